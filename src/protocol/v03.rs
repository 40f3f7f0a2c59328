//! A2A v0.3's wire types where they differ from v1.0's (see [`super::params`] for the rest).

use super::WireVersion;
use super::codec;
use super::fields::FieldResult;
use super::params::{SendRequest, decode};
use serde::Deserialize;
use serde::de::IgnoredAny;
use serde_json::Value;

/// `MessageSendParams`: the params of `message/send` and `message/stream`.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MessageSendParams {
    /// Required here; read by the codec, which names the fields inside it.
    #[serde(rename = "message")]
    _message: IgnoredAny,
    configuration: Option<MessageSendConfiguration>,
}

/// `MessageSendConfiguration`.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct MessageSendConfiguration {
    #[serde(default, deserialize_with = "super::params::count")]
    history_length: Option<u64>,
    /// Wait for the turn to end (the default) or answer at once.
    blocking: Option<bool>,
    push_notification_config: Option<Value>,
    /// The v1.0 spelling, also refused rather than ignored.
    task_push_notification_config: Option<Value>,
}

impl MessageSendParams {
    pub fn read(params: &Value) -> FieldResult<SendRequest> {
        let request: MessageSendParams = decode(params)?;
        let message = codec::decode_message(WireVersion::V03, &params["message"], "message")?;
        let configuration = request.configuration;
        Ok(SendRequest {
            message,
            return_immediately: !configuration
                .as_ref()
                .and_then(|c| c.blocking)
                .unwrap_or(true),
            history_length: configuration.as_ref().and_then(|c| c.history_length),
            push_notification: configuration.is_some_and(|c| {
                c.push_notification_config.is_some() || c.task_push_notification_config.is_some()
            }),
        })
    }
}
