//! Streams that resume: every event has an id; a client that drops its connection at random
//! points and resubscribes with the last id it saw (`Last-Event-ID`, or `lastEventId` in the
//! query) gets exactly what it missed, on both wire versions and both HTTP bindings; an id
//! older than what is kept starts from the task; an id the task never reached is refused.

use crate::common;

use colloquy::agent::EchoAgent;
use common::*;
use eventsource_stream::Eventsource;
use futures_util::StreamExt;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::Duration;

#[derive(Clone, Copy, Debug)]
enum Binding {
    JsonRpc(&'static str),
    Rest(&'static str),
}

/// One SSE event: its id and its payload with any JSON-RPC envelope taken off.
#[derive(Debug)]
struct Event {
    id: String,
    result: Value,
}

/// What an event says about the reply.
enum Seen<'a> {
    /// The task as it stands: the reply so far.
    Task(&'a Value),
    /// A piece of the reply.
    Chunk(String),
    Other,
}

fn seen(result: &Value) -> Seen<'_> {
    if let Some(task) = result.get("task") {
        return Seen::Task(task);
    }
    if result["kind"] == "task" {
        return Seen::Task(result);
    }
    let update = match result.get("artifactUpdate") {
        Some(update) => update,
        None if result["kind"] == "artifact-update" => result,
        None => return Seen::Other,
    };
    let artifact = &update["artifact"];
    if artifact["name"] != "reply" {
        return Seen::Other;
    }
    let text = artifact["parts"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|p| p["text"].as_str())
        .collect();
    Seen::Chunk(text)
}

impl Binding {
    /// Starts a streamed turn.
    async fn stream(self, server: &TestServer, text: &str) -> reqwest::Response {
        let request = match self {
            Binding::JsonRpc(version) => {
                let method = if version == V1 {
                    "SendStreamingMessage"
                } else {
                    "message/stream"
                };
                let params = json!({"message": user_message(version, text, None, None)});
                let body =
                    json!({"jsonrpc": "2.0", "id": next_id(), "method": method, "params": params});
                server
                    .client
                    .post(&server.url)
                    .header("A2A-Version", version)
                    .json(&body)
            }
            Binding::Rest(V1) => server
                .client
                .post(format!("{}message:stream", server.url))
                .json(&json!({"message": user_message(V1, text, None, None)})),
            Binding::Rest(_) => {
                let message = json!({
                    "messageId": format!("m-{}", next_id()), "role": "ROLE_USER",
                    "content": [{"text": text}],
                });
                server
                    .client
                    .post(format!("{}v1/message:stream", server.url))
                    .json(&json!({"message": message}))
            }
        };
        let response = request.send().await.expect("stream opened");
        assert_eq!(response.status(), 200);
        response
    }

