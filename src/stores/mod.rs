//! The stores that remember clients, behind one trait ([`Store`]), and the gate's handle on
//! the configured one ([`Limiter`]): the [`MemoryStore`] (sharded, bounded, saved to
//! `STATE_FILE` by `state_file`), and a store that can fail ([`Remote`]: the
//! [`RedisStore`], single, cluster or Sentinel) behind the [`Guard`] (circuit breakers, fail
//! modes, the denial cache). The guard is generic over the remote, so its logic is tested
//! against a store that fails on command. A store sees a rule, a key and a cost, never a
//! request.

pub mod denials;
pub mod guard;
pub mod lease;
pub mod limiter;
pub mod memory;
pub mod redis;
pub mod redis_clock;
pub mod sentinel;
pub mod settings;
pub mod slots;
pub mod state_file;
pub mod store;

pub use guard::{Guard, GuardSettings, Remote};
pub use limiter::{Limiter, Verdict};
pub use memory::MemoryStore;
pub use redis::{RedisStore, RedisTarget, StoreError};
pub use store::{BreakerStats, Decide, Store, StoreStats};
