//! Configuration: environment variables in, a validated [`Config`] out.
//!
//! Parsing is a pure function over a map of strings ([`Config::from_vars`]), so every rule is
//! unit-tested without touching the process environment, in the manner of linkerd2-proxy's
//! `env.rs`. It is split by concern:
//!
//! - [`mod@env`]: the reader of named variables, which records every name it reads;
//! - [`rules`]: the rule table (`ALGORITHM`, `ROUTES`, `AUTH_PATHS`, `KEY_BY`, `COSTS`, ...);
//! - [`store`]: memory or Redis, and what to do when Redis fails;
//! - [`listener`]: HTTPS and the PROXY protocol on `PORT`;
//! - [`warnings`]: variables that are set but change nothing (misspelt, or not read by the
//!   chosen algorithm or store), reported without stopping startup;
//! - this module: the listener, the backend, timeouts, connection limits and logging, and the
//!   whole [`Config`]: one field per component, of that component's own settings type.
//!
//! Setting types belong to the components that use them ([`ServerSettings`] to the server,
//! [`ProxySettings`] to the proxy, [`GateSettings`] to the gate, [`StoreSettings`] to the
//! limiter, [`AdminSettings`] to the admin listener, [`LogSettings`] to telemetry):
//! configuration depends on the components, never the reverse, and no component sees the
//! whole `Config` (the wiring in [`crate::app`] hands each its part). Every error names the variable, shows the bad value (except for secrets) and
//! says what is accepted.

pub(crate) mod env;
pub(crate) mod listener;
pub(crate) mod overrides;
pub(crate) mod rules;
pub(crate) mod rules_file;
pub(crate) mod spec;
pub(crate) mod store;
pub(crate) mod warnings;

use crate::variables as vars;
use crate::variables::Var;
#[cfg(test)]
use std::collections::BTreeSet;
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::num::NonZeroUsize;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use http::uri::{Authority, Scheme, Uri};
use ipnet::IpNet;

use crate::admin::AdminSettings;
use crate::decide::{DecideSettings, Token};
use crate::gate::GateSettings;
use crate::gate::delay::DelayBounds;
use crate::limit::RuleTable;
use crate::limit_headers::HeaderStyle;
use crate::proxy::body::MinRate;
use crate::proxy::cors::Cors;
use crate::proxy::headers::{MethodOverride, UnderscoreHeaders};
use crate::proxy::tls::{self, BackendTls};
use crate::proxy::upgrades::UpgradeProtocols;
use crate::proxy::{AccessLog, Backend, ProxySettings};
use crate::refusal::{self, DenyFormat, Refusals};
use crate::rls::DescriptorTable;
use crate::server::ServerSettings;
use crate::server::limits::PerClientCap;
use crate::telemetry::{LogFormat, LogSettings};
use env::{Env, entries};
use rules_file::RulesFile;

/// The most `MAX_KEYS` may be: a billion clients, about 87 GB held in full. The store's index
/// (about 7 bytes per key) is allocated and written at startup, so a mistyped value is refused
/// here rather than failing the allocation.
pub const MAX_MAX_KEYS: usize = 1_000_000_000;

/// The shortest `DECIDE_TOKEN`: 16 random characters are beyond guessing; fewer are a
/// placeholder left in.
pub const MIN_TOKEN_LENGTH: usize = 16;

pub use crate::limit::settings::{RedisConfig, StoreConfig, StoreSettings};
/// Every variable's name (see [`crate::variables`], where each is spelt, with its default).
pub use crate::variables::NAMES as VARIABLES;

/// `BODY_MIN_RATE_WINDOW_MS` unless `BODY_IDLE_TIMEOUT_MS` is longer: Apache's
/// `mod_reqtimeout` gives a body 20 s before `MinRate` applies; this is the default
/// `BODY_IDLE_TIMEOUT_MS`, so a body may pause as long as that allows and still pass.
pub const DEFAULT_BODY_MIN_RATE_WINDOW: Duration = Duration::from_secs(30);

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
    /// One entry of a list variable (`ROUTES`, `COSTS`, ...) is wrong.
    #[error("{var} entry {entry:?} is invalid: {problem}")]
    Entry {
        /// The variable.
        var: &'static str,
        /// The entry as written.
        entry: String,
        /// What is wrong with it, and what is accepted.
        problem: String,
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
    /// A file a variable names is wrong: where in it, and what.
    #[error("{var}: {location}: {problem}")]
    File {
        /// The variable.
        var: &'static str,
        /// The file, and the line and entry where known (`rls.yaml:12: descriptors[0].key`).
        location: String,
        /// What is wrong with it, and what is accepted.
        problem: String,
    },
}

impl ConfigError {
    /// `var=value` is not what is `expected`.
    pub fn invalid(var: &'static str, value: &str, expected: &str) -> ConfigError {
        ConfigError::Invalid {
            var,
            value: value.to_owned(),
            expected: expected.to_owned(),
        }
    }

    /// One `entry` of `var` is wrong.
    pub fn entry(var: &'static str, entry: &str, problem: impl Into<String>) -> ConfigError {
        ConfigError::Entry {
            var,
            entry: entry.to_owned(),
            problem: problem.into(),
        }
    }
}

/// `RULES_FILE` and `OVERRIDES_FILE`: the files the rule table is reloaded from.
#[derive(Clone)]
pub(crate) struct ReloadSettings {
    /// `RULES_FILE`, if set.
    pub(crate) rules_file: Option<String>,
    /// `OVERRIDES_FILE`, if set.
    pub(crate) overrides_file: Option<String>,
    /// `RLS_CONFIG`, if set: Envoy's descriptors reload with the rules.
    pub(crate) rls_config: Option<String>,
    /// `RULES_RELOAD_INTERVAL_MS`: how often they are read for changes; `None`: on SIGHUP only.
    pub(crate) interval: Option<Duration>,
    /// The environment the configuration was read from (the rules file's settings not
    /// added): a reload reads the files again beside it.
    pub(crate) environment: Arc<Vec<(String, String)>>,
    /// The files' bytes this configuration was built from: the watcher reloads when they
    /// change.
    pub(crate) loaded: Loaded,
    /// What `.env` set when this configuration was read ([`read_dot_env`]).
    pub(crate) dot_env: Arc<Vec<(String, String)>>,
}

