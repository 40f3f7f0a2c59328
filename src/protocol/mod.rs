//! A2A on the wire: the JSON-RPC envelope, method names and the two version mappings.

pub mod codec;
pub mod fields;
pub mod jsonrpc;
mod out;
pub mod params;
pub mod protojson;
pub mod push;
pub mod rest03;
pub mod signing;
pub mod v03;
pub mod v1;

pub use jsonrpc::{RpcError, RpcRequest};

/// The two A2A wire versions colloquy speaks on one endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WireVersion {
    V1,
    V03,
}

impl WireVersion {
    /// From the `A2A-Version` header or query parameter; none means v0.3.
    pub fn parse(requested: Option<&str>) -> Result<WireVersion, RpcError> {
        match requested.map(str::trim) {
            None | Some("") | Some("0.3") | Some("0.3.0") => Ok(WireVersion::V03),
            Some("1.0") | Some("1.0.0") => Ok(WireVersion::V1),
            Some(other) => Err(RpcError::VersionNotSupported(other.to_owned())),
        }
    }

    pub fn label(self) -> &'static str {
        match self {
            WireVersion::V1 => "1.0",
            WireVersion::V03 => "0.3",
        }
    }
}

/// Every method the endpoint serves, whatever its version's spelling.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    SendMessage,
    SendStreamingMessage,
    GetTask,
    ListTasks,
    CancelTask,
    SubscribeToTask,
    CreatePushConfig,
    GetPushConfig,
    ListPushConfigs,
    DeletePushConfig,
    GetExtendedAgentCard,
    ListConversations,
    GetConversation,
    DeleteConversation,
}

const V1_METHODS: &[(&str, Method)] = &[
    ("SendMessage", Method::SendMessage),
    ("SendStreamingMessage", Method::SendStreamingMessage),
    ("GetTask", Method::GetTask),
    ("ListTasks", Method::ListTasks),
    ("CancelTask", Method::CancelTask),
    ("SubscribeToTask", Method::SubscribeToTask),
    ("CreateTaskPushNotificationConfig", Method::CreatePushConfig),
    ("GetTaskPushNotificationConfig", Method::GetPushConfig),
    ("ListTaskPushNotificationConfigs", Method::ListPushConfigs),
    ("DeleteTaskPushNotificationConfig", Method::DeletePushConfig),
    ("GetExtendedAgentCard", Method::GetExtendedAgentCard),
];

const V03_METHODS: &[(&str, Method)] = &[
    ("message/send", Method::SendMessage),
    ("message/stream", Method::SendStreamingMessage),
    ("tasks/get", Method::GetTask),
    ("tasks/list", Method::ListTasks),
    ("tasks/cancel", Method::CancelTask),
    ("tasks/resubscribe", Method::SubscribeToTask),
    ("tasks/pushNotificationConfig/set", Method::CreatePushConfig),
    ("tasks/pushNotificationConfig/get", Method::GetPushConfig),
    ("tasks/pushNotificationConfig/list", Method::ListPushConfigs),
    (
        "tasks/pushNotificationConfig/delete",
        Method::DeletePushConfig,
    ),
    (
        "agent/getAuthenticatedExtendedCard",
        Method::GetExtendedAgentCard,
    ),
];

/// colloquy's own methods, the same in both versions.
const OWN_METHODS: &[(&str, Method)] = &[
    ("colloquy/listConversations", Method::ListConversations),
    ("colloquy/getConversation", Method::GetConversation),
    ("colloquy/deleteConversation", Method::DeleteConversation),
];

impl Method {
    pub fn resolve(version: WireVersion, name: &str) -> Result<Method, RpcError> {
        let table = match version {
            WireVersion::V1 => V1_METHODS,
            WireVersion::V03 => V03_METHODS,
        };
        if let Some((_, method)) = table.iter().chain(OWN_METHODS).find(|(n, _)| *n == name) {
            return Ok(*method);
        }
        let (other_table, other) = match version {
            WireVersion::V1 => (V03_METHODS, WireVersion::V03),
            WireVersion::V03 => (V1_METHODS, WireVersion::V1),
        };
        let hint = other_table.iter().find(|(n, _)| *n == name).map(|(_, method)| {
            let own_name = table.iter().find(|(_, m)| m == method).map_or("", |(n, _)| *n);
            format!(
                " ({name} is the A2A {} name; with A2A-Version {} use {own_name}, or send A2A-Version: {})",
                other.label(),
                version.label(),
                other.label()
            )
        });
        Err(RpcError::MethodNotFound(format!(
            "method not found: {name:?}{}",
            hint.unwrap_or_default()
        )))
    }

    /// Every method's label, once each.
    pub fn labels() -> impl Iterator<Item = &'static str> {
        V1_METHODS
            .iter()
            .chain(OWN_METHODS)
            .filter(|(name, method)| method.label() == *name)
            .map(|(name, _)| *name)
    }

    /// One of the four push-notification config methods.
    pub fn is_push_config(self) -> bool {
        matches!(
            self,
            Method::CreatePushConfig
                | Method::GetPushConfig
                | Method::ListPushConfigs
                | Method::DeletePushConfig
        )
    }

    /// A stable label for metrics and logs (the v1.0 name, or ours).
    pub fn label(self) -> &'static str {
        V1_METHODS
            .iter()
            .chain(OWN_METHODS)
            .find(|(_, m)| *m == self)
            .map_or("unknown", |(n, _)| *n)
    }
}
