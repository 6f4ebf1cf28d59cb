//! What an algorithm decides of one request ([`LimitDecision`]), and what a rule's limits
//! decide together ([`Decision`], each limit's [`Part`]): plain values that allocate
//! nothing for a rule of one limit.

use std::sync::Arc;
use std::time::Duration;

/// Most limits one rule holds (`token_bucket:20:10+fixed_window:10000:86400` is two): a
/// decision carries each one's part inline, so it stays a plain value that allocates nothing.
pub const MAX_LIMITS: usize = 6;

/// What one limit of a rule says of one request: what an [`Algorithm`](crate::algorithms::Algorithm) decides.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LimitDecision {
    /// Whether this limit lets the request through.
    pub allowed: bool,
    /// The limit's capacity or per-window limit.
    pub limit: u64,
    /// Whole units left after this request; 0 when denied.
    pub remaining: u64,
    /// When denied, how long until the same request would be allowed; zero when allowed.
    pub retry_after: Duration,
    /// How long until the budget is entirely back.
    pub reset_after: Duration,
    /// When the request was counted, in microseconds since the Unix epoch on the deciding
    /// store's clock: what a refund hands back to find what to give back.
    pub at_us: u64,
}

/// The outcome of asking a store about one request, under every limit of its rule.
///
/// The fields describe the rule as a whole, as the legacy headers and `Retry-After` tell it:
/// allowed only when every limit allows; when refused, `retry_after` is the latest of the
/// refusing limits' retry times and the numbers are that limit's; when allowed, they are the
/// limit closest to exhaustion's (the fewest units left, then the latest reset). [`parts`]
/// holds each limit's own, for the draft headers, which list every policy.
///
/// A rule of one limit's decision is those fields alone (80 bytes, no allocation): every
/// request's future carries it, and one holding every part inline (312 bytes) was copied
/// there measurably (docs/benchmarks.md, part 17). A rule of several limits' parts are shared
/// behind one allocation.
///
/// [`parts`]: Decision::parts
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    /// Whether the request may go through: every limit allowed it.
    pub allowed: bool,
    /// The described limit's capacity or per-window limit (`X-RateLimit-Limit`).
    pub limit: u64,
    /// Whole units left under it after this request; 0 when denied (`X-RateLimit-Remaining`).
    pub remaining: u64,
    /// When denied, how long until the same request would be allowed by every limit; zero
    /// when allowed.
    pub retry_after: Duration,
    /// How long until the described limit's budget is entirely back (`X-RateLimit-Reset` is
    /// now plus this).
    pub reset_after: Duration,
    /// When the request was counted, in microseconds since the Unix epoch on the deciding
    /// store's clock: what a refund hands back to find what to give back.
    pub at_us: u64,
    /// The position of the described limit (the one `limit`, `remaining` and `reset_after`
    /// speak of) among the rule's limits.
    pub(crate) described: u8,
    /// A rule of several limits: each limit's part, by its position in the rule; `None` for
    /// a rule of one, whose part the fields above are.
    pub(crate) several: Option<Arc<[Part]>>,
}

/// A decision's parts ([`Decision::parts`]): a slice of them.
pub enum Parts<'a> {
    /// A rule of one limit's, made from the decision's own fields.
    One(Part),
    /// A rule of several limits'.
    Several(&'a [Part]),
}

impl<'a> IntoIterator for Parts<'a> {
    type Item = Part;
    type IntoIter = PartsIter<'a>;

    fn into_iter(self) -> PartsIter<'a> {
        match self {
            Parts::One(part) => PartsIter::One(Some(part)),
            Parts::Several(parts) => PartsIter::Several(parts.iter()),
        }
    }
}

/// The parts of a decision, one by one, by value.
pub enum PartsIter<'a> {
    /// The one part left to give, if not given yet.
    One(Option<Part>),
    /// The parts of a rule of several limits.
    Several(std::slice::Iter<'a, Part>),
}

impl Iterator for PartsIter<'_> {
    type Item = Part;

    fn next(&mut self) -> Option<Part> {
        match self {
            PartsIter::One(part) => part.take(),
            PartsIter::Several(parts) => parts.next().copied(),
        }
    }
}

impl std::ops::Deref for Parts<'_> {
    type Target = [Part];

    fn deref(&self) -> &[Part] {
        match self {
            Parts::One(part) => std::slice::from_ref(part),
            Parts::Several(parts) => parts,
        }
    }
}

/// One limit's part of a [`Decision`]: what the draft headers say of its policy. Times are
/// kept in microseconds, as the stores decide them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Part {
    /// Whether this limit allowed the request.
    pub allowed: bool,
    /// Whole units left under this limit (after the request, when it went through; as they
    /// are, when the request was refused: a refused request spends nothing in any limit).
    pub remaining: u64,
    /// Zero when this limit allowed the request; else µs until it would.
    pub(crate) retry_after_us: u64,
    /// µs until this limit's budget is entirely back.
    pub(crate) reset_after_us: u64,
    /// When this limit counted the request (its own `at_us`: a concurrency limit's is the
    /// name of the lease it took, what giving the place back hands over).
    pub at_us: u64,
}

impl Decision {
    /// The decision of a rule of one limit.
    pub const fn one(decision: LimitDecision) -> Decision {
        Decision {
            allowed: decision.allowed,
            limit: decision.limit,
            remaining: decision.remaining,
            retry_after: decision.retry_after,
            reset_after: decision.reset_after,
            at_us: decision.at_us,
            described: 0,
            several: None,
        }
    }

