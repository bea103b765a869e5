//! Behaviour of the crate through its public API: schema generation, loading and evaluation.

use serde_json::{Value, json};
use toolgate_core::{AgentId, Decision, RiskLevel, RunId, TenantId, ToolName, ToolSpec};

use crate::{
    CompiledPolicy, DEFAULT_POLICY, PolicyDecision, PolicyError, PolicyRequest, PolicySchema,
};

/// Tools of several shapes: read-only low, write medium, financial high, and one whose schema
/// holds every JSON Schema type plus some that have no Cedar type.
fn specs() -> Vec<ToolSpec> {
    let tool = |name: &str, schema: Value| {
        ToolSpec::new(ToolName::new(name).unwrap(), "test tool", schema)
    };
    vec![
        tool(
            "docs.search",
            json!({"type": "object", "required": ["query"], "properties": {
                "query": {"type": "string"},
                "limit": {"type": "integer"}
            }}),
        )
        .tag("read_only"),
        tool(
            "slack.post_message",
            json!({"type": "object", "required": ["channel", "text"], "properties": {
                "channel": {"type": "string"},
                "text": {"type": "string"},
                "thread_ts": {"type": ["string", "null"]}
            }}),
        )
        .tag("write")
        .risk(RiskLevel::Medium),
        tool(
            "slack.list_channels",
            json!({"type": "object", "properties": {}}),
        )
        .tag("read_only")
        .idempotent(true),
        tool(
            "payments.refund",
            json!({"type": "object", "required": ["amount", "currency", "region"], "properties": {
                "amount": {"type": "integer"},
                "currency": {"type": "string"},
                "region": {"type": "string"},
                "metadata": {"oneOf": [{"type": "string"}, {"type": "object"}]}
            }}),
        )
        .tag("write")
        .tag("financial")
        .risk(RiskLevel::High),
        tool(
            "aws.ec2_inventory",
            json!({"type": "object", "required": ["region"], "properties": {
                "region": {"type": "string"},
                "ratio": {"type": "number"},
                "dry_run": {"type": "boolean"},
                "states": {"type": "array", "items": {"type": "string"}},
                "filters": {"type": "object", "required": ["tag"], "properties": {
                    "tag": {"type": "string"},
                    "min_cpus": {"type": "integer"}
                }},
                "anything": {}
            }}),
        )
        .tag("read_only")
        .idempotent(true),
    ]
}

fn schema() -> PolicySchema {
    PolicySchema::from_specs(&specs()).unwrap()
}

fn spec(name: &str) -> ToolSpec {
    specs()
        .into_iter()
        .find(|spec| spec.name.as_str() == name)
        .unwrap_or_else(|| panic!("no test tool {name}"))
}

fn evaluate(policy: &CompiledPolicy, tool: &ToolSpec, arguments: &Value) -> PolicyDecision {
    let tenant = TenantId::new("acme").unwrap();
    let agent = AgentId::new("support-bot").unwrap();
    let run = RunId::new("run-1").unwrap();
    policy.evaluate(&PolicyRequest {
        tenant: &tenant,
        agent: &agent,
        run: &run,
        tool,
        arguments,
    })
}

/// Loads `text` (version 7), evaluates one call and checks the decision and deciding ids.
fn check(
    text: &str,
    tool: &str,
    arguments: Value,
    decision: Decision,
    ids: &[&str],
) -> PolicyDecision {
    let policy = CompiledPolicy::compile(&schema(), text, 7)
        .unwrap_or_else(|error| panic!("policy must load: {error}"));
    let got = evaluate(&policy, &spec(tool), &arguments);
    let ids: Vec<String> = ids.iter().map(|id| id.to_string()).collect();
    assert_eq!(
        (got.decision, &got.policy_ids),
        (decision, &ids),
        "{tool} {arguments}: {got:?}"
    );
    assert_eq!(got.policy_version, 7);
    got
}

