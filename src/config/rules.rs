//! The rule table parser: `ALGORITHM`, `AUTH_ALGORITHM` and their numbers, `ROUTES`,
//! `AUTH_PATHS`, `KEY_BY`, `AUTH_KEY_BY`, `IPV6_PREFIX`, `KEY_HASH_SECRET`, `COSTS`, `EXEMPT`, `SKIP_PATHS`,
//! `SHADOW_MODE`, `AUTH_COUNT`, `DELAY_MAX_MS`, `AUTH_DELAY_MAX_MS`, and with Redis `FAIL_MODE`
//! and `AUTH_FAIL_MODE`, compiled into one [`RuleTable`].
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
//! any case of its method or under a method-override header, see `limit::rules`), `shadow`,
//! `count=failures`,
//! `fail=open|closed|local` (default `FAIL_MODE`: what to do when Redis cannot decide), and
//! `delay=MS` (default `DELAY_MAX_MS`: how long a refused request may wait for its budget
//! instead, 0 for not at all). No entry may contain whitespace: `AUTH_PATHS="/login /signup"`
//! is an error, not one odd path.

use crate::variables::{self as vars, Var};
use ipnet::IpNet;
use std::time::Duration;

use super::env::{Env, entries};
use super::{ConfigError, parse_network};
use crate::limit::FailMode;
use crate::limit::algorithm::{Algorithm, Concurrent, Limits, ParameterError, Policy, parse_limits};
use crate::limit::key::{KEY_BY_FORMS, KeyBy, KeyHasher, Source, host_value};
use crate::limit::pattern::PathPattern;
use crate::limit::rules::{Count, Exemptions, Route, Rule, RuleTable, TableError};

/// Most `ROUTES` entries: rule ids are 16 bits, and a table this long is a mistake anyway.
const MAX_ROUTES: usize = 1_000;

/// A `KEY_HASH_SECRET` shorter than this is refused: it must be hard to guess.
const MIN_SECRET_LEN: usize = 16;

/// Most milliseconds a request may be delayed (`DELAY_MAX_MS`, `AUTH_DELAY_MAX_MS`, `delay=`): a
/// minute. A longer wait outlives most clients' own timeouts, and holds a connection all along.
const MAX_DELAY_MS: u64 = 60_000;

/// What a delay is written as, for its errors.
const DELAY_FORMS: &str = "a whole number of milliseconds from 0 (refused at once) to 60000";

