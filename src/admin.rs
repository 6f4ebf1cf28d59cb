//! The admin listener: `GET /metrics`, `GET /healthz` and `GET /readyz`, on a port of their own
//! (`ADMIN_PORT`), so no backend path is shadowed and a prober never spends a client's budget.
//!
//! - `/healthz`: 200 while the process serves (liveness).
//! - `/readyz`: 200 when traffic should be sent here, 503 while draining after SIGTERM, or
//!   while `FAIL_MODE=closed` refuses everything because the Redis breaker is open (on a
//!   cluster, every master's). With the fail modes that forward (`open`, `local`), a Redis
//!   outage does not make the gateway unready: taking every replica out of a load balancer
//!   would turn it into an outage of the backend. The body says which store, and the
//!   breakers' state (`closed`, `open`, or `partial` when some cluster masters' are open), as
//!   JSON.
//! - `/metrics`: the Prometheus text format 0.0.4, or OpenMetrics 1.0.0 to a scraper whose
//!   `Accept` prefers `application/openmetrics-text` (Prometheus does); see [`crate::metrics`].
//!
//! With `ADMIN_TOKEN` set, the admin operations too, each behind `Authorization: Bearer
//! <ADMIN_TOKEN>` (compared in constant time; `401` without it) and logged with the peer
//! that asked; without `ADMIN_TOKEN` they do not exist (`404`). They go through the
//! [`Gate`], which names the rule and the client as requests do:
//!
//! - `GET /v1/clients/RULE/KEY`: what the client has left under the rule, spending nothing.
//!   `KEY` as logs write it: an address, `key:VALUE` with the raw value of the rule's one key
//!   source (a header's, a cookie's, ...), or `IP+key:VALUE`; under a rule keyed by several
//!   sources, `VALUE` is the digest as logs print it. Percent-encoded where it (or a rule named
//!   by its pattern) holds a `/`; anything after `KEY` is not found (`404`), not ignored.
//!   `key:<32 hex digits>` as logs and `/v1/limited` print it also names that digest under a
//!   rule keyed by one source (whose `key:VALUE` is otherwise the raw value).
//! - `DELETE /v1/clients/RULE/KEY`: give it its whole budget back (in Redis, for every
//!   replica); `404` with `"reset": false` when the store held no budget of it.
//! - `GET /v1/limited?top=N`: per rule, the clients refused most in the last minute, from a
//!   bounded heavy-hitter sketch ([`crate::gate::refused`]).
//!
//! Also here: [`healthcheck`], what `tollgate healthcheck` runs for a container's
//! `HEALTHCHECK` (the distroless image has no curl).

