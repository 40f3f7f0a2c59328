//! Server-Sent Events: each stream item is one `data:` line holding a JSON-RPC response.

use crate::engine::Subscription;
use crate::model::StreamItem;
use crate::protocol::codec::{self, TaskView};
use crate::protocol::jsonrpc::{RequestId, failure, success};
use crate::protocol::{RpcError, WireVersion};
use actix_web::HttpResponse;
use actix_web::http::header::{CacheControl, CacheDirective, ContentEncoding};
use actix_web_lab::sse::{self, Sse};
use futures_util::stream;
use std::time::Duration;

/// A subscription on its way to the wire.
pub struct EventStream {
    subscription: Subscription,
    buffer: usize,
}

impl EventStream {
    pub fn new(subscription: Subscription, buffer: usize) -> Self {
        EventStream {
            subscription,
            buffer,
        }
    }
}

/// Counts live streams for the metrics; drops with the stream (also when the client goes away).
struct LiveStream;

impl LiveStream {
    fn new() -> Self {
        metrics::gauge!("colloquy_sse_streams").increment(1.0);
        LiveStream
    }
}

impl Drop for LiveStream {
    fn drop(&mut self) {
        metrics::gauge!("colloquy_sse_streams").decrement(1.0);
    }
}

struct Cursor {
    events: EventStream,
    id: RequestId,
    version: WireVersion,
    done: bool,
    _live: LiveStream,
}

fn data_event(value: serde_json::Value) -> sse::Event {
    sse::Event::Data(sse::Data::new(value.to_string()))
}

pub fn respond(events: EventStream, id: RequestId, version: WireVersion) -> HttpResponse {
    let cursor = Cursor {
        events,
        id,
        version,
        done: false,
        _live: LiveStream::new(),
    };
    let stream = stream::unfold(cursor, |mut cursor| async move {
        if cursor.done {
            return None;
        }
        match cursor.events.subscription.items.recv().await {
            Some(item) => {
                let result = match &item {
                    StreamItem::Task(task) => {
                        // A stream that starts on a finished task has nothing more to say.
                        if task.status.state.ends_turn() {
                            cursor.done = true;
                        }
                        codec::encode_stream_item(cursor.version, &item, TaskView::FULL)
                    }
                    StreamItem::Message(_) => {
                        cursor.done = true;
                        codec::encode_stream_item(cursor.version, &item, TaskView::FULL)
                    }
                    StreamItem::Event(_) => {
                        codec::encode_stream_item(cursor.version, &item, TaskView::FULL)
                    }
                };
                let event = data_event(success(&cursor.id, result));
                Some((Ok::<_, std::convert::Infallible>(event), cursor))
            }
            None if cursor.events.subscription.overflowed() => {
                cursor.done = true;
                let error = RpcError::SubscriberTooSlow(cursor.events.buffer);
                let event = data_event(failure(&cursor.id, &error, cursor.version));
                Some((Ok(event), cursor))
            }
            None => None,
        }
    });
    HttpResponse::Ok()
        .content_type("text/event-stream")
        .insert_header(ContentEncoding::Identity)
        .insert_header(CacheControl(vec![CacheDirective::NoCache]))
        .body(Sse::from_stream(stream).with_keep_alive(Duration::from_secs(15)))
}
