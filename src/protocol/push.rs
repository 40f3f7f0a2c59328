//! Push-notification configs on the wire, both versions.
//!
//! v1.0: `TaskPushNotificationConfig` is flat, `{id, taskId, url, token?, authentication?:
//! {scheme, credentials?}}`. v0.3: `{taskId, pushNotificationConfig: {id, url, token?,
//! authentication?: {schemes: [..], credentials?}}}`. Credentials are never encoded back.

use super::WireVersion;
use super::codec::{self, TaskView};
use super::fields::{FieldResult, field_error};
use super::params::{decode_at, join};
use crate::model::{PushAuth, PushConfig, Task};
use serde::Deserialize;
use serde_json::{Map, Value, json};

/// Longest webhook `url`, in bytes (longer URLs are not sendable anyway: past about 64 KiB the
/// HTTP client refuses them).
pub const MAX_URL_BYTES: usize = 2048;
/// Longest `token`, `authentication.credentials` and (together) `authentication.scheme(s)`, in
/// bytes: each goes out as a header with every notification.
pub const MAX_SECRET_BYTES: usize = 4096;
/// Longest config `id`, in bytes (the default of `limits.context_id_bytes`).
pub const MAX_CONFIG_ID_BYTES: usize = 256;

/// Refuses a config whose fields exceed their bounds, naming the field (under `at`; `schemes`
/// is how the version spells the authentication scheme).
fn check_bounds(config: &PushConfig, at: &str, schemes: &str) -> FieldResult<()> {
    let too_long = |field: &str, len: usize, max: usize| {
        field_error(
            join(at, field),
            format!("is {len} bytes, more than the {max} allowed"),
        )
    };
    let bounded = |field: &str, len: usize, max: usize| {
        if len > max {
            Err(too_long(field, len, max))
        } else {
            Ok(())
        }
    };
    bounded("url", config.url.len(), MAX_URL_BYTES)?;
    bounded("id", config.id.len(), MAX_CONFIG_ID_BYTES)?;
    bounded(
        "token",
        config.token.as_ref().map_or(0, String::len),
        MAX_SECRET_BYTES,
    )?;
    if let Some(auth) = &config.authentication {
        let credentials = auth.credentials.as_ref().map_or(0, String::len);
        bounded("authentication.credentials", credentials, MAX_SECRET_BYTES)?;
        let scheme_bytes = auth.schemes.iter().map(String::len).sum();
        bounded(
            &format!("authentication.{schemes}"),
            scheme_bytes,
            MAX_SECRET_BYTES,
        )?;
    }
    Ok(())
}

/// v1.0 `TaskPushNotificationConfig` (Create's params, and a send's
/// `configuration.taskPushNotificationConfig`).
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct V1Config {
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    task_id: Option<String>,
    url: String,
    #[serde(default)]
    token: Option<String>,
    #[serde(default)]
    authentication: Option<V1Auth>,
}

#[derive(Deserialize)]
struct V1Auth {
    scheme: String,
    #[serde(default)]
    credentials: Option<String>,
}

/// v0.3 `TaskPushNotificationConfig` (`tasks/pushNotificationConfig/set`'s params).
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct V03TaskConfig {
    #[serde(default)]
    task_id: Option<String>,
    push_notification_config: V03Config,
}

/// v0.3 `PushNotificationConfig` (also a send's `configuration.pushNotificationConfig`).
#[derive(Deserialize)]
struct V03Config {
    #[serde(default)]
    id: Option<String>,
    url: String,
    #[serde(default)]
    token: Option<String>,
    #[serde(default)]
    authentication: Option<V03Auth>,
}

#[derive(Deserialize)]
struct V03Auth {
    schemes: Vec<String>,
    #[serde(default)]
    credentials: Option<String>,
}

impl V1Config {
    fn into_config(self) -> PushConfig {
        PushConfig {
            id: self.id.unwrap_or_default(),
            task_id: self.task_id.unwrap_or_default(),
            url: self.url,
            token: self.token,
            authentication: self.authentication.map(|auth| PushAuth {
                schemes: vec![auth.scheme],
                credentials: auth.credentials,
            }),
            wire_version: WireVersion::V1.label().to_owned(),
        }
    }
}

