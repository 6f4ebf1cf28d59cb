//! Every environment variable tollgate reads, by name, each with its default beside it: the
//! one place a name is spelt. The parsers in `config` read them through these
//! constants, the warnings about unknown names check against [`ALL`], and `.env.example`
//! documents each (a test holds the two to the same names and defaults).
//!
//! A leaf: the algorithms' parameter tables name their variables here too, without depending
//! on the configuration.

/// An environment variable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Var {
    /// Its name, as set.
    pub name: &'static str,
    /// Its value when unset, as written; `None` when unset means off, required, or derived
    /// from another variable (its parser says which).
    pub default: Option<&'static str>,
}

impl Var {
    const fn new(name: &'static str, default: &'static str) -> Var {
        Var {
            name,
            default: Some(default),
        }
    }

    const fn unset(name: &'static str) -> Var {
        Var { name, default: None }
    }
}

// --- core

/// Where allowed requests go (required unless DECIDE_PORT is set).
pub const BACKEND_URL: Var = Var::unset("BACKEND_URL");
/// The proxy listener's port (default `8080`).
pub const PORT: Var = Var::new("PORT", "8080");
/// The listeners' address (default `0.0.0.0`).
pub const BIND: Var = Var::new("BIND", "0.0.0.0");
/// The admin listener's port (default `9091`).
pub const ADMIN_PORT: Var = Var::new("ADMIN_PORT", "9091");
/// The admin listener's address (default `127.0.0.1`).
pub const ADMIN_BIND: Var = Var::new("ADMIN_BIND", "127.0.0.1");
/// The bearer token of the admin operations on `/v1/` (unset: they do not exist).
pub const ADMIN_TOKEN: Var = Var::unset("ADMIN_TOKEN");
/// The decision endpoints' port (unset: off).
pub const DECIDE_PORT: Var = Var::unset("DECIDE_PORT");
/// The bearer token `POST /v1/check` requires (unset: none).
pub const DECIDE_TOKEN: Var = Var::unset("DECIDE_TOKEN");
/// Envoy's rate limit service descriptors: a YAML file or a directory of them (unset: off).
pub const RLS_CONFIG: Var = Var::unset("RLS_CONFIG");
/// Whether files of one domain in RLS_CONFIG are merged (default `false`: refused).
pub const RLS_MERGE_DOMAIN_CONFIG: Var = Var::new("RLS_MERGE_DOMAIN_CONFIG", "false");
/// The general rule's algorithm (default `token_bucket`).
pub const ALGORITHM: Var = Var::new("ALGORITHM", "token_bucket");
/// The auth rule's algorithm (default: the value of ALGORITHM).
pub const AUTH_ALGORITHM: Var = Var::unset("AUTH_ALGORITHM");
/// The paths of the auth rule (default `/login,/signup,/reset-password`).
pub const AUTH_PATHS: Var = Var::new("AUTH_PATHS", "/login,/signup,/reset-password");
/// Which rate-limit headers answers carry (default `legacy`).
pub const RATE_LIMIT_HEADERS: Var = Var::new("RATE_LIMIT_HEADERS", "legacy");
/// The status of a rate-limit refusal (default `429`).
pub const DENY_STATUS: Var = Var::new("DENY_STATUS", "429");
/// The body of a rate-limit refusal when the client's `Accept` prefers none (default `json`).
pub const DENY_FORMAT: Var = Var::new("DENY_FORMAT", "json");
/// The draft `RateLimit` fields on forwarded requests, for the backend (default `false`).
pub const FORWARD_RATELIMIT_HEADERS: Var = Var::new("FORWARD_RATELIMIT_HEADERS", "false");
/// `text` or `json` log lines (default `text`).
pub const LOG_FORMAT: Var = Var::new("LOG_FORMAT", "text");
/// Which requests get an `info` line (default `denied`).
pub const ACCESS_LOG: Var = Var::new("ACCESS_LOG", "denied");
/// The log filter, read by tracing-subscriber.
pub const RUST_LOG: Var = Var::unset("RUST_LOG");

