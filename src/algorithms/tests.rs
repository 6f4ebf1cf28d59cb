//! Every algorithm against hostile costs (issue 26): the numbers an attacker writes where a
//! cost goes (Envoy's `hits_addend`, `/v1/check`'s `cost`, a backend's reported cost) never
//! pass, never wrap, never panic, spend nothing when refused, and a charge leaves a bounded
//! debt.

use std::time::Duration;

use proptest::prelude::*;

use super::*;

/// The extremes, beside 0, 1, a limit and a limit + 1.
const EXTREMES: [u64; 7] = [
    1 << 31,
    u32::MAX as u64,
    1 << 50,
    1 << 53,
    i64::MAX as u64,
    1 << 63,
    u64::MAX,
];

/// A realistic wall-clock time, as large as in production.
const NOW: u64 = 1_764_000_000_000_000;

/// Every algorithm, with small numbers and with the largest the configuration accepts: each
/// algorithm's [`Algorithm::EXAMPLES`], so a new one is driven here as soon as it is listed.
fn policies() -> Vec<Policy> {
    Policy::examples().collect()
}

/// The costs a policy is driven with: 0, 1, its limit, its limit + 1, and the extremes.
fn costs(limit: u64) -> Vec<u64> {
    let mut costs = vec![0, 1, limit, limit + 1];
    costs.extend(EXTREMES);
    costs
}

/// Each algorithm's own functions, past the stores' `Cost`: total over every `u64` (a debug
/// build panics on a wrapping sum or product).
fn total<A: Algorithm>(algorithm: A) {
    for raw in costs(algorithm.limit()) {
        let mut state = A::State::default();
        let decision = algorithm.check(&mut state, NOW, raw);
        assert_eq!(
            decision.allowed,
            raw <= algorithm.limit(),
            "{algorithm} cost {raw}"
        );
        algorithm.charge(&mut state, NOW, raw);
        algorithm.refund(&mut state, NOW, raw);
        algorithm.charge(&mut state, NOW + 1, raw);
        let later = algorithm.check(&mut state, NOW + 2, raw);
        assert!(later.retry_after <= 3 * algorithm.window() + Duration::from_secs(1));
        let _ = algorithm.idle_at(&state);
    }
}

#[test]
fn every_algorithm_is_total_over_u64() {
    struct Total;
    impl Visitor for Total {
        fn visit<A: Algorithm>(&mut self, algorithm: A) {
            total(algorithm);
        }
    }
    for policy in policies() {
        policy.visit(&mut Total);
    }
}

#[test]
fn a_cost_above_the_limit_is_refused_at_once_and_alike_whatever_it_is() {
    for policy in policies() {
        let mut spent = policy.fresh_state();
        policy.check(&mut spent, NOW, Cost::ONE);
        for state in [policy.fresh_state(), spent] {
            let answers: Vec<LimitDecision> = costs(policy.limit())
                .into_iter()
                .filter(|raw| *raw > policy.limit())
                .map(|raw| policy.check(&mut state.clone(), NOW + 5, Cost::saturating(raw)))
                .collect();
            assert!(answers.iter().all(|answer| !answer.allowed), "{policy}");
            assert!(
                answers.windows(2).all(|pair| pair[0] == pair[1]),
                "{policy}: {answers:?}"
            );
        }
    }
}

#[test]
fn a_charge_of_any_size_is_paid_back_within_two_windows() {
    for policy in policies().into_iter().filter(|policy| !policy.is_concurrent()) {
        for raw in costs(policy.limit()) {
            let mut state = policy.fresh_state();
            policy.charge(&mut state, NOW, Cost::saturating(raw));
            policy.charge(&mut state, NOW, Cost::saturating(raw));
            let refused = policy.check(&mut state.clone(), NOW, Cost::ONE);
            assert!(
                refused.retry_after <= 3 * policy.window(),
                "{policy} charged {raw} twice: {refused:?}"
            );
            let window = u64::try_from(policy.window().as_micros()).unwrap();
            assert!(
                policy.check(&mut state, NOW + 2 * window, Cost::ONE).allowed,
                "{policy} charged {raw} twice"
            );
        }
    }
}

