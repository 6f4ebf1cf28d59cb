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
//!   decided through [`Gate::decide_key`], costing `hits_addend` (the descriptor's, else the
//!   request's; 0 is 1, as that service reads it), keyed by the domain and the descriptor's
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
//! Not supported: a descriptor's `limit` override (the budget of a limit must be a rule known
//! at startup; the override is ignored and the configured limit applies), per-value metrics
//! (`detailed_metric` is accepted and changes nothing), `quota` answers.

pub(crate) mod config;
pub mod matcher;
mod yaml;

use std::sync::Arc;
use std::time::Duration;

use tonic::{Request, Response, Status};

use crate::gate::Gate;
use crate::limit::{Decision, Rule, Verdict};
use crate::proxy::AccessLog;
use crate::refusal::{Refusals, Violated};
use crate::telemetry::throttle::LogThrottle;
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

/// The header names envoyproxy/ratelimit sends by default (`LIMIT_LIMIT_HEADER`,
/// `LIMIT_REMAINING_HEADER`, `LIMIT_RESET_HEADER`).
pub(crate) const LIMIT_HEADER: &str = "RateLimit-Limit";
/// See [`LIMIT_HEADER`].
pub(crate) const REMAINING_HEADER: &str = "RateLimit-Remaining";
/// See [`LIMIT_HEADER`].
pub(crate) const RESET_HEADER: &str = "RateLimit-Reset";

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

/// Envoy's rate limit service, deciding through the gate.
pub struct RateLimitService {
    /// The one door to policy.
    gate: Arc<Gate>,
    /// The descriptor trees.
    table: Arc<DescriptorTable>,
    /// Each limit's rule, by [`config::LimitId`]; `None` for an unlimited one. Resolved once,
    /// so a decision never looks a rule up by name.
    rules: Vec<Option<Rule>>,
    /// `DENY_FORMAT` (and `DENY_STATUS`, which a problem body states): the `raw_body` Envoy
    /// sends with its refusal.
    refusals: Refusals,
    /// `FORWARD_RATELIMIT_HEADERS`: the draft fields as `request_headers_to_add`.
    forward_headers: bool,
    /// `ACCESS_LOG`: which decisions get an `info` line, as the proxy's requests do.
    access_log: AccessLog,
    /// Paces the refusals' lines under `ACCESS_LOG=denied`.
    denial_log: LogThrottle,
}

/// One descriptor's way to its answer.
enum Plan<'s> {
    /// Nothing applies: `OK`, no limit.
    Free,
    /// `unlimited`.
    Unlimited,
    /// Decided under the rule, at this cost.
    Decide(&'s config::Limit, &'s Rule, u64),
}

impl RateLimitService {
    /// The service of `table`, deciding through `gate`, whose rule table must hold the
    /// table's rules ([`DescriptorTable::rules`], added with `RuleTable::with_named`).
    pub fn new(gate: Arc<Gate>, table: Arc<DescriptorTable>) -> Result<RateLimitService, RlsError> {
        let rules = table
            .limits
            .iter()
            .map(|limit| match limit.allowance.counted() {
                false => Ok(None),
                true => gate
                    .current()
                    .rule(&limit.rule)
                    .cloned()
                    .map(Some)
                    .ok_or_else(|| RlsError::MissingRule(limit.rule.to_string())),
            })
            .collect::<Result<_, _>>()?;
        Ok(RateLimitService {
            gate,
            table,
            rules,
            refusals: Refusals::default(),
            forward_headers: false,
            access_log: AccessLog::Denied,
            denial_log: LogThrottle::new(),
        })
    }

    /// This service with refusals shaped as `refusals` say, and the budget told to the backend
    /// when `forward_headers` (`FORWARD_RATELIMIT_HEADERS`).
    pub(crate) fn shaped(mut self, refusals: Refusals, forward_headers: bool) -> RateLimitService {
        self.refusals = refusals;
        self.forward_headers = forward_headers;
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

    /// Answer one `ShouldRateLimit` request.
    pub async fn check(&self, request: &RateLimitRequest) -> Result<RateLimitResponse, Status> {
        validate(request)?;
        let plans = self.plan(request);
        // Its rules by name in the table in force: a reload of RULES_FILE moves rule ids.
        let generation = self.gate.current();
        let mut statuses = Vec::with_capacity(plans.len());
        // Each status's decision, when a store made one: what the refusal and the forwarded
        // draft fields are built from.
        let mut decisions = Vec::with_capacity(plans.len());
        for (plan, descriptor) in plans.iter().zip(&request.descriptors) {
            let mut decided = None;
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
                Plan::Decide(limit, rule, cost) => match generation.rule(&rule.name) {
                    Some(rule) => {
                        let key = generation.key_of(&client_name(&request.domain, descriptor));
                        let keyed = self.gate.decide_key(&generation, rule, key, *cost).await;
                        decided = keyed.decision.decision().cloned();
                        crate::decide::log(
                            self.access_log,
                            &self.denial_log,
                            &crate::decide::Decided {
                                door: "rls",
                                method: None,
                                path: Some(&request.domain),
                                client: key,
                                address: None,
                                rule: &rule.name,
                                outcome: keyed.outcome,
                                status: if keyed.outcome.forwards() { 200 } else { 429 },
                                retry_after_s: decided.as_ref().filter(|_| !keyed.outcome.forwards()).map(
                                    |decision| crate::limit_headers::retry_after_secs(decision.retry_after),
                                ),
                            },
                        );
                        status(limit, rule, keyed.decision, keyed.outcome.forwards())
                    }
                    // Every table the configuration builds holds RLS_CONFIG's rules.
                    None => DescriptorStatus {
                        code: Code::Ok as i32,
                        ..Default::default()
                    },
                },
            };
            statuses.push(status);
            decisions.push(decided);
        }
        let over = statuses
            .iter()
            .any(|status| status.code == Code::OverLimit as i32);
        let nearest = nearest(&statuses);
        let mut response = RateLimitResponse {
            overall_code: if over { Code::OverLimit } else { Code::Ok } as i32,
            response_headers_to_add: nearest.map(|index| headers(&statuses[index])).unwrap_or_default(),
            ..Default::default()
        };
        if let Some(index) = nearest
            && let Plan::Decide(_, rule, _) = plans[index]
            && let Some(decision) = &decisions[index]
        {
            self.shape(&mut response, decision, rule, over);
        }
        response.statuses = statuses;
        Ok(response)
    }

