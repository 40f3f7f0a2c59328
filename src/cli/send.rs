//! `colloquy send`: talk to any A2A agent by peer name, `a2a:NAME`, URL or `ctx-` session id.
//!
//! Exit codes: 0 the peer answered (completed, or waiting for input), 1 local trouble (config,
//! state file, stdin), 2 the target did not resolve or the command line is wrong (nothing sent),
//! 3 connection refused / timeout / TLS / unreachable, 4 HTTP 401 or a missing token,
//! 5 the peer's JSON-RPC error or another HTTP or protocol error, 6 the task failed, was
//! rejected or canceled.

use super::CliError;
use crate::client::{self, ClientError, ClientOptions, Peer, TaskAssembler};
use crate::config::Config;
use crate::error::chain;
use crate::model::{Message, SendResult, Task, TaskState};
use chrono::{DateTime, Utc};
use clap::Args;
use futures_util::StreamExt;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;
use tracing::Instrument;

pub const EXIT_OK: u8 = 0;
pub const EXIT_LOCAL: u8 = 1;
pub const EXIT_TARGET: u8 = 2;
pub const EXIT_CONNECT: u8 = 3;
pub const EXIT_AUTH: u8 = 4;
pub const EXIT_PEER: u8 = 5;
pub const EXIT_TASK: u8 = 6;

#[derive(Args, Debug, Clone)]
pub struct SendArgs {
    /// Where to send: a configured peer name, a2a:NAME, an http(s):// URL, or a ctx-... session id.
    #[arg(long, required_unless_present = "list")]
    to: Option<String>,
    /// Start a new conversation instead of continuing the last one with this peer.
    #[arg(long, conflicts_with_all = ["context", "task"])]
    new: bool,
    /// Continue this contextId with the peer.
    #[arg(long)]
    context: Option<String>,
    /// Answer this task (one waiting for input).
    #[arg(long)]
    task: Option<String>,
    /// Print the reply as it arrives.
    #[arg(long)]
    stream: bool,
    /// Machine-readable output: JSON lines (`{"chunk":..}` with --stream, then one result object).
    #[arg(long)]
    json: bool,
    /// List the configured peers (checking their cards) and the remembered sessions.
    #[arg(long)]
    list: bool,
    /// TOML configuration file (its [peers.NAME] tables).
    #[arg(long)]
    config: Option<PathBuf>,
    /// Seconds to wait for an answer (for streams: the longest silence).
    #[arg(long, default_value_t = 300)]
    timeout: u64,
    /// The message text, or `-` to read it from standard input.
    text: Option<String>,
}

/// A failure with its exit code.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct SendFailure {
    pub code: u8,
    pub message: String,
}

fn fail(code: u8, message: impl Into<String>) -> SendFailure {
    SendFailure {
        code,
        message: message.into(),
    }
}

impl From<ClientError> for SendFailure {
    fn from(e: ClientError) -> Self {
        if let Some(task) = e.busy_task_id() {
            return fail(
                EXIT_PEER,
                format!(
                    "the peer is still working on task {task} in this conversation; retry later"
                ),
            );
        }
        let code = match &e {
            ClientError::InvalidUrl(..) => EXIT_TARGET,
            ClientError::ConnectionRefused { .. }
            | ClientError::Connect { .. }
            | ClientError::Timeout { .. }
            | ClientError::Tls { .. } => EXIT_CONNECT,
            ClientError::Unauthorized { .. } => EXIT_AUTH,
            ClientError::Rpc { .. }
            | ClientError::Http { .. }
            | ClientError::Request { .. }
            | ClientError::Malformed { .. }
            | ClientError::Card { .. }
            | ClientError::CardSignature { .. }
            | ClientError::TrustedKeys { .. } => EXIT_PEER,
        };
        fail(code, chain(&e).to_string())
    }
}

// ---- sessions ----

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Session {
    pub context_id: String,
    /// The configured peer's name, or none for a URL target.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peer: Option<String>,
    pub url: String,
    pub turns: u64,
    pub created: DateTime<Utc>,
    pub last_used: DateTime<Utc>,
    /// A task waiting for input, answered with `--task`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waiting_task_id: Option<String>,
}

