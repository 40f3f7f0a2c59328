//! Past `limits.running_turns`, sends get a quick overload error (-32011 with a retry hint)
//! instead of piling up, nothing of theirs is stored, and the server takes turns again once the
//! load drops.

use crate::common;

use colloquy::agent::EchoAgent;
use common::*;
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::{Duration, Instant};

const LIMIT: usize = 4;
const SLOW: Duration = Duration::from_millis(2_000);
const SENDS: usize = 24;

fn retry_after_ms(version: &str, error: &Value) -> Option<u64> {
    if version == V1 {
        error["data"][0]["metadata"]["retryAfterMs"].as_u64()
    } else {
        error["data"]["retryAfterMs"].as_u64()
    }
}

async fn overload_round(server: &TestServer, version: &str, round: &str) {
    let started = Instant::now();
    let mut sends = Vec::new();
    for i in 0..SENDS {
        let client = server.client.clone();
        let url = server.url.clone();
        let context_id = format!("overload-{round}-{i}");
        let body = json!({"jsonrpc": "2.0", "id": i, "method": send_method(version),
            "params": {"message": user_message(version, &format!("slow turn {i}"), Some(&context_id), None)}});
        let version = version.to_owned();
        sends.push(tokio::spawn(async move {
            let sent = Instant::now();
            let response = post_rpc(&client, &url, &version, &body).await;
            (context_id, sent.elapsed(), response)
        }));
    }
    let mut completed = Vec::new();
    let mut overloaded = Vec::new();
    for send in sends {
        let (context_id, took, response) = send.await.expect("send task");
        if let Some(error) = response.get("error") {
            assert_eq!(error["code"], -32011, "unexpected error: {response}");
            let retry = retry_after_ms(version, error);
            assert!(retry.is_some_and(|ms| ms > 0), "no retry hint: {error}");
            overloaded.push((context_id, took));
        } else {
            let task = task_of(&response);
            let state = task["status"]["state"].as_str().unwrap_or("");
            assert!(
                state == "TASK_STATE_COMPLETED" || state == "completed",
                "{response}"
            );
            assert!(took >= SLOW, "a slow turn ended in {took:?}");
            completed.push(context_id);
        }
    }
    assert!(
        completed.len() <= LIMIT,
        "{} turns ran at once, the limit is {LIMIT}",
        completed.len()
    );
    assert!(!completed.is_empty(), "no turn was let in");
    assert_eq!(completed.len() + overloaded.len(), SENDS);
    for (context_id, took) in &overloaded {
        // Well before the slow turns end: the excess is not queued behind them.
        assert!(
            *took < SLOW / 2,
            "overload answer for {context_id} took {took:?}"
        );
        // A rejected message is not stored.
        let found = server
            .rpc(
                version,
                "colloquy/getConversation",
                json!({"contextId": context_id}),
            )
            .await;
        let stored = found["result"]["messages"]
            .as_array()
            .map_or(0, |m| m.len());
        assert_eq!(stored, 0, "rejected send was stored: {found}");
    }
    assert!(
        started.elapsed() < SLOW * 3,
        "round took {:?}",
        started.elapsed()
    );
}

async fn recovers(server: &TestServer, version: &str) {
    // Load has dropped: sends are taken again, up to the limit at once, and multi-turn works.
    for i in 0..LIMIT * 2 {
        let first = server
            .send_text(version, &format!("after {i}"), None, None)
            .await;
        let task = task_of(&first);
        let context_id = task["contextId"].as_str().expect("contextId").to_owned();
        let second = server
            .send_text(version, "again", Some(&context_id), None)
            .await;
        let text = artifact_text(task_of(&second));
        assert!(
            text.contains(&format!("previously: \"after {i}\"")),
            "{second}"
        );
    }
}

#[actix_rt::test]
async fn excess_sends_are_refused_quickly_and_the_server_recovers() {
    let server = start_with(Arc::new(EchoAgent::new(0, SLOW)), |config| {
        config.limits.running_turns = LIMIT;
        config.workers = 2;
    })
    .await;
    overload_round(&server, V1, "v1").await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(server.server.engine.running_turns(), 0);
    overload_round(&server, V03, "v03").await;
    assert_eq!(server.server.engine.running_turns(), 0);
    recovers_fast(&server).await;
    server.stop().await;
}

