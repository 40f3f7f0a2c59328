//! The exec backend end to end: a real server on port 0, real sled, test programs in tests/fixtures.

use crate::common;

use colloquy::config::Config;
use common::*;
use serde_json::{Value, json};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// The real python3 binary (not a version-manager shim, which would need more environment).
fn python() -> String {
    static PYTHON: OnceLock<String> = OnceLock::new();
    PYTHON
        .get_or_init(|| {
            let out = std::process::Command::new("python3")
                .args(["-c", "import sys; print(sys.executable)"])
                .output()
                .expect("python3 runs");
            String::from_utf8(out.stdout)
                .expect("utf-8")
                .trim()
                .to_owned()
        })
        .clone()
}

fn fixture(name: &str) -> String {
    format!("{}/tests/fixtures/{name}", env!("CARGO_MANIFEST_DIR"))
}

async fn exec_server(command: Vec<String>, tweak: impl Fn(&mut Config)) -> TestServer {
    let mut config = Config::default();
    config.agent.kind = "exec".into();
    config.agent.command = command;
    tweak(&mut config);
    let agent = colloquy::cli::build_agent(&config).expect("exec agent builds");
    let agent_config = config.agent.clone();
    start_with(agent, move |c| c.agent = agent_config).await
}

async fn python_server(tweak: impl Fn(&mut Config)) -> TestServer {
    exec_server(vec![python(), fixture("exec_agent.py")], tweak).await
}

