//! The `exec` backend: any program, one process per task, JSON lines over stdio.
//!
//! Protocol version 1 (documented in `docs/agents.md`):
//! - argv is `agent.command` (never a shell); the environment is cleared, then `PATH`, the names in
//!   `agent.env`, `A2A_CONTEXT_ID` and `A2A_TASK_ID` are set, and with traces on the turn's W3C
//!   trace context (`TRACEPARENT`, `TRACESTATE`, `BAGGAGE`); the working folder is the server's.
//! - stdin: one JSON object `{"version":1, "contextId", "taskId", "message", "history", "prompt"}`
//!   (and `traceparent`, `tracestate` with traces on) and a newline, then EOF.
//! - stdout: one JSON object per line: `{"text"}` a reply chunk, `{"artifact":{name?, parts}}` a
//!   whole artifact, `{"status", "text"?}` the final state, `{"message":{"parts"}}` a plain-message
//!   answer (when it is the sole output). Any other line is reply text, its newline kept.
//! - exit 0: completed (unless a status line said otherwise); non-zero: failed with the tail of
//!   stderr, unless the program already reported `failed` or `rejected` itself.
//!
//! The process runs in a process group of its own. When the run's future is dropped (cancel,
//! timeout, shutdown), a guard sends SIGTERM to the group, waits `agent.grace_secs`, then sends
//! SIGKILL and reaps the child, so nothing is left behind and no zombie stays.

use super::{Agent, AgentBuildError, AgentError, AgentEvent, AgentRequest, AgentSink};
use crate::config::AgentConfig;
use crate::model::{Artifact, Message, Part, Role, TaskState, now};
use crate::protocol::WireVersion;
use crate::protocol::codec::{decode_part, encode_message};
use futures_util::FutureExt;
use futures_util::future::BoxFuture;
use serde_json::{Map, Value, json};
use std::process::{ExitStatus, Stdio};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, Command};

/// The exec protocol version this server speaks (the `version` field of the input object).
pub const PROTOCOL_VERSION: u64 = 1;

/// Lines of stderr quoted in the status message of a failed run.
const STDERR_TAIL_LINES: usize = 10;

/// How long stderr may stay open after the program exited (a leftover grandchild may hold it).
const STDERR_DRAIN: Duration = Duration::from_millis(500);

#[derive(Debug)]
struct Settings {
    program: String,
    args: Vec<String>,
    env: Vec<String>,
    grace: Duration,
    max_line_bytes: usize,
    max_output_bytes: usize,
    max_stderr_bytes: usize,
}

/// Runs `agent.command` once per task.
#[derive(Debug, Clone)]
pub struct ExecAgent {
    settings: Arc<Settings>,
}

impl ExecAgent {
    pub fn from_config(config: &AgentConfig) -> Result<ExecAgent, AgentBuildError> {
        let Some((program, args)) = config.command.split_first() else {
            return Err(AgentBuildError::Missing {
                field: "agent.command",
                why: "the exec backend needs a program to run \
                      (agent.command = [\"prog\", \"arg\"] or `colloquy serve --agent exec -- prog arg`)",
            });
        };
        if program.is_empty() {
            return Err(AgentBuildError::Invalid(
                "agent.command: the program name is empty".into(),
            ));
        }
        for name in &config.env {
            if name.is_empty() || name.contains('=') || name.contains('\0') {
                return Err(AgentBuildError::Invalid(format!(
                    "agent.env: {name:?} is not an environment variable name"
                )));
            }
        }
        Ok(ExecAgent {
            settings: Arc::new(Settings {
                program: program.clone(),
                args: args.to_vec(),
                env: config.env.clone(),
                grace: Duration::from_secs(config.grace_secs),
                max_line_bytes: config.max_line_bytes.max(1),
                max_output_bytes: config.max_output_bytes.max(1),
                max_stderr_bytes: config.max_stderr_bytes.max(1),
            }),
        })
    }
}

