//! Request ids: one per request, in every log line about it, forwarded to the backend and
//! returned to the client, so a report from either side can be found in the other's logs.
//!
//! A client's (or an outer proxy's) `X-Request-Id` is kept when it is 1 to 128 visible ASCII
//! characters (RFC 9110 `VCHAR`: nothing that could split a log line or a header); otherwise
//! the gateway makes one: 32 hex digits, a random per-process prefix and a counter, unique
//! without a random draw per request.

use std::sync::atomic::{AtomicU64, Ordering};

use http::HeaderMap;
use http::header::{HeaderName, HeaderValue};

use crate::header_arena;

/// `X-Request-Id`. A constant, not a static: inserted by value, it is a few stores rather than
/// a call to clone a static's name (see `gate::identity::X_FORWARDED_FOR_NAME`).
#[allow(clippy::declare_interior_mutable_const)]
pub(crate) const X_REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// Longest client-supplied id kept.
const MAX_LEN: usize = 128;

/// Makes request ids.
#[derive(Debug)]
pub(crate) struct RequestIds {
    /// Random per process, so two replicas (or restarts) never hand out the same id: its 16
    /// hex digits, written once.
    prefix: [u8; 16],
    /// Requests numbered so far.
    counter: AtomicU64,
}

impl RequestIds {
    /// A generator with a random prefix (a fixed one if the OS has no randomness to give,
    /// which only makes ids less unique across processes).
    pub(crate) fn new() -> RequestIds {
        let mut prefix = [0u8; 16];
        hex(&mut prefix, getrandom::u64().unwrap_or(0x746f_6c6c_6761_7465));
        RequestIds {
            prefix,
            counter: AtomicU64::new(0),
        }
    }

    /// The request's own id if acceptable, else a new one.
    pub(crate) fn for_request(&self, headers: &HeaderMap) -> HeaderValue {
        let mut given = headers.get_all(&X_REQUEST_ID).iter();
        match (given.next(), given.next()) {
            (Some(id), None) if is_acceptable(id.as_bytes()) => id.clone(),
            _ => self.generate(),
        }
    }

    /// A new id (for a request that sent no `X-Request-Id`).
    pub(crate) fn generate(&self) -> HeaderValue {
        let n = self.counter.fetch_add(1, Ordering::Relaxed);
        // Written by hand rather than with `format!`: this runs on every request.
        let mut id = [0u8; 32];
        id[..16].copy_from_slice(&self.prefix);
        hex(&mut id[16..], n);
        // 32 hex digits are always a valid header value. Cut from the thread's header buffer:
        // no allocation, and the clone the backend gets none either.
        header_arena::copy(&id).unwrap_or_else(|| HeaderValue::from_static("0"))
    }
}

impl Default for RequestIds {
    fn default() -> Self {
        Self::new()
    }
}

/// `value` as 16 lower-case hex digits into `out`.
fn hex(out: &mut [u8], value: u64) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    for (i, digit) in out.iter_mut().enumerate() {
        *digit = DIGITS[((value >> (60 - 4 * i)) & 0xf) as usize];
    }
}

fn is_acceptable(id: &[u8]) -> bool {
    (1..=MAX_LEN).contains(&id.len()) && id.iter().all(|b| b.is_ascii_graphic())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id_for(values: &[&[u8]]) -> String {
        let mut headers = HeaderMap::new();
        for value in values {
            headers.append(X_REQUEST_ID, HeaderValue::from_bytes(value).unwrap());
        }
        RequestIds::new()
            .for_request(&headers)
            .to_str()
            .unwrap()
            .to_owned()
    }

    #[test]
    fn a_sane_id_is_kept_anything_else_is_replaced() {
        assert_eq!(id_for(&[b"abc-123"]), "abc-123");
        assert_eq!(id_for(&[&[b'x'; 128]]), "x".repeat(128));
        for bad in [&[b'x'; 129][..], b"has space", b"tab\there", b"caf\xc3\xa9"] {
            let id = id_for(&[bad]);
            assert_eq!(id.len(), 32, "{bad:?} -> {id}");
            assert!(id.bytes().all(|b| b.is_ascii_hexdigit()));
        }
        assert_eq!(id_for(&[b"one", b"two"]).len(), 32, "two ids are no id");
        assert_eq!(id_for(&[]).len(), 32);
    }

    #[test]
    fn hex_digits_are_the_value() {
        let mut out = [0u8; 16];
        hex(&mut out, 0x0123_4567_89ab_cdef);
        assert_eq!(&out, b"0123456789abcdef");
        hex(&mut out, 42);
        assert_eq!(&out, b"000000000000002a");
    }

    #[test]
    fn generated_ids_are_unique() {
        let ids = RequestIds::new();
        let headers = HeaderMap::new();
        let a = ids.for_request(&headers);
        let b = ids.for_request(&headers);
        assert_ne!(a, b);
    }
}
