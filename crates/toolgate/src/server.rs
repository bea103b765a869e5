//! `toolgate serve`: opens the ledger, registers the connectors, and serves gRPC.

use std::io::Write as _;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use tokio::net::TcpListener;
use toolgate_core::{Clock, Connector, SecretSource, SystemClock, ToolRegistry};
use toolgate_engine::{Catalog, Engine};
use toolgate_ledger::{Role, Store};
use toolgate_proto::v1::admin_service_server::AdminServiceServer;
use toolgate_proto::v1::agent_service_server::AgentServiceServer;
use toolgate_proto::v1::approval_service_server::ApprovalServiceServer;
use toolgate_secrets::{ProcessEnvironment, Vault};
use tracing::{info, warn};

use crate::approvals::ApprovalApi;
use crate::auth::{Authenticator, issue_token};
use crate::config::{AwsSettings, Config, ShopifySettings, SlackSettings};
use crate::drain::{Drain, Draining};
use crate::keys;
use crate::services::{AdminApi, AgentApi, Shared};

/// How long a verified token is trusted before it is looked up again.
const TOKEN_CACHE_TTL: Duration = Duration::from_secs(2);

/// The connectors compiled into this build, in registration order.
pub(crate) fn compiled_connectors(
    slack: &SlackSettings,
    shopify: &ShopifySettings,
    aws: &AwsSettings,
) -> anyhow::Result<Vec<Arc<dyn Connector>>> {
    let mut connectors: Vec<Arc<dyn Connector>> = Vec::new();
    add_slack(&mut connectors, slack)?;
    add_shopify(&mut connectors, shopify)?;
    add_aws(&mut connectors, aws)?;
    add_testkit(&mut connectors);
    Ok(connectors)
}

#[cfg(feature = "slack")]
fn add_slack(
    connectors: &mut Vec<Arc<dyn Connector>>,
    settings: &SlackSettings,
) -> anyhow::Result<()> {
    let defaults = toolgate_slack::SlackConfig::default();
    let config = toolgate_slack::SlackConfig {
        api_base_url: settings
            .api_base_url
            .clone()
            .unwrap_or(defaults.api_base_url.clone()),
        allow_hosts: settings.allow_hosts.clone(),
        webhook_hosts: settings
            .webhook_hosts
            .clone()
            .unwrap_or(defaults.webhook_hosts.clone()),
        ..defaults
    };
    let connector = toolgate_slack::SlackConnector::new(config)
        .context("connectors.slack in the configuration")?;
    connectors.push(Arc::new(connector));
    Ok(())
}

#[cfg(not(feature = "slack"))]
fn add_slack(
    _connectors: &mut Vec<Arc<dyn Connector>>,
    _settings: &SlackSettings,
) -> anyhow::Result<()> {
    Ok(())
}

#[cfg(feature = "shopify")]
fn add_shopify(
    connectors: &mut Vec<Arc<dyn Connector>>,
    settings: &ShopifySettings,
) -> anyhow::Result<()> {
    let defaults = toolgate_shopify::ShopifyConfig::default();
    let config = toolgate_shopify::ShopifyConfig {
        api_version: settings
            .api_version
            .clone()
            .unwrap_or(defaults.api_version.clone()),
        allow_hosts: settings.allow_hosts.clone(),
        ..defaults
    };
    let connector = toolgate_shopify::ShopifyConnector::new(config)
        .context("connectors.shopify in the configuration")?;
    connectors.push(Arc::new(connector));
    Ok(())
}

#[cfg(feature = "aws")]
fn add_aws(connectors: &mut Vec<Arc<dyn Connector>>, settings: &AwsSettings) -> anyhow::Result<()> {
    let defaults = toolgate_aws::AwsConfig::default();
    let config = toolgate_aws::AwsConfig {
        endpoint_url: settings.endpoint_url.clone(),
        default_region: settings
            .default_region
            .clone()
            .unwrap_or(defaults.default_region.clone()),
        max_concurrency: settings.max_concurrency.unwrap_or(defaults.max_concurrency),
        max_attempts: settings.max_attempts.unwrap_or(defaults.max_attempts),
        page_size: settings.page_size.unwrap_or(defaults.page_size),
    };
    let connector =
        toolgate_aws::AwsConnector::new(config).context("connectors.aws in the configuration")?;
    connectors.push(Arc::new(connector));
    Ok(())
}

