//! Bearer tokens, principals and isolation.

mod common;

use common::*;
use serde_json::{Value, json};
use std::sync::Arc;

async fn start_with_tokens() -> TestServer {
    start_with(Arc::new(colloquy::agent::EchoAgent::default()), |c| {
        c.auth.tokens.insert("alice".into(), "alice-secret".into());
        c.auth.tokens.insert("bob".into(), "bob-secret".into());
    })
    .await
}

async fn call(
    server: &TestServer,
    token: Option<&str>,
    method: &str,
    params: Value,
) -> (u16, Option<String>, Value) {
    let mut request = server
        .client
        .post(&server.url)
        .header("A2A-Version", V1)
        .json(&json!({"jsonrpc": "2.0", "id": next_id(), "method": method, "params": params}));
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    let challenge = response
        .headers()
        .get("www-authenticate")
        .map(|v| v.to_str().unwrap().to_owned());
    (status, challenge, response.json().await.unwrap())
}

fn send(text: &str, context_id: &str) -> Value {
    json!({"message": user_message(V1, text, Some(context_id), None)})
}

#[actix_rt::test]
async fn missing_or_wrong_tokens_get_401_with_a_json_rpc_body() {
    let server = start_with_tokens().await;
    for token in [None, Some("wrong"), Some("")] {
        let (status, challenge, body) = call(&server, token, "SendMessage", send("hi", "c")).await;
        assert_eq!(status, 401);
        assert_eq!(challenge.as_deref(), Some("Bearer"));
        assert_eq!(body["error"]["code"], json!(-32014));
    }
    // Nothing was stored by the refused requests.
    let (_, _, listed) = call(
        &server,
        Some("alice-secret"),
        "colloquy/listConversations",
        json!({}),
    )
    .await;
    assert_eq!(listed["result"]["conversations"], json!([]));
    // The card stays public and advertises the scheme.
    let card = server.card(&[]).await;
    assert_eq!(card["securitySchemes"]["bearer"]["scheme"], "bearer");
    server.stop().await;
}

#[actix_rt::test]
async fn principals_are_isolated() {
    let server = start_with_tokens().await;
    let (_, _, alice) = call(
        &server,
        Some("alice-secret"),
        "SendMessage",
        send("alice's secret plan", "shared-id"),
    )
    .await;
    let (_, _, bob) = call(
        &server,
        Some("bob-secret"),
        "SendMessage",
        send("bob's idea", "shared-id"),
    )
    .await;
    assert_eq!(
        artifact_text(task_of(&bob)),
        "echo: bob's idea (turn 1)",
        "the same contextId is another conversation"
    );
    let (_, _, alice_again) = call(
        &server,
        Some("alice-secret"),
        "SendMessage",
        send("again", "shared-id"),
    )
    .await;
    assert!(artifact_text(task_of(&alice_again)).contains("previously: \"alice's secret plan\""));

    let alice_task = task_of(&alice)["id"].as_str().unwrap().to_owned();
    for method in ["GetTask", "CancelTask", "SubscribeToTask"] {
        let (_, _, response) = call(
            &server,
            Some("bob-secret"),
            method,
            json!({"id": alice_task}),
        )
        .await;
        assert_eq!(response["error"]["code"], json!(-32001), "{method}");
    }
    let answer = json!({"message": user_message(V1, "hijack", None, Some(&alice_task))});
    let (_, _, response) = call(&server, Some("bob-secret"), "SendMessage", answer).await;
    assert_eq!(response["error"]["code"], json!(-32001));

    let (_, _, tasks) = call(&server, Some("bob-secret"), "ListTasks", json!({})).await;
    assert_eq!(tasks["result"]["tasks"].as_array().unwrap().len(), 1);
    let (_, _, tasks) = call(
        &server,
        Some("alice-secret"),
        "ListTasks",
        json!({"contextId": "shared-id"}),
    )
    .await;
    assert_eq!(tasks["result"]["tasks"].as_array().unwrap().len(), 2);
    let (_, _, history) = call(
        &server,
        Some("bob-secret"),
        "colloquy/getConversation",
        json!({"contextId": "shared-id"}),
    )
    .await;
    let texts = conversation_texts(&history);
    assert_eq!(texts.len(), 2);
    assert!(texts.iter().all(|t| !t.contains("alice")));
    server.stop().await;
}

#[actix_rt::test]
async fn hashed_tokens_file_and_environment_style_pairs() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("tokens");
    std::fs::write(
        &file,
        format!(
            "# principal:sha256\ncarol:{}\n",
            hex::encode(colloquy::http::token_digest("carol-secret"))
        ),
    )
    .unwrap();
    let server = start_with(Arc::new(colloquy::agent::EchoAgent::default()), |c| {
        c.auth.tokens_file = Some(file.clone())
    })
    .await;
    let (status, _, _) = call(
        &server,
        Some("carol-secret"),
        "SendMessage",
        send("hi", "c"),
    )
    .await;
    assert_eq!(status, 200);
    let (status, _, _) = call(&server, Some("carol"), "SendMessage", send("hi", "c")).await;
    assert_eq!(status, 401);
    server.stop().await;
}

#[actix_rt::test]
async fn no_tokens_and_a_public_address_refuses_to_start() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = test_config(dir.path());
    config.listen = "0.0.0.0:0".into();
    let refused =
        colloquy::http::start(config, Arc::new(colloquy::agent::EchoAgent::default())).await;
    let message = refused.err().map(|e| e.to_string()).unwrap_or_default();
    assert!(message.contains("--allow-unauthenticated"), "{message}");
}
