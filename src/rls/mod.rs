//! Envoy's rate limit service over gRPC (`envoy.service.ratelimit.v3.RateLimitService/
//! ShouldRateLimit`), a drop-in for envoyproxy/ratelimit: a front door, a caller of the gate
//! like the proxy is.
//!
//! - [`config`]: `RLS_CONFIG`, that service's YAML, into a validated [`DescriptorTable`]
//!   whose every rate limit is a [`Rule`] of the gate's table (a fixed window of its unit, or
//!   with tollgate's `algorithm` or `limits` keys any algorithm or a list of limits).
//! - [`matcher`]: which limit one request descriptor falls under.
//! - this module: the answer. Each descriptor of a request is matched; a matched limit whose
//!   `name` another matched limit `replaces` is not applied; each remaining counted limit is
//!   admitted through [`Gate::admit_named`] (and settled elsewhere: Envoy carries the request
//!   out), costing `hits_addend` (the descriptor's, else the
//!   request's; 0 is 1, as that service reads it; one above the limit's capacity, up to
//!   2^64 - 1, is `OVER_LIMIT` at once and spends nothing), keyed by the domain and the descriptor's
//!   entries. `overall_code` is `OVER_LIMIT` if any descriptor is. `response_headers_to_add`
//!   carries `RateLimit-Limit`, `RateLimit-Remaining` and `RateLimit-Reset` of the descriptor
//!   nearest its limit (one over it, if any), the headers that service sends with
//!   `LIMIT_RESPONSE_HEADERS_ENABLED=true`. An `OVER_LIMIT` answer carries the refusal's body
//!   (`raw_body`, in `DENY_FORMAT`, with its `Content-Type` among the response headers), for
//!   the same limit; Envoy writes the status itself (its
//!   filter's `rate_limited_status`, which should be `DENY_STATUS` for a problem body's
//!   `status` to be true). With `FORWARD_RATELIMIT_HEADERS`, an `OK` answer carries the draft
//!   `RateLimit-Policy` and `RateLimit` of that limit as `request_headers_to_add`, for Envoy to
//!   set on the request it forwards (every limit of a list, as the proxy lists them).
//!
//! A status's `current_limit` is the limit as written for a plain `unit` and
//! `requests_per_unit`; for an `algorithm` or a list, the limit the decision describes (as the
//! proxy's legacy headers do: the one closest to exhaustion, or the refusing one with the
//! latest retry), its capacity or per-window limit in the unit nearest its window
//! ([`nearest_unit`]). `limit_remaining` and `duration_until_reset` are that limit's.
//!
//! An unknown domain, a descriptor that matches nothing, a replaced limit: `OK`, no limit. An
//! `unlimited` limit: `OK`, never counted. `shadow_mode` (or `SHADOW_MODE`): counted, `OK`.
//! When Redis cannot decide, the rules' fail mode (`FAIL_MODE`) answers: `open` is `OK`,
//! `local` is this replica's own count, and `closed` is `OVER_LIMIT`, since "refuse when
//! unsure" is what the operator asked for. (envoyproxy/ratelimit answers a gRPC error there,
//! and Envoy's `failure_mode_deny` decides; an error cannot say which of a request's
//! descriptors failed, and with `FAIL_MODE` the gateway's operator already chose.)
//!
//! envoyproxy/ratelimit's other keys: a `quota_mode` descriptor over its limit makes the answer
//! `OVER_LIMIT` only when every quota descriptor of the request is over; the `metadata` of the
//! descriptors within their limits goes in `dynamic_metadata`; an `OVER_LIMIT` answer carries
//! `Retry-After`. A descriptor's own `limit` (Envoy's override) wins over the configured one in
//! a known domain: decided under the override rule (`rls~override`, in every table with
//! `RLS_CONFIG`; the unit part of the budget's key) with the request's numbers.
//!
//! A reload of `RLS_CONFIG` (with the rules: SIGHUP, or a file changed) swaps the descriptor
//! tables whole ([`RateLimitService::reload`]) once the gate's table holds their rules; a
//! request is answered under the tables it started with.
//!
//! A limit with `detailed_metric` or `value_to_metric` counts each descriptor it decides in
//! `tollgate_rls_descriptor_total{domain, descriptor, decision}`, `descriptor` the metric key
//! that service builds ([`matcher::metric_key`]), at most
//! [`MAX_DESCRIPTOR_SERIES`](crate::metrics::MAX_DESCRIPTOR_SERIES) apart; a limit without
//! either counts only in its rule's series, as before.
//!
//! Not supported: `quota` answers.

pub(crate) mod config;
pub mod matcher;
mod yaml;

use std::sync::Arc;
use std::time::Duration;

use tonic::{Request, Response, Status};

use crate::algorithms::{Cost, Decision};
use crate::algorithms::{FixedWindow, Limits, Policy};
use crate::gate::{Answers, Gate, Refuse};
use crate::limit_headers::HeaderStyle;
use crate::metrics::DescriptorCounts;
use crate::outcome::Outcome;
use crate::proxy::AccessLog;
use crate::refusal::Refusals;
use crate::rules::Rule;
use crate::telemetry::throttle::LogThrottle;
use crate::telemetry::trace::{Noted, RequestSpan};
pub(crate) use config::DescriptorTable;

