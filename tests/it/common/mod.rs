//! Shared test harness: a real server on port 0 with a real sled store in a temp folder.

pub mod pg;

use colloquy::agent::{EchoAgent, SharedAgent};
use colloquy::config::Config;
use colloquy::http::RunningServer;
use serde_json::{Value, json};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

pub const V1: &str = "1.0";
pub const V03: &str = "0.3";

pub struct TestServer {
    pub server: RunningServer,
    pub dir: tempfile::TempDir,
    pub url: String,
    pub client: reqwest::Client,
}

/// Waits past the current millisecond. Listings order by time in milliseconds, a tie by id, so
/// writes a test lists in order must not share one (a turn can take less).
pub async fn next_millisecond() {
    tokio::time::sleep(std::time::Duration::from_millis(2)).await;
}

/// A config for tests: loopback, port 0 (gRPC too), data in `dir`.
pub fn test_config(dir: &std::path::Path) -> Config {
    let mut config = Config {
        listen: "127.0.0.1:0".into(),
        grpc_listen: "127.0.0.1:0".into(),
        data: dir.to_path_buf(),
        workers: 2,
        ..Config::default()
    };
    config.shutdown.grace_secs = 5;
    config
}

pub async fn start_with(agent: SharedAgent, tweak: impl FnOnce(&mut Config)) -> TestServer {
    let dir = tempfile::tempdir().expect("temp dir");
    start_in(dir, agent, tweak).await
}

/// Starts a server on an existing folder (for restart tests).
pub async fn start_in(
    dir: tempfile::TempDir,
    agent: SharedAgent,
    tweak: impl FnOnce(&mut Config),
) -> TestServer {
    let mut config = test_config(dir.path());
    tweak(&mut config);
    let server = colloquy::app::start(config, agent)
        .await
        .expect("server starts");
    let url = server.url();
    TestServer {
        server,
        dir,
        url,
        client: reqwest::Client::new(),
    }
}

pub async fn start_echo() -> TestServer {
    start_echo_with(|_| {}).await
}

/// The echo agent with `tweak` applied to the test config.
pub async fn start_echo_with(tweak: impl FnOnce(&mut Config)) -> TestServer {
    start_with(Arc::new(EchoAgent::default()), tweak).await
}

/// The echo agent behind two principals' tokens: alice (`alice-secret`), bob (`bob-secret`).
pub async fn start_with_tokens() -> TestServer {
    start_echo_with(|c| {
        c.auth.tokens.insert("alice".into(), "alice-secret".into());
        c.auth.tokens.insert("bob".into(), "bob-secret".into());
    })
    .await
}

/// Set in a child process of this binary that runs one test alone (see [`rerun_alone`]).
const ALONE_ENV: &str = "COLLOQUY_IT_ALONE";

/// For a test that reads process-wide state: the metrics recorder, which every in-process server
/// of this binary counts into. In the binary's own run, runs `test` (its path, `module::name`)
/// again alone in a child process of this binary, asserts it ran and passed, and returns true so
/// the caller returns. In that child it returns false: the test runs there.
pub fn rerun_alone(test: &str) -> bool {
    if std::env::var_os(ALONE_ENV).is_some() {
        return false;
    }
    let binary = std::env::current_exe().expect("the test binary's path");
    let output = std::process::Command::new(binary)
        .args([test, "--exact", "--test-threads=1"])
        .env(ALONE_ENV, "1")
        .output()
        .expect("the test binary runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success() && stdout.contains(" 1 passed;"),
        "{test}, run alone in a child process:\n{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    true
}

static IDS: AtomicU64 = AtomicU64::new(1);

/// A loopback port free a moment ago, for a child process's `--listen`.
pub fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind port 0");
    listener.local_addr().expect("local addr").port()
}

pub fn next_id() -> u64 {
    IDS.fetch_add(1, Ordering::Relaxed)
}

impl TestServer {
    /// One JSON-RPC call; returns the whole response object.
    pub async fn rpc(&self, version: &str, method: &str, params: Value) -> Value {
        let body = json!({"jsonrpc": "2.0", "id": next_id(), "method": method, "params": params});
        post_rpc(&self.client, &self.url, version, &body).await
    }