impl Agent for ExecAgent {
    fn kind(&self) -> &'static str {
        "exec"
    }

    fn may_answer_with_message(&self) -> bool {
        true
    }

    fn description(&self) -> String {
        // The program and its first argument (often the script an interpreter runs), by file name.
        let base = |path: &str| {
            std::path::Path::new(path)
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_else(|| path.to_owned())
        };
        let mut name = base(&self.settings.program);
        if let Some(first) = self.settings.args.first().filter(|a| !a.starts_with('-')) {
            name = format!("{name} {}", base(first));
        }
        format!(
            "Runs the program {name} for each message, with the whole conversation \
             (earlier turns as reference) on its input."
        )
    }

    fn run(
        &self,
        request: AgentRequest,
        sink: AgentSink,
    ) -> BoxFuture<'static, Result<(), AgentError>> {
        let settings = self.settings.clone();
        async move {
            run(&settings, request, sink)
                .await
                .map_err(AgentError::from)
        }
        .boxed()
    }
}

/// Why a run failed; becomes the task's status message.
#[derive(Debug, thiserror::Error)]
enum ExecError {
    #[error("could not start {program}: {source}")]
    Spawn {
        program: String,
        source: std::io::Error,
    },
    #[error("reading the program's output: {0}")]
    Read(#[source] std::io::Error),
    #[error("waiting for the program: {0}")]
    Wait(#[source] std::io::Error),
    #[error("the program wrote a line longer than {0} bytes (agent.max_line_bytes)")]
    LineTooLong(usize),
    #[error("the program wrote more than {0} bytes (agent.max_output_bytes)")]
    OutputTooLarge(usize),
    #[error("line {line} of the program's output: {problem}")]
    Protocol {
        line: u64,
        #[source]
        problem: LineError,
    },
    #[error("{program} {how}{stderr}")]
    Exit {
        program: String,
        how: String,
        stderr: String,
    },
    #[error(transparent)]
    Sink(AgentError),
}

impl From<ExecError> for AgentError {
    fn from(e: ExecError) -> Self {
        match e {
            ExecError::Sink(e) => e,
            other => AgentError::Backend(Box::new(other)),
        }
    }
}

/// The request the program reads; `trace` is the turn's trace context (its environment's
/// `TRACEPARENT` and company), added as `traceparent` and `tracestate` when traces are on.
fn input_object(request: &AgentRequest, trace: &[(&str, String)]) -> Vec<u8> {
    let mut message = request.message.clone();
    message
        .context_id
        .get_or_insert_with(|| request.context_id.clone());
    message
        .task_id
        .get_or_insert_with(|| request.task_id.clone());
    let input = json!({
        "version": PROTOCOL_VERSION,
        "contextId": request.context_id,
        "taskId": request.task_id,
        "message": encode_message(WireVersion::V1, &message),
        "history": request.history,
        "prompt": request.prompt,
    });
    let mut input = input;
    if let Some(object) = input.as_object_mut() {
        for (variable, value) in trace {
            if *variable != "BAGGAGE" {
                object.insert(variable.to_ascii_lowercase(), json!(value));
            }
        }
    }
    let mut bytes = serde_json::to_vec(&input).unwrap_or_else(|_| b"{}".to_vec());
    bytes.push(b'\n');
    bytes
}

async fn run(settings: &Settings, request: AgentRequest, sink: AgentSink) -> Result<(), ExecError> {
    let mut command = Command::new(&settings.program);
    command
        .args(&settings.args)
        .env_clear()
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .process_group(0);
    if let Some(path) = std::env::var_os("PATH") {
        command.env("PATH", path);
    }
    for name in &settings.env {
        if let Some(value) = std::env::var_os(name) {
            command.env(name, value);
        }
    }
    command
        .env("A2A_CONTEXT_ID", &request.context_id)
        .env("A2A_TASK_ID", &request.task_id);
    let trace = crate::telemetry::propagation::environment();
    command.envs(trace.iter().map(|(variable, value)| (variable, value)));
    let mut child = command.spawn().map_err(|source| ExecError::Spawn {
        program: settings.program.clone(),
        source,
    })?;
    let stdin = child.stdin.take();
    let stdout = child.stdout.take();
    let stderr = child.stderr.take();
    let pgid = child.id().and_then(|id| libc::pid_t::try_from(id).ok());
    let mut running = Running {
        group: Some(ProcessGroup {
            child,
            pgid,
            reaped: false,
        }),
        grace: settings.grace,
    };
    tracing::debug!(task_id = %request.task_id, pid = ?pgid, "exec agent started");

    let input = input_object(&request, &trace);
    let mut relay = Relay {
        sink: &sink,
        context_id: &request.context_id,
        max_line_bytes: settings.max_line_bytes,
        max_output_bytes: settings.max_output_bytes,
        total: 0,
        lines: 0,
        reported_failure: false,
    };
    let mut tail = StderrTail::new(settings.max_stderr_bytes);
    let (relayed, status) = {
        let mut collect = std::pin::pin!(collect_stderr(stderr, &mut tail));
        let mut stderr_done = false;
        let mut write = Box::pin(write_input(stdin, input));
        let mut written = false;
        let mut out = std::pin::pin!(relay.run(stdout));
        let relayed = loop {
            tokio::select! {
                _ = &mut write, if !written => written = true,
                _ = &mut collect, if !stderr_done => stderr_done = true,
                result = &mut out => break result,
            }
        };
        // stdout is closed: stop feeding stdin (the program no longer answers).
        drop(write);
        let reported_failure = relayed?;
        let status = loop {
            tokio::select! {
                _ = &mut collect, if !stderr_done => stderr_done = true,
                status = running.wait() => break status.map_err(ExecError::Wait)?,
            }
        };
        if !stderr_done {
            let _ = tokio::time::timeout(STDERR_DRAIN, &mut collect).await;
        }
        (reported_failure, status)
    };
    tracing::debug!(task_id = %request.task_id, %status, "exec agent exited");
    if status.success() || relayed {
        return Ok(());
    }
    let how = match (
        status.code(),
        std::os::unix::process::ExitStatusExt::signal(&status),
    ) {
        (Some(code), _) => format!("exited with code {code}"),
        (None, Some(signal)) => format!("was killed by signal {signal}"),
        (None, None) => format!("ended: {status}"),
    };
    let stderr = tail.last_lines(STDERR_TAIL_LINES);
    Err(ExecError::Exit {
        program: settings.program.clone(),
        how,
        stderr: if stderr.is_empty() {
            String::new()
        } else {
            format!("; stderr:\n{stderr}")
        },
    })
}

async fn write_input(stdin: Option<ChildStdin>, input: Vec<u8>) {
    if let Some(mut stdin) = stdin {
        // A program that does not read its input may close stdin: that is not an error.
        if stdin.write_all(&input).await.is_ok() {
            let _ = stdin.shutdown().await;
        }
    }
}

/// The last `capacity` bytes written to stderr.
struct StderrTail {
    buf: Vec<u8>,
    capacity: usize,
    cut: bool,
}

impl StderrTail {
    fn new(capacity: usize) -> Self {
        StderrTail {
            buf: Vec::new(),
            capacity,
            cut: false,
        }
    }

    fn push(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
        if self.buf.len() > self.capacity {
            let excess = self.buf.len() - self.capacity;
            self.buf.drain(..excess);
            self.cut = true;
        }
    }

    fn last_lines(&self, count: usize) -> String {
        let text = String::from_utf8_lossy(&self.buf);
        let mut text: &str = &text;
        if self.cut {
            // The first line was cut in the middle: skip it.
            text = text.split_once('\n').map(|(_, rest)| rest).unwrap_or(text);
        }
        let lines: Vec<&str> = text
            .lines()
            .map(str::trim_end)
            .filter(|l| !l.is_empty())
            .collect();
        lines[lines.len().saturating_sub(count)..].join("\n")
    }
}

async fn collect_stderr(stderr: Option<impl AsyncRead + Unpin>, tail: &mut StderrTail) {
    let Some(mut stderr) = stderr else { return };
    let mut chunk = vec![0u8; 4096];
    loop {
        match stderr.read(&mut chunk).await {
            Ok(0) | Err(_) => return,
            Ok(n) => tail.push(&chunk[..n]),
        }
    }
}

/// Turns stdout lines into agent events.
struct Relay<'a> {
    sink: &'a AgentSink,
    context_id: &'a str,
    max_line_bytes: usize,
    max_output_bytes: usize,
    total: usize,
    lines: u64,
    /// The program itself reported `failed` or `rejected`: its exit code adds nothing.
    reported_failure: bool,
}

impl Relay<'_> {
    /// Relays every line; `true` when the program reported `failed` or `rejected` itself.
    async fn run(&mut self, stdout: Option<impl AsyncRead + Unpin>) -> Result<bool, ExecError> {
        let Some(stdout) = stdout else {
            return Ok(false);
        };
        let mut reader = BufReader::with_capacity(64 * 1024, stdout);
        let mut line = Vec::new();
        while read_line(&mut reader, &mut line, self.max_line_bytes).await? {
            self.total += line.len();
            if self.total > self.max_output_bytes {
                return Err(ExecError::OutputTooLarge(self.max_output_bytes));
            }
            self.lines += 1;
            let event =
                parse_line(&line, self.context_id).map_err(|problem| ExecError::Protocol {
                    line: self.lines,
                    problem,
                })?;
            if let AgentEvent::Status {
                state: TaskState::Failed | TaskState::Rejected,
                ..
            } = event
            {
                self.reported_failure = true;
            }
            self.sink.send(event).await.map_err(ExecError::Sink)?;
        }
        Ok(self.reported_failure)
    }
}