/// What a reload read: the rule table to put in force, what it was built from, and Envoy's
/// descriptors (their rules in the table).
pub(crate) struct Reloaded {
    /// The rule table, `RLS_CONFIG`'s rules included.
    pub(crate) rules: crate::limit::RuleTable,
    /// The files' bytes.
    pub(crate) loaded: Loaded,
    /// `RLS_CONFIG`'s descriptors, when it is set.
    pub(crate) rls: Option<Arc<DescriptorTable>>,
}

/// The bytes of the files a rule table was built from (empty for a file not set).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Loaded {
    /// `RULES_FILE`'s.
    pub(crate) rules: Arc<Vec<u8>>,
    /// `OVERRIDES_FILE`'s.
    pub(crate) overrides: Arc<Vec<u8>>,
    /// `RLS_CONFIG`'s files, each with its name ([`DescriptorTable::snapshot`]).
    pub(crate) rls: Arc<Vec<u8>>,
}

impl ReloadSettings {
    /// The files, as logs name them: `rules.toml,overrides.txt`.
    pub(crate) fn files(&self) -> String {
        let files: Vec<&str> = [&self.rules_file, &self.overrides_file, &self.rls_config]
            .into_iter()
            .flatten()
            .map(String::as_str)
            .collect();
        files.join(",")
    }

    /// Read the files as they are now (bounded as at start); `None` when one cannot be read.
    pub(crate) fn read(&self) -> Option<Loaded> {
        let read = |path: &Option<String>| match path {
            Some(path) => rules_file::read_bounded(path).ok().map(Arc::new),
            None => Some(Arc::default()),
        };
        let rls = match &self.rls_config {
            Some(path) => Arc::new(DescriptorTable::snapshot(Path::new(path))?),
            None => Arc::default(),
        };
        Some(Loaded {
            rules: read(&self.rules_file)?,
            overrides: read(&self.overrides_file)?,
            rls,
        })
    }
}
/// The tollgate variables `.env` in the working directory sets now (none when it is missing or
/// unreadable), for the warning about changes a reload does not apply.
pub(crate) fn read_dot_env() -> Vec<(String, String)> {
    let Ok(entries) = dotenvy::from_path_iter(".env") else {
        return Vec::new();
    };
    entries
        .filter_map(Result::ok)
        .filter(|(name, _)| VARIABLES.contains(&name.as_str()))
        .collect()
}

impl fmt::Debug for ReloadSettings {
    // The environment holds secrets: never printed.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReloadSettings")
            .field("rules_file", &self.rules_file)
            .field("overrides_file", &self.overrides_file)
            .field("interval", &self.interval)
            .finish_non_exhaustive()
    }
}

/// The validated configuration: the settings of each component, each its own type.
#[derive(Debug, Clone)]
pub struct Config {
    /// The listener: address, TLS and PROXY protocol, connection limits and clocks.
    pub(crate) server: ServerSettings,
    /// The reverse proxy: the backend, timeouts, bodies, headers, upgrades, refusals' shape;
    /// `None` without `BACKEND_URL`, when tollgate is a decision service only (`DECIDE_PORT`).
    pub(crate) proxy: Option<ProxySettings>,
    /// The decision endpoints (`DECIDE_PORT`); `None` when unset.
    pub(crate) decide: Option<DecideSettings>,
    /// Classification and decision: the rule table, trusted proxies, tunnels per client.
    pub(crate) gate: GateSettings,
    /// Where budgets live (memory or Redis), and how many clients memory holds.
    pub(crate) store: StoreSettings,
    /// The admin listener.
    pub(crate) admin: AdminSettings,
    /// `RLS_CONFIG`: Envoy's rate limit service's descriptors, whose limits are named rules of
    /// `gate.rules`; `None` when unset.
    pub(crate) rls: Option<Arc<DescriptorTable>>,
    /// `RULES_FILE` and `OVERRIDES_FILE`, and how often they are read for changes; `None`
    /// when neither is set.
    pub(crate) reload: Option<ReloadSettings>,
    /// The log.
    pub(crate) log: LogSettings,
    /// Every variable name the parsers read (set or not), for warnings about the rest.
    #[cfg(test)]
    pub(crate) read: BTreeSet<&'static str>,
    /// Variables that are set but change nothing (see [`warnings`]), one line each, naming
    /// variables but never showing values: `--check-config` prints them, startup logs them.
    pub(crate) warnings: Vec<String>,
}
impl Config {
    /// Variables that are set but change nothing (misspelt, or not read by the chosen
    /// algorithm or store), one line each, naming variables but never showing values.
    pub fn warnings(&self) -> &[String] {
        &self.warnings
    }

    /// Whether the rule table reloads from `RULES_FILE` or `OVERRIDES_FILE` (on SIGHUP and
    /// when a file changes).
    pub fn reloads_rules(&self) -> bool {
        self.reload.is_some()
    }

    /// `SHUTDOWN_TIMEOUT_MS`: how long a drain waits for requests in flight.
    pub fn shutdown_timeout(&self) -> Duration {
        self.server.shutdown_timeout
    }

    /// `STATE_FILE` and `STATE_SAVE_INTERVAL_S`; `None` when unset.
    pub fn state_file(&self) -> Option<&crate::limit::state_file::StateFileSettings> {
        self.store.state_file.as_ref()
    }

