//! The rule table parser: `ALGORITHM`, `AUTH_ALGORITHM` and their numbers, `ROUTES`,
//! `AUTH_PATHS`, `KEY_BY`, `AUTH_KEY_BY`, `IPV6_PREFIX`, `KEY_HASH_SECRET`, `COSTS`, `EXEMPT`, `SKIP_PATHS`,
//! `SHADOW_MODE`, `AUTH_COUNT`, `DELAY_MAX_MS`, `AUTH_DELAY_MAX_MS`, and with Redis `FAIL_MODE`
//! and `AUTH_FAIL_MODE` (or a rules file's routes in place of `ROUTES`): one [`RuleSpec`] per
//! route, the auth and the general rule, compiled by [`RuleTable::compile`].
//!
//! `ROUTES` is `;`-separated entries, each `PATTERN=LIMITS[,OPTION...]`, `LIMITS` one
//! `ALGORITHM:A:B` or several joined by `+`, all enforced:
//!
//! ```text
//! ROUTES="/api/export/*=token_bucket:5:0.1;/search=fixed_window:100:60,method=GET|HEAD,key=header:X-API-Key"
//! ROUTES="/api/*=token_bucket:20:10+fixed_window:10000:86400,name=api"
//! ```
//!
//! `A:B` are capacity and refill rate for `token_bucket`/`gcra`, and limit and window seconds
//! for `sliding_window`, `fixed_window` and `sliding_log`. Options: `name=NAME` (default: the
//! pattern), `key=SOURCE[+SOURCE...]` (`ip`, `header:NAME`, `cookie:NAME`, `query:NAME`, `host`,
//! `path`; default `KEY_BY`), `cost=N` (default 1),
//! `method=GET|POST` (default every method; `GET` takes `HEAD` too, and a request matches in
//! any case of its method or under a method-override header, see `rules`), `shadow`,
//! `count=failures`,
//! `fail=open|closed|local` (default `FAIL_MODE`: what to do when Redis cannot decide), and
//! `delay=MS` (default `DELAY_MAX_MS`: how long a refused request may wait for its budget
//! instead, 0 for not at all). No entry may contain whitespace: `AUTH_PATHS="/login /signup"`
//! is an error, not one odd path.

use crate::variables::{self as vars, Var};
use ipnet::IpNet;

use super::env::{Env, entries};
use super::spec::{Context, DELAY_FORMS, KeyProblem, RouteEntry, delayable, key_problem, parse_delay};
use super::{ConfigError, parse_network};
use crate::algorithms::{
    Algorithm, Concurrent, Limits, ParameterError, Policy, algorithm_names, parse_limits,
};
use crate::rules::key::{KEY_BY_FORMS, KeyBy, KeyHasher, Source, host_value};
use crate::rules::pattern::PathPattern;
use crate::rules::table::{Count, Exemptions, Rule, RuleTable, TableError};
use crate::rules::{FailMode, Matching, RouteSpec, RuleSpec, TableSpec};

/// Most `ROUTES` entries: rule ids are 16 bits, and a table this long is a mistake anyway.
const MAX_ROUTES: usize = 1_000;

/// A `KEY_HASH_SECRET` shorter than this is refused: it must be hard to guess.
const MIN_SECRET_LEN: usize = 16;

