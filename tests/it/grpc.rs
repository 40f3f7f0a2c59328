//! The gRPC binding (`lf.a2a.v1.A2AService`) beside the HTTP ones, driven with the official
//! generated client (`a2a-pb`, tonic): conversations, streams, listing, cancel, push configs,
//! errors as gRPC statuses with the same `ErrorInfo`, the same auth, and the card listing it.

use crate::common;

use a2a_pb::proto as pb;
use common::*;
use pb::a2a_service_client::A2aServiceClient;
use serde_json::{Value, json};
use std::time::Duration;
use tonic::transport::Channel;
use tonic::{Code, Request, Status};
use tonic_types::StatusExt;

pub(crate) async fn client(server: &TestServer) -> A2aServiceClient<Channel> {
    let addr = server.server.grpc_addr.expect("the gRPC binding is served");
    A2aServiceClient::connect(format!("http://{addr}"))
        .await
        .expect("connects")
}

fn message(text: &str, context_id: &str, task_id: &str) -> pb::Message {
    pb::Message {
        message_id: format!("m-{}", next_id()),
        context_id: context_id.into(),
        task_id: task_id.into(),
        role: pb::Role::User as i32,
        parts: vec![pb::Part {
            content: Some(pb::part::Content::Text(text.into())),
            ..Default::default()
        }],
        ..Default::default()
    }
}

fn send_request(text: &str, context_id: &str) -> pb::SendMessageRequest {
    pb::SendMessageRequest {
        message: Some(message(text, context_id, "")),
        ..Default::default()
    }
}

fn with_token<T>(body: T, token: &str) -> Request<T> {
    let mut request = Request::new(body);
    let value = format!("Bearer {token}").parse().expect("ascii");
    request.metadata_mut().insert("authorization", value);
    request
}

/// A turn sent without waiting for it (`returnImmediately`): its task, as it started.
async fn started(grpc: &mut A2aServiceClient<Channel>, text: &str, context_id: &str) -> pb::Task {
    let request = pb::SendMessageRequest {
        message: Some(message(text, context_id, "")),
        configuration: Some(pb::SendMessageConfiguration {
            return_immediately: true,
            ..Default::default()
        }),
        ..Default::default()
    };
    task_of(grpc.send_message(request).await.expect("sent").into_inner())
}

fn task_of(response: pb::SendMessageResponse) -> pb::Task {
    match response.payload {
        Some(pb::send_message_response::Payload::Task(task)) => task,
        other => panic!("a task, not {other:?}"),
    }
}

pub(crate) fn text_of(task: &pb::Task) -> String {
    task.artifacts
        .iter()
        .flat_map(|artifact| &artifact.parts)
        .filter_map(|part| match &part.content {
            Some(pb::part::Content::Text(text)) => Some(text.as_str()),
            _ => None,
        })
        .collect()
}

pub(crate) fn state(task: &pb::Task) -> pb::TaskState {
    task.status
        .as_ref()
        .map_or(pb::TaskState::Unspecified, |status| status.state())
}

/// The status's `ErrorInfo` reason, after checking its domain is the specification's.
fn reason(status: &Status) -> String {
    let details = status.get_error_details();
    let info = details
        .error_info()
        .unwrap_or_else(|| panic!("an ErrorInfo in {status:?}"));
    assert_eq!(info.domain, "a2a-protocol.org", "{status:?}");
    info.reason.clone()
}

/// Every `StreamResponse` of a stream, until it ends; the status that ended it, if any.
pub(crate) async fn drain(
    mut stream: tonic::Streaming<pb::StreamResponse>,
) -> (Vec<pb::StreamResponse>, Option<Status>) {
    let mut events = Vec::new();
    loop {
        match stream.message().await {
            Ok(Some(event)) => events.push(event),
            Ok(None) => return (events, None),
            Err(status) => return (events, Some(status)),
        }
    }
}

pub(crate) fn chunk_text(event: &pb::StreamResponse) -> Option<String> {
    match &event.payload {
        Some(pb::stream_response::Payload::ArtifactUpdate(update)) => {
            let artifact = update.artifact.as_ref()?;
            Some(
                artifact
                    .parts
                    .iter()
                    .filter_map(|part| match &part.content {
                        Some(pb::part::Content::Text(text)) => Some(text.as_str()),
                        _ => None,
                    })
                    .collect(),
            )
        }
        _ => None,
    }
}

