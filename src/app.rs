//! The wiring: the configuration's settings handed to the components they belong to, and the
//! components put together: the store (memory, or Redis behind its guard), the metrics, the
//! gate, the proxy, the listener and the admin listener; then serving until shutdown, and the
//! drain. The one module that knows them all, so none of them has to know the configuration.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::net::TcpListener;

use crate::admin::{self, AdminState};
use crate::config::{Config, StoreConfig};
use crate::decide::Decide;
use crate::gate::Gate;
use crate::gate::identity::ClientIdentity;
use crate::limit::state_file::{self, Persistence, SaveStats, StateFileSettings};
use crate::limit::{Guard, KeyHasher, Limiter, MemoryStore, RedisStore, Rule, StoreError};
use crate::metrics::{self, Metrics};
use crate::proxy::Proxy;
use crate::proxy::tls::{TlsConnector, TlsSetupError};
use crate::rls::{DescriptorTable, RateLimitService, RlsError};
use crate::server::listener::Listener;
use crate::server::{Capacity, Door, Drain, Server, tls};

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
    /// A listener could not be bound.
    #[error("cannot listen on {address} ({variables}): {source}")]
    Bind {
        /// Where.
        address: SocketAddr,
        /// The variables that chose it.
        variables: &'static str,
        /// Why.
        source: std::io::Error,
    },
    /// The listeners given are not the ones the configuration asks for.
    #[error("listeners: {0}")]
    Listener(&'static str),
    /// The TLS certificate or key could not be used.
    #[error("{0}")]
    Tls(#[from] tls::TlsError),
    /// Envoy's rate limit service could not be built from the rule table.
    #[error("envoy rls: {0}")]
    Rls(#[from] RlsError),
    /// `STATE_FILE` cannot be written where it is.
    #[error("STATE_FILE: {0}")]
    StateFile(#[from] state_file::StateFileError),
}

/// Build the configured limiter. Redis is connected lazily, so this does not wait for it.
pub(crate) fn limiter(config: &Config) -> Result<Limiter, StoreError> {
    let rules = config.gate.rules.rules();
    Ok(match &config.store.kind {
        StoreConfig::Memory => Limiter::new(MemoryStore::new(config.store.max_keys, rules)),
        StoreConfig::Redis(redis) => {
            let store = RedisStore::new(&redis.target, &redis.key_prefix, redis.timeout)?
                .with_calls_in_flight(redis.calls_in_flight);
            Limiter::new(Guard::new(store, redis.guard, config.store.max_keys, rules))
        }
    })
}

/// `STATE_FILE` for `store`, built for `rules` (header keys digested by `hasher`): refuse to
/// start when the file's directory cannot take it (found at deploy time, not at the first
/// restart that should have kept the budgets), read the file into the store (anything wrong
/// with it is logged and ignored), and save every `STATE_SAVE_INTERVAL_S` from now on. The
/// caller saves once more after the drain ([`Persistence::save_on_shutdown`]) and aborts the
/// periodic task. Call before the listeners accept.
pub(crate) async fn restore_state(
    settings: &StateFileSettings,
    store: &MemoryStore,
    rules: &[Rule],
    hasher: &KeyHasher,
    stats: Arc<SaveStats>,
) -> Result<(Persistence, tokio::task::JoinHandle<()>), ServeError> {
    // A file created and removed: quick enough for startup, before anything is served.
    state_file::check_writable(&settings.path)?;
    let persistence =
        Persistence::new(settings.clone(), store.clone(), rules, hasher.fingerprint()).with_stats(stats);
    persistence.load().await;
    let periodic = tokio::spawn(persistence.clone().save_periodically());
    Ok((persistence, periodic))
}

/// Envoy's rate limit service of `config` (`None` without `RLS_CONFIG`), deciding through
/// `gate`, which must be built from `config.gate` (whose table holds the descriptors' rules).
/// The decision listener routes `application/grpc` requests to its
/// [`RateLimitService::into_server`], as the decision listener serves it.
pub fn rls_service(config: &Config, gate: Arc<Gate>) -> Result<Option<RateLimitService>, ServeError> {
    let Some(table) = &config.rls else {
        return Ok(None);
    };
    let service = RateLimitService::new(gate, table.clone())?;
    // Envoy's refusals shaped as the other doors' (the decision listener's settings).
    Ok(Some(match &config.decide {
        Some(decide) => service
            .shaped(decide.refusals.clone(), decide.forward_headers)
            .logged(decide.access_log),
        None => service,
    }))
}

#[cfg(any(feature = "testing", feature = "layer"))]
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
    let metrics = Arc::new(Metrics::new(limiter.clone(), load));
    let gate = Arc::new(Gate::new(config.gate.clone(), limiter, metrics.clone()));
    Ok((gate, metrics))
}

/// The sockets tollgate serves on, each bound by the caller (so tests bind `127.0.0.1:0`).
#[derive(Debug, Default)]
pub struct Listeners {
    /// The proxy's (`BIND`, `PORT`): required when the configuration has a `BACKEND_URL`.
    pub proxy: Option<TcpListener>,
    /// The admin endpoints' (`ADMIN_BIND`, `ADMIN_PORT`); `None`: no admin listener.
    pub admin: Option<TcpListener>,
    /// The decision endpoints' (`BIND`, `DECIDE_PORT`): required when `DECIDE_PORT` is set.
    pub decide: Option<TcpListener>,
    /// SIGHUPs from the moment of binding on, for `RULES_FILE`'s reloads (made by [`bind`]
    /// when there is a rules file; `None`: [`serve_on`] listens from when it starts).
    pub hangup: Option<Hangup>,
}

/// SIGHUPs received since it was made: a client can connect as soon as a listener is bound,
/// and an operator's SIGHUP from then on must be a reload, not lost.
pub struct Hangup(tokio::signal::unix::Signal);

impl Hangup {
    /// Listen for SIGHUP from now on; `None`, said in a warning, when the handler cannot be
    /// installed (the file's changes are still read).
    pub fn listen() -> Option<Hangup> {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) {
            Ok(signal) => Some(Hangup(signal)),
            Err(error) => {
                tracing::warn!(%error, "cannot install a SIGHUP handler: RULES_FILE reloads when it changes only");
                None
            }
        }
    }
}

impl std::fmt::Debug for Hangup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Hangup")
    }
}

