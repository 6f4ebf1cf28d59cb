//! The state file's round trip, the downtime counted by each algorithm's own arithmetic, the
//! rules dropped, and every way a file can be wrong.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::num::NonZeroUsize;

use super::*;
use crate::algorithms::Cost;
use crate::algorithms::{FixedWindow, SlidingLog, SlidingWindow, TokenBucket};

const S: u64 = 1_000_000;
const FINGERPRINT: [u8; 16] = [7; 16];

fn token_bucket(capacity: u64, interval_us: u64) -> Policy {
    Policy::TokenBucket(TokenBucket {
        capacity,
        interval_us,
    })
}

fn fixed_window(limit: u64, window_s: u64) -> Policy {
    Policy::FixedWindow(FixedWindow {
        limit,
        window_ms: window_s * 1_000,
    })
}

fn sliding_window(limit: u64, window_s: u64) -> Policy {
    Policy::SlidingWindow(SlidingWindow {
        limit,
        window_ms: window_s * 1_000,
    })
}

fn sliding_log(limit: u64, window_s: u64) -> Policy {
    Policy::SlidingLog(SlidingLog {
        limit,
        window_ms: window_s * 1_000,
    })
}

/// A table of `(name, policy)`, ids in order.
fn table(rules: &[(&str, Policy)]) -> Vec<Rule> {
    rules
        .iter()
        .enumerate()
        .map(|(id, (name, policy))| Rule::new(id as u16, name, *policy))
        .collect()
}

fn store(rules: &[Rule], max_keys: usize) -> MemoryStore {
    MemoryStore::new(NonZeroUsize::new(max_keys).unwrap(), rules)
}

fn ip(n: u32) -> ClientKey {
    ClientKey::Ip(ClientIp::new(IpAddr::V4(Ipv4Addr::from(n)), 64))
}

/// A start in the past on the real clock (a save through the file reads it), at the start of
/// a 10 s window.
fn base() -> u64 {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_micros() as u64;
    (now / (10 * S) - 2) * 10 * S
}

/// Every state held, by rule name and client.
fn held(store: &MemoryStore, rules: &[Rule]) -> BTreeMap<(String, String), (State, bool)> {
    let mut states = BTreeMap::new();
    store.visit_states(|rule, limit, key, state, refused| {
        let name = rules[usize::from(rule)].name.to_string();
        states.insert(
            (format!("{name}/{limit}"), key.to_string()),
            (state.clone(), refused),
        );
    });
    states
}

/// A store of every algorithm with clients of every kind of key, some refused.
/// Windows of an hour and a bucket refilling over three minutes: nothing is idle again
/// during a test.
fn busy_at(t0: u64) -> (MemoryStore, Vec<Rule>, u64) {
    let rules = table(&[
        ("general", token_bucket(3, 60 * S)),
        ("auth", fixed_window(2, 3_600)),
        ("api", sliding_window(4, 3_600)),
        ("login", sliding_log(3, 3_600)),
    ]);
    let store = store(&rules, 1_000);
    let keys = [
        ip(1),
        ClientKey::Ip(ClientIp::new("2001:db8:1:2:3::9".parse().unwrap(), 64)),
        ClientKey::Header(Digest::from_bytes([9; 16])),
        ClientKey::IpAndHeader(
            ClientIp::new(IpAddr::V6(Ipv6Addr::LOCALHOST), 128),
            Digest::from_bytes(*b"0123456789abcdef"),
        ),
    ];
    for rule in &rules {
        for (n, key) in keys.iter().enumerate() {
            // The first key spends everything and is refused; the others spend one each.
            let requests = if n == 0 { rule.limits.capacity() + 1 } else { 1 };
            for i in 0..requests {
                store.check_at(rule, *key, Cost::ONE, t0 + i * 1_000);
            }
        }
    }
    (store, rules, t0)
}

fn busy() -> (MemoryStore, Vec<Rule>, u64) {
    busy_at(base())
}

