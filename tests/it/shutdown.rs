//! SIGTERM: running turns finish within the grace period (or fail clearly past it), newcomers are
//! refused at once, the process exits 0 soon after the grace whatever clients do, and what was
//! acknowledged is there after a restart. Also the serving process's open-files limit.

use crate::common;

use common::*;
use serde_json::{Value, json};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

struct Process {
    child: Child,
    url: String,
}

async fn spawn(data: &std::path::Path, grace_secs: u64, delay_ms: u64) -> Process {
    spawn_with(data, grace_secs, delay_ms, |_| {}).await
}

/// Starts `colloquy serve` with the echo agent; `tweak` adds flags or environment.
async fn spawn_with(
    data: &std::path::Path,
    grace_secs: u64,
    delay_ms: u64,
    tweak: impl FnOnce(&mut Command),
) -> Process {
    let port = free_port();
    let mut command = Command::new(env!("CARGO_BIN_EXE_colloquy"));
    command
        .args([
            "serve",
            "--grpc-listen",
            "127.0.0.1:0",
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--data",
        ])
        .arg(data)
        .args(["--echo-delay-ms", &delay_ms.to_string()])
        .env("COLLOQUY_SHUTDOWN__GRACE_SECS", grace_secs.to_string())
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::inherit());
    tweak(&mut command);
    let mut child = command.spawn().expect("colloquy starts");
    let url = format!("http://127.0.0.1:{port}/");
    let client = reqwest::Client::new();
    for _ in 0..200 {
        if client.get(format!("{url}healthz")).send().await.is_ok() {
            return Process { child, url };
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let _ = child.kill();
    let _ = child.wait();
    panic!("colloquy did not come up");
}

async fn rpc(url: &str, method: &str, params: Value) -> Value {
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params});
    post_rpc(&reqwest::Client::new(), url, V1, &body).await
}

fn terminate(process: &Process) {
    // SAFETY: kill(2) on our own child's pid.
    unsafe { libc::kill(process.child.id() as libc::pid_t, libc::SIGTERM) };
}

