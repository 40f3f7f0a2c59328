//! Readiness: whether the store takes a durable write. Probed at most once per
//! [`PROBE_INTERVAL`], whoever asks and however often: a health check must not cost a write (and a
//! device flush) per request, or anyone who can reach `/readyz` slows every turn.

use super::{EngineError, EngineResult};
use crate::store::SharedStore;
use std::time::{Duration, Instant};

pub const PROBE_INTERVAL: Duration = Duration::from_secs(1);

#[derive(Default)]
pub struct Readiness {
    /// The last probe's time and outcome. Callers that arrive while a probe runs wait for it
    /// and share its outcome.
    last: tokio::sync::Mutex<Option<(Instant, EngineResult<()>)>>,
}

impl Readiness {
    pub async fn check(&self, store: &SharedStore) -> EngineResult<()> {
        let mut last = self.last.lock().await;
        if let Some((at, outcome)) = last.as_ref()
            && at.elapsed() < PROBE_INTERVAL
        {
            return outcome.clone();
        }
        let outcome = store.probe().await.map_err(EngineError::from);
        *last = Some((Instant::now(), outcome.clone()));
        outcome
    }
}
