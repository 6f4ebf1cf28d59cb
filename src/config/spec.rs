//! A route's [`RuleSpec`] from what was written: the one parser of a route's attributes,
//! whether a `ROUTES` entry (`/api/*=token_bucket:20:10,name=api,cost=2`) or a rules file's
//! `[[routes]]` table (`name = "api"`, `cost = 2`) wrote them.
//!
//! Both sources produce a [`RouteEntry`]: its pattern and limits parsed, each other attribute
//! as its name and its value's text, and where it was written. [`RouteEntry::spec`] applies
//! the attributes, each by its one parser in [`ATTRIBUTES`], over the general rule's
//! defaults, then checks the rule as a whole. A new attribute is one line in [`ATTRIBUTES`]
//! and its parser here (the rules file learns its key from the same table).

use std::time::Duration;

use super::ConfigError;
use crate::algorithms::{Limits, parse_limits};
use crate::rules::key::{KEY_BY_FORMS, KeyBy, Source};
use crate::rules::pattern::PathPattern;
use crate::rules::{Count, FailMode, Matching, RouteSpec, Rule, RuleSpec};
use crate::variables as vars;

/// Most milliseconds a request may be delayed (`DELAY_MAX_MS`, `AUTH_DELAY_MAX_MS`, `delay=`): a
/// minute. A longer wait outlives most clients' own timeouts, and holds a connection all along.
const MAX_DELAY_MS: u64 = 60_000;

/// What a delay is written as, for its errors.
pub(super) const DELAY_FORMS: &str = "a whole number of milliseconds from 0 (refused at once) to 60000";

/// A route as written, before the general rule's defaults are known.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct RouteEntry {
    /// Which paths.
    pub(crate) pattern: PathPattern,
    /// Its limits.
    pub(crate) limits: Limits,
    /// Every other attribute, in the order written: its name (one of [`ATTRIBUTES`]) and its
    /// value's text (`shadow` is `"true"` or `"false"`, methods are joined by `|`).
    pub(crate) attributes: Vec<(&'static str, String)>,
    /// Where it was written.
    pub(crate) at: Written,
}

/// Where a route was written: what its errors and warnings name.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Written {
    /// A `ROUTES` entry, as written.
    Entry(String),
    /// A rules file's `[[routes]]` table: the file, the line it starts on, `routes[N]`.
    File {
        /// `RULES_FILE`.
        path: String,
        /// 1-based.
        line: usize,
        /// `routes[N]`.
        setting: String,
    },
}

impl Written {
    /// `problem`, about the route written here.
    pub(crate) fn error(&self, problem: impl Into<String>) -> ConfigError {
        match self {
            Written::Entry(entry) => ConfigError::entry(vars::ROUTES.name, entry, problem),
            Written::File { path, line, setting } => ConfigError::File {
                var: vars::RULES_FILE.name,
                location: format!("{path}:{line}: {setting}"),
                problem: problem.into(),
            },
        }
    }

    /// A warning about the route of `pattern` written here.
    fn warning(&self, pattern: &PathPattern, words: &str) -> String {
        match self {
            Written::Entry(_) => format!("ROUTES entry for {pattern}: {words}"),
            Written::File { path, line, setting } => {
                format!("RULES_FILE {path}:{line}: {setting} ({pattern}): {words}")
            }
        }
    }
}

/// How a rules file writes an attribute's value in TOML.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Toml {
    /// A string.
    Text,
    /// A whole number of at least 0.
    Number,
    /// A whole number of at least 1.
    Count,
    /// `true` or `false`.
    Flag,
    /// A method name, or an array of them.
    Methods,
}

/// One attribute of a route: its name (`ROUTES`' option, the rules file's key), how the file
/// writes it, and its parser, which sets it on the specification and may warn.
pub(crate) struct Attribute {
    /// `cost`.
    pub(crate) name: &'static str,
    /// How a rules file writes it.
    pub(crate) toml: Toml,
    /// Sets it from its value's text; the error says what is wrong with the value.
    apply: fn(&mut RuleSpec, &str, &Context) -> Result<Option<String>, String>,
}

/// What an attribute's parser may need to know beyond its value.
pub(crate) struct Context {
    /// Redis is in use (fail modes mean something).
    pub(crate) shared_store: bool,
}

/// Every attribute of a route beside its pattern and limits, in the order errors list them.
pub(crate) const ATTRIBUTES: &[Attribute] = &[
    Attribute {
        name: "name",
        toml: Toml::Text,
        apply: name,
    },
    Attribute {
        name: "key",
        toml: Toml::Text,
        apply: key,
    },
    Attribute {
        name: "cost",
        toml: Toml::Count,
        apply: cost,
    },
    Attribute {
        name: "method",
        toml: Toml::Methods,
        apply: method,
    },
    Attribute {
        name: "count",
        toml: Toml::Text,
        apply: count,
    },
    Attribute {
        name: "fail",
        toml: Toml::Text,
        apply: fail,
    },
    Attribute {
        name: "delay",
        toml: Toml::Number,
        apply: delay,
    },
    Attribute {
        name: "shadow",
        toml: Toml::Flag,
        apply: shadow,
    },
];

