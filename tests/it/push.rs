//! Push notifications: the config methods in both versions, where webhooks may point, and
//! delivery to a real receiver on loopback.

use crate::common;

use common::*;
use serde_json::{Value, json};
use std::sync::Arc;

const HOOK: &str = "http://127.0.0.1:9/hook";

async fn start_allowing_loopback() -> TestServer {
    start_with(Arc::new(colloquy::agent::EchoAgent::default()), |c| {
        c.push.allow_private_networks = true;
    })
    .await
}

/// `ListTaskPushNotificationConfigs` (v1.0) of `task_id`.
async fn listed_configs(server: &TestServer, task_id: &str) -> Value {
    server
        .rpc(
            V1,
            "ListTaskPushNotificationConfigs",
            json!({"taskId": task_id}),
        )
        .await
}

async fn new_task(server: &TestServer, version: &str) -> String {
    let sent = server.send_text(version, "hello", None, None).await;
    task_of(&sent)["id"].as_str().expect("a task id").to_owned()
}

fn v1_config(task_id: &str, url: &str) -> Value {
    json!({
        "taskId": task_id,
        "url": url,
        "token": "receiver-token",
        "authentication": {"scheme": "Bearer", "credentials": "very-secret"},
    })
}

fn v03_config(task_id: &str, url: &str) -> Value {
    json!({
        "taskId": task_id,
        "pushNotificationConfig": {
            "url": url,
            "token": "receiver-token",
            "authentication": {"schemes": ["Bearer"], "credentials": "very-secret"},
        },
    })
}

fn assert_redacted(response: &Value) {
    let text = response.to_string();
    assert!(
        !text.contains("very-secret"),
        "credentials answered back: {text}"
    );
}

#[actix_rt::test]
async fn v1_configs_are_created_read_listed_and_deleted_without_their_credentials() {
    let server = start_allowing_loopback().await;
    let task_id = new_task(&server, V1).await;
    let created = server
        .rpc(
            V1,
            "CreateTaskPushNotificationConfig",
            v1_config(&task_id, HOOK),
        )
        .await;
    assert_redacted(&created);
    let first = created["result"].clone();
    let first_id = first["id"].as_str().expect("a config id").to_owned();
    assert_eq!(first["taskId"], json!(task_id));
    assert_eq!(first["url"], json!(HOOK));
    assert_eq!(first["token"], json!("receiver-token"));
    assert_eq!(first["authentication"]["scheme"], json!("Bearer"));

    let mut second = v1_config(&task_id, "http://127.0.0.1:10/other");
    second["id"] = json!("mine");
    let created = server
        .rpc(V1, "CreateTaskPushNotificationConfig", second)
        .await;
    assert_eq!(created["result"]["id"], json!("mine"));

    let got = server
        .rpc(
            V1,
            "GetTaskPushNotificationConfig",
            json!({"taskId": task_id, "id": first_id}),
        )
        .await;
    assert_redacted(&got);
    assert_eq!(got["result"], first);
    let listed = listed_configs(&server, &task_id).await;
    assert_redacted(&listed);
    assert_eq!(
        listed["result"]["configs"].as_array().map(Vec::len),
        Some(2)
    );
    assert_eq!(listed["result"]["nextPageToken"], json!(""));

    let deleted = server
        .rpc(
            V1,
            "DeleteTaskPushNotificationConfig",
            json!({"taskId": task_id, "id": "mine"}),
        )
        .await;
    assert!(deleted.get("error").is_none(), "{deleted}");
    let listed = listed_configs(&server, &task_id).await;
    assert_eq!(listed["result"]["configs"], json!([first]));
    let gone = server
        .rpc(
            V1,
            "GetTaskPushNotificationConfig",
            json!({"taskId": task_id, "id": "mine"}),
        )
        .await;
    assert_eq!(gone["error"]["code"], json!(-32602));
    let unknown_task = server
        .rpc(
            V1,
            "CreateTaskPushNotificationConfig",
            v1_config("no-such-task", HOOK),
        )
        .await;
    assert_eq!(unknown_task["error"]["code"], json!(-32001));
    server.stop().await;
}

#[actix_rt::test]
async fn v03_configs_are_set_read_listed_and_deleted_and_survive_a_restart() {
    let server = start_allowing_loopback().await;
    let task_id = new_task(&server, V03).await;
    let set = server
        .rpc(
            V03,
            "tasks/pushNotificationConfig/set",
            v03_config(&task_id, HOOK),
        )
        .await;
    assert_redacted(&set);
    let config = set["result"].clone();
    assert_eq!(config["taskId"], json!(task_id));
    assert_eq!(config["pushNotificationConfig"]["url"], json!(HOOK));
    assert_eq!(
        config["pushNotificationConfig"]["authentication"]["schemes"],
        json!(["Bearer"])
    );
    assert_v03_valid("TaskPushNotificationConfig", &config);
    let config_id = config["pushNotificationConfig"]["id"]
        .as_str()
        .unwrap()
        .to_owned();

    let dir = server.stop().await;
    let server = start_in(dir, Arc::new(colloquy::agent::EchoAgent::default()), |c| {
        c.push.allow_private_networks = true;
    })
    .await;
    let got = server
        .rpc(
            V03,
            "tasks/pushNotificationConfig/get",
            json!({"id": task_id, "pushNotificationConfigId": config_id}),
        )
        .await;
    assert_eq!(got["result"], config);
    let first = server
        .rpc(
            V03,
            "tasks/pushNotificationConfig/get",
            json!({"id": task_id}),
        )
        .await;
    assert_eq!(first["result"], config);
    let listed = server
        .rpc(
            V03,
            "tasks/pushNotificationConfig/list",
            json!({"id": task_id}),
        )
        .await;
    assert_redacted(&listed);
    assert_eq!(listed["result"], json!([config]));
    let deleted = server
        .rpc(
            V03,
            "tasks/pushNotificationConfig/delete",
            json!({"id": task_id, "pushNotificationConfigId": config_id}),
        )
        .await;
    assert_eq!(deleted["result"], Value::Null);
    assert!(deleted.get("error").is_none(), "{deleted}");
    let listed = server
        .rpc(
            V03,
            "tasks/pushNotificationConfig/list",
            json!({"id": task_id}),
        )
        .await;
    assert_eq!(listed["result"], json!([]));
    server.stop().await;
}

/// Deleting a config is idempotent (A2A v1.0 §3.1.10: "multiple deletions of the same config
/// have the same effect"): a second delete, or one of a config never created, succeeds in both
/// versions and on both bindings; a task that does not exist is still -32001 (404).
#[actix_rt::test]
async fn deleting_a_config_twice_succeeds_and_an_unknown_task_is_still_not_found() {
    let server = start_allowing_loopback().await;
    let v1_task = new_task(&server, V1).await;
    let mut config = v1_config(&v1_task, HOOK);
    config["id"] = json!("twice");
    let created = server
        .rpc(V1, "CreateTaskPushNotificationConfig", config)
        .await;
    assert!(created.get("error").is_none(), "{created}");
    for config_id in ["twice", "twice", "never-created"] {
        let deleted = server
            .rpc(
                V1,
                "DeleteTaskPushNotificationConfig",
                json!({"taskId": v1_task, "id": config_id}),
            )
            .await;
        assert_eq!(deleted["result"], json!({}), "{config_id}: {deleted}");
        let rest = server
            .client
            .delete(format!(
                "{}tasks/{v1_task}/pushNotificationConfigs/{config_id}",
                server.url
            ))
            .send()
            .await
            .expect("sent");
        assert_eq!(rest.status().as_u16(), 200, "HTTP+JSON {config_id}");
    }

    let v03_task = new_task(&server, V03).await;
    let set = server
        .rpc(
            V03,
            "tasks/pushNotificationConfig/set",
            v03_config(&v03_task, HOOK),
        )
        .await;
    let config_id = set["result"]["pushNotificationConfig"]["id"]
        .as_str()
        .expect("an id")
        .to_owned();
    for _ in 0..2 {
        let deleted = server
            .rpc(
                V03,
                "tasks/pushNotificationConfig/delete",
                json!({"id": v03_task, "pushNotificationConfigId": config_id}),
            )
            .await;
        assert!(deleted.get("error").is_none(), "{deleted}");
        assert_eq!(deleted["result"], Value::Null);
    }

    let unknown = server
        .rpc(
            V1,
            "DeleteTaskPushNotificationConfig",
            json!({"taskId": "no-such-task", "id": "twice"}),
        )
        .await;
    assert_eq!(unknown["error"]["code"], json!(-32001), "{unknown}");
    let unknown = server
        .rpc(
            V03,
            "tasks/pushNotificationConfig/delete",
            json!({"id": "no-such-task", "pushNotificationConfigId": "twice"}),
        )
        .await;
    assert_eq!(unknown["error"]["code"], json!(-32001), "{unknown}");
    let rest = server
        .client
        .delete(format!(
            "{}tasks/no-such-task/pushNotificationConfigs/twice",
            server.url
        ))
        .send()
        .await
        .expect("sent");
    assert_eq!(rest.status().as_u16(), 404);
    server.stop().await;
}