/// The recovery check, on a fresh fast server would not prove anything: reuse the slow one,
/// sending one turn at a time (each takes `SLOW`), so only a few.
async fn recovers_fast(server: &TestServer) {
    let started = Instant::now();
    let mut turns = Vec::new();
    for i in 0..LIMIT {
        let client = server.client.clone();
        let url = server.url.clone();
        let body = json!({"jsonrpc": "2.0", "id": i, "method": "SendMessage",
            "params": {"message": user_message(V1, &format!("back {i}"), None, None)}});
        turns.push(tokio::spawn(async move {
            post_rpc(&client, &url, V1, &body).await
        }));
    }
    for turn in turns {
        let response = turn.await.expect("task");
        assert_eq!(
            task_of(&response)["status"]["state"],
            "TASK_STATE_COMPLETED",
            "{response}"
        );
    }
    // The limit's worth of turns ran side by side, not one after another.
    assert!(started.elapsed() < SLOW * 2, "{:?}", started.elapsed());
}

#[actix_rt::test]
async fn multi_turn_works_after_overload_on_a_fast_server() {
    let server = start_with(
        Arc::new(EchoAgent::new(0, Duration::from_millis(300))),
        |config| {
            config.limits.running_turns = 2;
        },
    )
    .await;
    // Overload it briefly.
    let mut sends = Vec::new();
    for i in 0..12 {
        let client = server.client.clone();
        let url = server.url.clone();
        let body = json!({"jsonrpc": "2.0", "id": i, "method": "SendMessage",
            "params": {"message": user_message(V1, "burst", None, None)}});
        sends.push(tokio::spawn(async move {
            post_rpc(&client, &url, V1, &body).await
        }));
    }
    let mut refused = 0;
    for send in sends {
        let response = send.await.expect("task");
        if response["error"]["code"] == -32011 {
            refused += 1;
        }
    }
    assert!(refused >= 12 - 2, "only {refused} refused");
    recovers(&server, V1).await;
    server.stop().await;
}

// Slow clients: a body has a deadline, and connections are bounded.

const BODY_TIMEOUT: Duration = Duration::from_millis(500);

/// Reads one HTTP/1.1 response (head and a Content-Length body): its status and body.
async fn read_response(reader: &mut (impl tokio::io::AsyncRead + Unpin)) -> (u16, Value) {
    use tokio::io::AsyncReadExt;
    let mut buffer = Vec::new();
    let mut chunk = [0u8; 4096];
    let head_end = loop {
        if let Some(at) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
            break at + 4;
        }
        let n = reader.read(&mut chunk).await.expect("read");
        assert!(n > 0, "connection closed before a response");
        buffer.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buffer[..head_end]).to_ascii_lowercase();
    let status = head[9..12].parse().expect("status code");
    let length: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .and_then(|v| v.trim().parse().ok())
        .expect("content-length");
    while buffer.len() < head_end + length {
        let n = reader.read(&mut chunk).await.expect("read");
        assert!(n > 0, "connection closed inside the body");
        buffer.extend_from_slice(&chunk[..n]);
    }
    let body = serde_json::from_slice(&buffer[head_end..head_end + length]).unwrap_or(Value::Null);
    (status, body)
}

/// Declares a 1 MB body and sends one byte every 50 ms; returns the answer and how long it took.
async fn slow_body_client(addr: std::net::SocketAddr) -> (u16, Value, Duration) {
    use tokio::io::AsyncWriteExt;
    let stream = tokio::net::TcpStream::connect(addr)
        .await
        .expect("connects");
    let (mut reader, mut writer) = stream.into_split();
    let head = "POST / HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
                A2A-Version: 1.0\r\nContent-Length: 1000000\r\n\r\n{";
    writer.write_all(head.as_bytes()).await.expect("head sent");
    let sent = Instant::now();
    let drip = tokio::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_millis(50)).await;
            if writer.write_all(b" ").await.is_err() {
                break;
            }
        }
    });
    let answer = tokio::time::timeout(Duration::from_secs(15), read_response(&mut reader)).await;
    drip.abort();
    let (status, body) = answer.expect("no answer to a slow body within 15 s");
    (status, body, sent.elapsed())
}

