//! One request's life at the gate: [`Admission`], what [`Gate::admit`](super::Gate::admit)
//! returns, owns everything the request holds (the table it was decided under, its rule, key
//! and cost, the decision and the numbers for the headers, its tunnel's place, its
//! concurrency places) and is settled by consuming it.
//!
//! Every door reads the same three steps, as pingora's `ProxyHttp` phases read around one
//! per-request context: **admit** (the gate classifies and decides), **act** (forward the
//! request, or answer for the calling proxy, or write the gateway's own answer with
//! [`super::answer`]), **settle** ([`Admission::settle`] once the response's status is known,
//! or [`Admission::settle_elsewhere`] by a door whose request is carried out by someone else).
//! Settling consumes the admission, so it happens once; an admission a door never settles (its
//! future dropped when the client went away, an early return) gives back on `Drop` whatever it
//! holds: its concurrency places and its tunnel's place. No step can be forgotten into a leak.
//!
//! The concurrency places outlive the admission: [`Admission::settle`] hands them to the
//! [`Settled`] it returns, which the response body holds until its last frame is handed over
//! (the server's response body wrapper), so a long download holds its place while it streams.

use std::fmt;
use std::net::IpAddr;
use std::sync::Arc;

use tokio::time::Instant;

use super::tunnels::TunnelSlot;
use super::{Generation, PlaceRules};
use crate::algorithms::{Cost, Decision};
use crate::limit_headers::retry_after_secs;
use crate::metrics::RuleSeries;
use crate::outcome::Outcome;
use crate::rules::{ClientKey, Count, Mode, Rule};
use crate::stores::{Decide, Verdict as StoreVerdict};
use crate::telemetry::trace::Admitted;

/// What the gate decided about one request, and everything the request holds until it is
/// settled. Its life: this module's docs (`gate::admission`).
pub struct Admission {
    /// The table it was decided under, held until it is settled: a reload never mixes two
    /// tables' rule ids.
    pub(super) generation: Arc<Generation>,
    /// The id of the rule it was classified under, in `generation`.
    pub(super) rule: u16,
    /// Whose budget.
    pub(super) key: ClientKey,
    /// What it costs.
    pub(super) cost: Cost,
    /// Enforced, shadowed, exempt (not decided) or denied.
    pub(super) mode: Mode,
    /// The client address the rules used (the peer, or from a trusted `X-Forwarded-For`);
    /// `None` for a door that named the client itself ([`super::Gate::admit_named`]).
    pub(super) client: Option<IpAddr>,
    /// Whether the TCP peer is one of `TRUSTED_PROXIES`, read once while finding the client:
    /// whether the forwarding headers it sent are believed.
    pub(super) peer_trusted: bool,
    /// `Some` when the backend must get another path than the one sent (dot segments
    /// resolved, leading slashes merged); `None`: the path as sent.
    pub(super) rewritten: Option<String>,
    /// What the store said; `None` for a request not decided (`SKIP_PATHS`, `EXEMPT`, a
    /// `deny` override).
    pub(super) decision: Option<StoreVerdict>,
    /// What the door is to do with it.
    pub(super) outcome: Outcome,
    /// When the store was first asked (the decision's start; `decided` when none was asked):
    /// a trace's child span for the store's call, read from the clocks the gate reads anyway.
    pub(super) asked: Instant,
    /// When the decision ended: one reading of the clock ends it and starts the backend's.
    pub(super) decided: Instant,
    /// The client's place under `MAX_UPGRADES_PER_CLIENT` for an upgrade: the door hands it to
    /// the tunnel ([`Admission::take_tunnel`]), which holds it until it closes.
    pub(super) tunnel: Option<TunnelSlot>,
    /// The places an allowed request holds under its rule's concurrency limits; boxed, so an
    /// admission (and the response body that ends up holding them) stays small for the
    /// requests of every other rule.
    pub(super) places: Option<Box<Place>>,
}

impl fmt::Debug for Admission {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Admission")
            .field("rule", &self.rule().name)
            .field("key", &self.key)
            .field("cost", &self.cost)
            .field("mode", &self.mode)
            .field("client", &self.client)
            .field("decision", &self.decision)
            .field("outcome", &self.outcome)
            .field("places", &self.places.is_some())
            .field("tunnel", &self.tunnel.is_some())
            .finish_non_exhaustive()
    }
}

