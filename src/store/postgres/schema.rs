//! The schema, created and upgraded by numbered migrations. Each migration runs in one
//! transaction together with the row that records it, so nodes starting at once apply it once.
//!
//! Portable SQL only (PostgreSQL, CockroachDB, YugabyteDB): no sequences or SERIAL, no advisory
//! locks, no PL/pgSQL, no LISTEN/NOTIFY. The conversation key (the 33-byte versioned SHA-256
//! namespace key) is in every per-conversation primary key, the distribution column of a
//! sharded database; it leads them but the tasks' (`(task_id, conv_key)`, migration 7), so a
//! conversation's rows sit together and its latest messages are one index range of
//! `(conv_key, seq)`. Ids (principal,
//! contextId, taskId) are stored as their UTF-8 bytes: TEXT cannot hold NUL, and bytes order
//! the same on every engine and locale.

use super::ops::decode;
use super::{Failure, Ops};
use crate::store::{Notification, StoreError};
use deadpool_postgres::GenericClient;

/// A schema migration: its SQL (placeholders filled by [`migration_sql`]) and the tables it
/// creates keyed by conversation, which a partitioned schema splits by their key's hash.
struct Migration {
    sql: &'static str,
    by_conversation: &'static [&'static str],
}

/// The migrations this build knows, in order: version `i + 1` is `MIGRATIONS[i]`.
const MIGRATIONS: &[Migration] = &[
    // 1: conversations with their lease, messages, tasks, the readiness probe.
    Migration {
        by_conversation: &[
            "colloquy_conversations",
            "colloquy_messages",
            "colloquy_tasks",
        ],
        sql: r#"
    CREATE TABLE colloquy_conversations (
        conv_key BYTEA PRIMARY KEY,
        principal_key BYTEA NOT NULL,
        principal BYTEA NOT NULL,
        context_id BYTEA NOT NULL,
        created_at TIMESTAMPTZ NOT NULL,
        updated_at TIMESTAMPTZ NOT NULL,
        updated_ms BIGINT NOT NULL,
        turns BIGINT NOT NULL,
        next_seq BIGINT NOT NULL,
        token BIGINT NOT NULL,
        running_task BYTEA,
        lease_expires TIMESTAMPTZ,
        lease_holder TEXT,
        agent_state TEXT
    ){partitioned};
    CREATE INDEX colloquy_conversations_by_principal
        ON colloquy_conversations (principal_key, updated_ms DESC, conv_key);
    CREATE INDEX colloquy_conversations_by_lease
        ON colloquy_conversations (lease_expires);
    CREATE TABLE colloquy_messages (
        conv_key BYTEA NOT NULL,
        seq BIGINT NOT NULL,
        body TEXT NOT NULL,
        PRIMARY KEY (conv_key, seq)
    ){partitioned};
    CREATE TABLE colloquy_tasks (
        conv_key BYTEA NOT NULL,
        task_id BYTEA NOT NULL,
        principal_key BYTEA NOT NULL,
        principal BYTEA NOT NULL,
        state SMALLINT NOT NULL,
        status_ms BIGINT NOT NULL,
        record TEXT NOT NULL,
        PRIMARY KEY (conv_key, task_id)
    ){partitioned};
    CREATE {unique} INDEX colloquy_tasks_by_id ON colloquy_tasks (task_id);
    CREATE INDEX colloquy_tasks_by_principal
        ON colloquy_tasks (principal_key, status_ms DESC, task_id);
    CREATE INDEX colloquy_tasks_by_conversation
        ON colloquy_tasks (conv_key, status_ms DESC, task_id);
    CREATE TABLE colloquy_probe (
        id INT PRIMARY KEY,
        at TIMESTAMPTZ NOT NULL
    );
    "#,
    },
    // 2: push-notification configs and the outbox every node drains. A node delivers a
    // notification only under its claim (`claim_token`, `claimed_until` by the database's clock).
    Migration {
        by_conversation: &[],
        sql: r#"
    CREATE TABLE colloquy_push_configs (
        task_id BYTEA NOT NULL,
        config_id BYTEA NOT NULL,
        principal BYTEA NOT NULL,
        config TEXT NOT NULL,
        PRIMARY KEY (task_id, config_id)
    );
    CREATE TABLE colloquy_outbox (
        seq BIGINT PRIMARY KEY,
        task_id BYTEA NOT NULL,
        not_before TIMESTAMPTZ NOT NULL,
        claim_token TEXT,
        claimed_until TIMESTAMPTZ,
        record TEXT NOT NULL
    );
    CREATE INDEX colloquy_outbox_by_task ON colloquy_outbox (task_id, seq);
    "#,
    },
    // 3: the outbox indexed by due time (the worker reads only what is due), by lane (a task's
    // notifications to one URL: each waits, `due` NULL, behind the one before it) and by
    // principal (the pending cap). Rows written before get their values at start
    // (`PgStore::connect`): computing them takes the record.
    Migration {
        by_conversation: &[],
        sql: r#"
    ALTER TABLE colloquy_outbox ADD COLUMN due TIMESTAMPTZ;
    ALTER TABLE colloquy_outbox ADD COLUMN lane BYTEA;
    ALTER TABLE colloquy_outbox ADD COLUMN principal_key BYTEA;
    CREATE INDEX colloquy_outbox_by_due ON colloquy_outbox (due, seq);
    CREATE INDEX colloquy_outbox_by_lane ON colloquy_outbox (task_id, lane, seq);
    CREATE INDEX colloquy_outbox_by_principal ON colloquy_outbox (principal_key, seq);
    "#,
    },
    // 4: whether a task has push configs, so a turn's end knows without reading them. Tasks
    // whose configs came before are marked at start (`Ops::repair_outbox`).
    Migration {
        by_conversation: &[],
        sql: r#"
    ALTER TABLE colloquy_tasks ADD COLUMN has_push BOOLEAN NOT NULL DEFAULT FALSE;
    "#,
    },
    // 5: the lease index holds running conversations only: the sweep reads nothing else, and a
    // turn's end (which clears `running_task`) adds no entry to it.
    Migration {
        by_conversation: &[],
        sql: r#"
    DROP INDEX colloquy_conversations_by_lease;
    CREATE INDEX colloquy_conversations_by_lease
        ON colloquy_conversations (lease_expires) WHERE running_task IS NOT NULL;
    "#,
    },
    // 6: push configs and the outbox keyed by conversation first, as every other table, so a
    // sharded database keeps a task's configs and notifications on its conversation's shard.
    // The tables are made anew: a primary key cannot change, and on a partitioned schema they
    // are partitioned. Configs take their task's key; notifications take theirs from their
    // record (`move_outbox_rows`: their task may be gone with its conversation). Nodes of an
    // older build fail their writes of configs and notifications from here on (docs/cluster.md).
    Migration {
        by_conversation: &["colloquy_push_configs", "colloquy_outbox"],
        sql: r#"
    ALTER TABLE colloquy_push_configs RENAME TO colloquy_push_configs_before_6;
    ALTER INDEX colloquy_push_configs_pkey RENAME TO colloquy_push_configs_before_6_pkey;
    CREATE TABLE colloquy_push_configs (
        conv_key BYTEA NOT NULL,
        task_id BYTEA NOT NULL,
        config_id BYTEA NOT NULL,
        principal BYTEA NOT NULL,
        config TEXT NOT NULL,
        PRIMARY KEY (conv_key, task_id, config_id)
    ){partitioned};
    INSERT INTO colloquy_push_configs (conv_key, task_id, config_id, principal, config)
        SELECT t.conv_key, p.task_id, p.config_id, p.principal, p.config
        FROM colloquy_push_configs_before_6 p JOIN colloquy_tasks t ON t.task_id = p.task_id;
    DROP TABLE colloquy_push_configs_before_6;
    ALTER TABLE colloquy_outbox RENAME TO colloquy_outbox_before_6;
    ALTER INDEX colloquy_outbox_pkey RENAME TO colloquy_outbox_before_6_pkey;
    DROP INDEX colloquy_outbox_by_task;
    DROP INDEX colloquy_outbox_by_due;
    DROP INDEX colloquy_outbox_by_lane;
    DROP INDEX colloquy_outbox_by_principal;
    CREATE TABLE colloquy_outbox (
        conv_key BYTEA NOT NULL,
        seq BIGINT NOT NULL,
        task_id BYTEA NOT NULL,
        not_before TIMESTAMPTZ NOT NULL,
        claim_token TEXT,
        claimed_until TIMESTAMPTZ,
        record TEXT NOT NULL,
        due TIMESTAMPTZ,
        lane BYTEA,
        principal_key BYTEA,
        PRIMARY KEY (conv_key, seq)
    ){partitioned};
    CREATE INDEX colloquy_outbox_by_due ON colloquy_outbox (due, seq);
    CREATE INDEX colloquy_outbox_by_lane ON colloquy_outbox (conv_key, task_id, lane, seq);
    CREATE INDEX colloquy_outbox_by_principal ON colloquy_outbox (principal_key, seq);
    "#,
    },
    // 7: tasks keyed by their id first, then their conversation: a turn's two task writes
    // (the working task, its final state) add their key entries at the end of the index (task
    // ids are time-ordered UUIDs), not at a random place among every task of every
    // conversation, and the key serves lookups by id, so the separate id index goes (a turn
    // wrote four index entries per task write, now three: the database's CPU a turn -11% on
    // two nodes, docs/performance.md). The conversation key stays in the key, so a sharded
    // database still distributes tasks by it; `ON CONFLICT (conv_key, task_id)` still names
    // this key (a column set). Task ids are unique as minted (an import checks), as on a
    // partitioned schema before. Building the key locks the table while it builds.
    Migration {
        by_conversation: &[],
        sql: r#"
    ALTER TABLE colloquy_tasks DROP CONSTRAINT colloquy_tasks_pkey;
    ALTER TABLE colloquy_tasks ADD CONSTRAINT colloquy_tasks_pkey PRIMARY KEY (task_id, conv_key);
    DROP INDEX colloquy_tasks_by_id;
    "#,
    },
    // 8: the listing indexes of tasks hold settled tasks only (any state after working): a
    // task is inserted working at its turn's start and updated at its end, and each write of a
    // row adds an entry to every index whose condition it meets, so the start now adds its
    // key's entry alone (two entries fewer a turn; the database's CPU a turn 7% less in
    // alternated runs, docs/performance.md). A submitted or working task is its
    // conversation's running task (`running_task`, set and cleared in the same transactions
    // as its state), so listings add those from the running conversations, which the lease
    // index, now keyed by principal first, finds for one principal; the sweep and the console
    // read all of it (it holds running conversations only). Building the indexes locks the
    // two tables against writes while they build.
    Migration {
        by_conversation: &[],
        sql: r#"
    DROP INDEX colloquy_tasks_by_principal;
    CREATE INDEX colloquy_tasks_by_principal
        ON colloquy_tasks (principal_key, status_ms DESC, task_id) WHERE state > 1;
    DROP INDEX colloquy_tasks_by_conversation;
    CREATE INDEX colloquy_tasks_by_conversation
        ON colloquy_tasks (conv_key, status_ms DESC, task_id) WHERE state > 1;
    DROP INDEX colloquy_conversations_by_lease;
    CREATE INDEX colloquy_conversations_running
        ON colloquy_conversations (principal_key, lease_expires) WHERE running_task IS NOT NULL;
    "#,
    },
];

