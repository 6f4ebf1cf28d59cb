//! Header values the gateway writes on every request (the rate-limit numbers, the client's
//! address in the forwarding headers, a new `X-Request-Id`), written into a per-thread buffer
//! and cut off it, so that a value costs no allocation of its own.
//!
//! `HeaderValue::from_str` copies its text into an allocation of its own, and a value made
//! from a `String` whose length is not its capacity makes a second one (the shared header
//! `bytes` puts in front of such a buffer); a clone of either may allocate again. An allowed
//! request wrote about nine of them, each a `malloc` and a `free` (docs/benchmarks.md,
//! part 19). Here each thread writes its values one after the other into one 4 KiB buffer
//! (`BytesMut`) and hands out each as a frozen, reference-counted slice of it: a value is a
//! counter increment to make, clone and drop, and a new buffer is allocated once the current
//! one is full (about every hundred values), or the same one is reused when every value cut
//! from it has been dropped.
//!
//! The cost of sharing: a value kept long after its request pins its whole buffer (4 KiB);
//! the values made here live as long as one request's headers.

use std::cell::RefCell;

use bytes::{BufMut, Bytes, BytesMut};
use http::header::HeaderValue;

/// Bytes allocated for a thread's buffer at a time.
const CHUNK: usize = 4096;

thread_local! {
    /// The current thread's buffer: the unused part of its chunk.
    static BUFFER: RefCell<BytesMut> = RefCell::new(BytesMut::with_capacity(CHUNK));
}

/// The text `write` puts into the buffer it is given, as a header value; `None` if it is not
/// a valid one (a byte below 0x20 other than a tab, or 0x7f). `write` only appends.
pub(crate) fn value(write: impl FnOnce(&mut BytesMut)) -> Option<HeaderValue> {
    let text = cut(write);
    HeaderValue::from_maybe_shared(text).ok()
}

/// `text` as a header value (see [`value`]).
pub(crate) fn copy(text: &[u8]) -> Option<HeaderValue> {
    value(|buffer| buffer.put_slice(text))
}

/// What `write` appended, cut off the thread's buffer. Outside a thread that can keep one
/// (during its destruction), a buffer of its own.
fn cut(write: impl FnOnce(&mut BytesMut)) -> Bytes {
    let mut write = Some(write);
    let shared = BUFFER.try_with(|buffer| {
        let mut buffer = buffer.borrow_mut();
        // Room for the usual value: a full buffer is swapped for a new one (or reused whole,
        // if nothing cut from it is still alive) rather than grown a few bytes at a time.
        if buffer.capacity() < 256 {
            buffer.reserve(CHUNK);
        }
        if let Some(write) = write.take() {
            write(&mut buffer);
        }
        buffer.split().freeze()
    });
    match (shared, write) {
        (Ok(bytes), _) => bytes,
        (Err(_), Some(write)) => {
            let mut own = BytesMut::new();
            write(&mut own);
            own.freeze()
        }
        (Err(_), None) => Bytes::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_what_was_written_and_stay_so() {
        let values: Vec<HeaderValue> = (0..2_000u32)
            .map(|i| copy(i.to_string().as_bytes()).unwrap())
            .collect();
        for (i, value) in values.iter().enumerate() {
            assert_eq!(value, i.to_string().as_str());
        }
        let clone = values[7].clone();
        drop(values);
        assert_eq!(clone, "7");
    }

    #[test]
    fn a_value_longer_than_a_chunk_is_whole() {
        let long = "x".repeat(3 * CHUNK);
        assert_eq!(copy(long.as_bytes()).unwrap(), long.as_str());
        assert_eq!(copy(b"after").unwrap(), "after");
    }

    #[test]
    fn pieces_are_one_value_and_invalid_text_is_none() {
        let value = value(|buffer| {
            buffer.put_slice(b"for=");
            buffer.put_slice(b"192.0.2.1");
        });
        assert_eq!(value.unwrap(), "for=192.0.2.1");
        assert!(copy(b"line\nbreak").is_none());
        assert_eq!(copy(b"").unwrap(), "");
    }
}