#[actix_rt::test]
async fn each_kind_of_output_line() {
    let server = python_server(|_| {}).await;

    let response = server.send_text(V1, "kinds", Some("kinds-1"), None).await;
    let task = task_of(&response);
    assert_eq!(
        task["status"]["state"], "TASK_STATE_COMPLETED",
        "{response}"
    );
    assert_eq!(status_text(task), "all done");
    // JSON text chunks, non-JSON lines (newline kept), JSON that is not an object, a last line
    // without a newline: all reply text, in order.
    let expected = "aplain line\n42\nbtail";
    assert_eq!(reply_text(task), expected);
    let extra = task["artifacts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["name"] == "extra")
        .unwrap_or_else(|| panic!("no extra artifact: {task}"));
    assert_eq!(extra["parts"], json!([{"text": "art"}, {"data": {"k": 1}}]));
    let stored = server.stored_messages(V1, "kinds-1").await;
    assert_eq!(stored.len(), 2);
    assert_eq!(message_text(&stored[1]), expected);

    // Streamed: the chunks a client receives add up to the same reply.
    let events = stream_results(&server, "kinds", "kinds-2").await;
    assert_eq!(reply_chunks(&events).concat(), expected, "{events:?}");
    let last = events.last().unwrap();
    assert_eq!(
        last["statusUpdate"]["status"]["state"],
        "TASK_STATE_COMPLETED"
    );

    // `{"message"}` as the only output: a plain Message answer.
    let response = server.send_text(V1, "message", Some("kinds-3"), None).await;
    let message = &response["result"]["message"];
    assert_eq!(message_text(message), "just a message", "{response}");
    assert_eq!(message["role"], "ROLE_AGENT");

    // input-required: the status text is the question; the task waits.
    let response = server.send_text(V1, "ask", Some("kinds-4"), None).await;
    let task = task_of(&response);
    assert_eq!(
        task["status"]["state"], "TASK_STATE_INPUT_REQUIRED",
        "{response}"
    );
    assert_eq!(status_text(task), "which one?");
    assert_eq!(reply_text(task), "partial");

    // A program that reports its own rejection keeps its message, whatever its exit code.
    let response = server.send_text(V1, "refuse", Some("kinds-5"), None).await;
    let task = task_of(&response);
    assert_eq!(task["status"]["state"], "TASK_STATE_REJECTED", "{response}");
    assert_eq!(status_text(task), "not allowed");

    server.stop().await;
}

#[actix_rt::test]
async fn input_object_history_and_environment() {
    let server = python_server(|c| c.agent.env = vec!["HOME".into()]).await;
    let first = server
        .send_text(V1, "dump first", Some("dump-ctx"), None)
        .await;
    let first_task = task_of(&first).clone();
    let second = server
        .send_text(V1, "dump second", Some("dump-ctx"), None)
        .await;
    let task = task_of(&second);
    assert_eq!(task["status"]["state"], "TASK_STATE_COMPLETED", "{second}");
    let input: Value = serde_json::from_str(&reply_text(task)).expect("the dumped input");

    assert_eq!(input["version"], 1);
    assert_eq!(input["contextId"], "dump-ctx");
    assert_eq!(input["taskId"], task["id"]);
    assert_eq!(input["message"]["role"], "ROLE_USER");
    assert_eq!(input["message"]["parts"], json!([{"text": "dump second"}]));
    assert_eq!(input["message"]["contextId"], "dump-ctx");
    let history = input["history"].as_array().expect("history");
    assert_eq!(history.len(), 2, "{input}");
    assert_eq!(history[0]["role"], "user");
    assert_eq!(history[0]["text"], "dump first");
    assert_eq!(history[0]["taskId"], first_task["id"]);
    assert!(history[0]["messageId"].is_string());
    assert!(history[0]["timestamp"].is_string());
    assert_eq!(history[1]["role"], "agent");
    assert_eq!(
        history[1]["text"].as_str().unwrap(),
        reply_text(&first_task)
    );
    let prompt = input["prompt"].as_str().unwrap();
    assert!(prompt.starts_with("[Previous conversation"), "{prompt}");
    assert!(prompt.contains("user: dump first"), "{prompt}");
    assert!(prompt.ends_with("\n\ndump second"), "{prompt}");

    // Only PATH, the configured names and the A2A variables reach the program.
    let response = server.send_text(V1, "env", Some("env-ctx"), None).await;
    let names = reply_text(task_of(&response));
    let names: Vec<&str> = names.split_whitespace().collect();
    for needed in ["A2A_CONTEXT_ID", "A2A_TASK_ID", "PATH"] {
        assert!(names.contains(&needed), "{names:?}");
    }
    if std::env::var_os("HOME").is_some() {
        assert!(names.contains(&"HOME"), "{names:?}");
    }
    // LC_CTYPE: python's own C-locale coercion may add it.
    let allowed = ["A2A_CONTEXT_ID", "A2A_TASK_ID", "PATH", "HOME", "LC_CTYPE"];
    assert!(names.iter().all(|n| allowed.contains(n)), "{names:?}");
    server.stop().await;
}

#[actix_rt::test]
async fn non_zero_exit_fails_with_stderr_tail() {
    let server = python_server(|_| {}).await;
    let response = server.send_text(V1, "fail", Some("fail-ctx"), None).await;
    let task = task_of(&response);
    assert_eq!(task["status"]["state"], "TASK_STATE_FAILED", "{response}");
    let text = status_text(task);
    assert!(text.contains("exited with code 3"), "{text}");
    assert!(text.contains("err line 19"), "{text}");
    assert!(text.contains("err line 10"), "{text}");
    assert!(
        !text.contains("err line 9\n"),
        "only the last lines: {text}"
    );
    // Output produced before the failure stays in the reply.
    assert_eq!(reply_text(task), "started");

    // The context is free again.
    let response = server
        .send_text(V1, "message", Some("fail-ctx"), None)
        .await;
    assert_eq!(
        message_text(&response["result"]["message"]),
        "just a message"
    );
    server.stop().await;
}

#[actix_rt::test]
async fn a_program_that_cannot_start_fails_the_task() {
    let server = exec_server(vec!["/nonexistent/agent-program".into()], |_| {}).await;
    let response = server.send_text(V1, "hi", None, None).await;
    let task = task_of(&response);
    assert_eq!(task["status"]["state"], "TASK_STATE_FAILED", "{response}");
    assert!(status_text(task).contains("could not start /nonexistent/agent-program"));
    server.stop().await;
}

#[test]
fn missing_command_is_a_configuration_error() {
    let mut config = Config::default();
    config.agent.kind = "exec".into();
    let error = colloquy::cli::build_agent(&config)
        .err()
        .expect("refused")
        .to_string();
    assert!(error.contains("agent.command"), "{error}");
}

/// The pids a sleeping fixture wrote: itself and its `sleep` child.
async fn wait_for_pids(path: &std::path::Path) -> (i32, i32) {
    let started = Instant::now();
    loop {
        if let Ok(text) = std::fs::read_to_string(path) {
            let pids: Vec<i32> = text
                .split_whitespace()
                .map(|p| p.parse().unwrap())
                .collect();
            return (pids[0], pids[1]);
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the program never started"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `None`: gone (reaped); `Some(state)`: the /proc state letter.
fn proc_state(pid: i32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // "pid (comm) S ...": the state follows the last ')'.
    stat.rsplit_once(')')?.1.trim_start().chars().next()
}

/// Our child must be reaped (gone); its own child must be dead (a zombie of an init that does
/// not reap counts as dead).
async fn assert_gone(pid: i32, grandchild: i32, within: Duration) {
    let started = Instant::now();
    loop {
        let child_gone = proc_state(pid).is_none();
        let grandchild_dead = matches!(proc_state(grandchild), None | Some('Z') | Some('X'));
        if child_gone && grandchild_dead {
            return;
        }
        assert!(
            started.elapsed() < within,
            "still there after {within:?}: child {pid} {:?}, grandchild {grandchild} {:?}",
            proc_state(pid),
            proc_state(grandchild)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[actix_rt::test]
async fn timeout_fails_the_task_and_kills_the_program() {
    let server = python_server(|c| {
        c.agent.timeout_secs = 1;
        c.agent.grace_secs = 1;
    })
    .await;
    let pid_file = server.dir.path().join("timeout.pid");
    let text = format!("sleep {}", pid_file.display());
    let started = Instant::now();
    let response = server.send_text(V1, &text, Some("timeout-ctx"), None).await;
    let task = task_of(&response);
    assert_eq!(task["status"]["state"], "TASK_STATE_FAILED", "{response}");
    assert!(
        status_text(task).contains("did not finish within 1 s"),
        "{response}"
    );
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_eq!(reply_text(task), "sleeping");
    let (pid, grandchild) = wait_for_pids(&pid_file).await;
    assert_gone(pid, grandchild, Duration::from_secs(3)).await;
    server.stop().await;
}

async fn cancel_while_running(server: &TestServer, name: &str) -> (i32, i32) {
    let pid_file = server.dir.path().join(format!("{name}.pid"));
    let text = format!("sleep {}", pid_file.display());
    let message = user_message(V1, &text, Some(name), None);
    let response = server
        .rpc(
            V1,
            "SendMessage",
            json!({"message": message, "configuration": {"returnImmediately": true}}),
        )
        .await;
    let task_id = task_of(&response)["id"]
        .as_str()
        .expect("task id")
        .to_owned();
    let pids = wait_for_pids(&pid_file).await;
    assert!(proc_state(pids.0).is_some(), "the program runs");
    let response = server.rpc(V1, "CancelTask", json!({"id": task_id})).await;
    assert_eq!(
        response["result"]["status"]["state"], "TASK_STATE_CANCELED",
        "{response}"
    );
    pids
}

#[actix_rt::test]
async fn cancel_terminates_the_process_group() {
    let server = python_server(|c| c.agent.grace_secs = 5).await;
    let (pid, grandchild) = cancel_while_running(&server, "cancel-ctx").await;
    // SIGTERM ends both at once: well within the grace period.
    assert_gone(pid, grandchild, Duration::from_secs(3)).await;
    server.stop().await;
}

#[actix_rt::test]
async fn cancel_kills_a_program_that_ignores_sigterm_after_the_grace_period() {
    let server = python_server(|c| c.agent.grace_secs = 1).await;
    let pid_file = server.dir.path().join("stubborn.pid");
    let text = format!("stubborn {}", pid_file.display());
    let response = server
        .rpc(
            V1,
            "SendMessage",
            json!({"message": user_message(V1, &text, Some("stubborn-ctx"), None),
                   "configuration": {"returnImmediately": true}}),
        )
        .await;
    let task_id = task_of(&response)["id"]
        .as_str()
        .expect("task id")
        .to_owned();
    let (pid, grandchild) = wait_for_pids(&pid_file).await;
    let canceled_at = Instant::now();
    let response = server.rpc(V1, "CancelTask", json!({"id": task_id})).await;
    assert_eq!(response["result"]["status"]["state"], "TASK_STATE_CANCELED");
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert!(
        matches!(proc_state(pid), Some(s) if s != 'Z'),
        "SIGTERM is ignored: the program is still alive during the grace period"
    );
    assert_gone(pid, grandchild, Duration::from_secs(4)).await;
    assert!(canceled_at.elapsed() >= Duration::from_millis(900));
    server.stop().await;
}

#[actix_rt::test]
async fn two_hundred_concurrent_contexts_do_not_cross() {
    let server = exec_server(
        vec!["/bin/sh".into(), fixture("exec_concurrent.sh")],
        |_| {},
    )
    .await;
    let server = std::sync::Arc::new(server);
    let mut handles = Vec::new();
    for i in 0..200 {
        let server = server.clone();
        handles.push(actix_rt::spawn(async move {
            let context_id = format!("conc-{i}");
            let text = format!("hello number {i}");
            let response = server.send_text(V1, &text, Some(&context_id), None).await;
            let task = task_of(&response).clone();
            (i, context_id, text, task)
        }));
    }
    for handle in handles {
        let (i, context_id, text, task) = handle.await.expect("joined");
        assert_eq!(
            task["status"]["state"], "TASK_STATE_COMPLETED",
            "{i}: {task}"
        );
        assert_eq!(task["contextId"], context_id.as_str());
        let expected = format!(
            "ctx={context_id} task={} said={text}\n",
            task["id"].as_str().unwrap()
        );
        assert_eq!(reply_text(&task), expected);
    }
    // And the stored replies match, conversation by conversation.
    for i in [0, 57, 199] {
        let stored = server.stored_messages(V1, &format!("conc-{i}")).await;
        assert_eq!(stored.len(), 2);
        assert!(message_text(&stored[1]).starts_with(&format!("ctx=conc-{i} ")));
        assert!(message_text(&stored[1]).ends_with(&format!("said=hello number {i}\n")));
    }
    let server = std::sync::Arc::into_inner(server).expect("sole owner");
    server.stop().await;
}
