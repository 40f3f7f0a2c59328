//! The PostgreSQL store: any number of colloquy nodes on one database.
//!
//! A conversation's lease lives in its row: `running_task`, `token` (incremented at every take)
//! and `lease_expires`, judged by the database's clock. Starting a turn takes the lease with a
//! conditional insert-or-update in the transaction that stores the caller's message; every
//! later write of the turn is conditional on the token, so a node that lost its lease (paused,
//! partitioned) never writes again. A lease its holder stopped renewing expires; its task is
//! then failed by the next turn, by the sweeper every node runs, or on the next read of it.
//!
//! Operations run on a small runtime of the store's own, so connections never live on (and
//! stall with) an actor's thread. Every commit is durable when PostgreSQL acknowledges it.

mod console;
mod failover;
mod group;
mod ops;
mod push;
mod schema;
mod transfer;
mod turn;

pub use schema::{Migrated, SCHEMA_VERSION};

use super::{
    BeginTurn, ConversationKey, ConversationMeta, ConversationPage, ConversationRecords,
    ConversationStore, FinishTurn, Imported, Lease, MessagesFrom, Page, StoreError, StoreResult,
    StreamOutline, TaskQuery, TurnBegun,
};
use crate::error::{Cause, chain};
use crate::model::{Task, TaskStatus};
use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};
use futures_util::future::BoxFuture;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

/// What a task cut off by a node that stopped says when it is marked failed.
pub const ABANDONED_TASK_TEXT: &str = "the node running this turn stopped";

/// How to reach the database and how long a lease lasts.
#[derive(Debug, Clone)]
pub struct PgOptions {
    /// `postgres://…` or `postgresql://…` (also multi-host, `target_session_attrs=read-write`).
    pub url: String,
    /// Connections this node keeps at most.
    pub pool_size: usize,
    /// How long a turn's lease lasts unless renewed.
    pub lease: Duration,
    /// Who holds the leases this node takes (shown in the conversation's row).
    pub holder: String,
    /// PEM certificates of the authorities the database's certificate may come from, besides
    /// the public ones. Set, or with `sslmode=require` in the URL, connections use TLS.
    pub tls_ca_file: Option<std::path::PathBuf>,
    /// Hash partitions of the conversation-keyed tables when this node creates the schema (0:
    /// plain tables). Read only then.
    pub partitions: u32,
    /// The most turn starts (or ends) one statement commits together (`group.rs`; 1: each
    /// alone).
    pub group_steps: usize,
}