impl Admission {
    /// The rule it was classified under (for [`super::Gate::admit_named`], the table's rule of
    /// that id).
    pub(crate) fn rule(&self) -> &Rule {
        &self.generation.rules.rules()[usize::from(self.rule)]
    }

    /// The rule's metric series: what the door counts the response and the backend in.
    pub(crate) fn series(&self) -> Option<&Arc<RuleSeries>> {
        self.generation.series(self.rule)
    }

    /// The name of the rule it was classified under (`general`, `auth`, a route's), as logs
    /// and metrics name it.
    pub fn rule_name(&self) -> &str {
        &self.rule().name
    }

    /// Whose budget.
    pub fn key(&self) -> ClientKey {
        self.key
    }

    /// Enforced, shadowed, exempt or denied.
    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// The client address the rules used; `None` when the door named the client itself.
    pub fn client(&self) -> Option<IpAddr> {
        self.client
    }

    /// Whether the TCP peer is one of `TRUSTED_PROXIES`: whether the forwarding headers it
    /// sent (`X-Forwarded-*`, `Forwarded`) are kept on the way to the backend.
    pub fn peer_trusted(&self) -> bool {
        self.peer_trusted
    }

    /// The path the backend must get instead of the one sent, if another.
    pub fn rewritten(&self) -> Option<&str> {
        self.rewritten.as_deref()
    }

    /// The store's decision, if one was made: the numbers for the rate-limit headers.
    pub fn decision(&self) -> Option<&Decision> {
        self.decision.as_ref().and_then(StoreVerdict::decision)
    }

    /// What the door is to do with it.
    pub fn outcome(&self) -> Outcome {
        self.outcome
    }

    /// Whether the request goes ahead (to the backend, or back to the calling proxy as
    /// allowed).
    pub fn forwards(&self) -> bool {
        self.outcome.forwards()
    }

    /// When the decision ended: what the backend's latency and timeout count from.
    pub fn decided(&self) -> Instant {
        self.decided
    }

