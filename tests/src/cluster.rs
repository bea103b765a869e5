//! The gateways of a test that runs on both backends: one gateway on its own SQLite file, or
//! two replicas sharing a fresh PostgreSQL schema, with one tenant set up and one execution
//! log for all of them.

use toolgate_proto::v1 as pb;

use crate::{ExecutionLog, Gateway, PgSchema, Tenant, TenantSetup};

/// Where a test's gateways keep their ledger.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// One gateway on its own SQLite file (one process owns a file).
    Sqlite,
    /// Two gateway processes sharing one PostgreSQL schema, behaving as one gateway.
    Postgres,
}

/// The gateways of one test on one ledger. Fields drop in order: the gateways first, then
/// the schema they used.
#[derive(Debug)]
pub struct Cluster {
    /// One gateway (SQLite) or two replicas (PostgreSQL).
    pub gateways: Vec<Gateway>,
    /// The schema on PostgreSQL.
    pub schema: Option<PgSchema>,
    /// Every gateway's testkit executions.
    pub log: ExecutionLog,
    /// The tenant set up at the start.
    pub tenant: Tenant,
}

impl Cluster {
    /// Starts the first gateway with `env`, sets `tenant` up on it, then (on PostgreSQL)
    /// starts the second replica, so nothing about the tenant is cached in it yet.
    pub async fn start(backend: Backend, env: &[(&str, &str)], tenant: TenantSetup) -> Cluster {
        let log = ExecutionLog::new();
        let schema = match backend {
            Backend::Sqlite => None,
            Backend::Postgres => Some(PgSchema::new().await),
        };
        let options = |schema: &Option<PgSchema>| {
            let base = match schema {
                Some(schema) => schema.options(),
                None => Gateway::options(),
            };
            base.envs(env).execution_log(&log)
        };
        let first = options(&schema).start();
        let tenant = tenant.create(&first).await;
        let mut gateways = vec![first];
        if schema.is_some() {
            let second = gateways[0].replica(options(&schema));
            gateways.push(second);
        }
        Cluster {
            gateways,
            schema,
            log,
            tenant,
        }
    }

    /// Gateway `i`, round-robin over the replicas (on SQLite always the one gateway).
    pub fn gateway(&self, i: usize) -> &Gateway {
        &self.gateways[i % self.gateways.len()]
    }

    /// `ExecuteTool` on gateway `i` with the tenant's agent token; the gRPC error, if any.
    pub async fn try_execute(
        &self,
        i: usize,
        request: pb::ExecuteToolRequest,
    ) -> Result<pb::ToolCallResult, tonic::Status> {
        self.gateway(i)
            .try_execute(&self.tenant.token, request)
            .await
    }

    /// `ExecuteTool` on gateway `i` with the tenant's agent token: its answer.
    pub async fn execute(&self, i: usize, request: pb::ExecuteToolRequest) -> pb::ToolCallResult {
        self.gateway(i).execute(&self.tenant.token, request).await
    }

    /// Opens a run of the tenant's agent on the first gateway.
    pub async fn open_run(&self, max_calls: u32) -> String {
        self.gateway(0)
            .open_run(&self.tenant.token, &self.tenant.agent, max_calls)
            .await
    }
}
