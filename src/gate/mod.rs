//! The one door to policy: from a request head to a [`Verdict`] ([`Gate::decide`]), and after
//! the answer, what the answer changes ([`Gate::settle`]).
//!
//! Every front door (today the reverse proxy) calls the same two functions, so a rule means the
//! same thing whichever door a request came in by. The gate knows `http`'s types at most, never
//! hyper's, and answers nothing itself: what a refusal looks like on the wire is the door's.
//!
//! - [`path`]: the request path read once, into the canonical form rules match and what the
//!   backend must get, or refused as one that backends could read two ways.
//! - [`identity`]: the client address (the peer, or `X-Forwarded-For` from `TRUSTED_PROXIES`).
//! - [`tunnels`]: `MAX_UPGRADES_PER_CLIENT`, the tunnels one client may hold open.
//! - the rule table ([`crate::limit::RuleTable`]) and the limiter ([`crate::limit::Limiter`]):
//!   which rule, key, cost and mode, and what the store says.
//!
//! A decision is counted in the metrics here (`tollgate_requests_total`, the decision's
//! latency), once, whichever door asked.

pub mod identity;
pub mod path;
pub(crate) mod tunnels;

use std::net::IpAddr;
use std::sync::Arc;

use http::{HeaderMap, Method};
use ipnet::IpNet;
use tokio::time::Instant;

use crate::limit::refused::{Counted, RefusedClients};
use crate::limit::{
    ClientIp, ClientKey, Count, Decision, Limiter, Mode, RequestHead, Rule, RuleTable, StoreError,
    Verdict as StoreVerdict,
};
use crate::metrics::Metrics;
use crate::outcome::Outcome;
use identity::ClientIdentity;
use tunnels::{TunnelSlot, Tunnels};

/// What the gate is built from: the settings of its own (`MAX_UPGRADES_PER_CLIENT`,
/// `TRUSTED_PROXIES`) beside the rule table.
#[derive(Debug, Clone)]
pub struct GateSettings {
    /// The compiled rule table: every rule, route, cost and exemption.
    pub rules: RuleTable,
    /// `TRUSTED_PROXIES`: peers whose `X-Forwarded-For` is believed.
    pub trusted_proxies: Vec<IpNet>,
    /// `MAX_UPGRADES_PER_CLIENT`: most tunnels one client address holds; `None`: unlimited.
    pub max_upgrades_per_client: Option<u32>,
}

/// Classification and decision, shared by every door.
pub struct Gate {
    /// Which rule, key, cost and mode apply to a request.
    rules: RuleTable,
    /// `TRUSTED_PROXIES`.
    identity: ClientIdentity,
    /// Memory or Redis.
    limiter: Limiter,
    /// `MAX_UPGRADES_PER_CLIENT`.
    tunnels: Tunnels,
    /// Counts decisions.
    metrics: Arc<Metrics>,
    /// The clients refused most, per rule, in bounded memory: the admin's `/v1/limited`.
    refused: RefusedClients,
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
    /// The store could not be asked (Redis down, its breaker open).
    #[error("the store could not be asked: {0}")]
    Store(#[from] StoreError),
}

/// What a door knows of a request before anything is decided.
#[derive(Debug, Clone, Copy)]
pub struct Head<'a> {
    /// The request method.
    pub method: &'a Method,
    /// The path as sent, without the query (`Uri::path`), or `*` (`OPTIONS *`).
    pub path: &'a str,
    /// The request headers (`X-Forwarded-For`, header keys).
    pub headers: &'a HeaderMap,
    /// The TCP peer.
    pub peer: IpAddr,
    /// Whether the request asks for a tunnel the door will open if the backend agrees (an
    /// HTTP/1.1 upgrade): it takes a place under `MAX_UPGRADES_PER_CLIENT` first.
    pub upgrade: bool,
}

/// Why the gate decided nothing: the request is refused before any budget is touched.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refused {
    /// The request could be read two ways (its path, or its key header): the reason, for a
    /// `400`.
    Ambiguous(String),
    /// The client holds `MAX_UPGRADES_PER_CLIENT` tunnels already (the limit), for a `429`.
    Tunnels(u32),
}

