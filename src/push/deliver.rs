//! The delivery worker: drains the store's outbox, POSTing each notification to its webhook.
//!
//! It reads only what is due, earliest first, from the store's index by due time, and sleeps
//! until the next one falls due (or new work wakes it): thousands of notifications waiting for
//! a receiver that is down cost nothing between their attempts.
//!
//! At least once, in order per (task, URL): only the oldest notification of each lane is in
//! flight, and the next one waits until it is delivered or given up (the store's claim sets a
//! later one aside, out of the due order, until then). Failures that may pass
//! (a host name that does not resolve, connection errors, timeouts, 408, 429, 5xx) are retried
//! with exponential backoff and jitter (at least `Retry-After`), until `give_up_after` from the
//! change; other answers, and addresses the policy refuses, are given up at once. Every outcome
//! is written to the store, so a restart resumes where this process stopped. On a shared
//! database each attempt first claims its notification (`PushStore::claim_notification`), so
//! nodes draining one outbox never have one notification in flight twice at once. The worker
//! holds the store weakly: it ends when the store is dropped.

use super::target::{CheckedResolver, TargetError, TargetPolicy};
use crate::error::chain;
use crate::model::now;
use crate::protocol::WireVersion;
use crate::store::{Notification, PushStore, StoreError};
use crate::telemetry::traces;
use chrono::{DateTime, Utc};
use rand::Rng;
use reqwest::StatusCode;
use std::collections::HashSet;
use std::net::IpAddr;
use std::sync::{Arc, Weak};
use std::time::Duration;
use tokio::task::JoinSet;
use tokio::time::Instant;
use tracing::Instrument;

/// The header carrying the config's token.
pub const TOKEN_HEADER: &str = "X-A2A-Notification-Token";
/// The header carrying the notification's stable id (receivers drop duplicates by it).
pub const ID_HEADER: &str = "X-Colloquy-Notification-Id";

/// Why a notification to a refused address is given up (the address itself stays out of logs).
const REFUSED_TARGET: &str = "the webhook's address is not allowed by the push target policy";

/// How often the due index is read when nothing is due sooner and nothing wakes the worker
/// (another node sharing the database may have added work): one indexed read of a few rows.
const IDLE_POLL: Duration = Duration::from_secs(1);
/// The due index is read at most this often: wake-ups and finished attempts in between are
/// taken together.
const MIN_RESCAN: Duration = Duration::from_millis(10);
/// How often `colloquy_push_pending` is refreshed (it counts the whole outbox).
const COUNT_EVERY: Duration = Duration::from_secs(15);

#[derive(Debug, Clone)]
pub struct DeliveryOptions {
    pub give_up_after: Duration,
    pub attempt_timeout: Duration,
    pub retry_base: Duration,
    pub retry_max: Duration,
    pub concurrency: usize,
}

/// Signs a notification's body: the headers to add (`sign.rs`).
pub trait SignBody: Send + Sync + 'static {
    fn headers(&self, notification: &Notification, body: &[u8]) -> Vec<(&'static str, String)>;
}

/// What one attempt came to.
enum Outcome {
    Delivered,
    /// Worth another try, not before the given delay (`Retry-After`) if any.
    Retry {
        why: String,
        after: Option<Duration>,
    },
    /// Will never succeed.
    Refused(String),
}

struct Worker {
    store: Weak<dyn PushStore>,
    client: reqwest::Client,
    policy: Arc<TargetPolicy>,
    signer: Option<Arc<dyn SignBody>>,
    options: DeliveryOptions,
    given_up: Arc<GivenUp>,
}

/// How many given-up notifications a node keeps to show.
const GIVEN_UP_KEPT: usize = 100;

/// The notifications this node gave up on, the last [`GIVEN_UP_KEPT`], newest first: the
/// operator console shows them. The store removes a notification given up (its outbox holds
/// what is still to deliver), so these are this node's since it started; the log and
/// `colloquy_push_given_up_total` have every one.
#[derive(Default)]
pub struct GivenUp(parking_lot::Mutex<std::collections::VecDeque<GaveUp>>);

/// A notification given up (what the console shows of it), why, and when.
#[derive(Clone)]
pub struct GaveUp {
    pub principal: String,
    pub task_id: String,
    pub url: String,
    pub attempts: u32,
    pub why: String,
    pub at: DateTime<Utc>,
}