// --- traces (OpenTelemetry's own names)

/// The OTLP collector's base URL; traces go to its `/v1/traces` (unset: no traces).
pub const OTEL_EXPORTER_OTLP_ENDPOINT: Var = Var::unset("OTEL_EXPORTER_OTLP_ENDPOINT");
/// The URL traces are sent to, as is (unset: from OTEL_EXPORTER_OTLP_ENDPOINT).
pub const OTEL_EXPORTER_OTLP_TRACES_ENDPOINT: Var = Var::unset("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT");
/// `http/protobuf` or `grpc` (default `http/protobuf`).
pub const OTEL_EXPORTER_OTLP_PROTOCOL: Var = Var::new("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf");
/// The `service.name` of the spans (default `tollgate`).
pub const OTEL_SERVICE_NAME: Var = Var::unset("OTEL_SERVICE_NAME");
/// More resource attributes, `key=value,...` (unset: none).
pub const OTEL_RESOURCE_ATTRIBUTES: Var = Var::unset("OTEL_RESOURCE_ATTRIBUTES");
/// Which traces are recorded (default `parentbased_always_on`).
pub const OTEL_TRACES_SAMPLER: Var = Var::new("OTEL_TRACES_SAMPLER", "parentbased_always_on");
/// The ratio of the `*traceidratio` samplers, 0 to 1 (default `1.0`).
pub const OTEL_TRACES_SAMPLER_ARG: Var = Var::unset("OTEL_TRACES_SAMPLER_ARG");

/// The rules file (TOML): the rule table's settings, reloaded on SIGHUP and when it changes
/// (unset: the environment alone).
pub const RULES_FILE: Var = Var::unset("RULES_FILE");
/// How often the rules file (and OVERRIDES_FILE, RLS_CONFIG) is read for changes, in
/// milliseconds; `0`: on SIGHUP only (default `2000`).
pub const RULES_RELOAD_INTERVAL_MS: Var = Var::new("RULES_RELOAD_INTERVAL_MS", "2000");
/// The general rule's limits, `ALGORITHM:A:B`, several joined by `+` (unset: ALGORITHM and
/// its numbers).
pub const LIMITS: Var = Var::unset("LIMITS");
/// The auth rule's limits, as `LIMITS` (unset: AUTH_ALGORITHM and its numbers).
pub const AUTH_LIMITS: Var = Var::unset("AUTH_LIMITS");
/// A header of the backend's response saying what the request really cost (LLM tokens,
/// bytes, rows): the difference from the cost charged is charged or refunded (unset: none).
pub const RESPONSE_COST_HEADER: Var = Var::unset("RESPONSE_COST_HEADER");
/// Per-client overrides: a file of `RULE CLIENT LIMITS|unlimited|deny` lines, reloaded as
/// `RULES_FILE` is (unset: none).
pub const OVERRIDES_FILE: Var = Var::unset("OVERRIDES_FILE");
/// Tiers, `NAME=LIMITS;NAME=LIMITS`: the limits a request naming a tier in `TIER_HEADER` gets
/// (unset: none).
pub const TIERS: Var = Var::unset("TIERS");
/// The header naming a request's tier, believed from `TRUSTED_PROXIES` only (unset: none).
pub const TIER_HEADER: Var = Var::unset("TIER_HEADER");

// --- token bucket

/// General rule, token bucket: capacity (default `10`).
pub const MAX_TOKENS: Var = Var::new("MAX_TOKENS", "10");
/// General rule, token bucket: tokens per second (default `1`).
pub const REFILL_RATE: Var = Var::new("REFILL_RATE", "1");
/// Auth rule, token bucket: capacity (default `5`).
pub const AUTH_MAX_TOKENS: Var = Var::new("AUTH_MAX_TOKENS", "5");
/// Auth rule, token bucket: tokens per second (default `0.01`).
pub const AUTH_REFILL_RATE: Var = Var::new("AUTH_REFILL_RATE", "0.01");

// --- window algorithms

