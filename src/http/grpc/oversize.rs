//! A request message over `limits.body_bytes` is refused by tonic before it is decoded, with
//! `OUT_OF_RANGE`; gRPC's table of status codes gives a message larger than the configured
//! limit `RESOURCE_EXHAUSTED`, which is what clients and proxies expect (and what the other
//! bindings' 413 means). This layer changes that code only, keeping tonic's message (it names
//! the size and the limit), in the trailers that carry it (or the headers of a trailers-only
//! answer).

use futures_util::TryFutureExt;
use http::{HeaderMap, HeaderValue};
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use std::pin::Pin;
use std::task::{Context, Poll};
use tower::{Layer, Service};

/// What tonic's decoder says of a message over the limit, as its `grpc-message` spells it
/// (percent-encoded).
const TOO_LARGE: &str = "decoded%20message%20length%20too%20large";

#[derive(Clone, Copy)]
pub struct OversizeExhausts;

impl<S> Layer<S> for OversizeExhausts {
    type Service = WithOversize<S>;

    fn layer(&self, inner: S) -> Self::Service {
        WithOversize { inner }
    }
}

#[derive(Clone)]
pub struct WithOversize<S> {
    inner: S,
}

type Answer<B> = http::Response<B>;

impl<S, Q, B> Service<http::Request<Q>> for WithOversize<S>
where
    S: Service<http::Request<Q>, Response = Answer<B>>,
{
    type Response = Answer<Checked<B>>;
    type Error = S::Error;
    type Future = futures_util::future::MapOk<S::Future, fn(Answer<B>) -> Answer<Checked<B>>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<Q>) -> Self::Future {
        self.inner
            .call(request)
            .map_ok(checked as fn(Answer<B>) -> Answer<Checked<B>>)
    }
}

fn checked<B>(mut answer: Answer<B>) -> Answer<Checked<B>> {
    resource_exhausted(answer.headers_mut());
    answer.map(|inner| Checked { inner })
}

pin_project! {
    /// An answer's body whose trailers get [`resource_exhausted`].
    pub struct Checked<B> {
        #[pin]
        inner: B,
    }
}

impl<B: Body> Body for Checked<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        self.project().inner.poll_frame(cx).map_ok(|mut frame| {
            if let Some(trailers) = frame.trailers_mut() {
                resource_exhausted(trailers);
            }
            frame
        })
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// `RESOURCE_EXHAUSTED` in place of tonic's `OUT_OF_RANGE` for a message over the limit; any
/// other status as it is.
fn resource_exhausted(headers: &mut HeaderMap) {
    let out_of_range = headers
        .get("grpc-status")
        .is_some_and(|code| code == (tonic::Code::OutOfRange as i32).to_string().as_str());
    let too_large = headers
        .get("grpc-message")
        .and_then(|message| message.to_str().ok())
        .is_some_and(|message| message.contains(TOO_LARGE));
    if out_of_range && too_large {
        let code = (tonic::Code::ResourceExhausted as i32).to_string();
        if let Ok(code) = HeaderValue::from_str(&code) {
            headers.insert("grpc-status", code);
        }
    }
}