    /// Raw POST of `body` with the given content type and version header.
    pub async fn post_raw(
        &self,
        version: Option<&str>,
        content_type: &str,
        body: Vec<u8>,
    ) -> (u16, Value) {
        let mut request = self
            .client
            .post(&self.url)
            .header("Content-Type", content_type)
            .body(body);
        if let Some(version) = version {
            request = request.header("A2A-Version", version);
        }
        let response = request.send().await.expect("request sent");
        let status = response.status().as_u16();
        let value = response.json().await.unwrap_or(Value::Null);
        (status, value)
    }

    /// Sends `text` as a user message (v1.0 shapes for "1.0", v0.3 otherwise).
    pub async fn send_text(
        &self,
        version: &str,
        text: &str,
        context_id: Option<&str>,
        task_id: Option<&str>,
    ) -> Value {
        self.rpc(
            version,
            send_method(version),
            json!({"message": user_message(version, text, context_id, task_id)}),
        )
        .await
    }

    pub async fn stop(self) -> tempfile::TempDir {
        self.server.stop().await;
        self.dir
    }
}

pub fn send_method(version: &str) -> &'static str {
    if version == V1 {
        "SendMessage"
    } else {
        "message/send"
    }
}

pub fn user_message(
    version: &str,
    text: &str,
    context_id: Option<&str>,
    task_id: Option<&str>,
) -> Value {
    let mut message = if version == V1 {
        json!({"messageId": format!("m-{}", next_id()), "role": "ROLE_USER", "parts": [{"text": text}]})
    } else {
        json!({"kind": "message", "messageId": format!("m-{}", next_id()), "role": "user", "parts": [{"kind": "text", "text": text}]})
    };
    if let Some(context_id) = context_id {
        message["contextId"] = json!(context_id);
    }
    if let Some(task_id) = task_id {
        message["taskId"] = json!(task_id);
    }
    message
}

/// The task inside a send result (v1.0 wraps it in `task`).
pub fn task_of(response: &Value) -> &Value {
    let result = &response["result"];
    if result.get("task").is_some() {
        &result["task"]
    } else {
        result
    }
}

/// All text of a task's artifacts, concatenated.
pub fn artifact_text(task: &Value) -> String {
    task["artifacts"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|a| a["parts"].as_array().into_iter().flatten())
        .filter_map(|p| p["text"].as_str())
        .collect()
}

/// A test agent scripted by the message text:
/// `ask: Q` ends input-required asking Q; `fail` fails; `reject` is rejected; `panic` panics;
/// `slow N` waits N ms then echoes; `chunks N: TEXT` streams TEXT as raw bytes in N random cuts
/// (cuts may fall inside UTF-8 characters); `drip MS N: TEXT` streams TEXT in N-character chunks
/// MS apart (then waits for input if TEXT ends in `?`); `flood COUNT SIZE` streams COUNT chunks of SIZE bytes; anything else echoes.
pub struct ScriptedAgent;