/// General rule, window algorithms: requests per window (default `10`).
pub const LIMIT: Var = Var::new("LIMIT", "10");
/// General rule, window algorithms: window seconds (default `60`).
pub const WINDOW_SIZE: Var = Var::new("WINDOW_SIZE", "60");
/// Auth rule, window algorithms: requests per window (default `5`).
pub const AUTH_LIMIT: Var = Var::new("AUTH_LIMIT", "5");
/// Auth rule, window algorithms: window seconds (default `60`).
pub const AUTH_WINDOW_SIZE: Var = Var::new("AUTH_WINDOW_SIZE", "60");

// --- more rules

/// Per-route rules, tried before `AUTH_PATHS`.
pub const ROUTES: Var = Var::unset("ROUTES");
/// What requests cost, by path.
pub const COSTS: Var = Var::unset("COSTS");
/// Clients never limited (addresses, `key:` values).
pub const EXEMPT: Var = Var::unset("EXEMPT");
/// Paths forwarded without a decision.
pub const SKIP_PATHS: Var = Var::unset("SKIP_PATHS");
/// Decide and count, never refuse (default `false`).
pub const SHADOW_MODE: Var = Var::new("SHADOW_MODE", "false");
/// Which auth requests keep their cost (`all`, `failures`) (default `all`).
pub const AUTH_COUNT: Var = Var::new("AUTH_COUNT", "all");
/// How long a request refused by the general rule (and routes without `delay=`) may wait for
/// its budget instead, in milliseconds; `0`: refused at once (default `0`).
pub const DELAY_MAX_MS: Var = Var::new("DELAY_MAX_MS", "0");
/// The same for the auth rule (default `0`).
pub const AUTH_DELAY_MAX_MS: Var = Var::new("AUTH_DELAY_MAX_MS", "0");
/// Most requests waiting under a delay at once, over every rule and client (default `1000`).
pub const DELAY_QUEUE: Var = Var::new("DELAY_QUEUE", "1000");
/// Most requests one client waits with at once under one rule's delay (default `4`).
pub const DELAY_QUEUE_PER_CLIENT: Var = Var::new("DELAY_QUEUE_PER_CLIENT", "4");

// --- client identity

/// What the general rule's budgets are keyed by (default `ip`).
pub const KEY_BY: Var = Var::new("KEY_BY", "ip");
/// What the auth rule's budgets are keyed by (default `ip`).
pub const AUTH_KEY_BY: Var = Var::new("AUTH_KEY_BY", "ip");
/// IPv6 clients grouped by this prefix (default `64`).
pub const IPV6_PREFIX: Var = Var::new("IPV6_PREFIX", "64");
/// The key of the digests of key values read from requests (required with Redis and any key
/// but `ip`).
pub const KEY_HASH_SECRET: Var = Var::unset("KEY_HASH_SECRET");
/// Peers whose `X-Forwarded-For` is believed (default empty).
pub const TRUSTED_PROXIES: Var = Var::new("TRUSTED_PROXIES", "");
/// Client states held per rule in memory (default `100000`).
pub const MAX_KEYS: Var = Var::new("MAX_KEYS", "100000");
/// Where the memory store is saved, to be read back at start (unset: off).
pub const STATE_FILE: Var = Var::unset("STATE_FILE");
/// How often the state file is saved while serving, in seconds; 0: on shutdown only (default `60`).
pub const STATE_SAVE_INTERVAL_S: Var = Var::new("STATE_SAVE_INTERVAL_S", "60");

// --- the listener: TLS and the PROXY protocol

/// HTTPS on the listeners: the certificate chain (PEM).
pub const TLS_CERT_FILE: Var = Var::unset("TLS_CERT_FILE");
/// HTTPS on the listeners: the private key (PEM).
pub const TLS_KEY_FILE: Var = Var::unset("TLS_KEY_FILE");
/// How often the certificate files are checked for changes (default `5000`).
pub const TLS_RELOAD_INTERVAL_MS: Var = Var::new("TLS_RELOAD_INTERVAL_MS", "5000");
/// Expect a PROXY header from trusted proxies (default `false`).
pub const PROXY_PROTOCOL: Var = Var::new("PROXY_PROTOCOL", "false");

