//! An error with its causes on one line, `outer: inner: innermost`, as both binaries log it.

use std::fmt;

/// Displays an error followed by each of its sources, separated by `: `.
#[derive(Debug, Clone, Copy)]
pub struct ErrorChain<'a>(pub &'a (dyn std::error::Error + 'static));

impl fmt::Display for ErrorChain<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)?;
        let mut source = self.0.source();
        while let Some(cause) = source {
            write!(f, ": {cause}")?;
            source = cause.source();
        }
        Ok(())
    }
}

/// Renders an error with its causes, `outer: inner: innermost`.
pub fn chain(error: &(dyn std::error::Error + 'static)) -> String {
    ErrorChain(error).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("cannot read the file")]
    struct Outer(#[source] std::io::Error);

    #[test]
    fn every_cause_follows_on_one_line() {
        let e = Outer(std::io::Error::other("permission denied"));
        assert_eq!(chain(&e), "cannot read the file: permission denied");
    }
}
