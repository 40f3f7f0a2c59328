//! Crash durability: the server runs as a child process under concurrent multi-turn load and is
//! crashed at a random moment, then restarted on the same folder. Every turn whose reply came
//! back completed must be in its conversation (the user's text and the reply, in order), no
//! conversation may hold another's message, and the store must open cleanly. Conversations
//! carry on across crashes, so older ones are checked again after every restart.
//!
//! Two kinds of crash: SIGKILL, which leaves the page cache (and so every write) intact, and a
//! power cut, simulated by [`crashfs`], which also forgets whatever was never synced.

use crate::common;
mod crashfs;

use common::free_port;

use rand::Rng;
use serde_json::{Value, json};
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const ROUNDS: usize = 20;
const NEW_PER_ROUND: usize = 4;
const CONTINUED_PER_ROUND: usize = 4;
const MAX_TURNS_PER_ROUND: usize = 30;
const MAX_TURNS_PER_CONVERSATION: usize = 60;
/// Each turn's agent takes 2 ms, as any real agent takes longer than the echo agent alone: a
/// kill then often finds a turn whose start is stored and whose end is not, which the restart
/// must fail. (With the echo agent answering at once, as few as 1 restart in 21 found one.)
const AGENT_TAKES_TIME: (&str, &str) = ("COLLOQUY_AGENT__ECHO__DELAY_MS", "2");

/// The first message of each conversation in odd rounds is this large.
const LARGE_TEXT_BYTES: usize = 150 * 1024;

/// Acknowledged turns per conversation: (user text, reply text), in order.
type Acked = BTreeMap<String, Vec<(String, String)>>;

pub(crate) struct Server {
    pub(crate) child: Child,
    pub(crate) url: String,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A `colloquy serve` child process on `data`, once ready (also used by `push.rs`).
pub(crate) async fn start(
    data: &Path,
    log: &Path,
    env: &[(&str, &str)],
    client: &reqwest::Client,
) -> Server {
    let mut last_error = String::new();
    for _attempt in 0..3 {
        let port = free_port();
        let log_file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .expect("log file");
        let err_file = log_file.try_clone().expect("log file clone");
        let mut child = Command::new(env!("CARGO_BIN_EXE_colloquy"))
            .args([
                "serve",
                "--grpc-listen",
                "127.0.0.1:0",
                "--listen",
                &format!("127.0.0.1:{port}"),
                "--data",
            ])
            .arg(data)
            // The store's info lines say when a start replayed the write-ahead log.
            .env("RUST_LOG", "warn,colloquy::store=info")
            .env_remove("COLLOQUY_TOKENS")
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(log_file)
            .stderr(err_file)
            .spawn()
            .expect("spawn colloquy");
        let url = format!("http://127.0.0.1:{port}/");
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if let Ok(Some(status)) = child.try_wait() {
                last_error = format!("server exited with {status} on start");
                break;
            }
            let ready = client
                .get(format!("{url}readyz"))
                .send()
                .await
                .is_ok_and(|r| r.status().is_success());
            if ready {
                return Server { child, url };
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        let _ = child.kill();
        let _ = child.wait();
        if last_error.is_empty() {
            last_error = "server not ready within 20 s".into();
        }
    }
    let log_text = std::fs::read_to_string(log).unwrap_or_default();
    let tail: String = log_text
        .lines()
        .rev()
        .take(30)
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .collect::<Vec<_>>()
        .join("\n");
    panic!("the store did not open cleanly: {last_error}\n{tail}");
}

async fn rpc(
    client: &reqwest::Client,
    url: &str,
    method: &str,
    params: Value,
) -> reqwest::Result<Value> {
    client
        .post(url)
        .header("A2A-Version", "1.0")
        .json(&json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params}))
        .send()
        .await?
        .json()
        .await
}

fn text_of(parts: &Value) -> String {
    parts
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|p| p["text"].as_str())
        .collect()
}

