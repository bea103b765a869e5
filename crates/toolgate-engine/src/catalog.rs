//! The tools this gateway serves: the registry plus what is derived from it once at start-up
//! (compiled argument validators, the Cedar schema, the default policy text).

use std::collections::HashMap;
use std::fmt;

use serde_json::{Value, json};
use toolgate_core::{ToolName, ToolRegistry, ToolSpec};
use toolgate_policy::{DEFAULT_POLICY, PolicySchema};

use crate::error::EngineError;

/// The registry with every tool's schema compiled.
pub struct Catalog {
    registry: ToolRegistry,
    /// Built once from this build's tools, never from a request: foldhash, not SipHash, serves
    /// the lookup every call makes (a request's tool name is only looked up, never added).
    validators: HashMap<ToolName, jsonschema::Validator, foldhash::fast::RandomState>,
    policy_schema: PolicySchema,
    default_policy: String,
}

impl Catalog {
    /// Compiles every registered tool's input schema and the Cedar schema. A schema that does
    /// not compile is a start-up error naming the tool.
    pub fn new(registry: ToolRegistry) -> Result<Catalog, EngineError> {
        let mut validators = HashMap::with_capacity_and_hasher(registry.len(), Default::default());
        for spec in registry.specs() {
            let validator = jsonschema::validator_for(&spec.input_schema).map_err(|err| {
                EngineError::FailedPrecondition(format!(
                    "tool `{}` has an invalid input schema: {}",
                    spec.name,
                    err.masked()
                ))
            })?;
            validators.insert(spec.name.clone(), validator);
        }
        let policy_schema = PolicySchema::from_specs(registry.specs().map(|spec| spec.as_ref()))
            .map_err(|err| {
                EngineError::FailedPrecondition(format!(
                    "cannot build the policy schema from the registered tools: {err}"
                ))
            })?;
        let default_policy = DEFAULT_POLICY.to_owned();
        Ok(Catalog {
            registry,
            validators,
            policy_schema,
            default_policy,
        })
    }

    /// The registry.
    pub fn registry(&self) -> &ToolRegistry {
        &self.registry
    }

    /// The Cedar schema policies are validated against.
    pub fn policy_schema(&self) -> &PolicySchema {
        &self.policy_schema
    }

    /// The policy set in force for tenants that never uploaded one.
    pub fn default_policy(&self) -> &str {
        &self.default_policy
    }

    /// Checks `arguments` against the tool's schema. The message lists up to five violations
    /// by location, without echoing argument values (they may hold secrets).
    pub fn validate(&self, tool: &ToolName, arguments: &Value) -> Result<(), String> {
        let Some(validator) = self.validators.get(tool) else {
            return Err(format!("tool `{tool}` has no compiled schema"));
        };
        if validator.is_valid(arguments) {
            return Ok(());
        }
        let problems: Vec<String> = validator
            .iter_errors(arguments)
            .take(5)
            .map(|err| {
                let path = err.instance_path().to_string();
                let location = if path.is_empty() {
                    "(root)".to_owned()
                } else {
                    path
                };
                format!("{location}: {}", err.masked())
            })
            .collect();
        Err(format!(
            "the arguments do not match the schema of `{tool}`: {}",
            problems.join("; ")
        ))
    }

    /// The definition of `spec` in the shapes LLM tool-use APIs accept.
    pub fn llm_definitions(spec: &ToolSpec) -> (Value, Value) {
        let name = llm_tool_name(&spec.name);
        let anthropic = json!({
            "name": name,
            "description": spec.description,
            "input_schema": spec.input_schema,
        });
        let openai = json!({
            "type": "function",
            "function": {
                "name": name,
                "description": spec.description,
                "parameters": spec.input_schema,
            }
        });
        (anthropic, openai)
    }
}

impl fmt::Debug for Catalog {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Catalog")
            .field("tools", &self.registry)
            .finish_non_exhaustive()
    }
}

/// The name LLM APIs accept: they forbid dots, so `slack.post_message` becomes
/// `slack__post_message`. Families never contain `__`, so the form is unambiguous.
pub fn llm_tool_name(name: &ToolName) -> String {
    format!("{}__{}", name.family(), name.action())
}

/// Parses either form of a tool name; in the LLM form the first `__` ends the family.
pub fn parse_llm_tool_name(requested: &str) -> Option<ToolName> {
    if let Ok(name) = ToolName::new(requested) {
        return Some(name);
    }
    let (family, action) = requested.split_once("__")?;
    ToolName::new(format!("{family}.{action}")).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn llm_names_round_trip() {
        let name = ToolName::new("slack.post_message").unwrap();
        assert_eq!(llm_tool_name(&name), "slack__post_message");
        assert_eq!(
            parse_llm_tool_name("slack__post_message"),
            Some(name.clone())
        );
        assert_eq!(parse_llm_tool_name("slack.post_message"), Some(name));
        assert_eq!(parse_llm_tool_name("slack_post_message"), None);
        assert_eq!(parse_llm_tool_name(""), None);
    }
}
