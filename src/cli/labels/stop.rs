// SPDX-License-Identifier: Apache-2.0
//! The `--interval` loop's wait: sleep until the next round unless SIGTERM or SIGINT comes
//! first. The two signals are blocked and read from a signalfd, polled with the time left
//! as the timeout, so a signal that arrives during a round is kept until the wait (not
//! fatal, and not lost). No async runtime: the core library links none.

use std::io;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::signal::{SigSet, SigmaskHow, Signal, pthread_sigmask};
use nix::sys::signalfd::{SfdFlags, SignalFd};

/// SIGTERM and SIGINT, blocked on this thread and readable from a signalfd while this
/// lives; the thread's previous mask comes back when it is dropped. Threads started
/// while it lives inherit the mask, so the signals reach the signalfd, not them.
pub(crate) struct StopSignals {
    fd: SignalFd,
    previous: SigSet,
}

impl StopSignals {
    pub(crate) fn listen() -> io::Result<Self> {
        let mut stop = SigSet::empty();
        stop.add(Signal::SIGTERM);
        stop.add(Signal::SIGINT);
        let mut previous = SigSet::empty();
        pthread_sigmask(SigmaskHow::SIG_BLOCK, Some(&stop), Some(&mut previous))?;
        match SignalFd::with_flags(&stop, SfdFlags::SFD_NONBLOCK | SfdFlags::SFD_CLOEXEC) {
            Ok(fd) => Ok(Self { fd, previous }),
            Err(e) => {
                let _ = pthread_sigmask(SigmaskHow::SIG_SETMASK, Some(&previous), None);
                Err(e.into())
            }
        }
    }

    /// Waits `interval`; `true` when SIGTERM or SIGINT came first.
    pub(crate) fn wait(&self, interval: Duration) -> io::Result<bool> {
        let deadline = Instant::now() + interval;
        loop {
            if self.fd.read_signal()?.is_some() {
                return Ok(true);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(false);
            }
            // poll takes at most i32::MAX ms (about 24 days); a longer wait polls again.
            let timeout = PollTimeout::try_from(left).unwrap_or(PollTimeout::MAX);
            let mut fds = [PollFd::new(
                std::os::fd::AsFd::as_fd(&self.fd),
                PollFlags::POLLIN,
            )];
            match poll(&mut fds, timeout) {
                Ok(_) | Err(Errno::EINTR) => {}
                Err(e) => return Err(e.into()),
            }
        }
    }
}

/// Readable once SIGTERM or SIGINT is pending: what `metrics_server::serve` stops on.
impl std::os::fd::AsFd for StopSignals {
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

impl Drop for StopSignals {
    fn drop(&mut self) {
        // What was read is gone; a signal still pending is delivered as before we came.
        let _ = pthread_sigmask(SigmaskHow::SIG_SETMASK, Some(&self.previous), None);
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use nix::sys::signal::{Signal, raise};

    use super::StopSignals;

    #[test]
    fn the_interval_passes_without_a_signal() {
        let stop = StopSignals::listen().unwrap();
        let start = Instant::now();
        assert!(!stop.wait(Duration::from_millis(50)).unwrap());
        assert!(start.elapsed() >= Duration::from_millis(50));
    }

    /// A signal that came before the wait (during a round) ends it at once; `raise`
    /// sends to this thread, where the signal is blocked, so it waits for the signalfd.
    #[test]
    fn sigterm_or_sigint_ends_the_wait() {
        for signal in [Signal::SIGTERM, Signal::SIGINT] {
            let stop = StopSignals::listen().unwrap();
            raise(signal).unwrap();
            let start = Instant::now();
            assert!(stop.wait(Duration::from_secs(30)).unwrap(), "case {signal}");
            assert!(start.elapsed() < Duration::from_secs(10), "case {signal}");
        }
    }
}
