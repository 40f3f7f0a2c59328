//! Conversations: the listing (every principal's, filtered, newest first, paged), one
//! conversation with the prompt each turn's agent was shown, and deleting one.

use super::auth::{Console, Operator};
use super::{ConsoleError, PATH, ok, optional_name, principal_label, query, see_other, time};
use crate::history::{HistoryEntry, render_prompt};
use crate::http::state::AppState;
use crate::model::{Message, Role, TaskState, TaskView};
use crate::store::{
    ConversationFilter, ConversationKey, ConversationMeta, MessagesFrom, TaskQuery,
};
use actix_web::{HttpRequest, HttpResponse, web};
use askama::Template;

/// Conversations a listing page shows unless the URL asks for another number (1 to
/// [`MAX_PAGE_SIZE`]).
const PAGE_SIZE: usize = 25;
const MAX_PAGE_SIZE: usize = 100;

/// The latest messages a conversation's page shows (the windows of their turns are read too).
const SHOWN_MESSAGES: usize = 50;

/// The latest tasks a conversation's page lists.
const SHOWN_TASKS: usize = 50;

pub fn routes(cfg: &mut web::ServiceConfig) {
    cfg.route("/conversations", web::get().to(list))
        .route("/conversation", web::get().to(show))
        .route("/conversation/delete", web::get().to(confirm_delete))
        .route("/conversation/delete", web::post().to(delete));
}

#[derive(serde::Deserialize)]
struct ListQuery {
    principal: Option<String>,
    tenant: Option<String>,
    prefix: Option<String>,
    page: Option<String>,
    size: Option<usize>,
    /// The contextId just deleted, to say so.
    deleted: Option<String>,
}

/// One row of the listing.
struct Row {
    context_id: String,
    principal: String,
    turns: u64,
    updated: String,
    running_task: Option<String>,
    href: String,
}

impl Row {
    fn of(meta: ConversationMeta) -> Row {
        Row {
            href: conversation_href(&meta.principal, &meta.context_id),
            principal: principal_label(&meta.principal),
            updated: time(&meta.updated_at),
            context_id: meta.context_id,
            turns: meta.turns,
            running_task: meta.running_task,
        }
    }
}

pub fn conversation_href(principal: &str, context_id: &str) -> String {
    format!(
        "{PATH}/conversation{}",
        query(&[("principal", principal), ("context", context_id)])
    )
}

#[derive(Template)]
#[template(path = "console/conversations.html")]
struct ListPage {
    op: Operator,
    principal: String,
    tenant: String,
    prefix: String,
    rows: Vec<Row>,
    /// The next page's link, if there is one.
    next: Option<String>,
    /// The first page's link, when this is a later one.
    first: Option<String>,
    deleted: Option<String>,
}

async fn list(
    op: Operator,
    state: web::Data<AppState>,
    params: web::Query<ListQuery>,
) -> Result<HttpResponse, ConsoleError> {
    let principal = optional_name("principal", &params.principal)?;
    let tenant = optional_name("tenant", &params.tenant)?;
    let prefix = optional_name("contextId prefix", &params.prefix)?;
    let page_token = optional_name("page", &params.page)?;
    let page_size = params.size.unwrap_or(PAGE_SIZE).clamp(1, MAX_PAGE_SIZE);
    let filter = ConversationFilter {
        // The store knows a principal in a tenant by the two joined.
        principal: principal
            .as_deref()
            .map(|p| crate::model::principal_in_tenant(p, tenant.as_deref())),
        tenant: tenant.clone(),
        context_prefix: prefix.clone(),
        page_size,
        page_token: page_token.clone(),
    };
    let page = state.engine.store().console_conversations(filter).await?;
    let (principal, tenant, prefix) = (
        principal.unwrap_or_default(),
        tenant.unwrap_or_default(),
        prefix.unwrap_or_default(),
    );
    let size = if page_size == PAGE_SIZE {
        String::new()
    } else {
        page_size.to_string()
    };
    let link = |page: &str| {
        format!(
            "{PATH}/conversations{}",
            query(&[
                ("principal", &principal),
                ("tenant", &tenant),
                ("prefix", &prefix),
                ("size", &size),
                ("page", page),
            ])
        )
    };
    let next = (!page.next_page_token.is_empty()).then(|| link(&page.next_page_token));
    let first = page_token.is_some().then(|| link(""));
    Ok(ok(&ListPage {
        rows: page.items.into_iter().map(Row::of).collect(),
        next,
        first,
        deleted: params.deleted.clone(),
        op,
        principal,
        tenant,
        prefix,
    }))
}

