//! The log line of a decision of a door that forwards nothing (forward-auth, `/v1/check`,
//! Envoy's rate limit service), written as the proxy writes one per request: its own module,
//! so that every door can write it without importing another door.

use crate::outcome::Outcome;
use crate::proxy::AccessLog;
use crate::rules::ClientKey;
use crate::telemetry::throttle::LogThrottle;

/// One decision of a door here, for its log line.
pub(crate) struct Decided<'a> {
    /// `forward-auth` or `check`.
    pub(crate) door: &'static str,
    /// The original request's method and path (a named `/v1/check` question has none; for
    /// Envoy's rate limit service, the path is the descriptors' domain).
    pub(crate) method: Option<&'a str>,
    pub(crate) path: Option<&'a str>,
    /// Whose budget, as the proxy's lines and `/v1/limited` name it.
    pub(crate) client: ClientKey,
    /// The client's address, when the door was told it.
    pub(crate) address: Option<std::net::IpAddr>,
    pub(crate) rule: &'a str,
    pub(crate) outcome: Outcome,
    /// The status the door answers (for `/v1/check` always 200: `allowed` says the rest).
    pub(crate) status: u16,
    pub(crate) retry_after_s: Option<u64>,
}

/// The line about one decision of a door that forwards nothing (see [`Decide::log`](crate::decide::Decide::log)), under
/// `access_log`, refusals paced by `throttle`.
pub(crate) fn log(access_log: AccessLog, throttle: &LogThrottle, decided: &Decided<'_>) {
    let Decided {
        door,
        method,
        path,
        client,
        address,
        rule,
        outcome,
        status,
        retry_after_s,
    } = decided;
    let suppressed = match access_log {
        _ if !tracing::enabled!(tracing::Level::INFO) => None,
        AccessLog::All => Some(0),
        _ if access_log.logs(*outcome) => throttle.admit(),
        _ => None,
    };
    let address = address.map(tracing::field::display);
    match suppressed {
        Some(suppressed) => {
            if suppressed > 0 {
                tracing::info!(suppressed, "{suppressed} similar lines suppressed");
            }
            let message = match outcome {
                Outcome::Shadow => "shadow rule would have refused this request; allowed",
                _ if !outcome.forwards() => "request refused",
                _ => "request",
            };
            tracing::info!(
                door,
                method,
                path,
                client = %client,
                address,
                rule,
                decision = outcome.as_str(),
                status,
                retry_after_s,
                "{message}"
            );
        }
        None => tracing::debug!(
            door,
            method,
            path,
            client = %client,
            address,
            rule,
            decision = outcome.as_str(),
            status,
            "request"
        ),
    }
}