#[test]
fn every_algorithm_and_key_round_trips_matched_by_name_not_id() {
    let (saved, rules, t0) = busy();
    let (file, clients) = encode_at(&saved, &rules, FINGERPRINT, || t0 + 5_000);
    assert_eq!(clients, 16);
    // The same rules in another order (a route added in front moves every id).
    let mut reordered = rules.clone();
    reordered.reverse();
    let reordered: Vec<Rule> = reordered
        .into_iter()
        .enumerate()
        .map(|(id, rule)| Rule::new(id as u16, &rule.name, rule.limits.clone()))
        .collect();
    let restored = store(&reordered, 1_000);
    let loaded = restore_from(&file, &restored, &reordered, FINGERPRINT, t0 + 5_000).unwrap();
    assert_eq!(loaded.restored(), 16);
    assert!(
        loaded
            .rules
            .iter()
            .all(|rule| rule.dropped == 0 && rule.dropped_because.is_none())
    );
    assert_eq!(held(&restored, &reordered), held(&saved, &rules));
    let refused = held(&restored, &reordered)
        .values()
        .filter(|(_, refused)| *refused)
        .count();
    assert_eq!(refused, 4, "the refused flag comes back too");
}

/// Save `spend` requests on one rule at `t0`, restore `downtime` later, and return the store
/// and rule as they are after the restart.
fn restart(policy: Policy, spend: &[u64], t0: u64, downtime: u64) -> (MemoryStore, Rule, Loaded) {
    let rules = table(&[("general", policy)]);
    let before = store(&rules, 100);
    for &at in spend {
        assert!(before.check_at(&rules[0], ip(1), Cost::ONE, t0 + at).allowed);
    }
    let last = t0 + spend.last().copied().unwrap_or(0);
    let (file, _) = encode_at(&before, &rules, FINGERPRINT, || last);
    let after = store(&rules, 100);
    let loaded = restore_from(&file, &after, &rules, FINGERPRINT, last + downtime).unwrap();
    (after, rules[0].clone(), loaded)
}

/// How many requests of cost 1 are allowed at `now`, in a row.
fn allowed_now(store: &MemoryStore, rule: &Rule, now: u64) -> u64 {
    (0..100)
        .take_while(|_| store.check_at(rule, ip(1), Cost::ONE, now).allowed)
        .count() as u64
}

#[test]
fn a_token_bucket_refills_over_the_downtime() {
    let t0 = base();
    // 10 tokens, one every second: all spent at t0, 3 s down.
    let (after, rule, loaded) = restart(token_bucket(10, S), &[0; 10], t0, 3 * S);
    assert_eq!(loaded.restored(), 1);
    assert_eq!(loaded.age, Duration::from_secs(3), "the downtime, from the save");
    assert_eq!(allowed_now(&after, &rule, t0 + 3 * S), 3);
    // Down long enough to refill entirely: nothing is restored, the bucket is full anyway.
    let (after, rule, loaded) = restart(token_bucket(10, S), &[0; 10], t0, 10 * S);
    assert_eq!((loaded.restored(), loaded.rules[0].dropped), (0, 1));
    assert!(after.is_empty());
    assert_eq!(allowed_now(&after, &rule, t0 + 10 * S), 10);
}

#[test]
fn a_fixed_window_that_ended_is_gone_and_one_still_open_is_kept() {
    let t0 = base();
    // 5 per 10 s window, all spent in the window starting at t0.
    let spend = [0, 1, 2, 3, 4].map(|n| n * 1_000);
    let (after, rule, loaded) = restart(fixed_window(5, 10), &spend, t0, 5 * S);
    assert_eq!(loaded.restored(), 1);
    assert_eq!(
        allowed_now(&after, &rule, t0 + 9 * S),
        0,
        "same window: still limited"
    );
    assert_eq!(
        allowed_now(&after, &rule, t0 + 10 * S),
        5,
        "the next window: a fresh count"
    );
    let (after, rule, loaded) = restart(fixed_window(5, 10), &spend, t0, 10 * S);
    assert_eq!(loaded.restored(), 0, "the window ended during the downtime");
    assert_eq!(allowed_now(&after, &rule, t0 + 10 * S), 5);
}