/// Reads one line, its `\n` included, into `line`; `false` at the end of the stream.
async fn read_line(
    reader: &mut (impl AsyncBufRead + Unpin),
    line: &mut Vec<u8>,
    max: usize,
) -> Result<bool, ExecError> {
    line.clear();
    loop {
        let available = reader.fill_buf().await.map_err(ExecError::Read)?;
        if available.is_empty() {
            return Ok(!line.is_empty());
        }
        let (take, done) = match available.iter().position(|b| *b == b'\n') {
            Some(at) => (at + 1, true),
            None => (available.len(), false),
        };
        let content = if done { take - 1 } else { take };
        if line.len() + content > max {
            return Err(ExecError::LineTooLong(max));
        }
        line.extend_from_slice(&available[..take]);
        reader.consume(take);
        if done {
            return Ok(true);
        }
    }
}

/// Why a protocol object on a line of the program's output does not fit.
#[derive(Debug, thiserror::Error)]
enum LineError {
    #[error("{0}")]
    Shape(String),
    #[error(transparent)]
    Part(#[from] crate::protocol::fields::FieldError),
}

impl From<String> for LineError {
    fn from(why: String) -> Self {
        LineError::Shape(why)
    }
}

impl From<&str> for LineError {
    fn from(why: &str) -> Self {
        LineError::Shape(why.to_owned())
    }
}

/// One stdout line as an event. `Err` for a protocol object that does not fit.
fn parse_line(line: &[u8], context_id: &str) -> Result<AgentEvent, LineError> {
    let as_text = || AgentEvent::Text(String::from_utf8_lossy(line).into_owned());
    let Ok(text) = std::str::from_utf8(line) else {
        return Ok(as_text());
    };
    let trimmed = text.trim_end_matches(['\n', '\r']);
    let Ok(Value::Object(object)) = serde_json::from_str::<Value>(trimmed) else {
        return Ok(as_text());
    };
    if let Some(status) = object.get("status") {
        return parse_status(status, &object);
    }
    if let Some(artifact) = object.get("artifact") {
        return parse_artifact(artifact);
    }
    if let Some(message) = object.get("message") {
        return parse_message(message, context_id);
    }
    match object.get("text") {
        Some(Value::String(chunk)) => Ok(AgentEvent::Text(chunk.clone())),
        Some(_) => Err("\"text\" must be a string".into()),
        // A JSON object this version does not know: it is text like any other line.
        None => Ok(as_text()),
    }
}

fn parse_status(status: &Value, object: &Map<String, Value>) -> Result<AgentEvent, LineError> {
    const ALLOWED: [TaskState; 6] = [
        TaskState::Completed,
        TaskState::InputRequired,
        TaskState::AuthRequired,
        TaskState::Failed,
        TaskState::Rejected,
        TaskState::Working,
    ];
    let name = status
        .as_str()
        .ok_or_else(|| "\"status\" must be a string".to_owned())?;
    let state = ALLOWED
        .into_iter()
        .find(|s| s.as_str() == name)
        .ok_or_else(|| {
            format!(
                "unknown status {name:?}; use \"completed\", \"input-required\", \
                 \"auth-required\", \"failed\", \"rejected\" or \"working\""
            )
        })?;
    let text = match object.get("text") {
        None | Some(Value::Null) => None,
        Some(Value::String(text)) => Some(text.clone()),
        Some(_) => return Err("\"text\" of a status line must be a string".into()),
    };
    Ok(AgentEvent::Status { state, text })
}

fn parse_parts(value: Option<&Value>, path: &str) -> Result<Vec<Part>, LineError> {
    let parts = value
        .and_then(Value::as_array)
        .ok_or_else(|| format!("{path} must be an array of parts"))?;
    parts
        .iter()
        .enumerate()
        .map(|(i, part)| {
            decode_part(WireVersion::V1, part, &format!("{path}[{i}]")).map_err(LineError::from)
        })
        .collect()
}

fn optional_string(
    object: &Map<String, Value>,
    key: &str,
    path: &str,
) -> Result<Option<String>, LineError> {
    match object.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(_) => Err(format!("{path}.{key} must be a string").into()),
    }
}