/// A TLS connector (rustls) if the URL's `sslmode` requires TLS or a CA file is given; else
/// plain connections (`sslmode=prefer`, the default, then connects without TLS).
fn tls_connector(
    config: &tokio_postgres::Config,
    ca_file: Option<&std::path::Path>,
) -> StoreResult<Option<tokio_postgres_rustls::MakeRustlsConnect>> {
    use rustls_pki_types::CertificateDer;
    use rustls_pki_types::pem::PemObject;
    use tokio_postgres::config::SslMode;
    let required = !matches!(config.get_ssl_mode(), SslMode::Disable | SslMode::Prefer);
    if !required && ca_file.is_none() {
        return Ok(None);
    }
    fn tls_error(e: impl Into<crate::error::BoxError>) -> StoreError {
        StoreError::backend("store TLS", e)
    }
    let mut roots = rustls::RootCertStore::empty();
    roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
    if let Some(file) = ca_file {
        let certificates = CertificateDer::pem_file_iter(file).map_err(tls_error)?;
        for certificate in certificates {
            roots
                .add(certificate.map_err(tls_error)?)
                .map_err(tls_error)?;
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(tls_error)?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(Some(tokio_postgres_rustls::MakeRustlsConnect::new(config)))
}

/// Whether `url` names a PostgreSQL database: a `postgres://` or `postgresql://` URL, or a
/// key-value connection string naming its hosts (`host=a,b port=5432,5433 dbname=…`).
pub fn is_postgres_url(url: &str) -> bool {
    let key_value = || {
        url.split_whitespace().any(|pair| pair.starts_with("host="))
            && url.parse::<tokio_postgres::Config>().is_ok()
    };
    url.starts_with("postgres://") || url.starts_with("postgresql://") || key_value()
}

/// How often the sweep repairs the outbox rows that nodes of an older build leave (see
/// `Ops::repair_outbox`).
const OUTBOX_REPAIR_PERIOD: Duration = Duration::from_secs(30);

/// The store. Cheap to clone.
#[derive(Clone)]
pub struct PgStore {
    ops: Arc<Ops>,
    runtime: Arc<StoreRuntime>,
}

/// The connection pool and the lease settings every operation uses.
pub(crate) struct Ops {
    pool: Pool,
    lease_secs: f64,
    /// [`PgOptions::partitions`].
    partitions: u32,
    /// This node's address in the leases it takes (see [`PgStore::set_holder`]).
    holder: parking_lot::RwLock<String>,
    /// When the sweep last repaired the outbox (see [`OUTBOX_REPAIR_PERIOD`]).
    outbox_repaired: parking_lot::Mutex<std::time::Instant>,
    /// The turns this node started and has not yet ended, by conversation and token: what
    /// their end writes without reading it first (`turn.rs`).
    started:
        parking_lot::Mutex<std::collections::HashMap<(ConversationKey, u64), turn::StartedTurn>>,
    /// Where the usual starts and ends wait to be committed together (`group.rs`).
    steps: group::Group<turn::StartStep, turn::EndStep>,
    /// Told when this node committed a status change that may have added notifications: its
    /// delivery worker need not wait for its next poll. Other nodes' notifications are found by
    /// polling. A one-trip turn step adds none (it runs only for tasks without push configs),
    /// so it wakes nobody.
    outbox: Arc<tokio::sync::Notify>,
}

/// Where the store's work runs: its statements, its connections, its group commit.
enum StoreRuntime {
    /// A runtime of its own ([`store_threads`] threads), shut down without blocking when the
    /// last handle goes (which may be inside another runtime).
    Own(Option<tokio::runtime::Runtime>),
    /// A node's only conversation arbiter (`engine::Arbiters::sole_runtime`): a turn's steps
    /// go to the database and their answers come back to the turn on the thread that runs it,
    /// without waking a thread of the store's. It stops with the arbiters, at the end of the
    /// engine's shutdown; the store is closed from then on.
    Borrowed(tokio::runtime::Handle),
}

impl Drop for StoreRuntime {
    fn drop(&mut self) {
        if let StoreRuntime::Own(runtime) = self
            && let Some(runtime) = runtime.take()
        {
            runtime.shutdown_background();
        }
    }
}

impl StoreRuntime {
    fn handle(&self) -> Option<tokio::runtime::Handle> {
        match self {
            StoreRuntime::Own(runtime) => runtime.as_ref().map(|r| r.handle().clone()),
            StoreRuntime::Borrowed(handle) => Some(handle.clone()),
        }
    }
}

/// Why one database operation failed, before it becomes a [`StoreError`].
pub(crate) enum Failure {
    Db(tokio_postgres::Error),
    Pool(deadpool_postgres::PoolError),
    Store(StoreError),
    /// A connection lost mid-commit, told to every step of a group (`group.rs`): whether
    /// the commit was stored is unknown.
    Lost(StoreError),
}

impl From<tokio_postgres::Error> for Failure {
    fn from(e: tokio_postgres::Error) -> Self {
        Failure::Db(e)
    }
}

impl From<StoreError> for Failure {
    fn from(e: StoreError) -> Self {
        Failure::Store(e)
    }
}

impl Failure {
    /// A conflict the database asks us to retry (serialization failure, deadlock).
    fn is_retryable(&self) -> bool {
        use tokio_postgres::error::SqlState;
        match self {
            Failure::Db(e) => e.code().is_some_and(|code| {
                *code == SqlState::T_R_SERIALIZATION_FAILURE
                    || *code == SqlState::T_R_DEADLOCK_DETECTED
            }),
            _ => false,
        }
    }

    /// Whether the connection went while the request was out (its commit may be stored).
    pub(super) fn connection_lost(&self) -> bool {
        match self {
            Failure::Db(e) => failover::connection_lost(e),
            Failure::Lost(_) => true,
            _ => false,
        }
    }

    /// The database refused the statement (its transaction wrote nothing), with this SQLSTATE.
    pub(super) fn refused_with(&self) -> Option<&str> {
        match self {
            Failure::Db(e) if !failover::connection_lost(e) => {
                e.as_db_error().map(|db| db.code().code())
            }
            _ => None,
        }
    }

    /// This failure, told to `n` callers.
    fn shared(self, n: usize) -> Vec<Failure> {
        if n == 1 {
            return vec![self];
        }
        let lost = self.connection_lost();
        let error = self.into_store();
        (0..n)
            .map(|_| match lost {
                true => Failure::Lost(error.clone()),
                false => Failure::Store(error.clone()),
            })
            .collect()
    }

    pub(crate) fn into_store(self) -> StoreError {
        match self {
            Failure::Store(e) | Failure::Lost(e) => e,
            // No connection to be had: none was used, nothing was written.
            // A pool error's own text rarely says why (a TLS handshake's reason, say): the
            // message carries its causes.
            Failure::Pool(e) => StoreError::Unavailable {
                message: format!("database connection: {}", chain(&e)),
                source: Some(Cause::new(e)),
            },
            Failure::Db(e) if failover::connection_lost(&e) => {
                StoreError::unavailable("database", e)
            }
            Failure::Db(e) => match e
                .as_db_error()
                .map(|db| format!("database: {} ({})", db.message(), db.code().code()))
            {
                Some(message) => StoreError::Backend {
                    message,
                    source: Some(Cause::new(e)),
                },
                None => StoreError::backend("database", e),
            },
        }
    }
}

/// Runs `attempt` again while it fails with a conflict the database asks to retry, with a
/// growing, jittered pause.
async fn retrying<T, F, Fut>(mut attempt: F) -> StoreResult<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, Failure>>,
{
    let mut pause = Duration::from_millis(5);
    for _ in 0..8 {
        match attempt().await {
            Err(failure) if failure.is_retryable() => {
                let jitter = rand::random::<u64>() % (pause.as_millis() as u64 + 1);
                tokio::time::sleep(pause + Duration::from_millis(jitter)).await;
                pause = (pause * 2).min(Duration::from_millis(500));
            }
            other => return other.map_err(Failure::into_store),
        }
    }
    attempt().await.map_err(Failure::into_store)
}

impl PgStore {
    /// Connects, applies the migrations the database lacks and refuses a schema newer than
    /// this build knows.
    pub async fn connect(options: &PgOptions) -> StoreResult<PgStore> {
        PgStore::open(options, None).await
    }

    /// [`PgStore::connect`], the store's work running on `runtime` (a node's only arbiter,
    /// see [`StoreRuntime::Borrowed`]) instead of a runtime of its own.
    pub async fn connect_on(
        options: &PgOptions,
        runtime: tokio::runtime::Handle,
    ) -> StoreResult<PgStore> {
        PgStore::open(options, Some(runtime)).await
    }

    async fn open(
        options: &PgOptions,
        runtime: Option<tokio::runtime::Handle>,
    ) -> StoreResult<PgStore> {
        let store = PgStore::pool(options, runtime)?;
        store
            .run(|ops| async move { ops.migrate(SCHEMA_VERSION).await })
            .await?;
        Ok(store)
    }

    /// Connects and applies the migrations the database lacks (`colloquy migrate`).
    pub async fn migrate(options: &PgOptions) -> StoreResult<Migrated> {
        PgStore::migrate_to(options, SCHEMA_VERSION).await
    }

    /// Applies the migrations the database lacks up to version `to` only: an older schema, as
    /// an older build left it, for tests of an upgrade.
    pub async fn migrate_to(options: &PgOptions, to: i64) -> StoreResult<Migrated> {
        let store = PgStore::pool(options, None)?;
        store
            .run(move |ops| async move { ops.migrate(to).await })
            .await
    }

    fn pool(options: &PgOptions, borrowed: Option<tokio::runtime::Handle>) -> StoreResult<PgStore> {
        let mut config: tokio_postgres::Config = options
            .url
            .parse()
            .map_err(|e| StoreError::backend("store.url", e))?;
        failover::bound_dead_hosts(&mut config);
        let tls = tls_connector(&config, options.tls_ca_file.as_deref())?;
        let manager = || {
            let manager_config = ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            };
            match tls.clone() {
                Some(tls) => Manager::from_config(config.clone(), tls, manager_config),
                None => Manager::from_config(config.clone(), tokio_postgres::NoTls, manager_config),
            }
        };
        let (runtime, handle) = match borrowed {
            Some(handle) => (StoreRuntime::Borrowed(handle.clone()), handle),
            None => {
                let own = tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(store_threads())
                    .thread_name("colloquy-pg")
                    .enable_all()
                    .build()
                    .map_err(|e| StoreError::backend("the store's runtime", e))?;
                let handle = own.handle().clone();
                (StoreRuntime::Own(Some(own)), handle)
            }
        };
        let pool = Pool::builder(manager())
            .max_size(options.pool_size.max(1))
            .runtime(deadpool_postgres::Runtime::Tokio1)
            .wait_timeout(Some(Duration::from_secs(30)))
            .create_timeout(Some(Duration::from_secs(10)))
            .build()
            .map_err(|e| StoreError::backend("connection pool", e))?;
        handle.spawn(report_pool_use(pool.clone()));
        let group_pool =
            group::group_pool(manager()).map_err(|e| StoreError::backend("connection pool", e))?;
        Ok(PgStore {
            ops: Arc::new(Ops {
                pool: pool.clone(),
                lease_secs: options.lease.as_secs_f64(),
                partitions: options.partitions,
                holder: parking_lot::RwLock::new(options.holder.clone()),
                outbox_repaired: parking_lot::Mutex::new(std::time::Instant::now()),
                started: parking_lot::Mutex::default(),
                steps: group::Group::spawn(
                    group_pool,
                    turn::GROUP_SQL,
                    options.group_steps,
                    &handle,
                ),
                outbox: Arc::new(tokio::sync::Notify::new()),
            }),
            runtime: Arc::new(runtime),
        })
    }

    /// Names this node in the leases it takes from now on: the address other nodes forward
    /// requests for its running tasks to (known once it listens).
    pub fn set_holder(&self, holder: String) {
        *self.ops.holder.write() = holder;
    }

    /// [`PgStore::run`] for an operation that changes a task's status: wakes the delivery worker
    /// once it committed.
    fn run_status<T, F, Fut>(&self, op: F) -> BoxFuture<'static, StoreResult<T>>
    where
        T: Send + 'static,
        F: FnOnce(Arc<Ops>) -> Fut + Send + 'static,
        Fut: Future<Output = StoreResult<T>> + Send + 'static,
    {
        let done = self.run(op);
        let outbox = self.ops.outbox.clone();
        Box::pin(async move {
            let result = done.await;
            outbox.notify_one();
            result
        })
    }

    /// Runs an operation on the store's runtime. The operation's future is boxed before it is
    /// spawned: a turn step's is several KB (every state of every path it may take, inline), and
    /// the runtime moves a task's whole future-or-output slot when it stores and takes the
    /// output, so unboxed each step copied about 20 KB (docs/performance.md).
    fn run<T, F, Fut>(&self, op: F) -> BoxFuture<'static, StoreResult<T>>
    where
        T: Send + 'static,
        F: FnOnce(Arc<Ops>) -> Fut + Send + 'static,
        Fut: Future<Output = StoreResult<T>> + Send + 'static,
    {
        let ops = self.ops.clone();
        let handle = self.runtime.handle();
        Box::pin(async move {
            let handle = handle.ok_or(StoreError::Closed)?;
            handle
                .spawn(Box::pin(op(ops)))
                .await
                .map_err(|e| match e.is_cancelled() {
                    // Its runtime stopped: a borrowed one stops with the arbiters.
                    true => StoreError::Closed,
                    false => StoreError::backend("store operation", e),
                })?
        })
    }
}

/// The store runtime's threads, when it has its own ([`StoreRuntime::Own`]): a quarter of the
/// cores, at least one. Its work is a small part of a turn's (building statements, reading
/// rows: about a third of a node's CPU on two cores), and each thread more is one more to
/// wake: on two cores, two threads cost the node 5% more CPU a turn than one (`NODES=2
/// benches/pg_ab.sh`, docs/performance.md).
fn store_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get().div_ceil(4))
}