impl colloquy::agent::Agent for ScriptedAgent {
    fn kind(&self) -> &'static str {
        "scripted"
    }

    fn description(&self) -> String {
        "scripted test agent".into()
    }

    fn run(
        &self,
        request: colloquy::agent::AgentRequest,
        sink: colloquy::agent::AgentSink,
    ) -> futures_util::future::BoxFuture<'static, Result<(), colloquy::agent::AgentError>> {
        use colloquy::agent::{AgentError, AgentEvent};
        use colloquy::model::TaskState;
        use futures_util::FutureExt;
        async move {
            let text = request.message.text();
            if let Some(question) = text.strip_prefix("ask: ") {
                return sink
                    .send(AgentEvent::Status {
                        state: TaskState::InputRequired,
                        text: Some(question.to_owned()),
                    })
                    .await;
            }
            match text.as_str() {
                "fail" => return Err(AgentError::Failed("scripted failure".into())),
                "reject" => {
                    return sink
                        .send(AgentEvent::Status {
                            state: TaskState::Rejected,
                            text: Some("not doing that".into()),
                        })
                        .await;
                }
                "panic" => panic!("scripted panic"),
                _ => {}
            }
            if let Some(ms) = text
                .strip_prefix("slow ")
                .and_then(|n| n.trim().parse::<u64>().ok())
            {
                tokio::time::sleep(std::time::Duration::from_millis(ms)).await;
            }
            if let Some((spec, body)) = text.strip_prefix("drip ").and_then(|r| r.split_once(": "))
            {
                // `drip MS N: TEXT`: wait MS, then TEXT in N-character chunks, MS apart.
                let mut numbers = spec
                    .split_whitespace()
                    .filter_map(|n| n.parse::<u64>().ok());
                let (ms, n) = (
                    numbers.next().unwrap_or(10),
                    numbers.next().unwrap_or(1).max(1) as usize,
                );
                let chars: Vec<char> = body.chars().collect();
                for chunk in chars.chunks(n) {
                    tokio::time::sleep(std::time::Duration::from_millis(ms)).await;
                    sink.text(chunk.iter().collect::<String>()).await?;
                }
                if body.ends_with('?') {
                    return sink
                        .send(AgentEvent::Status {
                            state: TaskState::InputRequired,
                            text: None,
                        })
                        .await;
                }
                return Ok(());
            }
            if let Some(spec) = text.strip_prefix("flood ") {
                // `flood COUNT SIZE`: COUNT chunks of SIZE bytes, 1 ms apart.
                let mut numbers = spec
                    .split_whitespace()
                    .filter_map(|n| n.parse::<usize>().ok());
                let (count, size) = (numbers.next().unwrap_or(10), numbers.next().unwrap_or(10));
                for i in 0..count {
                    let fill = char::from(b'a' + (i % 26) as u8);
                    sink.text(std::iter::repeat_n(fill, size).collect::<String>())
                        .await?;
                    tokio::time::sleep(std::time::Duration::from_millis(1)).await;
                }
                return Ok(());
            }
            if let Some((count, body)) = text
                .strip_prefix("chunks ")
                .and_then(|r| r.split_once(": "))
            {
                let count: usize = count.parse().unwrap_or(1);
                let bytes = body.as_bytes();
                let mut cuts: Vec<usize> = (0..count.saturating_sub(1))
                    .map(|_| rand::random::<usize>() % (bytes.len() + 1))
                    .collect();
                cuts.push(0);
                cuts.push(bytes.len());
                cuts.sort_unstable();
                for pair in cuts.windows(2) {
                    sink.send(AgentEvent::Bytes(bytes[pair[0]..pair[1]].to_vec()))
                        .await?;
                }
                return Ok(());
            }
            sink.text(colloquy::agent::EchoAgent::reply(&request)).await
        }
        .boxed()
    }
}

pub async fn start_scripted(tweak: impl FnOnce(&mut Config)) -> TestServer {
    start_with(Arc::new(ScriptedAgent), tweak).await
}

/// Reads an SSE response into its JSON-RPC payloads.
pub async fn sse_events(response: reqwest::Response) -> Vec<Value> {
    LiveStream::new(response).rest().await
}

type ByteStream = futures_util::stream::BoxStream<'static, reqwest::Result<bytes::Bytes>>;

/// An SSE response read event by event (each a JSON-RPC response).
pub struct LiveStream(eventsource_stream::EventStream<ByteStream>);

impl LiveStream {
    pub fn new(response: reqwest::Response) -> Self {
        LiveStream(eventsource_stream::EventStream::new(
            futures_util::StreamExt::boxed(response.bytes_stream()),
        ))
    }

    /// The next event with data; None when the stream has ended.
    pub async fn next_event(&mut self) -> Option<Value> {
        while let Some(event) = futures_util::StreamExt::next(&mut self.0).await {
            match event {
                Ok(event) if !event.data.is_empty() => {
                    return Some(serde_json::from_str(&event.data).expect("JSON event"));
                }
                Ok(_) => {}
                Err(e) => panic!("SSE stream error: {e}"),
            }
        }
        None
    }

    /// Every remaining event, until the stream ends.
    pub async fn rest(mut self) -> Vec<Value> {
        let mut events = Vec::new();
        while let Some(event) = self.next_event().await {
            events.push(event);
        }
        events
    }
}

