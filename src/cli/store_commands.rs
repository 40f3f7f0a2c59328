//! `colloquy conversations | history | delete`: the store, read directly (a sled folder of a
//! stopped server, or the PostgreSQL database of `store.url`, servers running or not);
//! `colloquy migrate`: the PostgreSQL schema.

use super::{CliError, StoreArgs};
use crate::config::Config;
use crate::model::{Role, format_time};
use crate::store::postgres::PgStore;
use crate::store::{ConversationKey, ConversationMeta, MessagesFrom, SharedStore, StoreResult};
use clap::Args;
use std::process::ExitCode;
use std::sync::Arc;

#[derive(Args, Debug)]
pub struct ListArgs {
    #[command(flatten)]
    store: StoreArgs,
    #[arg(long, default_value_t = 50)]
    page_size: usize,
    /// Continue from the token a previous page printed.
    #[arg(long)]
    page_token: Option<String>,
}

#[derive(Args, Debug)]
pub struct HistoryArgs {
    #[command(flatten)]
    store: StoreArgs,
    /// The contextId exactly as the caller used it.
    context_id: String,
    /// Most recent messages to show.
    #[arg(long, default_value_t = 200)]
    limit: usize,
}

#[derive(Args, Debug)]
pub struct MigrateArgs {
    #[arg(long)]
    config: Option<std::path::PathBuf>,
}

#[derive(Args, Debug)]
pub struct DeleteArgs {
    #[command(flatten)]
    store: StoreArgs,
    context_id: String,
}

fn open(args: &StoreArgs) -> Result<SharedStore, CliError> {
    open_store(
        &load_config(args.config.as_deref())?,
        args.data.clone(),
        false,
    )
}

pub(super) fn load_config(path: Option<&std::path::Path>) -> Result<Config, CliError> {
    Ok(Config::load(path, serde_json::json!({}))?)
}

/// The store the config names: the PostgreSQL database of `store.url`, else the sled folder
/// `data` (default: the config's), created if `create` says so.
pub(super) fn open_store(
    config: &Config,
    data: Option<std::path::PathBuf>,
    create: bool,
) -> Result<SharedStore, CliError> {
    if let Some(options) = crate::app::postgres_options(config) {
        let store = wait(PgStore::connect(&options))?;
        return Ok(Arc::new(store));
    }
    let data = data.unwrap_or_else(|| config.data.clone());
    if create {
        std::fs::create_dir_all(&data).map_err(|source| CliError::File {
            path: data.display().to_string(),
            source,
        })?;
    }
    if !data.exists() {
        return Err(CliError::Refused(format!(
            "no data folder at {}",
            data.display()
        )));
    }
    let store =
        crate::app::open_store(&data, &config.store).map_err(|source| CliError::Locked {
            path: data.display().to_string(),
            source,
        })?;
    Ok(Arc::new(store))
}

/// Runs a store future to its end on a runtime of its own (the commands are synchronous).
pub(super) fn wait<T>(
    work: impl std::future::Future<Output = StoreResult<T>>,
) -> Result<T, CliError> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .map_err(CliError::Runtime)?;
    Ok(runtime.block_on(work)?)
}

pub fn list(args: ListArgs) -> Result<ExitCode, CliError> {
    let store = open(&args.store)?;
    let page = wait(store.list_conversations(
        &args.store.stored_principal(),
        args.page_size.max(1),
        args.page_token.clone(),
    ))?;
    println!("{:<40} {:>6}  {:<24}", "CONTEXT ID", "TURNS", "UPDATED");
    for meta in &page.items {
        println!(
            "{:<40} {:>6}  {:<24}",
            meta.context_id,
            meta.turns,
            format_time(&meta.updated_at)
        );
    }
    println!(
        "({} of {} conversations)",
        page.items.len(),
        page.total_size
    );
    if !page.next_page_token.is_empty() {
        println!("next page: --page-token {}", page.next_page_token);
    }
    Ok(ExitCode::SUCCESS)
}

/// Opens the store and finds the principal's conversation, or says it is not there.
fn find(
    args: &StoreArgs,
    context_id: &str,
) -> Result<(SharedStore, ConversationKey, ConversationMeta), CliError> {
    let store = open(args)?;
    let key = ConversationKey::new(&args.stored_principal(), context_id);
    match wait(store.conversation(key))? {
        Some(meta) => Ok((store, key, meta)),
        None => Err(CliError::Refused(format!(
            "no conversation {context_id:?} for principal {:?}",
            args.principal
        ))),
    }
}

pub fn history(args: HistoryArgs) -> Result<ExitCode, CliError> {
    let (store, key, meta) = find(&args.store, &args.context_id)?;
    println!(
        "conversation {} ({} turns, updated {})",
        meta.context_id,
        meta.turns,
        format_time(&meta.updated_at)
    );
    let page = wait(store.conversation_page(key, MessagesFrom::Latest(args.limit), usize::MAX))?
        .ok_or_else(|| CliError::Refused(format!("conversation {:?} is gone", args.context_id)))?;
    for message in page.messages {
        let role = match message.role {
            Role::User => "user",
            Role::Agent => "agent",
        };
        let time = message
            .timestamp
            .as_ref()
            .map(format_time)
            .unwrap_or_default();
        println!("[{time}] {role}: {}", message.text());
    }
    Ok(ExitCode::SUCCESS)
}

pub fn delete(args: DeleteArgs) -> Result<ExitCode, CliError> {
    let (store, key, _) = find(&args.store, &args.context_id)?;
    wait(store.delete_conversation(key))?;
    println!("deleted conversation {}", args.context_id);
    Ok(ExitCode::SUCCESS)
}

pub fn migrate(args: MigrateArgs) -> Result<ExitCode, CliError> {
    let config = load_config(args.config.as_deref())?;
    let options = crate::app::postgres_options(&config).ok_or_else(|| {
        CliError::Refused(
            "store.url is not set (COLLOQUY_STORE__URL): the embedded store needs no migration"
                .to_owned(),
        )
    })?;
    let migrated = wait(crate::store::postgres::PgStore::migrate(&options))?;
    if migrated.from == migrated.to {
        println!("the schema is at version {}: nothing to do", migrated.to);
    } else {
        println!(
            "migrated the schema from version {} to {}",
            migrated.from, migrated.to
        );
    }
    Ok(ExitCode::SUCCESS)
}