/// Build the rule table. `shared_store`: Redis is in use, so header digests must agree across
/// replicas and need `KEY_HASH_SECRET`. What is suspicious but may be meant goes to `warnings`.
pub(crate) fn parse(
    env: &Env,
    shared_store: bool,
    warnings: &mut Vec<String>,
) -> Result<RuleTable, ConfigError> {
    let (general, mut auth) = general_and_auth(env, shared_store, warnings)?;
    let ipv6_prefix = env.parse(vars::IPV6_PREFIX, "a prefix length from 1 to 128", |s| {
        s.parse::<u8>().ok().filter(|p| (1..=128).contains(p))
    })?;
    let context = Context { shared_store };
    let mut rules = route_specs(env, &general, &context, warnings)?;
    auth_paths(env, &mut auth, &rules, warnings)?;
    check_delays(env, &general, &auth, warnings)?;
    let cost_entries = list(env, vars::COSTS, &[';', ','])?;
    let costs = costs(&cost_entries)?;
    let skip = list(env, vars::SKIP_PATHS, &[','])?
        .into_iter()
        .map(|entry| {
            PathPattern::parse(entry).map_err(|why| ConfigError::entry(vars::SKIP_PATHS.name, entry, why))
        })
        .collect::<Result<_, _>>()?;
    rules.extend([auth, general]);
    let digested_keys = rules.iter().any(|spec| spec.rule.key_by.digests());
    let hasher = key_hasher(env, digested_keys, shared_store)?;
    let exempt = parse_exemptions(env, &hasher, &rules)?;
    let table = TableSpec {
        rules,
        costs,
        skip,
        exempt,
        ipv6_prefix,
        hasher,
    };
    RuleTable::compile(table).map_err(|error| match error {
        TableError::CostAboveCapacity {
            entry,
            rule,
            capacity,
        } => ConfigError::entry(
            vars::COSTS.name,
            cost_entries[entry],
            format!("a request there can fall under rule {rule:?}, which holds at most {capacity}"),
        ),
        // The table is built of routes, the auth and the general rule: no named rules yet.
        TableError::TooManyRules(_) | TableError::DuplicateName(_) | TableError::NoGeneralRule => {
            ConfigError::Conflict(format!("the rule table cannot be built: {error}"))
        }
    })
}

/// The general rule (its variables are every route's defaults too) and the auth rule, whose
/// paths [`auth_paths`] adds.
fn general_and_auth(
    env: &Env,
    shared_store: bool,
    warnings: &mut Vec<String>,
) -> Result<(RuleSpec, RuleSpec), ConfigError> {
    let key_by = key_by_variable(env, vars::KEY_BY, warnings)?;
    // Logins come before any API key, and a key the client chooses is a fresh budget per
    // request: the auth rule stays keyed by address unless told otherwise.
    let auth_key_by = key_by_variable(env, vars::AUTH_KEY_BY, warnings)?;
    let shadow = env.flag(vars::SHADOW_MODE)?;
    let auth_count = env.parse(vars::AUTH_COUNT, "all or failures", |s| match s {
        "all" => Some(Count::All),
        "failures" => Some(Count::Failures),
        _ => None,
    })?;
    let delay = env.parse(vars::DELAY_MAX_MS, DELAY_FORMS, parse_delay)?;
    let auth_delay = env.parse(vars::AUTH_DELAY_MAX_MS, DELAY_FORMS, parse_delay)?;
    let (limits, auth_limits) = general_and_auth_limits(env)?;
    let (fail_mode, auth_fail_mode) = fail_modes(env, shared_store)?;
    let general = Rule {
        key_by,
        shadow,
        fail_mode,
        delay,
        ..Rule::new(0, "general", limits)
    };
    let auth = Rule {
        name: "auth".into(),
        limits: auth_limits,
        count: auth_count,
        key_by: auth_key_by,
        fail_mode: auth_fail_mode,
        delay: auth_delay,
        ..general.clone()
    };
    let general = RuleSpec {
        matching: Matching::Rest,
        rule: general,
    };
    let auth = RuleSpec {
        matching: Matching::Paths(Vec::new()),
        rule: auth,
    };
    Ok((general, auth))
}

