//! Classification: the compiled rule table and what it reads of a request. A request head
//! goes in, a [`Match`] comes out (rule, client key, cost, mode): [`RuleTable::classify`]
//! (`table`), the client keys (`key`), per-client overrides and tiers (`overrides`), path
//! patterns (`pattern`), each rule's fail mode (`fail_mode`). Nothing here decides or
//! remembers anything: that is `algorithms` and `stores`.

pub mod fail_mode;
pub mod key;
pub mod overrides;
pub mod pattern;
pub mod spec;
pub mod table;

pub use fail_mode::FailMode;
pub use key::{ClientIp, ClientKey, Digest, KeyBy, KeyHasher, Source};
pub use spec::{Matching, RouteSpec, RuleSpec, TableSpec};
pub use table::{Count, Match, Mode, RequestHead, Rule, RuleTable};
