//! The crate's one error type, and the rendering of Cedar diagnostics into messages that name
//! the policy and the line and column.

use std::fmt::Write as _;

use miette::Diagnostic;

/// A policy set or schema was refused. Every variant's text names what to fix.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PolicyError {
    /// The text is not valid Cedar. Each message carries the line and column.
    #[error("the policy text does not parse: {}", .0.join("; "))]
    Parse(Vec<String>),
    /// The policies do not type-check against the schema generated from the tool specs (a
    /// misspelled attribute, an unknown tool, a comparison of mismatched types, ...), or use a
    /// construct toolgate does not support. Each message names the policy and, where Cedar
    /// gives one, the line and column.
    #[error("the policies do not validate: {}", .0.join("; "))]
    Validation(Vec<String>),
    /// The Cedar schema could not be generated from the tool specs.
    #[error("cannot build the policy schema: {0}")]
    Schema(String),
    /// A policy's `@id`, `@decision` or `@risk` annotation is invalid, or an annotation is
    /// unknown.
    #[error("policy `{policy}`: {message}")]
    Annotation {
        /// The policy's `@id`, or Cedar's generated id (`policy0`, ...) when it has none.
        policy: String,
        /// What is wrong.
        message: String,
    },
}

/// Renders one Cedar diagnostic as `policy `id` at line L, column C: message (help)`.
/// `policy` is Cedar's generated id and the id to show (the `@id` when there is one).
pub(crate) fn describe(
    diagnostic: &dyn Diagnostic,
    text: &str,
    policy: Option<(&str, &str)>,
) -> String {
    let mut out = String::new();
    let mut message = diagnostic.to_string();
    if let Some((generated, shown)) = policy {
        let _ = write!(out, "policy `{shown}` ");
        // Cedar starts many messages with the generated id, which the prefix replaces.
        if let Some(rest) = message.strip_prefix(&format!("for policy `{generated}`, ")) {
            message = rest.to_owned();
        }
    }
    let first_label = diagnostic.labels().and_then(|mut labels| labels.next());
    if let Some(label) = first_label {
        let (line, column) = line_and_column(text, label.offset());
        let _ = write!(out, "at line {line}, column {column}");
    }
    if out.is_empty() {
        out = message;
    } else {
        let _ = write!(out, ": {message}");
    }
    if let Some(help) = diagnostic.help() {
        let _ = write!(out, " ({help})");
    }
    out
}

/// 1-based line and column (in characters) of a byte offset.
fn line_and_column(text: &str, offset: usize) -> (usize, usize) {
    let mut end = offset.min(text.len());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    let before = &text[..end];
    let line = before.matches('\n').count() + 1;
    let line_start = before.rfind('\n').map_or(0, |newline| newline + 1);
    let column = before[line_start..].chars().count() + 1;
    (line, column)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_become_lines_and_columns() {
        let text = "ab\ncdé\nf";
        let cases = [
            (0, (1, 1)),
            (2, (1, 3)),
            (3, (2, 1)),
            (6, (2, 3)),
            (7, (2, 4)),
            (8, (3, 1)),
            (99, (3, 2)),
        ];
        for (offset, expected) in cases {
            assert_eq!(line_and_column(text, offset), expected, "offset {offset}");
        }
    }

    #[test]
    fn lists_are_joined_in_display() {
        let err = PolicyError::Validation(vec!["a".into(), "b".into()]);
        assert_eq!(err.to_string(), "the policies do not validate: a; b");
    }
}