    /// The compiled rule table: what classifies a request head into rule, key, cost and mode.
    pub fn rule_table(&self) -> &crate::limit::RuleTable {
        &self.gate.rules
    }

    /// Read the process environment (after the caller has loaded `.env`, if any).
    pub fn from_env() -> Result<Self, ConfigError> {
        let mut vars = Vec::new();
        // `std::env::vars` panics on a value that is not UTF-8; a variable that is not ours may
        // hold anything, and one of ours that is not UTF-8 is an error naming it.
        for (name, value) in std::env::vars_os() {
            let Ok(name) = name.into_string() else {
                continue;
            };
            match value.into_string() {
                Ok(value) => vars.push((name, value)),
                Err(_) => {
                    if let Some(var) = VARIABLES.iter().find(|known| **known == name) {
                        return Err(ConfigError::InvalidSecret {
                            var,
                            expected: "valid UTF-8 text".into(),
                        });
                    }
                }
            }
        }
        Self::from_vars(vars)
    }

    /// Parse from any set of `NAME=value` pairs; names are the upper-case variable names.
    pub fn from_vars<I, K, V>(vars: I) -> Result<Self, ConfigError>
    where
        I: IntoIterator<Item = (K, V)>,
        K: Into<String>,
        V: Into<String>,
    {
        Self::from_vars_inheriting(vars, None)
    }

    /// [`Config::from_vars`], digesting keys with `hasher` (a reload's: the running table's)
    /// when `KEY_HASH_SECRET` is unset.
    fn from_vars_inheriting<I, K, V>(
        vars: I,
        hasher: Option<crate::limit::KeyHasher>,
    ) -> Result<Self, ConfigError>
    where
        I: IntoIterator<Item = (K, V)>,
        K: Into<String>,
        V: Into<String>,
    {
        let environment: Vec<(String, String)> = vars
            .into_iter()
            .map(|(name, value)| (name.into(), value.into()))
            .collect();
        let path = environment
            .iter()
            .rev()
            .find(|(name, value)| name == vars::RULES_FILE.name && !value.trim().is_empty())
            .map(|(_, value)| value.trim().to_owned());
        let file = RulesFile::load(path.as_deref())?;
        let mut config = match &file {
            None => Self::from_env_reader(&Env::new(environment.clone()).inheriting(hasher))?,
            Some(file) => {
                let merged = file.merge(&environment)?;
                let env = Env::new(merged).inheriting(hasher).with_routes(file.routes());
                Self::from_env_reader(&env).map_err(|error| file.locate(error))?
            }
        };
        if let Some(settings) = &mut config.reload {
            settings.environment = Arc::new(environment);
            if let Some(file) = file {
                settings.loaded.rules = Arc::new(file.bytes);
            }
            settings.dot_env = Arc::new(read_dot_env());
        }
        Ok(config)
    }

    /// The rule table again, with `RULES_FILE`, `OVERRIDES_FILE` and `RLS_CONFIG` read anew
    /// beside the environment read at start: what a reload puts in force (the rules, and
    /// Envoy's descriptors whose rules the table holds), and the files' bytes it was built
    /// from. The whole configuration is validated as at start, so a table the process could
    /// not have started with is refused too; keys are digested as the running table digests
    /// them.
    pub(crate) fn reload_rules(&self) -> Result<Reloaded, ConfigError> {
        let Some(settings) = &self.reload else {
            return Err(ConfigError::Missing {
                var: vars::RULES_FILE.name,
                expected: "a rules file (or OVERRIDES_FILE, or RLS_CONFIG) to reload the rule table from",
            });
        };
        let environment = settings.environment.iter().cloned();
        let config = Config::from_vars_inheriting(environment, Some(self.gate.rules.hasher().clone()))?;
        let bytes = config
            .reload
            .as_ref()
            .map_or_else(Loaded::default, |settings| settings.loaded.clone());
        Ok(Reloaded {
            rules: config.gate.rules,
            loaded: bytes,
            rls: config.rls,
        })
    }

    /// Parse, then check the variables this configuration does not read: a malformed one is
    /// an error even so, as it would be once it is read (a well-formed one is only warned
    /// about, see [`warnings`]).
    fn from_env_reader(env: &Env) -> Result<Self, ConfigError> {
        let config = Self::parse_env(env)?;
        warnings::check_unused(env, |vars| Self::parse_env(&Env::new(vars)).map(drop))?;
        Ok(config)
    }

