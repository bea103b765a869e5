//! A tenant's policy set, parsed and validated once, and the evaluation of one tool call
//! against it.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::mem::discriminant;
use std::str::FromStr;
use std::sync::Arc;

use cedar_policy::{
    ActionConstraint, AuthorizationError, Authorizer, Context, Effect, EntityId, EntityUid, Policy,
    PolicyId, PolicySet, PrincipalConstraint, Request, ResourceConstraint, Response,
    RestrictedExpression, ValidationMode, ValidationWarning, Validator,
};
use toolgate_core::{AgentId, Decision, RiskLevel, RunId, TenantId, ToolSpec};

use crate::error::{PolicyError, describe};
use crate::schema::{PolicySchema, SchemaInner, ToolEntry};

/// The annotations toolgate reads. Any other is refused, so a misspelled `@decison` cannot
/// silently turn into `allow`.
const KNOWN_ANNOTATIONS: [&str; 4] = ["id", "decision", "risk", "description"];

/// One tool call, as policy sees it.
#[derive(Clone, Copy, Debug)]
pub struct PolicyRequest<'a> {
    /// The tenant; `context.tenant` in Cedar.
    pub tenant: &'a TenantId,
    /// The agent; the principal `Toolgate::Agent::"<agent>"`.
    pub agent: &'a AgentId,
    /// The run; `context.run`.
    pub run: &'a RunId,
    /// The tool; the resource `Toolgate::Tool::"<name>"` and the action
    /// `Toolgate::Action::"<name>"`.
    pub tool: &'a ToolSpec,
    /// The arguments, already validated against the tool's input schema; `context.args`.
    pub arguments: &'a serde_json::Value,
}

/// What policy decided about one call, and why.
#[derive(Clone, Debug, PartialEq)]
pub struct PolicyDecision {
    /// The strictest satisfied decision.
    pub decision: Decision,
    /// The larger of the tool's risk and the `@risk` of the deciding policies.
    pub risk: RiskLevel,
    /// The `@id` (or generated id) of every policy that decided, in source order. Empty when
    /// nothing permitted the call or the call could not be evaluated.
    pub policy_ids: Vec<String>,
    /// The version of the policy set that decided.
    pub policy_version: i64,
    /// A short explanation, safe to show an LLM: it names policies, never argument values.
    pub reason: String,
}

/// A policy set parsed and validated against a [`PolicySchema`]. Immutable, `Send + Sync`;
/// share it with `Arc` and swap the `Arc` to install a new version.
pub struct CompiledPolicy {
    schema: Arc<SchemaInner>,
    /// For each tool of the schema (by [`ToolEntry::index`]), the policies whose scope can
    /// match it. Cedar evaluates every policy it is given, so this keeps per-tool rules from
    /// slowing down every other tool.
    per_tool: Vec<PolicySet>,
    /// For each tool (by [`ToolEntry::index`]), Cedar's answer when no call can change it:
    /// every policy that may apply to the tool reads neither `principal` nor `context` (the
    /// default set reads only the tool's own attributes), so the answer is a function of the
    /// tool alone and is worked out once, here, rather than on every call.
    fixed: Vec<Option<Response>>,
    meta: HashMap<PolicyId, PolicyMeta>,
    authorizer: Authorizer,
    version: i64,
    warnings: Vec<String>,
}

/// What toolgate reads from one policy's effect and annotations.
#[derive(Clone, Debug)]
struct PolicyMeta {
    /// `@id`, or Cedar's generated id.
    id: String,
    /// Position in the source, to list deciding policies in a stable order.
    order: usize,
    forbid: bool,
    decision: Decision,
    risk: Option<RiskLevel>,
}

