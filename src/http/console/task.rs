//! A task: its state, artifacts and messages, a live view of its stream while it runs, and
//! cancelling it.

use super::auth::{Console, Operator};
use super::conversations::conversation_href;
use super::{ConsoleError, PATH, ok, optional_name, principal_label, query, see_other, time};
use crate::http::state::AppState;
use crate::model::{Artifact, Message, Task};
use actix_web::{HttpRequest, HttpResponse, web};
use askama::Template;

pub fn routes(cfg: &mut web::ServiceConfig) {
    cfg.route("/task", web::get().to(show))
        .route("/task/live", web::get().to(super::live::stream))
        .route("/task/cancel", web::get().to(confirm_cancel))
        .route("/task/cancel", web::post().to(cancel));
}

pub fn task_href(principal: &str, task_id: &str) -> String {
    format!(
        "{PATH}/task{}",
        query(&[("principal", principal), ("id", task_id)])
    )
}

#[derive(serde::Deserialize)]
pub struct TaskQuery {
    principal: String,
    id: String,
}

impl TaskQuery {
    /// The ids, checked for length.
    pub fn checked(&self) -> Result<(String, String), ConsoleError> {
        let principal = optional_name("principal", &Some(self.principal.clone()))?
            .ok_or_else(|| ConsoleError::BadRequest("principal is missing".into()))?;
        let id = super::task_id(&self.id)?;
        Ok((principal, id.to_owned()))
    }
}

struct ArtifactView {
    name: String,
    text: String,
}

impl ArtifactView {
    fn of(artifact: &Artifact) -> ArtifactView {
        ArtifactView {
            name: artifact
                .name
                .clone()
                .unwrap_or_else(|| artifact.artifact_id.clone()),
            text: artifact.text(),
        }
    }
}

struct MessageView {
    role: &'static str,
    text: String,
    at: String,
}

impl MessageView {
    fn of(message: &Message) -> MessageView {
        MessageView {
            role: super::role_label(message.role),
            text: message.text(),
            at: message.timestamp.as_ref().map(time).unwrap_or_default(),
        }
    }
}

#[derive(Template)]
#[template(path = "console/task.html")]
struct TaskPage {
    op: Operator,
    id: String,
    principal: String,
    context_id: String,
    conversation_href: String,
    state: &'static str,
    status_at: String,
    status_text: String,
    artifacts: Vec<ArtifactView>,
    history: Vec<MessageView>,
    /// The task has not ended: the live view follows it, and it may be cancelled.
    open: bool,
    live_src: String,
    cancel_href: String,
    /// The node that runs it, when it is another node of a cluster.
    holder: Option<String>,
}

async fn show(
    op: Operator,
    state: web::Data<AppState>,
    params: web::Query<TaskQuery>,
) -> Result<HttpResponse, ConsoleError> {
    let (principal, id) = params.checked()?;
    let task = state.engine.get_task(&principal, &id).await?;
    let open = !task.status.state.is_terminal();
    let holder = if open {
        state.engine.store().running_holder(&principal, &id).await?
    } else {
        None
    };
    let links = query(&[("principal", &principal), ("id", &id)]);
    let Task {
        context_id,
        status,
        artifacts,
        history,
        ..
    } = task;
    Ok(ok(&TaskPage {
        op,
        conversation_href: conversation_href(&principal, &context_id),
        principal: principal_label(&principal),
        context_id,
        state: status.state.as_str(),
        status_at: time(&status.timestamp),
        status_text: status
            .message
            .as_ref()
            .map(Message::text)
            .unwrap_or_default(),
        artifacts: artifacts.iter().map(ArtifactView::of).collect(),
        history: history.iter().map(MessageView::of).collect(),
        live_src: format!("{PATH}/task/live{links}"),
        cancel_href: format!("{PATH}/task/cancel{links}"),
        open,
        holder,
        id,
    }))
}

#[derive(Template)]
#[template(path = "console/confirm_cancel.html")]
struct ConfirmCancel {
    op: Operator,
    id: String,
    principal: String,
    principal_raw: String,
    back: String,
}

async fn confirm_cancel(
    op: Operator,
    params: web::Query<TaskQuery>,
) -> Result<HttpResponse, ConsoleError> {
    let (principal, id) = params.checked()?;
    Ok(ok(&ConfirmCancel {
        op,
        back: task_href(&principal, &id),
        principal: principal_label(&principal),
        principal_raw: principal,
        id,
    }))
}

#[derive(serde::Deserialize)]
struct CancelForm {
    principal: String,
    id: String,
    csrf: String,
}

/// Cancels the task as its own principal would (`CancelTask`): the engine stops a running
/// turn through its conversation's actor, or cancels a task waiting for input in the store.
async fn cancel(
    req: HttpRequest,
    _: Operator,
    console: web::Data<Console>,
    state: web::Data<AppState>,
    form: web::Form<CancelForm>,
) -> Result<HttpResponse, ConsoleError> {
    console.check_form(&req, &form.csrf)?;
    let ids = TaskQuery {
        principal: form.principal.clone(),
        id: form.id.clone(),
    };
    let (principal, id) = ids.checked()?;
    // The engine's cancel reaches the turns of this node; one another node runs is cancelled
    // there (a client's CancelTask is forwarded by the RPC front, which the console is not).
    if let Some(holder) = state.engine.store().running_holder(&principal, &id).await? {
        return Err(ConsoleError::Conflict(format!(
            "task {id} runs on node {holder}: cancel it from that node's console"
        )));
    }
    let task = state.engine.cancel(&principal, &id).await?;
    tracing::info!(task_id = %id, state = task.status.state.as_str(), "the console cancelled a task");
    Ok(see_other(&task_href(&principal, &id)))
}