    fn parse_env(env: &Env) -> Result<Self, ConfigError> {
        let decide_port = env
            .get(vars::DECIDE_PORT)
            .map(|value| {
                value.parse::<u16>().ok().filter(|p| *p != 0).ok_or_else(|| {
                    ConfigError::invalid(vars::DECIDE_PORT.name, value, "a port number from 1 to 65535")
                })
            })
            .transpose()?;
        // A decision service alone needs no backend.
        let backend = match (env.get(vars::BACKEND_URL), decide_port) {
            (None, Some(_)) => None,
            _ => Some(parse_backend(env)?),
        };
        let port: u16 = env.parse(vars::PORT, "a port number from 1 to 65535", |s| {
            s.parse().ok().filter(|p| *p != 0)
        })?;
        let bind: IpAddr = env.parse(vars::BIND, "an IP address such as 0.0.0.0 or ::", |s| {
            s.parse().ok()
        })?;
        // Loopback unless asked: metrics and probes are for this host's (or pod's) eyes, and an
        // admin port left open to clients lets them hold its few connections.
        let admin_bind: IpAddr =
            env.parse(vars::ADMIN_BIND, "an IP address such as 127.0.0.1 or ::", |s| {
                s.parse().ok()
            })?;
        let admin_port: u16 = env.parse(vars::ADMIN_PORT, "a port number from 1 to 65535", |s| {
            s.parse().ok().filter(|p| *p != 0)
        })?;
        let admin = SocketAddr::new(admin_bind, admin_port);
        // One port on two addresses collides when either is unspecified (0.0.0.0 holds the
        // port on 127.0.0.1 too).
        let overlapping = admin_bind == bind || admin_bind.is_unspecified() || bind.is_unspecified();
        if admin_port == port && overlapping {
            return Err(ConfigError::Conflict(format!(
                "ADMIN_PORT={admin_port} is PORT too: the admin listener needs a port of its own"
            )));
        }
        if let Some(decide_port) = decide_port {
            if decide_port == port && backend.is_some() {
                return Err(ConfigError::Conflict(format!(
                    "DECIDE_PORT={decide_port} is PORT too: the decision endpoints need a port of their own"
                )));
            }
            if decide_port == admin_port && overlapping {
                return Err(ConfigError::Conflict(format!(
                    "DECIDE_PORT={decide_port} is ADMIN_PORT too: the decision endpoints need a port of their own"
                )));
            }
        }
        let access_log = env.parse(vars::ACCESS_LOG, "off, denied or all", AccessLog::parse)?;
        let store = store::parse(env)?;
        let mut rule_warnings = Vec::new();
        let rules = rules::parse(env, matches!(store, StoreConfig::Redis(_)), &mut rule_warnings)?;
        let overrides_file = overrides::read(env)?;
        let rules = overrides::apply(env, rules, overrides_file.as_ref(), &mut rule_warnings)?;
        let (rules, rls) = parse_rls(env, rules, matches!(store, StoreConfig::Redis(_)))?;
        // `/v1/check`'s named keys (`{"rule","key"}`) are digested too: replicas sharing Redis
        // must digest them alike, or each holds a budget of its own for one client.
        if decide_port.is_some()
            && matches!(store, StoreConfig::Redis(_))
            && !env.is_set(vars::KEY_HASH_SECRET)
        {
            return Err(ConfigError::Missing {
                var: vars::KEY_HASH_SECRET.name,
                expected: "with Redis and DECIDE_PORT, every replica must digest /v1/check's named keys \
                           ({\"rule\",\"key\"}) alike: set the same secret of 16+ characters on each, e.g. \
                           from `openssl rand -hex 32`",
            });
        }
        let trusted_proxies = entries(env.value(vars::TRUSTED_PROXIES), &[','])
            .map(|entry| {
                let network = parse_network(entry).ok_or_else(|| {
                    ConfigError::invalid(
                        vars::TRUSTED_PROXIES.name,
                        entry,
                        "comma-separated CIDRs or addresses, e.g. 10.0.0.0/8,192.168.1.7",
                    )
                })?;
                // Trusting every peer believes every X-Forwarded-For: each client would name
                // its own address, and so its own budget.
                if network.prefix_len() == 0 {
                    return Err(ConfigError::entry(
                        vars::TRUSTED_PROXIES.name,
                        entry,
                        "it trusts every address, so any client could choose its own address (and a \
                         fresh budget) with X-Forwarded-For; list only the proxies in front of tollgate",
                    ));
                }
                Ok(network)
            })
            .collect::<Result<Vec<_>, _>>()?;
        let listener = listener::parse(env, &trusted_proxies)?;
        let rules_reload = env.parse(
            vars::RULES_RELOAD_INTERVAL_MS,
            "a whole number of milliseconds, 0 (on SIGHUP only) to 31536000000 (a year)",
            |s| {
                s.parse::<u64>()
                    .ok()
                    .filter(|ms| *ms <= env::MAX_MILLIS)
                    .map(Duration::from_millis)
            },
        )?;
        let rls_config = env.get(vars::RLS_CONFIG).map(str::to_owned);
        let reloads = env.is_set(vars::RULES_FILE) || overrides_file.is_some() || rls_config.is_some();
        let reload = reloads.then(|| ReloadSettings {
            rules_file: env.get(vars::RULES_FILE).map(str::to_owned),
            overrides_file: overrides_file.as_ref().map(|file| file.path.clone()),
            rls_config: rls_config.clone(),
            interval: (!rules_reload.is_zero()).then_some(rules_reload),
            environment: Arc::default(),
            loaded: Loaded {
                rules: Arc::default(),
                overrides: overrides_file
                    .as_ref()
                    .map(|file| file.bytes.clone())
                    .unwrap_or_default(),
                // Read after the table was (a change between the two is one more reload).
                rls: rls_config
                    .as_deref()
                    .and_then(|path| DescriptorTable::snapshot(Path::new(path)))
                    .map(Arc::new)
                    .unwrap_or_default(),
            },
            dot_env: Arc::default(),
        });
        let max_keys = env.parse(vars::MAX_KEYS, "a whole number from 1 to 1000000000", |s| {
            s.parse::<usize>()
                .ok()
                .filter(|&keys| keys <= MAX_MAX_KEYS)
                .and_then(NonZeroUsize::new)
        })?;
        let state_file = store::state_file(env, &store)?;
        // Every rule has room for MAX_KEYS clients, and its index is written at startup.
        let rule_count = rules.rules().len();
        if max_keys.get().saturating_mul(rule_count) > MAX_MAX_KEYS {
            return Err(ConfigError::invalid(
                vars::MAX_KEYS.name,
                &max_keys.to_string(),
                &format!(
                    "a whole number of client states per rule, at most {} for the {rule_count} \
                     rules configured ({MAX_MAX_KEYS} in all)",
                    MAX_MAX_KEYS / rule_count
                ),
            ));
        }
        let headers = env.parse(
            vars::RATE_LIMIT_HEADERS,
            "legacy, draft, both or none",
            HeaderStyle::parse,
        )?;
        let refusals = {
            let value = env.value(vars::DENY_STATUS);
            let status = refusal::parse_status(value)
                .map_err(|expected| ConfigError::invalid(vars::DENY_STATUS.name, value, &expected))?;
            let format = env.parse(vars::DENY_FORMAT, "json, problem or text", DenyFormat::parse)?;
            // RATE_LIMIT_HEADERS=none reveals nothing about the limits, the rule's name included.
            Refusals::new(status, format, headers != HeaderStyle::None)
        };
        let forward_headers = env.flag(vars::FORWARD_RATELIMIT_HEADERS)?;
        let response_cost_header = env
            .get(vars::RESPONSE_COST_HEADER)
            .map(|name| {
                http::HeaderName::from_bytes(name.as_bytes()).map_err(|_| {
                    ConfigError::invalid(
                        vars::RESPONSE_COST_HEADER.name,
                        name,
                        "a header name, such as X-Tokens-Used",
                    )
                })
            })
            .transpose()?;
        let log_format = env.parse(vars::LOG_FORMAT, "text or json", |s| match s {
            "text" => Some(LogFormat::Text),
            "json" => Some(LogFormat::Json),
            _ => None,
        })?;
        let backend_timeout = env.millis(vars::BACKEND_TIMEOUT_MS)?;
        let backend_idle_timeout = env.millis(vars::BACKEND_IDLE_TIMEOUT_MS)?;
        let body_idle_timeout = env.millis(vars::BODY_IDLE_TIMEOUT_MS)?;
        let body_min_rate = env.parse(
            vars::BODY_MIN_RATE,
            "a whole number of bytes per second, 0 for no minimum",
            |s| s.parse::<u64>().ok(),
        )?;
        // Read only with a rate to check: set with `BODY_MIN_RATE=0`, it is warned about.
        let body_min_rate = match body_min_rate {
            0 => None,
            rate => {
                // A window shorter than the pause BODY_IDLE_TIMEOUT_MS allows would cut that
                // pause (a window of waiting with nothing in it): the default never is.
                let window = body_idle_timeout.max(DEFAULT_BODY_MIN_RATE_WINDOW);
                let window = env.millis_or(vars::BODY_MIN_RATE_WINDOW_MS, &window.as_millis().to_string())?;
                Some(MinRate::new(rate, window))
            }
        };
        let header_read_timeout = env.millis(vars::HEADER_READ_TIMEOUT_MS)?;
        let shutdown_timeout = env.millis(vars::SHUTDOWN_TIMEOUT_MS)?;
        let idle_timeout = env.millis(vars::IDLE_TIMEOUT_MS)?;
        let send_timeout = env.millis(vars::SEND_TIMEOUT_MS)?;
        let max_connections = env
            .get(vars::MAX_CONNECTIONS)
            .map(|value| {
                value
                    .parse::<usize>()
                    .ok()
                    .and_then(NonZeroUsize::new)
                    .ok_or_else(|| {
                        ConfigError::invalid(
                            vars::MAX_CONNECTIONS.name,
                            value,
                            "a whole number of at least 1 (unset: sized from the file-descriptor limit)",
                        )
                    })
            })
            .transpose()?;
        let max_connections_per_client =
            env.get(vars::MAX_CONNECTIONS_PER_CLIENT)
                .map(|value| {
                    PerClientCap::parse(value).ok_or_else(|| {
                    ConfigError::invalid(vars::MAX_CONNECTIONS_PER_CLIENT.name,
                        value,
                        "a whole number, 0 for no cap per client (unset: three quarters of MAX_CONNECTIONS)",
                    )
                })
                })
                .transpose()?
                .unwrap_or_default();
        let max_requests_per_client = env
            .get(vars::MAX_REQUESTS_IN_FLIGHT_PER_CLIENT)
            .map(|value| {
                PerClientCap::parse(value).ok_or_else(|| {
                    ConfigError::invalid(
                        vars::MAX_REQUESTS_IN_FLIGHT_PER_CLIENT.name,
                        value,
                        "a whole number, 0 for no cap per client (unset: three quarters of MAX_CONNECTIONS)",
                    )
                })
            })
            .transpose()?
            .unwrap_or_default();
        let h2_max_concurrent_streams = env.parse(
            vars::H2_MAX_CONCURRENT_STREAMS,
            "a whole number from 1 to 2147483647",
            |s| s.parse::<u32>().ok().filter(|n| (1..=0x7fff_ffff).contains(n)),
        )?;
        let max_upgrades_per_client = env
            .get(vars::MAX_UPGRADES_PER_CLIENT)
            .map(|value| {
                value.parse::<u32>().map_err(|_| {
                    ConfigError::invalid(
                        vars::MAX_UPGRADES_PER_CLIENT.name,
                        value,
                        "a whole number, 0 refusing every upgrade (unset: unlimited)",
                    )
                })
            })
            .transpose()?;
        let delay_queue = |var: Var| {
            env.parse(var, "a whole number of at least 1", |s| {
                s.parse::<u32>().ok().filter(|n| *n > 0)
            })
        };
        let delay_bounds = DelayBounds {
            overall: delay_queue(vars::DELAY_QUEUE)?,
            per_client: delay_queue(vars::DELAY_QUEUE_PER_CLIENT)?,
        };
        let upgrade_protocols = {
            let value = env.value(vars::UPGRADE_PROTOCOLS);
            UpgradeProtocols::parse(value).map_err(|error| {
                ConfigError::invalid(vars::UPGRADE_PROTOCOLS.name, value, &error.to_string())
            })?
        };
        let underscore_headers = env.parse(
            vars::UNDERSCORE_HEADERS,
            "drop (not forwarded, as nginx does) or forward",
            UnderscoreHeaders::parse,
        )?;
        let method_override = env.parse(
            vars::METHOD_OVERRIDE,
            "meter (forwarded, and counted as the method it names too) or strip (removed)",
            MethodOverride::parse,
        )?;
        let cors = {
            let value = env.value(vars::CORS_ALLOW_ORIGINS);
            Cors::parse(value)
                .map_err(|problem| ConfigError::invalid(vars::CORS_ALLOW_ORIGINS.name, value, &problem))?
        };
        let upgrade_idle_timeout = env.parse(
            vars::UPGRADE_IDLE_TIMEOUT_MS,
            "a whole number of milliseconds up to 31536000000 (a year), 0 for never",
            |s| {
                s.parse::<u64>()
                    .ok()
                    .filter(|ms| *ms <= env::MAX_MILLIS)
                    .map(|ms| (ms > 0).then(|| Duration::from_millis(ms)))
            },
        )?;
        let admin_token = bearer_token(env, vars::ADMIN_TOKEN)?;
        let decide = match decide_port {
            None => None,
            Some(decide_port) => {
                let token = bearer_token(env, vars::DECIDE_TOKEN)?;
                Some(DecideSettings {
                    listen: SocketAddr::new(bind, decide_port),
                    token,
                    headers,
                    refusals: refusals.clone(),
                    forward_headers,
                    body_timeout: body_idle_timeout,
                    access_log,
                })
            }
        };
        // Last, when every variable this configuration reads has been read.
        #[cfg(test)]
        let read = env.read_names();
        let mut warnings = warnings::warnings(env);
        warnings.extend(rule_warnings);
        Ok(Config {
            server: ServerSettings {
                listen: SocketAddr::new(bind, port),
                listener,
                header_read_timeout,
                idle_timeout,
                send_timeout,
                max_connections,
                max_connections_per_client,
                max_requests_per_client,
                h2_max_concurrent_streams,
                shutdown_timeout,
            },
            proxy: backend.map(|backend| ProxySettings {
                backend,
                headers,
                refusals,
                forward_headers,
                response_cost_header,
                access_log,
                backend_timeout,
                backend_idle_timeout,
                body_idle_timeout,
                body_min_rate,
                upgrade_idle_timeout,
                upgrade_protocols,
                underscore_headers,
                method_override,
                cors,
            }),
            decide,
            gate: GateSettings {
                rules,
                trusted_proxies,
                max_upgrades_per_client,
                delay_bounds,
            },
            store: StoreSettings {
                kind: store,
                max_keys,
                state_file,
            },
            admin: AdminSettings {
                address: admin,
                token: admin_token,
            },
            rls,
            reload,
            log: LogSettings { format: log_format },
            #[cfg(test)]
            read,
            warnings,
        })
    }
}