/// The generated protocol: Envoy's messages and the tonic server, from `proto/`.
#[allow(missing_docs, clippy::all, clippy::pedantic)]
pub mod proto {
    /// `envoy.*`.
    pub mod envoy {
        /// `envoy.config`.
        pub mod config {
            /// `envoy.config.core`.
            pub mod core {
                /// `envoy.config.core.v3`: `HeaderValue`.
                pub mod v3 {
                    include!(concat!(env!("OUT_DIR"), "/envoy.config.core.v3.rs"));
                }
            }
        }
        /// `envoy.extensions`.
        pub mod extensions {
            /// `envoy.extensions.common`.
            pub mod common {
                /// `envoy.extensions.common.ratelimit`.
                pub mod ratelimit {
                    /// `envoy.extensions.common.ratelimit.v3`: `RateLimitDescriptor`.
                    pub mod v3 {
                        include!(concat!(
                            env!("OUT_DIR"),
                            "/envoy.extensions.common.ratelimit.v3.rs"
                        ));
                    }
                }
            }
        }
        /// `envoy.service`.
        pub mod service {
            /// `envoy.service.ratelimit`.
            pub mod ratelimit {
                /// `envoy.service.ratelimit.v3`: the service and its messages.
                pub mod v3 {
                    include!(concat!(env!("OUT_DIR"), "/envoy.service.ratelimit.v3.rs"));
                }
            }
        }
        /// `envoy.type`.
        pub mod r#type {
            /// `envoy.type.v3`: `RateLimitUnit`.
            pub mod v3 {
                include!(concat!(env!("OUT_DIR"), "/envoy.r#type.v3.rs"));
            }
        }
    }
}

use proto::envoy::config::core::v3::HeaderValue;
use proto::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use proto::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit as ProtoUnit;
use proto::envoy::service::ratelimit::v3::rate_limit_response::{
    Code, DescriptorStatus, RateLimit as CurrentLimit,
};
use proto::envoy::service::ratelimit::v3::rate_limit_service_server::{self, RateLimitServiceServer};
use proto::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};

/// The gRPC method Envoy calls, as its HTTP/2 request's path (a trace span's `http.route`).
pub(crate) const ROUTE: &str = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";

/// The header names envoyproxy/ratelimit sends by default (`LIMIT_LIMIT_HEADER`,
/// `LIMIT_REMAINING_HEADER`, `LIMIT_RESET_HEADER`).
pub(crate) const LIMIT_HEADER: &str = "RateLimit-Limit";
/// See [`LIMIT_HEADER`].
pub(crate) const REMAINING_HEADER: &str = "RateLimit-Remaining";
/// See [`LIMIT_HEADER`].
pub(crate) const RESET_HEADER: &str = "RateLimit-Reset";

/// The header an `OVER_LIMIT` answer carries among `response_headers_to_add`: the seconds
/// until the refusing limit allows again.
pub(crate) const RETRY_AFTER_HEADER: &str = "Retry-After";

/// Most descriptors one request may carry: each is a decision, and Envoy sends a handful.
pub(crate) const MAX_DESCRIPTORS: usize = 64;

/// Most entries one descriptor may carry.
pub(crate) const MAX_ENTRIES: usize = 64;

/// The gRPC server type, for a listener to route `application/grpc` requests to.
pub(crate) type Server = RateLimitServiceServer<RateLimitService>;

/// Why the service cannot be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RlsError {
    /// The gate's rule table lacks a rule the descriptor table needs: the two were not built
    /// from one configuration.
    #[error("the gate has no rule {0:?}: build its rule table with the descriptor table's rules")]
    MissingRule(String),
}

/// Envoy's rate limit service, deciding through the gate. Its clones share the descriptor
/// tables, so a reload ([`RateLimitService::reload`]) reaches the server serving them.
#[derive(Clone)]
pub struct RateLimitService {
    /// The one door to policy.
    gate: Arc<Gate>,
    /// The descriptor tables in force, swapped whole by a reload of `RLS_CONFIG`.
    tables: Arc<arc_swap::ArcSwap<Tables>>,
    /// `DENY_FORMAT` (and `DENY_STATUS`, which a problem body states): the `raw_body` Envoy
    /// sends with its refusal; `FORWARD_RATELIMIT_HEADERS`: the draft fields as
    /// `request_headers_to_add`. The answers every door shares.
    answers: Answers,
    /// `tollgate_rls_descriptor_total`: the decisions of limits with `detailed_metric` or
    /// `value_to_metric`, by descriptor.
    descriptors: Arc<DescriptorCounts>,
    /// `ACCESS_LOG`: which decisions get an `info` line, as the proxy's requests do.
    access_log: AccessLog,
    /// Paces the refusals' lines under `ACCESS_LOG=denied`.
    denial_log: Arc<LogThrottle>,
}

