//! colloquy's engine benchmarks (criterion): `cargo bench --bench engine`.
//!
//! - `history/render_last_20/{10,1000,100000}`: load the last 20 messages of a conversation with
//!   that many stored messages from a real sled store and render the guarded prompt. Rendering
//!   is one reverse range scan, so the three times should be about equal.
//! - `durable_append/{1,64}_writers`: appends, each applied and then awaited durable (group
//!   commit), from 1 or 64 concurrent tokio tasks. Throughput is writes/s; the flushes per write
//!   (from the store's `colloquy_store_flushes_total` counter) are printed after each run.
//! - `turn/echo`: one in-process turn through the `Engine` with the echo agent (persist the user
//!   message durably, render history, run the agent, persist the reply durably), in an actix
//!   System.

use colloquy::agent::{EchoAgent, SharedAgent};
use colloquy::engine::{ANONYMOUS, Engine, EngineConfig};
use colloquy::history::{HistoryEntry, HistoryLimits, render_prompt};
use colloquy::model::{Message, Part, Role};
use colloquy::store::ConversationRecords;
use colloquy::store::embedded::{EmbeddedStore, Existing};
use colloquy::store::{ConversationKey, ConversationMeta};
use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use metrics::{Counter, CounterFn, Gauge, Histogram, Key, KeyName, Metadata, SharedString, Unit};
use std::hint::black_box;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

const CACHE_BYTES: u64 = 256 << 20;

// ---- a tiny metrics recorder: counts the store's flushes and writes ----

static FLUSHES: AtomicU64 = AtomicU64::new(0);
static WRITES: AtomicU64 = AtomicU64::new(0);

struct Count(&'static AtomicU64);

impl CounterFn for Count {
    fn increment(&self, value: u64) {
        self.0.fetch_add(value, Ordering::Relaxed);
    }
    fn absolute(&self, value: u64) {
        self.0.store(value, Ordering::Relaxed);
    }
}

struct StoreCounters;

impl metrics::Recorder for StoreCounters {
    fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}

    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
        match key.name() {
            "colloquy_store_flushes_total" => Counter::from_arc(Arc::new(Count(&FLUSHES))),
            "colloquy_store_writes_total" => Counter::from_arc(Arc::new(Count(&WRITES))),
            _ => Counter::noop(),
        }
    }
    fn register_gauge(&self, _: &Key, _: &Metadata<'_>) -> Gauge {
        Gauge::noop()
    }
    fn register_histogram(&self, _: &Key, _: &Metadata<'_>) -> Histogram {
        Histogram::noop()
    }
}

fn install_counters() {
    // The flusher runs on its own thread, so the recorder must be the global one.
    let _ = metrics::set_global_recorder(StoreCounters);
}

// ---- fixtures ----

fn message(role: Role, text: String, context_id: &str) -> Message {
    Message {
        message_id: uuid::Uuid::new_v4().to_string(),
        role,
        parts: vec![Part::text(text)],
        context_id: Some(context_id.to_owned()),
        task_id: None,
        reference_task_ids: Vec::new(),
        metadata: None,
        extensions: Vec::new(),
        timestamp: Some(colloquy::model::now()),
    }
}

/// A conversation of `count` alternating user/agent messages, written in batches of 1,000.
fn build_conversation(
    runtime: &tokio::runtime::Runtime,
    store: &EmbeddedStore,
    context_id: &str,
    count: u64,
) -> ConversationKey {
    let mut meta = ConversationMeta::new(ANONYMOUS, context_id);
    let mut seq = 0;
    while seq < count {
        let first_seq = seq;
        let mut messages = Vec::new();
        for _ in 0..1000.min(count - seq) {
            let role = if seq % 2 == 0 {
                Role::User
            } else {
                Role::Agent
            };
            let text = format!(
                "message {seq} of {context_id}: what time is the meeting tomorrow, and which room?"
            );
            messages.push(message(role, text, context_id));
            seq += 1;
        }
        meta.next_seq = seq;
        let import = ConversationRecords {
            meta: meta.clone(),
            first_seq,
            messages,
            tasks: Vec::new(),
        };
        runtime
            .block_on(store.import(vec![import], Existing::Overwrite))
            .expect("import");
    }
    meta.key()
}

fn tokio_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime")
}

// ---- (a) history rendering does not grow with the conversation ----

