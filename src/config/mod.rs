//! Configuration: environment variables in, a validated [`Config`] out.
//!
//! Parsing is a pure function over a map of strings ([`Config::from_vars`]), so every rule is
//! unit-tested without touching the process environment, in the manner of linkerd2-proxy's
//! `env.rs`. Each component's settings are parsed by a module of their own, over the one
//! reader of variables (`env`), as the component's own settings type:
//!
//! - `server`: the listeners' addresses, the connection limits and clocks (`ServerSettings`),
//!   with `listener`: HTTPS and the PROXY protocol on `PORT`;
//! - `proxy`: the backend, its TLS and clocks, bodies, headers, upgrades (`ProxySettings`),
//!   answering as `answers` says (rate-limit headers, refusals, the access log), as
//!   `decide` does: the decision endpoints (`DecideSettings`);
//! - `rules`: the rule table (`ALGORITHM`, `ROUTES`, `AUTH_PATHS`, `KEY_BY`, `COSTS`, ...),
//!   from the environment or `rules_file`, with `overrides` and Envoy's descriptors
//!   (`rls`); `gate`: the gate's own settings beside it (`GateSettings`);
//! - `store`: memory or Redis, `MAX_KEYS` and `STATE_FILE` ([`StoreSettings`]);
//! - `admin`: the admin listener (`AdminSettings`); `telemetry`: the log
//!   (`LogSettings`) and the traces (`TraceSettings`); `reload`: the files the rule table is reloaded from;
//! - `warnings`: variables that are set but change nothing (misspelt, or not read by the
//!   chosen algorithm or store), reported without stopping startup;
//! - this module: the whole [`Config`], one field per component, and what the components'
//!   settings say together.
//!
//! Setting types belong to the components that use them: configuration depends on the
//! components, never the reverse, and no component sees the whole `Config` (the wiring in
//! `crate::app` hands each its part). Variable names and defaults are constants in
//! [`crate::variables`]. Every error names the variable, shows the bad value (except for
//! secrets) and says what is accepted.

pub(crate) mod admin;
pub(crate) mod answers;
pub(crate) mod decide;
mod display;
pub(crate) mod env;
pub(crate) mod gate;
pub(crate) mod listener;
pub(crate) mod overrides;
pub(crate) mod proxy;
pub(crate) mod reload;
pub(crate) mod rls;
pub(crate) mod rules;
pub(crate) mod rules_file;
pub(crate) mod server;
pub(crate) mod spec;
pub(crate) mod store;
pub(crate) mod telemetry;
pub(crate) mod warnings;

use crate::variables as vars;
#[cfg(test)]
use std::collections::BTreeSet;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use ipnet::IpNet;

use crate::admin::AdminSettings;
use crate::decide::DecideSettings;
use crate::gate::GateSettings;
use crate::proxy::ProxySettings;
use crate::rls::DescriptorTable;
use crate::server::ServerSettings;
use crate::telemetry::LogSettings;
use crate::telemetry::trace::TraceSettings;
use admin::admin_address;
use env::Env;
pub(crate) use reload::{Loaded, ReloadSettings, Reloaded, read_dot_env};
use rules_file::RulesFile;

/// The most `MAX_KEYS` may be: a billion clients, about 87 GB held in full. The store's index
/// (about 7 bytes per key) is allocated and written at startup, so a mistyped value is refused
/// here rather than failing the allocation.
pub const MAX_MAX_KEYS: usize = 1_000_000_000;

/// The shortest `DECIDE_TOKEN`: 16 random characters are beyond guessing; fewer are a
/// placeholder left in.
pub const MIN_TOKEN_LENGTH: usize = 16;

pub use crate::stores::settings::{RedisConfig, StoreConfig, StoreSettings};
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
    /// Traces (`OTEL_*`); `None` when no endpoint is set: nothing exported.
    pub(crate) traces: Option<TraceSettings>,
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
    pub fn state_file(&self) -> Option<&crate::stores::state_file::StateFileSettings> {
        self.store.state_file.as_ref()
    }

    /// The compiled rule table: what classifies a request head into rule, key, cost and mode.
    pub fn rule_table(&self) -> &crate::rules::RuleTable {
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
        hasher: Option<crate::rules::KeyHasher>,
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

    /// Each component's settings, from its own parser; then what they say together.
    fn parse_env(env: &Env) -> Result<Self, ConfigError> {
        let addresses = server::addresses(env)?;
        let answers = answers::parse(env)?;
        let store = store::parse(env)?;
        let shared_store = matches!(store, StoreConfig::Redis(_));
        let mut rule_warnings = Vec::new();
        let rules = rules::parse(env, shared_store, &mut rule_warnings)?;
        let overrides_file = overrides::read(env)?;
        let rules = overrides::apply(env, rules, overrides_file.as_ref(), &mut rule_warnings)?;
        let (rules, rls) = rls::parse(env, rules, shared_store)?;
        let decide = decide::parse(env, addresses.decide, &answers, shared_store)?;
        let gate = gate::parse(env, rules)?;
        let server = server::parse(env, addresses.listen, &gate.trusted_proxies)?;
        let reload = reload::parse(env, overrides_file.as_ref())?;
        let store = store::settings(env, store, gate.rules.rules().len())?;
        let proxy = proxy::parse(env, addresses.proxied, answers)?;
        let admin = admin::parse(env, addresses.admin)?;
        let log = telemetry::parse(env)?;
        let traces = telemetry::parse_traces(env)?;
        // Last, when every variable this configuration reads has been read.
        #[cfg(test)]
        let read = env.read_names();
        let mut warnings = warnings::warnings(env);
        warnings.extend(rule_warnings);
        Ok(Config {
            server,
            proxy,
            decide,
            gate,
            store,
            admin,
            rls,
            reload,
            log,
            traces,
            #[cfg(test)]
            read,
            warnings,
        })
    }
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

/// A CIDR (`10.0.0.0/8`) or a single address, host bits cleared.
pub(crate) fn parse_network(entry: &str) -> Option<IpNet> {
    entry
        .parse::<IpNet>()
        .or_else(|_| entry.parse::<IpAddr>().map(IpNet::from))
        .ok()
        .map(|net| net.trunc())
}

#[cfg(test)]
mod tests;