/// The descriptor trees and their rules: what one reload of `RLS_CONFIG` puts in force.
struct Tables {
    /// The descriptor trees.
    table: Arc<DescriptorTable>,
    /// Each limit's rule, by [`config::LimitId`]; `None` for an unlimited one. Resolved once,
    /// so a decision never looks a rule up by name.
    rules: Vec<Option<Rule>>,
    /// The override rule ([`DescriptorTable::override_spec`]): what a descriptor's own `limit`
    /// is decided under; `None` in a table built without it (none the configuration builds),
    /// which leaves overrides unapplied.
    overrides: Option<Rule>,
}

impl Tables {
    /// The tables of `table`, whose rules the gate's table in force must hold.
    fn new(gate: &Gate, table: Arc<DescriptorTable>) -> Result<Tables, RlsError> {
        let generation = gate.current();
        let rules = table
            .limits
            .iter()
            .map(|limit| match limit.allowance.counted() {
                false => Ok(None),
                true => generation
                    .rule(&limit.rule)
                    .cloned()
                    .map(Some)
                    .ok_or_else(|| RlsError::MissingRule(limit.rule.to_string())),
            })
            .collect::<Result<_, _>>()?;
        let overrides = generation.rule(config::OVERRIDE_RULE).cloned();
        Ok(Tables {
            table,
            rules,
            overrides,
        })
    }
}

/// One descriptor's way to its answer.
enum Plan<'s> {
    /// Nothing applies: `OK`, no limit.
    Free,
    /// `unlimited`.
    Unlimited,
    /// Decided under the rule, at this cost, the entries a `share_threshold` wildcard matched
    /// keyed by its pattern.
    Decide(&'s config::Limit, &'s Rule, Cost, Vec<(usize, &'s str)>),
    /// The descriptor's own `limit` (Envoy's override): decided under the override rule of its
    /// unit with the request's numbers, at this cost.
    Override(Box<config::Limit>, Rule, Cost),
}

impl Plan<'_> {
    /// Whether its limit is in `quota_mode`.
    fn quota(&self) -> bool {
        matches!(self, Plan::Decide(limit, ..) if limit.quota)
    }

    /// The rule it is decided under, if any.
    fn rule(&self) -> Option<&Rule> {
        match self {
            Plan::Decide(_, rule, ..) => Some(rule),
            Plan::Override(_, rule, _) => Some(rule),
            Plan::Free | Plan::Unlimited => None,
        }
    }
}

impl RateLimitService {
    /// The service of `table`, deciding through `gate`, whose rule table must hold the
    /// table's rules ([`DescriptorTable::specs`], added with `RuleTable::with_named`).
    pub fn new(gate: Arc<Gate>, table: Arc<DescriptorTable>) -> Result<RateLimitService, RlsError> {
        let tables = Tables::new(&gate, table)?;
        let descriptors = gate.metrics().descriptors();
        Ok(RateLimitService {
            descriptors,
            gate,
            tables: Arc::new(arc_swap::ArcSwap::from_pointee(tables)),
            answers: Answers::default(),
            access_log: AccessLog::Denied,
            denial_log: Arc::new(LogThrottle::new()),
        })
    }

    /// Put `table` in force (a reload of `RLS_CONFIG`), once the gate's table in force holds
    /// its rules (the reloaded configuration's, swapped in first); an error swaps nothing.
    pub(crate) fn reload(&self, table: Arc<DescriptorTable>) -> Result<(), RlsError> {
        let tables = Tables::new(&self.gate, table)?;
        self.tables.store(Arc::new(tables));
        Ok(())
    }

    /// This service with refusals shaped as `refusals` say, and the budget told to the backend
    /// when `forward_headers` (`FORWARD_RATELIMIT_HEADERS`).
    pub(crate) fn shaped(mut self, refusals: Refusals, forward_headers: bool) -> RateLimitService {
        // Envoy's answers list that service's own rate-limit headers (`RateLimit-Limit`, ...).
        self.answers = Answers::new(HeaderStyle::None, refusals, forward_headers);
        self
    }

    /// The tonic server of this service: a `tower::Service` of HTTP/2 requests.
    pub fn into_server(self) -> Server {
        RateLimitServiceServer::new(self)
    }

    /// This service with its decisions logged as the proxy's requests are (`ACCESS_LOG`).
    pub(crate) fn logged(mut self, access_log: AccessLog) -> RateLimitService {
        self.access_log = access_log;
        self
    }

    /// Answer one `ShouldRateLimit` request (the integration tests' way in; the server's is
    /// `should_rate_limit`, which traces).
    #[cfg(feature = "testing")]
    pub async fn check(&self, request: &RateLimitRequest) -> Result<RateLimitResponse, Status> {
        self.check_traced(request, None).await
    }

