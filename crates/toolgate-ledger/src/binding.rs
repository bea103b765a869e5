//! Binding a call's recorded content into the audit chain. The rows of `tool_calls`,
//! `policy_decisions` and `pending_invocations` are not events, so on their own anyone who can
//! write the database could rewrite a failed call as succeeded. Each write that creates or
//! changes such a row therefore puts, on one of the keyed events it appends in the same
//! transaction, a *binding*: a JSON object naming the row and the values it was given.
//!
//! ```text
//! {"call":     {"id": ..., "status": ..., "error_code": ..., "error_sha256": ...,
//!               "input_sha256": ..., "output_sha256": ..., "tool": ..., "run": ...,
//!               "args_hash": ..., "decision_id": ..., "risk": ..., "attempts": ...},
//!  "decision": {"id": ..., "tool_call_id": ..., "tool": ..., "decision": ..., "risk": ...,
//!               "policy_ids": ..., "policy_version": ...},
//!  "pending":  {"id": ..., "tool_call_id": ..., "tool": ..., "args_hash": ..., "origin": ...,
//!               "decision": ..., "policy_version": ...}}
//! ```
//!
//! Texts that may be long (redacted input and output, error text) are bound by their SHA-256.
//! A write that changes only some fields (a finish, a human decision) binds only those. The
//! event's MAC covers the binding, so it cannot be changed without the key either.
//!
//! Verification folds the bindings of a chain in chain order (a later binding of a field wins)
//! and compares the result with the rows as stored: a bound field that differs is an edit, a
//! bound row that is gone a deletion, and a row that no binding names is accepted only when a
//! legacy (unkeyed, written before bindings) event names its call. What is not bound, and may
//! change without an event: a pending invocation's state, version and sealed arguments (its
//! call's status is bound instead), a call's sealed answer (purged after its retention), its
//! duration and timestamps.

use std::collections::{HashMap, HashSet};

use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

use crate::model::{
    FinishCall, PendingInvocation, PolicyDecisionRecord, ResolvePending, ToolCallRecord,
};
use crate::ops::PreparedEvent;

/// A call row's bound fields, from the row's values as stored.
#[derive(Clone, Copy, Debug)]
pub(crate) struct CallContent<'a> {
    pub(crate) status: &'a str,
    pub(crate) error_code: Option<&'a str>,
    pub(crate) error_text: Option<&'a str>,
    pub(crate) input: &'a str,
    pub(crate) output: Option<&'a str>,
    pub(crate) tool: &'a str,
    pub(crate) run: &'a str,
    pub(crate) args_hash: &'a str,
    pub(crate) decision_id: Option<&'a str>,
    pub(crate) risk: Option<&'a str>,
    pub(crate) attempts: i64,
}

impl CallContent<'_> {
    pub(crate) fn of<'a>(
        call: &'a ToolCallRecord,
        input: &'a str,
        output: Option<&'a str>,
    ) -> CallContent<'a> {
        CallContent {
            status: call.status.as_str(),
            error_code: call.error_code.map(|code| code.as_str()),
            error_text: call.error_text.as_deref(),
            input,
            output,
            tool: &call.tool,
            run: call.run.as_str(),
            args_hash: &call.args_hash,
            decision_id: call.policy_decision_id.as_deref(),
            risk: call.risk_level.map(|risk| risk.as_str()),
            attempts: call.attempts,
        }
    }
}

impl RowContent for CallContent<'_> {
    fn put(&self, sink: &mut impl Sink) {
        sink.text("status", self.status);
        sink.optional("error_code", self.error_code);
        sink.digest("error_sha256", self.error_text);
        sink.digest("input_sha256", Some(self.input));
        sink.digest("output_sha256", self.output);
        sink.text("tool", self.tool);
        sink.text("run", self.run);
        sink.text("args_hash", self.args_hash);
        sink.optional("decision_id", self.decision_id);
        sink.optional("risk", self.risk);
        sink.number("attempts", self.attempts);
    }
}

/// A decision row's bound fields; `policy_ids` is the stored JSON text (bound as a string).
#[derive(Clone, Copy, Debug)]
pub(crate) struct DecisionContent<'a> {
    pub(crate) tool_call_id: &'a str,
    pub(crate) tool: &'a str,
    pub(crate) decision: &'a str,
    pub(crate) risk: &'a str,
    pub(crate) policy_ids: &'a str,
    pub(crate) policy_version: i64,
}