    /// What its request's trace span says of it: rule, decision, the numbers, and when the
    /// store was asked and when its decision ended (under a delay, the last decision's end).
    pub(crate) fn traced(&self) -> Admitted<'_> {
        Admitted {
            rule: self.rule_name(),
            decision: self.outcome.as_str(),
            numbers: self
                .decision()
                .map(|decision| (decision.limit, decision.remaining)),
            store_call: self.decision.as_ref().map(|_| (self.asked, self.decided)),
        }
    }

    /// For a refused request with a decision, the whole seconds until the same request would
    /// be allowed (`Retry-After`).
    pub fn retry_after_secs(&self) -> Option<u64> {
        self.decision()
            .filter(|_| !self.forwards())
            .map(|decision| retry_after_secs(decision.retry_after))
    }

    /// The client's place under `MAX_UPGRADES_PER_CLIENT`, for the tunnel to hold until it
    /// closes; taken once (`None` after, and for a request that asked for no upgrade).
    pub(crate) fn take_tunnel(&mut self) -> Option<TunnelSlot> {
        self.tunnel.take()
    }

    /// After the answer (`status`): a success under `count=failures` gets its cost back;
    /// else a cost the backend `reported` (`RESPONSE_COST_HEADER`) replaces the one charged
    /// up front, the difference charged (into debt if need be) or given back, in the store
    /// that decided. A request forwarded by a shadow rule's would-be refusal spent nothing up
    /// front, so all it reported is charged. Its tunnel's place, if no tunnel took it, goes
    /// back now; its concurrency places go to the [`Settled`] returned, which the response
    /// body holds until its last frame is handed over.
    ///
    /// What the store is asked is worked out at once, so the future returned owns only that
    /// (an `async fn` would hold the whole admission, twice: it is part of every request's
    /// future).
    pub fn settle(
        mut self,
        status: u16,
        reported: Option<Cost>,
    ) -> impl Future<Output = Settled> + Send + use<> {
        let settled = Settled {
            places: self.places.take(),
        };
        let change = self.change(status, reported);
        let Admission {
            generation,
            rule,
            key,
            decision,
            ..
        } = self;
        async move {
            if let (Some((rest, change)), Some(decision)) = (change, &decision) {
                let rule = match rest {
                    true => generation
                        .places
                        .get(usize::from(rule))
                        .and_then(|places| places.rest.as_ref()),
                    false => generation.rules.rules().get(usize::from(rule)),
                };
                if let Some(rule) = rule {
                    let limiter = &generation.limiter;
                    match change {
                        Change::Refund(cost) => limiter.refund(rule, key, cost, decision).await,
                        Change::Charge(cost) => limiter.charge(rule, key, cost, decision).await,
                    }
                }
            }
            settled
        }
    }

    /// What settling with `status` (and the cost the backend `reported`) asks of the store
    /// that decided, if anything, and whether of the rule's rate limits apart from its
    /// concurrency limits (`true`) or of the rule itself.
    fn change(&self, status: u16, reported: Option<Cost>) -> Option<(bool, Change)> {
        self.decision.as_ref()?;
        // Concurrency places are given back when the response ends, by the places: what is
        // refunded or charged here is the rule's rate limits' alone.
        let (rest, rule) = match self.generation.places.get(usize::from(self.rule)) {
            Some(PlaceRules { rest: None, places }) if !places.is_empty() => return None,
            Some(PlaceRules { rest: Some(rest), .. }) => (true, rest),
            _ => (false, self.rule()),
        };
        let spent = matches!(self.outcome, Outcome::Allowed | Outcome::LocalAllowed);
        if rule.count == Count::Failures && spent && status < 400 {
            return Some((rest, Change::Refund(self.cost)));
        }
        let charged = match self.outcome {
            _ if spent => self.cost,
            Outcome::Shadow => Cost::ZERO,
            _ => return None,
        };
        match reported {
            Some(cost) if cost > charged => Some((rest, Change::Charge(cost.saturating_sub(charged)))),
            Some(cost) if cost < charged => Some((rest, Change::Refund(charged.saturating_sub(cost)))),
            _ => None,
        }
    }

    /// Settle an admission whose request is carried out out of this door's sight (the
    /// calling proxy's after forward-auth, Envoy's after a descriptor, the service's after
    /// `/v1/check`): no status to settle by, so nothing is refunded or charged, and its
    /// concurrency leases are left to run their full time (no one here can tell when the
    /// request ends). Its tunnel's place goes back.
    pub fn settle_elsewhere(mut self) {
        if let Some(places) = &mut self.places {
            places.keep_leases();
        }
    }
}

/// What settling asks of the store.
#[derive(Debug, Clone, Copy)]
enum Change {
    /// Give this much back.
    Refund(Cost),
    /// Take this much more (into debt if need be).
    Charge(Cost),
}

/// What a settled admission leaves for its response to hold: the places under its rule's
/// concurrency limits, given back when this is dropped or [`Settled::release`]d (the response
/// body does at its last frame). Empty for most requests.
#[derive(Debug, Default)]
pub struct Settled {
    places: Option<Box<Place>>,
}

impl Settled {
    /// Nothing held.
    pub fn none() -> Settled {
        Settled::default()
    }

    /// Give the places back now (the response's last frame is handed over).
    pub fn release(&mut self) {
        self.places = None;
    }
}

/// An allowed request's places under its rule's concurrency limits (`concurrent:N`), given
/// back once, when dropped: at the end of the response (see [`Settled`]), or with an admission
/// dropped unsettled. [`Place::keep_leases`] leaves them to their leases instead.
pub(crate) struct Place {
    /// The table it was decided under, whose store holds the places.
    generation: Arc<Generation>,
    /// The rule's id in `generation`.
    rule: u16,
    /// Whose places.
    key: ClientKey,
    /// How many each limit holds: the request's cost.
    cost: Cost,
    /// What the store said: which store, and each lease's name (its part's `at_us`).
    decision: StoreVerdict,
    /// Renews the leases every third of their length while the request goes on; stopped
    /// when the place is given back.
    renewal: Option<tokio::task::JoinHandle<()>>,
    /// Whether dropping gives the leases back (`false` once [`Place::keep_leases`]).
    give_back: bool,
}

