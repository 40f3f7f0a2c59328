//! The openai backend end to end: a real server on port 0, real sled, and a loopback
//! chat-completions server written here that records what it was sent and fails on demand.

use crate::common;

use colloquy::config::Config;
use common::*;
use serde_json::{Value, json};
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// What the fake upstream does with one request.
#[derive(Clone, Debug)]
enum Reply {
    /// An SSE stream of `delta.content` chunks, `delay` apart, then `finish_reason` and `[DONE]`.
    Stream {
        chunks: Vec<String>,
        delay: Duration,
    },
    /// An HTTP error with a JSON body `{"error":{"message":...}}`.
    Error { code: u16, message: String },
    /// 200 with this content type and raw body, then close.
    Raw { content_type: String, body: String },
    /// Chunks, then silence (the connection stays open).
    StallAfter(Vec<String>),
    /// Never answers.
    Hang,
}

#[derive(Debug, Clone)]
struct Recorded {
    path: String,
    headers: Vec<(String, String)>,
    body: Value,
}

impl Recorded {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

#[derive(Clone, Default)]
struct Upstream {
    requests: Arc<Mutex<Vec<Recorded>>>,
    script: Arc<Mutex<VecDeque<Reply>>>,
}

impl Upstream {
    /// Listens on loopback; returns the base URL (`http://127.0.0.1:port/v1`).
    async fn start(&self) -> String {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let upstream = self.clone();
        actix_rt::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let upstream = upstream.clone();
                actix_rt::spawn(async move { upstream.serve(stream).await });
            }
        });
        format!("http://{addr}/v1")
    }

    fn push(&self, reply: Reply) {
        self.script.lock().unwrap().push_back(reply);
    }

    fn requests(&self) -> Vec<Recorded> {
        self.requests.lock().unwrap().clone()
    }

    fn clear(&self) {
        self.requests.lock().unwrap().clear();
        self.script.lock().unwrap().clear();
    }

    async fn serve(&self, mut stream: TcpStream) {
        let Some(recorded) = read_request(&mut stream).await else {
            return;
        };
        self.requests.lock().unwrap().push(recorded);
        let reply = self
            .script
            .lock()
            .unwrap()
            .pop_front()
            .unwrap_or(Reply::Stream {
                chunks: vec!["default".into()],
                delay: Duration::ZERO,
            });
        let _ = respond(&mut stream, reply).await;
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

async fn read_request(stream: &mut TcpStream) -> Option<Recorded> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 8192];
    let head_end = loop {
        let n = stream.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
        if let Some(at) = find(&buf, b"\r\n\r\n") {
            break at + 4;
        }
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
    let mut lines = head.split("\r\n");
    let path = lines.next()?.split(' ').nth(1)?.to_owned();
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    let length: usize = headers
        .iter()
        .find(|(n, _)| n == "content-length")
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or(0);
    while buf.len() < head_end + length {
        let n = stream.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    let body = serde_json::from_slice(&buf[head_end..head_end + length]).unwrap_or(Value::Null);
    Some(Recorded {
        path,
        headers,
        body,
    })
}

fn sse_chunk(content: &str) -> String {
    let event = json!({"id": "c1", "object": "chat.completion.chunk",
        "choices": [{"index": 0, "delta": {"content": content}, "finish_reason": null}]});
    format!("data: {event}\n\n")
}

const SSE_HEAD: &str =
    "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n";

async fn respond(stream: &mut TcpStream, reply: Reply) -> std::io::Result<()> {
    match reply {
        Reply::Stream { chunks, delay } => {
            stream.write_all(SSE_HEAD.as_bytes()).await?;
            let first = json!({"choices": [{"index": 0, "delta": {"role": "assistant"}, "finish_reason": null}]});
            stream
                .write_all(format!("data: {first}\n\n").as_bytes())
                .await?;
            for chunk in chunks {
                if !delay.is_zero() {
                    tokio::time::sleep(delay).await;
                }
                stream.write_all(sse_chunk(&chunk).as_bytes()).await?;
                stream.flush().await?;
            }
            let last = json!({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]});
            stream
                .write_all(format!("data: {last}\n\ndata: [DONE]\n\n").as_bytes())
                .await?;
        }
        Reply::Error { code, message } => {
            let body = json!({"error": {"message": message, "type": "test_error"}}).to_string();
            let head = format!(
                "HTTP/1.1 {code} Whatever\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                body.len()
            );
            stream.write_all(head.as_bytes()).await?;
            stream.write_all(body.as_bytes()).await?;
        }
        Reply::Raw { content_type, body } => {
            let head = format!(
                "HTTP/1.1 200 OK\r\nContent-Type: {content_type}\r\nConnection: close\r\n\r\n"
            );
            stream.write_all(head.as_bytes()).await?;
            stream.write_all(body.as_bytes()).await?;
        }
        Reply::StallAfter(chunks) => {
            stream.write_all(SSE_HEAD.as_bytes()).await?;
            for chunk in chunks {
                stream.write_all(sse_chunk(&chunk).as_bytes()).await?;
            }
            stream.flush().await?;
            tokio::time::sleep(Duration::from_secs(30)).await;
        }
        Reply::Hang => tokio::time::sleep(Duration::from_secs(30)).await,
    }
    stream.shutdown().await
}

