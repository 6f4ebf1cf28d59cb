//! The tower layer (`tollgate::layer`) in an axum app over real sockets: in memory and on a real
//! Redis; one budget spent by the app and the gateway together; concurrency places held until
//! the response body ends; a cost the app reports; refusals, refused paths and headers as the
//! gateway answers them; the auth rule; the client's address through trusted proxies; and the
//! `500` that says how to give the layer a client address.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::routing::{get, post};
use bytes::Bytes;
use http::{Method, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tollgate::layer::RateLimitLayer;

use crate::support::{Backend, Gateway, RedisServer, Reply, get_from, request};

/// An axum app behind the layer, on `127.0.0.1:0`.
struct App {
    addr: SocketAddr,
    layer: RateLimitLayer,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for App {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The app's routes: `GET /` hello, `POST /login` ok, `GET /slow` after 500 ms, `GET
/// /cost/{n}` reporting that cost in `X-Tokens-Used`, `GET /stream` a body whose second
/// chunk comes a second after the first; anything else `app`.
fn routes() -> Router {
    Router::new()
        .route("/", get(|| async { "hello" }))
        .route("/login", post(|| async { "ok" }))
        .route(
            "/slow",
            get(|| async {
                tokio::time::sleep(Duration::from_millis(500)).await;
                "slow"
            }),
        )
        .route(
            "/cost/{n}",
            get(|axum::extract::Path(n): axum::extract::Path<String>| async move {
                ([("x-tokens-used", n)], "costly")
            }),
        )
        .route(
            "/stream",
            get(|| async {
                let chunks = futures_util::stream::unfold(0, |sent| async move {
                    match sent {
                        0 => Some((Ok::<_, std::io::Error>(Bytes::from_static(b"first ")), 1)),
                        1 => {
                            tokio::time::sleep(Duration::from_secs(1)).await;
                            Some((Ok(Bytes::from_static(b"last")), 2))
                        }
                        _ => None,
                    }
                });
                Body::from_stream(chunks)
            }),
        )
        .fallback(|| async { "app" })
}

impl App {
    /// The app with the layer of `vars` (the binary's variables), served with axum's
    /// `ConnectInfo`.
    async fn start(vars: &[(&str, &str)]) -> App {
        Self::serve(vars, true).await
    }

    async fn serve(vars: &[(&str, &str)], connect_info: bool) -> App {
        let layer = vars
            .iter()
            .fold(RateLimitLayer::builder(), |builder, (name, value)| {
                builder.var(name, *value)
            })
            .build()
            .expect("test layer is valid");
        // Around the whole router, so it routes the path the rules matched; an outer router
        // hands it every request, and serves its answers with axum's body.
        let app = Router::new().fallback_service(layer.wrap(routes()));
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let task = tokio::spawn(async move {
            let served = match connect_info {
                true => axum::serve(listener, app.into_make_service_with_connect_info::<SocketAddr>()).await,
                false => axum::serve(listener, app).await,
            };
            served.unwrap();
        });
        App { addr, layer, task }
    }
}

const LOCAL: [u8; 4] = [127, 0, 0, 1];

async fn send(to: SocketAddr, method: Method, path: &str, headers: &[(&str, &str)]) -> Reply {
    request(to, LOCAL.into(), method, path, headers, Bytes::new()).await
}

/// The headers a client reads of a decision, and a refusal's type and body: what the gateway
/// and the layer must answer alike (the reset time is a clock reading, compared apart; an
/// allowed request's type and body are the app's or the backend's).
fn answer(reply: &Reply) -> (StatusCode, Vec<(&'static str, Option<String>)>, Bytes) {
    let refused = reply.status != StatusCode::OK;
    let names = [
        "retry-after",
        "x-ratelimit-limit",
        "x-ratelimit-remaining",
        "ratelimit-policy",
        "ratelimit",
    ];
    let mut headers: Vec<_> = names
        .iter()
        .map(|name| (*name, reply.header(name).map(str::to_owned)))
        .collect();
    if refused {
        headers.push(("content-type", reply.header("content-type").map(str::to_owned)));
        return (reply.status, headers, reply.body.clone());
    }
    (reply.status, headers, Bytes::new())
}

/// The same requests to the gateway and to the app get the same answers: allowed with the
/// same headers, refused with the same status, headers and body, in each body format.
#[tokio::test]
async fn refusals_and_headers_are_the_gateways() {
    let vars = [
        ("LIMITS", "token_bucket:2:0.001"),
        ("AUTH_LIMITS", "fixed_window:1:3600"),
        ("RATE_LIMIT_HEADERS", "both"),
    ];
    let backend = Backend::start().await;
    let gateway = Gateway::start(&backend.url(), &vars).await;
    let app = App::start(&vars).await;
    for (method, path, headers) in [
        (Method::GET, "/", &[][..]),
        (Method::GET, "/", &[]),
        (Method::GET, "/", &[]),
        (Method::GET, "/", &[("accept", "text/plain")]),
        (Method::GET, "/", &[("accept", "application/problem+json")]),
        (Method::POST, "/login", &[]),
        (Method::POST, "/LOGIN;x=1", &[]),
        // Refused before any budget is touched, as ambiguous.
        (Method::GET, "/x%5c..%5clogin", &[]),
        (Method::GET, "/login%00.png", &[]),
        (Method::GET, "/a%2f..%2flogin", &[]),
    ] {
        let at_gateway = request(
            gateway.addr,
            LOCAL.into(),
            method.clone(),
            path,
            headers,
            Bytes::new(),
        )
        .await;
        let at_app = send(app.addr, method.clone(), path, headers).await;
        assert_eq!(
            answer(&at_app),
            answer(&at_gateway),
            "{method} {path} {headers:?}"
        );
        if let (Some(app_reset), Some(gateway_reset)) = (
            at_app.header("x-ratelimit-reset"),
            at_gateway.header("x-ratelimit-reset"),
        ) {
            let (a, g): (u64, u64) = (app_reset.parse().unwrap(), gateway_reset.parse().unwrap());
            assert!(a.abs_diff(g) <= 1, "{path}: reset {a} and {g}");
        }
    }
    // The refusals above are refusals, and the allowed requests reached the app.
    assert_eq!(
        send(app.addr, Method::GET, "/", &[]).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(
        send(app.addr, Method::GET, "/x%5c..%5clogin", &[]).await.status,
        StatusCode::BAD_REQUEST
    );
}

/// `AUTH_PATHS`' stricter rule on `POST /login`, whichever spelling the router would serve:
/// `/a/%2e%2e/login` is `/login` to the rules and to the app, which answers it.
#[tokio::test]
async fn the_auth_rule_is_stricter_and_dot_segments_reach_the_app_resolved() {
    let app = App::start(&[
        ("AUTH_LIMITS", "token_bucket:3:0.001"),
        ("LIMITS", "token_bucket:100:1"),
    ])
    .await;
    let first = send(app.addr, Method::POST, "/login", &[]).await;
    assert_eq!((first.status, first.text()), (StatusCode::OK, "ok"));
    assert_eq!(first.number("x-ratelimit-limit"), 3);
    let dotted = send(app.addr, Method::POST, "/a/%2e%2e/login", &[]).await;
    assert_eq!(
        (dotted.status, dotted.text()),
        (StatusCode::OK, "ok"),
        "routed as /login"
    );
    assert_eq!(dotted.number("x-ratelimit-remaining"), 1, "the auth budget");
    assert_eq!(
        send(app.addr, Method::POST, "/Login/", &[]).await.status,
        StatusCode::OK
    );
    let refused = send(app.addr, Method::POST, "/login", &[]).await;
    assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS);
    assert!(refused.number("retry-after") > 0);
    // The general rule has its own budget.
    let hello = send(app.addr, Method::GET, "/", &[]).await;
    assert_eq!((hello.status, hello.text()), (StatusCode::OK, "hello"));
    assert_eq!(hello.number("x-ratelimit-limit"), 100);
}

/// One Redis, one rule, one budget of 10: the app spends 6, the gateway gets the other 4 and
/// no more; then both at once for another client, exactly 10 allowed between them.
#[tokio::test]
async fn an_app_and_the_gateway_on_one_redis_spend_one_exact_budget() {
    let redis = RedisServer::start();
    let url = redis.url();
    let vars = [("REDIS_URL", url.as_str()), ("LIMITS", "token_bucket:10:0.001")];
    let backend = Backend::start().await;
    let gateway = Gateway::start(&backend.url(), &vars).await;
    let app = App::start(&vars).await;
    for n in 0..6 {
        let reply = send(app.addr, Method::GET, "/", &[]).await;
        assert_eq!(reply.status, StatusCode::OK, "app request {n}");
        assert_eq!(reply.number("x-ratelimit-remaining"), 9 - n);
    }
    let mut allowed = 0;
    for _ in 0..10 {
        let reply = get_from(gateway.addr, LOCAL.into(), "/", &[]).await;
        allowed += u32::from(reply.status == StatusCode::OK);
    }
    assert_eq!(allowed, 4, "the gateway gets what the app left");
    assert_eq!(
        send(app.addr, Method::GET, "/", &[]).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );

    // Both at once, 12 each, for one other client.
    let other: IpAddr = [127, 0, 0, 2].into();
    let mut tasks = Vec::new();
    for to in [app.addr, gateway.addr] {
        for _ in 0..12 {
            tasks.push(tokio::spawn(async move {
                request(to, other, Method::GET, "/", &[], Bytes::new())
                    .await
                    .status
            }));
        }
    }
    let mut allowed = 0;
    for task in tasks {
        allowed += u32::from(task.await.unwrap() == StatusCode::OK);
    }
    assert_eq!(allowed, 10, "exactly the budget, between the two");
}

/// The app in memory and on Redis decides alike: a budget, its refusal, and the store's
/// keys on Redis (the gateway's prefix).
#[tokio::test]
async fn the_layer_decides_in_memory_and_on_redis() {
    let redis = RedisServer::start();
    let url = redis.url();
    for store in [vec![], vec![("REDIS_URL", url.as_str())]] {
        let mut vars = vec![("LIMITS", "fixed_window:3:3600")];
        vars.extend(store.iter().copied());
        let app = App::start(&vars).await;
        let statuses: Vec<_> =
            futures_util::future::join_all((0..5).map(|_| send(app.addr, Method::GET, "/", &[])))
                .await
                .into_iter()
                .map(|reply| reply.status)
                .collect();
        let allowed = statuses
            .iter()
            .filter(|status| **status == StatusCode::OK)
            .count();
        assert_eq!(allowed, 3, "{store:?}: {statuses:?}");
    }
    assert!(
        !redis.cli(&["--scan", "--pattern", "*"]).trim().is_empty(),
        "the Redis run kept its budget in Redis"
    );
}

/// `concurrent:1`: a request's place is held while the app works and while its response
/// body is still being sent, and given back when the body ends.
#[tokio::test]
async fn concurrency_places_are_held_until_the_response_body_ends() {
    let app = App::start(&[("ROUTES", "/slow=concurrent:1;/stream=concurrent:1")]).await;
    let slow = tokio::spawn(send(app.addr, Method::GET, "/slow", &[]));
    tokio::time::sleep(Duration::from_millis(150)).await;
    let refused = send(app.addr, Method::GET, "/slow", &[]).await;
    assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS, "one place, taken");
    assert_eq!(slow.await.unwrap().text(), "slow");
    assert_eq!(
        send(app.addr, Method::GET, "/slow", &[]).await.status,
        StatusCode::OK
    );

    // The head has arrived, the body not yet: the place is still held.
    let stream = tokio::net::TcpStream::connect(app.addr).await.unwrap();
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(connection);
    let streaming = http::Request::get("/stream")
        .header("host", "app.test")
        .body(Full::new(Bytes::new()))
        .unwrap();
    let response = sender.send_request(streaming).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let refused = send(app.addr, Method::GET, "/stream", &[]).await;
    assert_eq!(
        refused.status,
        StatusCode::TOO_MANY_REQUESTS,
        "held while the body is sent"
    );
    let body = response.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(&body[..], b"first last");
    // Given back with the last frame (the client may ask again at once).
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(
        send(app.addr, Method::GET, "/stream", &[]).await.status,
        StatusCode::OK
    );
}

/// The app reports what a request cost in `RESPONSE_COST_HEADER`: the difference is charged
/// after the answer, and the header never reaches the client.
#[tokio::test]
async fn a_cost_the_app_reports_is_charged_and_not_shown() {
    let app = App::start(&[
        ("LIMITS", "token_bucket:10:0.001"),
        ("RESPONSE_COST_HEADER", "X-Tokens-Used"),
    ])
    .await;
    let costly = send(app.addr, Method::GET, "/cost/5", &[]).await;
    assert_eq!((costly.status, costly.text()), (StatusCode::OK, "costly"));
    assert!(
        costly.header("x-tokens-used").is_none(),
        "the app's report is not the client's"
    );
    assert_eq!(
        costly.number("x-ratelimit-remaining"),
        9,
        "the decision as it was made"
    );
    // 1 up front, 4 more after: 5 spent, and this one.
    assert_eq!(
        send(app.addr, Method::GET, "/", &[])
            .await
            .number("x-ratelimit-remaining"),
        4
    );
    // Reported 0: the up-front cost given back.
    send(app.addr, Method::GET, "/cost/0", &[]).await;
    assert_eq!(
        send(app.addr, Method::GET, "/", &[])
            .await
            .number("x-ratelimit-remaining"),
        3
    );
    // Malformed: ignored (the up-front cost stands) and counted.
    send(app.addr, Method::GET, "/cost/many", &[]).await;
    assert_eq!(
        send(app.addr, Method::GET, "/", &[])
            .await
            .number("x-ratelimit-remaining"),
        1
    );
    let metrics = app.layer.encode_metrics(false).unwrap();
    assert!(
        metrics.contains("tollgate_response_cost_invalid_total 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains(r#"tollgate_requests_total{rule="general",decision="allowed"} 6"#),
        "the app serves the gate's registry: {metrics}"
    );
}

/// `TRUSTED_PROXIES`: a trusted peer's `X-Forwarded-For` names the client, so two clients
/// behind one proxy have a budget each; an untrusted peer's is ignored.
#[tokio::test]
async fn the_client_is_found_through_trusted_proxies() {
    let app = App::start(&[
        ("LIMITS", "token_bucket:1:0.001"),
        ("TRUSTED_PROXIES", "127.0.0.1"),
    ])
    .await;
    let from = |client: &'static str| [("x-forwarded-for", client)];
    let first = from("203.0.113.1");
    assert_eq!(
        send(app.addr, Method::GET, "/", &first).await.status,
        StatusCode::OK
    );
    assert_eq!(
        send(app.addr, Method::GET, "/", &first).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(
        send(app.addr, Method::GET, "/", &from("203.0.113.2"))
            .await
            .status,
        StatusCode::OK
    );
    // 127.0.0.2 is no trusted proxy: its header is the client's own claim, and ignored.
    let untrusted: IpAddr = [127, 0, 0, 2].into();
    for (client, status) in [
        ("198.51.100.1", StatusCode::OK),
        ("198.51.100.2", StatusCode::TOO_MANY_REQUESTS),
    ] {
        let headers = [("x-forwarded-for", client)];
        let reply = request(app.addr, untrusted, Method::GET, "/", &headers, Bytes::new()).await;
        assert_eq!(reply.status, status, "{client}");
    }
}

/// Served without the connection's address, the layer cannot tell clients apart: a `500`
/// saying so (and a log line naming the fix), never a panic, and the app is not called.
#[tokio::test]
async fn without_a_client_address_the_answer_is_500_and_names_it() {
    let app = App::serve(&[], false).await;
    let reply = send(app.addr, Method::GET, "/", &[]).await;
    assert_eq!(reply.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert!(reply.text().contains("client's address"), "{}", reply.text());
    assert_eq!(
        send(app.addr, Method::GET, "/", &[]).await.status,
        StatusCode::INTERNAL_SERVER_ERROR
    );
}

/// A setting the binary refuses, the builder refuses with the same error, naming it.
#[tokio::test]
async fn a_bad_setting_is_the_binarys_error() {
    let error = RateLimitLayer::builder()
        .limits("token_bucket:ten:1")
        .build()
        .unwrap_err()
        .to_string();
    assert!(error.contains("LIMITS"), "{error}");
}

/// Built outside a Tokio runtime (where its store and upkeep would have nowhere to run): an
/// error saying so, not a panic.
#[test]
fn built_outside_a_runtime_the_layer_says_so() {
    let error = RateLimitLayer::builder().build().unwrap_err().to_string();
    assert!(error.contains("inside a Tokio runtime"), "{error}");
}