/// Loads `text`, expecting an error whose message contains every one of `needles`.
fn check_load_error(text: &str, needles: &[&str]) -> PolicyError {
    let error = match CompiledPolicy::compile(&schema(), text, 1) {
        Ok(policy) => panic!("policy must not load: {policy:?}"),
        Err(error) => error,
    };
    let message = error.to_string();
    for needle in needles {
        assert!(message.contains(needle), "`{needle}` not in: {message}");
    }
    error
}

const ALLOW_ALL: &str = r#"@id("allow-all") permit (principal, action, resource);"#;

#[test]
fn default_policy_decides_by_tags_and_risk() {
    let cases: &[(&str, Value, Decision, &str, RiskLevel)] = &[
        (
            "docs.search",
            json!({"query": "q"}),
            Decision::Allow,
            "default-read-only",
            RiskLevel::Low,
        ),
        (
            "slack.list_channels",
            json!({}),
            Decision::Allow,
            "default-read-only",
            RiskLevel::Low,
        ),
        (
            "aws.ec2_inventory",
            json!({"region": "eu-west-3"}),
            Decision::Allow,
            "default-read-only",
            RiskLevel::Low,
        ),
        (
            "slack.post_message",
            json!({"channel": "#x", "text": "hi"}),
            Decision::Observe,
            "default-observe",
            RiskLevel::Medium,
        ),
        (
            "payments.refund",
            json!({"amount": 5, "currency": "EUR", "region": "eu-west-1"}),
            Decision::RequireExpertApproval,
            "default-high-risk",
            RiskLevel::High,
        ),
    ];
    for (tool, arguments, decision, id, risk) in cases {
        let got = check(DEFAULT_POLICY, tool, arguments.clone(), *decision, &[id]);
        assert_eq!(got.risk, *risk, "{tool}");
    }
}

#[test]
fn default_policy_covers_every_combination_of_tags_and_risk() {
    // The first two default policies are complementary, so no tool is ever left unpermitted.
    let mut tools = Vec::new();
    for (index, tags) in [&[][..], &["read_only"], &["write"], &["read_only", "write"]]
        .into_iter()
        .enumerate()
    {
        for risk in [RiskLevel::Low, RiskLevel::Medium, RiskLevel::High] {
            let name = format!("t.tool_{index}_{risk}");
            let mut spec =
                ToolSpec::new(ToolName::new(name).unwrap(), "x", json!({"type": "object"}))
                    .risk(risk);
            for tag in tags {
                spec = spec.tag(tag);
            }
            tools.push(spec);
        }
    }
    let schema = PolicySchema::from_specs(&tools).unwrap();
    let policy = CompiledPolicy::compile(&schema, DEFAULT_POLICY, 1).unwrap();
    for tool in &tools {
        let got = evaluate(&policy, tool, &json!({}));
        let expected = match (
            tool.risk,
            tool.has_tag("read_only") && !tool.has_tag("write"),
        ) {
            (RiskLevel::High, _) => Decision::RequireExpertApproval,
            (RiskLevel::Low, true) => Decision::Allow,
            _ => Decision::Observe,
        };
        assert_eq!(got.decision, expected, "{}: {got:?}", tool.name);
    }
}