    /// What the status nearest its limit (its `decision` under `rule`) adds: on a refusal, the
    /// body Envoy sends (`raw_body`, in `DENY_FORMAT`: Envoy's request carries no `Accept` to
    /// choose by, its `retry-after` the decision's) and its `Content-Type`; on an allowed request
    /// with `FORWARD_RATELIMIT_HEADERS`, the draft fields for Envoy to set on the request it
    /// forwards, exactly as the proxy sets them (every limit of a rule of several, `RULE.1`,
    /// `RULE.2`, ...).
    fn shape(&self, response: &mut RateLimitResponse, decision: &Decision, rule: &Rule, over: bool) {
        let header = |key: &str, value: &http::HeaderValue| HeaderValue {
            key: key.to_owned(),
            value: value.to_str().unwrap_or_default().to_owned(),
            raw_value: Vec::new(),
        };
        if over {
            let format = self.refusals.format();
            let body = self.refusals.body(
                format,
                self.refusals.status(),
                Violated::rule(&rule.name),
                crate::limit_headers::retry_after_secs(decision.retry_after).max(1),
            );
            response.raw_body = body.to_vec();
            response
                .response_headers_to_add
                .push(header("content-type", &format.content_type()));
        } else if self.forward_headers {
            let mut fields = http::HeaderMap::new();
            crate::limit_headers::set_draft(&mut fields, rule, decision);
            response.request_headers_to_add = ["RateLimit-Policy", "RateLimit"]
                .into_iter()
                .filter_map(|key| fields.get(key).map(|value| header(key, value)))
                .collect();
        }
    }

    /// What each descriptor comes to: its limit, unless another matched limit replaces it.
    fn plan(&self, request: &RateLimitRequest) -> Vec<Plan<'_>> {
        let matched: Vec<Option<config::LimitId>> = request
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
            .flat_map(|id| self.table.limits[*id].replaces.iter().map(String::as_str))
            .collect();
        matched
            .iter()
            .zip(&request.descriptors)
            .map(|(id, descriptor)| {
                let Some(id) = *id else { return Plan::Free };
                let limit = &self.table.limits[id];
                if limit.name.as_deref().is_some_and(|name| replaced.contains(&name)) {
                    return Plan::Free;
                }
                match &self.rules[id] {
                    None => Plan::Unlimited,
                    Some(rule) => {
                        let hits = descriptor
                            .hits_addend
                            .map_or(u64::from(request.hits_addend), |hits| hits);
                        Plan::Decide(limit, rule, hits.max(1))
                    }
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
        self.check(request.get_ref()).await.map(Response::new)
    }
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
    }
    Ok(())
}

/// Whose budget a descriptor spends: the domain and every entry (as that service's cache key
/// holds them all), each length-prefixed so no two descriptors encode alike.
pub(crate) fn client_name(domain: &str, descriptor: &RateLimitDescriptor) -> Vec<u8> {
    let mut name = Vec::with_capacity(8 + domain.len() + descriptor.entries.len() * 24);
    name.extend_from_slice(b"rls\0");
    let mut part = |bytes: &[u8]| {
        name.extend_from_slice(&(bytes.len() as u64).to_le_bytes());
        name.extend_from_slice(bytes);
    };
    part(domain.as_bytes());
    for entry in &descriptor.entries {
        part(entry.key.as_bytes());
        part(entry.value.as_bytes());
    }
    name
}

/// The status of a descriptor decided under `rule`: `forwards` is whether the gate lets the
/// request on (so `OK`; a shadow rule's refusals and `FAIL_MODE=open` do).
///
/// `current_limit` is the limit as written for a plain `unit` and `requests_per_unit` (a fixed
/// window). For an `algorithm` or a `limits` list it is the limit the decision describes (the
/// one closest to exhaustion, or the refusing one with the latest retry, as the proxy's
/// legacy headers describe it; the first limit when no store decided): its capacity or
/// per-window limit as `requests_per_unit`, in the [`nearest_unit`] of its window.
fn status(limit: &config::Limit, rule: &Rule, verdict: Verdict, forwards: bool) -> DescriptorStatus {
    let code = if forwards { Code::Ok } else { Code::OverLimit };
    let decision = verdict.decision();
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

/// The status nearest its limit: the last one over it if any is, else the one with the least
/// remaining (the first of equals), as envoyproxy/ratelimit picks it; none when no descriptor
/// had a limit decided.
fn nearest(statuses: &[DescriptorStatus]) -> Option<usize> {
    let decided = statuses
        .iter()
        .enumerate()
        .filter(|(_, status)| status.current_limit.is_some() && status.duration_until_reset.is_some());
    decided
        .clone()
        .rfind(|(_, status)| status.code == Code::OverLimit as i32)
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