    /// Answer one `ShouldRateLimit` request, telling the request's `span` (traces on) the rule, decision
    /// and numbers of the descriptor its answer follows (the refusing or nearest one).
    async fn check_traced(
        &self,
        request: &RateLimitRequest,
        span: Option<&RequestSpan>,
    ) -> Result<RateLimitResponse, Status> {
        validate(request)?;
        // One table for the whole request, whatever a reload swaps meanwhile.
        let tables = self.tables.load_full();
        let plans = tables.plan(request);
        // Its rules by name in the table in force: a reload of RULES_FILE moves rule ids.
        let generation = self.gate.current();
        let mut statuses = Vec::with_capacity(plans.len());
        // Each status's decision, when a store made one: what the refusal and the forwarded
        // draft fields are built from.
        let mut decisions = Vec::with_capacity(plans.len());
        // Each status's admission as its span would read it; traces off, nothing.
        let mut noted: Vec<Option<Noted>> = Vec::new();
        for (plan, descriptor) in plans.iter().zip(&request.descriptors) {
            let mut decided = None;
            let mut note = None;
            let status = match plan {
                Plan::Free => DescriptorStatus {
                    code: Code::Ok as i32,
                    ..Default::default()
                },
                Plan::Unlimited => DescriptorStatus {
                    code: Code::Ok as i32,
                    limit_remaining: u32::MAX,
                    ..Default::default()
                },
                Plan::Decide(limit, rule, cost, shared) => match generation.rule(&rule.name) {
                    Some(rule) => {
                        let key = generation.key_of(&client_name(&request.domain, descriptor, shared));
                        let admission = self.gate.admit_named(generation.clone(), rule, key, *cost).await;
                        let outcome = admission.outcome();
                        if limit.per_descriptor() {
                            self.count_descriptor(&tables.table, &request.domain, limit, descriptor, outcome);
                        }
                        decided = admission.decision().cloned();
                        if span.is_some() {
                            note = Some(Noted::of(admission.traced()));
                        }
                        crate::decision_log::log(
                            self.access_log,
                            &self.denial_log,
                            &crate::decision_log::Decided {
                                door: "rls",
                                method: None,
                                path: Some(&request.domain),
                                client: key,
                                address: None,
                                rule: &rule.name,
                                outcome,
                                status: if outcome.forwards() { 200 } else { 429 },
                                retry_after_s: admission.retry_after_secs(),
                            },
                        );
                        let status = status(limit, rule, admission.decision(), outcome.forwards());
                        // The request is Envoy's to carry out, out of sight.
                        admission.settle_elsewhere();
                        status
                    }
                    // Every table the configuration builds holds RLS_CONFIG's rules.
                    None => DescriptorStatus {
                        code: Code::Ok as i32,
                        ..Default::default()
                    },
                },
                Plan::Override(limit, rule, cost) => match generation.rule(&rule.name) {
                    Some(base) => {
                        // The request's numbers under the id of the rule in force.
                        let rule = Rule {
                            id: base.id,
                            ..rule.clone()
                        };
                        // One rule for every unit: the unit is part of the budget's key.
                        let mut name = client_name(&request.domain, descriptor, &[]);
                        if let config::Allowance::Rate { unit, .. } = &limit.allowance {
                            let unit = unit.as_str().as_bytes();
                            name.extend_from_slice(&(unit.len() as u64).to_le_bytes());
                            name.extend_from_slice(unit);
                        }
                        let key = generation.key_of(&name);
                        let admission = self.gate.admit_named(generation.clone(), &rule, key, *cost).await;
                        decided = admission.decision().cloned();
                        if span.is_some() {
                            note = Some(Noted::of(admission.traced()));
                        }
                        let status = status(limit, &rule, admission.decision(), admission.forwards());
                        admission.settle_elsewhere();
                        status
                    }
                    None => DescriptorStatus {
                        code: Code::Ok as i32,
                        ..Default::default()
                    },
                },
            };
            statuses.push(status);
            decisions.push(decided);
            if span.is_some() {
                noted.push(note);
            }
        }
        let refusing = Refusing::of(&plans, &statuses);
        let over = (0..statuses.len()).any(|index| refusing.refuses(index));
        let nearest = nearest(&statuses, &refusing);
        if let Some(span) = span
            && let Some(note) = nearest
                .and_then(|index| noted.get(index))
                .or_else(|| noted.iter().find(|note| note.is_some()))
                .and_then(Option::as_ref)
        {
            span.decided(note.admitted());
        }
        let mut response = RateLimitResponse {
            overall_code: if over { Code::OverLimit } else { Code::Ok } as i32,
            response_headers_to_add: nearest.map(|index| headers(&statuses[index])).unwrap_or_default(),
            dynamic_metadata: metadata(request, &plans, &statuses),
            ..Default::default()
        };
        if let Some(index) = nearest
            && let Some(rule) = plans[index].rule()
            && let Some(decision) = &decisions[index]
        {
            self.shape(&mut response, decision, rule, over);
        }
        response.statuses = statuses;
        Ok(response)
    }

    /// Count `descriptor` of `domain`, decided under `limit` (which has `detailed_metric` or
    /// `value_to_metric`) as `outcome`, under its metric key.
    fn count_descriptor(
        &self,
        table: &DescriptorTable,
        domain: &str,
        limit: &config::Limit,
        descriptor: &RateLimitDescriptor,
        outcome: Outcome,
    ) {
        let entries = descriptor
            .entries
            .iter()
            .map(|entry| (entry.key.as_str(), entry.value.as_str()));
        if let Some(key) = matcher::metric_key(table, domain, limit.detailed_metric, entries) {
            self.descriptors.count(domain, &key, outcome);
        }
    }

