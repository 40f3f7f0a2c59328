//! Fills a data folder through the embedded store's bulk load (`EmbeddedStore::import`), fast, for the start-up and history
//! measurements (no server, no HTTP).
//!
//! ```text
//! cargo bench --bench fill_store -- --data DIR --conversations 1000000 [--messages 2] [--prefix bulk]
//! ```
//! Writes `--conversations` conversations of the anonymous principal, with contextIds
//! `<prefix>-<n>`, each holding `--messages` messages (user and agent, alternating), as the engine
//! stores them after that many completed turns. Tasks are not written (only history is needed).
//! `--batch OPS` sets the messages per atomic write (default 20,000).

use colloquy::engine::ANONYMOUS;
use colloquy::model::{Message, Part, Role};
use colloquy::store::ConversationMeta;
use colloquy::store::ConversationRecords;
use colloquy::store::embedded::{EmbeddedStore, Existing};
use std::path::PathBuf;
use std::time::Instant;

fn message(role: Role, context_id: &str, text: String) -> Message {
    let mut message = Message::agent_text(text, context_id, None);
    message.role = role;
    if role == Role::User {
        message.parts = vec![Part::text(message.text())];
    }
    message
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut data: Option<PathBuf> = None;
    let mut conversations: u64 = 1;
    let mut messages: u64 = 2;
    let mut prefix = "bulk".to_owned();
    let mut batch_ops: u64 = 20_000;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--data" => data = args.next().map(PathBuf::from),
            "--conversations" => conversations = args.next().ok_or("value")?.parse()?,
            "--messages" => messages = args.next().ok_or("value")?.parse()?,
            "--prefix" => prefix = args.next().ok_or("value")?,
            "--batch" => batch_ops = args.next().ok_or("value")?.parse()?,
            _ => {}
        }
    }
    let data = data.ok_or("--data DIR is required")?;
    let store = EmbeddedStore::open_sled(&data, 64 * 1024 * 1024)?;
    let started = Instant::now();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    let mut batch = Vec::new();
    let mut in_batch = 0u64;
    for n in 0..conversations {
        let context_id = format!("{prefix}-{n}");
        let mut meta = ConversationMeta::new(ANONYMOUS, &context_id);
        let history = (0..messages)
            .map(|seq| {
                let turn = seq / 2 + 1;
                if seq % 2 == 0 {
                    message(
                        Role::User,
                        &context_id,
                        format!("{context_id} message {turn}"),
                    )
                } else {
                    let text = format!("echo: {context_id} message {turn} (turn {turn})");
                    message(Role::Agent, &context_id, text)
                }
            })
            .collect();
        meta.next_seq = messages;
        meta.turns = messages.div_ceil(2);
        batch.push(ConversationRecords {
            meta,
            first_seq: 0,
            messages: history,
            tasks: Vec::new(),
        });
        in_batch += messages + 1;
        if in_batch >= batch_ops {
            runtime.block_on(store.import(std::mem::take(&mut batch), Existing::Overwrite))?;
            in_batch = 0;
        }
        if n > 0 && n % 200_000 == 0 {
            eprintln!(
                "{n} conversations, {:.1} s",
                started.elapsed().as_secs_f64()
            );
        }
    }
    runtime.block_on(store.import(batch, Existing::Overwrite))?;
    let rss = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .map(|l| l.trim_start_matches("VmRSS:").trim().to_owned())
        })
        .unwrap_or_default();
    eprintln!(
        "filled {conversations} conversations x {messages} messages in {:.1} s; {} bytes on disk; RSS {rss}",
        started.elapsed().as_secs_f64(),
        runtime.block_on(colloquy::store::ConversationStore::size_on_disk(&store))?
    );
    Ok(())
}