/// What the gate decided about one request: everything a door needs to act on it, log it and
/// settle it.
#[derive(Debug)]
pub struct Verdict<'g> {
    /// The rule it was classified under.
    pub rule: &'g Rule,
    /// Whose budget.
    pub key: ClientKey,
    /// What it costs.
    pub cost: u64,
    /// Enforced, shadowed, or exempt (not decided).
    pub mode: Mode,
    /// The client address the rules used (the peer, or from a trusted `X-Forwarded-For`).
    pub client: IpAddr,
    /// `Some` when the backend must get another path than the one sent (dot segments
    /// resolved, leading slashes merged); `None`: the path as sent.
    pub rewritten: Option<String>,
    /// What the store said; `None` for a request not decided (`SKIP_PATHS`, `EXEMPT`).
    pub decision: Option<StoreVerdict>,
    /// What the door is to do with it.
    pub outcome: Outcome,
    /// When the decision ended: one reading of the clock ends it and starts the backend's.
    pub decided: Instant,
    /// The client's place under `MAX_UPGRADES_PER_CLIENT` for an upgrade: the door hands it
    /// to the tunnel, which holds it until it closes.
    pub tunnel: Option<TunnelSlot>,
}

/// What [`Gate::decide_key`] decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Keyed {
    /// What the store (or the fail mode) said.
    pub decision: StoreVerdict,
    /// What the door is to do with it.
    pub outcome: Outcome,
}

impl Gate {
    /// The gate of `settings`, deciding with `limiter` and counting into `metrics`.
    pub fn new(settings: GateSettings, limiter: Limiter, metrics: Arc<Metrics>) -> Gate {
        let ipv6_prefix = settings.rules.ipv6_prefix();
        let refused = RefusedClients::new(settings.rules.rules().len());
        Gate {
            rules: settings.rules,
            identity: ClientIdentity::new(settings.trusted_proxies),
            limiter,
            tunnels: Tunnels::new(settings.max_upgrades_per_client, ipv6_prefix),
            metrics,
            refused,
        }
    }

