//! One function per JSON-RPC method: decode params, call the engine, encode the result.

use super::errors::rpc_error;
use super::sse;
use super::state::AppState;
use crate::engine::{EngineError, EventId, Scope, ValidMessage};
use crate::model::{SendResult, format_time};
use crate::protocol::codec::{self, JsonText, TaskView};
use crate::protocol::params::{
    self, ContextParams, GetConversationParams, GetTaskParams, ListConversationsParams,
    ListTasksParams, Params, SubscribeParams, TaskIdParams,
};
use crate::protocol::{Method, RpcError, WireVersion};
use crate::store::TaskQuery;
use serde_json::{Value, json};
use std::sync::Arc;

const DEFAULT_PAGE_SIZE: u64 = 50;
const MAX_PAGE_SIZE: u64 = 100;

type RpcResult<T> = Result<T, RpcError>;

/// What a method answers: one JSON result (as a tree, or as text already written), or an SSE
/// stream of them.
pub enum Reply {
    Json(Value),
    Text(JsonText),
    Stream(sse::EventStream),
}

impl Reply {
    /// A one-result answer as a tree, for a binding that reshapes it (HTTP+JSON v0.3). Text
    /// that does not parse back, or a stream, is our own bug: an internal error.
    pub fn into_json(self) -> Result<Value, RpcError> {
        match self {
            Reply::Json(value) => Ok(value),
            Reply::Text(text) => serde_json::from_slice(text.as_bytes()).map_err(|e| {
                RpcError::Internal(format!("an answer that does not parse back: {e}"))
            }),
            Reply::Stream(_) => Err(RpcError::Internal(
                "a stream where one answer was due".into(),
            )),
        }
    }
}

pub async fn dispatch(
    state: &AppState,
    version: WireVersion,
    method: Method,
    principal: &str,
    base_url: Option<&str>,
    params: Params,
) -> RpcResult<Reply> {
    let params = match version {
        WireVersion::V1 => params.with_json_names()?,
        WireVersion::V03 => params,
    };
    let call = Call {
        state,
        version,
        principal,
        params: &params,
    };
    match method {
        Method::SendMessage => call.send_message().await.map(Reply::Text),
        Method::SendStreamingMessage => call.send_streaming().await.map(Reply::Stream),
        Method::GetTask => call.get_task().await.map(Reply::Json),
        Method::ListTasks => call.list_tasks().await.map(Reply::Json),
        Method::CancelTask => call.cancel_task().await.map(Reply::Json),
        Method::SubscribeToTask => call.subscribe().await.map(Reply::Stream),
        Method::CreatePushConfig
        | Method::GetPushConfig
        | Method::ListPushConfigs
        | Method::DeletePushConfig => {
            super::push::handle(state, version, principal, method, &*params.tree()?)
                .await
                .map(Reply::Json)
        }
        Method::GetExtendedAgentCard => match base_url {
            Some(url) => super::card::extended_card(state, url).map(Reply::Json),
            None => Err(RpcError::Internal(
                "the binding gave no base URL for the extended card".into(),
            )),
        },
        Method::ListConversations => call.list_conversations().await.map(Reply::Json),
        Method::GetConversation => call.get_conversation().await.map(Reply::Json),
        Method::DeleteConversation => call.delete_conversation().await.map(Reply::Json),
    }
}

struct Call<'a> {
    state: &'a AppState,
    version: WireVersion,
    principal: &'a str,
    params: &'a Params,
}

/// What a send asked for besides the message.
struct SendOptions {
    return_immediately: bool,
    history_length: Option<usize>,
}

fn to_usize(n: Option<u64>) -> Option<usize> {
    n.map(|n| usize::try_from(n).unwrap_or(usize::MAX))
}

