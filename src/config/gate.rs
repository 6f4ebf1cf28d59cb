//! The gate's own settings beside the rule table: `TRUSTED_PROXIES`,
//! `MAX_UPGRADES_PER_CLIENT`, `DELAY_QUEUE` and `DELAY_QUEUE_PER_CLIENT`, into
//! [`GateSettings`]. The rule table is [`super::rules`]' (with [`super::overrides`] and
//! [`super::rls`]).

use ipnet::IpNet;

use super::env::{Env, entries};
use super::{ConfigError, parse_network};
use crate::gate::GateSettings;
use crate::gate::delay::DelayBounds;
use crate::rules::RuleTable;
use crate::variables::{self as vars, Var};

/// The gate's settings, classifying with `rules`.
pub(crate) fn parse(env: &Env, rules: RuleTable) -> Result<GateSettings, ConfigError> {
    let trusted_proxies = trusted_proxies(env)?;
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
    Ok(GateSettings {
        rules,
        trusted_proxies,
        max_upgrades_per_client,
        delay_bounds,
    })
}

/// `TRUSTED_PROXIES`: CIDRs or addresses, none of them every address.
fn trusted_proxies(env: &Env) -> Result<Vec<IpNet>, ConfigError> {
    entries(env.value(vars::TRUSTED_PROXIES), &[','])
        .map(|entry| {
            let network = parse_network(entry).ok_or_else(|| {
                ConfigError::invalid(
                    vars::TRUSTED_PROXIES.name,
                    entry,
                    "comma-separated CIDRs or addresses, e.g. 10.0.0.0/8,192.168.1.7",
                )
            })?;
            // Trusting every peer believes every X-Forwarded-For: each client would name its
            // own address, and so its own budget.
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
        .collect()
}
