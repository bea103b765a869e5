//! Serving: opens the ledger, issues the first admin token, wires the services behind
//! authentication and the drain, and serves gRPC until a shutdown, then drains.

use std::future::Future;
use std::io::Write as _;
use std::net::SocketAddr;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use futures::stream::BoxStream;
use futures::{Stream, StreamExt as _};
use tokio::net::TcpListener;
use toolgate_core::{Clock, SecretSource, SystemClock, ToolRegistry};
use toolgate_engine::{Catalog, Engine};
use toolgate_ledger::{Role, Store};
use toolgate_proto::v1::admin_service_server::AdminServiceServer;
use toolgate_proto::v1::agent_service_server::AgentServiceServer;
use toolgate_proto::v1::approval_service_server::ApprovalServiceServer;
use toolgate_secrets::{ProcessEnvironment, Vault};
use tower_layer::Layer as _;
use tracing::{info, warn};

use crate::auth::{AuthLayer, Authenticator, issue_token};
use crate::config::Config;
use crate::connectors::build_observed_registry;
use crate::console::links::LinkMinter;
use crate::drain::{Drain, Draining};
use crate::files::{refuse_shared_file, write_private_file};
use crate::keys;
use crate::mcp;
use crate::metrics::{Endpoint, Metrics, Scrape};
use crate::overload::{Admission, Overload};
use crate::services::{AdminApi, AgentApi, ApprovalApi, Shared};
use crate::telemetry::TraceLayer;

/// How long a verified token is trusted before it is looked up again.
const TOKEN_CACHE_TTL: Duration = Duration::from_secs(2);

/// Runs the gateway with the connectors of this build on `config.listen` until `shutdown`
/// yields, then drains it (see [`crate::drain`]): new calls are refused, running ones may finish
/// until `server.drain_timeout_ms`, or until `shutdown` yields again.
pub async fn serve(
    config: Config,
    shutdown: impl Stream<Item = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let started = Instant::now();
    for warning in config.warnings() {
        warn!("{warning}");
    }
    let metrics = config.metrics.listen.map(|_| Arc::new(Metrics::new()));
    let vendor_observer: Arc<dyn toolgate_http::HttpObserver> = match &metrics {
        Some(metrics) => Arc::clone(metrics) as _,
        None => Arc::new(toolgate_http::NoHttpObserver),
    };
    let registry = build_observed_registry(
        &config.disabled_connectors,
        &config.slack,
        &config.shopify,
        &config.aws,
        vendor_observer,
    )?;
    let bind = Bind::Address;
    run(config, registry, bind, shutdown.boxed(), started, metrics).await
}

/// [`serve`] with the tools of `registry` on a listener the caller bound (in-process tests
/// bind port 0 and read the address). With `metrics.listen` set, the metrics count the calls,
/// the caches and the ledger; the vendor requests of `registry`'s connectors only if they
/// were built with an observer of their own.
pub async fn serve_with(
    config: Config,
    registry: ToolRegistry,
    listener: TcpListener,
    shutdown: impl Stream<Item = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let bind = Bind::Listener(listener);
    for warning in config.warnings() {
        warn!("{warning}");
    }
    let metrics = config.metrics.listen.map(|_| Arc::new(Metrics::new()));
    run(
        config,
        registry,
        bind,
        shutdown.boxed(),
        Instant::now(),
        metrics,
    )
    .await
}

/// The agent service's methods that execute tools, which [`Admission`] limits. Runs, lists,
/// results and waits stay answerable under load, as do the admin and approval services and
/// health checks.
const LIMITED_METHODS: &[&str] = &["/toolgate.v1.AgentService/ExecuteTool"];

/// Where the server listens: `config.listen`, bound once the ledger is ready, or a listener
/// bound already.
enum Bind {
    Address,
    Listener(TcpListener),
}

async fn bind(bind: Bind, address: SocketAddr) -> anyhow::Result<TcpListener> {
    match bind {
        Bind::Address => TcpListener::bind(address)
            .await
            .with_context(|| format!("cannot listen on {address}")),
        Bind::Listener(listener) => Ok(listener),
    }
}

/// The next shutdown request; a stream that has ended asks for none again.
async fn requested(shutdown: &mut BoxStream<'static, ()>) {
    if shutdown.next().await.is_none() {
        std::future::pending::<()>().await;
    }
}

