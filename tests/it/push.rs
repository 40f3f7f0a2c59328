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
    let listed = server
        .rpc(
            V1,
            "ListTaskPushNotificationConfigs",
            json!({"taskId": task_id}),
        )
        .await;
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
    let listed = server
        .rpc(
            V1,
            "ListTaskPushNotificationConfigs",
            json!({"taskId": task_id}),
        )
        .await;
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
    for _ in 0..2 {
        let created = call(
            "alice-secret",
            "CreateTaskPushNotificationConfig",
            v1_config(&task_id, HOOK),
        )
        .await;
        assert!(created.get("result").is_some(), "{created}");
    }
    let third = call(
        "alice-secret",
        "CreateTaskPushNotificationConfig",
        v1_config(&task_id, HOOK),
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
        let refused = server
            .rpc(
                V1,
                "CreateTaskPushNotificationConfig",
                v1_config(&task_id, url),
            )
            .await;
        assert_eq!(refused["error"]["code"], json!(-32602), "{url}: {refused}");
        assert!(
            refused["error"]["message"]
                .as_str()
                .unwrap()
                .starts_with("invalid params: url:"),
            "{url}: {refused}"
        );
    }
    let listed = server
        .rpc(
            V1,
            "ListTaskPushNotificationConfigs",
            json!({"taskId": task_id}),
        )
        .await;
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
    let listed = server
        .rpc(
            V1,
            "ListTaskPushNotificationConfigs",
            json!({"taskId": task_id}),
        )
        .await;
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
