//! The tokio side of [`crate::http2`]: a connection whose reads pass through
//! [`Inbound`], so h2 reads every request with an `:authority` it accepts. Writes go
//! straight to the socket.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tonic::transport::server::Connected;

use crate::http2::Inbound;

/// How much is read from the socket at a time.
const READ_CHUNK: usize = 8 * 1024;

/// A client connection seen through [`Inbound`].
#[derive(Debug)]
pub struct AuthorityFixed<S> {
    io: S,
    inbound: Inbound,
    /// What h2 has still to read, from `out_at` on.
    out: Vec<u8>,
    out_at: usize,
    chunk: Box<[u8]>,
    eof: bool,
    logged: u64,
}

impl<S> AuthorityFixed<S> {
    pub fn new(io: S) -> Self {
        Self {
            io,
            inbound: Inbound::default(),
            out: Vec::new(),
            out_at: 0,
            chunk: vec![0; READ_CHUNK].into_boxed_slice(),
            eof: false,
            logged: 0,
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for AuthorityFixed<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        loop {
            if this.out_at < this.out.len() {
                let n = buf.remaining().min(this.out.len() - this.out_at);
                buf.put_slice(&this.out[this.out_at..this.out_at + n]);
                this.out_at += n;
                if this.out_at == this.out.len() {
                    this.out.clear();
                    this.out_at = 0;
                }
                return Poll::Ready(Ok(()));
            }
            if this.eof {
                return Poll::Ready(Ok(()));
            }
            let mut read = ReadBuf::new(&mut this.chunk);
            ready!(Pin::new(&mut this.io).poll_read(cx, &mut read))?;
            let filled = read.filled();
            if filled.is_empty() {
                // A partial frame still held back is dropped: h2 sees the end.
                this.eof = true;
                continue;
            }
            if let Err(error) = this.inbound.feed(filled, &mut this.out) {
                tracing::warn!(%error, "closing a device-plugin connection");
                return Poll::Ready(Err(io::Error::new(io::ErrorKind::InvalidData, error)));
            }
            let rewritten = this.inbound.rewritten();
            if rewritten > this.logged {
                if this.logged == 0 {
                    tracing::debug!(
                        "replaced the client's :authority (a socket path or empty) with one h2 accepts"
                    );
                }
                this.logged = rewritten;
            }
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for AuthorityFixed<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

impl<S: Connected> Connected for AuthorityFixed<S> {
    type ConnectInfo = S::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.io.connect_info()
    }
}
