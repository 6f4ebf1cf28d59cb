//! The rate-limiting algorithms, one file each. Every algorithm is a pure function of
//! (stored state, now, parameters, cost) returning a [`Decision`](crate::limit::Decision) and
//! the state to store, so the in-memory store, the Redis Lua scripts and the tests share one
//! definition. Time is an integer count of microseconds on whatever clock the store uses.

pub mod sliding_window;
pub mod token_bucket;

pub use sliding_window::{SlidingWindow, WindowState};
pub use token_bucket::TokenBucket;
