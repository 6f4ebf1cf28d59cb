//! Who is refused most: a heavy-hitter sketch per rule over one-minute windows, for the
//! admin's `GET /v1/limited?top=N`.
//!
//! Each window is a Space-Saving summary (Metwally, Agrawal and El Abbadi, "Efficient
//! computation of frequent and top-k elements in data streams", ICDT 2005) of a fixed
//! [`CAPACITY`]: a client already counted gains one; a new one, while there is room, enters
//! with one; otherwise it takes the place of the client counted least, inheriting that count
//! plus one (and the inherited part as its possible error). So memory stays at `CAPACITY`
//! entries per rule whatever a flood of distinct keys does, every client refused more than
//! `refusals / CAPACITY` times in a window is in the summary, and a count is never below the
//! true one nor above it by more than its `error`.
//!
//! A window is a minute on the gateway's clock (tokio's, so tests can pause it); the list
//! reports the current window and the one before it together, so it always covers at least
//! the last full minute (and at most two).

use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::time::Instant;

use crate::rules::{ClientKey, Rule};

/// Clients each rule's summary holds in a window: enough for any `top` an operator reads, and
/// a linear scan of it per refusal (a few dozen nanoseconds) costs less than a hash index.
pub(crate) const CAPACITY: usize = 64;

/// How long one window lasts.
pub(crate) const WINDOW: Duration = Duration::from_secs(60);

/// One client in a summary.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Counted {
    /// Whose refusals.
    pub(crate) client: ClientKey,
    /// Refusals counted: never fewer than the true number, at most `error` more.
    pub(crate) count: u64,
    /// How much of `count` may belong to the clients this one displaced.
    pub(crate) error: u64,
}

/// A Space-Saving summary of at most `capacity` clients.
#[derive(Debug, Clone)]
pub(crate) struct SpaceSaving {
    /// The clients counted, in no order.
    entries: Vec<Counted>,
    /// Most entries held.
    capacity: usize,
}

impl SpaceSaving {
    /// An empty summary of at most `capacity` clients (at least one).
    pub(crate) fn new(capacity: usize) -> SpaceSaving {
        let capacity = capacity.max(1);
        SpaceSaving {
            entries: Vec::with_capacity(capacity),
            capacity,
        }
    }

    /// Count one refusal of `client`.
    pub(crate) fn observe(&mut self, client: ClientKey) {
        if let Some(entry) = self.entries.iter_mut().find(|entry| entry.client == client) {
            entry.count += 1;
            return;
        }
        if self.entries.len() < self.capacity {
            self.entries.push(Counted {
                client,
                count: 1,
                error: 0,
            });
            return;
        }
        // Full: the least counted gives its place, and its count, to the newcomer.
        if let Some(least) = self.entries.iter_mut().min_by_key(|entry| entry.count) {
            let inherited = least.count;
            *least = Counted {
                client,
                count: inherited + 1,
                error: inherited,
            };
        }
    }

    /// The clients counted, in no order.
    pub(crate) fn entries(&self) -> &[Counted] {
        &self.entries
    }

    /// How many clients are held: at most the capacity.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }
}

/// One rule's summaries: the current window's and the one before.
#[derive(Debug)]
struct Windows {
    /// The current window's number, in [`WINDOW`]s since the tracker started.
    number: u64,
    /// Refusals in the current window.
    current: SpaceSaving,
    /// Refusals in the window before it (empty when it saw none, or is older).
    previous: SpaceSaving,
}

impl Windows {
    fn empty() -> Arc<Mutex<Windows>> {
        Arc::new(Mutex::new(Windows {
            number: 0,
            current: SpaceSaving::new(CAPACITY),
            previous: SpaceSaving::new(CAPACITY),
        }))
    }
}

/// The refused clients of every rule, each rule's bounded by [`CAPACITY`]: what the gate feeds
/// with every refusal, and the admin reads.
#[derive(Debug)]
pub(crate) struct RefusedClients {
    /// By rule id; shared with the tracker of the table before for a rule of the same name.
    rules: Box<[Arc<Mutex<Windows>>]>,
    /// Window 0's start.
    started: Instant,
}

