//! Fuzzing on a stable toolchain: the targets in `fuzz/src/lib.rs` (the same functions the
//! cargo-fuzz crate in `fuzz/` runs under libFuzzer) driven by proptest, each two ways:
//!
//! - arbitrary bytes and strings, through the targets' `*_bytes` decoders or directly;
//! - generators of near-valid input built from fragments of the real grammar (variable names,
//!   `ROUTES` entries, escapes, address spellings, `Forwarded` elements) with random mutations,
//!   since random bytes rarely get past a parser's first check.
//!
//! Case counts keep `cargo test` fast; `PROPTEST_CASES=100000 cargo test --release --test fuzz`
//! runs longer. Failures found so far are kept below as named regression tests.

#[path = "../fuzz/src/lib.rs"]
mod targets;

use std::net::IpAddr;

use ipnet::IpNet;
use proptest::collection::vec;
use proptest::option;
use proptest::prelude::*;
use proptest::sample::{Index, select, subsequence};
use tollgate::config::VARIABLES;

use targets::{SECRET_MARK, Sent};

/// `cases` unless `PROPTEST_CASES` asks for another number.
fn cases(cases: u32) -> ProptestConfig {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(cases);
    ProptestConfig {
        cases,
        // The regressions worth keeping are the named tests below.
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

fn owned(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(name, value)| ((*name).to_owned(), (*value).to_owned()))
        .collect()
}

// ---------------------------------------------------------------------------------------------
// Configuration: fragments of the real grammar, mostly valid ones, so most generated
// configurations get past the first checks and reach ROUTES, COSTS and the rule table

/// One of `good` 24 times in 25, one of `bad` otherwise: a configuration draws dozens of
/// these, and one bad pick is enough to stop the parser.
fn mostly(
    good: &'static [&'static str],
    bad: &'static [&'static str],
) -> impl Strategy<Value = &'static str> + Clone {
    prop_oneof![24 => select(good), 1 => select(bad)]
}

const ALGORITHMS: &[&str] = &[
    "token_bucket",
    "gcra",
    "sliding_window",
    "fixed_window",
    "sliding_log",
];
const BAD_ALGORITHMS: &[&str] = &["TOKEN_BUCKET", "leaky", "token_bucket:1", ""];

/// Valid for every parameter: a count, tokens per second, window seconds.
const NUMBERS: &[&str] = &["1", "2", "5", "10", "60", "100", "3600"];
const BAD_NUMBERS: &[&str] = &[
    "0",
    "-1",
    "0.1",
    "0.001",
    "0.0004",
    "1e6",
    "1000001",
    "1e9",
    "1e-9",
    "1e308",
    "NaN",
    "inf",
    "1.5",
    "18446744073709551615",
    "18446744073709551616",
    "9007199254740993",
    "x",
    "",
];

const SEGMENTS: &[&str] = &[
    "api", "API", "login", "export", "auth", "v1.0", "a.b", "x", "bulk", "",
];
const BAD_SEGMENTS: &[&str] = &[
    ".", "..", "*", "%41", ";p", "{t}", "é", " ", "a=b", "a,b", "\\", "?q", "a:b",
];

const PATTERNS: &[&str] = &[
    "/",
    "/*",
    "/login",
    "/api/*",
    "/api*",
    "/auth/*",
    "/auth*",
    "/.*",
    "/a.b",
    "/API/export/*",
    "//x//",
    "/x/",
    "/api/export",
    "/api/export/*",
    "/v1.0/*",
    "/api/bulk",
    "/login.json",
];
const BAD_PATTERNS: &[&str] = &["login", "*", "/a*b", "/./x", "/a b", "/%41", "/{t}", "/x;y"];

const ROUTE_OPTIONS: &[&str] = &[
    "name=export",
    "name=api",
    "name=bulk",
    "key=ip",
    "key=header:X-API-Key",
    "key=ip+header:x-key",
    "cost=1",
    "cost=2",
    "method=GET|HEAD",
    "method=post",
    "shadow",
    "count=failures",
    "count=all",
];
const BAD_ROUTE_OPTIONS: &[&str] = &[
    "name=Bad Name",
    "name=general",
    "name=",
    "key=header:",
    "key=header:bad name",
    "cost=0",
    "cost=999999",
    "method=",
    "method=G(T",
    "count=x",
    "bogus",
    "",
];

const KEY_SPECS: &[&str] = &["ip", "header:X-API-Key", "ip+header:x-key"];
const BAD_KEY_SPECS: &[&str] = &["header:", "header:bad name", "cookie:x", "IP"];

const NETWORKS: &[&str] = &["10.0.0.0/8", "192.0.2.1", "192.0.2.0/24", "::1", "fd00::/8"];
// Every address is a network no configuration may trust or exempt.
const BAD_NETWORKS: &[&str] = &["10.0.0.0/33", "bogus", "10.0.0.0 /8", "0.0.0.0/0"];

/// What surrounds the marker in a secret: characters URLs and lists care about.
const AROUND_SECRETS: &[&str] = &[
    "a", "Z", "9", "/", "?", "#", "@", ":", "%", "%2F", " ", ",", ";", "[", "=", "é",
];

