//! toolgate's policy: per-tenant Cedar policy sets, validated against a Cedar schema generated
//! from the registered tool specs, deciding allow / observe / require approval / block with a
//! risk level for every tool call. Pure: no I/O, no async, no global state.
//!
//! # The model
//!
//! [`PolicySchema::from_specs`] generates a schema in the namespace `Toolgate`:
//!
//! - principal `Toolgate::Agent::"<agent id>"`, without attributes;
//! - resource `Toolgate::Tool::"<tool name>"`, attributes `tags: Set<String>`, `risk: String`
//!   (`low`, `medium`, `high`), `idempotent: Bool`, `family: String`;
//! - one action per tool, `Toolgate::Action::"slack.post_message"`, member of the action group
//!   `Toolgate::Action::"family:slack"`, with context
//!   `{ tenant: String, run: String, args: <record> }` where `args` is typed from the tool's
//!   input JSON Schema.
//!
//! The tenant is in the context rather than an attribute of the agent so that no entity has
//! to be built per call: the entity store of each tool (the tool, its action and its family
//! group) is built once, and an agent missing from it behaves exactly like an agent without
//! attributes or parents.
//!
//! Policies are validated strictly against it when they are loaded, so a misspelled attribute,
//! tool or family is a load error naming the policy, line and column, never a silent miss.
//! [`PolicySchema::cedar_schema_text`] prints it for policy authors.
//!
//! # JSON Schema to Cedar
//!
//! Only the `type` keyword decides (plus `properties` / `required` / `items` below it):
//!
//! | JSON Schema                         | Cedar                                          |
//! |-------------------------------------|------------------------------------------------|
//! | `string`                            | `String`                                       |
//! | `integer`                           | `Long` (64-bit; 3.0 counts as 3)               |
//! | `boolean`                           | `Bool`                                         |
//! | `number`                            | `decimal`, rounded to 4 fractional digits      |
//! | `array` with one `items` schema     | `Set<item>` (order and duplicates are lost)    |
//! | `object`                            | record of its mappable `properties`            |
//! | `["<type>", "null"]`                | that type, as an optional attribute            |
//!
//! A property is required in Cedar when it is in `required` and not nullable; otherwise it is
//! optional and policies must test it with `has` first (`context.args has thread_ts && ...`).
//! A `number` becomes a `decimal` because it is Cedar's only non-integer type; decimals have 4
//! fractional digits and a range of about ±9.2e14, so values are rounded to 4 digits (a
//! difference below 0.00005, which no `decimal("...")` literal in a policy can express) and
//! values outside the range block the call. Compare decimals with their methods:
//! `context.args.ratio.greaterThan(decimal("0.5"))`.
//!
//! Properties that cannot be mapped (no `type`, as with `oneOf` / `anyOf` / `$ref`; several
//! types; `null` only; arrays without a single `items` schema or with nullable items) are
//! **left out** of the schema: a policy that references one fails validation at load time
//! ("attribute not found"), and the schema text lists every left-out property with the reason.
//! Properties of an argument value that are not in the schema are dropped when the value is
//! converted.
//!
//! # Decisions
//!
//! A `permit` may carry `@decision("observe")` (also `require_expert_approval`,
//! `require_client_approval`, `block`; none means `allow`) and `@risk("low" | "medium" |
//! "high")`; `@id("...")` names the policy in decisions and errors (else Cedar's `policy0`,
//! `policy1`, ...), and `@description("...")` is free text. Other annotations, invalid values,
//! `@decision` on a `forbid`, and duplicate ids are load errors. Then, for each call:
//!
//! - a satisfied `forbid` blocks, naming every satisfied forbid;
//! - otherwise the strictest `@decision` among satisfied permits wins, naming the satisfied
//!   permits that carry it;
//! - when nothing permits, the call is blocked ("no policy permits this call");
//! - the risk is the larger of the tool's risk and the `@risk` of the deciding policies;
//! - a policy that fails to evaluate never loosens the outcome: a failing `forbid` blocks, and
//!   a failing permit whose decision is stricter than the outcome imposes its decision;
//! - arguments that cannot be converted block, with a reason naming the argument.
//!
//! [`DEFAULT_POLICY`] is the set a tenant starts with.
//!
//! # Cost
//!
//! Cedar evaluates every policy it is given (about 1 µs each), so a compiled policy keeps, per
//! tool, only the policies whose action and resource scope can match that tool; rules written
//! for one tool cost nothing on the others. Requests are not re-validated against the schema:
//! the context is built from the schema's own types. Evaluating a call under the default
//! policy takes about 7 µs in a release build.

mod compiled;
mod default;
mod error;
mod schema;
mod shape;

pub use compiled::{CompiledPolicy, PolicyDecision, PolicyRequest};
pub use default::DEFAULT_POLICY;
pub use error::PolicyError;
pub use schema::PolicySchema;

#[cfg(test)]
mod tests;