impl CompiledPolicy {
    /// Parses `text` and validates it strictly against `schema`.
    ///
    /// Every problem is reported, each with the policy's id and, where Cedar gives one, the
    /// line and column. Besides Cedar's validation errors, these are refused: policies that can
    /// never apply, bidirectional-text control characters, templates (policies with slots),
    /// unknown annotations, invalid `@decision` / `@risk` values, and duplicate ids.
    pub fn compile(
        schema: &PolicySchema,
        text: &str,
        version: i64,
    ) -> Result<CompiledPolicy, PolicyError> {
        let policies = PolicySet::from_str(text).map_err(|errors| {
            PolicyError::Parse(
                errors
                    .iter()
                    .map(|error| describe(error, text, None))
                    .collect(),
            )
        })?;

        let templates: Vec<String> = policies
            .templates()
            .map(|template| {
                let id = template
                    .annotation("id")
                    .map_or_else(|| template.id().to_string(), str::to_owned);
                format!(
                    "policy `{id}` is a template (it has ?principal or ?resource slots); \
                     templates are not supported"
                )
            })
            .collect();
        if !templates.is_empty() {
            return Err(PolicyError::Validation(templates));
        }

        let meta = read_annotations(&policies)?;
        let human_id = |id: &PolicyId| {
            meta.get(id)
                .map_or_else(|| id.to_string(), |meta| meta.id.clone())
        };

        let result =
            Validator::new(schema.inner.cedar.clone()).validate(&policies, ValidationMode::Strict);
        // Cedar reports a problem once per action the policy may apply to; report it once.
        let mut problems = Problems::default();
        let mut failing: HashSet<&PolicyId> = HashSet::new();
        for error in result.validation_errors() {
            let id = error.policy_id();
            failing.insert(id);
            let kind = format!("error {:?}", discriminant(error));
            problems.add((id.clone(), first_offset(error), kind), || {
                describe(error, text, Some((id.as_ref(), &human_id(id))))
            });
        }
        let has_tools = !schema.inner.tools.is_empty();
        let mut warnings = Vec::new();
        for warning in result.validation_warnings() {
            let id = warning.policy_id();
            let message = || describe(warning, text, Some((id.as_ref(), &human_id(id))));
            if !warning_is_fatal(warning, has_tools) {
                warnings.push(message());
            } else if !failing.contains(id) {
                // A policy with errors may also "never apply"; its errors already say why.
                let kind = format!("warning {:?}", discriminant(warning));
                problems.add((id.clone(), first_offset(warning), kind), message);
            }
        }
        if !problems.is_empty() {
            return Err(PolicyError::Validation(problems.into_messages()));
        }

        let per_tool = per_tool_sets(&schema.inner, &policies)?;
        let authorizer = Authorizer::new();
        let fixed = fixed_answers(&schema.inner, &policies, &per_tool, &authorizer);
        Ok(CompiledPolicy {
            schema: Arc::clone(&schema.inner),
            per_tool,
            fixed,
            meta,
            authorizer,
            version,
            warnings,
        })
    }

    /// The same policy with no answer worked out in advance: every call goes to Cedar.
    #[cfg(test)]
    pub(crate) fn without_fixed_answers(mut self) -> CompiledPolicy {
        self.fixed.iter_mut().for_each(|answer| *answer = None);
        self
    }

    /// How many tools have their answer worked out in advance.
    #[cfg(test)]
    pub(crate) fn fixed_answers(&self) -> usize {
        self.fixed.iter().flatten().count()
    }

    /// The version given to [`CompiledPolicy::compile`].
    pub fn version(&self) -> i64 {
        self.version
    }

    /// Validator warnings that do not stop the policy from loading (mixed scripts or
    /// confusable characters in strings and identifiers), as messages for the operator.
    pub fn warnings(&self) -> &[String] {
        &self.warnings
    }

    /// Decides one call. Never fails: anything that prevents a decision (a tool missing from
    /// the schema, arguments that cannot be converted, a forbid that cannot be evaluated)
    /// blocks, with the reason.
    pub fn evaluate(&self, request: &PolicyRequest<'_>) -> PolicyDecision {
        let spec = request.tool;
        let Some(tool) = self.schema.tools.get(spec.name.as_str()) else {
            let reason = format!("tool `{}` is not in the policy schema", spec.name);
            return self.block(spec.risk, Vec::new(), reason);
        };
        if let Some(response) = &self.fixed[tool.index] {
            // The answer cannot depend on this call; its arguments must still be ones Cedar
            // could be given, exactly as when the request is built.
            return match tool.args.convert(request.arguments) {
                Ok(_) => self.decide(spec.risk, response),
                Err(error) => {
                    let reason = format!("policy cannot evaluate this call: {error}");
                    self.block(spec.risk, Vec::new(), reason)
                }
            };
        }
        match self.cedar_request(tool, request) {
            Ok(cedar_request) => {
                let response = self.authorizer.is_authorized(
                    &cedar_request,
                    &self.per_tool[tool.index],
                    &tool.entities,
                );
                self.decide(spec.risk, &response)
            }
            Err(problem) => {
                let reason = format!("policy cannot evaluate this call: {problem}");
                self.block(spec.risk, Vec::new(), reason)
            }
        }
    }

