//! What colloquy tells its operators besides its answers: Prometheus metrics (`prometheus`,
//! and the handles of the series a turn updates, registered once: `handles`),
//! logs and OTLP traces (`traces`), and the W3C trace context carried on every call in and
//! out (`propagation`).

mod handles;
mod prometheus;
pub mod propagation;
pub mod traces;

pub use handles::Handles;
pub(crate) use handles::kept;
pub use prometheus::*;