    /// What the status nearest its limit (its `decision` under `rule`) adds: on a refusal, the
    /// body Envoy sends (`raw_body`, in `DENY_FORMAT`: Envoy's request carries no `Accept` to
    /// choose by, its `retry-after` the decision's) and its `Content-Type`; on an allowed request
    /// with `FORWARD_RATELIMIT_HEADERS`, the draft fields for Envoy to set on the request it
    /// forwards, exactly as the proxy sets them (every limit of a rule of several, `RULE.1`,
    /// `RULE.2`, ...).
    fn shape(&self, response: &mut RateLimitResponse, decision: &Decision, rule: &Rule, over: bool) {
        if over {
            // The proxy's refusal, as the shared answers write it for a client that sent no
            // `Accept`: its body, and its headers (`Content-Type`, `Retry-After`, ...).
            let refusal = self.answers.refusal_of(
                rule,
                Some(decision),
                Outcome::Limited,
                &http::HeaderMap::new(),
                Refuse::Client,
            );
            let (parts, body) = refusal.into_parts();
            response
                .response_headers_to_add
                .extend(grpc_headers(&parts.headers));
            response.raw_body = body.to_vec();
        } else {
            let mut fields = http::HeaderMap::new();
            self.answers.set_forwarded_of(rule, decision, &mut fields);
            response.request_headers_to_add = grpc_headers(&fields).collect();
        }
    }
}

/// `headers` as Envoy's header list, each name as that service and the proxy's clients spell
/// it (`Retry-After`, `RateLimit-Policy`, `RateLimit`; others as `http` keeps them, in lower
/// case), in order.
fn grpc_headers(headers: &http::HeaderMap) -> impl Iterator<Item = HeaderValue> + '_ {
    headers.iter().map(|(name, value)| {
        let key = match name.as_str() {
            "retry-after" => RETRY_AFTER_HEADER,
            "ratelimit-policy" => "RateLimit-Policy",
            "ratelimit" => "RateLimit",
            other => other,
        };
        HeaderValue {
            key: key.to_owned(),
            value: value.to_str().unwrap_or_default().to_owned(),
            raw_value: Vec::new(),
        }
    })
}

impl Tables {
    /// The plan of a descriptor's own `limit`: `requests_per_unit` in each fixed window of
    /// `unit`, under the override rule (in every table of a configuration with `RLS_CONFIG`).
    fn override_plan(&self, requests_per_unit: u32, unit: config::Unit, cost: Cost) -> Plan<'_> {
        let Some(base) = &self.overrides else {
            return Plan::Free;
        };
        let limit = config::Limit {
            rule: base.name.clone(),
            allowance: config::Allowance::Rate {
                requests_per_unit,
                unit,
            },
            name: None,
            replaces: Vec::new(),
            shadow: false,
            quota: false,
            metadata: None,
            detailed_metric: false,
            value_to_metric: false,
        };
        let rule = Rule {
            limits: Limits::one(Policy::FixedWindow(FixedWindow {
                limit: u64::from(requests_per_unit),
                window_ms: unit.seconds() * 1_000,
            })),
            ..base.clone()
        };
        Plan::Override(Box::new(limit), rule, cost)
    }

    /// What each descriptor comes to: its limit, unless another matched limit replaces it.
    fn plan(&self, request: &RateLimitRequest) -> Vec<Plan<'_>> {
        let matched: Vec<Option<matcher::Found<'_>>> = request
            .descriptors
            .iter()
            .map(|descriptor| {
                let entries = descriptor
                    .entries
                    .iter()
                    .map(|entry| (entry.key.as_str(), entry.value.as_str()));
                matcher::find(&self.table, &request.domain, entries)
            })
            .collect();
        let replaced: Vec<&str> = matched
            .iter()
            .flatten()
            .flat_map(|found| self.table.limits[found.limit].replaces.iter().map(String::as_str))
            .collect();
        let known = self.table.domains.contains_key(&request.domain);
        matched
            .into_iter()
            .zip(&request.descriptors)
            .map(|(found, descriptor)| {
                // 0 is 1; a number above every capacity (the descriptor's is a u64) is over the
                // limit at once, as Cost::MAX is: Envoy has no way to hear that a descriptor's
                // number is wrong but OVER_LIMIT, and an error would let the request through by
                // Envoy's default (`failure_mode_deny: false`).
                let hits = descriptor
                    .hits_addend
                    .map_or(Cost::from(request.hits_addend), Cost::saturating)
                    .max(Cost::ONE);
                // The descriptor's own limit wins over the configured one, whatever matched (or
                // nothing did), in a known domain; as in that service, it is never shadowed
                // nor replaced.
                if known
                    && let Some(limit) = &descriptor.limit
                    && let Some(unit) = override_unit(limit.unit)
                {
                    return self.override_plan(limit.requests_per_unit, unit, hits);
                }
                let Some(matcher::Found { limit: id, shared }) = found else {
                    return Plan::Free;
                };
                let limit = &self.table.limits[id];
                if limit.name.as_deref().is_some_and(|name| replaced.contains(&name)) {
                    return Plan::Free;
                }
                match &self.rules[id] {
                    None => Plan::Unlimited,
                    Some(rule) => Plan::Decide(limit, rule, hits, shared),
                }
            })
            .collect()
    }
}