/// The effective configuration, as `--check-config` prints it and startup logs it.
impl fmt::Display for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.proxy {
            Some(_) => writeln!(
                f,
                "listen:           {} (admin {})",
                self.server.listen, self.admin.address
            )?,
            None => writeln!(f, "listen:           no proxy (admin {})", self.admin.address)?,
        }
        if let Some(decide) = &self.decide {
            writeln!(
                f,
                "decisions:        {} (/v1/forward-auth, /v1/check{})",
                decide.listen,
                if decide.token.is_some() {
                    " with DECIDE_TOKEN"
                } else {
                    ""
                }
            )?;
        }
        if let Some(proxy) = &self.proxy {
            writeln!(
                f,
                "backend:          {} (timeout {} ms)",
                proxy.backend,
                proxy.backend_timeout.as_millis()
            )?;
            if let Some(tls) = &proxy.backend.tls {
                writeln!(f, "backend TLS:      {tls}")?;
            }
        }
        // The classified ones: a named rule (RLS_CONFIG's) has no paths and is listed by its door.
        let rules = self.gate.rules.classified();
        if let Some(file) = &self.reload {
            writeln!(
                f,
                "rules file:       {} (reloaded on SIGHUP{}; table digest {:08x})",
                file.files(),
                file.interval.map_or_else(String::new, |every| format!(
                    " and when it changes, read every {} ms",
                    every.as_millis()
                )),
                self.gate.rules.digest()
            )?;
        }
        writeln!(f, "general rule:     {}", self.gate.rules.general().limits)?;
        if let Some(auth) = self.gate.rules.rule("auth") {
            writeln!(f, "auth rule:        {}", auth.limits)?;
        }
        writeln!(f, "auth paths:       {}", self.gate.rules.paths_of("auth"))?;
        writeln!(f, "{}", self.gate.rules)?;
        let proxies: Vec<String> = self
            .gate
            .trusted_proxies
            .iter()
            .map(ToString::to_string)
            .collect();
        writeln!(
            f,
            "trusted proxies:  {}",
            if proxies.is_empty() {
                "none".into()
            } else {
                proxies.join(",")
            }
        )?;
        writeln!(
            f,
            "listener:         {}{}",
            self.server.listener.tls.as_ref().map_or_else(
                || "http".to_owned(),
                |tls| format!(
                    "https ({}, {}, checked every {} ms)",
                    tls.cert_file.display(),
                    tls.key_file.display(),
                    tls.reload_interval.as_millis()
                )
            ),
            if self.server.listener.proxy_protocol {
                ", PROXY protocol from trusted proxies only"
            } else {
                ""
            }
        )?;
        if let Some(rls) = &self.rls {
            writeln!(f, "envoy rls:        {rls}")?;
        }
        if self.gate.rules.rules().iter().any(|rule| rule.delay.is_some()) {
            let bounds = self.gate.delay_bounds;
            writeln!(
                f,
                "delay queue:      at most {} requests waiting ({} per client and rule); past it, refused at once",
                bounds.overall, bounds.per_client
            )?;
        }
        let refusals = match (&self.proxy, &self.decide) {
            (Some(proxy), _) => Some((&proxy.refusals, proxy.forward_headers)),
            (None, Some(decide)) => Some((&decide.refusals, decide.forward_headers)),
            (None, None) => None,
        };
        if let Some((refusals, forward_headers)) = refusals {
            writeln!(
                f,
                "refusals:         {} {} (unless Accept prefers another of json, problem, text); \
                 RateLimit fields to the backend: {}",
                refusals.status().as_u16(),
                refusals.format().as_str(),
                if forward_headers { "yes" } else { "no" }
            )?;
        }
        if let Some(proxy) = &self.proxy {
            writeln!(f, "headers:          {}", proxy.headers.as_str())?;
            if let Some(header) = &proxy.response_cost_header {
                writeln!(
                    f,
                    "reported costs:   {header} (the difference from the cost charged, charged or refunded after the response)"
                )?;
            }
            writeln!(
                f,
                "request bodies:   cut after {} ms without data, {}",
                proxy.body_idle_timeout.as_millis(),
                proxy
                    .body_min_rate
                    .map_or_else(|| "no minimum rate".to_owned(), |rate| format!("or below {rate}"))
            )?;
        }
        let share = |cap: PerClientCap| match (cap, self.server.max_connections) {
            (PerClientCap::Off, _) => "no cap".to_owned(),
            (cap, Some(max)) => cap
                .effective(max.get())
                .map_or_else(|| "no cap".to_owned(), |cap| cap.to_string()),
            (PerClientCap::At(cap), None) => cap.to_string(),
            (PerClientCap::Default, None) => "three quarters of that".to_owned(),
        };
        let per_client = share(self.server.max_connections_per_client);
        writeln!(
            f,
            "connections:      at most {} ({per_client} per client), first request within {} ms, \
             closed after {} ms idle or {} ms unread; upgrades per client: {}, tunnel idle \
             timeout: {}",
            self.server.max_connections.map_or_else(
                || "as the file-descriptor limit allows".to_owned(),
                |max| max.to_string()
            ),
            self.server.header_read_timeout.as_millis(),
            self.server.idle_timeout.as_millis(),
            self.server.send_timeout.as_millis(),
            self.gate
                .max_upgrades_per_client
                .map_or_else(|| "unlimited".to_owned(), |max| max.to_string()),
            self.proxy
                .as_ref()
                .and_then(|proxy| proxy.upgrade_idle_timeout)
                .map_or_else(|| "never".to_owned(), |idle| format!("{} ms", idle.as_millis()))
        )?;
        writeln!(
            f,
            "requests:         in flight at most as many ({} per client), {} streams per HTTP/2 \
             connection",
            share(self.server.max_requests_per_client),
            self.server.h2_max_concurrent_streams
        )?;
        if let Some(proxy) = &self.proxy {
            writeln!(
                f,
                "upgrades to:      {}; headers with '_': {}; method overrides: {}; CORS on own answers: {}",
                proxy.upgrade_protocols.describe(),
                proxy.underscore_headers.as_str(),
                proxy.method_override.as_str(),
                proxy
                    .cors
                    .as_ref()
                    .map_or_else(|| "off".to_owned(), Cors::describe)
            )?;
        }
        match &self.store.kind {
            StoreConfig::Memory => {
                write!(
                    f,
                    "store:            memory (at most {} client states per rule)",
                    self.store.max_keys
                )?;
                match &self.store.state_file {
                    Some(state_file) => write!(f, "\nstate file:       {state_file}"),
                    None => write!(f, "\nstate file:       off (budgets start full after a restart)"),
                }
            }
            StoreConfig::Redis(redis) => {
                writeln!(f, "store:            {redis}")?;
                // Each rule's own (FAIL_MODE, AUTH_FAIL_MODE, a route's fail=), in table order.
                let modes: Vec<String> = rules
                    .iter()
                    .map(|rule| format!("{} {}", rule.name, rule.fail_mode.as_str()))
                    .collect();
                write!(
                    f,
                    "fail modes:       {} (when Redis cannot decide)",
                    modes.join(", ")
                )
            }
        }
    }
}