fn parse_artifact(artifact: &Value) -> Result<AgentEvent, LineError> {
    let object = artifact
        .as_object()
        .ok_or_else(|| "\"artifact\" must be an object".to_owned())?;
    let parts = parse_parts(object.get("parts"), "artifact.parts")?;
    Ok(AgentEvent::Artifact(Artifact {
        artifact_id: uuid::Uuid::new_v4().to_string(),
        name: optional_string(object, "name", "artifact")?,
        description: optional_string(object, "description", "artifact")?,
        parts,
        metadata: object.get("metadata").and_then(Value::as_object).cloned(),
    }))
}

fn parse_message(message: &Value, context_id: &str) -> Result<AgentEvent, LineError> {
    let object = message
        .as_object()
        .ok_or_else(|| "\"message\" must be an object".to_owned())?;
    let parts = parse_parts(object.get("parts"), "message.parts")?;
    Ok(AgentEvent::Message(Message {
        message_id: uuid::Uuid::new_v4().to_string(),
        role: Role::Agent,
        parts,
        context_id: Some(context_id.to_owned()),
        task_id: None,
        reference_task_ids: Vec::new(),
        metadata: object.get("metadata").and_then(Value::as_object).cloned(),
        extensions: Vec::new(),
        timestamp: Some(now()),
    }))
}