/// Publishes the pool's use once a second (the metrics endpoint), until the store's runtime
/// stops.
async fn report_pool_use(pool: Pool) {
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        tick.tick().await;
        let status = pool.status();
        metrics::gauge!("colloquy_store_pool_in_use")
            .set(status.size.saturating_sub(status.available) as f64);
        metrics::gauge!("colloquy_store_pool_waiting").set(status.waiting as f64);
    }
}

impl ConversationStore for PgStore {
    fn console_conversations(
        &self,
        filter: super::ConversationFilter,
    ) -> BoxFuture<'static, StoreResult<super::Page<ConversationMeta>>> {
        self.run(move |ops| async move { retrying(|| ops.console_conversations(&filter)).await })
    }

    fn held_leases(&self, limit: usize) -> BoxFuture<'static, StoreResult<Vec<super::HeldLease>>> {
        self.run(move |ops| async move { retrying(|| ops.held_leases(limit)).await })
    }

    fn begin_turn(&self, turn: BeginTurn) -> BoxFuture<'static, StoreResult<TurnBegun>> {
        // `Ops::begin` wakes the delivery worker itself, when it went the general way.
        self.run(|ops| async move { retrying(|| ops.begin(&turn)).await })
    }

    fn record_status(
        &self,
        lease: &Lease,
        status: TaskStatus,
    ) -> BoxFuture<'static, StoreResult<()>> {
        let lease = lease.clone();
        self.run_status(
            |ops| async move { ops.record_status_across_failover(&lease, &status).await },
        )
    }

    fn renew_lease(&self, lease: &Lease) -> BoxFuture<'static, StoreResult<()>> {
        let lease = lease.clone();
        self.run(|ops| async move { retrying(|| ops.renew(&lease)).await })
    }

    fn finish_turn(&self, end: FinishTurn) -> BoxFuture<'static, StoreResult<()>> {
        // `Ops::finish` wakes the delivery worker itself, when it went the general way.
        self.run(|ops| async move { ops.finish_across_failover(&end).await })
    }

    fn cancel_waiting(
        &self,
        principal: &str,
        task_id: &str,
    ) -> BoxFuture<'static, StoreResult<Task>> {
        let (principal, task_id) = (principal.to_owned(), task_id.to_owned());
        self.run_status(
            |ops| async move { retrying(|| ops.cancel_waiting(&principal, &task_id)).await },
        )
    }

    /// The sweep every node runs: fails the tasks of expired leases and, every
    /// [`OUTBOX_REPAIR_PERIOD`], repairs the outbox.
    fn fail_interrupted_turns(&self) -> BoxFuture<'static, StoreResult<usize>> {
        self.run_status(|ops| async move {
            let failed = retrying(|| ops.fail_expired()).await?;
            if ops.outbox_repair_due() {
                retrying(|| ops.repair_outbox()).await?;
            }
            Ok(failed)
        })
    }

    fn conversation(
        &self,
        key: ConversationKey,
    ) -> BoxFuture<'static, StoreResult<Option<ConversationMeta>>> {
        self.run(move |ops| async move { retrying(|| ops.conversation(&key)).await })
    }

    fn conversation_page(
        &self,
        key: ConversationKey,
        from: MessagesFrom,
        max_bytes: usize,
    ) -> BoxFuture<'static, StoreResult<Option<ConversationPage>>> {
        self.run(move |ops| async move {
            retrying(|| ops.conversation_page(&key, &from, max_bytes)).await
        })
    }

    fn task(
        &self,
        principal: &str,
        task_id: &str,
    ) -> BoxFuture<'static, StoreResult<Option<Task>>> {
        let (principal, task_id) = (principal.to_owned(), task_id.to_owned());
        self.run(|ops| async move { retrying(|| ops.task(&principal, &task_id)).await })
    }

    fn stream_outline(
        &self,
        principal: &str,
        task_id: &str,
    ) -> BoxFuture<'static, StoreResult<Option<StreamOutline>>> {
        let (principal, task_id) = (principal.to_owned(), task_id.to_owned());
        self.run(|ops| async move { retrying(|| ops.stream_outline(&principal, &task_id)).await })
    }

    fn list_tasks(
        &self,
        principal: &str,
        query: TaskQuery,
    ) -> BoxFuture<'static, StoreResult<Page<Task>>> {
        let principal = principal.to_owned();
        self.run(|ops| async move { retrying(|| ops.list_tasks(&principal, &query)).await })
    }

    fn list_conversations(
        &self,
        principal: &str,
        page_size: usize,
        page_token: Option<String>,
    ) -> BoxFuture<'static, StoreResult<Page<ConversationMeta>>> {
        let principal = principal.to_owned();
        self.run(move |ops| async move {
            retrying(|| ops.list_conversations(&principal, page_size, page_token.as_deref())).await
        })
    }

    fn delete_conversation(&self, key: ConversationKey) -> BoxFuture<'static, StoreResult<bool>> {
        self.run(move |ops| async move { retrying(|| ops.delete_conversation(&key)).await })
    }

    fn probe(&self) -> BoxFuture<'static, StoreResult<()>> {
        self.run(|ops| async move { retrying(|| ops.probe()).await })
    }

    fn running_holder(
        &self,
        principal: &str,
        task_id: &str,
    ) -> BoxFuture<'static, StoreResult<Option<String>>> {
        let (principal, task_id) = (principal.to_owned(), task_id.to_owned());
        self.run(|ops| async move { retrying(|| ops.running_holder(&principal, &task_id)).await })
    }

    fn export_conversations(
        &self,
        principal: Option<String>,
        after: Option<ConversationKey>,
        limit: usize,
    ) -> BoxFuture<'static, StoreResult<Vec<ConversationRecords>>> {
        self.run(move |ops| async move {
            retrying(|| ops.export(principal.as_deref(), after.as_ref(), limit)).await
        })
    }

    fn import_conversations(
        &self,
        items: Vec<ConversationRecords>,
    ) -> BoxFuture<'static, StoreResult<Imported>> {
        self.run(move |ops| async move { retrying(|| ops.import(&items)).await })
    }

    /// Every acknowledged write is already committed.
    fn flush(&self) -> BoxFuture<'static, StoreResult<()>> {
        Box::pin(async { Ok(()) })
    }

    fn size_on_disk(&self) -> BoxFuture<'static, StoreResult<u64>> {
        self.run(|ops| async move { retrying(|| ops.size_on_disk()).await })
    }
}
