//! Dependencies point one way: reads the sources and fails on an import against the layering
//! (`crate::x` paths, including `crate::{x, ..}` groups).
//!
//! model, history < store < engine < http < app; protocol is a pure wire library over the model;
//! config is plain settings; agents and the client know neither engine nor HTTP.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// Every `.rs` file at `relative` under `src/` (a file, or a folder walked recursively).
fn rust_files(relative: &str) -> Vec<PathBuf> {
    let mut pending = vec![src().join(relative)];
    let mut files = Vec::new();
    while let Some(path) = pending.pop() {
        if path.is_dir() {
            let entries = std::fs::read_dir(&path)
                .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
            pending.extend(entries.map(|entry| entry.expect("a directory entry").path()));
        } else if path.extension().is_some_and(|ext| ext == "rs") {
            files.push(path);
        }
    }
    assert!(!files.is_empty(), "no Rust sources at src/{relative}");
    files
}

/// The top-level modules a source names through `crate::`.
fn crate_modules(source: &str) -> BTreeSet<String> {
    let ident = |s: &str| -> String {
        s.chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect()
    };
    let mut modules = BTreeSet::new();
    for (at, _) in source.match_indices("crate::") {
        let rest = &source[at + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let group = &group[..group.find('}').unwrap_or(group.len())];
            modules.extend(group.split(',').map(|item| ident(item.trim())));
        } else {
            modules.insert(ident(rest));
        }
    }
    modules.remove("");
    modules
}

/// Fails listing every file under `relative` that names one of `forbidden`.
fn assert_no_imports(relative: &str, forbidden: &[&str]) {
    let mut offenders = Vec::new();
    for file in rust_files(relative) {
        let source = std::fs::read_to_string(&file)
            .unwrap_or_else(|e| panic!("reading {}: {e}", file.display()));
        for module in crate_modules(&source) {
            if forbidden.contains(&module.as_str()) {
                offenders.push(format!("{} uses crate::{module}", file.display()));
            }
        }
    }
    assert!(
        offenders.is_empty(),
        "src/{relative} must not depend on {forbidden:?}:\n{}",
        offenders.join("\n")
    );
}

#[test]
fn the_checker_sees_paths_and_groups() {
    let found = crate_modules("use crate::model::Task;\nuse crate::{engine, http::Auth};");
    let expected: BTreeSet<String> = ["engine", "http", "model"].map(String::from).into();
    assert_eq!(found, expected);
}

#[test]
fn protocol_is_a_pure_wire_library() {
    assert_no_imports("protocol", &["engine", "http", "store", "config", "app"]);
}

#[test]
fn store_knows_neither_engine_nor_http() {
    assert_no_imports("store", &["engine", "http", "app"]);
}

#[test]
fn nothing_below_the_front_knows_http() {
    for layer in ["engine", "agent", "model.rs", "history.rs"] {
        assert_no_imports(layer, &["http", "app"]);
    }
}

#[test]
fn push_delivery_knows_neither_engine_nor_http() {
    assert_no_imports("push", &["engine", "http", "app", "config"]);
}

#[test]
fn config_is_plain_settings() {
    assert_no_imports("config.rs", &["engine", "http", "agent", "app"]);
}

#[test]
fn agents_and_the_client_do_not_reach_into_the_engine() {
    for layer in ["agent", "client"] {
        assert_no_imports(layer, &["engine", "http", "app"]);
    }
}