pub(crate) fn final_state(events: &[pb::StreamResponse]) -> Option<pb::TaskState> {
    match &events.last()?.payload {
        Some(pb::stream_response::Payload::StatusUpdate(update)) => {
            update.status.as_ref().map(|status| status.state())
        }
        Some(pb::stream_response::Payload::Task(task)) => Some(state(task)),
        _ => None,
    }
}

#[actix_rt::test]
async fn a_multi_turn_conversation_get_list_and_cancel_over_grpc() {
    let server = start_scripted(|_| {}).await;
    let mut grpc = client(&server).await;
    let first = task_of(
        grpc.send_message(send_request("hello", "grpc-conversation"))
            .await
            .expect("sent")
            .into_inner(),
    );
    assert_eq!(first.context_id, "grpc-conversation");
    assert_eq!(state(&first), pb::TaskState::Completed);
    next_millisecond().await;
    let second = task_of(
        grpc.send_message(send_request("again", "grpc-conversation"))
            .await
            .expect("sent")
            .into_inner(),
    );
    assert_eq!(
        text_of(&second),
        "echo: again (turn 2; previously: \"hello\")",
        "the second turn saw the first"
    );

    // The same conversation read over JSON-RPC: one store, one engine.
    let over_rpc = server
        .rpc(V1, "GetTask", json!({"id": second.id, "historyLength": 10}))
        .await;
    assert_eq!(over_rpc["result"]["contextId"], json!("grpc-conversation"));

    let got = grpc
        .get_task(pb::GetTaskRequest {
            id: second.id.clone(),
            history_length: Some(10),
            ..Default::default()
        })
        .await
        .expect("got")
        .into_inner();
    assert_eq!(got.id, second.id);
    assert_eq!(text_of(&got), text_of(&second));
    assert!(!got.history.is_empty(), "history when asked for");

    let listed = grpc
        .list_tasks(pb::ListTasksRequest {
            context_id: "grpc-conversation".into(),
            ..Default::default()
        })
        .await
        .expect("listed")
        .into_inner();
    let ids: Vec<&str> = listed.tasks.iter().map(|task| task.id.as_str()).collect();
    assert_eq!(ids, [second.id.as_str(), first.id.as_str()], "newest first");

    // A running task is canceled; an ended one cannot be.
    let running = started(&mut grpc, "slow 5000", "grpc-cancel").await;
    let canceled = grpc
        .cancel_task(pb::CancelTaskRequest {
            id: running.id.clone(),
            ..Default::default()
        })
        .await
        .expect("canceled")
        .into_inner();
    assert_eq!(state(&canceled), pb::TaskState::Canceled);
    let again = grpc
        .cancel_task(pb::CancelTaskRequest {
            id: first.id.clone(),
            ..Default::default()
        })
        .await
        .expect_err("an ended task is not cancelable");
    assert_eq!(again.code(), Code::FailedPrecondition);
    assert_eq!(reason(&again), "TASK_NOT_CANCELABLE");
    server.stop().await;
}

#[actix_rt::test]
async fn streams_carry_every_chunk_and_subscriptions_follow_the_task() {
    let server = start_scripted(|_| {}).await;
    let mut grpc = client(&server).await;
    let stream = grpc
        .send_streaming_message(send_request("drip 5 2: abcdef", "grpc-stream"))
        .await
        .expect("a stream")
        .into_inner();
    let (events, error) = drain(stream).await;
    assert!(error.is_none(), "{error:?}");
    assert!(
        matches!(
            events[0].payload,
            Some(pb::stream_response::Payload::Task(_))
        ),
        "the task first: {events:?}"
    );
    let text: String = events.iter().filter_map(chunk_text).collect();
    assert_eq!(text, "abcdef", "append-only chunks, none lost");
    assert_eq!(final_state(&events), Some(pb::TaskState::Completed));

    // A subscriber to a running task gets it so far, then the rest, then the end.
    let running = started(&mut grpc, "drip 100 1: xyz", "grpc-subscribe").await;
    let subscribed = grpc
        .subscribe_to_task(pb::SubscribeToTaskRequest {
            id: running.id.clone(),
            ..Default::default()
        })
        .await
        .expect("subscribed")
        .into_inner();
    let (events, error) = tokio::time::timeout(Duration::from_secs(10), drain(subscribed))
        .await
        .expect("the stream ends with the task");
    assert!(error.is_none(), "{error:?}");
    assert_eq!(final_state(&events), Some(pb::TaskState::Completed));
    let stored = grpc
        .get_task(pb::GetTaskRequest {
            id: running.id.clone(),
            ..Default::default()
        })
        .await
        .expect("got")
        .into_inner();
    assert_eq!(text_of(&stored), "xyz");

    // An ended task cannot be subscribed to: the status says why.
    let ended = grpc
        .subscribe_to_task(pb::SubscribeToTaskRequest {
            id: running.id,
            ..Default::default()
        })
        .await
        .expect_err("an ended task");
    assert_eq!(ended.code(), Code::Unimplemented);
    assert_eq!(reason(&ended), "UNSUPPORTED_OPERATION");
    server.stop().await;
}

