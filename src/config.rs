//! Configuration: environment variables in, a validated [`Config`] out.
//!
//! Parsing is a pure function over a map of strings ([`Config::from_vars`]), so every rule is
//! unit-tested without touching the process environment. `envy` maps the variables onto a flat
//! struct of raw strings; all checking happens here, so every error names the variable, shows
//! the bad value (except for secrets) and says what is accepted. An empty value (`FOO=`)
//! counts as unset.

use std::collections::HashMap;
use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::num::NonZeroUsize;
use std::time::Duration;

use http::uri::{Authority, Scheme, Uri};
use ipnet::IpNet;
use serde::Deserialize;

use crate::limit::algorithm::{SlidingWindow, TokenBucket};
use crate::limit::redis::redact_url;
use crate::limit::{FailMode, GuardSettings, Policy, RedisTarget, Rule, RuleName};
use crate::proxy::route::{AuthPaths, PathPattern};

/// Numbers the Lua scripts handle must stay well below 2^53 (exact in a double); 2^50 leaves
/// room for the additions the algorithms make.
const EXACT_LIMIT: u64 = 1 << 50;

/// A configuration mistake, naming the variable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// A required variable is unset or empty.
    #[error("{var} is required: {expected}")]
    Missing {
        /// The variable.
        var: &'static str,
        /// What it should hold.
        expected: &'static str,
    },
    /// A value that does not parse or is out of range.
    #[error("{var}={value:?} is invalid: expected {expected}")]
    Invalid {
        /// The variable.
        var: &'static str,
        /// What was given.
        value: String,
        /// What is accepted.
        expected: String,
    },
    /// A value that may hold a password: it is never printed.
    #[error("{var} is invalid (value hidden, it may hold a password): expected {expected}")]
    InvalidSecret {
        /// The variable.
        var: &'static str,
        /// What is accepted.
        expected: String,
    },
    /// Variables that cannot be used together.
    #[error("{0}")]
    Conflict(String),
}

/// The variables as strings, exactly as `envy` finds them (every field optional: all checking
/// is done by [`Config::from_raw`], never by `envy`, whose errors would print values).
#[derive(Debug, Default, Deserialize)]
struct RawConfig {
    backend_url: Option<String>,
    port: Option<String>,
    bind: Option<String>,
    algorithm: Option<String>,
    auth_paths: Option<String>,
    max_tokens: Option<String>,
    refill_rate: Option<String>,
    auth_max_tokens: Option<String>,
    auth_refill_rate: Option<String>,
    limit: Option<String>,
    window_size: Option<String>,
    auth_limit: Option<String>,
    auth_window_size: Option<String>,
    trusted_proxies: Option<String>,
    max_keys: Option<String>,
    log_format: Option<String>,
    backend_timeout_ms: Option<String>,
    backend_idle_timeout_ms: Option<String>,
    header_read_timeout_ms: Option<String>,
    shutdown_timeout_ms: Option<String>,
    redis_addr: Option<String>,
    redis_url: Option<String>,
    redis_password: Option<String>,
    redis_cluster_nodes: Option<String>,
    redis_tls: Option<String>,
    key_prefix: Option<String>,
    redis_timeout_ms: Option<String>,
    fail_mode: Option<String>,
    redis_breaker_threshold: Option<String>,
    redis_probe_interval_ms: Option<String>,
}

/// Where allowed requests go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Backend {
    /// `http` (TLS to the backend is not supported).
    pub scheme: Scheme,
    /// Host and port of the backend.
    pub authority: Authority,
    /// Path prefix of `BACKEND_URL` without its trailing slash (often empty); request paths
    /// are appended to it.
    pub base_path: String,
}

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line, for log shippers.
    Json,
}

/// Which store holds client budgets.
#[derive(Debug, Clone, PartialEq)]
pub enum StoreConfig {
    /// In process memory (no Redis variable set).
    Memory,
    /// Redis, shared by all replicas.
    Redis(RedisConfig),
}

