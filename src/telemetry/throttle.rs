//! Rate limits for the gateway's own log lines: under a flood of denials or backend failures,
//! a log must never be the thing that falls over (or fills the disk).
//!
//! Each kind of line may be written [`LINES_PER_SECOND`] times per second; the rest are
//! counted, and the next line written says how many were suppressed. Lock-free: a few
//! atomics, raced benignly (at a second's turn a line or two more may get through).

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use tokio::time::Instant;

/// Lines of one kind written per second at most.
pub(crate) const LINES_PER_SECOND: u32 = 10;

/// Admits at most [`LINES_PER_SECOND`] lines per second.
#[derive(Debug)]
pub(crate) struct LogThrottle {
    /// The clock's origin.
    started: Instant,
    /// The second (since `started`) `written` counts in.
    second: AtomicU64,
    /// Lines admitted in that second.
    written: AtomicU32,
    /// Lines refused since the last admitted one.
    suppressed: AtomicU64,
}

impl LogThrottle {
    /// A throttle with nothing written yet.
    pub(crate) fn new() -> LogThrottle {
        LogThrottle {
            started: Instant::now(),
            second: AtomicU64::new(0),
            written: AtomicU32::new(0),
            suppressed: AtomicU64::new(0),
        }
    }

    /// `Some(n)` when a line may be written now, `n` being how many were suppressed before
    /// it (to be said in the line, or just before it); `None` when it must be dropped.
    pub(crate) fn admit(&self) -> Option<u64> {
        let second = self.started.elapsed().as_secs();
        if self.second.load(Ordering::Relaxed) != second
            && self.second.swap(second, Ordering::Relaxed) != second
        {
            self.written.store(0, Ordering::Relaxed);
        }
        if self.written.fetch_add(1, Ordering::Relaxed) < LINES_PER_SECOND {
            Some(self.suppressed.swap(0, Ordering::Relaxed))
        } else {
            self.suppressed.fetch_add(1, Ordering::Relaxed);
            None
        }
    }
}

impl Default for LogThrottle {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test(start_paused = true)]
    async fn a_flood_is_cut_to_the_rate_and_the_rest_is_counted() {
        let throttle = LogThrottle::new();
        let admitted: Vec<Option<u64>> = (0..25).map(|_| throttle.admit()).collect();
        assert_eq!(
            admitted.iter().filter(|a| a.is_some()).count(),
            LINES_PER_SECOND as usize
        );
        assert!(
            admitted[..LINES_PER_SECOND as usize]
                .iter()
                .all(|a| *a == Some(0))
        );
        tokio::time::advance(Duration::from_secs(1)).await;
        // The first line of the next second reports the 15 dropped.
        assert_eq!(throttle.admit(), Some(15));
        assert_eq!(throttle.admit(), Some(0));
    }
}