#[actix_rt::test]
async fn slow_bodies_get_408_while_conversations_go_on() {
    const SLOW_CLIENTS: usize = 8;
    let server = start_echo_with(|config| {
        config.limits.body_timeout_ms = BODY_TIMEOUT.as_millis() as u64;
    })
    .await;
    let slow: Vec<_> = (0..SLOW_CLIENTS)
        .map(|_| tokio::spawn(slow_body_client(server.server.addr)))
        .collect();

    // While they drip, a two-turn conversation is answered promptly, again and again.
    let until = Instant::now() + BODY_TIMEOUT * 2;
    let mut round = 0;
    while Instant::now() < until {
        round += 1;
        let started = Instant::now();
        let first = server
            .send_text(V1, &format!("hello {round}"), None, None)
            .await;
        let context_id = task_of(&first)["contextId"].as_str().expect("contextId");
        let second = server.send_text(V1, "again", Some(context_id), None).await;
        assert!(
            artifact_text(task_of(&second)).contains(&format!("previously: \"hello {round}\"")),
            "{second}"
        );
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "two turns took {:?} beside slow clients",
            started.elapsed()
        );
    }

    for client in slow {
        let (status, body, took) = client.await.expect("slow client");
        assert_eq!(status, 408, "{body}");
        assert_eq!(body["error"]["code"], -32600, "{body}");
        let message = body["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains("not received within 500 ms"), "{body}");
        assert!(took >= BODY_TIMEOUT, "answered after {took:?}");
        assert!(
            took < BODY_TIMEOUT + Duration::from_secs(3),
            "answered after {took:?}"
        );
    }
    server.stop().await;
}

#[actix_rt::test]
async fn connections_past_the_bound_wait_for_a_free_one() {
    // One worker, so its share is the whole bound.
    let server = start_echo_with(|config| {
        config.workers = 1;
        config.limits.max_connections = 2;
    })
    .await;
    let addr = server.server.addr;
    let first = tokio::net::TcpStream::connect(addr)
        .await
        .expect("connects");
    let _second = tokio::net::TcpStream::connect(addr)
        .await
        .expect("connects");
    tokio::time::sleep(Duration::from_millis(200)).await;

    // A third connection is not taken while two are open (idle connections last 5 s, the
    // client request timeout, which is longer than this wait).
    let url = format!("{}healthz", server.url);
    let mut third = tokio::spawn(async move {
        reqwest::Client::new()
            .get(url)
            .timeout(Duration::from_secs(10))
            .send()
            .await
            .map(|r| r.status().as_u16())
    });
    let early = tokio::time::timeout(Duration::from_millis(1_000), &mut third).await;
    assert!(early.is_err(), "a third connection was served: {early:?}");

    // One closes: the waiting one is taken and answered.
    drop(first);
    let answered = tokio::time::timeout(Duration::from_secs(3), third)
        .await
        .expect("the waiting connection was not served after one closed")
        .expect("task");
    assert_eq!(answered.expect("answered"), 200);
    server.stop().await;
}