impl Call<'_> {
    fn engine_error(&self, e: EngineError) -> RpcError {
        rpc_error(e, self.version)
    }

    fn decode<T: serde::de::DeserializeOwned>(&self) -> RpcResult<T> {
        Ok(self.params.decode()?)
    }

    /// The task a request names, on its span (its contextId is left out of traces: the turn's
    /// span names the conversation by its key's hash).
    fn record_task(task_id: Option<&str>) {
        if let Some(task_id) = task_id {
            tracing::Span::current().record("task_id", task_id);
        }
    }

    async fn decode_send(&self) -> RpcResult<(ValidMessage, SendOptions)> {
        let request = params::send_request(self.version, self.params)?;
        let mut message = self
            .state
            .engine
            .validate(request.message)
            .map_err(|e| self.engine_error(e))?;
        // Only a send asking for notifications has a configuration for the push side to read.
        let configuration = match request.push_notification {
            true => self.params.tree()?.get("configuration").cloned(),
            false => None,
        };
        if let Some(configuration) = &configuration {
            let continued = message.get().task_id.clone();
            let push = super::push::send_config(
                self.state,
                self.version,
                self.principal,
                configuration,
                continued.as_deref(),
            )
            .await?;
            message = message.with_push_configs(push);
        }
        let options = SendOptions {
            return_immediately: request.return_immediately,
            history_length: to_usize(request.history_length),
        };
        let ids = message.get();
        Self::record_task(ids.task_id.as_deref());
        Ok((message, options))
    }

    async fn send_message(&self) -> RpcResult<JsonText> {
        let (message, options) = self.decode_send().await?;
        let engine = &self.state.engine;
        let result = if options.return_immediately {
            let hub = engine.send(self.principal, message).await;
            Arc::new(SendResult::Task(
                hub.map_err(|e| self.engine_error(e))?.snapshot(),
            ))
        } else {
            let result = engine.send_blocking(self.principal, message).await;
            result.map_err(|e| self.engine_error(e))?
        };
        if let SendResult::Task(task) = &*result {
            Self::record_task(Some(&task.id));
        }
        let view = TaskView {
            history_length: options.history_length,
            artifacts: true,
        };
        Ok(codec::encode_send_result(self.version, &result, view))
    }

    async fn send_streaming(&self) -> RpcResult<sse::EventStream> {
        let (message, _) = self.decode_send().await?;
        let (hub, subscription) = self
            .state
            .engine
            .send_streaming(self.principal, message)
            .await
            .map_err(|e| self.engine_error(e))?;
        Self::record_task(Some(&hub.task_id));
        Ok(sse::EventStream::new(
            subscription,
            self.state.config.streaming.subscriber_buffer,
        ))
    }

    fn task_id(&self) -> RpcResult<String> {
        let TaskIdParams { id } = self.decode()?;
        Self::record_task(Some(&id));
        Ok(id)
    }

    async fn get_task(&self) -> RpcResult<Value> {
        let GetTaskParams { id, history_length } = self.decode()?;
        Self::record_task(Some(&id));
        let history_length = to_usize(history_length);
        let task = self
            .state
            .engine
            .get_task(self.principal, &id)
            .await
            .map_err(|e| self.engine_error(e))?;
        Ok(codec::encode_task(
            self.version,
            &task,
            TaskView {
                history_length,
                artifacts: true,
            },
        ))
    }

    async fn cancel_task(&self) -> RpcResult<Value> {
        let id = self.task_id()?;
        let task = self
            .state
            .engine
            .cancel(self.principal, &id)
            .await
            .map_err(|e| self.engine_error(e))?;
        Ok(codec::encode_task(self.version, &task, TaskView::FULL))
    }

    async fn subscribe(&self) -> RpcResult<sse::EventStream> {
        let SubscribeParams {
            id,
            last_event_id,
            turn_only,
        } = self.decode()?;
        Self::record_task(Some(&id));
        let after =
            match last_event_id.as_deref().map(str::trim) {
                None | Some("") => None,
                Some(text) => Some(text.parse::<EventId>().map_err(|e| {
                    RpcError::InvalidParams(format!("lastEventId: {text:?} is {e}"))
                })?),
            };
        let scope = if turn_only { Scope::Turn } else { Scope::Task };
        let subscription = self
            .state
            .engine
            .subscribe(self.principal, &id, after, scope)
            .await
            .map_err(|e| self.engine_error(e))?;
        Ok(sse::EventStream::new(
            subscription,
            self.state.config.streaming.subscriber_buffer,
        ))
    }

    fn page_size(size: Option<u64>, default: u64, max: u64) -> RpcResult<usize> {
        let size = size.unwrap_or(default);
        if size == 0 || size > max {
            return Err(RpcError::InvalidParams(format!(
                "pageSize: must be 1 to {max}"
            )));
        }
        Ok(size as usize)
    }

    async fn list_tasks(&self) -> RpcResult<Value> {
        let params: ListTasksParams = self.decode()?;
        let state = params.state(self.version)?;
        let page_size = Self::page_size(params.page_size, DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE)?;
        let history_length = to_usize(params.history_length);
        let include_artifacts = params.include_artifacts.unwrap_or(false);
        let view = TaskView {
            history_length,
            artifacts: include_artifacts,
        };
        let query = TaskQuery {
            context_id: params.context_id,
            state,
            status_after: params.status_timestamp_after,
            page_size,
            page_token: params.page_token,
            view,
            max_bytes: usize::MAX,
        };
        let page = self
            .state
            .engine
            .list_tasks(self.principal, query)
            .await
            .map_err(|e| self.engine_error(e))?;
        let tasks: Vec<Value> = page
            .items
            .iter()
            .map(|task| codec::encode_task(self.version, task, view))
            .collect();
        Ok(json!({
            "tasks": tasks,
            "nextPageToken": page.next_page_token,
            "pageSize": page_size,
            "totalSize": page.total_size,
        }))
    }

    async fn list_conversations(&self) -> RpcResult<Value> {
        let params: ListConversationsParams = self.decode()?;
        let page_size = Self::page_size(params.page_size, DEFAULT_PAGE_SIZE, 1000)?;
        let token = params.page_token;
        let page = self
            .state
            .engine
            .list_conversations(self.principal, page_size, token)
            .await
            .map_err(|e| self.engine_error(e))?;
        let conversations: Vec<Value> = page
            .items
            .iter()
            .map(|meta| {
                json!({
                    "contextId": meta.context_id,
                    "turns": meta.turns,
                    "createdAt": format_time(&meta.created_at),
                    "updatedAt": format_time(&meta.updated_at),
                })
            })
            .collect();
        Ok(json!({
            "conversations": conversations,
            "nextPageToken": page.next_page_token,
            "totalSize": page.total_size,
        }))
    }

    async fn get_conversation(&self) -> RpcResult<Value> {
        let params: GetConversationParams = self.decode()?;
        let context_id = params.context_id.as_str();
        let history_length = to_usize(params.history_length).unwrap_or(crate::history::MAX_LIMIT);
        let page = self
            .state
            .engine
            .conversation(
                self.principal,
                context_id,
                history_length,
                params.page_token,
            )
            .await
            .map_err(|e| self.engine_error(e))?
            .ok_or_else(|| RpcError::ConversationNotFound(context_id.to_owned()))?;
        let messages: Vec<Value> = page
            .messages
            .iter()
            .map(|m| codec::encode_message(self.version, m))
            .collect();
        let meta = &page.meta;
        Ok(json!({
            "contextId": meta.context_id,
            "turns": meta.turns,
            "createdAt": format_time(&meta.created_at),
            "updatedAt": format_time(&meta.updated_at),
            "messages": messages,
            "nextPageToken": page.next_page_token,
        }))
    }

    async fn delete_conversation(&self) -> RpcResult<Value> {
        let ContextParams { context_id } = self.decode()?;
        let context_id = context_id.as_str();
        let deleted = self
            .state
            .engine
            .delete_conversation(self.principal, context_id)
            .await
            .map_err(|e| self.engine_error(e))?;
        if !deleted {
            return Err(RpcError::ConversationNotFound(context_id.to_owned()));
        }
        Ok(json!({ "contextId": context_id, "deleted": true }))
    }
}