/// The general and auth rules' limits: `LIMITS` and `AUTH_LIMITS`, or the algorithm and number
/// variables (`ALGORITHM`, `MAX_TOKENS`, ...; `AUTH_ALGORITHM`, `AUTH_MAX_TOKENS`, ...).
fn general_and_auth_limits(env: &Env) -> Result<(Limits, Limits), ConfigError> {
    let general_limits = limits_variable(env, vars::LIMITS, false)?;
    let algorithm = match (env.get(vars::ALGORITHM), &general_limits) {
        (Some(algorithm), _) => algorithm,
        // The auth rule's algorithm, unless AUTH_ALGORITHM names one: a concurrency limit is
        // no algorithm, so the first that is (or the default).
        (None, Some(limits)) => limits
            .iter()
            .find(|policy| !policy.is_concurrent())
            .map_or_else(|| env.value(vars::ALGORITHM), |policy| policy.name()),
        (None, None) => env.value(vars::ALGORITHM),
    };
    let general_limits = match general_limits {
        Some(limits) => limits,
        None => Limits::one(policy_from_variables(env, vars::ALGORITHM, algorithm, false)?),
    };
    let auth_limits = match limits_variable(env, vars::AUTH_LIMITS, true)? {
        Some(limits) => limits,
        None => {
            let auth_algorithm = env.get(vars::AUTH_ALGORITHM).unwrap_or(algorithm);
            let policy = policy_from_variables(env, vars::AUTH_ALGORITHM, auth_algorithm, true)?;
            Limits::one(policy)
        }
    };
    Ok((general_limits, auth_limits))
}

/// `FAIL_MODE` and `AUTH_FAIL_MODE`, read with Redis only: the memory store never fails, and
/// an unread `FAIL_MODE` is warned about (and still checked).
fn fail_modes(env: &Env, shared_store: bool) -> Result<(FailMode, FailMode), ConfigError> {
    if !shared_store {
        return Ok((FailMode::Open, FailMode::Open));
    }
    let general = env.parse(vars::FAIL_MODE, FailMode::NAMES, FailMode::parse)?;
    let auth = env.parse_or(
        vars::AUTH_FAIL_MODE,
        general.as_str(),
        FailMode::NAMES,
        FailMode::parse,
    )?;
    Ok((general, auth))
}

/// The routes' rules, in order: the rules file's `[[routes]]` when it has them, else
/// `ROUTES`' entries, each over the general rule's defaults.
fn route_specs(
    env: &Env,
    general: &RuleSpec,
    context: &Context,
    warnings: &mut Vec<String>,
) -> Result<Vec<RuleSpec>, ConfigError> {
    let mut rules = Vec::new();
    match env.file_routes() {
        Some(routes) => {
            for route in routes {
                add_route(&mut rules, route, general, context, warnings)?;
            }
        }
        None => {
            for entry in list(env, vars::ROUTES, &[';'])? {
                let route = RouteEntry::parse(entry)?;
                add_route(&mut rules, &route, general, context, warnings)?;
            }
        }
    }
    Ok(rules)
}

/// `route`'s rule after `rules`: refused when there are too many, when an earlier route takes
/// every request it would, or when its name is taken.
fn add_route(
    rules: &mut Vec<RuleSpec>,
    route: &RouteEntry,
    general: &RuleSpec,
    context: &Context,
    warnings: &mut Vec<String>,
) -> Result<(), ConfigError> {
    if rules.len() == MAX_ROUTES {
        return Err(route.at.error(format!("at most {MAX_ROUTES} routes")));
    }
    let rule = route.spec(general, context, warnings)?;
    if let Some((earlier, name)) = earlier_route(rules, &rule.routes()[0]) {
        return Err(route.at.error(format!(
            "it can never match: the earlier entry for {} (rule {name:?}) takes every request it would",
            earlier.pattern
        )));
    }
    let taken = rules.iter().any(|other| other.rule.name == rule.rule.name);
    if taken || ["general", "auth"].contains(&&*rule.rule.name) {
        return Err(route.at.error(format!(
            "the rule name {:?} is taken; give this route its own with name=NAME",
            rule.rule.name
        )));
    }
    rules.push(rule);
    Ok(())
}

/// The first route of `rules` that takes every request `later` would match, and its rule's name.
fn earlier_route<'r>(rules: &'r [RuleSpec], later: &RouteSpec) -> Option<(&'r RouteSpec, &'r str)> {
    rules.iter().find_map(|rule| {
        let earlier = rule.routes().iter().find(|earlier| earlier.takes_all_of(later))?;
        Some((earlier, &*rule.rule.name))
    })
}

