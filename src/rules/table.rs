//! The compiled rule table: which budget a request draws from, under which key, at what cost.
//!
//! Built once from the configuration and consulted once per request with
//! [`RuleTable::classify`]. Rules are tried in order and the first match wins: `ROUTES` entries
//! as written, then `AUTH_PATHS`, then the general rule, which matches everything. Then
//! `SKIP_PATHS` and `EXEMPT` may exempt the request, and `COSTS` may price it. Paths are
//! matched in the canonical form the proxy parsed them into (see `gate::path`), never as
//! spelled, so every spelling a backend would read as `/login` counts against `/login`, and
//! as the scripts they name (`/wp-login.php/x` is `/wp-login.php` to PHP). Methods likewise:
//! a route of some methods takes its methods in any case, `HEAD` under `GET`, and a request
//! whose method-override header or `_method` query parameter names a method that picks
//! another route than its own method does is refused ([`ClassifyError::AmbiguousMethod`]).
//!
//! A table may also hold rules that no path classifies into ([`RuleTable::with_named`]): the
//! budgets of a door that names its rule itself (an Envoy descriptor's limit, `RLS_CONFIG`).
//! They come after the general rule, their ids continuing, so the stores and the metrics,
//! which keep arrays by rule id, know them from startup.

use std::borrow::Cow;
use std::fmt;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use http::{HeaderMap, Method};
use ipnet::IpNet;

use crate::algorithms::Limits;
use crate::rules::FailMode;
use crate::rules::key::{
    ClientIp, ClientKey, Digest, KeyBy, KeyHasher, MAX_SOURCES, Source, cookie_value, host_value,
    query_value, query_values,
};
use crate::rules::overrides::{AmbiguousTier, Client, Override, Overrides};
use crate::rules::pattern::{PathPattern, resource};
use crate::rules::spec::RuleSpec;

/// A named budget: the algorithm that enforces it and how requests are filed under it.
#[derive(Debug, Clone, PartialEq)]
pub struct Rule {
    /// Position in the table; the memory store files client states under it.
    pub id: u16,
    /// `general`, `auth`, or the route's own name: part of every Redis key, log line and
    /// rate-limit header, so it must stay stable across restarts.
    pub name: Arc<str>,
    /// The limits, each an algorithm and its numbers: a request goes through only when every
    /// one allows it.
    pub limits: Limits,
    /// What budgets are keyed by.
    pub key_by: KeyBy,
    /// What one request costs unless `COSTS` says otherwise.
    pub cost: u64,
    /// Decide and count, but never refuse (`SHADOW_MODE`, or a route's `shadow`).
    pub shadow: bool,
    /// Which requests keep their cost (`AUTH_COUNT`, or a route's `count=`).
    pub count: Count,
    /// What the Redis guard does with a request of this rule when Redis cannot decide
    /// (`FAIL_MODE`, `AUTH_FAIL_MODE`, or a route's `fail=`); the memory store never fails.
    pub fail_mode: FailMode,
    /// How long a request refused under this rule may wait for its budget instead
    /// (`DELAY_MAX_MS`, `AUTH_DELAY_MAX_MS`, or a route's `delay=`): a denial whose retry time
    /// is at most this is held by the gate and decided again. `None`: refused at once.
    pub delay: Option<Duration>,
}

impl Rule {
    /// Whether `other` is this rule's budget again, in another table: the same name and the
    /// same limits. A reload keeps such a rule's clients (their states, in memory and in
    /// Redis); any other rule starts afresh, but for each of its limits a limit of the same
    /// name and policy had (the stores keep budgets by rule name and policy).
    pub fn same_budget(&self, other: &Rule) -> bool {
        self.name == other.name && self.limits == other.limits
    }

    /// A rule keyed by IP, costing 1, enforced, counting every request, failing open, never
    /// delayed.
    pub fn new(id: u16, name: &str, limits: impl Into<Limits>) -> Rule {
        Rule {
            id,
            name: name.into(),
            limits: limits.into(),
            key_by: KeyBy::ip(),
            cost: 1,
            shadow: false,
            count: Count::All,
            fail_mode: FailMode::Open,
            delay: None,
        }
    }
}

