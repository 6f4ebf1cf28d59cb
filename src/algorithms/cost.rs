//! What one request spends of a budget: a [`Cost`], bounded by construction.
//!
//! Costs come from outside: Envoy's `hits_addend` (the request's `uint32`, a descriptor's
//! `UInt64Value`), `/v1/check`'s `cost`, a backend's `RESPONSE_COST_HEADER`. They reach the
//! algorithms' arithmetic and the Redis scripts, whose Lua numbers are doubles, exact only
//! below 2^53. So every door makes a [`Cost`], which holds at most [`Cost::MAX`] (2^50), and
//! every store and algorithm takes one: no number an attacker writes reaches a multiplication.
//!
//! `Cost::MAX` is above every limit's capacity (each below [`EXACT_LIMIT`], which the
//! configuration's parsers enforce), and every algorithm refuses a cost above its capacity at
//! once, spending nothing, whatever the cost: so all costs from the capacity + 1 up are
//! decided alike, and a door with no way to say that a number is wrong (Envoy's descriptors)
//! clamps it with [`Cost::saturating`] without changing any decision. A door that can say so
//! refuses it ([`Cost::new`]: `/v1/check` answers `400`, a backend's report is ignored and
//! counted).

use std::fmt;

use crate::algorithms::EXACT_LIMIT;

/// Units of a budget one request spends: from 0 (a look that spends nothing) to
/// [`Cost::MAX`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Cost(u64);

/// A number too large to be a cost.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("{0} is above the largest cost, {max}", max = Cost::MAX.get())]
pub struct CostError(pub u64);

impl Cost {
    /// The largest cost, 2^50: above every limit's capacity, so never allowed, and small
    /// enough that a cost times a refill interval (each below 2^50) cannot wrap a `u64` once
    /// bounded by the capacity, and Lua's doubles hold every sum the scripts make exactly.
    pub const MAX: Cost = Cost(EXACT_LIMIT);
    /// Nothing: what a look at a budget spends.
    pub const ZERO: Cost = Cost(0);
    /// One unit: a request of the default cost.
    pub const ONE: Cost = Cost(1);

    /// `units`, if it is at most [`Cost::MAX`].
    pub const fn new(units: u64) -> Result<Cost, CostError> {
        if units <= Cost::MAX.0 {
            Ok(Cost(units))
        } else {
            Err(CostError(units))
        }
    }

    /// `units`, or [`Cost::MAX`] for anything above it: a cost no limit allows either way.
    pub const fn saturating(units: u64) -> Cost {
        if units <= Cost::MAX.0 {
            Cost(units)
        } else {
            Cost::MAX
        }
    }

    /// The number of units.
    pub const fn get(self) -> u64 {
        self.0
    }

    /// `self - other`, or nothing if `other` is more.
    pub const fn saturating_sub(self, other: Cost) -> Cost {
        Cost(self.0.saturating_sub(other.0))
    }
}

/// Every `u32` is a cost (2^32 - 1 is far below [`Cost::MAX`]): Envoy's request-level
/// `hits_addend`, and the numbers tests write.
impl From<u32> for Cost {
    fn from(units: u32) -> Cost {
        Cost(u64::from(units))
    }
}

impl fmt::Display for Cost {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cost_is_at_most_the_largest_and_above_every_capacity() {
        for units in [0, 1, 1 << 31, u64::from(u32::MAX), 1 << 50] {
            assert_eq!(Cost::new(units).map(Cost::get), Ok(units));
            assert_eq!(Cost::saturating(units).get(), units);
        }
        for units in [(1 << 50) + 1, 1 << 53, i64::MAX as u64, 1 << 63, u64::MAX] {
            assert_eq!(Cost::new(units), Err(CostError(units)));
            assert_eq!(Cost::saturating(units), Cost::MAX);
        }
        // Every capacity the parsers accept is below EXACT_LIMIT: the largest cost is over it.
        assert!(Cost::MAX.get() > EXACT_LIMIT - 1);
        assert_eq!(Cost::from(u32::MAX).get(), u64::from(u32::MAX));
        assert_eq!(Cost::ONE.saturating_sub(Cost::MAX), Cost::ZERO);
    }
}