#[test]
fn arguments_steer_decisions() {
    let amount = r#"
        @id("allow-all") permit (principal, action, resource);
        @id("large-refund")
        @decision("require_expert_approval")
        @risk("high")
        permit (principal, action == Toolgate::Action::"payments.refund", resource)
        when { context.args.amount > 1000 };
    "#;
    let region = r#"
        @id("allow-all") permit (principal, action, resource);
        @id("block-eu-west-3")
        forbid (principal, action, resource)
        when { context.args has region && context.args.region == "eu-west-3" };
    "#;
    let shapes = r#"
        @id("ratio") permit (principal, action == Toolgate::Action::"aws.ec2_inventory", resource)
        when { context.args has ratio && context.args.ratio.greaterThan(decimal("0.5")) };
        @id("running") permit (principal, action == Toolgate::Action::"aws.ec2_inventory", resource)
        when { context.args has states && context.args.states.contains("running") };
        @id("prod") permit (principal, action == Toolgate::Action::"aws.ec2_inventory", resource)
        when { context.args has filters && context.args.filters.tag == "prod" };
        @id("thread") permit (principal, action == Toolgate::Action::"slack.post_message", resource)
        when { context.args has thread_ts && context.args.thread_ts == "1.2" };
    "#;
    let who = r#"
        @id("bot-in-acme")
        permit (principal == Toolgate::Agent::"support-bot", action in Toolgate::Action::"family:slack", resource)
        when { context.tenant == "acme" && context.run like "run-*" && resource.family == "slack" };
        @id("other-bot") permit (principal == Toolgate::Agent::"other-bot", action, resource);
    "#;
    // Policies are pre-filtered per tool by scope; every kind of scope must still match.
    let scopes = r#"
        @id("list") permit (principal, action in [Toolgate::Action::"docs.search", Toolgate::Action::"family:slack"], resource);
        @id("eq-resource") @decision("observe") permit (principal, action, resource == Toolgate::Tool::"docs.search");
        @id("in-resource") @decision("observe") permit (principal, action, resource in Toolgate::Tool::"slack.list_channels");
        @id("is-resource") @decision("require_client_approval") permit (principal, action, resource is Toolgate::Tool)
        when { resource.idempotent && resource.family == "aws" };
    "#;
    let refund = |amount: Value, region: &str| json!({"amount": amount, "currency": "EUR", "region": region});
    let post = |thread: Value| json!({"channel": "#c", "text": "t", "thread_ts": thread});
    let cases: &[(&str, &str, Value, Decision, &[&str])] = &[
        (
            amount,
            "payments.refund",
            refund(json!(1500), "x"),
            Decision::RequireExpertApproval,
            &["large-refund"],
        ),
        (
            amount,
            "payments.refund",
            refund(json!(10), "x"),
            Decision::Allow,
            &["allow-all"],
        ),
        (
            amount,
            "payments.refund",
            refund(json!(1000), "x"),
            Decision::Allow,
            &["allow-all"],
        ),
        (
            region,
            "payments.refund",
            refund(json!(10), "eu-west-3"),
            Decision::Block,
            &["block-eu-west-3"],
        ),
        (
            region,
            "aws.ec2_inventory",
            json!({"region": "eu-west-3"}),
            Decision::Block,
            &["block-eu-west-3"],
        ),
        (
            region,
            "aws.ec2_inventory",
            json!({"region": "us-east-1"}),
            Decision::Allow,
            &["allow-all"],
        ),
        (
            region,
            "docs.search",
            json!({"query": "eu-west-3"}),
            Decision::Allow,
            &["allow-all"],
        ),
        (
            shapes,
            "aws.ec2_inventory",
            json!({"region": "r", "ratio": 0.75}),
            Decision::Allow,
            &["ratio"],
        ),
        (
            shapes,
            "aws.ec2_inventory",
            json!({"region": "r", "ratio": 0.25}),
            Decision::Block,
            &[],
        ),
        (
            shapes,
            "aws.ec2_inventory",
            json!({"region": "r", "states": ["stopped", "running"]}),
            Decision::Allow,
            &["running"],
        ),
        (
            shapes,
            "aws.ec2_inventory",
            json!({"region": "r", "filters": {"tag": "prod", "extra": 1}}),
            Decision::Allow,
            &["prod"],
        ),
        (
            shapes,
            "aws.ec2_inventory",
            json!({"region": "r", "anything": {"x": 1}, "not_in_schema": 2}),
            Decision::Block,
            &[],
        ),
        (
            shapes,
            "slack.post_message",
            post(json!("1.2")),
            Decision::Allow,
            &["thread"],
        ),
        (
            shapes,
            "slack.post_message",
            post(Value::Null),
            Decision::Block,
            &[],
        ),
        (
            who,
            "slack.post_message",
            post(Value::Null),
            Decision::Allow,
            &["bot-in-acme"],
        ),
        (
            who,
            "docs.search",
            json!({"query": "q"}),
            Decision::Block,
            &[],
        ),
        (
            scopes,
            "docs.search",
            json!({"query": "q"}),
            Decision::Observe,
            &["eq-resource"],
        ),
        (
            scopes,
            "slack.post_message",
            post(Value::Null),
            Decision::Allow,
            &["list"],
        ),
        (
            scopes,
            "slack.list_channels",
            json!({}),
            Decision::Observe,
            &["in-resource"],
        ),
        (
            scopes,
            "aws.ec2_inventory",
            json!({"region": "r"}),
            Decision::RequireClientApproval,
            &["is-resource"],
        ),
        (
            scopes,
            "payments.refund",
            refund(json!(1), "r"),
            Decision::Block,
            &[],
        ),
    ];
    for (text, tool, arguments, decision, ids) in cases {
        check(text, tool, arguments.clone(), *decision, ids);
    }
}