/// `AUTH_PATHS` (or its default), the auth rule's routes: none may take every path, and
/// none may be under a route before it.
fn auth_paths(
    env: &Env,
    auth: &mut RuleSpec,
    routes: &[RuleSpec],
    warnings: &mut Vec<String>,
) -> Result<(), ConfigError> {
    let set = env.is_set(vars::AUTH_PATHS);
    let entries = match set {
        true => list(env, vars::AUTH_PATHS, &[','])?,
        false => entries(vars::AUTH_PATHS.default.unwrap_or_default(), &[',']).collect(),
    };
    let mut paths = Vec::new();
    for entry in entries {
        let route = auth_path(entry, warnings)?;
        // Against the routes only: an auth path under an earlier one (`/auth/*` then
        // `/auth/login`) is the same rule, said twice.
        if let Some((earlier, name)) = earlier_route(routes, &route) {
            let why = format!(
                "the ROUTES entry for {} (rule {name:?}) takes every request to {entry}, so the auth rule never sees them",
                earlier.pattern
            );
            if set {
                return Err(ConfigError::entry(vars::AUTH_PATHS.name, entry, why));
            }
            // The default auth paths were not asked for: a route over them may be meant.
            warnings.push(format!(
                "AUTH_PATHS is unset and its default {entry} is shadowed: {why}"
            ));
        }
        paths.push(route);
    }
    auth.matching = Matching::Paths(paths);
    Ok(())
}

/// One `AUTH_PATHS` entry: never every path.
fn auth_path(entry: &str, warnings: &mut Vec<String>) -> Result<RouteSpec, ConfigError> {
    let pattern =
        PathPattern::parse(entry).map_err(|why| ConfigError::invalid(vars::AUTH_PATHS.name, entry, &why))?;
    if pattern.covers(&PathPattern::Subtree("/".into())) {
        return Err(ConfigError::entry(
            vars::AUTH_PATHS.name,
            entry,
            "it matches every path, so every request would spend the login budget and the \
             general rule would never apply; list the login, signup and reset paths",
        ));
    }
    if pattern == PathPattern::Exact("/".into()) {
        warnings
            .push("AUTH_PATHS has \"/\": that is the root path alone (the home page), not every path".into());
    }
    Ok(RouteSpec {
        pattern,
        methods: None,
    })
}

/// The general and auth rules' delays (`DELAY_MAX_MS`, `AUTH_DELAY_MAX_MS`): each one its
/// limits can wait for, and warned about under `SHADOW_MODE`.
fn check_delays(
    env: &Env,
    general: &RuleSpec,
    auth: &RuleSpec,
    warnings: &mut Vec<String>,
) -> Result<(), ConfigError> {
    let (general, auth) = (&general.rule, &auth.rule);
    if general.shadow && (general.delay.is_some() || auth.delay.is_some()) {
        warnings.push(
            "DELAY_MAX_MS or AUTH_DELAY_MAX_MS changes nothing under SHADOW_MODE=true: a shadowed \
             rule refuses nothing, so never waits"
                .into(),
        );
    }
    for (rule, var) in [(auth, vars::AUTH_DELAY_MAX_MS), (general, vars::DELAY_MAX_MS)] {
        delayable(rule)
            .map_err(|why| ConfigError::Conflict(format!("{}={}: {why}", var.name, env.value(var))))?;
    }
    Ok(())
}

/// `COSTS`' entries, `PATTERN=N`.
fn costs(entries: &[&str]) -> Result<Vec<(PathPattern, u64)>, ConfigError> {
    entries
        .iter()
        .map(|entry| {
            let parsed = entry.split_once('=').and_then(|(pattern, cost)| {
                Some((
                    PathPattern::parse(pattern).ok()?,
                    cost.parse::<u64>().ok().filter(|n| *n > 0)?,
                ))
            });
            parsed.ok_or_else(|| {
                ConfigError::entry(
                    vars::COSTS.name,
                    entry,
                    "expected PATTERN=N, e.g. /export=5 (N a whole number >= 1)",
                )
            })
        })
        .collect()
}