proptest! {
    /// Any run of decisions, charges and refunds of 0, 1, the limit, the limit + 1 and the
    /// extremes: nothing above the limit passes or spends anything, `remaining` never exceeds
    /// the limit, every wait is bounded (three windows: a debt, and a token more), and after a charge the client passes again within
    /// two windows (the debt bound).
    #[test]
    fn hostile_costs_never_pass_and_leave_a_bounded_debt(
        which in 0..policies().len(),
        steps in proptest::collection::vec((0u64..3_000_000, 0..11usize, 0..4u8), 1..60),
    ) {
        let policy = policies()[which];
        let costs = costs(policy.limit());
        let window = u64::try_from(policy.window().as_micros()).unwrap();
        let bound = 3 * policy.window() + Duration::from_secs(1);
        let mut state = policy.fresh_state();
        let mut now = NOW;
        for (dt, index, op) in steps {
            now += dt;
            let raw = costs[index];
            let cost = Cost::saturating(raw);
            match op {
                0 | 1 => {
                    let before = state.clone();
                    let decision = policy.check(&mut state, now, cost);
                    prop_assert!(decision.remaining <= policy.limit());
                    prop_assert!(decision.retry_after <= bound, "{:?}", decision);
                    prop_assert!(decision.reset_after <= bound, "{:?}", decision);
                    if raw > policy.limit() {
                        prop_assert!(!decision.allowed);
                        prop_assert_eq!(policy.peek(&state, now), policy.peek(&before, now));
                    }
                }
                2 => {
                    policy.charge(&mut state, now, cost);
                    let later = policy.check(&mut state.clone(), now + 2 * window, Cost::ONE);
                    prop_assert!(later.allowed, "charged {}: {:?}", raw, later);
                }
                _ => policy.refund(&mut state, now, cost),
            }
        }
    }
}

/// The admin's inspection of a whole budget: nothing to wait for (`reset_after` zero, not
/// the rest of a window), under every algorithm; and one spent request still waits.
#[test]
fn a_whole_budget_resets_after_nothing() {
    let now_us = 1_700_000_016_016_000;
    for (name, first, second) in [
        ("token_bucket", "10", "1"),
        ("fixed_window", "10", "60"),
        ("sliding_window", "10", "60"),
        ("sliding_log", "10", "60"),
        ("concurrent", "10", "30"),
    ] {
        let policy = Policy::parse(name, first, second).unwrap().unwrap();
        let fresh = policy.peek(&policy.fresh_state(), now_us);
        assert_eq!(
            (fresh.remaining, fresh.reset_after),
            (10, Duration::ZERO),
            "{name}"
        );
        let mut spent = policy.fresh_state();
        policy.check(&mut spent, now_us, Cost::ONE);
        let seen = policy.peek(&spent, now_us + 1_000);
        assert_eq!(seen.remaining, 9, "{name}");
        assert!(seen.reset_after > Duration::ZERO, "{name}");
    }
}

