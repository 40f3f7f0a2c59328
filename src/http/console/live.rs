//! The live view of a task: its stream relayed as Server-Sent Events the task page's few lines
//! of script (`live.js`) append to an `aria-live` region.
//!
//! It takes the same subscription a client's `SubscribeToTask` takes (the task with its reply
//! so far, then every later event, through waits for input, until the task ends; relayed from
//! the node that runs it on a cluster), and says of each event only what the page shows: the
//! reply so far (`replace`), a chunk of it (`text`), a state (`state`), and the end (`done`).

use super::ConsoleError;
use super::auth::Operator;
use super::task::TaskQuery;
use crate::engine::{Scope, Subscription};
use crate::http::sse::LiveStream;
use crate::http::state::AppState;
use crate::model::{Artifact, StreamItem, Task, TaskEvent};
use actix_web::http::header::{CacheControl, CacheDirective, ContentEncoding};
use actix_web::{HttpResponse, web};
use actix_web_lab::sse::{self, Sse};
use futures_util::stream;
use serde_json::{Value, json};
use std::time::Duration;

pub async fn stream(
    _: Operator,
    state: web::Data<AppState>,
    params: web::Query<TaskQuery>,
) -> Result<HttpResponse, ConsoleError> {
    let (principal, id) = params.checked()?;
    let subscription = state
        .engine
        .subscribe(&principal, &id, None, Scope::Task)
        .await?;
    let cursor = Cursor {
        subscription,
        done: false,
        _live: LiveStream::new("colloquy_sse_streams"),
    };
    let events = stream::unfold(cursor, |mut cursor| async move {
        if cursor.done {
            return None;
        }
        let item = match cursor.subscription.items.recv().await {
            Some(sequenced) => sequenced.item,
            // Closed: the task ended, or this view fell too far behind (it may reload).
            None => {
                cursor.done = true;
                let data = json!({ "done": true, "state": "stream closed" });
                return Some((Ok(event(&data)), cursor));
            }
        };
        let data = describe(&item);
        cursor.done = data.get("done").is_some();
        Some((Ok::<_, std::convert::Infallible>(event(&data)), cursor))
    });
    Ok(HttpResponse::Ok()
        .content_type("text/event-stream")
        .insert_header(ContentEncoding::Identity)
        .insert_header(CacheControl(vec![CacheDirective::NoCache]))
        .body(Sse::from_stream(events).with_keep_alive(Duration::from_secs(15))))
}

struct Cursor {
    subscription: Subscription,
    done: bool,
    _live: LiveStream,
}

fn event(data: &Value) -> sse::Event {
    sse::Event::Data(sse::Data::new(data.to_string()))
}

/// The reply so far: the text of the task's artifacts, as the page lists them.
fn reply_so_far(task: &Task) -> String {
    task.artifacts
        .iter()
        .map(Artifact::text)
        .collect::<Vec<_>>()
        .join("\n")
}

/// What the page shows of one stream item.
fn describe(item: &StreamItem) -> Value {
    match item {
        StreamItem::Task(task) => {
            let state = task.status.state;
            let mut data = json!({ "replace": reply_so_far(task), "state": state.as_str() });
            if state.is_terminal() {
                data["done"] = true.into();
            }
            data
        }
        StreamItem::Message(message) => json!({ "text": message.text(), "done": true }),
        StreamItem::Event(TaskEvent::Artifact {
            artifact, append, ..
        }) => {
            let text = artifact.text();
            if *append {
                json!({ "text": text })
            } else {
                // A new artifact starts on a line of its own.
                json!({ "text": text, "newline": true })
            }
        }
        StreamItem::Event(TaskEvent::Status { status, .. }) => {
            let mut data = json!({ "state": status.state.as_str() });
            if status.state.is_terminal() {
                data["done"] = true.into();
            }
            data
        }
    }
}
