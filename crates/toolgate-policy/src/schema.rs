//! The Cedar schema generated from the registered tool specs, and the per-tool Cedar values
//! (entity uids, the tool entity, the argument shape) built once so evaluation only converts
//! the arguments.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use cedar_policy::{
    Entities, Entity, EntityId, EntityTypeName, EntityUid, RestrictedExpression, Schema,
    SchemaFragment,
};
use serde_json::{Map, Value, json};
use toolgate_core::ToolSpec;

use crate::error::PolicyError;
use crate::shape::{Omission, Shape};

/// The Cedar namespace of everything toolgate declares.
pub(crate) const NAMESPACE: &str = "Toolgate";

/// The Cedar schema every policy set is validated against, generated from the tool specs.
///
/// Cheap to clone (the contents are shared). See the crate documentation for the model.
#[derive(Clone)]
pub struct PolicySchema {
    pub(crate) inner: Arc<SchemaInner>,
}

pub(crate) struct SchemaInner {
    pub(crate) cedar: Schema,
    pub(crate) agent_type: EntityTypeName,
    pub(crate) tools: HashMap<String, ToolEntry>,
    text: String,
}

/// What evaluation needs about one tool, built once.
pub(crate) struct ToolEntry {
    /// Position among the schema's tools, for per-tool tables of a compiled policy.
    pub(crate) index: usize,
    pub(crate) action: EntityUid,
    /// The action's family group.
    pub(crate) group: EntityUid,
    pub(crate) resource: EntityUid,
    /// The tool entity, its action and the action's family group.
    pub(crate) entities: Entities,
    /// The record shape of `context.args`.
    pub(crate) args: Shape,
}

impl PolicySchema {
    /// Generates the schema from every registered tool spec.
    ///
    /// Argument properties without a Cedar type are left out (and listed in
    /// [`PolicySchema::cedar_schema_text`]), so a policy that references one fails validation.
    pub fn from_specs<'a>(
        specs: impl IntoIterator<Item = &'a ToolSpec>,
    ) -> Result<PolicySchema, PolicyError> {
        let mut by_name: BTreeMap<&str, &ToolSpec> = BTreeMap::new();
        for spec in specs {
            if by_name.insert(spec.name.as_str(), spec).is_some() {
                return Err(PolicyError::Schema(format!(
                    "tool `{}` is listed twice",
                    spec.name
                )));
            }
        }

        let mut omitted: Vec<(&str, Omission)> = Vec::new();
        let mut shapes = Vec::with_capacity(by_name.len());
        for (name, spec) in &by_name {
            let mut tool_omitted = Vec::new();
            let shape = Shape::for_arguments(&spec.input_schema, &mut tool_omitted);
            omitted.extend(tool_omitted.into_iter().map(|omission| (*name, omission)));
            shapes.push((*spec, shape));
        }

        let json = schema_json(&shapes);
        let cedar = Schema::from_json_value(json.clone())
            .map_err(|error| PolicyError::Schema(full_message(&error)))?;
        let fragment = SchemaFragment::from_json_value(json)
            .map_err(|error| PolicyError::Schema(full_message(&error)))?;
        let body = fragment
            .to_cedarschema()
            .map_err(|error| PolicyError::Schema(full_message(&error)))?;
        let text = schema_text(&body, &omitted);

        let agent_type = type_name("Agent")?;
        let tool_type = type_name("Tool")?;
        let action_type = type_name("Action")?;
        let action_entities = cedar
            .action_entities()
            .map_err(|error| PolicyError::Schema(full_message(&error)))?;

        let mut tools = HashMap::with_capacity(shapes.len());
        let mut tool_entities = Vec::with_capacity(shapes.len());
        for (index, (spec, shape)) in shapes.into_iter().enumerate() {
            let name = spec.name.as_str();
            let resource = EntityUid::from_type_name_and_id(tool_type.clone(), EntityId::new(name));
            let action = EntityUid::from_type_name_and_id(action_type.clone(), EntityId::new(name));
            let group = EntityUid::from_type_name_and_id(
                action_type.clone(),
                EntityId::new(family_group(spec.name.family())),
            );
            let tool_entity = tool_entity(spec, resource.clone())?;
            // The principal is not in the store: agents have no attributes or parents, and a
            // missing entity behaves exactly like one without them.
            let mut entities = vec![tool_entity.clone()];
            for uid in [&action, &group] {
                let entity = action_entities
                    .get(uid)
                    .cloned()
                    .ok_or_else(|| PolicyError::Schema(format!("the schema lost action {uid}")))?;
                entities.push(entity);
            }
            let entities = Entities::from_entities(entities, None)
                .map_err(|error| PolicyError::Schema(full_message(&error)))?;
            tool_entities.push(tool_entity);
            tools.insert(
                name.to_owned(),
                ToolEntry {
                    index,
                    action,
                    group,
                    resource,
                    entities,
                    args: shape,
                },
            );
        }
        // The per-tool stores skip the schema check to stay small; check every tool entity
        // against the schema once here instead.
        Entities::from_entities(tool_entities, Some(&cedar))
            .map_err(|error| PolicyError::Schema(full_message(&error)))?;

        Ok(PolicySchema {
            inner: Arc::new(SchemaInner {
                cedar,
                agent_type,
                tools,
                text,
            }),
        })
    }

    /// The schema in Cedar's human-readable syntax, preceded by comments listing the argument
    /// properties that have no Cedar type and were left out.
    pub fn cedar_schema_text(&self) -> String {
        self.inner.text.clone()
    }
}

