//! Interoperability with the official Python SDK clients (`a2a-sdk` 0.3.x and 1.x), each in its
//! own venv, against the real server: a three-turn conversation reusing the returned contextId,
//! a task lookup, a listing (1.x), blocking and streaming; the 1.x client on JSON-RPC, HTTP+JSON
//! and gRPC.

use crate::common;

use common::*;

async fn client_run(venv: &str, script: &str, mode: &str) {
    client_run_with(venv, script, &["--mode", mode]).await;
}

async fn client_run_with(venv: &str, script: &str, args: &[&str]) {
    let server = start_echo().await;
    let url = server.url.trim_end_matches('/').to_owned();
    let mode = args.join(" ");
    let mut all_args = vec!["--url", url.as_str()];
    all_args.extend_from_slice(args);
    let (ok, output) = run_sdk_script(venv, script, &all_args).await;
    println!("{output}");
    assert!(ok, "{script} {mode} failed:\n{output}");
    assert!(output.contains("INTEROP OK"), "{output}");
    server.stop().await;
}

#[actix_rt::test]
async fn sdk_1x_blocking() {
    client_run("sdk1", "client1.py", "blocking").await;
}

#[actix_rt::test]
async fn sdk_1x_streaming() {
    client_run("sdk1", "client1.py", "streaming").await;
}

/// The 1.x client's HTTP+JSON transport (`RestTransport`), chosen from the card's interfaces.
#[actix_rt::test]
async fn sdk_1x_rest_blocking() {
    client_run_with(
        "sdk1",
        "client1.py",
        &["--mode", "blocking", "--binding", "rest"],
    )
    .await;
}

#[actix_rt::test]
async fn sdk_1x_rest_streaming() {
    client_run_with(
        "sdk1",
        "client1.py",
        &["--mode", "streaming", "--binding", "rest"],
    )
    .await;
}

/// The 1.x client's gRPC transport (`GrpcTransport`, `a2a-sdk[grpc]`), chosen from the card.
#[actix_rt::test]
async fn sdk_1x_grpc_blocking() {
    client_run_with(
        "sdk1",
        "client1.py",
        &["--mode", "blocking", "--binding", "grpc"],
    )
    .await;
}

#[actix_rt::test]
async fn sdk_1x_grpc_streaming() {
    client_run_with(
        "sdk1",
        "client1.py",
        &["--mode", "streaming", "--binding", "grpc"],
    )
    .await;
}

#[actix_rt::test]
async fn sdk_03_blocking() {
    client_run("sdk03", "client03.py", "blocking").await;
}

#[actix_rt::test]
async fn sdk_03_streaming() {
    client_run("sdk03", "client03.py", "streaming").await;
}

/// The 0.3.x client's HTTP+JSON transport: v0.3's `/v1/...` routes, from the card's
/// `additionalInterfaces`.
#[actix_rt::test]
async fn sdk_03_rest_blocking() {
    client_run_with(
        "sdk03",
        "client03.py",
        &["--mode", "blocking", "--binding", "rest"],
    )
    .await;
}

#[actix_rt::test]
async fn sdk_03_rest_streaming() {
    client_run_with(
        "sdk03",
        "client03.py",
        &["--mode", "streaming", "--binding", "rest"],
    )
    .await;
}