/// Migration `version`'s SQL. With `partitions` > 0 the tables keyed by conversation are
/// hash-partitioned on the conversation key into that many partitions (a distributed
/// PostgreSQL's shards, on one server), each table's partitions made right after it, and the
/// task-id index of migration 1 (dropped by 7) is not unique: a unique index of a partitioned
/// table must hold the partition key (task ids are minted unique; an import checks).
fn migration_sql(version: i64, partitions: u32) -> String {
    let migration = &MIGRATIONS[(version - 1) as usize];
    if partitions == 0 {
        return migration
            .sql
            .replace("{partitioned}", "")
            .replace("{unique}", "UNIQUE");
    }
    let mut sql = migration.sql.replace("{unique}", "");
    for table in migration.by_conversation {
        let mut made = String::from(" PARTITION BY HASH (conv_key);\n");
        for remainder in 0..partitions {
            made.push_str(&format!(
                "CREATE TABLE {table}_p{remainder} PARTITION OF {table} \
                 FOR VALUES WITH (MODULUS {partitions}, REMAINDER {remainder});\n"
            ));
        }
        let created = format!("CREATE TABLE {table} (");
        if let Some(at) = sql.find(&created)
            && let Some(end) = sql[at..].find("{partitioned};")
        {
            let end = at + end;
            sql.replace_range(end..end + "{partitioned};".len(), &made);
        }
    }
    sql
}

