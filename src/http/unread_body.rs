//! A connection whose request body the server did not read to its end is closed after the
//! response, never drained.
//!
//! actix-http drains the unread rest of a chunked body once its handler has dropped it, so that
//! the connection can carry the next request; a client that never sends the last chunk then
//! holds the connection (and one of `limits.max_connections`) for as long as it likes, whatever
//! the server answered. actix closes the connection instead when the body's reader is still
//! alive when the response has gone out (checked as its last byte is written). This middleware
//! keeps it alive until then: it hands the handler a view of the body and ties the body itself
//! to the response's body.
//!
//! Handlers that read a body do so within `limits.body_timeout_ms` (`rpc::read_body`); with this
//! in front, a body that is not complete by then costs its sender the connection.

use actix_web::HttpMessage;
use actix_web::body::{BodySize, EitherBody, MessageBody};
use actix_web::dev::{Payload, ServiceRequest, ServiceResponse};
use actix_web::error::PayloadError;
use actix_web::middleware::Next;
use bytes::Bytes;
use futures_util::Stream;
use std::cell::RefCell;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll};

/// The request's body, shared by the handler's view and the response that keeps it alive.
type SharedBody = Rc<RefCell<Payload>>;

pin_project_lite::pin_project! {
    /// The response's body, holding the request's until actix has decided, with the request
    /// body's reader still alive, whether the connection may carry another request.
    pub struct Holding<B> {
        #[pin]
        response: B,
        request: SharedBody,
    }
}

impl<B: MessageBody> MessageBody for Holding<B> {
    type Error = B::Error;

    fn size(&self) -> BodySize {
        self.response.size()
    }

    fn poll_next(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Bytes, Self::Error>>> {
        self.project().response.poll_next(cx)
    }
}

/// The handler's view of the shared body.
struct BodyView(SharedBody);

impl Stream for BodyView {
    type Item = Result<Bytes, PayloadError>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        Pin::new(&mut *self.0.borrow_mut()).poll_next(cx)
    }
}

pub async fn close_if_unread<B: MessageBody + 'static>(
    mut req: ServiceRequest,
    next: Next<B>,
) -> Result<ServiceResponse<EitherBody<B, Holding<B>>>, actix_web::Error> {
    let body = req.take_payload();
    if matches!(body, Payload::None) {
        return Ok(next.call(req).await?.map_into_left_body());
    }
    let shared: SharedBody = Rc::new(RefCell::new(body));
    req.set_payload(Payload::Stream {
        payload: Box::pin(BodyView(Rc::clone(&shared))),
    });
    let response = next.call(req).await?;
    Ok(response
        .map_body(|_, response| Holding {
            response,
            request: shared,
        })
        .map_into_right_body())
}
