//! The error of a wire value that does not fit, naming the field's full path.

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
