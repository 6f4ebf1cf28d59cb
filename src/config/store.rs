//! The store settings: memory, or Redis (one server, a URL, a cluster, or the master Redis
//! Sentinels name) with its key prefix,
//! timeout and circuit breaker. Redis URLs and passwords are never printed. The fail modes
//! (`FAIL_MODE`, `AUTH_FAIL_MODE`) are the rules' own, parsed with them in [`super::rules`].

use super::ConfigError;
use super::MAX_MAX_KEYS;
use super::env::{Env, entries};
use crate::stores::lease::LeaseSettings;
use crate::stores::redis::redact_url;
use crate::stores::settings::{RedisConfig, StoreConfig, StoreSettings};
use crate::stores::state_file::StateFileSettings;
use crate::stores::{GuardSettings, RedisTarget};
use crate::variables as vars;
use std::num::NonZeroUsize;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The store: memory unless one of `REDIS_URL`, `REDIS_ADDR`, `REDIS_CLUSTER_NODES` and
/// `REDIS_SENTINELS` is set.
pub(crate) fn parse(env: &Env) -> Result<StoreConfig, ConfigError> {
    match target(env)? {
        None => Ok(StoreConfig::Memory),
        Some(target) => redis(env, target).map(StoreConfig::Redis),
    }
}

/// The store's settings: `kind` (from [`parse`]), `MAX_KEYS` for each of the `rule_count`
/// rules, and `STATE_FILE`.
pub(crate) fn settings(
    env: &Env,
    kind: StoreConfig,
    rule_count: usize,
) -> Result<StoreSettings, ConfigError> {
    let max_keys = env.parse(vars::MAX_KEYS, "a whole number from 1 to 1000000000", |s| {
        s.parse::<usize>()
            .ok()
            .filter(|&keys| keys <= MAX_MAX_KEYS)
            .and_then(NonZeroUsize::new)
    })?;
    let state_file = state_file(env, &kind)?;
    // Every rule has room for MAX_KEYS clients, and its index is written at startup.
    if max_keys.get().saturating_mul(rule_count) > MAX_MAX_KEYS {
        return Err(ConfigError::invalid(
            vars::MAX_KEYS.name,
            &max_keys.to_string(),
            &format!(
                "a whole number of client states per rule, at most {} for the {rule_count} \
                 rules configured ({MAX_MAX_KEYS} in all)",
                MAX_MAX_KEYS / rule_count.max(1)
            ),
        ));
    }
    Ok(StoreSettings {
        kind,
        max_keys,
        state_file,
    })
}

/// Where Redis is: `None` (memory) unless one of the four variables that select it is set.
fn target(env: &Env) -> Result<Option<RedisTarget>, ConfigError> {
    let target = match (
        env.get(vars::REDIS_URL),
        env.get(vars::REDIS_ADDR),
        env.get(vars::REDIS_CLUSTER_NODES),
        env.get(vars::REDIS_SENTINELS),
    ) {
        (None, None, None, None) => return Ok(None),
        (Some(_), None, None, None) if env.is_set(vars::REDIS_TLS) => {
            return Err(ConfigError::Conflict(
                "REDIS_TLS goes with REDIS_ADDR, REDIS_CLUSTER_NODES or REDIS_SENTINELS; \
                 with REDIS_URL, choose redis:// or rediss:// (TLS) in the URL"
                    .into(),
            ));
        }
        (Some(_), None, None, None) if env.is_set(vars::REDIS_PASSWORD) => {
            return Err(ConfigError::Conflict(
                "REDIS_PASSWORD goes with REDIS_ADDR, REDIS_CLUSTER_NODES or REDIS_SENTINELS; \
                 with REDIS_URL, put the password in the URL (redis://:password@host:port)"
                    .into(),
            ));
        }
        (Some(url), None, None, None) => RedisTarget::Single(url_target(url)?),
        (None, Some(addr), None, None) => {
            let addr = host_port("REDIS_ADDR", addr)?;
            let scheme = if env.flag(vars::REDIS_TLS)? {
                "rediss"
            } else {
                "redis"
            };
            let url = match env.get(vars::REDIS_PASSWORD) {
                Some(password) => format!(
                    "{scheme}://:{}@{addr}",
                    percent_encoding::utf8_percent_encode(password, percent_encoding::NON_ALPHANUMERIC)
                ),
                None => format!("{scheme}://{addr}"),
            };
            RedisTarget::Single(url)
        }
        (None, None, Some(value), None) => RedisTarget::Cluster {
            nodes: host_ports("REDIS_CLUSTER_NODES", value, "comma-separated host:port seeds")?,
            password: env.get(vars::REDIS_PASSWORD).map(str::to_owned),
            tls: env.flag(vars::REDIS_TLS)?,
        },
        (None, None, None, Some(value)) => sentinel(env, value)?,
        _ => {
            return Err(ConfigError::Conflict(
                "set only one of REDIS_URL, REDIS_ADDR, REDIS_CLUSTER_NODES and REDIS_SENTINELS".into(),
            ));
        }
    };
    Ok(Some(target))
}

