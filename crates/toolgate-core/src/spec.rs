//! Tool specs: what a tool is called, what it takes, how risky it is and what it needs.

use std::collections::BTreeSet;
use std::fmt;
use std::time::Duration;

use serde_json::Value;

use crate::decision::RiskLevel;
use crate::error::SpecError;
use crate::ids::{SecretName, ToolName};

/// A free-form label on a tool that policy can match, e.g. `read_only`, `write`, `financial`.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Tag(String);

impl Tag {
    /// The tool only reads.
    pub const READ_ONLY: &'static str = "read_only";
    /// The tool changes something at the vendor.
    pub const WRITE: &'static str = "write";
    /// The tool touches money.
    pub const FINANCIAL: &'static str = "financial";
    /// The tool deletes or cannot be undone.
    pub const DESTRUCTIVE: &'static str = "destructive";

    /// Validates a tag: 1 to 32 of `a-z`, `0-9`, `_`.
    pub fn new(value: impl Into<String>) -> Result<Tag, String> {
        let value = value.into();
        let valid = !value.is_empty()
            && value.len() <= 32
            && value
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
        if valid {
            Ok(Tag(value))
        } else {
            Err(format!("tag `{value}` must be 1 to 32 of a-z, 0-9 and _"))
        }
    }

    /// The tag as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Tag {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Everything the gateway knows about one tool before calling it.
#[derive(Clone, Debug, PartialEq)]
pub struct ToolSpec {
    /// `family.action`.
    pub name: ToolName,
    /// What the tool does, written for an LLM deciding whether to call it.
    pub description: String,
    /// JSON Schema (an object schema) the arguments must satisfy.
    pub input_schema: Value,
    /// JSON Schema of the result, when the connector documents one.
    pub output_schema: Option<Value>,
    /// Labels policy can match.
    pub tags: BTreeSet<Tag>,
    /// The tool's inherent risk.
    pub risk: RiskLevel,
    /// Whether calling twice with the same arguments has the effect of calling once; only
    /// idempotent tools are ever retried.
    pub idempotent: bool,
    /// The tenant secrets the connector receives for this tool, and no others.
    pub required_secrets: Vec<SecretName>,
    /// How long a call may take unless the caller asks for less.
    pub default_timeout: Duration,
}

impl ToolSpec {
    /// Starts a spec with an object input schema, low risk, no tags, not idempotent, no
    /// secrets and a 30 s timeout. Validated by [`ToolSpec::validate`] at registration.
    pub fn new(name: ToolName, description: impl Into<String>, input_schema: Value) -> ToolSpec {
        ToolSpec {
            name,
            description: description.into(),
            input_schema,
            output_schema: None,
            tags: BTreeSet::new(),
            risk: RiskLevel::Low,
            idempotent: false,
            required_secrets: Vec::new(),
            default_timeout: Duration::from_secs(30),
        }
    }

    /// Adds a tag.
    ///
    /// # Panics
    /// When the tag is malformed: tags are written by connector authors as literals.
    #[must_use]
    pub fn tag(mut self, tag: &str) -> ToolSpec {
        let tag = Tag::new(tag).unwrap_or_else(|reason| panic!("{reason}"));
        self.tags.insert(tag);
        self
    }

    /// Sets the risk level.
    #[must_use]
    pub fn risk(mut self, risk: RiskLevel) -> ToolSpec {
        self.risk = risk;
        self
    }

    /// Marks the tool idempotent.
    #[must_use]
    pub fn idempotent(mut self, idempotent: bool) -> ToolSpec {
        self.idempotent = idempotent;
        self
    }

    /// Declares a secret the tool needs.
    #[must_use]
    pub fn secret(mut self, name: SecretName) -> ToolSpec {
        self.required_secrets.push(name);
        self
    }

    /// Sets the default timeout.
    #[must_use]
    pub fn timeout(mut self, timeout: Duration) -> ToolSpec {
        self.default_timeout = timeout;
        self
    }

    /// Sets the output schema.
    #[must_use]
    pub fn output_schema(mut self, schema: Value) -> ToolSpec {
        self.output_schema = Some(schema);
        self
    }

    /// Whether the tool carries `tag`.
    pub fn has_tag(&self, tag: &str) -> bool {
        self.tags.iter().any(|t| t.as_str() == tag)
    }

    /// Checks what can be checked without compiling the schema: a description, an object
    /// input schema, a non-zero timeout.
    pub fn validate(&self) -> Result<(), SpecError> {
        let fail = |reason: &str| {
            Err(SpecError {
                tool: self.name.to_string(),
                reason: reason.to_owned(),
            })
        };
        if self.description.trim().is_empty() {
            return fail("the description is empty; an LLM needs it to choose the tool");
        }
        match self.input_schema.get("type") {
            Some(Value::String(t)) if t == "object" => {}
            _ => return fail("the input schema must be a JSON Schema with \"type\": \"object\""),
        }
        if self.default_timeout.is_zero() {
            return fail("the default timeout must be greater than zero");
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn spec(schema: Value) -> ToolSpec {
        ToolSpec::new(ToolName::new("t.x").unwrap(), "does x", schema)
    }

    #[test]
    fn specs_are_validated() {
        assert!(spec(json!({"type": "object"})).validate().is_ok());
        let err = spec(json!({"type": "string"})).validate().unwrap_err();
        assert!(err.to_string().contains("\"type\": \"object\""), "{err}");
        let mut no_desc = spec(json!({"type": "object"}));
        no_desc.description = " ".into();
        assert!(no_desc.validate().is_err());
        assert!(
            spec(json!({"type": "object"}))
                .timeout(Duration::ZERO)
                .validate()
                .is_err()
        );
    }

    #[test]
    fn builder_sets_fields() {
        let s = spec(json!({"type": "object"}))
            .tag(Tag::WRITE)
            .risk(RiskLevel::High)
            .idempotent(true);
        assert!(s.has_tag("write"));
        assert!(!s.has_tag("read_only"));
        assert_eq!(s.risk, RiskLevel::High);
        assert!(s.idempotent);
    }
}
