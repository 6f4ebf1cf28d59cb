//! The wiring: the configuration's settings handed to the components they belong to, and the
//! components put together: the store (memory, or Redis behind its guard), the metrics, the
//! gate, the proxy, the listener and the admin listener; then serving until shutdown, and the
//! drain. The one module that knows them all, so none of them has to know the configuration.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::net::TcpListener;

use crate::admin::{self, AdminState};
use crate::config::{Config, StoreConfig};
use crate::gate::Gate;
use crate::gate::identity::ClientIdentity;
use crate::limit::{Guard, Limiter, MemoryStore, RedisStore, StoreError};
use crate::metrics::{self, Metrics};
use crate::proxy::Proxy;
use crate::proxy::tls::{TlsConnector, TlsSetupError};
use crate::rls::{RateLimitService, RlsError};
use crate::server::listener::Listener;
use crate::server::{Capacity, Server, tls};

/// How often the memory store drops clients whose budget is entirely back.
const PURGE_INTERVAL: Duration = Duration::from_secs(10);

/// Why tollgate could not start serving.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The Redis client could not be built from the configuration.
    #[error("redis store: {0}")]
    Store(#[from] StoreError),
    /// The TLS client of an https backend could not be built (`BACKEND_CA_FILE`, the
    /// platform's CA store).
    #[error("backend TLS: {0}")]
    BackendTls(#[from] TlsSetupError),
    /// The TLS certificate or key could not be used.
    #[error("{0}")]
    Tls(#[from] tls::TlsError),
    /// Envoy's rate limit service could not be built from the rule table.
    #[error("envoy rls: {0}")]
    Rls(#[from] RlsError),
}

/// Build the configured limiter. Redis is connected lazily, so this does not wait for it.
pub fn limiter(config: &Config) -> Result<Limiter, StoreError> {
    let rules = config.gate.rules.rules();
    Ok(match &config.store.kind {
        StoreConfig::Memory => Limiter::Memory(MemoryStore::new(config.store.max_keys, rules)),
        StoreConfig::Redis(redis) => {
            let store = RedisStore::new(&redis.target, &redis.key_prefix, redis.timeout)?
                .with_calls_in_flight(redis.calls_in_flight);
            Limiter::Redis(Guard::new(store, redis.guard, config.store.max_keys, rules))
        }
    })
}

/// Envoy's rate limit service of `config` (`None` without `RLS_CONFIG`), deciding through
/// `gate`, which must be built from `config.gate` (whose table holds the descriptors' rules).
/// The decision listener routes `application/grpc` requests to its
/// [`RateLimitService::into_server`]; [`crate::rls::serve`] serves it on a port of its own.
pub fn rls_service(config: &Config, gate: Arc<Gate>) -> Result<Option<RateLimitService>, ServeError> {
    let Some(table) = &config.rls else {
        return Ok(None);
    };
    Ok(Some(RateLimitService::new(gate, table.clone())?))
}

/// A gate of `config`'s own: its limiter (Redis connected lazily) and metrics, for a door
/// served apart from the proxy's listener (Envoy's rate limit service on a port of its own,
/// tests). Call it inside a Tokio runtime.
pub fn standalone_gate(config: &Config) -> Result<(Arc<Gate>, Arc<Metrics>), ServeError> {
    let limiter = limiter(config)?;
    let capacity = Capacity::of(&config.server);
    let load = metrics::Load {
        connections: Arc::new(capacity.connections.clone()),
        requests: Arc::new(capacity.requests.clone()),
    };
    let metrics = Arc::new(Metrics::new(&config.gate.rules, limiter.clone(), load));
    let gate = Arc::new(Gate::new(config.gate.clone(), limiter, metrics.clone()));
    Ok((gate, metrics))
}

/// Serve proxied traffic on `listener` (no admin listener) until `shutdown` completes, then
/// stop accepting, wait up to `SHUTDOWN_TIMEOUT_MS` for in-flight requests, and return.
pub async fn serve(
    listener: TcpListener,
    config: Config,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ServeError> {
    run(listener, None, config, shutdown).await
}

/// [`serve`], with the admin endpoints (`/metrics`, `/healthz`, `/readyz`) on `admin`. The
/// admin listener stays up during the drain, answering `/readyz` with 503.
pub async fn serve_with_admin(
    listener: TcpListener,
    admin: TcpListener,
    config: Config,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ServeError> {
    run(listener, Some(admin), config, shutdown).await
}

async fn run(
    listener: TcpListener,
    admin: Option<TcpListener>,
    config: Config,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ServeError> {
    let limiter = limiter(&config)?;
    // Before anything listens: a CA file that cannot be read stops startup.
    let tls = config
        .proxy
        .backend
        .tls
        .as_ref()
        .map(TlsConnector::new)
        .transpose()?;
    let capacity = Capacity::of(&config.server);
    let load = metrics::Load {
        connections: Arc::new(capacity.connections.clone()),
        requests: Arc::new(capacity.requests.clone()),
    };
    let metrics = Arc::new(Metrics::new(&config.gate.rules, limiter.clone(), load));
    let admin_state = Arc::new(AdminState {
        metrics: metrics.clone(),
        limiter: limiter.clone(),
        draining: AtomicBool::new(false),
    });
    let admin_address = admin.as_ref().and_then(|admin| admin.local_addr().ok());
    let admin = admin.map(|admin| tokio::spawn(admin::serve(admin, admin_state.clone())));
    let purge = limiter.memory_store().map(|store| {
        let store = store.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(PURGE_INTERVAL);
            loop {
                tick.tick().await;
                let purged = store.purge_idle();
                tracing::trace!(purged, held = store.len(), "purged idle clients");
            }
        })
    });
    let (entry, certificate_watcher) = Listener::new(
        &config.server.listener,
        &ClientIdentity::new(config.gate.trusted_proxies.clone()),
        &metrics,
    )?;
    let max_per_client = capacity.max_per_client(&config.server);
    // One line; in JSON every setting is a field of its own.
    tracing::info!(
        version = env!("CARGO_PKG_VERSION"),
        listen = %listener.local_addr().map_or_else(|_| "?".into(), |a| a.to_string()),
        admin = %admin_address.map_or_else(|| "off".into(), |a| a.to_string()),
        tls = entry.is_tls(),
        proxy_protocol = config.server.listener.proxy_protocol,
        backend = %config.proxy.backend,
        store = %match &config.store.kind {
            StoreConfig::Memory => format!("memory (MAX_KEYS={})", config.store.max_keys),
            StoreConfig::Redis(redis) => redis.to_string(),
        },
        rules = %config.gate.rules.summary(),
        headers = config.proxy.headers.as_str(),
        access_log = config.proxy.access_log.as_str(),
        trusted_proxies = config.gate.trusted_proxies.len(),
        max_connections = capacity.max_connections,
        max_connections_per_client = %max_per_client.map_or_else(|| "off".into(), |max| max.to_string()),
        fd_limit = %capacity.fd_limit.map_or_else(|| "unknown".into(), |limit| limit.to_string()),
        header_read_timeout_ms = config.server.header_read_timeout.as_millis() as u64,
        idle_timeout_ms = config.server.idle_timeout.as_millis() as u64,
        send_timeout_ms = config.server.send_timeout.as_millis() as u64,
        max_upgrades_per_client = %config
            .gate
            .max_upgrades_per_client
            .map_or_else(|| "unlimited".into(), |max| max.to_string()),
        "tollgate ready"
    );
    let trusted = (
        config.gate.trusted_proxies.as_slice(),
        config.gate.rules.ipv6_prefix(),
    );
    let gate = Arc::new(Gate::new(config.gate.clone(), limiter, metrics.clone()));
    let proxy = Arc::new(Proxy::new(&config.proxy, gate, metrics.clone(), tls));
    let server = Server::new(&config.server, proxy, entry, capacity, trusted, &metrics);
    let drain = server.accept_until(listener, shutdown).await;
    admin_state.draining.store(true, Ordering::Release);
    if let Some(purge) = purge {
        purge.abort();
    }
    if let Some(watcher) = certificate_watcher {
        watcher.abort();
    }
    server.drain(drain).await;
    if let Some(admin) = admin {
        admin.abort();
    }
    Ok(())
}
