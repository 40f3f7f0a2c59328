//! `limits.max_connections` on the gRPC port: a connection is accepted only while fewer than
//! the limit are open, so past it new ones wait in the kernel's listen queue (as on the HTTP
//! port) instead of taking descriptors the process does not have.

use futures_util::Stream;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tonic::transport::server::{Connected, TcpConnectInfo};

/// An accepted connection holding one of the limit's places until it closes.
pub struct Limited {
    stream: TcpStream,
    _place: OwnedSemaphorePermit,
}

/// The connections `listener` accepts, at most `limit` open at once.
pub fn accept(
    listener: TcpListener,
    limit: usize,
) -> impl Stream<Item = io::Result<Limited>> + Send + 'static {
    let places = Arc::new(Semaphore::new(limit.max(1)));
    futures_util::stream::unfold((listener, places), |(listener, places)| async move {
        // The semaphore is never closed: acquiring fails only if it were.
        let place = places.clone().acquire_owned().await.ok()?;
        let accepted = listener.accept().await.map(|(stream, _)| {
            // Streams send small frames: Nagle would hold each back for the peer's delayed ACK.
            let _ = stream.set_nodelay(true);
            Limited {
                stream,
                _place: place,
            }
        });
        Some((accepted, (listener, places)))
    })
}

impl Connected for Limited {
    type ConnectInfo = TcpConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.stream.connect_info()
    }
}

impl AsyncRead for Limited {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for Limited {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }
}