impl V03Config {
    fn into_config(self, task_id: String, at: &str) -> FieldResult<PushConfig> {
        let authentication = match self.authentication {
            Some(auth) if auth.schemes.is_empty() => {
                return Err(field_error(
                    join(at, "authentication.schemes"),
                    "is required",
                ));
            }
            auth => auth.map(|auth| PushAuth {
                schemes: auth.schemes,
                credentials: auth.credentials,
            }),
        };
        Ok(PushConfig {
            id: self.id.unwrap_or_default(),
            task_id,
            url: self.url,
            token: self.token,
            authentication,
            wire_version: WireVersion::V03.label().to_owned(),
        })
    }
}

/// A config as a request gives it (`params`, found at `at`); `id` and `task_id` may still be
/// empty (the caller fills them: a fresh id, the task a send creates).
pub fn decode_config(version: WireVersion, params: &Value, at: &str) -> FieldResult<PushConfig> {
    match version {
        WireVersion::V1 => {
            let config = decode_at::<V1Config>(params, at)?.into_config();
            check_bounds(&config, at, "scheme")?;
            Ok(config)
        }
        WireVersion::V03 => {
            let config: V03TaskConfig = decode_at(params, at)?;
            let inner = join(at, "pushNotificationConfig");
            let task_id = config.task_id.unwrap_or_default();
            let config = config
                .push_notification_config
                .into_config(task_id, &inner)?;
            check_bounds(&config, &inner, "schemes")?;
            Ok(config)
        }
    }
}

/// The config a send carries in its `configuration` (v1.0 `taskPushNotificationConfig`, v0.3
/// `pushNotificationConfig`), if any.
pub fn decode_send_config(
    version: WireVersion,
    configuration: &Value,
) -> FieldResult<Option<PushConfig>> {
    let (field, at) = match version {
        WireVersion::V1 => (
            "taskPushNotificationConfig",
            "configuration.taskPushNotificationConfig",
        ),
        WireVersion::V03 => (
            "pushNotificationConfig",
            "configuration.pushNotificationConfig",
        ),
    };
    let Some(config) = configuration.get(field).filter(|v| !v.is_null()) else {
        return Ok(None);
    };
    match version {
        WireVersion::V1 => decode_config(version, config, at).map(Some),
        WireVersion::V03 => {
            let config = decode_at::<V03Config>(config, at)?.into_config(String::new(), at)?;
            check_bounds(&config, at, "schemes")?;
            Ok(Some(config))
        }
    }
}

/// Which config Get and Delete name, and whose task List lists: v1.0 `{taskId, id}`, v0.3
/// `{id, pushNotificationConfigId}`.
pub struct ConfigRef {
    pub task_id: String,
    pub config_id: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct V1Ref {
    task_id: String,
    #[serde(default)]
    id: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct V03Ref {
    id: String,
    #[serde(default)]
    push_notification_config_id: Option<String>,
}

/// The params of Get, List and Delete.
pub fn decode_config_ref(version: WireVersion, params: &Value) -> FieldResult<ConfigRef> {
    Ok(match version {
        WireVersion::V1 => {
            let r: V1Ref = decode_at(params, "")?;
            ConfigRef {
                task_id: r.task_id,
                config_id: r.id,
            }
        }
        WireVersion::V03 => {
            let r: V03Ref = decode_at(params, "")?;
            ConfigRef {
                task_id: r.id,
                config_id: r.push_notification_config_id,
            }
        }
    })
}

/// The config as Get, List and Create answer it: without credentials.
pub fn encode_config(version: WireVersion, config: &PushConfig) -> Value {
    let mut inner = Map::new();
    inner.insert("id".into(), json!(config.id));
    if version == WireVersion::V1 {
        inner.insert("taskId".into(), json!(config.task_id));
    }
    inner.insert("url".into(), json!(config.url));
    if let Some(token) = &config.token {
        inner.insert("token".into(), json!(token));
    }
    if let Some(auth) = &config.authentication {
        let auth = match version {
            WireVersion::V1 => json!({"scheme": auth.schemes.first()}),
            WireVersion::V03 => json!({"schemes": auth.schemes}),
        };
        inner.insert("authentication".into(), auth);
    }
    match version {
        WireVersion::V1 => Value::Object(inner),
        WireVersion::V03 => json!({"taskId": config.task_id, "pushNotificationConfig": inner}),
    }
}

/// A notification's body: the task's current state as the config's version spells a task
/// (v1.0 a `StreamResponse` `{"task": ...}`, v0.3 the Task itself).
pub fn encode_notification(version: WireVersion, task: &Task) -> Value {
    let view = TaskView {
        history_length: Some(0),
        artifacts: true,
    };
    let task = codec::encode_task(version, task, view);
    match version {
        WireVersion::V1 => json!({ "task": task }),
        WireVersion::V03 => task,
    }
}
