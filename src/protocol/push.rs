//! Push-notification configs on the wire, both versions.
//!
//! v1.0: `TaskPushNotificationConfig` is flat, `{id, taskId, url, token?, authentication?:
//! {scheme, credentials?}}`. v0.3: `{taskId, pushNotificationConfig: {id, url, token?,
//! authentication?: {schemes: [..], credentials?}}}`. Credentials are never encoded back.

use super::WireVersion;
use super::codec::{self, TaskView};
use super::fields::{FieldResult, Obj, field_error};
use crate::model::{PushAuth, PushConfig, Task};
use serde_json::{Map, Value, json};

/// A config as a request gives it; `id` and `task_id` may still be empty (the caller fills
/// them: a fresh id, the task a send creates).
pub fn decode_config(version: WireVersion, params: &Obj) -> FieldResult<PushConfig> {
    let task_id = params.opt_str("taskId")?.unwrap_or_default().to_owned();
    let inner = match version {
        WireVersion::V1 => Obj {
            map: params.map,
            path: params.path.clone(),
        },
        WireVersion::V03 => params.obj("pushNotificationConfig")?,
    };
    decode_inner(version, &inner, task_id)
}

/// The config a send carries in its `configuration` (v1.0 `taskPushNotificationConfig`, v0.3
/// `pushNotificationConfig`), if any.
pub fn decode_send_config(
    version: WireVersion,
    configuration: &Obj,
) -> FieldResult<Option<PushConfig>> {
    match version {
        WireVersion::V1 => configuration
            .opt_obj("taskPushNotificationConfig")?
            .map(|obj| decode_config(version, &obj))
            .transpose(),
        WireVersion::V03 => configuration
            .opt_obj("pushNotificationConfig")?
            .map(|obj| decode_inner(version, &obj, String::new()))
            .transpose(),
    }
}

fn decode_inner(version: WireVersion, obj: &Obj, task_id: String) -> FieldResult<PushConfig> {
    let url = obj.str("url")?.to_owned();
    let authentication = match obj.opt_obj("authentication")? {
        None => None,
        Some(auth) => {
            let schemes = match version {
                WireVersion::V1 => auth
                    .opt_str("scheme")?
                    .map(str::to_owned)
                    .into_iter()
                    .collect(),
                WireVersion::V03 => auth.opt_strings("schemes")?,
            };
            if schemes.is_empty() {
                return Err(field_error(
                    auth.child_path(if version == WireVersion::V1 {
                        "scheme"
                    } else {
                        "schemes"
                    }),
                    "is required",
                ));
            }
            Some(PushAuth {
                schemes,
                credentials: auth.opt_str("credentials")?.map(str::to_owned),
            })
        }
    };
    Ok(PushConfig {
        id: obj.opt_str("id")?.unwrap_or_default().to_owned(),
        task_id,
        url,
        token: obj.opt_str("token")?.map(str::to_owned),
        authentication,
        wire_version: version.label().to_owned(),
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