/// Redis settings.
#[derive(Debug, Clone, PartialEq)]
pub struct RedisConfig {
    /// `REDIS_URL`, `REDIS_ADDR` or `REDIS_CLUSTER_NODES`.
    pub target: RedisTarget,
    /// `KEY_PREFIX`: in front of every key, so several gateways can share one Redis.
    pub key_prefix: String,
    /// `REDIS_TIMEOUT_MS`: the most one decision may wait for Redis.
    pub timeout: Duration,
    /// Fail mode and circuit breaker.
    pub guard: GuardSettings,
}

/// The validated configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// `BACKEND_URL`.
    pub backend: Backend,
    /// `BIND` and `PORT`.
    pub listen: SocketAddr,
    /// The rule for every path not in `AUTH_PATHS`.
    pub general: Rule,
    /// The rule for `AUTH_PATHS`.
    pub auth: Rule,
    /// `AUTH_PATHS`.
    pub auth_paths: AuthPaths,
    /// `TRUSTED_PROXIES`: peers whose `X-Forwarded-For` is believed.
    pub trusted_proxies: Vec<IpNet>,
    /// `MAX_KEYS`: bound on client states held in memory.
    pub max_keys: NonZeroUsize,
    /// `LOG_FORMAT`.
    pub log_format: LogFormat,
    /// `BACKEND_TIMEOUT_MS`: how long to wait for the backend's response headers (504 after).
    pub backend_timeout: Duration,
    /// `BACKEND_IDLE_TIMEOUT_MS`: idle pooled backend connections are closed after this; keep
    /// it below the backend's own keep-alive timeout so we never reuse a closing connection.
    pub backend_idle_timeout: Duration,
    /// `HEADER_READ_TIMEOUT_MS`: a client must send its request headers within this
    /// (slowloris protection).
    pub header_read_timeout: Duration,
    /// `SHUTDOWN_TIMEOUT_MS`: how long SIGTERM waits for in-flight requests.
    pub shutdown_timeout: Duration,
    /// Memory or Redis.
    pub store: StoreConfig,
}

impl Config {
    /// Read the process environment (after the caller has loaded `.env`, if any).
    pub fn from_env() -> Result<Self, ConfigError> {
        Self::from_vars(std::env::vars())
    }

    /// Parse from any set of `NAME=value` pairs; names are the upper-case variable names.
    pub fn from_vars<I, K, V>(vars: I) -> Result<Self, ConfigError>
    where
        I: IntoIterator<Item = (K, V)>,
        K: Into<String>,
        V: Into<String>,
    {
        // Later pairs win, as in a shell; empty values count as unset.
        let vars: HashMap<String, String> = vars
            .into_iter()
            .map(|(k, v)| (k.into(), v.into()))
            .filter(|(_, v)| !v.trim().is_empty())
            .collect();
        // Only string fields, all optional: envy cannot fail on a value, only on its own bugs.
        let raw = envy::from_iter::<_, RawConfig>(vars)
            .map_err(|e| ConfigError::Conflict(format!("reading the environment failed: {e}")))?;
        Self::from_raw(raw)
    }

