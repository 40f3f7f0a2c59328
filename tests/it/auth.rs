//! Bearer tokens, principals and isolation.

use crate::common;

use common::*;
use serde_json::{Value, json};
use std::sync::Arc;

async fn call(
    server: &TestServer,
    token: Option<&str>,
    method: &str,
    params: Value,
) -> (u16, Option<String>, Value) {
    call_url(&server.client, &server.url, token, method, params).await
}

/// One JSON-RPC call to `url`: the status, the WWW-Authenticate challenge and the body.
async fn call_url(
    client: &reqwest::Client,
    url: &str,
    token: Option<&str>,
    method: &str,
    params: Value,
) -> (u16, Option<String>, Value) {
    let mut request = client
        .post(url)
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
    // No token (an empty bearer is none) is challenged plainly; a wrong one as RFC 6750's
    // invalid_token.
    for (token, expected) in [
        (None, "Bearer"),
        (Some(""), "Bearer"),
        (Some("wrong"), "Bearer error=\"invalid_token\""),
    ] {
        let (status, challenge, body) = call(&server, token, "SendMessage", send("hi", "c")).await;
        assert_eq!(status, 401, "{token:?}");
        assert_eq!(challenge.as_deref(), Some(expected), "{token:?}");
        assert_eq!(body["error"]["code"], json!(-32014), "{token:?}");
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
        colloquy::app::start(config, Arc::new(colloquy::agent::EchoAgent::default())).await;
    let message = refused.err().map(|e| e.to_string()).unwrap_or_default();
    assert!(message.contains("--allow-unauthenticated"), "{message}");
}

/// Starts the server in-process with `tweak`ed config; returns why it refused to start.
async fn in_process_refusal(tweak: impl FnOnce(&mut colloquy::config::Config)) -> String {
    let dir = tempfile::tempdir().unwrap();
    let mut config = test_config(dir.path());
    tweak(&mut config);
    match colloquy::app::start(config, Arc::new(colloquy::agent::EchoAgent::default())).await {
        Ok(server) => {
            server.stop().await;
            panic!("the server started");
        }
        Err(e) => e.to_string(),
    }
}

/// A `colloquy serve` child with `COLLOQUY_TOKENS` and optionally a TOML config file.
fn serve_command(
    dir: &std::path::Path,
    listen: &str,
    env_tokens: &str,
    toml: Option<&str>,
) -> tokio::process::Command {
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_colloquy"));
    command
        .args([
            "serve",
            "--grpc-listen",
            "127.0.0.1:0",
            "--listen",
            listen,
            "--data",
        ])
        .arg(dir.join("data"))
        .env("COLLOQUY_TOKENS", env_tokens)
        .env("RUST_LOG", "warn")
        .kill_on_drop(true);
    if let Some(toml) = toml {
        let file = dir.join("colloquy.toml");
        std::fs::write(&file, toml).unwrap();
        command.arg("--config").arg(file);
    }
    command
}

/// Runs `colloquy serve` and returns its stderr, asserting it refused to start.
async fn binary_refusal(env_tokens: &str, toml: Option<&str>) -> String {
    let dir = tempfile::tempdir().unwrap();
    let output = serve_command(dir.path(), "127.0.0.1:0", env_tokens, toml).output();
    let output = tokio::time::timeout(std::time::Duration::from_secs(60), output)
        .await
        .expect("a refused start exits at once")
        .unwrap();
    assert!(!output.status.success(), "the server started");
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// The message names the problem and the principals, and shows neither the token nor its digest.
fn assert_names(message: &str, problem: &str, principals: &[&str], token: &str) {
    assert!(message.contains(problem), "{problem:?} not in {message:?}");
    for principal in principals {
        assert!(
            message.contains(&format!("{principal:?}")),
            "{principal} not in {message:?}"
        );
    }
    assert!(!message.contains(token), "the token leaked: {message:?}");
    let hex_digest = hex::encode(colloquy::http::token_digest(token));
    assert!(
        !message.contains(&hex_digest),
        "the digest leaked: {message:?}"
    );
}

#[actix_rt::test]
async fn a_token_given_to_two_principals_is_refused_whatever_its_sources() {
    let token = "shared-7f3a9c";
    let message = binary_refusal(&format!("alice:{token},bob:{token}"), None).await;
    assert_names(&message, "same token", &["alice", "bob"], token);
    assert!(message.contains("COLLOQUY_TOKENS"), "{message}");

    let toml = format!("[auth.tokens]\nalice = \"{token}\"\n");
    let message = binary_refusal(&format!("bob:{token}"), Some(&toml)).await;
    assert_names(&message, "same token", &["alice", "bob"], token);
    assert!(message.contains("[auth.tokens]"), "{message}");

    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("tokens");
    let line = format!("bob:{}\n", hex::encode(colloquy::http::token_digest(token)));
    std::fs::write(&file, line).unwrap();
    let message = in_process_refusal(|c| {
        c.auth.tokens.insert("alice".into(), token.into());
        c.auth.tokens_file = Some(file.clone());
    })
    .await;
    assert_names(&message, "same token", &["alice", "bob"], token);
    assert!(message.contains("tokens_file"), "{message}");
}

#[actix_rt::test]
async fn empty_tokens_and_empty_principals_are_refused() {
    let message = binary_refusal("alice:", None).await;
    assert_names(&message, "empty token", &["alice"], "\0");
    let message = binary_refusal("alice:   ,bob:b-token", None).await;
    assert_names(&message, "empty token", &["alice"], "b-token");
    let message = binary_refusal(":orphan-5e1d", None).await;
    assert_names(&message, "empty principal", &[], "orphan-5e1d");

    let message = in_process_refusal(|c| {
        c.auth.tokens.insert("alice".into(), String::new());
    })
    .await;
    assert_names(&message, "empty token", &["alice"], "\0");
    let message = in_process_refusal(|c| {
        c.auth.tokens.insert(" ".into(), "orphan-5e1d".into());
    })
    .await;
    assert_names(&message, "empty principal", &[], "orphan-5e1d");

    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("tokens");
    let line = format!("carol:{}\n", hex::encode(colloquy::http::token_digest("")));
    std::fs::write(&file, line).unwrap();
    let message = in_process_refusal(|c| c.auth.tokens_file = Some(file.clone())).await;
    assert_names(&message, "empty token", &["carol"], "\0");
    assert!(message.contains("line 1"), "{message}");
}

#[actix_rt::test]
async fn distinct_tokens_from_every_source_each_reach_their_principal() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("tokens");
    let line = format!(
        "bob:{}\n",
        hex::encode(colloquy::http::token_digest("b-tok"))
    );
    std::fs::write(&file, line).unwrap();
    let toml = format!(
        "[auth]\ntokens_file = {:?}\n[auth.tokens]\nalice = \"a-tok\"\n",
        file.display().to_string()
    );
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let listen = format!("127.0.0.1:{port}");
    // alice again with her own token: one principal listed twice is not a conflict.
    let env_tokens = "carol:c-tok, dave:d-tok, alice:a-tok";
    let mut child = serve_command(dir.path(), &listen, env_tokens, Some(&toml))
        .spawn()
        .expect("colloquy starts");
    let server_url = format!("http://{listen}/");
    let client = reqwest::Client::new();
    let mut up = false;
    for _ in 0..400 {
        if client
            .get(format!("{server_url}healthz"))
            .send()
            .await
            .is_ok()
        {
            up = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    }
    assert!(up, "colloquy did not come up");
    let send_as = |token: &'static str, text: &str| {
        call_url(
            &client,
            &server_url,
            Some(token),
            "SendMessage",
            send(text, "same-id"),
        )
    };
    for (token, principal) in [
        ("a-tok", "alice"),
        ("b-tok", "bob"),
        ("c-tok", "carol"),
        ("d-tok", "dave"),
    ] {
        let (status, _, body) = send_as(token, principal).await;
        assert_eq!(status, 200, "{principal}: {body}");
        // The same contextId is a first turn for each: every token reached its own principal.
        assert_eq!(
            artifact_text(task_of(&body)),
            format!("echo: {principal} (turn 1)")
        );
    }
    let (status, _, _) = send_as("e-tok", "stranger").await;
    assert_eq!(status, 401);
    child.kill().await.unwrap();
}

#[actix_rt::test]
async fn two_authorization_headers_are_refused_not_guessed() {
    let server = start_with_tokens().await;
    // Alice's token first and a wrong one after, and the other way round: neither is picked.
    for (first, second) in [("alice-secret", "wrong"), ("wrong", "alice-secret")] {
        let headers = || {
            let mut headers = reqwest::header::HeaderMap::new();
            for token in [first, second] {
                headers.append(
                    "Authorization",
                    format!("Bearer {token}").parse().expect("header"),
                );
            }
            headers
        };
        let response = server
            .client
            .post(&server.url)
            .header("A2A-Version", V1)
            .headers(headers())
            .json(&json!({"jsonrpc": "2.0", "id": 1, "method": "SendMessage",
                "params": send("which of us?", "twice")}))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 400);
        let body: Value = response.json().await.unwrap();
        assert_eq!(body["error"]["code"], -32600, "{body}");
        let message = body["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains("2 Authorization headers"), "{body}");

        let rest = server
            .client
            .post(format!("{}message:send", server.url))
            .headers(headers())
            .json(&send("which of us?", "twice"))
            .send()
            .await
            .unwrap();
        assert_eq!(rest.status(), 400, "HTTP+JSON");
    }
    // Nothing was stored under either principal.
    let (_, _, listed) = call(&server, Some("alice-secret"), "ListTasks", json!({})).await;
    assert_eq!(listed["result"]["tasks"], json!([]), "{listed}");
    server.stop().await;
}
