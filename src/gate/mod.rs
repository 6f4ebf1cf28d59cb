//! The one door to policy: from a request head to an [`Admission`] ([`Gate::admit`]), which
//! owns the request's life until the door settles it ([`Admission::settle`]); and from an
//! admission to its answer, one mapping for every door ([`answer`]).
//!
//! Every door (the proxy, forward-auth, `/v1/check`, Envoy's RLS) reads "admit, act, settle":
//! the same admission whichever door a request came in by, so a rule means the same thing
//! everywhere, and the same answers and headers for the same state. The gate knows `http`'s
//! types at most, never hyper's.
//!
//! - [`admission`]: the [`Admission`], what it holds and how it is settled or given back.
//! - [`answer`]: refusals, the `503` of an unavailable store, rate-limit headers, the budget
//!   told to the backend: [`Answers`].
//! - [`path`]: the request path read once, into the canonical form rules match and what the
//!   backend must get, or refused as one that backends could read two ways.
//! - [`identity`]: the client address (the peer, or `X-Forwarded-For` from `TRUSTED_PROXIES`).
//! - [`tunnels`]: `MAX_UPGRADES_PER_CLIENT`, the tunnels one client may hold open.
//! - [`delay`]: `DELAY_QUEUE`, `DELAY_QUEUE_PER_CLIENT`, the places of requests waiting under a
//!   rule's delay.
//! - the rule table ([`crate::rules::RuleTable`]) and the limiter ([`crate::stores::Limiter`]):
//!   which rule, key, cost and mode, and what the store says.
//!
//! A decision is counted in the metrics here (`tollgate_requests_total`, the decision's
//! latency), once, whichever door asked.
//!
//! Delay instead of refuse (a rule's `delay`, nginx's `limit_req` `burst` without `nodelay`)
//! is the gate's too, so every door waits alike: an enforced denial whose retry time is at most
//! the rule's delay takes a place in the [`delay`] queue, sleeps for the retry time, and is
//! decided again, its cost spent only then. Denied again (another request took the budget
//! first), it sleeps again while its whole wait stays within the delay, and is refused
//! otherwise, with the last decision. A full queue refuses at once. A shadow rule never
//! waits (it refuses nothing), nor does a request Redis could not decide for.

pub(crate) mod admission;
pub(crate) mod answer;
pub(crate) mod delay;
pub mod identity;
pub mod path;
pub(crate) mod refused;
pub(crate) mod tunnels;

use std::net::IpAddr;
use std::sync::Arc;

use arc_swap::ArcSwap;
use http::{HeaderMap, Method};
use ipnet::IpNet;
use tokio::time::Instant;

use delay::{DelayBounds, DelayQueue};

use crate::algorithms::{Cost, Decision, Limits};
use crate::gate::refused::{Counted, RefusedClients};
use crate::metrics::{Metrics, RuleSeries, TableSeries};
use crate::outcome::Outcome;
use crate::rules::table::ClassifyError;
use crate::rules::{ClientIp, ClientKey, Digest, Mode, RequestHead, Rule, RuleTable};
use crate::stores::{Limiter, StoreError, Verdict as StoreVerdict};
use crate::telemetry::trace::Traces;
use admission::Place;
pub use admission::{Admission, Settled};
pub use answer::{Answers, Refuse};
use identity::ClientIdentity;
pub use tunnels::TunnelSlot;
use tunnels::Tunnels;

/// What the gate is built from: the settings of its own (`MAX_UPGRADES_PER_CLIENT`,
/// `TRUSTED_PROXIES`) beside the rule table.
#[derive(Debug, Clone)]
pub(crate) struct GateSettings {
    /// The compiled rule table: every rule, route, cost and exemption.
    pub rules: RuleTable,
    /// `TRUSTED_PROXIES`: peers whose `X-Forwarded-For` is believed.
    pub trusted_proxies: Vec<IpNet>,
    /// `MAX_UPGRADES_PER_CLIENT`: most tunnels one client address holds; `None`: unlimited.
    pub max_upgrades_per_client: Option<u32>,
    /// `DELAY_QUEUE`, `DELAY_QUEUE_PER_CLIENT`: most requests waiting under a delay.
    pub delay_bounds: DelayBounds,
}

/// Classification and decision, shared by every door.
pub struct Gate {
    /// The rule table in force and what was built for it: swapped whole by a reload
    /// ([`Gate::swap`]), while a request decided under the one before keeps that one.
    current: ArcSwap<Generation>,
    /// `TRUSTED_PROXIES`.
    identity: ClientIdentity,
    /// `MAX_UPGRADES_PER_CLIENT`.
    tunnels: Tunnels,
    /// The places of requests waiting under a delay: the gate's, not a table's, so a reload
    /// leaves the waiting in their places and the caps whole.
    delays: DelayQueue,
    /// Counts decisions.
    metrics: Arc<Metrics>,
    /// One swap at a time: each builds on the table in force, so two at once would lose one.
    swapping: std::sync::Mutex<()>,
    /// The tracer (`OTEL_EXPORTER_OTLP_ENDPOINT`), every door's, as the gate is; `None`:
    /// traces are off and no door makes a span.
    traces: Option<Traces>,
}

/// One rule table and everything kept by rule id for it: a request holds the generation it
/// was decided under until it is settled, so a reload never mixes two tables' ids.
pub(crate) struct Generation {
    /// Which rule, key, cost and mode apply to a request.
    rules: RuleTable,
    /// Memory or Redis, for this table (see [`Limiter::for_rules`]).
    limiter: Limiter,
    /// The rules' metric series, by rule id.
    series: TableSeries,
    /// The clients refused most, per rule, in bounded memory: the admin's `/v1/limited`.
    refused: RefusedClients,
    /// By rule id, what a rule with concurrency limits gives back apart from the others.
    places: Box<[PlaceRules]>,
}

/// A rule's limits seen two ways, for a rule with concurrency limits: those places are given
/// back when the response ends ([`Place`]), the others under `count=failures` (when a
/// success is settled), never both for one limit.
#[derive(Default)]
struct PlaceRules {
    /// Each concurrency limit, by its position in the rule, as a rule of that limit alone.
    places: Vec<(usize, Rule)>,
    /// The rule without its concurrency limits (`None` when it has no other); for a rule
    /// without concurrency limits, `None` too, the rule itself serving.
    rest: Option<Rule>,
}

