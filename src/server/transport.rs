//! What HTTP is read from and written to on a client connection: the TCP socket, or TLS over
//! it; in both cases after any bytes read with a PROXY header that were not part of it.
//!
//! One enum rather than a type parameter: hyper's connection (and everything that wraps it)
//! is compiled once, and the branch per read or write costs nothing next to the syscall.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Buf, Bytes};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::server::TlsStream;

/// A TCP socket, with the bytes read past a PROXY header (the start of a TLS `ClientHello`
/// or of a request) handed out first.
#[derive(Debug)]
pub(crate) struct Prefixed {
    rest: Bytes,
    stream: TcpStream,
}

impl Prefixed {
    /// `stream`, whose next bytes are `rest` and then what it reads.
    pub(crate) fn new(rest: Bytes, stream: TcpStream) -> Prefixed {
        Prefixed { rest, stream }
    }

    /// The socket.
    pub(crate) fn tcp(&self) -> &TcpStream {
        &self.stream
    }
}

impl AsyncRead for Prefixed {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.rest.is_empty() {
            return Pin::new(&mut this.stream).poll_read(cx, buf);
        }
        let n = this.rest.len().min(buf.remaining());
        buf.put_slice(&this.rest[..n]);
        this.rest.advance(n);
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for Prefixed {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().stream).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_shutdown(cx)
    }
}

/// A client connection's byte stream, plain or TLS.
#[derive(Debug)]
pub(crate) enum Transport {
    /// HTTP in the clear.
    Plain(Prefixed),
    /// HTTP inside TLS, the handshake done. Boxed: rustls' connection state is large.
    Tls(Box<TlsStream<Prefixed>>),
}

impl Transport {
    /// The socket underneath (for its options).
    pub(crate) fn tcp(&self) -> &TcpStream {
        match self {
            Transport::Plain(plain) => plain.tcp(),
            Transport::Tls(tls) => tls.get_ref().0.tcp(),
        }
    }
}

impl From<TcpStream> for Transport {
    fn from(stream: TcpStream) -> Self {
        Transport::Plain(Prefixed::new(Bytes::new(), stream))
    }
}

impl AsyncRead for Transport {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Transport::Plain(plain) => Pin::new(plain).poll_read(cx, buf),
            Transport::Tls(tls) => Pin::new(tls.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Transport {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Transport::Plain(plain) => Pin::new(plain).poll_write(cx, buf),
            Transport::Tls(tls) => Pin::new(tls.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Transport::Plain(plain) => Pin::new(plain).poll_write_vectored(cx, bufs),
            Transport::Tls(tls) => Pin::new(tls.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Transport::Plain(plain) => plain.is_write_vectored(),
            Transport::Tls(tls) => tls.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Transport::Plain(plain) => Pin::new(plain).poll_flush(cx),
            Transport::Tls(tls) => Pin::new(tls.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Transport::Plain(plain) => Pin::new(plain).poll_shutdown(cx),
            Transport::Tls(tls) => Pin::new(tls.as_mut()).poll_shutdown(cx),
        }
    }
}
