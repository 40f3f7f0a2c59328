//! Metric handles registered once instead of on every update.
//!
//! A `counter!`, `gauge!` or `histogram!` call finds its series in the recorder's registry,
//! hashing its name and labels, each time it runs: a blocking turn updates about fourteen
//! series, about 3.8k of its instructions under callgrind (2026-12-06). A [`Handles`] keeps
//! each label set's handle after its first registration.
//!
//! Nothing is kept until a recorder is installed ([`super::recorder`]): a handle registered
//! before then is a no-op for good, so until then every update registers afresh (and updates
//! nothing, as there is nothing to update).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, PoisonError};

static INSTALLED: AtomicBool = AtomicBool::new(false);

/// A recorder is installed for the process: handles registered from now on are kept.
pub(super) fn recorder_installed() {
    INSTALLED.store(true, Ordering::Release);
}

/// The handles of one metric, by label set (`()` for a metric without labels). Label sets
/// are few (a method, an outcome, a state), so they are searched in a list.
pub struct Handles<K, T> {
    kept: Mutex<Vec<(K, T)>>,
}

impl<K: Copy + PartialEq, T: Clone> Handles<K, T> {
    pub const fn new() -> Self {
        Handles {
            kept: Mutex::new(Vec::new()),
        }
    }

    /// The handle for `labels`, made by `register` the first time.
    pub fn get(&self, labels: K, register: impl FnOnce() -> T) -> T {
        if !INSTALLED.load(Ordering::Acquire) {
            return register();
        }
        let mut kept = self.kept.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((_, handle)) = kept.iter().find(|(kept, _)| *kept == labels) {
            return handle.clone();
        }
        let handle = register();
        kept.push((labels, handle.clone()));
        handle
    }
}

/// The kept handle of a series without labels, one per call site:
/// `kept!(counter, "colloquy_store_writes_total").increment(1)`.
macro_rules! kept {
    (counter, $name:literal) => {
        $crate::telemetry::kept!(@metrics::Counter, metrics::counter!($name))
    };
    (gauge, $name:literal) => {
        $crate::telemetry::kept!(@metrics::Gauge, metrics::gauge!($name))
    };
    (histogram, $name:literal) => {
        $crate::telemetry::kept!(@metrics::Histogram, metrics::histogram!($name))
    };
    (@$handle:ty, $register:expr) => {{
        static HANDLE: $crate::telemetry::Handles<(), $handle> = $crate::telemetry::Handles::new();
        HANDLE.get((), || $register)
    }};
}
pub(crate) use kept;

impl<K: Copy + PartialEq, T: Clone> Default for Handles<K, T> {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    #[test]
    fn each_label_set_is_registered_once_the_recorder_is_installed() {
        drop(super::super::recorder());
        let handles: Handles<&str, usize> = Handles::new();
        let registered = AtomicUsize::new(0);
        let register = || registered.fetch_add(1, Ordering::Relaxed);
        let first = handles.get("a", register);
        assert_eq!(handles.get("a", register), first);
        assert_ne!(handles.get("b", register), first);
        handles.get("b", register);
        assert_eq!(registered.load(Ordering::Relaxed), 2);
    }
}
