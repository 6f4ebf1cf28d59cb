//! The store's settings: which store holds client budgets (memory, or Redis with its key
//! prefix, timeout and circuit breaker), and how many clients memory holds. Parsed by
//! `config::store`; Redis URLs and passwords are never printed.

use std::fmt;
use std::num::NonZeroUsize;
use std::time::Duration;

use super::lease::LeaseSettings;
use super::{GuardSettings, RedisTarget};
use crate::stores::state_file::StateFileSettings;

/// Where budgets live, and how many clients memory holds.
#[derive(Debug, Clone, PartialEq)]
pub struct StoreSettings {
    /// Memory or Redis.
    pub kind: StoreConfig,
    /// `MAX_KEYS`: the most client states held in memory per rule (the memory store, or
    /// `FAIL_MODE=local`'s).
    pub max_keys: NonZeroUsize,
    /// `STATE_FILE` and `STATE_SAVE_INTERVAL_S`: where the memory store is saved and read back
    /// at start; `None` when unset (and always with Redis, which keeps budgets itself).
    pub state_file: Option<StateFileSettings>,
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
    /// `REDIS_URL`, `REDIS_ADDR`, `REDIS_CLUSTER_NODES` or `REDIS_SENTINELS`.
    pub target: RedisTarget,
    /// `KEY_PREFIX`: in front of every key, so several gateways can share one Redis.
    pub key_prefix: String,
    /// `REDIS_TIMEOUT_MS`: the most one decision may wait for Redis.
    pub timeout: Duration,
    /// `REDIS_CALLS_IN_FLIGHT`: decision calls out at once before the decisions arriving
    /// wait and go together in one call (single Redis); 0 never coalesces.
    pub calls_in_flight: usize,
    /// The circuit breaker.
    pub guard: GuardSettings,
    /// `REDIS_LEASES` and `REDIS_LEASE_HOT`: hot keys decided from shares of their budgets;
    /// `None` when off.
    pub leases: Option<LeaseSettings>,
}

/// As `--check-config` shows it, password redacted.
impl fmt::Display for RedisConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Cluster and Sentinel targets name themselves; a lone URL is a single server.
        let single = if matches!(self.target, RedisTarget::Single(_)) {
            "single "
        } else {
            ""
        };
        write!(
            f,
            "redis {single}{} (prefix {:?}, timeout {} ms, {} calls in flight, breaker after {} failures, probe every {} ms, leases {})",
            self.target.redacted(),
            self.key_prefix,
            self.timeout.as_millis(),
            self.calls_in_flight,
            self.guard.failure_threshold,
            self.guard.probe_interval.as_millis(),
            match self.leases {
                Some(leases) => format!("from {} decisions/s", leases.hot_per_second),
                None => "off".to_owned(),
            },
        )
    }
}
