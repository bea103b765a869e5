//! Policy decisions, risk levels and tool call statuses: the small closed vocabularies every
//! layer speaks.

use std::fmt;
use std::str::FromStr;

/// What policy says about one call. Ordered from least to most strict, so `max` picks the
/// strictest of several satisfied rules.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Decision {
    /// Execute.
    Allow,
    /// Execute, and flag the call for later review.
    Observe,
    /// Suspend until an expert (operator) approves.
    RequireExpertApproval,
    /// Suspend until the client (end user) approves.
    RequireClientApproval,
    /// Refuse.
    Block,
}

impl Decision {
    /// Every decision, least strict first.
    pub const ALL: [Decision; 5] = [
        Decision::Allow,
        Decision::Observe,
        Decision::RequireExpertApproval,
        Decision::RequireClientApproval,
        Decision::Block,
    ];

    /// The stable name used in Cedar annotations, storage and the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            Decision::Allow => "allow",
            Decision::Observe => "observe",
            Decision::RequireExpertApproval => "require_expert_approval",
            Decision::RequireClientApproval => "require_client_approval",
            Decision::Block => "block",
        }
    }

    /// Whether the call executes without a human decision.
    pub fn executes(self) -> bool {
        matches!(self, Decision::Allow | Decision::Observe)
    }

    /// Whether the call waits for a human decision.
    pub fn needs_approval(self) -> bool {
        matches!(
            self,
            Decision::RequireExpertApproval | Decision::RequireClientApproval
        )
    }
}

impl fmt::Display for Decision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Decision {
    type Err = String;

    fn from_str(s: &str) -> Result<Decision, String> {
        Decision::ALL
            .into_iter()
            .find(|d| d.as_str() == s)
            .ok_or_else(|| {
                format!(
                    "unknown decision `{s}` (expected one of allow, observe, require_expert_approval, require_client_approval, block)"
                )
            })
    }
}

/// How much harm a call can do. Ordered from least to most risky.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub enum RiskLevel {
    /// Reads, reversible effects.
    #[default]
    Low,
    /// Writes with limited blast radius.
    Medium,
    /// Money, deletion, mass effects.
    High,
}

impl RiskLevel {
    /// The stable name.
    pub fn as_str(self) -> &'static str {
        match self {
            RiskLevel::Low => "low",
            RiskLevel::Medium => "medium",
            RiskLevel::High => "high",
        }
    }
}

impl fmt::Display for RiskLevel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for RiskLevel {
    type Err = String;

    fn from_str(s: &str) -> Result<RiskLevel, String> {
        match s {
            "low" => Ok(RiskLevel::Low),
            "medium" => Ok(RiskLevel::Medium),
            "high" => Ok(RiskLevel::High),
            other => Err(format!(
                "unknown risk level `{other}` (expected low, medium or high)"
            )),
        }
    }
}

/// Where a tool call stands. Stored in the ledger and sent on the wire by name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ToolCallStatus {
    /// The connector has been (or is about to be) called.
    Running,
    /// The connector answered with a result.
    Succeeded,
    /// The call failed (a validation, credential or vendor failure).
    Failed,
    /// The call was refused before execution (kill switch, manifest, policy, budget).
    Blocked,
    /// The call is suspended until a human decides.
    WaitingApproval,
    /// A human approved the call; it has been handed to execution.
    Approved,
    /// The gateway's deadline passed before the connector answered.
    TimedOut,
    /// The vendor may or may not have acted (crash or timeout of a non-idempotent call).
    OutcomeUnknown,
}

impl ToolCallStatus {
    /// Every status.
    pub const ALL: [ToolCallStatus; 8] = [
        ToolCallStatus::Running,
        ToolCallStatus::Succeeded,
        ToolCallStatus::Failed,
        ToolCallStatus::Blocked,
        ToolCallStatus::WaitingApproval,
        ToolCallStatus::Approved,
        ToolCallStatus::TimedOut,
        ToolCallStatus::OutcomeUnknown,
    ];

    /// The stable name.
    pub fn as_str(self) -> &'static str {
        match self {
            ToolCallStatus::Running => "running",
            ToolCallStatus::Succeeded => "succeeded",
            ToolCallStatus::Failed => "failed",
            ToolCallStatus::Blocked => "blocked",
            ToolCallStatus::WaitingApproval => "waiting_approval",
            ToolCallStatus::Approved => "approved",
            ToolCallStatus::TimedOut => "timed_out",
            ToolCallStatus::OutcomeUnknown => "outcome_unknown",
        }
    }

    /// Whether no further transition is expected.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            ToolCallStatus::Succeeded
                | ToolCallStatus::Failed
                | ToolCallStatus::Blocked
                | ToolCallStatus::TimedOut
                | ToolCallStatus::OutcomeUnknown
        )
    }
}

impl fmt::Display for ToolCallStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for ToolCallStatus {
    type Err = String;

    fn from_str(s: &str) -> Result<ToolCallStatus, String> {
        ToolCallStatus::ALL
            .into_iter()
            .find(|status| status.as_str() == s)
            .ok_or_else(|| format!("unknown tool call status `{s}`"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strictest_decision_is_the_maximum() {
        let satisfied = [Decision::Observe, Decision::Block, Decision::Allow];
        assert_eq!(satisfied.iter().max(), Some(&Decision::Block));
        assert!(Decision::RequireClientApproval > Decision::RequireExpertApproval);
    }

    #[test]
    fn names_round_trip() {
        for d in Decision::ALL {
            assert_eq!(d.as_str().parse::<Decision>(), Ok(d));
        }
        for s in ToolCallStatus::ALL {
            assert_eq!(s.as_str().parse::<ToolCallStatus>(), Ok(s));
        }
        for r in [RiskLevel::Low, RiskLevel::Medium, RiskLevel::High] {
            assert_eq!(r.as_str().parse::<RiskLevel>(), Ok(r));
        }
        assert!("maybe".parse::<Decision>().is_err());
    }
}
