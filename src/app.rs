//! The composition root: builds the agent, auth, metrics, store and engine from the [`Config`]
//! and hands them to the HTTP front, which only routes and serves what it is given.
//!
//! The only module that knows every other one; none of them depends on it.

use crate::agent::{A2aAgent, AgentBuildError, EchoAgent, ExecAgent, OpenAiAgent, SharedAgent};
use crate::config::{Config, StoreConfig};
use crate::engine::MessageLimits;
use crate::engine::{Arbiters, Engine, EngineConfig, ResumeLimits, WindowLimits};
use crate::error::chain;
use crate::history::HistoryLimits;
use crate::http::{
    AppState, Auth, AuthConfigError, RunningServer, ServeError, SigningKeys, token_digest,
};
use crate::protocol::signing::{CardKeyError, CardSigner};
use crate::push::deliver::DeliveryOptions;
use crate::push::sign::{DEFAULT_KEY_FILE, SignError, Signer};
use crate::push::{ConfigLimits, PushConfigs, TargetPolicy};
use crate::store::embedded::{DEFAULT_MEMTABLE_BYTES, EmbeddedStore, SledOptions, WalLimits};
use crate::store::postgres::{PgOptions, PgStore};
use crate::store::{ConversationStore, SharedPushStore, SharedStore, StoreError};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// Why the server did not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("{0}")]
    Config(String),
    #[error("authentication: {0}")]
    Auth(#[from] AuthConfigError),
    #[error("opening the store at {path}: {source}")]
    Store {
        path: String,
        source: StoreStartError,
    },
    #[error(transparent)]
    Signer(#[from] SignError),
    #[error(transparent)]
    CardKey(#[from] CardKeyError),
    #[error("building the push delivery client: {0}")]
    Delivery(#[source] reqwest::Error),
    #[error(transparent)]
    Join(#[from] tokio::task::JoinError),
    #[error(transparent)]
    Invalid(#[from] crate::config::ConfigError),
    #[error(transparent)]
    Serve(#[from] ServeError),
}

/// Why the store did not open, or the engine over it did not start.
#[derive(Debug, thiserror::Error)]
pub enum StoreStartError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Join(#[from] tokio::task::JoinError),
    #[error("failing the turns a crash cut off: {0}")]
    Interrupted(#[source] crate::engine::EngineError),
}

/// Opens the store, starts the engine and serves. Needs a running actix System.
pub async fn start(config: Config, agent: SharedAgent) -> Result<RunningServer, StartError> {
    // Installed first, so what the store and engine record while starting is kept.
    let metrics = crate::telemetry::recorder();
    crate::telemetry::register_series(agent.kind());
    let auth = load_auth(&config)?;
    check_cluster_secret(&config)?;
    let proxies = crate::http::TrustedProxies::new(config.trusted_proxies()?);
    let engine_config = engine_config(&config);
    // The arbiters come first: a store that can run on the only one does (`Arbiters`).
    let arbiters = Arbiters::start(engine_config.arbiters);
    let opened = open_store_async(&config, &arbiters).await?;
    let store = opened.store;
    if opened.database.is_some() {
        actix_rt::spawn(sweep_expired_leases(
            Arc::downgrade(&store),
            lease_duration(&config) / 3,
        ));
    }
    let push_key = match opened.push {
        Some(_) => Some(load_signer(&config).await?),
        None => None,
    };
    let card_key = load_card_signer(&config).await?;
    let keys = Arc::new(SigningKeys::new(
        push_key,
        card_key,
        Duration::from_secs(config.auth.retired_key_secs),
    ));
    let push = match opened.push {
        Some(push_store) => {
            let given_up = Arc::new(crate::push::deliver::GivenUp::default());
            crate::push::deliver::start(
                push_store.clone(),
                Arc::new(target_policy(&config)),
                Some(keys.clone()),
                delivery_options(&config),
                given_up.clone(),
            )
            .map_err(StartError::Delivery)?;
            Some(push_configs(push_store, &config, given_up))
        }
        None => None,
    };
    actix_rt::spawn(crate::http::watch_credentials(
        auth.clone(),
        keys.clone(),
        Duration::from_secs(config.auth.reload_check_secs),
    ));
    let database = opened.database;
    let relay = match (&database, config.cluster.secret()) {
        (Some(_), Some(secret)) => Some(crate::http::NodeRelay::new(
            secret.to_owned(),
            store.clone(),
            config.streaming.subscriber_buffer,
        )),
        _ => None,
    };
    let engine = start_engine(store, agent, &config, engine_config, arbiters)
        .await
        .map_err(|source| StartError::Store {
            path: store_location(&config),
            source,
        })?;
    if let Some(relay) = relay {
        engine.relay_through(Arc::new(relay));
    }
    let metrics_token = config
        .metrics
        .token
        .as_deref()
        .map(|t| token_digest(t.trim()));
    let advertise_url = config.cluster.advertise_url.clone();
    let state = AppState {
        engine,
        config: Arc::new(config),
        auth,
        metrics,
        metrics_token,
        push,
        keys,
        proxies,
        grpc_addr: None,
    };
    let server = crate::http::serve(state)?;
    if let Some(database) = database {
        database.set_holder(advertised_url(advertise_url, &server));
    }
    Ok(server)
}

/// The address other nodes forward requests for this node's tasks to.
fn advertised_url(configured: Option<String>, server: &RunningServer) -> String {
    let configured = configured.filter(|url| !url.trim().is_empty());
    if configured.is_none() && server.addr.ip().is_unspecified() {
        tracing::warn!(
            addr = %server.addr,
            "cluster.advertise_url is not set and this node listens on every address: other \
             nodes cannot forward requests for its tasks to it; set cluster.advertise_url"
        );
    }
    let url = configured.unwrap_or_else(|| server.url());
    if url.ends_with('/') {
        url
    } else {
        format!("{url}/")
    }
}

/// The tokens, and the refusal to serve a non-loopback address without any.
fn load_auth(config: &Config) -> Result<Auth, StartError> {
    let auth = Auth::load(
        &config.auth,
        std::env::var("COLLOQUY_TOKENS").ok().as_deref(),
    )?;
    let exposed = std::iter::once(config.listen.as_str())
        .chain(config.grpc_listen())
        .find(|listen| !is_loopback(listen));
    if let Some(listen) = exposed
        && !auth.enabled()
        && !config.allow_unauthenticated
    {
        return Err(StartError::Config(format!(
            "refusing to listen on {listen} without authentication: configure tokens \
             ([auth.tokens], auth.tokens_file or COLLOQUY_TOKENS) or JWTs ([auth.jwt]), or pass \
             --allow-unauthenticated"
        )));
    }
    check_open_console(config)?;
    if !auth.enabled() && config.card.extended.configured() {
        tracing::warn!(
            "card.extended is configured without tokens: every caller counts as authenticated \
             and gets the extended card"
        );
    }
    Ok(auth)
}

/// The operator console shows every principal's conversations and may delete them: one without
/// a token (`console.token`, `metrics.token`) is served on a loopback `admin_listen` only,
/// unless `allow_unauthenticated` says otherwise.
fn check_open_console(config: &Config) -> Result<(), StartError> {
    let Some(admin) = config.admin_listen() else {
        return Ok(());
    };
    let open =
        config.console.enabled && config.console.token.is_none() && config.metrics.token.is_none();
    if open && !is_loopback(admin) && !config.allow_unauthenticated {
        return Err(StartError::Config(format!(
            "refusing to serve the operator console on {admin} without a token: set              console.token (or metrics.token), turn it off (console.enabled = false), or pass              --allow-unauthenticated"
        )));
    }
    Ok(())
}

/// The shortest `cluster.secret` accepted: one anybody could guess lets them act as any caller.
pub const MIN_CLUSTER_SECRET_BYTES: usize = 32;

/// Nodes that other machines can reach must authenticate what they pass between them: with a
/// PostgreSQL store, `cluster.secret` is required unless every address is loopback, and is
/// [`MIN_CLUSTER_SECRET_BYTES`] long at least.
fn check_cluster_secret(config: &Config) -> Result<(), StartError> {
    if let Some(secret) = config.cluster.secret()
        && secret.len() < MIN_CLUSTER_SECRET_BYTES
    {
        return Err(StartError::Config(format!(
            "cluster.secret is {} bytes; it must be at least {MIN_CLUSTER_SECRET_BYTES} (make \
             one with `openssl rand -hex 32`, and give every node the same)",
            secret.len()
        )));
    }
    if config.store.database_url().is_none() || config.cluster.secret().is_some() {
        return Ok(());
    }
    let advertised_loopback = config
        .cluster
        .advertise_url
        .as_deref()
        .is_none_or(url_is_loopback);
    if is_loopback(&config.listen) && advertised_loopback {
        return Ok(());
    }
    Err(StartError::Config(
        "cluster.secret (COLLOQUY_CLUSTER__SECRET) is required with store.url when a node \
         listens or advertises beyond loopback: every node sharing the database must have the same"
            .into(),
    ))
}

fn url_is_loopback(url: &str) -> bool {
    let Ok(url) = reqwest::Url::parse(url) else {
        return false;
    };
    let host = url.host_str().unwrap_or_default();
    let host = host.trim_start_matches('[').trim_end_matches(']');
    host.eq_ignore_ascii_case("localhost")
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

fn is_loopback(listen: &str) -> bool {
    use std::net::ToSocketAddrs;
    listen
        .to_socket_addrs()
        .map(|mut addrs| addrs.all(|a| a.ip().is_loopback()))
        .unwrap_or(false)
}

/// Opens the store in `data` with the configured options (blocking: sled replays its log).
/// The one place the server and the `store` commands open it.
pub fn open_store(
    data: &std::path::Path,
    config: &StoreConfig,
) -> Result<EmbeddedStore, StoreError> {
    EmbeddedStore::open(data, &sled_options(config))
}

/// The push-notification config side over the store, with the configured policy and limits.
fn push_configs(
    store: SharedPushStore,
    config: &Config,
    given_up: Arc<crate::push::deliver::GivenUp>,
) -> PushConfigs {
    PushConfigs::new(
        store,
        Arc::new(target_policy(config)),
        ConfigLimits {
            per_task: config.push.max_configs_per_task,
            pending_per_principal: config.push.max_pending_per_principal,
        },
        given_up,
    )
}

/// The push signing key: configured, else generated on first start into the data folder.
async fn load_signer(config: &Config) -> Result<(PathBuf, Signer), StartError> {
    let path = config
        .push
        .signing_key_file
        .clone()
        .unwrap_or_else(|| config.data.join(DEFAULT_KEY_FILE));
    read_key(path, Signer::load_or_generate).await
}

/// The card's signing key, if `card.signing_key_file` names one.
async fn load_card_signer(config: &Config) -> Result<Option<(PathBuf, CardSigner)>, StartError> {
    let Some(path) = config.card.signing_key_file.clone() else {
        return Ok(None);
    };
    // Without it the card's URLs come from each request's Host header: anyone could have a
    // card signed that sends its readers elsewhere.
    if config.public_url.is_none() {
        return Err(StartError::Config(
            "card.signing_key_file needs public_url: a signed card must name this server's own \
             URL, not one taken from a request's Host header"
                .into(),
        ));
    }
    Ok(Some(read_key(path, CardSigner::load).await?))
}

/// A signing key read from `path` off the async threads (file I/O), with its path for reloads.
async fn read_key<K, E>(
    path: PathBuf,
    load: fn(&std::path::Path) -> Result<K, E>,
) -> Result<(PathBuf, K), StartError>
where
    K: Send + 'static,
    E: Send + 'static,
    StartError: From<E>,
{
    let read = path.clone();
    let key = actix_rt::task::spawn_blocking(move || load(&read)).await?;
    Ok((path, key?))
}

fn delivery_options(config: &Config) -> DeliveryOptions {
    let push = &config.push;
    DeliveryOptions {
        give_up_after: Duration::from_secs(push.give_up_after_secs),
        attempt_timeout: Duration::from_millis(push.attempt_timeout_ms),
        retry_base: Duration::from_millis(push.retry_base_ms),
        retry_max: Duration::from_millis(push.retry_max_ms),
        concurrency: push.concurrency,
    }
}

fn target_policy(config: &Config) -> TargetPolicy {
    TargetPolicy {
        allow_private_networks: config.push.allow_private_networks,
        allowed_hosts: config.push.allowed_hosts.clone(),
    }
}

/// Where the store is, for messages: the data folder, or the database (never its URL, which
/// may hold a password).
fn store_location(config: &Config) -> String {
    match config.store.database_url() {
        Some(_) => "the PostgreSQL database of store.url".into(),
        None => config.data.display().to_string(),
    }
}

/// How long a turn's lease lasts unless renewed.
fn lease_duration(config: &Config) -> Duration {
    Duration::from_secs(config.cluster.lease_secs.max(1))
}

/// The PostgreSQL store's settings, if `store.url` names one.
pub fn postgres_options(config: &Config) -> Option<PgOptions> {
    let url = config.store.database_url()?;
    Some(PgOptions {
        url: url.to_owned(),
        pool_size: config.store.pool_size,
        lease: lease_duration(config),
        tls_ca_file: config.store.tls_ca_file.clone(),
        partitions: config.store.partitions,
        group_steps: config.store.group_steps,
        holder: format!(
            "{}/{}/{:08x}",
            config.listen,
            std::process::id(),
            rand::random::<u32>()
        ),
    })
}

/// Fails, every `period`, the tasks whose nodes stopped renewing their leases (every node runs
/// one; they agree through the database). Ends when the store is gone.
async fn sweep_expired_leases(store: std::sync::Weak<dyn ConversationStore>, period: Duration) {
    let mut tick = tokio::time::interval(period.max(Duration::from_millis(100)));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Some(store) = store.upgrade() else { return };
        match store.fail_interrupted_turns().await {
            Ok(0) => {}
            Ok(failed) => tracing::warn!(
                tasks = failed,
                "marked failed the tasks whose nodes stopped renewing their leases"
            ),
            Err(StoreError::Closed) => {}
            Err(e) => tracing::warn!(error = %chain(&e), "sweeping expired leases"),
        }
    }
}

/// What opening the configured store gives: the store, its push-notification side, and the
/// database.
struct OpenedStore {
    store: SharedStore,
    push: Option<SharedPushStore>,
    database: Option<PgStore>,
}

/// The configured store: PostgreSQL when `store.url` is set (its work on the only one of
/// `arbiters`, if there is one), else sled in `data` (opened off the async threads).
async fn open_store_async(config: &Config, arbiters: &Arbiters) -> Result<OpenedStore, StartError> {
    let failed = |source: StoreStartError| StartError::Store {
        path: store_location(config),
        source,
    };
    if let Some(options) = postgres_options(config) {
        let connected = match arbiters.sole_runtime().await {
            Some(runtime) => PgStore::connect_on(&options, runtime).await,
            None => PgStore::connect(&options).await,
        };
        let store = connected.map_err(|e| failed(e.into()))?;
        if config.cluster.secret().is_none() {
            tracing::warn!(
                "cluster.secret is not set: streams, live reads and cancels of a task another \
                 node runs are answered from the database, not forwarded to that node"
            );
        }
        return Ok(OpenedStore {
            store: Arc::new(store.clone()),
            push: Some(Arc::new(store.clone())),
            database: Some(store),
        });
    }
    let data = config.data.clone();
    let store_config = config.store.clone();
    actix_rt::task::spawn_blocking(move || open_store(&data, &store_config))
        .await
        .map_err(|e| failed(e.into()))?
        .map(|store| {
            let store = Arc::new(store);
            OpenedStore {
                store: store.clone(),
                push: Some(store),
                database: None,
            }
        })
        .map_err(|e| failed(e.into()))
}

/// Starts the engine over `store` and fails the turns a crash cut off.
async fn start_engine(
    store: SharedStore,
    agent: SharedAgent,
    config: &Config,
    engine_config: EngineConfig,
    arbiters: Arbiters,
) -> Result<Engine, StoreStartError> {
    if let Some(limit) = crate::container::memory_limit() {
        // The embedded store's, as it is given them (`sled_options`); none on PostgreSQL.
        let sled = config
            .store
            .database_url()
            .is_none()
            .then(|| sled_options(&config.store));
        tracing::info!(
            limit,
            max_resident = engine_config.max_resident,
            history_cache_bytes = engine_config.window.bytes,
            resume_bytes = engine_config.resume.bytes,
            store_cache_bytes = sled.as_ref().map(|sled| sled.cache_bytes),
            memtable_bytes = sled.as_ref().map(|sled| sled.wal.memtable_bytes),
            "memory budgets, each at most its share of the container's memory limit"
        );
    }
    let engine = Engine::start_on(store, agent, engine_config, arbiters);
    let interrupted = engine
        .fail_interrupted_turns()
        .await
        .map_err(StoreStartError::Interrupted)?;
    if interrupted > 0 {
        tracing::warn!(
            tasks = interrupted,
            "marked failed the tasks that were running when the server last stopped"
        );
    }
    Ok(engine)
}

fn sled_options(store: &StoreConfig) -> SledOptions {
    let container = crate::container::memory_limit();
    SledOptions {
        cache_bytes: within_container(store.cache_bytes, container, SLED_CACHE_SHARE),
        wal: WalLimits {
            checkpoint_every: Duration::from_millis(store.checkpoint_interval_ms),
            checkpoint_min_bytes: usize::try_from(store.checkpoint_min_bytes).unwrap_or(usize::MAX),
            checkpoint_max_wait: Duration::from_millis(store.checkpoint_max_wait_ms),
            memtable_bytes: memtable_limit(container),
        },
        snapshot_log_bytes: store.snapshot_log_bytes,
        zstd_level: (store.compression_level > 0).then_some(i32::from(store.compression_level)),
        leaf_fanout: store.leaf_fanout,
        segment_cleanup_percent: store.segment_cleanup_percent,
    }
}

/// What a caller's message may hold (`limits.*`): the engine checks sends against it, and
/// `colloquy import` every record it stores.
pub fn message_limits(config: &Config) -> MessageLimits {
    MessageLimits {
        parts: config.limits.parts_per_message,
        text_bytes: config.limits.text_bytes,
        id_bytes: config.limits.context_id_bytes,
    }
}

/// The engine's settings, from the configuration's sections.
pub fn engine_config(config: &Config) -> EngineConfig {
    let defaults = EngineConfig::default();
    let container = crate::container::memory_limit();
    let bytes = |configured: u64, share: u64| {
        usize::try_from(within_container(configured, container, share)).unwrap_or(usize::MAX)
    };
    EngineConfig {
        history: HistoryLimits {
            limit: config.history.limit,
            max_chars: config.history.max_chars,
        },
        idle_timeout: Duration::from_secs(config.contexts.idle_timeout_secs.max(1)),
        agent_timeout: Duration::from_secs(config.agent.timeout_secs.max(1)),
        subscriber_buffer: config.streaming.subscriber_buffer,
        arbiters: match config.contexts.arbiters {
            0 => defaults.arbiters,
            n => n,
        },
        max_running_turns: config.limits.running_turns.max(1),
        message: message_limits(config),
        max_resident: resident_limit(&config.contexts, container),
        response_bytes: config.limits.response_bytes,
        lease: lease_duration(config),
        window: WindowLimits {
            keep: Duration::from_secs(config.contexts.history_cache_secs),
            bytes: bytes(config.contexts.history_cache_bytes, HISTORY_WINDOW_SHARE),
        },
        resume: ResumeLimits {
            events: config.streaming.resume_events,
            keep: Duration::from_secs(config.streaming.resume_secs),
            bytes: bytes(config.streaming.resume_bytes, RESUME_EVENTS_SHARE),
        },
    }
}

// What a container's memory limit (cgroup) leaves each in-memory budget, as a divisor of it.
// Together they take about half (at 256 MiB: sled's cache about 24 MB, as sled holds about 1.5
// times `store.cache_bytes`; windows 32 MiB; kept events 16 MiB; resident conversations 32 MiB;
// the memtables 32 MiB), leaving the rest to the process itself (threads, buffers, sled's page
// table) and to the page cache its writes dirty, which the cgroup counts too. Measured without
// the shares (2026-12-06): 20 s of `colloquy loadgen` in a 256 MiB cgroup grew the process to
// the limit and could get it killed.
const SLED_CACHE_SHARE: u64 = 16;
const HISTORY_WINDOW_SHARE: u64 = 8;
const RESUME_EVENTS_SHARE: u64 = 16;
const RESIDENT_SHARE: u64 = 8;

/// `configured`, lowered to a `share`-th of the container's memory limit when there is one.
fn within_container(configured: u64, container: Option<u64>, share: u64) -> u64 {
    container.map_or(configured, |limit| configured.min(limit / share))
}

/// The smallest memtable limit a container's memory lowers the write-ahead log's to: a quarter
/// of it (an early checkpoint) still holds a few hundred turns.
const MIN_MEMTABLE_BYTES: usize = 16 << 20;
/// The share of a container's memory a memtable may hold: with the table being moved into
/// sled beside it, the log holds at most twice that.
const CONTAINER_SHARE_PER_MEMTABLE: u64 = 16;

/// The write-ahead log's memtable limit: the default, or a sixteenth of the container's memory
/// when that is less.
pub fn memtable_limit(container: Option<u64>) -> usize {
    container.map_or(DEFAULT_MEMTABLE_BYTES, |limit| {
        usize::try_from(limit / CONTAINER_SHARE_PER_MEMTABLE)
            .unwrap_or(usize::MAX)
            .clamp(MIN_MEMTABLE_BYTES, DEFAULT_MEMTABLE_BYTES)
    })
}

/// What one resident conversation (its actor, mailbox and directory entry) costs in memory,
/// rounded up from the 3.3 KB measured with 100,000 idle conversations (docs/performance.md).
pub const RESIDENT_CONVERSATION_BYTES: u64 = 4096;

/// How many conversations may be resident: `contexts.max_resident`, lowered to what
/// `contexts.max_resident_bytes` holds, or by default an eighth of the container's memory.
pub fn resident_limit(contexts: &crate::config::ContextsConfig, container: Option<u64>) -> usize {
    let budget = match contexts.max_resident_bytes {
        0 => container.map(|limit| limit / RESIDENT_SHARE),
        bytes => Some(bytes),
    };
    let by_memory = budget.map_or(usize::MAX, |bytes| {
        usize::try_from(bytes / RESIDENT_CONVERSATION_BYTES).unwrap_or(usize::MAX)
    });
    contexts.max_resident.min(by_memory).max(1)
}

/// Why the configured agent backend cannot be built.
#[derive(Debug, thiserror::Error)]
pub enum AgentSetupError {
    #[error("agent.kind {kind:?}: {source}")]
    Build {
        kind: &'static str,
        source: AgentBuildError,
    },
    #[error("agent.kind {0:?} is not available; use \"echo\", \"exec\", \"openai\" or \"a2a\"")]
    UnknownKind(String),
    #[error("agent.kind = \"a2a\" needs agent.peer_url (the peer agent's URL)")]
    NoPeerUrl,
    #[error("agent.peer_url: {0}")]
    PeerUrl(#[source] crate::client::ClientError),
    #[error("agent.token_env names {name}, which is not set in the environment")]
    TokenEnv {
        name: String,
        source: std::env::VarError,
    },
}

/// The backend `agent.kind` names.
pub fn build_agent(config: &Config) -> Result<SharedAgent, AgentSetupError> {
    match config.agent.kind.as_str() {
        "echo" => Ok(Arc::new(EchoAgent::new(
            config.agent.echo.chunk_chars,
            Duration::from_millis(config.agent.echo.delay_ms),
        ))),
        "exec" => ExecAgent::from_config(&config.agent)
            .map(|agent| Arc::new(agent) as SharedAgent)
            .map_err(|source| AgentSetupError::Build {
                kind: "exec",
                source,
            }),
        "openai" => OpenAiAgent::from_config(config)
            .map(|agent| Arc::new(agent) as SharedAgent)
            .map_err(|source| AgentSetupError::Build {
                kind: "openai",
                source,
            }),
        "a2a" => build_a2a_agent(config),
        other => Err(AgentSetupError::UnknownKind(other.to_owned())),
    }
}

fn build_a2a_agent(config: &Config) -> Result<SharedAgent, AgentSetupError> {
    let url = config
        .agent
        .peer_url
        .clone()
        .ok_or(AgentSetupError::NoPeerUrl)?;
    crate::client::check_url(&url).map_err(AgentSetupError::PeerUrl)?;
    let token = match &config.agent.token_env {
        None => None,
        Some(name) => Some(
            std::env::var(name).map_err(|source| AgentSetupError::TokenEnv {
                name: name.clone(),
                source,
            })?,
        ),
    };
    let options = crate::client::ClientOptions {
        token,
        card_jwks_url: config.agent.card_jwks_url.clone(),
        ..crate::client::ClientOptions::default()
    };
    Ok(Arc::new(A2aAgent::with_options(
        url,
        options,
        config.agent.max_turns_per_context,
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resident_conversations_fit_the_memory_given_them() {
        let mut contexts = crate::config::ContextsConfig::default();
        assert_eq!(
            resident_limit(&contexts, None),
            1_000_000,
            "no container: the count"
        );
        // A 512 MiB container: an eighth of it, at 4 KiB each.
        assert_eq!(resident_limit(&contexts, Some(512 << 20)), 16_384);
        contexts.max_resident_bytes = 40 * RESIDENT_CONVERSATION_BYTES;
        assert_eq!(
            resident_limit(&contexts, Some(512 << 20)),
            40,
            "configured wins"
        );
        contexts.max_resident = 10;
        assert_eq!(
            resident_limit(&contexts, None),
            10,
            "the lower bound applies"
        );
        contexts.max_resident_bytes = 1;
        assert_eq!(resident_limit(&contexts, None), 1, "never zero");
    }

    #[test]
    fn budgets_are_lowered_to_their_share_of_a_container() {
        assert_eq!(
            within_container(64 << 20, None, 8),
            64 << 20,
            "no container"
        );
        assert_eq!(within_container(64 << 20, Some(256 << 20), 8), 32 << 20);
        assert_eq!(
            within_container(16 << 20, Some(256 << 20), 8),
            16 << 20,
            "never raised"
        );
    }

    #[test]
    fn the_write_ahead_logs_memory_fits_the_container() {
        assert_eq!(memtable_limit(None), DEFAULT_MEMTABLE_BYTES, "no container");
        assert_eq!(memtable_limit(Some(512 << 20)), 32 << 20, "a sixteenth");
        assert_eq!(
            memtable_limit(Some(64 << 20)),
            MIN_MEMTABLE_BYTES,
            "not below"
        );
        assert_eq!(
            memtable_limit(Some(64 << 30)),
            DEFAULT_MEMTABLE_BYTES,
            "not above"
        );
    }

    /// Config keeps its own defaults (it does not depend on the engine); they must stay the
    /// engine's.
    #[test]
    fn default_config_maps_to_the_engine_defaults() {
        let mapped = engine_config(&Config::default());
        let defaults = EngineConfig::default();
        assert_eq!(mapped.response_bytes, defaults.response_bytes);
        assert_eq!(mapped.window, defaults.window);
        assert_eq!(mapped.history.limit, defaults.history.limit);
        assert_eq!(mapped.history.max_chars, defaults.history.max_chars);
        assert_eq!(mapped.idle_timeout, defaults.idle_timeout);
        assert_eq!(mapped.agent_timeout, defaults.agent_timeout);
        assert_eq!(mapped.subscriber_buffer, defaults.subscriber_buffer);
        assert_eq!(mapped.arbiters, defaults.arbiters);
        assert_eq!(mapped.max_running_turns, defaults.max_running_turns);
        assert_eq!(mapped.message, defaults.message);
        assert_eq!(mapped.max_resident, defaults.max_resident);
        assert_eq!(mapped.lease, defaults.lease);
    }

    #[test]
    fn a_shared_database_beyond_loopback_needs_the_cluster_secret() {
        let mut config = Config::default();
        config.store.url = "postgres://db/colloquy".into();
        assert!(check_cluster_secret(&config).is_ok(), "loopback only");
        config.cluster.advertise_url = Some("http://10.0.0.5:8080/".into());
        assert!(check_cluster_secret(&config).is_err());
        config.cluster.advertise_url = Some("http://[::1]:8080/".into());
        assert!(check_cluster_secret(&config).is_ok());
        config.listen = "0.0.0.0:8080".into();
        assert!(check_cluster_secret(&config).is_err());
        config.cluster.secret = Some("s".repeat(MIN_CLUSTER_SECRET_BYTES - 1));
        assert!(check_cluster_secret(&config).is_err(), "too short");
        config.cluster.secret = Some("s".repeat(MIN_CLUSTER_SECRET_BYTES));
        assert!(check_cluster_secret(&config).is_ok());
        config.store.url = String::new();
        config.cluster.secret = None;
        assert!(check_cluster_secret(&config).is_ok(), "sled needs none");
    }
}
