//! `OVERRIDES_FILE`, `TIERS` and `TIER_HEADER`: other limits for some clients of a rule,
//! compiled into the rule table's variants and [`Overrides`] (see [`crate::rules::overrides`]).
//!
//! The overrides file holds one override a line, `RULE CLIENT WHAT`, separated by spaces or
//! tabs; `#` starts a comment, and blank lines are skipped:
//!
//! ```text
//! # rule   client               limits, unlimited or deny
//! general  key:sk_live_abc      token_bucket:1000:100
//! general  10.0.0.0/8           unlimited
//! auth     203.0.113.7          deny
//! api      198.51.100.0/24      token_bucket:50:5+fixed_window:10000:86400
//! ```
//!
//! `RULE` is `general`, `auth` or a route's name; `CLIENT` an address, a CIDR, or `key:VALUE`,
//! the value of the rule's key source (the rule keyed by one source besides the address, as
//! `EXEMPT`'s `key:` entries); `WHAT` a limit list as `ROUTES` writes one, `unlimited` or
//! `deny`. Every error names the file and the line, and never shows a `key:` value.
//!
//! `TIERS` is `NAME=LIMITS;NAME=LIMITS`: a request whose `TIER_HEADER` names a tier, from a
//! peer in `TRUSTED_PROXIES`, gets the tier's limits under every rule but the auth rule (a
//! plan buys more API, not more password guesses).

use std::collections::HashMap;
use std::sync::Arc;

use http::HeaderName;
use ipnet::IpNet;

use super::env::{Env, entries};
use super::{ConfigError, parse_network};
use crate::algorithms::parse_limits;
use crate::rules::overrides::{Client, Entry, Override, Overrides, Tier};
use crate::rules::{Rule, RuleTable};
use crate::variables as vars;

/// Most lines an overrides file holds (it is read whole, and its lookups are held in memory).
pub(crate) const MAX_OVERRIDES: usize = 100_000;

/// Most variants (distinct limit lists of overrides, and tiers times rules) a table holds:
/// each is a rule with its own states and metric series.
pub(crate) const MAX_VARIANTS: usize = 1_000;

/// The overrides file's bytes, as read at start or by a reload: what the table was built from.
#[derive(Debug, Clone)]
pub(crate) struct OverridesFile {
    /// `OVERRIDES_FILE`.
    pub(crate) path: String,
    /// Its bytes.
    pub(crate) bytes: Arc<Vec<u8>>,
}

/// Read `OVERRIDES_FILE` (bounded as a rules file is), if set.
pub(crate) fn read(env: &Env) -> Result<Option<OverridesFile>, ConfigError> {
    let Some(path) = env.get(vars::OVERRIDES_FILE) else {
        return Ok(None);
    };
    let bytes = super::rules_file::read_bounded(path).map_err(|problem| ConfigError::File {
        var: vars::OVERRIDES_FILE.name,
        location: path.to_owned(),
        problem,
    })?;
    Ok(Some(OverridesFile {
        path: path.to_owned(),
        bytes: Arc::new(bytes),
    }))
}

/// `table` with the variants and overrides of `TIERS`/`TIER_HEADER` and `file`. What is
/// suspicious but may be meant goes to `warnings`.
pub(crate) fn apply(
    env: &Env,
    table: RuleTable,
    file: Option<&OverridesFile>,
    warnings: &mut Vec<String>,
) -> Result<RuleTable, ConfigError> {
    let mut variants = Variants {
        next: table.rules().len(),
        rules: Vec::new(),
    };
    let tiers = tiers(env, &table, &mut variants, warnings)?;
    let entries = match file {
        Some(file) => lines(file, &table, &mut variants)?,
        None => Vec::new(),
    };
    if entries.is_empty() && tiers.is_none() {
        return Ok(table);
    }
    let overrides = Overrides::new(entries, tiers);
    table.with_overrides(variants.rules, overrides).map_err(|error| {
        ConfigError::Conflict(format!(
            "the overrides cannot be added to the rule table: {error}"
        ))
    })
}

