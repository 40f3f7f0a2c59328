//! The push outbox: the notifications waiting to be delivered, in outbox order, each with its
//! attempts, the time of its next one and why the last failed; and those this node gave up on
//! lately (the store removes a notification given up: the delivery worker keeps the last
//! hundred in memory, `push::deliver::GivenUp`).

use super::auth::Operator;
use super::{ConsoleError, ok, principal_label, time};
use crate::http::state::AppState;
use actix_web::{HttpResponse, web};
use askama::Template;

/// Notifications the page lists, at most (the first of the outbox).
const SHOWN: usize = 200;

struct Entry {
    id: String,
    task_id: String,
    task_href: String,
    principal: String,
    url: String,
    state: &'static str,
    reported: &'static str,
    attempts: u32,
    created: String,
    next_attempt: String,
    claimed: bool,
    last_error: String,
}

struct GaveUpEntry {
    task_id: String,
    task_href: String,
    url: String,
    attempts: u32,
    why: String,
    at: String,
}

#[derive(Template)]
#[template(path = "console/outbox.html")]
struct OutboxPage {
    op: Operator,
    entries: Vec<Entry>,
    pending: usize,
    retrying: usize,
    /// The page shows the first [`SHOWN`] only.
    cut: bool,
    shown: usize,
    /// The store keeps no outbox (push is off).
    push_enabled: bool,
    given_up: Vec<GaveUpEntry>,
}

pub async fn page(op: Operator, state: web::Data<AppState>) -> Result<HttpResponse, ConsoleError> {
    let notifications = match &state.push {
        Some(push) => push.outbox(SHOWN + 1).await?,
        None => Vec::new(),
    };
    let cut = notifications.len() > SHOWN;
    let entries: Vec<Entry> = notifications
        .into_iter()
        .take(SHOWN)
        .map(|n| Entry {
            task_href: super::task::task_href(&n.principal, &n.config.task_id),
            principal: principal_label(&n.principal),
            state: if n.attempts == 0 {
                "pending"
            } else {
                "retrying"
            },
            reported: n.task.status.state.as_str(),
            attempts: n.attempts,
            created: time(&n.created_at),
            next_attempt: time(&n.not_before),
            claimed: n.claim.is_some(),
            last_error: n.last_error.unwrap_or_default(),
            task_id: n.config.task_id,
            url: n.config.url,
            id: n.id,
        })
        .collect();
    let given_up = state
        .push
        .as_ref()
        .map(|push| push.given_up())
        .unwrap_or_default()
        .into_iter()
        .map(|gave_up| GaveUpEntry {
            task_href: super::task::task_href(&gave_up.principal, &gave_up.task_id),
            task_id: gave_up.task_id,
            url: gave_up.url,
            attempts: gave_up.attempts,
            why: gave_up.why,
            at: time(&gave_up.at),
        })
        .collect();
    let retrying = entries.iter().filter(|e| e.attempts > 0).count();
    Ok(ok(&OutboxPage {
        op,
        pending: entries.len() - retrying,
        retrying,
        cut,
        shown: SHOWN,
        entries,
        push_enabled: state.push.is_some(),
        given_up,
    }))
}
