//! The `aws` connector: resolves the call's credentials (assuming the tenant's role with a
//! session policy limited to the tool's actions), then runs the tool.

use std::sync::Arc;

use serde_json::Value;
use toolgate_core::{
    Connector, ErrorCode, InvocationContext, ToolError, ToolName, ToolOutput, ToolSpec,
};

use crate::config::{AwsConfig, AwsConfigError};
use crate::session::Sessions;
use crate::tools::specs::{actions_of, specs};
use crate::tools::{cloudtrail, cost, ec2, iam, rds, s3};

/// Serves `aws.*`. Build it once with [`AwsConnector::new`]: every tenant and service shares
/// its HTTP connection pool and its assumed-role cache.
#[derive(Debug)]
pub struct AwsConnector {
    sessions: Arc<Sessions>,
}

impl AwsConnector {
    /// Builds the connector; fails on an invalid configuration.
    pub fn new(config: AwsConfig) -> Result<AwsConnector, AwsConfigError> {
        config.validate()?;
        Ok(AwsConnector {
            sessions: Arc::new(Sessions::new(config)),
        })
    }

    /// How many `sts:AssumeRole` requests this connector has sent (cached sessions are reused).
    pub fn assume_role_requests(&self) -> u64 {
        self.sessions.assume_role_requests()
    }
}

#[async_trait::async_trait]
impl Connector for AwsConnector {
    fn family(&self) -> &str {
        "aws"
    }

    fn tools(&self) -> Vec<ToolSpec> {
        specs()
    }

    async fn invoke(
        &self,
        ctx: InvocationContext,
        tool: &ToolName,
        arguments: Value,
    ) -> Result<ToolOutput, ToolError> {
        let action = tool.as_str().strip_prefix("aws.").unwrap_or("");
        let actions = actions_of(action);
        if actions.is_empty() {
            return Err(ToolError::new(
                ErrorCode::UnknownTool,
                format!("the aws connector has no tool `{tool}`"),
            ));
        }
        if !arguments.is_object() {
            return Err(ToolError::new(
                ErrorCode::InvalidArguments,
                "the arguments must be a JSON object",
            )
            .with_attempts(0));
        }
        let session = self.sessions.open(&ctx, actions).await?;
        let result = match action {
            "ec2_inventory" => ec2::ec2_inventory(&session, &arguments).await,
            "ebs_inventory" => ec2::ebs_inventory(&session, &arguments).await,
            "security_groups_audit" => ec2::security_groups_audit(&session, &arguments).await,
            "nat_gateways_audit" => ec2::nat_gateways_audit(&session, &arguments).await,
            "eips_audit" => ec2::eips_audit(&session, &arguments).await,
            "cost_breakdown" => cost::cost_breakdown(&session, &arguments).await,
            "cost_anomalies" => cost::cost_anomalies(&session, &arguments).await,
            "compute_optimizer_recs" => cost::compute_optimizer_recs(&session, &arguments).await,
            "s3_inventory" => s3::s3_inventory(&session, &arguments).await,
            "iam_audit" => iam::iam_audit(&session, &arguments).await,
            "cloudtrail_coverage" => cloudtrail::cloudtrail_coverage(&session, &arguments).await,
            "rds_inventory" => rds::rds_inventory(&session, &arguments).await,
            _ => Err(ToolError::new(
                ErrorCode::UnknownTool,
                format!("the aws connector has no tool `{tool}`"),
            )),
        };
        result.map(ToolOutput::new)
    }
}