// --- backend and timeouts

/// How long the backend may take to answer (default `30000`).
pub const BACKEND_TIMEOUT_MS: Var = Var::new("BACKEND_TIMEOUT_MS", "30000");
/// Idle pooled backend connections closed after this (default `4000`).
pub const BACKEND_IDLE_TIMEOUT_MS: Var = Var::new("BACKEND_IDLE_TIMEOUT_MS", "4000");
/// The CA certificates an https backend is checked against.
pub const BACKEND_CA_FILE: Var = Var::unset("BACKEND_CA_FILE");
/// The name an https backend's certificate is checked for.
pub const BACKEND_TLS_SERVER_NAME: Var = Var::unset("BACKEND_TLS_SERVER_NAME");
/// A request body pausing this long is cut off (default `30000`).
pub const BODY_IDLE_TIMEOUT_MS: Var = Var::new("BODY_IDLE_TIMEOUT_MS", "30000");
/// The slowest request body, in bytes per second (0: no minimum) (default `500`).
pub const BODY_MIN_RATE: Var = Var::new("BODY_MIN_RATE", "500");
/// The window `BODY_MIN_RATE` is counted over (default: BODY_IDLE_TIMEOUT_MS or 30000, whichever is longer).
pub const BODY_MIN_RATE_WINDOW_MS: Var = Var::unset("BODY_MIN_RATE_WINDOW_MS");
/// A request's head must arrive within this (default `10000`).
pub const HEADER_READ_TIMEOUT_MS: Var = Var::new("HEADER_READ_TIMEOUT_MS", "10000");
/// How long a drain waits for requests in flight (default `8000`).
pub const SHUTDOWN_TIMEOUT_MS: Var = Var::new("SHUTDOWN_TIMEOUT_MS", "8000");

// --- client connections

/// A client connection with nothing in flight is closed after this (default `60000`).
pub const IDLE_TIMEOUT_MS: Var = Var::new("IDLE_TIMEOUT_MS", "60000");
/// A client that takes no byte of its answer for this long is dropped (default `60000`).
pub const SEND_TIMEOUT_MS: Var = Var::new("SEND_TIMEOUT_MS", "60000");
/// Client connections open at once (unset: from the file-descriptor limit).
pub const MAX_CONNECTIONS: Var = Var::unset("MAX_CONNECTIONS");
/// Connections one client address may hold (unset: three quarters of MAX_CONNECTIONS).
pub const MAX_CONNECTIONS_PER_CLIENT: Var = Var::unset("MAX_CONNECTIONS_PER_CLIENT");
/// Requests in flight one client address may have (unset: three quarters of MAX_CONNECTIONS).
pub const MAX_REQUESTS_IN_FLIGHT_PER_CLIENT: Var = Var::unset("MAX_REQUESTS_IN_FLIGHT_PER_CLIENT");
/// Streams one HTTP/2 connection may have open at once (default `200`).
pub const H2_MAX_CONCURRENT_STREAMS: Var = Var::new("H2_MAX_CONCURRENT_STREAMS", "200");
/// Tunnels one client address may hold (unset: unlimited).
pub const MAX_UPGRADES_PER_CLIENT: Var = Var::unset("MAX_UPGRADES_PER_CLIENT");
/// The `Upgrade` protocols forwarded (default `websocket`).
pub const UPGRADE_PROTOCOLS: Var = Var::new("UPGRADE_PROTOCOLS", "websocket");
/// What becomes of header names with `_` (default `drop`).
pub const UNDERSCORE_HEADERS: Var = Var::new("UNDERSCORE_HEADERS", "drop");
/// What becomes of method-override headers: `meter` or `strip` (default `meter`).
pub const METHOD_OVERRIDE: Var = Var::new("METHOD_OVERRIDE", "meter");
/// Origins the gateway's own answers allow (CORS) (default empty).
pub const CORS_ALLOW_ORIGINS: Var = Var::new("CORS_ALLOW_ORIGINS", "");
/// A tunnel idle this long is closed (0: never) (default `3600000`).
pub const UPGRADE_IDLE_TIMEOUT_MS: Var = Var::new("UPGRADE_IDLE_TIMEOUT_MS", "3600000");