impl PlaceRules {
    /// What `rule` gives back, limit by limit.
    fn of(rule: &Rule) -> PlaceRules {
        if !rule.limits.iter().any(|policy| policy.is_concurrent()) {
            return PlaceRules::default();
        }
        let places = rule
            .limits
            .iter()
            .enumerate()
            .filter(|(_, policy)| policy.is_concurrent())
            .map(|(position, policy)| {
                (
                    position,
                    Rule {
                        limits: Limits::one(*policy),
                        ..rule.clone()
                    },
                )
            })
            .collect();
        let others: Vec<_> = rule
            .limits
            .iter()
            .filter(|policy| !policy.is_concurrent())
            .copied()
            .collect();
        let rest = Limits::new(others).ok().map(|limits| Rule {
            limits,
            ..rule.clone()
        });
        PlaceRules { places, rest }
    }
}

impl Generation {
    /// Every rule, in table order.
    pub(crate) fn rules(&self) -> &[Rule] {
        self.rules.rules()
    }

    /// The rule called `name`, for [`Gate::admit_named`].
    pub(crate) fn rule(&self, name: &str) -> Option<&Rule> {
        self.rules.rule(name)
    }

    /// The compiled table.
    pub(crate) fn table(&self) -> &RuleTable {
        &self.rules
    }

    /// The limiter of this table.
    pub(crate) fn limiter(&self) -> &Limiter {
        &self.limiter
    }

    /// The headers some rule keys its budgets by, each once.
    pub(crate) fn key_headers(&self) -> impl Iterator<Item = &http::HeaderName> {
        self.rules.key_headers()
    }

    /// Rule `id`'s metric series.
    pub(crate) fn series(&self, id: u16) -> Option<&Arc<RuleSeries>> {
        self.series.rule(id)
    }
}

/// Why an admin operation on one client did nothing.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ClientError {
    /// No rule has that name.
    #[error("no rule is called {0:?}")]
    UnknownRule(String),
    /// The client is not written as logs write it.
    #[error("{0:?} is not a client: an IP address, key:VALUE or IP+key:VALUE")]
    BadKey(String),
    /// A `key:` of a rule keyed by several sources that is not a digest as logs write it.
    #[error(
        "{0:?} is not a client of a rule keyed by several sources ({1}): its key is one digest of \
         them all, so name it as logs and /v1/limited print it, key:<32 hex digits> or IP+key:<32 hex digits>"
    )]
    NotADigest(String, String),
    /// The store could not be asked (Redis down, its breaker open).
    #[error("the store could not be asked: {0}")]
    Store(#[from] StoreError),
}

/// A request [`Gate::admit_now`] classified (its rule, key, cost and mode found, its tunnel's
/// place taken) but did not decide: the store is to be waited for, or its rule may delay.
/// Decided by [`Gate::admit_pending`]; dropped, it gives its tunnel's place back.
pub(crate) struct Pending {
    /// The table it was classified under.
    generation: Arc<Generation>,
    /// Its rule's id in `generation`.
    rule: u16,
    /// Whose budget.
    key: ClientKey,
    /// What it costs.
    cost: Cost,
    /// Enforced, shadowed, exempt or denied (only the first two are ever left pending).
    mode: Mode,
    /// The client address the rules used.
    client: IpAddr,
    /// Whether the TCP peer is one of `TRUSTED_PROXIES`.
    peer_trusted: bool,
    /// The path to forward, when not the one sent.
    rewritten: Option<String>,
    /// Its place under `MAX_UPGRADES_PER_CLIENT`, for an upgrade.
    tunnel: Option<TunnelSlot>,
}

impl Pending {
    /// The admission, with what the store said (`None`: nothing decided) and when it was
    /// asked and answered: counted under its rule, its concurrency places taken if it goes
    /// ahead.
    fn admitted(self, decision: Option<StoreVerdict>, asked: Instant, decided: Instant) -> Admission {
        let outcome = Outcome::of(self.mode, decision.as_ref());
        self.generation.count(self.rule, self.key, outcome);
        let places = match outcome.forwards() {
            true => Place::take(
                &self.generation,
                self.rule,
                self.key,
                self.cost,
                decision.as_ref(),
            ),
            false => None,
        };
        Admission {
            generation: self.generation,
            rule: self.rule,
            key: self.key,
            cost: self.cost,
            mode: self.mode,
            client: Some(self.client),
            peer_trusted: self.peer_trusted,
            rewritten: self.rewritten,
            decision,
            outcome,
            asked,
            decided,
            tunnel: self.tunnel,
            places,
        }
    }
}

/// What a door knows of a request before anything is decided.
#[derive(Debug, Clone, Copy)]
pub struct Head<'a> {
    /// The request method.
    pub method: &'a Method,
    /// The path as sent, without the query (`Uri::path`), or `*` (`OPTIONS *`).
    pub path: &'a str,
    /// The query as sent, after the `?` (`Uri::query`), for `query:NAME` keys.
    pub query: Option<&'a str>,
    /// The host the target names, if it names one (HTTP/2's `:authority`, an absolute-form
    /// target; forward-auth's `X-Forwarded-Host`): the `host` key, before the `Host` header.
    pub authority: Option<&'a str>,
    /// The request headers (`X-Forwarded-For`, `Host`, header and cookie keys).
    pub headers: &'a HeaderMap,
    /// The TCP peer.
    pub peer: IpAddr,
    /// Whether the request asks for a tunnel the door will open if the backend agrees (an
    /// HTTP/1.1 upgrade): it takes a place under `MAX_UPGRADES_PER_CLIENT` first.
    pub upgrade: bool,
}

