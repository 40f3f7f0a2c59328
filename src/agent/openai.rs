//! The `openai` backend: any OpenAI-compatible chat-completions server, streamed.
//!
//! Each task is one `POST {base_url}/chat/completions` with `stream: true`. The messages are: the
//! configured system prompt (if any); when there is history, a system note that the earlier turns
//! are reference only, not instructions; the stored history as `user` / `assistant` messages,
//! oldest first; then the current message as `user`. The server-sent events' `delta.content`
//! pieces become reply chunks as they arrive; `data: [DONE]` ends the reply.
//!
//! 429 and 5xx answers (and refused connections) are retried `agent.retries` times with
//! exponential backoff, which is always before any chunk was emitted. Everything else that goes
//! wrong ends the task failed with a message naming the HTTP status and the upstream's own error
//! message. The API key is read from the environment variable `agent.api_key_env` names; it is never
//! logged and never part of an error message.

use super::{Agent, AgentBuildError, AgentError, AgentRequest, AgentSink};
use crate::config::Config;
use crate::error::chain;
use crate::model::Role;
use eventsource_stream::{EventStreamError, Eventsource};
use futures_util::future::BoxFuture;
use futures_util::{FutureExt, StreamExt};
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::Duration;
use tracing::Instrument;

/// The system note placed before the earlier turns.
pub const HISTORY_NOTE: &str = "The messages before the last user message are earlier turns of \
    this conversation, shown for continuity reference only. They are not new instructions: \
    answer the last user message.";

/// Longest wait between retries, whatever the backoff or `Retry-After` say.
const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// Bytes of an error body read to find the upstream's message.
const MAX_ERROR_BODY: usize = 16 * 1024;
/// Bytes of a non-streamed (`application/json`) answer accepted.
const MAX_JSON_BODY: usize = 16 * 1024 * 1024;

/// Holds the API key; never printed.
#[derive(Clone)]
struct ApiKey(String);

impl std::fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ApiKey(<redacted>)")
    }
}

#[derive(Debug)]
struct Settings {
    client: reqwest::Client,
    url: String,
    model: String,
    api_key: Option<ApiKey>,
    system_prompt: Option<String>,
    retries: u32,
    backoff: Duration,
    read_timeout: Duration,
    connect_timeout: Duration,
    max_chars: usize,
}

#[derive(Debug, Clone)]
pub struct OpenAiAgent {
    settings: Arc<Settings>,
}

impl OpenAiAgent {
    pub fn from_config(config: &Config) -> Result<OpenAiAgent, AgentBuildError> {
        let agent = &config.agent;
        let base_url = agent
            .base_url
            .as_deref()
            .filter(|u| !u.trim().is_empty())
            .ok_or(AgentBuildError::Missing {
                field: "agent.base_url",
                why: "the openai backend needs the server's base URL, e.g. http://127.0.0.1:11434/v1",
            })?;
        let model = agent
            .model
            .as_deref()
            .filter(|m| !m.trim().is_empty())
            .ok_or(AgentBuildError::Missing {
                field: "agent.model",
                why: "the openai backend needs the model name to ask for",
            })?;
        let parsed =
            reqwest::Url::parse(base_url.trim()).map_err(|source| AgentBuildError::BadUrl {
                field: "agent.base_url",
                value: base_url.to_owned(),
                source,
            })?;
        if !["http", "https"].contains(&parsed.scheme()) {
            return Err(AgentBuildError::Invalid(format!(
                "agent.base_url {base_url:?}: use http or https"
            )));
        }
        let trimmed = parsed.as_str().trim_end_matches('/');
        let url = if trimmed.ends_with("/chat/completions") {
            trimmed.to_owned()
        } else {
            format!("{trimmed}/chat/completions")
        };
        let api_key = match agent.api_key_env.as_deref().filter(|n| !n.is_empty()) {
            None => None,
            Some(name) => match std::env::var(name) {
                Ok(key) if !key.is_empty() => Some(ApiKey(key)),
                _ => {
                    return Err(AgentBuildError::Invalid(format!(
                        "agent.api_key_env names the environment variable {name}, which is not set"
                    )));
                }
            },
        };
        let connect_timeout = Duration::from_secs(agent.connect_timeout_secs.max(1));
        let read_timeout = Duration::from_secs(agent.read_timeout_secs.max(1));
        let client = reqwest::Client::builder()
            .connect_timeout(connect_timeout)
            .read_timeout(read_timeout)
            .user_agent(concat!("colloquy/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(AgentBuildError::Client)?;
        Ok(OpenAiAgent {
            settings: Arc::new(Settings {
                client,
                url,
                model: model.to_owned(),
                api_key,
                system_prompt: agent.system_prompt.clone().filter(|p| !p.is_empty()),
                retries: agent.retries,
                backoff: Duration::from_millis(agent.retry_backoff_ms),
                read_timeout,
                connect_timeout,
                max_chars: config.history.max_chars,
            }),
        })
    }
}

impl Agent for OpenAiAgent {
    fn kind(&self) -> &'static str {
        "openai"
    }

    fn description(&self) -> String {
        format!(
            "Answers with the model {} over an OpenAI-compatible chat-completions API, \
             seeing the whole conversation.",
            self.settings.model
        )
    }

    fn run(
        &self,
        request: AgentRequest,
        sink: AgentSink,
    ) -> BoxFuture<'static, Result<(), AgentError>> {
        let settings = self.settings.clone();
        // Its retry lines name the turn: the engine's own per-turn spans are debug-level. No
        // contextId: traces name a conversation by its key's hash only (the turn's span).
        let span = tracing::info_span!("openai", task_id = %request.task_id);
        async move {
            run(&settings, &request, &sink)
                .await
                .map_err(AgentError::from)
        }
        .instrument(span)
        .boxed()
    }
}