/// The id of the task a stream's first event carries (v1.0 `{"task":..}` or bare v0.3).
pub fn streamed_task_id(first: &Value) -> String {
    let result = &first["result"];
    let task = result.get("task").unwrap_or(result);
    task["id"]
        .as_str()
        .expect("the first event is the task")
        .to_owned()
}

impl TestServer {
    /// The agent card, with extra request headers.
    pub async fn card(&self, headers: &[(&str, &str)]) -> Value {
        let mut request = self
            .client
            .get(format!("{}.well-known/agent-card.json", self.url));
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        request
            .send()
            .await
            .expect("card")
            .json()
            .await
            .expect("card JSON")
    }

    /// The server's `/metrics` text.
    pub async fn metrics_text(&self) -> String {
        let response = self.client.get(format!("{}metrics", self.url)).send().await;
        response
            .expect("metrics")
            .text()
            .await
            .expect("metrics text")
    }

    /// Opens a JSON-RPC SSE stream (SendStreamingMessage, SubscribeToTask ...).
    pub async fn stream(&self, version: &str, method: &str, params: Value) -> reqwest::Response {
        let body = json!({"jsonrpc": "2.0", "id": next_id(), "method": method, "params": params});
        self.client
            .post(&self.url)
            .header("A2A-Version", version)
            .json(&body)
            .send()
            .await
            .expect("stream opened")
    }

    /// The stored messages of a conversation (via colloquy/getConversation, every page).
    pub async fn stored_messages(&self, version: &str, context_id: &str) -> Vec<Value> {
        let mut messages = Vec::new();
        let mut token = String::new();
        loop {
            let response = self
                .rpc(
                    version,
                    "colloquy/getConversation",
                    json!({"contextId": context_id, "historyLength": 200, "pageToken": token}),
                )
                .await;
            let result = &response["result"];
            messages.extend(result["messages"].as_array().cloned().unwrap_or_default());
            token = result["nextPageToken"].as_str().unwrap_or("").to_owned();
            if token.is_empty() {
                return messages;
            }
        }
    }
}

/// POSTs a JSON-RPC request body; returns the whole response object. Takes its client and URL
/// rather than a server, so spawned tasks and child-process servers can use it.
pub async fn post_rpc(client: &reqwest::Client, url: &str, version: &str, body: &Value) -> Value {
    post_rpc_as(client, url, version, None, body).await
}

/// [`post_rpc`] with the bearer token of a principal, if given.
async fn post_rpc_as(
    client: &reqwest::Client,
    url: &str,
    version: &str,
    token: Option<&str>,
    body: &Value,
) -> Value {
    let mut request = client.post(url).header("A2A-Version", version).json(body);
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    request
        .send()
        .await
        .expect("request sent")
        .json()
        .await
        .expect("JSON response")
}

/// One v1.0 JSON-RPC call to `server` as the principal whose bearer token is `token`.
pub async fn rpc_as(server: &TestServer, token: &str, method: &str, params: Value) -> Value {
    let body = json!({"jsonrpc": "2.0", "id": next_id(), "method": method, "params": params});
    post_rpc_as(&server.client, &server.url, V1, Some(token), &body).await
}

/// The texts of the messages in a `colloquy/getConversation` response.
pub fn conversation_texts(response: &Value) -> Vec<String> {
    response["result"]["messages"]
        .as_array()
        .expect("messages")
        .iter()
        .map(message_text)
        .collect()
}

/// The text parts of a wire message, joined.
pub fn message_text(message: &Value) -> String {
    message["parts"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|p| p["text"].as_str())
        .collect::<Vec<_>>()
        .join("\n")
}

/// The text streamed by artifact-update events (either version), concatenated.
pub fn streamed_text(events: &[Value]) -> String {
    events
        .iter()
        .filter_map(|e| {
            let r = &e["result"];
            if let Some(update) = r.get("artifactUpdate") {
                Some(update)
            } else if r["kind"] == "artifact-update" {
                Some(r)
            } else {
                None
            }
        })
        .map(|update| artifact_text(&json!({"artifacts": [update["artifact"].clone()]})))
        .collect()
}