    /// The decision of a rule whose limits said `parts`, in order (at least one, at most
    /// `MAX_LIMITS`; more are ignored). A part that allowed a request refused by another
    /// must say what the limit has with nothing spent: the stores give its cost back first.
    pub fn of(parts: &[LimitDecision]) -> Decision {
        let parts = &parts[..parts.len().min(MAX_LIMITS)];
        if let [one] = parts {
            return Decision::one(*one);
        }
        let Some(first) = parts.first() else {
            // No limit refuses: a rule has one at least, so this is never reached.
            return Decision::one(LimitDecision {
                allowed: true,
                limit: 0,
                remaining: 0,
                retry_after: Duration::ZERO,
                reset_after: Duration::ZERO,
                at_us: 0,
            });
        };
        let allowed = parts.iter().all(|part| part.allowed);
        let (index, described) = if allowed {
            parts
                .iter()
                .enumerate()
                .min_by_key(|(_, part)| (part.remaining, std::cmp::Reverse(part.reset_after)))
        } else {
            parts
                .iter()
                .enumerate()
                .filter(|(_, part)| !part.allowed)
                .max_by_key(|(_, part)| part.retry_after)
        }
        .unwrap_or((0, first));
        Decision {
            allowed,
            limit: described.limit,
            remaining: if allowed { described.remaining } else { 0 },
            retry_after: if allowed {
                Duration::ZERO
            } else {
                described.retry_after
            },
            reset_after: described.reset_after,
            at_us: first.at_us,
            // At most MAX_LIMITS, which fits.
            described: index as u8,
            several: Some(parts.iter().map(Part::of).collect()),
        }
    }

    /// Each limit's part, in the order the rule writes its limits.
    pub fn parts(&self) -> Parts<'_> {
        match &self.several {
            Some(parts) => Parts::Several(parts),
            None => Parts::One(Part::of(&LimitDecision {
                allowed: self.allowed,
                limit: self.limit,
                remaining: self.remaining,
                retry_after: self.retry_after,
                reset_after: self.reset_after,
                at_us: self.at_us,
            })),
        }
    }

    /// The position among the rule's limits (as written) of the limit that `limit`,
    /// `remaining` and `reset_after` describe: for a caller that names its window or unit
    /// (Envoy's rate limit service reports a unit).
    pub fn described(&self) -> usize {
        usize::from(self.described)
    }

    /// The same decision seen `elapsed` later: every wait shorter by it (a cached denial).
    pub fn aged(&self, elapsed: Duration) -> Decision {
        let mut aged = self.clone();
        aged.retry_after = aged.retry_after.saturating_sub(elapsed);
        aged.reset_after = aged.reset_after.saturating_sub(elapsed);
        let elapsed = micros(elapsed);
        if let Some(parts) = &self.several {
            aged.several = Some(
                parts
                    .iter()
                    .map(|part| Part {
                        retry_after_us: part.retry_after_us.saturating_sub(elapsed),
                        reset_after_us: part.reset_after_us.saturating_sub(elapsed),
                        ..*part
                    })
                    .collect(),
            );
        }
        aged
    }
}

impl Part {
    const fn of(decision: &LimitDecision) -> Part {
        Part {
            allowed: decision.allowed,
            remaining: decision.remaining,
            retry_after_us: if decision.allowed {
                0
            } else {
                micros(decision.retry_after)
            },
            reset_after_us: micros(decision.reset_after),
            at_us: decision.at_us,
        }
    }

    /// Zero when this limit allowed the request; else how long until it would.
    pub fn retry_after(&self) -> Duration {
        Duration::from_micros(self.retry_after_us)
    }

    /// How long until this limit's budget is entirely back.
    pub fn reset_after(&self) -> Duration {
        Duration::from_micros(self.reset_after_us)
    }
}

/// A wait in whole microseconds (the stores' unit: nothing finer is ever decided).
const fn micros(duration: Duration) -> u64 {
    duration
        .as_secs()
        .saturating_mul(1_000_000)
        .saturating_add(duration.subsec_micros() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn part(allowed: bool, limit: u64, remaining: u64, retry_secs: u64, reset_secs: u64) -> LimitDecision {
        LimitDecision {
            allowed,
            limit,
            remaining,
            retry_after: Duration::from_secs(retry_secs),
            reset_after: Duration::from_secs(reset_secs),
            at_us: 0,
        }
    }

    #[test]
    fn the_described_limit_is_named_by_its_position() {
        // Allowed: the fewest left, then the latest reset.
        let allowed = Decision::of(&[
            part(true, 20, 5, 0, 1),
            part(true, 100, 5, 0, 900),
            part(true, 9, 7, 0, 60),
        ]);
        assert_eq!((allowed.described(), allowed.limit), (1, 100));
        // Refused: the refusing limit whose retry is latest.
        let refused = Decision::of(&[
            part(false, 20, 0, 2, 4),
            part(true, 100, 50, 0, 900),
            part(false, 9, 0, 30, 60),
        ]);
        assert_eq!((refused.described(), refused.limit), (2, 9));
        assert_eq!(Decision::one(part(true, 3, 2, 0, 1)).described(), 0);
        assert_eq!(refused.aged(Duration::from_secs(1)).described(), 2);
    }
}