/// The variants made so far, each a rule of the table to be.
struct Variants {
    /// The id of the next.
    next: usize,
    rules: Vec<Rule>,
}

impl Variants {
    /// The variant of `base` called `name` with the limits `spec`, made if new.
    fn of(&mut self, base: &Rule, name: String, spec: &str) -> Result<u16, String> {
        if let Some(held) = self.rules.iter().find(|rule| *rule.name == *name) {
            return Ok(held.id);
        }
        let limits = parse_limits(spec)?;
        if base.cost > limits.capacity() {
            return Err(format!(
                "the rule {:?} costs {} a request, above these limits' capacity of {}: no request could pass",
                &*base.name,
                base.cost,
                limits.capacity()
            ));
        }
        if self.rules.len() == MAX_VARIANTS {
            return Err(format!(
                "more than {MAX_VARIANTS} distinct limit lists and tiers: each is a budget of its own"
            ));
        }
        let id = u16::try_from(self.next).map_err(|_| "too many rules".to_owned())?;
        self.next += 1;
        self.rules.push(Rule {
            id,
            name: name.into(),
            limits,
            ..base.clone()
        });
        Ok(id)
    }
}

/// `TIERS` and `TIER_HEADER`, both or neither.
fn tiers(
    env: &Env,
    table: &RuleTable,
    variants: &mut Variants,
    warnings: &mut Vec<String>,
) -> Result<Option<(HeaderName, Vec<Tier>)>, ConfigError> {
    let (spec, header) = match (env.get(vars::TIERS), env.get(vars::TIER_HEADER)) {
        (None, None) => return Ok(None),
        (Some(spec), Some(header)) => (spec, header),
        (Some(_), None) | (None, Some(_)) => {
            return Err(ConfigError::Conflict(format!(
                "{} and {} go together: the tiers, and the header naming a request's tier",
                vars::TIERS.name,
                vars::TIER_HEADER.name
            )));
        }
    };
    let header = HeaderName::from_bytes(header.as_bytes())
        .map_err(|_| ConfigError::invalid(vars::TIER_HEADER.name, header, "a header name, such as X-Plan"))?;
    if entries(env.value(vars::TRUSTED_PROXIES), &[',']).next().is_none() {
        warnings.push(format!(
            "{} is set but TRUSTED_PROXIES is empty: a tier is believed only from a trusted proxy, so \
             every request gets its rule's own limits",
            vars::TIER_HEADER.name
        ));
    }
    let mut tiers: Vec<Tier> = Vec::new();
    for entry in entries(spec, &[';']) {
        let bad = |problem: String| ConfigError::entry(vars::TIERS.name, entry, problem);
        let (name, limits) = entry
            .split_once('=')
            .ok_or_else(|| bad("expected NAME=LIMITS, e.g. pro=token_bucket:100:10".into()))?;
        if !super::spec::is_rule_name(name) {
            return Err(bad(format!(
                "tier name {name:?}: expected 1 to 64 of a-z, 0-9, '_' and '-'"
            )));
        }
        if tiers.iter().any(|tier| *tier.name == *name) {
            return Err(bad(format!("the tier {name:?} is named twice")));
        }
        let mut by_rule = Vec::with_capacity(table.classified().len());
        for rule in table.classified() {
            by_rule.push(match &*rule.name {
                "auth" => None,
                base => Some(
                    variants
                        .of(rule, format!("{base}@{name}"), limits)
                        .map_err(&bad)?,
                ),
            });
        }
        tiers.push(Tier {
            name: name.into(),
            variants: by_rule,
        });
    }
    if tiers.is_empty() {
        return Err(ConfigError::invalid(
            vars::TIERS.name,
            spec,
            "at least one NAME=LIMITS, e.g. free=token_bucket:10:1;pro=token_bucket:100:10",
        ));
    }
    Ok(Some((header, tiers)))
}