impl GivenUp {
    fn keep(&self, notification: &Notification, why: &str) {
        let mut kept = self.0.lock();
        kept.push_front(GaveUp {
            principal: notification.principal.clone(),
            task_id: notification.config.task_id.clone(),
            url: notification.config.url.clone(),
            attempts: notification.attempts + 1,
            why: why.to_owned(),
            at: now(),
        });
        kept.truncate(GIVEN_UP_KEPT);
    }

    /// Newest first.
    pub fn recent(&self) -> Vec<GaveUp> {
        self.0.lock().iter().cloned().collect()
    }
}

/// Starts the worker on the current runtime; what it gives up on is kept in `given_up`.
pub fn start(
    store: Arc<dyn PushStore>,
    policy: Arc<TargetPolicy>,
    signer: Option<Arc<dyn SignBody>>,
    options: DeliveryOptions,
    given_up: Arc<GivenUp>,
) -> Result<(), reqwest::Error> {
    let client = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .no_proxy()
        .dns_resolver(Arc::new(CheckedResolver(policy.clone())))
        .connect_timeout(options.attempt_timeout)
        .timeout(options.attempt_timeout)
        .user_agent(concat!("colloquy/", env!("CARGO_PKG_VERSION")))
        .build()?;
    let waker = store.outbox_waker();
    let worker = Arc::new(Worker {
        store: Arc::downgrade(&store),
        client,
        policy,
        signer,
        options,
        given_up,
    });
    tokio::spawn(worker.run(waker));
    Ok(())
}

impl Worker {
    async fn run(self: Arc<Self>, waker: Arc<tokio::sync::Notify>) {
        let mut attempts: JoinSet<u64> = JoinSet::new();
        let mut in_flight: HashSet<u64> = HashSet::new();
        let mut counted: Option<Instant> = None;
        // Whether the outbox may have changed since it was last counted (an idle worker
        // counts nothing).
        let mut changed = true;
        loop {
            let scanned = Instant::now();
            let Some(store) = self.store.upgrade() else {
                return;
            };
            let (wait, read) = self.read_due(&*store, &mut attempts, &mut in_flight).await;
            changed |= read > 0;
            if changed && counted.is_none_or(|at| at.elapsed() >= COUNT_EVERY) {
                (counted, changed) = (Some(scanned), false);
                match store.pending_count().await {
                    Ok(pending) => metrics::gauge!("colloquy_push_pending").set(pending as f64),
                    Err(StoreError::Closed) => {}
                    Err(e) => {
                        tracing::error!(error = %chain(&e), "counting the push-notification outbox")
                    }
                }
            }
            drop(store);
            tokio::select! {
                Some(done) = attempts.join_next(), if !attempts.is_empty() => {
                    if let Ok(seq) = done {
                        in_flight.remove(&seq);
                    }
                    changed = true;
                }
                _ = waker.notified() => changed = true,
                _ = tokio::time::sleep(wait) => {}
            }
            tokio::time::sleep_until(scanned + MIN_RESCAN).await;
            while let Some(done) = attempts.try_join_next() {
                if let Ok(seq) = done {
                    in_flight.remove(&seq);
                }
            }
        }
    }

    /// Reads what is due, while a delivery slot is free, and starts it; returns how long the
    /// worker may sleep (until the next one falls due, at most [`IDLE_POLL`]) and how many
    /// notifications it read.
    async fn read_due(
        self: &Arc<Self>,
        store: &dyn PushStore,
        attempts: &mut JoinSet<u64>,
        in_flight: &mut HashSet<u64>,
    ) -> (Duration, usize) {
        let free = self.options.concurrency.saturating_sub(attempts.len());
        if free == 0 {
            // Nothing could start: a finished attempt wakes the worker.
            return (IDLE_POLL, 0);
        }
        // Those in flight may be among the due ones (until their outcome is stored).
        match store.due_notifications(free + in_flight.len()).await {
            Ok(found) => {
                let read = found.due.len();
                metrics::counter!("colloquy_push_scanned_total").increment(read as u64);
                self.start(found.due, attempts, in_flight);
                let wait = found.next_due.map_or(IDLE_POLL, |next| {
                    (next - now()).to_std().unwrap_or_default().min(IDLE_POLL)
                });
                (wait, read)
            }
            // The server is stopping: the worker ends once the store is dropped.
            Err(StoreError::Closed) => (IDLE_POLL, 0),
            Err(e) => {
                tracing::error!(error = %chain(&e), "reading the push-notification outbox");
                (IDLE_POLL, 0)
            }
        }
    }