    /// The Cedar request of one call. The error is LLM-safe: Cedar's own messages may quote
    /// argument values, so they are not passed on (the conversion has already checked
    /// everything they could report).
    fn cedar_request(
        &self,
        tool: &ToolEntry,
        request: &PolicyRequest<'_>,
    ) -> Result<Request, String> {
        let args = tool
            .args
            .convert(request.arguments)
            .map_err(|error| error.to_string())?;
        let tenant = RestrictedExpression::new_string(request.tenant.as_str().to_owned());
        let run = RestrictedExpression::new_string(request.run.as_str().to_owned());
        let context = Context::from_pairs([
            ("tenant".to_owned(), tenant),
            ("run".to_owned(), run),
            ("args".to_owned(), args),
        ])
        .map_err(|_| "the arguments do not form a Cedar context".to_owned())?;
        let principal = EntityUid::from_type_name_and_id(
            self.schema.agent_type.clone(),
            EntityId::new(request.agent.as_str()),
        );
        // The context was built from the schema's own shape and the policies were validated
        // against the schema, so request validation would only repeat that work (it costs
        // about as much as the rest of the request building).
        Request::new(
            principal,
            tool.action.clone(),
            tool.resource.clone(),
            context,
            None,
        )
        .map_err(|_| "the Cedar request could not be built".to_owned())
    }

    /// Turns Cedar's allow/deny and its diagnostics into toolgate's decision.
    ///
    /// A satisfied forbid blocks. Otherwise the strictest `@decision` among satisfied permits
    /// wins. A policy that failed to evaluate never loosens the outcome: an erroring forbid
    /// blocks, and an erroring permit raises the decision to its own when that is stricter
    /// (but cannot permit a call by itself).
    fn decide(&self, tool_risk: RiskLevel, response: &Response) -> PolicyDecision {
        let diagnostics = response.diagnostics();
        let satisfied: Vec<&PolicyMeta> = diagnostics
            .reason()
            .filter_map(|id| self.meta.get(id))
            .collect();
        let errored: Vec<&PolicyMeta> = diagnostics
            .errors()
            .filter_map(|error| {
                let AuthorizationError::PolicyEvaluationError(error) = error;
                self.meta.get(error.policy_id())
            })
            .collect();

        let forbids: Vec<&PolicyMeta> = satisfied.iter().copied().filter(|m| m.forbid).collect();
        if !forbids.is_empty() {
            return self.decided(tool_risk, Decision::Block, forbids, None);
        }
        let failed_forbids: Vec<&PolicyMeta> =
            errored.iter().copied().filter(|m| m.forbid).collect();
        if !failed_forbids.is_empty() {
            return self.decided(
                tool_risk,
                Decision::Block,
                failed_forbids,
                Some("could not be evaluated, so the call is blocked"),
            );
        }

        let Some(strictest) = satisfied.iter().map(|m| m.decision).max() else {
            return self.block(tool_risk, Vec::new(), "no policy permits this call".into());
        };
        let stricter_failure = errored.iter().map(|m| m.decision).max();
        if let Some(failed) = stricter_failure.filter(|failed| *failed > strictest) {
            let deciding = errored
                .iter()
                .copied()
                .filter(|m| m.decision == failed)
                .collect();
            return self.decided(
                tool_risk,
                failed,
                deciding,
                Some("could not be evaluated, so its decision applies"),
            );
        }
        let deciding = satisfied
            .iter()
            .copied()
            .filter(|m| m.decision == strictest)
            .collect();
        self.decided(tool_risk, strictest, deciding, None)
    }

    fn decided(
        &self,
        tool_risk: RiskLevel,
        decision: Decision,
        mut deciding: Vec<&PolicyMeta>,
        failure: Option<&str>,
    ) -> PolicyDecision {
        deciding.sort_unstable_by_key(|m| m.order);
        let risk = deciding
            .iter()
            .filter_map(|m| m.risk)
            .fold(tool_risk, RiskLevel::max);
        let policy_ids: Vec<String> = deciding.iter().map(|m| m.id.clone()).collect();
        let names = quoted_list(&policy_ids);
        let reason = match (failure, decision) {
            (Some(failure), _) => format!("{names} {failure}"),
            (None, Decision::Allow) => format!("allowed by {names}"),
            (None, Decision::Observe) => format!("allowed and recorded for review by {names}"),
            (None, Decision::RequireExpertApproval) => {
                format!("an expert must approve this call ({names})")
            }
            (None, Decision::RequireClientApproval) => {
                format!("the client must approve this call ({names})")
            }
            (None, Decision::Block) => format!("blocked by {names}"),
        };
        PolicyDecision {
            decision,
            risk,
            policy_ids,
            policy_version: self.version,
            reason,
        }
    }

    fn block(&self, risk: RiskLevel, policy_ids: Vec<String>, reason: String) -> PolicyDecision {
        PolicyDecision {
            decision: Decision::Block,
            risk,
            policy_ids,
            policy_version: self.version,
            reason,
        }
    }
}

