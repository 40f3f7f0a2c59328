//! The A2A service over HTTP: every method in both versions, every task path, multi-turn,
//! busy contexts, restart. v0.3 responses are checked against the official schema.

use crate::common;

use common::*;
use serde_json::{Value, json};
use std::time::{Duration, Instant};

fn state_of(task: &Value) -> &str {
    task["status"]["state"].as_str().unwrap_or("")
}

fn expect_state(version: &str, state: &str) -> String {
    if version == V1 {
        format!("TASK_STATE_{}", state.to_uppercase().replace('-', "_"))
    } else {
        state.to_owned()
    }
}

/// Checks a v0.3 response against the schema (v1.0 has no official JSON schema to check).
fn checked(version: &str, definition: &str, response: Value) -> Value {
    if version == V03 {
        assert_v03_valid(definition, &response);
    }
    response
}

/// The vendored schema keeps its teeth: a real v0.3 task passes, and each way of breaking the
/// shape (a missing field, a v1.0 enum spelling, a wrong type, a wrong `kind`) is caught.
#[actix_rt::test]
async fn v03_schema_rejects_broken_shapes() {
    let server = start_echo().await;
    let response = server.send_text(V03, "shape check", None, None).await;
    let task = task_of(&response).clone();
    assert_v03_valid("Task", &task);
    let broken = |edit: &dyn Fn(&mut Value)| {
        let mut copy = task.clone();
        edit(&mut copy);
        copy
    };
    let remove = |value: &mut Value, field: &str| {
        value.as_object_mut().map(|object| object.remove(field));
    };
    let cases = [
        ("no contextId", broken(&|t| remove(t, "contextId"))),
        (
            "a v1.0 state",
            broken(&|t| t["status"]["state"] = json!("TASK_STATE_COMPLETED")),
        ),
        ("a numeric id", broken(&|t| t["id"] = json!(7))),
        ("the wrong kind", broken(&|t| t["kind"] = json!("message"))),
        (
            "a part without kind",
            broken(&|t| remove(&mut t["history"][0]["parts"][0], "kind")),
        ),
    ];
    for (what, value) in cases {
        assert!(
            !v03_schema_errors("Task", &value).is_empty(),
            "the schema accepted a task with {what}: {value:#}"
        );
    }
}

#[actix_rt::test]
async fn multi_turn_conversations_in_both_versions() {
    let server = start_echo().await;
    for version in [V1, V03] {
        let first = checked(
            version,
            "SendMessageResponse",
            server.send_text(version, "hello there", None, None).await,
        );
        let task = task_of(&first);
        assert_eq!(state_of(task), expect_state(version, "completed"));
        let context_id = task["contextId"].as_str().unwrap().to_owned();
        assert_eq!(artifact_text(task), "echo: hello there (turn 1)");
        let second = checked(
            version,
            "SendMessageResponse",
            server
                .send_text(version, "and again", Some(&context_id), None)
                .await,
        );
        let task = task_of(&second);
        assert_eq!(task["contextId"], json!(context_id));
        assert_eq!(
            artifact_text(task),
            "echo: and again (turn 2; previously: \"hello there\")"
        );
        if version == V03 {
            assert_eq!(task["kind"], "task");
            assert_eq!(second["result"]["history"][0]["kind"], "message");
        } else {
            assert!(
                second["result"].get("task").is_some(),
                "v1.0 wraps the task"
            );
        }
    }
    server.stop().await;
}

