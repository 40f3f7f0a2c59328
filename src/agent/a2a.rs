//! The `a2a` backend: each turn is delegated to another A2A agent.
//!
//! Each colloquy conversation maps to one upstream contextId, kept in the conversation's agent
//! state ([`AgentEvent::State`]) so a restart keeps it. Only the current message is forwarded: the
//! peer keeps its own history. The peer's stream is relayed chunk by chunk; its errors fail the
//! task with the peer's message; its `input-required` is passed through, and the answer goes back
//! to the same upstream task. Anti-loop: at most `max_turns` delegated turns per conversation.

use super::{Agent, AgentError, AgentEvent, AgentRequest, AgentSink};
use crate::client::{self, ClientError, ClientOptions, Peer, TaskAssembler};
use crate::model::{Message, SendResult, StreamItem, Task, TaskState};
use futures_util::future::BoxFuture;
use futures_util::{FutureExt, StreamExt};
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use tokio::sync::Mutex;

/// What the backend keeps per conversation.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct DelegationState {
    /// The peer's contextId for this conversation.
    pub upstream_context_id: Option<String>,
    /// Turns delegated so far (the anti-loop count).
    pub delegated_turns: u64,
    /// The upstream task waiting for input, and the colloquy task that relayed its question.
    pub upstream_task_id: Option<String>,
    pub waiting_task_id: Option<String>,
}

pub struct A2aAgent {
    inner: Arc<Inner>,
}

struct Inner {
    url: String,
    options: ClientOptions,
    max_turns: u64,
    peer: Mutex<Option<Peer>>,
}

impl A2aAgent {
    pub fn new(url: impl Into<String>, token: Option<String>, max_turns: u64) -> A2aAgent {
        let options = ClientOptions {
            token,
            ..ClientOptions::default()
        };
        A2aAgent::with_options(url, options, max_turns)
    }

    /// A peer reached with `options` (its token, the key set its card must be signed by).
    pub fn with_options(
        url: impl Into<String>,
        options: ClientOptions,
        max_turns: u64,
    ) -> A2aAgent {
        A2aAgent {
            inner: Arc::new(Inner {
                url: url.into(),
                options,
                max_turns,
                peer: Mutex::new(None),
            }),
        }
    }
}