#[actix_rt::test]
async fn configs_belong_to_the_tasks_principal_and_are_limited_per_task() {
    let server = start_with(Arc::new(colloquy::agent::EchoAgent::default()), |c| {
        c.auth.tokens.insert("alice".into(), "alice-secret".into());
        c.auth.tokens.insert("bob".into(), "bob-secret".into());
        c.push.allow_private_networks = true;
        c.push.max_configs_per_task = 2;
    })
    .await;
    let call = |token: &'static str, method: &'static str, params: Value| {
        let request = server
            .client
            .post(&server.url)
            .header("A2A-Version", V1)
            .bearer_auth(token)
            .json(&json!({"jsonrpc": "2.0", "id": next_id(), "method": method, "params": params}));
        async move { request.send().await.unwrap().json::<Value>().await.unwrap() }
    };
    let sent = call(
        "alice-secret",
        "SendMessage",
        json!({"message": user_message(V1, "hi", None, None)}),
    )
    .await;
    let task_id = task_of(&sent)["id"].as_str().unwrap().to_owned();
    let named = |id: &str| {
        let mut config = v1_config(&task_id, HOOK);
        config["id"] = json!(id);
        config
    };
    for id in ["first", "second", "second"] {
        let created = call(
            "alice-secret",
            "CreateTaskPushNotificationConfig",
            named(id),
        )
        .await;
        assert!(created.get("result").is_some(), "{created}");
    }
    let third = call(
        "alice-secret",
        "CreateTaskPushNotificationConfig",
        named("third"),
    )
    .await;
    assert_eq!(third["error"]["code"], json!(-32602));
    assert!(
        third["error"]["message"]
            .as_str()
            .unwrap()
            .contains("limit"),
        "{third}"
    );

    let bobs = call(
        "bob-secret",
        "CreateTaskPushNotificationConfig",
        v1_config(&task_id, HOOK),
    )
    .await;
    assert_eq!(bobs["error"]["code"], json!(-32001));
    let bobs = call(
        "bob-secret",
        "ListTaskPushNotificationConfigs",
        json!({"taskId": task_id}),
    )
    .await;
    assert_eq!(bobs["error"]["code"], json!(-32001));
    let alices = call(
        "alice-secret",
        "ListTaskPushNotificationConfigs",
        json!({"taskId": task_id}),
    )
    .await;
    let config_id = alices["result"]["configs"][0]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let bobs = call(
        "bob-secret",
        "DeleteTaskPushNotificationConfig",
        json!({"taskId": task_id, "id": config_id}),
    )
    .await;
    assert_eq!(bobs["error"]["code"], json!(-32001));
    let bobs = call(
        "bob-secret",
        "GetTaskPushNotificationConfig",
        json!({"taskId": task_id, "id": config_id}),
    )
    .await;
    assert_eq!(bobs["error"]["code"], json!(-32001));
    server.stop().await;
}