impl fmt::Debug for CompiledPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut ids: Vec<(usize, &str)> = self
            .meta
            .values()
            .map(|m| (m.order, m.id.as_str()))
            .collect();
        ids.sort_unstable();
        let ids: Vec<&str> = ids.into_iter().map(|(_, id)| id).collect();
        f.debug_struct("CompiledPolicy")
            .field("version", &self.version)
            .field("policies", &ids)
            .finish_non_exhaustive()
    }
}

/// Identifies one problem across the actions Cedar repeats it for.
type ProblemKey = (PolicyId, Option<usize>, String);

/// Load problems in the order found, each once, with how often Cedar repeated it.
#[derive(Default)]
struct Problems {
    seen: HashMap<ProblemKey, usize>,
    list: Vec<(String, usize)>,
}

impl Problems {
    fn add(&mut self, key: ProblemKey, message: impl FnOnce() -> String) {
        match self.seen.get(&key) {
            Some(&index) => self.list[index].1 += 1,
            None => {
                self.seen.insert(key, self.list.len());
                self.list.push((message(), 1));
            }
        }
    }

    fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    fn into_messages(self) -> Vec<String> {
        self.list
            .into_iter()
            .map(|(message, count)| match count {
                1 => message,
                more => format!("{message} [and for {} more tools]", more - 1),
            })
            .collect()
    }
}

/// The byte offset Cedar points at, if any.
fn first_offset(diagnostic: &dyn miette::Diagnostic) -> Option<usize> {
    diagnostic
        .labels()
        .and_then(|mut labels| labels.next())
        .map(|label| label.offset())
}

/// `policy `a`` or `policies `a`, `b``.
fn quoted_list(ids: &[String]) -> String {
    let quoted: Vec<String> = ids.iter().map(|id| format!("`{id}`")).collect();
    match quoted.as_slice() {
        [one] => format!("policy {one}"),
        many => format!("policies {}", many.join(", ")),
    }
}

/// Warnings that mean a policy silently does nothing, or hides what it does, stop the load;
/// script-mixing hints do not, since legitimate non-English text can trigger them. With no
/// tools registered every policy "never applies", and that is no mistake of the policy's.
fn warning_is_fatal(warning: &ValidationWarning, has_tools: bool) -> bool {
    match warning {
        ValidationWarning::ImpossiblePolicy(_) | ValidationWarning::InvalidActionApplication(_) => {
            has_tools
        }
        ValidationWarning::BidiCharsInString(_) | ValidationWarning::BidiCharsInIdentifier(_) => {
            true
        }
        _ => false,
    }
}

/// Splits the policy set by tool, keeping for each tool the policies whose action and resource
/// scope can match it. A dropped policy's scope is false for that tool, so Cedar would never
/// look past it: the decisions are the same.
fn per_tool_sets(
    schema: &SchemaInner,
    policies: &PolicySet,
) -> Result<Vec<PolicySet>, PolicyError> {
    let tools = tools_by_index(schema);
    let mut sets = Vec::with_capacity(tools.len());
    for tool in tools {
        let relevant = policies
            .policies()
            .filter(|policy| may_apply(policy, tool))
            .cloned();
        let set = PolicySet::from_policies(relevant)
            .map_err(|error| PolicyError::Validation(vec![error.to_string()]))?;
        sets.push(set);
    }
    Ok(sets)
}

/// The schema's tools in the order of their [`ToolEntry::index`], the order of every per-tool
/// table.
fn tools_by_index(schema: &SchemaInner) -> Vec<&ToolEntry> {
    let mut tools: Vec<&ToolEntry> = schema.tools.values().collect();
    tools.sort_unstable_by_key(|tool| tool.index);
    tools
}

/// Cedar's answer for each tool whose policies cannot tell one call from another (see
/// [`CompiledPolicy::fixed`]), asked once with a request only the tool's action and resource
/// of which the policies can see.
fn fixed_answers(
    schema: &SchemaInner,
    policies: &PolicySet,
    per_tool: &[PolicySet],
    authorizer: &Authorizer,
) -> Vec<Option<Response>> {
    // Each policy is read once, however many tools it may apply to.
    let tool_only: HashSet<&PolicyId> = policies
        .policies()
        .filter(|policy| reads_only_the_tool(policy))
        .map(Policy::id)
        .collect();
    tools_by_index(schema)
        .into_iter()
        .zip(per_tool)
        .map(|(tool, set)| {
            if !set.policies().all(|policy| tool_only.contains(policy.id())) {
                return None;
            }
            // No policy of the set reads the principal or the context, so any will do.
            let principal =
                EntityUid::from_type_name_and_id(schema.agent_type.clone(), EntityId::new(""));
            let request = Request::new(
                principal,
                tool.action.clone(),
                tool.resource.clone(),
                Context::empty(),
                None,
            )
            .ok()?;
            Some(authorizer.is_authorized(&request, set, &tool.entities))
        })
        .collect()
}