/// `RLS_CONFIG` (a file, or a directory of `*.yaml`/`*.yml`, one domain each), read now so a
/// bad file stops startup: its table, and `rules` with its limits added as named rules, each
/// failing as `FAIL_MODE` says and shadowed under `SHADOW_MODE` (both the general rule's).
fn parse_rls(
    env: &Env,
    rules: RuleTable,
    shared_store: bool,
) -> Result<(RuleTable, Option<Arc<DescriptorTable>>), ConfigError> {
    let merge = env.flag(vars::RLS_MERGE_DOMAIN_CONFIG)?;
    let Some(path) = env.get(vars::RLS_CONFIG) else {
        return Ok((rules, None));
    };
    // A descriptor's budget is keyed by a digest of its entries: replicas sharing Redis must
    // digest alike (the rule table's parser has refused a short secret already).
    if shared_store && !env.is_set(vars::KEY_HASH_SECRET) {
        return Err(ConfigError::Missing {
            var: "KEY_HASH_SECRET",
            expected: "with Redis and RLS_CONFIG, every replica must digest descriptors alike: set the \
                       same secret of 16+ characters on each, e.g. from `openssl rand -hex 32`",
        });
    }
    let table = DescriptorTable::load(Path::new(path), merge).map_err(|error| ConfigError::File {
        var: vars::RLS_CONFIG.name,
        location: error.location,
        problem: error.problem,
    })?;
    let general = rules.general();
    let mut named = table.specs(general.fail_mode, general.shadow);
    named.push(DescriptorTable::override_spec(general.fail_mode, general.shadow));
    let rules = rules
        .with_named(named)
        .map_err(|error| ConfigError::invalid(vars::RLS_CONFIG.name, path, &error.to_string()))?;
    Ok((rules, Some(Arc::new(table))))
}

