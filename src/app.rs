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
use crate::config::{Config, Loaded, ReloadSettings, StoreConfig};
use crate::decide::Decide;
use crate::gate::Gate;
use crate::gate::identity::ClientIdentity;
use crate::metrics::{self, Metrics};
use crate::proxy::Proxy;
use crate::proxy::tls::{TlsConnector, TlsSetupError};
use crate::rls::{DescriptorTable, RateLimitService, RlsError};
use crate::rules::RuleTable;
use crate::server::listener::Listener;
use crate::server::{Capacity, Door, Drain, Server, tls};
use crate::stores::state_file::{self, Persistence, StateFileSettings};
use crate::stores::{Guard, Limiter, MemoryStore, RedisStore, StoreError};
use crate::telemetry::trace::Traces;

/// How often the memory store drops clients whose budget is entirely back.
const PURGE_INTERVAL: Duration = Duration::from_secs(10);

/// How long the drained gateway waits for its last spans to reach the collector.
const TRACES_SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(5);

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
    /// The traces' exporter could not be built (`OTEL_EXPORTER_OTLP_*`).
    #[error("{0}")]
    Traces(String),
}

/// Build the configured limiter. Redis is connected lazily, so this does not wait for it.
pub(crate) fn limiter(config: &Config) -> Result<Limiter, StoreError> {
    let rules = config.gate.rules.rules();
    Ok(match &config.store.kind {
        StoreConfig::Memory => Limiter::new(MemoryStore::new(config.store.max_keys, rules)),
        StoreConfig::Redis(redis) => {
            let store = RedisStore::new(&redis.target, &redis.key_prefix, redis.timeout)?
                .with_calls_in_flight(redis.calls_in_flight);
            Limiter::new(Guard::with_leases(
                store,
                redis.guard,
                config.store.max_keys,
                rules,
                redis.leases,
            ))
        }
    })
}