/// The name of the limit at `position` (from 0) of the rule called `rule`, a rule of several
/// limits, as the draft headers, refusal bodies and the JSON decision API name its policy:
/// `api.1`, `api.2`, ...
pub fn limit_name(rule: &str, position: usize) -> String {
    format!("{rule}.{}", position + 1)
}

/// Which allowed requests keep spending the budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Count {
    /// Every allowed request.
    All,
    /// Only those the backend answers with a status of 400 or more: the cost of a success is
    /// refunded, so a login brute-force is limited without punishing users who get in.
    Failures,
}

/// A path pattern that selects a rule, optionally for some methods only.
#[derive(Debug, Clone, PartialEq)]
pub struct Route {
    /// Which paths.
    pub pattern: PathPattern,
    /// Which methods (`None`: all).
    pub methods: Option<Vec<Method>>,
    /// Index of the rule in [`RuleTable::rules`].
    pub rule: usize,
}

impl Route {
    /// Whether a request for `path`, read as the method `method` (its bytes in any case),
    /// is one of this route: its path as itself or as a script it names (see
    /// [`PathPattern::matches`]), and, for a route of some methods, that method.
    fn matches(&self, path: &str, method: &[u8]) -> bool {
        self.pattern.matches(path)
            && self.methods.as_ref().is_none_or(|methods| {
                methods
                    .iter()
                    .any(|listed| listed.as_str().as_bytes().eq_ignore_ascii_case(method))
            })
    }
}

/// The headers through which a client asks the backend to read its request as another method:
/// Symfony, Rails (Rack), Express's `method-override`, Laravel read `X-HTTP-Method-Override`;
/// OData, Google's APIs and others `X-HTTP-Method` or `X-Method-Override`.
pub const METHOD_OVERRIDE_HEADERS: [http::HeaderName; 3] = [
    http::HeaderName::from_static("x-http-method-override"),
    http::HeaderName::from_static("x-http-method"),
    http::HeaderName::from_static("x-method-override"),
];

/// The query parameter through which Symfony and Laravel (for a `POST`), and Express's
/// `method-override` configured so, read a request as another method: `?_method=DELETE`.
pub const METHOD_OVERRIDE_PARAMETER: &str = "_method";

/// Whether `each` says yes to a method some backend reads the request as instead of its
/// own: one an override header names (any element of any line, trimmed: which line or element
/// a framework believes is its own), or a `_method` query parameter (any of them, decoded).
fn any_override(headers: &HeaderMap, query: Option<&str>, mut each: impl FnMut(&[u8]) -> bool) -> bool {
    METHOD_OVERRIDE_HEADERS.iter().any(|header| {
        headers.get_all(header).iter().any(|line| {
            line.as_bytes()
                .split(|&byte| byte == b',')
                .any(|element| each(element.trim_ascii()))
        })
    }) || query.is_some_and(|query| {
        query_values(query, METHOD_OVERRIDE_PARAMETER).any(|value| each(value.trim_ascii()))
    })
}

/// What is never limited (`EXEMPT`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Exemptions {
    /// Client networks.
    pub networks: Vec<IpNet>,
    /// `SOURCE=VALUE` entries: the source, and the value's digest as a rule keyed by that
    /// source alone (besides the address) digests it. Compared with a request's key under
    /// such a rule only: a value exempted as a query parameter is not exempted as a `Host`.
    pub keys: Vec<(Source, Digest)>,
}

impl Exemptions {
    /// Whether a request keyed `digest` under a rule keyed `by` is exempt.
    fn exempts(&self, by: &KeyBy, digest: Digest) -> bool {
        self.keys
            .iter()
            .any(|(source, exempt)| *exempt == digest && by.single() == Some(source))
    }
}