/// The entries of a list variable. Whitespace inside an entry is an error: it is nearly always
/// a wrong separator (`/login /signup`), and silently protecting nothing is the worst outcome.
fn list<'a>(env: &'a Env, var: Var, separators: &'a [char]) -> Result<Vec<&'a str>, ConfigError> {
    let entries: Vec<&str> = entries(env.get(var).unwrap_or(""), separators).collect();
    let Some(entry) = entries.iter().find(|entry| entry.contains(char::is_whitespace)) else {
        return Ok(entries);
    };
    // An `EXEMPT` `SOURCE=VALUE` or `key:VALUE` holds an API key: never shown.
    let shown = exempt_shown(entry);
    Err(ConfigError::entry(
        var.name,
        &shown,
        format!(
            "it contains whitespace; separate entries with {:?}",
            separators[0]
        ),
    ))
}

/// `LIMITS` or `AUTH_LIMITS` (`auth`): the rule's limits written as a route's are
/// (`token_bucket:100:10`, or several joined by `+`), instead of its algorithm and number
/// variables; setting both ways is an error naming both.
fn limits_variable(env: &Env, var: Var, auth: bool) -> Result<Option<Limits>, ConfigError> {
    let Some(spec) = env.get(var) else {
        return Ok(None);
    };
    let limits = parse_limits(spec).map_err(|why| ConfigError::invalid(var.name, spec, &why))?;
    let algorithm = if auth {
        vars::AUTH_ALGORITHM
    } else {
        vars::ALGORITHM
    };
    let mut older = vec![algorithm];
    for name in Policy::NAMES {
        for parameter in Policy::parameters(name).into_iter().flatten() {
            let var = if auth { parameter.auth } else { parameter.general };
            if !older.contains(&var) {
                older.push(var);
            }
        }
    }
    if let Some(both) = older.into_iter().find(|older| env.is_set(*older)) {
        return Err(ConfigError::Conflict(format!(
            "{} and {} both set the {} rule's limit: set one (LIMITS-style lists are the newer way)",
            var.name,
            both.name,
            if auth { "auth" } else { "general" }
        )));
    }
    Ok(Some(limits))
}

/// The general (`ALGORITHM`, `MAX_TOKENS`, ...) or auth (`AUTH_ALGORITHM`, `AUTH_MAX_TOKENS`,
/// ...) rule's policy, from the variables the chosen algorithm reads.
fn policy_from_variables(
    env: &Env,
    algorithm_var: Var,
    algorithm: &str,
    auth: bool,
) -> Result<Policy, ConfigError> {
    let unknown = || ConfigError::invalid(algorithm_var.name, algorithm, &algorithm_names());
    if algorithm == Concurrent::NAME {
        return Err(ConfigError::invalid(
            algorithm_var.name,
            algorithm,
            "an algorithm; concurrent is a limit of a list: LIMITS=concurrent:N (or AUTH_LIMITS, \
             ROUTES, the rules file), alone or joined to others by +",
        ));
    }
    let parameters = Policy::parameters(algorithm).ok_or_else(unknown)?;
    let [first, second] = parameters.map(|p| {
        let var = if auth { p.auth } else { p.general };
        (var.name, env.value(var))
    });
    match Policy::parse(algorithm, first.1, second.1).ok_or_else(unknown)? {
        Ok(policy) => Ok(policy),
        Err(ParameterError::Invalid { index, expected }) => {
            let (var, value) = [first, second][index];
            Err(ConfigError::invalid(var, value, &expected))
        }
        Err(ParameterError::Combination(why)) => Err(ConfigError::Conflict(format!(
            "{}={} with {}={}: {why}",
            first.0, first.1, second.0, second.1
        ))),
    }
}

