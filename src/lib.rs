//! colloquy: an A2A conversation engine.
//!
//! A caller tags each message with a `contextId`; colloquy loads that conversation's history,
//! shows the agent the whole thread behind a guard marker, runs one task at a time per
//! conversation, and keeps conversations strictly apart.
//!
//! Layout: [`model`] the internal types; [`json`] JSON text of them; [`store`] persistence;
//! [`history`] guarded rendering; [`agent`] backends; [`engine`] the actors; [`protocol`] the two
//! wire versions; [`http`] the JSON-RPC front; [`app`] the composition root that builds and wires
//! them; [`telemetry`] the metrics recorder; [`cli`] the commands; [`config`] layered
//! configuration; [`error`] what every layer's errors share (causes, and rendering them for
//! logs).
//!
//! Dependencies point one way: `protocol` is a pure wire library (model and json only), `store`
//! knows neither engine nor HTTP, nothing below `http` knows `http` (`tests/it/layering.rs` checks).

pub mod agent;
pub mod app;
pub mod cli;
pub mod client;
pub mod config;
pub mod container;
pub mod durable;
pub mod engine;
pub mod error;
pub mod history;
pub mod http;
pub mod json;
pub mod model;
pub mod protocol;
pub mod push;
pub mod store;
pub mod telemetry;