/// How a matched request is treated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Decided; denials are refused.
    Enforce,
    /// Decided and counted; denials are forwarded anyway (and logged).
    Shadow,
    /// Not decided at all (`SKIP_PATHS`, `EXEMPT`, an `unlimited` override): forwarded
    /// without rate-limit headers.
    Exempt,
    /// Not decided: refused at once, without `Retry-After` (a `deny` override).
    Deny,
}

impl Mode {
    /// As in `--check-config` and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Enforce => "enforce",
            Mode::Shadow => "shadow",
            Mode::Exempt => "exempt",
            Mode::Deny => "deny",
        }
    }
}

/// The parts of a request the table looks at.
#[derive(Debug, Clone, Copy)]
pub struct RequestHead<'a> {
    /// The request method.
    pub method: &'a Method,
    /// The path in canonical form (`gate::path`): what rules match, and the `path` key source.
    pub path: &'a str,
    /// The raw query, after the `?` (for `query:NAME` keys).
    pub query: Option<&'a str>,
    /// The host the target names, when it names one (HTTP/2's `:authority`, an absolute-form
    /// target, forward-auth's `X-Forwarded-Host`): the `host` key source, before `Host`.
    pub authority: Option<&'a str>,
    /// The request headers (for header and cookie keys, and `Host`).
    pub headers: &'a HeaderMap,
    /// The client address, after `TRUSTED_PROXIES`.
    pub client_ip: IpAddr,
    /// Whether the TCP peer is one of `TRUSTED_PROXIES` (whose `TIER_HEADER` is believed).
    pub trusted: bool,
}

/// The outcome of classifying one request.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Match<'t> {
    /// The rule that applies.
    pub rule: &'t Rule,
    /// Whose budget.
    pub key: ClientKey,
    /// How much of it this request costs.
    pub cost: u64,
    /// Enforce, shadow, exempt or deny.
    pub mode: Mode,
    /// The request named a tier (`TIER_HEADER`) but came from a peer not trusted to: the
    /// header was ignored.
    pub untrusted_tier: bool,
}

/// A request whose identity cannot be read one way only.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClassifyError {
    /// The header budgets are keyed by came more than once: which one the backend would
    /// believe is unknowable, so the request is refused rather than counted under either.
    #[error("the {0} header appears more than once")]
    RepeatedKeyHeader(http::HeaderName),
    /// The header budgets are keyed by holds a comma list (`a, b`): a proxy may have merged
    /// two lines into it, and a backend may read only the first element. Refused as two
    /// lines are.
    #[error("the {0} header holds a comma-separated list")]
    ListKeyHeader(http::HeaderName),
    /// The query parameter budgets are keyed by came more than once (`&` or `;` separated,
    /// as many frameworks split them): backends differ on which one they read (the first,
    /// the last, all), so the request is refused rather than counted under either.
    #[error("the query parameter {0} appears more than once (pairs split at & and ;)")]
    RepeatedKeyParameter(Box<str>),
    /// `TIER_HEADER`, from a trusted peer, named more than one tier.
    #[error(transparent)]
    Tier(#[from] AmbiguousTier),
    /// The request's own method and a method an override names (`X-HTTP-Method-Override`,
    /// `_method`, ...) pick different routes: which one the backend runs is its choice, so the
    /// request is refused rather than counted under either.
    #[error("the request's method and the method it asks to be read as pick different routes")]
    AmbiguousMethod,
}

/// Most rules one table holds: ids are 16 bits.
pub const MAX_RULES: usize = u16::MAX as usize + 1;