#[cfg(not(feature = "shopify"))]
fn add_shopify(
    _connectors: &mut Vec<Arc<dyn Connector>>,
    _settings: &ShopifySettings,
) -> anyhow::Result<()> {
    Ok(())
}

#[cfg(not(feature = "aws"))]
fn add_aws(
    _connectors: &mut Vec<Arc<dyn Connector>>,
    _settings: &AwsSettings,
) -> anyhow::Result<()> {
    Ok(())
}

#[cfg(feature = "testkit")]
fn add_testkit(connectors: &mut Vec<Arc<dyn Connector>>) {
    connectors.push(Arc::new(toolgate_engine::testkit::TestkitConnector));
}

#[cfg(not(feature = "testkit"))]
fn add_testkit(_connectors: &mut Vec<Arc<dyn Connector>>) {}

/// Registers every compiled connector except the disabled families.
pub(crate) fn build_registry(
    disabled: &[String],
    slack: &SlackSettings,
    shopify: &ShopifySettings,
    aws: &AwsSettings,
) -> anyhow::Result<ToolRegistry> {
    let connectors = compiled_connectors(slack, shopify, aws)?;
    for family in disabled {
        if !connectors.iter().any(|c| c.family() == family) {
            let available: Vec<&str> = connectors.iter().map(|c| c.family()).collect();
            bail!(
                "connectors.disabled names `{family}`, which this build does not include (compiled connectors: {})",
                if available.is_empty() {
                    "none".to_owned()
                } else {
                    available.join(", ")
                }
            );
        }
    }
    let mut registry = ToolRegistry::new();
    for connector in connectors {
        if disabled.iter().any(|family| family == connector.family()) {
            continue;
        }
        registry.register(connector)?;
    }
    Ok(registry)
}