#[tonic::async_trait]
impl rate_limit_service_server::RateLimitService for RateLimitService {
    async fn should_rate_limit(
        &self,
        request: Request<RateLimitRequest>,
    ) -> Result<Response<RateLimitResponse>, Status> {
        // The span the decision listener made for this call, traces on.
        let span = request.extensions().get::<RequestSpan>();
        self.check_traced(request.get_ref(), span)
            .await
            .map(Response::new)
    }
}

/// The unit of a descriptor's `limit` override; `None` for `UNKNOWN` (or a number no unit has).
fn override_unit(unit: i32) -> Option<config::Unit> {
    use proto::envoy::r#type::v3::RateLimitUnit;
    Some(match RateLimitUnit::try_from(unit).ok()? {
        RateLimitUnit::Unknown => return None,
        RateLimitUnit::Second => config::Unit::Second,
        RateLimitUnit::Minute => config::Unit::Minute,
        RateLimitUnit::Hour => config::Unit::Hour,
        RateLimitUnit::Day => config::Unit::Day,
        RateLimitUnit::Week => config::Unit::Week,
        RateLimitUnit::Month => config::Unit::Month,
        RateLimitUnit::Year => config::Unit::Year,
    })
}

/// Refuse what that service refuses (`rate limit domain must not be empty`, `rate limit
/// descriptor list must not be empty`), and what no Envoy sends.
fn validate(request: &RateLimitRequest) -> Result<(), Status> {
    if request.domain.is_empty() {
        return Err(Status::invalid_argument("rate limit domain must not be empty"));
    }
    if request.descriptors.is_empty() {
        return Err(Status::invalid_argument(
            "rate limit descriptor list must not be empty",
        ));
    }
    if request.descriptors.len() > MAX_DESCRIPTORS {
        return Err(Status::invalid_argument(format!(
            "at most {MAX_DESCRIPTORS} descriptors in one request"
        )));
    }
    for (index, descriptor) in request.descriptors.iter().enumerate() {
        if descriptor.entries.len() > MAX_ENTRIES {
            return Err(Status::invalid_argument(format!(
                "descriptor {index}: at most {MAX_ENTRIES} entries"
            )));
        }
        if descriptor.entries.iter().any(|entry| entry.key.is_empty()) {
            return Err(Status::invalid_argument(format!(
                "descriptor {index}: an entry has an empty key"
            )));
        }
        if let Some(limit) = &descriptor.limit
            && override_unit(limit.unit).is_none()
        {
            return Err(Status::invalid_argument(format!(
                "descriptor {index}: limit.unit {} is not a unit: expected SECOND, MINUTE, HOUR, DAY, \
                 WEEK, MONTH or YEAR",
                limit.unit
            )));
        }
    }
    Ok(())
}

/// Whose budget a descriptor spends: the domain and every entry (as that service's cache key
/// holds them all), each length-prefixed so no two descriptors encode alike. An entry a
/// `share_threshold` wildcard matched (its index in `shared`) is keyed by the pattern, so every
/// value the pattern matches spends one budget (a value written as the pattern itself matches
/// it, and belongs in that budget).
pub(crate) fn client_name(
    domain: &str,
    descriptor: &RateLimitDescriptor,
    shared: &[(usize, &str)],
) -> Vec<u8> {
    let mut name = Vec::with_capacity(8 + domain.len() + descriptor.entries.len() * 24);
    name.extend_from_slice(b"rls\0");
    let mut part = |bytes: &[u8]| {
        name.extend_from_slice(&(bytes.len() as u64).to_le_bytes());
        name.extend_from_slice(bytes);
    };
    part(domain.as_bytes());
    for (index, entry) in descriptor.entries.iter().enumerate() {
        part(entry.key.as_bytes());
        let value = shared
            .iter()
            .find(|(shared, _)| *shared == index)
            .map_or(entry.value.as_str(), |(_, pattern)| pattern);
        part(value.as_bytes());
    }
    name
}

/// Which statuses refuse the request: a descriptor over its limit, unless its limit is in
/// `quota_mode` and some other quota descriptor of the request is within its own (as
/// envoyproxy/ratelimit decides: `OVER_LIMIT` iff a rate limit descriptor is over, or every
/// quota descriptor is).
struct Refusing<'p, 's> {
    plans: &'p [Plan<'s>],
    statuses: &'p [DescriptorStatus],
    /// Every quota descriptor of the request is over its limit (and there is one).
    every_quota_over: bool,
}