/// The compiled rule table.
#[derive(Debug, Clone)]
pub struct RuleTable {
    /// Every rule: those paths classify into, in evaluation order of their first route, the
    /// general rule last of them (at `classified - 1`); then the variants overrides and tiers
    /// decide under; then the named rules, if any.
    rules: Vec<Rule>,
    /// How many of `rules` requests are classified into (the general rule included).
    classified: usize,
    /// How many of `rules`, after the classified ones, are variants.
    variants: usize,
    /// `OVERRIDES_FILE` and `TIERS`.
    overrides: Overrides,
    /// `ROUTES` then `AUTH_PATHS`, in order.
    routes: Vec<Route>,
    /// Whether a route names methods: only then are method overrides read.
    method_routes: bool,
    /// `COSTS`: the first matching entry prices the request.
    costs: Vec<(PathPattern, u64)>,
    /// `SKIP_PATHS`.
    skip: Vec<PathPattern>,
    /// `EXEMPT`.
    exempt: Exemptions,
    /// `IPV6_PREFIX`.
    ipv6_prefix: u8,
    /// Digests header keys.
    hasher: KeyHasher,
}

/// Why a table cannot be built; the configuration turns it into an error naming a variable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TableError {
    /// A `COSTS` entry (by index) prices a request above a rule's capacity.
    #[error("COSTS entry {entry} prices a request above rule {rule:?}'s capacity of {capacity}")]
    CostAboveCapacity {
        /// Index into the costs.
        entry: usize,
        /// The rule it can reach.
        rule: String,
        /// That rule's capacity.
        capacity: u64,
    },
    /// More rules than ids: at most [`MAX_RULES`].
    #[error("{0} rules, more than the {MAX_RULES} a table holds")]
    TooManyRules(usize),
    /// A named rule has the name of a rule already in the table.
    #[error("two rules are named {0:?}")]
    DuplicateName(String),
    /// The rules classified into do not end with the general rule, alone of its kind.
    #[error("the rules do not end with the general rule, which every request falls back to")]
    NoGeneralRule,
}

impl RuleTable {
    /// Assemble a table ([`RuleTable::compile`] calls it). `rules` must end with the general
    /// rule (which every request falls back to) and each rule's `id` must be its index;
    /// `routes` point into `rules`.
    pub(super) fn new(
        rules: Vec<Rule>,
        routes: Vec<Route>,
        costs: Vec<(PathPattern, u64)>,
        skip: Vec<PathPattern>,
        exempt: Exemptions,
        ipv6_prefix: u8,
        hasher: KeyHasher,
    ) -> Result<RuleTable, TableError> {
        debug_assert!(
            rules
                .iter()
                .enumerate()
                .all(|(i, rule)| usize::from(rule.id) == i)
        );
        let table = RuleTable {
            classified: rules.len(),
            variants: 0,
            overrides: Overrides::default(),
            rules,
            method_routes: routes.iter().any(|route| route.methods.is_some()),
            routes,
            costs,
            skip,
            exempt,
            ipv6_prefix,
            hasher,
        };
        for (entry, (pattern, cost)) in table.costs.iter().enumerate() {
            if let Some(rule) = table
                .reachable(pattern)
                .into_iter()
                .find(|rule| rule.limits.capacity() < *cost)
            {
                return Err(TableError::CostAboveCapacity {
                    entry,
                    rule: rule.name.to_string(),
                    capacity: rule.limits.capacity(),
                });
            }
        }
        Ok(table)
    }

    /// This table with `named` appended: rules no path classifies into, decided only by a door
    /// that names them ([`crate::gate::Gate::admit_named`]). Their ids are set here, following
    /// the rules already held.
    ///
    /// Each is a specification that no path matches ([`Matching::Named`](crate::rules::spec::Matching::Named)).
    pub fn with_named(mut self, named: Vec<RuleSpec>) -> Result<RuleTable, TableError> {
        let total = self.rules.len() + named.len();
        if total > MAX_RULES {
            return Err(TableError::TooManyRules(total));
        }
        for spec in named {
            if self.rule(&spec.rule.name).is_some() {
                return Err(TableError::DuplicateName(spec.rule.name.to_string()));
            }
            // Below MAX_RULES, checked above.
            self.rules.push(spec.compiled(self.rules.len() as u16));
        }
        Ok(self)
    }