use std::collections::VecDeque;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode, header};
use http_body_util::{BodyExt, Empty, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use parking_lot::Mutex;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;

use crate::decide::Token;
use crate::gate::refused::{CAPACITY, WINDOW};
use crate::gate::{ClientError, Gate};
use crate::metrics::{Format, Metrics};
use crate::rules::FailMode;
use crate::stores::store::common_fail_mode;

/// The admin listener's settings.
#[derive(Debug, Clone)]
pub(crate) struct AdminSettings {
    /// `ADMIN_BIND` (default loopback) and `ADMIN_PORT`: `/metrics`, `/healthz`, `/readyz`,
    /// apart from proxied traffic so no backend path is shadowed and probes spend no budget.
    pub address: SocketAddr,
    /// `ADMIN_TOKEN`: the bearer token of the operations on `/v1/`; `None`: they do not exist.
    pub token: Option<Token>,
}

/// How long an admin client may take to send its request head (and stay idle between
/// requests).
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(5);

/// Most admin connections open at once; past it a new one takes the place of the oldest, which
/// is closed. Probes and scrapers need a few; the cap keeps a flood of admin connections inside
/// the file descriptors set apart for the admin listener and the like
/// ([`RESERVED_FDS`](crate::server::limits::RESERVED_FDS)), so it cannot starve proxied
/// traffic of them, and closing the oldest rather than refusing the newest means a flood of
/// connections that send nothing cannot keep a probe out either: a probe asks at once, and is
/// answered before 32 more connections push it out.
pub const MAX_ADMIN_CONNECTIONS: usize = 32;

/// How long `tollgate healthcheck` waits for an answer: below the image's `HEALTHCHECK
/// --timeout=3s`, so the probe's own message (not Docker's "timed out") reaches the health log.
const HEALTHCHECK_TIMEOUT: Duration = Duration::from_secs(2);

/// What the admin endpoints report on.
pub(crate) struct AdminState {
    /// The registry `/metrics` encodes.
    pub metrics: Arc<Metrics>,
    /// The gate, whose store (the table in force's) `/readyz` reports on.
    pub gate: Arc<Gate>,
    /// Set when the drain begins: `/readyz` turns 503 so load balancers stop sending.
    pub draining: AtomicBool,
    /// The admin operations on `/v1/`, with `ADMIN_TOKEN`; `None`: they do not exist.
    pub operations: Option<Operations>,
}

/// What the admin operations need: the token they ask for, and the gate they act through.
pub(crate) struct Operations {
    /// `ADMIN_TOKEN`.
    pub token: Token,
    /// The proxy's gate: the same rules, keys and store as the requests.
    pub gate: Arc<Gate>,
}

/// How many clients `/v1/limited` lists per rule unless `top` says.
const DEFAULT_TOP: usize = 10;

/// Serve the admin endpoints on `listener` until the task is dropped.
pub(crate) async fn serve(listener: TcpListener, state: Arc<AdminState>) {
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT);
    let open = Arc::new(OpenConnections::default());
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(error) => {
                tracing::debug!(%error, "admin accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let (id, close) = open.admit();
        tracing::trace!(%peer, "admin connection accepted");
        let state = state.clone();
        let service = service_fn(move |request: Request<Incoming>| {
            let state = state.clone();
            async move {
                let response = match &state.operations {
                    Some(operations) if request.uri().path().starts_with("/v1/") => {
                        operate(operations, &request, peer).await
                    }
                    _ => answer(&state, &request),
                };
                Ok::<_, Infallible>(response)
            }
        });
        let connection = http.serve_connection(TokioIo::new(stream), service);
        let open = open.clone();
        tokio::spawn(async move {
            tokio::select! {
                served = connection => if let Err(error) = served {
                    tracing::debug!(%error, "admin connection ended with an error");
                },
                // Dropping the connection closes its socket.
                () = close.notified() => tracing::debug!(
                    max = MAX_ADMIN_CONNECTIONS,
                    "admin connection closed for a newer one: too many open"
                ),
            }
            open.remove(id);
        });
    }
}

/// The admin connections open, oldest first, each with the means to close it.
#[derive(Default)]
struct OpenConnections {
    inner: Mutex<OpenInner>,
}

#[derive(Default)]
struct OpenInner {
    /// The id the next connection gets.
    next: u64,
    /// `(id, close)` of each connection open, in the order they were accepted.
    held: VecDeque<(u64, Arc<Notify>)>,
}

impl OpenConnections {
    /// A place for a new connection: its id and what tells it to close. At
    /// [`MAX_ADMIN_CONNECTIONS`] the oldest is told to close and given up.
    fn admit(&self) -> (u64, Arc<Notify>) {
        let mut inner = self.inner.lock();
        if inner.held.len() >= MAX_ADMIN_CONNECTIONS
            && let Some((_, oldest)) = inner.held.pop_front()
        {
            // A stored permit if its task is not waiting yet: it still closes.
            oldest.notify_one();
        }
        let id = inner.next;
        inner.next += 1;
        let close = Arc::new(Notify::new());
        inner.held.push_back((id, close.clone()));
        (id, close)
    }

    /// Connection `id` has ended (or was given up already: then nothing happens).
    fn remove(&self, id: u64) {
        let mut inner = self.inner.lock();
        if let Some(at) = inner.held.iter().position(|(held, _)| *held == id) {
            inner.held.remove(at);
        }
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.inner.lock().held.len()
    }
}

fn answer(state: &AdminState, request: &Request<Incoming>) -> Response<Full<Bytes>> {
    if !matches!(*request.method(), Method::GET | Method::HEAD) {
        return text(StatusCode::METHOD_NOT_ALLOWED, "GET only\n");
    }
    match request.uri().path() {
        "/healthz" => text(StatusCode::OK, "ok\n"),
        "/readyz" => readiness(state),
        "/metrics" => {
            let format = Format::negotiate(request.headers().get(header::ACCEPT));
            match state.metrics.encode(format) {
                Ok(body) => {
                    let mut response = Response::new(Full::new(Bytes::from(body)));
                    let headers = response.headers_mut();
                    headers.insert(
                        header::CONTENT_TYPE,
                        header::HeaderValue::from_static(format.content_type()),
                    );
                    // The body depends on Accept: a cache in between must not mix them up.
                    headers.insert(header::VARY, header::HeaderValue::from_static("accept"));
                    response
                }
                Err(_) => text(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "metrics could not be encoded\n",
                ),
            }
        }
        _ => text(
            StatusCode::NOT_FOUND,
            "not found: try /metrics, /healthz or /readyz\n",
        ),
    }
}

/// An admin operation on `/v1/`: the token first, then the operation, logged with `peer`.
async fn operate(
    operations: &Operations,
    request: &Request<Incoming>,
    peer: SocketAddr,
) -> Response<Full<Bytes>> {
    let method = request.method();
    let path = request.uri().path();
    if !operations
        .token
        .authorizes(request.headers().get(header::AUTHORIZATION))
    {
        tracing::warn!(%peer, %method, path, "admin operation refused: no valid ADMIN_TOKEN");
        let mut response = text(StatusCode::UNAUTHORIZED, "Authorization: Bearer <ADMIN_TOKEN>\n");
        response.headers_mut().insert(
            header::WWW_AUTHENTICATE,
            header::HeaderValue::from_static("Bearer"),
        );
        return response;
    }
    if path == "/v1/limited" {
        return limited(&operations.gate, request, peer);
    }
    let Some((rule, client)) = path
        .strip_prefix("/v1/clients/")
        .and_then(|rest| rest.split_once('/'))
        .filter(|(_, client)| one_segment(client))
        .and_then(|(rule, client)| Some((decode(rule)?, decode(client)?)))
    else {
        return text(
            StatusCode::NOT_FOUND,
            "not found: try /v1/clients/RULE/KEY (one segment each: percent-encode a / in them) or /v1/limited?top=N\n",
        );
    };
    let answered = match *method {
        Method::GET => inspect(&operations.gate, &rule, &client, peer).await,
        Method::DELETE => reset(&operations.gate, &rule, &client, peer).await,
        _ => return text(StatusCode::METHOD_NOT_ALLOWED, "GET or DELETE only\n"),
    };
    match answered {
        Ok((status, body)) => json(status, &body),
        Err(error) => {
            tracing::warn!(%peer, %method, rule, client, %error, "admin operation failed");
            let status = match error {
                ClientError::UnknownRule(_) => StatusCode::NOT_FOUND,
                ClientError::BadKey(_) | ClientError::NotADigest(..) => StatusCode::BAD_REQUEST,
                ClientError::Store(_) => StatusCode::SERVICE_UNAVAILABLE,
            };
            text(status, &format!("{error}\n"))
        }
    }
}

/// `GET /v1/limited?top=N`: the clients refused most in the last [`WINDOW`], by rule.
fn limited(gate: &Gate, request: &Request<Incoming>, peer: SocketAddr) -> Response<Full<Bytes>> {
    if *request.method() != Method::GET {
        return text(StatusCode::METHOD_NOT_ALLOWED, "GET only\n");
    }
    let top = match top_of(request.uri().query()) {
        Ok(top) => top,
        Err(message) => return text(StatusCode::BAD_REQUEST, &message),
    };
    tracing::info!(%peer, operation = "limited", top, "admin operation");
    let rules: Vec<serde_json::Value> = gate
        .most_refused(top)
        .into_iter()
        .map(|(rule, clients)| {
            let clients: Vec<serde_json::Value> = clients
                .iter()
                .map(|counted| {
                    serde_json::json!({
                        "client": counted.client.to_string(),
                        "refused": counted.count,
                        "error": counted.error,
                    })
                })
                .collect();
            serde_json::json!({ "rule": &*rule, "clients": clients })
        })
        .collect();
    json(
        StatusCode::OK,
        &serde_json::json!({ "window_seconds": WINDOW.as_secs(), "rules": rules }),
    )
}

/// `GET /v1/clients/RULE/KEY`: the client's budget under the rule, each limit's part of it.
async fn inspect(
    gate: &Gate,
    rule: &str,
    client: &str,
    peer: SocketAddr,
) -> Result<(StatusCode, serde_json::Value), ClientError> {
    let (rule, key, decision) = gate.inspect(rule, client).await?;
    tracing::info!(%peer, operation = "inspect", rule = %rule.name, client = %key, "admin operation");
    let limits: Vec<serde_json::Value> = rule
        .limits
        .iter()
        .zip(decision.parts())
        .map(|(policy, part)| {
            serde_json::json!({
                "algorithm": policy.name(),
                "limit": policy.limit(),
                "window_s": policy.window().as_secs_f64(),
                "remaining": part.remaining,
                "reset_after_ms": part.reset_after().as_millis() as u64,
            })
        })
        .collect();
    Ok((
        StatusCode::OK,
        serde_json::json!({
            "rule": &*rule.name,
            "client": key.to_string(),
            "algorithm": rule.limits.first().name(),
            "limit": decision.limit,
            "remaining": decision.remaining,
            "reset_after_ms": decision.reset_after.as_millis() as u64,
            "limited": decision.parts().iter().any(|part| part.remaining < rule.cost),
            "limits": limits,
        }),
    ))
}

/// `DELETE /v1/clients/RULE/KEY`: the client's budget under the rule made whole.
async fn reset(
    gate: &Gate,
    rule: &str,
    client: &str,
    peer: SocketAddr,
) -> Result<(StatusCode, serde_json::Value), ClientError> {
    let (rule, key, held) = gate.reset(rule, client).await?;
    tracing::info!(%peer, operation = "reset", rule = %rule, client = %key, held, "admin operation");
    let mut body = serde_json::json!({ "rule": &*rule, "client": key.to_string(), "reset": held });
    if held {
        return Ok((StatusCode::OK, body));
    }
    // Nothing matched: a mistyped key, or a client whose budget is whole already.
    body["error"] = "no budget of this client under this rule: nothing to reset".into();
    Ok((StatusCode::NOT_FOUND, body))
}

/// `top=N` of `/v1/limited`'s query: [`DEFAULT_TOP`] without one, at most [`CAPACITY`].
fn top_of(query: Option<&str>) -> Result<usize, String> {
    let Some(value) = query
        .unwrap_or_default()
        .split('&')
        .find_map(|pair| pair.strip_prefix("top="))
    else {
        return Ok(DEFAULT_TOP);
    };
    value
        .parse::<usize>()
        .ok()
        .filter(|top| *top >= 1)
        .map(|top| top.min(CAPACITY))
        .ok_or_else(|| format!("top={value:?}: a whole number from 1 (at most {CAPACITY} are kept)\n"))
}

/// Whether the client part of `/v1/clients/RULE/KEY` is one segment: a `/` in it percent-
/// encoded, but for an IPv6 network as logs write it (`2001:db8:1:2::/64`), whose prefix the
/// gate checks. `127.0.0.1/extra` names no client, rather than 127.0.0.1.
fn one_segment(client: &str) -> bool {
    match client.split_once('/') {
        None => true,
        Some((address, prefix)) => {
            address.contains(':')
                && !address.contains("key:")
                && !prefix.is_empty()
                && prefix.bytes().all(|b| b.is_ascii_digit())
        }
    }
}

/// One path segment, percent-decoded; `None` when empty or not UTF-8.
fn decode(segment: &str) -> Option<String> {
    let decoded = percent_encoding::percent_decode_str(segment).decode_utf8().ok()?;
    (!decoded.is_empty()).then(|| decoded.into_owned())
}

fn json(status: StatusCode, body: &serde_json::Value) -> Response<Full<Bytes>> {
    let mut response = text(status, &format!("{body}\n"));
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("application/json"),
    );
    response
}