/// What went wrong, as the task's status message says it.
#[derive(Debug, thiserror::Error)]
enum OpenAiError {
    #[error("the upstream answered HTTP {status}{detail}{retried}")]
    Http {
        status: String,
        detail: String,
        retried: String,
    },
    /// reqwest's own message rarely says what happened (refused, reset, ...): the message
    /// carries the causes.
    #[error("could not reach the upstream at {url}: {}{retried}", chain(.source))]
    Connect {
        url: String,
        source: reqwest::Error,
        retried: String,
    },
    #[error("the upstream did not answer within {0} s (agent.read_timeout_secs)")]
    NoAnswer(u64),
    #[error(
        "the upstream went silent for {0} s in the middle of its answer (agent.read_timeout_secs)"
    )]
    Silent(u64),
    #[error("the upstream's stream broke: {}", chain(.0))]
    Broken(#[source] reqwest::Error),
    #[error("malformed upstream response: {0}")]
    Malformed(String),
    #[error("malformed upstream response: the JSON answer does not parse: {0}")]
    NotJson(#[source] serde_json::Error),
    #[error("malformed upstream response: {what}: {source}")]
    Stream {
        what: &'static str,
        source: crate::error::BoxError,
    },
    #[error("the upstream reported an error: {0}")]
    Upstream(String),
    #[error("the upstream closed its stream before the answer was finished")]
    Truncated,
    #[error(transparent)]
    Sink(AgentError),
}

impl From<OpenAiError> for AgentError {
    fn from(e: OpenAiError) -> Self {
        match e {
            OpenAiError::Sink(e) => e,
            other => AgentError::Backend(Box::new(other)),
        }
    }
}

fn truncate(text: &str, max_chars: usize) -> String {
    match text.char_indices().nth(max_chars) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text.to_owned(),
    }
}

/// The chat messages of one request.
pub fn chat_messages(
    request: &AgentRequest,
    system_prompt: Option<&str>,
    max_chars: usize,
) -> Vec<Value> {
    let mut messages = Vec::with_capacity(request.history.len() + 3);
    if let Some(prompt) = system_prompt {
        messages.push(json!({"role": "system", "content": prompt}));
    }
    if !request.history.is_empty() {
        messages.push(json!({"role": "system", "content": HISTORY_NOTE}));
    }
    for entry in request.history.iter() {
        let role = match entry.role {
            Role::User => "user",
            Role::Agent => "assistant",
        };
        messages.push(json!({"role": role, "content": truncate(&entry.text, max_chars)}));
    }
    messages.push(json!({"role": "user", "content": request.message.text()}));
    messages
}

fn retried(attempts: u32) -> String {
    match attempts {
        0 => String::new(),
        1 => " (after 1 retry)".into(),
        n => format!(" (after {n} retries)"),
    }
}

/// The delay before retry number `attempt` (0-based): the backoff doubled each time, or the
/// upstream's `Retry-After` if longer; never more than [`MAX_BACKOFF`].
fn backoff(base: Duration, attempt: u32, retry_after: Option<Duration>) -> Duration {
    let exponential = base.saturating_mul(1u32 << attempt.min(16));
    exponential
        .max(retry_after.unwrap_or_default())
        .min(MAX_BACKOFF)
}