fn history(c: &mut Criterion) {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = EmbeddedStore::open_sled(dir.path(), CACHE_BYTES).expect("store opens");
    let runtime = tokio_runtime();
    let sizes = [10u64, 1_000, 100_000];
    let started = Instant::now();
    let keys: Vec<(u64, ConversationKey)> = sizes
        .iter()
        .map(|&n| {
            (
                n,
                build_conversation(&runtime, &store, &format!("ctx-{n}"), n),
            )
        })
        .collect();
    eprintln!(
        "history: stored {} messages in {:.1?}",
        sizes.iter().sum::<u64>(),
        started.elapsed()
    );
    let limits = HistoryLimits::default();
    let mut group = c.benchmark_group("history");
    group
        .sample_size(50)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(4));
    for (n, key) in &keys {
        group.bench_with_input(BenchmarkId::new("render_last_20", n), key, |b, key| {
            b.iter(|| {
                let recent = runtime
                    .block_on(store.recent_messages(*key, limits.limit))
                    .expect("recent messages");
                let entries: Vec<HistoryEntry> = recent.iter().map(HistoryEntry::from).collect();
                assert_eq!(entries.len(), limits.limit.min(*n as usize));
                black_box(render_prompt(&entries, "Which room?", limits))
            })
        });
    }
    group.finish();
}

// ---- (b) durable appends share flushes ----

fn durable_append(c: &mut Criterion) {
    install_counters();
    let dir = tempfile::tempdir().expect("temp dir");
    let store = EmbeddedStore::open_sled(dir.path(), CACHE_BYTES).expect("store opens");
    let runtime = tokio_runtime();
    let mut group = c.benchmark_group("durable_append");
    group
        .sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(8))
        .throughput(Throughput::Elements(1));
    for writers in [1u64, 64] {
        let (writes_before, flushes_before) = (
            WRITES.load(Ordering::Relaxed),
            FLUSHES.load(Ordering::Relaxed),
        );
        let next_seq = Arc::new(AtomicU64::new(0));
        group.bench_function(
            BenchmarkId::from_parameter(format!("{writers}_writers")),
            |b| {
                b.iter_custom(|iters| {
                    runtime.block_on(async {
                        let per_writer = iters.div_ceil(writers);
                        let started = Instant::now();
                        let tasks: Vec<_> = (0..writers)
                            .map(|w| {
                                let store = store.clone();
                                let next_seq = next_seq.clone();
                                tokio::spawn(async move {
                                    let context_id = format!("writer-{writers}-{w}");
                                    let mut meta = ConversationMeta::new(ANONYMOUS, &context_id);
                                    for _ in 0..per_writer {
                                        let seq = next_seq.fetch_add(1, Ordering::Relaxed);
                                        let text = format!("a durable append, number {seq}");
                                        meta.next_seq = seq + 1;
                                        let import = ConversationRecords {
                                            meta: meta.clone(),
                                            first_seq: seq,
                                            messages: vec![message(Role::User, text, &context_id)],
                                            tasks: Vec::new(),
                                        };
                                        store
                                            .import(vec![import], Existing::Overwrite)
                                            .await
                                            .expect("durable");
                                    }
                                })
                            })
                            .collect();
                        for task in tasks {
                            task.await.expect("writer task");
                        }
                        // Time per write, over the writes actually made.
                        started
                            .elapsed()
                            .mul_f64(iters as f64 / (per_writer * writers) as f64)
                    })
                })
            },
        );
        let writes = WRITES.load(Ordering::Relaxed) - writes_before;
        let flushes = FLUSHES.load(Ordering::Relaxed) - flushes_before;
        eprintln!(
            "durable_append/{writers}_writers: {writes} writes, {flushes} flushes, {:.3} flushes per write",
            flushes as f64 / writes.max(1) as f64
        );
    }
    group.finish();
}

// ---- (c) one in-process turn with the echo agent ----

fn turn(c: &mut Criterion) {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = EmbeddedStore::open_sled(dir.path(), CACHE_BYTES).expect("store opens");
    let system = actix_rt::System::new();
    let agent: SharedAgent = Arc::new(EchoAgent::default());
    let engine = system.block_on(async {
        Engine::start(
            Arc::new(store),
            agent,
            EngineConfig {
                arbiters: 2,
                ..EngineConfig::default()
            },
        )
    });
    let context_id = "ctx-bench-turn";
    let send_turn = |n: u64| {
        let engine = engine.clone();
        async move {
            let text = format!("turn {n}: which room is the meeting in?");
            let valid = engine
                .validate(message(Role::User, text, context_id))
                .expect("a valid message");
            let hub = engine.send(ANONYMOUS, valid).await.expect("turn starts");
            let result = hub.wait_final().await;
            assert!(
                matches!(result.as_deref(), Some(colloquy::model::SendResult::Task(t)) if t.status.state == colloquy::model::TaskState::Completed),
                "the turn completes: {result:?}"
            );
        }
    };
    let counter = AtomicU64::new(0);
    let mut group = c.benchmark_group("turn");
    group
        .sample_size(20)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(8));
    group.bench_function("echo", |b| {
        b.iter_custom(|iters| {
            system.block_on(async {
                let started = Instant::now();
                for _ in 0..iters {
                    send_turn(counter.fetch_add(1, Ordering::Relaxed)).await;
                }
                started.elapsed()
            })
        })
    });
    group.finish();
    system.block_on(engine.shutdown(Duration::from_secs(5)));
}

criterion_group!(benches, history, durable_append, turn);
criterion_main!(benches);
