// SPDX-License-Identifier: Apache-2.0
//! The `--interval` loop's wait: sleep until the next round unless a signal comes first:
//! SIGTERM, SIGINT or SIGQUIT stop the loop, SIGHUP reloads (GFD's signals). They are
//! blocked and read from a signalfd, polled with the time left as the timeout, so a signal
//! that arrives during a round is kept until the wait (not fatal, and not lost). No async
//! runtime: the core library links none.

use std::io;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::signal::{SigSet, SigmaskHow, Signal, pthread_sigmask};
use nix::sys::signalfd::{SfdFlags, SignalFd};

/// What ended a wait.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Wake {
    /// The interval passed: time for the next round.
    Elapsed,
    /// SIGTERM, SIGINT or SIGQUIT: stop.
    Stop,
    /// SIGHUP: read the config again and relabel now.
    Reload,
}

/// The loop's signals, blocked on this thread and readable from a signalfd while this
/// lives; the thread's previous mask comes back when it is dropped. Threads started while
/// it lives inherit the mask, so the signals reach the signalfd, not them.
pub(crate) struct StopSignals {
    fd: SignalFd,
    previous: SigSet,
}

impl StopSignals {
    pub(super) fn listen() -> io::Result<Self> {
        Self::listen_to(&[
            Signal::SIGTERM,
            Signal::SIGINT,
            Signal::SIGQUIT,
            Signal::SIGHUP,
        ])
    }

    /// Blocks `signals` and reads them from a signalfd instead.
    pub(crate) fn listen_to(signals: &[Signal]) -> io::Result<Self> {
        let mut stop = SigSet::empty();
        for signal in signals {
            stop.add(*signal);
        }
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

    /// Waits `interval`, or until a signal.
    pub(crate) fn wait(&self, interval: Duration) -> io::Result<Wake> {
        let deadline = Instant::now() + interval;
        loop {
            if let Some(info) = self.fd.read_signal()? {
                return Ok(if info.ssi_signo == Signal::SIGHUP as u32 {
                    Wake::Reload
                } else {
                    Wake::Stop
                });
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(Wake::Elapsed);
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

/// Readable once one of the signals is pending: what `metrics_server::serve` stops on.
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

    use super::{StopSignals, Wake};

    #[test]
    fn the_interval_passes_without_a_signal() {
        let stop = StopSignals::listen().unwrap();
        let start = Instant::now();
        assert_eq!(stop.wait(Duration::from_millis(50)).unwrap(), Wake::Elapsed);
        assert!(start.elapsed() >= Duration::from_millis(50));
    }

    /// A signal that came before the wait (during a round) ends it at once; `raise`
    /// sends to this thread, where the signal is blocked, so it waits for the signalfd.
    #[test]
    fn signals_end_the_wait() {
        for (signal, want) in [
            (Signal::SIGTERM, Wake::Stop),
            (Signal::SIGINT, Wake::Stop),
            (Signal::SIGQUIT, Wake::Stop),
            (Signal::SIGHUP, Wake::Reload),
        ] {
            let stop = StopSignals::listen().unwrap();
            raise(signal).unwrap();
            let start = Instant::now();
            assert_eq!(
                stop.wait(Duration::from_secs(30)).unwrap(),
                want,
                "case {signal}"
            );
            assert!(start.elapsed() < Duration::from_secs(10), "case {signal}");
        }
    }
}
