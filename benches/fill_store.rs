//! Fills a data folder through the library's `Store` API, fast, for the start-up and history
//! measurements (no server, no HTTP).
//!
//! ```text
//! cargo bench --bench fill_store -- --data DIR --conversations 1000000 [--messages 2] [--prefix bulk]
//! ```
//! Writes `--conversations` conversations of the anonymous principal, with contextIds
//! `<prefix>-<n>`, each holding `--messages` messages (user and agent, alternating), as the engine
//! stores them after that many completed turns. Tasks are not written (only history is needed).
//! `--batch OPS` sets the writes per atomic batch (default 20,000; the engine writes about 8).

use colloquy::engine::ANONYMOUS;
use colloquy::model::{Message, Part, Role};
use colloquy::store::{ConversationMeta, Store, WriteBatch};
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
    let store = Store::open_sled(&data, 64 * 1024 * 1024)?;
    let started = Instant::now();
    let runtime = tokio::runtime::Builder::new_current_thread().build()?;
    let mut batch = WriteBatch::new();
    let mut in_batch = 0u64;
    for n in 0..conversations {
        let context_id = format!("{prefix}-{n}");
        let mut meta = ConversationMeta::new(ANONYMOUS, &context_id);
        let key = meta.key();
        for seq in 0..messages {
            let turn = seq / 2 + 1;
            let (role, text) = if seq % 2 == 0 {
                (Role::User, format!("{context_id} message {turn}"))
            } else {
                (
                    Role::Agent,
                    format!("echo: {context_id} message {turn} (turn {turn})"),
                )
            };
            batch.append_message(&key, seq, &message(role, &context_id, text));
            in_batch += 1;
            if in_batch >= batch_ops {
                store.apply(std::mem::take(&mut batch))?;
                in_batch = 0;
            }
        }
        meta.next_seq = messages;
        meta.turns = messages.div_ceil(2);
        batch.put_conversation(&meta, None);
        in_batch += 2;
        if in_batch >= batch_ops {
            store.apply(std::mem::take(&mut batch))?;
            in_batch = 0;
        }
        if n > 0 && n % 200_000 == 0 {
            eprintln!(
                "{n} conversations, {:.1} s",
                started.elapsed().as_secs_f64()
            );
        }
    }
    store.apply(batch)?;
    runtime.block_on(store.durable())?;
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
        store.size_on_disk()?
    );
    Ok(())
}