/// Runs the gateway until Ctrl-C or SIGTERM, then drains it (see [`crate::drain`]).
pub(crate) async fn serve(config: Config) -> anyhow::Result<()> {
    let started = Instant::now();
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let registry = build_registry(
        &config.disabled_connectors,
        &config.slack,
        &config.shopify,
        &config.aws,
    )?;
    let catalog = Arc::new(Catalog::new(registry)?);
    // Files holding secrets are checked before anything is opened or written; then the keys,
    // since the ledger MACs its audit events with chain keys derived from them.
    refuse_shared_file(&config.admin_token_file, "admin token file")?;
    let (ring, created) = keys::load_key_ring(&config.key_file, config.master_keys.as_deref())?;
    if created {
        announce(&format!(
            "created a master key in {} (readable only by you); back it up: credentials sealed with it are lost without it",
            config.key_file.display()
        ));
    }
    let chain_keys = Arc::new(toolgate_secrets::LiveKeyRing::new(ring.clone()));
    let store = config
        .database
        .open(Arc::clone(&chain_keys) as Arc<dyn toolgate_core::AuditKeys>)
        .await?;
    bootstrap_admin_token(&store, clock.as_ref(), &config.admin_token_file).await?;
    keys::check_keys_present(&store, &ring).await?;
    let vault = Arc::new(Vault::new(
        Arc::new(keys::LedgerCredentials(Arc::clone(&store))),
        ring,
        Arc::new(ProcessEnvironment),
    ));
    let engine = Engine::new(
        Arc::clone(&store),
        catalog,
        Arc::clone(&clock),
        config.engine.clone(),
    )?
    .with_secrets(Arc::clone(&vault) as Arc<dyn SecretSource>)
    // Full answers kept for replays are sealed with the same key ring as credentials.
    .with_sealer(Arc::clone(&vault) as Arc<dyn toolgate_core::Sealer>);
    let config_vault = Arc::clone(&vault);
    let key_manager = Arc::new(keys::KeyManager::new(
        &config.key_file,
        config.master_keys.is_some(),
        vault,
        chain_keys,
        Arc::clone(&store),
        Arc::clone(&clock),
    ));
    // Before serving: calls a crash interrupted are settled as outcome_unknown, never rerun.
    let interrupted = engine.recover_interrupted_calls().await?;
    // Arguments of calls suspended by a version that kept them in clear (or under a key
    // that is no longer the active one) are sealed under the active key now.
    let (sealed, _) = engine
        .rewrap_pending_arguments(key_manager.vault().key_ring().active().as_str())
        .await?;
    if sealed > 0 {
        info!(
            sealed,
            "sealed the arguments of pending calls under the active key"
        );
    }
    if interrupted > 0 {
        warn!(
            calls = interrupted,
            "calls interrupted by the last shutdown are now outcome_unknown"
        );
    }
    let engine = Arc::new(engine);
    // Pending invocations nobody decided in time resolve as rejected, audited; calls of
    // replicas that died since (PostgreSQL) are settled like those found at start-up.
    tokio::spawn(sweep_loop(Arc::clone(&engine)));

    let listener = TcpListener::bind(config.listen)
        .await
        .with_context(|| format!("cannot listen on {}", config.listen))?;
    let local = listener.local_addr()?;
    // `Server::tcp_nodelay` does not apply to a listener handed in, so set it on the incoming
    // stream: without it, small responses wait for Nagle and delayed ACKs.
    let incoming = tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true));

    let auth = Arc::new(Authenticator::new(Arc::clone(&store), TOKEN_CACHE_TTL));
    // Replicas sharing the store: another one's change to flags, grants, policies, tokens or
    // credentials empties this one's caches at once, so a kill switch or a revoked token
    // takes effect everywhere without waiting for the caches to expire.
    if let Some(changes) = store.subscribe_config_changes() {
        tokio::spawn(forget_on_config_change(
            changes,
            Arc::clone(&engine),
            Arc::clone(&auth),
            config_vault,
        ));
    }
    let drain = Drain::new();
    let shared = Shared {
        engine,
        auth,
        clock,
        keys: key_manager,
        drain: Arc::clone(&drain),
    };
    let (health_reporter, health_service) = tonic_health::server::health_reporter();
    health_reporter
        .set_serving::<AgentServiceServer<AgentApi>>()
        .await;
    health_reporter
        .set_serving::<AdminServiceServer<AdminApi>>()
        .await;
    health_reporter
        .set_serving::<ApprovalServiceServer<ApprovalApi>>()
        .await;
    let reflection = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(toolgate_proto::v1::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1()?;

    info!(address = %local, database = %config.database, startup_ms = started.elapsed().as_millis(), "toolgate listening");
    announce(&format!("toolgate listening on {local}"));

    // Requests as large as the largest argument the engine accepts must reach it (and be
    // refused there, naming the limit), and answers carry up to two copies of one.
    let limits = MessageLimits::for_arguments(config.engine.max_argument_bytes);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tonic::transport::Server::builder()
        .add_service(health_service)
        .add_service(reflection)
        .add_service(Draining::new(
            AgentServiceServer::new(AgentApi(shared.clone()))
                .max_decoding_message_size(limits.decoding)
                .max_encoding_message_size(limits.encoding),
            &drain,
        ))
        .add_service(Draining::new(
            ApprovalServiceServer::new(ApprovalApi(shared.clone()))
                .max_decoding_message_size(limits.decoding)
                .max_encoding_message_size(limits.encoding),
            &drain,
        ))
        .add_service(Draining::new(
            AdminServiceServer::new(AdminApi(shared))
                .max_decoding_message_size(limits.decoding)
                .max_encoding_message_size(limits.encoding),
            &drain,
        ))
        .serve_with_incoming_shutdown(incoming, async {
            let _ = stopped.await;
        });
    let mut server = std::pin::pin!(server);
    tokio::select! {
        served = &mut server => {
            served?;
            return Ok(());
        }
        () = shutdown_signal() => {}
    }

    // The shutdown: refuse new calls and end streams at once, let running calls finish until
    // the drain timeout, then stop. The server keeps accepting meanwhile, so health checks and
    // new clients are answered (NOT_SERVING, UNAVAILABLE) rather than left hanging.
    let deadline = tokio::time::Instant::now() + config.drain_timeout;
    drain.begin();
    for service in [
        "",
        <AgentServiceServer<AgentApi> as tonic::server::NamedService>::NAME,
        <AdminServiceServer<AdminApi> as tonic::server::NamedService>::NAME,
        <ApprovalServiceServer<ApprovalApi> as tonic::server::NamedService>::NAME,
    ] {
        health_reporter
            .set_service_status(service, tonic_health::ServingStatus::NotServing)
            .await;
    }
    let in_flight = drain.state().in_flight;
    info!(
        calls = in_flight,
        drain_timeout_ms = config.drain_timeout.as_millis(),
        "shutting down: new calls are refused, running ones may finish"
    );
    let drained = tokio::select! {
        served = &mut server => {
            store.close().await;
            served?;
            return Ok(());
        }
        idle = tokio::time::timeout_at(deadline, drain.idle()) => idle.is_ok(),
        () = shutdown_signal() => false,
    };
    let _ = stop.send(());
    let mut served = Ok(());
    if drained {
        // Lets the last answers go out and idle connections close; a client holding a
        // stream of its own (a health watch) does not hold the process beyond this.
        match tokio::time::timeout(FLUSH_GRACE, &mut server).await {
            Ok(result) => served = result,
            Err(_) => info!("connections still open after the drain; closing them"),
        }
        info!("toolgate stopped");
    } else {
        warn!(
            calls = drain.state().in_flight,
            "the drain timeout passed with calls still running; they are abandoned and the next start records them as outcome_unknown"
        );
    }
    // Commits what is queued and, on SQLite, folds the write-ahead log into the database and
    // empties it; an abandoned call's later write fails and its row stays `running`.
    store.close().await;
    Ok(served?)
}