#[test]
fn the_strictest_satisfied_decision_wins() {
    let text = r##"
        @id("observe-slack") @decision("observe")
        permit (principal, action in Toolgate::Action::"family:slack", resource);
        @id("client-general") @decision("require_client_approval")
        permit (principal, action == Toolgate::Action::"slack.post_message", resource)
        when { context.args.channel == "#general" };
        @id("expert-writes") @decision("require_expert_approval")
        permit (principal, action, resource) when { resource.tags.contains("write") };
        @id("also-observe") @decision("observe") @description("a second observer")
        permit (principal, action == Toolgate::Action::"slack.list_channels", resource);
    "##;
    let post = |channel: &str| json!({"channel": channel, "text": "t"});
    let cases: &[(&str, Value, Decision, &[&str])] = &[
        (
            "slack.post_message",
            post("#general"),
            Decision::RequireClientApproval,
            &["client-general"],
        ),
        (
            "slack.post_message",
            post("#random"),
            Decision::RequireExpertApproval,
            &["expert-writes"],
        ),
        (
            "slack.list_channels",
            json!({}),
            Decision::Observe,
            &["observe-slack", "also-observe"],
        ),
    ];
    for (tool, arguments, decision, ids) in cases {
        check(text, tool, arguments.clone(), *decision, ids);
    }
    // The risk is the larger of the tool's and the deciding policies' @risk.
    let risky = r#"@id("risky") @risk("high") permit (principal, action, resource);"#;
    let got = check(
        risky,
        "docs.search",
        json!({"query": "q"}),
        Decision::Allow,
        &["risky"],
    );
    assert_eq!(got.risk, RiskLevel::High);
    let got = check(
        ALLOW_ALL,
        "slack.post_message",
        post("#c"),
        Decision::Allow,
        &["allow-all"],
    );
    assert_eq!(got.risk, RiskLevel::Medium);
    // A permit may block too; without an @id, Cedar's generated id is reported.
    let text = "permit (principal, action, resource);\n@decision(\"block\") permit (principal, action, resource);";
    let got = check(
        text,
        "docs.search",
        json!({"query": "q"}),
        Decision::Block,
        &["policy1"],
    );
    assert_eq!(got.reason, "blocked by policy `policy1`");
}

#[test]
fn nothing_permitted_blocks() {
    let only_docs = r#"@id("only-docs") permit (principal, action == Toolgate::Action::"docs.search", resource);"#;
    for text in [only_docs, "", "// nothing here\n"] {
        let got = check(
            text,
            "slack.post_message",
            json!({"channel": "#c", "text": "t"}),
            Decision::Block,
            &[],
        );
        assert_eq!(got.reason, "no policy permits this call");
        assert_eq!(got.risk, RiskLevel::Medium);
    }
}

#[test]
fn decisions_carry_ids_version_and_reason() {
    let schema = schema();
    let policy = CompiledPolicy::compile(&schema, DEFAULT_POLICY, 42).unwrap();
    assert_eq!(policy.version(), 42);
    let got = evaluate(
        &policy,
        &spec("slack.post_message"),
        &json!({"channel": "#c", "text": "t"}),
    );
    assert_eq!(
        got,
        PolicyDecision {
            decision: Decision::Observe,
            risk: RiskLevel::Medium,
            policy_ids: vec!["default-observe".into()],
            policy_version: 42,
            reason: "allowed and recorded for review by policy `default-observe`".into(),
        }
    );
}