    /// Starts an attempt for each due notification not in flight, while slots are free.
    fn start(
        self: &Arc<Self>,
        due: Vec<Notification>,
        attempts: &mut JoinSet<u64>,
        in_flight: &mut HashSet<u64>,
    ) {
        for notification in due {
            if attempts.len() >= self.options.concurrency {
                break;
            }
            let seq = notification.seq;
            if !in_flight.insert(seq) {
                continue;
            }
            let worker = self.clone();
            attempts.spawn(async move {
                worker.deliver(notification).await;
                seq
            });
        }
    }

    /// One attempt, and what the store keeps of its outcome.
    async fn deliver(&self, notification: Notification) {
        let Some(notification) = self.claim(notification).await else {
            return;
        };
        let span = tracing::debug_span!(
            "push.deliver",
            otel.kind = "client",
            task_id = %notification.config.task_id,
            attempt = notification.attempts + 1,
        );
        if let Some(trace) = &notification.trace {
            crate::telemetry::propagation::continue_from_traceparent(&span, trace);
        }
        let outcome = self.attempt(&notification).instrument(span.clone()).await;
        match &outcome {
            Outcome::Delivered => {}
            Outcome::Retry { why, .. } | Outcome::Refused(why) => traces::fail(&span, why.clone()),
        }
        let Some(store) = self.store.upgrade() else {
            return;
        };
        let (task_id, id) = (&notification.config.task_id, &notification.id);
        let recorded = match outcome {
            Outcome::Delivered => {
                metrics::counter!("colloquy_push_sent_total").increment(1);
                let latency = (now() - notification.created_at)
                    .to_std()
                    .unwrap_or_default();
                metrics::histogram!("colloquy_push_delivery_seconds").record(latency);
                store.notification_delivered(&notification).await
            }
            Outcome::Retry { why, after } => {
                metrics::counter!("colloquy_push_failed_total").increment(1);
                let delay = self.backoff(notification.attempts, after);
                let next = now() + chrono::Duration::from_std(delay).unwrap_or_default();
                if self.past_deadline(&notification, next) {
                    self.give_up(&notification, &why);
                    store.give_up_notification(&notification).await
                } else {
                    metrics::counter!("colloquy_push_retried_total").increment(1);
                    tracing::debug!(task_id, notification_id = id, %why, "push notification will be retried");
                    let mut again = notification.clone();
                    again.attempts += 1;
                    again.not_before = next;
                    again.last_error = Some(why);
                    store.reschedule_notification(again).await
                }
            }
            Outcome::Refused(why) => {
                metrics::counter!("colloquy_push_failed_total").increment(1);
                self.give_up(&notification, &why);
                store.give_up_notification(&notification).await
            }
        };
        if let Err(e) = recorded {
            tracing::error!(task_id, notification_id = id, error = %chain(&e), "recording a push notification's outcome");
        }
    }

    /// Takes the notification from the outbox for this attempt (another node sharing the
    /// database may have taken it): held for twice the attempt's timeout, so it is not tried
    /// elsewhere while this attempt may still run.
    async fn claim(&self, notification: Notification) -> Option<Notification> {
        let store = self.store.upgrade()?;
        let hold = self.options.attempt_timeout * 2 + Duration::from_secs(1);
        let id = notification.id.clone();
        match store.claim_notification(notification, hold).await {
            Ok(claimed) => claimed,
            Err(e) => {
                tracing::error!(notification_id = id, error = %chain(&e), "claiming a push notification");
                None
            }
        }
    }

    /// Logs, counts and keeps (for the operator console) a notification given up.
    fn give_up(&self, notification: &Notification, why: &str) {
        metrics::counter!("colloquy_push_given_up_total").increment(1);
        tracing::warn!(
            task_id = notification.config.task_id,
            notification_id = notification.id,
            attempts = notification.attempts + 1,
            %why,
            "gave up delivering a push notification"
        );
        self.given_up.keep(notification, why);
    }

    fn past_deadline(&self, notification: &Notification, next: DateTime<Utc>) -> bool {
        let give_up_after =
            chrono::Duration::from_std(self.options.give_up_after).unwrap_or(chrono::Duration::MAX);
        next > notification.created_at + give_up_after
    }

