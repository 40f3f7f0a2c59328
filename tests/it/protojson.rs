//! v1.0 input under ProtoJSON's original field names (`history_length`, `context_id`, …) means
//! what the JSON names mean; a field given both ways is an error naming it; output keeps the
//! JSON names.

use crate::common;

use common::*;
use serde_json::{Value, json};

fn history_len(task: &Value) -> usize {
    task["history"].as_array().map_or(0, Vec::len)
}

#[actix_rt::test]
async fn get_task_with_history_length_under_its_proto_name_trims_the_history() {
    let server = start_echo().await;
    let sent = server.send_text(V1, "one", Some("pj-get"), None).await;
    let task_id = task_of(&sent)["id"].as_str().unwrap().to_owned();
    let full = server.rpc(V1, "GetTask", json!({"id": task_id})).await;
    assert!(history_len(&full["result"]) >= 2, "{full}");
    let trimmed = server
        .rpc(V1, "GetTask", json!({"id": task_id, "history_length": 1}))
        .await;
    assert_eq!(history_len(&trimmed["result"]), 1, "{trimmed}");
    assert_eq!(
        trimmed["result"]["history"][0],
        full["result"]["history"]
            .as_array()
            .unwrap()
            .last()
            .unwrap()
            .clone()
    );
    // Output keeps the JSON names.
    assert!(trimmed["result"]["contextId"].is_string(), "{trimmed}");
    assert!(trimmed["result"].get("context_id").is_none(), "{trimmed}");
    server.stop().await;
}

#[actix_rt::test]
async fn list_tasks_with_context_id_under_its_proto_name_filters() {
    let server = start_echo().await;
    server.send_text(V1, "a", Some("pj-one"), None).await;
    server.send_text(V1, "b", Some("pj-one"), None).await;
    server.send_text(V1, "c", Some("pj-other"), None).await;
    let listed = server
        .rpc(
            V1,
            "ListTasks",
            json!({"context_id": "pj-one", "page_size": 1, "include_artifacts": true}),
        )
        .await;
    let result = &listed["result"];
    let tasks = result["tasks"].as_array().expect("tasks");
    assert_eq!(tasks.len(), 1, "page_size: {listed}");
    assert_eq!(
        result["totalSize"],
        json!(2),
        "context_id filters: {listed}"
    );
    assert_eq!(tasks[0]["contextId"], json!("pj-one"));
    assert!(
        tasks[0]["artifacts"].is_array(),
        "include_artifacts: {listed}"
    );
    assert!(
        result["nextPageToken"]
            .as_str()
            .is_some_and(|t| !t.is_empty())
    );
    server.stop().await;
}

#[actix_rt::test]
async fn send_message_reads_proto_names_in_the_message_and_its_configuration() {
    let server = start_echo().await;
    let message = json!({
        "message_id": "pj-m1",
        "role": "ROLE_USER",
        "context_id": "pj-send",
        "parts": [{"text": "hello", "media_type": "text/plain"}],
        "reference_task_ids": [],
        "metadata": {"left_alone": true}
    });
    let sent = server
        .rpc(
            V1,
            "SendMessage",
            json!({"message": message, "configuration": {"history_length": 0, "return_immediately": false}}),
        )
        .await;
    let task = task_of(&sent);
    assert_eq!(task["contextId"], json!("pj-send"), "{sent}");
    assert_eq!(
        history_len(task),
        0,
        "history_length 0 omits the history: {sent}"
    );
    assert_eq!(state_of_task(task), "TASK_STATE_COMPLETED");
    // Continue the task's conversation under proto names too.
    let task_id = task["id"].as_str().unwrap().to_owned();
    let got = server.rpc(V1, "GetTask", json!({"id": task_id})).await;
    let first = &got["result"]["history"][0];
    assert_eq!(first["messageId"], json!("pj-m1"), "{got}");
    assert_eq!(
        first["metadata"],
        json!({"left_alone": true}),
        "metadata keys are data"
    );
    server.stop().await;
}

fn state_of_task(task: &Value) -> &str {
    task["status"]["state"].as_str().unwrap_or("")
}

#[actix_rt::test]
async fn a_field_given_both_ways_is_an_error_naming_it() {
    let server = start_echo().await;
    let cases = [
        (
            "GetTask",
            json!({"id": "x", "historyLength": 1, "history_length": 2}),
            "historyLength",
        ),
        (
            "ListTasks",
            json!({"contextId": "a", "context_id": "b"}),
            "contextId",
        ),
        (
            "SendMessage",
            json!({"message": {"messageId": "m", "message_id": "m", "role": "ROLE_USER", "parts": [{"text": "x"}]}}),
            "message.messageId",
        ),
    ];
    for (method, params, field) in cases {
        let response = server.rpc(V1, method, params).await;
        assert_eq!(
            response["error"]["code"],
            json!(-32602),
            "{method}: {response}"
        );
        let message = response["error"]["message"].as_str().unwrap_or("");
        assert!(
            message.contains(field),
            "{method}: {message} should name {field}"
        );
    }
    server.stop().await;
}