#[derive(serde::Deserialize)]
pub struct ConversationQuery {
    principal: String,
    context: String,
}

impl ConversationQuery {
    /// The ids, checked: the principal bounded, the contextId as the engine checks one.
    fn checked(&self, state: &AppState) -> Result<(String, String), ConsoleError> {
        let principal = optional_name("principal", &Some(self.principal.clone()))?
            .ok_or_else(|| ConsoleError::BadRequest("principal is missing".into()))?;
        crate::engine::check_context_id(&self.context, &state.engine.config().message)?;
        Ok((principal, self.context.clone()))
    }
}

/// One message of the conversation's page, with the prompt its turn's agent was shown.
struct Shown {
    role: &'static str,
    text: String,
    message_id: String,
    task_href: Option<String>,
    task_id: String,
    at: String,
    /// For a caller's message: the prompt the agent got (the guarded block, then the text);
    /// None when the loaded messages do not reach back over its whole window.
    prompt: Option<String>,
    /// A caller's message (a turn).
    turn: bool,
}

struct TaskRow {
    id: String,
    state: &'static str,
    at: String,
    href: String,
    running: bool,
}

#[derive(Template)]
#[template(path = "console/conversation.html")]
struct ConversationPageView {
    op: Operator,
    context_id: String,
    principal: String,
    created: String,
    updated: String,
    turns: u64,
    running_task: Option<String>,
    running_href: Option<String>,
    messages: Vec<Shown>,
    /// Messages before the first shown.
    earlier: u64,
    history_limit: usize,
    tasks: Vec<TaskRow>,
    delete_href: String,
}

async fn show(
    op: Operator,
    state: web::Data<AppState>,
    params: web::Query<ConversationQuery>,
) -> Result<HttpResponse, ConsoleError> {
    let (principal, context_id) = params.checked(&state)?;
    let limits = state.engine.config().history;
    let (meta, messages) = load_messages(&state, &principal, &context_id, limits.limit).await?;
    let complete = messages.len() as u64 >= meta.next_seq;
    let first_shown = messages.len().saturating_sub(SHOWN_MESSAGES);
    let entries: Vec<HistoryEntry> = messages.iter().map(HistoryEntry::from).collect();
    let shown = messages
        .iter()
        .enumerate()
        .skip(first_shown)
        .map(|(i, message)| {
            // What the engine gave this turn's agent: the messages before it, rendered by the
            // engine's own code; known only when they are all loaded.
            let whole_window = complete || i >= limits.limit;
            let prompt = (message.role == Role::User && whole_window)
                .then(|| render_prompt(&entries[..i], &message.text(), limits));
            shown_message(&principal, message, prompt)
        })
        .collect();
    let tasks = conversation_tasks(&state, &principal, &context_id).await?;
    Ok(ok(&ConversationPageView {
        op,
        principal: principal_label(&principal),
        created: time(&meta.created_at),
        updated: time(&meta.updated_at),
        turns: meta.turns,
        running_href: meta
            .running_task
            .as_deref()
            .map(|id| super::task::task_href(&principal, id)),
        running_task: meta.running_task,
        earlier: meta
            .next_seq
            .saturating_sub((messages.len() - first_shown) as u64),
        messages: shown,
        history_limit: limits.limit,
        tasks,
        delete_href: format!(
            "{PATH}/conversation/delete{}",
            query(&[("principal", &principal), ("context", &context_id)])
        ),
        context_id,
    }))
}

