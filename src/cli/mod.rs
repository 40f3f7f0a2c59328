//! The `colloquy` command line: `serve` (the default), the store commands, `send`.

mod healthcheck;
mod loadgen;
mod send;
mod serve;
mod store_commands;
mod transfer;

pub use crate::app::build_agent;
pub use transfer::ImportError;

use clap::{Args, Parser, Subcommand};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Parser, Debug)]
#[command(
    name = "colloquy",
    version,
    about = "A2A conversation engine: multi-turn A2A with one actor per contextId"
)]
#[command(args_conflicts_with_subcommands = true)]
pub struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    serve: serve::ServeArgs,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Serve A2A JSON-RPC (the default when no subcommand is given).
    Serve(serve::ServeArgs),
    /// List stored conversations, newest first (on a stopped server's data folder).
    Conversations(store_commands::ListArgs),
    /// Show one conversation's messages.
    History(store_commands::HistoryArgs),
    /// Delete one conversation and its tasks.
    Delete(store_commands::DeleteArgs),
    /// Write conversations, messages and tasks as JSON lines (all, or one principal's).
    Export(transfer::ExportArgs),
    /// Read an export into the store the config names (sled `data`, or `store.url`); again is
    /// harmless: conversations already stored are left as they are.
    Import(transfer::ImportArgs),
    /// Create or upgrade the PostgreSQL schema of store.url (servers also do it at start).
    Migrate(store_commands::MigrateArgs),
    /// Send a message to an A2A agent: a configured peer, a2a:NAME, a URL or a ctx-... session.
    ///
    /// Exit status: 0 answered (completed or waiting for input), 1 local error, 2 target or usage
    /// error (nothing sent), 3 connection refused / timeout / TLS, 4 HTTP 401 or missing token,
    /// 5 the peer's JSON-RPC or protocol error, 6 the task failed, was rejected or canceled.
    Send(send::SendArgs),
    /// Drive many multi-turn conversations against a server and report turns/s and latency.
    Loadgen(loadgen::LoadgenArgs),
    /// Ask a running server's /healthz (the container's HEALTHCHECK): exit 0 on 200, else 1.
    Healthcheck(healthcheck::HealthcheckArgs),
}

/// Where the store commands find the data folder.
#[derive(Args, Debug, Clone)]
pub struct StoreArgs {
    /// Data folder (default: from the config, else ./colloquy-data).
    #[arg(long)]
    data: Option<PathBuf>,
    /// The principal whose conversations to show (default: anonymous, the principal without auth).
    #[arg(long, default_value = crate::model::ANONYMOUS)]
    principal: String,
    /// The tenant (v1.0's `tenant`) whose conversations to show (default: the default tenant).
    #[arg(long)]
    tenant: Option<String>,
    #[arg(long)]
    config: Option<PathBuf>,
}

impl StoreArgs {
    /// The principal the store knows the conversations by.
    fn stored_principal(&self) -> String {
        crate::model::principal_in_tenant(&self.principal, self.tenant.as_deref())
    }
}

/// Why a command failed. `main` prints it with its causes.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// A refusal said in words (no such conversation, a server that is not healthy).
    #[error("{0}")]
    Refused(String),
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    #[error(transparent)]
    Store(#[from] crate::store::StoreError),
    #[error(transparent)]
    Agent(#[from] crate::app::AgentSetupError),
    #[error(transparent)]
    Start(#[from] crate::app::StartError),
    #[error(transparent)]
    Traces(#[from] crate::telemetry::traces::TracesError),
    #[error(transparent)]
    Loadgen(#[from] loadgen::LoadgenError),
    #[error(transparent)]
    Import(#[from] ImportError),
    #[error("starting the runtime: {0}")]
    Runtime(#[source] std::io::Error),
    #[error("{path}: {source}")]
    File {
        path: String,
        source: std::io::Error,
    },
    #[error(
        "opening {path}: {source} (is a server running on it? use the colloquy/* JSON-RPC methods then)"
    )]
    Locked {
        path: String,
        source: crate::store::StoreError,
    },
    #[error("writing the export: {0}")]
    Write(#[source] std::io::Error),
    #[error(transparent)]
    Json(#[from] serde_json::Error),
    #[error("building the HTTP client: {0}")]
    HttpClient(#[source] reqwest::Error),
    #[error("{url}: {source}")]
    Request { url: String, source: reqwest::Error },
}

/// Runs the command the arguments name.
pub fn run() -> Result<ExitCode, CliError> {
    let cli = Cli::parse();
    match cli.command {
        None => serve::run(cli.serve),
        Some(Command::Serve(args)) => serve::run(args),
        Some(Command::Conversations(args)) => store_commands::list(args),
        Some(Command::History(args)) => store_commands::history(args),
        Some(Command::Delete(args)) => store_commands::delete(args),
        Some(Command::Export(args)) => transfer::export(args),
        Some(Command::Import(args)) => transfer::import(args),
        Some(Command::Migrate(args)) => store_commands::migrate(args),
        Some(Command::Send(args)) => send::run(args),
        Some(Command::Loadgen(args)) => loadgen::run(args),
        Some(Command::Healthcheck(args)) => healthcheck::run(args),
    }
}
