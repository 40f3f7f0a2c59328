//! `colloquy loadgen`: many multi-turn conversations in flight against an A2A JSON-RPC server.
//!
//! Each conversation sends `--turns` messages one after the other: the first without a
//! `contextId`, the rest with the one the server returned, as a real multi-turn client does.
//! `--conversations` of them run at once over pooled keep-alive HTTP/1.1 connections; when one
//! finishes, the next starts, until `--total` conversations have run or `--duration` has passed.
//!
//! Every reply is checked: the task must be completed, carry this conversation's `contextId`
//! (never another live conversation's), and (unless `--no-echo-check`) echo this turn's text and
//! this conversation's previous text, as the built-in echo agent does.
//!
//! With `--stream` it also measures, per good turn, the time to first chunk (request sent to the
//! first artifact-update event with non-empty text read), and counts every artifact-update event
//! received (chunks delivered).

use super::CliError;
use crate::protocol::{WireVersion, codec};
use clap::Args;
use hdrhistogram::Histogram;
use serde_json::{Value, json};
use std::collections::{BTreeMap, HashSet};
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

#[derive(Args, Debug, Clone)]
pub struct LoadgenArgs {
    /// The server's JSON-RPC endpoint; several (comma-separated or the flag repeated) spread
    /// the conversations over them, conversation n on the (n mod count)-th.
    #[arg(long, value_delimiter = ',', default_value = "http://127.0.0.1:8080/")]
    url: Vec<String>,
    /// Conversations in flight at once.
    #[arg(long, default_value_t = 64)]
    conversations: usize,
    /// Sequential turns per conversation (all reusing its contextId).
    #[arg(long, default_value_t = 5)]
    turns: usize,
    /// Conversations to run in all [default: --conversations, or unbounded with --duration].
    #[arg(long)]
    total: Option<u64>,
    /// Wire version: 1.0 or 0.3.
    #[arg(long, default_value = "1.0", value_parser = ["1.0", "0.3"])]
    version: String,
    /// Use the streaming method (SSE) instead of the blocking send.
    #[arg(long)]
    stream: bool,
    /// Bytes of text in each message.
    #[arg(long, default_value_t = 200)]
    text_bytes: usize,
    /// Stop starting conversations after this many seconds (running ones finish their turns).
    #[arg(long)]
    duration: Option<f64>,
    /// Per-request timeout in seconds.
    #[arg(long, default_value_t = 30.0)]
    timeout_secs: f64,
    /// Send every turn into this existing conversation (forces one conversation in flight).
    #[arg(long)]
    context_id: Option<String>,
    /// Bearer token for servers with authentication.
    #[arg(long, env = "COLLOQUY_LOADGEN_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// Do not check that replies echo this turn's and the previous turn's text.
    #[arg(long)]
    no_echo_check: bool,
    /// Print only the JSON line.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum LoadgenError {
    #[error("invalid arguments: {0}")]
    Args(String),
    #[error("starting the runtime: {0}")]
    Runtime(#[source] std::io::Error),
    #[error("building the HTTP client: {0}")]
    Client(#[source] reqwest::Error),
    #[error("latency histogram: {0}")]
    Histogram(#[source] crate::error::BoxError),
}

/// Why a turn did not count as a good reply.
#[derive(Debug)]
enum TurnError {
    /// Not retried: the conversation stops here.
    Kind(String),
}

impl TurnError {
    fn kind(kind: impl Into<String>) -> Self {
        TurnError::Kind(kind.into())
    }
}

struct Shared {
    args: LoadgenArgs,
    client: reqwest::Client,
    /// contextIds handed out to this run's conversations.
    owned_contexts: Mutex<HashSet<String>>,
    errors: Mutex<BTreeMap<String, u64>>,
    next_conversation: AtomicU64,
    total: u64,
    deadline: Option<Instant>,
    turns_ok: AtomicU64,
    turns_sent: AtomicU64,
    /// Artifact-update events received, in all turns (streaming only).
    chunks: AtomicU64,
}

impl Shared {
    fn error(&self, kind: &str) {
        let mut errors = self.errors.lock().unwrap_or_else(|e| e.into_inner());
        *errors.entry(kind.to_owned()).or_default() += 1;
    }

    fn claim_conversation(&self) -> Option<u64> {
        if self.deadline.is_some_and(|d| Instant::now() >= d) {
            return None;
        }
        let n = self.next_conversation.fetch_add(1, Ordering::Relaxed);
        (n < self.total).then_some(n)
    }
}

/// The run's figures.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Report {
    pub url: String,
    pub version: String,
    pub stream: bool,
    pub conversations: usize,
    pub turns: usize,
    pub conversations_started: u64,
    pub text_bytes: usize,
    pub elapsed_s: f64,
    pub turns_sent: u64,
    pub turns_ok: u64,
    pub turns_per_s: f64,
    pub latency_ms: Latency,
    /// Time to first chunk of good turns (streaming only; `null` otherwise).
    pub ttfc_ms: Option<Ttfc>,
    /// Artifact-update events received in all turns (streaming only).
    pub chunks: u64,
    pub chunks_per_s: f64,
    pub errors: BTreeMap<String, u64>,
    pub error_total: u64,
}

/// Time to first chunk: request sent to the first artifact-update event with text read.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct Ttfc {
    /// Good turns that had a chunk with text (the histogram's sample count).
    pub count: u64,
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub max: f64,
}

#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct Latency {
    pub mean: f64,
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub p999: f64,
    pub max: f64,
}