    /// Exponential from `retry_base`, capped at `retry_max`, with jitter (half to all of it);
    /// never less than the receiver's `Retry-After`.
    fn backoff(&self, attempts: u32, retry_after: Option<Duration>) -> Duration {
        let options = &self.options;
        let exponential = options
            .retry_base
            .saturating_mul(1u32 << attempts.min(20))
            .min(options.retry_max);
        let jittered = exponential.mul_f64(rand::thread_rng().gen_range(0.5..=1.0));
        jittered.max(retry_after.unwrap_or_default())
    }

    async fn attempt(&self, notification: &Notification) -> Outcome {
        let config = &notification.config;
        if self.check_literal(&config.url).is_err() {
            return Outcome::Refused(REFUSED_TARGET.into());
        }
        let version = WireVersion::parse(Some(&config.wire_version)).unwrap_or(WireVersion::V1);
        let payload = crate::protocol::push::encode_notification(version, &notification.task);
        let body = serde_json::to_vec(&payload).unwrap_or_default();
        let mut request = self
            .client
            .post(&config.url)
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .header(ID_HEADER, &notification.id);
        if let Some(token) = &config.token {
            request = request.header(TOKEN_HEADER, token);
        }
        if let Some(auth) = &config.authentication
            && let (Some(scheme), Some(credentials)) = (auth.schemes.first(), &auth.credentials)
        {
            request = request.header(
                reqwest::header::AUTHORIZATION,
                format!("{scheme} {credentials}"),
            );
        }
        if let Some(signer) = &self.signer {
            for (name, value) in signer.headers(notification, &body) {
                request = request.header(name, value);
            }
        }
        let request = crate::telemetry::propagation::onto(request);
        match request.body(body).send().await {
            Ok(response) => classify(&response),
            Err(e) => match target_error(&e) {
                // A name that does not resolve now may later: retried like a refused connection.
                Some(refusal) => match refusal.unresolved() {
                    Some(why) => Outcome::Retry { why, after: None },
                    None => Outcome::Refused(REFUSED_TARGET.into()),
                },
                None if e.is_builder() => Outcome::Refused(without_url(&e)),
                None => Outcome::Retry {
                    why: without_url(&e),
                    after: None,
                },
            },
        }
    }

    /// The policy's form checks, and the address check for a host given as an address (the
    /// client resolves names through [`CheckedResolver`], which checks them).
    fn check_literal(&self, url: &str) -> Result<(), TargetError> {
        let (host, _) = self.policy.check_url(url)?;
        let bare = host.trim_start_matches('[').trim_end_matches(']');
        if let Ok(addr) = bare.parse::<IpAddr>() {
            self.policy.check_addr(&host, addr)?;
        }
        Ok(())
    }
}

fn classify(response: &reqwest::Response) -> Outcome {
    let status = response.status();
    if status.is_success() {
        return Outcome::Delivered;
    }
    let retryable = status.is_server_error()
        || status == StatusCode::TOO_MANY_REQUESTS
        || status == StatusCode::REQUEST_TIMEOUT;
    if retryable {
        Outcome::Retry {
            why: format!("the receiver answered {status}"),
            after: retry_after(response),
        }
    } else {
        Outcome::Refused(format!("the receiver answered {status}"))
    }
}

/// `Retry-After` in seconds or as an HTTP date.
fn retry_after(response: &reqwest::Response) -> Option<Duration> {
    let value = response
        .headers()
        .get(reqwest::header::RETRY_AFTER)?
        .to_str()
        .ok()?
        .trim();
    if let Ok(seconds) = value.parse::<u64>() {
        return Some(Duration::from_secs(seconds));
    }
    let when = DateTime::parse_from_rfc2822(value).ok()?;
    (when.with_timezone(&Utc) - now()).to_std().ok()
}

/// What the target policy said, when the client's resolver ([`CheckedResolver`]) failed the
/// request: a refused address, or a name that did not resolve.
fn target_error(error: &reqwest::Error) -> Option<&TargetError> {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(e) = source {
        if let Some(target) = e.downcast_ref::<TargetError>() {
            return Some(target);
        }
        source = e.source();
    }
    None
}

/// The error with its causes (reqwest's own message rarely says what happened), without the
/// URL: it may carry secrets in its query, which must stay out of logs.
fn without_url(error: &reqwest::Error) -> String {
    let text = chain(error).to_string();
    match error.url() {
        Some(url) => text.replace(url.as_str(), "<url>"),
        None => text,
    }
}