/// An environment variable cargo sets for test runs: the test needs no `set_var`.
const KEY_ENV: &str = "CARGO_MANIFEST_DIR";

async fn openai_server(base_url: &str, tweak: impl Fn(&mut Config)) -> TestServer {
    let mut config = Config::default();
    config.agent.kind = "openai".into();
    config.agent.base_url = Some(base_url.to_owned());
    config.agent.model = Some("test-model".into());
    config.agent.retry_backoff_ms = 20;
    config.agent.connect_timeout_secs = 1;
    config.agent.read_timeout_secs = 1;
    tweak(&mut config);
    let agent = colloquy::cli::build_agent(&config).expect("openai agent builds");
    let section = config.agent.clone();
    start_with(agent, move |c| c.agent = section).await
}

#[actix_rt::test]
async fn history_arrives_as_chat_messages_and_chunks_stream_intact() {
    let upstream = Upstream::default();
    let base_url = upstream.start().await;
    let server = openai_server(&base_url, |c| {
        c.agent.system_prompt = Some("You are terse.".into());
        c.agent.api_key_env = Some(KEY_ENV.into());
    })
    .await;

    upstream.push(Reply::Stream {
        chunks: vec!["Hel".into(), "lo, ".into(), "wörld".into()],
        delay: Duration::ZERO,
    });
    let response = server
        .send_text(V1, "first question", Some("chat-1"), None)
        .await;
    let task = task_of(&response);
    assert_eq!(
        task["status"]["state"], "TASK_STATE_COMPLETED",
        "{response}"
    );
    assert_eq!(reply_text(task), "Hello, wörld");

    // The first request: no history, so no note.
    let first = &upstream.requests()[0];
    assert_eq!(first.path, "/v1/chat/completions");
    assert_eq!(
        first.body["messages"],
        json!([
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": "first question"},
        ])
    );

    // Second turn, streamed to the client with pauses upstream: every chunk arrives intact and in
    // order, including multi-byte characters and newlines.
    let chunks: Vec<String> = [
        "Zwei",
        "te ",
        "Ant",
        "wort: ",
        "😀",
        "\nline two",
        " — ",
        "end.",
    ]
    .map(str::to_owned)
    .to_vec();
    upstream.push(Reply::Stream {
        chunks: chunks.clone(),
        delay: Duration::from_millis(30),
    });
    let events = stream_results(&server, "second question", "chat-1").await;
    let received = reply_chunks(&events);
    assert_eq!(received, chunks, "{events:?}");
    let whole = chunks.concat();
    let last = events.last().expect("events");
    assert_eq!(
        last["statusUpdate"]["status"]["state"], "TASK_STATE_COMPLETED",
        "{last}"
    );

    // The final artifact and the stored reply are the concatenation.
    let task_id = events[0]["task"]["id"]
        .as_str()
        .expect("task first")
        .to_owned();
    let got = server.rpc(V1, "GetTask", json!({"id": task_id})).await;
    assert_eq!(reply_text(&got["result"]), whole, "{got}");
    let conversation = server
        .rpc(
            V1,
            "colloquy/getConversation",
            json!({"contextId": "chat-1"}),
        )
        .await;
    let stored = conversation["result"]["messages"]
        .as_array()
        .expect("messages");
    assert_eq!(stored.len(), 4);
    assert_eq!(message_text(&stored[3]), whole);

    // The second request: system prompt, the note, the history in order, then the message.
    let requests = upstream.requests();
    assert_eq!(requests.len(), 2);
    let second = &requests[1];
    assert_eq!(second.body["model"], "test-model");
    assert_eq!(second.body["stream"], true);
    assert_eq!(
        second.body["messages"],
        json!([
            {"role": "system", "content": "You are terse."},
            {"role": "system", "content": colloquy::agent::OPENAI_HISTORY_NOTE},
            {"role": "user", "content": "first question"},
            {"role": "assistant", "content": "Hello, wörld"},
            {"role": "user", "content": "second question"},
        ])
    );
    let key = std::env::var(KEY_ENV).expect("cargo sets it");
    assert_eq!(
        second.header("authorization"),
        Some(format!("Bearer {key}").as_str())
    );

    // The card follows the backend.
    let card = server.card(&[]).await;
    assert!(
        card["description"].as_str().unwrap().contains("test-model"),
        "{card}"
    );
    assert_eq!(card["skills"][0]["id"], "openai");
    server.stop().await;
}