fn shown_message(principal: &str, message: &Message, prompt: Option<String>) -> Shown {
    let task_id = message.task_id.clone().unwrap_or_default();
    Shown {
        role: super::role_label(message.role),
        text: message.text(),
        message_id: message.message_id.clone(),
        task_href: message
            .task_id
            .as_deref()
            .map(|id| super::task::task_href(principal, id)),
        task_id,
        at: message.timestamp.as_ref().map(time).unwrap_or_default(),
        turn: message.role == Role::User,
        prompt,
    }
}

/// The conversation and its latest messages: those shown and, before them, the window of the
/// first shown turn (`history_limit` more), following page tokens (each page is bounded by
/// the response budget; the count bounds how many there are).
async fn load_messages(
    state: &AppState,
    principal: &str,
    context_id: &str,
    history_limit: usize,
) -> Result<(ConversationMeta, Vec<Message>), ConsoleError> {
    let store = state.engine.store();
    let key = ConversationKey::new(principal, context_id);
    let budget = state.engine.config().response_bytes;
    let mut from = MessagesFrom::Latest(SHOWN_MESSAGES + history_limit);
    let mut messages = Vec::new();
    loop {
        let page = store
            .conversation_page(key, from, budget)
            .await?
            .ok_or_else(|| ConsoleError::NotFound(format!("no conversation {context_id:?}")))?;
        messages.extend(page.messages);
        if page.next_page_token.is_empty() {
            return Ok((page.meta, messages));
        }
        from = MessagesFrom::PageToken(page.next_page_token);
    }
}

async fn conversation_tasks(
    state: &AppState,
    principal: &str,
    context_id: &str,
) -> Result<Vec<TaskRow>, ConsoleError> {
    let query = TaskQuery {
        context_id: Some(context_id.to_owned()),
        page_size: SHOWN_TASKS,
        view: TaskView {
            history_length: Some(0),
            artifacts: false,
        },
        max_bytes: state.engine.config().response_bytes,
        ..TaskQuery::default()
    };
    let page = state.engine.store().list_tasks(principal, query).await?;
    Ok(page
        .items
        .into_iter()
        .map(|task| TaskRow {
            href: super::task::task_href(principal, &task.id),
            state: task.status.state.as_str(),
            running: matches!(task.status.state, TaskState::Submitted | TaskState::Working),
            at: time(&task.status.timestamp),
            id: task.id,
        })
        .collect())
}

#[derive(Template)]
#[template(path = "console/confirm_delete.html")]
struct ConfirmDelete {
    op: Operator,
    principal: String,
    principal_raw: String,
    context_id: String,
    back: String,
}

async fn confirm_delete(
    op: Operator,
    state: web::Data<AppState>,
    params: web::Query<ConversationQuery>,
) -> Result<HttpResponse, ConsoleError> {
    let (principal, context_id) = params.checked(&state)?;
    Ok(ok(&ConfirmDelete {
        op,
        back: conversation_href(&principal, &context_id),
        principal: principal_label(&principal),
        principal_raw: principal,
        context_id,
    }))
}

#[derive(serde::Deserialize)]
struct DeleteForm {
    principal: String,
    context: String,
    csrf: String,
}

async fn delete(
    req: HttpRequest,
    _: Operator,
    console: web::Data<Console>,
    state: web::Data<AppState>,
    form: web::Form<DeleteForm>,
) -> Result<HttpResponse, ConsoleError> {
    console.check_form(&req, &form.csrf)?;
    let ids = ConversationQuery {
        principal: form.principal.clone(),
        context: form.context.clone(),
    };
    let (principal, context_id) = ids.checked(&state)?;
    if !state
        .engine
        .delete_conversation(&principal, &context_id)
        .await?
    {
        return Err(ConsoleError::NotFound(format!(
            "no conversation {context_id:?}"
        )));
    }
    // Logs name a conversation by its key, never by its contextId or principal.
    tracing::info!(
        conversation = %ConversationKey::new(&principal, &context_id),
        "the console deleted a conversation"
    );
    Ok(see_other(&format!(
        "{PATH}/conversations{}",
        query(&[("deleted", &context_id)])
    )))
}