/// Where `tollgate healthcheck` finds the admin listener in `vars` (the process environment,
/// after `.env`): as the server binds it, an unspecified address reached on loopback.
pub fn admin_probe_address<I, K, V>(vars: I) -> Result<SocketAddr, String>
where
    I: IntoIterator<Item = (K, V)>,
    K: Into<String>,
    V: Into<String>,
{
    admin_address(&Env::new(vars))
}

/// The bearer token in `var` (`DECIDE_TOKEN`, `ADMIN_TOKEN`): `None` when unset; refused when
/// shorter than [`MIN_TOKEN_LENGTH`].
fn bearer_token(env: &Env, var: Var) -> Result<Option<Token>, ConfigError> {
    match env.get(var) {
        None => Ok(None),
        Some(token) if token.len() < MIN_TOKEN_LENGTH => Err(ConfigError::InvalidSecret {
            var: var.name,
            expected: format!(
                "a secret of at least {MIN_TOKEN_LENGTH} characters (e.g. `openssl rand -hex 32`)"
            ),
        }),
        Some(token) => Token::new(token)
            .map(Some)
            .ok_or_else(|| ConfigError::InvalidSecret {
                var: var.name,
                expected: "a secret to keep: the operating system gave no randomness to keep it with".into(),
            }),
    }
}