/// Secret values: the marker with characters around it.
fn secret() -> impl Strategy<Value = String> {
    let around = || vec(select(AROUND_SECRETS), 0..4);
    (around(), around())
        .prop_map(|(before, after)| format!("{}{SECRET_MARK}{}", before.concat(), after.concat()))
}

/// `REDIS_URL` values with a marked password, mostly well formed.
fn redis_url() -> impl Strategy<Value = String> {
    (
        mostly(
            &["redis://", "rediss://"],
            &["redis:/", "http://", "REDIS://", ""],
        ),
        select(&["", "default", "user"][..]),
        secret(),
        mostly(
            &["db", "127.0.0.1", "[::1]", "db:6379"],
            &["", "db:0", "db:x", "0.0.0.0"],
        ),
        mostly(
            &["", "/0", "/2"],
            &["/x", "?protocol=resp3", "#insecure", "/0?a=b"],
        ),
    )
        .prop_map(|(scheme, user, password, host, tail)| format!("{scheme}{user}:{password}@{host}{tail}"))
}

/// The Redis variables: a URL, an address with a password, a cluster, or a conflict.
fn store() -> impl Strategy<Value = Vec<(String, String)>> {
    let addr = || {
        mostly(
            &["127.0.0.1:6379", "db:6379", "[::1]:6379"],
            &["db", ":6379", "db:0", "a@b:1"],
        )
    };
    prop_oneof![
        redis_url().prop_map(|url| vec![("REDIS_URL".to_owned(), url)]),
        (
            addr(),
            secret(),
            option::weighted(0.2, mostly(&["true", "false"], &["yes"]))
        )
            .prop_map(|(addr, password, tls)| {
                let mut vars = owned(&[("REDIS_ADDR", addr)]);
                vars.push(("REDIS_PASSWORD".to_owned(), password));
                vars.extend(tls.map(|tls| ("REDIS_TLS".to_owned(), tls.to_owned())));
                vars
            }),
        (vec(addr(), 0..3), option::of(secret())).prop_map(|(nodes, password)| {
            let mut vars = vec![("REDIS_CLUSTER_NODES".to_owned(), nodes.join(","))];
            vars.extend(password.map(|password| ("REDIS_PASSWORD".to_owned(), password)));
            vars
        }),
        // Conflicts: two ways to reach Redis, or a URL with the settings it cannot take.
        (redis_url(), secret()).prop_map(|(url, password)| vec![
            ("REDIS_URL".to_owned(), url),
            ("REDIS_PASSWORD".to_owned(), password),
        ]),
        (redis_url(), addr()).prop_map(|(url, addr)| vec![
            ("REDIS_ADDR".to_owned(), addr.to_owned()),
            ("REDIS_URL".to_owned(), url),
        ]),
    ]
}

/// A path pattern: a written one, or segments joined, maybe with a wildcard.
fn pattern() -> impl Strategy<Value = String> {
    prop_oneof![
        mostly(PATTERNS, BAD_PATTERNS).prop_map(str::to_owned),
        (
            vec(mostly(SEGMENTS, BAD_SEGMENTS), 1..4),
            select(&["", "*", "/*", "/"][..])
        )
            .prop_map(|(segments, end)| format!("/{}{end}", segments.join("/"))),
    ]
}

/// One `ROUTES` entry: `PATTERN=ALGORITHM:A:B[,OPTION...]`.
fn route() -> impl Strategy<Value = String> {
    (
        pattern(),
        mostly(ALGORITHMS, BAD_ALGORITHMS),
        mostly(NUMBERS, BAD_NUMBERS),
        mostly(NUMBERS, BAD_NUMBERS),
        vec(mostly(ROUTE_OPTIONS, BAD_ROUTE_OPTIONS), 0..3),
    )
        .prop_map(|(pattern, algorithm, a, b, options)| {
            let mut entry = format!("{pattern}={algorithm}:{a}:{b}");
            for option in options {
                entry.push(',');
                entry.push_str(option);
            }
            entry
        })
}

/// One `COSTS` entry: `PATTERN=N`.
fn cost() -> impl Strategy<Value = String> {
    (
        pattern(),
        mostly(&["1", "2", "3", "5", "10"], &["0", "-1", "x", ""]),
    )
        .prop_map(|(pattern, n)| format!("{pattern}={n}"))
}

/// A random edit of a value: insert a character the grammar cares about, delete, duplicate a
/// stretch, or cut the rest.
#[derive(Debug, Clone)]
enum Mutation {
    Insert(Index, char),
    Delete(Index),
    Duplicate(Index, Index),
    Truncate(Index),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    let special = select(
        &[
            ' ', ';', ',', '=', ':', '/', '@', '%', '*', '\t', '\n', 'é', '\0', '{', '"', '|', '+', '.', 'A',
            '1',
        ][..],
    );
    prop_oneof![
        (any::<Index>(), special).prop_map(|(at, c)| Mutation::Insert(at, c)),
        any::<Index>().prop_map(Mutation::Delete),
        (any::<Index>(), any::<Index>()).prop_map(|(a, b)| Mutation::Duplicate(a, b)),
        any::<Index>().prop_map(Mutation::Truncate),
    ]
}