/// Build the rule table. `shared_store`: Redis is in use, so header digests must agree across
/// replicas and need `KEY_HASH_SECRET`. What is suspicious but may be meant goes to `warnings`.
pub(crate) fn parse(
    env: &Env,
    shared_store: bool,
    warnings: &mut Vec<String>,
) -> Result<RuleTable, ConfigError> {
    let key_by = key_by_variable(env, vars::KEY_BY, warnings)?;
    // Logins come before any API key, and a key the client chooses is a fresh budget per
    // request: the auth rule stays keyed by address unless told otherwise.
    let auth_key_by = key_by_variable(env, vars::AUTH_KEY_BY, warnings)?;
    let ipv6_prefix = env.parse(vars::IPV6_PREFIX, "a prefix length from 1 to 128", |s| {
        s.parse::<u8>().ok().filter(|p| (1..=128).contains(p))
    })?;
    let shadow = env.flag(vars::SHADOW_MODE)?;
    let auth_count = env.parse(vars::AUTH_COUNT, "all or failures", |s| match s {
        "all" => Some(Count::All),
        "failures" => Some(Count::Failures),
        _ => None,
    })?;

    let delay = env.parse(vars::DELAY_MAX_MS, DELAY_FORMS, parse_delay)?;
    let auth_delay = env.parse(vars::AUTH_DELAY_MAX_MS, DELAY_FORMS, parse_delay)?;

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
            Limits::one(policy_from_variables(
                env,
                vars::AUTH_ALGORITHM,
                auth_algorithm,
                true,
            )?)
        }
    };
    // Read with Redis only: the memory store never fails, and an unread FAIL_MODE is warned
    // about (and still checked).
    let (fail_mode, auth_fail_mode) = if shared_store {
        let general = env.parse(vars::FAIL_MODE, FailMode::NAMES, FailMode::parse)?;
        let auth = env.parse_or(
            vars::AUTH_FAIL_MODE,
            general.as_str(),
            FailMode::NAMES,
            FailMode::parse,
        )?;
        (general, auth)
    } else {
        (FailMode::Open, FailMode::Open)
    };
    let defaults = Rule {
        id: 0,
        name: "".into(),
        limits: general_limits,
        key_by,
        cost: 1,
        shadow,
        count: Count::All,
        fail_mode,
        delay,
    };

    let mut rules: Vec<Rule> = Vec::new();
    let mut routes: Vec<Route> = Vec::new();
    for entry in list(env, vars::ROUTES, &[';'])? {
        if rules.len() == MAX_ROUTES {
            return Err(ConfigError::entry(
                vars::ROUTES.name,
                entry,
                format!("at most {MAX_ROUTES} routes"),
            ));
        }
        let (route, mut rule) = parse_route(entry, &defaults, shared_store, warnings)?;
        if let Some(earlier) = routes
            .iter()
            .find(|earlier: &&Route| takes_all_of(earlier, &route))
        {
            return Err(ConfigError::entry(
                vars::ROUTES.name,
                entry,
                format!(
                    "it can never match: the earlier entry for {} (rule {:?}) takes every request it would",
                    earlier.pattern, rules[earlier.rule].name
                ),
            ));
        }
        if rules.iter().any(|other: &Rule| other.name == rule.name)
            || ["general", "auth"].contains(&&*rule.name)
        {
            return Err(ConfigError::entry(
                vars::ROUTES.name,
                entry,
                format!(
                    "the rule name {:?} is taken; give this route its own with name=NAME",
                    rule.name
                ),
            ));
        }
        rule.id = rules.len() as u16;
        routes.push(Route {
            rule: rules.len(),
            ..route
        });
        rules.push(rule);
    }
    let auth_index = rules.len();
    let auth_paths_set = env.is_set(vars::AUTH_PATHS);
    let auth_paths = match auth_paths_set {
        true => list(env, vars::AUTH_PATHS, &[','])?,
        false => entries(vars::AUTH_PATHS.default.unwrap_or_default(), &[',']).collect(),
    };
    for entry in auth_paths {
        let pattern = PathPattern::parse(entry)
            .map_err(|why| ConfigError::invalid(vars::AUTH_PATHS.name, entry, &why))?;
        let route = Route {
            pattern,
            methods: None,
            rule: auth_index,
        };
        if route.pattern.covers(&PathPattern::Subtree("/".into())) {
            return Err(ConfigError::entry(
                vars::AUTH_PATHS.name,
                entry,
                "it matches every path, so every request would spend the login budget and the \
                 general rule would never apply; list the login, signup and reset paths",
            ));
        }
        if route.pattern == PathPattern::Exact("/".into()) {
            warnings.push(
                "AUTH_PATHS has \"/\": that is the root path alone (the home page), not every path".into(),
            );
        }
        // Against the ROUTES entries only: an auth path under an earlier one (`/auth/*` then
        // `/auth/login`) is the same rule, said twice.
        let routes_entries = routes.iter().filter(|earlier| earlier.rule < auth_index);
        if let Some(earlier) = routes_entries
            .into_iter()
            .find(|earlier| takes_all_of(earlier, &route))
        {
            let why = format!(
                "the ROUTES entry for {} (rule {:?}) takes every request to {entry}, so the auth rule never sees them",
                earlier.pattern, rules[earlier.rule].name
            );
            if auth_paths_set {
                return Err(ConfigError::entry(vars::AUTH_PATHS.name, entry, why));
            }
            // The default auth paths were not asked for: a route over them may be meant.
            warnings.push(format!(
                "AUTH_PATHS is unset and its default {entry} is shadowed: {why}"
            ));
        }
        routes.push(route);
    }
    rules.push(Rule {
        id: auth_index as u16,
        name: "auth".into(),
        limits: auth_limits,
        count: auth_count,
        key_by: auth_key_by,
        fail_mode: auth_fail_mode,
        delay: auth_delay,
        ..defaults.clone()
    });
    rules.push(Rule {
        id: auth_index as u16 + 1,
        name: "general".into(),
        ..defaults
    });
    if shadow && (delay.is_some() || auth_delay.is_some()) {
        warnings.push(
            "DELAY_MAX_MS or AUTH_DELAY_MAX_MS changes nothing under SHADOW_MODE=true: a shadowed \
             rule refuses nothing, so never waits"
                .into(),
        );
    }
    for (rule, var) in rules[auth_index..]
        .iter()
        .zip([vars::AUTH_DELAY_MAX_MS, vars::DELAY_MAX_MS])
    {
        delayable(rule)
            .map_err(|why| ConfigError::Conflict(format!("{}={}: {why}", var.name, env.value(var))))?;
    }

    let mut costs = Vec::new();
    let cost_entries = list(env, vars::COSTS, &[';', ','])?;
    for entry in &cost_entries {
        let parsed = entry.split_once('=').and_then(|(pattern, cost)| {
            Some((
                PathPattern::parse(pattern).ok()?,
                cost.parse::<u64>().ok().filter(|n| *n > 0)?,
            ))
        });
        costs.push(parsed.ok_or_else(|| {
            ConfigError::entry(
                vars::COSTS.name,
                entry,
                "expected PATTERN=N, e.g. /export=5 (N a whole number >= 1)",
            )
        })?);
    }
    let skip = list(env, vars::SKIP_PATHS, &[','])?
        .into_iter()
        .map(|entry| {
            PathPattern::parse(entry).map_err(|why| ConfigError::entry(vars::SKIP_PATHS.name, entry, why))
        })
        .collect::<Result<_, _>>()?;

    let digested_keys = rules.iter().any(|rule| rule.key_by.digests());
    let hasher = key_hasher(env, digested_keys, shared_store)?;
    let exempt = parse_exemptions(env, &hasher, &rules)?;

    RuleTable::new(rules, routes, costs, skip, exempt, ipv6_prefix, hasher).map_err(|error| match error {
        TableError::CostAboveCapacity {
            entry,
            rule,
            capacity,
        } => ConfigError::entry(
            vars::COSTS.name,
            cost_entries[entry],
            format!("a request there can fall under rule {rule:?}, which holds at most {capacity}"),
        ),
        // `new` adds no named rules; these come from `with_named` only.
        TableError::TooManyRules(_) | TableError::DuplicateName(_) => {
            ConfigError::Conflict(format!("the rule table cannot be built: {error}"))
        }
    })
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
            older.push(if auth { parameter.auth } else { parameter.general });
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
    let unknown = || ConfigError::invalid(algorithm_var.name, algorithm, &Policy::algorithm_names());
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