#[test]
fn a_sliding_window_weighs_the_window_before_the_restart() {
    let t0 = base();
    // 10 per 10 s, all spent early in the window at t0; back half-way through the next one,
    // where the previous window weighs half: 5 fit.
    let (after, rule, loaded) = restart(sliding_window(10, 10), &[0; 10], t0, 15 * S);
    assert_eq!(loaded.restored(), 1);
    assert_eq!(allowed_now(&after, &rule, t0 + 15 * S), 5);
    // Two windows later nothing it counted weighs: not restored.
    let (after, rule, loaded) = restart(sliding_window(10, 10), &[0; 10], t0, 20 * S);
    assert_eq!(loaded.restored(), 0);
    assert_eq!(allowed_now(&after, &rule, t0 + 20 * S), 10);
}

#[test]
fn a_sliding_log_forgets_exactly_the_entries_that_expired_while_down() {
    let t0 = base();
    // 3 per 10 s, at 0, 1 and 2 s; back at 10.5 s: the first has expired, the others not.
    let (after, rule, loaded) = restart(sliding_log(3, 10), &[0, S, 2 * S], t0, 8 * S + S / 2);
    assert_eq!(loaded.restored(), 1);
    assert_eq!(allowed_now(&after, &rule, t0 + 10 * S + S / 2), 1);
    assert_eq!(
        allowed_now(&after, &rule, t0 + 11 * S),
        1,
        "the second expired at 11 s"
    );
}

#[test]
fn a_rule_whose_limits_changed_or_that_was_renamed_is_dropped_and_the_rest_restored() {
    let (saved, rules, t0) = busy();
    let (file, _) = encode_at(&saved, &rules, FINGERPRINT, || t0 + 5_000);
    let now = table(&[
        ("general", token_bucket(3, 60 * S)), // unchanged
        ("auth", fixed_window(3, 3_600)),     // another limit
        ("api", sliding_log(4, 3_600)),       // another algorithm, the same numbers
        ("signin", sliding_log(3, 3_600)),    // "login" renamed
    ]);
    let restored = store(&now, 1_000);
    let loaded = restore_from(&file, &restored, &now, FINGERPRINT, t0 + 5_000).unwrap();
    let fate: Vec<(&str, u64, u64, bool)> = loaded
        .rules
        .iter()
        .map(|rule| {
            (
                rule.name.as_str(),
                rule.restored,
                rule.dropped,
                rule.dropped_because.is_some(),
            )
        })
        .collect();
    assert_eq!(
        fate,
        [
            ("general", 4, 0, false),
            ("auth", 0, 4, true),
            ("api", 0, 4, true),
            ("login", 0, 4, true),
        ]
    );
    assert!(
        loaded.rules[1]
            .dropped_because
            .as_deref()
            .unwrap()
            .contains("limits changed")
    );
    assert!(
        loaded.rules[3]
            .dropped_because
            .as_deref()
            .unwrap()
            .contains("no rule of this name")
    );
    assert_eq!(restored.len(), 4);
}