    /// Resumes `task_id` after `last`, by header or (`in_query`) by query parameter.
    async fn resume(
        self,
        server: &TestServer,
        task_id: &str,
        last: &str,
        in_query: bool,
    ) -> reqwest::Response {
        let query = if in_query {
            format!("?lastEventId={last}")
        } else {
            String::new()
        };
        let request = match self {
            Binding::JsonRpc(version) => {
                let method = if version == V1 {
                    "SubscribeToTask"
                } else {
                    "tasks/resubscribe"
                };
                let body = json!({"jsonrpc": "2.0", "id": next_id(), "method": method, "params": {"id": task_id}});
                server
                    .client
                    .post(format!("{}{query}", server.url))
                    .header("A2A-Version", version)
                    .json(&body)
            }
            Binding::Rest(version) => {
                let prefix = if version == V1 { "" } else { "v1/" };
                server.client.get(format!(
                    "{}{prefix}tasks/{task_id}:subscribe{query}",
                    server.url
                ))
            }
        };
        let request = if in_query {
            request
        } else {
            request.header("Last-Event-ID", last)
        };
        let response = request.send().await.expect("resubscribed");
        assert_eq!(response.status(), 200);
        response
    }
}

type Events = std::pin::Pin<
    Box<
        dyn futures_util::Stream<
                Item = Result<
                    eventsource_stream::Event,
                    eventsource_stream::EventStreamError<reqwest::Error>,
                >,
            > + Send,
    >,
>;

fn events(response: reqwest::Response) -> Events {
    Box::pin(response.bytes_stream().eventsource())
}

/// The next event with data, or None once the stream ends.
async fn next(events: &mut Events) -> Option<Event> {
    while let Some(event) = events.next().await {
        let event = event.expect("a well-formed SSE stream");
        if event.data.is_empty() {
            continue;
        }
        let value: Value = serde_json::from_str(&event.data).expect("JSON data");
        assert!(value.get("error").is_none(), "an error event: {value}");
        let result = value.get("result").cloned().unwrap_or(value);
        return Some(Event {
            id: event.id,
            result,
        });
    }
    None
}

fn parse_id(id: &str) -> (u64, u32) {
    let (turn, n) = id
        .split_once('.')
        .unwrap_or_else(|| panic!("an id <turn>.<n>, not {id:?}"));
    (turn.parse().expect("turn"), n.parse().expect("n"))
}

/// Starts a streamed turn and reads its first event, the task: the stream, the task's id, the
/// reply so far and the first event's id.
async fn open_stream(
    server: &TestServer,
    binding: Binding,
    text: &str,
) -> (Events, String, String, String) {
    let mut stream = events(binding.stream(server, text).await);
    let first = next(&mut stream).await.expect("the task first");
    let Seen::Task(task) = seen(&first.result) else {
        panic!("a stream starts with the task: {:?}", first.result);
    };
    let task_id = task["id"].as_str().expect("task id").to_owned();
    (stream, task_id, reply_text(task), first.id)
}

/// One event after `last` of a stream that must not restart: its id goes on from `last`, it is
/// no snapshot, and a chunk of the reply is added to `reply`. Returns its id.
fn take_replayed(binding: Binding, event: Event, last: &str, reply: &mut String) -> String {
    assert!(
        parse_id(&event.id) > parse_id(last),
        "{binding:?}: ids increase: {} after {last}",
        event.id
    );
    match seen(&event.result) {
        Seen::Chunk(chunk) => reply.push_str(&chunk),
        Seen::Task(task) => panic!("{binding:?}: a snapshot after {last}: {task}"),
        Seen::Other => {}
    }
    event.id
}

/// Streams one reply, dropping the connection after a random number of events each time and
/// resuming after the last id seen, until the stream ends by itself; returns the task's id,
/// the text the chunks made and how many times it resumed.
async fn stream_with_cuts(
    server: &TestServer,
    binding: Binding,
    text: &str,
    rng: &mut StdRng,
) -> (String, String, usize) {
    let (mut stream, task_id, mut reply, mut last) = open_stream(server, binding, text).await;
    let mut resumes = 0;
    loop {
        let cut_after = rng.gen_range(1..12);
        let mut read = 0;
        let ended = loop {
            let Some(event) = next(&mut stream).await else {
                break true;
            };
            last = take_replayed(binding, event, &last, &mut reply);
            read += 1;
            if read == cut_after {
                break false;
            }
        };
        if ended {
            return (task_id, reply, resumes);
        }
        drop(stream);
        resumes += 1;
        let response = binding
            .resume(server, &task_id, &last, rng.gen_bool(0.5))
            .await;
        stream = events(response);
    }
}

#[actix_rt::test]
async fn streams_cut_at_random_points_resume_without_gap_or_duplicate() {
    let agent = Arc::new(EchoAgent::new(2, Duration::from_millis(1)));
    let server = start_with(agent, |_| {}).await;
    let seed: u64 = rand::random();
    println!("seed {seed}");
    let bindings = [
        Binding::JsonRpc(V1),
        Binding::JsonRpc(V03),
        Binding::Rest(V1),
        Binding::Rest(V03),
    ];
    // 200 tasks, 50 per binding, 8 at a time.
    let runs = futures_util::stream::iter(0..200u64)
        .map(|i| {
            let server = &server;
            let binding = bindings[(i % 4) as usize];
            async move {
                let mut rng = StdRng::seed_from_u64(seed.wrapping_add(i));
                let text = format!("task {i}: {}", "abcdefghij".repeat(3 + (i % 5) as usize));
                let (task_id, streamed, resumes) =
                    stream_with_cuts(server, binding, &text, &mut rng).await;
                let stored = server.rpc(V1, "GetTask", json!({"id": task_id})).await;
                let stored = &stored["result"];
                assert_eq!(
                    stored["status"]["state"], "TASK_STATE_COMPLETED",
                    "{stored}"
                );
                assert_eq!(
                    streamed,
                    reply_text(stored),
                    "{binding:?}, seed {seed}, task {i}: the chunks make the stored reply"
                );
                assert!(streamed.contains(&text), "{streamed}");
                resumes
            }
        })
        .buffer_unordered(8)
        .collect::<Vec<usize>>()
        .await;
    let resumes: usize = runs.iter().sum();
    assert!(resumes >= 400, "each task resumed a few times: {resumes}");
    server.stop().await;
}

/// The whole body of a stream, as text.
async fn body(response: reqwest::Response) -> String {
    response.text().await.expect("stream body")
}

#[actix_rt::test]
async fn an_id_older_than_the_log_starts_from_the_task_and_an_unreached_id_is_refused() {
    if rerun_alone(
        "resume::an_id_older_than_the_log_starts_from_the_task_and_an_unreached_id_is_refused",
    ) {
        return;
    }
    let agent = Arc::new(EchoAgent::new(1, Duration::ZERO));
    let server = start_with(agent, |c| c.streaming.resume_events = 4).await;
    let mut stream = events(
        Binding::JsonRpc(V1)
            .stream(&server, "a reply of many chunks")
            .await,
    );
    let mut ids = Vec::new();
    while let Some(event) = next(&mut stream).await {
        ids.push(event.id);
    }
    let task_id = {
        let listed = server.rpc(V1, "ListTasks", json!({})).await;
        listed["result"]["tasks"][0]["id"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    assert!(ids.len() > 10, "{ids:?}");
    let (turn, _) = parse_id(&ids[0]);
    for (n, id) in ids.iter().enumerate() {
        assert_eq!(
            id,
            &format!("{turn}.{}", n + 1),
            "events count from 1: {ids:?}"
        );
    }

    // Within the last four: exactly the events after it.
    let kept = &ids[ids.len() - 3];
    let response = Binding::JsonRpc(V1)
        .resume(&server, &task_id, kept, false)
        .await;
    let text = body(response).await;
    assert!(text.contains(": resumed: the events after"), "{text}");
    let replayed: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("id: "))
        .collect();
    assert_eq!(replayed, ids[ids.len() - 2..], "{text}");

    // Older than the log: the task as it stands, said so first.
    let response = Binding::JsonRpc(V1)
        .resume(&server, &task_id, &ids[1], true)
        .await;
    let text = body(response).await;
    assert!(text.contains(": resumed from a snapshot"), "{text}");
    let data: Vec<Value> = text
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .map(|d| serde_json::from_str(d).unwrap())
        .collect();
    assert_eq!(data.len(), 1, "{text}");
    assert_eq!(
        data[0]["result"]["task"]["status"]["state"],
        "TASK_STATE_COMPLETED"
    );
    assert!(reply_text(&data[0]["result"]["task"]).contains("a reply of many chunks"));

    // Never reached, or not an id at all: invalid params, on both versions.
    for (version, method) in [(V1, "SubscribeToTask"), (V03, "tasks/resubscribe")] {
        for bad in [
            format!("{turn}.999"),
            format!("{}.1", turn + 1),
            "x.1".into(),
            "3.0".into(),
        ] {
            let response = server
                .client
                .post(&server.url)
                .header("A2A-Version", version)
                .header("Last-Event-ID", &bad)
                .json(&json!({"jsonrpc": "2.0", "id": 7, "method": method, "params": {"id": task_id}}))
                .send()
                .await
                .unwrap();
            let text = response.text().await.unwrap();
            let json_text = text.strip_prefix("data: ").unwrap_or(&text);
            let answer: Value = serde_json::from_str(json_text.trim()).expect(&text);
            assert_eq!(answer["error"]["code"], -32602, "{version} {bad}: {text}");
            assert!(
                answer["error"]["message"]
                    .as_str()
                    .unwrap()
                    .contains("lastEventId"),
                "{text}"
            );
        }
    }
    let (status, _) = {
        let response = server
            .client
            .get(format!(
                "{}tasks/{task_id}:subscribe?lastEventId={turn}.999",
                server.url
            ))
            .send()
            .await
            .unwrap();
        (response.status().as_u16(), response.text().await)
    };
    assert_eq!(status, 400);

    let metrics = server.metrics_text().await;
    assert!(
        metrics.contains("colloquy_stream_resumes_total{outcome=\"replayed\"} 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("colloquy_stream_resumes_total{outcome=\"snapshot\"} 1"),
        "{metrics}"
    );
    server.stop().await;
}

/// The reply a resumed stream carries, a task snapshot resetting it; and its ids in order.
async fn read_reply(stream: &mut Events) -> (String, Vec<(u64, u32)>) {
    let (mut reply, mut ids) = (String::new(), Vec::new());
    while let Some(event) = next(stream).await {
        ids.push(parse_id(&event.id));
        match seen(&event.result) {
            Seen::Task(task) => reply = reply_text(task),
            Seen::Chunk(chunk) => reply.push_str(&chunk),
            Seen::Other => {}
        }
    }
    (reply, ids)
}

#[actix_rt::test]
async fn a_resume_follows_the_task_through_a_wait_for_input_and_replays_every_turn() {
    let server = start_with(asker(), |_| {}).await;
    let mut first = events(Binding::JsonRpc(V1).stream(&server, "book a table").await);
    let opened = next(&mut first).await.expect("the task");
    let Seen::Task(task) = seen(&opened.result) else {
        panic!("{:?}", opened.result)
    };
    let (task_id, context_id) = (
        task["id"].as_str().unwrap().to_owned(),
        task["contextId"].as_str().unwrap().to_owned(),
    );
    // The connection drops after the first event; the turn goes on and waits for input.
    drop(first);
    let mut state = String::new();
    for _ in 0..100 {
        let task = server.rpc(V1, "GetTask", json!({"id": task_id})).await;
        state = task["result"]["status"]["state"]
            .as_str()
            .unwrap_or_else(|| panic!("{task}"))
            .to_owned();
        if state == "TASK_STATE_INPUT_REQUIRED" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(state, "TASK_STATE_INPUT_REQUIRED");

    let mut resumed = events(
        Binding::JsonRpc(V1)
            .resume(&server, &task_id, &opened.id, false)
            .await,
    );
    let missed = next(&mut resumed).await.expect("the missed status");
    assert!(parse_id(&missed.id) > parse_id(&opened.id));
    assert_eq!(
        missed.result["statusUpdate"]["status"]["state"], "TASK_STATE_INPUT_REQUIRED",
        "{:?}",
        missed.result
    );
    // The stream stays open through the wait and carries the turn that answers it.
    let answer = json!({"message": user_message(V1, "monday", Some(&context_id), Some(&task_id))});
    let answered = server.rpc(V1, "SendMessage", answer).await;
    assert_eq!(
        answered["result"]["task"]["status"]["state"], "TASK_STATE_COMPLETED",
        "{answered}"
    );
    let (reply, ids) = read_reply(&mut resumed).await;
    assert_eq!(reply, "booked for monday");
    assert!(ids.windows(2).all(|w| w[0] < w[1]), "{ids:?}");
    assert!(ids[0].0 > parse_id(&missed.id).0, "a later turn: {ids:?}");

    // After the end, the same resume replays both turns' rest and closes.
    let mut again = events(
        Binding::JsonRpc(V1)
            .resume(&server, &task_id, &opened.id, true)
            .await,
    );
    let (reply, replayed) = read_reply(&mut again).await;
    assert_eq!(reply, "booked for monday");
    assert_eq!(replayed[0], parse_id(&missed.id));
    assert_eq!(replayed[1..], ids[..], "the same events, the same ids");
    server.stop().await;
}

/// A loopback proxy to `target` that, on each connection that carries a streamed send, cuts
/// the connection once `cut_after` bytes of the answer have passed; returns its URL and the
/// requests it relayed.
async fn cutting_proxy(
    target: std::net::SocketAddr,
    cut_after: usize,
) -> (String, Arc<std::sync::Mutex<String>>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/", listener.local_addr().unwrap());
    let seen = Arc::new(std::sync::Mutex::new(String::new()));
    let log = seen.clone();
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let upstream = tokio::net::TcpStream::connect(target).await.unwrap();
            let (mut client_read, mut client_write) = client.into_split();
            let (mut up_read, mut up_write) = upstream.into_split();
            let streaming = Arc::new(std::sync::atomic::AtomicBool::new(false));
            let (flag, log) = (streaming.clone(), log.clone());
            tokio::spawn(async move {
                let mut buffer = vec![0; 16 * 1024];
                while let Ok(n @ 1..) = client_read.read(&mut buffer).await {
                    let text = String::from_utf8_lossy(&buffer[..n]).into_owned();
                    if text.contains("SendStreamingMessage") {
                        flag.store(true, std::sync::atomic::Ordering::SeqCst);
                    }
                    log.lock().unwrap().push_str(&text);
                    if up_write.write_all(&buffer[..n]).await.is_err() {
                        break;
                    }
                }
            });
            tokio::spawn(async move {
                let mut buffer = vec![0; 256];
                let mut passed = 0;
                while let Ok(n @ 1..) = up_read.read(&mut buffer).await {
                    if streaming.load(std::sync::atomic::Ordering::SeqCst) {
                        passed += n;
                        if passed > cut_after {
                            // Cut: drop both halves mid-stream.
                            return;
                        }
                    }
                    if client_write.write_all(&buffer[..n]).await.is_err() {
                        break;
                    }
                }
            });
        }
    });
    (url, seen)
}

#[actix_rt::test]
async fn the_client_resumes_its_own_stream_after_a_dropped_connection() {
    let agent = Arc::new(EchoAgent::new(2, Duration::from_millis(3)));
    let server = start_with(agent, |_| {}).await;
    let target = server
        .url
        .trim_start_matches("http://")
        .trim_end_matches('/');
    let (proxy_url, relayed) = cutting_proxy(target.parse().unwrap(), 1_500).await;
    let peer = colloquy::client::connect(&proxy_url, Default::default())
        .await
        .expect("the card through the proxy");
    let text = "a long question ".repeat(6);
    let message = colloquy::client::user_text_message(&text, None, None);
    let mut stream = peer.stream(&message).await.expect("a stream");
    let mut assembler = colloquy::client::TaskAssembler::default();
    let mut printed = String::new();
    while let Some(item) = stream.next().await {
        printed.push_str(&assembler.apply(item.expect("an item, resumed past the cut")));
    }
    assert!(assembler.finished);
    let task = assembler.task.expect("a task");
    let stored = server.rpc(V1, "GetTask", json!({"id": task.id})).await;
    assert_eq!(stored["result"]["status"]["state"], "TASK_STATE_COMPLETED");
    assert_eq!(printed, reply_text(&stored["result"]), "printed once each");
    assert!(printed.contains(text.trim()), "{printed}");
    let relayed = relayed.lock().unwrap().to_ascii_lowercase();
    assert!(
        relayed.contains("last-event-id: "),
        "the stream was cut and resumed: {relayed}"
    );
    server.stop().await;
}

/// Once no node logs a finished turn any more (here: the server restarted on its data), a
/// resume is served from the outline the turn's end stored with the task: the events after the
/// id exactly, no snapshot, on both versions and both HTTP bindings.
#[actix_rt::test]
async fn a_finished_turn_resumes_from_the_store_after_a_restart() {
    let echo = || Arc::new(EchoAgent::new(3, Duration::from_millis(1)));
    let server = start_with(echo(), |_| {}).await;
    let bindings = [
        Binding::JsonRpc(V1),
        Binding::JsonRpc(V03),
        Binding::Rest(V1),
        Binding::Rest(V03),
    ];
    let mut cut = Vec::new();
    for (i, binding) in bindings.into_iter().enumerate() {
        let text = format!("resumed from the store {i}: é€😀 {}", "xyz".repeat(5));
        let (mut stream, task_id, mut reply, mut last) = open_stream(&server, binding, &text).await;
        for _ in 0..3 + i {
            let event = next(&mut stream).await.expect("an event");
            if let Seen::Chunk(chunk) = seen(&event.result) {
                reply.push_str(&chunk);
            }
            last = event.id;
        }
        drop(stream);
        cut.push((binding, task_id, reply, last));
    }
    for (_, task_id, _, _) in &cut {
        wait_for_state(&server, task_id, "TASK_STATE_COMPLETED").await;
    }
    let dir = server.stop().await;
    let server = common::start_in(dir, echo(), |_| {}).await;

    for (binding, task_id, mut reply, mut last) in cut {
        let response = binding.resume(&server, &task_id, &last, false).await;
        assert_eq!(
            response.headers()["x-colloquy-resumed"],
            "replayed",
            "{binding:?}"
        );
        let mut stream = events(response);
        while let Some(event) = next(&mut stream).await {
            last = take_replayed(binding, event, &last, &mut reply);
        }
        let stored = server.rpc(V1, "GetTask", json!({"id": task_id})).await;
        assert_eq!(
            reply,
            reply_text(&stored["result"]),
            "{binding:?}: the chunks before the restart and after make the stored reply"
        );
    }
    server.stop().await;
}

/// Waits until the task reads `state` (v1.0 spelling).
async fn wait_for_state(server: &TestServer, task_id: &str, state: &str) {
    for _ in 0..200 {
        let task = server.rpc(V1, "GetTask", json!({"id": task_id})).await;
        if task["result"]["status"]["state"] == state {
            return;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("task {task_id} never reached {state}");
}