/// `KEY_BY` or `AUTH_KEY_BY`, checked by [`key_problem`].
fn key_by_variable(env: &Env, var: Var, warnings: &mut Vec<String>) -> Result<KeyBy, ConfigError> {
    let value = env.value(var);
    let key_by = KeyBy::parse(value)
        .map_err(|why| ConfigError::invalid(var.name, value, &format!("{KEY_BY_FORMS}; {why}")))?;
    match key_problem(&key_by) {
        None => {}
        Some(KeyProblem::Certain(why)) => {
            return Err(ConfigError::invalid(
                var.name,
                value,
                &format!("a header that identifies a client ({why})"),
            ));
        }
        Some(KeyProblem::Suspicious(why)) => warnings.push(format!("{}={key_by}: {why}", var.name)),
    }
    Ok(key_by)
}

/// The keyed hash for keys digested from requests. Replicas sharing Redis must agree on it, so
/// there it comes from `KEY_HASH_SECRET`; alone, a random key per process does (or the secret,
/// if given).
fn key_hasher(env: &Env, digested_keys: bool, shared_store: bool) -> Result<KeyHasher, ConfigError> {
    match env.get(vars::KEY_HASH_SECRET) {
        Some(secret) if secret.len() < MIN_SECRET_LEN => Err(ConfigError::InvalidSecret {
            var: vars::KEY_HASH_SECRET.name,
            expected: format!("at least {MIN_SECRET_LEN} characters, e.g. from `openssl rand -hex 32`"),
        }),
        Some(secret) => Ok(KeyHasher::from_secret(secret)),
        None if digested_keys && shared_store => Err(ConfigError::Missing {
            var: vars::KEY_HASH_SECRET.name,
            expected: "with Redis and keys read from requests (KEY_BY, AUTH_KEY_BY or a route's key= \
                       naming header:, cookie:, query:, host or path), every replica must digest their \
                       values alike: set the same secret of 16+ characters on each, e.g. from \
                       `openssl rand -hex 32`",
        }),
        // A reload's: the running table's random key, so every client keeps its key.
        None if let Some(hasher) = env.inherited_hasher() => Ok(hasher.clone()),
        None => KeyHasher::random().map_err(|error| {
            ConfigError::Conflict(format!(
                "cannot read the operating system's random source for KEY_HASH_SECRET's default ({error}); \
                 set KEY_HASH_SECRET"
            ))
        }),
    }
}

/// An `EXEMPT` entry as errors show it: a key value (`SOURCE=VALUE`, `key:VALUE`) never, its
/// source alone (`query:tenant=***`).
fn exempt_shown(entry: &str) -> std::borrow::Cow<'_, str> {
    if entry.starts_with("key:") {
        return "key:***".into();
    }
    match entry.split_once('=') {
        Some((source, _)) => format!("{source}=***").into(),
        None => entry.into(),
    }
}

/// What an `EXEMPT` key entry is written as, for its errors.
const EXEMPT_KEY_FORMS: &str =
    "header:NAME=VALUE, cookie:NAME=VALUE, query:NAME=VALUE, host=VALUE or path=VALUE";

/// `EXEMPT`: CIDRs or addresses, and `SOURCE=VALUE` raw values of one key source
/// (`query:tenant=acme`, `header:X-API-Key=...`, `host=...`), stored only as that source's
/// digest of the value and matched only by rules keyed by that source alone (besides the
/// address): `?tenant=acme` exempted is not `Host: acme`. `key:VALUE`, the spelling before
/// sources were named, is read as the one source rules are keyed by alone, and refused when
/// there are several.
fn parse_exemptions(env: &Env, hasher: &KeyHasher, rules: &[RuleSpec]) -> Result<Exemptions, ConfigError> {
    let mut single: Vec<&Source> = Vec::new();
    for source in rules.iter().filter_map(|spec| spec.rule.key_by.single()) {
        if !single.contains(&source) {
            single.push(source);
        }
    }
    let mut exempt = Exemptions::default();
    for entry in list(env, vars::EXEMPT, &[','])? {
        let (source, value) = if let Some(value) = entry.strip_prefix("key:") {
            (unnamed_source(&single)?, value)
        } else if let Some((spec, value)) = entry.split_once('=') {
            (named_source(entry, spec, &single)?, value)
        } else {
            exempt.networks.push(exempt_network(entry)?);
            continue;
        };
        // As the source reads a request's: a host lower case, without a default port.
        let value = match source {
            Source::Host => host_value(value.as_bytes()).map_or_else(Vec::new, |host| host.into_owned()),
            _ => value.as_bytes().to_vec(),
        };
        if value.is_empty() {
            return Err(ConfigError::entry(
                vars::EXEMPT.name,
                &exempt_shown(entry),
                "names no value (an empty value is never a key: such a request is keyed by its address)",
            ));
        }
        let digest = hasher.digest_of(std::slice::from_ref(&source), &[&value]);
        if !exempt.keys.contains(&(source.clone(), digest)) {
            exempt.keys.push((source, digest));
        }
    }
    Ok(exempt)
}