impl RowContent for DecisionContent<'_> {
    fn put(&self, sink: &mut impl Sink) {
        sink.text("tool_call_id", self.tool_call_id);
        sink.text("tool", self.tool);
        sink.text("decision", self.decision);
        sink.text("risk", self.risk);
        sink.text("policy_ids", self.policy_ids);
        sink.number("policy_version", self.policy_version);
    }
}

/// A pending invocation's bound fields (those that never change after it is written).
#[derive(Clone, Copy, Debug)]
pub(crate) struct PendingContent<'a> {
    pub(crate) tool_call_id: &'a str,
    pub(crate) tool: &'a str,
    pub(crate) args_hash: &'a str,
    pub(crate) origin: &'a str,
    pub(crate) decision: &'a str,
    pub(crate) policy_version: i64,
}

impl RowContent for PendingContent<'_> {
    fn put(&self, sink: &mut impl Sink) {
        sink.text("tool_call_id", self.tool_call_id);
        sink.text("tool", self.tool);
        sink.text("args_hash", self.args_hash);
        sink.text("origin", self.origin);
        sink.text("decision", self.decision);
        sink.number("policy_version", self.policy_version);
    }
}

/// A row kind's bound fields. One list per kind serves the write (the binding's JSON text)
/// and the verifier (the values a stored row is compared with), so the two cannot drift apart.
pub(crate) trait RowContent {
    /// Every bound field, into `sink`.
    fn put(&self, sink: &mut impl Sink);

    /// Every bound field, as values.
    fn fields(&self) -> Map<String, Value> {
        let mut fields = Map::new();
        self.put(&mut fields);
        fields
    }
}