#[actix_rt::test]
async fn busy_answers_are_retried() {
    let upstream = Upstream::default();
    let base_url = upstream.start().await;
    let server = openai_server(&base_url, |c| c.agent.retries = 3).await;
    upstream.push(Reply::Error {
        code: 429,
        message: "slow down".into(),
    });
    upstream.push(Reply::Error {
        code: 503,
        message: "warming up".into(),
    });
    upstream.push(Reply::Stream {
        chunks: vec!["at ".into(), "last".into()],
        delay: Duration::ZERO,
    });
    let response = server.send_text(V1, "hello", Some("retry-1"), None).await;
    let task = task_of(&response);
    assert_eq!(
        task["status"]["state"], "TASK_STATE_COMPLETED",
        "{response}"
    );
    assert_eq!(reply_text(task), "at last");
    let requests = upstream.requests();
    assert_eq!(requests.len(), 3);
    // The retries send the same request.
    assert_eq!(requests[0].body, requests[2].body);
    server.stop().await;
}

async fn failed_with(server: &TestServer, context_id: &str) -> (String, String) {
    let response = server.send_text(V1, "hello", Some(context_id), None).await;
    let task = task_of(&response);
    assert_eq!(task["status"]["state"], "TASK_STATE_FAILED", "{response}");
    (status_text(task), reply_text(task))
}

