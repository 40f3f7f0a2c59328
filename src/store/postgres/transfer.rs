//! Moving conversations in and out (`colloquy export` / `import`): whole conversations in key
//! order, each with its messages and tasks, written back exactly as they were stored.

use super::ops::{META_COLUMNS, decode, encode, meta_of, put_task};
use super::{Failure, Ops};
use crate::store::{
    ConversationKey, ConversationRecords, Imported, PrincipalKey, StoreError, TaskRecords,
};
use deadpool_postgres::GenericClient;
use tokio_postgres::IsolationLevel;

impl Ops {
    /// Up to `limit` conversations after `after`, read in one snapshot.
    pub(super) async fn export(
        &self,
        principal: Option<&str>,
        after: Option<&ConversationKey>,
        limit: usize,
    ) -> Result<Vec<ConversationRecords>, Failure> {
        let mut client = self.client().await?;
        let tx = client
            .build_transaction()
            .isolation_level(IsolationLevel::RepeatableRead)
            .read_only(true)
            .start()
            .await?;
        let after: &[u8] = after.map_or(&[], |key| key.as_bytes().as_slice());
        let limit = limit.min(i64::MAX as usize) as i64;
        let rows = match principal {
            Some(principal) => {
                tx.query(
                    &format!(
                        "SELECT {META_COLUMNS} FROM colloquy_conversations \
                         WHERE conv_key > $1 AND principal = $2 ORDER BY conv_key LIMIT $3"
                    ),
                    &[&after, &principal.as_bytes(), &limit],
                )
                .await?
            }
            None => {
                tx.query(
                    &format!(
                        "SELECT {META_COLUMNS} FROM colloquy_conversations \
                         WHERE conv_key > $1 ORDER BY conv_key LIMIT $2"
                    ),
                    &[&after, &limit],
                )
                .await?
            }
        };
        let mut page = Vec::with_capacity(rows.len());
        for row in &rows {
            page.push(export_one(&tx, meta_of(row)?).await?);
        }
        tx.commit().await?;
        Ok(page)
    }

    /// Stores the conversations the database lacks, in one transaction.
    pub(super) async fn import(&self, items: &[ConversationRecords]) -> Result<Imported, Failure> {
        let mut client = self.client().await?;
        let tx = client.transaction().await?;
        let mut imported = Imported::default();
        for item in items {
            item.check()?;
            if import_one(&tx, item).await? {
                imported.conversations += 1;
            } else {
                imported.skipped += 1;
            }
        }
        tx.commit().await?;
        Ok(imported)
    }
}

async fn export_one(
    client: &impl GenericClient,
    meta: crate::store::ConversationMeta,
) -> Result<ConversationRecords, Failure> {
    let key = meta.key();
    let key_bytes = key.as_bytes().as_slice();
    let rows = client
        .query(
            "SELECT seq, body FROM colloquy_messages WHERE conv_key = $1 ORDER BY seq",
            &[&key_bytes],
        )
        .await?;
    let first_seq = match rows.first() {
        Some(row) => row.try_get::<_, i64>("seq")? as u64,
        None => 0,
    };
    let mut messages = Vec::with_capacity(rows.len());
    for row in &rows {
        let seq = row.try_get::<_, i64>("seq")? as u64;
        if seq != first_seq + messages.len() as u64 {
            return Err(StoreError::corrupt_msg(format!(
                "conversation {:?} has a gap before message {seq}",
                meta.context_id
            ))
            .into());
        }
        messages.push(decode(&row.try_get::<_, String>("body")?)?);
    }
    let tasks = super::ops::scoped_tasks("conv_key", "t.record, t.task_id", "TRUE", "");
    let rows = client
        .query(
            &format!("SELECT record FROM ({tasks}) AS tasks ORDER BY task_id"),
            &[&key_bytes],
        )
        .await?;
    let mut tasks = Vec::with_capacity(rows.len());
    for row in &rows {
        tasks.push(decode::<TaskRecords>(&row.try_get::<_, String>("record")?)?);
    }
    Ok(ConversationRecords {
        meta,
        first_seq,
        messages,
        tasks,
    })
}

/// Inserts one conversation unless its key is stored; false if it was. A task left running is
/// stored with an expired lease, so the sweeper fails it as one whose node stopped.
async fn import_one(
    client: &impl GenericClient,
    item: &ConversationRecords,
) -> Result<bool, Failure> {
    let meta = &item.meta;
    let key = meta.key();
    let key_bytes = key.as_bytes().as_slice();
    let agent_state = meta.agent_state.as_ref().map(encode);
    let inserted = client
        .execute(
            "INSERT INTO colloquy_conversations (conv_key, principal_key, principal, \
                 context_id, created_at, updated_at, updated_ms, turns, next_seq, token, \
                 running_task, lease_expires, lease_holder, agent_state) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, \
                 CASE WHEN $11::BYTEA IS NULL THEN NULL ELSE now() END, NULL, $12) \
             ON CONFLICT (conv_key) DO NOTHING",
            &[
                &key_bytes,
                &PrincipalKey::new(&meta.principal).as_bytes().as_slice(),
                &meta.principal.as_bytes(),
                &meta.context_id.as_bytes(),
                &meta.created_at,
                &meta.updated_at,
                &meta.updated_at.timestamp_millis(),
                &(meta.turns as i64),
                &(meta.next_seq as i64),
                &(meta.token as i64),
                &meta.running_task.as_ref().map(|t| t.as_bytes()),
                &agent_state,
            ],
        )
        .await?;
    if inserted == 0 {
        return Ok(false);
    }
    for (offset, message) in item.messages.iter().enumerate() {
        let seq = (item.first_seq + offset as u64) as i64;
        client
            .execute(
                "INSERT INTO colloquy_messages (conv_key, seq, body) VALUES ($1, $2, $3)",
                &[&key_bytes, &seq, &encode(message)],
            )
            .await?;
    }
    for record in &item.tasks {
        let id = &record.task.id;
        let taken = client
            .query_opt(
                "SELECT 1 FROM colloquy_tasks WHERE task_id = $1",
                &[&id.as_bytes()],
            )
            .await?;
        if taken.is_some() {
            return Err(StoreError::ImportRefused(format!(
                "task {id} is already stored (in another conversation or twice)"
            ))
            .into());
        }
        put_task(client, &key, &meta.principal, record, None).await?;
    }
    Ok(true)
}
