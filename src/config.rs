//! Configuration, layered: defaults < TOML file (`--config`) < environment (`COLLOQUY_*`) < flags.
//!
//! Environment keys are the TOML keys upper-cased, nested with `__`: `COLLOQUY_HISTORY__LIMIT=10`.
//! A `COLLOQUY_*` variable that names no key is ignored (with one warning at start, see
//! [`ignored_environment`]): Kubernetes injects `COLLOQUY_PORT=tcp://…`,
//! `COLLOQUY_SERVICE_HOST` and more into every pod of a namespace holding a Service named
//! `colloquy`. No key is named `port`, `service_host` or `port_*` for that reason. A value is
//! read by the type of the key it sets: text for a text key (`COLLOQUY_CARD__VERSIONS=1.0` is
//! `"1.0"`), TOML-like values (numbers, booleans, `[a, b]`) for the others.

use crate::history::{HistoryLimits, MAX_LIMIT};
use crate::store::embedded::{
    DEFAULT_CHECKPOINT_EVERY, DEFAULT_CHECKPOINT_MAX_WAIT, DEFAULT_CHECKPOINT_MIN_BYTES,
    DEFAULT_COMPRESSION_LEVEL, DEFAULT_LEAF_FANOUT, DEFAULT_SEGMENT_CLEANUP_PERCENT,
    DEFAULT_SNAPSHOT_LOG_BYTES, MAX_LEAF_FANOUT, MIN_LEAF_FANOUT, SEGMENT_CLEANUP_PERCENTS,
};
use figment::providers::{Format, Serialized, Toml};
use figment::value::{Dict, Map, Value as FigmentValue};
use figment::{Figment, Metadata, Profile, Provider};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("configuration: {0}")]
    Invalid(String),
    /// Boxed: figment's error is large, and every `Result` of the start-up path carries it.
    #[error("configuration: {0}")]
    Load(#[source] Box<figment::Error>),
}

impl From<figment::Error> for ConfigError {
    fn from(e: figment::Error) -> Self {
        ConfigError::Load(Box::new(e))
    }
}

/// The default number of HTTP workers, and of arbiters: half the cores each, at least one, so
/// that the two together take about one thread per core (the store's threads come on top).
/// Threads past the cores only add switching: on two cores, one worker and one arbiter cost a
/// turn 9% less CPU than two of each, at the same turns/s (docs/performance.md, 2026-12-05).
pub fn default_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get().div_ceil(2))
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Address to listen on.
    pub listen: String,
    /// Folder of the embedded sled store.
    pub data: PathBuf,
    /// The URL clients should use, for the agent card; default: from the request's Host.
    pub public_url: Option<String>,
    /// Peers (addresses or CIDR ranges) whose `Forwarded` / `X-Forwarded-Proto` /
    /// `X-Forwarded-Host` headers are believed for the URLs the card gives; default none.
    pub trusted_proxies: Vec<String>,
    /// Listen on a non-loopback address without any token configured.
    #[serde(deserialize_with = "flexible_bool")]
    pub allow_unauthenticated: bool,
    /// `pretty` or `json`.
    pub log_format: String,
    /// HTTP worker threads (0 = [`default_threads`]).
    pub workers: usize,
    /// Address serving `/metrics`, `/healthz` and `/readyz` apart from `listen` (unset or empty:
    /// none, and `/metrics` is served on `listen`).
    pub admin_listen: Option<String>,
    /// Address serving the gRPC binding (empty: none).
    pub grpc_listen: String,
    /// The gRPC target the card gives; default: the card's host with `grpc_listen`'s port.
    pub grpc_public_url: Option<String>,
    pub metrics: MetricsConfig,
    pub telemetry: TelemetryConfig,
    pub console: ConsoleConfig,
    pub agent: AgentConfig,
    pub history: HistoryConfig,
    pub contexts: ContextsConfig,
    pub limits: LimitsConfig,
    pub card: CardConfig,
    pub streaming: StreamingConfig,
    pub store: StoreConfig,
    pub cluster: ClusterConfig,
    pub shutdown: ShutdownConfig,
    pub auth: AuthConfig,
    pub push: PushSettings,
    pub peers: BTreeMap<String, PeerConfig>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            listen: "127.0.0.1:8080".into(),
            data: PathBuf::from("./colloquy-data"),
            public_url: None,
            trusted_proxies: Vec::new(),
            allow_unauthenticated: false,
            log_format: "pretty".into(),
            workers: 0,
            admin_listen: None,
            grpc_listen: "127.0.0.1:8081".into(),
            grpc_public_url: None,
            metrics: MetricsConfig::default(),
            telemetry: TelemetryConfig::default(),
            console: ConsoleConfig::default(),
            agent: AgentConfig::default(),
            history: HistoryConfig::default(),
            contexts: ContextsConfig::default(),
            limits: LimitsConfig::default(),
            card: CardConfig::default(),
            streaming: StreamingConfig::default(),
            store: StoreConfig::default(),
            cluster: ClusterConfig::default(),
            shutdown: ShutdownConfig::default(),
            auth: AuthConfig::default(),
            push: PushSettings::default(),
            peers: BTreeMap::new(),
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct AgentConfig {
    /// `echo`, `exec`, `openai` or `a2a`.
    pub kind: String,
    /// A turn whose agent has not finished by then fails.
    pub timeout_secs: u64,
    pub echo: EchoConfig,
    /// exec: the program and its arguments (never run through a shell).
    pub command: Vec<String>,
    /// exec: names of environment variables passed through to the program.
    pub env: Vec<String>,
    /// openai: base URL, e.g. `http://127.0.0.1:11434/v1`.
    pub base_url: Option<String>,
    /// openai: the model name sent with each request.
    pub model: Option<String>,
    /// Name of the environment variable holding the API key (the key never sits in config).
    pub api_key_env: Option<String>,
    /// openai: a system prompt sent before everything else.
    pub system_prompt: Option<String>,
    /// openai: retries of a request answered 429 or 5xx (or not connected), before any chunk arrived.
    pub retries: u32,
    /// openai: the first retry's delay in milliseconds; each further retry doubles it (at most 30 s).
    /// A `Retry-After` header in seconds, if longer, is honoured up to the same cap.
    pub retry_backoff_ms: u64,
    /// openai: seconds to connect to the upstream server.
    pub connect_timeout_secs: u64,
    /// openai: seconds the upstream may stay silent (before answering, or between chunks).
    pub read_timeout_secs: u64,
    /// exec: seconds between SIGTERM and SIGKILL when a task is canceled or times out.
    pub grace_secs: u64,
    /// exec: the longest stdout line, in bytes; a longer line fails the task.
    pub max_line_bytes: usize,
    /// exec: total stdout bytes per task; more fails the task.
    pub max_output_bytes: usize,
    /// exec: the tail of stderr kept per task (the status message of a failed run), in bytes.
    pub max_stderr_bytes: usize,
    /// a2a: the peer agent's URL.
    pub peer_url: Option<String>,
    /// a2a: name of the environment variable holding the peer's bearer token.
    pub token_env: Option<String>,
    /// a2a: the key set the peer's card must be signed by; set, an unsigned card or one whose
    /// signature fails is refused.
    pub card_jwks_url: Option<String>,
    /// a2a: delegated turns allowed per conversation (anti-loop).
    pub max_turns_per_context: u64,
}

