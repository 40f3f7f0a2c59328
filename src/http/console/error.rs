//! The console's own errors and the one place they become HTTP answers: an HTML page saying
//! what went wrong, with the status a script or a person can act on.

use crate::engine::EngineError;
use crate::store::StoreError;
use actix_web::http::{StatusCode, header};
use actix_web::{HttpResponse, ResponseError};
use askama::Template;

#[derive(Debug, thiserror::Error)]
pub enum ConsoleError {
    /// No valid token (header or cookie).
    #[error("the console needs its token: sign in, or send Authorization: Bearer")]
    Unauthorized,
    /// A POST without this session's form token, or from another origin.
    #[error("{0}")]
    Forbidden(String),
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    BadRequest(String),
    /// The conversation has a running turn (-32010 context busy).
    #[error(
        "context busy (-32010): task {task_id} is running in conversation {context_id:?}; cancel it or wait for it to end, then try again"
    )]
    Busy { context_id: String, task_id: String },
    /// The task has ended: there is nothing to cancel.
    #[error("{0}")]
    Conflict(String),
    /// The database is unreachable for now: try again.
    #[error("{0}")]
    Unavailable(String),
    #[error("{0}")]
    Internal(String),
    #[error("rendering the page: {0}")]
    Render(String),
}

impl From<EngineError> for ConsoleError {
    fn from(e: EngineError) -> Self {
        match e {
            EngineError::TaskNotFound(id) => ConsoleError::NotFound(format!("no task {id}")),
            EngineError::ContextBusy {
                context_id,
                task_id,
            } => ConsoleError::Busy {
                context_id,
                task_id,
            },
            e @ (EngineError::TaskNotCancelable { .. } | EngineError::TaskTerminal { .. }) => {
                ConsoleError::Conflict(e.to_string())
            }
            EngineError::InvalidParams(why) => ConsoleError::BadRequest(why),
            e @ (EngineError::StoreUnavailable(_)
            | EngineError::ShuttingDown
            | EngineError::Overloaded { .. }) => ConsoleError::Unavailable(e.to_string()),
            e @ (EngineError::Store(_) | EngineError::Internal(_)) => {
                ConsoleError::Internal(e.to_string())
            }
        }
    }
}

impl From<StoreError> for ConsoleError {
    fn from(e: StoreError) -> Self {
        EngineError::from(e).into()
    }
}

/// The error page.
#[derive(Template)]
#[template(path = "console/error.html")]
struct ErrorPage<'a> {
    title: &'a str,
    detail: String,
    /// Unauthorized: the page links to the sign-in form.
    sign_in: bool,
}

impl ConsoleError {
    fn title(&self) -> &'static str {
        match self {
            ConsoleError::Unauthorized => "Sign-in needed",
            ConsoleError::Forbidden(_) => "Refused",
            ConsoleError::NotFound(_) => "Not found",
            ConsoleError::BadRequest(_) => "Bad request",
            ConsoleError::Busy { .. } => "Conversation busy",
            ConsoleError::Conflict(_) => "Not possible now",
            ConsoleError::Unavailable(_) => "Unavailable, try again",
            ConsoleError::Internal(_) | ConsoleError::Render(_) => "Server error",
        }
    }

    /// The page for this error (also used where a handler renders one itself).
    pub fn response(&self) -> HttpResponse {
        let status = self.status_code();
        if status.is_server_error() {
            tracing::error!(error = %self, "console");
        }
        let page = ErrorPage {
            title: self.title(),
            detail: self.to_string(),
            sign_in: matches!(self, ConsoleError::Unauthorized),
        };
        let mut response = match page.render() {
            Ok(body) => HttpResponse::build(status)
                .content_type("text/html; charset=utf-8")
                .insert_header((
                    header::CONTENT_SECURITY_POLICY,
                    super::CONTENT_SECURITY_POLICY,
                ))
                .insert_header((header::CACHE_CONTROL, "no-store"))
                .body(body),
            // The error page has no stored text in it; plain text if it ever fails to render.
            Err(_) => HttpResponse::build(status).body(self.to_string()),
        };
        if matches!(self, ConsoleError::Unauthorized) {
            response.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                header::HeaderValue::from_static("Bearer"),
            );
        }
        response
    }
}

impl ResponseError for ConsoleError {
    fn status_code(&self) -> StatusCode {
        match self {
            ConsoleError::Unauthorized => StatusCode::UNAUTHORIZED,
            ConsoleError::Forbidden(_) => StatusCode::FORBIDDEN,
            ConsoleError::NotFound(_) => StatusCode::NOT_FOUND,
            ConsoleError::BadRequest(_) => StatusCode::BAD_REQUEST,
            ConsoleError::Busy { .. } | ConsoleError::Conflict(_) => StatusCode::CONFLICT,
            ConsoleError::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            ConsoleError::Internal(_) | ConsoleError::Render(_) => {
                StatusCode::INTERNAL_SERVER_ERROR
            }
        }
    }

    fn error_response(&self) -> HttpResponse {
        self.response()
    }
}