#[actix_rt::test]
async fn errors_are_grpc_statuses_with_the_error_info_and_the_server_keeps_serving() {
    let server = start_scripted(|c| c.limits.body_bytes = 64 * 1024).await;
    let mut grpc = client(&server).await;
    let missing = grpc
        .get_task(pb::GetTaskRequest {
            id: "no-such-task".into(),
            ..Default::default()
        })
        .await
        .expect_err("not found");
    assert_eq!(missing.code(), Code::NotFound);
    assert_eq!(reason(&missing), "TASK_NOT_FOUND");

    // One running task per conversation: a second send is turned away at once.
    let running = started(&mut grpc, "slow 3000", "grpc-busy").await;
    let busy = grpc
        .send_message(send_request("me too", "grpc-busy"))
        .await
        .expect_err("busy");
    assert_eq!(busy.code(), Code::Aborted);
    assert_eq!(reason(&busy), "CONTEXT_BUSY");
    let details = busy.get_error_details();
    let info = details.error_info().expect("ErrorInfo");
    assert_eq!(info.metadata["contextId"], "grpc-busy");
    assert_eq!(info.metadata["taskId"], running.id);

    // A message without parts, an oversize one, and a version gRPC does not serve.
    let empty = grpc
        .send_message(pb::SendMessageRequest {
            message: Some(pb::Message {
                parts: Vec::new(),
                ..message("", "grpc-invalid", "")
            }),
            ..Default::default()
        })
        .await
        .expect_err("no parts");
    assert_eq!(empty.code(), Code::InvalidArgument, "{empty:?}");
    let oversize = grpc
        .send_message(send_request(&"x".repeat(100 * 1024), "grpc-invalid"))
        .await
        .expect_err("over limits.body_bytes");
    // Refused before anything is decoded, with gRPC's code for a message over the limit.
    assert_eq!(oversize.code(), Code::ResourceExhausted, "{oversize:?}");
    assert!(oversize.message().contains("65536"), "{oversize:?}");
    let mut old = Request::new(send_request("hi", "grpc-invalid"));
    old.metadata_mut()
        .insert("a2a-version", "0.3".parse().expect("ascii"));
    let refused = grpc.send_message(old).await.expect_err("0.3 over gRPC");
    assert_eq!(refused.code(), Code::Unimplemented);
    assert_eq!(reason(&refused), "VERSION_NOT_SUPPORTED");
    let no_card = grpc
        .get_extended_agent_card(pb::GetExtendedAgentCardRequest::default())
        .await
        .expect_err("no extended card");
    assert_eq!(reason(&no_card), "EXTENDED_AGENT_CARD_NOT_CONFIGURED");

    // Nothing of the refused requests was stored, and the server still serves.
    let listed = server
        .rpc(V1, "ListTasks", json!({"contextId": "grpc-invalid"}))
        .await;
    assert_eq!(listed["result"]["tasks"], json!([]), "{listed}");
    let fine = grpc
        .send_message(send_request("still here", "grpc-after"))
        .await
        .expect("served");
    assert_eq!(state(&task_of(fine.into_inner())), pb::TaskState::Completed);
    server.stop().await;
}