/// Creates a config for `url`, asserts it is refused as invalid params, and returns the message.
async fn refused_config(server: &TestServer, task_id: &str, url: &str) -> String {
    let refused = server
        .rpc(
            V1,
            "CreateTaskPushNotificationConfig",
            v1_config(task_id, url),
        )
        .await;
    assert_eq!(refused["error"]["code"], json!(-32602), "{url}: {refused}");
    refused["error"]["message"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

#[actix_rt::test]
async fn internal_addresses_are_refused_without_an_allowance() {
    let server = start_echo().await;
    let task_id = new_task(&server, V1).await;
    for url in [
        "http://127.0.0.1:9/hook",
        "https://127.0.0.1/hook",
        "https://169.254.169.254/latest/meta-data",
        "https://10.0.0.1/hook",
        "https://[::1]/hook",
        "https://localhost/hook",
        "ftp://example.com/hook",
    ] {
        let message = refused_config(&server, &task_id, url).await;
        assert!(
            message.starts_with("invalid params: url:"),
            "{url}: {message}"
        );
    }
    let listed = listed_configs(&server, &task_id).await;
    assert_eq!(listed["result"]["configs"], json!([]));
    let refused = server
        .rpc(
            V1,
            "SendMessage",
            json!({
                "message": user_message(V1, "hi", None, None),
                "configuration": {"taskPushNotificationConfig": {"url": HOOK}},
            }),
        )
        .await;
    assert_eq!(refused["error"]["code"], json!(-32602), "{refused}");
    server.stop().await;
}

#[actix_rt::test]
async fn the_card_declares_push_notifications() {
    let server = start_echo().await;
    let card = server.card(&[]).await;
    assert_eq!(card["capabilities"]["pushNotifications"], json!(true));
    server.stop().await;
}

#[actix_rt::test]
async fn a_send_registers_the_config_it_carries_for_its_task() {
    let server = start_allowing_loopback().await;
    let sent = server
        .rpc(
            V1,
            "SendMessage",
            json!({
                "message": user_message(V1, "hi", None, None),
                "configuration": {"taskPushNotificationConfig": {"url": HOOK, "token": "t1"}},
            }),
        )
        .await;
    let task_id = task_of(&sent)["id"].as_str().expect("a task").to_owned();
    let listed = listed_configs(&server, &task_id).await;
    assert_eq!(listed["result"]["configs"][0]["url"], json!(HOOK));
    assert_eq!(listed["result"]["configs"][0]["token"], json!("t1"));

    let sent = server
        .rpc(
            V03,
            "message/send",
            json!({
                "message": user_message(V03, "hi", None, None),
                "configuration": {"pushNotificationConfig": {"url": HOOK, "id": "cfg-1"}},
            }),
        )
        .await;
    let task_id = task_of(&sent)["id"].as_str().expect("a task").to_owned();
    let listed = server
        .rpc(
            V03,
            "tasks/pushNotificationConfig/list",
            json!({"id": task_id}),
        )
        .await;
    assert_eq!(
        listed["result"][0]["pushNotificationConfig"]["id"],
        json!("cfg-1")
    );

    server.stop().await;
}

/// A webhook receiver on loopback: records every request, and answers the first
/// `fail_next` of them with `fail_status` (and `Retry-After`, if set).
struct Receiver {
    url: String,
    got: Arc<std::sync::Mutex<Vec<Received>>>,
    fail_next: Arc<std::sync::atomic::AtomicUsize>,
    handle: actix_web::dev::ServerHandle,
}

#[derive(Debug, Clone)]
struct Received {
    headers: std::collections::HashMap<String, String>,
    body: Value,
    raw: Vec<u8>,
    /// What the receiver answered.
    status: u16,
}

impl Received {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .get(&name.to_ascii_lowercase())
            .map(String::as_str)
    }

    fn id(&self) -> &str {
        self.header("x-colloquy-notification-id")
            .expect("a notification id")
    }

    /// The task's state, whichever version the payload speaks.
    fn state(&self) -> String {
        let task = self.body.get("task").unwrap_or(&self.body);
        task["status"]["state"].as_str().unwrap_or("?").to_owned()
    }
}

impl Receiver {
    async fn start(fail_status: u16, retry_after: Option<&'static str>) -> Receiver {
        use actix_web::{App, HttpRequest, HttpResponse, HttpServer, web};
        let got: Arc<std::sync::Mutex<Vec<Received>>> = Arc::default();
        let fail_next: Arc<std::sync::atomic::AtomicUsize> = Arc::default();
        let (got_in, fail_in) = (got.clone(), fail_next.clone());
        let server = HttpServer::new(move || {
            let (got, fail_next) = (got_in.clone(), fail_in.clone());
            App::new().route(
                "/hook",
                web::post().to(move |req: HttpRequest, body: web::Bytes| {
                    let (got, fail_next) = (got.clone(), fail_next.clone());
                    async move {
                        use std::sync::atomic::Ordering;
                        let failing = fail_next
                            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                            .is_ok();
                        let status = if failing { fail_status } else { 200 };
                        let headers = req
                            .headers()
                            .iter()
                            .map(|(k, v)| {
                                (k.as_str().to_owned(), v.to_str().unwrap_or("").to_owned())
                            })
                            .collect();
                        got.lock().unwrap().push(Received {
                            headers,
                            body: serde_json::from_slice(&body).unwrap_or(Value::Null),
                            raw: body.to_vec(),
                            status,
                        });
                        let mut response = HttpResponse::build(
                            actix_web::http::StatusCode::from_u16(status).unwrap(),
                        );
                        if let (true, Some(after)) = (failing, retry_after) {
                            response.insert_header(("Retry-After", after));
                        }
                        response.finish()
                    }
                }),
            )
        })
        .workers(1)
        .disable_signals()
        .bind("127.0.0.1:0")
        .unwrap();
        let addr = server.addrs()[0];
        let server = server.run();
        let handle = server.handle();
        actix_rt::spawn(server);
        Receiver {
            url: format!("http://{addr}/hook"),
            got,
            fail_next,
            handle,
        }
    }

    fn fail_next(&self, n: usize) {
        self.fail_next.store(n, std::sync::atomic::Ordering::SeqCst);
    }

    fn all(&self) -> Vec<Received> {
        self.got.lock().unwrap().clone()
    }

    /// The delivered (answered 2xx) notifications, each id once (delivery is at least once:
    /// a receiver drops duplicates), once there are `n`, waiting up to a minute.
    async fn delivered(&self, n: usize) -> Vec<Received> {
        for _ in 0..600 {
            let delivered = distinct(self.all().into_iter().filter(|r| r.status == 200).collect());
            if delivered.len() >= n {
                return delivered;
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
        panic!("fewer than {n} notifications delivered: {:?}", self.all());
    }

    async fn stop(self) {
        self.handle.stop(false).await;
    }
}

fn allow_loopback_with_fast_retries(c: &mut colloquy::config::Config) {
    c.push.allow_private_networks = true;
    c.push.retry_base_ms = 50;
    c.push.retry_max_ms = 200;
}

fn send_with_hook(version: &str, text: &str, task_id: Option<&str>, hook: &str) -> Value {
    let configuration = if version == V1 {
        json!({"taskPushNotificationConfig": {
            "url": hook,
            "token": "receiver-token",
            "authentication": {"scheme": "Bearer", "credentials": "hook-secret"},
        }})
    } else {
        json!({"pushNotificationConfig": {"url": hook, "token": "receiver-token"}})
    };
    json!({
        "message": user_message(version, text, None, task_id),
        "configuration": configuration,
    })
}

#[actix_rt::test]
async fn every_state_change_of_a_multi_turn_task_is_delivered_in_order_with_the_token() {
    let receiver = Receiver::start(503, None).await;
    let server = start_scripted(allow_loopback_with_fast_retries).await;
    let asked = server
        .rpc(
            V1,
            "SendMessage",
            send_with_hook(V1, "ask: which room?", None, &receiver.url),
        )
        .await;
    let task_id = task_of(&asked)["id"].as_str().expect("a task").to_owned();
    assert_eq!(
        task_of(&asked)["status"]["state"],
        json!("TASK_STATE_INPUT_REQUIRED")
    );
    let answered = server
        .send_text(V1, "room four", None, Some(&task_id))
        .await;
    assert_eq!(
        task_of(&answered)["status"]["state"],
        json!("TASK_STATE_COMPLETED")
    );

    let delivered = receiver.delivered(4).await;
    assert_eq!(receiver.all().len(), 4, "no duplicates while nothing fails");
    let states: Vec<String> = delivered.iter().map(Received::state).collect();
    assert_eq!(
        states,
        [
            "TASK_STATE_WORKING",
            "TASK_STATE_INPUT_REQUIRED",
            "TASK_STATE_WORKING",
            "TASK_STATE_COMPLETED"
        ]
    );
    let ids: std::collections::HashSet<&str> = delivered.iter().map(Received::id).collect();
    assert_eq!(ids.len(), 4, "each notification has its own id");
    for notification in &delivered {
        assert_eq!(
            notification.header("x-a2a-notification-token"),
            Some("receiver-token")
        );
        assert_eq!(
            notification.header("authorization"),
            Some("Bearer hook-secret")
        );
        assert_eq!(
            notification.header("content-type"),
            Some("application/json")
        );
        assert_eq!(notification.body["task"]["id"], json!(task_id));
    }
    // The last one carries the task's reply.
    assert!(
        delivered[3].body["task"]["artifacts"].is_array(),
        "{:?}",
        delivered[3].body
    );

    // v0.3 configs get the v0.3 Task.
    let sent = server
        .rpc(
            V03,
            "message/send",
            send_with_hook(V03, "hello", None, &receiver.url),
        )
        .await;
    let task_id = task_of(&sent)["id"].as_str().unwrap().to_owned();
    let delivered = receiver.delivered(6).await;
    assert_eq!(delivered[4].body["kind"], json!("task"));
    assert_eq!(delivered[4].body["id"], json!(task_id));
    assert_eq!(delivered[4].state(), "working");
    assert_eq!(delivered[5].state(), "completed");
    assert_v03_valid("Task", &delivered[5].body);
    server.stop().await;
    receiver.stop().await;
}

#[actix_rt::test]
async fn a_receiver_that_fails_for_a_while_gets_everything_in_order_with_stable_ids() {
    let receiver = Receiver::start(503, None).await;
    receiver.fail_next(4);
    let server = start_echo_with(allow_loopback_with_fast_retries).await;
    let sent = server
        .rpc(
            V1,
            "SendMessage",
            send_with_hook(V1, "hello", None, &receiver.url),
        )
        .await;
    assert_eq!(
        task_of(&sent)["status"]["state"],
        json!("TASK_STATE_COMPLETED"),
        "a turn never waits for its webhook"
    );
    let delivered = receiver.delivered(2).await;
    let states: Vec<String> = delivered.iter().map(Received::state).collect();
    assert_eq!(states, ["TASK_STATE_WORKING", "TASK_STATE_COMPLETED"]);
    let all = receiver.all();
    assert_eq!(all.len(), 6, "four failures, then two deliveries: {all:?}");
    for failed in &all[..4] {
        assert_eq!(failed.status, 503);
        assert_eq!(
            failed.id(),
            delivered[0].id(),
            "a retry is the same notification"
        );
    }
    server.stop().await;
    receiver.stop().await;
}

#[actix_rt::test]
async fn retry_after_is_honoured() {
    let receiver = Receiver::start(429, Some("1")).await;
    receiver.fail_next(1);
    let server = start_echo_with(allow_loopback_with_fast_retries).await;
    server
        .rpc(
            V1,
            "SendMessage",
            send_with_hook(V1, "hello", None, &receiver.url),
        )
        .await;
    let started = std::time::Instant::now();
    receiver.delivered(1).await;
    assert!(
        started.elapsed() >= std::time::Duration::from_millis(900),
        "retried after {:?}, before the receiver's Retry-After of 1 s",
        started.elapsed()
    );
    server.stop().await;
    receiver.stop().await;
}

#[actix_rt::test]
async fn undelivered_notifications_are_delivered_after_a_restart() {
    let receiver = Receiver::start(503, None).await;
    receiver.fail_next(usize::MAX);
    let server = start_echo_with(allow_loopback_with_fast_retries).await;
    server
        .rpc(
            V1,
            "SendMessage",
            send_with_hook(V1, "hello", None, &receiver.url),
        )
        .await;
    // Both notifications were tried (and refused) before the stop.
    for _ in 0..300 {
        if receiver.all().len() >= 2 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let tried_before: Vec<String> = receiver.all().iter().map(|r| r.id().to_owned()).collect();
    let dir = server.stop().await;
    receiver.fail_next(0);
    let server = start_in(
        dir,
        Arc::new(colloquy::agent::EchoAgent::default()),
        allow_loopback_with_fast_retries,
    )
    .await;
    // At least once: an attempt of the stopped server may have landed just as it let go of
    // the store, and is sent again by the new one (`delivered` drops duplicates by id).
    let delivered = receiver.delivered(2).await;
    let states: Vec<String> = delivered.iter().map(Received::state).collect();
    assert_eq!(states, ["TASK_STATE_WORKING", "TASK_STATE_COMPLETED"]);
    assert!(
        tried_before.contains(&delivered[0].id().to_owned()),
        "the same notification, resumed"
    );
    server.stop().await;
    receiver.stop().await;
}

async fn start_echo_with(tweak: impl FnOnce(&mut colloquy::config::Config)) -> TestServer {
    start_with(Arc::new(colloquy::agent::EchoAgent::default()), tweak).await
}

/// A sample's value in the server's `/metrics` text (0 when absent).
async fn metric(server: &TestServer, name: &str) -> f64 {
    let text = server.metrics_text().await;
    text.lines()
        .find_map(|line| {
            line.strip_prefix(name)?
                .strip_prefix(' ')?
                .trim()
                .parse()
                .ok()
        })
        .unwrap_or(0.0)
}

#[actix_rt::test]
async fn a_notification_never_accepted_is_given_up_with_a_metric() {
    if rerun_alone("push::a_notification_never_accepted_is_given_up_with_a_metric") {
        return;
    }
    let receiver = Receiver::start(500, None).await;
    receiver.fail_next(usize::MAX);
    let server = start_echo_with(|c| {
        allow_loopback_with_fast_retries(c);
        c.push.give_up_after_secs = 1;
    })
    .await;
    server
        .rpc(
            V1,
            "SendMessage",
            send_with_hook(V1, "hello", None, &receiver.url),
        )
        .await;
    let mut given_up = 0.0;
    for _ in 0..200 {
        given_up = metric(&server, "colloquy_push_given_up_total").await;
        if given_up >= 2.0 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert_eq!(given_up, 2.0, "both notifications given up");
    assert!(metric(&server, "colloquy_push_retried_total").await >= 2.0);
    assert!(metric(&server, "colloquy_push_failed_total").await >= 4.0);
    assert_eq!(metric(&server, "colloquy_push_sent_total").await, 0.0);
    let tried = receiver.all().len();
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    assert_eq!(
        receiver.all().len(),
        tried,
        "nothing is tried once given up"
    );
    server.stop().await;
    receiver.stop().await;
}

#[actix_rt::test]
async fn delivery_checks_the_address_again_after_resolving_the_name() {
    if rerun_alone("push::delivery_checks_the_address_again_after_resolving_the_name") {
        return;
    }
    // Registered while loopback was allowed; nothing listens there, so it stays pending.
    let hook = format!("https://localhost:{}/hook", free_port());
    let server = start_echo_with(allow_loopback_with_fast_retries).await;
    server
        .rpc(V1, "SendMessage", send_with_hook(V1, "hello", None, &hook))
        .await;
    assert_eq!(metric(&server, "colloquy_push_given_up_total").await, 0.0);
    let dir = server.stop().await;
    // Restarted without the allowance: the name resolves to loopback, so both are given up
    // without a connection.
    let server = start_in(dir, Arc::new(colloquy::agent::EchoAgent::default()), |c| {
        c.push.retry_base_ms = 50;
        c.push.retry_max_ms = 200;
    })
    .await;
    let mut given_up = 0.0;
    for _ in 0..200 {
        given_up = metric(&server, "colloquy_push_given_up_total").await;
        if given_up >= 2.0 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert_eq!(given_up, 2.0);
    assert_eq!(metric(&server, "colloquy_push_sent_total").await, 0.0);
    server.stop().await;
}

/// Waits (up to 10 s) until `name` reaches `at_least`, and returns its value then.
async fn metric_reaching(server: &TestServer, name: &str, at_least: f64) -> f64 {
    let mut value = 0.0;
    for _ in 0..200 {
        value = metric(server, name).await;
        if value >= at_least {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    value
}

/// A name that does not resolve at delivery (one under `.invalid`, which RFC 6761 keeps from
/// ever resolving: like a resolver that is down or a name not yet in DNS) is a failed attempt,
/// retried with backoff until the retry budget is spent; a name that resolves to a forbidden
/// address is still refused and given up at once, on the same server.
#[actix_rt::test]
async fn a_name_that_does_not_resolve_at_delivery_is_retried_and_a_forbidden_one_is_not() {
    if rerun_alone(
        "push::a_name_that_does_not_resolve_at_delivery_is_retried_and_a_forbidden_one_is_not",
    ) {
        return;
    }
    const UNRESOLVED: &str = "https://hooks.colloquy-test.invalid/webhook";
    // Registered while loopback was allowed (a name resolving to loopback is refused at
    // registration otherwise); nothing listens there.
    let forbidden = format!("https://localhost:{}/hook", free_port());
    let server = start_echo_with(allow_loopback_with_fast_retries).await;
    for hook in [forbidden.as_str(), UNRESOLVED] {
        let sent = server
            .rpc(V1, "SendMessage", send_with_hook(V1, "hello", None, hook))
            .await;
        assert!(sent.get("result").is_some(), "{sent}");
    }
    let dir = server.stop().await;

    // Without the allowance: loopback is refused once resolved (two notifications given up at
    // once, never retried), while the unresolved name keeps being retried.
    let server = start_in(dir, Arc::new(colloquy::agent::EchoAgent::default()), |c| {
        c.push.retry_base_ms = 50;
        c.push.retry_max_ms = 200;
    })
    .await;
    assert_eq!(
        metric_reaching(&server, "colloquy_push_given_up_total", 2.0).await,
        2.0
    );
    let retried = metric(&server, "colloquy_push_retried_total").await;
    let failed = metric(&server, "colloquy_push_failed_total").await;
    assert!(
        metric_reaching(&server, "colloquy_push_retried_total", retried + 3.0).await
            >= retried + 3.0,
        "the unresolved name is retried"
    );
    // Counted apart from the retry: it may land a moment after.
    assert!(
        metric_reaching(&server, "colloquy_push_failed_total", failed + 3.0).await >= failed + 3.0
    );
    assert_eq!(
        metric(&server, "colloquy_push_given_up_total").await,
        2.0,
        "only the forbidden address is given up"
    );
    assert_eq!(metric(&server, "colloquy_push_sent_total").await, 0.0);
    let dir = server.stop().await;

    // Given up once the usual budget is spent: both of its notifications.
    let server = start_in(dir, Arc::new(colloquy::agent::EchoAgent::default()), |c| {
        c.push.retry_base_ms = 50;
        c.push.retry_max_ms = 200;
        c.push.give_up_after_secs = 1;
    })
    .await;
    assert_eq!(
        metric_reaching(&server, "colloquy_push_given_up_total", 4.0).await,
        4.0
    );
    assert_eq!(metric(&server, "colloquy_push_sent_total").await, 0.0);
    server.stop().await;
}

/// Checks a notification's JWT against the keys the server's card points to: the signature,
/// the body's digest, the notification id and the time.
async fn assert_signed(server: &TestServer, notification: &Received) {
    use base64::Engine;
    use base64::engine::general_purpose::URL_SAFE_NO_PAD;
    use sha2::Digest;
    let card = server.card(&[]).await;
    let extension = &card["capabilities"]["extensions"][0]["params"];
    assert_eq!(extension["header"], json!("X-Colloquy-Signature"));
    let jwks: Value = server
        .client
        .get(
            extension["jwksUrl"]
                .as_str()
                .expect("the card names the JWKS"),
        )
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let jwt = notification
        .header("x-colloquy-signature")
        .expect("a signature");
    let parts: Vec<&str> = jwt.split('.').collect();
    assert_eq!(parts.len(), 3, "{jwt}");
    let decode = |part: &str| URL_SAFE_NO_PAD.decode(part).expect("base64url");
    let header: Value = serde_json::from_slice(&decode(parts[0])).unwrap();
    assert_eq!(header["alg"], json!("ES256"));
    let key = jwks["keys"]
        .as_array()
        .unwrap()
        .iter()
        .find(|k| k["kid"] == header["kid"])
        .expect("the JWT's kid is in the JWKS");
    let mut point = vec![4u8];
    point.extend(decode(key["x"].as_str().unwrap()));
    point.extend(decode(key["y"].as_str().unwrap()));
    ring::signature::UnparsedPublicKey::new(&ring::signature::ECDSA_P256_SHA256_FIXED, &point)
        .verify(
            format!("{}.{}", parts[0], parts[1]).as_bytes(),
            &decode(parts[2]),
        )
        .expect("the signature verifies against the served key");
    let claims: Value = serde_json::from_slice(&decode(parts[1])).unwrap();
    assert_eq!(
        claims["request_body_sha256"],
        json!(hex::encode(sha2::Sha256::digest(&notification.raw)))
    );
    assert_eq!(claims["jti"], json!(notification.id()));
    let age = chrono::Utc::now().timestamp() - claims["iat"].as_i64().unwrap();
    assert!((0..120).contains(&age), "iat {age} s ago");
}

#[actix_rt::test]
async fn notifications_are_signed_with_the_key_the_card_points_to() {
    let receiver = Receiver::start(503, None).await;
    let server = start_echo_with(allow_loopback_with_fast_retries).await;
    server
        .rpc(
            V1,
            "SendMessage",
            send_with_hook(V1, "hello", None, &receiver.url),
        )
        .await;
    let delivered = receiver.delivered(2).await;
    for notification in &delivered {
        assert_signed(&server, notification).await;
    }
    // A body changed on the way no longer matches the signed digest.
    let jwt = delivered[0].header("x-colloquy-signature").unwrap();
    let claims = jwt.split('.').nth(1).unwrap();
    let claims: Value = serde_json::from_slice(
        &base64::Engine::decode(&base64::engine::general_purpose::URL_SAFE_NO_PAD, claims).unwrap(),
    )
    .unwrap();
    let mut tampered = delivered[0].raw.clone();
    tampered.extend_from_slice(b" ");
    assert_ne!(
        claims["request_body_sha256"],
        json!(hex::encode(<sha2::Sha256 as sha2::Digest>::digest(
            &tampered
        )))
    );

    // The same key after a restart (kept in the data folder).
    let jwks_before = server.card(&[]).await["capabilities"]["extensions"][0]["params"]["jwksUrl"]
        .as_str()
        .map(str::to_owned)
        .unwrap();
    let keys_before: Value = server
        .client
        .get(&jwks_before)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let dir = server.stop().await;
    assert!(dir.path().join("push-signing-key.p8").exists());
    let server = start_in(
        dir,
        Arc::new(colloquy::agent::EchoAgent::default()),
        allow_loopback_with_fast_retries,
    )
    .await;
    let jwks_url = format!("{}.well-known/jwks.json", server.url);
    let keys_after: Value = server
        .client
        .get(&jwks_url)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(keys_before, keys_after);
    server.stop().await;
    receiver.stop().await;
}

#[actix_rt::test]
async fn the_documented_receiver_example_verifies_a_real_notification() {
    let script = include_str!("../interop/verify_notification.py");
    let doc = include_str!("../../docs/push.md");
    let example = doc
        .split("```python\n")
        .nth(1)
        .and_then(|rest| rest.split("```").next())
        .expect("docs/push.md has a Python example");
    assert!(
        script.contains(example),
        "tests/interop/verify_notification.py is not the documented example"
    );

    let receiver = Receiver::start(503, None).await;
    let server = start_echo_with(allow_loopback_with_fast_retries).await;
    server
        .rpc(
            V1,
            "SendMessage",
            send_with_hook(V1, "hello", None, &receiver.url),
        )
        .await;
    let notification = receiver.delivered(1).await.remove(0);
    let jwks: Value = server
        .client
        .get(format!("{}.well-known/jwks.json", server.url))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let files = tempfile::tempdir().unwrap();
    let (body, tampered, keys) = (
        files.path().join("body"),
        files.path().join("tampered"),
        files.path().join("jwks.json"),
    );
    std::fs::write(&body, &notification.raw).unwrap();
    std::fs::write(&tampered, [&notification.raw[..], b" "].concat()).unwrap();
    std::fs::write(&keys, jwks.to_string()).unwrap();
    let jwt = notification.header("x-colloquy-signature").unwrap();
    let path = |p: &std::path::Path| p.to_str().unwrap().to_owned();
    let (ok, output) = run_sdk_script(
        "sdk1",
        "verify_notification.py",
        &[jwt, &path(&body), &path(&keys)],
    )
    .await;
    assert!(ok, "{output}");
    assert_eq!(output.trim(), format!("VERIFIED {}", notification.id()));
    let (ok, output) = run_sdk_script(
        "sdk1",
        "verify_notification.py",
        &[jwt, &path(&tampered), &path(&keys)],
    )
    .await;
    assert!(!ok && output.starts_with("REFUSED"), "{output}");
    server.stop().await;
    receiver.stop().await;
}

async fn sdk_manages_configs(venv: &str, script: &str) {
    let server = start_allowing_loopback().await;
    let url = server.url.trim_end_matches('/').to_owned();
    let (ok, output) = run_sdk_script(venv, script, &["--url", &url, "--hook", HOOK]).await;
    println!("{output}");
    assert!(ok && output.contains("INTEROP OK"), "{script}:\n{output}");
    server.stop().await;
}

#[actix_rt::test]
async fn the_sdk_1x_client_creates_reads_lists_and_deletes_configs() {
    sdk_manages_configs("sdk1", "push1.py").await;
}

#[actix_rt::test]
async fn the_sdk_03_client_sets_reads_lists_and_deletes_configs() {
    sdk_manages_configs("sdk03", "push03.py").await;
}

#[actix_rt::test]
async fn notifications_pending_at_a_sigkill_are_delivered_after_the_restart() {
    let receiver = Receiver::start(503, None).await;
    receiver.fail_next(usize::MAX);
    let client = reqwest::Client::new();
    let data = tempfile::tempdir().unwrap();
    let log = data.path().join("server.log");
    let store = data.path().join("store");
    let env = [
        ("COLLOQUY_PUSH__ALLOW_PRIVATE_NETWORKS", "true"),
        ("COLLOQUY_PUSH__RETRY_BASE_MS", "50"),
        ("COLLOQUY_PUSH__RETRY_MAX_MS", "200"),
    ];
    let mut server = crate::crash::start(&store, &log, &env, &client).await;
    let mut task_ids = Vec::new();
    for text in ["one", "two", "three"] {
        let body = json!({"jsonrpc": "2.0", "id": next_id(), "method": "SendMessage",
            "params": send_with_hook(V1, text, None, &receiver.url)});
        let sent = post_rpc(&client, &server.url, V1, &body).await;
        task_ids.push(task_of(&sent)["id"].as_str().expect("a task").to_owned());
    }
    // Every notification is in the outbox and being retried when the process dies.
    for _ in 0..400 {
        if receiver.all().len() >= 6 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    }
    server.child.kill().expect("SIGKILL");
    let _ = server.child.wait();
    let tried_before = receiver.all().len();
    assert!(
        tried_before >= 3,
        "attempts before the kill: {tried_before}"
    );
    receiver.fail_next(0);
    let _server = crate::crash::start(&store, &log, &env, &client).await;
    let delivered = receiver.delivered(6).await;
    for task_id in &task_ids {
        let states: Vec<String> = delivered
            .iter()
            .filter(|r| r.body["task"]["id"] == json!(task_id))
            .map(Received::state)
            .collect();
        assert_eq!(
            states,
            ["TASK_STATE_WORKING", "TASK_STATE_COMPLETED"],
            "task {task_id}"
        );
    }
    receiver.stop().await;
}

#[actix_rt::test]
async fn configs_stored_before_a_restart_are_notified_after_it() {
    let receiver = Receiver::start(503, None).await;
    let server = start_scripted(allow_loopback_with_fast_retries).await;
    let asked = server
        .rpc(
            V1,
            "SendMessage",
            send_with_hook(V1, "ask: which room?", None, &receiver.url),
        )
        .await;
    let task_id = task_of(&asked)["id"].as_str().expect("a task").to_owned();
    receiver.delivered(2).await;
    let dir = server.stop().await;
    let server = start_in(
        dir,
        Arc::new(ScriptedAgent),
        allow_loopback_with_fast_retries,
    )
    .await;
    let answered = server
        .send_text(V1, "room four", None, Some(&task_id))
        .await;
    assert_eq!(
        task_of(&answered)["status"]["state"],
        json!("TASK_STATE_COMPLETED")
    );
    let states: Vec<String> = receiver
        .delivered(4)
        .await
        .iter()
        .map(Received::state)
        .collect();
    assert_eq!(
        states,
        [
            "TASK_STATE_WORKING",
            "TASK_STATE_INPUT_REQUIRED",
            "TASK_STATE_WORKING",
            "TASK_STATE_COMPLETED"
        ]
    );
    server.stop().await;
    receiver.stop().await;
}

/// The notifications in order, each id once (as a receiver dropping duplicates sees them).
fn distinct(received: Vec<Received>) -> Vec<Received> {
    let mut seen = std::collections::HashSet::new();
    received
        .into_iter()
        .filter(|r| seen.insert(r.id().to_owned()))
        .collect()
}

/// Two nodes on one PostgreSQL database, both draining its outbox: a task's changes, made on
/// either node, reach the webhook once each and in order, retried through a failing spell.
#[actix_rt::test]
async fn two_nodes_on_postgres_deliver_each_notification_once_and_in_order() {
    let Some(url) = pg::database("push::two_nodes_on_postgres") else {
        return;
    };
    let receiver = Receiver::start(503, None).await;
    let node = || {
        start_scripted(|c| {
            allow_loopback_with_fast_retries(c);
            c.store.url = url.clone();
        })
    };
    let (a, b) = (node().await, node().await);
    let card = b.card(&[]).await;
    assert_eq!(card["capabilities"]["pushNotifications"], json!(true));
    let asked = a
        .rpc(
            V1,
            "SendMessage",
            send_with_hook(V1, "ask: which room?", None, &receiver.url),
        )
        .await;
    let task_id = task_of(&asked)["id"].as_str().expect("a task").to_owned();
    let answered = b.send_text(V1, "room four", None, Some(&task_id)).await;
    assert_eq!(
        task_of(&answered)["status"]["state"],
        json!("TASK_STATE_COMPLETED")
    );
    let delivered = receiver.delivered(4).await;
    let states: Vec<String> = delivered.iter().map(Received::state).collect();
    assert_eq!(
        states,
        [
            "TASK_STATE_WORKING",
            "TASK_STATE_INPUT_REQUIRED",
            "TASK_STATE_WORKING",
            "TASK_STATE_COMPLETED"
        ]
    );
    // Both workers poll the outbox: a second delivery of any of them would show here.
    tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
    assert_eq!(
        receiver.all().len(),
        4,
        "each delivered once: {:?}",
        receiver.all()
    );
    let listed = listed_configs(&b, &task_id).await;
    assert_eq!(
        listed["result"]["configs"].as_array().map(Vec::len),
        Some(1),
        "{listed}"
    );

    // A failing spell: retried (by either node) until delivered, in order, same ids.
    receiver.fail_next(3);
    let sent = b
        .rpc(
            V1,
            "SendMessage",
            send_with_hook(V1, "hello", None, &receiver.url),
        )
        .await;
    assert_eq!(
        task_of(&sent)["status"]["state"],
        json!("TASK_STATE_COMPLETED")
    );
    let delivered = receiver.delivered(6).await;
    let states: Vec<String> = delivered[4..].iter().map(Received::state).collect();
    assert_eq!(states, ["TASK_STATE_WORKING", "TASK_STATE_COMPLETED"]);
    let failed: Vec<Received> = receiver
        .all()
        .into_iter()
        .filter(|r| r.status != 200)
        .collect();
    assert_eq!(failed.len(), 3);
    assert!(failed.iter().all(|r| r.id() == delivered[4].id()));
    a.stop().await;
    b.stop().await;
    receiver.stop().await;
}

/// On PostgreSQL a turn's end is written in one round trip unless its task has push configs: a
/// config created while the turn runs still gets the turn's final state.
#[actix_rt::test]
async fn a_config_created_while_its_turn_runs_on_postgres_gets_the_final_state() {
    let Some(url) = pg::database("push::a_config_created_while_its_turn_runs") else {
        return;
    };
    let receiver = Receiver::start(503, None).await;
    let agent = colloquy::agent::EchoAgent::new(0, std::time::Duration::from_millis(1500));
    let server = start_with(Arc::new(agent), |c| {
        allow_loopback_with_fast_retries(c);
        c.store.url = url.clone();
    })
    .await;
    let started = server
        .rpc(
            V1,
            "SendMessage",
            json!({"message": user_message(V1, "slowly", None, None),
                   "configuration": {"returnImmediately": true}}),
        )
        .await;
    let task_id = task_of(&started)["id"].as_str().expect("a task").to_owned();
    let created = server
        .rpc(
            V1,
            "CreateTaskPushNotificationConfig",
            v1_config(&task_id, &receiver.url),
        )
        .await;
    assert!(created.get("result").is_some(), "{created}");
    let delivered = receiver.delivered(1).await;
    assert_eq!(delivered[0].state(), "TASK_STATE_COMPLETED");
    assert_eq!(delivered[0].body["task"]["id"], json!(task_id));
    server.stop().await;
    receiver.stop().await;
}

/// A config that does not fit is refused with -32602 naming the field's path, in both versions,
/// and nothing is stored.
#[actix_rt::test]
async fn a_malformed_config_is_refused_naming_the_field() {
    let server = start_allowing_loopback().await;
    let task_id = new_task(&server, V1).await;
    let cases = [
        (
            V1,
            "CreateTaskPushNotificationConfig",
            json!({"taskId": task_id, "url": HOOK, "authentication": {"credentials": "x"}}),
            "authentication",
        ),
        (
            V1,
            "CreateTaskPushNotificationConfig",
            json!({"taskId": task_id, "url": 7}),
            "url",
        ),
        (
            V03,
            "tasks/pushNotificationConfig/set",
            json!({"taskId": task_id, "pushNotificationConfig": {"url": HOOK, "authentication": {"schemes": []}}}),
            "pushNotificationConfig.authentication.schemes",
        ),
        (
            V03,
            "tasks/pushNotificationConfig/set",
            json!({"taskId": task_id, "pushNotificationConfig": {"url": [HOOK]}}),
            "pushNotificationConfig.url",
        ),
        (
            V1,
            "GetTaskPushNotificationConfig",
            json!({"taskId": task_id}),
            "id",
        ),
        (
            V03,
            "tasks/pushNotificationConfig/delete",
            json!({"id": task_id}),
            "pushNotificationConfigId",
        ),
    ];
    for (version, method, params, field) in cases {
        let refused = server.rpc(version, method, params.clone()).await;
        assert_eq!(
            refused["error"]["code"],
            json!(-32602),
            "{params}: {refused}"
        );
        let message = refused["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains(field), "{params}: {message} names {field}");
    }
    for (version, method, params) in [
        (
            V1,
            "ListTaskPushNotificationConfigs",
            json!({"taskId": task_id}),
        ),
        (
            V03,
            "tasks/pushNotificationConfig/list",
            json!({"id": task_id}),
        ),
    ] {
        let listed = server.rpc(version, method, params).await;
        assert!(
            listed["result"] == json!([]) || listed["result"]["configs"] == json!([]),
            "nothing stored: {listed}"
        );
    }
    server.stop().await;
}

/// A webhook's `url` is at most 2,048 bytes and its `token` and credentials at most
/// 4 KiB, in both versions, on create and on a send, and on the HTTP+JSON binding (400):
/// refused with -32602 naming the field, and nothing stored.
#[actix_rt::test]
async fn oversized_url_token_and_credentials_are_refused_naming_the_field() {
    let server = start_allowing_loopback().await;
    let task_id = new_task(&server, V1).await;
    let url_of = |len: usize| format!("{HOOK}{}", "a".repeat(len - HOOK.len()));
    let long = "t".repeat(4097);
    let cases = [
        (V1, json!({"taskId": task_id, "url": url_of(2049)}), "url"),
        (
            V1,
            json!({"taskId": task_id, "url": HOOK, "token": long}),
            "token",
        ),
        (
            V1,
            json!({"taskId": task_id, "url": HOOK,
                   "authentication": {"scheme": "Bearer", "credentials": long}}),
            "authentication.credentials",
        ),
        (
            V03,
            json!({"taskId": task_id, "pushNotificationConfig": {"url": url_of(2049)}}),
            "pushNotificationConfig.url",
        ),
        (
            V03,
            json!({"taskId": task_id, "pushNotificationConfig": {"url": HOOK, "token": long}}),
            "pushNotificationConfig.token",
        ),
        (
            V03,
            json!({"taskId": task_id, "pushNotificationConfig": {"url": HOOK,
                   "authentication": {"schemes": ["Bearer"], "credentials": long}}}),
            "pushNotificationConfig.authentication.credentials",
        ),
    ];
    for (version, params, field) in cases {
        let method = if version == V1 {
            "CreateTaskPushNotificationConfig"
        } else {
            "tasks/pushNotificationConfig/set"
        };
        let refused = server.rpc(version, method, params.clone()).await;
        assert_eq!(refused["error"]["code"], json!(-32602), "{refused}");
        let message = refused["error"]["message"].as_str().unwrap_or_default();
        assert!(
            message.contains(&format!("{field}: is ")),
            "{message} should name {field}"
        );
    }
    let sent = server
        .rpc(
            V1,
            "SendMessage",
            json!({
                "message": user_message(V1, "hi", None, None),
                "configuration": {"taskPushNotificationConfig": {"url": url_of(2049)}},
            }),
        )
        .await;
    let message = sent["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("configuration.taskPushNotificationConfig.url"),
        "{sent}"
    );
    let rest = server
        .client
        .post(format!(
            "{}tasks/{task_id}/pushNotificationConfigs",
            server.url
        ))
        .json(&json!({"url": url_of(2049)}))
        .send()
        .await
        .unwrap();
    assert_eq!(rest.status().as_u16(), 400);
    let listed = listed_configs(&server, &task_id).await;
    assert_eq!(listed["result"]["configs"], json!([]), "nothing stored");
    // At the bounds: accepted.
    let at_bounds = json!({"taskId": task_id, "url": url_of(2048), "token": "t".repeat(4096),
        "authentication": {"scheme": "Bearer", "credentials": "c".repeat(4096)}});
    let created = server
        .rpc(V1, "CreateTaskPushNotificationConfig", at_bounds)
        .await;
    assert_eq!(created["result"]["url"], json!(url_of(2048)), "{created}");
    server.stop().await;
}

/// Special-purpose addresses (IPv4 embedded in IPv6, site-local, benchmarking, ...) are refused
/// end to end.
#[actix_rt::test]
async fn special_purpose_addresses_are_refused() {
    let server = start_echo().await;
    let task_id = new_task(&server, V1).await;
    for url in [
        "https://[::127.0.0.1]/hook",
        "https://[::ffff:0:127.0.0.1]/hook",
        "https://[2002:7f00:1::]/hook",
        "https://[fec0::1]/hook",
        "https://[2001::1]/hook",
        "https://[100::1]/hook",
        "https://198.18.0.1/hook",
        "https://192.0.0.1/hook",
    ] {
        let message = refused_config(&server, &task_id, url).await;
        assert!(message.contains("special-purpose"), "{url}: {message}");
    }
    server.stop().await;
}

/// A host that does not resolve now (one under `.invalid`, which RFC 6761 keeps from ever
/// resolving) is no reason to refuse a config: the resolver may be down or the name not yet in
/// DNS, and every delivery resolves and checks again. What is certain at registration is still
/// refused: a literal address in a forbidden range. Both versions, both bindings, and a send.
#[actix_rt::test]
async fn a_host_that_does_not_resolve_is_accepted_and_a_forbidden_literal_is_not() {
    const UNRESOLVED: &str = "https://hooks.colloquy-test.invalid/webhook";
    let server = start_echo().await;
    let rest_create = |prefix: &str, task_id: &str, body: Value| {
        server
            .client
            .post(format!(
                "{}{prefix}tasks/{task_id}/pushNotificationConfigs",
                server.url
            ))
            .json(&body)
            .send()
    };
    let v03_rest_body = |task_id: &str, url: &str| {
        json!({"parent": format!("tasks/{task_id}"), "configId": "rest-03",
            "config": {"pushNotificationConfig": {"url": url}}})
    };

    let v1_task = new_task(&server, V1).await;
    let created = server
        .rpc(
            V1,
            "CreateTaskPushNotificationConfig",
            v1_config(&v1_task, UNRESOLVED),
        )
        .await;
    assert_eq!(created["result"]["url"], json!(UNRESOLVED), "{created}");
    let rest = rest_create("", &v1_task, json!({"id": "rest", "url": UNRESOLVED}))
        .await
        .expect("sent");
    assert_eq!(rest.status().as_u16(), 200, "HTTP+JSON v1.0");
    let listed = listed_configs(&server, &v1_task).await;
    let urls: Vec<&Value> = listed["result"]["configs"]
        .as_array()
        .map(|configs| configs.iter().map(|c| &c["url"]).collect())
        .unwrap_or_default();
    assert_eq!(urls, [UNRESOLVED, UNRESOLVED], "{listed}");

    let v03_task = new_task(&server, V03).await;
    let set = server
        .rpc(
            V03,
            "tasks/pushNotificationConfig/set",
            v03_config(&v03_task, UNRESOLVED),
        )
        .await;
    assert_eq!(
        set["result"]["pushNotificationConfig"]["url"],
        json!(UNRESOLVED),
        "{set}"
    );
    let rest = rest_create("v1/", &v03_task, v03_rest_body(&v03_task, UNRESOLVED))
        .await
        .expect("sent");
    assert_eq!(rest.status().as_u16(), 200, "HTTP+JSON v0.3");
    let listed = server
        .rpc(
            V03,
            "tasks/pushNotificationConfig/list",
            json!({"id": v03_task}),
        )
        .await;
    assert_eq!(
        listed["result"].as_array().map(Vec::len),
        Some(2),
        "{listed}"
    );

    for version in [V1, V03] {
        let sent = server
            .rpc(
                version,
                send_method(version),
                send_with_hook(version, "hi", None, UNRESOLVED),
            )
            .await;
        let task_id = task_of(&sent)["id"].as_str().expect("a task").to_owned();
        let listed = listed_configs(&server, &task_id).await;
        assert_eq!(
            listed["result"]["configs"][0]["url"],
            json!(UNRESOLVED),
            "{version}: {listed}"
        );
    }

    for forbidden in [
        "https://127.0.0.1/webhook",
        "https://169.254.169.254/webhook",
    ] {
        let message = refused_config(&server, &v1_task, forbidden).await;
        assert!(
            message.contains("special-purpose"),
            "{forbidden}: {message}"
        );
        let set = server
            .rpc(
                V03,
                "tasks/pushNotificationConfig/set",
                v03_config(&v03_task, forbidden),
            )
            .await;
        assert_eq!(set["error"]["code"], json!(-32602), "{forbidden}: {set}");
        for version in [V1, V03] {
            let sent = server
                .rpc(
                    version,
                    send_method(version),
                    send_with_hook(version, "hi", None, forbidden),
                )
                .await;
            assert_eq!(sent["error"]["code"], json!(-32602), "{version}: {sent}");
        }
        let rest = rest_create("", &v1_task, json!({"url": forbidden}))
            .await
            .expect("sent");
        assert_eq!(rest.status().as_u16(), 400, "HTTP+JSON v1.0 {forbidden}");
        let rest = rest_create("v1/", &v03_task, v03_rest_body(&v03_task, forbidden))
            .await
            .expect("sent");
        assert_eq!(rest.status().as_u16(), 400, "HTTP+JSON v0.3 {forbidden}");
    }
    let listed = listed_configs(&server, &v1_task).await;
    assert_eq!(
        listed["result"]["configs"].as_array().map(Vec::len),
        Some(2),
        "nothing more stored: {listed}"
    );
    server.stop().await;
}

/// A principal with `push.max_pending_per_principal` notifications pending gets no
/// new config (a -32602 naming the limit, counted by a metric); what is pending is not
/// dropped, and once it is delivered new configs are accepted again.
#[actix_rt::test]
async fn a_principal_at_the_pending_cap_gets_no_new_config_and_keeps_its_pending() {
    if rerun_alone("push::a_principal_at_the_pending_cap_gets_no_new_config_and_keeps_its_pending")
    {
        return;
    }
    let receiver = Receiver::start(503, None).await;
    receiver.fail_next(usize::MAX);
    let server = start_echo_with(|c| {
        allow_loopback_with_fast_retries(c);
        c.push.max_pending_per_principal = 2;
    })
    .await;
    let sent = server
        .rpc(
            V1,
            "SendMessage",
            send_with_hook(V1, "hello", None, &receiver.url),
        )
        .await;
    let task_id = task_of(&sent)["id"].as_str().expect("a task").to_owned();
    // working and completed: two pending, the cap.
    let refused = server
        .rpc(
            V1,
            "CreateTaskPushNotificationConfig",
            v1_config(&task_id, &receiver.url),
        )
        .await;
    assert_eq!(refused["error"]["code"], json!(-32602), "{refused}");
    let message = refused["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("push.max_pending_per_principal"),
        "{message}"
    );
    let by_send = server
        .rpc(
            V1,
            "SendMessage",
            send_with_hook(V1, "again", None, &receiver.url),
        )
        .await;
    assert_eq!(by_send["error"]["code"], json!(-32602), "{by_send}");
    let refusals = r#"colloquy_push_refused_total{reason="pending_limit"}"#;
    assert_eq!(metric(&server, refusals).await, 2.0);
    // The receiver comes back: both pending notifications arrive, in order.
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    receiver.fail_next(0);
    let delivered = receiver.delivered(2).await;
    let states: Vec<String> = delivered.iter().map(Received::state).collect();
    assert_eq!(states, ["TASK_STATE_WORKING", "TASK_STATE_COMPLETED"]);
    let mut accepted = json!(null);
    for _ in 0..100 {
        accepted = server
            .rpc(
                V1,
                "CreateTaskPushNotificationConfig",
                v1_config(&task_id, &receiver.url),
            )
            .await;
        if accepted.get("result").is_some() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert!(accepted.get("result").is_some(), "{accepted}");
    server.stop().await;
    receiver.stop().await;
}

/// With notifications waiting for a receiver that asked to be left alone
/// (`Retry-After`), the worker reads nothing from the outbox until one is due: between
/// attempts `colloquy_push_scanned_total` (records read) does not move. A worker that reread
/// the pending list on every pass read them all again at least once a second.
#[actix_rt::test]
async fn an_idle_worker_reads_nothing_between_attempts() {
    if rerun_alone("push::an_idle_worker_reads_nothing_between_attempts") {
        return;
    }
    let receiver = Receiver::start(503, Some("60")).await;
    receiver.fail_next(usize::MAX);
    let server = start_echo_with(allow_loopback_with_fast_retries).await;
    let tasks = 10;
    for n in 0..tasks {
        let sent = server
            .rpc(
                V1,
                "SendMessage",
                send_with_hook(V1, &format!("hello {n}"), None, &receiver.url),
            )
            .await;
        assert!(sent.get("result").is_some(), "{sent}");
    }
    // Each task's first notification is tried once and waits a minute; the second waits
    // behind it.
    for _ in 0..200 {
        if receiver.all().len() >= tasks {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert_eq!(receiver.all().len(), tasks, "one attempt per task");
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    let before = metric(&server, "colloquy_push_scanned_total").await;
    assert!(before >= tasks as f64, "the attempts read them: {before}");
    tokio::time::sleep(std::time::Duration::from_secs(3)).await;
    let after = metric(&server, "colloquy_push_scanned_total").await;
    assert_eq!(after, before, "read while nothing was due");
    assert_eq!(receiver.all().len(), tasks, "nothing tried before its time");
    server.stop().await;
    receiver.stop().await;
}

/// A config registered without an id is the task's default config, id `default`: the next one
/// registered without an id replaces it rather than adding a second webhook (so a client that
/// sends its config with every turn is notified once per event), and v0.3's get names it so.
#[actix_rt::test]
async fn a_config_without_an_id_is_the_tasks_default_and_is_replaced() {
    let server = start_allowing_loopback().await;
    let task_id = new_task(&server, V1).await;
    for url in [HOOK, "http://127.0.0.1:10/second"] {
        let created = server
            .rpc(
                V1,
                "CreateTaskPushNotificationConfig",
                v1_config(&task_id, url),
            )
            .await;
        assert_eq!(created["result"]["id"], json!("default"), "{created}");
    }
    let listed = listed_configs(&server, &task_id).await;
    let configs = listed["result"]["configs"].as_array().expect("configs");
    assert_eq!(configs.len(), 1, "{listed}");
    assert_eq!(configs[0]["url"], json!("http://127.0.0.1:10/second"));

    let v03_task = new_task(&server, V03).await;
    let set = server
        .rpc(
            V03,
            "tasks/pushNotificationConfig/set",
            v03_config(&v03_task, HOOK),
        )
        .await;
    assert_eq!(
        set["result"]["pushNotificationConfig"]["id"],
        json!("default")
    );
    let got = server
        .rpc(
            V03,
            "tasks/pushNotificationConfig/get",
            json!({"id": v03_task, "pushNotificationConfigId": "default"}),
        )
        .await;
    assert_eq!(
        got["result"]["pushNotificationConfig"]["url"],
        json!(HOOK),
        "{got}"
    );
    server.stop().await;
}
