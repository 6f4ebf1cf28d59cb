//! tollgate: a rate-limiting reverse proxy.
//!
//! Every request's path is read once into a canonical form, attributed to a client (its IP, the
//! address a trusted proxy forwarded, or a header such as an API key), matched to a rule by the
//! compiled rule table (routes, the auth paths, the general rule), and decided by a limiter
//! held in memory or in Redis. Allowed requests stream through to the
//! backend; the rest get `429 Too Many Requests` with `Retry-After`. Configuration comes only
//! from the environment.
//!
//! ```no_run
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let config = tollgate::Config::from_vars([("BACKEND_URL", "http://127.0.0.1:8000")])?;
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
//! tollgate::serve(listener, config, std::future::pending()).await?;
//! # Ok(()) }
//! ```
//!
//! # Layout
//!
//! Policy behind the gate, HTTP in the callers, wiring in `app`. Public: [`App`] (built, then
//! run; [`serve_on`] does both, as do [`serve`] and [`serve_with_admin`]; [`bind`] binds its
//! listeners), [`standalone_gate`], [`Config`], the limiting domain ([`limit`]) and
//! the variables ([`variables`]); the rest is the crate's own, and the `testing` feature opens
//! the parsers the fuzzers and integration tests drive (`tollgate::testing`).
//!
//! Modules:
//!
//! - [`config`]: environment variables to a validated [`Config`], a struct of the components'
//!   own settings types, each parsed by its part of `config`; every error names the variable.
//! - `app`: the wiring: [`App::build`] puts the store, the metrics, the gate, the proxy, the
//!   listener and the admin listener together (everything that can fail), [`App::run`] serves
//!   until shutdown, then drains.
//! - `server`: the accept loop, HTTPS or not, the PROXY protocol, HTTP/1.1 + h2c,
//!   connection limits and timeouts, the drain.
//! - `gate`: the one door to policy: `gate::Gate::decide` turns a request head into a
//!   verdict (the path read once, the client, the rule, the tunnel cap, the limiter), and
//!   `gate::Gate::settle` applies what the answer changes.
//! - `proxy`: the reverse proxy, a caller of the gate: strict HTTP/1.1 checks, forwarding
//!   (request bodies watched, so a broken one is the client's fault), hop-by-hop and
//!   forwarding headers, upgrades, and the gateway's own responses and rate-limit headers.
//! - `rls`: Envoy's rate limit service over gRPC, a caller of the gate: `RLS_CONFIG`'s
//!   descriptor trees (envoyproxy/ratelimit's format), each limit a named rule of the gate.
//! - [`limit`]: the policy's parts, never forwarding or answering anything: the rule table
//!   ([`limit::RuleTable`]: classify a request head into rule, key, cost and mode), client keys,
//!   path patterns, the algorithms (`limit::algorithm`, one module and one Lua script each),
//!   and the stores behind one trait ([`limit::Store`], which the gate's [`limit::Limiter`]
//!   holds): the memory store, and the guard ([`limit::Guard`]: breakers and fail modes)
//!   generic over a store that can fail ([`limit::Remote`]), the Redis store; and
//!   [`limit::state_file`], the memory store saved to `STATE_FILE` and read back at start.
//! - `outcome`: what became of a request, a backend exchange or a connection, as the doors
//!   and the `metrics` both name it.
//! - `admin`: the admin listener (`/metrics`, `/healthz`, `/readyz`) and `tollgate healthcheck`.
//! - `metrics`: the Prometheus registry and the typed metrics, labels bounded by the config.
//! - `telemetry`: log setup, and the throttle for log lines a flood could repeat.

#![forbid(unsafe_code)]
#![warn(missing_docs)]
// The public surface is what the docs say it is: the crate root's re-exports, `config`, `limit`
// and `variables`; the rest is the crate's own. Checked in the `testing` build (which
// `cargo test` and `cargo clippy --all-targets` make, through the self dev-dependency), where
// the test hooks are reachable through `testing`; without the feature they would be flagged
// for being reachable from tests only.
#![cfg_attr(feature = "testing", warn(unreachable_pub))]

pub(crate) mod admin;
pub(crate) mod app;
pub mod config;
pub(crate) mod decide;
pub(crate) mod decision_log;
pub(crate) mod gate;
pub mod limit;
pub(crate) mod limit_headers;
pub(crate) mod metrics;
pub(crate) mod outcome;
pub(crate) mod proxy;
pub(crate) mod refusal;
pub(crate) mod rls;
pub(crate) mod server;
mod suggest;
pub(crate) mod telemetry;
#[cfg(feature = "testing")]
pub mod testing;
pub mod variables;

pub use admin::healthcheck;
pub use app::{App, Hangup, Listeners, ServeError, bind, serve, serve_on, serve_with_admin, standalone_gate};
pub use config::{Config, ConfigError};
pub use server::raise_fd_limit;
pub use telemetry::{TelemetryError, check_log_filter, init_logging};