/// A rule of several limits is a section per limit: each limit's clients come back to the
/// limit of the same policy, wherever it now stands in the list; a limit gone is dropped,
/// one added starts afresh.
#[test]
fn each_limit_of_a_rule_is_saved_and_restored_by_its_own_policy() {
    let t0 = base();
    let (burst, quota, daily) = (
        token_bucket(3, 60 * S),
        fixed_window(10, 3_600),
        sliding_log(50, 86_400),
    );
    let rule = |limits: Vec<Policy>| Rule::new(0, "api", crate::algorithms::Limits::new(limits).unwrap());
    let before = [rule(vec![burst, quota])];
    let saved = store(&before, 1_000);
    for n in 0..4 {
        assert!(
            saved
                .check_at(&before[0], ip(n), Cost::saturating(2), t0 + u64::from(n))
                .allowed
        );
    }
    let (file, clients) = encode_at(&saved, &before, FINGERPRINT, || t0 + 5_000);
    assert_eq!(clients, 8, "4 clients under each of 2 limits");
    // Reordered, the burst kept, the hourly quota gone, a daily one added.
    let after = [rule(vec![daily, burst])];
    let restored = store(&after, 1_000);
    let loaded = restore_from(&file, &restored, &after, FINGERPRINT, t0 + 5_000).unwrap();
    let fate: Vec<(u64, u64)> = loaded
        .rules
        .iter()
        .map(|rule| (rule.restored, rule.dropped))
        .collect();
    assert_eq!(
        fate,
        [(4, 0), (0, 4)],
        "the burst's section restored, the quota's dropped"
    );
    let decision = restored.inspect_at(&after[0], ip(0), t0 + 5_000);
    let remaining: Vec<u64> = decision.parts().iter().map(|part| part.remaining).collect();
    assert_eq!(
        remaining,
        [50, 1],
        "the daily limit afresh, the burst as it was saved"
    );
}

#[test]
fn header_keys_digested_under_another_key_are_dropped() {
    let (saved, rules, t0) = busy();
    let (file, _) = encode_at(&saved, &rules, FINGERPRINT, || t0 + 5_000);
    let restored = store(&rules, 1_000);
    let loaded = restore_from(&file, &restored, &rules, [8; 16], t0 + 5_000).unwrap();
    // Two of the four keys of each rule carry a digest.
    assert_eq!((loaded.restored(), loaded.foreign_header_keys), (8, 8));
}

#[test]
fn restoring_more_clients_than_max_keys_keeps_the_bound_exact() {
    let rules = table(&[("general", token_bucket(10, S))]);
    // Room to spare: shards fill unevenly, and a full one would evict before the save.
    let big = store(&rules, 100_000);
    let t0 = base();
    for n in 0..5_000 {
        big.check_at(&rules[0], ip(n), Cost::ONE, t0);
    }
    let (file, clients) = encode_at(&big, &rules, FINGERPRINT, || t0);
    assert_eq!(clients, 5_000);
    for max_keys in [1, 100, 1_000] {
        let small = store(&rules, max_keys);
        let loaded = restore_from(&file, &small, &rules, FINGERPRINT, t0 + 1).unwrap();
        assert_eq!(loaded.restored(), 5_000, "each went in, evicting another");
        assert_eq!(small.len(), max_keys, "max_keys={max_keys}");
    }
}

#[test]
fn a_file_cut_at_any_byte_is_refused_and_restores_nothing() {
    let (saved, rules, t0) = busy();
    let (file, _) = encode_at(&saved, &rules, FINGERPRINT, || t0 + 5_000);
    for len in 0..file.len() {
        let restored = store(&rules, 1_000);
        let error = restore_from(&file[..len], &restored, &rules, FINGERPRINT, t0).unwrap_err();
        assert!(
            matches!(error, DecodeError::Truncated { .. }),
            "cut at {len} of {}: {error}",
            file.len()
        );
        assert!(restored.is_empty());
    }
    let mut longer = file.clone();
    longer.push(0);
    assert!(matches!(
        restore_from(&longer, &store(&rules, 10), &rules, FINGERPRINT, t0),
        Err(DecodeError::Truncated { .. })
    ));
}