// --- redis

/// Redis, as `host:port`.
pub const REDIS_ADDR: Var = Var::unset("REDIS_ADDR");
/// Redis, as a `redis://` or `rediss://` URL.
pub const REDIS_URL: Var = Var::unset("REDIS_URL");
/// Redis Cluster seed nodes.
pub const REDIS_CLUSTER_NODES: Var = Var::unset("REDIS_CLUSTER_NODES");
/// Redis Sentinels.
pub const REDIS_SENTINELS: Var = Var::unset("REDIS_SENTINELS");
/// The master the Sentinels are asked for.
pub const REDIS_SENTINEL_MASTER: Var = Var::unset("REDIS_SENTINEL_MASTER");
/// The Sentinels' own password.
pub const REDIS_SENTINEL_PASSWORD: Var = Var::unset("REDIS_SENTINEL_PASSWORD");
/// Redis' password (with REDIS_ADDR, REDIS_CLUSTER_NODES, REDIS_SENTINELS).
pub const REDIS_PASSWORD: Var = Var::unset("REDIS_PASSWORD");
/// TLS to Redis (default `false`).
pub const REDIS_TLS: Var = Var::new("REDIS_TLS", "false");
/// A CA bundle for TLS, read by the TLS library.
pub const SSL_CERT_FILE: Var = Var::unset("SSL_CERT_FILE");
/// A directory of CA certificates for TLS, read by the TLS library.
pub const SSL_CERT_DIR: Var = Var::unset("SSL_CERT_DIR");
/// Put in front of every Redis key (default `tollgate:`).
pub const KEY_PREFIX: Var = Var::new("KEY_PREFIX", "tollgate:");
/// The most one Redis call may take (default `50`).
pub const REDIS_TIMEOUT_MS: Var = Var::new("REDIS_TIMEOUT_MS", "50");
/// Redis calls sent at once on a single Redis's connection (default `4`).
pub const REDIS_CALLS_IN_FLIGHT: Var = Var::new("REDIS_CALLS_IN_FLIGHT", "4");
/// Hot keys decided from shares of their budgets taken from Redis, `on` or `off` (default `off`).
pub const REDIS_LEASES: Var = Var::new("REDIS_LEASES", "off");
/// Decisions a second for one key on one replica from which it takes shares (default `100`).
pub const REDIS_LEASE_HOT: Var = Var::new("REDIS_LEASE_HOT", "100");
/// What the rules do when Redis cannot decide (default `open`).
pub const FAIL_MODE: Var = Var::new("FAIL_MODE", "open");
/// What the auth rule does when Redis cannot decide (default: the value of FAIL_MODE).
pub const AUTH_FAIL_MODE: Var = Var::unset("AUTH_FAIL_MODE");
/// Consecutive Redis failures that open the breaker (default `3`).
pub const REDIS_BREAKER_THRESHOLD: Var = Var::new("REDIS_BREAKER_THRESHOLD", "3");
/// How often an open breaker asks Redis again (default `500`).
pub const REDIS_PROBE_INTERVAL_MS: Var = Var::new("REDIS_PROBE_INTERVAL_MS", "500");