#[actix_rt::test]
async fn the_same_auth_guards_grpc_and_the_card_lists_it() {
    let server = start_with_tokens().await;
    let mut grpc = client(&server).await;
    let anonymous = grpc
        .send_message(send_request("hi", "grpc-auth"))
        .await
        .expect_err("no token");
    assert_eq!(anonymous.code(), Code::Unauthenticated);
    assert_eq!(reason(&anonymous), "UNAUTHENTICATED");
    let wrong = grpc
        .send_message(with_token(send_request("hi", "grpc-auth"), "guess"))
        .await
        .expect_err("a wrong token");
    assert_eq!(wrong.code(), Code::Unauthenticated);

    // Two tokens are refused, not guessed between.
    let mut twice = with_token(send_request("hi", "grpc-auth"), "alice-secret");
    let bob = "Bearer bob-secret".parse().expect("ascii");
    twice.metadata_mut().append("authorization", bob);
    let twice = grpc.send_message(twice).await.expect_err("two tokens");
    assert_eq!(twice.code(), Code::InvalidArgument, "{twice:?}");

    let mine = task_of(
        grpc.send_message(with_token(
            send_request("mine", "grpc-auth"),
            "alice-secret",
        ))
        .await
        .expect("alice's turn")
        .into_inner(),
    );
    let theirs = grpc
        .get_task(with_token(
            pb::GetTaskRequest {
                id: mine.id.clone(),
                ..Default::default()
            },
            "bob-secret",
        ))
        .await
        .expect_err("another principal's task");
    assert_eq!(theirs.code(), Code::NotFound);
    // Bob's conversation of the same contextId is his own.
    let bobs = task_of(
        grpc.send_message(with_token(send_request("his", "grpc-auth"), "bob-secret"))
            .await
            .expect("bob's turn")
            .into_inner(),
    );
    assert_eq!(text_of(&bobs), "echo: his (turn 1)");

    let card: Value = server
        .client
        .get(format!("{}.well-known/agent-card.json", server.url))
        .send()
        .await
        .expect("card")
        .json()
        .await
        .expect("JSON");
    let interfaces = card["supportedInterfaces"].as_array().expect("interfaces");
    let grpc_interface = interfaces
        .iter()
        .find(|i| i["protocolBinding"] == "GRPC")
        .expect("the card lists GRPC");
    let addr = server.server.grpc_addr.expect("served");
    // A gRPC target, as channels dial it.
    assert_eq!(grpc_interface["url"], json!(addr.to_string()));
    assert_eq!(grpc_interface["protocolVersion"], json!("1.0"));
    server.stop().await;
}

#[actix_rt::test]
async fn push_configs_are_created_read_listed_and_deleted_over_grpc() {
    let server = start_scripted(|c| c.push.allow_private_networks = true).await;
    let mut grpc = client(&server).await;
    let task = task_of(
        grpc.send_message(send_request("ask: which one?", "grpc-push"))
            .await
            .expect("sent")
            .into_inner(),
    );
    assert_eq!(state(&task), pb::TaskState::InputRequired);
    let created = grpc
        .create_task_push_notification_config(pb::TaskPushNotificationConfig {
            task_id: task.id.clone(),
            id: "hook-1".into(),
            url: "http://127.0.0.1:9/hook".into(),
            token: "opaque".into(),
            ..Default::default()
        })
        .await
        .expect("created")
        .into_inner();
    assert_eq!(created.id, "hook-1");
    assert_eq!(created.task_id, task.id);
    let got = grpc
        .get_task_push_notification_config(pb::GetTaskPushNotificationConfigRequest {
            task_id: task.id.clone(),
            id: "hook-1".into(),
            ..Default::default()
        })
        .await
        .expect("got")
        .into_inner();
    assert_eq!(got.url, "http://127.0.0.1:9/hook");
    let listed = grpc
        .list_task_push_notification_configs(pb::ListTaskPushNotificationConfigsRequest {
            task_id: task.id.clone(),
            ..Default::default()
        })
        .await
        .expect("listed")
        .into_inner();
    assert_eq!(listed.configs.len(), 1, "{listed:?}");
    grpc.delete_task_push_notification_config(pb::DeleteTaskPushNotificationConfigRequest {
        task_id: task.id.clone(),
        id: "hook-1".into(),
        ..Default::default()
    })
    .await
    .expect("deleted");
    let missing = grpc
        .get_task_push_notification_config(pb::GetTaskPushNotificationConfigRequest {
            task_id: task.id.clone(),
            id: "hook-1".into(),
            ..Default::default()
        })
        .await
        .expect_err("deleted");
    // As JSON-RPC answers it: the task is there, the config id is not a valid one for it.
    assert_eq!(missing.code(), Code::InvalidArgument, "{missing:?}");
    assert_eq!(reason(&missing), "INVALID_PARAMS");
    // Another principal's task is not found either (no tokens here: a task that is not).
    let unknown = grpc
        .create_task_push_notification_config(pb::TaskPushNotificationConfig {
            task_id: "no-such-task".into(),
            url: "http://127.0.0.1:9/hook".into(),
            ..Default::default()
        })
        .await
        .expect_err("an unknown task");
    assert_eq!(reason(&unknown), "TASK_NOT_FOUND");
    server.stop().await;
}