/// Whether the policy's outcome is settled by the action and the resource alone: it constrains
/// no principal in its scope and its conditions name neither `principal` nor `context`. Read
/// from the policy's JSON form, where every variable is `{"Var": name}`; a policy that cannot
/// be turned into JSON is taken to read everything.
fn reads_only_the_tool(policy: &Policy) -> bool {
    fn names_caller(json: &serde_json::Value) -> bool {
        match json {
            serde_json::Value::Object(fields) => fields.iter().any(|(key, value)| {
                (key == "Var" && matches!(value.as_str(), Some("principal" | "context")))
                    || names_caller(value)
            }),
            serde_json::Value::Array(items) => items.iter().any(names_caller),
            _ => false,
        }
    }
    matches!(policy.principal_constraint(), PrincipalConstraint::Any)
        && policy.to_json().is_ok_and(|json| !names_caller(&json))
}

fn may_apply(policy: &Policy, tool: &ToolEntry) -> bool {
    let action = match policy.action_constraint() {
        ActionConstraint::Any => true,
        ActionConstraint::Eq(uid) => uid == tool.action,
        ActionConstraint::In(uids) => uids
            .iter()
            .any(|uid| *uid == tool.action || *uid == tool.group),
    };
    // Tools have no parents, so `resource in X` holds only for X itself.
    let resource = match policy.resource_constraint() {
        ResourceConstraint::Eq(uid)
        | ResourceConstraint::In(uid)
        | ResourceConstraint::IsIn(_, uid) => uid == tool.resource,
        ResourceConstraint::Any | ResourceConstraint::Is(_) => true,
    };
    action && resource
}

/// Reads every policy's effect and annotations, in source order.
fn read_annotations(policies: &PolicySet) -> Result<HashMap<PolicyId, PolicyMeta>, PolicyError> {
    let mut ordered: Vec<&Policy> = policies.policies().collect();
    // `PolicySet::from_str` numbers policies policy0, policy1, ... in source order.
    ordered.sort_by_key(|policy| source_index(policy.id()));

    let mut meta = HashMap::with_capacity(ordered.len());
    let mut seen: HashMap<String, PolicyId> = HashMap::with_capacity(ordered.len());
    for (order, policy) in ordered.into_iter().enumerate() {
        let id = policy
            .annotation("id")
            .map_or_else(|| policy.id().to_string(), str::to_owned);
        let fail = |message: String| PolicyError::Annotation {
            policy: id.clone(),
            message,
        };
        if id.trim().is_empty() {
            return Err(fail("@id must not be empty".into()));
        }
        if let Some(other) = seen.insert(id.clone(), policy.id().clone()) {
            return Err(fail(format!(
                "two policies have this id ({other} and {}); ids must be unique",
                policy.id()
            )));
        }
        for (key, _) in policy.annotations() {
            if !KNOWN_ANNOTATIONS.contains(&key) {
                return Err(fail(format!(
                    "unknown annotation @{key}; toolgate reads @id, @decision, @risk and \
                     @description"
                )));
            }
        }
        let forbid = policy.effect() == Effect::Forbid;
        let decision = match policy.annotation("decision") {
            None if forbid => Decision::Block,
            None => Decision::Allow,
            Some(value) => {
                let decision = Decision::from_str(value).map_err(&fail)?;
                if forbid && decision != Decision::Block {
                    return Err(fail(format!(
                        "a forbid policy always blocks; remove @decision(\"{decision}\") or make \
                         it a permit"
                    )));
                }
                decision
            }
        };
        let risk = match policy.annotation("risk") {
            None => None,
            Some(value) => Some(RiskLevel::from_str(value).map_err(&fail)?),
        };
        meta.insert(
            policy.id().clone(),
            PolicyMeta {
                id,
                order,
                forbid,
                decision,
                risk,
            },
        );
    }
    Ok(meta)
}

/// The number in a generated id (`policy12` -> 12), for sorting into source order.
fn source_index(id: &PolicyId) -> (usize, String) {
    let text = id.to_string();
    let index = text
        .strip_prefix("policy")
        .and_then(|number| number.parse().ok())
        .unwrap_or(usize::MAX);
    (index, text)
}