    /// Read the path, work out the client, classify, take a tunnel's place, and ask the
    /// limiter: the verdict, or why nothing was decided.
    pub async fn decide(&self, head: &Head<'_>) -> Result<Verdict<'_>, Refused> {
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
        let client = self.identity.client(head.peer, head.headers);
        let matched = self
            .rules
            .classify(&RequestHead {
                method: head.method,
                path: &path.canonical,
                headers: head.headers,
                client_ip: client,
            })
            .map_err(|error| Refused::Ambiguous(error.to_string()))?;
        // Before any budget is spent: a refused upgrade costs none.
        let tunnel = match head.upgrade {
            true => self.tunnels.admit(client).map_err(|limit| {
                tracing::debug!(%client, limit, "upgrade refused: MAX_UPGRADES_PER_CLIENT reached");
                Refused::Tunnels(limit)
            })?,
            false => None,
        };
        let (decision, decided) = match matched.mode {
            Mode::Exempt => (None, Instant::now()),
            Mode::Enforce | Mode::Shadow => {
                let asked = Instant::now();
                let decision = self.limiter.check(matched.rule, matched.key, matched.cost).await;
                let decided = Instant::now();
                self.metrics.decision(matched.rule.id, decided - asked);
                (Some(decision), decided)
            }
        };
        let outcome = Outcome::of(matched.mode, decision.as_ref());
        self.metrics.request(matched.rule.id, outcome);
        self.count_refusal(matched.rule, matched.key, outcome);
        Ok(Verdict {
            rule: matched.rule,
            key: matched.key,
            cost: matched.cost,
            mode: matched.mode,
            client,
            rewritten: path.rewritten,
            decision,
            outcome,
            decided,
            tunnel,
        })
    }

    /// Decide `cost` units of `key`'s budget under `rule`, for a door that names the client and
    /// the rule itself (the JSON API's `{"rule", "key"}`, an Envoy descriptor): the same
    /// limiter, denial cache, breaker and fail mode as [`Gate::decide`], counted in the same
    /// metrics. `rule` must be one of this gate's ([`Gate::rule`]).
    pub async fn decide_key(&self, rule: &Rule, key: ClientKey, cost: u64) -> Keyed {
        let mode = if rule.shadow { Mode::Shadow } else { Mode::Enforce };
        let asked = Instant::now();
        let decision = self.limiter.check(rule, key, cost).await;
        self.metrics.decision(rule.id, asked.elapsed());
        let outcome = Outcome::of(mode, Some(&decision));
        self.metrics.request(rule.id, outcome);
        self.count_refusal(rule, key, outcome);
        Keyed { decision, outcome }
    }

    /// A refused request counts toward its client's place in `/v1/limited`.
    fn count_refusal(&self, rule: &Rule, key: ClientKey, outcome: Outcome) {
        if matches!(outcome, Outcome::Limited | Outcome::LocalLimited) {
            self.refused.refused(rule.id, key);
        }
    }

    /// The client written `text` as logs write it, under this table's keys: an address
    /// (`203.0.113.7`, or an IPv6 network `2001:db8:1:2::/64`, grouped by `IPV6_PREFIX`),
    /// `key:VALUE` with the header's raw value (digested with `KEY_HASH_SECRET`, as a
    /// request's), or `IP+key:VALUE`.
    pub(crate) fn client_key(&self, text: &str) -> Result<ClientKey, ClientError> {
        let prefix = self.rules.ipv6_prefix();
        let ip = |text: &str| {
            // A network as logs write it: its address, grouped by the prefix as any address.
            let address = text.split_once('/').map_or(text, |(address, _)| address);
            address.parse::<IpAddr>().ok().map(|ip| ClientIp::new(ip, prefix))
        };
        if let Some(value) = text.strip_prefix("key:") {
            return Ok(self.key_of(value.as_bytes()));
        }
        if let Some((address, value)) = text.split_once("+key:")
            && let Some(ip) = ip(address)
        {
            return Ok(ClientKey::IpAndHeader(
                ip,
                self.rules.hasher().digest(value.as_bytes()),
            ));
        }
        ip(text)
            .map(ClientKey::Ip)
            .ok_or_else(|| ClientError::BadKey(text.to_owned()))
    }

    /// The rule called `rule` and the client written `client` (see [`Gate::client_key`]).
    fn client_of(&self, rule: &str, client: &str) -> Result<(&Rule, ClientKey), ClientError> {
        let found = self
            .rule(rule)
            .ok_or_else(|| ClientError::UnknownRule(rule.to_owned()))?;
        Ok((found, self.client_key(client)?))
    }

    /// What `client` has left under the rule called `rule`, spending nothing.
    pub(crate) async fn inspect(
        &self,
        rule: &str,
        client: &str,
    ) -> Result<(&Rule, ClientKey, Decision), ClientError> {
        let (rule, key) = self.client_of(rule, client)?;
        let decision = self.limiter.inspect(rule, key).await?;
        Ok((rule, key, decision))
    }

    /// Give `client` its whole budget back under the rule called `rule` (for every replica,
    /// with Redis).
    pub(crate) async fn reset(&self, rule: &str, client: &str) -> Result<(&Rule, ClientKey), ClientError> {
        let (rule, key) = self.client_of(rule, client)?;
        self.limiter.reset(rule, key).await?;
        Ok((rule, key))
    }

    /// Each rule, in table order, with its `top` clients refused most in the last minute (see
    /// [`crate::limit::refused`]).
    pub(crate) fn most_refused(&self, top: usize) -> Vec<(&Rule, Vec<Counted>)> {
        self.rules()
            .iter()
            .map(|rule| (rule, self.refused.top(rule.id, top)))
            .collect()
    }

    /// Every rule, in table order.
    pub fn rules(&self) -> &[Rule] {
        self.rules.rules()
    }

    /// The rule called `name`, for [`Gate::decide_key`].
    pub fn rule(&self, name: &str) -> Option<&Rule> {
        self.rules.rule(name)
    }

    /// Digests a client's own name (a JSON API key, a descriptor's entries) into a
    /// [`ClientKey`], with the key every replica shares (`KEY_HASH_SECRET`).
    pub fn key_of(&self, value: &[u8]) -> ClientKey {
        ClientKey::Header(self.rules.hasher().digest(value))
    }

    /// After the answer (`status`): a success under `count=failures` gets its cost back.
    pub async fn settle(&self, verdict: &Verdict<'_>, status: u16) {
        let Some(decision) = &verdict.decision else {
            return;
        };
        if verdict.rule.count == Count::Failures
            && matches!(verdict.outcome, Outcome::Allowed | Outcome::LocalAllowed)
            && status < 400
        {
            self.limiter
                .refund(verdict.rule, verdict.key, verdict.cost, decision)
                .await;
        }
    }

    /// Whether `peer` is one of `TRUSTED_PROXIES` (whose forwarding headers are kept).
    pub fn trusts(&self, peer: IpAddr) -> bool {
        self.identity.is_trusted(peer)
    }

    /// The headers some rule keys its budgets by, each once.
    pub fn key_headers(&self) -> impl Iterator<Item = &http::HeaderName> {
        self.rules.key_headers()
    }
}
