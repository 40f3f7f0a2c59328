//! `colloquy conversations | history | delete`: the store, read directly (server stopped).

use super::StoreArgs;
use crate::config::Config;
use crate::model::{Role, format_time};
use crate::store::{ConversationKey, ConversationMeta, Store};
use clap::Args;
use std::process::ExitCode;

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
pub struct DeleteArgs {
    #[command(flatten)]
    store: StoreArgs,
    context_id: String,
}

fn open(args: &StoreArgs) -> Result<Store, String> {
    let config =
        Config::load(args.config.as_deref(), serde_json::json!({})).map_err(|e| e.to_string())?;
    let data = args.data.clone().unwrap_or(config.data);
    if !data.exists() {
        return Err(format!("no data folder at {}", data.display()));
    }
    crate::app::open_store(&data, &config.store).map_err(|e| {
        format!(
            "opening {}: {e} (is a server running on it? use the colloquy/* JSON-RPC methods then)",
            data.display()
        )
    })
}

pub fn list(args: ListArgs) -> Result<ExitCode, String> {
    let store = open(&args.store)?;
    let page = store
        .list_conversations(
            &args.store.principal,
            args.page_size.max(1),
            args.page_token.as_deref(),
        )
        .map_err(|e| e.to_string())?;
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
) -> Result<(Store, ConversationKey, ConversationMeta), String> {
    let store = open(args)?;
    let key = ConversationKey::new(&args.principal, context_id);
    match store.conversation(&key).map_err(|e| e.to_string())? {
        Some(meta) => Ok((store, key, meta)),
        None => Err(format!(
            "no conversation {context_id:?} for principal {:?}",
            args.principal
        )),
    }
}

pub fn history(args: HistoryArgs) -> Result<ExitCode, String> {
    let (store, key, meta) = find(&args.store, &args.context_id)?;
    println!(
        "conversation {} ({} turns, updated {})",
        meta.context_id,
        meta.turns,
        format_time(&meta.updated_at)
    );
    for (_, message) in store
        .recent_messages(&key, meta.next_seq, args.limit)
        .map_err(|e| e.to_string())?
    {
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

pub fn delete(args: DeleteArgs) -> Result<ExitCode, String> {
    let (store, _, meta) = find(&args.store, &args.context_id)?;
    store
        .delete_conversation(&meta)
        .map_err(|e| e.to_string())?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .map_err(|e| e.to_string())?;
    runtime
        .block_on(store.durable())
        .map_err(|e| e.to_string())?;
    println!("deleted conversation {}", args.context_id);
    Ok(ExitCode::SUCCESS)
}