impl RefusedClients {
    /// A tracker for `rules` rules (ids `0..rules`).
    pub(crate) fn new(rules: usize) -> RefusedClients {
        RefusedClients {
            rules: (0..rules).map(|_| Windows::empty()).collect(),
            started: Instant::now(),
        }
    }

    /// The tracker of another table of `rules`, where `before` were this one's: a rule of a
    /// name `before` had keeps its counts (its clients are refused under the same name).
    pub(crate) fn for_rules(&self, before: &[Rule], rules: &[Rule]) -> RefusedClients {
        RefusedClients {
            rules: rules
                .iter()
                .map(|rule| {
                    before
                        .iter()
                        .position(|held| held.name == rule.name)
                        .and_then(|id| self.rules.get(id).cloned())
                        .unwrap_or_else(Windows::empty)
                })
                .collect(),
            started: self.started,
        }
    }

    /// Count one refusal of `client` under rule `rule` (ignored for a rule not tracked).
    pub(crate) fn refused(&self, rule: u16, client: ClientKey) {
        if let Some(windows) = self.rules.get(usize::from(rule)) {
            let number = self.window_now();
            let mut windows = windows.lock();
            windows.advance(number);
            windows.current.observe(client);
        }
    }

    /// The `top` clients of rule `rule` refused most in the current window and the one
    /// before, most refused first: their counts added up (as are their errors).
    pub(crate) fn top(&self, rule: u16, top: usize) -> Vec<Counted> {
        let Some(windows) = self.rules.get(usize::from(rule)) else {
            return Vec::new();
        };
        let number = self.window_now();
        let mut windows = windows.lock();
        windows.advance(number);
        let mut merged: Vec<Counted> = windows.previous.entries().to_vec();
        for entry in windows.current.entries() {
            match merged.iter_mut().find(|seen| seen.client == entry.client) {
                Some(seen) => {
                    seen.count += entry.count;
                    seen.error += entry.error;
                }
                None => merged.push(*entry),
            }
        }
        drop(windows);
        merged.sort_by(|a, b| b.count.cmp(&a.count).then(a.error.cmp(&b.error)));
        merged.truncate(top);
        merged
    }

    /// Clients held for rule `rule`, both windows together: at most twice [`CAPACITY`].
    #[cfg(test)]
    pub(crate) fn held(&self, rule: u16) -> usize {
        self.rules.get(usize::from(rule)).map_or(0, |windows| {
            let windows = windows.lock();
            windows.current.len() + windows.previous.len()
        })
    }

    fn window_now(&self) -> u64 {
        self.started.elapsed().as_secs() / WINDOW.as_secs()
    }
}