/// The newest schema version this build knows.
pub const SCHEMA_VERSION: i64 = MIGRATIONS.len() as i64;

const VERSION_TABLE: &str = "CREATE TABLE IF NOT EXISTS colloquy_schema (
    version BIGINT PRIMARY KEY,
    applied_at TIMESTAMPTZ NOT NULL DEFAULT now()
)";

/// What [`migrate`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Migrated {
    pub from: i64,
    pub to: i64,
}

impl Ops {
    /// The schema version the database is at (0: none). Creating the version table can race
    /// with another node doing the same (PostgreSQL's `IF NOT EXISTS` is not atomic): retried.
    async fn schema_version(&self) -> Result<i64, Failure> {
        let mut attempt = 0;
        loop {
            match self.read_schema_version().await {
                Err(_) if attempt < 3 => {
                    attempt += 1;
                    tokio::time::sleep(std::time::Duration::from_millis(50 * attempt)).await;
                }
                other => return other,
            }
        }
    }

    async fn read_schema_version(&self) -> Result<i64, Failure> {
        let client = self.client().await?;
        client.batch_execute(VERSION_TABLE).await?;
        let row = client
            .query_one("SELECT COALESCE(MAX(version), 0) FROM colloquy_schema", &[])
            .await?;
        Ok(row.get(0))
    }