pub fn run(args: LoadgenArgs) -> Result<ExitCode, CliError> {
    let report = run_report(args.clone())?;
    if !args.json {
        print!("{}", table(&report));
    }
    println!("{}", serde_json::to_string(&report)?);
    Ok(if report.error_total == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(2)
    })
}

/// Runs the load and returns the figures.
pub fn run_report(mut args: LoadgenArgs) -> Result<Report, LoadgenError> {
    if args.context_id.is_some() {
        args.conversations = 1;
    }
    if args.conversations == 0 || args.turns == 0 {
        return Err(LoadgenError::Args(
            "--conversations and --turns must be positive".into(),
        ));
    }
    args.url.retain(|url| !url.trim().is_empty());
    if args.url.is_empty() {
        return Err(LoadgenError::Args("--url names no endpoint".into()));
    }
    if let Some(url) = args
        .url
        .iter()
        .find(|url| !url.starts_with("http://") && !url.starts_with("https://"))
    {
        return Err(LoadgenError::Args(format!(
            "--url {url:?} is not an http(s) URL"
        )));
    }
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get());
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads)
        .enable_all()
        .build()
        .map_err(LoadgenError::Runtime)?;
    runtime.block_on(drive(args))
}

async fn drive(args: LoadgenArgs) -> Result<Report, LoadgenError> {
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(args.conversations)
        .pool_idle_timeout(Duration::from_secs(90))
        .tcp_nodelay(true)
        .timeout(Duration::from_secs_f64(args.timeout_secs.max(0.001)))
        .build()
        .map_err(LoadgenError::Client)?;
    let total = match (args.total, args.duration) {
        (Some(total), _) => total,
        (None, Some(_)) => u64::MAX,
        (None, None) => args.conversations as u64,
    };
    let started = Instant::now();
    let deadline = args.duration.map(|d| started + Duration::from_secs_f64(d));
    let shared = Arc::new(Shared {
        client,
        owned_contexts: Mutex::new(HashSet::new()),
        errors: Mutex::new(BTreeMap::new()),
        next_conversation: AtomicU64::new(0),
        total,
        deadline,
        turns_ok: AtomicU64::new(0),
        turns_sent: AtomicU64::new(0),
        chunks: AtomicU64::new(0),
        args: args.clone(),
    });
    let mut workers = Vec::with_capacity(args.conversations);
    for _ in 0..args.conversations {
        let shared = shared.clone();
        workers.push(tokio::spawn(worker(shared)));
    }
    let mut histogram = new_histogram()?;
    let mut ttfc_histogram = new_histogram()?;
    for worker in workers {
        match worker.await {
            Ok(Ok(h)) => {
                histogram
                    .add(&h.latency)
                    .map_err(|e| LoadgenError::Histogram(e.into()))?;
                ttfc_histogram
                    .add(&h.ttfc)
                    .map_err(|e| LoadgenError::Histogram(e.into()))?;
            }
            Ok(Err(e)) => return Err(e),
            Err(e) => shared.error(&format!("worker_panicked: {e}")),
        }
    }
    let elapsed = started.elapsed().as_secs_f64();
    let errors = shared
        .errors
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone();
    let turns_ok = shared.turns_ok.load(Ordering::Relaxed);
    let ms = |v: u64| v as f64 / 1000.0;
    let latency = if histogram.is_empty() {
        Latency::default()
    } else {
        Latency {
            mean: histogram.mean() / 1000.0,
            p50: ms(histogram.value_at_quantile(0.50)),
            p90: ms(histogram.value_at_quantile(0.90)),
            p99: ms(histogram.value_at_quantile(0.99)),
            p999: ms(histogram.value_at_quantile(0.999)),
            max: ms(histogram.max()),
        }
    };
    let ttfc = args.stream.then(|| {
        if ttfc_histogram.is_empty() {
            Ttfc::default()
        } else {
            Ttfc {
                count: ttfc_histogram.len(),
                p50: ms(ttfc_histogram.value_at_quantile(0.50)),
                p90: ms(ttfc_histogram.value_at_quantile(0.90)),
                p99: ms(ttfc_histogram.value_at_quantile(0.99)),
                max: ms(ttfc_histogram.max()),
            }
        }
    });
    let chunks = shared.chunks.load(Ordering::Relaxed);
    let per_s = |n: u64| {
        if elapsed > 0.0 {
            n as f64 / elapsed
        } else {
            0.0
        }
    };
    Ok(Report {
        url: args.url.join(","),
        version: args.version.clone(),
        stream: args.stream,
        conversations: args.conversations,
        turns: args.turns,
        conversations_started: shared.next_conversation.load(Ordering::Relaxed).min(total),
        text_bytes: args.text_bytes,
        elapsed_s: elapsed,
        turns_sent: shared.turns_sent.load(Ordering::Relaxed),
        turns_ok,
        turns_per_s: per_s(turns_ok),
        latency_ms: latency,
        ttfc_ms: ttfc,
        chunks,
        chunks_per_s: per_s(chunks),
        error_total: errors.values().sum(),
        errors,
    })
}