impl<'a> Head<'a> {
    /// What the gate reads of `request` from `peer`, asking for a tunnel when `upgrade`: the
    /// proxy's and the tower layer's head alike.
    pub fn of<B>(request: &'a http::Request<B>, peer: IpAddr, upgrade: bool) -> Head<'a> {
        Head {
            method: request.method(),
            path: request.uri().path(),
            query: request.uri().query(),
            authority: request.uri().authority().map(|authority| authority.as_str()),
            headers: request.headers(),
            peer,
            upgrade,
        }
    }
}

/// Why the gate decided nothing: the request is refused before any budget is touched.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refused {
    /// The request could be read two ways (its path, or a key's query parameter): the
    /// reason, for a `400`.
    Ambiguous(String),
    /// A header the decision reads is malformed or could be read two ways (`X-Forwarded-For`
    /// from a trusted proxy, a key header, `TIER_HEADER`): the reason, for a `400`.
    Headers(String),
    /// The client holds `MAX_UPGRADES_PER_CLIENT` tunnels already (the limit), for a `429`.
    Tunnels(u32),
}

/// What [`Gate::swap`] changed: rule names, each in one list.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct Swapped {
    /// Same name and policy: budgets kept.
    pub kept: Vec<String>,
    /// Same name, another policy: budgets start afresh.
    pub changed: Vec<String>,
    /// New names.
    pub added: Vec<String>,
    /// Names no longer in the table: their budgets are dropped.
    pub removed: Vec<String>,
    /// The new table's digest.
    pub digest: u32,
}

impl Gate {
    /// The gate of `settings`, deciding with `limiter` (built for `settings.rules`) and
    /// counting into `metrics`.
    pub(crate) fn new(settings: GateSettings, limiter: Limiter, metrics: Arc<Metrics>) -> Gate {
        let ipv6_prefix = settings.rules.ipv6_prefix();
        let generation = Generation {
            places: settings.rules.rules().iter().map(PlaceRules::of).collect(),
            series: metrics.series(&settings.rules),
            refused: RefusedClients::new(settings.rules.rules().len()),
            rules: settings.rules,
            limiter,
        };
        metrics.set_config_hash(generation.rules.digest());
        Gate {
            current: ArcSwap::from_pointee(generation),
            identity: ClientIdentity::new(settings.trusted_proxies),
            tunnels: Tunnels::new(settings.max_upgrades_per_client, ipv6_prefix),
            delays: DelayQueue::new(settings.delay_bounds, metrics.delays()),
            metrics,
            swapping: std::sync::Mutex::new(()),
            traces: None,
        }
    }

    /// This gate with `traces`: every door that admits through it makes a span per request.
    pub(crate) fn with_traces(mut self, traces: Option<Traces>) -> Gate {
        self.traces = traces;
        self
    }

    /// The tracer, when traces are on: a door asks it for each request's span.
    pub(crate) fn traces(&self) -> Option<&Traces> {
        self.traces.as_ref()
    }

    /// The rule table in force, and what was built for it.
    pub(crate) fn current(&self) -> Arc<Generation> {
        self.current.load_full()
    }

    /// Put `rules` in force: the limiter made for them keeps the budgets of every rule whose
    /// name and policy are unchanged; requests decided before keep the table they started
    /// under. Returns what changed, rule by rule.
    pub(crate) fn swap(&self, rules: RuleTable) -> Swapped {
        let _one_at_a_time = self
            .swapping
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let old = self.current();
        let limiter = old.limiter.for_rules(rules.rules());
        let mut swapped = Swapped {
            digest: rules.digest(),
            ..Swapped::default()
        };
        for rule in rules.rules() {
            match old.rule(&rule.name) {
                Some(held) if held.same_budget(rule) => swapped.kept.push(rule.name.to_string()),
                Some(_) => swapped.changed.push(rule.name.to_string()),
                None => swapped.added.push(rule.name.to_string()),
            }
        }
        for rule in old.rules() {
            if rules.rule(&rule.name).is_none() {
                swapped.removed.push(rule.name.to_string());
            }
        }
        let generation = Generation {
            places: rules.rules().iter().map(PlaceRules::of).collect(),
            series: self.metrics.series(&rules),
            refused: old.refused.for_rules(old.rules(), rules.rules()),
            rules,
            limiter,
        };
        self.metrics.retire(&swapped.removed);
        self.metrics.set_limiter(generation.limiter.clone());
        self.metrics.set_config_hash(swapped.digest);
        self.current.store(Arc::new(generation));
        swapped
    }

    /// Admit one request: read the path, work out the client, classify, take a tunnel's
    /// place, ask the limiter (waiting under a rule's delay), and take the places of an
    /// allowed request under its rule's concurrency limits. The [`Admission`] owns all of it
    /// until the door settles it; or why nothing was decided.
    pub async fn admit(&self, head: &Head<'_>) -> Result<Admission, Refused> {
        match self.admit_now(head)? {
            Ok(admission) => Ok(admission),
            Err(pending) => Ok(self.admit_pending(pending).await),
        }
    }