/// The child, leader of its own process group.
struct ProcessGroup {
    child: Child,
    pgid: Option<libc::pid_t>,
    reaped: bool,
}

impl ProcessGroup {
    fn signal(&self, signal: libc::c_int) {
        if let Some(pgid) = self.pgid.filter(|p| *p > 0) {
            // SAFETY: killpg only sends a signal. The group id is our child's pid; while the child is
            // not reaped (or any member of its group lives) that id cannot belong to anyone else.
            unsafe {
                libc::killpg(pgid, signal);
            }
        }
    }

    async fn wait(&mut self) -> std::io::Result<ExitStatus> {
        let status = self.child.wait().await?;
        self.reaped = true;
        Ok(status)
    }

    /// SIGTERM to the group; after `grace`, SIGKILL; then reap.
    async fn terminate(mut self, grace: Duration) {
        self.signal(libc::SIGTERM);
        if tokio::time::timeout(grace, self.child.wait()).await.is_ok() {
            self.reaped = true;
            // Members of the group that outlived their leader.
            self.signal(libc::SIGKILL);
            return;
        }
        self.signal(libc::SIGKILL);
        if self.child.wait().await.is_ok() {
            self.reaped = true;
        }
        tracing::debug!(pid = ?self.pgid, "exec agent killed after the grace period");
    }
}