fn new_histogram() -> Result<Histogram<u64>, LoadgenError> {
    // Microseconds, 1 us to 10 minutes, 3 significant figures.
    Histogram::new_with_bounds(1, 600_000_000, 3).map_err(|e| LoadgenError::Histogram(e.into()))
}

/// One worker's samples, in microseconds.
struct Histograms {
    /// Per good turn: request sent to reply read.
    latency: Histogram<u64>,
    /// Per good streamed turn with a chunk: request sent to the first chunk with text read.
    ttfc: Histogram<u64>,
}

async fn worker(shared: Arc<Shared>) -> Result<Histograms, LoadgenError> {
    let mut histograms = Histograms {
        latency: new_histogram()?,
        ttfc: new_histogram()?,
    };
    while let Some(n) = shared.claim_conversation() {
        conversation(&shared, n, &mut histograms).await;
    }
    Ok(histograms)
}

fn micros(elapsed: Duration) -> u64 {
    u64::try_from(elapsed.as_micros())
        .unwrap_or(u64::MAX)
        .max(1)
}

/// This turn's text: unique to the conversation and turn, padded to `bytes`.
fn turn_text(run: u32, conversation: u64, turn: usize, bytes: usize) -> String {
    let mut text = format!("r{run:08x}-c{conversation}-t{turn}-");
    const FILL: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789 ";
    let mut i = 0;
    while text.len() < bytes {
        text.push(FILL[i % FILL.len()] as char);
        i += 1;
    }
    text
}

static RUN_ID: std::sync::OnceLock<u32> = std::sync::OnceLock::new();

fn run_id() -> u32 {
    *RUN_ID.get_or_init(rand::random::<u32>)
}