/// Talking to the peer failed.
#[derive(Debug, thiserror::Error)]
#[error("delegating to the peer agent: {0}")]
struct Delegation(#[source] ClientError);

#[derive(Debug, thiserror::Error)]
#[error("encoding the delegation state: {0}")]
struct EncodeState(#[source] serde_json::Error);

fn peer_error(url: &str, e: ClientError) -> AgentError {
    match e {
        ClientError::Rpc { message, code, .. } => AgentError::Failed(format!(
            "the peer agent at {url} answered error {code}: {message}"
        )),
        other => AgentError::Backend(Box::new(Delegation(other))),
    }
}

impl Inner {
    /// The peer, its card read once and kept until a call fails at the transport level.
    async fn peer(&self) -> Result<Peer, ClientError> {
        let mut cached = self.peer.lock().await;
        if let Some(peer) = cached.as_ref() {
            return Ok(peer.clone());
        }
        let peer = client::connect(&self.url, self.options.clone()).await?;
        *cached = Some(peer.clone());
        Ok(peer)
    }

    async fn forget_peer(&self, e: &ClientError) {
        if !matches!(e, ClientError::Rpc { .. }) {
            *self.peer.lock().await = None;
        }
    }

    async fn run(
        self: Arc<Self>,
        request: AgentRequest,
        sink: AgentSink,
    ) -> Result<(), AgentError> {
        let mut state: DelegationState = request
            .state
            .clone()
            .and_then(|v| serde_json::from_value(v).ok())
            .unwrap_or_default();
        if state.delegated_turns >= self.max_turns {
            return sink
                .send(AgentEvent::Status {
                    state: TaskState::Rejected,
                    text: Some(format!(
                        "delegation limit reached: this conversation has already been delegated {} \
                         turns to the peer agent (agent.max_turns_per_context = {}); start a new conversation",
                        state.delegated_turns, self.max_turns
                    )),
                })
                .await;
        }
        state.delegated_turns += 1;
        // Answer the upstream task only when this message answers the task that relayed its question.
        let upstream_task = match (&state.waiting_task_id, &request.message.task_id) {
            (Some(waiting), Some(ours)) if waiting == ours => state.upstream_task_id.clone(),
            _ => None,
        };
        state.upstream_task_id = None;
        state.waiting_task_id = None;
        emit_state(&sink, &state).await?;

        let message = Message {
            message_id: uuid::Uuid::new_v4().to_string(),
            role: crate::model::Role::User,
            parts: request.message.parts.clone(),
            context_id: state.upstream_context_id.clone(),
            task_id: upstream_task,
            reference_task_ids: Vec::new(),
            metadata: None,
            extensions: Vec::new(),
            timestamp: None,
        };
        let peer = match self.peer().await {
            Ok(peer) => peer,
            Err(e) => {
                self.forget_peer(&e).await;
                return Err(peer_error(&self.url, e));
            }
        };
        let outcome = self.exchange(&peer, &message, &mut state, &sink).await;
        let assembled = match outcome {
            Ok(assembled) => assembled,
            Err(Failure::Peer(e)) => {
                self.forget_peer(&e).await;
                return Err(peer_error(&self.url, e));
            }
            Err(Failure::Sink(e)) => return Err(e),
        };
        let Some(task) = assembled.task else {
            // A plain message answer (its text was relayed) or nothing at all.
            return Ok(());
        };
        self.finish(task, &request, &mut state, &sink).await
    }

    /// Sends the message (streaming when the peer can) and relays the reply text as it comes.
    async fn exchange(
        &self,
        peer: &Peer,
        message: &Message,
        state: &mut DelegationState,
        sink: &AgentSink,
    ) -> Result<TaskAssembler, Failure> {
        let mut assembler = TaskAssembler::default();
        if peer.streaming {
            let mut stream = peer.stream(message).await.map_err(Failure::Peer)?;
            while let Some(item) = stream.next().await {
                let item = item.map_err(Failure::Peer)?;
                learn_context(&item, state, sink).await?;
                let text = assembler.apply(item);
                if !text.is_empty() {
                    sink.text(text).await.map_err(Failure::Sink)?;
                }
            }
            // A stream that closed early: fetch the task so the reply is never cut.
            if let (false, Some(task)) = (assembler.finished, assembler.task.as_ref()) {
                let full = peer.get_task(&task.id).await.map_err(Failure::Peer)?;
                let full_text = client::task_text(&full);
                if let Some(rest) = full_text.strip_prefix(&assembler.streamed_text)
                    && !rest.is_empty()
                {
                    sink.text(rest).await.map_err(Failure::Sink)?;
                }
                assembler.task = Some(full);
            }
        } else {
            let result = peer.send(message).await.map_err(Failure::Peer)?;
            let item = match result.clone() {
                SendResult::Task(task) => StreamItem::Task(task),
                SendResult::Message(message) => StreamItem::Message(message),
            };
            learn_context(&item, state, sink).await?;
            let text = client::reply_text(&result);
            assembler.apply(item);
            if !text.is_empty() {
                sink.text(text).await.map_err(Failure::Sink)?;
            }
        }
        Ok(assembler)
    }

    async fn finish(
        &self,
        task: Task,
        request: &AgentRequest,
        state: &mut DelegationState,
        sink: &AgentSink,
    ) -> Result<(), AgentError> {
        let peer_text = client::status_text(&task);
        match task.status.state {
            TaskState::Completed => Ok(()),
            TaskState::InputRequired | TaskState::AuthRequired => {
                state.upstream_task_id = Some(task.id.clone());
                state.waiting_task_id = Some(request.task_id.clone());
                emit_state(sink, state).await?;
                sink.send(AgentEvent::Status {
                    state: task.status.state,
                    text: peer_text,
                })
                .await
            }
            TaskState::Rejected | TaskState::Canceled => {
                sink.send(AgentEvent::Status {
                    state: task.status.state,
                    text: Some(format!(
                        "the peer agent {} the task{}",
                        task.status.state.as_str(),
                        peer_text.map(|t| format!(": {t}")).unwrap_or_default()
                    )),
                })
                .await
            }
            TaskState::Failed => Err(AgentError::Failed(format!(
                "the peer agent's task failed: {}",
                peer_text.unwrap_or_else(|| "(no message)".into())
            ))),
            state @ (TaskState::Submitted | TaskState::Working) => {
                Err(AgentError::Failed(format!(
                    "the peer agent stopped answering while its task was {}",
                    state.as_str()
                )))
            }
        }
    }
}

enum Failure {
    Peer(ClientError),
    Sink(AgentError),
}

async fn emit_state(sink: &AgentSink, state: &DelegationState) -> Result<(), AgentError> {
    let value =
        serde_json::to_value(state).map_err(|e| AgentError::Backend(Box::new(EncodeState(e))))?;
    sink.send(AgentEvent::State(value)).await
}

/// Records the peer's contextId the first time it shows up (or if the peer changed it).
async fn learn_context(
    item: &StreamItem,
    state: &mut DelegationState,
    sink: &AgentSink,
) -> Result<(), Failure> {
    let context = match item {
        StreamItem::Task(task) => Some(task.context_id.as_str()),
        StreamItem::Message(message) => message.context_id.as_deref(),
        StreamItem::Event(crate::model::TaskEvent::Status { context_id, .. })
        | StreamItem::Event(crate::model::TaskEvent::Artifact { context_id, .. }) => {
            Some(context_id.as_str())
        }
    };
    if let Some(context) = context
        && state.upstream_context_id.as_deref() != Some(context)
    {
        state.upstream_context_id = Some(context.to_owned());
        emit_state(sink, state).await.map_err(Failure::Sink)?;
    }
    Ok(())
}

impl Agent for A2aAgent {
    fn kind(&self) -> &'static str {
        "a2a"
    }

    fn description(&self) -> String {
        format!(
            "Delegates each turn to the A2A agent at {}, carrying the conversation on under that agent's own contextId.",
            self.inner.url
        )
    }

    fn run(
        &self,
        request: AgentRequest,
        sink: AgentSink,
    ) -> BoxFuture<'static, Result<(), AgentError>> {
        self.inner.clone().run(request, sink).boxed()
    }
}