/// `REDIS_URL`: checked, never shown (it may hold a password).
fn url_target(url: &str) -> Result<String, ConfigError> {
    let expected = "redis://[:password@]host:port/db or rediss://... for TLS";
    if !(url.starts_with("redis://") || url.starts_with("rediss://")) {
        return Err(ConfigError::InvalidSecret {
            var: vars::REDIS_URL.name,
            expected: expected.into(),
        });
    }
    if redis::Client::open(url).is_err() {
        return Err(ConfigError::InvalidSecret {
            var: vars::REDIS_URL.name,
            expected: format!("{expected} (got {})", redact_url(url)),
        });
    }
    Ok(url.to_owned())
}

/// `REDIS_SENTINELS` (`value`), `REDIS_SENTINEL_MASTER` and their passwords.
fn sentinel(env: &Env, value: &str) -> Result<RedisTarget, ConfigError> {
    let sentinels = host_ports(
        "REDIS_SENTINELS",
        value,
        "comma-separated host:port of the Sentinels, e.g. 10.0.0.5:26379,10.0.0.6:26379",
    )?;
    let Some(master) = env.get(vars::REDIS_SENTINEL_MASTER) else {
        return Err(ConfigError::Missing {
            var: vars::REDIS_SENTINEL_MASTER.name,
            expected: "the master's name as the Sentinels monitor it (`sentinel monitor NAME ...`), \
                       with REDIS_SENTINELS",
        });
    };
    if master.contains(char::is_whitespace) {
        return Err(ConfigError::invalid(
            vars::REDIS_SENTINEL_MASTER.name,
            master,
            "a master name without spaces, as in `sentinel monitor NAME ...`",
        ));
    }
    Ok(RedisTarget::Sentinel {
        sentinels,
        master: master.to_owned(),
        password: env.get(vars::REDIS_PASSWORD).map(str::to_owned),
        sentinel_password: env.get(vars::REDIS_SENTINEL_PASSWORD).map(str::to_owned),
        tls: env.flag(vars::REDIS_TLS)?,
    })
}