async fn conversation(shared: &Shared, n: u64, histograms: &mut Histograms) {
    let args = &shared.args;
    let mut context_id = args.context_id.clone();
    let mut previous: Option<String> = None;
    let url = &args.url[(n % args.url.len() as u64) as usize];
    for turn in 1..=args.turns {
        let text = turn_text(run_id(), n, turn, args.text_bytes);
        shared.turns_sent.fetch_add(1, Ordering::Relaxed);
        let started = Instant::now();
        let result = one_turn(shared, url, &text, context_id.as_deref(), started).await;
        let elapsed = started.elapsed();
        let reply = match result {
            Ok(reply) => reply,
            Err(TurnError::Kind(kind)) => {
                shared.error(&kind);
                return;
            }
        };
        match (&context_id, &reply.context_id) {
            (_, None) => {
                shared.error("missing_context_id");
                return;
            }
            (Some(ours), Some(theirs)) if ours != theirs => {
                shared.error("foreign_context_id");
                return;
            }
            (None, Some(theirs)) => {
                let fresh = shared
                    .owned_contexts
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(theirs.clone());
                if !fresh {
                    shared.error("foreign_context_id");
                    return;
                }
                context_id = Some(theirs.clone());
            }
            _ => {}
        }
        if !args.no_echo_check {
            if !reply.text.contains(&text) {
                shared.error("echo_missing_own_text");
                return;
            }
            if let Some(previous) = &previous
                && !reply.text.contains(&format!("previously: \"{previous}\""))
            {
                shared.error("echo_missing_previous_text");
                return;
            }
        }
        histograms.latency.saturating_record(micros(elapsed));
        if let Some(first_chunk) = reply.first_chunk {
            histograms.ttfc.saturating_record(micros(first_chunk));
        }
        shared.turns_ok.fetch_add(1, Ordering::Relaxed);
        previous = Some(text);
    }
}

struct Reply {
    context_id: Option<String>,
    text: String,
    /// Streaming: from the turn's start to the first artifact-update event with text.
    first_chunk: Option<Duration>,
}

fn request_body(args: &LoadgenArgs, text: &str, context_id: Option<&str>, id: u64) -> Value {
    let v1 = args.version == "1.0";
    let version = if v1 {
        WireVersion::V1
    } else {
        WireVersion::V03
    };
    let mut message = crate::client::user_text_message(text, context_id, None);
    message.message_id = format!("lg-{:016x}-{id}", rand::random::<u64>());
    let method = match (v1, args.stream) {
        (true, false) => "SendMessage",
        (true, true) => "SendStreamingMessage",
        (false, false) => "message/send",
        (false, true) => "message/stream",
    };
    json!({"jsonrpc": "2.0", "id": id, "method": method,
           "params": {"message": codec::encode_message(version, &message)}})
}

static REQUEST_IDS: AtomicU64 = AtomicU64::new(1);

async fn one_turn(
    shared: &Shared,
    url: &str,
    text: &str,
    context_id: Option<&str>,
    started: Instant,
) -> Result<Reply, TurnError> {
    let args = &shared.args;
    let id = REQUEST_IDS.fetch_add(1, Ordering::Relaxed);
    let body = request_body(args, text, context_id, id);
    let mut request = shared.client.post(url).json(&body);
    if args.version == "1.0" {
        request = request.header("A2A-Version", "1.0");
    }
    if let Some(token) = &args.token {
        request = request.bearer_auth(token);
    }
    let response = request.send().await.map_err(|e| {
        TurnError::kind(if e.is_timeout() {
            "timeout"
        } else if e.is_connect() {
            "connect"
        } else {
            "transport"
        })
    })?;
    let status = response.status();
    if !status.is_success() {
        return Err(TurnError::kind(format!("http_{}", status.as_u16())));
    }
    if args.stream {
        stream_reply(response, started, &shared.chunks).await
    } else {
        let bytes = response.bytes().await.map_err(|e| {
            TurnError::kind(if e.is_timeout() {
                "timeout"
            } else {
                "transport"
            })
        })?;
        let value: Value =
            serde_json::from_slice(&bytes).map_err(|_| TurnError::kind("bad_json"))?;
        blocking_reply(&value)
    }
}

fn rpc_error(value: &Value) -> Option<TurnError> {
    let error = value.get("error")?;
    let code = error.get("code").and_then(Value::as_i64).unwrap_or(0);
    Some(TurnError::kind(match code {
        -32010 => "rpc_-32010_context_busy".to_owned(),
        -32011 => "rpc_-32011_overloaded".to_owned(),
        -32016 => "rpc_-32016_store_unavailable".to_owned(),
        code => format!("rpc_{code}"),
    }))
}