/// Every variable, grouped as in `.env.example`: the parsers' (whichever the configuration
/// makes them read), and `RUST_LOG`, `SSL_CERT_FILE` and `SSL_CERT_DIR`, which the log filter and
/// the TLS library read themselves.
pub const ALL: &[Var] = &[
    BACKEND_URL,
    PORT,
    BIND,
    ADMIN_PORT,
    ADMIN_BIND,
    ADMIN_TOKEN,
    DECIDE_PORT,
    DECIDE_TOKEN,
    RLS_CONFIG,
    RLS_MERGE_DOMAIN_CONFIG,
    RULES_FILE,
    RULES_RELOAD_INTERVAL_MS,
    LIMITS,
    AUTH_LIMITS,
    RESPONSE_COST_HEADER,
    OVERRIDES_FILE,
    TIERS,
    TIER_HEADER,
    ALGORITHM,
    AUTH_ALGORITHM,
    AUTH_PATHS,
    RATE_LIMIT_HEADERS,
    DENY_STATUS,
    DENY_FORMAT,
    FORWARD_RATELIMIT_HEADERS,
    LOG_FORMAT,
    ACCESS_LOG,
    RUST_LOG,
    OTEL_EXPORTER_OTLP_ENDPOINT,
    OTEL_EXPORTER_OTLP_TRACES_ENDPOINT,
    OTEL_EXPORTER_OTLP_PROTOCOL,
    OTEL_SERVICE_NAME,
    OTEL_RESOURCE_ATTRIBUTES,
    OTEL_TRACES_SAMPLER,
    OTEL_TRACES_SAMPLER_ARG,
    MAX_TOKENS,
    REFILL_RATE,
    AUTH_MAX_TOKENS,
    AUTH_REFILL_RATE,
    LIMIT,
    WINDOW_SIZE,
    AUTH_LIMIT,
    AUTH_WINDOW_SIZE,
    ROUTES,
    COSTS,
    EXEMPT,
    SKIP_PATHS,
    SHADOW_MODE,
    AUTH_COUNT,
    DELAY_MAX_MS,
    AUTH_DELAY_MAX_MS,
    DELAY_QUEUE,
    DELAY_QUEUE_PER_CLIENT,
    KEY_BY,
    AUTH_KEY_BY,
    IPV6_PREFIX,
    KEY_HASH_SECRET,
    TRUSTED_PROXIES,
    MAX_KEYS,
    STATE_FILE,
    STATE_SAVE_INTERVAL_S,
    TLS_CERT_FILE,
    TLS_KEY_FILE,
    TLS_RELOAD_INTERVAL_MS,
    PROXY_PROTOCOL,
    BACKEND_TIMEOUT_MS,
    BACKEND_IDLE_TIMEOUT_MS,
    BACKEND_CA_FILE,
    BACKEND_TLS_SERVER_NAME,
    BODY_IDLE_TIMEOUT_MS,
    BODY_MIN_RATE,
    BODY_MIN_RATE_WINDOW_MS,
    HEADER_READ_TIMEOUT_MS,
    SHUTDOWN_TIMEOUT_MS,
    IDLE_TIMEOUT_MS,
    SEND_TIMEOUT_MS,
    MAX_CONNECTIONS,
    MAX_CONNECTIONS_PER_CLIENT,
    MAX_REQUESTS_IN_FLIGHT_PER_CLIENT,
    H2_MAX_CONCURRENT_STREAMS,
    MAX_UPGRADES_PER_CLIENT,
    UPGRADE_PROTOCOLS,
    UNDERSCORE_HEADERS,
    METHOD_OVERRIDE,
    CORS_ALLOW_ORIGINS,
    UPGRADE_IDLE_TIMEOUT_MS,
    REDIS_ADDR,
    REDIS_URL,
    REDIS_CLUSTER_NODES,
    REDIS_SENTINELS,
    REDIS_SENTINEL_MASTER,
    REDIS_SENTINEL_PASSWORD,
    REDIS_PASSWORD,
    REDIS_TLS,
    SSL_CERT_FILE,
    SSL_CERT_DIR,
    KEY_PREFIX,
    REDIS_TIMEOUT_MS,
    REDIS_CALLS_IN_FLIGHT,
    REDIS_LEASES,
    REDIS_LEASE_HOT,
    FAIL_MODE,
    AUTH_FAIL_MODE,
    REDIS_BREAKER_THRESHOLD,
    REDIS_PROBE_INTERVAL_MS,
];

/// The names of [`ALL`], in its order.
pub static NAMES: std::sync::LazyLock<Vec<&'static str>> =
    std::sync::LazyLock::new(|| ALL.iter().map(|var| var.name).collect());

/// Whether `name` is one of [`ALL`].
pub fn is_known(name: &str) -> bool {
    ALL.iter().any(|var| var.name == name)
}