    /// This table with the variants of its rules that `overrides` decide under (each
    /// variant's id the next after the table's rules, in order, as the overrides name them).
    /// Before any named rule is added.
    pub fn with_overrides(
        mut self,
        variants: Vec<Rule>,
        overrides: Overrides,
    ) -> Result<RuleTable, TableError> {
        debug_assert_eq!(self.rules.len(), self.classified + self.variants);
        let total = self.rules.len() + variants.len();
        if total > MAX_RULES {
            return Err(TableError::TooManyRules(total));
        }
        for rule in variants {
            if self.rule(&rule.name).is_some() {
                return Err(TableError::DuplicateName(rule.name.to_string()));
            }
            debug_assert_eq!(usize::from(rule.id), self.rules.len());
            self.rules.push(rule);
            self.variants += 1;
        }
        self.overrides = overrides;
        Ok(self)
    }

    /// The variants overrides and tiers decide under ([`RuleTable::with_overrides`]).
    pub fn variants(&self) -> &[Rule] {
        &self.rules[self.classified..self.classified + self.variants]
    }

    /// `OVERRIDES_FILE` and `TIERS`.
    pub fn overrides(&self) -> &Overrides {
        &self.overrides
    }

    /// The headers some rule keys its budgets by, each once.
    pub fn key_headers(&self) -> impl Iterator<Item = &http::HeaderName> {
        let all = || self.rules.iter().flat_map(|rule| rule.key_by.headers());
        all()
            .enumerate()
            .filter(move |(i, name)| all().take(*i).all(|earlier| earlier != *name))
            .map(|(_, name)| name)
    }

    /// Every rule, by id: those paths classify into (the general rule last of them), then the
    /// named ones.
    pub fn rules(&self) -> &[Rule] {
        &self.rules
    }

    /// The rules requests are classified into: `ROUTES`', the auth rule, the general rule.
    pub fn classified(&self) -> &[Rule] {
        &self.rules[..self.classified]
    }

    /// The rules only a door that names them decides ([`RuleTable::with_named`]).
    pub fn named(&self) -> &[Rule] {
        &self.rules[self.classified + self.variants..]
    }

    /// The rule every request no route takes falls back to.
    pub fn general(&self) -> &Rule {
        // `new` is only handed tables that end with the general rule, and named rules come
        // after it.
        &self.rules[self.classified - 1]
    }

    /// A digest of everything the table decides by (FNV-1a, 32 bits): the same table, in any
    /// process, has the same one. Logged at start and on each reload, and exported as
    /// `tollgate_config_hash`, so replicas running different tables can be told apart.
    pub fn digest(&self) -> u32 {
        // Every part but the hasher (its key is a secret, or random per process).
        crate::algorithms::fnv1a(format_args!(
            "{:?}|{}|{}|{:?}|{:?}|{:?}|{:?}|{}|{:?}",
            self.rules,
            self.classified,
            self.variants,
            self.routes,
            self.costs,
            self.skip,
            self.exempt,
            self.ipv6_prefix,
            self.overrides
        ))
    }

    /// Whether `other` decides every request as this table does: the parts [`digest`](Self::digest)
    /// covers, compared whole rather than by a 32-bit digest.
    pub fn decides_like(&self, other: &RuleTable) -> bool {
        self.rules == other.rules
            && self.classified == other.classified
            && self.variants == other.variants
            && self.overrides == other.overrides
            && self.routes == other.routes
            && self.costs == other.costs
            && self.skip == other.skip
            && self.exempt == other.exempt
            && self.ipv6_prefix == other.ipv6_prefix
            && self.hasher == other.hasher
    }

    /// The rule called `name`.
    pub fn rule(&self, name: &str) -> Option<&Rule> {
        self.rules.iter().find(|rule| &*rule.name == name)
    }

    /// The patterns that select the rule called `name`, as `AUTH_PATHS` is written.
    pub fn paths_of(&self, name: &str) -> String {
        let patterns: Vec<String> = self
            .routes
            .iter()
            .filter(|route| &*self.rules[route.rule].name == name)
            .map(|route| route.pattern.to_string())
            .collect();
        patterns.join(",")
    }