/// The overrides of `file`, in order.
fn lines(
    file: &OverridesFile,
    table: &RuleTable,
    variants: &mut Variants,
) -> Result<Vec<Entry>, ConfigError> {
    let text = std::str::from_utf8(&file.bytes).map_err(|e| ConfigError::File {
        var: vars::OVERRIDES_FILE.name,
        location: file.path.clone(),
        problem: format!("not UTF-8 text: {e}"),
    })?;
    let mut overrides: Vec<Entry> = Vec::new();
    // Where each (rule, client) was written, to name both lines of a repeat.
    let mut seen: HashMap<(u16, Client), usize> = HashMap::new();
    for (at, line) in text.lines().enumerate() {
        let number = at + 1;
        let error = |problem: String| ConfigError::File {
            var: vars::OVERRIDES_FILE.name,
            location: format!("{}:{number}", file.path),
            problem,
        };
        let line = line.split_once('#').map_or(line, |(before, _)| before);
        let fields: Vec<&str> = line.split_whitespace().collect();
        let [rule, client, what] = fields[..] else {
            if fields.is_empty() {
                continue;
            }
            let found = fields.len();
            return Err(error(format!(
                "expected RULE CLIENT LIMITS|unlimited|deny (3 fields), found {found}"
            )));
        };
        if overrides.len() == MAX_OVERRIDES {
            return Err(error(format!("more than {MAX_OVERRIDES} overrides")));
        }
        let entry = override_line(table, variants, [rule, client, what]).map_err(error)?;
        if let Some(first) = seen.insert((entry.rule, entry.client), number) {
            let shown = match entry.client {
                Client::Key(_) => "key:***".to_owned(),
                Client::Network(network) => network.to_string(),
            };
            return Err(error(format!(
                "{rule} {shown} is overridden on line {first} already"
            )));
        }
        overrides.push(entry);
    }
    Ok(overrides)
}

/// One line's override, `RULE CLIENT LIMITS|unlimited|deny`; the error says what is wrong.
fn override_line(
    table: &RuleTable,
    variants: &mut Variants,
    [rule, client, what]: [&str; 3],
) -> Result<Entry, String> {
    let base = table
        .classified()
        .iter()
        .find(|held| &*held.name == rule)
        .ok_or_else(|| {
            let names: Vec<&str> = table.classified().iter().map(|rule| &*rule.name).collect();
            format!("no rule is named {rule:?}; the rules are {}", names.join(", "))
        })?;
    let client = override_client(table, base, rule, client)?;
    let what = match what {
        "unlimited" => Override::Unlimited,
        "deny" => Override::Deny,
        spec => Override::Limits(variants.of(base, format!("{rule}@{spec}"), spec)?),
    };
    Ok(Entry {
        rule: base.id,
        client,
        what,
    })
}

/// An override's client: `key:VALUE` (digested as the rule `base`, called `rule`, digests its
/// one source) or a network, never every address.
fn override_client(table: &RuleTable, base: &Rule, rule: &str, client: &str) -> Result<Client, String> {
    if let Some(value) = client.strip_prefix("key:") {
        let source = base.key_by.single().ok_or_else(|| {
            format!(
                "key:*** needs the rule {rule:?} keyed by one source besides ip (it is keyed by {})",
                base.key_by
            )
        })?;
        if value.is_empty() {
            return Err("key: names no value".into());
        }
        let digest = table
            .hasher()
            .digest_of(std::slice::from_ref(source), &[value.as_bytes()]);
        return Ok(Client::Key(digest));
    }
    let network: IpNet =
        parse_network(client).ok_or_else(|| format!("{client:?} is not an address, a CIDR or key:VALUE"))?;
    if network.prefix_len() == 0 {
        return Err(format!(
            "{client} is every client of its address family: change the rule's own limits instead"
        ));
    }
    Ok(Client::Network(network.trunc()))
}