impl Place {
    /// The places of an admission decided `decision` under rule `rule` of `generation`, when
    /// the rule has concurrency limits and the decision allowed the request: renewed from now
    /// until given back.
    pub(super) fn take(
        generation: &Arc<Generation>,
        rule: u16,
        key: ClientKey,
        cost: Cost,
        decision: Option<&StoreVerdict>,
    ) -> Option<Box<Place>> {
        let places = generation.places.get(usize::from(rule))?;
        let decision = decision?;
        if places.places.is_empty() || !decision.decision()?.allowed {
            return None;
        }
        let renewal = tokio::spawn(Place::renew(
            generation.clone(),
            rule,
            key,
            cost,
            decision.clone(),
        ));
        Some(Box::new(Place {
            generation: generation.clone(),
            rule,
            key,
            cost,
            decision: decision.clone(),
            renewal: Some(renewal),
            give_back: true,
        }))
    }

    /// Stop renewing, and leave the leases to expire by themselves.
    fn keep_leases(&mut self) {
        self.give_back = false;
    }

    /// Each lease the place holds: the rule of its limit alone, and the verdict naming it
    /// (the decision with that limit's `at_us`), in the rule's order.
    fn leases(generation: &Generation, rule: u16, decision: &StoreVerdict) -> Vec<(usize, StoreVerdict)> {
        let (Some(rules), Some(decided)) = (generation.places.get(usize::from(rule)), decision.decision())
        else {
            return Vec::new();
        };
        rules
            .places
            .iter()
            .filter_map(|(position, _)| {
                let mut lease = decided.clone();
                lease.at_us = decided.parts().get(*position)?.at_us;
                Some((
                    *position,
                    match decision {
                        StoreVerdict::DecidedLocally(_) => StoreVerdict::DecidedLocally(lease),
                        _ => StoreVerdict::Decided(lease),
                    },
                ))
            })
            .collect()
    }

    /// Every third of the shortest lease, renew each lease of the place, until aborted.
    async fn renew(
        generation: Arc<Generation>,
        rule: u16,
        key: ClientKey,
        cost: Cost,
        decision: StoreVerdict,
    ) {
        let Some(rules) = generation.places.get(usize::from(rule)) else {
            return;
        };
        let Some(lease) = rules
            .places
            .iter()
            .map(|(_, rule)| rule.limits.first().window())
            .min()
        else {
            return;
        };
        let leases = Place::leases(&generation, rule, &decision);
        let mut every = tokio::time::interval_at(Instant::now() + lease / 3, lease / 3);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            every.tick().await;
            for (position, lease) in &leases {
                if let Some((_, rule)) = rules.places.iter().find(|(at, _)| at == position) {
                    generation.limiter.renew(rule, key, cost, lease).await;
                }
            }
        }
    }
}

impl fmt::Debug for Place {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Place")
            .field("rule", &self.rule)
            .field("key", &self.key)
            .field("cost", &self.cost)
            .finish_non_exhaustive()
    }
}

impl Drop for Place {
    /// Give each lease back to the store that decided it: at once in memory; with Redis, in a
    /// task of its own (a drop cannot wait), which a runtime shutting down may never run, and
    /// then the lease expires.
    fn drop(&mut self) {
        if let Some(renewal) = self.renewal.take() {
            renewal.abort();
        }
        if !self.give_back {
            return;
        }
        let Some(rules) = self.generation.places.get(usize::from(self.rule)) else {
            return;
        };
        let mut waiting = Vec::new();
        for (position, lease) in Place::leases(&self.generation, self.rule, &self.decision) {
            let Some((_, rule)) = rules.places.iter().find(|(at, _)| *at == position) else {
                continue;
            };
            let given = self.generation.limiter.refund(rule, self.key, self.cost, &lease);
            // A store that answered at once has given it back; one that waits on the network
            // (whose future does nothing until polled) is asked again in a task.
            if let Decide::Pending(_) = given {
                waiting.push((position, lease));
            }
        }
        if waiting.is_empty() {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (generation, id, key, cost) = (
            self.generation.clone(),
            usize::from(self.rule),
            self.key,
            self.cost,
        );
        runtime.spawn(async move {
            let Some(rules) = generation.places.get(id) else {
                return;
            };
            for (position, lease) in waiting {
                if let Some((_, rule)) = rules.places.iter().find(|(at, _)| *at == position) {
                    generation.limiter.refund(rule, key, cost, &lease).await;
                }
            }
        });
    }
}
