//! Delay instead of refuse (`DELAY_MAX_MS`, `AUTH_DELAY_MAX_MS`, a route's `delay=`): the places
//! of the requests waiting for their budget, bounded per client and overall.
//!
//! A request refused with a retry time within its rule's delay takes a place here before it
//! sleeps (see [`crate::gate::Gate`]): one under its client's cap (`DELAY_QUEUE_PER_CLIENT`, a
//! client being its key under the rule, as its budget is) and one under the overall cap
//! (`DELAY_QUEUE`). With either full it is refused at once, as without a delay, so a flood of
//! refused requests holds a bounded number of connections and timers, and one client cannot
//! take every place. The place is a [`Place`] guard: dropped when the wait ends, and when the
//! waiting future is dropped because the client went away (hyper drops a request's future on
//! a disconnect), so an abandoned wait frees its place at once. Entries are removed at zero, so
//! the table holds only clients waiting now.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use crate::metrics::DelayMetrics;

use crate::rules::ClientKey;

/// The caps of the delay queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct DelayBounds {
    /// `DELAY_QUEUE`: most requests waiting at once, over every rule and client.
    pub overall: u32,
    /// `DELAY_QUEUE_PER_CLIENT`: most requests one client waits with at once under one rule.
    pub per_client: u32,
}

/// Which cap refused a place.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Full {
    /// The client's own: `DELAY_QUEUE_PER_CLIENT`.
    Client,
    /// Everyone's: `DELAY_QUEUE`.
    Overall,
}

impl Full {
    /// As the `queue` label of `tollgate_delay_queue_full_total` and logs name it.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Full::Client => "client",
            Full::Overall => "overall",
        }
    }
}

/// Who waits: a rule's name (kept across reloads, unlike its id) and the client's key there.
type Waiter = (Arc<str>, ClientKey);

/// The places of the waiting requests.
#[derive(Debug)]
pub(crate) struct DelayQueue {
    /// The caps.
    bounds: DelayBounds,
    /// Who holds places, counted under one lock: both caps are checked and taken together.
    held: Mutex<Held>,
    /// Counted into as places are taken, given back and refused.
    metrics: DelayMetrics,
}

/// The places held.
#[derive(Debug, Default)]
struct Held {
    /// Every place held.
    total: u32,
    /// Places per waiter; no zero entries.
    by_client: HashMap<Waiter, u32>,
}

/// A request's place in the queue, given back when dropped.
#[derive(Debug)]
pub(crate) struct Place<'q> {
    queue: &'q DelayQueue,
    waiter: Waiter,
}

impl Drop for Place<'_> {
    fn drop(&mut self) {
        let mut held = self.queue.lock();
        if let Some(count) = held.by_client.get_mut(&self.waiter) {
            *count -= 1;
            if *count == 0 {
                held.by_client.remove(&self.waiter);
            }
            held.total -= 1;
        }
        self.queue.metrics.waiting.set(i64::from(held.total));
    }
}

impl DelayQueue {
    /// A queue of `bounds`, counting into `metrics`.
    pub(crate) fn new(bounds: DelayBounds, metrics: DelayMetrics) -> DelayQueue {
        DelayQueue {
            bounds,
            held: Mutex::default(),
            metrics,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Held> {
        self.held.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A place for `key` under the rule called `rule`, or the cap that is full.
    pub(crate) fn take(&self, rule: &Arc<str>, key: ClientKey) -> Result<Place<'_>, Full> {
        let waiter = (rule.clone(), key);
        let mut held = self.lock();
        if held.total >= self.bounds.overall {
            self.metrics.overall_full.inc();
            return Err(Full::Overall);
        }
        let count = held.by_client.entry(waiter.clone()).or_insert(0);
        if *count >= self.bounds.per_client {
            if *count == 0 {
                held.by_client.remove(&waiter);
            }
            self.metrics.client_full.inc();
            return Err(Full::Client);
        }
        *count += 1;
        held.total += 1;
        self.metrics.waiting.set(i64::from(held.total));
        Ok(Place { queue: self, waiter })
    }

    /// Places held now, over every client.
    #[cfg(test)]
    fn waiting(&self) -> u32 {
        self.lock().total
    }

    /// Clients holding a place now.
    #[cfg(test)]
    fn clients(&self) -> usize {
        self.lock().by_client.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rules::ClientIp;
    use std::net::IpAddr;

    fn client(last: u8) -> ClientKey {
        ClientKey::Ip(ClientIp::new(IpAddr::from([192, 0, 2, last]), 64))
    }

    fn queue(overall: u32, per_client: u32) -> DelayQueue {
        DelayQueue::new(DelayBounds { overall, per_client }, DelayMetrics::default())
    }

    #[test]
    fn a_client_holds_at_most_its_cap_and_gets_a_place_back_when_one_is_dropped() {
        let queue = queue(10, 2);
        let rule: Arc<str> = "api".into();
        let first = queue.take(&rule, client(1)).unwrap();
        let _second = queue.take(&rule, client(1)).unwrap();
        assert_eq!(queue.take(&rule, client(1)).unwrap_err(), Full::Client);
        // Another client, and the same client under another rule, are counted apart.
        let _other = queue.take(&rule, client(2)).unwrap();
        let _login = queue.take(&"auth".into(), client(1)).unwrap();
        assert_eq!(queue.waiting(), 4);
        drop(first);
        assert_eq!(queue.waiting(), 3);
        let _again = queue.take(&rule, client(1)).unwrap();
        assert_eq!(queue.metrics.client_full.get(), 1);
        assert_eq!(queue.metrics.waiting.get(), 4);
    }

    #[test]
    fn the_overall_cap_refuses_every_client_once_it_is_reached() {
        let queue = queue(2, 5);
        let rule: Arc<str> = "general".into();
        let first = queue.take(&rule, client(1)).unwrap();
        let _second = queue.take(&rule, client(2)).unwrap();
        assert_eq!(queue.take(&rule, client(3)).unwrap_err(), Full::Overall);
        assert_eq!(queue.take(&rule, client(1)).unwrap_err(), Full::Overall);
        // A refusal holds nothing: no entry is left behind for the refused client.
        assert_eq!(queue.clients(), 2);
        drop(first);
        let _third = queue.take(&rule, client(3)).unwrap();
        assert_eq!(queue.metrics.overall_full.get(), 2);
    }

    #[test]
    fn every_place_given_back_leaves_the_table_empty() {
        let queue = queue(100, 100);
        let rule: Arc<str> = "general".into();
        let places: Vec<Place<'_>> = (0..50)
            .map(|i| queue.take(&rule, client(i % 7)).unwrap())
            .collect();
        assert_eq!((queue.waiting(), queue.clients()), (50, 7));
        drop(places);
        assert_eq!((queue.waiting(), queue.clients()), (0, 0));
        assert_eq!(queue.metrics.waiting.get(), 0);
    }

    #[test]
    fn a_cap_of_zero_refuses_every_place() {
        let queue = queue(0, 4);
        assert_eq!(
            queue.take(&"general".into(), client(1)).unwrap_err(),
            Full::Overall
        );
        let queue = super::DelayQueue::new(
            DelayBounds {
                overall: 4,
                per_client: 0,
            },
            DelayMetrics::default(),
        );
        assert_eq!(
            queue.take(&"general".into(), client(1)).unwrap_err(),
            Full::Client
        );
        assert_eq!(queue.clients(), 0);
    }
}