impl<'p, 's> Refusing<'p, 's> {
    fn of(plans: &'p [Plan<'s>], statuses: &'p [DescriptorStatus]) -> Self {
        let quotas = plans.iter().filter(|plan| plan.quota()).count();
        let quotas_over = plans
            .iter()
            .zip(statuses)
            .filter(|(plan, status)| plan.quota() && over(status))
            .count();
        Refusing {
            plans,
            statuses,
            every_quota_over: quotas > 0 && quotas == quotas_over,
        }
    }

    /// Whether status `index` refuses the request.
    fn refuses(&self, index: usize) -> bool {
        self.statuses.get(index).is_some_and(over)
            && self
                .plans
                .get(index)
                .is_some_and(|plan| !plan.quota() || self.every_quota_over)
    }
}

/// Whether `status` is over its limit.
fn over(status: &DescriptorStatus) -> bool {
    status.code == Code::OverLimit as i32
}

/// The answer's `dynamic_metadata`, when a descriptor within its limit has `metadata`: as
/// envoyproxy/ratelimit writes it (with `RESPONSE_DYNAMIC_METADATA`), the `domain`, each
/// descriptor's `entries` (`key=value`) and `hitsAddend`, the request's `hitsAddend`, and the
/// `metadata` of every descriptor within its limit merged (mappings key by key, the first
/// descriptor's value kept where two disagree).
fn metadata(
    request: &RateLimitRequest,
    plans: &[Plan<'_>],
    statuses: &[DescriptorStatus],
) -> Option<prost_types::Struct> {
    use prost_types::value::Kind;
    use prost_types::{ListValue, Struct, Value};
    let mut merged = Struct::default();
    for (plan, status) in plans.iter().zip(statuses) {
        if let Plan::Decide(limit, ..) = plan
            && status.code != Code::OverLimit as i32
            && let Some(metadata) = &limit.metadata
        {
            merge_metadata(&mut merged, metadata);
        }
    }
    if merged.fields.is_empty() {
        return None;
    }
    let value = |kind: Kind| Value { kind: Some(kind) };
    let descriptors = request
        .descriptors
        .iter()
        .map(|descriptor| {
            let entries = descriptor
                .entries
                .iter()
                .map(|entry| value(Kind::StringValue(format!("{}={}", entry.key, entry.value))))
                .collect();
            let mut fields = std::collections::BTreeMap::new();
            fields.insert(
                "entries".to_owned(),
                value(Kind::ListValue(ListValue { values: entries })),
            );
            if let Some(hits) = descriptor.hits_addend {
                fields.insert("hitsAddend".to_owned(), value(Kind::NumberValue(hits as f64)));
            }
            value(Kind::StructValue(Struct { fields }))
        })
        .collect();
    let mut fields = std::collections::BTreeMap::new();
    fields.insert(
        "domain".to_owned(),
        value(Kind::StringValue(request.domain.clone())),
    );
    fields.insert(
        "descriptors".to_owned(),
        value(Kind::ListValue(ListValue { values: descriptors })),
    );
    if request.hits_addend != 0 {
        fields.insert(
            "hitsAddend".to_owned(),
            value(Kind::NumberValue(f64::from(request.hits_addend))),
        );
    }
    fields.insert("metadata".to_owned(), value(Kind::StructValue(merged)));
    Some(Struct { fields })
}

/// `from`'s fields put into `into`: a field both hold as mappings is merged, any other field
/// `into` holds already is kept.
fn merge_metadata(into: &mut prost_types::Struct, from: &prost_types::Struct) {
    use prost_types::value::Kind;
    for (key, value) in &from.fields {
        match into.fields.get_mut(key) {
            None => {
                into.fields.insert(key.clone(), value.clone());
            }
            Some(prost_types::Value {
                kind: Some(Kind::StructValue(into)),
            }) => {
                if let Some(Kind::StructValue(from)) = &value.kind {
                    merge_metadata(into, from);
                }
            }
            Some(_) => {}
        }
    }
}

/// The status of a descriptor decided under `rule`: `forwards` is whether the gate lets the
/// request on (so `OK`; a shadow rule's refusals and `FAIL_MODE=open` do).
///
/// `current_limit` is the limit as written for a plain `unit` and `requests_per_unit` (a fixed
/// window). For an `algorithm` or a `limits` list it is the limit the decision describes (the
/// one closest to exhaustion, or the refusing one with the latest retry, as the proxy's
/// legacy headers describe it; the first limit when no store decided): its capacity or
/// per-window limit as `requests_per_unit`, in the [`nearest_unit`] of its window.
fn status(
    limit: &config::Limit,
    rule: &Rule,
    decision: Option<&Decision>,
    forwards: bool,
) -> DescriptorStatus {
    let code = if forwards { Code::Ok } else { Code::OverLimit };
    let current_limit = match &limit.allowance {
        config::Allowance::Rate {
            requests_per_unit,
            unit,
        } => Some(CurrentLimit {
            name: limit.name.clone().unwrap_or_default(),
            requests_per_unit: *requests_per_unit,
            unit: proto_unit(*unit) as i32,
        }),
        config::Allowance::Limits(_) => {
            let described = decision.map_or(0, Decision::described);
            let policy = rule.limits.get(described).unwrap_or(rule.limits.first());
            Some(CurrentLimit {
                name: limit.name.clone().unwrap_or_default(),
                requests_per_unit: u32::try_from(policy.limit()).unwrap_or(u32::MAX),
                unit: proto_unit(nearest_unit(policy.window())) as i32,
            })
        }
        config::Allowance::Unlimited => None,
    };
    let (remaining, reset) = match decision {
        Some(decision) => (decision.remaining, Some(decision.reset_after)),
        None => (0, None),
    };
    DescriptorStatus {
        code: code as i32,
        current_limit,
        limit_remaining: u32::try_from(remaining).unwrap_or(u32::MAX),
        duration_until_reset: reset.map(duration),
        quota: None,
    }
}

/// The unit nearest `window` (the time over which a policy's limit applies: a window, or the
/// time to refill an empty bucket), on a ratio scale: a window is reported in the larger of two
/// neighbouring units once it is past their geometric mean (a minute and an hour meet at
/// 7.75 minutes, a second and a minute at 7.75 seconds), and in the smaller at it. A
/// window of a whole unit is that unit; below a second is a second, beyond a year a year.
pub(crate) fn nearest_unit(window: Duration) -> config::Unit {
    let window = window.as_millis();
    let squared = window.saturating_mul(window);
    config::Unit::ALL
        .windows(2)
        .find(|pair| {
            let (smaller, larger) = (
                u128::from(pair[0].seconds()) * 1_000,
                u128::from(pair[1].seconds()) * 1_000,
            );
            squared <= smaller * larger
        })
        .map_or(config::Unit::Year, |pair| pair[0])
}

fn proto_unit(unit: config::Unit) -> ProtoUnit {
    match unit {
        config::Unit::Second => ProtoUnit::Second,
        config::Unit::Minute => ProtoUnit::Minute,
        config::Unit::Hour => ProtoUnit::Hour,
        config::Unit::Day => ProtoUnit::Day,
        config::Unit::Week => ProtoUnit::Week,
        config::Unit::Month => ProtoUnit::Month,
        config::Unit::Year => ProtoUnit::Year,
    }
}

fn duration(duration: Duration) -> prost_types::Duration {
    prost_types::Duration {
        seconds: i64::try_from(duration.as_secs()).unwrap_or(i64::MAX),
        nanos: i32::try_from(duration.subsec_nanos()).unwrap_or(0),
    }
}

/// The status nearest its limit: the last one that refuses the request ([`refusing`]) if any
/// does, else the one with the least remaining (the first of equals), as envoyproxy/ratelimit
/// picks it; none when no descriptor had a limit decided.
fn nearest(statuses: &[DescriptorStatus], refusing: &Refusing<'_, '_>) -> Option<usize> {
    let decided = statuses
        .iter()
        .enumerate()
        .filter(|(_, status)| status.current_limit.is_some() && status.duration_until_reset.is_some());
    decided
        .clone()
        .rfind(|(index, _)| refusing.refuses(*index))
        .or_else(|| decided.min_by_key(|(_, status)| status.limit_remaining))
        .map(|(index, _)| index)
}

/// `RateLimit-Limit`, `-Remaining` and `-Reset` of `status` (the [`nearest`]).
fn headers(status: &DescriptorStatus) -> Vec<HeaderValue> {
    let limit = status
        .current_limit
        .as_ref()
        .map_or(0, |limit| limit.requests_per_unit);
    // Whole seconds, rounded up: a client that waits that long finds the window over.
    let reset = status.duration_until_reset.as_ref().map_or(0, |reset| {
        reset.seconds.saturating_add(i64::from(reset.nanos > 0))
    });
    let header = |key: &str, value: String| HeaderValue {
        key: key.to_owned(),
        value,
        raw_value: Vec::new(),
    };
    vec![
        header(LIMIT_HEADER, limit.to_string()),
        header(REMAINING_HEADER, status.limit_remaining.to_string()),
        header(RESET_HEADER, reset.to_string()),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use config::Unit;

    #[test]
    fn a_window_is_reported_in_the_unit_nearest_it_on_a_ratio_scale() {
        let unit = |seconds: f64| nearest_unit(Duration::from_secs_f64(seconds));
        for (seconds, expected) in [
            (0.001, Unit::Second),
            (1.0, Unit::Second),
            (2.0, Unit::Second),
            // A second and a minute meet at sqrt(60) = 7.746 s.
            (7.745, Unit::Second),
            (7.75, Unit::Minute),
            (60.0, Unit::Minute),
            // A minute and an hour at 464.76 s.
            (464.0, Unit::Minute),
            (465.0, Unit::Hour),
            (10_000.0, Unit::Hour),
            (17_635.0, Unit::Hour),
            (17_640.0, Unit::Day),
            (86_400.0, Unit::Day),
            (7.0 * 86_400.0, Unit::Week),
            (30.0 * 86_400.0, Unit::Month),
            (365.0 * 86_400.0, Unit::Year),
            (10_000.0 * 86_400.0, Unit::Year),
        ] {
            assert_eq!(unit(seconds), expected, "{seconds} s");
        }
        // Every unit is itself.
        for whole in Unit::ALL {
            assert_eq!(nearest_unit(Duration::from_secs(whole.seconds())), whole);
        }
    }
}
