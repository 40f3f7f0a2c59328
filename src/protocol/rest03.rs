//! v0.3's HTTP+JSON binding speaks the ProtoJSON of v0.3's protobuf schema, which differs from
//! v1.0's in a few names and shapes. The routes serve it by translating at the edge: a request
//! body into the v1.0 params the handlers take, a v1.0 result into v0.3's spelling.
//!
//! v0.3 against v1.0: `Message.content` for `parts`; a data part `{"data": {"data": …}}` for
//! `{"data": …}`; a file part `{"file": {fileWithUri | fileWithBytes, mimeType, name}}` for
//! `{url | raw, mediaType, filename}`; `TASK_STATE_CANCELLED` for `TASK_STATE_CANCELED`;
//! `configuration.blocking` for the inverse `returnImmediately`, `pushNotification` for
//! `taskPushNotificationConfig`; a status update's `final`; the card's security in message form.

use super::Method;
use serde_json::{Map, Value, json};

/// A v0.3 `SendMessageRequest` (or any params object) as v1.0 params, in place.
pub fn params_to_v1(params: &mut Map<String, Value>) {
    if let Some(message) = params.get_mut("message") {
        message_to_v1(message);
    }
    if let Some(Value::Object(configuration)) = params.get_mut("configuration") {
        if let Some(blocking) = configuration.remove("blocking") {
            let blocking = blocking.as_bool().unwrap_or(true);
            configuration.insert("returnImmediately".into(), Value::Bool(!blocking));
        }
        if let Some(push) = configuration.remove("pushNotification") {
            configuration.insert("taskPushNotificationConfig".into(), push);
        }
    }
}

/// A v0.3 push-config route's params (the path's `taskId` and `id`, and for create the body
/// `{parent, configId, config: {name, pushNotificationConfig}}`) as v0.3 JSON-RPC params, in
/// place: the v0.3 handlers take them, so the config keeps notifying in v0.3's spelling.
pub fn push_params_to_v03(method: Method, params: &mut Map<String, Value>) {
    let task = params.remove("taskId").unwrap_or_default();
    let config_id = params.remove("id");
    if method == Method::CreatePushConfig {
        let mut inner = match params.remove("config") {
            Some(Value::Object(mut config)) => config
                .remove("pushNotificationConfig")
                .unwrap_or_else(|| json!({})),
            other => other.unwrap_or_else(|| json!({})),
        };
        if let Value::Object(inner) = &mut inner {
            defaults_absent(inner);
        }
        if let (Value::Object(inner), Some(id)) = (&mut inner, params.remove("configId"))
            && !inner.contains_key("id")
        {
            inner.insert("id".into(), id);
        }
        params.clear();
        params.insert("taskId".into(), task);
        params.insert("pushNotificationConfig".into(), inner);
        return;
    }
    params.clear();
    params.insert("id".into(), task);
    if let Some(config_id) = config_id {
        params.insert("pushNotificationConfigId".into(), config_id);
    }
}

/// In ProtoJSON a string at its default (`""`) is the same as an absent one, and an
/// `authentication` with neither schemes nor credentials carries nothing: a config's empty `id`
/// or `token` and such an `authentication` are dropped, rather than stored or refused as
/// incomplete by the v0.3 handlers, which take the config next and follow JSON-RPC's v0.3 schema
/// (where an `authentication` must have `schemes`).
fn defaults_absent(config: &mut Map<String, Value>) {
    let empty = |value: Option<&Value>| match value {
        None | Some(Value::Null) => true,
        Some(Value::String(text)) => text.is_empty(),
        Some(Value::Array(items)) => items.is_empty(),
        Some(Value::Object(fields)) => fields.is_empty(),
        Some(_) => false,
    };
    for field in ["id", "token"] {
        if empty(config.get(field)) {
            config.remove(field);
        }
    }
    let no_authentication = match config.get("authentication") {
        Some(Value::Object(auth)) => empty(auth.get("schemes")) && empty(auth.get("credentials")),
        other => empty(other),
    };
    if no_authentication {
        config.remove("authentication");
    }
}

