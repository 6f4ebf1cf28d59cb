//! Envoy's rate limit service's settings: `RLS_CONFIG` and `RLS_MERGE_DOMAIN_CONFIG`, read
//! into a [`DescriptorTable`] whose limits become named rules of the rule table.

use std::path::Path;
use std::sync::Arc;

use super::ConfigError;
use super::env::Env;
use crate::rls::DescriptorTable;
use crate::rules::RuleTable;
use crate::variables as vars;

/// `RLS_CONFIG` (a file, or a directory of `*.yaml`/`*.yml`, one domain each), read now so a
/// bad file stops startup: its table, and `rules` with its limits added as named rules, each
/// failing as `FAIL_MODE` says and shadowed under `SHADOW_MODE` (both the general rule's).
pub(crate) fn parse(
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