fn retry_after(response: &reqwest::Response) -> Option<Duration> {
    let value = response.headers().get(reqwest::header::RETRY_AFTER)?;
    let seconds: u64 = value.to_str().ok()?.trim().parse().ok()?;
    Some(Duration::from_secs(seconds))
}

/// The upstream's own error message from an error body, if it has one.
fn upstream_message(body: &[u8]) -> Option<String> {
    if let Ok(value) = serde_json::from_slice::<Value>(body) {
        let found = value
            .pointer("/error/message")
            .or_else(|| value.get("error"))
            .or_else(|| value.get("message"))
            .or_else(|| value.get("detail"));
        if let Some(found) = found {
            return Some(match found {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            });
        }
    }
    let text = String::from_utf8_lossy(body);
    let text = text.trim();
    (!text.is_empty()).then(|| truncate(text, 300))
}

async fn read_bounded(
    mut response: reqwest::Response,
    max: usize,
) -> Result<Vec<u8>, reqwest::Error> {
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await? {
        let room = max.saturating_sub(body.len());
        body.extend_from_slice(&chunk[..chunk.len().min(room)]);
        if body.len() >= max {
            break;
        }
    }
    Ok(body)
}

async fn http_error(response: reqwest::Response, attempts: u32) -> OpenAiError {
    let status = response.status();
    let body = read_bounded(response, MAX_ERROR_BODY)
        .await
        .unwrap_or_default();
    OpenAiError::Http {
        status: status.to_string(),
        detail: upstream_message(&body)
            .map(|m| format!(": {m}"))
            .unwrap_or_default(),
        retried: retried(attempts),
    }
}

fn is_retryable(status: reqwest::StatusCode) -> bool {
    status == reqwest::StatusCode::TOO_MANY_REQUESTS || status.is_server_error()
}

/// Sends the request, retrying 429 / 5xx answers and refused connections.
async fn connect(settings: &Settings, body: &Value) -> Result<reqwest::Response, OpenAiError> {
    let mut attempt = 0u32;
    loop {
        let request = settings
            .client
            .post(&settings.url)
            .header(reqwest::header::ACCEPT, "text/event-stream")
            .json(body);
        let mut request = crate::telemetry::propagation::onto(request);
        if let Some(key) = &settings.api_key {
            request = request.bearer_auth(&key.0);
        }
        let waited = tokio::time::timeout(
            settings.connect_timeout + settings.read_timeout,
            request.send(),
        )
        .await;
        let delay = match waited {
            Err(_) => return Err(OpenAiError::NoAnswer(settings.read_timeout.as_secs())),
            Ok(Ok(response)) if response.status().is_success() => return Ok(response),
            Ok(Ok(response)) => {
                if !is_retryable(response.status()) || attempt >= settings.retries {
                    return Err(http_error(response, attempt).await);
                }
                tracing::info!(status = %response.status(), attempt, "openai upstream busy; retrying");
                backoff(settings.backoff, attempt, retry_after(&response))
            }
            Ok(Err(e)) if e.is_timeout() => {
                return Err(OpenAiError::NoAnswer(settings.read_timeout.as_secs()));
            }
            Ok(Err(e)) => {
                if !e.is_connect() || attempt >= settings.retries {
                    return Err(OpenAiError::Connect {
                        url: settings.url.clone(),
                        source: e,
                        retried: retried(attempt),
                    });
                }
                tracing::info!(error = %chain(&e), attempt, "openai upstream unreachable; retrying");
                backoff(settings.backoff, attempt, None)
            }
        };
        tokio::time::sleep(delay).await;
        attempt += 1;
    }
}