/// A subscription follows the task, not the turn: on a task waiting for input it stays open
/// through the wait and the answer's turn, and ends when the task completes.
#[actix_rt::test]
async fn a_subscription_follows_the_task_through_a_wait_for_input() {
    let server = start_scripted(|_| {}).await;
    let mut grpc = client(&server).await;
    let waiting = task_of(
        grpc.send_message(send_request("ask: your name?", "grpc-wait"))
            .await
            .expect("sent")
            .into_inner(),
    );
    assert_eq!(state(&waiting), pb::TaskState::InputRequired);
    let subscribe = pb::SubscribeToTaskRequest {
        id: waiting.id.clone(),
        ..Default::default()
    };
    let mut stream = grpc
        .subscribe_to_task(subscribe)
        .await
        .expect("subscribed")
        .into_inner();
    let first = stream.message().await.expect("an event").expect("the task");
    assert!(
        matches!(&first.payload, Some(pb::stream_response::Payload::Task(t)) if t.id == waiting.id),
        "{first:?}"
    );
    let open = tokio::time::timeout(Duration::from_millis(300), stream.message()).await;
    assert!(open.is_err(), "the stream ended while waiting: {open:?}");

    let answer = task_of(
        grpc.send_message(pb::SendMessageRequest {
            message: Some(message("Ada", "grpc-wait", &waiting.id)),
            ..Default::default()
        })
        .await
        .expect("answered")
        .into_inner(),
    );
    assert_eq!(state(&answer), pb::TaskState::Completed);
    let (rest, error) = tokio::time::timeout(Duration::from_secs(20), drain(stream))
        .await
        .expect("the stream ends once the task completed");
    assert!(error.is_none(), "{error:?}");
    assert_eq!(final_state(&rest), Some(pb::TaskState::Completed));
    server.stop().await;
}

/// A subscriber that reads nothing while the reply floods past its buffer is closed with
/// SUBSCRIBER_TOO_SLOW after what it had, never skipped ahead; a reader keeping up gets it all.
#[actix_rt::test]
async fn a_slow_reader_is_closed_with_subscriber_too_slow_not_skipped_ahead() {
    let server = start_scripted(|c| c.streaming.subscriber_buffer = 16).await;
    let mut grpc = client(&server).await;
    let (count, size) = (1500, 16 * 1024);
    let mut fast = grpc
        .send_streaming_message(send_request(&format!("flood {count} {size}"), "grpc-flood"))
        .await
        .expect("a stream")
        .into_inner();
    let first = fast.message().await.expect("an event").expect("the task");
    let Some(pb::stream_response::Payload::Task(task)) = first.payload else {
        panic!("the task first");
    };
    let slow = grpc
        .subscribe_to_task(pb::SubscribeToTaskRequest {
            id: task.id.clone(),
            ..Default::default()
        })
        .await
        .expect("subscribed")
        .into_inner();
    let fast_events = tokio::spawn(drain(fast));
    // The slow subscriber reads nothing until the agent is done.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let (events, error) = drain(slow).await;
    let (fast_events, fast_error) = fast_events.await.expect("the fast reader");
    assert!(fast_error.is_none(), "{fast_error:?}");
    let fast_bytes: usize = fast_events
        .iter()
        .filter_map(chunk_text)
        .map(|t| t.len())
        .sum();
    assert_eq!(fast_bytes, count * size, "the fast reader got every chunk");
    let error = error.expect("the slow reader's stream ends with an error");
    assert_eq!(error.code(), Code::ResourceExhausted, "{error:?}");
    assert_eq!(reason(&error), "SUBSCRIBER_TOO_SLOW");
    // What it did get is the reply's start, in order: the snapshot, then chunks.
    assert!(
        matches!(
            events.first().and_then(|e| e.payload.as_ref()),
            Some(pb::stream_response::Payload::Task(_))
        ),
        "the task first"
    );
    let slow_bytes: usize = events.iter().filter_map(chunk_text).map(|t| t.len()).sum();
    assert!(slow_bytes < count * size, "it fell behind: {slow_bytes}");
    server.stop().await;
}