impl Windows {
    /// Move on to window `number`, if it is a later one.
    fn advance(&mut self, number: u64) {
        if number == self.number {
            return;
        }
        let fresh = SpaceSaving::new(CAPACITY);
        if number == self.number + 1 {
            self.previous = std::mem::replace(&mut self.current, fresh);
        } else if number > self.number {
            self.previous = SpaceSaving::new(CAPACITY);
            self.current = fresh;
        } else {
            // The clock never goes back; nothing to do if it did.
            return;
        }
        self.number = number;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{IpAddr, Ipv4Addr};

    fn ip(n: u32) -> ClientKey {
        IpAddr::V4(Ipv4Addr::from(n)).into()
    }

    #[test]
    fn a_flood_of_distinct_keys_keeps_the_summary_at_its_capacity() {
        let mut summary = SpaceSaving::new(CAPACITY);
        for n in 0..100_000 {
            summary.observe(ip(n));
            assert!(summary.len() <= CAPACITY);
        }
        assert_eq!(summary.len(), CAPACITY);
        assert_eq!(summary.entries.capacity(), CAPACITY, "never grown");
        // Every count is the stream's, no more: they add up to the refusals seen.
        let total: u64 = summary.entries().iter().map(|entry| entry.count).sum();
        assert_eq!(total, 100_000);
    }

    #[test]
    fn heavy_hitters_stand_out_of_a_flood_with_their_counts_bounded() {
        let mut summary = SpaceSaving::new(CAPACITY);
        // Three clients refused 5000, 3000 and 2000 times, among 50 000 refusals of distinct
        // clients, interleaved.
        let heavy = [(ip(1), 5_000), (ip(2), 3_000), (ip(3), 2_000)];
        let mut noise = 1_000_000;
        for round in 0..5_000u64 {
            for (client, times) in heavy {
                if round < times {
                    summary.observe(client);
                }
            }
            for _ in 0..10 {
                summary.observe(ip(noise));
                noise += 1;
            }
        }
        let total = 5_000 + 3_000 + 2_000 + 50_000;
        let mut entries = summary.entries().to_vec();
        entries.sort_by_key(|entry| std::cmp::Reverse(entry.count));
        for (rank, (client, times)) in heavy.into_iter().enumerate() {
            let entry = entries[rank];
            assert_eq!(entry.client, client, "rank {rank}");
            assert!(entry.count >= times, "never below the truth");
            assert!(entry.count - entry.error <= times, "the error covers the excess");
            assert!(
                entry.error <= total / CAPACITY as u64,
                "the error is bounded by N/k"
            );
        }
    }

    #[test]
    fn counts_are_exact_below_the_capacity() {
        let mut summary = SpaceSaving::new(4);
        for (client, times) in [(ip(1), 3), (ip(2), 1)] {
            for _ in 0..times {
                summary.observe(client);
            }
        }
        let mut entries = summary.entries().to_vec();
        entries.sort_by_key(|entry| std::cmp::Reverse(entry.count));
        assert_eq!(
            entries,
            [
                Counted {
                    client: ip(1),
                    count: 3,
                    error: 0
                },
                Counted {
                    client: ip(2),
                    count: 1,
                    error: 0
                },
            ]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn the_list_covers_the_last_minute_and_forgets_older_ones() {
        let refused = RefusedClients::new(2);
        for _ in 0..3 {
            refused.refused(0, ip(1));
        }
        refused.refused(0, ip(2));
        refused.refused(1, ip(9));
        let top = refused.top(0, 10);
        assert_eq!(
            top.iter().map(|c| (c.client, c.count)).collect::<Vec<_>>(),
            [(ip(1), 3), (ip(2), 1)]
        );
        assert_eq!(refused.top(0, 1).len(), 1);
        tokio::time::advance(WINDOW).await;
        // The window before is still reported, added to the current one's.
        refused.refused(0, ip(2));
        refused.refused(0, ip(2));
        refused.refused(0, ip(2));
        let top = refused.top(0, 10);
        assert_eq!(
            top.iter().map(|c| (c.client, c.count)).collect::<Vec<_>>(),
            [(ip(2), 4), (ip(1), 3)]
        );
        tokio::time::advance(WINDOW * 2).await;
        assert!(refused.top(0, 10).is_empty(), "two windows on, nothing is left");
        assert_eq!(refused.top(1, 10).len(), 0);
        assert!(refused.top(7, 10).is_empty(), "an unknown rule has none");
    }

    #[test]
    fn a_flood_keeps_each_rules_tracker_bounded() {
        let refused = RefusedClients::new(1);
        for n in 0..100_000 {
            refused.refused(0, ip(n));
        }
        assert!(refused.held(0) <= 2 * CAPACITY);
        assert_eq!(refused.top(0, 1_000).len(), CAPACITY);
    }

    #[test]
    fn a_rule_holds_a_few_kilobytes_at_most() {
        let per_rule = 2 * CAPACITY * std::mem::size_of::<Counted>();
        eprintln!(
            "{per_rule} bytes per rule ({} per client)",
            std::mem::size_of::<Counted>()
        );
        assert!(per_rule <= 8 * 1024, "{per_rule} bytes");
    }
}