async fn run(
    config: Config,
    registry: ToolRegistry,
    bind_to: Bind,
    mut shutdown: BoxStream<'static, ()>,
    started: Instant,
    metrics: Option<Arc<Metrics>>,
) -> anyhow::Result<()> {
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    if let Some(metrics) = &metrics {
        metrics.set_tools(registry.names());
    }
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
        .open(
            Arc::clone(&chain_keys) as Arc<dyn toolgate_core::AuditKeys>,
            metrics
                .clone()
                .map(|metrics| metrics as Arc<dyn toolgate_ledger::LedgerObserver>),
        )
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
    let engine = match &metrics {
        Some(metrics) => engine.with_observer(Arc::clone(metrics) as _),
        None => engine,
    };
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
    let console_idle = config
        .console
        .enabled
        .then_some(config.console.session_idle);
    tokio::spawn(sweep_loop(
        Arc::clone(&engine),
        Arc::clone(&clock),
        console_idle,
    ));

    let listener = bind(bind_to, config.listen).await?;
    let local = listener.local_addr()?;
    // Stops serving the metrics when dropped, whichever way this function returns.
    let _metrics_endpoint = match (&metrics, config.metrics.listen) {
        (Some(metrics), Some(address)) => {
            let scrape = Scrape {
                metrics: Arc::clone(metrics),
                store: Arc::clone(&store),
                clock: Arc::clone(&clock),
            };
            let endpoint = Endpoint::start(address, scrape).await?;
            info!(address = %endpoint.local, "metrics served at /metrics");
            announce(&format!(
                "toolgate metrics on http://{}/metrics",
                endpoint.local
            ));
            Some(endpoint)
        }
        _ => None,
    };

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
    let console = config.console.enabled;
    let shared = Shared {
        engine,
        auth: Arc::clone(&auth),
        clock,
        keys: key_manager,
        drain: Arc::clone(&drain),
        client_links: console.then(|| {
            Arc::new(LinkMinter::new(
                config.console.public_url.as_deref(),
                config.console.client_link_ttl,
            ))
        }),
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

    let tls = match &config.tls {
        Some(tls) if tls.requires_client_certificates() => "mtls",
        Some(_) => "tls",
        None => "plaintext",
    };
    // The runtime this gateway runs on (sized by the binary from `server.worker_threads`).
    let worker_threads = tokio::runtime::Handle::current().metrics().num_workers();
    info!(address = %local, database = %config.database, tls, worker_threads, max_concurrent_calls = config.limits.max_concurrent, max_queued_calls = config.limits.max_queued, startup_ms = started.elapsed().as_millis(), "toolgate listening");
    announce(&format!("toolgate listening on {local}"));
    if config.mcp.enabled {
        let scheme = if config.tls.is_some() {
            "https"
        } else {
            "http"
        };
        info!(url = %format!("{scheme}://{local}{}", mcp::MCP_PATH), "MCP served");
    }

    // Requests as large as the largest argument the engine accepts must reach it (and be
    // refused there, naming the limit), and answers carry up to two copies of one.
    let limits = MessageLimits::for_arguments(config.engine.max_argument_bytes);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let admission = Admission::new(config.limits);
    // gRPC and, beside it on the same port, HTTP routes (MCP): tonic's routes are an axum
    // router, and HTTP/1.1 is accepted for the HTTP clients.
    let grpc = tonic::service::Routes::new(health_service)
        .add_service(reflection)
        .add_service(Overload::new(
            Draining::new(
                AuthLayer::new(&auth, Role::Agent).layer(
                    AgentServiceServer::new(AgentApi(shared.clone()))
                        .max_decoding_message_size(limits.decoding)
                        .max_encoding_message_size(limits.encoding),
                ),
                &drain,
            ),
            &admission,
            &drain,
            LIMITED_METHODS,
        ))
        .add_service(Draining::new(
            AuthLayer::new(&auth, Role::Approver).layer(
                ApprovalServiceServer::new(ApprovalApi(shared.clone()))
                    .max_decoding_message_size(limits.decoding)
                    .max_encoding_message_size(limits.encoding),
            ),
            &drain,
        ))
        .add_service(Draining::new(
            AuthLayer::new(&auth, Role::Admin).layer(
                AdminServiceServer::new(AdminApi(shared.clone()))
                    .max_decoding_message_size(limits.decoding)
                    .max_encoding_message_size(limits.encoding),
            ),
            &drain,
        ));
    let mut app = grpc.into_axum_router();
    if config.console.enabled {
        app = app.merge(crate::console::router(
            shared.clone(),
            config.console.clone(),
            config.tls.is_some(),
        ));
    }
    if config.mcp.enabled {
        app = app.merge(mcp::router(
            shared,
            Arc::clone(&admission),
            &config.mcp,
            limits.decoding,
            config.engine.max_calls_limit,
        ));
    }
    let router = tonic::transport::Server::builder()
        .accept_http1(true)
        .layer(TraceLayer)
        .add_routes(tonic::service::Routes::from(app).prepare());
    let stopped = async {
        let _ = stopped.await;
    };
    let mut server: Pin<Box<dyn Future<Output = Result<(), tonic::transport::Error>> + Send>> =
        match &config.tls {
            Some(tls) => {
                Box::pin(router.serve_with_incoming_shutdown(tls.incoming(listener), stopped))
            }
            None => {
                // `Server::tcp_nodelay` does not apply to a listener handed in, so set it on the
                // incoming stream: without it, small responses wait for Nagle and delayed ACKs.
                let incoming =
                    tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true));
                Box::pin(router.serve_with_incoming_shutdown(incoming, stopped))
            }
        };
    tokio::select! {
        served = &mut server => {
            served?;
            return Ok(());
        }
        () = requested(&mut shutdown) => {}
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
        () = requested(&mut shutdown) => false,
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

async fn sweep_loop(engine: Arc<Engine>, clock: Arc<dyn Clock>, console_idle: Option<Duration>) {
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
        // Console sessions past their expiry are of no use to anyone: their rows go.
        if let Some(idle) = console_idle {
            let now = clock.now();
            let idle_ms = i64::try_from(idle.as_millis()).unwrap_or(i64::MAX);
            let idle_before = toolgate_core::Timestamp(now.0.saturating_sub(idle_ms));
            if let Err(error) = engine
                .store()
                .purge_console_sessions(now, idle_before)
                .await
            {
                warn!(%error, "removing ended console sessions failed");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_limited_method_is_the_agent_services_execute_tool() {
        let name = <AgentServiceServer<AgentApi> as tonic::server::NamedService>::NAME;
        assert_eq!(LIMITED_METHODS, [format!("/{name}/ExecuteTool")]);
    }

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
