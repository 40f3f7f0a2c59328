//! What colloquy tells its operators besides its answers: Prometheus metrics (`prometheus`),
//! logs and OTLP traces (`traces`), and the W3C trace context carried on every call in and
//! out (`propagation`).

mod prometheus;
pub mod propagation;
pub mod traces;

pub use prometheus::*;
