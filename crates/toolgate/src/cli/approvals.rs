//! `toolgate approvals`: pending invocations listed, shown and decided with an approver token.

use std::process::ExitCode;

use clap::{Args, Subcommand, ValueEnum};
use toolgate_proto::v1 as pb;
use toolgate_proto::v1::approval_service_client::ApprovalServiceClient;

use super::call::call_exit_code;
use super::output::print_message;
use super::{Connection, EXIT_NOT_DECIDED, TokenRole};

/// `toolgate approvals` subcommands (needs an approver token, from TOOLGATE_APPROVER_TOKEN or
/// --token-file).
#[derive(Debug, Subcommand)]
pub(crate) enum ApprovalsCommand {
    /// Invocations awaiting a decision.
    List {
        #[arg(long)]
        run: Option<String>,
        #[arg(long)]
        tool: Option<String>,
        /// Why the invocation was suspended.
        #[arg(long, value_enum, ignore_case = true)]
        origin: Option<Origin>,
    },
    /// One invocation.
    Show { invocation_id: String },
    /// Approves: the call executes once, and its outcome is printed.
    Approve(Decision),
    /// Rejects: the call ends without executing.
    Reject(Decision),
    /// Lets the run move on without executing the call (it ends SKIPPED); resolves any
    /// pending invocation, a policy denial included.
    Continue(Decision),
}

/// Which pending invocation a decision is about, and why it is taken.
#[derive(Debug, Args)]
pub(crate) struct Decision {
    run_id: String,
    invocation_id: String,
    #[arg(long)]
    reason: Option<String>,
}

/// Why an invocation waits; the names are sent as they are, as `PendingInvocation.origin`
/// spells them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
#[value(rename_all = "SCREAMING_SNAKE_CASE")]
pub(crate) enum Origin {
    ApprovalRequired,
    PolicyDenied,
    ExecutionFailed,
}

/// Runs an approvals subcommand.
pub(crate) async fn approvals(
    conn: Connection,
    command: ApprovalsCommand,
) -> anyhow::Result<ExitCode> {
    let mut client = ApprovalServiceClient::new(conn.connect(TokenRole::Approver).await?);
    let (decision, resume) = match command {
        ApprovalsCommand::List { run, tool, origin } => {
            let request = pb::ListPendingRequest {
                run_id: run.unwrap_or_default(),
                tool_name: tool.unwrap_or_default(),
                origin: origin
                    .and_then(|origin| origin.to_possible_value())
                    .map(|name| name.get_name().to_owned())
                    .unwrap_or_default(),
                page_size: 0,
            };
            let listed = client.list_pending(request).await?.into_inner();
            print_message(&listed.invocations)?;
            return Ok(ExitCode::SUCCESS);
        }
        ApprovalsCommand::Show { invocation_id } => {
            let request = pb::GetPendingRequest { invocation_id };
            print_message(&client.get_pending(request).await?.into_inner())?;
            return Ok(ExitCode::SUCCESS);
        }
        ApprovalsCommand::Approve(decision) => (decision, pb::ResumeDecision::Approve),
        ApprovalsCommand::Reject(decision) => (decision, pb::ResumeDecision::Reject),
        ApprovalsCommand::Continue(decision) => (decision, pb::ResumeDecision::Continue),
    };
    let request = pb::ResumeRequest {
        run_id: decision.run_id,
        invocation_id: decision.invocation_id,
        decision: resume.into(),
        reason: decision.reason.unwrap_or_default(),
    };
    let answer = client.resume(request).await?.into_inner();
    print_message(&answer)?;
    // The accessors read a value this build does not know as UNSPECIFIED: not done.
    let executed = answer.result.as_ref().map(pb::ToolCallResult::status);
    let outcome = answer.outcome();
    Ok(ExitCode::from(resume_exit_code(outcome, executed)))
}

/// The exit code of a decision: 0 when it applied (a rejection, a continue, an approval whose
/// execution succeeded), the call's own code when an approved execution did not succeed, and
/// [`EXIT_NOT_DECIDED`] when the decision did not apply.
pub(super) fn resume_exit_code(
    outcome: pb::ResumeOutcome,
    executed: Option<pb::ToolCallStatus>,
) -> u8 {
    match outcome {
        pb::ResumeOutcome::Executed => call_exit_code(executed.unwrap_or_default()),
        pb::ResumeOutcome::Rejected | pb::ResumeOutcome::Continued => 0,
        pb::ResumeOutcome::Unspecified
        | pb::ResumeOutcome::ClaimLost
        | pb::ResumeOutcome::PolicyDenialTerminal
        | pb::ResumeOutcome::FeatureDisabled => EXIT_NOT_DECIDED,
    }
}