fn is_completed(state: &str) -> bool {
    state == "TASK_STATE_COMPLETED" || state == "completed"
}

fn parts_text(parts: &Value) -> String {
    parts
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|p| p.get("text").and_then(Value::as_str))
        .collect()
}

fn artifacts_text(task: &Value) -> String {
    task.get("artifacts")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(|a| parts_text(&a["parts"]))
        .collect()
}

fn blocking_reply(value: &Value) -> Result<Reply, TurnError> {
    if let Some(error) = rpc_error(value) {
        return Err(error);
    }
    let result = value
        .get("result")
        .ok_or_else(|| TurnError::kind("no_result"))?;
    let task = result.get("task").unwrap_or(result);
    let state = task["status"]["state"].as_str().unwrap_or("");
    if !is_completed(state) {
        return Err(TurnError::kind(format!("state_{state}")));
    }
    Ok(Reply {
        context_id: task
            .get("contextId")
            .and_then(Value::as_str)
            .map(str::to_owned),
        text: artifacts_text(task),
        first_chunk: None,
    })
}

/// Reads an SSE answer to its end: the final state, the contextId every event carries, and
/// the reply text put together from the artifact chunks. Counts each artifact-update event in
/// `chunks` and notes when the first one with text arrived (measured from `started`).
async fn stream_reply(
    response: reqwest::Response,
    started: Instant,
    chunks: &AtomicU64,
) -> Result<Reply, TurnError> {
    use futures_util::StreamExt;
    let mut body = response.bytes_stream();
    let mut buffer: Vec<u8> = Vec::new();
    let mut context_id: Option<String> = None;
    let mut text = String::new();
    let mut state = String::new();
    let mut foreign = false;
    let mut first_chunk: Option<Duration> = None;
    while let Some(chunk) = body.next().await {
        let chunk = chunk.map_err(|e| {
            TurnError::kind(if e.is_timeout() {
                "timeout"
            } else {
                "transport"
            })
        })?;
        buffer.extend_from_slice(&chunk);
        while let Some(end) = find_event_end(&buffer) {
            let event: Vec<u8> = buffer.drain(..end.0 + end.1).collect();
            let event = String::from_utf8_lossy(&event[..end.0]).into_owned();
            for line in event.lines() {
                let Some(data) = line.strip_prefix("data:") else {
                    continue;
                };
                let value: Value = serde_json::from_str(data.trim_start())
                    .map_err(|_| TurnError::kind("bad_sse_json"))?;
                if let Some(error) = rpc_error(&value) {
                    return Err(error);
                }
                let result = &value["result"];
                let (kind, item) = stream_item(result);
                if let Some(cid) = item.get("contextId").and_then(Value::as_str) {
                    match &context_id {
                        Some(seen) if seen != cid => foreign = true,
                        Some(_) => {}
                        None => context_id = Some(cid.to_owned()),
                    }
                }
                match kind {
                    "task" => {
                        text = artifacts_text(item);
                        if let Some(s) = item["status"]["state"].as_str() {
                            state = s.to_owned();
                        }
                    }
                    "status" => {
                        if let Some(s) = item["status"]["state"].as_str() {
                            state = s.to_owned();
                        }
                    }
                    "artifact" => {
                        let chunk = parts_text(&item["artifact"]["parts"]);
                        chunks.fetch_add(1, Ordering::Relaxed);
                        if first_chunk.is_none() && !chunk.is_empty() {
                            first_chunk = Some(started.elapsed());
                        }
                        if item.get("append").and_then(Value::as_bool) == Some(true) {
                            text.push_str(&chunk);
                        } else {
                            text = chunk;
                        }
                    }
                    "message" => {
                        text = parts_text(&item["parts"]);
                        state = "completed".into();
                    }
                    _ => return Err(TurnError::kind("unknown_sse_event")),
                }
            }
        }
    }
    if foreign {
        return Err(TurnError::kind("foreign_context_id_in_stream"));
    }
    if !is_completed(&state) {
        return Err(TurnError::kind(format!("stream_state_{state}")));
    }
    Ok(Reply {
        context_id,
        text,
        first_chunk,
    })
}

