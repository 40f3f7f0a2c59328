//! The store commands on a stopped server's folder, and the health endpoints.

use crate::common;

use common::*;
use std::process::Command;

fn colloquy(args: &[&str], data: &std::path::Path) -> (bool, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_colloquy"))
        .args(args)
        .arg("--data")
        .arg(data)
        .output()
        .expect("colloquy runs");
    let mut text = String::from_utf8_lossy(&output.stdout).into_owned();
    text.push_str(&String::from_utf8_lossy(&output.stderr));
    (output.status.success(), text)
}

#[actix_rt::test]
async fn conversations_history_and_delete_on_the_data_folder() {
    let server = start_echo().await;
    for (text, context_id) in [
        ("first of a", "tenant/a"),
        ("first of b", "tenanta"),
        ("second of a", "tenant/a"),
    ] {
        server.send_text(V1, text, Some(context_id), None).await;
        next_millisecond().await;
    }
    let health = server
        .client
        .get(format!("{}healthz", server.url))
        .send()
        .await
        .unwrap();
    assert_eq!(health.status().as_u16(), 200);
    let ready = server
        .client
        .get(format!("{}readyz", server.url))
        .send()
        .await
        .unwrap();
    assert_eq!(ready.status().as_u16(), 200);
    let get_root = server.client.get(&server.url).send().await.unwrap();
    assert_eq!(get_root.status().as_u16(), 405);
    let dir = server.stop().await;

    let (ok, listed) = colloquy(&["conversations"], dir.path());
    assert!(ok, "{listed}");
    let a = listed.find("tenant/a").expect("tenant/a listed");
    let b = listed.find("tenanta").expect("tenanta listed");
    assert!(a < b, "newest first:\n{listed}");
    assert!(listed.contains("(2 of 2 conversations)"));

    let (ok, history) = colloquy(&["history", "tenant/a"], dir.path());
    assert!(ok, "{history}");
    assert!(history.contains("user: first of a") && history.contains("user: second of a"));
    assert!(history.contains("agent: echo: second of a (turn 2; previously: \"first of a\")"));
    assert!(!history.contains("first of b"));

    let (ok, out) = colloquy(&["delete", "tenant/a"], dir.path());
    assert!(ok, "{out}");
    let (ok, listed) = colloquy(&["conversations"], dir.path());
    assert!(ok);
    assert!(!listed.contains("tenant/a") && listed.contains("tenanta"));
    let (ok, out) = colloquy(&["history", "tenant/a"], dir.path());
    assert!(!ok && out.contains("no conversation"), "{out}");
    let (ok, out) = colloquy(
        &["history", "tenanta", "--principal", "someone-else"],
        dir.path(),
    );
    assert!(
        !ok && out.contains("no conversation"),
        "another principal sees nothing: {out}"
    );
}