    /// [`Gate::admit`] without waiting, where nothing is to be waited for: `Ok(admission)`
    /// when the memory store decides (it answers at once) under a rule that cannot delay, or
    /// nothing is decided (`SKIP_PATHS`, exempt, denied); else the classified request, for
    /// [`Gate::admit_pending`] to decide. A door on the request's way calls the two itself:
    /// a memory decision then makes no future at all, where `admit`'s (hundreds of bytes)
    /// was made and moved twice on every request (docs/benchmarks.md, part 27).
    pub(crate) fn admit_now(&self, head: &Head<'_>) -> Result<Result<Admission, Pending>, Refused> {
        let generation = self.current();
        let path = if head.path == "*" {
            // `OPTIONS *` names the server, not a resource: no path pattern matches it but a
            // catch-all `/*`.
            path::RequestPath {
                canonical: "*".into(),
                rewritten: None,
            }
        } else {
            path::parse(head.path).map_err(|error| Refused::Ambiguous(error.to_string()))?
        };
        let (client, peer_trusted) = self
            .identity
            .client(head.peer, head.headers)
            .map_err(|error| Refused::Headers(error.to_string()))?;
        let matched = generation
            .rules
            .classify(&RequestHead {
                method: head.method,
                path: &path.canonical,
                query: head.query,
                authority: head.authority,
                headers: head.headers,
                client_ip: client,
                // Read only by tiers.
                trusted: peer_trusted,
            })
            .map_err(|error| match error {
                ClassifyError::RepeatedKeyParameter(_) | ClassifyError::AmbiguousMethod => {
                    Refused::Ambiguous(error.to_string())
                }
                _ => Refused::Headers(error.to_string()),
            })?;
        if matched.untrusted_tier {
            self.metrics.tier_header_untrusted();
        }
        // Before any budget is spent: a refused upgrade costs none.
        let tunnel = match head.upgrade {
            true => self.tunnels.admit(client).map_err(|limit| {
                tracing::debug!(%client, limit, "upgrade refused: MAX_UPGRADES_PER_CLIENT reached");
                Refused::Tunnels(limit)
            })?,
            false => None,
        };
        let rule = matched.rule;
        // The table's costs are at most their rule's capacity: the saturation never bites.
        let (key, cost, mode) = (matched.key, Cost::saturating(matched.cost), matched.mode);
        let decided = match mode {
            Mode::Exempt | Mode::Deny => {
                let now = Instant::now();
                Some((None, now, now))
            }
            // A rule that may delay a denial waits in the queue.
            Mode::Enforce if rule.delay.is_some() => None,
            // A store other than memory (Redis, the guard) answers over the network.
            Mode::Enforce | Mode::Shadow => generation.limiter.memory().map(|memory| {
                let asked = Instant::now();
                let decision = StoreVerdict::Decided(memory.check(rule, key, cost));
                let decided = Instant::now();
                if let Some(series) = generation.series(rule.id) {
                    series.decision(decided - asked);
                }
                (Some(decision), asked, decided)
            }),
        };
        let pending = Pending {
            rule: rule.id,
            generation,
            key,
            cost,
            mode,
            client,
            peer_trusted,
            rewritten: path.rewritten,
            tunnel,
        };
        Ok(match decided {
            Some((decision, asked, decided)) => Ok(pending.admitted(decision, asked, decided)),
            None => Err(pending),
        })
    }

    /// Decide a request [`Gate::admit_now`] classified but could not decide at once: the
    /// store asked and waited for, the delay queue if its rule delays.
    pub(crate) async fn admit_pending(&self, pending: Pending) -> Admission {
        let decided = match pending.generation.rules.rules().get(usize::from(pending.rule)) {
            Some(rule) => Some(
                self.check(&pending.generation, rule, pending.key, pending.cost, pending.mode)
                    .await,
            ),
            // Not reached: the id is of this table's rules. Decided as nothing would be.
            None => None,
        };
        match decided {
            Some((decision, asked, decided)) => pending.admitted(Some(decision), asked, decided),
            None => {
                let now = Instant::now();
                pending.admitted(None, now, now)
            }
        }
    }

    /// The metrics decisions are counted in, for a door's own series (the RLS door's per
    /// descriptor).
    pub(crate) fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// Admit `cost` units of `key`'s budget under `rule`, for a door that names the client
    /// and the rule itself (the JSON API's `{"rule", "key"}`, an Envoy descriptor): the same
    /// limiter, delay, denial cache, breaker and fail mode as [`Gate::admit`], counted in the
    /// same metrics, and an [`Admission`] to act on and settle alike. `rule` is one of
    /// `generation`'s (`Generation::rule`), or one made from one with its id (Envoy's
    /// descriptor override), decided under its own limits.
    pub(crate) async fn admit_named(
        &self,
        generation: Arc<Generation>,
        rule: &Rule,
        key: ClientKey,
        cost: Cost,
    ) -> Admission {
        let mode = if rule.shadow { Mode::Shadow } else { Mode::Enforce };
        let (decision, asked, decided) = self.check(&generation, rule, key, cost, mode).await;
        let outcome = Outcome::of(mode, Some(&decision));
        generation.count(rule.id, key, outcome);
        let places = match outcome.forwards() {
            true => Place::take(&generation, rule.id, key, cost, Some(&decision)),
            false => None,
        };
        Admission {
            rule: rule.id,
            key,
            cost,
            mode,
            client: None,
            peer_trusted: false,
            rewritten: None,
            decision: Some(decision),
            outcome,
            asked,
            decided,
            tunnel: None,
            places,
            generation,
        }
    }

    /// Ask `generation`'s limiter for `cost` of `key`'s budget under `rule`, each answer's
    /// latency counted; under a rule with a delay, an enforced denial that clears within it
    /// waits in the queue and is asked again (see the module's docs). Dropping the future
    /// (the client went away) gives its place back. Returns the decision, when it was first
    /// asked for and when it ended.
    async fn check(
        &self,
        generation: &Generation,
        rule: &Rule,
        key: ClientKey,
        cost: Cost,
        mode: Mode,
    ) -> (StoreVerdict, Instant, Instant) {
        let (decision, asked, decided) = Gate::ask(generation, rule, key, cost).await;
        let Some((delay, retry_after)) = delayable(rule, mode, &decision) else {
            return (decision, asked, decided);
        };
        // Boxed, the rare way: its timer and queue place would make every request's future
        // larger, and a request's future is moved several times before it is polled
        // (docs/benchmarks.md, part 17).
        let (decision, decided) = Box::pin(self.wait(generation, rule, key, cost, delay, retry_after))
            .await
            .unwrap_or((decision, decided));
        (decision, asked, decided)
    }

    /// One decision, its latency counted in the rule's series: what it decided, when it was
    /// asked for and when it ended (one reading of the clock ends the decision and starts the
    /// backend's).
    async fn ask(
        generation: &Generation,
        rule: &Rule,
        key: ClientKey,
        cost: Cost,
    ) -> (StoreVerdict, Instant, Instant) {
        let asked = Instant::now();
        let decision = generation.limiter.check(rule, key, cost).await;
        let decided = Instant::now();
        if let Some(series) = generation.series(rule.id) {
            series.decision(decided - asked);
        }
        (decision, asked, decided)
    }

