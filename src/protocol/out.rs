//! The shapes colloquy answers in that both wire versions share: `Message`, `TaskStatus`,
//! `Artifact` and `Task`. The versions differ in them only by their parts (each version's own
//! `PartOut`), by the names of roles and states, and by v0.3's `kind` member; a version's part
//! shape says which version it is ([`PartShape`]), and the rest follows from that.

use super::WireVersion;
use super::codec;
use crate::model::{Artifact, Message, Metadata, Part, Task, TaskStatus, TaskView, format_time};
use serde::Serialize;

/// A version's `Part` as it answers it.
pub(super) trait PartShape<'a>: Serialize + From<&'a Part> {
    /// The version these parts belong to.
    const VERSION: WireVersion;
}

/// v0.3's `kind` member (`"message"`, `"task"`); v1.0 has none.
fn kind<'a, P: PartShape<'a>>(name: &'static str) -> Option<&'static str> {
    (P::VERSION == WireVersion::V03).then_some(name)
}

fn parts<'a, P: PartShape<'a>>(parts: &'a [Part]) -> Vec<P> {
    parts.iter().map(P::from).collect()
}

/// `Message`.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct MessageOut<'a, P> {
    /// First, where a tag of serde's would stand.
    #[serde(skip_serializing_if = "Option::is_none")]
    kind: Option<&'static str>,
    message_id: &'a str,
    role: &'static str,
    parts: Vec<P>,
    #[serde(skip_serializing_if = "Option::is_none")]
    context_id: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    task_id: Option<&'a str>,
    #[serde(skip_serializing_if = "<[String]>::is_empty")]
    reference_task_ids: &'a [String],
    #[serde(skip_serializing_if = "<[String]>::is_empty")]
    extensions: &'a [String],
    #[serde(skip_serializing_if = "Option::is_none")]
    metadata: Option<&'a Metadata>,
}

impl<'a, P: PartShape<'a>> From<&'a Message> for MessageOut<'a, P> {
    fn from(message: &'a Message) -> Self {
        MessageOut {
            kind: kind::<P>("message"),
            message_id: &message.message_id,
            role: codec::role_name(P::VERSION, message.role),
            parts: parts(&message.parts),
            context_id: message.context_id.as_deref(),
            task_id: message.task_id.as_deref(),
            reference_task_ids: &message.reference_task_ids,
            extensions: &message.extensions,
            metadata: message.metadata.as_ref(),
        }
    }
}

/// `TaskStatus`.
#[derive(Serialize)]
pub(super) struct StatusOut<'a, P> {
    state: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    message: Option<MessageOut<'a, P>>,
    timestamp: String,
}

impl<'a, P: PartShape<'a>> From<&'a TaskStatus> for StatusOut<'a, P> {
    fn from(status: &'a TaskStatus) -> Self {
        StatusOut {
            state: codec::state_name(P::VERSION, status.state),
            message: status.message.as_ref().map(MessageOut::from),
            timestamp: format_time(&status.timestamp),
        }
    }
}

/// `Artifact`.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct ArtifactOut<'a, P> {
    artifact_id: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    name: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    description: Option<&'a str>,
    parts: Vec<P>,
    #[serde(skip_serializing_if = "Option::is_none")]
    metadata: Option<&'a Metadata>,
}

impl<'a, P: PartShape<'a>> From<&'a Artifact> for ArtifactOut<'a, P> {
    fn from(artifact: &'a Artifact) -> Self {
        ArtifactOut {
            artifact_id: &artifact.artifact_id,
            name: artifact.name.as_deref(),
            description: artifact.description.as_deref(),
            parts: parts(&artifact.parts),
            metadata: artifact.metadata.as_ref(),
        }
    }
}

/// `Task`, with what `view` asks for.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct TaskOut<'a, P> {
    /// First, where a tag of serde's would stand.
    #[serde(skip_serializing_if = "Option::is_none")]
    kind: Option<&'static str>,
    id: &'a str,
    context_id: &'a str,
    status: StatusOut<'a, P>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    artifacts: Vec<ArtifactOut<'a, P>>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    history: Vec<MessageOut<'a, P>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    metadata: Option<&'a Metadata>,
}

impl<'a, P: PartShape<'a>> TaskOut<'a, P> {
    pub(super) fn new(task: &'a Task, view: TaskView) -> Self {
        let artifacts = match view.artifacts {
            true => task.artifacts.iter().map(ArtifactOut::from).collect(),
            false => Vec::new(),
        };
        TaskOut {
            kind: kind::<P>("task"),
            id: &task.id,
            context_id: &task.context_id,
            status: StatusOut::from(&task.status),
            artifacts,
            history: codec::history_view(task, view)
                .iter()
                .map(MessageOut::from)
                .collect(),
            metadata: task.metadata.as_ref(),
        }
    }
}
