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
        match previous {
            Some(previous) => format!(
                "echo: {text} (turn {}; previously: \"{}\")",
                request.turn, previous.text
            ),
            None => format!("echo: {text} (turn {})", request.turn),
        }
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
    use super::chunks;

    #[test]
    fn chunks_split_on_characters() {
        assert_eq!(chunks("héllo", 2), vec!["hé", "ll", "o"]);
        assert_eq!(chunks("héllo", 0), vec!["héllo"]);
        assert_eq!(chunks("ab", 5), vec!["ab"]);
    }
}
