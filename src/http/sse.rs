//! Server-Sent Events: each stream item is one `data:` line, holding a JSON-RPC response on the
//! JSON-RPC binding or the bare `StreamResponse` on the HTTP+JSON binding, with its event id on
//! an `id:` line (`engine::resume`), which a client sends back as `Last-Event-ID` to resume.

use crate::engine::resume::Resumed;
use crate::engine::{EventId, Subscription};
use crate::model::StreamItem;
use crate::protocol::codec::{self, TaskView};
use crate::protocol::jsonrpc::{RequestId, failure, success};
use crate::protocol::{RpcError, WireVersion};
use actix_web::http::header::{CacheControl, CacheDirective, ContentEncoding};
use actix_web::{HttpRequest, HttpResponse, web};
use actix_web_lab::sse::{self, Sse};
use futures_util::stream;
use std::time::Duration;

/// The header a reconnecting client names the last event it saw in.
pub const LAST_EVENT_ID: &str = "last-event-id";
/// How a resumed stream started ([`Resumed::label`]), for a node relaying it (`forward`).
pub const RESUMED_HEADER: &str = "x-colloquy-resumed";

/// Puts where a resumed stream goes on from into `params` as `lastEventId` (unless they name
/// it): the `Last-Event-ID` header, or the `lastEventId` query parameter for clients that
/// cannot set headers.
pub fn resume_point(req: &HttpRequest, params: &mut serde_json::Map<String, serde_json::Value>) {
    if params.contains_key("lastEventId") {
        return;
    }
    let from_header = req
        .headers()
        .get(LAST_EVENT_ID)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let from_query = || {
        web::Query::<std::collections::HashMap<String, String>>::from_query(req.query_string())
            .ok()
            .and_then(|query| query.into_inner().remove("lastEventId"))
    };
    if let Some(id) = from_header.or_else(from_query) {
        params.insert("lastEventId".into(), id.into());
    }
}

/// One event of a stream, spelled for its wire version.
pub struct Outgoing {
    pub id: Option<EventId>,
    pub result: serde_json::Value,
}

/// A subscription on its way to the wire, whichever binding carries it.
pub struct EventStream {
    subscription: Subscription,
    buffer: usize,
    started: bool,
    done: bool,
}

impl EventStream {
    pub fn new(subscription: Subscription, buffer: usize) -> Self {
        EventStream {
            subscription,
            buffer,
            started: false,
            done: false,
        }
    }

    /// How the stream started, when it resumed after an id.
    pub fn resumed(&self) -> Option<Resumed> {
        self.subscription.resumed
    }

    /// The next event as `version` spells a `StreamResponse`, or the error that ends the
    /// stream (a reader too slow for the buffer is closed, never skipped ahead); `None` once
    /// the stream is over.
    pub async fn next(&mut self, version: WireVersion) -> Option<Result<Outgoing, RpcError>> {
        if self.done {
            return None;
        }
        match self.subscription.items.recv().await {
            Some(sequenced) => {
                let item = &sequenced.item;
                let started = std::mem::replace(&mut self.started, true);
                self.done = match item {
                    // A stream that starts on an ended task has nothing more to say (one on a
                    // task waiting for input goes on: its subscription follows the task).
                    StreamItem::Task(task) => !started && task.status.state.is_terminal(),
                    StreamItem::Message(_) => true,
                    StreamItem::Event(_) => false,
                };
                Some(Ok(Outgoing {
                    id: sequenced.id,
                    result: codec::encode_stream_item(version, item, TaskView::FULL),
                }))
            }
            None if self.subscription.overflowed() => {
                self.done = true;
                Some(Err(RpcError::SubscriberTooSlow(self.buffer)))
            }
            None => None,
        }
    }
}

