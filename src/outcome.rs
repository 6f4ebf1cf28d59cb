//! What became of a request and of its backend exchange, as logs and metrics name them: the
//! types every door and the metrics share, in a module of their own so that neither depends
//! on the other for them.

use crate::rules::Mode;
use crate::stores::Verdict;

/// What became of one request, as logs and metrics name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Within budget: forwarded.
    Allowed,
    /// Over budget: refused with 429.
    Limited,
    /// Over budget under a shadow rule: forwarded anyway.
    Shadow,
    /// `SKIP_PATHS` or `EXEMPT`: forwarded without a decision.
    Exempt,
    /// Redis could not decide and `FAIL_MODE=open`: forwarded.
    FailOpen,
    /// Redis could not decide and `FAIL_MODE=closed`: refused with 503.
    FailClosed,
    /// Redis could not decide; this replica's own store allowed it (`FAIL_MODE=local`).
    LocalAllowed,
    /// Redis could not decide; this replica's own store refused it (`FAIL_MODE=local`).
    LocalLimited,
    /// A `deny` override (`OVERRIDES_FILE`): refused without a decision.
    Denied,
}

impl Outcome {
    /// Every outcome, in declaration order (`outcome as usize` indexes it).
    pub const ALL: [Outcome; 9] = [
        Outcome::Allowed,
        Outcome::Limited,
        Outcome::Shadow,
        Outcome::Exempt,
        Outcome::FailOpen,
        Outcome::FailClosed,
        Outcome::LocalAllowed,
        Outcome::LocalLimited,
        Outcome::Denied,
    ];

    /// What the gateway does with a request matched in `mode` given the limiter's verdict
    /// (`None` for exempt requests, which are not decided).
    pub fn of(mode: Mode, verdict: Option<&Verdict>) -> Outcome {
        match (mode, verdict) {
            (Mode::Deny, _) => Outcome::Denied,
            (Mode::Exempt, _) | (_, None) => Outcome::Exempt,
            (_, Some(Verdict::Decided(decision))) if decision.allowed => Outcome::Allowed,
            (Mode::Shadow, Some(Verdict::Decided(_))) => Outcome::Shadow,
            (_, Some(Verdict::Decided(_))) => Outcome::Limited,
            (_, Some(Verdict::DecidedLocally(decision))) if decision.allowed => Outcome::LocalAllowed,
            (Mode::Shadow, Some(Verdict::DecidedLocally(_))) => Outcome::Shadow,
            (_, Some(Verdict::DecidedLocally(_))) => Outcome::LocalLimited,
            (_, Some(Verdict::FailOpen)) => Outcome::FailOpen,
            (Mode::Shadow, Some(Verdict::FailClosed)) => Outcome::FailOpen,
            (_, Some(Verdict::FailClosed)) => Outcome::FailClosed,
        }
    }

    /// Whether the request goes to the backend.
    pub fn forwards(self) -> bool {
        !matches!(
            self,
            Outcome::Limited | Outcome::LocalLimited | Outcome::FailClosed | Outcome::Denied
        )
    }

    /// The name in logs and the `decision` label of the metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Allowed => "allowed",
            Outcome::Limited => "limited",
            Outcome::Shadow => "shadow",
            Outcome::Exempt => "exempt",
            Outcome::FailOpen => "fail_open",
            Outcome::FailClosed => "fail_closed",
            Outcome::LocalAllowed => "local_fallback",
            Outcome::LocalLimited => "local_fallback_limited",
            Outcome::Denied => "denied",
        }
    }
}

/// Why the backend gave no answer, as logs and metrics name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackendFailure {
    /// Its name did not resolve.
    Dns,
    /// Nothing listens there.
    Refused,
    /// It closed or reset the connection before answering.
    Reset,
    /// It did not connect or answer within `BACKEND_TIMEOUT_MS`.
    Timeout,
    /// The TLS handshake failed: its certificate (expired, unknown issuer, wrong name) or
    /// the handshake itself.
    Tls,
    /// Anything else.
    Other,
}

impl BackendFailure {
    /// Every failure, in declaration order (`failure as usize` indexes it).
    pub const ALL: [BackendFailure; 6] = [
        BackendFailure::Dns,
        BackendFailure::Refused,
        BackendFailure::Reset,
        BackendFailure::Timeout,
        BackendFailure::Tls,
        BackendFailure::Other,
    ];

    /// The name in logs and the `cause` label of the metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            BackendFailure::Dns => "dns",
            BackendFailure::Refused => "refused",
            BackendFailure::Reset => "reset",
            BackendFailure::Timeout => "timeout",
            BackendFailure::Tls => "tls",
            BackendFailure::Other => "other",
        }
    }
}

/// Why a connection was closed before HTTP: the `reason` label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Rejection {
    /// `PROXY_PROTOCOL=true` and the peer is not in `TRUSTED_PROXIES`.
    ProxyUntrusted,
    /// A trusted peer's connection did not begin with a good PROXY header.
    ProxyMalformed,
    /// The TLS handshake failed.
    TlsHandshake,
    /// The PROXY header or the handshake was not done within `HEADER_READ_TIMEOUT_MS`.
    Timeout,
}

impl Rejection {
    /// Every reason, in label order.
    pub(crate) const ALL: [Rejection; 4] = [
        Rejection::ProxyUntrusted,
        Rejection::ProxyMalformed,
        Rejection::TlsHandshake,
        Rejection::Timeout,
    ];

    /// The label value.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Rejection::ProxyUntrusted => "proxy_untrusted",
            Rejection::ProxyMalformed => "proxy_malformed",
            Rejection::TlsHandshake => "tls_handshake",
            Rejection::Timeout => "handshake_timeout",
        }
    }
}