/// Where bound fields go: the JSON text a write puts on its event ([`Fields`]), or the values
/// the verifier compares a stored row's with (a map).
pub(crate) trait Sink {
    fn text(&mut self, name: &'static str, value: &str);
    fn null(&mut self, name: &'static str);
    fn number(&mut self, name: &'static str, value: i64);
    /// The SHA-256 of `text` in lowercase hex.
    fn sha256(&mut self, name: &'static str, text: &str);

    fn optional(&mut self, name: &'static str, value: Option<&str>) {
        match value {
            Some(value) => self.text(name, value),
            None => self.null(name),
        }
    }

    /// The SHA-256 of `text`, or null.
    fn digest(&mut self, name: &'static str, text: Option<&str>) {
        match text {
            Some(text) => self.sha256(name, text),
            None => self.null(name),
        }
    }
}

impl Sink for Map<String, Value> {
    fn text(&mut self, name: &'static str, value: &str) {
        self.insert(name.into(), value.into());
    }

    fn null(&mut self, name: &'static str) {
        self.insert(name.into(), Value::Null);
    }

    fn number(&mut self, name: &'static str, value: i64) {
        self.insert(name.into(), value.into());
    }

    fn sha256(&mut self, name: &'static str, text: &str) {
        self.insert(
            name.into(),
            Value::String(toolgate_core::hex::encode(Sha256::digest(text.as_bytes()))),
        );
    }
}

/// What one write binds, written straight as JSON text part by part (no map of values is
/// built: this runs for every call, the verifier's `fields` for every row it checks).
#[derive(Debug)]
pub(crate) struct Binding(Vec<u8>);

impl Default for Binding {
    /// Empty, with room for a call's binding (its parts and their digests take well under
    /// this), so writing one never grows the buffer.
    fn default() -> Binding {
        Binding(Vec::with_capacity(BINDING_BYTES))
    }
}

/// The room a new binding is given.
const BINDING_BYTES: usize = 1024;

impl Binding {
    /// A whole call row, as inserted or rewritten.
    pub(crate) fn call(mut self, call: &ToolCallRecord, input: &str, output: Option<&str>) -> Self {
        let mut fields = self.part("call", call.id.as_str());
        CallContent::of(call, input, output).put(&mut fields);
        fields.close();
        self
    }

    /// The fields a finish sets.
    pub(crate) fn finish(mut self, finish: &FinishCall, output: Option<&str>) -> Self {
        let mut fields = self.part("call", finish.id.as_str());
        fields.text("status", finish.status.as_str());
        fields.optional("error_code", finish.error_code.map(|c| c.as_str()));
        fields.digest("error_sha256", finish.error_text.as_deref());
        fields.digest("output_sha256", output);
        fields.number("attempts", finish.attempts);
        fields.close();
        self
    }

    /// The fields a human decision sets on its call.
    pub(crate) fn resolution(mut self, call_id: &str, resolution: &ResolvePending) -> Self {
        let mut fields = self.part("call", call_id);
        fields.text("status", resolution.call_status.as_str());
        fields.optional("error_code", resolution.error_code.map(|c| c.as_str()));
        fields.digest("error_sha256", resolution.error_text.as_deref());
        fields.close();
        self
    }

    pub(crate) fn decision(mut self, decision: &PolicyDecisionRecord, policy_ids: &str) -> Self {
        let mut fields = self.part("decision", &decision.id);
        DecisionContent {
            tool_call_id: decision.tool_call_id.as_str(),
            tool: decision.tool.as_str(),
            decision: decision.decision.as_str(),
            risk: decision.risk.as_str(),
            policy_ids,
            policy_version: decision.policy_version,
        }
        .put(&mut fields);
        fields.close();
        self
    }

    pub(crate) fn pending(mut self, pending: &PendingInvocation) -> Self {
        let mut fields = self.part("pending", &pending.id);
        PendingContent {
            tool_call_id: pending.tool_call_id.as_str(),
            tool: pending.tool.as_str(),
            args_hash: &pending.args_hash,
            origin: pending.origin.as_str(),
            decision: pending.decision.as_str(),
            policy_version: pending.policy_version,
        }
        .put(&mut fields);
        fields.close();
        self
    }

    /// Opens part `name` (each write binds a part at most once) with the row's `id`.
    fn part(&mut self, name: &'static str, id: &str) -> Fields<'_> {
        self.0
            .extend_from_slice(if self.0.is_empty() { b"{\"" } else { b",\"" });
        self.0.extend_from_slice(name.as_bytes());
        self.0.extend_from_slice(b"\":{");
        let mut fields = Fields {
            out: &mut self.0,
            first: true,
        };
        fields.text("id", id);
        fields
    }

    /// Puts the binding on the first of `events` that reports `call_id` (else the first
    /// event). A write without events binds nothing, and verification then finds its rows
    /// unbound.
    pub(crate) fn attach(mut self, events: &mut [PreparedEvent], call_id: &str) {
        if self.0.is_empty() {
            return;
        }
        let index = events
            .iter()
            .position(|event| event.tool_call_id.as_deref() == Some(call_id))
            .unwrap_or(0);
        if let Some(event) = events.get_mut(index) {
            self.0.push(b'}');
            event.binding = Some(String::from_utf8(self.0).expect("JSON text is UTF-8"));
        }
    }
}

/// The fields of one part being written: `"name":value` pairs, the names fixed identifiers
/// (written as they are), the texts escaped by serde_json.
struct Fields<'b> {
    out: &'b mut Vec<u8>,
    /// No field written yet.
    first: bool,
}

impl Fields<'_> {
    fn key(&mut self, name: &'static str) {
        if !std::mem::take(&mut self.first) {
            self.out.push(b',');
        }
        self.out.push(b'"');
        self.out.extend_from_slice(name.as_bytes());
        self.out.extend_from_slice(b"\":");
    }

    fn close(self) {
        self.out.push(b'}');
    }
}

impl Sink for Fields<'_> {
    fn text(&mut self, name: &'static str, value: &str) {
        self.key(name);
        serde_json::to_writer(&mut *self.out, value).expect("writing to memory");
    }

    fn null(&mut self, name: &'static str) {
        self.key(name);
        self.out.extend_from_slice(b"null");
    }

    fn number(&mut self, name: &'static str, value: i64) {
        self.key(name);
        serde_json::to_writer(&mut *self.out, &value).expect("writing to memory");
    }

    fn sha256(&mut self, name: &'static str, text: &str) {
        self.key(name);
        self.out.push(b'"');
        toolgate_core::hex::encode_into(Sha256::digest(text.as_bytes()), self.out);
        self.out.push(b'"');
    }
}

/// The bound values of one chain, folded in chain order.
#[derive(Debug, Default)]
pub(crate) struct Bound {
    /// Per part (`call`, `decision`, `pending`) and row id: the fields and the chain position
    /// of the newest binding.
    rows: HashMap<(String, String), (Map<String, Value>, i64)>,
    /// Calls named by a legacy event (written before bindings).
    pub(crate) legacy_calls: HashSet<String>,
}

impl Bound {
    /// Folds the binding of the event at `chain_seq`; an unparsable binding is an edit.
    pub(crate) fn fold(&mut self, chain_seq: i64, binding: &str) -> Result<(), String> {
        let Ok(Value::Object(parts)) = serde_json::from_str::<Value>(binding) else {
            return Err(format!(
                "event {chain_seq} carries a binding that is not a JSON object"
            ));
        };
        for (part, fields) in parts {
            let Value::Object(mut fields) = fields else {
                return Err(format!(
                    "event {chain_seq} carries a malformed `{part}` binding"
                ));
            };
            let Some(Value::String(id)) = fields.remove("id") else {
                return Err(format!(
                    "event {chain_seq} binds a `{part}` row without an id"
                ));
            };
            let entry = self
                .rows
                .entry((part, id))
                .or_insert_with(|| (Map::new(), chain_seq));
            entry.0.extend(fields);
            entry.1 = chain_seq;
        }
        Ok(())
    }

    /// Compares one stored row (`part`, `id`, its bound fields as stored) with what the chain
    /// bound; the row is marked seen. `Err` explains a mismatch, with the chain position of the
    /// binding that disagrees (or 0 when nothing binds the row). `Ok(false)`: nothing binds
    /// the row, and a legacy event names its call.
    pub(crate) fn check(
        &mut self,
        part: &str,
        id: &str,
        call_id: &str,
        stored: &Map<String, Value>,
    ) -> Result<bool, (i64, String)> {
        let Some((bound, at)) = self.rows.remove(&(part.to_owned(), id.to_owned())) else {
            if self.legacy_calls.contains(call_id) {
                return Ok(false);
            }
            return Err((
                0,
                format!(
                    "{} {id} is in the ledger but no audit event records it: the row was \
                     added outside the ledger",
                    describe(part)
                ),
            ));
        };
        // Fields in name order, whatever order the map keeps (serde_json's `preserve_order`
        // is on in some builds), so the same tampering is always reported the same way.
        let mut fields: Vec<(&String, &Value)> = bound.iter().collect();
        fields.sort_by(|a, b| a.0.cmp(b.0));
        for (field, value) in fields {
            let actual = stored.get(field).unwrap_or(&Value::Null);
            if actual != value {
                return Err((
                    at,
                    format!(
                        "{} {id}: its {field} is {actual} in the table but event {at} recorded \
                         {value}: the row was rewritten",
                        describe(part)
                    ),
                ));
            }
        }
        Ok(true)
    }

    /// After every row was checked: a bound row that was never seen was deleted.
    pub(crate) fn missing(&self) -> Option<(i64, String)> {
        self.rows
            .iter()
            .min_by_key(|(_, (_, at))| *at)
            .map(|((part, id), (_, at))| {
                (
                    *at,
                    format!(
                        "{} {id}, recorded by event {at}, is no longer in the ledger: the row \
                         was deleted",
                        describe(part)
                    ),
                )
            })
    }
}

fn describe(part: &str) -> &'static str {
    match part {
        "call" => "tool call",
        "decision" => "policy decision",
        "pending" => "pending invocation",
        _ => "row",
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;
    use toolgate_core::{ErrorCode, ToolCallStatus};

    use super::*;
    use crate::tests::{decide, finish, waiting_call};

    /// The binding text one write puts on its event; `None` when it binds nothing.
    fn text_of(binding: Binding) -> Option<String> {
        let mut events = vec![PreparedEvent::new(crate::tests::event(
            "acme",
            "tool_call.requested",
            "run-1",
            "c1",
        ))];
        binding.attach(&mut events, "c1");
        events.pop()?.binding
    }

    /// The binding of one write, parsed.
    fn written(binding: Binding) -> Option<Value> {
        text_of(binding).map(|text| serde_json::from_str(&text).unwrap())
    }

    #[test]
    fn a_call_binds_what_the_verifier_compares_its_rows_with() {
        let mut new = waiting_call("acme", "c1", None);
        // Texts that need escaping, and an error bound by its digest.
        new.call.tool = "odd \"tool\"\n\u{e9}\u{1f600}\\".to_owned();
        new.call.error_code = Some(ErrorCode::VendorError);
        new.call.error_text = Some("boom".to_owned());
        let call = &new.call;
        let decision = new.decision.as_ref().unwrap();
        let pending = new.pending.as_ref().unwrap();
        let input = r#"{"text":"[REDACTED]"}"#;
        let binding = Binding::default()
            .call(call, input, Some("out"))
            .decision(decision, r#"["p1"]"#)
            .pending(pending);
        let sha = |text: &str| toolgate_core::hex::encode(Sha256::digest(text));
        // Every field by name, as the verifier reads it back.
        let expected = json!({
            "call": {
                "id": "c1", "status": "waiting_approval", "error_code": "VENDOR_ERROR",
                "error_sha256": sha("boom"), "input_sha256": sha(input),
                "output_sha256": sha("out"), "tool": call.tool, "run": "run-1",
                "args_hash": call.args_hash, "decision_id": "dec-c1", "risk": "medium",
                "attempts": 0,
            },
            "decision": {
                "id": decision.id, "tool_call_id": "c1", "tool": "slack.post_message",
                "decision": "require_expert_approval", "risk": "medium",
                "policy_ids": r#"["p1"]"#, "policy_version": 1,
            },
            "pending": {
                "id": pending.id, "tool_call_id": "c1", "tool": pending.tool.as_str(),
                "args_hash": pending.args_hash, "origin": pending.origin.as_str(),
                "decision": pending.decision.as_str(), "policy_version": pending.policy_version,
            },
        });
        assert_eq!(
            Value::Object(CallContent::of(call, input, Some("out")).fields()),
            {
                let mut fields = expected["call"].clone();
                fields.as_object_mut().unwrap().remove("id");
                fields
            },
            "the verifier's values are the written ones"
        );
        assert_eq!(written(binding), Some(expected));
    }

    #[test]
    fn a_finish_and_a_resolution_bind_only_the_fields_they_set() {
        let mut done = finish("acme", "c1");
        done.status = ToolCallStatus::Failed;
        done.error_code = Some(ErrorCode::VendorError);
        done.error_text = Some("vendor said \"no\"".to_owned());
        let binding = Binding::default().finish(&done, None);
        assert_eq!(
            written(binding),
            Some(json!({"call": {
                "id": "c1",
                "status": "failed",
                "error_code": "VENDOR_ERROR",
                "error_sha256": toolgate_core::hex::encode(Sha256::digest("vendor said \"no\"")),
                "output_sha256": null,
                "attempts": 1,
            }}))
        );

        let rejected = decide("c1", 1, false, "ana");
        let binding = Binding::default().resolution("c1", &rejected);
        assert_eq!(
            written(binding),
            Some(json!({"call": {
                "id": "c1",
                "status": "blocked",
                "error_code": null,
                "error_sha256": null,
            }}))
        );
        assert_eq!(written(Binding::default()), None);
    }

    #[test]
    fn a_written_binding_folds_into_the_values_it_bound() {
        let new = waiting_call("acme", "c1", None);
        let text = text_of(Binding::default().call(&new.call, "{}", None)).unwrap();
        let mut bound = Bound::default();
        bound.fold(1, &text).unwrap();
        let fields = CallContent::of(&new.call, "{}", None).fields();
        assert_eq!(bound.check("call", "c1", "c1", &fields), Ok(true));

        let mut bound = Bound::default();
        bound.fold(1, &text).unwrap();
        let mut rewritten = fields;
        rewritten.insert("status".into(), "succeeded".into());
        let (at, problem) = bound.check("call", "c1", "c1", &rewritten).unwrap_err();
        assert_eq!(at, 1);
        assert!(problem.contains("its status is \"succeeded\""), "{problem}");
    }
}