/// Drives one conversation until the server dies or its turns run out. Returns the
/// contextId (`None` if the first turn never came back) and records every acknowledged turn.
async fn drive(
    client: reqwest::Client,
    url: String,
    label: String,
    round: usize,
    mut context_id: Option<String>,
    turns: usize,
    acked: Arc<Mutex<Acked>>,
) -> bool {
    for turn in 0..turns {
        let mut text = format!("{label} says {round}.{turn}");
        if turn == 0 && round % 2 == 1 {
            // Large enough that sled keeps the page as a blob file of its own (over 128 KiB).
            text.push_str(&" and on".repeat(LARGE_TEXT_BYTES / 7));
        }
        let mut message = json!({"messageId": format!("{label}-m{turn}"), "role": "ROLE_USER",
            "parts": [{"text": text}]});
        if let Some(context_id) = &context_id {
            message["contextId"] = json!(context_id);
        }
        let Ok(response) = rpc(&client, &url, "SendMessage", json!({"message": message})).await
        else {
            return true; // the server is gone, a turn cut off
        };
        let task = &response["result"]["task"];
        if task["status"]["state"] != "TASK_STATE_COMPLETED" {
            assert!(
                response.get("error").is_some() || task["status"]["state"].is_string(),
                "odd answer: {response}"
            );
            return true;
        }
        let returned = task["contextId"].as_str().expect("contextId").to_owned();
        if let Some(ours) = &context_id {
            assert_eq!(
                ours, &returned,
                "reply carries another conversation's contextId"
            );
        }
        let reply: String = task["artifacts"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|a| text_of(&a["parts"]))
            .collect();
        assert!(
            reply.contains(&text),
            "reply {reply:?} does not echo {text:?}"
        );
        acked
            .lock()
            .expect("acked lock")
            .entry(returned.clone())
            .or_default()
            .push((text, reply));
        context_id = Some(returned);
    }
    false
}

/// Every acknowledged turn is stored in order; every stored user message was sent to this conversation.
async fn verify(
    client: &reqwest::Client,
    url: &str,
    acked: &Acked,
    labels: &BTreeMap<String, String>,
) {
    for (context_id, turns) in acked {
        let label = &labels[context_id];
        let mut stored: Vec<(String, String)> = Vec::new();
        let mut token = String::new();
        loop {
            let response = rpc(
                client,
                url,
                "colloquy/getConversation",
                json!({"contextId": context_id, "historyLength": 100_000, "pageToken": token}),
            )
            .await
            .expect("getConversation");
            let messages = response["result"]["messages"]
                .as_array()
                .unwrap_or_else(|| panic!("no conversation {context_id}: {response}"));
            stored.extend(messages.iter().map(|m| {
                (
                    m["role"].as_str().unwrap_or("").to_owned(),
                    text_of(&m["parts"]),
                )
            }));
            token = response["result"]["nextPageToken"]
                .as_str()
                .unwrap_or("")
                .to_owned();
            if token.is_empty() {
                break;
            }
        }
        for (role, text) in &stored {
            if role == "ROLE_USER" {
                assert!(
                    text.starts_with(&format!("{label} says ")),
                    "conversation {context_id} ({label}) holds a foreign message {text:?}"
                );
            } else if let Some(quoted) = text.strip_prefix("echo: ") {
                assert!(
                    quoted.starts_with(&format!("{label} says ")),
                    "conversation {context_id} ({label}) holds a foreign reply {text:?}"
                );
            }
        }
        // The acknowledged turns appear in order, each user message followed by its reply.
        let mut at = 0;
        for (user, reply) in turns {
            let found = stored[at..]
                .iter()
                .position(|(role, text)| role == "ROLE_USER" && text == user)
                .unwrap_or_else(|| {
                    panic!("acknowledged message {user:?} lost from {context_id}: {stored:?}")
                });
            at += found + 1;
            let next = stored
                .get(at)
                .unwrap_or_else(|| panic!("acknowledged reply to {user:?} lost from {context_id}"));
            assert_eq!(next.0, "ROLE_AGENT", "after {user:?} in {context_id}");
            assert_eq!(
                &next.1, reply,
                "stored reply differs from the acknowledged one"
            );
            at += 1;
        }
    }
}

/// What a task cut off by a crash says (the engine's `INTERRUPTED_TASK_TEXT`).
const INTERRUPTED_TASK_TEXT: &str = "the server stopped before the agent finished";

async fn list_tasks_in(
    client: &reqwest::Client,
    url: &str,
    state: &str,
    page_token: &str,
) -> Value {
    let response = rpc(
        client,
        url,
        "ListTasks",
        json!({"status": state, "pageSize": 100, "pageToken": page_token, "historyLength": 0}),
    )
    .await
    .expect("ListTasks");
    assert!(response.get("error").is_none(), "ListTasks: {response}");
    response["result"].clone()
}