#[test]
fn a_flipped_byte_anywhere_is_refused() {
    let (saved, rules, t0) = busy();
    let (file, _) = encode_at(&saved, &rules, FINGERPRINT, || t0 + 5_000);
    for at in 0..file.len() {
        let mut flipped = file.clone();
        flipped[at] ^= 0x10;
        let restored = store(&rules, 1_000);
        let error = restore_from(&flipped, &restored, &rules, FINGERPRINT, t0).unwrap_err();
        let expected = match at {
            0..8 => matches!(error, DecodeError::Foreign),
            8..12 => matches!(error, DecodeError::Version { .. }),
            12..20 => matches!(error, DecodeError::Truncated { .. }),
            _ => matches!(error, DecodeError::Checksum { .. }),
        };
        assert!(expected, "byte {at}: {error}");
        assert!(restored.is_empty());
    }
}

#[test]
fn foreign_and_empty_files_are_told_apart() {
    let rules = table(&[("general", token_bucket(10, S))]);
    let load = |bytes: &[u8]| restore_from(bytes, &store(&rules, 10), &rules, FINGERPRINT, u64::MAX / 2);
    assert!(matches!(load(b"{\"clients\": []}\n"), Err(DecodeError::Foreign)));
    assert!(matches!(load(&[0; 64]), Err(DecodeError::Foreign)));
    assert!(matches!(load(b""), Err(DecodeError::Truncated { .. })));
    assert!(matches!(load(b"TOLL"), Err(DecodeError::Truncated { .. })));
    let mut future = b"TOLLGATE".to_vec();
    future.extend_from_slice(&2u32.to_le_bytes());
    future.extend_from_slice(&[0; 12]);
    assert_eq!(load(&future).unwrap_err(), DecodeError::Version { found: 2 });
}

/// A file of `body`, with a correct envelope (length and checksum): what a hostile or buggy
/// writer could make.
fn sealed(body: &[u8]) -> Vec<u8> {
    let mut file = MAGIC.to_vec();
    file.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
    file.extend_from_slice(&(body.len() as u64).to_le_bytes());
    file.extend_from_slice(&crc32fast::hash(body).to_le_bytes());
    file.extend_from_slice(body);
    file
}

/// A body's start: saved at `saved_at`, [`FINGERPRINT`], `rules` rules.
fn body(saved_at: u64, rules: u32) -> Vec<u8> {
    let mut body = saved_at.to_le_bytes().to_vec();
    body.extend_from_slice(&FINGERPRINT);
    body.extend_from_slice(&rules.to_le_bytes());
    body
}

fn section(body: &mut Vec<u8>, name: &str, policy: &Policy, clients: u64) {
    body.extend_from_slice(&(name.len() as u16).to_le_bytes());
    body.extend_from_slice(name.as_bytes());
    let [first, second] = policy.script().1;
    body.push(policy.file_tag());
    body.extend_from_slice(&first.to_le_bytes());
    body.extend_from_slice(&second.to_le_bytes());
    body.extend_from_slice(&clients.to_le_bytes());
}

#[test]
fn huge_declared_lengths_are_refused_before_anything_is_allocated() {
    let policy = sliding_log(1_000, 10);
    let rules = table(&[("general", policy)]);
    let load = |file: Vec<u8>| restore_from(&file, &store(&rules, 10), &rules, FINGERPRINT, 10 * S);
    let corrupt = |result: Result<Loaded, DecodeError>| match result {
        Err(DecodeError::Corrupt { problem, .. }) => problem,
        other => panic!("expected a corrupt file, got {other:?}"),
    };
    // Four billion rules in a file of a few bytes.
    assert!(corrupt(load(sealed(&body(S, u32::MAX)))).contains("more rules"));
    // A name of 65535 bytes in a file of 64, and one of none.
    let mut long_name = body(S, 1);
    long_name.extend_from_slice(&u16::MAX.to_le_bytes());
    long_name.extend_from_slice(&[b'a'; 64]);
    assert!(corrupt(load(sealed(&long_name))).contains("ends in the middle"));
    let mut no_name = body(S, 1);
    no_name.extend_from_slice(&[0; 64]);
    assert!(corrupt(load(sealed(&no_name))).contains("empty rule name"));
    // 2^64 - 1 clients.
    let mut clients = body(S, 1);
    section(&mut clients, "general", &policy, u64::MAX);
    assert!(corrupt(load(sealed(&clients))).contains("more clients"));
    // A sliding log of four billion entries (the rule's limit is 1000), and one of 1000 in a
    // file holding one.
    for len in [u32::MAX, 1_000] {
        let mut log = body(S, 1);
        section(&mut log, "general", &policy, 1);
        log.extend_from_slice(&[0, 0, 4, 127, 0, 0, 1, 32]);
        log.extend_from_slice(&len.to_le_bytes());
        log.extend_from_slice(&S.to_le_bytes());
        log.extend_from_slice(&[0; 8]);
        assert!(
            corrupt(load(sealed(&log))).contains("sliding log longer"),
            "{len}"
        );
    }
}