/// The attribute called `name`.
pub(crate) fn attribute(name: &str) -> Option<&'static Attribute> {
    ATTRIBUTES.iter().find(|attribute| attribute.name == name)
}

fn name(spec: &mut RuleSpec, name: &str, _: &Context) -> Result<Option<String>, String> {
    if !is_rule_name(name) {
        return Err(format!(
            "name {name:?}: expected 1 to 64 of a-z, 0-9, '_' and '-'"
        ));
    }
    spec.rule.name = name.into();
    Ok(None)
}

fn key(spec: &mut RuleSpec, key: &str, _: &Context) -> Result<Option<String>, String> {
    spec.rule.key_by =
        KeyBy::parse(key).map_err(|why| format!("key={key}: {why}; expected {KEY_BY_FORMS}"))?;
    match key_problem(&spec.rule.key_by) {
        None => Ok(None),
        Some(KeyProblem::Certain(why)) => Err(format!("key {key:?}: {why}")),
        Some(KeyProblem::Suspicious(why)) => Ok(Some(format!("key={key}: {why}"))),
    }
}

fn cost(spec: &mut RuleSpec, cost: &str, _: &Context) -> Result<Option<String>, String> {
    spec.rule.cost = cost
        .parse::<u64>()
        .ok()
        .filter(|n| *n > 0)
        .ok_or_else(|| format!("cost {cost:?}: expected a whole number of at least 1"))?;
    Ok(None)
}

fn method(spec: &mut RuleSpec, list: &str, _: &Context) -> Result<Option<String>, String> {
    let parsed: Option<Vec<http::Method>> = list
        .split('|')
        .map(|method| http::Method::from_bytes(method.to_ascii_uppercase().as_bytes()).ok())
        .collect();
    let mut parsed = parsed.ok_or_else(|| format!("method {list:?}: expected e.g. GET|HEAD"))?;
    // Flask, Django, Rails and Express run a GET route's handler for HEAD (nginx's
    // `limit_except GET` covers HEAD too): a HEAD must not walk around it.
    if parsed.contains(&http::Method::GET) && !parsed.contains(&http::Method::HEAD) {
        parsed.push(http::Method::HEAD);
    }
    if let Matching::Paths(routes) = &mut spec.matching {
        for route in routes {
            route.methods = Some(parsed.clone());
        }
    }
    Ok(None)
}

fn count(spec: &mut RuleSpec, count: &str, _: &Context) -> Result<Option<String>, String> {
    spec.rule.count = match count {
        "failures" => Count::Failures,
        "all" => Count::All,
        _ => return Err(format!("count {count:?}: expected all or failures")),
    };
    Ok(None)
}

fn fail(spec: &mut RuleSpec, mode: &str, context: &Context) -> Result<Option<String>, String> {
    spec.rule.fail_mode =
        FailMode::parse(mode).ok_or_else(|| format!("fail {mode:?}: expected {}", FailMode::NAMES))?;
    Ok((!context.shared_store).then(|| {
        format!(
            "fail={mode} changes nothing: the store is in memory, and fail modes apply when Redis \
             cannot decide"
        )
    }))
}

fn delay(spec: &mut RuleSpec, ms: &str, _: &Context) -> Result<Option<String>, String> {
    spec.rule.delay = parse_delay(ms).ok_or_else(|| format!("delay {ms:?}: expected {DELAY_FORMS}"))?;
    Ok(None)
}

/// `shadow`: `true` shadows the route; `false` leaves it as `SHADOW_MODE` says.
fn shadow(spec: &mut RuleSpec, flag: &str, _: &Context) -> Result<Option<String>, String> {
    match flag {
        "true" => spec.rule.shadow = true,
        "false" => {}
        _ => return Err(format!("shadow {flag:?}: expected true or false")),
    }
    Ok(None)
}