    /// The table on one line, for the startup log: each rule with its paths, in order (the
    /// named rules counted, not listed).
    pub fn summary(&self) -> String {
        let mut rules: Vec<String> = self
            .classified()
            .iter()
            .map(|rule| {
                let paths = match self.paths_of(&rule.name) {
                    paths if paths.is_empty() => "*".to_owned(),
                    paths => paths,
                };
                format!("[{paths}] {}", describe(rule))
            })
            .collect();
        if !self.named().is_empty() {
            rules.push(format!("{} named rules", self.named().len()));
        }
        rules.join("; ")
    }

    /// `IPV6_PREFIX`: IPv6 clients are this network, for anything else counted per client
    /// (such as open tunnels).
    pub fn ipv6_prefix(&self) -> u8 {
        self.ipv6_prefix
    }

    /// The hasher header keys are digested with (for `EXEMPT` entries).
    pub fn hasher(&self) -> &KeyHasher {
        &self.hasher
    }

    /// The first route of a request for `path` read as `method`, by its index.
    fn route(&self, path: &str, method: &[u8]) -> Option<usize> {
        self.routes.iter().position(|route| route.matches(path, method))
    }

    /// Which rule, key, cost and mode apply to this request.
    pub fn classify(&self, head: &RequestHead<'_>) -> Result<Match<'_>, ClassifyError> {
        let route = self.route(head.path, head.method.as_str().as_bytes());
        // Every method a backend may run the request as picks the same route, or the request
        // is refused: counted under its own method's route, an override naming a more
        // generous route's method would otherwise choose its budget, whichever reading the
        // backend believes. Read only for a table with routes of some methods.
        if self.method_routes
            && any_override(head.headers, head.query, |method| {
                self.route(head.path, method) != route
            })
        {
            return Err(ClassifyError::AmbiguousMethod);
        }
        let rule = route.map_or_else(|| self.general(), |route| &self.rules[self.routes[route].rule]);
        let cost = self
            .costs
            .iter()
            .find(|(pattern, _)| pattern.matches(head.path))
            .map_or(rule.cost, |(_, cost)| *cost);
        let ip = ClientIp::new(head.client_ip, self.ipv6_prefix);
        // Skipped paths and exempt networks are decided before any header is read, so nothing
        // in a header can make them fail.
        // Skipped as the path itself only: `/index.php/admin/login` is a front controller's
        // login, whatever `/index.php` is.
        if self.skip.iter().any(|pattern| pattern.matches_itself(head.path))
            || self
                .exempt
                .networks
                .iter()
                .any(|net| net.contains(&head.client_ip.to_canonical()))
        {
            let key = ClientKey::Ip(ip);
            return Ok(Match {
                rule,
                key,
                cost,
                mode: Mode::Exempt,
                untrusted_tier: false,
            });
        }
        let key = match rule.key_by.digests() {
            // The default, `ip`: nothing to read.
            false => ClientKey::Ip(ip),
            true => self.key(&rule.key_by, ip, head)?,
        };
        let mut mode = match (key.digest(), rule.shadow) {
            (Some(digest), _) if self.exempt.exempts(&rule.key_by, digest) => Mode::Exempt,
            (_, true) => Mode::Shadow,
            (_, false) => Mode::Enforce,
        };
        let mut matched = rule;
        let mut untrusted_tier = false;
        if !self.overrides.is_empty() && mode != Mode::Exempt {
            let found = self
                .overrides
                .find(rule.id, &key, head.client_ip, head.headers, head.trusted)?;
            untrusted_tier = found.untrusted_tier;
            match found.what {
                None => {}
                Some(Override::Limits(variant)) => {
                    matched = self.rules.get(usize::from(variant)).unwrap_or(rule);
                }
                Some(Override::Unlimited) => mode = Mode::Exempt,
                Some(Override::Deny) => mode = Mode::Deny,
            }
        }
        Ok(Match {
            rule: matched,
            key,
            cost,
            mode,
            untrusted_tier,
        })
    }

    /// The key of a rule keyed `by` (some source besides the address): every source's value
    /// digested together, or the address alone when any is missing.
    fn key(&self, by: &KeyBy, ip: ClientIp, head: &RequestHead<'_>) -> Result<ClientKey, ClassifyError> {
        let sources = by.sources();
        // One header, the most common key but the address: read in place, as before there
        // were other sources, without the array of values below.
        if let [Source::Header(name)] = sources {
            return Ok(match one_header(head.headers, name)? {
                Some(value) => ClientKey::new(by, ip, Some(&[value]), &self.hasher),
                None => ClientKey::Ip(ip),
            });
        }
        let mut read: [Cow<'_, [u8]>; MAX_SOURCES] = Default::default();
        for (slot, source) in read.iter_mut().zip(sources) {
            match source_value(source, head)? {
                Some(value) => *slot = value,
                None => return Ok(ClientKey::Ip(ip)),
            }
        }
        let values: [&[u8]; MAX_SOURCES] = std::array::from_fn(|i| &*read[i]);
        Ok(ClientKey::new(
            by,
            ip,
            Some(&values[..sources.len()]),
            &self.hasher,
        ))
    }

    /// The rules a request on `pattern` can be classified under: each route overlapping it, in
    /// order, up to one that takes all of it for every method (or else the general rule).
    /// Startup only.
    fn reachable(&self, pattern: &PathPattern) -> Vec<&Rule> {
        let mut rules = Vec::new();
        for route in &self.routes {
            if route.pattern.overlaps(pattern) {
                rules.push(&self.rules[route.rule]);
                if route.methods.is_none() && route.pattern.covers(pattern) {
                    return rules;
                }
            }
        }
        rules.push(self.general());
        rules
    }
}

/// What `head` holds for `source`: `None` when it is absent or empty (the request is then keyed
/// by its address), an error when it could be read two ways.
fn source_value<'h>(source: &Source, head: &RequestHead<'h>) -> Result<Option<Cow<'h, [u8]>>, ClassifyError> {
    Ok(match source {
        Source::Header(name) => one_header(head.headers, name)?.map(Cow::Borrowed),
        Source::Cookie(name) => cookie_value(
            head.headers
                .get_all(http::header::COOKIE)
                .iter()
                .map(|line| line.as_bytes()),
            name,
        ),
        Source::Query(name) => match head.query {
            Some(query) => {
                query_value(query, name).map_err(|_| ClassifyError::RepeatedKeyParameter(name.clone()))?
            }
            None => None,
        },
        Source::Host => match head.authority {
            Some(authority) => host_value(authority.as_bytes()),
            None => one_header(head.headers, &http::header::HOST)?.and_then(host_value),
        },
        // The resource as the loosest reader reads it: `/api/search.json` and
        // `/wp-login.php/x` share the budgets of `/api/search` and `/wp-login.php`.
        Source::Path => Some(Cow::Borrowed(resource(head.path).as_bytes())),
    })
}