/// The end of the first complete event in `buffer`: (its length, the separator's length).
fn find_event_end(buffer: &[u8]) -> Option<(usize, usize)> {
    let lf = buffer.windows(2).position(|w| w == b"\n\n").map(|p| (p, 2));
    let crlf = buffer
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map(|p| (p, 4));
    match (lf, crlf) {
        (Some(a), Some(b)) => Some(if a.0 <= b.0 { a } else { b }),
        (a, b) => a.or(b),
    }
}

/// A stream event's kind and body, for both wire versions.
fn stream_item(result: &Value) -> (&'static str, &Value) {
    for (field, kind) in [
        ("task", "task"),
        ("statusUpdate", "status"),
        ("artifactUpdate", "artifact"),
        ("message", "message"),
    ] {
        if let Some(item) = result.get(field) {
            return (kind, item);
        }
    }
    let kind = match result.get("kind").and_then(Value::as_str) {
        Some("task") => "task",
        Some("status-update") => "status",
        Some("artifact-update") => "artifact",
        Some("message") => "message",
        _ => "unknown",
    };
    (kind, result)
}

/// The readable form of a report.
pub fn table(report: &Report) -> String {
    let mut out = String::new();
    let l = &report.latency_ms;
    out.push_str(&format!(
        "loadgen {} v{}{}: {} in flight x {} turns, {} B texts, {} conversations\n",
        report.url,
        report.version,
        if report.stream { " (stream)" } else { "" },
        report.conversations,
        report.turns,
        report.text_bytes,
        report.conversations_started,
    ));
    out.push_str(&format!(
        "  turns ok / sent   {:>10} / {}\n  elapsed           {:>10.2} s\n  turns/s           {:>10.1}\n",
        report.turns_ok, report.turns_sent, report.elapsed_s, report.turns_per_s
    ));
    out.push_str(&format!(
        "  latency ms        mean {:.2}  p50 {:.2}  p90 {:.2}  p99 {:.2}  p999 {:.2}  max {:.2}\n",
        l.mean, l.p50, l.p90, l.p99, l.p999, l.max
    ));
    if let Some(t) = &report.ttfc_ms {
        out.push_str(&format!(
            "  first chunk ms    p50 {:.2}  p90 {:.2}  p99 {:.2}  max {:.2}  ({} turns)\n",
            t.p50, t.p90, t.p99, t.max, t.count
        ));
        out.push_str(&format!(
            "  chunks            {:>10}\n  chunks/s          {:>10.1}\n",
            report.chunks, report.chunks_per_s
        ));
    }
    if report.errors.is_empty() {
        out.push_str("  errors            0\n");
    } else {
        out.push_str(&format!("  errors            {}\n", report.error_total));
        for (kind, count) in &report.errors {
            out.push_str(&format!("    {kind:<30} {count}\n"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn texts_are_unique_and_sized() {
        let a = turn_text(1, 3, 1, 200);
        let b = turn_text(1, 3, 2, 200);
        let c = turn_text(1, 31, 1, 200);
        assert_eq!(a.len(), 200);
        assert_ne!(a, b);
        assert!(!c.starts_with(&a[..a.find("-t").unwrap_or(0) + 2]));
    }

    #[test]
    fn sse_events_split() {
        assert_eq!(find_event_end(b"data: 1\n\ndata: 2"), Some((7, 2)));
        assert_eq!(find_event_end(b"data: 1\r\n\r\n"), Some((7, 4)));
        assert_eq!(find_event_end(b"data: 1\n"), None);
    }

    #[test]
    fn replies_of_both_versions() {
        let v1 = json!({"result": {"task": {"contextId": "c", "status": {"state": "TASK_STATE_COMPLETED"},
                 "artifacts": [{"parts": [{"text": "echo: x"}]}]}}});
        let reply = blocking_reply(&v1).map_err(|e| format!("{e:?}")).unwrap();
        assert_eq!(reply.text, "echo: x");
        let v03 =
            json!({"result": {"kind": "task", "contextId": "c", "status": {"state": "failed"}}});
        assert!(blocking_reply(&v03).is_err());
        let busy = json!({"error": {"code": -32010}});
        assert!(matches!(blocking_reply(&busy), Err(TurnError::Kind(k)) if k.contains("busy")));
    }
}