fn mutate(value: &str, mutation: &Mutation) -> String {
    let mut chars: Vec<char> = value.chars().collect();
    match *mutation {
        Mutation::Insert(at, c) => chars.insert(at.index(chars.len() + 1), c),
        Mutation::Delete(at) if !chars.is_empty() => {
            chars.remove(at.index(chars.len()));
        }
        Mutation::Duplicate(a, b) if !chars.is_empty() => {
            let (a, b) = (a.index(chars.len()), b.index(chars.len()));
            let stretch: Vec<char> = chars[a.min(b)..=a.max(b)].to_vec();
            chars.splice(a.max(b) + 1..a.max(b) + 1, stretch);
        }
        Mutation::Truncate(at) => chars.truncate(at.index(chars.len() + 1)),
        _ => {}
    }
    chars.into_iter().collect()
}

/// Mutate the value of one variable after the first (`BACKEND_URL`), maybe.
fn with_mutation(
    vars: impl Strategy<Value = Vec<(String, String)>>,
) -> impl Strategy<Value = Vec<(String, String)>> {
    (vars, option::weighted(0.3, (any::<Index>(), mutation()))).prop_map(|(mut vars, mutation)| {
        if let Some((which, mutation)) = mutation
            && vars.len() > 1
        {
            let i = 1 + which.index(vars.len() - 1);
            vars[i].1 = mutate(&vars[i].1, &mutation);
        }
        vars
    })
}

fn set(vars: &mut Vec<(String, String)>, name: &str, value: Option<String>) {
    if let Some(value) = value {
        vars.push((name.to_owned(), value));
    }
}

/// A configuration near a valid one around the rule table: both rules' numbers, client
/// identity, `ROUTES`, `COSTS`, the path lists and exemptions, memory store mostly.
fn rules_config() -> impl Strategy<Value = Vec<(String, String)>> {
    let sometimes = |p, values: &'static [&'static str], bad: &'static [&'static str]| {
        option::weighted(p, mostly(values, bad).prop_map(str::to_owned))
    };
    let numbers = (
        sometimes(0.3, ALGORITHMS, BAD_ALGORITHMS),
        sometimes(0.3, ALGORITHMS, BAD_ALGORITHMS),
        vec(option::weighted(0.15, mostly(NUMBERS, BAD_NUMBERS)), 8),
    );
    let identity = (
        option::weighted(0.15, Just(owned(&[("REDIS_ADDR", "127.0.0.1:6379")]))),
        sometimes(0.3, KEY_SPECS, BAD_KEY_SPECS),
        sometimes(0.2, KEY_SPECS, BAD_KEY_SPECS),
        option::weighted(
            0.4,
            prop_oneof![
                9 => Just(format!("0123456789abcdef{SECRET_MARK}")),
                1 => Just(format!("short{SECRET_MARK}")),
            ],
        ),
        option::weighted(0.2, vec(mostly(NETWORKS, BAD_NETWORKS), 1..3)),
        option::weighted(
            0.3,
            vec(
                prop_oneof![
                    mostly(NETWORKS, BAD_NETWORKS).prop_map(str::to_owned),
                    secret().prop_map(|s| format!("key:{s}")),
                    (mostly(KEY_SPECS, BAD_KEY_SPECS), secret())
                        .prop_map(|(source, s)| format!("{source}={s}")),
                ],
                1..3,
            ),
        ),
        sometimes(0.1, &["64", "48", "128"], &["0", "129", "x"]),
    );
    let table = (
        option::weighted(0.9, (vec(route(), 1..6), mostly(&[";"], &[";;", "; ", ","]))),
        option::weighted(0.5, (vec(cost(), 1..4), mostly(&[";", ","], &[" ", ";;"]))),
        option::weighted(0.3, vec(pattern(), 0..3)),
        option::weighted(0.3, vec(pattern(), 0..3)),
        sometimes(0.1, &["true", "false"], &["1"]),
        sometimes(0.1, &["all", "failures"], &["x"]),
    );
    with_mutation((numbers, identity, table).prop_map(|(numbers, identity, table)| {
        let mut vars = owned(&[("BACKEND_URL", targets::BACKEND_URL)]);
        let (algorithm, auth_algorithm, numbers) = numbers;
        set(&mut vars, "ALGORITHM", algorithm);
        set(&mut vars, "AUTH_ALGORITHM", auth_algorithm);
        let number_vars = [
            "MAX_TOKENS",
            "REFILL_RATE",
            "AUTH_MAX_TOKENS",
            "AUTH_REFILL_RATE",
            "LIMIT",
            "WINDOW_SIZE",
            "AUTH_LIMIT",
            "AUTH_WINDOW_SIZE",
        ];
        for (name, value) in number_vars.into_iter().zip(numbers) {
            set(&mut vars, name, value.map(str::to_owned));
        }
        let (redis, key_by, auth_key_by, secret, trusted, exempt, ipv6_prefix) = identity;
        vars.extend(redis.into_iter().flatten());
        set(&mut vars, "KEY_BY", key_by);
        set(&mut vars, "AUTH_KEY_BY", auth_key_by);
        set(&mut vars, "KEY_HASH_SECRET", secret);
        set(&mut vars, "TRUSTED_PROXIES", trusted.map(|nets| nets.join(",")));
        set(&mut vars, "EXEMPT", exempt.map(|entries| entries.join(",")));
        set(&mut vars, "IPV6_PREFIX", ipv6_prefix);
        let (routes, costs, auth_paths, skip_paths, shadow, auth_count) = table;
        set(
            &mut vars,
            "ROUTES",
            routes.map(|(routes, separator)| routes.join(separator)),
        );
        set(
            &mut vars,
            "COSTS",
            costs.map(|(costs, separator)| costs.join(separator)),
        );
        set(&mut vars, "AUTH_PATHS", auth_paths.map(|paths| paths.join(",")));
        set(&mut vars, "SKIP_PATHS", skip_paths.map(|paths| paths.join(",")));
        set(&mut vars, "SHADOW_MODE", shadow);
        set(&mut vars, "AUTH_COUNT", auth_count);
        vars
    }))
}