impl fmt::Debug for PolicySchema {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let tools: BTreeSet<&str> = self.inner.tools.keys().map(String::as_str).collect();
        f.debug_struct("PolicySchema")
            .field("tools", &tools)
            .finish_non_exhaustive()
    }
}

/// The action group of a family: `Toolgate::Action::"family:slack"`. Tool names cannot contain
/// `:`, so a group never collides with a tool.
fn family_group(family: &str) -> String {
    format!("family:{family}")
}

fn type_name(basename: &str) -> Result<EntityTypeName, PolicyError> {
    EntityTypeName::from_str(&format!("{NAMESPACE}::{basename}"))
        .map_err(|error| PolicyError::Schema(error.to_string()))
}

fn tool_entity(spec: &ToolSpec, uid: EntityUid) -> Result<Entity, PolicyError> {
    let tags = spec
        .tags
        .iter()
        .map(|tag| RestrictedExpression::new_string(tag.as_str().to_owned()));
    let attrs = HashMap::from([
        ("tags".to_owned(), RestrictedExpression::new_set(tags)),
        (
            "risk".to_owned(),
            RestrictedExpression::new_string(spec.risk.as_str().to_owned()),
        ),
        (
            "idempotent".to_owned(),
            RestrictedExpression::new_bool(spec.idempotent),
        ),
        (
            "family".to_owned(),
            RestrictedExpression::new_string(spec.name.family().to_owned()),
        ),
    ]);
    Entity::new(uid, attrs, HashSet::new())
        .map_err(|error| PolicyError::Schema(full_message(&error)))
}

/// The schema in Cedar's JSON format.
fn schema_json(tools: &[(&ToolSpec, Shape)]) -> Value {
    let string_set = json!({"type": "Set", "element": {"type": "String"}});
    let entity_types = json!({
        "Agent": {},
        "Tool": {"shape": {"type": "Record", "attributes": {
            "tags": string_set,
            "risk": {"type": "String"},
            "idempotent": {"type": "Boolean"},
            "family": {"type": "String"},
        }}},
    });
    let mut actions = Map::new();
    let families: BTreeSet<&str> = tools.iter().map(|(spec, _)| spec.name.family()).collect();
    for family in families {
        actions.insert(family_group(family), json!({}));
    }
    for (spec, shape) in tools {
        actions.insert(
            spec.name.as_str().to_owned(),
            json!({
                "memberOf": [{"id": family_group(spec.name.family())}],
                "appliesTo": {
                    "principalTypes": ["Agent"],
                    "resourceTypes": ["Tool"],
                    "context": {"type": "Record", "attributes": {
                        "tenant": {"type": "String"},
                        "run": {"type": "String"},
                        "args": shape.to_cedar_json(),
                    }},
                },
            }),
        );
    }
    json!({ NAMESPACE: {"entityTypes": entity_types, "actions": actions} })
}

fn schema_text(body: &str, omitted: &[(&str, Omission)]) -> String {
    let mut text = String::from(
        "// Cedar schema generated by toolgate from the registered tool specs.\n\
         // Principal: Toolgate::Agent (its uid is the agent id). Resource: Toolgate::Tool (its\n\
         // uid is the tool name). context.tenant and context.run name the tenant and the run.\n\
         // One action per tool, Toolgate::Action::\"<tool name>\", in the action group\n\
         // Toolgate::Action::\"family:<family>\". context.args holds the arguments that have a\n\
         // Cedar type: string -> String, integer -> Long, boolean -> Bool,\n\
         // number -> decimal (rounded to 4 fractional digits), array -> Set, object -> record.\n",
    );
    if !omitted.is_empty() {
        text.push_str("//\n// Left out (no Cedar type), so policies cannot reference them:\n");
        for (tool, omission) in omitted {
            let path = if omission.path.is_empty() {
                "context.args".to_owned()
            } else {
                format!("context.args.{}", omission.path)
            };
            // Debug-quote the path: property names are free text and could hold a newline.
            text.push_str(&format!("//   {tool}: {path:?}: {}\n", omission.reason));
        }
    }
    text.push('\n');
    // Cedar qualifies built-in types (`__cedar::String`) when printing; the namespace declares
    // no types of those names, so the short names mean the same and read better.
    let body = body.replace(": __cedar::", ": ").replace("<__cedar::", "<");
    text.push_str(&body);
    if !text.ends_with('\n') {
        text.push('\n');
    }
    text
}

/// An error's message followed by its causes, which Cedar's top-level messages often omit.
fn full_message(error: &dyn std::error::Error) -> String {
    let mut message = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        message.push_str(": ");
        message.push_str(&cause.to_string());
        source = cause.source();
    }
    message
}
