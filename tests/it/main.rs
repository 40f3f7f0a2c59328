//! The integration tests: one binary (one link of the library and its dependencies, not one
//! per file), a module per suite. Run one suite with `cargo test --test it crash::`.

mod common;

mod agent_a2a;
mod agent_exec;
mod agent_openai;
mod auth;
mod card;
mod card_signing;
mod cli_store;
mod cluster;
mod cluster_metrics;
mod config_doc;
mod config_env;
mod console;
mod container;
mod crash;
mod engine;
mod failover;
mod grpc;
mod http_api;
mod identity;
mod interop;
mod layering;
mod loadgen;
mod malformed;
mod metrics;
mod overload;
mod pg_turn;
mod props_codec;
mod props_history;
mod props_namespace;
mod protojson;
mod push;
mod push_store;
mod rest;
mod resume;
mod send_cli;
mod shutdown;
mod store;
mod store_conformance;
mod streaming;
mod traces;
mod transfer;