/// Asserts `value` is valid against the official v0.3 schema's `definition`.
pub fn assert_v03_valid(definition: &str, value: &Value) {
    let errors = v03_schema_errors(definition, value);
    assert!(
        errors.is_empty(),
        "not a valid v0.3 {definition}: {errors:?}\n{value:#}"
    );
}

/// What the official v0.3 schema's `definition` finds wrong with `value`.
pub fn v03_schema_errors(definition: &str, value: &Value) -> Vec<String> {
    static SCHEMA: std::sync::OnceLock<Value> = std::sync::OnceLock::new();
    let schema = SCHEMA.get_or_init(|| {
        // The official schema, vendored (see tests/fixtures/spec/README.md): compiled in, so
        // no test reads anything outside the repository.
        let text = include_str!("../../fixtures/spec/a2a-v0.3.0.schema.json");
        serde_json::from_str(text).expect("schema JSON")
    });
    let root = json!({
        "$schema": "http://json-schema.org/draft-07/schema#",
        "$ref": format!("#/definitions/{definition}"),
        "definitions": schema["definitions"].clone(),
    });
    let validator = jsonschema::validator_for(&root).expect("schema compiles");
    validator
        .iter_errors(value)
        .map(|e| format!("{e} at {}", e.instance_path))
        .collect()
}

/// The python of an a2a-sdk venv (`sdk03` or `sdk1`), creating the venvs on first use
/// (`tests/interop/setup.sh`, idempotent; `INTEROP_VENVS` overrides where they live).
pub fn sdk_python(venv: &str) -> std::path::PathBuf {
    static READY: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();
    let root = READY.get_or_init(|| {
        let manifest = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        let venvs = std::env::var_os("INTEROP_VENVS")
            .map(std::path::PathBuf::from)
            .unwrap_or_else(|| manifest.join("target/interop"));
        let status = std::process::Command::new("bash")
            .arg(manifest.join("tests/interop/setup.sh"))
            .env("INTEROP_VENVS", &venvs)
            .status()
            .expect("bash runs tests/interop/setup.sh");
        assert!(
            status.success(),
            "tests/interop/setup.sh failed: the a2a-sdk venvs are needed for interop tests"
        );
        venvs
    });
    root.join(venv).join("bin/python")
}

/// Runs one of the interop kit's scripts with an SDK venv; returns (success, stdout + stderr).
pub async fn run_sdk_script(venv: &str, script: &str, args: &[&str]) -> (bool, String) {
    let python = sdk_python(venv);
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/interop")
        .join(script);
    let output = tokio::process::Command::new(python)
        .arg(script)
        .args(args)
        .kill_on_drop(true)
        .output()
        .await
        .expect("python runs");
    let mut text = String::from_utf8_lossy(&output.stdout).into_owned();
    text.push_str(&String::from_utf8_lossy(&output.stderr));
    (output.status.success(), text)
}