/// The value of `name`, sent once: none when absent or empty, an error when sent twice or as
/// a comma list (which a proxy may have merged from two lines).
fn one_header<'h>(
    headers: &'h HeaderMap,
    name: &http::HeaderName,
) -> Result<Option<&'h [u8]>, ClassifyError> {
    let mut values = headers.get_all(name).iter();
    match (values.next(), values.next()) {
        (Some(_), Some(_)) => Err(ClassifyError::RepeatedKeyHeader(name.clone())),
        (Some(value), None) if value.as_bytes().contains(&b',') => {
            Err(ClassifyError::ListKeyHeader(name.clone()))
        }
        (value, _) => Ok(value
            .map(|value| value.as_bytes())
            .filter(|value| !value.is_empty())),
    }
}

/// The table in evaluation order, as `--check-config` prints it.
impl fmt::Display for RuleTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.write_routes(f)?;
        self.write_tiers(f)?;
        self.write_overrides(f)?;
        if !self.named().is_empty() {
            writeln!(
                f,
                "named rules:      {} (decided only by the doors that name them)",
                self.named().len()
            )?;
        }
        let costs: Vec<String> = self
            .costs
            .iter()
            .map(|(pattern, cost)| format!("{pattern}={cost}"))
            .collect();
        writeln!(f, "costs:            {}", list_or_none(&costs))?;
        let skip: Vec<String> = self.skip.iter().map(ToString::to_string).collect();
        writeln!(f, "skip paths:       {}", list_or_none(&skip))?;
        let mut exempt: Vec<String> = self.exempt.networks.iter().map(ToString::to_string).collect();
        // Each key by its source, its value never shown.
        exempt.extend(self.exempt.keys.iter().map(|(source, _)| format!("{source}=***")));
        write!(f, "exempt:           {}", list_or_none(&exempt))
    }
}

