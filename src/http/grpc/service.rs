//! `lf.a2a.v1.A2AService`: each method's request goes to the same dispatch as JSON-RPC v1.0's
//! (`http::methods`), as the ProtoJSON that v1.0's JSON bindings speak, and its answer comes back
//! the same way. So the gRPC binding shares every rule, limit, metric and error of the others.
//!
//! The proto types serve the wire (`a2a_pb::proto`); their ProtoJSON twins (`a2a_pb::protojson`,
//! the same messages with serde) cross to JSON: a message moves between the two by its protobuf
//! encoding, which both share.

use super::forwarded;
use super::status::to_status;
use crate::engine::EventId;
use crate::http::auth::{AuthError, Identity};
use crate::http::forward;
use crate::http::methods::Reply;
use crate::http::rpc;
use crate::http::sse::{EventStream, LiveStream};
use crate::http::state::AppState;
use crate::http::traced;
use crate::protocol::codec::JsonText;
use crate::protocol::params::Params;
use crate::protocol::{Method, RpcError, WireVersion};
use crate::telemetry::propagation;
use a2a_pb::proto as pb;
use a2a_pb::protojson as pj;
use actix_web::web;
use futures_util::Stream;
use prost::Message;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;
use std::pin::Pin;
use std::time::Instant;
use tonic::metadata::MetadataMap;
use tonic::{Request, Response, Status};
use tracing::Instrument;

/// The v1.0 version header, as gRPC metadata (lower case).
const VERSION_KEY: &str = "a2a-version";

pub type EventStreamResponse =
    Pin<Box<dyn Stream<Item = Result<pb::StreamResponse, Status>> + Send + 'static>>;

/// The service, over the engine that the HTTP bindings serve too.
pub struct A2aGrpc {
    pub state: web::Data<AppState>,
    /// The HTTP base URL: `GetExtendedAgentCard` answers the card the HTTP bindings give.
    pub base_url: String,
}

/// `message` as the JSON of its ProtoJSON twin `J`.
fn to_json<J>(message: &impl Message) -> Result<Value, RpcError>
where
    J: Message + Default + Serialize,
{
    let twin = J::decode(message.encode_to_vec().as_slice())
        .map_err(|e| RpcError::InvalidParams(format!("the request does not decode: {e}")))?;
    serde_json::to_value(twin)
        .map_err(|e| RpcError::InvalidParams(format!("the request has no JSON form: {e}")))
}

/// The engine's JSON answer as the proto message `P`, through its ProtoJSON twin `J`.
fn from_json<J, P>(value: Value) -> Result<P, RpcError>
where
    J: Message + Default + DeserializeOwned,
    P: Message + Default,
{
    from_twin::<J, P>(serde_json::from_value(value))
}

/// [`from_json`] from an answer written as text, read without a `Value` in between.
fn from_text<J, P>(text: &JsonText) -> Result<P, RpcError>
where
    J: Message + Default + DeserializeOwned,
    P: Message + Default,
{
    from_twin::<J, P>(serde_json::from_slice(text.as_bytes()))
}

fn from_twin<J, P>(twin: Result<J, serde_json::Error>) -> Result<P, RpcError>
where
    J: Message + Default,
    P: Message + Default,
{
    let twin =
        twin.map_err(|e| RpcError::Internal(format!("an answer without a proto form: {e}")))?;
    P::decode(twin.encode_to_vec().as_slice())
        .map_err(|e| RpcError::Internal(format!("an answer that does not encode: {e}")))
}

/// The caller, from the `authorization` metadata (as HTTP's `Authorization`; several are
/// refused there and here).
async fn identity(state: &AppState, metadata: &MetadataMap) -> Result<Identity, RpcError> {
    let mut values = metadata.get_all("authorization").iter();
    let first = values.next();
    let authorization = match values.count() {
        0 => Ok(first.and_then(|value| value.to_str().ok())),
        more => Err(AuthError::Repeated(more + 1)),
    };
    rpc::identify(state, authorization).await
}

/// gRPC serves v1.0 only: a caller that asks for another version is told so.
fn check_version(metadata: &MetadataMap) -> Result<(), RpcError> {
    let Some(value) = metadata.get(VERSION_KEY) else {
        return Ok(());
    };
    match WireVersion::parse(Some(value.to_str().unwrap_or("(not text)"))) {
        Ok(WireVersion::V1) => Ok(()),
        Ok(WireVersion::V03) => Err(RpcError::VersionNotSupported(
            "0.3 (the gRPC binding serves 1.0)".into(),
        )),
        Err(error) => Err(error),
    }
}

/// What a call answered: here, or by the node that runs its task.
enum Answer {
    Here(Reply),
    Forwarded(reqwest::Response),
}