/// A configuration around the store's secrets: every way of reaching Redis with a marked
/// password, a marked `KEY_HASH_SECRET` and header keys, settings around them.
fn secrets_config() -> impl Strategy<Value = Vec<(String, String)>> {
    let others = (
        option::weighted(0.3, mostly(&["header:X-API-Key"], &["header:"])),
        option::weighted(
            0.7,
            secret().prop_map(|secret| format!("0123456789abcdef{secret}")),
        ),
        option::weighted(0.2, mostly(&["tollgate:", "gw-"], &["{x}"])),
        option::weighted(0.2, mostly(&["open", "closed", "local"], &["x"])),
        option::weighted(0.2, mostly(&["50", "1000"], &["0", "x"])),
    );
    with_mutation(
        (store(), others).prop_map(|(store, (key_by, secret, prefix, fail_mode, timeout))| {
            let mut vars = owned(&[("BACKEND_URL", targets::BACKEND_URL)]);
            vars.extend(store);
            set(&mut vars, "KEY_BY", key_by.map(str::to_owned));
            set(&mut vars, "KEY_HASH_SECRET", secret);
            set(&mut vars, "KEY_PREFIX", prefix.map(str::to_owned));
            set(&mut vars, "FAIL_MODE", fail_mode.map(str::to_owned));
            set(&mut vars, "REDIS_TIMEOUT_MS", timeout.map(str::to_owned));
            vars
        }),
    )
}

/// Any name (mostly ours) with any value; secret variables get the marker.
fn arbitrary_vars() -> impl Strategy<Value = Vec<(String, String)>> {
    let name = prop_oneof![
        8 => select(&VARIABLES[..]).prop_map(str::to_owned),
        1 => any::<String>(),
        1 => "[A-Z_]{1,24}",
    ];
    let value = prop_oneof![
        any::<String>(),
        "[ -~]{0,40}",
        vec(
            prop_oneof![
                select(SEGMENTS),
                select(BAD_SEGMENTS),
                select(NUMBERS),
                select(BAD_NUMBERS)
            ],
            0..6
        )
        .prop_map(|parts| parts.concat()),
    ];
    vec((name, value), 0..12).prop_map(|vars| {
        let mut all = owned(&[("BACKEND_URL", targets::BACKEND_URL)]);
        for (name, value) in vars {
            let value = match name.as_str() {
                "REDIS_PASSWORD" | "KEY_HASH_SECRET" => format!("{value}{SECRET_MARK}"),
                "REDIS_URL" => format!("{SECRET_MARK}{value}"),
                _ => value,
            };
            all.push((name, value));
        }
        all
    })
}

proptest! {
    #![proptest_config(cases(2000))]

    #[test]
    fn config_from_arbitrary_variables(vars in arbitrary_vars()) {
        targets::config(&vars);
    }

    #[test]
    fn config_from_arbitrary_bytes(data in vec(any::<u8>(), 0..512)) {
        targets::config_bytes(&data);
    }

    #[test]
    fn config_rule_tables(vars in rules_config()) {
        targets::config(&vars);
    }

    #[test]
    fn config_secrets(vars in secrets_config()) {
        targets::config(&vars);
    }

    #[test]
    fn config_lines_of_the_grammar(
        lines in vec((select(&VARIABLES[..]), vec(select(SEGMENTS), 0..5), select(NUMBERS)), 0..10),
    ) {
        let text: Vec<String> = lines
            .iter()
            .map(|(name, parts, number)| format!("{name}={}{number}", parts.concat()))
            .collect();
        targets::config_bytes(text.join("\n").as_bytes());
    }
}

// ---------------------------------------------------------------------------------------------
// Request paths

const PATH_FRAGMENTS: &[&str] = &[
    "/", "/", "/", "//", ".", "..", "%2e", "%2E", "%2f", "%2F", "%3b", "%3B", ";", ";x=1", "..;", "%25", "%",
    "%4", "%41", "%61", "a", "A", "login", "Login", "%5c", "\\", "%00", "%C3%A9", "é", "%C3", "%ff", "%20",
    " ", "%0a", "~", "*", "?", "#", ".json", "%252f", "%u006c",
];

