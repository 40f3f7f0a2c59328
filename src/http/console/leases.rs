//! The held leases: which conversation's turn runs where. On PostgreSQL each lease names the
//! node that holds it (`cluster.advertise`, else its listen address) and when it expires; on
//! the embedded store this process holds them all.

use super::auth::Operator;
use super::{ConsoleError, ok, principal_label};
use crate::http::state::AppState;
use actix_web::{HttpResponse, web};
use askama::Template;

/// Leases the page lists, at most (soonest to expire first).
const SHOWN: usize = 500;

struct LeaseRow {
    context_id: String,
    conversation_href: String,
    principal: String,
    task_id: String,
    task_href: String,
    holder: String,
    expires: String,
}

#[derive(Template)]
#[template(path = "console/leases.html")]
struct LeasesPage {
    op: Operator,
    rows: Vec<LeaseRow>,
    cut: bool,
    shown: usize,
}

pub async fn page(op: Operator, state: web::Data<AppState>) -> Result<HttpResponse, ConsoleError> {
    let leases = state.engine.store().held_leases(SHOWN + 1).await?;
    let cut = leases.len() > SHOWN;
    let rows = leases
        .into_iter()
        .take(SHOWN)
        .map(|lease| LeaseRow {
            conversation_href: super::conversations::conversation_href(
                &lease.principal,
                &lease.context_id,
            ),
            task_href: super::task::task_href(&lease.principal, &lease.task_id),
            principal: principal_label(&lease.principal),
            holder: lease.holder.unwrap_or_else(|| "this node".into()),
            expires: match lease.expires_in_secs {
                Some(secs) if secs < 0.0 => format!("expired {:.1} s ago", -secs),
                Some(secs) => format!("in {secs:.1} s"),
                None => "held while the turn runs".into(),
            },
            context_id: lease.context_id,
            task_id: lease.task_id,
        })
        .collect();
    Ok(ok(&LeasesPage {
        op,
        rows,
        cut,
        shown: SHOWN,
    }))
}