/// Right after a restart, before any conversation is used: no task reads as working, and every
/// task the crash cut off reads as failed with the interrupted message (through ListTasks,
/// GetTask and SubscribeToTask). Returns how many failed tasks are new since the last restart.
async fn check_no_task_left_working(
    client: &reqwest::Client,
    url: &str,
    failed_before: &mut BTreeSet<String>,
) -> usize {
    let working = list_tasks_in(client, url, "TASK_STATE_WORKING", "").await;
    assert_eq!(
        working["totalSize"], 0,
        "tasks still read as working after a restart: {working}"
    );
    let mut new_failed = Vec::new();
    let mut token = String::new();
    loop {
        let page = list_tasks_in(client, url, "TASK_STATE_FAILED", &token).await;
        for task in page["tasks"].as_array().expect("tasks") {
            assert_eq!(
                text_of(&task["status"]["message"]["parts"]),
                INTERRUPTED_TASK_TEXT,
                "a failed task: {task}"
            );
            let id = task["id"].as_str().expect("task id").to_owned();
            if failed_before.insert(id.clone()) {
                new_failed.push(id);
            }
        }
        token = page["nextPageToken"].as_str().unwrap_or("").to_owned();
        if token.is_empty() {
            break;
        }
    }
    for id in &new_failed {
        let got = rpc(client, url, "GetTask", json!({"id": id}))
            .await
            .expect("GetTask");
        assert_eq!(
            got["result"]["status"]["state"], "TASK_STATE_FAILED",
            "{got}"
        );
        let subscribed = rpc(client, url, "SubscribeToTask", json!({"id": id}))
            .await
            .expect("SubscribeToTask answers a failed task with a JSON error, not a stream");
        assert_eq!(subscribed["error"]["code"], -32004, "{subscribed}");
    }
    new_failed.len()
}

/// What a run of crash rounds did.
struct Rounds {
    conversations: usize,
    acknowledged: usize,
    cut_off: usize,
    /// Restarts that found tasks a kill had cut off mid-turn (and failed them).
    restarts_failing_tasks: usize,
    /// How many restarts replayed the write-ahead log, from the server's log.
    replays: usize,
    /// Recovery snapshots sled wrote while running (logged at debug level).
    live_snapshots: usize,
}