/// Where the admin listener is, as the server would bind it: `ADMIN_BIND` (default
/// `127.0.0.1`) and `ADMIN_PORT` (default 9091), with an unspecified address (`0.0.0.0`, `::`)
/// replaced by loopback of the same family, which the listener answers on too.
fn admin_address(env: &Env) -> Result<SocketAddr, String> {
    let invalid = |var: &str, value: &str| format!("{var}={value:?} is invalid");
    let bind = env.value(vars::ADMIN_BIND);
    let ip: IpAddr = bind.parse().map_err(|_| invalid("ADMIN_BIND", bind))?;
    let port = env.value(vars::ADMIN_PORT);
    let port: u16 = port.parse().map_err(|_| invalid("ADMIN_PORT", port))?;
    let ip = match ip {
        IpAddr::V4(v4) if v4.is_unspecified() => IpAddr::V4(Ipv4Addr::LOCALHOST),
        IpAddr::V6(v6) if v6.is_unspecified() => IpAddr::V6(Ipv6Addr::LOCALHOST),
        ip => ip,
    };
    Ok(SocketAddr::new(ip, port))
}

/// A CIDR (`10.0.0.0/8`) or a single address, host bits cleared.
pub(crate) fn parse_network(entry: &str) -> Option<IpNet> {
    entry
        .parse::<IpNet>()
        .or_else(|_| entry.parse::<IpAddr>().map(IpNet::from))
        .ok()
        .map(|net| net.trunc())
}

fn parse_backend(env: &Env) -> Result<Backend, ConfigError> {
    let expected = "an http or https URL such as http://127.0.0.1:8000";
    let value = env.get(vars::BACKEND_URL).ok_or(ConfigError::Missing {
        var: vars::BACKEND_URL.name,
        expected: "where allowed requests go, e.g. http://127.0.0.1:8000 (unless DECIDE_PORT is set: a \
                   decision service alone needs no backend)",
    })?;
    let invalid = |expected: &str| ConfigError::invalid(vars::BACKEND_URL.name, value, expected);
    let uri: Uri = value.parse().map_err(|_| invalid(expected))?;
    let scheme = match uri.scheme() {
        Some(scheme) if *scheme == Scheme::HTTP || *scheme == Scheme::HTTPS => scheme.clone(),
        _ => return Err(invalid(expected)),
    };
    let authority = uri.authority().cloned().ok_or_else(|| invalid(expected))?;
    if authority.as_str().contains('@') {
        return Err(invalid("a URL without user:password@"));
    }
    if uri.query().is_some() {
        return Err(invalid("a URL without a query string"));
    }
    // `Uri` takes any digits after the colon, and reads a port above 65535 as none at all (so
    // port 80); the port written must be the port used.
    let written_port = authority
        .as_str()
        .rsplit_once(':')
        .filter(|(_, port)| !port.contains(']'))
        .map(|(_, port)| port);
    if let Some(port) = written_port
        && !port.parse::<u16>().is_ok_and(|port| port > 0)
    {
        return Err(invalid("a port from 1 to 65535 after the host"));
    }
    let tls = match scheme == Scheme::HTTPS {
        true => Some(parse_backend_tls(env, &authority)?),
        false => None,
    };
    Ok(Backend {
        scheme,
        authority,
        base_path: uri.path().trim_end_matches('/').to_owned(),
        tls,
    })
}

/// `BACKEND_CA_FILE` and `BACKEND_TLS_SERVER_NAME`, read for an https `BACKEND_URL` only (set
/// for an http one, they are warned about as unread). The file is read when the proxy starts.
fn parse_backend_tls(env: &Env, authority: &Authority) -> Result<BackendTls, ConfigError> {
    let server_name = match env.get(vars::BACKEND_TLS_SERVER_NAME) {
        Some(name) => tls::server_name(name).ok_or_else(|| {
            ConfigError::invalid(
                vars::BACKEND_TLS_SERVER_NAME.name,
                name,
                "a DNS name or IP address the backend's certificate is valid for",
            )
        })?,
        None => tls::server_name(authority.host()).ok_or_else(|| {
            ConfigError::invalid(
                vars::BACKEND_URL.name,
                authority.as_str(),
                "a host that is a DNS name or IP address (the TLS server name), or set \
                 BACKEND_TLS_SERVER_NAME",
            )
        })?,
    };
    Ok(BackendTls {
        ca_file: env.get(vars::BACKEND_CA_FILE).map(PathBuf::from),
        server_name,
    })
}

#[cfg(test)]
mod tests;
