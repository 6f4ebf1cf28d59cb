//! The leases' arithmetic against a model: Redis's state of one client under one limit (as
//! `scripts/lease_take.lua` and the algorithms' scripts compute it, line for line) and replicas
//! that take shares, decide from them, give them back on expiry or at shutdown, or are killed
//! with them, in any interleaving. Never more admitted than the budget; with every replica
//! demanding, the whole budget admitted, less what kills took with them.

use proptest::prelude::*;

use super::*;

/// Redis's state of the client under one limit, and the limit.
#[derive(Debug, Clone)]
enum Model {
    /// Capacity, µs per token, TAT (none: full).
    Bucket {
        capacity: u64,
        interval: u64,
        tat: Option<u64>,
    },
    /// Limit, window µs, (window index, count).
    Fixed {
        limit: u64,
        window: u64,
        state: Option<(u64, u64)>,
    },
    /// Limit, window µs, (window index, previous count, current count).
    Sliding {
        limit: u64,
        window: u64,
        state: Option<(u64, u64, u64)>,
    },
}

impl Model {
    /// What the limit admits at `now`, and the take's cap (one second of refill for the bucket).
    fn avail(&self, now: u64) -> (u64, u64) {
        match *self {
            Model::Bucket {
                capacity,
                interval,
                tat,
            } => {
                let tau = capacity * interval;
                let tat = tat.unwrap_or(now).max(now);
                let avail = if tat - now <= tau {
                    (tau - (tat - now)) / interval
                } else {
                    0
                };
                (avail, (1_000_000 / interval).max(1))
            }
            Model::Fixed { limit, window, state } => {
                let k = now / window;
                let count = match state {
                    Some((w, c)) if w == k => c,
                    _ => 0,
                };
                (limit.saturating_sub(count), u64::MAX)
            }
            Model::Sliding { limit, window, state } => {
                let k = now / window;
                let elapsed = now - k * window;
                let (p, c) = match state {
                    Some((w, p, c)) if w == k => (p, c),
                    Some((w, _, c)) if w + 1 == k => (c, 0),
                    _ => (0, 0),
                };
                let room = (limit * window).saturating_sub(p * (window - elapsed) + c * window);
                (room / window, u64::MAX)
            }
        }
    }

    /// Debit `units` at `now` (what the take script writes); the share's end (window's end).
    fn debit(&mut self, now: u64, units: u64) -> Option<u64> {
        match self {
            Model::Bucket { interval, tat, .. } => {
                *tat = Some(tat.unwrap_or(now).max(now) + units * *interval);
                None
            }
            Model::Fixed { window, state, .. } => {
                let k = now / *window;
                let count = match *state {
                    Some((w, c)) if w == k => c,
                    _ => 0,
                };
                *state = Some((k, count + units));
                Some((k + 1) * *window)
            }
            Model::Sliding { window, state, .. } => {
                let k = now / *window;
                let (p, c) = match *state {
                    Some((w, p, c)) if w == k => (p, c),
                    Some((w, _, c)) if w + 1 == k => (c, 0),
                    _ => (0, 0),
                };
                *state = Some((k, p, c + units));
                Some((k + 1) * *window)
            }
        }
    }

    /// A refund of `units` counted at `at` (what a return is): the algorithms' scripts'.
    fn refund(&mut self, at: u64, units: u64) {
        match self {
            Model::Bucket { interval, tat, .. } => {
                if let Some(tat) = tat {
                    *tat = tat.saturating_sub(units * *interval);
                }
            }
            Model::Fixed { window, state, .. } => {
                if let Some((w, c)) = state
                    && *w == at / *window
                {
                    *c = c.saturating_sub(units);
                }
            }
            Model::Sliding { window, state, .. } => {
                if let Some((w, p, c)) = state {
                    if *w == at / *window {
                        *c = c.saturating_sub(units);
                    } else if *w == at / *window + 1 {
                        *p = p.saturating_sub(units);
                    }
                }
            }
        }
    }
}

/// A replica's share.
#[derive(Debug, Clone, Copy)]
struct Share {
    left: u64,
    taken_at: u64,
    expires: u64,
}

#[derive(Debug, Clone)]
enum Op {
    /// Replica `r` decides a request of `cost`, wanting `want` units if it takes a share.
    Decide { r: usize, cost: u64, want: u64 },
    /// Time passes; shares whose time is up go back.
    Wait(u64),
    /// Replica `r` is killed: its share is lost.
    Kill(usize),
    /// Replica `r` shuts down: its share goes back.
    Shutdown(usize),
}

