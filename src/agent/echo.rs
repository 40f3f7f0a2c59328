//! The built-in echo backend: deterministic, and its reply proves it saw the history.

use super::{Agent, AgentError, AgentRequest, AgentSink};
use crate::model::Role;
use futures_util::FutureExt;
use futures_util::future::BoxFuture;
use std::time::Duration;

#[derive(Debug, Clone, Default)]
pub struct EchoAgent {
    /// Characters per streamed chunk; 0 sends the whole reply as one chunk.
    pub chunk_chars: usize,
    /// A pause before each chunk, so tests and load runs can hold a context busy.
    pub delay: Duration,
}

impl EchoAgent {
    pub fn new(chunk_chars: usize, delay: Duration) -> Self {
        EchoAgent { chunk_chars, delay }
    }

    /// `echo: <text> (turn N; previously: "<last user text>")`, or `(turn N)` with no earlier user message.
    pub fn reply(request: &AgentRequest) -> String {
        let text = request.message.text();
        let previous = request
            .history
            .iter()
            .rev()
            .find(|entry| entry.role == Role::User);
        // Written into a string sized for it: `format!` grew it three times for a 200-byte
        // message, a tenth of the conversation actor's work in a turn.
        let previous_len = previous.map_or(0, |entry| entry.text.len());
        let mut reply = String::with_capacity(text.len() + previous_len + 64);
        reply.push_str("echo: ");
        reply.push_str(&text);
        reply.push_str(" (turn ");
        reply.push_str(&request.turn.to_string());
        if let Some(previous) = previous {
            reply.push_str("; previously: \"");
            reply.push_str(&previous.text);
            reply.push('"');
        }
        reply.push(')');
        reply
    }
}

fn chunks(text: &str, chunk_chars: usize) -> Vec<&str> {
    if chunk_chars == 0 || text.is_empty() {
        return vec![text];
    }
    let mut out = Vec::new();
    let mut start = 0;
    for (count, (at, _)) in text.char_indices().enumerate() {
        if count > 0 && count % chunk_chars == 0 {
            out.push(&text[start..at]);
            start = at;
        }
    }
    out.push(&text[start..]);
    out
}

impl Agent for EchoAgent {
    fn kind(&self) -> &'static str {
        "echo"
    }

    fn description(&self) -> String {
        "Echoes each message with its turn number and the previous user message, \
         showing that it sees the whole conversation."
            .into()
    }

    fn run(
        &self,
        request: AgentRequest,
        sink: AgentSink,
    ) -> BoxFuture<'static, Result<(), AgentError>> {
        let chunk_chars = self.chunk_chars;
        let delay = self.delay;
        async move {
            let reply = EchoAgent::reply(&request);
            for chunk in chunks(&reply, chunk_chars) {
                if !delay.is_zero() {
                    tokio::time::sleep(delay).await;
                }
                sink.text(chunk).await?;
            }
            Ok(())
        }
        .boxed()
    }
}

#[cfg(test)]
mod tests {
    use super::{EchoAgent, chunks};
    use crate::agent::AgentRequest;
    use crate::history::HistoryEntry;
    use crate::model::{Message, Role};
    use std::sync::Arc;

    fn message(role: Role, text: &str) -> Message {
        Message {
            role,
            ..Message::agent_text(text, "ctx", None)
        }
    }

    #[test]
    fn the_reply_names_the_turn_and_the_previous_user_text() {
        let mut request = AgentRequest {
            context_id: "ctx".into(),
            task_id: "task".into(),
            message: message(Role::User, "second"),
            history: Arc::default(),
            prompt: String::new(),
            turn: 2,
            state: None,
        };
        assert_eq!(EchoAgent::reply(&request), "echo: second (turn 2)");
        let earlier = [
            message(Role::User, "first"),
            message(Role::Agent, "echo: first (turn 1)"),
            message(Role::User, "between"),
            message(Role::Agent, "an agent's reply"),
        ];
        request.history = Arc::new(earlier.iter().map(HistoryEntry::from).collect());
        assert_eq!(
            EchoAgent::reply(&request),
            "echo: second (turn 2; previously: \"between\")"
        );
    }

    #[test]
    fn chunks_split_on_characters() {
        assert_eq!(chunks("héllo", 2), vec!["hé", "ll", "o"]);
        assert_eq!(chunks("héllo", 0), vec!["héllo"]);
        assert_eq!(chunks("ab", 5), vec!["ab"]);
    }
}
