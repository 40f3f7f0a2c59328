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

/// Why a part's fields do not make a part (one of text, raw, url or data, say); serde reports
/// it at the part's path.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct PartError(String);

impl From<String> for PartError {
    fn from(problem: String) -> Self {
        PartError(problem)
    }
}

impl From<&str> for PartError {
    fn from(problem: &str) -> Self {
        PartError(problem.to_owned())
    }
}
