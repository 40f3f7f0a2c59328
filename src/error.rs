//! What every layer's errors share: a boxed cause, and [`chain`], which renders an error with
//! the causes behind it.
//!
//! An error's `Display` is the message a client may be shown (the wire keeps it as it is); its
//! `source()` chain is what an operator needs to find out why. Log lines for internal errors
//! render the chain.

use std::error::Error;
use std::fmt;
use std::sync::Arc;

/// A cause of any type, kept as the source of one of colloquy's errors.
pub type BoxError = Box<dyn Error + Send + Sync + 'static>;

/// A cause kept by an error that is cloned (a store failure reaches every caller of a group
/// commit) and compared (tests compare store errors): the clones share it, and two causes are
/// equal, so an error's equality rests on its message.
#[derive(Clone)]
pub struct Cause(Arc<dyn Error + Send + Sync + 'static>);

impl Cause {
    pub fn new(error: impl Into<BoxError>) -> Self {
        Cause(Arc::from(error.into()))
    }
}

impl PartialEq for Cause {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl fmt::Debug for Cause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl fmt::Display for Cause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&*self.0, f)
    }
}

impl Error for Cause {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        self.0.source()
    }
}

/// Renders `error` and each of its sources, joined by ": ". A cause whose text is already part
/// of what was written (many errors repeat their cause in their own message) is not repeated.
pub fn chain<'a>(error: &'a (dyn Error + 'static)) -> Chain<'a> {
    Chain(error)
}

/// See [`chain`].
pub struct Chain<'a>(&'a (dyn Error + 'static));

impl fmt::Display for Chain<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut text = self.0.to_string();
        let mut cause = self.0.source();
        while let Some(inner) = cause {
            let inner_text = inner.to_string();
            if !text.contains(&inner_text) {
                text.push_str(": ");
                text.push_str(&inner_text);
            }
            cause = inner.source();
        }
        f.write_str(&text)
    }
}

impl fmt::Debug for Chain<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("outer")]
    struct Outer(#[source] Middle);

    #[derive(Debug, thiserror::Error)]
    #[error("middle: {0}")]
    struct Middle(#[source] std::io::Error);

    #[test]
    fn renders_each_cause_once() {
        let error = Outer(Middle(std::io::Error::other("disk on fire")));
        assert_eq!(chain(&error).to_string(), "outer: middle: disk on fire");
    }
}