impl RouteEntry {
    /// One `ROUTES` entry, `PATTERN=LIMITS[,OPTION...]`: its pattern, limits and options
    /// (`name=value`, or `shadow` alone).
    pub(crate) fn parse(entry: &str) -> Result<RouteEntry, ConfigError> {
        let at = Written::Entry(entry.to_owned());
        let (pattern, rest) = entry.split_once('=').ok_or_else(|| {
            at.error("expected PATTERN=ALGORITHM:A:B, e.g. /api/export/*=token_bucket:5:0.1")
        })?;
        let pattern = PathPattern::parse(pattern).map_err(|why| at.error(format!("pattern: {why}")))?;
        let mut options = rest.split(',');
        let limits = parse_limits(options.next().unwrap_or_default()).map_err(|why| at.error(why))?;
        let mut attributes = Vec::new();
        for option in options {
            // `name=value`, or a flag alone (`shadow`).
            let known = match option.split_once('=') {
                Some((name, value)) => attribute(name)
                    .filter(|known| known.toml != Toml::Flag)
                    .map(|known| (known.name, value)),
                None => attribute(option)
                    .filter(|known| known.toml == Toml::Flag)
                    .map(|known| (known.name, "true")),
            };
            let Some((name, value)) = known else {
                return Err(at.error(format!("unknown option {option:?}; expected {}", options_words())));
            };
            attributes.push((name, value.to_owned()));
        }
        Ok(RouteEntry {
            pattern,
            limits,
            attributes,
            at,
        })
    }

    /// The route's specification: `defaults` (the general rule's key, fail mode, delay and
    /// shadow) with its own limits, name (its pattern unless named) and attributes. What is
    /// suspicious but may be meant goes to `warnings`.
    pub(crate) fn spec(
        &self,
        defaults: &RuleSpec,
        context: &Context,
        warnings: &mut Vec<String>,
    ) -> Result<RuleSpec, ConfigError> {
        let route = RouteSpec {
            pattern: self.pattern.clone(),
            methods: None,
        };
        let mut spec = RuleSpec {
            matching: Matching::Paths(vec![route]),
            rule: Rule {
                name: self.pattern.to_string().into(),
                limits: self.limits.clone(),
                ..defaults.rule.clone()
            },
        };
        for (name, value) in &self.attributes {
            let apply = attribute(name).map(|attribute| attribute.apply);
            let warned = apply.map_or(Ok(None), |apply| apply(&mut spec, value, context));
            if let Some(words) = warned.map_err(|why| self.at.error(why))? {
                warnings.push(self.at.warning(&self.pattern, &words));
            }
        }
        self.check(&spec, warnings)?;
        Ok(spec)
    }

    /// The rule as a whole: its cost within its capacity, and a delay it can wait for.
    fn check(&self, spec: &RuleSpec, warnings: &mut Vec<String>) -> Result<(), ConfigError> {
        if spec.rule.cost > spec.rule.limits.capacity() {
            return Err(self.at.error(format!(
                "cost {} is above the rule's capacity of {}: no request could ever pass",
                spec.rule.cost,
                spec.rule.limits.capacity()
            )));
        }
        let own_delay = self.attributes.iter().any(|(name, _)| *name == "delay");
        if spec.rule.shadow && spec.rule.delay.is_some() && own_delay {
            warnings.push(self.at.warning(
                &self.pattern,
                "delay= changes nothing: the route is shadowed, and a shadowed rule refuses \
                 nothing, so never waits",
            ));
        }
        delayable(&spec.rule).map_err(|why| match own_delay {
            true => self.at.error(why),
            false => self.at.error(format!(
                "{why} (the route inherits DELAY_MAX_MS; delay=0 turns it off here)"
            )),
        })
    }
}

/// The options a `ROUTES` entry may have, in words: `name=, key=, ... or shadow`.
fn options_words() -> String {
    let words: Vec<String> = ATTRIBUTES
        .iter()
        .map(|attribute| match attribute.toml {
            Toml::Flag => attribute.name.to_owned(),
            _ => format!("{}=", attribute.name),
        })
        .collect();
    match words.split_last() {
        Some((last, init)) => format!("{} or {last}", init.join(", ")),
        None => String::new(),
    }
}

/// A delay as written (`DELAY_MAX_MS`, `delay=`): `None` when it is not one of
/// [`DELAY_FORMS`], `Some(None)` for 0 (no delay).
pub(super) fn parse_delay(ms: &str) -> Option<Option<Duration>> {
    ms.parse::<u64>()
        .ok()
        .filter(|ms| *ms <= MAX_DELAY_MS)
        .map(|ms| (ms > 0).then(|| Duration::from_millis(ms)))
}

/// The one check of a rule's delay against its limits, made for every rule (general, auth,
/// each route): a delayed request sleeps for its denial's retry time, so only limits whose
/// retry times are exact can be waited for ([`crate::algorithms::Policy::exact_retry`]): every
/// limit of the rule (the rule's retry time is the latest of its refusing limits'). The error
/// says why; the caller names what set the delay.
pub(super) fn delayable(rule: &Rule) -> Result<(), String> {
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

/// What is wrong with keying budgets by some source.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum KeyProblem {
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
pub(super) fn key_problem(key_by: &KeyBy) -> Option<KeyProblem> {
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
