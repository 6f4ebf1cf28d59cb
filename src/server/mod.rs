//! Wiring: build the limiter and proxy from the configuration, accept connections, serve
//! HTTP/1.1 and HTTP/2 (h2c, prior knowledge) on the same port, and drain on shutdown.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;

use std::sync::atomic::{AtomicBool, Ordering};

use crate::admin::{self, AdminState};
use crate::config::{Config, StoreConfig};
use crate::limit::{Guard, Limiter, MemoryStore, RedisStore, StoreError};
use crate::metrics::Metrics;
use crate::proxy::Proxy;

/// How often the memory store drops clients whose budget is entirely back.
const PURGE_INTERVAL: Duration = Duration::from_secs(10);

/// Pause after a failed `accept` (e.g. out of file descriptors) before trying again, so the
/// loop does not spin.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);

/// Why the server could not start.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The Redis client could not be built from the configuration.
    #[error("redis store: {0}")]
    Store(#[from] StoreError),
}

/// Build the configured limiter. Redis is connected lazily, so this does not wait for it.
pub fn limiter(config: &Config) -> Result<Limiter, StoreError> {
    Ok(match &config.store {
        StoreConfig::Memory => Limiter::Memory(MemoryStore::new(config.max_keys, config.rules.rules())),
        StoreConfig::Redis(redis) => {
            let store = RedisStore::new(&redis.target, &redis.key_prefix, redis.timeout)?;
            Limiter::Redis(Guard::new(
                store,
                redis.guard,
                config.max_keys,
                config.rules.rules(),
            ))
        }
    })
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
    let metrics = Arc::new(Metrics::new(&config.rules, limiter.clone()));
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
    // One line; in JSON every setting is a field of its own.
    tracing::info!(
        version = env!("CARGO_PKG_VERSION"),
        listen = %listener.local_addr().map_or_else(|_| "?".into(), |a| a.to_string()),
        admin = %admin_address.map_or_else(|| "off".into(), |a| a.to_string()),
        backend = %config.backend,
        store = %match &config.store {
            StoreConfig::Memory => format!("memory (MAX_KEYS={})", config.max_keys),
            StoreConfig::Redis(redis) => redis.to_string(),
        },
        rules = %config.rules.summary(),
        headers = config.headers.as_str(),
        access_log = config.access_log.as_str(),
        trusted_proxies = config.trusted_proxies.len(),
        "tollgate ready"
    );
    let proxy = Arc::new(Proxy::new(&config, limiter, metrics));

    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        // Without a timer the header read timeout is silently ignored.
        .timer(TokioTimer::new())
        .header_read_timeout(config.header_read_timeout);
    builder.http2().timer(TokioTimer::new());

    let graceful = GracefulShutdown::new();
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    tracing::warn!(%error, "accept failed");
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        if let Err(error) = stream.set_nodelay(true) {
            tracing::debug!(%error, "set_nodelay failed");
        }
        let proxy = proxy.clone();
        let service = service_fn(move |request| {
            let proxy = proxy.clone();
            async move { Ok::<_, Infallible>(proxy.handle(request, peer).await) }
        });
        let connection = builder.serve_connection_with_upgrades(TokioIo::new(stream), service);
        let connection = graceful.watch(connection.into_owned());
        tokio::spawn(async move {
            if let Err(error) = connection.await {
                tracing::debug!(%peer, error = %error, "connection ended with an error");
            }
        });
    }

    drop(listener);
    admin_state.draining.store(true, Ordering::Release);
    if let Some(purge) = purge {
        purge.abort();
    }
    tracing::info!(
        in_flight_connections = graceful.count(),
        "shutting down: draining connections"
    );
    match tokio::time::timeout(config.shutdown_timeout, graceful.shutdown()).await {
        Ok(()) => tracing::info!("all connections drained"),
        Err(_) => tracing::warn!(
            timeout_ms = config.shutdown_timeout.as_millis() as u64,
            "shutdown timeout: closing connections that are still busy"
        ),
    }
    if let Some(admin) = admin {
        admin.abort();
    }
    Ok(())
}
