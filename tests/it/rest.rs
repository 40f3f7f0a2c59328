//! The HTTP+JSON binding (v1.0) beside JSON-RPC on the same port: resource URLs, bare results,
//! SSE without the JSON-RPC envelope, `google.rpc.Status` errors with the HTTP status the
//! specification pairs with each error, the same auth, and the card declaring the interface.

use crate::common;

use common::*;
use serde_json::{Value, json};
use std::time::Duration;

struct Rest<'a> {
    server: &'a TestServer,
}

impl Rest<'_> {
    fn url(&self, path: &str) -> String {
        format!("{}{}", self.server.url.trim_end_matches('/'), path)
    }

    async fn answer(response: reqwest::Response) -> (u16, Value) {
        let status = response.status().as_u16();
        (status, response.json().await.unwrap_or(Value::Null))
    }

    async fn post(&self, path: &str, body: Value) -> (u16, Value) {
        let request = self.server.client.post(self.url(path)).json(&body);
        Self::answer(request.send().await.expect("sent")).await
    }

    async fn get(&self, path: &str) -> (u16, Value) {
        let request = self.server.client.get(self.url(path));
        Self::answer(request.send().await.expect("sent")).await
    }

    async fn send(&self, text: &str, context_id: Option<&str>) -> Value {
        let (status, body) = self
            .post(
                "/message:send",
                json!({"message": user_message(V1, text, context_id, None)}),
            )
            .await;
        assert_eq!(status, 200, "{body}");
        body
    }
}

/// The error body: a `google.rpc.Status` whose one ErrorInfo has the spec's domain; its reason.
fn reason(status: u16, body: &Value) -> String {
    let error = &body["error"];
    assert_eq!(error["code"], json!(status), "{body}");
    assert!(error["status"].is_string(), "{body}");
    assert!(error["message"].is_string(), "{body}");
    let info = &error["details"][0];
    assert_eq!(
        info["@type"],
        json!("type.googleapis.com/google.rpc.ErrorInfo"),
        "{body}"
    );
    assert_eq!(info["domain"], json!("a2a-protocol.org"), "{body}");
    info["reason"].as_str().unwrap_or_default().to_owned()
}

#[actix_rt::test]
async fn a_multi_turn_conversation_get_list_and_cancel_over_http_json() {
    let server = start_echo().await;
    let rest = Rest { server: &server };
    let first = rest.send("hello", None).await;
    assert!(
        first.get("jsonrpc").is_none(),
        "no JSON-RPC envelope: {first}"
    );
    let task = &first["task"];
    let context_id = task["contextId"].as_str().unwrap().to_owned();
    assert_eq!(task["status"]["state"], json!("TASK_STATE_COMPLETED"));
    next_millisecond().await;
    let second = rest.send("again", Some(&context_id)).await;
    let task2 = &second["task"];
    assert_eq!(task2["contextId"], json!(context_id));
    assert_eq!(
        artifact_text(task2),
        "echo: again (turn 2; previously: \"hello\")"
    );
    let task_id = task2["id"].as_str().unwrap().to_owned();

    let (status, got) = rest.get(&format!("/tasks/{task_id}?historyLength=1")).await;
    assert_eq!(status, 200, "{got}");
    assert_eq!(got["id"], json!(task_id));
    assert_eq!(got["history"].as_array().map(Vec::len), Some(1), "{got}");
    let (_, proto_named) = rest
        .get(&format!("/tasks/{task_id}?history_length=1"))
        .await;
    assert_eq!(proto_named["history"].as_array().map(Vec::len), Some(1));

    rest.send("elsewhere", Some("rest-other")).await;
    let (status, listed) = rest
        .get(&format!(
            "/tasks?contextId={context_id}&pageSize=1&includeArtifacts=true"
        ))
        .await;
    assert_eq!(status, 200, "{listed}");
    assert_eq!(listed["totalSize"], json!(2), "{listed}");
    assert_eq!(listed["tasks"].as_array().map(Vec::len), Some(1));
    assert_eq!(listed["tasks"][0]["id"], json!(task_id), "newest first");
    assert!(listed["tasks"][0]["artifacts"].is_array(), "{listed}");
    let token = listed["nextPageToken"].as_str().unwrap().to_owned();
    let (_, page2) = rest
        .get(&format!(
            "/tasks?contextId={context_id}&pageSize=1&pageToken={token}"
        ))
        .await;
    assert_eq!(page2["tasks"][0]["id"], task["id"]);
    assert!(page2["tasks"][0].get("artifacts").is_none(), "{page2}");
    assert_eq!(page2["nextPageToken"], json!(""));

    let (status, body) = rest
        .post(&format!("/tasks/{task_id}:cancel"), json!({}))
        .await;
    assert_eq!(reason(status, &body), "TASK_NOT_CANCELABLE");
    assert_eq!(status, 409);
    let (status, body) = rest.get("/tasks/no-such-task").await;
    assert_eq!(reason(status, &body), "TASK_NOT_FOUND");
    assert_eq!(status, 404);
    server.stop().await;
}