/// A v0.3 push-config result (`{taskId, pushNotificationConfig}`, a list of them, or null) as
/// v0.3's protobuf JSON: `{name: "tasks/{id}/pushNotificationConfigs/{configId}",
/// pushNotificationConfig}`, `{configs: [...]}`, `{}`.
pub fn push_result_to_v03(result: &mut Value) {
    fn named(config: &mut Value) {
        let Value::Object(object) = config else {
            return;
        };
        let task = object.remove("taskId");
        let task = task.as_ref().and_then(Value::as_str).unwrap_or_default();
        let id = object["pushNotificationConfig"]["id"]
            .as_str()
            .unwrap_or_default();
        let name = format!("tasks/{task}/pushNotificationConfigs/{id}");
        object.insert("name".into(), Value::String(name));
    }
    match result {
        Value::Array(configs) => {
            configs.iter_mut().for_each(named);
            *result = json!({"configs": std::mem::take(configs)});
        }
        Value::Null => *result = json!({}),
        config => named(config),
    }
}

fn message_to_v1(message: &mut Value) {
    let Value::Object(message) = message else {
        return;
    };
    if let Some(mut parts) = message.remove("content") {
        for part in parts.as_array_mut().into_iter().flatten() {
            part_to_v1(part);
        }
        message.insert("parts".into(), parts);
    }
}

fn part_to_v1(part: &mut Value) {
    let Value::Object(part) = part else {
        return;
    };
    if let Some(Value::Object(data)) = part.get_mut("data")
        && let Some(inner) = data.remove("data")
    {
        part.insert("data".into(), inner);
    }
    if let Some(Value::Object(mut file)) = part.remove("file") {
        for (from, to) in [
            ("fileWithUri", "url"),
            ("fileWithBytes", "raw"),
            ("mimeType", "mediaType"),
            ("name", "filename"),
        ] {
            if let Some(value) = file.remove(from) {
                part.insert(to.into(), value);
            }
        }
    }
}

/// A v1.0 HTTP+JSON result (a `SendMessageResponse`, `StreamResponse` or `Task`) in v0.3's
/// spelling, in place.
pub fn result_to_v03(result: &mut Value) {
    let Value::Object(object) = result else {
        return;
    };
    if let Some(task) = object.get_mut("task") {
        task_to_v03(task);
    } else if let Some(message) = object.get_mut("message") {
        message_to_v03(message);
    } else if let Some(Value::Object(update)) = object.get_mut("statusUpdate") {
        let mut ends = false;
        if let Some(status) = update.get_mut("status") {
            status_to_v03(status);
            ends = status["state"].as_str().is_some_and(state_ends_stream);
        }
        update.insert("final".into(), Value::Bool(ends));
    } else if let Some(Value::Object(update)) = object.get_mut("artifactUpdate") {
        if let Some(artifact) = update.get_mut("artifact") {
            artifact_to_v03(artifact);
        }
    } else if object.contains_key("status") {
        task_to_v03(result);
    }
}

/// After this state a stream says no more (v0.3 marks its status update `final`).
fn state_ends_stream(state: &str) -> bool {
    matches!(
        state,
        "TASK_STATE_COMPLETED"
            | "TASK_STATE_FAILED"
            | "TASK_STATE_CANCELLED"
            | "TASK_STATE_REJECTED"
            | "TASK_STATE_INPUT_REQUIRED"
            | "TASK_STATE_AUTH_REQUIRED"
    )
}

fn task_to_v03(task: &mut Value) {
    if let Some(status) = task.get_mut("status") {
        status_to_v03(status);
    }
    for message in task
        .get_mut("history")
        .and_then(Value::as_array_mut)
        .into_iter()
        .flatten()
    {
        message_to_v03(message);
    }
    for artifact in task
        .get_mut("artifacts")
        .and_then(Value::as_array_mut)
        .into_iter()
        .flatten()
    {
        artifact_to_v03(artifact);
    }
}

fn status_to_v03(status: &mut Value) {
    if status["state"] == "TASK_STATE_CANCELED" {
        status["state"] = json!("TASK_STATE_CANCELLED");
    }
    if let Some(message) = status.get_mut("message") {
        message_to_v03(message);
    }
}