impl RuleTable {
    /// The routes in order, then the general rule.
    fn write_routes(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "rules, first match wins:")?;
        let mut position = 0;
        for route in &self.routes {
            position += 1;
            let methods = route.methods.as_ref().map_or_else(String::new, |methods| {
                let names: Vec<&str> = methods.iter().map(Method::as_str).collect();
                format!(" {}", names.join("|"))
            });
            writeln!(
                f,
                "  {position:>2}. {}{methods} -> {}",
                route.pattern,
                describe(&self.rules[route.rule])
            )?;
        }
        writeln!(
            f,
            "  {:>2}. every other path -> {}",
            position + 1,
            describe(self.general())
        )
    }

    /// `TIERS`, each with its limits.
    fn write_tiers(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let Some((header, tiers)) = self.overrides.tiers() else {
            return Ok(());
        };
        writeln!(
            f,
            "tiers:            named by {header} (believed from TRUSTED_PROXIES only; not the auth rule):"
        )?;
        for tier in tiers {
            let limits = tier
                .variants
                .iter()
                .flatten()
                .filter_map(|id| self.rules.get(usize::from(*id)))
                .map(|variant| variant.limits.to_string())
                .next()
                .unwrap_or_default();
            writeln!(f, "  {} -> {limits}", tier.name)?;
        }
        Ok(())
    }

    /// `OVERRIDES_FILE`'s entries, key values never shown.
    fn write_overrides(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.overrides.entries().is_empty() {
            return Ok(());
        }
        writeln!(
            f,
            "overrides:        {} (most specific first: key, then network):",
            self.overrides.entries().len()
        )?;
        for entry in self.overrides.entries() {
            let rule = self
                .rules
                .get(usize::from(entry.rule))
                .map_or("?", |rule| &*rule.name);
            let client = match entry.client {
                Client::Network(network) => network.to_string(),
                Client::Key(_) => "key:*** (value not shown)".to_owned(),
            };
            let what = match entry.what {
                Override::Unlimited => "unlimited".to_owned(),
                Override::Deny => "deny (refused, no Retry-After)".to_owned(),
                Override::Limits(id) => self
                    .rules
                    .get(usize::from(id))
                    .map_or_else(String::new, |variant| {
                        format!("{}: {}", variant.name, variant.limits)
                    }),
            };
            writeln!(f, "  {rule} {client} -> {what}")?;
        }
        Ok(())
    }
}

/// One rule in words: `auth: token_bucket: 5 tokens, ... (key ip, cost 1, enforce)`, with
/// `, delays up to 500 ms` under `delay=`.
pub fn describe(rule: &Rule) -> String {
    let mode = if rule.shadow { "shadow" } else { "enforce" };
    let count = match rule.count {
        Count::All => "",
        Count::Failures => ", counts failures only",
    };
    let delay = match rule.delay {
        None => String::new(),
        Some(delay) => format!(", delays up to {} ms", delay.as_millis()),
    };
    format!(
        "{}: {} (key {}, cost {}, {mode}{count}{delay})",
        rule.name, rule.limits, rule.key_by, rule.cost
    )
}

fn list_or_none(items: &[String]) -> String {
    if items.is_empty() {
        "none".into()
    } else {
        items.join(", ")
    }
}