#[actix_rt::test]
async fn streaming_and_subscribing_carry_bare_stream_responses() {
    let server = start_scripted(|_| {}).await;
    let rest = Rest { server: &server };
    let response = server
        .client
        .post(rest.url("/message:stream"))
        .json(&json!({"message": user_message(V1, "drip 5 2: abcdef", Some("rest-stream"), None)}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 200);
    assert!(
        response.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/event-stream")
    );
    let events = sse_events(response).await;
    assert!(
        events
            .iter()
            .all(|e| e.get("jsonrpc").is_none() && e.get("result").is_none())
    );
    let task_id = events[0]["task"]["id"]
        .as_str()
        .expect("the task first")
        .to_owned();
    let chunks: String = events
        .iter()
        .filter_map(|e| e["artifactUpdate"]["artifact"]["parts"][0]["text"].as_str())
        .collect();
    assert_eq!(chunks, "abcdef");
    let last = events.last().unwrap();
    assert_eq!(
        last["statusUpdate"]["status"]["state"],
        json!("TASK_STATE_COMPLETED")
    );

    // A running task: subscribe (GET or POST) follows it to the end.
    let (_, started) = rest
        .post(
            "/message:send",
            json!({"message": user_message(V1, "drip 100 1: xyz", Some("rest-sub"), None),
                   "configuration": {"returnImmediately": true}}),
        )
        .await;
    let running = started["task"]["id"].as_str().unwrap().to_owned();
    let subscribed = server
        .client
        .post(rest.url(&format!("/tasks/{running}:subscribe")))
        .send()
        .await
        .unwrap();
    assert_eq!(subscribed.status().as_u16(), 200);
    let events = tokio::time::timeout(Duration::from_secs(10), sse_events(subscribed))
        .await
        .expect("the stream ends with the task");
    assert_eq!(events[0]["task"]["id"], json!(running));
    assert_eq!(
        events.last().unwrap()["statusUpdate"]["status"]["state"],
        json!("TASK_STATE_COMPLETED")
    );
    // A finished task: an error, as JSON with its status, not a stream.
    let (status, body) = rest.get(&format!("/tasks/{task_id}:subscribe")).await;
    assert_eq!(reason(status, &body), "UNSUPPORTED_OPERATION");
    assert_eq!(status, 400);
    server.stop().await;
}

#[actix_rt::test]
async fn a_busy_context_and_the_other_errors_get_their_statuses() {
    let server = start_scripted(|_| {}).await;
    let rest = Rest { server: &server };
    let (_, slow) = rest
        .post(
            "/message:send",
            json!({"message": user_message(V1, "slow 1500", Some("rest-busy"), None),
                   "configuration": {"return_immediately": true}}),
        )
        .await;
    let running = slow["task"]["id"].as_str().unwrap().to_owned();
    let (status, body) = rest
        .post(
            "/message:send",
            json!({"message": user_message(V1, "me too", Some("rest-busy"), None)}),
        )
        .await;
    assert_eq!(reason(status, &body), "CONTEXT_BUSY");
    assert_eq!(status, 409);
    let metadata = &body["error"]["details"][0]["metadata"];
    assert_eq!(metadata["contextId"], json!("rest-busy"));
    assert_eq!(metadata["taskId"], json!(running));

    let (status, body) = rest.get("/extendedAgentCard").await;
    assert_eq!(reason(status, &body), "EXTENDED_AGENT_CARD_NOT_CONFIGURED");
    // Push configs are served on this binding too: a webhook at a private address is refused.
    let (status, body) = rest
        .post(
            &format!("/tasks/{running}/pushNotificationConfigs"),
            json!({"url": "http://127.0.0.1:1/"}),
        )
        .await;
    assert_eq!(reason(status, &body), "INVALID_PARAMS");
    assert_eq!(status, 400);
    let (status, body) = rest
        .get("/tasks/no-such-task/pushNotificationConfigs")
        .await;
    assert_eq!(reason(status, &body), "TASK_NOT_FOUND");
    assert_eq!(status, 404);
    let (status, body) = rest
        .post("/message:send", json!({"message": {"role": "ROLE_USER"}}))
        .await;
    assert_eq!(reason(status, &body), "INVALID_PARAMS");
    assert_eq!(status, 400);
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("message.messageId"),
        "{body}"
    );

    let raw = |content_type: &'static str, version: Option<&'static str>, body: &'static str| {
        let mut request = server
            .client
            .post(rest.url("/message:send"))
            .header("Content-Type", content_type)
            .body(body);
        if let Some(version) = version {
            request = request.header("A2A-Version", version);
        }
        async move { Rest::answer(request.send().await.unwrap()).await }
    };
    let (status, body) = raw("text/plain", None, "{}").await;
    assert_eq!(reason(status, &body), "CONTENT_TYPE_NOT_SUPPORTED");
    assert_eq!(status, 415);
    let (status, body) = raw("application/json", None, "{nope").await;
    assert_eq!(reason(status, &body), "PARSE_ERROR");
    assert_eq!(status, 400);
    let (status, body) = raw("application/json", Some("0.3"), "{}").await;
    assert_eq!(reason(status, &body), "VERSION_NOT_SUPPORTED");
    assert_eq!(status, 400);
    let (status, body) = rest.post("/tasks/x:frobnicate", json!({})).await;
    assert_eq!(reason(status, &body), "METHOD_NOT_FOUND");
    assert_eq!(status, 404);
    server.stop().await;
}

