//! Each node of a cluster counts its own leases and forwarded requests (`/metrics`): exact
//! counts, read from `colloquy serve` child processes (the in-process servers of this test
//! binary share one recorder).

use crate::cluster::ChildNode;
use crate::common::*;
use serde_json::json;
use std::time::{Duration, Instant};

async fn metric(node: &ChildNode, name: &str) -> f64 {
    let text = reqwest::get(format!("{}metrics", node.url))
        .await
        .expect("metrics")
        .text()
        .await
        .expect("metrics text");
    text.lines()
        .find_map(|line| {
            let (series, value) = line.split_once(' ')?;
            (series == name).then(|| value.trim().parse().ok())?
        })
        .unwrap_or_else(|| panic!("no {name} in {text}"))
}

async fn rpc(node: &ChildNode, method: &str, params: serde_json::Value) -> serde_json::Value {
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params});
    post_rpc(&reqwest::Client::new(), &node.url, V1, &body).await
}

#[actix_rt::test]
async fn each_node_counts_its_leases_taken_and_expired_and_its_forwarded_requests() {
    let Some(url) = pg::database("cluster_metrics::each_node_counts") else {
        return;
    };
    let secret = [(
        "COLLOQUY_CLUSTER__SECRET",
        "between the nodes, 32 bytes or more",
    )];
    let doomed = ChildNode::start_with_env(&url, 2, 60_000, &secret).await;
    let other = ChildNode::start_with_env(&url, 2, 0, &secret).await;
    let task_id = doomed.send_immediately("never answered", "counted").await;
    // A live read through the other node is passed on to the one running the task.
    let live = rpc(&other, "GetTask", json!({"id": task_id})).await;
    assert_eq!(
        live["result"]["status"]["state"],
        json!("TASK_STATE_WORKING"),
        "{live}"
    );
    assert_eq!(
        metric(&other, "colloquy_forwarded_requests_total").await,
        1.0
    );
    assert_eq!(
        metric(&doomed, "colloquy_forwarded_requests_total").await,
        0.0
    );
    assert_eq!(metric(&doomed, "colloquy_leases_taken_total").await, 1.0);

    doomed.signal(libc::SIGKILL);
    let started = Instant::now();
    loop {
        let sent = rpc(
            &other,
            "SendMessage",
            json!({"message":
            user_message(V1, "after the lease", Some("counted"), None)}),
        )
        .await;
        if sent["error"]["code"] != json!(-32010) {
            assert!(sent.get("result").is_some(), "{sent}");
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(30), "{sent}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The dead node's expired lease was found by this node (its next turn or its sweeper).
    assert_eq!(metric(&other, "colloquy_leases_expired_total").await, 1.0);
    assert_eq!(metric(&other, "colloquy_leases_taken_total").await, 1.0);
    assert_eq!(metric(&other, "colloquy_leases_lost_total").await, 0.0);
}

/// A new task's turn without push configs is started and ended in one round trip each; a task
/// with push configs ends the general way.
#[actix_rt::test]
async fn turns_without_push_configs_take_the_one_round_trip_path() {
    let Some(url) = pg::database("cluster_metrics::one_round_trip_path") else {
        return;
    };
    let node = ChildNode::start_with_env(
        &url,
        5,
        0,
        &[("COLLOQUY_PUSH__ALLOW_PRIVATE_NETWORKS", "true")],
    )
    .await;
    for text in ["one", "two", "three"] {
        let sent = rpc(
            &node,
            "SendMessage",
            json!({"message": user_message(V1, text, Some("quick"), None)}),
        )
        .await;
        assert_eq!(
            task_of(&sent)["status"]["state"],
            json!("TASK_STATE_COMPLETED"),
            "{sent}"
        );
    }
    assert_eq!(metric(&node, "colloquy_leases_taken_total").await, 3.0);
    assert_eq!(
        metric(&node, "colloquy_store_general_turn_steps_total").await,
        0.0
    );
    // A send that registers a config: its start stores the config, its end builds notifications.
    let sent = rpc(
        &node,
        "SendMessage",
        json!({"message": user_message(V1, "four", Some("quick"), None),
               "configuration": {"taskPushNotificationConfig": {"url": "http://127.0.0.1:9/hook"}}}),
    )
    .await;
    assert_eq!(
        task_of(&sent)["status"]["state"],
        json!("TASK_STATE_COMPLETED"),
        "{sent}"
    );
    assert_eq!(
        metric(&node, "colloquy_store_general_turn_steps_total").await,
        2.0
    );
}