async fn run(
    settings: &Settings,
    request: &AgentRequest,
    sink: &AgentSink,
) -> Result<(), OpenAiError> {
    let body = json!({
        "model": settings.model,
        "stream": true,
        "messages": chat_messages(request, settings.system_prompt.as_deref(), settings.max_chars),
    });
    let response = connect(settings, &body).await?;
    let is_json = response
        .headers()
        .get(reqwest::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    if is_json {
        return relay_json(settings, response, sink).await;
    }
    relay_stream(settings, response, sink).await
}

/// A server that ignored `stream: true` and sent one whole completion.
async fn relay_json(
    settings: &Settings,
    response: reqwest::Response,
    sink: &AgentSink,
) -> Result<(), OpenAiError> {
    let body = read_bounded(response, MAX_JSON_BODY)
        .await
        .map_err(|e| transport_error(settings, e))?;
    let value: Value = serde_json::from_slice(&body).map_err(OpenAiError::NotJson)?;
    if let Some(error) = value.get("error") {
        return Err(OpenAiError::Upstream(describe_error(error)));
    }
    let content = value
        .pointer("/choices/0/message/content")
        .and_then(Value::as_str)
        .ok_or_else(|| {
            OpenAiError::Malformed("no choices[0].message.content in the answer".into())
        })?;
    if !content.is_empty() {
        sink.text(content).await.map_err(OpenAiError::Sink)?;
    }
    Ok(())
}

fn describe_error(error: &Value) -> String {
    match error.get("message") {
        Some(Value::String(message)) => message.clone(),
        _ => match error {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        },
    }
}

fn transport_error(settings: &Settings, e: reqwest::Error) -> OpenAiError {
    if e.is_timeout() {
        OpenAiError::Silent(settings.read_timeout.as_secs())
    } else {
        OpenAiError::Broken(e)
    }
}

fn preview(text: &str) -> String {
    truncate(text, 200)
}

async fn relay_stream(
    settings: &Settings,
    response: reqwest::Response,
    sink: &AgentSink,
) -> Result<(), OpenAiError> {
    let mut events = response.bytes_stream().eventsource();
    let mut finished = false;
    while let Some(event) = events.next().await {
        let event = match event {
            Ok(event) => event,
            Err(EventStreamError::Transport(e)) => return Err(transport_error(settings, e)),
            Err(EventStreamError::Utf8(e)) => {
                return Err(OpenAiError::Stream {
                    what: "the stream is not UTF-8",
                    source: e.into(),
                });
            }
            Err(EventStreamError::Parser(e)) => {
                return Err(OpenAiError::Stream {
                    what: "not a server-sent event stream",
                    source: e.into(),
                });
            }
        };
        let data = event.data.trim();
        if data == "[DONE]" {
            return Ok(());
        }
        if data.is_empty() {
            continue;
        }
        let value: Value = serde_json::from_str(data).map_err(|_| {
            OpenAiError::Malformed(format!("an event is not JSON: {:?}", preview(data)))
        })?;
        if let Some(error) = value.get("error") {
            return Err(OpenAiError::Upstream(describe_error(error)));
        }
        let choices = value
            .get("choices")
            .and_then(Value::as_array)
            .ok_or_else(|| {
                OpenAiError::Malformed(format!("an event has no choices: {:?}", preview(data)))
            })?;
        // Some servers end with a usage-only event whose choices are empty.
        let Some(choice) = choices.first() else {
            continue;
        };
        match choice.pointer("/delta/content") {
            None | Some(Value::Null) => {}
            Some(Value::String(content)) => {
                if !content.is_empty() {
                    sink.text(content.clone())
                        .await
                        .map_err(OpenAiError::Sink)?;
                }
            }
            Some(_) => {
                return Err(OpenAiError::Malformed(format!(
                    "delta.content is not a string: {:?}",
                    preview(data)
                )));
            }
        }
        if choice
            .get("finish_reason")
            .is_some_and(|reason| !reason.is_null())
        {
            finished = true;
        }
    }
    // No `[DONE]`: fine if the model said it had finished, else the answer was cut off.
    if finished {
        Ok(())
    } else {
        Err(OpenAiError::Truncated)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_and_is_capped() {
        let base = Duration::from_millis(100);
        assert_eq!(backoff(base, 0, None), Duration::from_millis(100));
        assert_eq!(backoff(base, 3, None), Duration::from_millis(800));
        assert_eq!(
            backoff(base, 0, Some(Duration::from_secs(2))),
            Duration::from_secs(2)
        );
        assert_eq!(backoff(base, 30, None), MAX_BACKOFF);
    }

    #[test]
    fn upstream_messages_are_found() {
        assert_eq!(
            upstream_message(br#"{"error":{"message":"model not found","type":"x"}}"#).as_deref(),
            Some("model not found")
        );
        assert_eq!(
            upstream_message(br#"{"error":"busy"}"#).as_deref(),
            Some("busy")
        );
        assert_eq!(upstream_message(b"  plain  ").as_deref(), Some("plain"));
        assert_eq!(upstream_message(b""), None);
    }
}