#[actix_rt::test]
async fn the_same_auth_guards_both_bindings_and_the_card_lists_both() {
    let server = start_with_tokens().await;
    let rest = Rest { server: &server };
    let response = server.client.get(rest.url("/tasks")).send().await.unwrap();
    assert_eq!(response.headers()["www-authenticate"], "Bearer");
    let (status, body) = Rest::answer(response).await;
    assert_eq!(reason(status, &body), "UNAUTHENTICATED");
    assert_eq!(status, 401);
    let send = |token: &'static str, path: String, body: Option<Value>| {
        let request = match body {
            Some(body) => server.client.post(rest.url(&path)).json(&body),
            None => server.client.get(rest.url(&path)),
        };
        async move { Rest::answer(request.bearer_auth(token).send().await.unwrap()).await }
    };
    let message = json!({"message": user_message(V1, "mine", Some("rest-auth"), None)});
    let (status, sent) = send("alice-secret", "/message:send".into(), Some(message)).await;
    assert_eq!(status, 200, "{sent}");
    let task_id = sent["task"]["id"].as_str().unwrap().to_owned();
    let (status, _) = send("alice-secret", format!("/tasks/{task_id}"), None).await;
    assert_eq!(status, 200);
    let (status, body) = send("bob-secret", format!("/tasks/{task_id}"), None).await;
    assert_eq!(
        reason(status, &body),
        "TASK_NOT_FOUND",
        "another principal's task"
    );

    let card = server.card(&[]).await;
    let interfaces = card["supportedInterfaces"].as_array().unwrap();
    let rest_interface = interfaces
        .iter()
        .find(|i| i["protocolBinding"] == "HTTP+JSON")
        .expect("the card lists HTTP+JSON");
    assert_eq!(rest_interface["protocolVersion"], json!("1.0"));
    let jsonrpc_url = interfaces[0]["url"].as_str().expect("a URL");
    assert_eq!(
        rest_interface["url"],
        json!(jsonrpc_url.trim_end_matches('/'))
    );
    server.stop().await;
}

