//! The load generator spreads its conversations over several endpoints (`--url a,b`).

use crate::common::*;
use serde_json::{Value, json};

async fn conversations_on(server: &TestServer) -> usize {
    let listed = server
        .rpc(V1, "colloquy/listConversations", json!({"pageSize": 100}))
        .await;
    listed["result"]["conversations"]
        .as_array()
        .map_or(0, Vec::len)
}

#[actix_rt::test]
async fn loadgen_spreads_conversations_over_several_urls() {
    let (a, b) = (start_echo().await, start_echo().await);
    let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_colloquy"))
        .args(["loadgen", "--url", &format!("{},{}", a.url, b.url)])
        .args(["--conversations", "4", "--turns", "2", "--total", "6"])
        .args(["--text-bytes", "40", "--version", "1.0", "--json"])
        .output()
        .await
        .expect("loadgen runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let report: Value =
        serde_json::from_str(stdout.lines().last().unwrap_or_default()).expect("a JSON report");
    assert_eq!(report["turns_ok"], json!(12), "{report}");
    assert_eq!(report["errors"], json!({}), "{report}");
    // Conversation n on the (n mod 2)-th URL: three on each.
    assert_eq!(conversations_on(&a).await, 3);
    assert_eq!(conversations_on(&b).await, 3);
    a.stop().await;
    b.stop().await;
}
