//! The peer `benches/compare.sh` measures colloquy against: the official Rust A2A SDK
//! (`a2a-server-lf`, its `DefaultRequestHandler`, JSON-RPC router and in-memory task store)
//! serving an echo agent that answers the way colloquy's built-in echo agent does, so
//! `colloquy loadgen`'s echo check passes against both.
//!
//! ```text
//! sdk_echo --listen 127.0.0.1:18092 [--workers 2]
//! ```
//! A2A v1.0 JSON-RPC at `/` (POST). Nothing durable: tasks live in the SDK's in-memory store
//! and nothing is written to disk. The only state of its own is each context's turn count and
//! last user text, which the reply must quote (`previously: "..."`): the SDK starts a new task
//! per message, so a continuation by `contextId` alone carries no history to read it from.
//! Two tokio workers by default, as `colloquy serve` runs on the benchmark's 2-core machine.

use a2a::{Artifact, Part, StreamResponse, Task, TaskState, TaskStatus, new_artifact_id};
use a2a_server::{AgentExecutor, DefaultRequestHandler, ExecutorContext, InMemoryTaskStore};
use axum::serve::ListenerExt;
use futures::stream::{self, BoxStream};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

#[derive(Default)]
struct Echo {
    /// contextId -> (turns so far, last user text).
    contexts: Mutex<HashMap<String, (u64, String)>>,
}

impl AgentExecutor for Echo {
    fn execute(
        &self,
        ctx: ExecutorContext,
    ) -> BoxStream<'static, Result<StreamResponse, a2a::A2AError>> {
        let text: String = ctx
            .message
            .iter()
            .flat_map(|m| m.parts.iter().filter_map(Part::as_text))
            .collect();
        let reply = {
            let mut contexts = self.contexts.lock().unwrap_or_else(|e| e.into_inner());
            let (turn, last) = contexts.entry(ctx.context_id.clone()).or_default();
            *turn += 1;
            let reply = if *turn == 1 {
                format!("echo: {text} (turn 1)")
            } else {
                format!("echo: {text} (turn {turn}; previously: \"{last}\")")
            };
            *last = text;
            reply
        };
        let task = Task {
            id: ctx.task_id,
            context_id: ctx.context_id,
            status: TaskStatus {
                state: TaskState::Completed,
                message: None,
                timestamp: None,
            },
            artifacts: Some(vec![Artifact {
                artifact_id: new_artifact_id(),
                name: None,
                description: None,
                parts: vec![Part::text(reply)],
                metadata: None,
                extensions: None,
            }]),
            history: ctx.stored_task.and_then(|t| t.history),
            metadata: None,
        };
        Box::pin(stream::once(async move { Ok(StreamResponse::Task(task)) }))
    }

    fn cancel(
        &self,
        ctx: ExecutorContext,
    ) -> BoxStream<'static, Result<StreamResponse, a2a::A2AError>> {
        let mut task = ctx.stored_task.unwrap_or_else(|| Task {
            id: ctx.task_id,
            context_id: ctx.context_id,
            status: TaskStatus {
                state: TaskState::Canceled,
                message: None,
                timestamp: None,
            },
            artifacts: None,
            history: None,
            metadata: None,
        });
        task.status.state = TaskState::Canceled;
        Box::pin(stream::once(async move { Ok(StreamResponse::Task(task)) }))
    }
}

fn usage() -> ! {
    eprintln!("usage: sdk_echo --listen HOST:PORT [--workers N]");
    std::process::exit(2);
}

fn main() -> std::io::Result<()> {
    let mut listen = String::from("127.0.0.1:18092");
    let mut workers = 2;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match (arg.as_str(), args.next()) {
            ("--listen", Some(addr)) => listen = addr,
            ("--workers", Some(n)) => match n.parse::<usize>() {
                Ok(n) if n > 0 => workers = n,
                _ => usage(),
            },
            _ => usage(),
        }
    }
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .enable_all()
        .build()?
        .block_on(async {
            let handler = DefaultRequestHandler::new(Echo::default(), InMemoryTaskStore::new());
            let app = a2a_server::jsonrpc::jsonrpc_router(Arc::new(handler));
            let listener = tokio::net::TcpListener::bind(&listen).await?;
            eprintln!("sdk_echo listening on {}", listener.local_addr()?);
            // TCP_NODELAY on accepted connections, as colloquy sets it (axum does not by default).
            let listener = listener.tap_io(|tcp| {
                let _ = tcp.set_nodelay(true);
            });
            axum::serve(listener, app).await
        })
}