/// The source of a `key:VALUE` entry: the one source rules are keyed by alone (`single`).
fn unnamed_source(single: &[&Source]) -> Result<Source, ConfigError> {
    match single {
        [] => Err(ConfigError::entry(
            vars::EXEMPT.name,
            "key:***",
            format!(
                "key: entries need a rule keyed by one source besides ip (KEY_BY=header:NAME, \
                 cookie:NAME, query:NAME, host or path, or a route's key=); an exemption \
                 names its source: {EXEMPT_KEY_FORMS}"
            ),
        )),
        [source] => Ok((*source).clone()),
        several => {
            let spellings: Vec<String> = several.iter().map(|source| exempt_spelling(source)).collect();
            Err(ConfigError::entry(
                vars::EXEMPT.name,
                "key:***",
                format!(
                    "key:VALUE is ambiguous: rules are keyed by {} (each alone or with ip), and \
                     a value exempted in one source must not be in another (a tenant's name \
                     is anyone's Host); name the source: {}",
                    joined(several, " or "),
                    spellings.join(" or ")
                ),
            ))
        }
    }
}

/// The source `spec` of a `SOURCE=VALUE` entry: one some rule is keyed by alone (`single`).
fn named_source(entry: &str, spec: &str, single: &[&Source]) -> Result<Source, ConfigError> {
    let shown = exempt_shown(entry);
    let source = match KeyBy::parse(spec) {
        Ok(by) if !by.has_ip() && by.single().is_some() => by.single().cloned(),
        _ => None,
    }
    .ok_or_else(|| {
        ConfigError::entry(
            vars::EXEMPT.name,
            &shown,
            format!("{spec:?} is not one key source: expected {EXEMPT_KEY_FORMS}"),
        )
    })?;
    if single.contains(&&source) {
        return Ok(source);
    }
    Err(ConfigError::entry(
        vars::EXEMPT.name,
        &shown,
        format!(
            "no rule is keyed by {source} alone (besides ip), so it would exempt nothing: \
             the rules keyed by one source are keyed by {}",
            match single {
                [] => "none".to_owned(),
                single => joined(single, ", "),
            }
        ),
    ))
}

/// An `EXEMPT` network: a CIDR or an address, never every address.
fn exempt_network(entry: &str) -> Result<IpNet, ConfigError> {
    let network: IpNet = parse_network(entry).ok_or_else(|| {
        ConfigError::entry(
            vars::EXEMPT.name,
            entry,
            format!("expected a CIDR, an address, or a key's value: {EXEMPT_KEY_FORMS}"),
        )
    })?;
    if network.prefix_len() == 0 {
        return Err(ConfigError::entry(
            vars::EXEMPT.name,
            entry,
            "it exempts every client of that address family, so none would be limited; \
             SHADOW_MODE=true counts without refusing, if that is what is wanted",
        ));
    }
    Ok(network)
}

/// `sources` in words, joined by `separator`.
fn joined(sources: &[&Source], separator: &str) -> String {
    let words: Vec<String> = sources.iter().map(ToString::to_string).collect();
    words.join(separator)
}

/// How an `EXEMPT` entry names a value of `source`: `query:tenant=VALUE`, `host=VALUE`.
fn exempt_spelling(source: &Source) -> String {
    format!("{source}=VALUE")
}
