//! The push-notification config methods, both versions: v1.0 `Create/Get/List/Delete
//! TaskPushNotificationConfig(s)`, v0.3 `tasks/pushNotificationConfig/{set,get,list,delete}`.
//! Configs belong to the task's principal; credentials are never answered back.

use super::errors::push_error;
use super::state::AppState;
use crate::model::PushConfig;
use crate::protocol::Method;
use crate::protocol::fields::field_error;
use crate::protocol::push::{decode_config, decode_config_ref, decode_send_config, encode_config};
use crate::protocol::{RpcError, WireVersion};
use serde_json::{Value, json};

enum Action {
    Create,
    Get,
    List,
    Delete,
}

fn action(method: Method) -> Option<Action> {
    match method {
        Method::CreatePushConfig => Some(Action::Create),
        Method::GetPushConfig => Some(Action::Get),
        Method::ListPushConfigs => Some(Action::List),
        Method::DeletePushConfig => Some(Action::Delete),
        _ => None,
    }
}

/// Answers one of the push-notification config methods (`method` as the request spelled it).
pub async fn handle(
    state: &AppState,
    version: WireVersion,
    principal: &str,
    method: Method,
    params: &Value,
) -> Result<Value, RpcError> {
    let configs = state.push.as_ref().ok_or(RpcError::PushNotSupported)?;
    let action =
        action(method).ok_or_else(|| RpcError::MethodNotFound(method.label().to_owned()))?;
    // v1.0 names the config `id`; v0.3 `pushNotificationConfigId` (except in set, whose params
    // are a config).
    let config_field = match version {
        WireVersion::V1 => "id",
        WireVersion::V03 => "pushNotificationConfigId",
    };
    let required = |id: Option<String>| id.ok_or_else(|| field_error(config_field, "is required"));
    match action {
        Action::Create => {
            let config = decode_config(version, params, "")?;
            if config.task_id.is_empty() {
                return Err(field_error("taskId", "is required").into());
            }
            let config = configs
                .create(principal, config)
                .await
                .map_err(push_error)?;
            Ok(encode_config(version, &config))
        }
        Action::Get => {
            let named = decode_config_ref(version, params)?;
            let config_id = match version {
                WireVersion::V1 => Some(required(named.config_id)?),
                WireVersion::V03 => named.config_id,
            };
            let config = configs
                .get(principal, &named.task_id, config_id.as_deref())
                .await
                .map_err(push_error)?;
            Ok(encode_config(version, &config))
        }
        Action::List => {
            let named = decode_config_ref(version, params)?;
            let list = configs
                .list(principal, &named.task_id)
                .await
                .map_err(push_error)?;
            let encoded: Vec<Value> = list.iter().map(|c| encode_config(version, c)).collect();
            Ok(match version {
                WireVersion::V1 => json!({"configs": encoded, "nextPageToken": ""}),
                WireVersion::V03 => Value::Array(encoded),
            })
        }
        Action::Delete => {
            let named = decode_config_ref(version, params)?;
            let config_id = required(named.config_id)?;
            configs
                .delete(principal, &named.task_id, &config_id)
                .await
                .map_err(push_error)?;
            Ok(match version {
                WireVersion::V1 => json!({}),
                WireVersion::V03 => Value::Null,
            })
        }
    }
}

/// The config a send carries (`configuration.taskPushNotificationConfig` in v1.0,
/// `configuration.pushNotificationConfig` in v0.3), checked. A send that continues a task
/// registers it at once (with the limit and ownership checks of Create); one that starts a task
/// hands it to the engine, which stores it with the task's start.
pub async fn send_config(
    state: &AppState,
    version: WireVersion,
    principal: &str,
    configuration: &Value,
    continued_task: Option<&str>,
) -> Result<Vec<PushConfig>, RpcError> {
    let Some(mut config) = decode_send_config(version, configuration)? else {
        return Ok(Vec::new());
    };
    let configs = state.push.as_ref().ok_or(RpcError::PushNotSupported)?;
    if let Some(task_id) = continued_task {
        config.task_id = task_id.to_owned();
        configs
            .create(principal, config)
            .await
            .map_err(push_error)?;
        return Ok(Vec::new());
    }
    let config = configs
        .checked(principal, config)
        .await
        .map_err(push_error)?;
    Ok(vec![config])
}

/// `GET /.well-known/jwks.json`: the keys push notifications are signed with.
pub async fn jwks(state: actix_web::web::Data<AppState>) -> actix_web::HttpResponse {
    actix_web::HttpResponse::Ok()
        .content_type("application/jwk-set+json")
        .json(state.keys.jwks())
}