/// `ROUNDS` rounds of load, each ended by SIGKILL at a random moment `kill_after` (in ms) into
/// it and then `after_kill` (with the round's number), then a restart that checks every turn
/// acknowledged so far.
async fn crash_rounds(
    data: &Path,
    log: &Path,
    env: &[(&str, &str)],
    kill_after: std::ops::Range<u64>,
    mut after_kill: impl FnMut(usize),
) -> Rounds {
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(20))
        .build()
        .expect("client");
    let acked: Arc<Mutex<Acked>> = Arc::default();
    let mut labels: BTreeMap<String, String> = BTreeMap::new();
    let mut rng = rand::thread_rng();
    let mut cut_off = 0;
    let mut failed_tasks = BTreeSet::new();
    let mut restarts_failing_tasks = 0;
    let env: Vec<(&str, &str)> = env.iter().copied().chain([AGENT_TAKES_TIME]).collect();
    let env = env.as_slice();
    for round in 0..ROUNDS {
        let mut server = start(data, log, env, &client).await;
        if check_no_task_left_working(&client, &server.url, &mut failed_tasks).await > 0 {
            restarts_failing_tasks += 1;
        }
        let snapshot = acked.lock().expect("acked lock").clone();
        verify(&client, &server.url, &snapshot, &labels).await;

        // Carry on some earlier conversations, start some new ones.
        let continued = snapshot
            .iter()
            .filter(|(_, turns)| turns.len() < MAX_TURNS_PER_CONVERSATION)
            .rev()
            .take(CONTINUED_PER_ROUND)
            .map(|(cid, _)| (labels[cid].clone(), Some(cid.clone())));
        let new_labels: Vec<String> = (0..NEW_PER_ROUND)
            .map(|i| format!("r{round}c{i}"))
            .collect();
        let started = new_labels.iter().map(|label| (label.clone(), None));
        let mut tasks = Vec::new();
        for (label, context_id) in continued.chain(started) {
            let turns = rng.gen_range(1..=MAX_TURNS_PER_ROUND);
            tasks.push(tokio::spawn(drive(
                client.clone(),
                server.url.clone(),
                label,
                round,
                context_id,
                turns,
                acked.clone(),
            )));
        }
        // SIGKILL at a random moment while the load runs.
        tokio::time::sleep(Duration::from_millis(rng.gen_range(kill_after.clone()))).await;
        server.child.kill().expect("SIGKILL");
        let _ = server.child.wait();
        after_kill(round);
        for task in tasks {
            if task.await.expect("load task") {
                cut_off += 1;
            }
        }
        // Learn the labels of the conversations that started this round.
        for (context_id, turns) in acked.lock().expect("acked lock").iter() {
            if labels.contains_key(context_id) {
                continue;
            }
            let label = new_labels
                .iter()
                .find(|l| turns[0].0.starts_with(&format!("{l} says ")))
                .expect("a new conversation's label")
                .clone();
            labels.insert(context_id.clone(), label);
        }
    }
    // A last restart checks the last crash.
    let mut server = start(data, log, env, &client).await;
    if check_no_task_left_working(&client, &server.url, &mut failed_tasks).await > 0 {
        restarts_failing_tasks += 1;
    }
    let snapshot = acked.lock().expect("acked lock").clone();
    verify(&client, &server.url, &snapshot, &labels).await;
    let _ = server.child.kill();
    let _ = server.child.wait();
    let rounds = Rounds {
        conversations: snapshot.len(),
        acknowledged: snapshot.values().map(Vec::len).sum(),
        cut_off,
        restarts_failing_tasks,
        replays: std::fs::read_to_string(log)
            .expect("server log")
            .matches("replayed the write-ahead log")
            .count(),
        live_snapshots: std::fs::read_to_string(log)
            .expect("server log")
            .matches("sled snapshot written")
            .count(),
    };
    eprintln!(
        "{} conversations, {} acknowledged turns, {} cut off, {} replays, {} tasks failed by \
         {} restarts",
        rounds.conversations,
        rounds.acknowledged,
        rounds.cut_off,
        rounds.replays,
        failed_tasks.len(),
        rounds.restarts_failing_tasks
    );
    assert!(
        rounds.acknowledged > ROUNDS,
        "too little load ran: {} acknowledged turns",
        rounds.acknowledged
    );
    assert!(
        rounds.cut_off >= ROUNDS / 2,
        "the crashes rarely hit running load: {}",
        rounds.cut_off
    );
    assert!(
        rounds.restarts_failing_tasks >= ROUNDS / 10,
        "the kills rarely cut off a stored running turn: {} restarts failed tasks",
        rounds.restarts_failing_tasks
    );
    rounds
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_turns_survive_sigkill() {
    let started = Instant::now();
    let dir = tempfile::tempdir().expect("temp dir");
    let log = dir.path().join("server.log");
    // Turns take a few milliseconds: a kill later than this often finds the round's load done.
    let rounds = crash_rounds(&dir.path().join("data"), &log, &[], 10..150, |_| {}).await;
    // Kills land within 150 ms of the load starting, before the store's first checkpoint
    // (about a second): the acknowledged turns of those rounds were in the log alone.
    assert!(
        rounds.replays >= ROUNDS / 2,
        "only {} restarts replayed the log",
        rounds.replays
    );
    eprintln!(
        "kill9: {ROUNDS} rounds, {} conversations, {} acknowledged turns checked, {} \
         conversations cut off mid-turn by the kills, {} restarts replayed the log, {:?}",
        rounds.conversations,
        rounds.acknowledged,
        rounds.cut_off,
        rounds.replays,
        started.elapsed()
    );
}

