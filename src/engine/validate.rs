//! The one place a message from a caller is checked. What passes is a [`ValidMessage`]: later
//! code trusts its shape, sizes and ids without checking again.

use super::error::{EngineError, EngineResult};
use crate::model::{Message, PartContent, PushConfig, Role};

/// What a message may hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MessageLimits {
    pub parts: usize,
    /// Text across all its parts.
    pub text_bytes: usize,
    /// Each of `contextId`, `taskId` and `messageId`.
    pub id_bytes: usize,
}

impl Default for MessageLimits {
    fn default() -> Self {
        MessageLimits {
            parts: 64,
            text_bytes: 256 * 1024,
            id_bytes: 256,
        }
    }
}

/// A caller's message that passed [`ValidMessage::check`].
#[derive(Debug, Clone)]
pub struct ValidMessage(Message, Vec<PushConfig>);

impl ValidMessage {
    /// Checks sizes, ids, role and parts, in that order, naming the first field at fault.
    pub fn check(message: Message, limits: &MessageLimits) -> EngineResult<Self> {
        let invalid = |why: String| Err(EngineError::InvalidParams(why));
        check_sizes(&message, limits, limits.text_bytes)?;
        if message.role != Role::User {
            return invalid(
                "message.role: a message sent to the agent must have the user role".into(),
            );
        }
        if message.parts.is_empty() {
            return invalid("message.parts: must not be empty".into());
        }
        Ok(ValidMessage(message, Vec::new()))
    }

    pub fn get(&self) -> &Message {
        &self.0
    }

    pub fn into_inner(self) -> Message {
        self.0
    }

    /// Push-notification configs the send registers for the task it starts, stored with it.
    pub fn with_push_configs(mut self, configs: Vec<PushConfig>) -> Self {
        self.1 = configs;
        self
    }

    pub fn into_parts(self) -> (Message, Vec<PushConfig>) {
        (self.0, self.1)
    }
}

/// The limits every stored message keeps, whoever wrote it (a caller, or `colloquy import`): at
/// most `limits.parts` parts and `text_bytes` of text (the caller's limit for a caller's message,
/// `limits.response_bytes` for an agent's reply), ids of 1 to `limits.id_bytes` bytes.
pub fn check_sizes(
    message: &Message,
    limits: &MessageLimits,
    text_bytes: usize,
) -> EngineResult<()> {
    let invalid = |why: String| Err(EngineError::InvalidParams(why));
    if message.parts.len() > limits.parts {
        return invalid(format!(
            "message.parts: {} parts, more than the limit of {}",
            message.parts.len(),
            limits.parts
        ));
    }
    let text: usize = message
        .parts
        .iter()
        .map(|p| match &p.content {
            PartContent::Text { text } => text.len(),
            _ => 0,
        })
        .sum();
    if text > text_bytes {
        return invalid(format!(
            "message.parts: {text} bytes of text, more than the limit of {text_bytes}"
        ));
    }
    for (name, id) in [
        ("messageId", Some(&message.message_id)),
        ("taskId", message.task_id.as_ref()),
    ] {
        if id.is_some_and(|id| id.is_empty() || id.len() > limits.id_bytes) {
            return invalid(format!(
                "message.{name}: must be 1 to {} bytes",
                limits.id_bytes
            ));
        }
    }
    match &message.context_id {
        Some(context_id) => check_context_id(context_id, limits),
        None => Ok(()),
    }
}

/// A contextId is 1 to `limits.id_bytes` bytes.
pub fn check_context_id(context_id: &str, limits: &MessageLimits) -> EngineResult<()> {
    if context_id.is_empty() {
        return Err(EngineError::InvalidParams(
            "contextId: must not be empty".into(),
        ));
    }
    if context_id.len() > limits.id_bytes {
        return Err(EngineError::InvalidParams(format!(
            "contextId: {} bytes, more than the limit of {}",
            context_id.len(),
            limits.id_bytes
        )));
    }
    Ok(())
}