fn readiness(state: &AdminState) -> Response<Full<Bytes>> {
    let draining = state.draining.load(Ordering::Acquire);
    let generation = state.gate.current();
    let limiter = generation.limiter();
    let stats = limiter.stats();
    let common = common_fail_mode(limiter.fail_modes());
    let (breaker, refusing) = match stats.breakers {
        None => ("none", false),
        Some(breakers) => {
            // Not ready only when nothing can be served: with any rule failing open or local,
            // its requests still get through (and a pod taken out for the others would take
            // them down too).
            let refusing = breakers.all_open && common == Some(FailMode::Closed);
            let breaker = match breakers.open {
                _ if breakers.all_open => "open",
                0 => "closed",
                // Some cluster masters are given up on, not all: their slots get the fail mode.
                _ => "partial",
            };
            (breaker, refusing)
        }
    };
    let store = stats.kind;
    let (fail_mode, fail_modes) = match stats.breakers {
        // A store that never fails has no fail mode.
        None => ("none", String::new()),
        Some(_) => {
            // Rule names are [a-z0-9_-] or a route's pattern, printable ASCII without `\`,
            // which may hold a `"`.
            let each: Vec<String> = limiter
                .fail_modes()
                .iter()
                .map(|(rule, mode)| format!(r#""{}":"{}""#, rule.replace('"', r#"\""#), mode.as_str()))
                .collect();
            (
                common.map_or("mixed", FailMode::as_str),
                format!(r#","fail_modes":{{{}}}"#, each.join(",")),
            )
        }
    };
    let ready = !draining && !refusing;
    let status = if ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    let body = format!(
        r#"{{"ready":{ready},"draining":{draining},"store":"{store}","breaker":"{breaker}","fail_mode":"{fail_mode}"{fail_modes}}}"#
    );
    let mut response = text(status, &body);
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("application/json"),
    );
    response
}

fn text(status: StatusCode, body: &str) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::copy_from_slice(body.as_bytes())));
    *response.status_mut() = status;
    response
}

