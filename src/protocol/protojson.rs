//! v1.0 is defined by a protobuf schema, and ProtoJSON parsers accept a field under its JSON name
//! (`historyLength`) or its original proto name (`history_length`). colloquy reads JSON names
//! only, so v1.0 input is first rewritten to them: one pass here instead of two spellings at every
//! read. Output is always JSON names.

use super::fields::{FieldResult, field_error};
use serde_json::{Map, Value};

/// Fields whose values are free-form JSON (`google.protobuf.Struct` / `Value`): their keys are
/// data, not field names, and stay as they are.
const FREE_FORM: &[&str] = &["metadata", "data"];

/// The lowerCamelCase JSON name protoc derives from a proto field name (`context_id` → `contextId`).
pub fn json_name(proto_name: &str) -> String {
    let mut name = String::with_capacity(proto_name.len());
    let mut upper_next = false;
    for c in proto_name.chars() {
        if c == '_' {
            upper_next = true;
        } else if upper_next {
            name.extend(c.to_uppercase());
            upper_next = false;
        } else {
            name.push(c);
        }
    }
    name
}

/// Where a value sits, formatted only when an error names it: building every field's path as
/// a string was most of this pass's cost on a request that has nothing to rename.
#[derive(Clone, Copy)]
enum Path<'a> {
    Root(&'a str),
    Field(&'a Path<'a>, &'a str),
    Item(&'a Path<'a>, usize),
}

impl std::fmt::Display for Path<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Path::Root(root) => f.write_str(root),
            Path::Field(Path::Root(""), key) => f.write_str(key),
            Path::Field(parent, key) => write!(f, "{parent}.{key}"),
            Path::Item(parent, index) => write!(f, "{parent}[{index}]"),
        }
    }
}

/// Rewrites every field given under its proto name to its JSON name, in `value` and the objects
/// within it. A field given both ways is an error naming it.
pub fn to_json_names(value: &mut Value, path: &str) -> FieldResult<()> {
    rename_within(value, Path::Root(path))
}

/// [`to_json_names`] for a params object.
pub fn object_to_json_names(map: &mut Map<String, Value>) -> FieldResult<()> {
    rename_fields(map, Path::Root(""))
}

fn rename_within(value: &mut Value, path: Path<'_>) -> FieldResult<()> {
    match value {
        Value::Object(map) => rename_fields(map, path),
        Value::Array(items) => items
            .iter_mut()
            .enumerate()
            .try_for_each(|(i, item)| rename_within(item, Path::Item(&path, i))),
        _ => Ok(()),
    }
}

fn rename_fields(map: &mut Map<String, Value>, path: Path<'_>) -> FieldResult<()> {
    let proto_names: Vec<String> = map.keys().filter(|k| k.contains('_')).cloned().collect();
    for proto_name in proto_names {
        let name = json_name(&proto_name);
        if name == proto_name {
            continue;
        }
        if map.contains_key(&name) {
            return Err(field_error(
                Path::Field(&path, &name).to_string(),
                format!("given twice, as {name} and as {proto_name}; send one"),
            ));
        }
        if let Some(field) = map.remove(&proto_name) {
            map.insert(name, field);
        }
    }
    for (key, field) in map.iter_mut() {
        if !FREE_FORM.contains(&key.as_str()) {
            rename_within(field, Path::Field(&path, key))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn proto_names_become_json_names() {
        assert_eq!(json_name("history_length"), "historyLength");
        assert_eq!(json_name("status_timestamp_after"), "statusTimestampAfter");
        assert_eq!(json_name("id"), "id");
    }

    #[test]
    fn nested_fields_are_renamed_but_free_form_values_are_not() {
        let mut value = json!({
            "message": {"message_id": "m", "context_id": "c", "parts": [{"text": "x", "media_type": "text/plain"}],
                        "metadata": {"keep_me": 1}},
            "configuration": {"return_immediately": true, "history_length": 2},
            "metadata": {"snake_case": {"inner_key": 1}}
        });
        to_json_names(&mut value, "").unwrap();
        assert_eq!(
            value,
            json!({
                "message": {"messageId": "m", "contextId": "c", "parts": [{"text": "x", "mediaType": "text/plain"}],
                            "metadata": {"keep_me": 1}},
                "configuration": {"returnImmediately": true, "historyLength": 2},
                "metadata": {"snake_case": {"inner_key": 1}}
            })
        );
    }

    #[test]
    fn a_field_given_both_ways_is_an_error_naming_it() {
        let mut value = json!({"message": {"contextId": "a", "context_id": "b"}});
        let error = to_json_names(&mut value, "").unwrap_err();
        assert_eq!(error.path, "message.contextId");
        assert!(error.problem.contains("context_id"), "{error}");
    }

    #[test]
    fn an_error_names_the_path_through_items_and_from_the_root_given() {
        let mut value = json!({"parts": [{}, {"media_type": "a", "mediaType": "b"}]});
        let error = to_json_names(&mut value, "result").unwrap_err();
        assert_eq!(error.path, "result.parts[1].mediaType");
        let mut value = json!([{}, {"context_id": "a", "contextId": "b"}]);
        let error = to_json_names(&mut value, "").unwrap_err();
        assert_eq!(error.path, "[1].contextId");
    }
}