#[test]
fn calls_that_cannot_be_evaluated_block() {
    let overflow_forbid = r#"
        @id("allow-all") permit (principal, action, resource);
        @id("overflow") forbid (principal, action == Toolgate::Action::"payments.refund", resource)
        when { context.args.amount * 1000000000000 < 0 };
    "#;
    let overflow_permit = r#"
        @id("allow-all") permit (principal, action, resource);
        @id("huge") @decision("require_expert_approval")
        permit (principal, action == Toolgate::Action::"payments.refund", resource)
        when { context.args.amount * 1000000000000 > 5000000000000000 };
    "#;
    let refund = |amount: Value| json!({"amount": amount, "currency": "EUR", "region": "r"});
    let cases: &[(&str, Value, Decision, &[&str], &str)] = &[
        (
            overflow_forbid,
            refund(json!(1)),
            Decision::Allow,
            &["allow-all"],
            "allowed by policy `allow-all`",
        ),
        (
            overflow_forbid,
            refund(json!(9_000_000_000_i64)),
            Decision::Block,
            &["overflow"],
            "could not be evaluated",
        ),
        (
            overflow_permit,
            refund(json!(9_000_000_000_i64)),
            Decision::RequireExpertApproval,
            &["huge"],
            "could not be evaluated",
        ),
        (
            ALLOW_ALL,
            refund(json!("lots")),
            Decision::Block,
            &[],
            "argument `amount` is not an integer",
        ),
        (
            ALLOW_ALL,
            refund(json!(1.5)),
            Decision::Block,
            &[],
            "argument `amount` is not an integer",
        ),
        (
            ALLOW_ALL,
            json!({"currency": "EUR", "region": "r"}),
            Decision::Block,
            &[],
            "argument `amount` is required but missing",
        ),
        (
            ALLOW_ALL,
            json!("not an object"),
            Decision::Block,
            &[],
            "the arguments value is not an object",
        ),
    ];
    for (text, arguments, decision, ids, reason) in cases {
        let got = check(text, "payments.refund", arguments.clone(), *decision, ids);
        assert!(got.reason.contains(reason), "`{reason}` not in {got:?}");
    }

    // A tool registered after the schema was built is unknown to policy.
    let policy = CompiledPolicy::compile(&schema(), ALLOW_ALL, 3).unwrap();
    let stranger = ToolSpec::new(
        ToolName::new("other.tool").unwrap(),
        "x",
        json!({"type": "object"}),
    );
    let got = evaluate(&policy, &stranger, &json!({}));
    assert_eq!((got.decision, got.policy_version), (Decision::Block, 3));
    assert!(
        got.reason
            .contains("`other.tool` is not in the policy schema"),
        "{got:?}"
    );
}

