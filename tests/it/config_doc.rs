//! docs/configuration.md names every configuration key, and only those: the keys come from
//! `Config::default()` serialised to JSON. Conventions (the doc's "Conventions of the table"):
//! nested tables become dotted keys; a list is one key; a map whose names the operator chooses
//! (`peers`, `auth.tokens`) is given one sample entry named by a placeholder (`<name>`,
//! `<principal>`), so its entries' keys are documented as `peers.<name>.url`. Each row's
//! environment form must be `COLLOQUY_` + the key upper-cased, `.` → `__`.

use colloquy::config::{Config, PeerConfig};
use serde_json::Value;
use std::collections::BTreeSet;

const DOC: &str = "docs/configuration.md";

/// The configuration's keys, with the maps given one placeholder entry each.
fn config_keys() -> BTreeSet<String> {
    let mut config = Config::default();
    config.peers.insert(
        "<name>".into(),
        PeerConfig {
            url: String::new(),
            token_env: None,
            card_jwks_url: Some(String::new()),
        },
    );
    config
        .auth
        .tenants
        .insert("<principal>".into(), vec![String::new()]);
    config
        .auth
        .tokens
        .insert("<principal>".into(), String::new());
    let value = serde_json::to_value(&config).expect("the configuration serialises");
    let mut keys = BTreeSet::new();
    collect("", &value, &mut keys);
    keys
}

fn collect(prefix: &str, value: &Value, keys: &mut BTreeSet<String>) {
    match value {
        Value::Object(table) => {
            // An empty table at this point is a map with no sample entry: the test must give it
            // one, or its entries' keys would go unchecked.
            assert!(
                !table.is_empty(),
                "`{prefix}` is an empty table in Config::default(): a map of named entries; \
                 give it a placeholder entry in config_keys() and document its keys with it"
            );
            for (name, inner) in table {
                let key = if prefix.is_empty() {
                    name.clone()
                } else {
                    format!("{prefix}.{name}")
                };
                collect(&key, inner, keys);
            }
        }
        _ => {
            keys.insert(prefix.to_string());
        }
    }
}

fn environment_form(key: &str) -> String {
    format!("COLLOQUY_{}", key.replace('.', "__").to_uppercase())
}

/// The rows of the doc's key table: (key, environment form).
fn documented_rows() -> Vec<(String, String)> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(DOC);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{DOC}: {e}"));
    let start = text
        .find("\n## Keys\n")
        .unwrap_or_else(|| panic!("{DOC} has no `## Keys` section"));
    let section = &text[start + 1..];
    let section = match section[1..].find("\n## ") {
        Some(end) => &section[..end + 1],
        None => section,
    };
    let mut rows = Vec::new();
    for line in section.lines().filter(|l| l.starts_with("| `")) {
        let cells: Vec<&str> = line.split(" | ").collect();
        assert!(cells.len() >= 4, "{DOC}: a row without four cells: {line}");
        let unquote = |cell: &str| {
            let cell = cell.trim().trim_start_matches('|').trim();
            assert!(
                cell.starts_with('`') && cell.ends_with('`') && cell.matches('`').count() == 2,
                "{DOC}: a key or environment cell is one name in backticks: {line}"
            );
            cell.trim_matches('`').to_string()
        };
        rows.push((unquote(cells[0]), unquote(cells[2])));
    }
    assert!(!rows.is_empty(), "{DOC}: no rows in the key table");
    rows
}

#[test]
fn configuration_doc_names_every_key_and_only_those() {
    let keys = config_keys();
    let rows = documented_rows();

    let mut documented = BTreeSet::new();
    let mut problems = Vec::new();
    for (key, environment) in &rows {
        if !documented.insert(key.clone()) {
            problems.push(format!("`{key}` has two rows"));
        }
        if !keys.contains(key) {
            problems.push(format!("`{key}` is documented but is no configuration key"));
        }
        let expected = environment_form(key);
        if *environment != expected {
            problems.push(format!(
                "`{key}`: environment form is `{expected}`, the doc says `{environment}`"
            ));
        }
    }
    for key in keys.difference(&documented) {
        problems.push(format!("`{key}` is a configuration key missing from {DOC}"));
    }
    assert!(
        problems.is_empty(),
        "{DOC} and the configuration disagree:\n  {}",
        problems.join("\n  ")
    );
}

#[test]
fn environment_form_joins_sections_with_double_underscores() {
    assert_eq!(environment_form("listen"), "COLLOQUY_LISTEN");
    assert_eq!(
        environment_form("agent.echo.chunk_chars"),
        "COLLOQUY_AGENT__ECHO__CHUNK_CHARS"
    );
    assert_eq!(
        environment_form("peers.<name>.url"),
        "COLLOQUY_PEERS__<NAME>__URL"
    );
}