impl Drop for ProcessGroup {
    fn drop(&mut self) {
        if !self.reaped {
            // No runtime to wait on: kill now; tokio reaps the orphan (kill_on_drop).
            self.signal(libc::SIGKILL);
        }
    }
}

/// Owns the running process; when the run is dropped before the process was reaped, terminates it
/// gracefully in a task of its own.
struct Running {
    group: Option<ProcessGroup>,
    grace: Duration,
}

impl Running {
    async fn wait(&mut self) -> std::io::Result<ExitStatus> {
        match self.group.as_mut() {
            Some(group) => group.wait().await,
            None => Err(std::io::Error::other("the program was already reaped")),
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let Some(group) = self.group.take() else {
            return;
        };
        if group.reaped {
            return;
        }
        match tokio::runtime::Handle::try_current() {
            Ok(handle) => {
                handle.spawn(group.terminate(self.grace));
            }
            Err(_) => drop(group),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_map_to_events() {
        let event = parse_line(b"{\"text\":\"hi\"}\n", "c").unwrap();
        assert!(matches!(event, AgentEvent::Text(t) if t == "hi"));
        let event = parse_line(b"plain words\n", "c").unwrap();
        assert!(matches!(event, AgentEvent::Text(t) if t == "plain words\n"));
        let event = parse_line(b"{\"other\":1}\n", "c").unwrap();
        assert!(matches!(event, AgentEvent::Text(t) if t == "{\"other\":1}\n"));
        let event = parse_line(
            b"{\"status\":\"input-required\",\"text\":\"which?\"}\r\n",
            "c",
        )
        .unwrap();
        assert!(matches!(
            event,
            AgentEvent::Status { state: TaskState::InputRequired, text: Some(t) } if t == "which?"
        ));
        assert!(parse_line(b"{\"status\":\"canceled\"}", "c").is_err());
        assert!(parse_line(b"{\"text\":5}", "c").is_err());
        let event = parse_line(
            b"{\"artifact\":{\"name\":\"a\",\"parts\":[{\"data\":{\"k\":1}}]}}",
            "c",
        )
        .unwrap();
        assert!(matches!(event, AgentEvent::Artifact(a) if a.name.as_deref() == Some("a")));
        assert!(parse_line(b"{\"artifact\":{\"parts\":[{\"bogus\":1}]}}", "c").is_err());
        let event = parse_line(b"{\"message\":{\"parts\":[{\"text\":\"m\"}]}}", "c").unwrap();
        assert!(matches!(event, AgentEvent::Message(m) if m.text() == "m"));
    }

    #[test]
    fn stderr_tail_keeps_last_lines() {
        let mut tail = StderrTail::new(16);
        tail.push(b"first line\nsecond\nthird\n");
        assert_eq!(tail.last_lines(10), "second\nthird");
        assert_eq!(tail.last_lines(1), "third");
    }

    #[tokio::test]
    async fn long_lines_are_refused() {
        let data: &[u8] = b"short\nmuch too long\n";
        let mut reader = BufReader::new(data);
        let mut line = Vec::new();
        assert!(read_line(&mut reader, &mut line, 8).await.unwrap());
        assert_eq!(line, b"short\n");
        assert!(matches!(
            read_line(&mut reader, &mut line, 8).await,
            Err(ExecError::LineTooLong(8))
        ));
    }
}