impl A2aGrpc {
    /// One call in its request span, which continues the caller's trace.
    async fn call<J>(
        &self,
        method: Method,
        request: Request<impl Message>,
    ) -> Result<Answer, Status>
    where
        J: Message + Default + Serialize,
    {
        let span = traced::request("grpc");
        propagation::continue_from(&span, &propagation::GrpcMetadata(request.metadata()));
        self.serve::<J>(method, request).instrument(span).await
    }

    /// Authenticates, dispatches and counts one call; `J` is the request's ProtoJSON twin. A
    /// call that follows a task another node runs goes to that node (as the HTTP bindings do).
    async fn serve<J>(
        &self,
        method: Method,
        request: Request<impl Message>,
    ) -> Result<Answer, Status>
    where
        J: Message + Default + Serialize,
    {
        let started = Instant::now();
        let (principal, params) = match self.prepare::<J>(method, &request).await {
            Ok(prepared) => prepared,
            Err(error) => {
                rpc::record("invalid", error.code(), started);
                return Err(to_status(&error));
            }
        };
        if let Some(answer) =
            forward::v1_call_to_holder(&self.state, &principal, method, &params).await
        {
            rpc::record(method.label(), 0, started);
            return Ok(Answer::Forwarded(answer));
        }
        rpc::call(
            &self.state,
            WireVersion::V1,
            method,
            &principal,
            Some(&self.base_url),
            Params::Tree(params),
            started,
        )
        .await
        .map(Answer::Here)
        .map_err(|error| to_status(&error))
    }

    /// The principal a call acts as (in its tenant) and its params as JSON.
    async fn prepare<J>(
        &self,
        method: Method,
        request: &Request<impl Message>,
    ) -> Result<(String, serde_json::Value), RpcError>
    where
        J: Message + Default + Serialize,
    {
        check_version(request.metadata())?;
        let identity = identity(&self.state, request.metadata()).await?;
        let mut params = to_json::<J>(request.get_ref())?;
        if method == Method::SubscribeToTask {
            resume_point(request.metadata(), &mut params);
        }
        let tenant = params.get("tenant");
        let principal =
            rpc::principal_in_tenant(&self.state, rpc::Caller::Client, identity, tenant)?;
        Ok((principal, params))
    }

    /// A call answered with one message `R`: `J` is the request's ProtoJSON twin, `K` the answer's.
    async fn unary<J, K, R>(
        &self,
        method: Method,
        request: Request<impl Message>,
    ) -> Result<Response<R>, Status>
    where
        J: Message + Default + Serialize,
        K: Message + Default + DeserializeOwned,
        R: Message + Default,
    {
        let answer = match self.call::<J>(method, request).await? {
            Answer::Here(Reply::Json(value)) => from_json::<K, R>(value),
            Answer::Here(Reply::Text(text)) => from_text::<K, R>(&text),
            Answer::Here(Reply::Stream(_)) => {
                return Err(Status::internal("a unary method answered a stream"));
            }
            Answer::Forwarded(answer) => from_json::<K, R>(forwarded::unary(answer).await?),
        };
        answer.map(Response::new).map_err(|error| to_status(&error))
    }

    /// A call answered with a stream of `StreamResponse`s.
    async fn streaming<J>(
        &self,
        method: Method,
        request: Request<impl Message>,
    ) -> Result<Response<EventStreamResponse>, Status>
    where
        J: Message + Default + Serialize,
    {
        match self.call::<J>(method, request).await? {
            Answer::Here(Reply::Stream(events)) => Ok(Response::new(stream_responses(events))),
            Answer::Here(Reply::Json(_) | Reply::Text(_)) => {
                Err(Status::internal("a streaming method answered one message"))
            }
            // Subscriptions are relayed by the engine, never passed on whole (`forward`).
            Answer::Forwarded(_) => Err(Status::internal("a stream was forwarded")),
        }
    }
}

/// A v1.0 `StreamResponse` in JSON as the proto message.
fn stream_response(value: Value) -> Result<pb::StreamResponse, Status> {
    from_json::<pj::StreamResponse, pb::StreamResponse>(value).map_err(|error| to_status(&error))
}

/// The metadata key each streamed event's id goes under (the event's own `metadata`: gRPC has
/// no metadata per message) and the request metadata a resume names the last one seen in.
const EVENT_ID_KEY: &str = "colloquy/eventId";
const LAST_EVENT_ID_KEY: &str = "last-event-id";

/// A `SubscribeToTask` with `last-event-id` metadata resumes after it, as `Last-Event-ID` does
/// on the HTTP bindings.
fn resume_point(metadata: &MetadataMap, params: &mut Value) {
    let last = metadata
        .get(LAST_EVENT_ID_KEY)
        .and_then(|v| v.to_str().ok());
    if let (Some(last), Value::Object(params)) = (last, params) {
        params
            .entry("lastEventId")
            .or_insert_with(|| last.to_owned().into());
    }
}