/// The registry (`algorithms!`) holds each algorithm whole: its script is `scripts/<name>.lua`
/// as on disk, its name and aliases parse to it, its policies come back from the state file's
/// tag and numbers, its states from their encoding, its tag and key suffix are its own, and
/// `docs/algorithms.md` describes it. What a new algorithm's line in the list must bring.
#[test]
fn every_registered_algorithm_is_whole() {
    let mut tags = std::collections::HashSet::new();
    let mut suffixes = std::collections::HashSet::new();
    let docs = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/algorithms.md")).unwrap();
    for name in Policy::NAMES {
        let examples: Vec<Policy> = policies().into_iter().filter(|p| p.name() == *name).collect();
        assert!(!examples.is_empty(), "{name}: no EXAMPLES");
        let script = std::fs::read_to_string(format!("{}/scripts/{name}.lua", env!("CARGO_MANIFEST_DIR")))
            .unwrap_or_else(|e| panic!("{name}: scripts/{name}.lua: {e}"));
        assert_eq!(
            examples[0].script().0.source(),
            script,
            "{name}: its script is not scripts/{name}.lua"
        );
        match Policy::parse(name, "1", "1") {
            Some(Ok(policy)) => assert_eq!(policy.name(), *name),
            Some(Err(_)) => {}
            None => panic!("{name} does not parse"),
        }
        assert!(
            tags.insert(examples[0].file_tag()),
            "{name}: a state file tag already taken"
        );
        assert!(
            suffixes.insert(examples[0].key_suffix()),
            "{name}: a key suffix already taken"
        );
        assert!(
            docs.contains(&format!("`{name}")),
            "docs/algorithms.md does not describe {name}"
        );
        for policy in examples {
            assert_eq!(
                Policy::from_file(policy.file_tag(), policy.script().1),
                Some(policy)
            );
            let mut state = policy.fresh_state();
            policy.check(&mut state, NOW, Cost::ONE);
            let mut saved = Vec::new();
            if policy.save_state(&state, &mut saved) {
                let mut input = StateReader::new(&saved, 0);
                assert_eq!(policy.load_state(&mut input, NOW), Ok(state), "{policy}");
                assert_eq!(input.left(), 0, "{policy}: read less than it wrote");
            } else {
                assert!(saved.is_empty(), "{policy}: wrote a state it does not save");
            }
        }
    }
    for spelling in Policy::spellings(false) {
        match Policy::parse(spelling, "1", "1") {
            Some(Ok(policy)) => assert!(Policy::NAMES.contains(&policy.name()), "{spelling}"),
            Some(Err(_)) => {}
            None => panic!("{spelling} does not parse"),
        }
    }
}

/// Messages name the algorithms as the algorithms name themselves: every kind's
/// `Algorithm::NAME` and alias, in declaration order, none written by hand.
#[test]
fn messages_name_the_algorithms_from_the_algorithms() {
    // Today's algorithms first, in the registry's order; one added later joins the end of the
    // list by its line in `algorithms!`, with no test to edit (docs/architecture.md's recipe).
    let names = super::algorithm_names();
    assert!(
        names.starts_with("token_bucket, gcra, sliding_window, fixed_window")
            && names.contains("sliding_log"),
        "{names}"
    );
    let kinds = super::limit_kinds();
    assert!(
        kinds.starts_with("token_bucket, gcra, sliding_window, fixed_window, sliding_log")
            && kinds.contains("concurrent"),
        "{kinds}"
    );
    // A choice in words: "a, b or c", each name once.
    for list in [&names, &kinds] {
        let (init, last) = list.rsplit_once(" or ").expect("two names at least");
        let mut all: Vec<&str> = init.split(", ").chain([last]).collect();
        let count = all.len();
        all.sort_unstable();
        all.dedup();
        assert_eq!(all.len(), count, "{list}");
    }
    for name in Policy::NAMES {
        assert!(super::limit_kinds().contains(name), "{name}");
        let known = Policy::parameters(name).is_some();
        assert_eq!(super::algorithm_names().contains(name), known, "{name}");
    }
    let unknown = super::parse_limit("leaky_bucket:1:1").unwrap_err();
    assert!(unknown.ends_with(&super::limit_kinds()), "{unknown}");
}

/// The fingerprints a rule's limits keep are each policy's own (every Redis key names one, and
/// a replica of another version must name the same), and the limits read as the policies
/// alone do: the rule table's digest is made of that text.
#[test]
fn limits_keep_each_policys_fingerprint_and_read_as_their_policies() {
    let policies = vec![
        super::parse_limit("token_bucket:20:10").unwrap(),
        super::parse_limit("fixed_window:10000:86400").unwrap(),
        super::parse_limit("sliding_window:5:1.5").unwrap(),
    ];
    let limits = Limits::new(policies.clone()).unwrap();
    for (index, policy) in policies.iter().enumerate() {
        assert_eq!(limits.fingerprint(index), policy.fingerprint(), "{policy}");
    }
    assert_eq!(limits.fingerprint(policies.len()), 0, "no such limit");
    assert_eq!(
        format!("{limits:?}"),
        format!("Limits({:?})", policies.into_boxed_slice())
    );
    let one = Limits::one(super::parse_limit("gcra:3:1").unwrap());
    assert_eq!(one.fingerprint(0), one.first().fingerprint());
}
