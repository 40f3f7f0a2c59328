//! Shared test harness: a real server on port 0 with a real sled store in a temp folder.
#![allow(dead_code)]

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

/// A config for tests: loopback, port 0, data in `dir`.
pub fn test_config(dir: &std::path::Path) -> Config {
    let mut config = Config::default();
    config.listen = "127.0.0.1:0".into();
    config.data = dir.to_path_buf();
    config.workers = 2;
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
    let server = colloquy::http::start(config, agent)
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
    start_with(Arc::new(EchoAgent::default()), |_| {}).await
}

static IDS: AtomicU64 = AtomicU64::new(1);

pub fn next_id() -> u64 {
    IDS.fetch_add(1, Ordering::Relaxed)
}

impl TestServer {
    /// One JSON-RPC call; returns the whole response object.
    pub async fn rpc(&self, version: &str, method: &str, params: Value) -> Value {
        let body = json!({"jsonrpc": "2.0", "id": next_id(), "method": method, "params": params});
        self.client
            .post(&self.url)
            .header("A2A-Version", version)
            .json(&body)
            .send()
            .await
            .expect("request sent")
            .json()
            .await
            .expect("JSON response")
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
