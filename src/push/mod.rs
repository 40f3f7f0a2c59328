//! Push notifications: webhook configs per task (checked against the target policy), and the
//! delivery worker that drains the store's outbox (`deliver.rs`).
//!
//! The store records a notification in the same write as the status change it reports; this
//! module only reads the outbox, so a turn never waits for a webhook.

pub mod deliver;
pub mod sign;
pub mod target;

use crate::model::PushConfig;
use crate::store::{PushError, SharedPushStore};
pub use target::{TargetError, TargetPolicy};

/// The id of a config registered without one: the task's default config, which the next
/// config registered without an id replaces (v0.2's one config per task, kept). So a client
/// that sends its webhook with every turn of a task is notified once per event, not once per
/// registration.
pub const DEFAULT_CONFIG_ID: &str = "default";

/// Why a config request was refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ConfigError {
    #[error(transparent)]
    Store(#[from] PushError),
    #[error("url: {0}")]
    Target(#[from] TargetError),
    /// The principal's notifications waiting for delivery reached the cap: no new config until
    /// fewer wait (those waiting are still delivered).
    #[error(
        "{limit} push notifications of this principal are waiting for delivery, the limit \
         (push.max_pending_per_principal): no new push notification config is accepted until \
         fewer are pending"
    )]
    PendingLimit { limit: usize },
}

/// What configs may add up to.
#[derive(Debug, Clone, Copy)]
pub struct ConfigLimits {
    /// Configs one task may have.
    pub per_task: usize,
    /// Notifications one principal may have pending for a new config to be accepted.
    pub pending_per_principal: usize,
}

/// The config side, shared by the HTTP handlers.
#[derive(Clone)]
pub struct PushConfigs {
    store: SharedPushStore,
    policy: std::sync::Arc<TargetPolicy>,
    limits: ConfigLimits,
    given_up: std::sync::Arc<deliver::GivenUp>,
}

impl PushConfigs {
    pub fn new(
        store: SharedPushStore,
        policy: std::sync::Arc<TargetPolicy>,
        limits: ConfigLimits,
        given_up: std::sync::Arc<deliver::GivenUp>,
    ) -> Self {
        PushConfigs {
            store,
            policy,
            limits,
            given_up,
        }
    }

    /// The notifications this node's delivery worker gave up on lately, newest first.
    pub fn given_up(&self) -> Vec<deliver::GaveUp> {
        self.given_up.recent()
    }

    /// The first `limit` notifications of the outbox, due or not (the operator console).
    pub async fn outbox(
        &self,
        limit: usize,
    ) -> crate::store::StoreResult<Vec<crate::store::Notification>> {
        self.store.pending_notifications(limit).await
    }

    /// Checks the config ([`PushConfigs::checked`]) and stores it for the principal's task,
    /// with a fresh id when it has none.
    pub async fn create(
        &self,
        principal: &str,
        mut config: PushConfig,
    ) -> Result<PushConfig, ConfigError> {
        config = self.checked(principal, config).await?;
        Ok(self
            .store
            .put_push_config(principal, config, self.limits.per_task)
            .await?)
    }

    /// The config of `principal`, refused while the principal has as many notifications
    /// pending as the cap, with its URL checked against the policy ([`TargetPolicy::check`]:
    /// resolving its host now, if it resolves) and an id ([`DEFAULT_CONFIG_ID`] when it has
    /// none).
    pub async fn checked(
        &self,
        principal: &str,
        mut config: PushConfig,
    ) -> Result<PushConfig, ConfigError> {
        let limit = self.limits.pending_per_principal;
        let pending = self
            .store
            .pending_of(principal, limit)
            .await
            .map_err(PushError::from)?;
        if pending >= limit {
            metrics::counter!("colloquy_push_refused_total", "reason" => "pending_limit")
                .increment(1);
            return Err(ConfigError::PendingLimit { limit });
        }
        self.policy.check(&config.url).await?;
        if config.id.is_empty() {
            config.id = DEFAULT_CONFIG_ID.to_owned();
        }
        Ok(config)
    }

    pub async fn get(
        &self,
        principal: &str,
        task_id: &str,
        config_id: Option<&str>,
    ) -> Result<PushConfig, ConfigError> {
        match config_id {
            Some(id) => Ok(self.store.push_config(principal, task_id, id).await?),
            // v0.3's single-config form: the task's first config.
            None => self
                .list(principal, task_id)
                .await?
                .into_iter()
                .next()
                .ok_or_else(|| {
                    ConfigError::Store(PushError::ConfigNotFound {
                        task_id: task_id.to_owned(),
                        config_id: String::new(),
                    })
                }),
        }
    }

    pub async fn list(
        &self,
        principal: &str,
        task_id: &str,
    ) -> Result<Vec<PushConfig>, ConfigError> {
        Ok(self.store.push_configs(principal, task_id).await?)
    }

    /// Deletes the config; idempotent (A2A v1.0 §3.1.10: "multiple deletions of the same
    /// config have the same effect"), so a config that is not there is deleted already. A task
    /// that does not exist (or is another principal's) is still refused.
    pub async fn delete(
        &self,
        principal: &str,
        task_id: &str,
        config_id: &str,
    ) -> Result<(), ConfigError> {
        match self
            .store
            .delete_push_config(principal, task_id, config_id)
            .await
        {
            Ok(()) | Err(PushError::ConfigNotFound { .. }) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }
}