    fn from_raw(raw: RawConfig) -> Result<Self, ConfigError> {
        let backend = parse_backend(raw.backend_url.as_deref())?;
        let port: u16 = parse(&raw.port, "PORT", "8080", "a port number from 1 to 65535", |s| {
            s.parse().ok().filter(|p| *p != 0)
        })?;
        let bind: IpAddr = parse(
            &raw.bind,
            "BIND",
            "0.0.0.0",
            "an IP address such as 0.0.0.0 or ::",
            |s| s.parse().ok(),
        )?;

        let algorithm = raw.algorithm.as_deref().map(str::trim).unwrap_or("token_bucket");
        let (general, auth) = match algorithm {
            "token_bucket" => (
                token_bucket(
                    RuleName::General,
                    &raw.max_tokens,
                    "MAX_TOKENS",
                    "10",
                    &raw.refill_rate,
                    "REFILL_RATE",
                    "1",
                )?,
                token_bucket(
                    RuleName::Auth,
                    &raw.auth_max_tokens,
                    "AUTH_MAX_TOKENS",
                    "5",
                    &raw.auth_refill_rate,
                    "AUTH_REFILL_RATE",
                    "0.01",
                )?,
            ),
            "sliding_window" => (
                sliding_window(
                    RuleName::General,
                    &raw.limit,
                    "LIMIT",
                    "10",
                    &raw.window_size,
                    "WINDOW_SIZE",
                    "60",
                )?,
                sliding_window(
                    RuleName::Auth,
                    &raw.auth_limit,
                    "AUTH_LIMIT",
                    "5",
                    &raw.auth_window_size,
                    "AUTH_WINDOW_SIZE",
                    "60",
                )?,
            ),
            other => return Err(invalid("ALGORITHM", other, "token_bucket or sliding_window")),
        };

        let auth_paths = AuthPaths(
            list(
                raw.auth_paths
                    .as_deref()
                    .unwrap_or("/login,/signup,/reset-password"),
            )
            .map(|entry| PathPattern::parse(entry).map_err(|why| invalid("AUTH_PATHS", entry, &why)))
            .collect::<Result<_, _>>()?,
        );
        let trusted_proxies = list(raw.trusted_proxies.as_deref().unwrap_or(""))
            .map(|entry| {
                entry
                    .parse::<IpNet>()
                    .or_else(|_| entry.parse::<IpAddr>().map(IpNet::from))
                    .map(|net| net.trunc())
                    .map_err(|_| {
                        invalid(
                            "TRUSTED_PROXIES",
                            entry,
                            "comma-separated CIDRs or addresses, e.g. 10.0.0.0/8,192.168.1.7",
                        )
                    })
            })
            .collect::<Result<_, _>>()?;
        let max_keys = parse(
            &raw.max_keys,
            "MAX_KEYS",
            "100000",
            "a whole number of at least 1",
            |s| s.parse::<usize>().ok().and_then(NonZeroUsize::new),
        )?;
        let log_format = parse(
            &raw.log_format,
            "LOG_FORMAT",
            "text",
            "text or json",
            |s| match s {
                "text" => Some(LogFormat::Text),
                "json" => Some(LogFormat::Json),
                _ => None,
            },
        )?;

        let store = parse_store(&raw)?;
        Ok(Config {
            backend,
            listen: SocketAddr::new(bind, port),
            general,
            auth,
            auth_paths,
            trusted_proxies,
            max_keys,
            log_format,
            backend_timeout: millis(&raw.backend_timeout_ms, "BACKEND_TIMEOUT_MS", "30000")?,
            backend_idle_timeout: millis(&raw.backend_idle_timeout_ms, "BACKEND_IDLE_TIMEOUT_MS", "4000")?,
            header_read_timeout: millis(&raw.header_read_timeout_ms, "HEADER_READ_TIMEOUT_MS", "10000")?,
            shutdown_timeout: millis(&raw.shutdown_timeout_ms, "SHUTDOWN_TIMEOUT_MS", "10000")?,
            store,
        })
    }

    /// Both rules, general first.
    pub fn rules(&self) -> [Rule; 2] {
        [self.general, self.auth]
    }
}