proptest! {
    #![proptest_config(cases(2000))]

    #[test]
    fn path_from_arbitrary_strings(raw in any::<String>()) {
        targets::path(&raw);
        targets::path(&format!("/{raw}"));
    }

    #[test]
    fn path_from_arbitrary_bytes(data in vec(any::<u8>(), 0..128)) {
        targets::path_bytes(&data);
    }

    #[test]
    fn path_from_fragments(slash in prop::bool::weighted(0.95), parts in vec(select(PATH_FRAGMENTS), 0..14)) {
        let raw = format!("{}{}", if slash { "/" } else { "" }, parts.concat());
        targets::path(&raw);
    }
}

// ---------------------------------------------------------------------------------------------
// X-Forwarded-For and the forwarding headers

const PEERS: &[&str] = &[
    "10.0.0.1",
    "10.0.0.2",
    "::ffff:10.0.0.3",
    "::1",
    "fd00::7",
    "203.0.113.9",
    "2001:db8::9",
];

const TRUSTED: &[&str] = &["10.0.0.0/8", "::1/128", "fd00::/8", "10.0.0.2/32", "0.0.0.0/0"];

const ENTRIES: &[&str] = &[
    "198.51.100.7",
    "10.0.0.2",
    "10.0.0.9",
    "::ffff:10.0.0.4",
    "::ffff:198.51.100.8",
    "2001:db8::5",
    "2001:DB8::5",
    "[2001:db8::6]",
    "[2001:db8::6]:443",
    "198.51.100.7:5555",
    "fd00::1",
    "[fd00::2]:80",
    "::1",
    " 198.51.100.9 ",
    "unknown",
    "",
    "1.2.3",
    "[::1",
    "_hidden",
    "999.1.1.1",
];

fn peer() -> impl Strategy<Value = IpAddr> {
    prop_oneof![
        4 => select(PEERS).prop_map(|peer| peer.parse().expect("a peer")),
        1 => any::<[u8; 4]>().prop_map(IpAddr::from),
        1 => any::<[u8; 16]>().prop_map(IpAddr::from),
    ]
}

fn trusted() -> impl Strategy<Value = Vec<IpNet>> {
    subsequence(TRUSTED, 0..=3)
        .prop_map(|nets| nets.iter().map(|net| net.parse().expect("a network")).collect())
}

/// An `X-Forwarded-For` line: entries of many spellings joined, or arbitrary bytes.
fn forwarded_for_line() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        4 => (vec(select(ENTRIES), 0..5), select(&[",", ", ", " ,", ",,"][..]))
            .prop_map(|(entries, separator)| entries.join(separator).into_bytes()),
        1 => vec(any::<u8>(), 0..40),
        1 => "[0-9a-f:.,\\[\\] ]{0,40}".prop_map(String::into_bytes),
    ]
}

const FORWARDED_ELEMENTS: &[&str] = &[
    "for=198.51.100.7",
    "for=198.51.100.7;proto=https;host=example.com",
    "for=\"[2001:db8::1]:443\"",
    "For=unknown",
    "for=_hidden;by=10.0.0.2",
    "for=\"_x\";host=\"a:8080\"",
    "proto=https",
    "",
    "for=\"x\\\"y\"",
    // Not RFC 7239:
    "for=\"198.51.100.7",
    "for=198.51.100.7; proto=https",
    "for",
    "for=[::1]",
    ";;",
];

const HOSTS: &[&str] = &[
    "example.com",
    "example.com:8080",
    "[::1]:8080",
    "",
    "a\"b\\c",
    "a b",
    "a,b;c=d",
    "\tx",
    "é",
];

fn sent() -> impl Strategy<Value = (Sent, Vec<u8>)> {
    let kind = select(
        &[
            Sent::Forwarded,
            Sent::XForwardedFor,
            Sent::XForwardedProto,
            Sent::XForwardedHost,
            Sent::XRealIp,
        ][..],
    );
    let value = prop_oneof![
        3 => (vec(select(FORWARDED_ELEMENTS), 0..4), select(&[",", ", ", " , "][..]))
            .prop_map(|(elements, separator)| elements.join(separator).into_bytes()),
        1 => forwarded_for_line(),
        1 => vec(any::<u8>(), 0..40),
    ];
    (kind, value)
}

fn host() -> impl Strategy<Value = Option<Vec<u8>>> {
    option::of(prop_oneof![
        3 => select(HOSTS).prop_map(|host| host.as_bytes().to_vec()),
        1 => vec(any::<u8>(), 0..20),
    ])
}

proptest! {
    #![proptest_config(cases(2000))]

    #[test]
    fn forwarded_for_from_spellings(
        peer in peer(),
        trusted in trusted(),
        lines in vec(forwarded_for_line(), 0..4),
    ) {
        targets::forwarded_for(peer, &trusted, &lines);
    }

    #[test]
    fn forwarded_for_from_arbitrary_bytes(data in vec(any::<u8>(), 0..256)) {
        targets::forwarded_for_bytes(&data);
    }

    #[test]
    fn forwarding_headers(
        peer in peer(),
        trusted in trusted(),
        host in host(),
        tls in any::<bool>(),
        sent in vec(sent(), 0..6),
    ) {
        targets::forwarding(peer, &trusted, host.as_deref(), tls, &sent);
    }

    #[test]
    fn forwarding_headers_from_arbitrary_bytes(data in vec(any::<u8>(), 0..256)) {
        targets::forwarding_bytes(&data);
    }
}