/// `tollgate healthcheck`: GET `/healthz` on the admin listener at `address` (see
/// [`crate::config::admin_probe_address`]). `Ok` on 200.
pub async fn healthcheck(address: SocketAddr) -> Result<(), String> {
    let probe = async {
        let stream = TcpStream::connect(address)
            .await
            .map_err(|error| format!("cannot connect to the admin listener at {address}: {error}"))?;
        let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|error| format!("{address}: {error}"))?;
        tokio::spawn(connection);
        let request = Request::get("/healthz")
            .header(header::HOST, address.to_string())
            .body(Empty::<Bytes>::new())
            .map_err(|error| error.to_string())?;
        let response = sender
            .send_request(request)
            .await
            .map_err(|error| format!("{address}: {error}"))?;
        let status = response.status();
        // Read the body so the exchange completes cleanly; its content does not matter.
        let _ = response.into_body().collect().await;
        if status == StatusCode::OK {
            Ok(())
        } else {
            Err(format!("http://{address}/healthz answered {status}"))
        }
    };
    tokio::time::timeout(HEALTHCHECK_TIMEOUT, probe)
        .await
        .map_err(|_| format!("no answer from {address} within {HEALTHCHECK_TIMEOUT:?}"))?
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn past_the_cap_the_oldest_connection_is_told_to_close() {
        let open = OpenConnections::default();
        let first = open.admit();
        let rest: Vec<_> = (1..MAX_ADMIN_CONNECTIONS).map(|_| open.admit()).collect();
        assert_eq!(open.len(), MAX_ADMIN_CONNECTIONS);
        let newest = open.admit();
        assert_eq!(open.len(), MAX_ADMIN_CONNECTIONS);
        // The oldest has its permit (it closes even if it was not waiting yet); no one else.
        tokio::time::timeout(Duration::from_secs(5), first.1.notified())
            .await
            .expect("the oldest is told to close");
        open.remove(first.0);
        assert_eq!(open.len(), MAX_ADMIN_CONNECTIONS, "it was given up already");
        open.remove(rest[0].0);
        open.remove(newest.0);
        assert_eq!(open.len(), MAX_ADMIN_CONNECTIONS - 2);
    }

    #[test]
    fn the_admin_token_is_a_bearer_token_in_any_case_of_the_scheme() {
        let token = Token::new("admin-token-for-the-tests").unwrap();
        let header = |value: &'static str| header::HeaderValue::from_static(value);
        assert!(token.authorizes(Some(&header("Bearer admin-token-for-the-tests"))));
        assert!(token.authorizes(Some(&header("bearer admin-token-for-the-tests"))));
        assert!(!token.authorizes(Some(&header("Bearer admin-token-for-the-test"))));
        assert!(!token.authorizes(Some(&header("Basic admin-token-for-the-tests"))));
        assert!(!token.authorizes(Some(&header("Bearer"))));
        assert!(!token.authorizes(None));
    }

    #[test]
    fn top_defaults_to_ten_and_stops_at_the_sketch_capacity() {
        assert_eq!(top_of(None), Ok(DEFAULT_TOP));
        assert_eq!(top_of(Some("other=1")), Ok(DEFAULT_TOP));
        assert_eq!(top_of(Some("top=3")), Ok(3));
        assert_eq!(top_of(Some("x=y&top=1000")), Ok(CAPACITY));
        for bad in ["top=0", "top=-1", "top=ten", "top="] {
            assert!(top_of(Some(bad)).is_err(), "{bad}");
        }
    }
}