/// The effective configuration, as `--check-config` prints it and startup logs it.
impl fmt::Display for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let backend = format!(
            "{}://{}{}",
            self.backend.scheme, self.backend.authority, self.backend.base_path
        );
        writeln!(f, "listen:           {}", self.listen)?;
        writeln!(
            f,
            "backend:          {backend} (timeout {} ms)",
            self.backend_timeout.as_millis()
        )?;
        writeln!(f, "general rule:     {}", describe(&self.general))?;
        writeln!(f, "auth rule:        {}", describe(&self.auth))?;
        writeln!(f, "auth paths:       {}", self.auth_paths)?;
        let proxies: Vec<String> = self.trusted_proxies.iter().map(ToString::to_string).collect();
        writeln!(
            f,
            "trusted proxies:  {}",
            if proxies.is_empty() {
                "none".into()
            } else {
                proxies.join(",")
            }
        )?;
        match &self.store {
            StoreConfig::Memory => write!(
                f,
                "store:            memory (at most {} client states)",
                self.max_keys
            ),
            StoreConfig::Redis(redis) => write!(
                f,
                "store:            redis {} (prefix {:?}, timeout {} ms, fail {}, breaker after {} failures, probe every {} ms)",
                redis.target.redacted(),
                redis.key_prefix,
                redis.timeout.as_millis(),
                redis.guard.fail_mode.as_str(),
                redis.guard.failure_threshold,
                redis.guard.probe_interval.as_millis(),
            ),
        }
    }
}

/// One rule in words, e.g. `token_bucket: 10 tokens, refill 1/s`.
pub fn describe(rule: &Rule) -> String {
    match rule.policy {
        Policy::TokenBucket(tb) => format!(
            "token_bucket: {} tokens, refill {}/s (one token every {} ms)",
            tb.capacity,
            1e6 / tb.interval_us as f64,
            tb.interval_us as f64 / 1e3
        ),
        Policy::SlidingWindow(sw) => format!(
            "sliding_window: {} requests per {} s",
            sw.limit,
            sw.window_ms as f64 / 1e3
        ),
    }
}

fn invalid(var: &'static str, value: &str, expected: &str) -> ConfigError {
    ConfigError::Invalid {
        var,
        value: value.to_owned(),
        expected: expected.to_owned(),
    }
}

/// Parse `value` (or `default` when unset) with `f`; `None` from `f` is an error naming `var`.
fn parse<T>(
    value: &Option<String>,
    var: &'static str,
    default: &str,
    expected: &str,
    f: impl FnOnce(&str) -> Option<T>,
) -> Result<T, ConfigError> {
    let value = value.as_deref().map(str::trim).unwrap_or(default);
    f(value).ok_or_else(|| invalid(var, value, expected))
}

/// Comma-separated entries, trimmed, empty ones skipped.
fn list(value: &str) -> impl Iterator<Item = &str> {
    value.split(',').map(str::trim).filter(|entry| !entry.is_empty())
}

fn millis(value: &Option<String>, var: &'static str, default: &str) -> Result<Duration, ConfigError> {
    parse(
        value,
        var,
        default,
        "a whole number of milliseconds, at least 1",
        |s| {
            s.parse::<u64>()
                .ok()
                .filter(|ms| *ms > 0)
                .map(Duration::from_millis)
        },
    )
}

fn count(value: &Option<String>, var: &'static str, default: &str) -> Result<u64, ConfigError> {
    parse(value, var, default, "a whole number of at least 1", |s| {
        s.parse::<u64>().ok().filter(|n| *n > 0)
    })
}

fn token_bucket(
    name: RuleName,
    capacity: &Option<String>,
    capacity_var: &'static str,
    capacity_default: &str,
    rate: &Option<String>,
    rate_var: &'static str,
    rate_default: &str,
) -> Result<Rule, ConfigError> {
    let capacity = count(capacity, capacity_var, capacity_default)?;
    let expected = "tokens per second: a number above 0 and at most 1000000, fractions allowed (0.01 is one token every 100 s)";
    let per_second = parse(rate, rate_var, rate_default, expected, |s| {
        s.parse::<f64>()
            .ok()
            .filter(|n| n.is_finite() && *n > 0.0 && *n <= 1e6)
    })?;
    // At most 1e6 per second, so at least one microsecond per token.
    let interval_us = (1e6 / per_second).round() as u64;
    if interval_us >= EXACT_LIMIT || capacity.saturating_mul(interval_us) >= EXACT_LIMIT {
        return Err(ConfigError::Conflict(format!(
            "{capacity_var}={capacity} with {rate_var}={per_second} takes longer than 35 years to refill; \
             raise {rate_var} or lower {capacity_var}"
        )));
    }
    Ok(Rule {
        name,
        policy: Policy::TokenBucket(TokenBucket {
            capacity,
            interval_us,
        }),
    })
}