#[test]
fn checked_but_impossible_contents_are_refused() {
    let rules = table(&[("general", token_bucket(10, S))]);
    let load = |file: Vec<u8>| restore_from(&file, &store(&rules, 10), &rules, FINGERPRINT, 51 * S);
    let one = |client: &[u8]| {
        let mut body = body(50 * S, 1);
        section(&mut body, "general", rules[0].limits.first(), 1);
        body.extend_from_slice(client);
        sealed(&body)
    };
    let client = |refused: u8, key: &[u8], tat: u64| {
        let mut bytes = vec![refused];
        bytes.extend_from_slice(key);
        bytes.extend_from_slice(&tat.to_le_bytes());
        bytes
    };
    let v4 = [0, 4, 10, 0, 0, 1, 32];
    assert_eq!(load(one(&client(0, &v4, 55 * S))).unwrap().restored(), 1);
    for (bad, problem) in [
        (client(2, &v4, 55 * S), "refused flag"),
        (client(0, &[3, 0, 0, 0, 0, 0, 0], 55 * S), "kind of client key"),
        (client(0, &[0, 5, 10, 0, 0, 1, 32], 55 * S), "address family"),
        (client(0, &[0, 4, 10, 0, 0, 1, 24], 55 * S), "host bits"),
        (client(0, &v4, 71 * S + 1), "more than its bounded debt"),
    ] {
        match load(one(&bad)) {
            Err(DecodeError::Corrupt { problem: found, .. }) => assert!(found.contains(problem), "{found}"),
            other => panic!("{problem}: {other:?}"),
        }
    }
    let mut trailing = one(&client(0, &v4, 55 * S));
    trailing.push(0);
    let body_len = (trailing.len() - ENVELOPE_LEN) as u64;
    trailing[12..20].copy_from_slice(&body_len.to_le_bytes());
    let checksum = crc32fast::hash(&trailing[ENVELOPE_LEN..]);
    trailing[20..24].copy_from_slice(&checksum.to_le_bytes());
    assert!(matches!(load(trailing), Err(DecodeError::Corrupt { .. })));
    // Saved "later" than now: the clock stepped back since.
    let file = one(&client(0, &v4, 55 * S));
    let early = restore_from(&file, &store(&rules, 10), &rules, FINGERPRINT, 40 * S);
    assert_eq!(early.unwrap_err(), DecodeError::FromTheFuture { ahead_s: 10 });
}