/// `limits.max_connections` holds on the gRPC port too: past it a new connection waits (in the
/// listen queue) until one closes, then is served.
#[actix_rt::test]
async fn connections_past_the_limit_wait_for_a_free_place() {
    let server = start_echo_with(|c| {
        c.limits.max_connections = 2;
        c.workers = 2;
    })
    .await;
    let lookup = || pb::GetTaskRequest {
        id: "none".into(),
        ..Default::default()
    };
    let mut first = client(&server).await;
    let mut second = client(&server).await;
    for held in [&mut first, &mut second] {
        let answer = held.get_task(lookup()).await.expect_err("no such task");
        assert_eq!(answer.code(), Code::NotFound);
    }
    let third = tokio::time::timeout(Duration::from_millis(800), async {
        let mut third = client(&server).await;
        third.get_task(lookup()).await
    })
    .await;
    assert!(third.is_err(), "a third connection was served: {third:?}");
    drop(first);
    let after = tokio::time::timeout(Duration::from_secs(10), async {
        let mut third = client(&server).await;
        third.get_task(lookup()).await
    })
    .await
    .expect("served once a place is free");
    assert_eq!(after.expect_err("no such task").code(), Code::NotFound);
    drop(second);
    server.stop().await;
}

/// A call whose request message never arrives in full is answered DEADLINE_EXCEEDED after
/// `limits.body_timeout_ms`, instead of holding the call forever; others are served meanwhile.
#[actix_rt::test]
async fn a_request_message_that_never_ends_gets_deadline_exceeded() {
    let server = start_echo_with(|c| c.limits.body_timeout_ms = 500).await;
    let addr = server.server.grpc_addr.expect("served");
    let tcp = tokio::net::TcpStream::connect(addr)
        .await
        .expect("connects");
    let (mut h2, connection) = h2::client::handshake(tcp).await.expect("HTTP/2");
    tokio::spawn(connection);
    let request = http::Request::post(format!("http://{addr}/lf.a2a.v1.A2AService/SendMessage"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(())
        .expect("a request");
    let started = std::time::Instant::now();
    let (response, mut body) = h2.send_request(request, false).expect("sent");
    // A message announced as 100 bytes, of which 3 are sent, and never the rest.
    body.send_data(
        bytes::Bytes::from_static(&[0, 0, 0, 0, 100, 1, 2, 3]),
        false,
    )
    .expect("a frame");

    // Meanwhile the server serves other calls.
    let mut grpc = client(&server).await;
    let fine = grpc
        .send_message(send_request("meanwhile", "grpc-deadline"))
        .await
        .expect("served");
    assert_eq!(state(&task_of(fine.into_inner())), pb::TaskState::Completed);

    let response = tokio::time::timeout(Duration::from_secs(5), response)
        .await
        .expect("answered within the deadline and a margin")
        .expect("a response");
    let elapsed = started.elapsed();
    // In the headers of a trailers-only answer, else in the trailers.
    let headers = response.headers().clone();
    let mut response_body = response.into_body();
    let status = match headers.get("grpc-status") {
        Some(status) => Some(status.clone()),
        None => response_body
            .trailers()
            .await
            .expect("trailers")
            .and_then(|trailers| trailers.get("grpc-status").cloned()),
    };
    let message = headers
        .get("grpc-message")
        .and_then(|m| m.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    assert_eq!(
        status.as_ref().and_then(|s| s.to_str().ok()),
        Some("4"),
        "DEADLINE_EXCEEDED: {headers:?}"
    );
    assert!(message.contains("body_timeout_ms"), "{message}");
    assert!(elapsed >= Duration::from_millis(450), "{elapsed:?}");
    server.stop().await;
}

/// The id a streamed event carries in its metadata.
fn event_id(event: &pb::StreamResponse) -> Option<String> {
    use pb::stream_response::Payload;
    let metadata = match event.payload.as_ref()? {
        Payload::Task(task) => task.metadata.as_ref(),
        Payload::Message(message) => message.metadata.as_ref(),
        Payload::StatusUpdate(update) => update.metadata.as_ref(),
        Payload::ArtifactUpdate(update) => update.metadata.as_ref(),
    }?;
    match metadata.fields.get("colloquy/eventId")?.kind.as_ref()? {
        prost_types::value::Kind::StringValue(id) => Some(id.clone()),
        _ => None,
    }
}

#[actix_rt::test]
async fn a_stream_cut_short_resumes_after_the_last_event_id_in_its_metadata() {
    let server = start_scripted(|_| {}).await;
    let mut grpc = client(&server).await;
    let mut stream = grpc
        .send_streaming_message(send_request(
            "drip 20 2: abcdefghijklmnopqrst",
            "grpc-resume",
        ))
        .await
        .expect("a stream")
        .into_inner();
    let (mut text, mut ids) = (String::new(), Vec::new());
    for _ in 0..4 {
        let event = stream.message().await.expect("read").expect("an event");
        ids.push(event_id(&event).expect("every event has its id"));
        text.push_str(&chunk_text(&event).unwrap_or_default());
    }
    drop(stream);
    let mut resume = tonic::Request::new(pb::SubscribeToTaskRequest {
        id: {
            let listed = server
                .rpc(V1, "ListTasks", json!({"contextId": "grpc-resume"}))
                .await;
            listed["result"]["tasks"][0]["id"]
                .as_str()
                .unwrap()
                .to_owned()
        },
        ..Default::default()
    });
    let last = ids.last().unwrap().clone();
    resume
        .metadata_mut()
        .insert("last-event-id", last.parse().unwrap());
    let rest = grpc
        .subscribe_to_task(resume)
        .await
        .expect("resumed")
        .into_inner();
    let (events, error) = drain(rest).await;
    assert!(error.is_none(), "{error:?}");
    for event in &events {
        assert!(
            !matches!(event.payload, Some(pb::stream_response::Payload::Task(_))),
            "no snapshot after {last}: {events:?}"
        );
        ids.push(event_id(event).expect("an id"));
        text.push_str(&chunk_text(event).unwrap_or_default());
    }
    let numbers: Vec<u32> = ids
        .iter()
        .map(|id| id.split_once('.').unwrap().1.parse().unwrap())
        .collect();
    assert_eq!(
        numbers,
        (1..=numbers.len() as u32).collect::<Vec<_>>(),
        "{ids:?}"
    );
    assert_eq!(text, "abcdefghijklmnopqrst");
    assert_eq!(final_state(&events), Some(pb::TaskState::Completed));
    server.stop().await;
}

#[actix_rt::test]
async fn a_tenant_named_over_grpc_keeps_its_own_conversations() {
    let server = start_echo_with(|config| {
        config
            .auth
            .tokens
            .insert("alice".into(), "alice-secret".into());
        config
            .auth
            .tenants
            .insert("alice".into(), vec!["red".into()]);
    })
    .await;
    let mut grpc = client(&server).await;
    let in_tenant = |tenant: &str, text: &str| {
        let request = pb::SendMessageRequest {
            tenant: tenant.into(),
            ..send_request(text, "grpc-tenant")
        };
        with_token(request, "alice-secret")
    };
    let mut turn = async |tenant: &str, text: &str| {
        grpc.send_message(in_tenant(tenant, text))
            .await
            .map(|response| task_of(response.into_inner()))
    };
    let red = turn("red", "one").await.expect("red's first turn");
    assert_eq!(text_of(&red), "echo: one (turn 1)");
    let default = turn("", "two").await.expect("the default tenant's turn");
    assert_eq!(
        text_of(&default),
        "echo: two (turn 1)",
        "another conversation"
    );
    let again = turn("red", "three").await.expect("red's second turn");
    assert!(
        text_of(&again).starts_with("echo: three (turn 2"),
        "{}",
        text_of(&again)
    );
    let refused = turn("blue", "four")
        .await
        .expect_err("a tenant alice may not use");
    assert_eq!(refused.code(), Code::PermissionDenied, "{refused:?}");
    assert_eq!(reason(&refused), "PERMISSION_DENIED");

    let get = |tenant: &str| {
        let request = pb::GetTaskRequest {
            id: red.id.clone(),
            tenant: tenant.into(),
            ..Default::default()
        };
        with_token(request, "alice-secret")
    };
    let mut grpc = client(&server).await;
    assert_eq!(
        grpc.get_task(get("red"))
            .await
            .expect("in red")
            .into_inner()
            .id,
        red.id
    );
    let elsewhere = grpc
        .get_task(get(""))
        .await
        .expect_err("not in the default tenant");
    assert_eq!(elsewhere.code(), Code::NotFound);
    server.stop().await;
}