#[test]
fn invalid_policies_are_refused_at_load() {
    let cases: &[(&str, &[&str])] = &[
        // A misspelled argument, with the location and Cedar's suggestion, reported once.
        (
            "@id(\"p\")\npermit (principal, action == Toolgate::Action::\"payments.refund\", resource)\nwhen { context.args.amout > 1000 };",
            &[
                "policy `p` at line 3, column 8",
                "`args.amout`",
                "did you mean `amount`?",
            ],
        ),
        // An argument that exists for some tools only must be guarded with `has`.
        (
            "permit (principal, action, resource) when { context.args.amount > 1 };",
            &["policy `policy0`", "args.amount", "[and for 3 more tools]"],
        ),
        (
            r#"@id("typo") permit (principal, action == Toolgate::Action::"payments.refnd", resource);"#,
            &[
                "policy `typo`",
                "unrecognized action `Toolgate::Action::\"payments.refnd\"`",
                "payments.refund",
            ],
        ),
        (
            r#"permit (principal, action in Toolgate::Action::"family:slak", resource);"#,
            &["family:slak"],
        ),
        (
            r#"permit (principal is Toolgate::Agnt, action, resource);"#,
            &["Toolgate::Agnt"],
        ),
        (
            r#"permit (principal, action, resource) when { resource.riks == "high" };"#,
            &["riks"],
        ),
        // The tenant is in the context; agents have no attributes.
        (
            r#"permit (principal, action, resource) when { principal.tenant == "acme" };"#,
            &["tenant"],
        ),
        // Left out of the schema because it has no Cedar type.
        (
            r#"permit (principal, action == Toolgate::Action::"payments.refund", resource) when { context.args has metadata };"#,
            &["impossible"],
        ),
        (
            r#"permit (principal, action == Toolgate::Action::"payments.refund", resource) when { context.args.metadata == "x" };"#,
            &["metadata"],
        ),
        (
            r#"permit (principal, action == Toolgate::Action::"payments.refund", resource) when { context.args.amount > "1000" };"#,
            &["Long"],
        ),
        // Optional arguments need `has`.
        (
            r#"permit (principal, action == Toolgate::Action::"slack.post_message", resource) when { context.args.thread_ts == "1" };"#,
            &["thread_ts"],
        ),
        // A family group is not an action a call can have.
        (
            r#"permit (principal, action == Toolgate::Action::"family:slack", resource);"#,
            &["unable to find an applicable action"],
        ),
        // Every broken policy is reported.
        (
            "@id(\"a\") permit (principal, action, resource) when { resource.nope };\n@id(\"b\") permit (principal, action, resource) when { resource.nada };",
            &["policy `a`", "nope", "policy `b`", "nada"],
        ),
        // Templates are not supported.
        (
            "@id(\"t\") permit (principal == ?principal, action, resource);",
            &["policy `t` is a template"],
        ),
        // Bidirectional control characters hide what a policy does.
        (
            "permit (principal, action, resource) when { resource.family == \"sl\u{202e}ack\" };",
            &["BIDI control characters"],
        ),
    ];
    for (text, needles) in cases {
        let error = check_load_error(text, needles);
        assert!(matches!(error, PolicyError::Validation(_)), "{error:?}");
    }
}

#[test]
fn annotations_are_checked_at_load() {
    let cases: &[(&str, &str, &str)] = &[
        (
            r#"@id("p1") @decision("maybe") permit (principal, action, resource);"#,
            "p1",
            "unknown decision `maybe`",
        ),
        (
            r#"@risk("extreme") permit (principal, action, resource);"#,
            "policy0",
            "unknown risk level `extreme`",
        ),
        (
            r#"@id("p2") @decison("observe") permit (principal, action, resource);"#,
            "p2",
            "unknown annotation @decison",
        ),
        (
            r#"@id("p3") @decision("observe") forbid (principal, action, resource);"#,
            "p3",
            "a forbid policy always blocks",
        ),
        (
            r#"@id("p4") @decision permit (principal, action, resource);"#,
            "p4",
            "unknown decision ``",
        ),
        (
            r#"@id("") permit (principal, action, resource);"#,
            "",
            "@id must not be empty",
        ),
        (
            "@id(\"twin\") permit (principal, action, resource);\n@id(\"twin\") forbid (principal, action, resource);",
            "twin",
            "ids must be unique",
        ),
        (
            "permit (principal, action, resource);\n@id(\"policy0\") permit (principal, action, resource);",
            "policy0",
            "ids must be unique",
        ),
    ];
    for (text, policy, needle) in cases {
        match check_load_error(text, &[needle]) {
            PolicyError::Annotation { policy: got, .. } => assert_eq!(got, *policy, "{text}"),
            other => panic!("expected an annotation error for {text}, got {other:?}"),
        }
    }
    // @decision("block") on a forbid is redundant but true.
    let text = r#"@id("f") @decision("block") forbid (principal, action, resource);"#;
    check(
        text,
        "docs.search",
        json!({"query": "q"}),
        Decision::Block,
        &["f"],
    );
}

