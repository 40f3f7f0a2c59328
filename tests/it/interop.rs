//! Interoperability with the official Python SDK clients (`a2a-sdk` 0.3.x and 1.x), each in its
//! own venv, against the real server: a three-turn conversation reusing the returned contextId,
//! a task lookup, a listing (1.x), blocking and streaming.

use crate::common;

use common::*;

async fn client_run(venv: &str, script: &str, mode: &str) {
    let server = start_echo().await;
    let url = server.url.trim_end_matches('/').to_owned();
    let (ok, output) = run_sdk_script(venv, script, &["--url", &url, "--mode", mode]).await;
    println!("{output}");
    assert!(ok, "{script} --mode {mode} failed:\n{output}");
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

#[actix_rt::test]
async fn sdk_03_blocking() {
    client_run("sdk03", "client03.py", "blocking").await;
}

#[actix_rt::test]
async fn sdk_03_streaming() {
    client_run("sdk03", "client03.py", "streaming").await;
}
