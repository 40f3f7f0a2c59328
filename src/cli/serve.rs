//! `colloquy serve`.

use super::CliError;
use crate::app::build_agent;
use crate::config::Config;
use clap::Args;
use serde_json::{Map, Value, json};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

#[derive(Args, Debug, Clone, Default)]
pub struct ServeArgs {
    /// Address to listen on [default: 127.0.0.1:8080].
    #[arg(long)]
    listen: Option<String>,
    /// Address for the gRPC binding; empty serves none [default: 127.0.0.1:8081].
    #[arg(long)]
    grpc_listen: Option<String>,
    /// Data folder of the embedded store [default: ./colloquy-data].
    #[arg(long)]
    data: Option<PathBuf>,
    /// Agent backend: echo, exec, openai or a2a [default: echo].
    #[arg(long)]
    agent: Option<String>,
    /// TOML configuration file.
    #[arg(long)]
    config: Option<PathBuf>,
    /// The URL the agent card advertises [default: from the request's Host].
    #[arg(long)]
    public_url: Option<String>,
    /// Earlier messages shown to the agent (0 = off, at most 200) [default: 20].
    #[arg(long)]
    history_limit: Option<usize>,
    /// Characters of each earlier message shown [default: 4000].
    #[arg(long)]
    history_max_chars: Option<usize>,
    /// Seconds before an idle conversation's actor stops [default: 30].
    #[arg(long)]
    idle_timeout_secs: Option<u64>,
    /// Echo backend: characters per streamed chunk (0 = one chunk).
    #[arg(long)]
    echo_chunk_chars: Option<usize>,
    /// Echo backend: pause before each chunk, in milliseconds.
    #[arg(long)]
    echo_delay_ms: Option<u64>,
    /// Listen on a non-loopback address without tokens.
    #[arg(long)]
    allow_unauthenticated: bool,
    /// Log format: pretty or json [default: pretty].
    #[arg(long)]
    log_format: Option<String>,
    /// exec backend: the program and its arguments, after `--`.
    #[arg(last = true)]
    command: Vec<String>,
}

impl ServeArgs {
    /// The flags that were given, as a config layer over file and environment.
    fn overrides(&self) -> Value {
        let mut top = Map::new();
        let put = |map: &mut Map<String, Value>, key: &str, value: Option<Value>| {
            if let Some(value) = value {
                map.insert(key.to_owned(), value);
            }
        };
        put(&mut top, "listen", self.listen.as_ref().map(|v| json!(v)));
        put(
            &mut top,
            "grpc_listen",
            self.grpc_listen.as_ref().map(|v| json!(v)),
        );
        put(&mut top, "data", self.data.as_ref().map(|v| json!(v)));
        put(
            &mut top,
            "public_url",
            self.public_url.as_ref().map(|v| json!(v)),
        );
        put(
            &mut top,
            "log_format",
            self.log_format.as_ref().map(|v| json!(v)),
        );
        if self.allow_unauthenticated {
            top.insert("allow_unauthenticated".into(), json!(true));
        }
        let mut history = Map::new();
        put(&mut history, "limit", self.history_limit.map(|v| json!(v)));
        put(
            &mut history,
            "max_chars",
            self.history_max_chars.map(|v| json!(v)),
        );
        let mut contexts = Map::new();
        put(
            &mut contexts,
            "idle_timeout_secs",
            self.idle_timeout_secs.map(|v| json!(v)),
        );
        let mut echo = Map::new();
        put(
            &mut echo,
            "chunk_chars",
            self.echo_chunk_chars.map(|v| json!(v)),
        );
        put(&mut echo, "delay_ms", self.echo_delay_ms.map(|v| json!(v)));
        let mut agent = Map::new();
        put(&mut agent, "kind", self.agent.as_ref().map(|v| json!(v)));
        if !self.command.is_empty() {
            agent.insert("command".into(), json!(self.command));
        }
        if !echo.is_empty() {
            agent.insert("echo".into(), Value::Object(echo));
        }
        for (key, section) in [
            ("history", history),
            ("contexts", contexts),
            ("agent", agent),
        ] {
            if !section.is_empty() {
                top.insert(key.into(), Value::Object(section));
            }
        }
        Value::Object(top)
    }
}

pub fn run(args: ServeArgs) -> Result<ExitCode, CliError> {
    let config = Config::load(args.config.as_deref(), args.overrides())?;
    let traces = crate::telemetry::traces::install(&config.telemetry, &config.log_format)?;
    let ignored = crate::config::ignored_environment();
    if !ignored.is_empty() {
        tracing::warn!(
            variables = %ignored.join(", "),
            "ignoring COLLOQUY_* environment variables that name no configuration key"
        );
    }
    let agent = build_agent(&config)?;
    // `stop` keeps to the grace and CLOSE_MARGIN by itself; past this the process exits anyway
    // (every acknowledged write is already durable).
    let stop_deadline =
        Duration::from_secs(config.shutdown.grace_secs) + crate::http::CLOSE_MARGIN + STOP_OVERRUN;
    let system = actix_rt::System::new();
    let code = system.block_on(async move {
        let server = crate::app::start(config, agent).await?;
        wait_for_signal().await;
        tracing::info!("shutting down: finishing running turns");
        if tokio::time::timeout(stop_deadline, server.stop())
            .await
            .is_err()
        {
            tracing::error!(
                deadline_secs = stop_deadline.as_secs(),
                "shutdown overran its deadline; exiting without waiting further"
            );
            return Ok(ExitCode::FAILURE);
        }
        tracing::info!("stopped; the store is flushed");
        Ok(ExitCode::SUCCESS)
    });
    traces.shutdown();
    code
}

/// Slack past the grace period and [`crate::http::CLOSE_MARGIN`] for failing the last turns,
/// the final flush and stopping threads.
const STOP_OVERRUN: Duration = Duration::from_secs(5);

async fn wait_for_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    match (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) {
        (Ok(mut term), Ok(mut int)) => {
            tokio::select! {
                _ = term.recv() => {},
                _ = int.recv() => {},
            }
        }
        _ => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}