// ---------------------------------------------------------------------------------------------
// Path patterns and key specs

proptest! {
    #![proptest_config(cases(2000))]

    #[test]
    fn path_pattern_from_arbitrary_strings(entry in any::<String>()) {
        targets::path_pattern(&entry);
        targets::path_pattern(&format!("/{entry}"));
    }

    #[test]
    fn path_pattern_from_fragments(entry in pattern()) {
        targets::path_pattern(&entry);
    }

    #[test]
    fn path_pattern_pairs(
        a in pattern(),
        b in pattern(),
        paths in vec(vec(select(PATH_FRAGMENTS), 1..6), 0..3),
    ) {
        let paths: Vec<String> = paths.iter().map(|parts| format!("/{}", parts.concat())).collect();
        let paths: Vec<&str> = paths.iter().map(String::as_str).collect();
        targets::path_pattern_pair(&a, &b, &paths);
    }

    #[test]
    fn path_pattern_from_arbitrary_bytes(data in vec(any::<u8>(), 0..128)) {
        targets::path_pattern_bytes(&data);
    }

    #[test]
    fn key_by_from_arbitrary_strings(value in any::<String>()) {
        targets::key_by(&value);
    }

    #[test]
    fn key_by_near_valid(
        prefix in select(&["ip", "header:", "ip+header:", "Header:", "ip+", ""][..]),
        name in "[ -~]{0,12}",
    ) {
        targets::key_by(&format!("{prefix}{name}"));
    }

    #[test]
    fn key_by_from_arbitrary_bytes(data in vec(any::<u8>(), 0..64)) {
        targets::key_by_bytes(&data);
    }
}

// ---------------------------------------------------------------------------------------------
// The decision endpoints: JSON questions built from the API's own fields, values of every
// JSON type (and wrong ones), duplicated and unknown fields; forward-auth's header lines

fn json_value() -> impl Strategy<Value = String> {
    prop_oneof![
        select(
            &[
                "\"general\"",
                "\"auth\"",
                "\"api\"",
                "\"generl\"",
                "\"\"",
                "\"/login\"",
                "\"//x/../login\"",
                "\"/a%3F/b\"",
                "\"*\"",
                "\"203.0.113.7\"",
                "\"::1\"",
                "\"POST\"",
                "\"G T\"",
                "\"\\u0000\"",
                "\"\\ud800\"",
                "0",
                "1",
                "-1",
                "20",
                "21",
                "18446744073709551615",
                "18446744073709551616",
                "1.5",
                "1e3",
                "true",
                "null",
                "[]",
                "{}",
                "{\"x-api-key\":\"k\"}",
                "{\"bad name\":\"v\"}",
                "{\"x\":\"a\\nb\"}",
                "{\"x\":1}"
            ][..]
        )
        .prop_map(str::to_owned),
        "\"[ -~]{0,12}\"",
        any::<i64>().prop_map(|n| n.to_string()),
    ]
}

fn check_body() -> impl Strategy<Value = Vec<u8>> {
    const FIELDS: &[&str] = &[
        "rule",
        "key",
        "cost",
        "method",
        "path",
        "client_ip",
        "headers",
        "kee",
        "rule",
    ];
    (
        vec((select(FIELDS), json_value()), 0..6),
        option::of((any::<Index>(), any::<u8>())),
    )
        .prop_map(|(fields, damage)| {
            let members: Vec<String> = fields
                .iter()
                .map(|(name, value)| format!("\"{name}\":{value}"))
                .collect();
            let mut body = format!("{{{}}}", members.join(",")).into_bytes();
            if let Some((at, byte)) = damage {
                let at = at.index(body.len() + 1);
                body.insert(at, byte);
            }
            body
        })
}

fn forward_auth_lines() -> impl Strategy<Value = Vec<u8>> {
    const NAMES: &[&str] = &[
        "x-forwarded-uri",
        "x-original-uri",
        "x-forwarded-method",
        "x-original-method",
        "x-forwarded-for",
        "x-forwarded-host",
        "x-api-key",
    ];
    const VALUES: &[&str] = &[
        "/login",
        "//login",
        "/a?b",
        "*",
        "login",
        "/a#b",
        "/%2F",
        "GET",
        "P OST",
        "203.0.113.7",
        "",
        "http://x/y",
    ];
    vec((select(NAMES), select(VALUES)), 0..6).prop_map(|lines| {
        lines
            .iter()
            .map(|(name, value)| format!("{name}: {value}\n"))
            .collect::<String>()
            .into_bytes()
    })
}