/// The URL of the card's HTTP+JSON interface in `interfaces`, whose binding is under `key`.
fn http_json_url(interfaces: &Value, key: &str) -> String {
    interfaces
        .as_array()
        .into_iter()
        .flatten()
        .find(|i| i[key] == "HTTP+JSON")
        .and_then(|i| i["url"].as_str())
        .unwrap_or_else(|| panic!("no HTTP+JSON interface in {interfaces}"))
        .to_owned()
}

/// The card's HTTP+JSON URLs end without `/`, so a client that appends a route by plain
/// concatenation (v1.0 `{url}/message:send`, v0.3 `{url}/v1/message:send`) reaches it; and a
/// path with repeated slashes reaches the route it names, on both versions.
#[actix_rt::test]
async fn a_route_appended_to_the_card_url_or_with_repeated_slashes_is_served() {
    let server = start_echo().await;
    let card = server.card(&[]).await;
    let v1_url = http_json_url(&card["supportedInterfaces"], "protocolBinding");
    let v03_url = http_json_url(&card["additionalInterfaces"], "transport");
    for url in [&v1_url, &v03_url] {
        assert!(!url.ends_with('/'), "{url}");
    }
    let v1_body = json!({"message": user_message(V1, "appended", None, None)});
    let v03_body = json!({"message": {
        "messageId": "m-03", "role": "ROLE_USER", "content": [{"text": "appended"}],
    }});
    let post = |url: String, body: &Value| {
        let request = server.client.post(&url).json(body);
        async move { (url, Rest::answer(request.send().await.expect("sent")).await) }
    };
    // `server.url` ends in `/`: each of these paths begins with `//`.
    let doubled = server.url.clone();
    for (url, (status, body)) in [
        post(format!("{v1_url}/message:send"), &v1_body).await,
        post(format!("{v03_url}/v1/message:send"), &v03_body).await,
        post(format!("{doubled}/message:send"), &v1_body).await,
        post(format!("{doubled}/v1/message:send"), &v03_body).await,
    ] {
        assert_eq!(status, 200, "{url}: {body}");
        assert!(body["task"]["id"].is_string(), "{url}: {body}");
    }
    let (_, (_, sent)) = post(format!("{v1_url}/message:send"), &v1_body).await;
    let id = sent["task"]["id"].as_str().expect("a task id");
    for url in [
        format!("{doubled}/tasks/{id}"),
        format!("{doubled}/v1//tasks/{id}"),
    ] {
        let got = server.client.get(&url).send().await.expect("sent");
        let (status, task) = Rest::answer(got).await;
        assert_eq!(status, 200, "{url}: {task}");
        assert_eq!(task["id"], json!(id), "{url}");
    }
    server.stop().await;
}

#[actix_rt::test]
async fn a_slow_subscriber_gets_an_error_event_with_the_error_body() {
    use futures_util::StreamExt;
    let server = start_scripted(|c| c.streaming.subscriber_buffer = 16).await;
    let rest = Rest { server: &server };
    let (count, size) = (1500, 16 * 1024);
    let message = user_message(V1, &format!("flood {count} {size}"), None, None);
    let fast = server
        .client
        .post(rest.url("/message:stream"))
        .json(&json!({"message": message}))
        .send()
        .await
        .unwrap();
    let mut fast = LiveStream::new(fast);
    let task_id = fast.next_event().await.unwrap()["task"]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let slow = server
        .client
        .get(rest.url(&format!("/tasks/{task_id}:subscribe")))
        .send()
        .await
        .unwrap();
    let fast_events = tokio::spawn(fast.rest());
    // The slow subscriber reads nothing until the agent is done.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let events: Vec<_> = eventsource_stream::Eventsource::eventsource(slow.bytes_stream())
        .filter_map(|e| async move { e.ok() })
        .collect()
        .await;
    fast_events.await.unwrap();
    let last = events.last().expect("events");
    assert_eq!(last.event, "error", "the last event is named error");
    let body: Value = serde_json::from_str(&last.data).unwrap();
    assert_eq!(reason(429, &body), "SUBSCRIBER_TOO_SLOW");
    assert!(
        events[..events.len() - 1]
            .iter()
            .all(|e| e.event == "message"),
        "the others are plain data events"
    );
    server.stop().await;
}