#[actix_rt::test]
async fn upstream_errors_end_the_task_failed() {
    let upstream = Upstream::default();
    let base_url = upstream.start().await;
    let server = openai_server(&base_url, |c| {
        c.agent.retries = 1;
        c.agent.api_key_env = Some(KEY_ENV.into());
    })
    .await;
    let key = std::env::var(KEY_ENV).expect("cargo sets it");
    let mut messages = Vec::new();

    // 500 twice: retried once, then failed with the status and the upstream's message.
    upstream.push(Reply::Error {
        code: 500,
        message: "boom".into(),
    });
    upstream.push(Reply::Error {
        code: 500,
        message: "boom".into(),
    });
    let (text, _) = failed_with(&server, "err-500").await;
    assert!(text.contains("HTTP 500") && text.contains("boom"), "{text}");
    assert!(text.contains("after 1 retry"), "{text}");
    assert_eq!(upstream.requests().len(), 2);
    messages.push(text);

    // 400: not retried.
    upstream.clear();
    upstream.push(Reply::Error {
        code: 400,
        message: "model not found".into(),
    });
    let (text, _) = failed_with(&server, "err-400").await;
    assert!(
        text.contains("HTTP 400") && text.contains("model not found"),
        "{text}"
    );
    assert_eq!(upstream.requests().len(), 1);
    messages.push(text);

    // Garbage events.
    upstream.clear();
    upstream.push(Reply::Raw {
        content_type: "text/event-stream".into(),
        body: "data: this is not json\n\n".into(),
    });
    let (text, _) = failed_with(&server, "err-garbage").await;
    assert!(text.contains("malformed upstream response"), "{text}");
    assert!(text.contains("this is not json"), "{text}");
    messages.push(text);

    // A JSON answer that does not parse.
    upstream.push(Reply::Raw {
        content_type: "application/json".into(),
        body: "{not json".into(),
    });
    let (text, _) = failed_with(&server, "err-json").await;
    assert!(text.contains("malformed upstream response"), "{text}");
    messages.push(text);

    // An error event in the stream.
    upstream.push(Reply::Raw {
        content_type: "text/event-stream".into(),
        body: format!(
            "{}data: {}\n\n",
            sse_chunk("part"),
            json!({"error": {"message": "overloaded mid-way"}})
        ),
    });
    let (text, partial) = failed_with(&server, "err-event").await;
    assert!(text.contains("overloaded mid-way"), "{text}");
    assert_eq!(partial, "part");
    messages.push(text);

    // A stream cut off: no finish_reason, no [DONE].
    upstream.push(Reply::Raw {
        content_type: "text/event-stream".into(),
        body: sse_chunk("half an ans"),
    });
    let (text, partial) = failed_with(&server, "err-cut").await;
    assert!(
        text.contains("closed its stream before the answer was finished"),
        "{text}"
    );
    assert_eq!(partial, "half an ans");
    messages.push(text);

    // No answer at all within the read timeout.
    upstream.push(Reply::Hang);
    let started = Instant::now();
    let (text, _) = failed_with(&server, "err-hang").await;
    assert!(text.contains("did not answer within 1 s"), "{text}");
    assert!(started.elapsed() < Duration::from_secs(5));
    messages.push(text);

    // Silence in the middle of a stream.
    upstream.push(Reply::StallAfter(vec!["some ".into(), "words".into()]));
    let (text, partial) = failed_with(&server, "err-stall").await;
    assert!(text.contains("went silent for 1 s"), "{text}");
    assert_eq!(partial, "some words");
    messages.push(text);

    for message in &messages {
        assert!(!message.contains(&key), "the key leaked: {message}");
    }
    server.stop().await;

    // Nothing listening: retried, then failed saying so.
    let closed = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let port = closed.local_addr().expect("addr").port();
    drop(closed);
    let server = openai_server(&format!("http://127.0.0.1:{port}/v1"), |c| {
        c.agent.retries = 1
    })
    .await;
    let (text, _) = failed_with(&server, "err-refused").await;
    assert!(text.contains("could not reach the upstream"), "{text}");
    assert!(text.contains("after 1 retry"), "{text}");
    server.stop().await;
}

#[test]
fn configuration_errors_name_the_field() {
    let mut config = Config::default();
    config.agent.kind = "openai".into();
    let error = colloquy::cli::build_agent(&config)
        .err()
        .expect("refused")
        .to_string();
    assert!(error.contains("agent.base_url"), "{error}");
    config.agent.base_url = Some("http://127.0.0.1:9/v1".into());
    let error = colloquy::cli::build_agent(&config)
        .err()
        .expect("refused")
        .to_string();
    assert!(error.contains("agent.model"), "{error}");
    config.agent.model = Some("m".into());
    config.agent.api_key_env = Some("COLLOQUY_TEST_SURELY_UNSET_KEY".into());
    let error = colloquy::cli::build_agent(&config)
        .err()
        .expect("refused")
        .to_string();
    assert!(error.contains("COLLOQUY_TEST_SURELY_UNSET_KEY"), "{error}");
    config.agent.api_key_env = None;
    assert!(colloquy::cli::build_agent(&config).is_ok());
}