/// Puts an event's id into the `metadata` of the task, message or update it carries.
fn with_event_id(mut result: Value, id: Option<EventId>) -> Value {
    if let (Some(id), Value::Object(response)) = (id, &mut result)
        && let Some(Value::Object(payload)) = response.values_mut().next()
    {
        let metadata = payload
            .entry("metadata")
            .or_insert_with(|| Value::Object(Default::default()));
        if let Value::Object(metadata) = metadata {
            metadata.insert(EVENT_ID_KEY.into(), id.to_string().into());
        }
    }
    result
}

/// Each event as a `StreamResponse`, its id in its metadata; the error that ends a stream (a
/// reader too slow for the buffer) ends it as its status, as on the other bindings.
fn stream_responses(events: EventStream) -> EventStreamResponse {
    let live = LiveStream::new("colloquy_grpc_streams");
    Box::pin(futures_util::stream::unfold(
        (events, live),
        |(mut events, live)| async move {
            let item = match events.next(WireVersion::V1).await? {
                Ok(outgoing) => stream_response(with_event_id(outgoing.result, outgoing.id)),
                Err(error) => Err(to_status(&error)),
            };
            Some((item, (events, live)))
        },
    ))
}

#[tonic::async_trait]
impl pb::a2a_service_server::A2aService for A2aGrpc {
    async fn send_message(
        &self,
        request: Request<pb::SendMessageRequest>,
    ) -> Result<Response<pb::SendMessageResponse>, Status> {
        self.unary::<pj::SendMessageRequest, pj::SendMessageResponse, _>(
            Method::SendMessage,
            request,
        )
        .await
    }

    type SendStreamingMessageStream = EventStreamResponse;

    async fn send_streaming_message(
        &self,
        request: Request<pb::SendMessageRequest>,
    ) -> Result<Response<Self::SendStreamingMessageStream>, Status> {
        self.streaming::<pj::SendMessageRequest>(Method::SendStreamingMessage, request)
            .await
    }

    async fn get_task(
        &self,
        request: Request<pb::GetTaskRequest>,
    ) -> Result<Response<pb::Task>, Status> {
        self.unary::<pj::GetTaskRequest, pj::Task, _>(Method::GetTask, request)
            .await
    }

    async fn list_tasks(
        &self,
        request: Request<pb::ListTasksRequest>,
    ) -> Result<Response<pb::ListTasksResponse>, Status> {
        self.unary::<pj::ListTasksRequest, pj::ListTasksResponse, _>(Method::ListTasks, request)
            .await
    }

    async fn cancel_task(
        &self,
        request: Request<pb::CancelTaskRequest>,
    ) -> Result<Response<pb::Task>, Status> {
        self.unary::<pj::CancelTaskRequest, pj::Task, _>(Method::CancelTask, request)
            .await
    }

    type SubscribeToTaskStream = EventStreamResponse;

    async fn subscribe_to_task(
        &self,
        request: Request<pb::SubscribeToTaskRequest>,
    ) -> Result<Response<Self::SubscribeToTaskStream>, Status> {
        self.streaming::<pj::SubscribeToTaskRequest>(Method::SubscribeToTask, request)
            .await
    }

    async fn create_task_push_notification_config(
        &self,
        request: Request<pb::TaskPushNotificationConfig>,
    ) -> Result<Response<pb::TaskPushNotificationConfig>, Status> {
        self.unary::<pj::TaskPushNotificationConfig, pj::TaskPushNotificationConfig, _>(
            Method::CreatePushConfig,
            request,
        )
        .await
    }

    async fn get_task_push_notification_config(
        &self,
        request: Request<pb::GetTaskPushNotificationConfigRequest>,
    ) -> Result<Response<pb::TaskPushNotificationConfig>, Status> {
        self.unary::<pj::GetTaskPushNotificationConfigRequest, pj::TaskPushNotificationConfig, _>(
            Method::GetPushConfig,
            request,
        )
        .await
    }

    async fn list_task_push_notification_configs(
        &self,
        request: Request<pb::ListTaskPushNotificationConfigsRequest>,
    ) -> Result<Response<pb::ListTaskPushNotificationConfigsResponse>, Status> {
        self.unary::<
            pj::ListTaskPushNotificationConfigsRequest,
            pj::ListTaskPushNotificationConfigsResponse,
            _,
        >(Method::ListPushConfigs, request)
        .await
    }

    async fn get_extended_agent_card(
        &self,
        request: Request<pb::GetExtendedAgentCardRequest>,
    ) -> Result<Response<pb::AgentCard>, Status> {
        self.unary::<pj::GetExtendedAgentCardRequest, pj::AgentCard, _>(
            Method::GetExtendedAgentCard,
            request,
        )
        .await
    }

    async fn delete_task_push_notification_config(
        &self,
        request: Request<pb::DeleteTaskPushNotificationConfigRequest>,
    ) -> Result<Response<()>, Status> {
        self.call::<pj::DeleteTaskPushNotificationConfigRequest>(Method::DeletePushConfig, request)
            .await
            .map(|_| Response::new(()))
    }
}