/// Bind every listener `config` asks for: the proxy's (`BIND`, `PORT`) when it has a backend,
/// the decision endpoints' (`BIND`, `DECIDE_PORT`) when set, and the admin listener's
/// (`ADMIN_BIND`, `ADMIN_PORT`).
pub async fn bind(config: &Config) -> Result<Listeners, ServeError> {
    async fn bind_one(address: SocketAddr, variables: &'static str) -> Result<TcpListener, ServeError> {
        TcpListener::bind(address)
            .await
            .map_err(|source| ServeError::Bind {
                address,
                variables,
                source,
            })
    }
    let proxy = match &config.proxy {
        Some(_) => Some(bind_one(config.server.listen, "BIND, PORT").await?),
        None => None,
    };
    let decide = match &config.decide {
        Some(decide) => Some(bind_one(decide.listen, "BIND, DECIDE_PORT").await?),
        None => None,
    };
    let admin = Some(bind_one(config.admin.address, "ADMIN_BIND, ADMIN_PORT").await?);
    let hangup = match config.reloads_rules() {
        true => Hangup::listen(),
        false => None,
    };
    Ok(Listeners {
        proxy,
        admin,
        decide,
        hangup,
    })
}

/// Serve proxied traffic on `listener` (no admin listener) until `shutdown` completes, then
/// stop accepting, wait up to `SHUTDOWN_TIMEOUT_MS` for in-flight requests, and return.
pub async fn serve(
    listener: TcpListener,
    config: Config,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ServeError> {
    let listeners = Listeners {
        proxy: Some(listener),
        ..Listeners::default()
    };
    serve_on(listeners, config, shutdown).await
}

/// [`serve`], with the admin endpoints (`/metrics`, `/healthz`, `/readyz`) on `admin`. The
/// admin listener stays up during the drain, answering `/readyz` with 503.
pub async fn serve_with_admin(
    listener: TcpListener,
    admin: TcpListener,
    config: Config,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ServeError> {
    let listeners = Listeners {
        proxy: Some(listener),
        admin: Some(admin),
        ..Listeners::default()
    };
    serve_on(listeners, config, shutdown).await
}

/// Serve every listener of `listeners` the configuration asks for (the proxy, the decision
/// endpoints, the admin endpoints) until `shutdown` completes; then stop accepting, drain the
/// proxy's and the decision endpoints' connections (up to `SHUTDOWN_TIMEOUT_MS`), and return.
pub async fn serve_on(
    listeners: Listeners,
    config: Config,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ServeError> {
    let Listeners {
        proxy,
        admin,
        decide,
        hangup,
    } = listeners;
    let proxy = wanted(
        proxy,
        config.proxy.is_some(),
        "BACKEND_URL is set: a listener for the proxy (PORT)",
        "a proxy listener was given but BACKEND_URL is unset: nothing to proxy to",
    )?;
    let decide = wanted(
        decide,
        config.decide.is_some(),
        "DECIDE_PORT is set: a listener for the decision endpoints",
        "a decision listener was given but DECIDE_PORT is unset",
    )?;
    if proxy.is_none() && decide.is_none() {
        return Err(ServeError::Listener(
            "BACKEND_URL or DECIDE_PORT: nothing to serve",
        ));
    }
    let limiter = limiter(&config)?;
    // Before anything listens: a CA file that cannot be read stops startup.
    let tls = config
        .proxy
        .as_ref()
        .and_then(|proxy| proxy.backend.tls.as_ref())
        .map(TlsConnector::new)
        .transpose()?;
    // One budget of file descriptors for both listeners' connections.
    let capacity = Capacity::of(&config.server);
    let load = metrics::Load {
        connections: Arc::new(capacity.connections.clone()),
        requests: Arc::new(capacity.requests.clone()),
    };
    let metrics = Arc::new(Metrics::new(limiter.clone(), load));
    // Before anything listens: the budgets saved by the last run, so a client limited before
    // the restart is limited from the first request after it.
    let persistence = match (limiter.memory(), &config.store.state_file) {
        (Some(store), Some(settings)) => Some(
            restore_state(
                settings,
                store,
                config.gate.rules.rules(),
                config.gate.rules.hasher(),
                metrics.state_saves(),
            )
            .await?,
        ),
        _ => None,
    };
    let gate = Arc::new(Gate::new(config.gate.clone(), limiter, metrics.clone()));
    let admin_state = Arc::new(AdminState {
        metrics: metrics.clone(),
        gate: gate.clone(),
        draining: AtomicBool::new(false),
        operations: config.admin.token.clone().map(|token| admin::Operations {
            token,
            gate: gate.clone(),
        }),
    });
    let admin_address = admin.as_ref().and_then(|admin| admin.local_addr().ok());
    let admin = admin.map(|admin| tokio::spawn(admin::serve(admin, admin_state.clone())));
    // Every store is asked (one that keeps no clients in memory has none to purge).
    let purge = {
        let gate = gate.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(PURGE_INTERVAL);
            loop {
                tick.tick().await;
                let limiter = gate.current().limiter().clone();
                let purged = limiter.purge_idle();
                tracing::trace!(purged, held = limiter.stats().clients, "purged idle clients");
            }
        })
    };
    // Envoy's rate limit service: served on the decision listener, reloaded with the rules.
    let rls_door = rls_service(&config, gate.clone())?;
    let reloads = config.reload.as_ref().map(|_| {
        // Installed by `bind`, or now, before the listeners accept: a SIGHUP from then on
        // is a reload.
        let hangup = hangup.or_else(Hangup::listen);
        let saver = persistence.as_ref().map(|(saver, _)| saver.clone());
        tokio::spawn(watch_rules(
            Arc::new(config.clone()),
            hangup,
            gate.clone(),
            metrics.clone(),
            saver,
            rls_door.clone(),
        ))
    });
    // What comes before HTTP (TLS, the PROXY header) is the same on both listeners.
    let (entry, certificate_watcher) = Listener::new(
        &config.server.listener,
        &ClientIdentity::new(config.gate.trusted_proxies.clone()),
        &metrics,
    )?;
    let entry = Arc::new(entry);
    let max_per_client = capacity.max_per_client(&config.server);
    let address = |listener: &Option<TcpListener>| {
        listener.as_ref().map_or_else(
            || "off".into(),
            |l| l.local_addr().map_or_else(|_| "?".into(), |a| a.to_string()),
        )
    };
    // One line; in JSON every setting is a field of its own.
    tracing::info!(
        version = env!("CARGO_PKG_VERSION"),
        listen = %address(&proxy),
        decide = %address(&decide),
        admin = %admin_address.map_or_else(|| "off".into(), |a| a.to_string()),
        tls = entry.is_tls(),
        proxy_protocol = config.server.listener.proxy_protocol,
        backend = %config.proxy.as_ref().map_or_else(|| "none".into(), |proxy| proxy.backend.to_string()),
        store = %match &config.store.kind {
            StoreConfig::Memory => format!("memory (this process's own, MAX_KEYS={})", config.store.max_keys),
            StoreConfig::Redis(redis) => redis.to_string(),
        },
        rules = %config.gate.rules.summary(),
        rules_digest = %format!("{:08x}", config.gate.rules.digest()),
        rules_files = %config.reload.as_ref().map_or_else(|| "-".to_owned(), |reload| reload.files()),
        headers = config.proxy.as_ref().map_or("-", |proxy| proxy.headers.as_str()),
        access_log = config
            .proxy
            .as_ref()
            .map(|proxy| proxy.access_log)
            .or(config.decide.as_ref().map(|decide| decide.access_log))
            .map_or("-", |access_log| access_log.as_str()),
        trusted_proxies = config.gate.trusted_proxies.len(),
        admin_operations = config.admin.token.is_some(),
        max_connections = capacity.max_connections,
        max_connections_per_client = %max_per_client.map_or_else(|| "off".into(), |max| max.to_string()),
        max_requests_in_flight_per_client = %capacity
            .max_requests_per_client(&config.server)
            .map_or_else(|| "off".into(), |max| max.to_string()),
        h2_max_concurrent_streams = config.server.h2_max_concurrent_streams,
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
    // Both accept loops stop on the one shutdown.
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let stopping = || {
        let mut stopped = stopped.clone();
        async move {
            // An error is a dropped sender: stop too.
            let _ = stopped.wait_for(|stop| *stop).await;
        }
    };
    let proxy_server = config.proxy.as_ref().zip(proxy).map(|(settings, listener)| {
        let proxy = Arc::new(Proxy::new(settings, gate.clone(), metrics.clone(), tls));
        let server = Server::new(
            &config.server,
            proxy,
            entry.clone(),
            capacity.clone(),
            trusted,
            &metrics,
        );
        (server, listener)
    });
    // Envoy's rate limit service, on the decision listener beside the other doors.
    let rls = rls_door.map(RateLimitService::into_server);
    if rls.is_some() && config.decide.is_none() {
        tracing::warn!("RLS_CONFIG is set but DECIDE_PORT is not: the rate limit service is not served");
    }
    let decide_server = config.decide.as_ref().zip(decide).map(|(settings, listener)| {
        let door = Decide::new(settings.clone(), gate.clone());
        let door = Arc::new(match &rls {
            Some(rls) => door.with_rls(rls.clone()),
            None => door,
        });
        let server = Server::new(
            &config.server,
            door,
            entry.clone(),
            capacity.clone(),
            trusted,
            &metrics,
        );
        (server, listener)
    });
    let (proxy_drain, decide_drain, ()) = tokio::join!(
        accept(proxy_server, stopping()),
        accept(decide_server, stopping()),
        async {
            shutdown.await;
            let _ = stop.send(true);
        }
    );
    admin_state.draining.store(true, Ordering::Release);
    purge.abort();
    if let Some(reloads) = reloads {
        reloads.abort();
    }
    if let Some(watcher) = certificate_watcher {
        watcher.abort();
    }
    tokio::join!(drain(proxy_drain), drain(decide_drain));
    // After the drain: the budgets as the last requests left them.
    if let Some((persistence, periodic)) = persistence {
        periodic.abort();
        persistence.save_on_shutdown().await;
    }
    if let Some(admin) = admin {
        admin.abort();
    }
    Ok(())
}

/// The listener given for a door, when the configuration wants one (`wanted`): an error naming
/// what is `missing`, or what is `extra` when one is given that the configuration does not want.
fn wanted(
    listener: Option<TcpListener>,
    wanted: bool,
    missing: &'static str,
    extra: &'static str,
) -> Result<Option<TcpListener>, ServeError> {
    match (listener, wanted) {
        (listener, true) => listener.map(Some).ok_or(ServeError::Listener(missing)),
        (None, false) => Ok(None),
        (Some(_), false) => Err(ServeError::Listener(extra)),
    }
}

/// Serve `served` (a door's server and its listener, if it has one) until `stop` completes;
/// what is left to drain, and the server that drains it.
async fn accept<D: Door>(
    served: Option<(Server<D>, TcpListener)>,
    stop: impl Future<Output = ()>,
) -> Option<(Drain, Server<D>)> {
    let (server, listener) = served?;
    Some((server.accept_until(listener, stop).await, server))
}

/// Wait for what [`accept`] left, up to `SHUTDOWN_TIMEOUT_MS`.
async fn drain<D: Door>(accepted: Option<(Drain, Server<D>)>) {
    if let Some((drain, server)) = accepted {
        server.drain(drain).await;
    }
}

/// Reload the rule table from `RULES_FILE` on SIGHUP and, every `RULES_RELOAD_INTERVAL_MS`,
/// when the file's bytes changed (a ConfigMap's update swaps a symlink: the path is read, not
/// watched, so any way of replacing the file is seen). One reload at a time: a storm of
/// SIGHUPs is read as the few reloads it takes to catch up.
pub(crate) async fn watch_rules(
    config: Arc<Config>,
    mut hangup: Option<Hangup>,
    gate: Arc<Gate>,
    metrics: Arc<Metrics>,
    saver: Option<Persistence>,
    rls: Option<RateLimitService>,
) {
    let Some(settings) = config.reload.clone() else {
        return;
    };
    let read = |settings: crate::config::ReloadSettings| async move {
        tokio::task::spawn_blocking(move || settings.read())
            .await
            .ok()
            .flatten()
    };
    let files = settings.files();
    // The bytes the table in force was built from: any other bytes are a change.
    let mut seen = Some(settings.loaded.clone());
    // Changed bytes seen once: reloaded when the next read agrees, so a file written in place
    // is not put in force half written.
    let mut pending: Option<Option<crate::config::Loaded>> = None;
    // The bytes the last reload failed on, as read after it: reported once, not at every
    // tick they stay; and a file put back to the table in force is said to be fine again.
    let mut failed: Option<Option<crate::config::Loaded>> = None;
    // What `.env` said when the configuration was read: a later change to it is named, as a
    // reload does not read it.
    let mut dot_env = settings.dot_env.to_vec();
    let mut tick = settings.interval.map(|interval| {
        let mut tick = tokio::time::interval(interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick
    });
    loop {
        let cause = tokio::select! {
            Some(()) = async { hangup.as_mut()?.0.recv().await } => "SIGHUP",
            Some(_) = async { Some(tick.as_mut()?.tick().await) } => {
                let now = read(settings.clone()).await;
                if now == seen {
                    pending = None;
                    if failed.take().is_some() {
                        tracing::info!(
                            file = %files,
                            "rules file is back to the rule table in force: nothing to reload, \
                             the failed reload's error is over"
                        );
                    }
                    continue;
                }
                if failed.as_ref() == Some(&now) {
                    // Still the bytes the last reload failed on: reported already.
                    pending = None;
                    continue;
                }
                if pending.as_ref() != Some(&now) {
                    pending = Some(now);
                    continue;
                }
                "the file changed"
            }
            else => return,
        };
        pending = None;
        let reloaded = {
            let config = config.clone();
            tokio::task::spawn_blocking(move || config.reload_rules()).await
        };
        let now = crate::config::read_dot_env();
        for (name, _) in now.iter().filter(|entry| !dot_env.contains(entry)) {
            tracing::warn!(
                variable = %name,
                "{name} changed in .env: the environment and .env are read at start only, and a \
                 reload reads RULES_FILE alone; restart to apply it"
            );
        }
        dot_env = now;
        let reloaded = reloaded.map(|reloaded| {
            reloaded.map(|reloaded| {
                // What the table was built from, whichever way the reload came.
                seen = Some(reloaded.loaded);
                (reloaded.rules, reloaded.rls)
            })
        });
        // Envoy's descriptors follow the rule table that holds their rules: put in force once
        // it is (a descriptor's `replaces`, `quota_mode` or `metadata` may change alone).
        let descriptors = |table: Option<Arc<DescriptorTable>>| {
            if let (Some(rls), Some(table)) = (&rls, table)
                && let Err(error) = rls.reload(table)
            {
                tracing::error!(%error, "RLS_CONFIG not reloaded: its descriptors in force stay");
            }
        };
        match reloaded {
            Ok(Ok((table, rls_table))) if table.decides_like(gate.current().table()) => {
                failed = None;
                descriptors(rls_table);
                metrics.config_reload(true);
                tracing::info!(file = %files, cause, digest = %format!("{:08x}", table.digest()), "rules reloaded: unchanged");
            }
            Ok(Ok((table, rls_table))) => {
                failed = None;
                if table.ipv6_prefix() != gate.current().table().ipv6_prefix() {
                    tracing::warn!(
                        ipv6_prefix = table.ipv6_prefix(),
                        "IPV6_PREFIX changed: the rules group IPv6 clients by the new prefix, while \
                         MAX_UPGRADES_PER_CLIENT keeps the one it started with until a restart"
                    );
                }
                let swapped = gate.swap(table);
                descriptors(rls_table);
                // STATE_FILE saves the table in force: its rules, and the store's view of them.
                let generation = gate.current();
                if let (Some(saver), Some(store)) = (&saver, generation.limiter().memory()) {
                    saver.follow(store.clone(), generation.rules());
                }
                metrics.config_reload(true);
                tracing::info!(
                    file = %files,
                    cause,
                    digest = %format!("{:08x}", swapped.digest),
                    kept = %swapped.kept.join(","),
                    changed = %swapped.changed.join(","),
                    added = %swapped.added.join(","),
                    removed = %swapped.removed.join(","),
                    "rules reloaded: rules kept keep their budgets; changed and added rules start afresh"
                );
            }
            Ok(Err(error)) => {
                metrics.config_reload(false);
                tracing::error!(file = %files, cause, %error, "rules not reloaded: the rule table in force stays");
                failed = Some(read(settings.clone()).await);
            }
            Err(error) => {
                metrics.config_reload(false);
                tracing::error!(file = %files, cause, %error, "rules not reloaded: the reload failed");
                failed = Some(read(settings.clone()).await);
            }
        }
    }
}