fn message_to_v03(message: &mut Value) {
    let Value::Object(message) = message else {
        return;
    };
    if let Some(mut parts) = message.remove("parts") {
        parts_to_v03(&mut parts);
        message.insert("content".into(), parts);
    }
}

fn artifact_to_v03(artifact: &mut Value) {
    if let Some(parts) = artifact.get_mut("parts") {
        parts_to_v03(parts);
    }
}

fn parts_to_v03(parts: &mut Value) {
    for part in parts.as_array_mut().into_iter().flatten() {
        let Value::Object(part) = part else {
            continue;
        };
        if let Some(data) = part.remove("data") {
            part.insert("data".into(), json!({ "data": data }));
        }
        let mut file = Map::new();
        for (from, to) in [
            ("url", "fileWithUri"),
            ("raw", "fileWithBytes"),
            ("mediaType", "mimeType"),
            ("filename", "name"),
        ] {
            if let Some(value) = part.remove(from) {
                file.insert(to.into(), value);
            }
        }
        if !file.is_empty() {
            part.insert("file".into(), Value::Object(file));
        }
    }
}

/// The agent card as v0.3's `AgentCard` message: without v1.0's fields, its security in the
/// message form (`{"schemes": {name: {"list": scopes}}}`, an HTTP scheme as
/// `httpAuthSecurityScheme`).
pub fn card_to_v03(card: &mut Value) {
    let Value::Object(card) = card else {
        return;
    };
    card.remove("supportedInterfaces");
    if let Some(Value::Object(capabilities)) = card.get_mut("capabilities") {
        capabilities.remove("extendedAgentCard");
    }
    if let Some(Value::Object(schemes)) = card.get_mut("securitySchemes") {
        for scheme in schemes.values_mut() {
            if scheme["type"] == "http" {
                let mut http = scheme.clone();
                if let Value::Object(http) = &mut http {
                    http.remove("type");
                }
                *scheme = json!({ "httpAuthSecurityScheme": http });
            }
        }
    }
    if let Some(Value::Array(requirements)) = card.get_mut("security") {
        for requirement in requirements.iter_mut() {
            let Value::Object(names) = requirement else {
                continue;
            };
            let schemes: Map<String, Value> = names
                .iter()
                .map(|(name, scopes)| (name.clone(), json!({ "list": scopes })))
                .collect();
            *requirement = json!({ "schemes": schemes });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_v03_send_becomes_v1_params_and_a_v1_task_becomes_v03() {
        let mut params = json!({
            "message": {"messageId": "m", "role": "ROLE_USER", "content": [{"text": "hi"}, {"data": {"data": {"a": 1}}}]},
            "configuration": {"blocking": false},
        });
        params_to_v1(params.as_object_mut().unwrap());
        assert_eq!(
            params["message"]["parts"],
            json!([{"text": "hi"}, {"data": {"a": 1}}])
        );
        assert_eq!(params["configuration"], json!({"returnImmediately": true}));

        let mut result = json!({"task": {
            "id": "t", "status": {"state": "TASK_STATE_CANCELED", "message": {"parts": [{"text": "x"}]}},
            "history": [{"parts": [{"url": "http://f", "mediaType": "text/plain"}]}],
            "artifacts": [{"parts": [{"text": "y"}]}],
        }});
        result_to_v03(&mut result);
        let task = &result["task"];
        assert_eq!(task["status"]["state"], "TASK_STATE_CANCELLED");
        assert_eq!(task["status"]["message"]["content"], json!([{"text": "x"}]));
        assert_eq!(
            task["history"][0]["content"],
            json!([{"file": {"fileWithUri": "http://f", "mimeType": "text/plain"}}])
        );
        assert_eq!(task["artifacts"][0]["parts"], json!([{"text": "y"}]));

        let mut update =
            json!({"statusUpdate": {"status": {"state": "TASK_STATE_INPUT_REQUIRED"}}});
        result_to_v03(&mut update);
        assert_eq!(update["statusUpdate"]["final"], true);
    }
}