#[test]
fn saving_replaces_the_file_whole_and_loading_reads_it_back() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tollgate.state");
    // On the real clock, as a save and a load read it.
    let (saved, rules, _) = busy_at(store(&[], 1).now_us() - 10_000);
    let restored = store(&rules, 1_000);
    assert_eq!(
        load(&path, &restored, &rules, FINGERPRINT).unwrap(),
        None,
        "no file yet"
    );
    check_writable(&path).unwrap();
    let first = save(&path, &saved, &rules, FINGERPRINT).unwrap();
    assert_eq!(first.clients, 16);
    assert_eq!(fs::metadata(&path).unwrap().len(), first.bytes);
    let loaded = load(&path, &restored, &rules, FINGERPRINT).unwrap().unwrap();
    assert_eq!(loaded.restored(), 16);
    // Saved again over the first: no temporary file is left beside it.
    save(&path, &restored, &rules, FINGERPRINT).unwrap();
    let names: Vec<_> = fs::read_dir(dir.path())
        .unwrap()
        .map(|entry| entry.unwrap().file_name())
        .collect();
    assert_eq!(names, ["tollgate.state"]);
    fs::write(&path, b"garbage").unwrap();
    let error = load(&path, &store(&rules, 10), &rules, FINGERPRINT).unwrap_err();
    assert!(error.to_string().contains("not a tollgate state file"), "{error}");
}

#[test]
fn an_unwritable_place_is_an_error_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("no-such-directory").join("tollgate.state");
    let error = check_writable(&missing).unwrap_err().to_string();
    assert!(error.contains("no-such-directory"), "{error}");
    let error = check_writable(dir.path()).unwrap_err().to_string();
    assert!(error.contains("directory"), "{error}");
    let (saved, rules, _) = busy();
    assert!(save(&missing, &saved, &rules, FINGERPRINT).is_err());
}

#[test]
fn places_in_flight_are_never_saved() {
    let places = Policy::Concurrent(crate::algorithms::Concurrent {
        places: 2,
        lease_ms: 60_000,
    });
    let rules = vec![Rule::new(
        0,
        "api",
        crate::algorithms::Limits::new(vec![token_bucket(5, S), places]).unwrap(),
    )];
    let t0 = base();
    let saved = store(&rules, 100);
    assert!(saved.check_at(&rules[0], ip(1), Cost::ONE, t0).allowed);
    let (file, clients) = encode_at(&saved, &rules, FINGERPRINT, || t0);
    assert_eq!(clients, 1, "the token bucket's state alone");
    let restored = store(&rules, 100);
    let loaded = restore_from(&file, &restored, &rules, FINGERPRINT, t0 + 1_000).unwrap();
    assert_eq!(loaded.restored(), 1);
    // Both places are free after the restart; the bucket still owes the token spent.
    assert_eq!(
        restored.inspect_at(&rules[0], ip(1), t0 + 1_000).parts()[1].remaining,
        2
    );
    assert_eq!(
        restored.inspect_at(&rules[0], ip(1), t0 + 1_000).parts()[0].remaining,
        4
    );
}

/// A charge (a cost the backend reported) may leave each algorithm up to its bounded debt
/// (`DEBT_LIMITS` times its limit spent): the file takes such a state back as it was, and one
/// client in debt never makes the whole file corrupt, which would give every client a full
/// budget after a restart.
#[test]
fn a_state_in_its_bounded_debt_round_trips() {
    let t0 = base();
    let rules = table(&[
        ("general", token_bucket(3, 60 * S)),
        ("auth", fixed_window(2, 3_600)),
        ("api", sliding_window(4, 3_600)),
        ("login", sliding_log(3, 3_600)),
    ]);
    let saved = store(&rules, 100);
    for rule in &rules {
        saved.charge_at(rule, ip(1), Cost::MAX, t0);
        saved.check_at(rule, ip(2), Cost::ONE, t0);
    }
    let (file, clients) = encode_at(&saved, &rules, FINGERPRINT, || t0 + 5_000);
    assert_eq!(clients, 8);
    let restored = store(&rules, 100);
    let loaded = restore_from(&file, &restored, &rules, FINGERPRINT, t0 + 5_000).unwrap();
    assert_eq!(loaded.restored(), 8);
    assert_eq!(held(&restored, &rules), held(&saved, &rules));
    for rule in &rules {
        assert!(
            !restored.check_at(rule, ip(1), Cost::ONE, t0 + 6_000).allowed,
            "{}",
            rule.name
        );
    }
}
