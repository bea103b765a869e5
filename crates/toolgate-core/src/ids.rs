//! Identifier newtypes, validated on construction so the rest of the code never sees an empty,
//! oversize or oddly shaped id.

use std::fmt;

use crate::error::IdError;

/// The longest identifier accepted anywhere.
const MAX_ID_LEN: usize = 128;

fn check_id(kind: &'static str, value: &str) -> Result<(), IdError> {
    let fail = |reason: String| Err(IdError { kind, reason });
    if value.is_empty() {
        return fail("must not be empty".into());
    }
    if value.len() > MAX_ID_LEN {
        return fail(format!(
            "is {} bytes long, at most {MAX_ID_LEN} are allowed",
            value.len()
        ));
    }
    let allowed = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | ':');
    if let Some(bad) = value.chars().find(|c| !allowed(*c)) {
        return fail(format!(
            "contains {bad:?}; only ASCII letters, digits and - _ . : are allowed"
        ));
    }
    Ok(())
}

macro_rules! id_type {
    ($(#[$doc:meta])* $name:ident, $kind:literal) => {
        $(#[$doc])*
        #[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub struct $name(String);

        impl $name {
            /// Validates and wraps `value`.
            pub fn new(value: impl Into<String>) -> Result<$name, IdError> {
                let value = value.into();
                check_id($kind, &value)?;
                Ok($name(value))
            }

            /// The id as text.
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl AsRef<str> for $name {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }

        impl std::str::FromStr for $name {
            type Err = IdError;

            fn from_str(s: &str) -> Result<$name, IdError> {
                $name::new(s)
            }
        }
    };
}

id_type!(
    /// An isolation boundary (an organisation).
    TenantId,
    "tenant id"
);
id_type!(
    /// A configured agent inside a tenant.
    AgentId,
    "agent id"
);
id_type!(
    /// One agent conversation.
    RunId,
    "run id"
);
id_type!(
    /// One invocation (a ledger row).
    ToolCallId,
    "tool call id"
);
id_type!(
    /// The agent runtime's id for a `tool_use` block; the idempotency key within a run.
    ToolUseId,
    "tool use id"
);
id_type!(
    /// Ties the gateway's records to the caller's traces.
    CorrelationId,
    "correlation id"
);

/// The name of a secret a tool needs, e.g. `slack_default`: lowercase letters, digits and `_`.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SecretName(String);

impl SecretName {
    /// Validates and wraps `value`.
    pub fn new(value: impl Into<String>) -> Result<SecretName, IdError> {
        let value = value.into();
        let kind = "secret name";
        if value.is_empty() || value.len() > 64 {
            return Err(IdError {
                kind,
                reason: format!("must be 1 to 64 bytes long, got {}", value.len()),
            });
        }
        if !value
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        {
            return Err(IdError {
                kind,
                reason: format!("`{value}` may contain only a-z, 0-9 and _"),
            });
        }
        Ok(SecretName(value))
    }

    /// The name as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for SecretName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A tool's name, `family.action`: the family names the connector (`aws`, `slack`), the action
/// the operation (`ec2_inventory`). Each part is 1 to 64 of `a-z`, `0-9`, `_`, starting with a
/// letter.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ToolName {
    full: String,
    dot: usize,
}

impl ToolName {
    /// Validates and wraps `value`.
    pub fn new(value: impl Into<String>) -> Result<ToolName, IdError> {
        let full = value.into();
        let fail = |reason: String| {
            Err(IdError {
                kind: "tool name",
                reason,
            })
        };
        let Some(dot) = full.find('.') else {
            return fail(format!(
                "`{}` must have the form family.action, e.g. slack.post_message",
                truncate_for_message(&full)
            ));
        };
        let (family, action) = (&full[..dot], &full[dot + 1..]);
        for (part, label) in [(family, "family"), (action, "action")] {
            let valid_chars = part
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
            let starts_with_letter = part.chars().next().is_some_and(|c| c.is_ascii_lowercase());
            // A family never contains `__`: LLM APIs forbid dots in tool names, so the
            // gateway also accepts `family__action`, which must stay unambiguous.
            let double_underscore = label == "family" && part.contains("__");
            if part.is_empty()
                || part.len() > 64
                || !valid_chars
                || !starts_with_letter
                || double_underscore
            {
                return fail(format!(
                    "the {label} part of `{}` must be 1 to 64 of a-z, 0-9 and _, starting with a letter",
                    truncate_for_message(&full)
                ));
            }
        }
        Ok(ToolName { full, dot })
    }

    /// The whole name.
    pub fn as_str(&self) -> &str {
        &self.full
    }

    /// The family (connector) part.
    pub fn family(&self) -> &str {
        &self.full[..self.dot]
    }

    /// The action part.
    pub fn action(&self) -> &str {
        &self.full[self.dot + 1..]
    }
}

impl fmt::Display for ToolName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.full)
    }
}

impl std::str::FromStr for ToolName {
    type Err = IdError;

    fn from_str(s: &str) -> Result<ToolName, IdError> {
        ToolName::new(s)
    }
}

/// Shortens user input quoted back in an error message, so an oversize value cannot flood logs.
fn truncate_for_message(value: &str) -> String {
    const LIMIT: usize = 80;
    if value.len() <= LIMIT {
        return value.to_owned();
    }
    let mut end = LIMIT;
    while !value.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &value[..end])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_validated() {
        let cases: &[(&str, bool)] = &[
            ("acme", true),
            ("run-01J:abc_1.2", true),
            ("", false),
            ("has space", false),
            ("slash/no", false),
            ("ünï", false),
        ];
        for (input, ok) in cases {
            assert_eq!(TenantId::new(*input).is_ok(), *ok, "{input:?}");
        }
        let long = "a".repeat(129);
        let err = RunId::new(long).unwrap_err();
        assert!(err.to_string().contains("129 bytes"), "{err}");
        assert!(RunId::new("a".repeat(128)).is_ok());
    }

    #[test]
    fn tool_names_have_family_and_action() {
        let cases: &[(&str, bool)] = &[
            ("aws.ec2_inventory", true),
            ("slack.post_message", true),
            ("noaction", false),
            (".x", false),
            ("x.", false),
            ("Aws.list", false),
            ("aws.1list", false),
            ("aws.list.more", false),
            ("my__fam.list", false),
            ("my_fam.list__all", true),
        ];
        for (input, ok) in cases {
            assert_eq!(ToolName::new(*input).is_ok(), *ok, "{input:?}");
        }
        let name = ToolName::new("aws.ec2_inventory").unwrap();
        assert_eq!((name.family(), name.action()), ("aws", "ec2_inventory"));
    }

    #[test]
    fn secret_names_are_validated() {
        assert!(SecretName::new("slack_default").is_ok());
        assert!(SecretName::new("Slack").is_err());
        assert!(SecretName::new("").is_err());
    }
}