/// Mounts crashfs, or says why the power-cut test cannot run here. Under `CI=true` a machine
/// with `/dev/fuse` must run it.
fn mount_crashfs(at: &Path) -> Option<crashfs::Mount> {
    let required = std::env::var("CI").is_ok_and(|v| v == "true");
    if !Path::new("/dev/fuse").exists() {
        eprintln!("SKIPPED power-cut test: this machine has no /dev/fuse");
        return None;
    }
    match crashfs::Mount::new(at) {
        Ok(mount) => Some(mount),
        Err(e) if !required => {
            eprintln!(
                "SKIPPED power-cut test: cannot mount a FUSE filesystem ({e}); as root it \
                 mounts directly, otherwise it needs fusermount3 (Debian's fuse3)"
            );
            None
        }
        Err(e) => panic!("CI=true and /dev/fuse exists, but crashfs did not mount: {e}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_turns_survive_power_cuts() {
    let started = Instant::now();
    let dir = tempfile::tempdir().expect("temp dir");
    let mountpoint = dir.path().join("disk");
    std::fs::create_dir(&mountpoint).expect("mount point");
    let Some(disk) = mount_crashfs(&mountpoint) else {
        return;
    };
    let log = dir.path().join("server.log");
    let survivors = [
        crashfs::Survivors::None,
        crashfs::Survivors::Prefix,
        crashfs::Survivors::Subset,
    ];
    let mut rng = rand::thread_rng();
    let mut dropped = 0;
    let mut kept = 0;
    // Checkpoints every 50 ms, so the random cuts land before, during and after them, and
    // sled's recovery snapshots after nearly every one: cuts land on those too, and each
    // restart recovers from one written while the server ran.
    let env = [
        ("COLLOQUY_STORE__CHECKPOINT_INTERVAL_MS", "50"),
        ("COLLOQUY_STORE__CHECKPOINT_MIN_BYTES", "0"),
        ("COLLOQUY_STORE__SNAPSHOT_LOG_BYTES", "4096"),
        ("RUST_LOG", "warn,colloquy::store=debug"),
    ];
    let rounds = crash_rounds(&disk.path().join("data"), &log, &env, 10..150, |round| {
        // The process is dead; the kernel may still be finishing its last requests.
        std::thread::sleep(Duration::from_millis(50));
        let cut = disk.cut_power(survivors[round % survivors.len()], &mut rng);
        kept += cut.kept;
        dropped += cut.pending - cut.kept;
    })
    .await;
    let syncs = disk.sync_counts();
    eprintln!(
        "power cut: {ROUNDS} rounds, {} conversations, {} acknowledged turns checked, {} \
         conversations cut off mid-turn, {} restarts replayed the log, {} live sled \
         snapshots; unsynced changes: {dropped} dropped, {kept} kept; {} file and {} folder \
         syncs; {:?}",
        rounds.conversations,
        rounds.acknowledged,
        rounds.cut_off,
        rounds.replays,
        rounds.live_snapshots,
        syncs.file_syncs,
        syncs.dir_syncs,
        started.elapsed()
    );
    assert!(
        dropped > 0,
        "no cut dropped anything: the test proves nothing"
    );
    assert!(
        rounds.live_snapshots >= ROUNDS / 4,
        "sled wrote only {} snapshots while running",
        rounds.live_snapshots
    );
}

/// crashfs forgets what was never synced (so the power-cut test can fail), and a file replaced
/// with `durable::write_atomic` (as `colloquy send` saves its sessions) survives every cut whole.
#[test]
fn only_synced_files_survive_a_power_cut() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mountpoint = dir.path().join("disk");
    std::fs::create_dir(&mountpoint).expect("mount point");
    let Some(disk) = mount_crashfs(&mountpoint) else {
        return;
    };
    let mut rng = rand::thread_rng();
    let careless = disk.path().join("careless.json");
    let careful = disk.path().join("state/sessions.json");
    std::fs::write(&careless, b"unsynced").expect("write");
    colloquy::durable::write_atomic(&careful, b"first").expect("write_atomic");
    disk.cut_power(crashfs::Survivors::None, &mut rng);
    // The folder sync that made `state/` durable made this name durable too, not its bytes.
    assert_eq!(
        std::fs::read(&careless).unwrap_or_default(),
        b"",
        "an unsynced write survived the cut"
    );
    assert_eq!(std::fs::read(&careful).expect("synced file"), b"first");

    for round in 0..20 {
        let next = format!("version {round}");
        colloquy::durable::write_atomic(&careful, next.as_bytes()).expect("write_atomic");
        // A cut after the write returned keeps it, whatever the device kept of the rest.
        let survivors = [
            crashfs::Survivors::None,
            crashfs::Survivors::Prefix,
            crashfs::Survivors::Subset,
        ];
        disk.cut_power(survivors[round % 3], &mut rng);
        assert_eq!(
            std::fs::read(&careful).expect("synced file"),
            next.as_bytes()
        );
        let names: Vec<_> = std::fs::read_dir(careful.parent().expect("folder"))
            .expect("list")
            .map(|e| e.expect("entry").file_name())
            .collect();
        assert_eq!(names, ["sessions.json"], "a temporary file was left behind");
    }
}