/// v0.3's HTTP+JSON under `/v1`: v0.3's ProtoJSON in (`content`, `blocking`) and out
/// (`content`, `TASK_STATE_CANCELLED`), and only version 0.3 there.
#[actix_rt::test]
async fn v03_routes_speak_v03_protojson() {
    let server = start_scripted(|_| {}).await;
    let rest = Rest { server: &server };
    let message = json!({
        "messageId": "m-1", "role": "ROLE_USER", "contextId": "rest03",
        "content": [{"text": "slow 60000"}],
    });
    // Not blocking: the task comes back working, then is canceled.
    let (status, body) = rest
        .post(
            "/v1/message:send",
            json!({"message": message, "configuration": {"blocking": false}}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let task = &body["task"];
    assert_eq!(task["contextId"], "rest03");
    assert_ne!(task["status"]["state"], "TASK_STATE_COMPLETED", "{body}");
    let id = task["id"].as_str().unwrap().to_owned();
    let user = &task["history"][0];
    assert_eq!(user["content"][0]["text"], "slow 60000", "{body}");
    assert!(user.get("parts").is_none(), "{body}");

    let (status, canceled) = rest
        .post(&format!("/v1/tasks/{id}:cancel"), json!({}))
        .await;
    assert_eq!(status, 200, "{canceled}");
    assert_eq!(canceled["status"]["state"], "TASK_STATE_CANCELLED");
    let (status, fetched) = rest.get(&format!("/v1/tasks/{id}")).await;
    assert_eq!(status, 200, "{fetched}");
    assert_eq!(fetched["status"]["state"], "TASK_STATE_CANCELLED");

    let refused = server
        .client
        .get(rest.url(&format!("/v1/tasks/{id}")))
        .header("A2A-Version", "1.0")
        .send()
        .await
        .unwrap();
    let status = refused.status().as_u16();
    let body: Value = refused.json().await.unwrap();
    assert_eq!(reason(status, &body), "VERSION_NOT_SUPPORTED");
    server.stop().await;
}

/// v0.3's push-config routes take and answer v0.3's protobuf JSON (`{name, pushNotificationConfig}`),
/// and the config they store is the one v0.3's JSON-RPC methods read.
#[actix_rt::test]
async fn v03_push_config_routes_speak_v03_protojson() {
    let server = start_with(
        std::sync::Arc::new(colloquy::agent::EchoAgent::default()),
        |c| {
            c.push.allow_private_networks = true;
        },
    )
    .await;
    let rest = Rest { server: &server };
    let sent = server.send_text(V03, "hello", None, None).await;
    let task = task_of(&sent)["id"].as_str().expect("a task id").to_owned();
    let name = format!("tasks/{task}/pushNotificationConfigs/cfg-1");
    let (status, created) = rest
        .post(
            &format!("/v1/tasks/{task}/pushNotificationConfigs"),
            json!({
                "parent": format!("tasks/{task}"),
                "configId": "cfg-1",
                "config": {"name": name, "pushNotificationConfig": {
                    "url": "http://127.0.0.1:9/hook", "token": "receiver-token",
                    "authentication": {"schemes": ["Bearer"], "credentials": "very-secret"},
                }},
            }),
        )
        .await;
    assert_eq!(status, 200, "{created}");
    assert_eq!(created["name"], json!(name), "{created}");
    let config = &created["pushNotificationConfig"];
    assert_eq!(config["id"], "cfg-1", "{created}");
    assert_eq!(config["url"], "http://127.0.0.1:9/hook");
    assert_eq!(config["authentication"]["schemes"], json!(["Bearer"]));
    assert!(created.get("taskId").is_none(), "{created}");
    assert!(!created.to_string().contains("very-secret"), "{created}");

    let (status, got) = rest.get(&format!("/v1/{name}")).await;
    assert_eq!(status, 200, "{got}");
    assert_eq!(got, created);
    let rpc = server
        .rpc(
            V03,
            "tasks/pushNotificationConfig/get",
            json!({"id": task, "pushNotificationConfigId": "cfg-1"}),
        )
        .await;
    assert_eq!(rpc["result"]["pushNotificationConfig"], *config, "{rpc}");
    let (status, listed) = rest
        .get(&format!("/v1/tasks/{task}/pushNotificationConfigs"))
        .await;
    assert_eq!(status, 200, "{listed}");
    assert_eq!(listed, json!({"configs": [created]}));

    let deleted = server
        .client
        .delete(rest.url(&format!("/v1/{name}")))
        .send()
        .await
        .expect("sent");
    let (status, deleted) = Rest::answer(deleted).await;
    assert_eq!((status, deleted), (200, json!({})));
    let (status, listed) = rest
        .get(&format!("/v1/tasks/{task}/pushNotificationConfigs"))
        .await;
    assert_eq!((status, listed), (200, json!({"configs": []})));
}

/// v0.3's HTTP+JSON is ProtoJSON, so fields may come under their proto names (`config_id`,
/// `push_notification_config`, `message_id`, `history_length`), as the official TCK's v0.3 REST
/// client sends them, and a proto default (`token: ""`, `authentication: {}`) means the field is
/// absent.
#[actix_rt::test]
async fn v03_routes_take_proto_field_names_and_defaults() {
    let server = start_echo().await;
    let rest = Rest { server: &server };
    let (status, sent) = rest
        .post(
            "/v1/message:send",
            json!({"message": {"message_id": "m-proto", "role": "ROLE_USER",
                "context_id": "rest03-proto", "content": [{"text": "hello"}]},
                "configuration": {"history_length": 0}}),
        )
        .await;
    assert_eq!(status, 200, "{sent}");
    assert_eq!(sent["task"]["contextId"], "rest03-proto", "{sent}");
    assert!(sent["task"].get("history").is_none(), "{sent}");
    let task = sent["task"]["id"].as_str().expect("a task id").to_owned();

    let (status, created) = rest
        .post(
            &format!("/v1/tasks/{task}/pushNotificationConfigs"),
            json!({
                "parent": format!("tasks/{task}"),
                "config_id": "default",
                "config": {
                    "name": format!("tasks/{task}/pushNotificationConfigs/default"),
                    "push_notification_config": {
                        "id": "default", "url": "https://example.com/webhook",
                        "token": "", "authentication": {},
                    },
                },
            }),
        )
        .await;
    assert_eq!(status, 200, "{created}");
    let config = &created["pushNotificationConfig"];
    assert_eq!(config["id"], "default", "{created}");
    assert_eq!(config["url"], "https://example.com/webhook", "{created}");
    assert!(config.get("token").is_none(), "{created}");
    assert!(config.get("authentication").is_none(), "{created}");
    let (status, got) = rest
        .get(&format!("/v1/tasks/{task}/pushNotificationConfigs/default"))
        .await;
    assert_eq!((status, &got), (200, &created));

    // One field under both names is refused, naming it.
    let (status, refused) = rest
        .post(
            &format!("/v1/tasks/{task}/pushNotificationConfigs"),
            json!({"configId": "a", "config_id": "b",
                "config": {"pushNotificationConfig": {"url": "https://example.com/webhook"}}}),
        )
        .await;
    assert_eq!(reason(status, &refused), "INVALID_PARAMS");
    assert!(
        refused["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("configId")),
        "{refused}"
    );
    // Unknown task: not found, whichever spelling.
    let (status, missing) = rest
        .post(
            "/v1/tasks/no-such-task/pushNotificationConfigs",
            json!({"config_id": "default", "config": {"push_notification_config":
                {"url": "https://example.com/webhook"}}}),
        )
        .await;
    assert_eq!(reason(status, &missing), "TASK_NOT_FOUND");
    server.stop().await;
}