    /// A denial clearing within `delay`, first in `retry_after`: wait for it in the queue and
    /// ask again, while the wait stays within the delay. `None` when the queue is full (the
    /// denial stands).
    async fn wait(
        &self,
        generation: &Generation,
        rule: &Rule,
        key: ClientKey,
        cost: Cost,
        delay: std::time::Duration,
        mut retry_after: std::time::Duration,
    ) -> Option<(StoreVerdict, Instant)> {
        let _place = match self.delays.take(&rule.name, key) {
            Ok(place) => place,
            Err(full) => {
                tracing::debug!(rule = %rule.name, queue = full.as_str(), "delay queue full: refused at once");
                return None;
            }
        };
        let waiting = Instant::now();
        let decision = loop {
            // At least a millisecond: a retry time rounded to zero must not spin.
            tokio::time::sleep(retry_after.max(std::time::Duration::from_millis(1))).await;
            let (decision, _, decided) = Gate::ask(generation, rule, key, cost).await;
            match denied_within(&decision, delay.saturating_sub(decided - waiting)) {
                Some(again) => retry_after = again,
                None => break (decision, decided),
            }
        };
        if let Some(series) = generation.series(rule.id) {
            series.delayed(decision.1 - waiting);
        }
        Some(decision)
    }

    /// Give `client` its whole budget back under the rule called `rule` (for every replica,
    /// with Redis). Returns the rule's name, the client's key and whether the store held a
    /// budget of it to forget (a client never seen, or long idle, has its whole budget and
    /// nothing to reset).
    pub(crate) async fn reset(
        &self,
        rule: &str,
        client: &str,
    ) -> Result<(Arc<str>, ClientKey, bool), ClientError> {
        let generation = self.current();
        let (rule, (key, displayed)) = generation.client_of(rule, client)?;
        let mut held = generation.limiter.reset(rule, key).await?;
        // `key:<digest>` as logs print it, under a rule keyed by one source: the raw value's
        // budget or the displayed digest's, whichever the store holds (both, were the two
        // ever to collide, which 128 bits make moot).
        let mut found = key;
        if let Some(displayed) = displayed
            && generation.limiter.reset(rule, displayed).await?
        {
            (held, found) = (true, displayed);
        }
        Ok((rule.name.clone(), found, held))
    }

    /// What `client` has left under the rule called `rule`, spending nothing: the rule's name
    /// and policy, the client's key, and the decision.
    pub(crate) async fn inspect(
        &self,
        rule: &str,
        client: &str,
    ) -> Result<(Rule, ClientKey, Decision), ClientError> {
        let generation = self.current();
        let (rule, (key, displayed)) = generation.client_of(rule, client)?;
        let mut decision = generation.limiter.inspect(rule, key).await?;
        let mut found = key;
        // Of the raw value's budget and the displayed digest's, the one in use: a budget
        // entirely back has nothing to wait for (`reset_after` zero), one in use has.
        if let Some(displayed) = displayed {
            let other = generation.limiter.inspect(rule, displayed).await?;
            if other.reset_after > decision.reset_after {
                (decision, found) = (other, displayed);
            }
        }
        Ok((rule.clone(), found, decision))
    }

    /// Each rule, in table order, with its `top` clients refused most in the last minute (see
    /// [`crate::gate::refused`]).
    pub(crate) fn most_refused(&self, top: usize) -> Vec<(Arc<str>, Vec<Counted>)> {
        let generation = self.current();
        generation
            .rules()
            .iter()
            .map(|rule| (rule.name.clone(), generation.refused.top(rule.id, top)))
            .collect()
    }

    /// Whether `peer` is one of `TRUSTED_PROXIES` (whose forwarding headers are kept).
    pub(crate) fn trusts(&self, peer: IpAddr) -> bool {
        self.identity.is_trusted(peer)
    }
}

/// Whether `decision` under `rule` (in `mode`) is to wait rather than be refused: an
/// enforced denial clearing within the rule's delay; its delay and retry time.
fn delayable(
    rule: &Rule,
    mode: Mode,
    decision: &StoreVerdict,
) -> Option<(std::time::Duration, std::time::Duration)> {
    let (Some(delay), Mode::Enforce) = (rule.delay, mode) else {
        return None;
    };
    denied_within(decision, delay).map(|retry_after| (delay, retry_after))
}

/// The retry time of `decision` when it is a denial that clears within `delay`: a store's (or
/// the local fallback's) refusal, not a fail mode's.
fn denied_within(decision: &StoreVerdict, delay: std::time::Duration) -> Option<std::time::Duration> {
    decision
        .decision()
        .filter(|decision| !decision.allowed && decision.retry_after <= delay)
        .map(|decision| decision.retry_after)
}

impl Generation {
    /// A decided request counts in the metrics, and a refused one toward its client's place
    /// in `/v1/limited`.
    fn count(&self, rule: u16, key: ClientKey, outcome: Outcome) {
        if let Some(series) = self.series(rule) {
            series.request(outcome);
        }
        if matches!(outcome, Outcome::Limited | Outcome::LocalLimited) {
            self.refused.refused(rule, key);
        }
    }

    /// Digests a client's own name (a descriptor's entries) into a [`ClientKey`], with the key
    /// every replica shares (`KEY_HASH_SECRET`).
    pub(crate) fn key_of(&self, value: &[u8]) -> ClientKey {
        ClientKey::Header(self.rules.hasher().digest(value))
    }

    /// The key a door that names the client (the JSON API's `{"rule", "key"}`) means by
    /// `value` under `rule`: as a request whose source held `value` is keyed, when the rule is
    /// keyed by one source besides the address (so `{"key": "acme"}` under `query:tenant`
    /// spends what `?tenant=acme` spends); else the digest of `value` alone, a name of its own.
    pub(crate) fn named_key(&self, rule: &Rule, value: &[u8]) -> ClientKey {
        let hasher = self.rules.hasher();
        match rule.key_by.single() {
            Some(source) => ClientKey::Header(hasher.digest_of(std::slice::from_ref(source), &[value])),
            None => ClientKey::Header(hasher.digest(value)),
        }
    }