/// How long, after the last call has finished, the server may take to send the last answers
/// and close its connections.
const FLUSH_GRACE: Duration = Duration::from_secs(2);

/// gRPC's own default message limit, which the gateway never goes below.
const GRPC_DEFAULT_LIMIT: usize = 4 * 1024 * 1024;

/// Room for a request's other fields (run id, tool name, ids) and the encoding around them.
const MESSAGE_HEADROOM: usize = 1024 * 1024;

/// The largest gRPC messages the gateway's services take and send.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct MessageLimits {
    /// Requests: one argument of the configured maximum, plus headroom.
    pub(crate) decoding: usize,
    /// Answers: a call's arguments and a result as large (a recorded call holds both).
    pub(crate) encoding: usize,
}

impl MessageLimits {
    pub(crate) fn for_arguments(max_argument_bytes: usize) -> MessageLimits {
        MessageLimits {
            decoding: max_argument_bytes
                .saturating_add(MESSAGE_HEADROOM)
                .max(GRPC_DEFAULT_LIMIT),
            encoding: max_argument_bytes
                .saturating_mul(2)
                .saturating_add(MESSAGE_HEADROOM)
                .max(GRPC_DEFAULT_LIMIT),
        }
    }
}

/// Prints a line for people and scripts on stdout.
#[allow(
    clippy::print_stdout,
    reason = "the address line is the binary's output for scripts"
)]
fn announce(line: &str) {
    println!("{line}");
    let _ = std::io::stdout().flush();
}

/// On first start (no admin token yet) creates one and writes it to a file only the current
/// user can read.
async fn bootstrap_admin_token(
    store: &Arc<dyn Store>,
    clock: &dyn Clock,
    path: &Path,
) -> anyhow::Result<()> {
    let admins = store.list_tokens(None).await?;
    if admins.iter().any(|t| t.role == Role::Admin && !t.revoked) {
        return Ok(());
    }
    let issued = issue_token(Role::Admin, None, None, "bootstrap".to_owned(), clock.now());
    write_private_file(path, &format!("{}\n", issued.secret))
        .with_context(|| format!("cannot write the admin token to {}", path.display()))?;
    // No admin exists yet to act: the gateway itself is the actor of this one change.
    let actor = toolgate_ledger::Actor::gateway(clock.now());
    store.create_token(issued.record, &actor).await?;
    announce(&format!(
        "created the first admin token in {} (readable only by you); `toolgate admin` reads it from there",
        path.display()
    ));
    Ok(())
}