    /// Applies the migrations the database lacks up to version `to`; refuses a schema newer
    /// than this build.
    pub(super) async fn migrate(&self, to: i64) -> Result<Migrated, StoreError> {
        let from = self.schema_version().await.map_err(Failure::into_store)?;
        if from > SCHEMA_VERSION {
            return Err(StoreError::backend_msg(format!(
                "the database's schema is version {from}, newer than this colloquy knows \
                 ({SCHEMA_VERSION}): run a newer colloquy"
            )));
        }
        // A schema made partitioned stays so: later migrations partition their tables as the
        // first one did, whatever this node's `store.partitions` says.
        let partitions = match from {
            0 => self.partitions,
            _ => self.schema_partitions().await.unwrap_or(self.partitions),
        };
        for version in from + 1..=to.min(SCHEMA_VERSION) {
            match self.apply(version, partitions).await {
                Ok(()) => tracing::info!(version, "applied a schema migration"),
                // Another node applied it meanwhile (its version row came first).
                Err(_) if self.schema_version().await.is_ok_and(|v| v >= version) => {}
                Err(e) => return Err(e.into_store()),
            }
        }
        if to < SCHEMA_VERSION {
            return Ok(Migrated { from, to });
        }
        self.repair_outbox().await.map_err(Failure::into_store)?;
        Ok(Migrated {
            from,
            to: SCHEMA_VERSION,
        })
    }

    /// How many partitions the schema's conversations table has (0: not partitioned). Read from
    /// PostgreSQL's catalog; an engine without it answers with an error.
    async fn schema_partitions(&self) -> Result<u32, Failure> {
        let client = self.client().await?;
        let row = client
            .query_one(
                "SELECT count(*) FROM pg_inherits \
                 WHERE inhparent = to_regclass('colloquy_conversations')",
                &[],
            )
            .await?;
        Ok(u32::try_from(row.try_get::<_, i64>(0)?).unwrap_or(0))
    }