#[actix_rt::test]
async fn look_alike_context_ids_stay_apart_and_survive_a_restart() {
    let server = start_echo().await;
    server
        .send_text(V1, "slash one", Some("tenant/a"), None)
        .await;
    server
        .send_text(V1, "plain one", Some("tenanta"), None)
        .await;
    let dir = server.stop().await;

    let server = start_in(
        dir,
        std::sync::Arc::new(colloquy::agent::EchoAgent::default()),
        |_| {},
    )
    .await;
    let slash = server
        .send_text(V1, "slash two", Some("tenant/a"), None)
        .await;
    assert_eq!(
        artifact_text(task_of(&slash)),
        "echo: slash two (turn 2; previously: \"slash one\")"
    );
    let plain = server
        .send_text(V03, "plain two", Some("tenanta"), None)
        .await;
    assert_eq!(
        artifact_text(task_of(&plain)),
        "echo: plain two (turn 2; previously: \"plain one\")"
    );
    let listed = server
        .rpc(V1, "colloquy/listConversations", json!({}))
        .await;
    let mut ids: Vec<&str> = listed["result"]["conversations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["contextId"].as_str().unwrap())
        .collect();
    ids.sort();
    assert_eq!(ids, ["tenant/a", "tenanta"]);
    server.stop().await;
}

#[actix_rt::test]
async fn every_task_path_in_both_versions() {
    let server = start_scripted(|_| {}).await;
    for version in [V1, V03] {
        // input-required, then continued by taskId.
        let asked = checked(
            version,
            "SendMessageResponse",
            server
                .send_text(version, "ask: which city?", None, None)
                .await,
        );
        let task = task_of(&asked).clone();
        assert_eq!(state_of(&task), expect_state(version, "input-required"));
        assert_eq!(message_text(&task["status"]["message"]), "which city?");
        let context_id = task["contextId"].as_str().unwrap().to_owned();
        let task_id = task["id"].as_str().unwrap().to_owned();
        let answered = checked(
            version,
            "SendMessageResponse",
            server
                .send_text(version, "Paris", None, Some(&task_id))
                .await,
        );
        let done = task_of(&answered);
        assert_eq!(done["id"], json!(task_id));
        assert_eq!(done["contextId"], json!(context_id));
        assert_eq!(state_of(done), expect_state(version, "completed"));
        assert!(artifact_text(done).contains("previously: \"ask: which city?\""));

        // A message to a terminal task: -32004 in v1.0, -32602 in v0.3.
        let refused = checked(
            version,
            "SendMessageResponse",
            server
                .send_text(version, "more", None, Some(&task_id))
                .await,
        );
        assert_eq!(
            refused["error"]["code"],
            json!(if version == V1 { -32004 } else { -32602 })
        );

        // failed and rejected.
        let failed = checked(
            version,
            "SendMessageResponse",
            server.send_text(version, "fail", None, None).await,
        );
        assert_eq!(state_of(task_of(&failed)), expect_state(version, "failed"));
        assert!(message_text(&task_of(&failed)["status"]["message"]).contains("scripted failure"));
        let rejected = checked(
            version,
            "SendMessageResponse",
            server.send_text(version, "reject", None, None).await,
        );
        assert_eq!(
            state_of(task_of(&rejected)),
            expect_state(version, "rejected")
        );

        // Non-blocking, then polled to the end.
        let configuration = if version == V1 {
            json!({"returnImmediately": true})
        } else {
            json!({"blocking": false})
        };
        let started = Instant::now();
        let response = server
            .rpc(version, send_method(version), json!({"message": user_message(version, "slow 400", None, None), "configuration": configuration}))
            .await;
        let response = checked(version, "SendMessageResponse", response);
        assert!(
            started.elapsed() < Duration::from_millis(350),
            "returned at once"
        );
        let pending = task_of(&response);
        assert_eq!(state_of(pending), expect_state(version, "working"));
        let id = pending["id"].as_str().unwrap();
        let get = if version == V1 {
            "GetTask"
        } else {
            "tasks/get"
        };
        let mut polled = Value::Null;
        for _ in 0..100 {
            polled = checked(
                version,
                "GetTaskResponse",
                server.rpc(version, get, json!({"id": id})).await,
            );
            if state_of(&polled["result"]) == expect_state(version, "completed") {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(
            state_of(&polled["result"]),
            expect_state(version, "completed")
        );
        assert_eq!(artifact_text(&polled["result"]), "echo: slow 400 (turn 1)");
        let trimmed = server
            .rpc(version, get, json!({"id": id, "historyLength": 1}))
            .await;
        assert_eq!(
            trimmed["result"]["history"].as_array().map(Vec::len),
            Some(1)
        );
        let no_history = server
            .rpc(version, get, json!({"id": id, "historyLength": 0}))
            .await;
        assert!(no_history["result"].get("history").is_none());

        // Canceled while running; cancel again is -32002.
        let response = server
            .rpc(version, send_method(version), json!({"message": user_message(version, "slow 5000", None, None), "configuration": configuration}))
            .await;
        let id = task_of(&response)["id"].as_str().unwrap().to_owned();
        let cancel = if version == V1 {
            "CancelTask"
        } else {
            "tasks/cancel"
        };
        let canceled = checked(
            version,
            "CancelTaskResponse",
            server.rpc(version, cancel, json!({"id": id})).await,
        );
        assert_eq!(
            state_of(&canceled["result"]),
            expect_state(version, "canceled")
        );
        let again = checked(
            version,
            "CancelTaskResponse",
            server.rpc(version, cancel, json!({"id": id})).await,
        );
        assert_eq!(again["error"]["code"], json!(-32002));

        // Unknown task.
        let missing = checked(
            version,
            "GetTaskResponse",
            server
                .rpc(version, get, json!({"id": "no-such-task"}))
                .await,
        );
        assert_eq!(missing["error"]["code"], json!(-32001));
    }
    server.stop().await;
}

#[actix_rt::test]
async fn list_tasks_filters_pages_and_omits_artifacts() {
    let server = start_scripted(|_| {}).await;
    let first = server.send_text(V1, "one", Some("listing"), None).await;
    let context_id = task_of(&first)["contextId"].as_str().unwrap().to_owned();
    next_millisecond().await;
    server
        .send_text(V1, "ask: two?", Some(&context_id), None)
        .await;
    next_millisecond().await;
    server.send_text(V1, "three", Some(&context_id), None).await;
    server.send_text(V1, "elsewhere", Some("other"), None).await;

    let all = server
        .rpc(V1, "ListTasks", json!({"contextId": context_id}))
        .await;
    let result = &all["result"];
    assert_eq!(result["totalSize"], json!(3));
    assert_eq!(result["nextPageToken"], json!(""));
    let tasks = result["tasks"].as_array().unwrap();
    assert_eq!(tasks.len(), 3);
    assert!(
        tasks.iter().all(|t| t.get("artifacts").is_none()),
        "no artifacts unless asked"
    );
    let texts: Vec<String> = tasks
        .iter()
        .map(|t| message_text(&t["history"][0]))
        .collect();
    assert_eq!(texts, ["three", "ask: two?", "one"], "newest first");

    let waiting = server
        .rpc(
            V1,
            "ListTasks",
            json!({"contextId": context_id, "status": "TASK_STATE_INPUT_REQUIRED"}),
        )
        .await;
    assert_eq!(waiting["result"]["tasks"].as_array().unwrap().len(), 1);

    let mut token = String::new();
    let mut seen = Vec::new();
    loop {
        let page = server
            .rpc(V1, "ListTasks", json!({"contextId": context_id, "pageSize": 2, "pageToken": token, "includeArtifacts": true}))
            .await;
        let result = &page["result"];
        for task in result["tasks"].as_array().unwrap() {
            assert!(
                task.get("artifacts").is_some() || state_of(task) == "TASK_STATE_INPUT_REQUIRED"
            );
            seen.push(task["id"].as_str().unwrap().to_owned());
        }
        token = result["nextPageToken"].as_str().unwrap().to_owned();
        if token.is_empty() {
            break;
        }
    }
    assert_eq!(seen.len(), 3);
    assert_eq!(
        seen.iter().collect::<std::collections::HashSet<_>>().len(),
        3
    );

    let v03 = server
        .rpc(V03, "tasks/list", json!({"status": "completed"}))
        .await;
    let tasks = v03["result"]["tasks"].as_array().unwrap();
    assert_eq!(tasks.len(), 3, "one, three, elsewhere");
    assert!(tasks.iter().all(|t| t["kind"] == "task"));
    for task in tasks {
        assert_v03_valid("Task", task);
    }
    let bad = server
        .rpc(V1, "ListTasks", json!({"pageToken": "zz-not-ours"}))
        .await;
    assert_eq!(bad["error"]["code"], json!(-32602));
    server.stop().await;
}

#[actix_rt::test]
async fn a_busy_context_refuses_at_once_and_others_are_served() {
    let server = start_scripted(|_| {}).await;
    let configuration = json!({"returnImmediately": true});
    let slow = server
        .rpc(V1, "SendMessage", json!({"message": user_message(V1, "slow 2000", Some("busy"), None), "configuration": configuration}))
        .await;
    let running_task = task_of(&slow)["id"].as_str().unwrap().to_owned();
    let started = Instant::now();
    let attempts = (0..50).map(|i| {
        let server = &server;
        async move {
            server
                .send_text(V1, &format!("attempt {i}"), Some("busy"), None)
                .await
        }
    });
    let responses = futures_util::future::join_all(attempts).await;
    let elapsed = started.elapsed();
    for response in &responses {
        assert_eq!(response["error"]["code"], json!(-32010), "{response}");
        let info = &response["error"]["data"][0];
        assert_eq!(info["domain"], json!("a2a-protocol.org"), "{response}");
        assert_eq!(info["reason"], json!("CONTEXT_BUSY"), "{response}");
        let metadata = &info["metadata"];
        assert_eq!(metadata["contextId"], json!("busy"));
        assert_eq!(metadata["taskId"], json!(running_task));
    }
    assert!(
        elapsed < Duration::from_millis(1500),
        "rejected at once, not after the slow turn ({elapsed:?})"
    );
    let other = server
        .send_text(V1, "meanwhile", Some("not-busy"), None)
        .await;
    assert_eq!(state_of(task_of(&other)), "TASK_STATE_COMPLETED");
    let v03 = checked(
        V03,
        "SendMessageResponse",
        server
            .send_text(V03, "v0.3 attempt", Some("busy"), None)
            .await,
    );
    assert_eq!(v03["error"]["code"], json!(-32010));
    assert_eq!(v03["error"]["data"]["taskId"], json!(running_task));

    tokio::time::sleep(Duration::from_millis(2200)).await;
    let stored = server.stored_messages(V1, "busy").await;
    assert_eq!(
        stored.len(),
        2,
        "only the slow turn and its reply are stored"
    );
    assert_eq!(message_text(&stored[0]), "slow 2000");
    let deleted = server
        .rpc(
            V1,
            "colloquy/deleteConversation",
            json!({"contextId": "busy"}),
        )
        .await;
    assert_eq!(deleted["result"]["deleted"], json!(true));
    assert!(server.stored_messages(V1, "busy").await.is_empty());
    server.stop().await;
}

#[actix_rt::test]
async fn deleting_a_busy_conversation_is_refused() {
    let server = start_scripted(|_| {}).await;
    server
        .rpc(V1, "SendMessage", json!({"message": user_message(V1, "slow 1000", Some("held"), None), "configuration": {"returnImmediately": true}}))
        .await;
    let refused = server
        .rpc(
            V1,
            "colloquy/deleteConversation",
            json!({"contextId": "held"}),
        )
        .await;
    assert_eq!(refused["error"]["code"], json!(-32010));
    let missing = server
        .rpc(
            V1,
            "colloquy/getConversation",
            json!({"contextId": "never-used"}),
        )
        .await;
    assert_eq!(missing["error"]["code"], json!(-32015));
    server.stop().await;
}

#[actix_rt::test]
async fn unsupported_methods_answer_their_codes_and_the_card_serves_both_versions() {
    let server = start_echo().await;
    let push = server
        .rpc(V1, "CreateTaskPushNotificationConfig", json!({}))
        .await;
    // Push notifications are served (tests/it/push.rs): a config without its fields is invalid.
    assert_eq!(push["error"]["code"], json!(-32602));
    let push = checked(
        V03,
        "JSONRPCErrorResponse",
        server
            .rpc(V03, "tasks/pushNotificationConfig/set", json!({}))
            .await,
    );
    assert_eq!(push["error"]["code"], json!(-32602));
    let card = server.rpc(V1, "GetExtendedAgentCard", json!({})).await;
    assert_eq!(card["error"]["code"], json!(-32007));

    for path in [".well-known/agent-card.json", ".well-known/agent.json"] {
        let card: Value = server
            .client
            .get(format!("{}{path}", server.url))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_v03_valid("AgentCard", &card);
        assert_eq!(card["supportedInterfaces"][0]["protocolVersion"], "1.0");
        assert_eq!(card["supportedInterfaces"][0]["protocolBinding"], "JSONRPC");
        assert_eq!(card["url"], json!(server.url));
        assert_eq!(card["capabilities"]["pushNotifications"], json!(true));
    }
    // Forwarding headers are believed only from `trusted_proxies` (tests/it/card.rs).
    let forwarded = server
        .card(&[
            ("X-Forwarded-Host", "agents.example"),
            ("X-Forwarded-Proto", "https"),
        ])
        .await;
    assert_eq!(forwarded["url"], json!(server.url));
    server.stop().await;
}

#[actix_rt::test]
async fn card_versions_choose_the_fields() {
    let server = start_with(
        std::sync::Arc::new(colloquy::agent::EchoAgent::default()),
        |c| {
            c.card.versions = "1.0".into();
            c.public_url = Some("https://public.example/a2a/".into());
        },
    )
    .await;
    let card = server.card(&[]).await;
    assert!(card.get("protocolVersion").is_none() && card.get("url").is_none());
    assert_eq!(
        card["supportedInterfaces"][0]["url"],
        "https://public.example/a2a/"
    );
    // HTTP+JSON clients append `/message:send`: no trailing slash.
    assert_eq!(
        card["supportedInterfaces"][1]["url"],
        "https://public.example/a2a"
    );
    server.stop().await;
}

/// Every page of a listing, following `nextPageToken` until it is empty.
async fn all_pages(server: &TestServer, method: &str, params: Value) -> Vec<Value> {
    let mut pages = Vec::new();
    let mut token = String::new();
    loop {
        let mut params = params.clone();
        params["pageToken"] = json!(token);
        let response = server.rpc(V1, method, params).await;
        let result = response["result"].clone();
        assert!(result.is_object(), "{method}: {response}");
        token = result["nextPageToken"].as_str().unwrap().to_owned();
        pages.push(result);
        if token.is_empty() {
            return pages;
        }
    }
}

#[actix_rt::test]
async fn list_tasks_pages_stop_at_the_response_budget() {
    let server = start_scripted(|config| config.limits.response_bytes = 5000).await;
    let mut sent = Vec::new();
    for i in 0..12 {
        let text = format!("turn {i} {}", "x".repeat(400));
        let response = server.send_text(V1, &text, Some("budget"), None).await;
        sent.push(task_of(&response)["id"].as_str().unwrap().to_owned());
        next_millisecond().await;
    }
    let params = json!({"pageSize": 100, "historyLength": 100, "includeArtifacts": true});
    let pages = all_pages(&server, "ListTasks", params.clone()).await;
    assert!(
        pages.len() > 1,
        "a page stops at the budget: {}",
        pages.len()
    );
    let mut seen = Vec::new();
    for page in &pages {
        let tasks = page["tasks"].as_array().unwrap();
        assert!(
            !tasks.is_empty() && tasks.len() < 12,
            "{} tasks",
            tasks.len()
        );
        assert_eq!(page["totalSize"], json!(12));
        for task in tasks {
            assert!(task.get("artifacts").is_some() && task.get("history").is_some());
            seen.push(task["id"].as_str().unwrap().to_owned());
        }
    }
    sent.reverse();
    assert_eq!(seen, sent, "every task exactly once, newest first");
    // Only what a page shows counts: without artifacts and history all twelve fit.
    let bare = server
        .rpc(
            V1,
            "ListTasks",
            json!({"pageSize": 100, "historyLength": 0}),
        )
        .await;
    assert_eq!(bare["result"]["tasks"].as_array().unwrap().len(), 12);
    assert_eq!(bare["result"]["nextPageToken"], json!(""));

    // A task larger than the whole budget still comes back, alone.
    let big = server
        .send_text(V1, &"y".repeat(20_000), Some("budget"), None)
        .await;
    let big_id = task_of(&big)["id"].as_str().unwrap().to_owned();
    let pages = all_pages(&server, "ListTasks", params).await;
    assert_eq!(pages[0]["tasks"].as_array().unwrap().len(), 1);
    assert_eq!(pages[0]["tasks"][0]["id"], json!(big_id));
    assert_ne!(pages[0]["nextPageToken"], json!(""));
    let listed: usize = pages
        .iter()
        .map(|p| p["tasks"].as_array().unwrap().len())
        .sum();
    assert_eq!(listed, 13);
    server.stop().await;
}

#[actix_rt::test]
async fn get_conversation_pages_through_every_message_once_in_order() {
    let server = start_scripted(|config| config.limits.response_bytes = 3000).await;
    let mut expected = Vec::new();
    for i in 0..15 {
        let text = format!("turn {i} {}", "z".repeat(300));
        let response = server.send_text(V1, &text, Some("paged"), None).await;
        let reply = task_of(&response)["artifacts"][0].clone();
        expected.push(text);
        expected.push(message_text(&reply));
    }
    let pages = all_pages(
        &server,
        "colloquy/getConversation",
        json!({"contextId": "paged", "historyLength": 1000}),
    )
    .await;
    assert!(pages.len() > 2, "pages: {}", pages.len());
    let mut texts = Vec::new();
    for page in &pages {
        let messages = page["messages"].as_array().unwrap();
        assert!(!messages.is_empty() && messages.len() < 30);
        assert_eq!(page["turns"], json!(15));
        texts.extend(messages.iter().map(message_text));
    }
    assert_eq!(texts, expected, "every message once, oldest first");

    // historyLength picks where the first page starts; later pages run to the newest.
    let pages = all_pages(
        &server,
        "colloquy/getConversation",
        json!({"contextId": "paged", "historyLength": 10}),
    )
    .await;
    let recent: Vec<String> = pages
        .iter()
        .flat_map(|p| p["messages"].as_array().unwrap().iter().map(message_text))
        .collect();
    assert_eq!(recent, expected[20..]);

    // The shared test helper pages through as well.
    assert_eq!(server.stored_messages(V1, "paged").await.len(), 30);
    let bad = server
        .rpc(
            V1,
            "colloquy/getConversation",
            json!({"contextId": "paged", "pageToken": "not-ours"}),
        )
        .await;
    assert_eq!(bad["error"]["code"], json!(-32602), "{bad}");
    server.stop().await;
}

/// The one `google.rpc.ErrorInfo` a v1.0 error carries: the spec's domain, and its reason.
fn error_info(response: &Value) -> &Value {
    let data = response["error"]["data"]
        .as_array()
        .expect("v1.0 data is an array");
    let infos: Vec<&Value> = data
        .iter()
        .filter(|d| d["@type"] == "type.googleapis.com/google.rpc.ErrorInfo")
        .collect();
    assert_eq!(infos.len(), 1, "{response}");
    assert_eq!(infos[0]["domain"], json!("a2a-protocol.org"), "{response}");
    assert!(infos[0]["metadata"].is_object(), "{response}");
    infos[0]
}

#[actix_rt::test]
async fn v1_errors_carry_error_info_with_the_spec_domain_and_reason() {
    let server = start_echo().await;
    let done = server.send_text(V1, "finish me", Some("errs"), None).await;
    let task_id = task_of(&done)["id"].as_str().unwrap().to_owned();
    let to_finished = json!({"message": user_message(V1, "more", None, Some(&task_id))});
    let calls = [
        (
            "GetTask",
            json!({"id": "no-such-task"}),
            -32001,
            "TASK_NOT_FOUND",
        ),
        (
            "CancelTask",
            json!({"id": task_id}),
            -32002,
            "TASK_NOT_CANCELABLE",
        ),
        (
            "GetTaskPushNotificationConfig",
            json!({"taskId": "no-such-task", "id": "no-such-config"}),
            -32001,
            "TASK_NOT_FOUND",
        ),
        ("SendMessage", to_finished, -32004, "UNSUPPORTED_OPERATION"),
        (
            "GetExtendedAgentCard",
            json!({}),
            -32007,
            "EXTENDED_AGENT_CARD_NOT_CONFIGURED",
        ),
        ("message/send", json!({}), -32601, "METHOD_NOT_FOUND"),
        ("GetTask", json!({}), -32602, "INVALID_PARAMS"),
        (
            "colloquy/getConversation",
            json!({"contextId": "never-seen"}),
            -32015,
            "CONVERSATION_NOT_FOUND",
        ),
    ];
    for (method, params, code, reason) in calls {
        let response = server.rpc(V1, method, params).await;
        assert_eq!(
            response["error"]["code"],
            json!(code),
            "{method}: {response}"
        );
        assert_eq!(error_info(&response)["reason"], json!(reason), "{method}");
    }
    let raw = [
        ("application/json", "{not json", 200, -32700, "PARSE_ERROR"),
        (
            "application/json",
            "{\"jsonrpc\": \"1.0\", \"method\": \"GetTask\"}",
            200,
            -32600,
            "INVALID_REQUEST",
        ),
        (
            "text/plain",
            "{}",
            415,
            -32005,
            "CONTENT_TYPE_NOT_SUPPORTED",
        ),
    ];
    for (content_type, body, http, code, reason) in raw {
        let (status, response) = server
            .post_raw(Some(V1), content_type, body.as_bytes().to_vec())
            .await;
        assert_eq!(status, http, "{response}");
        assert_eq!(response["error"]["code"], json!(code), "{response}");
        assert_eq!(error_info(&response)["reason"], json!(reason), "{response}");
    }
    server.stop().await;
}

/// A2A v1.0.1's `application/a2a+json`: a request that uses it, as its Content-Type or named in
/// its Accept, is answered in kind, on JSON-RPC, HTTP+JSON and the card, errors included; a
/// request that does not gets `application/json` as before.
#[actix_rt::test]
async fn a2a_json_requests_are_answered_in_kind() {
    const A2A_JSON: &str = "application/a2a+json";
    const JSON: &str = "application/json";
    let server = start_echo().await;
    let base = server.url.trim_end_matches('/').to_owned();
    let message = json!({"messageId": "m", "role": "ROLE_USER", "parts": [{"text": "hi"}]});
    let rpc =
        json!({"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": {"message": message}});
    let answered = |response: &reqwest::Response| {
        let value = response
            .headers()
            .get("content-type")
            .expect("a content type");
        value
            .to_str()
            .expect("text")
            .split(';')
            .next()
            .unwrap_or("")
            .to_owned()
    };
    let post = |url: String, content_type: &str, body: String| {
        server
            .client
            .post(url)
            .header("Content-Type", content_type)
            .header("A2A-Version", V1)
            .body(body)
            .send()
    };
    for (request_type, expected) in [
        (JSON, JSON),
        (A2A_JSON, A2A_JSON),
        ("application/a2a+json; charset=utf-8", A2A_JSON),
    ] {
        let response = post(server.url.clone(), request_type, rpc.to_string())
            .await
            .unwrap();
        assert_eq!(answered(&response), expected, "JSON-RPC, {request_type}");
        let body: Value = response.json().await.unwrap();
        assert!(body["result"]["task"]["id"].is_string(), "{body}");

        let rest = json!({"message": message}).to_string();
        let response = post(format!("{base}/message:send"), request_type, rest)
            .await
            .unwrap();
        assert_eq!(response.status(), 200, "HTTP+JSON, {request_type}");
        assert_eq!(answered(&response), expected, "HTTP+JSON, {request_type}");

        let response = post(server.url.clone(), request_type, "{not json".into())
            .await
            .unwrap();
        assert_eq!(
            answered(&response),
            expected,
            "a parse error, {request_type}"
        );
        let body: Value = response.json().await.unwrap();
        assert_eq!(body["error"]["code"], json!(-32700), "{body}");
    }
    for (accept, expected) in [
        (A2A_JSON, A2A_JSON),
        ("application/json;q=0.5, application/a2a+json", A2A_JSON),
        (JSON, JSON),
        ("*/*", JSON),
    ] {
        for path in ["/.well-known/agent-card.json", "/tasks"] {
            let response = server
                .client
                .get(format!("{base}{path}"))
                .header("Accept", accept)
                .header("A2A-Version", V1)
                .send()
                .await
                .unwrap();
            assert_eq!(response.status(), 200, "{path}");
            assert_eq!(answered(&response), expected, "{path}, Accept: {accept}");
        }
    }
    // Not JSON at all: 415, naming both types.
    let response = post(server.url.clone(), "text/plain", rpc.to_string())
        .await
        .unwrap();
    assert_eq!(response.status(), 415);
    let body: Value = response.json().await.unwrap();
    let said = body["error"]["message"].as_str().unwrap_or("");
    assert!(said.contains(JSON) && said.contains(A2A_JSON), "{body}");
    server.stop().await;
}