    /// The client written `text` as logs write it, under `rule`: an address (`203.0.113.7`, or
    /// an IPv6 network `2001:db8:1:2::/64`, grouped by `IPV6_PREFIX` and written with that
    /// prefix), `key:VALUE` or `IP+key:VALUE`. Under a rule keyed by one source besides the
    /// address, `VALUE` is that source's raw value (a header's, a cookie's, ...), digested as a
    /// request's is; under one keyed by several, whose key is one digest of them all, it is
    /// that digest, 32 hex digits as logs and `/v1/limited` print it.
    ///
    /// The second key is the other reading of a `VALUE` of 32 hex digits under a rule keyed by
    /// one source: the digest as logs and `/v1/limited` print it, taken as it is (an operator
    /// copies ids from them), where the first key is the raw value digested.
    fn client_key(&self, rule: &Rule, text: &str) -> Result<(ClientKey, Option<ClientKey>), ClientError> {
        let prefix = self.rules.ipv6_prefix();
        let ip = |text: &str| {
            // A network as logs write it: its address, and the prefix its key is grouped by
            // (anything else after a `/` names no client: `127.0.0.1/extra` is not 127.0.0.1).
            let (address, written) = match text.split_once('/') {
                Some((address, written)) => (address, Some(written)),
                None => (text, None),
            };
            let ip = ClientIp::new(address.parse::<IpAddr>().ok()?, prefix);
            match written {
                Some(written) if written.parse::<u8>().ok() != Some(ip.prefix()) => None,
                _ => Some(ip),
            }
        };
        let digests = |value: &str| match rule.key_by.sources() {
            [] | [_] => Ok([
                self.named_key(rule, value.as_bytes()).digest(),
                Digest::parse(value),
            ]),
            _ => Digest::parse(value)
                .map(|digest| [Some(digest), None])
                .ok_or_else(|| ClientError::NotADigest(text.to_owned(), rule.key_by.to_string())),
        };
        let bad = || ClientError::BadKey(text.to_owned());
        if let Some(value) = text.strip_prefix("key:") {
            let [raw, displayed] = digests(value)?;
            return Ok((
                ClientKey::Header(raw.ok_or_else(bad)?),
                displayed.map(ClientKey::Header),
            ));
        }
        if let Some((address, value)) = text.split_once("+key:")
            && let Some(ip) = ip(address)
        {
            let [raw, displayed] = digests(value)?;
            return Ok((
                ClientKey::IpAndHeader(ip, raw.ok_or_else(bad)?),
                displayed.map(|digest| ClientKey::IpAndHeader(ip, digest)),
            ));
        }
        let ip = ip(text).ok_or_else(bad)?;
        Ok((ClientKey::Ip(ip), None))
    }