/// Redis's settings beside its `target`: the key prefix, the timeout, and the guard.
fn redis(env: &Env, target: RedisTarget) -> Result<RedisConfig, ConfigError> {
    let key_prefix = env.value(vars::KEY_PREFIX).to_owned();
    if key_prefix.contains(['{', '}']) {
        return Err(ConfigError::invalid(
            vars::KEY_PREFIX.name,
            &key_prefix,
            "a prefix without '{' or '}' (they would break Redis Cluster hash tags)",
        ));
    }
    let failure_threshold = env.parse(
        vars::REDIS_BREAKER_THRESHOLD,
        "a whole number of at least 1",
        |s| s.parse::<u32>().ok().filter(|n| *n > 0),
    )?;
    let calls_in_flight = env.parse(
        vars::REDIS_CALLS_IN_FLIGHT,
        "a whole number from 0 (never coalesce) to 1024",
        |s| s.parse::<usize>().ok().filter(|n| *n <= 1024),
    )?;
    let leases = env.parse(vars::REDIS_LEASES, "on or off", |s| match s {
        "on" => Some(true),
        "off" => Some(false),
        _ => None,
    })?;
    let hot_per_second = env.parse(
        vars::REDIS_LEASE_HOT,
        "a whole number of decisions a second, from 1 to 1000000",
        |s| s.parse::<u32>().ok().filter(|n| (1..=1_000_000).contains(n)),
    )?;
    Ok(RedisConfig {
        target,
        key_prefix,
        timeout: env.millis(vars::REDIS_TIMEOUT_MS)?,
        calls_in_flight,
        leases: leases.then_some(LeaseSettings { hot_per_second }),
        guard: GuardSettings {
            failure_threshold,
            probe_interval: env.millis(vars::REDIS_PROBE_INTERVAL_MS)?,
        },
    })
}

/// The most `STATE_SAVE_INTERVAL_S` may be: a day. A save that rare loses a day of budgets to a
/// crash, and a larger number is more likely a mistake (milliseconds) than a wish.
pub(crate) const MAX_SAVE_INTERVAL_S: u64 = 24 * 3600;

/// `STATE_FILE` (and with it `STATE_SAVE_INTERVAL_S`), for the memory store. With Redis it is
/// an error rather than a warning: budgets already survive a restart there, and what the
/// operator who set it expects (a file that keeps them) would silently not exist, not even for
/// `FAIL_MODE=local`'s store, which is not saved.
pub(crate) fn state_file(env: &Env, store: &StoreConfig) -> Result<Option<StateFileSettings>, ConfigError> {
    let Some(path) = env.get(vars::STATE_FILE) else {
        return Ok(None);
    };
    if let StoreConfig::Redis(_) = store {
        return Err(ConfigError::Conflict(
            "STATE_FILE saves the memory store, but a Redis variable selects Redis, where budgets \
             already survive a restart (and FAIL_MODE=local's store is not saved): unset STATE_FILE"
                .into(),
        ));
    }
    if path.ends_with('/') || Path::new(path).file_name().is_none() {
        return Err(ConfigError::invalid(
            vars::STATE_FILE.name,
            path,
            "the path of a file (its directory must exist and be writable), e.g. /var/lib/tollgate/state",
        ));
    }
    let interval = env.parse(
        vars::STATE_SAVE_INTERVAL_S,
        "a whole number of seconds up to 86400 (a day), 0 to save only on shutdown",
        |s| s.parse::<u64>().ok().filter(|s| *s <= MAX_SAVE_INTERVAL_S),
    )?;
    Ok(Some(StateFileSettings {
        path: PathBuf::from(path),
        save_interval: (interval > 0).then(|| Duration::from_secs(interval)),
    }))
}

/// A comma-separated list of `host:port`, at least one.
fn host_ports(var: &'static str, value: &str, expected: &str) -> Result<Vec<String>, ConfigError> {
    let list: Vec<String> = entries(value, &[','])
        .map(|entry| host_port(var, entry))
        .collect::<Result<_, _>>()?;
    if list.is_empty() {
        return Err(ConfigError::invalid(var, value, expected));
    }
    Ok(list)
}

fn host_port(var: &'static str, value: &str) -> Result<String, ConfigError> {
    let valid = value.rsplit_once(':').is_some_and(|(host, port)| {
        !host.is_empty() && !host.contains(['/', '@']) && port.parse::<u16>().is_ok_and(|p| p > 0)
    });
    if valid {
        Ok(value.to_owned())
    } else {
        Err(ConfigError::invalid(var, value, "host:port, e.g. 127.0.0.1:6379"))
    }
}