/// True when every request `later` matches is matched by `earlier`, which comes first.
fn takes_all_of(earlier: &Route, later: &Route) -> bool {
    let methods = match (&earlier.methods, &later.methods) {
        (None, _) => true,
        (Some(_), None) => false,
        (Some(earlier), Some(later)) => later.iter().all(|method| earlier.contains(method)),
    };
    methods && earlier.pattern.covers(&later.pattern)
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

/// What is wrong with keying budgets by some source.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum KeyProblem {
    /// It is never a client's identity: the gateway rewrites or drops it, or every request
    /// carries a new one.
    Certain(&'static str),
    /// Nothing checks it: a client that changes it gets a fresh budget, unless the backend
    /// refuses values it does not know.
    Suspicious(&'static str),
}

/// A key is only as good as the backend's check of its value: a forged API key gets a fresh
/// budget and a 401. Some headers carry no credential, so a forged one gets a fresh budget and
/// a 200; `host` or `path` alone are not a client at all, but a budget every client shares. The
/// first certain problem of any source, else the first suspicious one.
fn key_problem(key_by: &KeyBy) -> Option<KeyProblem> {
    let problems = key_by.headers().filter_map(|name| header_problem(name.as_str()));
    let alone = match (key_by.has_ip(), key_by.sources()) {
        (false, [Source::Host]) => Some(KeyProblem::Suspicious(
            "every client shares one budget per host, and any client sends the Host (HTTP/2 \
             :authority) it likes: a new one is a fresh budget unless the backend refuses hosts it \
             does not serve; ip+host gives each client a budget per host",
        )),
        (false, [Source::Path]) => Some(KeyProblem::Suspicious(
            "every client shares one budget per path, and a client that asks for another path \
             gets a fresh one; ip+path gives each client a budget per path",
        )),
        _ => None,
    };
    let mut problems = problems.chain(alone);
    let first = problems.next()?;
    match first {
        KeyProblem::Certain(_) => Some(first),
        KeyProblem::Suspicious(_) => Some(
            problems
                .find(|problem| matches!(problem, KeyProblem::Certain(_)))
                .unwrap_or(first),
        ),
    }
}

/// What is wrong with keying budgets by the header `name`, if anything.
fn header_problem(name: &str) -> Option<KeyProblem> {
    let certain = match name {
        "x-forwarded-for" | "x-forwarded-host" | "x-forwarded-proto" | "x-real-ip" | "forwarded" => Some(
            "the gateway rewrites this one for the backend, and any client sends what it likes in it; \
             for one budget per client address use ip, with TRUSTED_PROXIES for the proxies in front",
        ),
        "connection"
        | "keep-alive"
        | "proxy-connection"
        | "te"
        | "trailer"
        | "transfer-encoding"
        | "upgrade"
        | "proxy-authorization"
        | "proxy-authenticate" => Some(
            "this hop-by-hop header is dropped before the backend, which never checks it; \
             any client sends a new value for a fresh budget",
        ),
        "host" => Some(
            "HTTP/2 requests name their host in :authority, not Host, and any client sends the \
             host it likes; the host source reads both (ip+host for a budget per client and host)",
        ),
        "cookie" => Some(
            "a Cookie line holds every cookie, and HTTP/2 splits it into several; \
             key by the one that names the client, cookie:NAME",
        ),
        "x-request-id" | "content-length" | "content-type" | "date" | "range" => {
            Some("it describes the request, not the client: every request may carry a new one")
        }
        _ => None,
    };
    if let Some(why) = certain {
        return Some(KeyProblem::Certain(why));
    }
    let credential_free = [
        "user-agent",
        "referer",
        "origin",
        "accept",
        "accept-language",
        "accept-encoding",
        "cache-control",
        "pragma",
        "dnt",
    ];
    credential_free.contains(&name).then_some(KeyProblem::Suspicious(
        "it carries no credential, so a client that changes it gets a fresh budget; key by one \
         the backend checks (an API key, Authorization)",
    ))
}

/// One `ROUTES` entry: its route (rule index filled in by the caller) and its rule.
fn parse_route(
    entry: &str,
    defaults: &Rule,
    shared_store: bool,
    warnings: &mut Vec<String>,
) -> Result<(Route, Rule), ConfigError> {
    let bad = |problem: String| ConfigError::entry(vars::ROUTES.name, entry, problem);
    let (pattern, rest) = entry
        .split_once('=')
        .ok_or_else(|| bad("expected PATTERN=ALGORITHM:A:B, e.g. /api/export/*=token_bucket:5:0.1".into()))?;
    let pattern = PathPattern::parse(pattern).map_err(|why| bad(format!("pattern: {why}")))?;
    let mut options = rest.split(',');
    let spec = options.next().unwrap_or_default();
    let limits = parse_limits(spec).map_err(bad)?;
    let mut rule = Rule {
        name: pattern.to_string().into(),
        limits,
        ..defaults.clone()
    };
    let mut methods = None;
    for option in options {
        match option.split_once('=') {
            Some(("name", name)) if is_rule_name(name) => rule.name = name.into(),
            Some(("name", name)) => {
                return Err(bad(format!(
                    "name {name:?}: expected 1 to 64 of a-z, 0-9, '_' and '-'"
                )));
            }
            Some(("key", key)) => {
                rule.key_by = KeyBy::parse(key)
                    .map_err(|why| bad(format!("key={key}: {why}; expected {KEY_BY_FORMS}")))?;
                match key_problem(&rule.key_by) {
                    None => {}
                    Some(KeyProblem::Certain(why)) => return Err(bad(format!("key {key:?}: {why}"))),
                    Some(KeyProblem::Suspicious(why)) => {
                        warnings.push(format!("ROUTES entry for {pattern}: key={key}: {why}"))
                    }
                }
            }
            Some(("cost", cost)) => {
                rule.cost =
                    cost.parse::<u64>().ok().filter(|n| *n > 0).ok_or_else(|| {
                        bad(format!("cost {cost:?}: expected a whole number of at least 1"))
                    })?;
            }
            Some(("method", list)) => {
                let parsed: Option<Vec<http::Method>> = list
                    .split('|')
                    .map(|method| http::Method::from_bytes(method.to_ascii_uppercase().as_bytes()).ok())
                    .collect();
                let mut parsed =
                    parsed.ok_or_else(|| bad(format!("method {list:?}: expected e.g. GET|HEAD")))?;
                // Flask, Django, Rails and Express run a GET route's handler for HEAD (nginx's
                // `limit_except GET` covers HEAD too): a HEAD must not walk around it.
                if parsed.contains(&http::Method::GET) && !parsed.contains(&http::Method::HEAD) {
                    parsed.push(http::Method::HEAD);
                }
                methods = Some(parsed);
            }
            Some(("fail", mode)) => {
                rule.fail_mode = FailMode::parse(mode)
                    .ok_or_else(|| bad(format!("fail {mode:?}: expected {}", FailMode::NAMES)))?;
                if !shared_store {
                    warnings.push(format!(
                        "ROUTES entry for {pattern}: fail={mode} changes nothing: the store is in memory, \
                         and fail modes apply when Redis cannot decide"
                    ));
                }
            }
            Some(("delay", ms)) => {
                rule.delay =
                    parse_delay(ms).ok_or_else(|| bad(format!("delay {ms:?}: expected {DELAY_FORMS}")))?;
            }
            Some(("count", "failures")) => rule.count = Count::Failures,
            Some(("count", "all")) => rule.count = Count::All,
            None if option == "shadow" => rule.shadow = true,
            _ => {
                return Err(bad(format!(
                    "unknown option {option:?}; expected name=, key=, cost=, method=, count=failures, fail=, delay= or shadow"
                )));
            }
        }
    }
    if rule.cost > rule.limits.capacity() {
        return Err(bad(format!(
            "cost {} is above the rule's capacity of {}: no request could ever pass",
            rule.cost,
            rule.limits.capacity()
        )));
    }
    if rule.shadow && rule.delay.is_some() && options_delay(rest) {
        warnings.push(format!(
            "ROUTES entry for {pattern}: delay= changes nothing: the route is shadowed, and a \
             shadowed rule refuses nothing, so never waits"
        ));
    }
    delayable(&rule).map_err(|why| match options_delay(rest) {
        true => bad(why),
        false => bad(format!(
            "{why} (the route inherits DELAY_MAX_MS; delay=0 turns it off here)"
        )),
    })?;
    let route = Route {
        pattern,
        methods,
        rule: 0,
    };
    Ok((route, rule))
}

/// A delay as written (`DELAY_MAX_MS`, `delay=`): `None` when it is not one of
/// [`DELAY_FORMS`], `Some(None)` for 0 (no delay).
fn parse_delay(ms: &str) -> Option<Option<Duration>> {
    ms.parse::<u64>()
        .ok()
        .filter(|ms| *ms <= MAX_DELAY_MS)
        .map(|ms| (ms > 0).then(|| Duration::from_millis(ms)))
}

/// Whether the options of a `ROUTES` entry (after its pattern's `=`) set `delay=` themselves.
fn options_delay(options: &str) -> bool {
    options
        .split(',')
        .skip(1)
        .any(|option| option.starts_with("delay="))
}

/// The one check of a rule's delay against its limits, made for every rule (general, auth,
/// each route): a delayed request sleeps for its denial's retry time, so only limits whose
/// retry times are exact can be waited for ([`Policy::exact_retry`]): every limit of the rule
/// (the rule's retry time is the latest of its refusing limits'). The error says why; the
/// caller names what set the delay.
fn delayable(rule: &Rule) -> Result<(), String> {
    let inexact = rule.limits.iter().find(|policy| !policy.exact_retry());
    match (rule.delay, inexact) {
        (Some(delay), Some(policy)) => Err(format!(
            "rule {:?} would delay requests up to {} ms, but its limit ({policy}) has no exact retry \
             time to wait for: a request could only poll; leave the delay off for this rule",
            rule.name,
            delay.as_millis(),
        )),
        _ => Ok(()),
    }
}

pub(crate) fn is_rule_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-')
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
fn parse_exemptions(env: &Env, hasher: &KeyHasher, rules: &[Rule]) -> Result<Exemptions, ConfigError> {
    let mut single: Vec<&Source> = Vec::new();
    for source in rules.iter().filter_map(|rule| rule.key_by.single()) {
        if !single.contains(&source) {
            single.push(source);
        }
    }
    let mut exempt = Exemptions::default();
    for entry in list(env, vars::EXEMPT, &[','])? {
        let (source, value) = if let Some(value) = entry.strip_prefix("key:") {
            let source = match &single[..] {
                [] => {
                    return Err(ConfigError::entry(
                        vars::EXEMPT.name,
                        "key:***",
                        format!(
                            "key: entries need a rule keyed by one source besides ip (KEY_BY=header:NAME, \
                             cookie:NAME, query:NAME, host or path, or a route's key=); an exemption \
                             names its source: {EXEMPT_KEY_FORMS}"
                        ),
                    ));
                }
                [source] => (*source).clone(),
                several => {
                    let spellings: Vec<String> =
                        several.iter().map(|source| exempt_spelling(source)).collect();
                    return Err(ConfigError::entry(
                        vars::EXEMPT.name,
                        "key:***",
                        format!(
                            "key:VALUE is ambiguous: rules are keyed by {} (each alone or with ip), and \
                             a value exempted in one source must not be in another (a tenant's name \
                             is anyone's Host); name the source: {}",
                            several
                                .iter()
                                .map(ToString::to_string)
                                .collect::<Vec<_>>()
                                .join(" or "),
                            spellings.join(" or ")
                        ),
                    ));
                }
            };
            (source, value)
        } else if let Some((spec, value)) = entry.split_once('=') {
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
            if !single.contains(&&source) {
                return Err(ConfigError::entry(
                    vars::EXEMPT.name,
                    &shown,
                    format!(
                        "no rule is keyed by {source} alone (besides ip), so it would exempt nothing: \
                         the rules keyed by one source are keyed by {}",
                        match &single[..] {
                            [] => "none".to_owned(),
                            single => single
                                .iter()
                                .map(ToString::to_string)
                                .collect::<Vec<_>>()
                                .join(", "),
                        }
                    ),
                ));
            }
            (source, value)
        } else {
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
            exempt.networks.push(network);
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

/// How an `EXEMPT` entry names a value of `source`: `query:tenant=VALUE`, `host=VALUE`.
fn exempt_spelling(source: &Source) -> String {
    format!("{source}=VALUE")
}