pub fn reply_text(task: &Value) -> String {
    task["artifacts"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|a| a["name"] == "reply")
        .flat_map(|a| a["parts"].as_array().into_iter().flatten())
        .filter_map(|p| p["text"].as_str())
        .collect()
}
pub fn status_text(task: &Value) -> String {
    task["status"]["message"]["parts"][0]["text"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}
/// Posts a streaming request and returns every event's `result`.
pub async fn stream_results(server: &TestServer, text: &str, context_id: &str) -> Vec<Value> {
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "SendStreamingMessage",
        "params": {"message": user_message(V1, text, Some(context_id), None)}});
    let raw = server
        .client
        .post(&server.url)
        .header("A2A-Version", V1)
        .json(&body)
        .send()
        .await
        .expect("stream request")
        .text()
        .await
        .expect("stream body");
    raw.lines()
        .filter_map(|line| line.strip_prefix("data: "))
        .map(|data| serde_json::from_str::<Value>(data).expect("event JSON")["result"].clone())
        .collect()
}
/// The non-empty text chunks of the reply artifact, in the order streamed.
pub fn reply_chunks(events: &[Value]) -> Vec<String> {
    let updates: Vec<&Value> = events
        .iter()
        .filter_map(|e| e.get("artifactUpdate"))
        .collect();
    let Some(first) = updates.iter().find(|u| u["artifact"]["name"] == "reply") else {
        return Vec::new();
    };
    let id = first["artifact"]["artifactId"].clone();
    updates
        .iter()
        .filter(|u| u["artifact"]["artifactId"] == id)
        .flat_map(|u| {
            u["artifact"]["parts"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .filter_map(|p| p["text"].as_str().map(str::to_owned))
        // The closing `lastChunk` update carries no text.
        .filter(|t| !t.is_empty())
        .collect()
}

/// What a test agent does with a request: [`agent_from`]'s `run`.
pub trait RunAgent:
    Fn(
        colloquy::agent::AgentRequest,
        colloquy::agent::AgentSink,
    ) -> futures_util::future::BoxFuture<'static, Result<(), colloquy::agent::AgentError>>
    + Send
    + Sync
    + 'static
{
}

impl<F> RunAgent for F where
    F: Fn(
            colloquy::agent::AgentRequest,
            colloquy::agent::AgentSink,
        )
            -> futures_util::future::BoxFuture<'static, Result<(), colloquy::agent::AgentError>>
        + Send
        + Sync
        + 'static
{
}

/// A test agent made of `run`: what the agent does, without the trait's other parts.
pub fn agent_from(kind: &'static str, run: impl RunAgent) -> SharedAgent {
    struct FromFn<F> {
        kind: &'static str,
        run: F,
    }
    impl<F: RunAgent> colloquy::agent::Agent for FromFn<F> {
        fn kind(&self) -> &'static str {
            self.kind
        }
        fn description(&self) -> String {
            format!("the {} test agent", self.kind)
        }
        fn run(
            &self,
            request: colloquy::agent::AgentRequest,
            sink: colloquy::agent::AgentSink,
        ) -> futures_util::future::BoxFuture<'static, Result<(), colloquy::agent::AgentError>>
        {
            (self.run)(request, sink)
        }
    }
    Arc::new(FromFn { kind, run })
}

/// Asks "which day?" first, then books for the answer.
pub fn asker() -> SharedAgent {
    agent_from("asker", |request, sink| {
        Box::pin(async move {
            let asked = request
                .history
                .last()
                .is_some_and(|h| h.text == "which day?");
            if asked {
                sink.text(format!("booked for {}", request.message.text()))
                    .await
            } else {
                sink.send(colloquy::agent::AgentEvent::Status {
                    state: colloquy::model::TaskState::InputRequired,
                    text: Some("which day?".into()),
                })
                .await
            }
        })
    })
}

/// A loopback HTTP server answering GET `path` with the JSON `body()` makes at each request
/// (a key set, a card: what a service outside colloquy would serve); its base URL.
pub async fn serve_json<F>(path: &'static str, body: F) -> (String, actix_web::dev::ServerHandle)
where
    F: Fn() -> Value + Clone + Send + 'static,
{
    use actix_web::{App, HttpResponse, HttpServer, web};
    let server = HttpServer::new(move || {
        let body = body.clone();
        App::new().route(
            path,
            web::get().to(move || {
                let answer = body();
                async move { HttpResponse::Ok().json(answer) }
            }),
        )
    })
    .workers(1)
    .disable_signals()
    .bind("127.0.0.1:0")
    .expect("bind");
    let addr = server.addrs()[0];
    let server = server.run();
    let handle = server.handle();
    actix_rt::spawn(server);
    (format!("http://{addr}/"), handle)
}

/// Sends SIGHUP to this process. A listener is held first, so that the signal can never take
/// the default action (ending the process) whatever the server's handler is doing.
pub fn hang_up(_listener: &tokio::signal::unix::Signal) {
    // SAFETY: kill(2) on our own pid with a signal that has a handler installed.
    let sent = unsafe { libc::kill(libc::getpid(), libc::SIGHUP) };
    assert_eq!(sent, 0, "kill(getpid(), SIGHUP)");
}

/// The conversations `server` lists for the anonymous caller (`colloquy/listConversations`).
pub async fn conversations(server: &TestServer) -> Vec<Value> {
    let response = server
        .rpc(V1, "colloquy/listConversations", json!({}))
        .await;
    response["result"]["conversations"]
        .as_array()
        .cloned()
        .unwrap_or_else(|| panic!("listConversations: {response}"))
}