    async fn apply(&self, version: i64, partitions: u32) -> Result<(), Failure> {
        let mut client = self.client().await?;
        let tx = client.transaction().await?;
        // First, so a node applying the same version at once waits on this row, then fails.
        tx.execute(
            "INSERT INTO colloquy_schema (version) VALUES ($1)",
            &[&version],
        )
        .await?;
        tx.batch_execute(&migration_sql(version, partitions))
            .await?;
        if version == 6 {
            move_outbox_rows(&tx).await?;
        }
        tx.commit().await?;
        Ok(())
    }
}

/// Migration 6's data step: the notifications waiting in the outbox as it was, each with its
/// conversation's key (from its record: its task may be gone with its conversation), then the
/// old table dropped. In the migration's transaction.
async fn move_outbox_rows(client: &impl GenericClient) -> Result<(), Failure> {
    const BATCH: i64 = 1000;
    let mut after = i64::MIN;
    loop {
        let rows = client
            .query(
                "SELECT seq, record FROM colloquy_outbox_before_6 WHERE seq > $1 \
                 ORDER BY seq LIMIT $2",
                &[&after, &BATCH],
            )
            .await?;
        let Some(last) = rows.last() else {
            break;
        };
        after = last.try_get("seq")?;
        let mut seqs = Vec::with_capacity(rows.len());
        let mut keys = Vec::with_capacity(rows.len());
        for row in &rows {
            let notification: Notification = decode(row.try_get::<_, &str>("record")?)?;
            seqs.push(row.try_get::<_, i64>("seq")?);
            keys.push(notification.conversation().as_bytes().to_vec());
        }
        client
            .execute(
                "INSERT INTO colloquy_outbox (conv_key, seq, task_id, not_before, claim_token, \
                     claimed_until, record, due, lane, principal_key) \
                 SELECT k.conv_key, o.seq, o.task_id, o.not_before, o.claim_token, \
                     o.claimed_until, o.record, o.due, o.lane, o.principal_key \
                 FROM colloquy_outbox_before_6 o \
                     JOIN unnest($1::BIGINT[], $2::BYTEA[]) AS k(seq, conv_key) ON k.seq = o.seq",
                &[&seqs, &keys],
            )
            .await?;
    }
    client
        .batch_execute("DROP TABLE colloquy_outbox_before_6")
        .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_partitioned_table_has_its_partitions_before_the_next_statement() {
        for version in 1..=SCHEMA_VERSION {
            let sql = migration_sql(version, 4);
            assert!(!sql.contains("{partitioned}"), "version {version}");
            for table in MIGRATIONS[(version - 1) as usize].by_conversation {
                let created = sql
                    .find(&format!("CREATE TABLE {table} ("))
                    .expect("created");
                let after = &sql[created..];
                let statements: Vec<&str> = after.split(';').map(str::trim).collect();
                assert!(
                    statements[0].ends_with("PARTITION BY HASH (conv_key)"),
                    "{table}"
                );
                for (remainder, statement) in statements[1..5].iter().enumerate() {
                    assert!(
                        statement.starts_with(&format!(
                            "CREATE TABLE {table}_p{remainder} PARTITION OF {table}"
                        )),
                        "{table}: {statement}"
                    );
                }
            }
        }
        assert!(migration_sql(6, 0).contains("PRIMARY KEY (conv_key, seq)\n    );"));
    }

    /// Migration 8's indexes and `ops::scoped_tasks` tell settled tasks by `state > 1`.
    #[test]
    fn settled_states_are_the_codes_above_working() {
        use crate::model::TaskState;
        for state in TaskState::ALL {
            let settled = !matches!(state, TaskState::Submitted | TaskState::Working);
            assert_eq!(state.code() > 1, settled, "{state:?}");
        }
    }
}