/// Refuses a file holding secrets (`what`: "key file", "admin token file", ...) when the group
/// or others have any access to it, naming the command that fixes it, as ssh refuses a
/// private key others can read. A missing file is not refused here.
pub(crate) fn refuse_shared_file(path: &Path, what: &str) -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt as _;
    let metadata = match std::fs::metadata(path) {
        Ok(metadata) => metadata,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(error) => {
            return Err(error)
                .with_context(|| format!("cannot read the permissions of {}", path.display()));
        }
    };
    let mode = metadata.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        anyhow::bail!(
            "the {what} {} has mode {mode:04o}, so other users can read it: run `chmod 600 {}`, then try again",
            path.display(),
            path.display()
        );
    }
    Ok(())
}

pub(crate) fn write_private_file(path: &Path, contents: &str) -> std::io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt as _;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)?;
    // A pre-existing file keeps its mode on open; make sure it is private.
    use std::os::unix::fs::PermissionsExt as _;
    file.set_permissions(std::fs::Permissions::from_mode(0o600))?;
    file.write_all(contents.as_bytes())?;
    file.sync_all()
}

/// Resolves on SIGINT (Ctrl-C) or SIGTERM; a second one during the drain stops waiting.
async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(term) => term,
        Err(_) => {
            let _ = ctrl_c.await;
            return;
        }
    };
    tokio::select! {
        _ = ctrl_c => info!("SIGINT received"),
        _ = term.recv() => info!("SIGTERM received"),
    }
}

async fn forget_on_config_change(
    mut changes: tokio::sync::watch::Receiver<u64>,
    engine: Arc<Engine>,
    auth: Arc<Authenticator>,
    vault: Arc<Vault>,
) {
    while changes.changed().await.is_ok() {
        engine.forget_cached_configuration();
        auth.forget_all();
        vault.invalidate_all();
    }
}

/// How often expired pending invocations, sealed answers past their retention and calls of
/// dead replicas are looked for (the first sweep runs at start-up).
const SWEEP_INTERVAL: Duration = Duration::from_secs(30);

async fn sweep_loop(engine: Arc<Engine>) {
    let mut tick = tokio::time::interval(SWEEP_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        match engine.expire_pending().await {
            Ok(0) => {}
            Ok(expired) => info!(expired, "expired pending invocations resolved as rejected"),
            Err(error) => warn!(%error, "expiring pending invocations failed"),
        }
        match engine.purge_expired_answers().await {
            Ok(0) => {}
            Ok(purged) => info!(purged, "sealed answers past their retention removed"),
            Err(error) => warn!(%error, "purging sealed answers failed"),
        }
        // Only calls whose process is gone are listed, so this never touches a live call.
        match engine.recover_interrupted_calls().await {
            Ok(0) => {}
            Ok(settled) => warn!(
                calls = settled,
                "calls of a gateway process that stopped are now outcome_unknown"
            ),
            Err(error) => warn!(%error, "settling interrupted calls failed"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn message_limits_follow_the_argument_limit() {
        let mib = 1024 * 1024;
        // (max_argument_bytes, requests, answers); small limits keep gRPC's default.
        let cases = [
            (1, 4 * mib, 4 * mib),
            (mib, 4 * mib, 4 * mib),
            (6 * mib, 7 * mib, 13 * mib),
            (64 * mib, 65 * mib, 129 * mib),
        ];
        for (arguments, decoding, encoding) in cases {
            assert_eq!(
                MessageLimits::for_arguments(arguments),
                MessageLimits { decoding, encoding },
                "{arguments}"
            );
        }
    }
}