#[test]
fn malformed_cedar_is_a_parse_error_with_its_location() {
    let text = "@id(\"p\")\npermit (principal, action, resource)\nwhen { context.args.amount > };";
    let error = check_load_error(text, &["line 3, column 30", "unexpected token `}`"]);
    assert!(
        matches!(error, PolicyError::Parse(ref messages) if messages.len() == 1),
        "{error:?}"
    );
    check_load_error("permit (principal, action, resource)", &["line 1"]);
}

#[test]
fn mixed_scripts_load_with_a_warning() {
    // "#gеneral" with a Cyrillic "е".
    let text = "@id(\"w\") permit (principal, action == Toolgate::Action::\"slack.post_message\", resource) when { context.args.channel == \"#g\u{0435}neral\" };";
    let policy = CompiledPolicy::compile(&schema(), text, 1).unwrap();
    assert_eq!(policy.warnings().len(), 1, "{:?}", policy.warnings());
    assert!(
        policy.warnings()[0].starts_with("policy `w` at line 1"),
        "{:?}",
        policy.warnings()
    );
    let clean = CompiledPolicy::compile(&schema(), DEFAULT_POLICY, 1).unwrap();
    assert!(clean.warnings().is_empty(), "{:?}", clean.warnings());
}

#[test]
fn schema_text_is_readable_cedar_listing_what_was_left_out() {
    let text = schema().cedar_schema_text();
    for needle in [
        "namespace Toolgate",
        "entity Agent;",
        "run: String,\n      tenant: String",
        "tags: Set<String>",
        r#"action "slack.post_message" in [Action::"family:slack"]"#,
        r#"action "family:slack";"#,
        "amount: Long",
        "ratio?: decimal",
        "thread_ts?: String",
        "states?: Set<String>",
        r#"payments.refund: "context.args.metadata": it declares no `type`"#,
        r#"aws.ec2_inventory: "context.args.anything""#,
    ] {
        assert!(text.contains(needle), "`{needle}` not in:\n{text}");
    }
    assert!(!text.contains("__cedar"), "{text}");
    let (parsed, _warnings) = cedar_policy::Schema::from_cedarschema_str(&text)
        .unwrap_or_else(|error| panic!("schema text must parse back: {error:?}\n{text}"));
    assert_eq!(
        parsed.actions().count(),
        5 + 4,
        "five tools and four families"
    );
}

#[test]
fn schemas_are_built_from_any_registry() {
    let twice = [spec("docs.search"), spec("docs.search")];
    let error = PolicySchema::from_specs(&twice).unwrap_err();
    assert!(
        error.to_string().contains("`docs.search` is listed twice"),
        "{error}"
    );

    // With no tools nothing can be called, but the default policy still loads.
    let empty = PolicySchema::from_specs(&[]).unwrap();
    let policy = CompiledPolicy::compile(&empty, DEFAULT_POLICY, 1);
    assert!(policy.is_ok(), "{policy:?}");
    assert_eq!(format!("{empty:?}"), "PolicySchema { tools: {}, .. }");
}

#[test]
fn compiled_policies_are_shareable_across_threads() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<CompiledPolicy>();
    assert_send_sync::<PolicySchema>();
    assert_send_sync::<PolicyDecision>();
}

/// One call of `agent` in tenant `tenant`, run `run`.
fn evaluate_as(
    policy: &CompiledPolicy,
    (tenant, agent, run): (&str, &str, &str),
    tool: &ToolSpec,
    arguments: &Value,
) -> PolicyDecision {
    policy.evaluate(&PolicyRequest {
        tenant: &TenantId::new(tenant).unwrap(),
        agent: &AgentId::new(agent).unwrap(),
        run: &RunId::new(run).unwrap(),
        tool,
        arguments,
    })
}