impl Default for AgentConfig {
    fn default() -> Self {
        AgentConfig {
            kind: "echo".into(),
            timeout_secs: 600,
            echo: EchoConfig::default(),
            command: Vec::new(),
            env: Vec::new(),
            base_url: None,
            model: None,
            api_key_env: None,
            system_prompt: None,
            retries: 3,
            retry_backoff_ms: 500,
            connect_timeout_secs: 10,
            read_timeout_secs: 120,
            grace_secs: 5,
            max_line_bytes: 1024 * 1024,
            max_output_bytes: 16 * 1024 * 1024,
            max_stderr_bytes: 8 * 1024,
            peer_url: None,
            token_env: None,
            card_jwks_url: None,
            max_turns_per_context: 20,
        }
    }
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct EchoConfig {
    /// Characters per streamed chunk (0 = one chunk).
    pub chunk_chars: usize,
    /// Pause before each chunk, in milliseconds.
    pub delay_ms: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct HistoryConfig {
    /// Earlier messages shown to the agent (0 turns injection off, at most 200).
    pub limit: usize,
    /// Characters of each earlier message shown; longer ones are cut and end in `…`.
    pub max_chars: usize,
}

impl Default for HistoryConfig {
    fn default() -> Self {
        let defaults = HistoryLimits::default();
        HistoryConfig {
            limit: defaults.limit,
            max_chars: defaults.max_chars,
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct ContextsConfig {
    /// A conversation's actor stops after this many idle seconds (its state stays on disk).
    /// An idle actor holds nothing the store does not (at most its last turn's history window,
    /// which only spares a read) and starting one costs microseconds, while a large idle population costs
    /// memory and turns/s (docs/performance.md, "Design decisions": fc6df1a, 2026-12-01): hence
    /// a short default.
    pub idle_timeout_secs: u64,
    /// Arbiter threads hosting conversation actors (0 = [`default_threads`]).
    pub arbiters: usize,
    /// Live conversation actors; past it idle ones are stopped first, past 110% new ones are refused.
    pub max_resident: usize,
    /// Memory for resident conversations, in bytes (about 4 KiB each); 0 = an eighth of the
    /// container's memory limit when there is one (cgroup), else no bound but `max_resident`.
    pub max_resident_bytes: u64,
    /// A conversation's actor keeps the history window of its last turn this many seconds, so
    /// that a next turn in a conversation no one else wrote to reads no history from the store.
    pub history_cache_secs: u64,
    /// Memory for those windows, all together, in bytes (estimated); 0 keeps none. In a
    /// container, at most an eighth of its memory limit.
    pub history_cache_bytes: u64,
}

impl Default for ContextsConfig {
    fn default() -> Self {
        // The engine's defaults too (`engine::WindowLimits`; `app`'s tests hold them equal).
        ContextsConfig {
            idle_timeout_secs: 30,
            arbiters: 0,
            max_resident: 1_000_000,
            max_resident_bytes: 0,
            history_cache_secs: 10,
            history_cache_bytes: 64 * 1024 * 1024,
        }
    }
}

/// The engine's default too (`engine::DEFAULT_RESPONSE_BYTES`; `app`'s tests hold them equal):
/// config stays plain settings, apart from the engine.
const DEFAULT_RESPONSE_BYTES: usize = 4 * 1024 * 1024;

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct LimitsConfig {
    /// Largest request body.
    pub body_bytes: usize,
    pub parts_per_message: usize,
    /// Total text bytes in one message.
    pub text_bytes: usize,
    pub context_id_bytes: usize,
    /// Turns running at once; beyond, sends get an overload error with a retry hint.
    pub running_turns: usize,
    /// Milliseconds a client has to send a whole request body (after its headers); beyond, 408.
    pub body_timeout_ms: u64,
    /// Connections open at once across all HTTP workers (each takes an even share); beyond,
    /// new connections wait in the kernel's listen queue until one closes.
    pub max_connections: usize,
    /// What one `ListTasks` or `colloquy/getConversation` page may hold, in bytes; a page
    /// stops early at it (a single larger record still comes back, alone).
    pub response_bytes: usize,
}

impl Default for LimitsConfig {
    fn default() -> Self {
        LimitsConfig {
            body_bytes: 1024 * 1024,
            parts_per_message: 64,
            text_bytes: 256 * 1024,
            context_id_bytes: 256,
            running_turns: 10_000,
            body_timeout_ms: 5_000,
            max_connections: 10_000,
            response_bytes: DEFAULT_RESPONSE_BYTES,
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct CardConfig {
    pub name: String,
    /// Default: the agent backend's own description.
    pub description: Option<String>,
    pub version: String,
    /// `both` (default), `1.0` or `0.3`: which versions' fields the card carries.
    pub versions: String,
    pub skills: Vec<SkillConfig>,
    /// Seconds clients and caches may keep the card (`Cache-Control: max-age`).
    pub max_age_secs: u64,
    /// What only authenticated callers see (`GetExtendedAgentCard`); unset: no extended card.
    pub extended: ExtendedCardConfig,
    /// The tenant the card's v1.0 interfaces tell clients to name (`supportedInterfaces[].tenant`);
    /// unset: none (the default tenant).
    pub tenant: Option<String>,
    /// PKCS#8 (PEM or DER) EC P-256 or Ed25519 key the card is signed with (`signatures`, JWS
    /// over its RFC 8785 form); unset: the card is not signed.
    pub signing_key_file: Option<PathBuf>,
}

/// The extended agent card: the public card, with this description and these skills added.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct ExtendedCardConfig {
    /// Replaces the public card's description.
    pub description: Option<String>,
    /// Added after the public card's skills.
    pub skills: Vec<SkillConfig>,
}

impl ExtendedCardConfig {
    /// Whether there is an extended card to serve (and to announce on the public card).
    pub fn configured(&self) -> bool {
        self.description.is_some() || !self.skills.is_empty()
    }
}

impl Default for CardConfig {
    fn default() -> Self {
        CardConfig {
            name: "colloquy".into(),
            description: None,
            version: env!("CARGO_PKG_VERSION").into(),
            versions: "both".into(),
            skills: Vec::new(),
            max_age_secs: 300,
            extended: ExtendedCardConfig::default(),
            tenant: None,
            signing_key_file: None,
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct SkillConfig {
    pub id: String,
    pub name: String,
    pub description: String,
    #[serde(default)]
    pub tags: Vec<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct StreamingConfig {
    /// Events a stream may fall behind before it is closed with an error.
    pub subscriber_buffer: usize,
    /// Events kept per task for streams that resume with `Last-Event-ID` (0: none; every
    /// resume then starts from the task as it stands).
    pub resume_events: usize,
    /// How long a task's kept events stay after its last one.
    pub resume_secs: u64,
    /// What the kept events of all tasks may hold together, estimated; past it the oldest
    /// tasks' events go first. In a container, at most a sixteenth of its memory limit.
    pub resume_bytes: u64,
}

impl Default for StreamingConfig {
    fn default() -> Self {
        StreamingConfig {
            subscriber_buffer: 1024,
            resume_events: 1024,
            resume_secs: 300,
            resume_bytes: 64 * 1024 * 1024,
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct StoreConfig {
    /// A PostgreSQL database shared by every node (`postgres://…` or `postgresql://…`); empty:
    /// the embedded sled store in `data`.
    pub url: String,
    /// PostgreSQL: connections this node keeps open at most, besides the few of its grouped
    /// turn steps.
    pub pool_size: usize,
    /// PostgreSQL: hash partitions of the tables keyed by conversation, when colloquy creates
    /// the schema (0: plain tables; set before the first start, later it changes nothing).
    pub partitions: u32,
    /// PostgreSQL: the most turn starts (or ends) committed together in one statement when
    /// they wait at the same time (1: each in its own).
    pub group_steps: usize,
    /// PostgreSQL: PEM file of the authorities the database's certificate may come from
    /// (besides the public ones); set, or with `sslmode=require` in the URL, TLS is used.
    pub tls_ca_file: Option<PathBuf>,
    /// sled's page cache. In a container, at most a sixteenth of its memory limit.
    pub cache_bytes: u64,
    /// Milliseconds between checkpoints of the write-ahead log into sled, once its memtable
    /// holds `checkpoint_min_bytes`.
    pub checkpoint_interval_ms: u64,
    /// A smaller memtable waits for more writes before its checkpoint (0: a checkpoint every
    /// interval whatever it holds), up to `checkpoint_max_wait_ms` after the last one.
    pub checkpoint_min_bytes: u64,
    /// The longest written data waits in the memtable for its checkpoint: bounds the log
    /// replayed after a crash under light load.
    pub checkpoint_max_wait_ms: u64,
    /// sled's log written between two recovery snapshots (at least eight times the last
    /// snapshot's size): a restart replays at most about this much.
    pub snapshot_log_bytes: u64,
    /// 0: sled's pages are stored uncompressed; 1-22: with zstd at that level (default 1).
    /// Applies to data folders created with it (sled refuses to change it later).
    pub compression_level: u8,
    /// Entries a leaf of sled's tree holds before it splits (at least 8). Larger: fewer pages,
    /// so less memory for sled's page table and a faster start; each page rewrite is larger.
    pub leaf_fanout: usize,
    /// sled cleans a segment (rewrites its live pages elsewhere, then reuses it) once its live
    /// bytes fall to this percentage of it: lower takes more disk and less rewriting.
    pub segment_cleanup_percent: usize,
}

impl Default for StoreConfig {
    fn default() -> Self {
        StoreConfig {
            url: String::new(),
            pool_size: 16,
            partitions: 0,
            group_steps: 64,
            tls_ca_file: None,
            cache_bytes: 64 * 1024 * 1024,
            checkpoint_interval_ms: DEFAULT_CHECKPOINT_EVERY.as_millis() as u64,
            checkpoint_min_bytes: DEFAULT_CHECKPOINT_MIN_BYTES as u64,
            checkpoint_max_wait_ms: DEFAULT_CHECKPOINT_MAX_WAIT.as_millis() as u64,
            snapshot_log_bytes: DEFAULT_SNAPSHOT_LOG_BYTES,
            compression_level: DEFAULT_COMPRESSION_LEVEL,
            leaf_fanout: DEFAULT_LEAF_FANOUT,
            segment_cleanup_percent: DEFAULT_SEGMENT_CLEANUP_PERCENT,
        }
    }
}

impl StoreConfig {
    /// The PostgreSQL URL, unless the embedded store is configured.
    pub fn database_url(&self) -> Option<&str> {
        Some(self.url.trim()).filter(|url| !url.is_empty())
    }
}

/// Several nodes on one database (a PostgreSQL store).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct ClusterConfig {
    /// Seconds a turn's lease on its conversation lasts unless renewed (its node renews it
    /// every third of that while the agent works). A node that stops holds it this long at
    /// most.
    pub lease_secs: u64,
    /// The URL other nodes reach this one at, for requests that follow a task it runs
    /// (streams, live reads, cancels); default: `http://` + the address it listens on.
    pub advertise_url: Option<String>,
    /// Shared by every node: authenticates requests forwarded between them. Unset: nothing is
    /// forwarded (a node answers from the database alone).
    pub secret: Option<String>,
}

impl Default for ClusterConfig {
    fn default() -> Self {
        ClusterConfig {
            lease_secs: 30,
            advertise_url: None,
            secret: None,
        }
    }
}

impl ClusterConfig {
    /// The shared secret, unless unset or empty.
    pub fn secret(&self) -> Option<&str> {
        self.secret.as_deref().filter(|s| !s.trim().is_empty())
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct ShutdownConfig {
    /// Seconds running turns get to finish after SIGTERM / SIGINT.
    pub grace_secs: u64,
}

impl Default for ShutdownConfig {
    fn default() -> Self {
        ShutdownConfig { grace_secs: 30 }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct AuthConfig {
    /// principal -> bearer token.
    pub tokens: BTreeMap<String, String>,
    /// A file of `principal:sha256-hex-of-token` lines, read again on SIGHUP and when it changes.
    pub tokens_file: Option<PathBuf>,
    /// Seconds between looks at `tokens_file` for a change; 0: on SIGHUP only.
    pub reload_check_secs: u64,
    /// JWT bearer tokens from an OpenID Connect / OAuth2 issuer, beside the static tokens; off
    /// while `auth.jwt.issuer` is empty.
    pub jwt: JwtConfig,
    /// principal -> the tenants it may use (v1.0's `tenant`); with none, only the default tenant.
    pub tenants: BTreeMap<String, Vec<String>>,
    /// Seconds a signing key (push, card) replaced on SIGHUP stays in the served key set.
    pub retired_key_secs: u64,
}

impl Default for AuthConfig {
    fn default() -> Self {
        AuthConfig {
            tokens: BTreeMap::new(),
            tokens_file: None,
            reload_check_secs: 5,
            jwt: JwtConfig::default(),
            tenants: BTreeMap::new(),
            retired_key_secs: 24 * 60 * 60,
        }
    }
}

/// Where JWTs come from and what they must say (`[auth.jwt]`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct JwtConfig {
    /// The `iss` every token must carry.
    pub issuer: String,
    /// The `aud` a token must carry (one of these); a string or a list.
    #[serde(deserialize_with = "one_or_many")]
    pub audience: Vec<String>,
    /// The issuer's key set, fetched and cached (one of `jwks_url`, `jwks_file`).
    pub jwks_url: Option<String>,
    /// A key set on disk, read at start and on reload.
    pub jwks_file: Option<PathBuf>,
    /// At most one fetch of `jwks_url` this often, when a token names a key not in the set.
    pub jwks_refresh_secs: u64,
    /// The fetched key set is replaced by a fresh fetch this often (withdrawn keys drop out).
    pub jwks_max_age_secs: u64,
    /// Slack on `exp` and `nbf`, for clocks that differ.
    pub leeway_secs: u64,
    /// The claim naming the caller; with `iss` it makes the principal `ISS#CLAIM`.
    pub principal_claim: String,
    /// Scopes every token must hold (`scope` or `scp`).
    pub required_scopes: Vec<String>,
    /// A claim listing the tenants the caller may use (a list, or a space-separated string).
    pub tenants_claim: Option<String>,
    /// The issuer's OpenID Connect discovery document, named on the agent card; default
    /// `ISSUER/.well-known/openid-configuration`.
    pub discovery_url: Option<String>,
}

impl JwtConfig {
    pub fn enabled(&self) -> bool {
        !self.issuer.trim().is_empty()
    }

    /// What makes the section unusable, if anything.
    fn problem(&self) -> Option<String> {
        if !self.enabled() {
            return None;
        }
        if self.audience.iter().all(|aud| aud.trim().is_empty()) {
            return Some("auth.jwt.audience is required with auth.jwt.issuer".into());
        }
        match (&self.jwks_url, &self.jwks_file) {
            (None, None) => Some("auth.jwt needs jwks_url or jwks_file".into()),
            (Some(_), Some(_)) => Some("auth.jwt: set jwks_url or jwks_file, not both".into()),
            _ if self.principal_claim.trim().is_empty() => {
                Some("auth.jwt.principal_claim is empty".into())
            }
            // Each token naming an unknown key would otherwise fetch the issuer's key set.
            _ if self.jwks_refresh_secs == 0 => {
                Some("auth.jwt.jwks_refresh_secs must be at least 1".into())
            }
            _ => None,
        }
    }
}

impl Default for JwtConfig {
    fn default() -> Self {
        JwtConfig {
            issuer: String::new(),
            audience: Vec::new(),
            jwks_url: None,
            jwks_file: None,
            jwks_refresh_secs: 60,
            jwks_max_age_secs: 600,
            leeway_secs: 30,
            principal_claim: "sub".into(),
            required_scopes: Vec::new(),
            tenants_claim: None,
            discovery_url: None,
        }
    }
}

/// A string or a list of strings, read as a list.
fn one_or_many<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<Vec<String>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum OneOrMany {
        One(String),
        Many(Vec<String>),
    }
    Ok(match OneOrMany::deserialize(deserializer)? {
        OneOrMany::One(one) => vec![one],
        OneOrMany::Many(many) => many,
    })
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct MetricsConfig {
    /// Bearer token `/metrics` requires, wherever it is served; unset: none.
    pub token: Option<String>,
}

/// Traces over OTLP (docs/observability.md). Off unless an endpoint is set here or in the
/// standard `OTEL_EXPORTER_OTLP_ENDPOINT` / `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct TelemetryConfig {
    /// The collector's OTLP endpoint, e.g. `http://127.0.0.1:4318` (HTTP/protobuf) or
    /// `http://127.0.0.1:4317` with `OTEL_EXPORTER_OTLP_PROTOCOL=grpc`.
    pub otlp_endpoint: Option<String>,
}

/// The operator console at `/console` on `admin_listen` (docs/console.md). It is served only
/// there, never on `listen`: without `admin_listen` there is no console.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct ConsoleConfig {
    /// Serve the console on `admin_listen`.
    #[serde(deserialize_with = "flexible_bool")]
    pub enabled: bool,
    /// The token the console requires, as `Authorization: Bearer` or through its sign-in form
    /// (which sets an HttpOnly, SameSite=Strict session cookie). Unset: `metrics.token`; with
    /// neither, the console is open to whoever reaches `admin_listen` (a warning at start says
    /// so).
    pub token: Option<String>,
}

impl ConsoleConfig {
    fn validate(&self) -> Result<(), ConfigError> {
        if self.token.as_deref().is_some_and(|t| t.trim().is_empty()) {
            return Err(ConfigError::Invalid(
                "console.token is empty; leave it unset for the console to take metrics.token's"
                    .into(),
            ));
        }
        Ok(())
    }
}

impl Default for ConsoleConfig {
    fn default() -> Self {
        ConsoleConfig {
            enabled: true,
            token: None,
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct PeerConfig {
    pub url: String,
    #[serde(default)]
    pub token_env: Option<String>,
    /// The key set the peer's agent card must be signed by; set, an unsigned card or one
    /// whose signature fails is refused.
    #[serde(default)]
    pub card_jwks_url: Option<String>,
}

/// Push notifications: limits, where webhooks may point, retries and the signing key.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct PushSettings {
    /// Configs one task may have.
    pub max_configs_per_task: usize,
    /// Notifications one principal may have waiting for delivery; at the cap, new configs are
    /// refused (those waiting are still delivered).
    pub max_pending_per_principal: usize,
    /// Webhooks may point at loopback, private, link-local and other internal addresses (and
    /// use http).
    #[serde(deserialize_with = "flexible_bool")]
    pub allow_private_networks: bool,
    /// Host names (or address literals) allowed whatever they resolve to, over http too.
    pub allowed_hosts: Vec<String>,
    /// A notification not delivered this long after its change is given up.
    pub give_up_after_secs: u64,
    /// Time one delivery attempt may take (connect, send, response headers).
    pub attempt_timeout_ms: u64,
    /// First retry delay; doubles per attempt (with jitter) up to `retry_max_ms`.
    pub retry_base_ms: u64,
    pub retry_max_ms: u64,
    /// Deliveries in flight at once.
    pub concurrency: usize,
    /// PKCS#8 (DER) ECDSA P-256 key notifications are signed with; default: generated on first
    /// start into `data/push-signing-key.p8`.
    pub signing_key_file: Option<PathBuf>,
}

impl Default for PushSettings {
    fn default() -> Self {
        PushSettings {
            max_configs_per_task: 10,
            max_pending_per_principal: 10_000,
            allow_private_networks: false,
            allowed_hosts: Vec::new(),
            give_up_after_secs: 24 * 60 * 60,
            attempt_timeout_ms: 10_000,
            retry_base_ms: 1_000,
            retry_max_ms: 5 * 60 * 1000,
            concurrency: 64,
            signing_key_file: None,
        }
    }
}

/// A boolean that also accepts the environment's usual spellings: `1`/`0`, `yes`/`no`.
fn flexible_bool<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<bool, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Flexible {
        Bool(bool),
        Number(u64),
        Text(String),
    }
    match Flexible::deserialize(deserializer)? {
        Flexible::Bool(b) => Ok(b),
        Flexible::Number(0) => Ok(false),
        Flexible::Number(1) => Ok(true),
        Flexible::Text(t)
            if ["1", "true", "yes", "on"].contains(&t.to_ascii_lowercase().as_str()) =>
        {
            Ok(true)
        }
        Flexible::Text(t)
            if ["0", "false", "no", "off", ""].contains(&t.to_ascii_lowercase().as_str()) =>
        {
            Ok(false)
        }
        _ => Err(serde::de::Error::custom(
            "expected a boolean (true/false, 1/0, yes/no)",
        )),
    }
}

impl Config {
    /// Defaults < `file` < `COLLOQUY_*` environment < `overrides` (from flags).
    pub fn load(file: Option<&Path>, overrides: impl Serialize) -> Result<Config, ConfigError> {
        let mut figment = Figment::from(Serialized::defaults(Config::default()));
        if let Some(file) = file {
            if !file.exists() {
                return Err(ConfigError::Invalid(format!(
                    "config file {} does not exist",
                    file.display()
                )));
            }
            figment = figment.merge(Toml::file(file));
        }
        for variable in environment().into_iter().filter_map(EnvSetting::known) {
            figment = figment.merge(variable);
        }
        figment = figment.merge(Serialized::globals(overrides));
        let config: Config = figment.extract()?;
        config.validate()?;
        Ok(config)
    }

    fn validate(&self) -> Result<(), ConfigError> {
        if let Some(problem) = self.auth.jwt.problem() {
            return Err(ConfigError::Invalid(problem));
        }
        if self.history.limit > MAX_LIMIT {
            return Err(ConfigError::Invalid(format!(
                "history.limit is {}, at most {MAX_LIMIT} is allowed",
                self.history.limit
            )));
        }
        if !["both", "1.0", "0.3"].contains(&self.card.versions.as_str()) {
            return Err(ConfigError::Invalid(format!(
                "card.versions is {:?}; use \"both\", \"1.0\" or \"0.3\"",
                self.card.versions
            )));
        }
        let tenants = self
            .auth
            .tenants
            .values()
            .flatten()
            .chain(&self.card.tenant);
        if let Some(bad) = tenants
            .into_iter()
            .find(|t| !crate::model::is_tenant_name(t))
        {
            return Err(ConfigError::Invalid(format!(
                "{bad:?} is not a tenant name ({})",
                crate::model::TENANT_NAME_RULE
            )));
        }
        if !["pretty", "json"].contains(&self.log_format.as_str()) {
            return Err(ConfigError::Invalid(format!(
                "log_format is {:?}; use \"pretty\" or \"json\"",
                self.log_format
            )));
        }
        if self.store.checkpoint_interval_ms == 0 {
            return Err(ConfigError::Invalid(
                "store.checkpoint_interval_ms must be positive".into(),
            ));
        }
        if self.store.checkpoint_max_wait_ms < self.store.checkpoint_interval_ms {
            return Err(ConfigError::Invalid(format!(
                "store.checkpoint_max_wait_ms ({}) is less than store.checkpoint_interval_ms ({})",
                self.store.checkpoint_max_wait_ms, self.store.checkpoint_interval_ms
            )));
        }
        if self.store.compression_level > 22 {
            return Err(ConfigError::Invalid(format!(
                "store.compression_level is {}; use 0 (none) or a zstd level from 1 to 22",
                self.store.compression_level
            )));
        }
        if !(MIN_LEAF_FANOUT..=MAX_LEAF_FANOUT).contains(&self.store.leaf_fanout) {
            return Err(ConfigError::Invalid(format!(
                "store.leaf_fanout is {}; use {MIN_LEAF_FANOUT} to {MAX_LEAF_FANOUT} entries",
                self.store.leaf_fanout
            )));
        }
        if !SEGMENT_CLEANUP_PERCENTS.contains(&self.store.segment_cleanup_percent) {
            return Err(ConfigError::Invalid(format!(
                "store.segment_cleanup_percent is {}; use {} to {}",
                self.store.segment_cleanup_percent,
                SEGMENT_CLEANUP_PERCENTS.start(),
                SEGMENT_CLEANUP_PERCENTS.end()
            )));
        }
        if let Some(url) = self.store.database_url()
            && !crate::store::postgres::is_postgres_url(url)
        {
            return Err(ConfigError::Invalid(
                "store.url must start with postgres:// or postgresql://, or be a key-value \
                 connection string naming host= (or be empty for the embedded store)"
                    .into(),
            ));
        }
        if self.cluster.lease_secs == 0 || self.store.pool_size == 0 {
            return Err(ConfigError::Invalid(
                "cluster.lease_secs and store.pool_size must be positive".into(),
            ));
        }
        if self.admin_listen() == Some(self.listen.trim()) {
            return Err(ConfigError::Invalid(format!(
                "admin_listen is {:?}, the same as listen; give the operator endpoints another \
                 address, or leave admin_listen unset",
                self.listen
            )));
        }
        // Port 0 asks for any free port: two such addresses never clash.
        if let Some(grpc) = self.grpc_listen().filter(|grpc| !grpc.ends_with(":0"))
            && (grpc == self.listen.trim() || Some(grpc) == self.admin_listen())
        {
            return Err(ConfigError::Invalid(format!(
                "grpc_listen is {grpc:?}, an address another endpoint listens on; give the gRPC \
                 binding its own address, or leave grpc_listen empty to serve none"
            )));
        }
        if self
            .metrics
            .token
            .as_deref()
            .is_some_and(|t| t.trim().is_empty())
        {
            return Err(ConfigError::Invalid(
                "metrics.token is empty; leave it unset for a /metrics without a token".into(),
            ));
        }
        self.console.validate()?;
        if self.limits.body_bytes == 0
            || self.limits.context_id_bytes == 0
            || self.limits.response_bytes == 0
        {
            return Err(ConfigError::Invalid(
                "limits.body_bytes, limits.context_id_bytes and limits.response_bytes must be \
                 positive"
                    .into(),
            ));
        }
        if self.limits.body_timeout_ms == 0 || self.limits.max_connections == 0 {
            return Err(ConfigError::Invalid(
                "limits.body_timeout_ms and limits.max_connections must be positive".into(),
            ));
        }
        self.trusted_proxies()?;
        let push = &self.push;
        if push.max_configs_per_task == 0
            || push.max_pending_per_principal == 0
            || push.attempt_timeout_ms == 0
            || push.retry_base_ms == 0
            || push.retry_max_ms < push.retry_base_ms
            || push.concurrency == 0
        {
            return Err(ConfigError::Invalid(
                "push.max_configs_per_task, push.max_pending_per_principal, \
                 push.attempt_timeout_ms, push.retry_base_ms and push.concurrency must be \
                 positive, and push.retry_max_ms at least push.retry_base_ms"
                    .into(),
            ));
        }
        Ok(())
    }

    /// `trusted_proxies` parsed: each an address (one host) or a CIDR range.
    pub fn trusted_proxies(&self) -> Result<Vec<ipnet::IpNet>, ConfigError> {
        self.trusted_proxies
            .iter()
            .map(|entry| {
                let entry = entry.trim();
                entry
                    .parse::<ipnet::IpNet>()
                    .or_else(|_| entry.parse::<std::net::IpAddr>().map(ipnet::IpNet::from))
                    .map_err(|_| {
                        ConfigError::Invalid(format!(
                            "trusted_proxies: {entry:?} is neither an IP address nor a CIDR range \
                             such as 10.0.0.0/8"
                        ))
                    })
            })
            .collect()
    }

    /// `grpc_listen`, unless empty.
    pub fn grpc_listen(&self) -> Option<&str> {
        Some(self.grpc_listen.trim()).filter(|listen| !listen.is_empty())
    }

    /// `admin_listen`, unless unset or empty.
    pub fn admin_listen(&self) -> Option<&str> {
        self.admin_listen
            .as_deref()
            .map(str::trim)
            .filter(|listen| !listen.is_empty())
    }
}

const PREFIX: &str = "COLLOQUY_";

/// `COLLOQUY_*` variables colloquy reads itself rather than as configuration keys.
const READ_ELSEWHERE: [&str; 4] = ["TOKENS", "HOME", "CONFIG", "LOADGEN_TOKEN"];

/// One `COLLOQUY_*` variable, as a config layer of its own (so an error names it exactly).
struct EnvSetting {
    variable: String,
    /// The key path, lower-cased, one segment per `__`.
    path: Vec<String>,
    value: String,
}

/// What the defaults say of a key: text (or unset, which is always text here), or a TOML-like
/// value (number, boolean, list, table).
enum KeyKind {
    Text,
    Structured,
}

/// The `COLLOQUY_*` variables that are not read elsewhere, by name.
fn environment() -> Vec<EnvSetting> {
    let mut settings: Vec<EnvSetting> = std::env::vars_os()
        .filter_map(|(name, value)| {
            let variable = name.into_string().ok()?;
            EnvSetting::new(variable, value.to_string_lossy().into_owned())
        })
        .collect();
    settings.sort_by(|a, b| a.variable.cmp(&b.variable));
    settings
}

/// Whether colloquy reads the environment variable `name`: one that names a configuration key
/// (`COLLOQUY_` and the key upper-cased, nested with `__`), or one it reads itself
/// (`COLLOQUY_TOKENS`, `COLLOQUY_CONFIG`, ...). For checking deployment files.
pub fn reads_variable(name: &str) -> bool {
    let Some(rest) = name
        .get(..PREFIX.len())
        .filter(|prefix| prefix.eq_ignore_ascii_case(PREFIX))
        .and_then(|_| name.get(PREFIX.len()..))
    else {
        return false;
    };
    READ_ELSEWHERE
        .iter()
        .any(|known| known.eq_ignore_ascii_case(rest))
        || EnvSetting::new(name.to_owned(), String::new())
            .is_some_and(|setting| setting.kind().is_some())
}

/// The `COLLOQUY_*` variables that name no configuration key (and are ignored), sorted.
pub fn ignored_environment() -> Vec<String> {
    environment()
        .into_iter()
        .filter(|setting| setting.kind().is_none())
        .map(|setting| setting.variable)
        .collect()
}

impl EnvSetting {
    /// The setting `variable` makes, if it is a `COLLOQUY_*` variable not read elsewhere. Names
    /// are matched ignoring case, as figment's `Env` did before.
    fn new(variable: String, value: String) -> Option<Self> {
        let prefix = variable.get(..PREFIX.len())?;
        let rest = variable.get(PREFIX.len()..)?;
        if !prefix.eq_ignore_ascii_case(PREFIX)
            || READ_ELSEWHERE
                .iter()
                .any(|name| name.eq_ignore_ascii_case(rest))
        {
            return None;
        }
        let path = rest.split("__").map(str::to_ascii_lowercase).collect();
        Some(EnvSetting {
            variable,
            path,
            value,
        })
    }

    fn known(self) -> Option<Self> {
        self.kind().is_some().then_some(self)
    }

    /// The kind of key the variable sets, from the defaults' shape; `None`: no such key. Below
    /// a table that is empty by default (`peers`, `auth.tokens`), any name is a key, of text.
    fn kind(&self) -> Option<KeyKind> {
        let defaults = serde_json::to_value(Config::default()).ok()?;
        let mut node = &defaults;
        for segment in &self.path {
            match node {
                serde_json::Value::Object(map) if map.is_empty() => return Some(KeyKind::Text),
                serde_json::Value::Object(map) => node = map.get(segment)?,
                _ => return None,
            }
        }
        Some(match node {
            serde_json::Value::String(_) | serde_json::Value::Null => KeyKind::Text,
            _ => KeyKind::Structured,
        })
    }

    fn parsed_value(&self) -> FigmentValue {
        match self.kind() {
            Some(KeyKind::Structured) => self
                .value
                .parse()
                .unwrap_or_else(|_| FigmentValue::from(self.value.clone())),
            _ => FigmentValue::from(self.value.clone()),
        }
    }
}

impl Provider for EnvSetting {
    fn metadata(&self) -> Metadata {
        let variable = self.variable.clone();
        Metadata::named("environment variable")
            .interpolater(move |_: &Profile, _: &[&str]| variable.clone())
    }

    fn data(&self) -> Result<Map<Profile, Dict>, figment::Error> {
        let mut value = self.parsed_value();
        for segment in self.path.iter().rev() {
            let mut dict = Dict::new();
            dict.insert(segment.clone(), value);
            value = FigmentValue::from(dict);
        }
        let dict = value.into_dict().unwrap_or_default();
        Ok(Profile::Default.collect(dict))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Kubernetes injects `<SERVICE>_PORT`, `<SERVICE>_SERVICE_HOST`, `<SERVICE>_PORT_<n>_TCP…`;
    /// a key with such a name would take their values instead of being left alone.
    #[test]
    fn no_key_has_a_name_kubernetes_injects() {
        let defaults = serde_json::to_value(Config::default()).unwrap();
        for key in defaults.as_object().unwrap().keys() {
            assert!(
                key != "port" && !key.starts_with("port_") && !key.starts_with("service_"),
                "{key}"
            );
        }
    }

    #[test]
    fn the_pending_cap_must_be_positive() {
        let mut config = Config::default();
        assert_eq!(config.push.max_pending_per_principal, 10_000);
        assert!(config.validate().is_ok());
        config.push.max_pending_per_principal = 0;
        let refused = config.validate().unwrap_err().to_string();
        assert!(
            refused.contains("push.max_pending_per_principal"),
            "{refused}"
        );
    }
}
