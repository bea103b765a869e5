//! The default policy set: ordinary Cedar text, derived from each tool's tags and risk level,
//! that a tenant can read, download and replace.

/// The policy set a tenant has until it installs its own.
///
/// It reads only the tool's attributes, so it is the same text whatever tools are registered,
/// and it covers every tool: the first two policies are complementary, so something always
/// permits, and the strictest satisfied decision wins.
pub const DEFAULT_POLICY: &str = r#"// toolgate default policy, derived from each tool's tags and risk level.
// Replace it with your own: every policy is validated against the schema generated from the
// registered tools (`toolgate policy schema`). The strictest satisfied decision wins
// (allow < observe < require_expert_approval < require_client_approval < block); a satisfied
// forbid blocks; a call that no policy permits is blocked.

// Low-risk tools that only read run without review.
@id("default-read-only")
permit (principal, action, resource)
when
{
  resource.risk == "low" &&
  resource.tags.contains("read_only") &&
  !resource.tags.contains("write")
};

// Everything else (writes, tools not declared read-only, medium risk) runs and is recorded
// for review.
@id("default-observe")
@decision("observe")
permit (principal, action, resource)
when
{
  resource.risk != "low" ||
  !resource.tags.contains("read_only") ||
  resource.tags.contains("write")
};

// High-risk tools wait for an expert's approval.
@id("default-high-risk")
@decision("require_expert_approval")
@risk("high")
permit (principal, action, resource)
when { resource.risk == "high" };
"#;
