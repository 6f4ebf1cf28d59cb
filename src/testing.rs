//! Test hooks, behind the `testing` feature: the parsers and pieces the fuzzers
//! (`tests/fuzz.rs`, `fuzz/`) and the integration tests drive directly, re-exported from the
//! modules that own them. Not part of the library's interface: nothing here is kept stable.

pub use crate::admin::MAX_ADMIN_CONNECTIONS;
pub use crate::app::rls_service;
pub use crate::decide::{check, forward_auth};
pub use crate::gate::{Gate, identity, path};
pub use crate::metrics::{METRIC_NAMES, Metrics};
pub use crate::proxy::headers;
pub use crate::rls::config::DescriptorTable;
pub use crate::rls::{RateLimitService, matcher, proto};
pub use crate::server::proxy_protocol;