fn sliding_window(
    name: RuleName,
    limit: &Option<String>,
    limit_var: &'static str,
    limit_default: &str,
    window: &Option<String>,
    window_var: &'static str,
    window_default: &str,
) -> Result<Rule, ConfigError> {
    let limit = count(limit, limit_var, limit_default)?;
    let expected = "a window length in seconds: a number of at least 0.001";
    let seconds = parse(window, window_var, window_default, expected, |s| {
        s.parse::<f64>().ok().filter(|n| n.is_finite() && *n >= 0.001)
    })?;
    let window_ms = (seconds * 1e3).round() as u64;
    // 10^12 request-seconds: the Lua arithmetic (about twice this, in request-ms) stays exact.
    if limit.saturating_mul(window_ms) >= 1_000_000_000_000_000 {
        return Err(ConfigError::Conflict(format!(
            "{limit_var}={limit} with {window_var}={seconds} is too large: \
             {limit_var} x {window_var} must stay below 10^12 request-seconds"
        )));
    }
    Ok(Rule {
        name,
        policy: Policy::SlidingWindow(SlidingWindow { limit, window_ms }),
    })
}

fn parse_backend(value: Option<&str>) -> Result<Backend, ConfigError> {
    let expected = "an http URL such as http://127.0.0.1:8000";
    let value = value.map(str::trim).ok_or(ConfigError::Missing {
        var: "BACKEND_URL",
        expected: "where allowed requests go, e.g. http://127.0.0.1:8000",
    })?;
    let uri: Uri = value
        .parse()
        .map_err(|_| invalid("BACKEND_URL", value, expected))?;
    match uri.scheme() {
        Some(scheme) if *scheme == Scheme::HTTP => {}
        Some(scheme) if *scheme == Scheme::HTTPS => {
            return Err(invalid(
                "BACKEND_URL",
                value,
                "http:// (TLS to the backend is not supported; terminate it in front of the backend)",
            ));
        }
        _ => return Err(invalid("BACKEND_URL", value, expected)),
    }
    let authority = uri
        .authority()
        .cloned()
        .ok_or_else(|| invalid("BACKEND_URL", value, expected))?;
    if authority.as_str().contains('@') {
        return Err(invalid("BACKEND_URL", value, "a URL without user:password@"));
    }
    if uri.query().is_some() {
        return Err(invalid("BACKEND_URL", value, "a URL without a query string"));
    }
    Ok(Backend {
        scheme: Scheme::HTTP,
        authority,
        base_path: uri.path().trim_end_matches('/').to_owned(),
    })
}