    /// The rule called `rule` and the client written `client` (see [`Generation::client_key`]):
    /// its key, and the other reading of a displayed digest.
    #[allow(clippy::type_complexity)]
    fn client_of(
        &self,
        rule: &str,
        client: &str,
    ) -> Result<(&Rule, (ClientKey, Option<ClientKey>)), ClientError> {
        let found = self
            .rule(rule)
            .ok_or_else(|| ClientError::UnknownRule(rule.to_owned()))?;
        Ok((found, self.client_key(found, client)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Config;

    fn config(routes: &str) -> Config {
        Config::from_vars([("BACKEND_URL", "http://127.0.0.1:9"), ("ROUTES", routes)]).unwrap()
    }

    fn gate(config: &Config) -> Gate {
        let limiter = crate::app::limiter(config).unwrap();
        let load = crate::metrics::Load {
            connections: Arc::new(crate::server::limits::ConnectionSlots::new(1)),
            requests: Arc::new(crate::server::limits::ConnectionSlots::new(1)),
        };
        let metrics = Arc::new(Metrics::new(limiter.clone(), load));
        Gate::new(config.gate.clone(), limiter, metrics)
    }

    /// A gate of `ROUTES=routes` plus `vars`.
    fn delaying(routes: &str, vars: &[(&str, &str)]) -> Gate {
        let mut all = vec![("BACKEND_URL", "http://127.0.0.1:9"), ("ROUTES", routes)];
        all.extend_from_slice(vars);
        gate(&Config::from_vars(all).unwrap())
    }

    /// The sample `series` of `gate`'s metrics (`name{labels}`), as a number.
    fn sample(gate: &Gate, series: &str) -> f64 {
        let text = gate.metrics.encode(crate::metrics::Format::Prometheus).unwrap();
        text.lines()
            .find_map(|line| line.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
            .unwrap_or_else(|| panic!("no {series} in {text}"))
    }

    fn remaining(verdict: &Admission) -> u64 {
        verdict
            .decision
            .as_ref()
            .and_then(|d| d.decision().cloned())
            .unwrap()
            .remaining
    }

    #[tokio::test(start_paused = true)]
    async fn a_denial_within_the_delay_waits_its_retry_time_and_goes() {
        let gate = delaying("/slow=token_bucket:1:1,name=slow,delay=1500", &[]);
        let headers = HeaderMap::new();
        let first = gate.admit(&head("/slow", &headers)).await.unwrap();
        assert_eq!(first.outcome, Outcome::Allowed);
        let started = Instant::now();
        let second = gate.admit(&head("/slow", &headers)).await.unwrap();
        assert_eq!(second.outcome, Outcome::Allowed, "after its wait");
        assert_eq!(remaining(&second), 0, "the allowed decision's headers");
        let waited = started.elapsed();
        assert!(
            waited >= std::time::Duration::from_secs(1) && waited < std::time::Duration::from_millis(1100),
            "{waited:?}"
        );
        assert_eq!(sample(&gate, r#"tollgate_delay_seconds_count{rule="slow"}"#), 1.0);
        assert_eq!(sample(&gate, "tollgate_delayed_requests"), 0.0);
        assert_eq!(
            sample(
                &gate,
                r#"tollgate_requests_total{rule="slow",decision="allowed"}"#
            ),
            2.0
        );
        assert_eq!(
            sample(
                &gate,
                r#"tollgate_requests_total{rule="slow",decision="limited"}"#
            ),
            0.0
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_denial_beyond_the_delay_a_shadow_rule_and_a_rule_without_one_answer_at_once() {
        let gate = delaying(
            "/far=token_bucket:1:0.5,name=far,delay=1500;/shadow=token_bucket:1:1,name=shadow,shadow,delay=1500;/now=token_bucket:1:1,name=now",
            &[],
        );
        let headers = HeaderMap::new();
        for (path, then) in [
            ("/far", Outcome::Limited),
            ("/shadow", Outcome::Shadow),
            ("/now", Outcome::Limited),
        ] {
            assert_eq!(
                gate.admit(&head(path, &headers)).await.unwrap().outcome,
                Outcome::Allowed
            );
            let started = Instant::now();
            let verdict = gate.admit(&head(path, &headers)).await.unwrap();
            assert_eq!((path, verdict.outcome), (path, then));
            assert_eq!(started.elapsed(), std::time::Duration::ZERO, "{path}");
        }
        assert_eq!(sample(&gate, r#"tollgate_delay_seconds_count{rule="far"}"#), 0.0);
    }

    #[tokio::test(start_paused = true)]
    async fn two_waiting_for_one_token_one_goes_and_the_other_is_refused_when_its_delay_would_run_out() {
        let gate = delaying("/slow=token_bucket:1:1,name=slow,delay=1500", &[]);
        let headers = HeaderMap::new();
        gate.admit(&head("/slow", &headers)).await.unwrap();
        let started = Instant::now();
        let timed = || async {
            let verdict = gate.admit(&head("/slow", &headers)).await.unwrap();
            (verdict.outcome, started.elapsed())
        };
        let (a, b) = tokio::join!(timed(), timed());
        let mut outcomes = [a.0, b.0];
        outcomes.sort_by_key(|outcome| outcome.as_str());
        assert_eq!(outcomes, [Outcome::Allowed, Outcome::Limited]);
        // Both woke at the token's time; the loser's next one (2 s) is past its 1.5 s.
        for (_, waited) in [a, b] {
            assert!(
                waited >= std::time::Duration::from_secs(1)
                    && waited < std::time::Duration::from_millis(1100),
                "{waited:?}"
            );
        }
        assert_eq!(sample(&gate, r#"tollgate_delay_seconds_count{rule="slow"}"#), 2.0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_full_queue_refuses_at_once_and_a_dropped_wait_gives_its_place_back() {
        let gate = delaying(
            "/slow=token_bucket:1:0.1,name=slow,delay=15000",
            &[("DELAY_QUEUE_PER_CLIENT", "1")],
        );
        let headers = HeaderMap::new();
        gate.admit(&head("/slow", &headers)).await.unwrap();
        let slow = head("/slow", &headers);
        // Boxed, so that dropping it drops the future itself, as hyper does.
        let mut waiting = Box::pin(gate.admit(&slow));
        tokio::select! {
            _ = &mut waiting => panic!("a 10 s wait ended at once"),
            _ = tokio::time::sleep(std::time::Duration::from_millis(100)) => {}
        }
        assert_eq!(sample(&gate, "tollgate_delayed_requests"), 1.0);
        let started = Instant::now();
        let refused = gate.admit(&head("/slow", &headers)).await.unwrap();
        assert_eq!(refused.outcome, Outcome::Limited);
        assert_eq!(started.elapsed(), std::time::Duration::ZERO, "refused at once");
        assert_eq!(
            sample(&gate, r#"tollgate_delay_queue_full_total{queue="client"}"#),
            1.0
        );
        // The waiting request's client goes away: its future is dropped, its place freed.
        drop(waiting);
        assert_eq!(sample(&gate, "tollgate_delayed_requests"), 0.0);
        let mut next = Box::pin(gate.admit(&slow));
        tokio::select! {
            _ = &mut next => panic!("a 10 s wait ended at once"),
            _ = tokio::time::sleep(std::time::Duration::from_millis(100)) => {}
        }
        assert_eq!(
            sample(&gate, "tollgate_delayed_requests"),
            1.0,
            "the next one has the place"
        );
        assert_eq!(next.await.unwrap().outcome, Outcome::Allowed);
    }

    #[tokio::test(start_paused = true)]
    async fn the_json_doors_decisions_wait_as_the_proxys_do() {
        let gate = delaying("/slow=token_bucket:1:1,name=slow,delay=1500", &[]);
        let generation = gate.current();
        let rule = generation.rule("slow").unwrap().clone();
        let key = generation.named_key(&rule, b"acme");
        assert_eq!(
            gate.admit_named(generation.clone(), &rule, key, Cost::ONE)
                .await
                .outcome,
            Outcome::Allowed
        );
        let started = Instant::now();
        assert_eq!(
            gate.admit_named(generation.clone(), &rule, key, Cost::ONE)
                .await
                .outcome,
            Outcome::Allowed
        );
        assert!(started.elapsed() >= std::time::Duration::from_secs(1));
    }

    /// What rule `name` of `gate`'s table has left for the client of [`head`], spending nothing.
    async fn left(gate: &Gate, name: &str) -> u64 {
        let generation = gate.current();
        let rule = generation.rule(name).unwrap();
        let key = ClientKey::Ip(ClientIp::new(IpAddr::from([192, 0, 2, 1]), 64));
        generation.limiter().inspect(rule, key).await.unwrap().remaining
    }

    #[tokio::test(start_paused = true)]
    async fn an_unsettled_admission_dropped_gives_its_places_and_tunnel_slot_back() {
        let gate = delaying("/dl=concurrent:1,name=dl", &[("MAX_UPGRADES_PER_CLIENT", "1")]);
        let headers = HeaderMap::new();
        let upgrade = Head {
            upgrade: true,
            ..head("/dl", &headers)
        };
        let admission = gate.admit(&upgrade).await.unwrap();
        assert_eq!(admission.outcome(), Outcome::Allowed);
        assert!(admission.places.is_some() && admission.tunnel.is_some());
        assert_eq!(left(&gate, "dl").await, 0);
        assert_eq!(gate.tunnels.clients(), 1);
        // Held: the next one is refused, its upgrade first.
        assert_eq!(gate.admit(&upgrade).await.unwrap_err(), Refused::Tunnels(1));
        assert_eq!(
            gate.admit(&head("/dl", &headers)).await.unwrap().outcome(),
            Outcome::Limited
        );
        // A door that forgets to settle (an early return, its client gone): dropped, it gives
        // everything back.
        tokio::time::advance(std::time::Duration::from_millis(10)).await;
        drop(admission);
        assert_eq!(left(&gate, "dl").await, 1, "the place is back");
        assert_eq!(gate.tunnels.clients(), 0, "the tunnel's place is back");
        assert_eq!(gate.admit(&upgrade).await.unwrap().outcome(), Outcome::Allowed);
    }

    #[tokio::test(start_paused = true)]
    async fn a_settled_admission_s_places_follow_its_response_and_elsewhere_they_run_their_lease() {
        let gate = delaying("/dl=concurrent:1:1,name=dl", &[]);
        let headers = HeaderMap::new();
        let admission = gate.admit(&head("/dl", &headers)).await.unwrap();
        let mut settled = admission.settle(200, None).await;
        assert_eq!(left(&gate, "dl").await, 0, "held by the response");
        settled.release();
        assert_eq!(left(&gate, "dl").await, 1, "its last frame is handed over");
        drop(settled);
        assert_eq!(left(&gate, "dl").await, 1, "given back once");
        // A door whose request is carried out elsewhere leaves the lease to run its time.
        let elsewhere = gate.admit(&head("/dl", &headers)).await.unwrap();
        assert!(elsewhere.places.is_some());
        elsewhere.settle_elsewhere();
        assert_eq!(left(&gate, "dl").await, 0, "the lease runs");
        tokio::time::advance(std::time::Duration::from_millis(1_001)).await;
        assert_eq!(left(&gate, "dl").await, 1, "and ends");
    }

    #[tokio::test]
    async fn the_answers_tell_an_enforced_decision_and_hide_a_shadow_one() {
        let gate = delaying(
            "/shadow=token_bucket:1:0.001,name=shadow,shadow;/api=token_bucket:1:0.001,name=api",
            &[],
        );
        let answers = Answers::new(
            crate::limit_headers::HeaderStyle::Both,
            crate::refusal::Refusals::default(),
            true,
        );
        let written: HeaderMap = [(
            http::HeaderName::from_static("ratelimit"),
            http::HeaderValue::from_static("\"api\";r=1000;t=1"),
        )]
        .into_iter()
        .collect();
        for (path, told) in [("/api", true), ("/shadow", false)] {
            for _ in 0..2 {
                let admission = gate.admit(&head(path, &written)).await.unwrap();
                let mut response = HeaderMap::new();
                match answers.refusal(&admission, &written, Refuse::Client) {
                    Some(refusal) => response = refusal.headers().clone(),
                    None => answers.set_headers(&admission, &mut response),
                }
                assert_eq!(response.contains_key("x-ratelimit-remaining"), told, "{path}");
                assert_eq!(response.contains_key("ratelimit-policy"), told, "{path}");
                // The backend never reads the budget the client wrote: ours, or none.
                let mut forwarded = written.clone();
                answers.set_forwarded(&admission, &mut forwarded);
                let budget = forwarded
                    .get("ratelimit")
                    .map(|value| value.to_str().unwrap().to_owned());
                match told {
                    true => assert!(budget.is_some_and(|budget| budget.starts_with("\"api\";r=0"))),
                    false => assert_eq!(budget, None, "{path}"),
                }
                admission.settle(200, None).await;
            }
        }
    }

    fn head<'a>(path: &'a str, headers: &'a HeaderMap) -> Head<'a> {
        Head {
            method: &Method::POST,
            path,
            query: None,
            authority: None,
            headers,
            peer: IpAddr::from([192, 0, 2, 1]),
            upgrade: false,
        }
    }

    #[tokio::test]
    async fn a_request_decided_before_a_swap_is_settled_under_the_table_it_started_with() {
        let before = config(
            "/login2=token_bucket:2:0.001,name=login2,count=failures;/api=token_bucket:5:0.001,name=api",
        );
        let gate = gate(&before);
        let headers = HeaderMap::new();
        let in_flight = gate.admit(&head("/login2", &headers)).await.unwrap();
        assert_eq!(in_flight.rule().name.as_ref(), "login2");
        // A route comes first now: every id moves, and login2 has other numbers.
        let after = config(
            "/new=token_bucket:1:0.001,name=new;/login2=token_bucket:9:0.001,name=login2;/api=token_bucket:5:0.001,name=api",
        );
        let swapped = gate.swap(after.gate.rules.clone());
        assert_eq!(swapped.added, ["new"]);
        assert_eq!(swapped.changed, ["login2"]);
        assert!(swapped.kept.contains(&"api".to_owned()) && swapped.kept.contains(&"general".to_owned()));
        assert_ne!(swapped.digest, before.gate.rules.digest());
        // Settled after the swap: refunded to the table it was decided under, the old login2.
        assert_eq!(in_flight.generation.table().digest(), before.gate.rules.digest());
        let old = in_flight.generation.clone();
        let rule = in_flight.rule().clone();
        let key = in_flight.key;
        assert_eq!(old.limiter().inspect(&rule, key).await.unwrap().remaining, 1);
        in_flight.settle(200, None).await;
        assert_eq!(
            old.limiter().inspect(&rule, key).await.unwrap().remaining,
            2,
            "refunded there"
        );
        // The new table's login2 starts afresh with its own numbers; api kept its budget.
        let now = gate.admit(&head("/login2", &headers)).await.unwrap();
        assert_eq!(
            now.decision
                .as_ref()
                .and_then(|d| d.decision().cloned())
                .unwrap()
                .remaining,
            8
        );
        assert_eq!(now.rule().id, 1, "the id of the table in force");
    }

    #[tokio::test]
    async fn a_kept_rule_shares_its_budgets_between_the_tables_old_and_new() {
        let before = config("/api=token_bucket:3:0.001,name=api");
        let gate = gate(&before);
        let headers = HeaderMap::new();
        let first = gate.admit(&head("/api", &headers)).await.unwrap();
        gate.swap(
            config("/x=token_bucket:1:1,name=x;/api=token_bucket:3:0.001,name=api")
                .gate
                .rules,
        );
        let second = gate.admit(&head("/api", &headers)).await.unwrap();
        let remaining = |verdict: &Admission| {
            verdict
                .decision
                .as_ref()
                .and_then(|d| d.decision().cloned())
                .unwrap()
                .remaining
        };
        assert_eq!(
            (remaining(&first), remaining(&second)),
            (2, 1),
            "one budget across the swap"
        );
        // And a request still under the old table spends from the same one.
        let old = first.generation.clone();
        let decided = old.limiter().check(first.rule(), first.key, Cost::ONE).await;
        assert_eq!(decided.decision().unwrap().remaining, 0);
    }
}
