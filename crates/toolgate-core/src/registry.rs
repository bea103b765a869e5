//! The tool registry: every tool the gateway can serve, by name, with its connector.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use crate::connector::Connector;
use crate::error::SpecError;
use crate::ids::ToolName;
use crate::spec::ToolSpec;

/// A registration was refused.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RegisterError {
    /// Two connectors (or one, twice) offer the same tool name.
    #[error("tool `{0}` is already registered")]
    Duplicate(ToolName),
    /// A tool's name does not start with its connector's family.
    #[error("tool `{tool}` does not belong to family `{family}`")]
    WrongFamily {
        /// The tool.
        tool: ToolName,
        /// The connector's family.
        family: String,
    },
    /// A spec is malformed.
    #[error(transparent)]
    Spec(#[from] SpecError),
}

/// A tool name that no connector serves.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown tool `{name}`; registered tools: {}", known.join(", "))]
pub struct UnknownTool {
    /// The name asked for.
    pub name: String,
    /// Every registered name, sorted.
    pub known: Vec<String>,
}

#[derive(Clone)]
struct Entry {
    spec: Arc<ToolSpec>,
    connector: Arc<dyn Connector>,
}

/// Tool name to spec and connector. Built once at start-up, then read-only and cheap to share.
#[derive(Clone, Default)]
pub struct ToolRegistry {
    tools: BTreeMap<ToolName, Entry>,
}

impl ToolRegistry {
    /// An empty registry.
    pub fn new() -> ToolRegistry {
        ToolRegistry::default()
    }

    /// Registers every tool of `connector`. Nothing is registered if any tool is refused.
    pub fn register(&mut self, connector: Arc<dyn Connector>) -> Result<(), RegisterError> {
        let specs = connector.tools();
        let mut seen = std::collections::BTreeSet::new();
        for spec in &specs {
            spec.validate()?;
            if spec.name.family() != connector.family() {
                return Err(RegisterError::WrongFamily {
                    tool: spec.name.clone(),
                    family: connector.family().to_owned(),
                });
            }
            if self.tools.contains_key(&spec.name) || !seen.insert(spec.name.clone()) {
                return Err(RegisterError::Duplicate(spec.name.clone()));
            }
        }
        for spec in specs {
            let entry = Entry {
                spec: Arc::new(spec),
                connector: Arc::clone(&connector),
            };
            self.tools.insert(entry.spec.name.clone(), entry);
        }
        Ok(())
    }

    /// The spec and connector of `name`, or an error listing what is registered.
    pub fn get(&self, name: &str) -> Result<(&Arc<ToolSpec>, &Arc<dyn Connector>), UnknownTool> {
        let found = ToolName::new(name)
            .ok()
            .and_then(|parsed| self.tools.get(&parsed));
        match found {
            Some(entry) => Ok((&entry.spec, &entry.connector)),
            None => Err(UnknownTool {
                name: name.chars().take(128).collect(),
                known: self.names().map(|n| n.to_string()).collect(),
            }),
        }
    }

    /// Whether `name` is registered.
    pub fn contains(&self, name: &ToolName) -> bool {
        self.tools.contains_key(name)
    }

    /// Every registered spec, sorted by name.
    pub fn specs(&self) -> impl Iterator<Item = &Arc<ToolSpec>> {
        self.tools.values().map(|entry| &entry.spec)
    }

    /// Every registered name, sorted.
    pub fn names(&self) -> impl Iterator<Item = &ToolName> {
        self.tools.keys()
    }

    /// How many tools are registered.
    pub fn len(&self) -> usize {
        self.tools.len()
    }

    /// Whether nothing is registered.
    pub fn is_empty(&self) -> bool {
        self.tools.is_empty()
    }
}

impl fmt::Debug for ToolRegistry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.tools.keys()).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::connector::{InvocationContext, ToolOutput};
    use crate::error::ToolError;
    use serde_json::{Value, json};

    #[derive(Debug)]
    struct Fake {
        family: &'static str,
        names: Vec<&'static str>,
    }

    #[async_trait::async_trait]
    impl Connector for Fake {
        fn family(&self) -> &str {
            self.family
        }
        fn tools(&self) -> Vec<ToolSpec> {
            self.names
                .iter()
                .map(|n| ToolSpec::new(ToolName::new(*n).unwrap(), "x", json!({"type": "object"})))
                .collect()
        }
        async fn invoke(
            &self,
            _ctx: InvocationContext,
            _tool: &ToolName,
            arguments: Value,
        ) -> Result<ToolOutput, ToolError> {
            Ok(ToolOutput::new(arguments))
        }
    }

    fn fake(family: &'static str, names: &[&'static str]) -> Arc<dyn Connector> {
        Arc::new(Fake {
            family,
            names: names.to_vec(),
        })
    }

    #[test]
    fn duplicates_are_refused_and_nothing_half_registers() {
        let mut registry = ToolRegistry::new();
        registry.register(fake("a", &["a.one"])).unwrap();
        let err = registry
            .register(fake("a", &["a.two", "a.one"]))
            .unwrap_err();
        assert!(matches!(err, RegisterError::Duplicate(ref n) if n.as_str() == "a.one"));
        assert_eq!(registry.len(), 1, "a.two must not be registered");
        let err = registry.register(fake("b", &["b.x", "b.x"])).unwrap_err();
        assert!(matches!(err, RegisterError::Duplicate(_)));
    }

    #[test]
    fn wrong_family_is_refused() {
        let mut registry = ToolRegistry::new();
        let err = registry.register(fake("a", &["b.one"])).unwrap_err();
        assert!(matches!(err, RegisterError::WrongFamily { .. }));
    }

    #[test]
    fn unknown_tool_lists_known_names() {
        let mut registry = ToolRegistry::new();
        registry.register(fake("a", &["a.two", "a.one"])).unwrap();
        assert!(registry.get("a.one").is_ok());
        let err = registry.get("a.three").unwrap_err();
        assert_eq!(err.known, vec!["a.one", "a.two"]);
        assert_eq!(
            err.to_string(),
            "unknown tool `a.three`; registered tools: a.one, a.two"
        );
        assert!(registry.get("not a name").is_err());
    }
}