fn parse_store(raw: &RawConfig) -> Result<StoreConfig, ConfigError> {
    let target = match (&raw.redis_url, &raw.redis_addr, &raw.redis_cluster_nodes) {
        (None, None, None) => return Ok(StoreConfig::Memory),
        (Some(_), None, None) if raw.redis_tls.is_some() => {
            return Err(ConfigError::Conflict(
                "REDIS_TLS goes with REDIS_ADDR or REDIS_CLUSTER_NODES; \
                 with REDIS_URL, choose redis:// or rediss:// (TLS) in the URL"
                    .into(),
            ));
        }
        (Some(_), None, None) if raw.redis_password.is_some() => {
            return Err(ConfigError::Conflict(
                "REDIS_PASSWORD goes with REDIS_ADDR or REDIS_CLUSTER_NODES; \
                 with REDIS_URL, put the password in the URL (redis://:password@host:port)"
                    .into(),
            ));
        }
        (Some(url), None, None) => {
            let url = url.trim();
            let expected = "redis://[:password@]host:port/db or rediss://... for TLS";
            if !(url.starts_with("redis://") || url.starts_with("rediss://")) {
                return Err(ConfigError::InvalidSecret {
                    var: "REDIS_URL",
                    expected: expected.into(),
                });
            }
            if redis::Client::open(url).is_err() {
                return Err(ConfigError::InvalidSecret {
                    var: "REDIS_URL",
                    expected: format!("{expected} (got {})", redact_url(url)),
                });
            }
            RedisTarget::Single(url.to_owned())
        }
        (None, Some(addr), None) => {
            let addr = host_port("REDIS_ADDR", addr.trim())?;
            let scheme = if redis_tls(raw)? { "rediss" } else { "redis" };
            let url = match &raw.redis_password {
                Some(password) => format!(
                    "{scheme}://:{}@{addr}",
                    percent_encoding::utf8_percent_encode(password, percent_encoding::NON_ALPHANUMERIC)
                ),
                None => format!("{scheme}://{addr}"),
            };
            RedisTarget::Single(url)
        }
        (None, None, Some(nodes)) => {
            let nodes: Vec<String> = list(nodes)
                .map(|node| host_port("REDIS_CLUSTER_NODES", node))
                .collect::<Result<_, _>>()?;
            if nodes.is_empty() {
                return Err(invalid(
                    "REDIS_CLUSTER_NODES",
                    "",
                    "comma-separated host:port seeds",
                ));
            }
            RedisTarget::Cluster {
                nodes,
                password: raw.redis_password.clone(),
                tls: redis_tls(raw)?,
            }
        }
        _ => {
            return Err(ConfigError::Conflict(
                "set only one of REDIS_URL, REDIS_ADDR and REDIS_CLUSTER_NODES".into(),
            ));
        }
    };
    let key_prefix = raw.key_prefix.as_deref().unwrap_or("tollgate:").to_owned();
    if key_prefix.contains(['{', '}']) {
        return Err(invalid(
            "KEY_PREFIX",
            &key_prefix,
            "a prefix without '{' or '}' (they would break Redis Cluster hash tags)",
        ));
    }
    let fail_mode = parse(
        &raw.fail_mode,
        "FAIL_MODE",
        "open",
        "open, closed or local",
        |s| match s {
            "open" => Some(FailMode::Open),
            "closed" => Some(FailMode::Closed),
            "local" => Some(FailMode::Local),
            _ => None,
        },
    )?;
    let failure_threshold = parse(
        &raw.redis_breaker_threshold,
        "REDIS_BREAKER_THRESHOLD",
        "3",
        "a whole number of at least 1",
        |s| s.parse::<u32>().ok().filter(|n| *n > 0),
    )?;
    Ok(StoreConfig::Redis(RedisConfig {
        target,
        key_prefix,
        timeout: millis(&raw.redis_timeout_ms, "REDIS_TIMEOUT_MS", "50")?,
        guard: GuardSettings {
            fail_mode,
            failure_threshold,
            probe_interval: millis(&raw.redis_probe_interval_ms, "REDIS_PROBE_INTERVAL_MS", "500")?,
        },
    }))
}

/// `REDIS_TLS`, for `REDIS_ADDR` and `REDIS_CLUSTER_NODES`.
fn redis_tls(raw: &RawConfig) -> Result<bool, ConfigError> {
    parse(
        &raw.redis_tls,
        "REDIS_TLS",
        "false",
        "true or false",
        |s| match s {
            "true" => Some(true),
            "false" => Some(false),
            _ => None,
        },
    )
}

fn host_port(var: &'static str, value: &str) -> Result<String, ConfigError> {
    let valid = value.rsplit_once(':').is_some_and(|(host, port)| {
        !host.is_empty() && !host.contains(['/', '@']) && port.parse::<u16>().is_ok_and(|p| p > 0)
    });
    if valid {
        Ok(value.to_owned())
    } else {
        Err(invalid(var, value, "host:port, e.g. 127.0.0.1:6379"))
    }
}

#[cfg(test)]
mod tests;
