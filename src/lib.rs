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
//! # The public surface
//!
//! - Serving, as the binary does: [`App`] (built, then run; [`serve_on`] does both, as do
//!   [`serve`] and [`serve_with_admin`]; [`bind`] binds its listeners),
//!   [`Config`] and its [`ConfigError`], [`ServeError`], logging ([`init_logging`]), the
//!   variables' names and defaults ([`variables`]).
//! - A gate without a listener, for a door of an app's own: [`standalone_gate`], [`Gate`],
//!   [`Admission`], [`Answers`].
//! - Embedding, with the `layer` feature: [`layer`], the gate as a tower layer in front of
//!   any service of `http` requests ([`RateLimitLayer`], built from the environment or a
//!   [`LayerBuilder`]); docs/embedding.md.
//! - The domain types those take or tell: [`FailMode`], [`Cost`], [`Outcome`].
//!
//! Everything else is the crate's own. The `testing` feature (the integration tests', benches'
//! and fuzzers', never a user's) opens `tollgate::testing`, `tollgate::limit` and
//! `tollgate::config` to drive parsers and stores directly; none of it is kept stable, and
//! none of it is documented.
//!
//! # Layout
//!
//! Policy behind the gate, HTTP in the callers, wiring in `app`. Modules:
//!
//! - `config`: environment variables to a validated [`Config`], a struct of the components'
//!   own settings types, each parsed by its part of `config`; every error names the variable.
//! - `app`: the wiring: [`App::build`] puts the store, the metrics, the gate, the proxy, the
//!   listener and the admin listener together (everything that can fail), [`App::run`] serves
//!   until shutdown, then drains.
//! - `server`: the accept loop, HTTPS or not, the PROXY protocol, HTTP/1.1 + h2c,
//!   connection limits and timeouts, the drain.
//! - `gate`: the one door to policy: `gate::Gate::admit` turns a request head into an
//!   admission (the path read once, the client, the rule, the tunnel cap, the limiter, the
//!   concurrency places) that owns the request until the door settles it, and
//!   `gate::Answers` maps an admission to its answer for every door.
//! - `proxy`: the reverse proxy, a caller of the gate: strict HTTP/1.1 checks, forwarding
//!   (request bodies watched, so a broken one is the client's fault), hop-by-hop and
//!   forwarding headers, upgrades, and the gateway's own responses and rate-limit headers.
//! - `decide`: forward-auth and `POST /v1/check`, callers of the gate for a proxy in front.
//! - `rls`: Envoy's rate limit service over gRPC, a caller of the gate: `RLS_CONFIG`'s
//!   descriptor trees (envoyproxy/ratelimit's format), each limit a named rule of the gate.
//! - [`layer`] (feature `layer`): the gate as a tower layer, a caller of the gate inside an app.
//! - `rules`: classification, never forwarding or answering anything: the rule table (classify
//!   a request head into rule, key, cost and mode), its specification, client keys, overrides
//!   and tiers, path patterns, each rule's fail mode.
//! - `algorithms`: one module and one Lua script each, behind `Policy`; the decisions they
//!   make and the cost they take.
//! - `stores`: the stores behind one trait: the memory store, the guard (breakers and fail
//!   modes) generic over a store that can fail, the Redis store; and the state file, the
//!   memory store saved to `STATE_FILE` and read back.
//! - `outcome`: what became of a request, a backend exchange or a connection, as the doors
//!   and the `metrics` both name it.
//! - `admin`: the admin listener (`/metrics`, `/healthz`, `/readyz`) and `tollgate healthcheck`.
//! - `metrics`: the Prometheus registry and the typed metrics, labels bounded by the config.
//! - `telemetry`: log setup, the throttle for log lines a flood could repeat, and traces
//!   (`telemetry::trace`: an OpenTelemetry span per request, exported over OTLP).
//! - `header_arena`: the header values written on every request (forwarding headers, request
//!   ids, rate-limit numbers) cut from a per-thread buffer, with no allocation of their own.

#![forbid(unsafe_code)]
#![warn(missing_docs)]
// The public surface is what the docs say it is: the re-exports below, `layer` and `variables`.
// Checked in the `testing` build (which `cargo test` and `cargo clippy --all-targets` make,
// through the self dev-dependency), where the test hooks are reachable through `testing`,
// `rules`, `algorithms`, `stores` and `config`: without the feature they would be flagged for
// being reachable from tests only. `cargo doc` documents the build without the hooks
// (`cfg(doc)`), and scripts/test.sh builds it with `-D warnings`, so no public item links to a
// private one.
#![cfg_attr(feature = "testing", warn(unreachable_pub))]

pub(crate) mod admin;
pub(crate) mod app;
#[cfg(all(feature = "testing", not(doc)))]
pub mod config;
// Public (as before) to the tests' hooks only: what only they call is no dead code here.
#[cfg(all(feature = "testing", not(doc)))]
pub mod algorithms;
#[cfg(not(all(feature = "testing", not(doc))))]
#[allow(dead_code, unused_imports)]
pub(crate) mod config;
pub(crate) mod decide;
pub(crate) mod decision_log;
pub(crate) mod gate;
pub(crate) mod header_arena;
#[cfg(feature = "layer")]
pub mod layer;
#[cfg(all(feature = "testing", not(doc)))]
pub mod rules;
#[cfg(all(feature = "testing", not(doc)))]
pub mod stores;
// Public (as before) to the tests' hooks only: what only they call is no dead code here.
#[cfg(not(all(feature = "testing", not(doc))))]
#[allow(dead_code, unused_imports)]
pub(crate) mod algorithms;
pub(crate) mod limit_headers;
pub(crate) mod metrics;
pub(crate) mod outcome;
pub(crate) mod proxy;
pub(crate) mod refusal;
pub(crate) mod rls;
#[cfg(not(all(feature = "testing", not(doc))))]
#[allow(dead_code, unused_imports)]
pub(crate) mod rules;
pub(crate) mod server;
#[cfg(not(all(feature = "testing", not(doc))))]
#[allow(dead_code, unused_imports)]
pub(crate) mod stores;
mod suggest;
pub(crate) mod telemetry;
#[cfg(all(feature = "testing", not(doc)))]
pub mod testing;
pub mod variables;

pub use crate::algorithms::{Cost, CostError, Decision};
pub use crate::rules::{ClientKey, FailMode, Mode};
pub use crate::stores::state_file::{StateFileError, StateFileSettings, check_writable as check_state_file};
pub use admin::healthcheck;
pub use app::{App, Hangup, Listeners, ServeError, bind, serve, serve_on, serve_with_admin, standalone_gate};
pub use config::{Config, ConfigError, admin_probe_address};
pub use gate::{Admission, Answers, Gate, Head, Refuse, Refused, Settled};
#[cfg(feature = "layer")]
pub use layer::{Builder as LayerBuilder, LayerError, RateLimitLayer};
pub use outcome::Outcome;
pub use server::raise_fd_limit;
pub use telemetry::{TelemetryError, check_log_filter, init_logging};