#[test]
fn answers_worked_out_in_advance_are_cedars_own() {
    // Sets whose answer for a tool cannot depend on the call, and sets reading the caller or
    // the context only in a condition (their scopes match everyone).
    let texts = [
        DEFAULT_POLICY,
        ALLOW_ALL,
        r#"@id("all") permit (principal, action, resource);
           @id("no-high") forbid (principal, action, resource) when { resource.risk == "high" };
           @id("weird") @decision("observe") permit (principal, action, resource)
           when { resource.tags.contains("write") || resource.family like "sl*" };"#,
        r#"@id("bot") permit (principal, action, resource)
           when { principal == Toolgate::Agent::"support-bot" };"#,
        r#"@id("acme") permit (principal, action, resource) when { context.tenant == "acme" };"#,
        r#"@id("runs") permit (principal, action, resource) unless { context.run like "run-9*" };"#,
        r#"@id("all") permit (principal, action, resource);
           @id("eu") forbid (principal, action == Toolgate::Action::"payments.refund", resource)
           when { context.args.region == "eu-west-1" };"#,
    ];
    let callers = [
        ("acme", "support-bot", "run-1"),
        ("globex", "other-bot", "run-99"),
    ];
    let arguments = [
        json!({"query": "q", "channel": "#x", "text": "t", "amount": 5, "currency": "EUR", "region": "eu-west-1"}),
        json!({"query": "q", "channel": "#y", "text": "t", "amount": 7, "currency": "USD", "region": "us-east-1"}),
        json!({"amount": 1.5}),
    ];
    for text in texts {
        let policy = CompiledPolicy::compile(&schema(), text, 2).unwrap();
        let asked = CompiledPolicy::compile(&schema(), text, 2)
            .unwrap()
            .without_fixed_answers();
        for tool in specs() {
            for caller in callers {
                for arguments in &arguments {
                    assert_eq!(
                        evaluate_as(&policy, caller, &tool, arguments),
                        evaluate_as(&asked, caller, &tool, arguments),
                        "{text}\n{} {caller:?} {arguments}",
                        tool.name
                    );
                }
            }
        }
    }

    // Which tools were worked out in advance: every one under a set that reads only the tool,
    // none under a set reading the caller or the context everywhere, and all but the tool a
    // context condition is scoped to.
    let fixed = |text: &str| {
        CompiledPolicy::compile(&schema(), text, 1)
            .unwrap()
            .fixed_answers()
    };
    let tools = specs().len();
    assert_eq!(fixed(DEFAULT_POLICY), tools);
    assert_eq!(fixed(texts[2]), tools);
    assert_eq!(fixed(texts[3]), 0);
    assert_eq!(fixed(texts[4]), 0);
    assert_eq!(fixed(texts[5]), 0);
    assert_eq!(fixed(texts[6]), tools - 1);
    let scoped =
        r#"@id("bot") permit (principal == Toolgate::Agent::"support-bot", action, resource);"#;
    assert_eq!(fixed(scoped), 0);
}

#[test]
fn policies_naming_the_caller_only_in_conditions_still_tell_callers_apart() {
    let tool = spec("slack.post_message");
    let arguments = json!({"channel": "#x", "text": "hi"});
    let cases: &[(&str, (&str, &str, &str), Decision)] = &[
        (
            r#"@id("bot") permit (principal, action, resource)
               when { principal == Toolgate::Agent::"support-bot" };"#,
            ("acme", "support-bot", "run-1"),
            Decision::Allow,
        ),
        (
            r#"@id("bot") permit (principal, action, resource)
               when { principal == Toolgate::Agent::"support-bot" };"#,
            ("acme", "other-bot", "run-1"),
            Decision::Block,
        ),
        (
            r#"@id("acme") permit (principal, action, resource) when { context.tenant == "acme" };"#,
            ("acme", "other-bot", "run-1"),
            Decision::Allow,
        ),
        (
            r#"@id("acme") permit (principal, action, resource) when { context.tenant == "acme" };"#,
            ("globex", "other-bot", "run-1"),
            Decision::Block,
        ),
    ];
    for (text, caller, decision) in cases {
        let policy = CompiledPolicy::compile(&schema(), text, 1).unwrap();
        let got = evaluate_as(&policy, *caller, &tool, &arguments);
        assert_eq!(got.decision, *decision, "{text} {caller:?}: {got:?}");
    }
}