/// Counts live streams in the gauge it names; drops with the stream (also when the client goes
/// away).
pub struct LiveStream(&'static str);

impl LiveStream {
    pub fn new(gauge: &'static str) -> Self {
        metrics::gauge!(gauge).increment(1.0);
        LiveStream(gauge)
    }
}

impl Drop for LiveStream {
    fn drop(&mut self) {
        metrics::gauge!(self.0).decrement(1.0);
    }
}

/// How each event goes on the wire.
pub enum Framing {
    /// A JSON-RPC response with the request's id; an error is a JSON-RPC error response.
    JsonRpc { id: RequestId, version: WireVersion },
    /// HTTP+JSON (v1.0): the `StreamResponse` itself; an error is an `error` event holding the
    /// binding's error body.
    Rest,
    /// v0.3's HTTP+JSON: as `Rest`, each event in v0.3's spelling (`protocol::rest03`).
    Rest03,
}

impl Framing {
    fn version(&self) -> WireVersion {
        match self {
            Framing::JsonRpc { version, .. } => *version,
            Framing::Rest | Framing::Rest03 => WireVersion::V1,
        }
    }

    fn result(&self, outgoing: Outgoing) -> sse::Event {
        let Outgoing { id, result } = outgoing;
        let text = match self {
            Framing::JsonRpc { id, .. } => serde_json::to_string(&success(id, &result)),
            Framing::Rest => serde_json::to_string(&result),
            Framing::Rest03 => {
                let mut result = result;
                crate::protocol::rest03::result_to_v03(&mut result);
                serde_json::to_string(&result)
            }
        };
        // A `Value` always serializes (string keys); an empty event stands in if it ever did not.
        let data = sse::Data::new(text.unwrap_or_default());
        sse::Event::Data(match id {
            Some(id) => data.id(id.to_string()),
            None => data,
        })
    }

    fn error(&self, error: &RpcError) -> sse::Event {
        match self {
            Framing::JsonRpc { id, version } => {
                sse::Event::Data(sse::Data::new(failure(id, error, *version).to_string()))
            }
            Framing::Rest | Framing::Rest03 => {
                sse::Event::Data(sse::Data::new(error.to_rest_json().to_string()).event("error"))
            }
        }
    }
}

struct Cursor {
    events: EventStream,
    framing: Framing,
    /// A comment to send before the first event.
    preface: Option<&'static str>,
    _live: LiveStream,
}

/// What a resumed stream says before its first event (a comment: clients skip it).
fn preface(resumed: Option<Resumed>) -> Option<&'static str> {
    match resumed? {
        Resumed::Replayed => Some("resumed: the events after Last-Event-ID follow"),
        Resumed::Snapshot => Some(
            "resumed from a snapshot: Last-Event-ID is older than the events kept; the task as it stands follows",
        ),
    }
}

pub fn respond(events: EventStream, framing: Framing) -> HttpResponse {
    let resumed = events.resumed();
    let cursor = Cursor {
        preface: preface(resumed),
        events,
        framing,
        _live: LiveStream::new("colloquy_sse_streams"),
    };
    let stream = stream::unfold(cursor, |mut cursor| async move {
        if let Some(comment) = cursor.preface.take() {
            return Some((Ok(sse::Event::Comment(comment.into())), cursor));
        }
        let event = match cursor.events.next(cursor.framing.version()).await? {
            Ok(result) => cursor.framing.result(result),
            Err(error) => cursor.framing.error(&error),
        };
        Some((Ok::<_, std::convert::Infallible>(event), cursor))
    });
    let mut response = event_stream(stream);
    if let Some(resumed) = resumed {
        response.headers_mut().insert(
            actix_web::http::header::HeaderName::from_static(RESUMED_HEADER),
            actix_web::http::header::HeaderValue::from_static(resumed.label()),
        );
    }
    response
}

/// An event stream carrying only `error`: v0.3's `tasks/resubscribe` answers an error before any
/// event this way, as the reference server does, so a streaming client reads it as an error
/// instead of failing on a JSON body.
pub fn respond_error(error: &RpcError, framing: Framing) -> HttpResponse {
    let event = framing.error(error);
    event_stream(stream::once(async move {
        Ok::<_, std::convert::Infallible>(event)
    }))
}

fn event_stream(
    events: impl futures_util::Stream<Item = Result<sse::Event, std::convert::Infallible>> + 'static,
) -> HttpResponse {
    HttpResponse::Ok()
        .content_type("text/event-stream")
        .insert_header(ContentEncoding::Identity)
        .insert_header(CacheControl(vec![CacheDirective::NoCache]))
        .body(Sse::from_stream(events).with_keep_alive(Duration::from_secs(15)))
}
