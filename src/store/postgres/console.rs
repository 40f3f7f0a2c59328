//! The reads of the operator console (`http::console`): every principal's conversations newest
//! first, and the held leases with the node that holds each. Each reads at most a page's rows.

use super::ops::{META_COLUMNS, meta_of, opt_text, parse_page_token, resume_token, text};
use super::{Failure, Ops};
use crate::store::{ConversationFilter, ConversationMeta, HeldLease, Page, PrincipalKey};

impl Ops {
    /// One page of the conversations `filter` keeps, most recently updated first. The
    /// principal and the contextId prefix are conditions of the query; the tenant, with no
    /// principal named, is checked on the rows read (a page may then come back short, with a
    /// token that goes on after the last row read).
    pub(super) async fn console_conversations(
        &self,
        filter: &ConversationFilter,
    ) -> Result<Page<ConversationMeta>, Failure> {
        let principal_key = filter
            .principal
            .as_deref()
            .map(|p| PrincipalKey::new(p).as_bytes().to_vec());
        let prefix = filter
            .context_prefix
            .as_deref()
            .filter(|p| !p.is_empty())
            .map(|p| p.as_bytes().to_vec());
        let (after_ms, after_key) = match parse_page_token(filter.page_token.as_deref())? {
            Some((ms, key)) => (Some(ms), Some(key)),
            None => (None, None),
        };
        let page_size = filter.page_size.clamp(1, 1000);
        let limit = page_size as i64 + 1;
        let client = self.client().await?;
        let rows = client
            .query(
                &format!(
                    "SELECT {META_COLUMNS}, updated_ms, conv_key FROM colloquy_conversations \
                     WHERE ($1::BYTEA IS NULL OR principal_key = $1) \
                       AND ($2::BYTEA IS NULL OR substr(context_id, 1, length($2)) = $2) \
                       AND ($3::BIGINT IS NULL OR updated_ms < $3 \
                           OR (updated_ms = $3 AND conv_key > $4)) \
                     ORDER BY updated_ms DESC, conv_key LIMIT $5"
                ),
                &[&principal_key, &prefix, &after_ms, &after_key, &limit],
            )
            .await?;
        let mut items = Vec::with_capacity(rows.len());
        let mut next_page_token = String::new();
        for (i, row) in rows.iter().enumerate() {
            if i == page_size {
                break;
            }
            let updated_ms: i64 = row.try_get("updated_ms")?;
            let conv_key: Vec<u8> = row.try_get("conv_key")?;
            if rows.len() > page_size {
                next_page_token = resume_token(updated_ms, &conv_key);
            }
            let meta = meta_of(row)?;
            if filter.matches(&meta) {
                items.push(meta);
            }
        }
        Ok(Page {
            items,
            next_page_token,
            total_size: 0,
        })
    }

    /// The conversations whose lease is held (expired ones not yet swept too), soonest to
    /// expire first, with their holders: read from the index of running conversations (it holds
    /// nothing else), sorted.
    pub(super) async fn held_leases(&self, limit: usize) -> Result<Vec<HeldLease>, Failure> {
        let limit = limit.min(10_000) as i64;
        let client = self.client().await?;
        let rows = client
            .query(
                "SELECT principal, context_id, running_task, lease_holder, \
                     EXTRACT(EPOCH FROM (lease_expires - now()))::FLOAT8 AS expires_in \
                 FROM colloquy_conversations WHERE running_task IS NOT NULL \
                 ORDER BY lease_expires LIMIT $1",
                &[&limit],
            )
            .await?;
        let mut leases = Vec::with_capacity(rows.len());
        for row in &rows {
            leases.push(HeldLease {
                principal: text(row, "principal")?,
                context_id: text(row, "context_id")?,
                task_id: opt_text(row, "running_task")?.unwrap_or_default(),
                holder: row.try_get("lease_holder")?,
                expires_in_secs: row.try_get("expires_in")?,
            });
        }
        Ok(leases)
    }
}