impl Session {
    fn peer_key(&self) -> &str {
        self.peer.as_deref().unwrap_or(&self.url)
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct SessionsFile {
    pub version: u32,
    pub sessions: Vec<Session>,
}

impl Default for SessionsFile {
    fn default() -> Self {
        SessionsFile {
            version: 1,
            sessions: Vec::new(),
        }
    }
}

/// `$COLLOQUY_HOME/sessions.json`, else `<config dir>/colloquy/sessions.json`.
pub fn sessions_path() -> Result<PathBuf, SendFailure> {
    if let Some(home) = std::env::var_os("COLLOQUY_HOME").filter(|h| !h.is_empty()) {
        return Ok(PathBuf::from(home).join("sessions.json"));
    }
    dirs::config_dir()
        .map(|d| d.join("colloquy").join("sessions.json"))
        .ok_or_else(|| {
            fail(
                EXIT_LOCAL,
                "no place for the sessions file: set COLLOQUY_HOME (no platform config folder found)",
            )
        })
}

impl SessionsFile {
    pub fn load(path: &Path) -> Result<SessionsFile, SendFailure> {
        match std::fs::read(path) {
            Ok(bytes) => serde_json::from_slice(&bytes).map_err(|e| {
                fail(
                    EXIT_LOCAL,
                    format!(
                        "the sessions file {} is not valid: {e} (move it away to start afresh)",
                        path.display()
                    ),
                )
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(SessionsFile::default()),
            Err(e) => Err(fail(EXIT_LOCAL, format!("reading {}: {e}", path.display()))),
        }
    }

    /// Written to a temporary file beside it, synced, then renamed over it (and the folder
    /// synced), so a power cut leaves the old sessions or the new ones.
    pub fn save(&self, path: &Path) -> Result<(), SendFailure> {
        let bytes = serde_json::to_vec_pretty(self)
            .map_err(|e| fail(EXIT_LOCAL, format!("encoding the sessions: {e}")))?;
        crate::durable::write_atomic(path, &bytes)
            .map_err(|e| fail(EXIT_LOCAL, format!("writing {}: {e}", path.display())))
    }

    fn find(&self, context_id: &str) -> Option<&Session> {
        self.sessions.iter().find(|s| s.context_id == context_id)
    }

    fn last_for(&self, peer_key: &str) -> Option<&Session> {
        self.sessions
            .iter()
            .filter(|s| s.peer_key() == peer_key)
            .max_by_key(|s| s.last_used)
    }

    fn record(&mut self, peer: Option<&str>, url: &str, context_id: &str, waiting: Option<String>) {
        let now = crate::model::now();
        match self
            .sessions
            .iter_mut()
            .find(|s| s.context_id == context_id)
        {
            Some(session) => {
                session.turns += 1;
                session.last_used = now;
                session.waiting_task_id = waiting;
                session.url = url.to_owned();
            }
            None => self.sessions.push(Session {
                context_id: context_id.to_owned(),
                peer: peer.map(str::to_owned),
                url: url.to_owned(),
                turns: 1,
                created: now,
                last_used: now,
                waiting_task_id: waiting,
            }),
        }
    }
}

// ---- target resolution ----

/// Where a message goes, resolved from `--to`.
#[derive(Debug, Clone, PartialEq)]
pub struct Resolved {
    /// The configured peer's name (none for a URL target).
    pub peer: Option<String>,
    pub url: String,
    pub token_env: Option<String>,
    /// The key set the peer's card must be signed by (`peers.NAME.card_jwks_url`).
    pub card_jwks_url: Option<String>,
    /// The session the target named (`ctx-...`).
    pub session: Option<String>,
}

fn describe_known(config: &Config, sessions: &SessionsFile) -> String {
    let peers = if config.peers.is_empty() {
        "  (none configured: add [peers.NAME] with url = \"...\" to the config file)".to_owned()
    } else {
        config
            .peers
            .iter()
            .map(|(name, peer)| format!("  {name}  {}", peer.url))
            .collect::<Vec<_>>()
            .join("\n")
    };
    let sessions = if sessions.sessions.is_empty() {
        "  (none)".to_owned()
    } else {
        let mut list: Vec<&Session> = sessions.sessions.iter().collect();
        list.sort_by_key(|s| std::cmp::Reverse(s.last_used));
        list.iter()
            .map(|s| format!("  {}  {}", s.context_id, s.peer_key()))
            .collect::<Vec<_>>()
            .join("\n")
    };
    format!("known peers:\n{peers}\nknown sessions:\n{sessions}")
}

/// Resolves `--to`. Never falls back to another destination: what does not resolve is an error.
pub fn resolve(
    target: &str,
    config: &Config,
    config_file: Option<&Path>,
    sessions: &SessionsFile,
    sessions_file: &Path,
) -> Result<Resolved, SendFailure> {
    let config_name = config_file.map_or_else(
        || "no config file given (--config FILE)".to_owned(),
        |f| format!("config {}", f.display()),
    );
    let peer = |name: &str| {
        config.peers.get(name).map(|p| Resolved {
            peer: Some(name.to_owned()),
            url: p.url.clone(),
            token_env: p.token_env.clone(),
            card_jwks_url: p.card_jwks_url.clone(),
            session: None,
        })
    };
    let unresolved = |tried: String| {
        fail(
            EXIT_TARGET,
            format!(
                "cannot resolve target {target:?}: tried {tried}. Nothing was sent.\n{}\n\
                 targets are: a configured peer name, a2a:NAME, an http:// or https:// URL, or a ctx-... session id",
                describe_known(config, sessions)
            ),
        )
    };
    let target = target.trim();
    if target.is_empty() {
        return Err(unresolved("nothing (the target is empty)".into()));
    }
    if target.starts_with("ctx-") {
        return match sessions.find(target) {
            Some(session) => {
                let configured = session.peer.as_deref().and_then(|n| config.peers.get(n));
                Ok(Resolved {
                    peer: session.peer.clone(),
                    url: session.url.clone(),
                    token_env: configured.and_then(|p| p.token_env.clone()),
                    card_jwks_url: configured.and_then(|p| p.card_jwks_url.clone()),
                    session: Some(session.context_id.clone()),
                })
            }
            None => Err(unresolved(format!(
                "a session {target} in {} (not among the {} remembered sessions)",
                sessions_file.display(),
                sessions.sessions.len()
            ))),
        };
    }
    if let Some(name) = target.strip_prefix("a2a:") {
        return peer(name).ok_or_else(|| {
            unresolved(format!("a configured peer named {name:?} ({config_name})"))
        });
    }
    if target.starts_with("http://") || target.starts_with("https://") {
        client::check_url(target)
            .map_err(|e| fail(EXIT_TARGET, format!("{e}. Nothing was sent.")))?;
        return Ok(Resolved {
            peer: None,
            url: target.to_owned(),
            token_env: None,
            card_jwks_url: None,
            session: None,
        });
    }
    if let Some(found) = peer(target) {
        return Ok(found);
    }
    let hint = if target.contains("://") {
        " (only http:// and https:// URLs are supported)"
    } else if target.contains(':') || target.contains('.') {
        " (a URL needs http:// or https:// in front)"
    } else {
        ""
    };
    Err(unresolved(format!(
        "a configured peer named {target:?} ({config_name}){hint}"
    )))
}

// ---- output ----

struct Output {
    json: bool,
}

impl Output {
    fn chunk(&self, text: &str) {
        if text.is_empty() {
            return;
        }
        let mut out = std::io::stdout().lock();
        if self.json {
            let _ = writeln!(out, "{}", json!({ "chunk": text }));
        } else {
            let _ = write!(out, "{text}");
        }
        let _ = out.flush();
    }
}

fn read_text(arg: Option<&str>) -> Result<String, SendFailure> {
    let text = match arg {
        Some("-") => {
            let mut text = String::new();
            std::io::stdin()
                .read_to_string(&mut text)
                .map_err(|e| fail(EXIT_LOCAL, format!("reading standard input: {e}")))?;
            text
        }
        Some(text) => text.to_owned(),
        None => {
            return Err(fail(
                EXIT_TARGET,
                "nothing to send: give the message text, or - to read it from standard input",
            ));
        }
    };
    if text.trim().is_empty() {
        return Err(fail(EXIT_TARGET, "nothing to send: the message is empty"));
    }
    Ok(text)
}

pub fn run(args: SendArgs) -> Result<ExitCode, CliError> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(CliError::Runtime)?;
    let json = args.json;
    match runtime.block_on(run_async(args)) {
        Ok(code) => Ok(ExitCode::from(code)),
        Err(failure) => {
            if json {
                println!(
                    "{}",
                    json!({"error": failure.message, "exitCode": failure.code})
                );
            }
            eprintln!("colloquy send: {}", failure.message);
            Ok(ExitCode::from(failure.code))
        }
    }
}

async fn run_async(args: SendArgs) -> Result<u8, SendFailure> {
    let config = Config::load(args.config.as_deref(), json!({}))
        .map_err(|e| fail(EXIT_LOCAL, e.to_string()))?;
    let traces = crate::telemetry::traces::install_for_command(&config.telemetry)
        .map_err(|e| fail(EXIT_LOCAL, chain(&e).to_string()))?;
    // A span of its own, continuing the trace of whoever started it (an `exec` agent's
    // `TRACEPARENT`): every request it makes carries it.
    let span = tracing::info_span!("send", otel.kind = "client");
    crate::telemetry::propagation::continue_from_environment(&span);
    let code = send(args, config).instrument(span).await;
    traces.shutdown();
    code
}

async fn send(args: SendArgs, config: Config) -> Result<u8, SendFailure> {
    let sessions_file = sessions_path()?;
    let mut sessions = SessionsFile::load(&sessions_file)?;
    if args.list {
        return list(&config, &sessions, args.json).await;
    }
    let target = args.to.clone().unwrap_or_default();
    let resolved = resolve(
        &target,
        &config,
        args.config.as_deref(),
        &sessions,
        &sessions_file,
    )?;
    let text = read_text(args.text.as_deref())?;

    // Which conversation: the session named, --context, a new one, or the last with this peer.
    let peer_key = resolved
        .peer
        .clone()
        .unwrap_or_else(|| resolved.url.clone());
    let context_id = match (&resolved.session, &args.context) {
        (Some(session), Some(context)) if session != context => {
            return Err(fail(
                EXIT_TARGET,
                format!(
                    "--to {session} names a session, and --context {context} another; give one"
                ),
            ));
        }
        (Some(_), _) if args.new => {
            return Err(fail(
                EXIT_TARGET,
                format!(
                    "--to {target} continues a session; --new contradicts it (use --to {peer_key} --new)"
                ),
            ));
        }
        (Some(session), _) => Some(session.clone()),
        (None, Some(context)) => Some(context.clone()),
        (None, None) if args.new => None,
        (None, None) if args.task.is_some() => None,
        (None, None) => sessions.last_for(&peer_key).map(|s| s.context_id.clone()),
    };
    // A new conversation gets a contextId chosen here, so it can be named before the reply.
    let context_id = context_id.unwrap_or_else(crate::engine::new_context_id);

    let token = match &resolved.token_env {
        None => None,
        Some(name) => Some(std::env::var(name).map_err(|_| {
            fail(
                EXIT_AUTH,
                format!(
                    "peer {} needs a bearer token from the environment variable {name}, which is not set",
                    peer_key
                ),
            )
        })?),
    };
    let options = ClientOptions {
        token,
        timeout: Duration::from_secs(args.timeout.max(1)),
        card_jwks_url: resolved.card_jwks_url.clone(),
        ..ClientOptions::default()
    };
    let peer = client::connect(&resolved.url, options).await?;
    let message = client::user_text_message(&text, Some(&context_id), args.task.as_deref());
    let output = Output { json: args.json };

    let (result, streamed) = if args.stream && peer.streaming {
        (stream_reply(&peer, &message, &output).await?, true)
    } else {
        if args.stream && !args.json {
            eprintln!("(the peer does not stream; waiting for the whole reply)");
        }
        (peer.send(&message).await?, false)
    };

    let (answered_context, task) = match &result {
        SendResult::Task(task) => (task.context_id.clone(), Some(task)),
        SendResult::Message(m) => (m.context_id.clone().unwrap_or(context_id.clone()), None),
    };
    let state = task.map(|t| t.status.state);
    let waiting = task
        .filter(|t| t.status.state.is_interrupted())
        .map(|t| t.id.clone());
    sessions.record(
        resolved.peer.as_deref(),
        &resolved.url,
        &answered_context,
        waiting.clone(),
    );
    sessions.save(&sessions_file)?;

    let reply = client::reply_text(&result);
    let status_text = task.and_then(client::status_text);
    let answer_with = waiting.as_ref().map(|task_id| {
        format!("colloquy send --to {answered_context} --task {task_id} \"<your answer>\"")
    });
    let code = match state {
        Some(TaskState::Failed | TaskState::Rejected | TaskState::Canceled) => EXIT_TASK,
        _ => EXIT_OK,
    };
    if args.json {
        let summary = json!({
            "peer": resolved.peer,
            "url": resolved.url,
            "protocolVersion": peer.version.label(),
            "contextId": answered_context,
            "taskId": task.map(|t| t.id.clone()),
            "state": state.map(TaskState::as_str).unwrap_or("message"),
            "reply": reply,
            "statusMessage": status_text,
            "answerWith": answer_with,
        });
        println!("{summary}");
        return Ok(code);
    }
    let mut out = std::io::stdout().lock();
    if !streamed {
        let _ = write!(out, "{reply}");
    }
    if !reply.is_empty() && !reply.ends_with('\n') {
        let _ = writeln!(out);
    }
    let state_label = state.map(TaskState::as_str).unwrap_or("message");
    match state {
        Some(s) if s.is_interrupted() => {
            if let Some(question) = &status_text
                && reply.trim() != question.trim()
            {
                let _ = writeln!(out, "{question}");
            }
            let _ = out.flush();
            eprintln!(
                "[context {answered_context} · task {} is {state_label}: the agent waits for your answer]\n\
                 answer with: {}",
                waiting.as_deref().unwrap_or(""),
                answer_with.as_deref().unwrap_or("")
            );
        }
        Some(s) if code == EXIT_TASK => {
            let _ = out.flush();
            eprintln!(
                "[context {answered_context} · task {} {}{}]",
                task.map(|t| t.id.as_str()).unwrap_or(""),
                s.as_str(),
                status_text.map(|t| format!(": {t}")).unwrap_or_default()
            );
        }
        _ => {
            let _ = out.flush();
            eprintln!("[context {answered_context} · {state_label}]");
        }
    }
    Ok(code)
}

/// Streams the reply, printing each chunk as it arrives; then makes sure the whole reply was
/// printed (fetching the task when the stream closed early) and returns the finished result.
async fn stream_reply(
    peer: &Peer,
    message: &Message,
    output: &Output,
) -> Result<SendResult, SendFailure> {
    let mut assembler = TaskAssembler::default();
    let mut stream = peer.stream(message).await?;
    let mut broken: Option<ClientError> = None;
    while let Some(item) = stream.next().await {
        match item {
            Ok(item) => {
                let text = assembler.apply(item);
                output.chunk(&text);
            }
            Err(e) => {
                broken = Some(e);
                break;
            }
        }
    }
    if let Some(message) = assembler.message.take()
        && assembler.task.is_none()
    {
        return Ok(SendResult::Message(message));
    }
    let Some(task) = assembler.task.clone() else {
        return Err(broken.map(SendFailure::from).unwrap_or_else(|| {
            fail(
                EXIT_PEER,
                "the peer closed the stream without sending a task or a message",
            )
        }));
    };
    if assembler.finished && broken.is_none() {
        return Ok(SendResult::Task(task));
    }
    // Cut short: follow the task until its turn ends, then print what was missing.
    let full = follow(peer, &task.id, peer_timeout(peer)).await?;
    let full_text = client::task_text(&full);
    match full_text.strip_prefix(&assembler.streamed_text) {
        Some(rest) => output.chunk(rest),
        None => {
            if !output.json {
                eprintln!("\n(the stream was cut; the complete reply follows)");
            }
            output.chunk(&full_text);
        }
    }
    Ok(SendResult::Task(full))
}

fn peer_timeout(peer: &Peer) -> Duration {
    peer.timeout()
}

/// Polls the task until it is terminal or waits for input.
async fn follow(peer: &Peer, task_id: &str, limit: Duration) -> Result<Task, SendFailure> {
    let started = std::time::Instant::now();
    loop {
        let task = peer.get_task(task_id).await?;
        if task.status.state.ends_turn() {
            return Ok(task);
        }
        if started.elapsed() > limit {
            return Err(fail(
                EXIT_CONNECT,
                format!(
                    "the stream closed early and task {task_id} is still {} after {} s",
                    task.status.state.as_str(),
                    limit.as_secs()
                ),
            ));
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

async fn list(config: &Config, sessions: &SessionsFile, json_out: bool) -> Result<u8, SendFailure> {
    let checks = config.peers.iter().map(|(name, peer)| async move {
        let token = peer.token_env.as_ref().and_then(|n| std::env::var(n).ok());
        let options = ClientOptions {
            token,
            connect_timeout: Duration::from_secs(3),
            timeout: Duration::from_secs(5),
            card_jwks_url: peer.card_jwks_url.clone(),
        };
        let outcome = client::connect(&peer.url, options).await;
        (name.clone(), peer.url.clone(), outcome)
    });
    let peers = futures_util::future::join_all(checks).await;
    let mut list: Vec<&Session> = sessions.sessions.iter().collect();
    list.sort_by_key(|s| std::cmp::Reverse(s.last_used));
    if json_out {
        let peers: Vec<Value> = peers
            .iter()
            .map(|(name, url, outcome)| match outcome {
                Ok(peer) => json!({"name": name, "url": url, "reachable": true,
                    "cardName": peer.name(), "protocolVersion": peer.version.label()}),
                Err(e) => {
                    json!({"name": name, "url": url, "reachable": false, "error": e.to_string()})
                }
            })
            .collect();
        let sessions: Vec<Value> = list
            .iter()
            .map(|s| {
                json!({"contextId": s.context_id, "peer": s.peer_key(), "url": s.url,
                "turns": s.turns, "lastUsed": crate::model::format_time(&s.last_used),
                "waitingTaskId": s.waiting_task_id})
            })
            .collect();
        println!("{}", json!({"peers": peers, "sessions": sessions}));
        return Ok(EXIT_OK);
    }
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "peers:");
    if peers.is_empty() {
        let _ = writeln!(
            out,
            "  (none configured: add [peers.NAME] with url = \"...\" to the config file)"
        );
    }
    for (name, url, outcome) in &peers {
        let status = match outcome {
            Ok(peer) => format!(
                "card: {} (A2A {})",
                peer.name().unwrap_or("(unnamed)"),
                peer.version.label()
            ),
            Err(e) => format!("unreachable: {e}"),
        };
        let _ = writeln!(out, "  {name}  {url}  {status}");
    }
    let _ = writeln!(out, "sessions:");
    if list.is_empty() {
        let _ = writeln!(out, "  (none)");
    }
    for s in list {
        let waiting = s
            .waiting_task_id
            .as_ref()
            .map(|t| format!("  waiting: task {t}"))
            .unwrap_or_default();
        let _ = writeln!(
            out,
            "  {}  {}  {} turn{}  last used {}{waiting}",
            s.context_id,
            s.peer_key(),
            s.turns,
            if s.turns == 1 { "" } else { "s" },
            crate::model::format_time(&s.last_used)
        );
    }
    Ok(EXIT_OK)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> Config {
        let mut config = Config::default();
        config.peers.insert(
            "alpha".into(),
            crate::config::PeerConfig {
                url: "http://127.0.0.1:1/".into(),
                token_env: None,
                card_jwks_url: None,
            },
        );
        config
    }

    #[test]
    fn every_target_form_resolves_or_fails_with_status_2() {
        let config = config();
        let mut sessions = SessionsFile::default();
        sessions.record(Some("alpha"), "http://127.0.0.1:1/", "ctx-1", None);
        let file = Path::new("/tmp/s.json");
        let r = |t: &str| resolve(t, &config, None, &sessions, file);
        assert_eq!(r("alpha").unwrap().url, "http://127.0.0.1:1/");
        assert_eq!(r("a2a:alpha").unwrap().peer.as_deref(), Some("alpha"));
        assert_eq!(r("http://127.0.0.1:2/").unwrap().peer, None);
        assert_eq!(r("ctx-1").unwrap().session.as_deref(), Some("ctx-1"));
        for bad in [
            "beta",
            "a2a:beta",
            "ctx-2",
            "127.0.0.1:2",
            "ftp://x/",
            "",
            "http://",
        ] {
            let e = r(bad).unwrap_err();
            assert_eq!(e.code, EXIT_TARGET, "{bad}: {}", e.message);
        }
        let e = r("beta").unwrap_err().message;
        assert!(e.contains("alpha") && e.contains("ctx-1"), "{e}");
    }
}
