//! tollgate: a rate-limiting reverse proxy.
//!
//! Every request is attributed to a client (its IP, or the address a trusted proxy forwarded),
//! matched to a rule by path (the general rule, or the stricter auth rule for `AUTH_PATHS`),
//! and decided by a limiter held in memory or in Redis. Allowed requests stream through to the
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
//! - [`config`]: environment variables to a validated [`Config`]; every error names the variable.
//! - [`server`]: accept loop, HTTP/1.1 + h2c, graceful shutdown; wires the pieces together.
//! - [`proxy`]: the HTTP face: client identity, path rules, forwarding, hop-by-hop headers,
//!   upgrades, and the gateway's own responses.
//! - [`limit`]: the domain, without HTTP types: [`limit::Rule`], [`limit::Decision`], the
//!   algorithms (`limit::algorithm`, one pure function each), the memory store, the Redis
//!   store (`scripts/*.lua`) and the guard that decides what happens when Redis fails.
//! - [`telemetry`]: log setup.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod config;
pub mod limit;
pub mod proxy;
pub mod server;
pub mod telemetry;

pub use config::{Config, ConfigError};
pub use server::{ServeError, serve};