impl Op {
    /// The same operation on one of `replicas` (the strategy draws replicas from a fixed
    /// range; a case with fewer folds them onto its own).
    fn among(&self, replicas: usize) -> Op {
        match *self {
            Op::Decide { r, cost, want } => Op::Decide {
                r: r % replicas,
                cost,
                want,
            },
            Op::Kill(r) => Op::Kill(r % replicas),
            Op::Shutdown(r) => Op::Shutdown(r % replicas),
            Op::Wait(us) => Op::Wait(us),
        }
    }
}

fn ops(replicas: usize) -> impl Strategy<Value = Vec<Op>> {
    let op = prop_oneof![
        8 => (0..replicas, 0u64..4, 1u64..40).prop_map(|(r, cost, want)| Op::Decide { r, cost, want }),
        2 => (0u64..400_000).prop_map(Op::Wait),
        1 => (0..replicas).prop_map(Op::Kill),
        1 => (0..replicas).prop_map(Op::Shutdown),
    ];
    proptest::collection::vec(op, 1..300)
}

/// The world: Redis, the replicas' shares, and what was admitted when.
struct World {
    redis: Model,
    shares: Vec<Option<Share>>,
    now: u64,
    /// (time, units) of every admission.
    admitted: Vec<(u64, u64)>,
    /// Units killed replicas took with them.
    lost: u64,
}

impl World {
    fn new(redis: Model, replicas: usize) -> World {
        World {
            redis,
            shares: vec![None; replicas],
            // Not at a window's start, and not at 0 (a bucket's TAT is at least now).
            now: 10_000_000_000,
            admitted: Vec::new(),
            lost: 0,
        }
    }

    fn give_back(&mut self, r: usize) {
        if let Some(share) = self.shares[r].take()
            && share.left > 0
        {
            self.redis.refund(share.taken_at, share.left);
        }
    }

    /// Replica `r` decides `cost`: from its share, else by a take (which is a plain decision when
    /// the share would be below the floor). Whether it was admitted.
    fn decide(&mut self, r: usize, cost: u64, want: u64) -> bool {
        let now = self.now;
        if let Some(share) = &mut self.shares[r]
            && now < share.expires
            && share.left >= cost
        {
            share.left -= cost;
            self.admitted.push((now, cost));
            return true;
        }
        self.give_back(r);
        let replicas = self.shares.len() as u64;
        let (avail, cap) = self.redis.avail(now);
        let Some(share) = share_of(cost, want.max(cost + 1), replicas, &[(avail, cap)]) else {
            return false;
        };
        let end = self.redis.debit(now, share);
        self.admitted.push((now, cost));
        if share > cost {
            self.shares[r] = Some(Share {
                left: share - cost,
                taken_at: now,
                expires: (now + LEASE_PERIOD.as_micros() as u64).min(end.unwrap_or(u64::MAX)),
            });
        }
        true
    }

    fn run(&mut self, op: &Op) {
        match *op {
            Op::Decide { r, cost, want } => {
                self.decide(r, cost, want);
            }
            Op::Wait(us) => {
                self.now += us;
                for r in 0..self.shares.len() {
                    if self.shares[r].is_some_and(|share| share.expires <= self.now) {
                        self.give_back(r);
                    }
                }
            }
            Op::Kill(r) => {
                if let Some(share) = self.shares[r].take() {
                    self.lost += share.left;
                }
            }
            Op::Shutdown(r) => self.give_back(r),
        }
    }

    /// Every replica demands one unit at a time, round after round, until a round admits
    /// nothing: the budget left is then all spent.
    fn exhaust(&mut self) {
        loop {
            let admitted = (0..self.shares.len())
                .map(|r| self.decide(r, 1, 8))
                .filter(|admitted| *admitted)
                .count();
            if admitted == 0 {
                return;
            }
        }
    }

