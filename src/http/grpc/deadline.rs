//! A call's request message must arrive within `limits.body_timeout_ms`, as an HTTP body must:
//! a client that opens a call and never finishes its message gets `DEADLINE_EXCEEDED` instead
//! of holding the call (and its connection's place) forever. Only the request is timed; the
//! answer, a stream of any length included, is not.

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::time::Sleep;
use tonic::Status;
use tower::{Layer, Service};

/// Wraps each request's body in a [`TimedBody`].
#[derive(Clone, Copy)]
pub struct RequestDeadline(pub Duration);

impl<S> Layer<S> for RequestDeadline {
    type Service = WithDeadline<S>;

    fn layer(&self, inner: S) -> Self::Service {
        WithDeadline {
            inner,
            limit: self.0,
        }
    }
}

#[derive(Clone)]
pub struct WithDeadline<S> {
    inner: S,
    limit: Duration,
}

impl<S> Service<http::Request<tonic::body::Body>> for WithDeadline<S>
where
    S: Service<http::Request<tonic::body::Body>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<tonic::body::Body>) -> Self::Future {
        let limit = self.limit;
        let request = request.map(|body| {
            tonic::body::Body::new(TimedBody {
                inner: body,
                deadline: tokio::time::sleep(limit),
                limit,
            })
        });
        self.inner.call(request)
    }
}

pin_project! {
    /// A request body that fails once its deadline passes before it ended.
    pub struct TimedBody {
        #[pin]
        inner: tonic::body::Body,
        #[pin]
        deadline: Sleep,
        limit: Duration,
    }
}

impl Body for TimedBody {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = self.project();
        if let Poll::Ready(frame) = this.inner.poll_frame(cx) {
            return Poll::Ready(frame);
        }
        match this.deadline.poll(cx) {
            Poll::Ready(()) => Poll::Ready(Some(Err(Status::deadline_exceeded(format!(
                "the request message did not arrive within limits.body_timeout_ms ({} ms)",
                this.limit.as_millis()
            ))))),
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