/// `STATE_FILE` for `store`, the memory store of `config`'s rule table: refuse to start when
/// the file's directory cannot take it (found at deploy time, not at the first restart that
/// should have kept the budgets), and read the file into the store (anything wrong with it is
/// logged and ignored). [`App::run`] saves it every `STATE_SAVE_INTERVAL_S` from then on, and
/// once more after the drain ([`Persistence::save_on_shutdown`]). Call before the listeners
/// accept.
async fn restore_state(
    settings: &StateFileSettings,
    store: &MemoryStore,
    config: &Config,
    metrics: &Metrics,
) -> Result<Persistence, ServeError> {
    // A file created and removed: quick enough for startup, before anything is served.
    state_file::check_writable(&settings.path)?;
    let rules = &config.gate.rules;
    let persistence = Persistence::new(
        settings.clone(),
        store.clone(),
        rules.rules(),
        rules.hasher().fingerprint(),
    )
    .with_stats(metrics.state_saves());
    persistence.load().await;
    Ok(persistence)
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

/// A gate of `config`'s own, with its limiter (Redis connected lazily) and metrics, and no
/// listener: for a door served apart from tollgate's listeners (the tower layer, Envoy's rate
/// limit service on a port of its own, tests). Call it inside a Tokio runtime.
pub fn standalone_gate(config: &Config) -> Result<(Arc<Gate>, Arc<Metrics>), ServeError> {
    build_gate(config, &Capacity::of(&config.server))
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
/// proxy's and the decision endpoints' connections (up to `SHUTDOWN_TIMEOUT_MS`), and return:
/// [`App::build`], then [`App::run`].
pub async fn serve_on(
    listeners: Listeners,
    config: Config,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ServeError> {
    App::build(config, listeners).await?.run(shutdown).await;
    Ok(())
}

/// Tollgate built from a configuration and its listeners, not serving yet: every part is
/// made and everything that can fail has been done (the listeners checked against the
/// configuration, the store, the backend's TLS client, the certificate, `STATE_FILE` checked
/// and read back, Envoy's service). [`App::run`] serves it until shutdown, and cannot fail.
pub struct App {
    /// The configuration, shared with the rules watcher (a reload validates it whole again).
    config: Arc<Config>,
    /// The one door to policy, every listener's.
    gate: Arc<Gate>,
    /// The registry, and the counters the reloads report to.
    metrics: Arc<Metrics>,
    /// The proxy's server and its listener; `None` without `BACKEND_URL`.
    proxy: Option<(Server<Proxy>, TcpListener)>,
    /// The decision endpoints' server and listener (Envoy's service beside them); `None`
    /// without `DECIDE_PORT`.
    decide: Option<(Server<Decide>, TcpListener)>,
    /// The admin listener, if one was given, and what it reports on.
    admin: Option<TcpListener>,
    admin_state: Arc<AdminState>,
    /// Envoy's rate limit service, reloaded with the rules; `None` without `RLS_CONFIG`.
    rls: Option<RateLimitService>,
    /// `STATE_FILE`, read back already: saved periodically and once more after the drain.
    persistence: Option<Persistence>,
    /// SIGHUPs since the listeners were bound (or the app built), for the rules watcher.
    hangup: Option<Hangup>,
    /// The task that reloads the listener's certificate when its files change.
    certificate_watcher: Option<Task>,
    /// What the ready line reports: the file-descriptor budget, and whether `PORT` is HTTPS.
    capacity: Capacity,
    tls: bool,
}

impl App {
    /// Build everything `config` asks for on `listeners`, in the order startup needs: nothing
    /// listens yet, so a CA file that cannot be read, a `STATE_FILE` that cannot be written or
    /// a bad certificate stops startup before a client is accepted, and a client limited
    /// before a restart is limited from the first request after it.
    pub async fn build(config: Config, listeners: Listeners) -> Result<App, ServeError> {
        let Listeners {
            proxy,
            admin,
            decide,
            hangup,
        } = listeners;
        let (proxy_listener, decide_listener) = Self::wanted_listeners(&config, proxy, decide)?;
        let backend_tls = config
            .proxy
            .as_ref()
            .and_then(|proxy| proxy.backend.tls.as_ref())
            .map(TlsConnector::new)
            .transpose()?;
        // One budget of file descriptors for both listeners' connections.
        let capacity = Capacity::of(&config.server);
        let (gate, metrics) = build_gate(&config, &capacity)?;
        let persistence = match (gate.current().limiter().memory(), &config.store.state_file) {
            (Some(store), Some(settings)) => Some(restore_state(settings, store, &config, &metrics).await?),
            _ => None,
        };
        let rls = rls_service(&config, gate.clone())?;
        // What comes before HTTP (TLS, the PROXY header) is the same on both listeners.
        let (entry, certificate_watcher) = Listener::new(
            &config.server.listener,
            &ClientIdentity::new(config.gate.trusted_proxies.clone()),
            &metrics,
        )?;
        let entry = Arc::new(entry);
        let servers = Servers {
            config: &config,
            gate: &gate,
            metrics: &metrics,
            entry: &entry,
            capacity: &capacity,
        };
        // Each listener is there when its settings are (`wanted_listeners`).
        let proxy = servers.proxy(backend_tls).zip(proxy_listener);
        let decide = servers.decide(rls.as_ref()).zip(decide_listener);
        // Installed by `bind`, or now, before the listeners accept: a SIGHUP from then on is a
        // reload.
        let hangup = config
            .reload
            .as_ref()
            .and_then(|_| hangup.or_else(Hangup::listen));
        Ok(App {
            admin_state: admin_state(&config, &gate, &metrics),
            config: Arc::new(config),
            gate,
            metrics,
            proxy,
            decide,
            admin,
            rls,
            persistence,
            hangup,
            certificate_watcher: certificate_watcher.map(Task),
            capacity,
            tls: entry.is_tls(),
        })
    }

    /// The proxy's and the decision endpoints' listeners, as the configuration wants them.
    fn wanted_listeners(
        config: &Config,
        proxy: Option<TcpListener>,
        decide: Option<TcpListener>,
    ) -> Result<(Option<TcpListener>, Option<TcpListener>), ServeError> {
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
        Ok((proxy, decide))
    }

    /// Where the proxy listens; `None` without `BACKEND_URL`.
    pub fn proxy_address(&self) -> Option<SocketAddr> {
        self.proxy
            .as_ref()
            .and_then(|(_, listener)| listener.local_addr().ok())
    }

    /// Where the decision endpoints listen; `None` without `DECIDE_PORT`.
    pub fn decide_address(&self) -> Option<SocketAddr> {
        self.decide
            .as_ref()
            .and_then(|(_, listener)| listener.local_addr().ok())
    }

    /// Where the admin endpoints listen; `None` when no admin listener was given.
    pub fn admin_address(&self) -> Option<SocketAddr> {
        self.admin
            .as_ref()
            .and_then(|listener| listener.local_addr().ok())
    }

    /// Serve until `shutdown` completes: the admin endpoints, the purge of idle clients, the
    /// rules watcher, `STATE_FILE`'s periodic saves, and the proxy's and the decision
    /// endpoints' accept loops. Then stop accepting (`/readyz` answers 503 from then on),
    /// drain the connections (up to `SHUTDOWN_TIMEOUT_MS`), and save `STATE_FILE` once more.
    pub async fn run(self, shutdown: impl Future<Output = ()>) {
        self.log_ready();
        let admin = self
            .admin
            .map(|admin| Task(tokio::spawn(admin::serve(admin, self.admin_state.clone()))));
        let purge = Task(tokio::spawn(purge_idle(self.gate.clone())));
        let periodic = self
            .persistence
            .as_ref()
            .map(|saver| Task(tokio::spawn(saver.clone().save_periodically())));
        let reloads = self.config.reload.as_ref().map(|_| {
            Task(tokio::spawn(watch_rules(
                self.config.clone(),
                self.hangup,
                self.gate.clone(),
                self.metrics.clone(),
                self.persistence.clone(),
                self.rls.clone(),
            )))
        });
        // Both accept loops stop on the one shutdown.
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let stopping = || {
            let mut stopped = stopped.clone();
            async move {
                // An error is a dropped sender: stop too.
                let _ = stopped.wait_for(|stop| *stop).await;
            }
        };
        let (proxy_drain, decide_drain, ()) = tokio::join!(
            accept(self.proxy, stopping()),
            accept(self.decide, stopping()),
            async {
                shutdown.await;
                let _ = stop.send(true);
            }
        );
        self.admin_state.draining.store(true, Ordering::Release);
        drop((purge, reloads, self.certificate_watcher));
        tokio::join!(drain(proxy_drain), drain(decide_drain));
        // After the drain: the shares of hot keys' budgets this replica did not spend go back.
        self.gate.current().limiter().release().await;
        // After the drain: the budgets as the last requests left them.
        drop(periodic);
        if let Some(persistence) = self.persistence {
            persistence.save_on_shutdown().await;
        }
        // The last requests' spans, sent before the process ends.
        if let Some(traces) = self.gate.traces() {
            traces.shutdown(TRACES_SHUTDOWN_TIMEOUT).await;
        }
        drop(admin);
    }

    /// The ready line: one line; in JSON every setting is a field of its own.
    fn log_ready(&self) {
        let config = &self.config;
        let capacity = &self.capacity;
        let address = |address: Option<SocketAddr>| address.map_or_else(|| "off".into(), |a| a.to_string());
        tracing::info!(
            version = env!("CARGO_PKG_VERSION"),
            listen = %address(self.proxy_address()),
            decide = %address(self.decide_address()),
            admin = %address(self.admin_address()),
            tls = self.tls,
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
            max_connections_per_client = %capacity
                .max_per_client(&config.server)
                .map_or_else(|| "off".into(), |max| max.to_string()),
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
    }
}

impl std::fmt::Debug for App {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("App")
            .field("proxy", &self.proxy_address())
            .field("decide", &self.decide_address())
            .field("admin", &self.admin_address())
            .finish_non_exhaustive()
    }
}

/// A task that ends with its owner: aborted when dropped.
struct Task(tokio::task::JoinHandle<()>);

impl Drop for Task {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The limiter, the metrics and the gate of `config`, counting connections and requests
/// against `capacity`. Redis is connected lazily, so this does not wait for it.
fn build_gate(config: &Config, capacity: &Capacity) -> Result<(Arc<Gate>, Arc<Metrics>), ServeError> {
    let limiter = limiter(config)?;
    let load = metrics::Load {
        connections: Arc::new(capacity.connections.clone()),
        requests: Arc::new(capacity.requests.clone()),
    };
    let metrics = Arc::new(Metrics::new(limiter.clone(), load));
    let traces = config
        .traces
        .as_ref()
        .map(|settings| Traces::start(settings, metrics.traces(), limiter.memory().is_none()))
        .transpose()
        .map_err(|error| ServeError::Traces(error.to_string()))?;
    let gate = Arc::new(Gate::new(config.gate.clone(), limiter, metrics.clone()).with_traces(traces));
    Ok((gate, metrics))
}

/// What the admin endpoints report on and act through.
fn admin_state(config: &Config, gate: &Arc<Gate>, metrics: &Arc<Metrics>) -> Arc<AdminState> {
    Arc::new(AdminState {
        metrics: metrics.clone(),
        gate: gate.clone(),
        draining: AtomicBool::new(false),
        operations: config.admin.token.clone().map(|token| admin::Operations {
            token,
            gate: gate.clone(),
        }),
    })
}

/// What the doors' servers are built from.
struct Servers<'a> {
    config: &'a Config,
    gate: &'a Arc<Gate>,
    metrics: &'a Arc<Metrics>,
    entry: &'a Arc<Listener>,
    capacity: &'a Capacity,
}

impl Servers<'_> {
    /// The proxy's server, forwarding through `tls` to an https backend; `None` without
    /// `BACKEND_URL`.
    fn proxy(&self, tls: Option<TlsConnector>) -> Option<Server<Proxy>> {
        let settings = self.config.proxy.as_ref()?;
        let proxy = Proxy::new(settings, self.gate.clone(), self.metrics.clone(), tls);
        Some(self.server(Arc::new(proxy)))
    }

    /// The decision endpoints' server, with Envoy's rate limit service (`rls`) beside them;
    /// `None` without `DECIDE_PORT`.
    fn decide(&self, rls: Option<&RateLimitService>) -> Option<Server<Decide>> {
        let Some(settings) = &self.config.decide else {
            if rls.is_some() {
                tracing::warn!(
                    "RLS_CONFIG is set but DECIDE_PORT is not: the rate limit service is not served"
                );
            }
            return None;
        };
        let door = Decide::new(settings.clone(), self.gate.clone());
        let door = match rls {
            Some(rls) => door.with_rls(rls.clone().into_server()),
            None => door,
        };
        Some(self.server(Arc::new(door)))
    }

    fn server<D: Door>(&self, door: Arc<D>) -> Server<D> {
        let trusted = (
            self.config.gate.trusted_proxies.as_slice(),
            self.config.gate.rules.ipv6_prefix(),
        );
        Server::new(
            &self.config.server,
            door,
            self.entry.clone(),
            self.capacity.clone(),
            trusted,
            self.metrics,
        )
    }
}

/// Every [`PURGE_INTERVAL`], drop the clients whose budget is entirely back. Every store is
/// asked (one that keeps no clients in memory has none to purge).
pub(crate) async fn purge_idle(gate: Arc<Gate>) {
    let mut tick = tokio::time::interval(PURGE_INTERVAL);
    loop {
        tick.tick().await;
        let limiter = gate.current().limiter().clone();
        let purged = limiter.purge_idle();
        tracing::trace!(purged, held = limiter.stats().clients, "purged idle clients");
    }
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
    let mut tick = settings.interval.map(|interval| {
        let mut tick = tokio::time::interval(interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick
    });
    let mut watcher = RulesWatcher {
        files: settings.files(),
        seen: Some(settings.loaded.clone()),
        pending: None,
        failed: None,
        dot_env: settings.dot_env.to_vec(),
        settings,
        config,
        gate,
        metrics,
        saver,
        rls,
    };
    loop {
        let cause = tokio::select! {
            Some(()) = async { hangup.as_mut()?.0.recv().await } => "SIGHUP",
            Some(_) = async { Some(tick.as_mut()?.tick().await) } => match watcher.changed().await {
                true => "the file changed",
                false => continue,
            },
            else => return,
        };
        watcher.reload(cause).await;
    }
}

/// What the rules watcher keeps between reloads.
struct RulesWatcher {
    config: Arc<Config>,
    settings: ReloadSettings,
    /// The files, as logs name them.
    files: String,
    gate: Arc<Gate>,
    metrics: Arc<Metrics>,
    /// `STATE_FILE`'s saver, which follows the table in force.
    saver: Option<Persistence>,
    /// Envoy's service, whose descriptors follow the table that holds their rules.
    rls: Option<RateLimitService>,
    /// The bytes the table in force was built from: any other bytes are a change.
    seen: Option<Loaded>,
    /// Changed bytes seen once: reloaded when the next read agrees, so a file written in place
    /// is not put in force half written.
    pending: Option<Option<Loaded>>,
    /// The bytes the last reload failed on, as read after it: reported once, not at every
    /// tick they stay; and a file put back to the table in force is said to be fine again.
    failed: Option<Option<Loaded>>,
    /// What `.env` said when the configuration was read: a later change to it is named, as a
    /// reload does not read it.
    dot_env: Vec<(String, String)>,
}

impl RulesWatcher {
    /// The files as they are now, read off the runtime's threads.
    async fn read(&self) -> Option<Loaded> {
        let settings = self.settings.clone();
        tokio::task::spawn_blocking(move || settings.read())
            .await
            .ok()
            .flatten()
    }

    /// At a tick: whether the files changed to bytes worth a reload (read twice alike, and
    /// not the bytes the last reload failed on).
    async fn changed(&mut self) -> bool {
        let now = self.read().await;
        if now == self.seen {
            self.pending = None;
            if self.failed.take().is_some() {
                tracing::info!(
                    file = %self.files,
                    "rules file is back to the rule table in force: nothing to reload, \
                     the failed reload's error is over"
                );
            }
            return false;
        }
        if self.failed.as_ref() == Some(&now) {
            // Still the bytes the last reload failed on: reported already.
            self.pending = None;
            return false;
        }
        if self.pending.as_ref() != Some(&now) {
            self.pending = Some(now);
            return false;
        }
        true
    }

    /// Read the configuration again and put its rule table in force, or say why not.
    async fn reload(&mut self, cause: &'static str) {
        self.pending = None;
        let reloaded = {
            let config = self.config.clone();
            tokio::task::spawn_blocking(move || config.reload_rules()).await
        };
        self.warn_dot_env();
        match reloaded {
            Ok(Ok(reloaded)) => {
                // What the table was built from, whichever way the reload came.
                self.seen = Some(reloaded.loaded);
                self.failed = None;
                self.put_in_force(reloaded.rules, reloaded.rls, cause);
            }
            Ok(Err(error)) => {
                self.metrics.config_reload(false);
                tracing::error!(file = %self.files, cause, %error, "rules not reloaded: the rule table in force stays");
                self.failed = Some(self.read().await);
            }
            Err(error) => {
                self.metrics.config_reload(false);
                tracing::error!(file = %self.files, cause, %error, "rules not reloaded: the reload failed");
                self.failed = Some(self.read().await);
            }
        }
    }

    /// Name each variable `.env` changed since the last look: a reload does not apply it.
    fn warn_dot_env(&mut self) {
        let now = crate::config::read_dot_env();
        for (name, _) in now.iter().filter(|entry| !self.dot_env.contains(entry)) {
            tracing::warn!(
                variable = %name,
                "{name} changed in .env: the environment and .env are read at start only, and a \
                 reload reads RULES_FILE alone; restart to apply it"
            );
        }
        self.dot_env = now;
    }

    /// Swap `table` in (unless it decides as the one in force does), and Envoy's
    /// descriptors with it.
    fn put_in_force(&self, table: RuleTable, descriptors: Option<Arc<DescriptorTable>>, cause: &str) {
        if table.decides_like(self.gate.current().table()) {
            self.reload_descriptors(descriptors);
            self.metrics.config_reload(true);
            tracing::info!(file = %self.files, cause, digest = %format!("{:08x}", table.digest()), "rules reloaded: unchanged");
            return;
        }
        if table.ipv6_prefix() != self.gate.current().table().ipv6_prefix() {
            tracing::warn!(
                ipv6_prefix = table.ipv6_prefix(),
                "IPV6_PREFIX changed: the rules group IPv6 clients by the new prefix, while \
                 MAX_UPGRADES_PER_CLIENT keeps the one it started with until a restart"
            );
        }
        let swapped = self.gate.swap(table);
        self.reload_descriptors(descriptors);
        // STATE_FILE saves the table in force: its rules, and the store's view of them.
        let generation = self.gate.current();
        if let (Some(saver), Some(store)) = (&self.saver, generation.limiter().memory()) {
            saver.follow(store.clone(), generation.rules());
        }
        // Counted once in force: a reload seen counted is a reload that decides.
        self.metrics.config_reload(true);
        tracing::info!(
            file = %self.files,
            cause,
            digest = %format!("{:08x}", swapped.digest),
            kept = %swapped.kept.join(","),
            changed = %swapped.changed.join(","),
            added = %swapped.added.join(","),
            removed = %swapped.removed.join(","),
            "rules reloaded: rules kept keep their budgets; changed and added rules start afresh"
        );
    }

    /// Envoy's descriptors follow the rule table that holds their rules: put in force once it
    /// is (a descriptor's `replaces`, `quota_mode` or `metadata` may change alone).
    fn reload_descriptors(&self, table: Option<Arc<DescriptorTable>>) {
        if let (Some(rls), Some(table)) = (&self.rls, table)
            && let Err(error) = rls.reload(table)
        {
            tracing::error!(%error, "RLS_CONFIG not reloaded: its descriptors in force stay");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(vars: &[(&str, &str)]) -> Config {
        Config::from_vars(vars.iter().copied()).unwrap()
    }

    async fn bound() -> TcpListener {
        TcpListener::bind("127.0.0.1:0").await.unwrap()
    }

    #[tokio::test]
    async fn build_refuses_listeners_the_configuration_does_not_want() {
        let proxied = config(&[("BACKEND_URL", "http://127.0.0.1:9")]);
        let error = App::build(proxied.clone(), Listeners::default())
            .await
            .unwrap_err();
        assert!(
            error.to_string().contains("a listener for the proxy (PORT)"),
            "{error}"
        );
        let extra = Listeners {
            proxy: Some(bound().await),
            decide: Some(bound().await),
            ..Listeners::default()
        };
        let error = App::build(proxied, extra).await.unwrap_err();
        assert!(error.to_string().contains("DECIDE_PORT is unset"), "{error}");
    }

    #[tokio::test]
    async fn build_stops_at_a_state_file_it_cannot_write_before_anything_is_served() {
        let state = config(&[
            ("BACKEND_URL", "http://127.0.0.1:9"),
            ("STATE_FILE", "/nonexistent-directory/tollgate/state"),
        ]);
        let listeners = Listeners {
            proxy: Some(bound().await),
            ..Listeners::default()
        };
        let error = App::build(state, listeners).await.unwrap_err();
        assert!(matches!(error, ServeError::StateFile(_)), "{error}");
    }

    #[tokio::test]
    async fn a_built_app_tells_its_addresses_then_serves_until_shutdown() {
        let (proxy, admin) = (bound().await, bound().await);
        let (proxy_address, admin_address) = (proxy.local_addr().unwrap(), admin.local_addr().unwrap());
        let listeners = Listeners {
            proxy: Some(proxy),
            admin: Some(admin),
            ..Listeners::default()
        };
        let app = App::build(config(&[("BACKEND_URL", "http://127.0.0.1:9")]), listeners)
            .await
            .unwrap();
        assert_eq!(app.proxy_address(), Some(proxy_address));
        assert_eq!(app.admin_address(), Some(admin_address));
        assert_eq!(app.decide_address(), None);
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let running = tokio::spawn(app.run(async {
            let _ = stopped.await;
        }));
        assert_eq!(crate::admin::healthcheck(admin_address).await, Ok(()));
        stop.send(()).unwrap();
        tokio::time::timeout(Duration::from_secs(10), running)
            .await
            .expect("run returns once shut down")
            .unwrap();
        // The admin listener went with the app.
        assert!(crate::admin::healthcheck(admin_address).await.is_err());
    }
}