async fn wait_exit(mut process: Process) -> std::process::ExitStatus {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(status) = process.child.try_wait().unwrap() {
            return status;
        }
        assert!(Instant::now() < deadline, "the server did not exit");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[actix_rt::test]
async fn a_running_turn_finishes_within_the_grace_period() {
    let dir = tempfile::tempdir().unwrap();
    let process = spawn(dir.path(), 10, 1500).await;
    let url = process.url.clone();
    let turn = tokio::spawn(async move {
        rpc(
            &url,
            "SendMessage",
            json!({"message": user_message(V1, "finish me", Some("graceful"), None)}),
        )
        .await
    });
    tokio::time::sleep(Duration::from_millis(400)).await;
    terminate(&process);
    let reply = turn.await.unwrap();
    assert_eq!(task_of(&reply)["status"]["state"], "TASK_STATE_COMPLETED");
    assert_eq!(artifact_text(task_of(&reply)), "echo: finish me (turn 1)");
    let status = wait_exit(process).await;
    assert!(status.success(), "exit status {status:?}");

    let process = spawn(dir.path(), 10, 0).await;
    let history = rpc(
        &process.url,
        "colloquy/getConversation",
        json!({"contextId": "graceful"}),
    )
    .await;
    let texts = conversation_texts(&history);
    assert_eq!(texts, ["finish me", "echo: finish me (turn 1)"]);
    terminate(&process);
    assert!(wait_exit(process).await.success());
}

#[actix_rt::test]
async fn turns_past_the_grace_period_fail_clearly() {
    let dir = tempfile::tempdir().unwrap();
    let process = spawn(dir.path(), 1, 6000).await;
    let url = process.url.clone();
    let turn = tokio::spawn(async move {
        rpc(
            &url,
            "SendMessage",
            json!({"message": user_message(V1, "too slow", Some("cut"), None)}),
        )
        .await
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    terminate(&process);
    let reply = turn.await.unwrap();
    let task = task_of(&reply);
    assert_eq!(task["status"]["state"], "TASK_STATE_FAILED");
    assert!(message_text(&task["status"]["message"]).contains("shut down"));
    let started = Instant::now();
    assert!(wait_exit(process).await.success());
    assert!(started.elapsed() < Duration::from_secs(10));

    let process = spawn(dir.path(), 1, 0).await;
    let task_id = task["id"].as_str().unwrap();
    let stored = rpc(&process.url, "GetTask", json!({"id": task_id})).await;
    assert_eq!(stored["result"]["status"]["state"], "TASK_STATE_FAILED");
    assert_eq!(message_text(&stored["result"]["history"][0]), "too slow");
    let next = rpc(
        &process.url,
        "SendMessage",
        json!({"message": user_message(V1, "again", Some("cut"), None)}),
    )
    .await;
    assert_eq!(task_of(&next)["status"]["state"], "TASK_STATE_COMPLETED");
    terminate(&process);
    assert!(wait_exit(process).await.success());
}

#[actix_rt::test]
async fn a_newcomer_during_the_grace_is_answered_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let turn_time = Duration::from_millis(5_000);
    let process = spawn(dir.path(), 15, turn_time.as_millis() as u64).await;
    let url = process.url.clone();
    let turn = tokio::spawn(async move {
        rpc(
            &url,
            "SendMessage",
            json!({"message": user_message(V1, "slow one", Some("running"), None)}),
        )
        .await
    });
    tokio::time::sleep(Duration::from_millis(400)).await;
    let signalled = Instant::now();
    terminate(&process);
    tokio::time::sleep(Duration::from_millis(300)).await;

    // A new client (its own connection): refused, or told -32013, well before the turn ends.
    let asked = Instant::now();
    let body = json!({"jsonrpc": "2.0", "id": 7, "method": "SendMessage",
        "params": {"message": user_message(V1, "newcomer", Some("late"), None)}});
    let answer = reqwest::Client::new()
        .post(&process.url)
        .header("A2A-Version", V1)
        .json(&body)
        .timeout(Duration::from_secs(10))
        .send()
        .await;
    let took = asked.elapsed();
    eprintln!("newcomer answered in {took:?}: {answer:?}");
    match answer {
        Err(e) => assert!(
            e.is_connect(),
            "not a refused connection: {e:?} after {took:?}"
        ),
        Ok(response) => {
            let value: Value = response.json().await.expect("JSON answer");
            assert_eq!(value["error"]["code"], -32013, "{value}");
        }
    }
    assert!(
        took < Duration::from_secs(2),
        "the newcomer waited {took:?}"
    );

    // The running turn still finishes, and the process exits cleanly.
    let reply = turn.await.unwrap();
    assert_eq!(task_of(&reply)["status"]["state"], "TASK_STATE_COMPLETED");
    assert!(signalled.elapsed() >= turn_time - Duration::from_millis(700));
    assert!(wait_exit(process).await.success());
}

/// Raw connections that ask for a stream and never read: the server's writes to them block once
/// the socket buffers are full.
async fn stalled_subscriber(port: u16, task_id: &str) -> tokio::net::TcpStream {
    use tokio::io::AsyncWriteExt;
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let mut stream = socket
        .connect(([127, 0, 0, 1], port).into())
        .await
        .expect("connects");
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "SubscribeToTask",
        "params": {"id": task_id}})
    .to_string();
    let request = format!(
        "POST / HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nA2A-Version: 1.0\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    stream
}

#[actix_rt::test]
async fn stalled_stream_readers_do_not_hold_the_exit_past_the_grace() {
    const GRACE_SECS: u64 = 2;
    const SUBSCRIBERS: usize = 12;
    // Every stream's first event (the task so far, with the 5 MB message in its history) is more
    // than the kernel buffers on both ends of a connection hold.
    let text = "x".repeat(5 * 1024 * 1024);
    let dir = tempfile::tempdir().unwrap();
    let process = spawn_with(dir.path(), GRACE_SECS, 150, |command| {
        command
            .args(["--echo-chunk-chars", "262144"])
            .env("COLLOQUY_LIMITS__BODY_BYTES", "16000000")
            .env("COLLOQUY_LIMITS__TEXT_BYTES", "16000000");
    })
    .await;
    let port: u16 = process
        .url
        .trim_end_matches('/')
        .rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .expect("port");
    // The long streamed turn (about 20 chunks, 150 ms apart): read its first event, then stop.
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "SendStreamingMessage",
        "params": {"message": user_message(V1, &text, Some("long"), None)}});
    let response = reqwest::Client::new()
        .post(&process.url)
        .header("A2A-Version", V1)
        .json(&body)
        .send()
        .await
        .expect("stream opened");
    let mut starter = LiveStream::new(response);
    let first = starter.next_event().await.expect("first event");
    let task_id = streamed_task_id(&first);
    let mut stalled = Vec::new();
    for _ in 0..SUBSCRIBERS {
        stalled.push(stalled_subscriber(port, &task_id).await);
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let signalled = Instant::now();
    terminate(&process);
    let status = wait_exit(process).await;
    let took = signalled.elapsed();
    eprintln!("exit {took:?} after SIGTERM (grace {GRACE_SECS} s)");
    assert!(status.success(), "exit status {status:?}");
    assert!(
        took < Duration::from_secs(GRACE_SECS + 3),
        "the process took {took:?} to exit with a grace of {GRACE_SECS} s"
    );
    drop((stalled, starter));
}

/// The soft and hard "Max open files" of a running process.
fn open_files_limits(pid: u32) -> (String, String) {
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).expect("/proc limits");
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .expect("Max open files line");
    let mut fields = line["Max open files".len()..].split_whitespace();
    let soft = fields.next().expect("soft").to_owned();
    let hard = fields.next().expect("hard").to_owned();
    (soft, hard)
}

#[actix_rt::test]
async fn the_soft_open_files_limit_is_raised_to_the_hard_one() {
    use std::os::unix::process::CommandExt;
    let dir = tempfile::tempdir().unwrap();
    let process = spawn_with(dir.path(), 1, 0, |command| {
        // SAFETY: only async-signal-safe calls between fork and exec (getrlimit, setrlimit).
        unsafe {
            command.pre_exec(|| {
                let mut limit = libc::rlimit {
                    rlim_cur: 0,
                    rlim_max: 0,
                };
                libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit);
                limit.rlim_cur = limit.rlim_max.min(512);
                libc::setrlimit(libc::RLIMIT_NOFILE, &limit);
                Ok(())
            });
        }
    })
    .await;
    let (soft, hard) = open_files_limits(process.child.id());
    assert_eq!(soft, hard, "soft open-files limit not raised");
    terminate(&process);
    assert!(wait_exit(process).await.success());
}