proptest! {
    #![proptest_config(cases(512))]

    #[test]
    fn check_bodies_from_the_apis_fields(body in check_body()) {
        targets::check_body(&body);
    }

    #[test]
    fn check_bodies_from_arbitrary_bytes(data in vec(any::<u8>(), 0..128)) {
        targets::check_body(&data);
    }

    #[test]
    fn forward_auth_headers_from_the_proxies_names(data in forward_auth_lines()) {
        targets::forward_auth_headers(&data);
    }

    #[test]
    fn forward_auth_headers_from_arbitrary_bytes(data in vec(any::<u8>(), 0..128)) {
        targets::forward_auth_headers(&data);
    }
}

// ---------------------------------------------------------------------------------------------
// Regression cases: inputs worth trying on every run

#[test]
fn examples_of_each_target() {
    targets::config(&owned(&[
        ("BACKEND_URL", "http://127.0.0.1:8000"),
        (
            "ROUTES",
            "/api/*=token_bucket:5:0.1,key=header:X-API-Key;/export=fixed_window:10:60,name=export,cost=2",
        ),
        ("COSTS", "/api/bulk=5"),
        ("REDIS_ADDR", "127.0.0.1:6379"),
        ("REDIS_PASSWORD", "pa/ss?Hunter2@#"),
        ("KEY_HASH_SECRET", "0123456789abcdefHunter2"),
    ]));
    targets::config(&owned(&[
        ("BACKEND_URL", "http://b"),
        ("KEY_HASH_SECRET", "shortHunter2"),
    ]));
    targets::config(&owned(&[
        ("BACKEND_URL", "http://b"),
        ("REDIS_URL", "redis://:Hunter2@db:6379/x"),
    ]));
    targets::path("/a/%7Euser/b/..");
    targets::path("/%2e%2E/Login;x");
    targets::forwarded_for(
        "10.0.0.1".parse().unwrap(),
        &["10.0.0.0/8".parse().unwrap()],
        &[b"6.6.6.6, 198.51.100.7".to_vec(), b"10.0.0.2".to_vec()],
    );
    targets::forwarding(
        "::1".parse().unwrap(),
        &[],
        Some(b"a\"b"),
        false,
        &[(Sent::Forwarded, b"for=6.6.6.6".to_vec())],
    );
    targets::forwarding(
        "10.0.0.1".parse().unwrap(),
        &["10.0.0.0/8".parse().unwrap()],
        Some(b"example.com"),
        true,
        &[(
            Sent::Forwarded,
            b"for=198.51.100.7;proto=https, for=\"[2001:db8::1]\"".to_vec(),
        )],
    );
    targets::path_pattern("/API//export/*");
    targets::path_pattern_pair("/auth/*", "/auth*", &["/authx"]);
    targets::key_by("ip+header:X-API-Key");
    targets::check_body(br#"{"rule":"api","key":"tenant","cost":20}"#);
    targets::check_body(br#"{"path":"/login?x","client_ip":"::1","headers":{"x-api-key":"k"}}"#);
    targets::forward_auth_headers(b"x-forwarded-uri: /a?b\nx-forwarded-for: 203.0.113.7\n");
}

#[test]
fn the_forwarded_oracle_reads_rfc_7239() {
    let pairs = |pairs: &[(&str, &str)]| -> Vec<(String, String)> { owned(pairs) };
    assert_eq!(
        targets::parse_forwarded(
            "for=192.0.2.60;proto=http;by=203.0.113.43, For=\"[2001:db8:cafe::17]:4711\""
        ),
        Some(vec![
            pairs(&[("for", "192.0.2.60"), ("proto", "http"), ("by", "203.0.113.43")]),
            pairs(&[("for", "[2001:db8:cafe::17]:4711")]),
        ])
    );
    assert_eq!(
        targets::parse_forwarded(" , for=a ,"),
        Some(vec![pairs(&[("for", "a")])])
    );
    assert_eq!(
        targets::parse_forwarded("host=\"a\\\"b\""),
        Some(vec![pairs(&[("host", "a\"b")])])
    );
    for invalid in ["for=\"x", "for=a; proto=b", "for", "for=[::1]", "for=a b", "=a"] {
        assert_eq!(targets::parse_forwarded(invalid), None, "{invalid:?}");
    }
}

/// Found by `config_secrets`: a `/` in `REDIS_URL`'s password ends the authority for
/// `redact_url` (src/stores/redis.rs), which then finds no `@` and returns the URL whole, so the
/// `REDIS_URL is invalid (value hidden...) (got ...)` hint of src/config/store.rs prints the
/// password. Fixed; kept as a regression test.
#[test]
fn a_redis_url_password_holding_a_slash_is_not_echoed() {
    for url in [
        "redis://:Hunter2/@db",
        "redis://:pa/ssHunter2@db:6379/0",
        "rediss://user:a?b/Hunter2@db",
    ] {
        let vars = owned(&[("BACKEND_URL", targets::BACKEND_URL), ("REDIS_URL", url)]);
        let message = tollgate::Config::from_vars(vars)
            .expect_err("an invalid URL")
            .to_string();
        assert!(!message.contains(SECRET_MARK), "{message}");
    }
}

/// Found by `config_rule_tables`: `list` (src/config/rules.rs) refuses an entry holding
/// whitespace by quoting it whole, so an `EXEMPT` key value (an API key, which
/// `parse_exemptions` otherwise shows only as `key:***` or `header:authorization=***`) is
/// printed when it holds a space, as `Bearer` tokens do. Fixed; kept as a regression test.
#[test]
fn an_exempt_key_holding_whitespace_is_not_echoed() {
    for entry in ["key:Bearer Hunter2", "header:Authorization=Bearer Hunter2"] {
        let vars = owned(&[
            ("BACKEND_URL", targets::BACKEND_URL),
            ("KEY_BY", "header:Authorization"),
            ("EXEMPT", &format!("10.0.0.0/8,{entry}")),
        ]);
        let message = tollgate::Config::from_vars(vars)
            .expect_err("whitespace in an entry")
            .to_string();
        assert!(!message.contains(SECRET_MARK), "{message}");
    }
}

/// What a client sends after the PROXY header: nothing yet, a request, a TLS record.
const AFTER_PROXY_HEADER: &[&[u8]] = &[b"", b"GET / HTTP/1.1\r\n", b"\x16\x03\x01\x00\xa5"];

/// Near-valid PROXY headers: a real v1 line or v2 header, cut, with bytes flipped, then
/// followed by what a client sends next.
fn proxy_header() -> impl Strategy<Value = Vec<u8>> {
    let v1 = select(
        &[
            "PROXY TCP4 198.51.100.7 192.0.2.1 5555 443\r\n",
            "PROXY TCP6 2001:db8::7 2001:db8::1 5555 443\r\n",
            "PROXY UNKNOWN\r\n",
            "PROXY UNKNOWN ffff::1 ffff::2 1 2\r\n",
            "PROXY TCP4 1.2.3.4 5.6.7.8 0 65535\r\n",
        ][..],
    )
    .prop_map(|line| line.as_bytes().to_vec());
    let v2 = (
        0u8..3,
        select(&[0x00u8, 0x11, 0x12, 0x21, 0x31, 0x41][..]),
        vec(any::<u8>(), 0..60),
    )
        .prop_map(|(command, family, payload)| {
            let mut header = b"\r\n\r\n\0\r\nQUIT\n".to_vec();
            header.push(0x20 | command);
            header.push(family);
            header.extend_from_slice(&(payload.len() as u16).to_be_bytes());
            header.extend_from_slice(&payload);
            header
        });
    (
        prop_oneof![v1, v2],
        vec((any::<Index>(), any::<u8>()), 0..3),
        option::of(any::<Index>()),
        select(AFTER_PROXY_HEADER),
    )
        .prop_map(|(mut header, flips, cut, next)| {
            for (at, byte) in flips {
                let at = at.index(header.len());
                header[at] = byte;
            }
            if let Some(cut) = cut {
                header.truncate(cut.index(header.len() + 1));
            }
            header.extend_from_slice(next);
            header
        })
}

proptest! {
    #![proptest_config(cases(4000))]

    #[test]
    fn proxy_headers_near_valid(bytes in proxy_header()) {
        targets::proxy_header(&bytes);
    }

    #[test]
    fn proxy_headers_from_arbitrary_bytes(bytes in vec(any::<u8>(), 0..200)) {
        targets::proxy_header(&bytes);
    }
}

/// Lines of `RLS_CONFIG`'s grammar (keys right and misspelt, units, values, wildcards,
/// anchors, flow collections), at random indentation: near-valid YAML for the descriptor
/// parser.
fn rls_yaml() -> impl Strategy<Value = String> {
    let line = select(vec![
        "domain: d",
        "domain:",
        "descriptors:",
        "- key: k",
        "- key: path",
        "  value: /api/*",
        "  value: v",
        "  value: '*'",
        "  rate_limit:",
        "    unit: second",
        "    unit: fortnight",
        "    requests_per_unit: 3",
        "    requests_per_unit: -1",
        "    unlimited: true",
        "    name: n",
        "    replaces:",
        "      - name: n",
        "      - name: other",
        "  shadow_mode: true",
        "  detailed_metric: yes",
        "  ratelimit: {}",
        "  descriptors:",
        "  - key: &a k",
        "  - key: *a",
        "  rate_limit: {unit: day, requests_per_unit: 1}",
        "[",
        "---",
        "? complex",
        ": value",
        "\t",
    ]);
    vec((0usize..8, line), 0..40).prop_map(|lines| {
        lines
            .into_iter()
            .map(|(indent, line)| format!("{}{line}\n", " ".repeat(indent)))
            .collect()
    })
}

proptest! {
    #![proptest_config(cases(512))]

    #[test]
    fn rls_config_from_arbitrary_text(text in any::<String>()) {
        targets::rls_config(&text, &[]);
    }

    #[test]
    fn rls_config_from_arbitrary_bytes(data in vec(any::<u8>(), 0..256)) {
        targets::rls_config_bytes(&data);
    }

    #[test]
    fn rls_config_and_matcher_on_near_valid_yaml(
        text in rls_yaml(),
        entries in vec((select(vec!["k", "path", "other", ""]), select(vec!["v", "/api/x", "", "*", "n"])), 0..6),
    ) {
        targets::rls_config(&text, &entries);
    }
}
