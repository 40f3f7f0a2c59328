//! A2A v1.0's wire types where they differ from v0.3's (see [`super::params`] for the rest).
//! Names are the JSON names; proto names were rewritten to them on the way in
//! ([`super::protojson`]).

use super::WireVersion;
use super::codec;
use super::fields::FieldResult;
use super::params::{SendRequest, decode};
use serde::Deserialize;
use serde::de::IgnoredAny;
use serde_json::Value;

/// `SendMessageRequest`: the params of `SendMessage` and `SendStreamingMessage`.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SendMessageRequest {
    /// Required here; read by the codec, which names the fields inside it.
    #[serde(rename = "message")]
    _message: IgnoredAny,
    configuration: Option<SendMessageConfiguration>,
}

/// `SendMessageConfiguration`.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct SendMessageConfiguration {
    #[serde(default, deserialize_with = "super::params::count")]
    history_length: Option<u64>,
    return_immediately: Option<bool>,
    task_push_notification_config: Option<Value>,
    /// The v0.3 spelling, also refused rather than ignored.
    push_notification_config: Option<Value>,
}

impl SendMessageRequest {
    pub fn read(params: &Value) -> FieldResult<SendRequest> {
        let request: SendMessageRequest = decode(params)?;
        let message = codec::decode_message(WireVersion::V1, &params["message"], "message")?;
        let configuration = request.configuration;
        Ok(SendRequest {
            message,
            return_immediately: configuration
                .as_ref()
                .and_then(|c| c.return_immediately)
                .unwrap_or(false),
            history_length: configuration.as_ref().and_then(|c| c.history_length),
            push_notification: configuration.is_some_and(|c| {
                c.task_push_notification_config.is_some() || c.push_notification_config.is_some()
            }),
        })
    }
}