/// Sends a chunked request's head and first chunk, never the last chunk.
async fn unfinished_chunked(
    addr: std::net::SocketAddr,
    method_and_path: &str,
    extra_headers: &str,
) -> tokio::net::TcpStream {
    use tokio::io::AsyncWriteExt;
    let mut stream = tokio::net::TcpStream::connect(addr)
        .await
        .expect("connects");
    let request = format!(
        "{method_and_path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
         {extra_headers}Transfer-Encoding: chunked\r\n\r\n5\r\n{{\"a\":\r\n"
    );
    stream
        .write_all(request.as_bytes())
        .await
        .expect("request sent");
    stream
}

/// Reads until the server closes the connection; how long that took from `since`, or None if it
/// stayed open for `wait`.
async fn closed_within(
    stream: &mut tokio::net::TcpStream,
    since: Instant,
    wait: Duration,
) -> Option<Duration> {
    use tokio::io::AsyncReadExt;
    let mut sink = [0u8; 4096];
    let read_to_end = async {
        loop {
            match stream.read(&mut sink).await {
                Ok(0) | Err(_) => return since.elapsed(),
                Ok(_) => {}
            }
        }
    };
    tokio::time::timeout(wait, read_to_end).await.ok()
}

#[actix_rt::test]
async fn a_chunked_body_that_never_ends_loses_its_connection() {
    let server = start_echo_with(|config| {
        config.limits.body_timeout_ms = BODY_TIMEOUT.as_millis() as u64;
        config
            .auth
            .tokens
            .insert("alice".into(), "alice-secret".into());
    })
    .await;
    let token = "Authorization: Bearer alice-secret\r\n";
    // Read and timed out (408), refused before reading (401, 404), or answered without reading
    // (a GET's body): each is answered, and the connection closed rather than drained.
    for (request, headers, status) in [
        ("POST /", token, 408),
        ("POST /", "", 401),
        ("GET /healthz", "", 200),
        ("POST /no-such-path", token, 404),
    ] {
        let started = Instant::now();
        let mut stream = unfinished_chunked(server.server.addr, request, headers).await;
        let (answered, _) = read_response(&mut stream).await;
        assert_eq!(answered, status, "{request}");
        let answered = started.elapsed();
        assert!(
            answered < BODY_TIMEOUT + Duration::from_secs(1),
            "{request}: answered after {answered:?}"
        );
        // The server waits up to CLOSE_LINGER for the client to close first.
        let bound = BODY_TIMEOUT + colloquy::http::CLOSE_LINGER + Duration::from_secs(1);
        let closed = closed_within(&mut stream, started, bound + Duration::from_secs(5)).await;
        let closed = closed.unwrap_or_else(|| panic!("{request} ({status}): still open"));
        assert!(closed < bound, "{request}: closed after {closed:?}");
    }
    server.stop().await;
}

#[actix_rt::test]
async fn the_connection_bound_holds_against_unfinished_chunked_bodies() {
    let server = start_echo_with(|config| {
        config.limits.body_timeout_ms = BODY_TIMEOUT.as_millis() as u64;
        config.limits.max_connections = 50;
    })
    .await;
    let mut held = Vec::new();
    for _ in 0..60 {
        held.push(unfinished_chunked(server.server.addr, "POST /", "").await);
    }
    let started = Instant::now();
    let health = server
        .client
        .get(format!("{}healthz", server.url))
        .timeout(Duration::from_secs(10))
        .send()
        .await
        .expect("/healthz answers while 60 bodies never end");
    assert_eq!(health.status(), 200);
    assert!(
        started.elapsed() < BODY_TIMEOUT + Duration::from_secs(1),
        "/healthz took {:?}",
        started.elapsed()
    );
    drop(held);
    server.stop().await;
}

#[actix_rt::test]
async fn a_complete_chunked_request_keeps_its_connection() {
    use tokio::io::AsyncWriteExt;
    let server = start_echo().await;
    let mut stream = tokio::net::TcpStream::connect(server.server.addr)
        .await
        .expect("connects");
    for turn in ["one", "two"] {
        let body = json!({"jsonrpc": "2.0", "id": 1, "method": "SendMessage",
            "params": {"message": user_message(V1, turn, Some("chunked-keeps"), None)}})
        .to_string();
        let request = format!(
            "POST / HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nA2A-Version: 1.0\r\n\
             Transfer-Encoding: chunked\r\n\r\n{:x}\r\n{body}\r\n0\r\n\r\n",
            body.len()
        );
        stream.write_all(request.as_bytes()).await.expect("sent");
        let (status, response) = read_response(&mut stream).await;
        assert_eq!(status, 200, "{response}");
        assert!(
            artifact_text(task_of(&response)).contains(turn),
            "{response}"
        );
    }
    server.stop().await;
}

async fn start_echo_with(tweak: impl FnOnce(&mut colloquy::config::Config)) -> TestServer {
    start_with(Arc::new(EchoAgent::default()), tweak).await
}

#[actix_rt::test]
async fn resident_conversations_stay_within_their_memory_budget() {
    let budget = 10 * colloquy::app::RESIDENT_CONVERSATION_BYTES;
    let server = start_with(Arc::new(EchoAgent::default()), |c| {
        c.contexts.max_resident_bytes = budget;
    })
    .await;
    for i in 0..40 {
        let response = server
            .send_text(V1, "hello", Some(&format!("m{i}")), None)
            .await;
        assert_eq!(
            task_of(&response)["status"]["state"],
            "TASK_STATE_COMPLETED",
            "idle conversations make room: {response}"
        );
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    let resident = server.server.engine.resident_contexts();
    assert!(resident <= 11, "{resident} resident for a budget of 10");
    let again = server.send_text(V1, "back", Some("m0"), None).await;
    assert!(
        artifact_text(task_of(&again)).contains("turn 2"),
        "an evicted conversation continues from disk: {again}"
    );
    server.stop().await;
}
