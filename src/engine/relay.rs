//! Streams of a turn another node runs. On several nodes a task's turns may run anywhere; a
//! subscription stays with the node it was made on, which takes each turn's events from the
//! node that runs it (through the [`Relay`] the composition root installs) and follows the task
//! from turn to turn itself (`follow`).

use super::hub::Subscription;
use super::resume::EventId;
use futures_util::future::BoxFuture;

/// Opens, on the node whose lease runs a task's turn, a stream of that turn's events: right
/// after `after`, or the task so far then the live events. The stream ends with the turn (the
/// relayed subscription does not follow the task: the subscribing node does). `None` when no
/// other node runs the task or that node does not answer. Implemented where nodes talk to each
/// other (`http::forward`).
pub trait Relay: Send + Sync {
    fn subscribe(
        &self,
        principal: &str,
        task_id: &str,
        after: Option<EventId>,
    ) -> BoxFuture<'static, Option<Subscription>>;
}