    fn admitted_in(&self, from: u64, to: u64) -> u64 {
        self.admitted
            .iter()
            .filter(|(at, _)| (from..to).contains(at))
            .map(|(_, units)| units)
            .sum()
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Token bucket: from a full bucket at `start`, at most `C + floor((now - start) / T)` units
    /// admitted by any moment, whatever the replicas do; and after every replica has demanded
    /// until refused, the bucket holds nothing more and no share is left.
    #[test]
    fn a_bucket_never_admits_more_than_it_refilled(
        capacity in 1u64..200,
        interval in prop_oneof![Just(1_000u64), Just(20_000), Just(1_000_000)],
        replicas in 1usize..5,
        ops in ops(4),
    ) {
        let mut world = World::new(Model::Bucket { capacity, interval, tat: None }, replicas);
        let start = world.now;
        for op in &ops {
            let op = op.among(replicas);
            world.run(&op);
            let admitted = world.admitted_in(0, u64::MAX);
            prop_assert!(admitted <= capacity + (world.now - start) / interval,
                "{admitted} admitted by {} µs", world.now - start);
        }
        world.exhaust();
        let admitted = world.admitted_in(0, u64::MAX);
        prop_assert!(admitted <= capacity + (world.now - start) / interval);
        prop_assert_eq!(world.redis.avail(world.now).0, 0);
        prop_assert!(world.shares.iter().all(|share| share.is_none_or(|share| share.left == 0)));
    }

    /// Fixed window: never more than `L` admitted in any window; with every replica demanding
    /// at the end, exactly `L` in the last window, less what kills lost in it.
    #[test]
    fn a_fixed_window_admits_its_limit_less_what_kills_took(
        limit in 1u64..300,
        window in prop_oneof![Just(1_000_000u64), Just(3_000_000), Just(1_000_000_000_000)],
        replicas in 1usize..5,
        ops in ops(4),
    ) {
        let mut world = World::new(Model::Fixed { limit, window, state: None }, replicas);
        let mut lost_in_window = std::collections::HashMap::<u64, u64>::new();
        for op in &ops {
            let op = op.among(replicas);
            if let Op::Kill(r) = op
                && let Some(share) = world.shares[r]
            {
                *lost_in_window.entry(share.taken_at / window).or_default() += share.left;
            }
            world.run(&op);
            let k = world.now / window;
            prop_assert!(world.admitted_in(k * window, (k + 1) * window) <= limit);
        }
        world.exhaust();
        let k = world.now / window;
        let admitted = world.admitted_in(k * window, (k + 1) * window);
        let lost = lost_in_window.get(&k).copied().unwrap_or(0);
        prop_assert_eq!(admitted, limit - lost, "lost {}", lost);
    }

    /// Sliding window: every unit admitted in a window is counted in it at Redis (so Redis's
    /// estimate, which admitted the share, holds it); with a window longer than the run, every
    /// replica demanding at the end admits exactly `L`, less what kills lost.
    #[test]
    fn a_sliding_window_counts_every_unit_it_admits(
        limit in 1u64..300,
        window in prop_oneof![Just(1_000_000u64), Just(1_000_000_000_000)],
        replicas in 1usize..5,
        ops in ops(4),
    ) {
        let mut world = World::new(Model::Sliding { limit, window, state: None }, replicas);
        let long = window > 1_000_000_000;
        for op in &ops {
            let op = op.among(replicas);
            world.run(&op);
            let k = world.now / window;
            let counted = match world.redis {
                Model::Sliding { state: Some((w, _, c)), .. } if w == k => c,
                _ => 0,
            };
            let held: u64 = world.shares.iter().flatten().map(|share| share.left).sum();
            let admitted = world.admitted_in(k * window, (k + 1) * window);
            prop_assert!(admitted + held <= counted + world.lost,
                "{admitted} admitted and {held} held, {counted} counted");
            prop_assert!(admitted <= counted);
        }
        world.exhaust();
        if long {
            prop_assert_eq!(world.admitted_in(0, u64::MAX), limit - world.lost);
        }
    }
}

/// The share: a fraction of what is left, divided among the replicas taking shares, capped by
/// the demand and the cap; below the cost and one more unit, the request alone; nothing when
/// some limit cannot admit the cost; the smallest over the limits.
#[test]
fn shares_shrink_as_the_budget_runs_low() {
    assert_eq!(share_of(1, 100, 3, &[(1_000, u64::MAX)]), Some(100));
    assert_eq!(share_of(1, 1_000, 3, &[(1_000, u64::MAX)]), Some(166));
    assert_eq!(share_of(1, 1_000, 3, &[(60, u64::MAX)]), Some(10));
    assert_eq!(
        share_of(1, 1_000, 3, &[(11, u64::MAX)]),
        Some(1),
        "below the floor"
    );
    assert_eq!(share_of(1, 1_000, 3, &[(0, u64::MAX)]), None);
    assert_eq!(share_of(5, 1_000, 1, &[(4, u64::MAX)]), None);
    assert_eq!(
        share_of(1, 1_000, 1, &[(1_000, 50)]),
        Some(50),
        "a bucket's second of refill"
    );
    assert_eq!(
        share_of(1, 1_000, 1, &[(1_000, u64::MAX), (40, u64::MAX)]),
        Some(20)
    );
    // Hostile numbers saturate.
    assert_eq!(
        share_of(u64::MAX, u64::MAX, u64::MAX, &[(u64::MAX, u64::MAX)]),
        Some(u64::MAX)
    );
    assert_eq!(share_of(0, 0, 0, &[(0, 0)]), Some(0));
}
