//! Reading JSON objects field by field, with errors that name the field's full path.

use serde_json::{Map, Value};

/// A wire value that does not fit: `path` names the field (`message.parts[0].text`).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{path}: {problem}")]
pub struct FieldError {
    pub path: String,
    pub problem: String,
}

pub type FieldResult<T> = Result<T, FieldError>;

pub fn field_error(path: impl Into<String>, problem: impl Into<String>) -> FieldError {
    FieldError {
        path: path.into(),
        problem: problem.into(),
    }
}

fn type_name(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// A JSON object and where it sits in the request.
pub struct Obj<'a> {
    pub map: &'a Map<String, Value>,
    pub path: String,
}

impl<'a> Obj<'a> {
    pub fn new(value: &'a Value, path: impl Into<String>) -> FieldResult<Self> {
        let path = path.into();
        match value {
            Value::Object(map) => Ok(Obj { map, path }),
            other => Err(field_error(
                path,
                format!("expected an object, got {}", type_name(other)),
            )),
        }
    }

    pub fn child_path(&self, name: &str) -> String {
        if self.path.is_empty() {
            name.to_owned()
        } else {
            format!("{}.{name}", self.path)
        }
    }

    /// The field, treating JSON `null` as absent.
    pub fn get(&self, name: &str) -> Option<&'a Value> {
        self.map.get(name).filter(|v| !v.is_null())
    }

    pub fn has(&self, name: &str) -> bool {
        self.get(name).is_some()
    }

    fn wrong(&self, name: &str, expected: &str, got: &Value) -> FieldError {
        field_error(
            self.child_path(name),
            format!("expected {expected}, got {}", type_name(got)),
        )
    }

    pub fn opt_str(&self, name: &str) -> FieldResult<Option<&'a str>> {
        match self.get(name) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(other) => Err(self.wrong(name, "a string", other)),
        }
    }

    pub fn str(&self, name: &str) -> FieldResult<&'a str> {
        self.opt_str(name)?
            .ok_or_else(|| field_error(self.child_path(name), "is required"))
    }

    pub fn opt_bool(&self, name: &str) -> FieldResult<Option<bool>> {
        match self.get(name) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(other) => Err(self.wrong(name, "a boolean", other)),
        }
    }

    /// A non-negative integer (also accepted as a decimal string, as proto JSON allows).
    pub fn opt_u64(&self, name: &str) -> FieldResult<Option<u64>> {
        match self.get(name) {
            None => Ok(None),
            Some(Value::Number(n)) => n.as_u64().map(Some).ok_or_else(|| {
                field_error(self.child_path(name), "must be a non-negative integer")
            }),
            Some(Value::String(s)) => s
                .parse()
                .map(Some)
                .map_err(|_| field_error(self.child_path(name), "must be a non-negative integer")),
            Some(other) => Err(self.wrong(name, "an integer", other)),
        }
    }

    pub fn opt_obj(&self, name: &str) -> FieldResult<Option<Obj<'a>>> {
        self.get(name)
            .map(|v| Obj::new(v, self.child_path(name)))
            .transpose()
    }

    pub fn obj(&self, name: &str) -> FieldResult<Obj<'a>> {
        self.opt_obj(name)?
            .ok_or_else(|| field_error(self.child_path(name), "is required"))
    }

    pub fn opt_map(&self, name: &str) -> FieldResult<Option<Map<String, Value>>> {
        Ok(self.opt_obj(name)?.map(|o| o.map.clone()))
    }

    pub fn opt_array(&self, name: &str) -> FieldResult<Option<&'a Vec<Value>>> {
        match self.get(name) {
            None => Ok(None),
            Some(Value::Array(items)) => Ok(Some(items)),
            Some(other) => Err(self.wrong(name, "an array", other)),
        }
    }

    pub fn array(&self, name: &str) -> FieldResult<&'a Vec<Value>> {
        self.opt_array(name)?
            .ok_or_else(|| field_error(self.child_path(name), "is required"))
    }

    pub fn opt_strings(&self, name: &str) -> FieldResult<Vec<String>> {
        let Some(items) = self.opt_array(name)? else {
            return Ok(Vec::new());
        };
        items
            .iter()
            .enumerate()
            .map(|(i, item)| match item {
                Value::String(s) => Ok(s.clone()),
                other => Err(field_error(
                    format!("{}[{i}]", self.child_path(name)),
                    format!("expected a string, got {}", type_name(other)),
                )),
            })
            .collect()
    }
}
