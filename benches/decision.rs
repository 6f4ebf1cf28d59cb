//! The in-memory decision hot path: `MemoryStore::check_at` for one hot client, for a million
//! clients, and with two threads contending on one store, beside the floor of any design for
//! two threads (the token bucket's state alone in an atomic word, see [`CasFloor`]); plus heap
//! allocations per decision.
//!
//! The clock is synthetic (one microsecond per decision, passed to `check_at`), so the numbers
//! measure the store and the algorithm, not the cost of reading a clock. Budgets are large
//! enough that every decision is allowed and writes new state: the more expensive branch.
//!
//! The single-thread groups (`hot_key`, `million_keys`) time the benchmarking thread's own CPU
//! time (`CLOCK_THREAD_CPUTIME_ID`), not wall time: on a machine shared with other work, a
//! thread waiting for a core would otherwise be billed for it, and the numbers would move with
//! the load average. The `contended` group needs wall time (waiting for a lock is the point),
//! so it is only as quiet as the machine.
//!
//! Run with `cargo bench --bench decision`; results and how to read them are in
//! `docs/benchmarks.md`.

use std::alloc::{GlobalAlloc, Layout, System};
use std::hash::BuildHasher;
use std::hint::black_box;
use std::net::{IpAddr, Ipv4Addr};
use std::num::NonZeroUsize;
use std::sync::Barrier;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput};
use hashbrown::DefaultHashBuilder;
use tollgate::algorithms::{Algorithm, SlidingWindow, TokenBucket};
use tollgate::algorithms::{Cost, Policy};
use tollgate::rules::{ClientKey, Rule};
use tollgate::stores::MemoryStore;

/// Heap allocations (alloc, alloc_zeroed, realloc) made by the whole process so far.
static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

/// `System`, counting every allocation, so the bench can say how many a decision makes.
struct CountingAllocator;

// SAFETY: every method forwards its arguments unchanged to `System`, which upholds the
// `GlobalAlloc` contract; the only addition is a relaxed atomic increment, which neither
// allocates nor touches the memory being handed out.
unsafe impl GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: the caller upholds `alloc`'s contract (non-zero size), forwarded as is.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: as for `alloc`.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: `ptr` was allocated by this allocator (hence by `System`) with `layout`,
        // as the caller guarantees.
        unsafe { System.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` was allocated by this allocator (hence by `System`) with `layout`.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: CountingAllocator = CountingAllocator;

/// "One million" clients: 2^20, so a multiplicative stride walks them all in a scattered order.
const MANY_KEYS: u64 = 1 << 20;

/// An odd stride: `i * STRIDE mod 2^20` visits every key once per lap, far from its neighbours
/// in insertion (and so allocation) order.
const STRIDE: u64 = 0x9E37_79B1;

/// Clients each thread walks in the "distinct keys" contention case.
const KEYS_PER_THREAD: u64 = 1 << 10;

fn token_bucket() -> Rule {
    // A billion tokens refilled at one per microsecond: with the clock advancing one
    // microsecond per decision, every request is allowed and the state is rewritten.
    Rule::new(
        0,
        "general",
        Policy::TokenBucket(TokenBucket {
            capacity: 1_000_000_000,
            interval_us: 1,
        }),
    )
}

fn sliding_window() -> Rule {
    Rule::new(
        0,
        "general",
        Policy::SlidingWindow(SlidingWindow {
            limit: 1_000_000_000,
            window_ms: 60_000,
        }),
    )
}

fn client(n: u64) -> ClientKey {
    // 10.0.0.0/8 and up: plain IPv4 clients, as most deployments see.
    IpAddr::V4(Ipv4Addr::from(0x0A00_0000_u32.wrapping_add(n as u32))).into()
}

/// A store for `rule` alone (its id is 0) holding at most `max_keys` clients.
fn new_store(max_keys: u64, rule: &Rule) -> MemoryStore {
    MemoryStore::new(
        NonZeroUsize::new(max_keys as usize).expect("max_keys > 0"),
        std::slice::from_ref(rule),
    )
}

/// A store holding `MANY_KEYS` clients under `rule`, inserted at times `0..MANY_KEYS`.
/// `MAX_KEYS` is twice that, so uneven sharding never evicts one of them.
fn million_store(rule: &Rule) -> MemoryStore {
    let store = new_store(2 * MANY_KEYS, rule);
    for n in 0..MANY_KEYS {
        store.check_at(rule, client(n), Cost::ONE, n);
    }
    assert_eq!(store.len() as u64, MANY_KEYS, "every client is held");
    store
}

/// The calling thread's CPU time.
fn thread_cpu_time() -> Duration {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `now` is a valid, writable `timespec` for the call's duration, and
    // CLOCK_THREAD_CPUTIME_ID is a clock Linux and macOS provide.
    let status = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut now) };
    assert_eq!(status, 0, "clock_gettime(CLOCK_THREAD_CPUTIME_ID)");
    Duration::new(now.tv_sec as u64, now.tv_nsec as u32)
}

/// The CPU time this thread spends running `work`.
fn on_cpu(work: impl FnOnce()) -> Duration {
    let start = thread_cpu_time();
    work();
    thread_cpu_time().saturating_sub(start)
}

fn hot_key(c: &mut Criterion) {
    let mut group = c.benchmark_group("hot_key");
    group.throughput(Throughput::Elements(1));
    for (name, rule) in [
        ("token_bucket", token_bucket()),
        ("sliding_window", sliding_window()),
    ] {
        let store = new_store(100_000, &rule);
        let ip = client(1);
        let mut now = 0u64;
        group.bench_function(name, |b| {
            b.iter_custom(|iters| {
                on_cpu(|| {
                    for _ in 0..iters {
                        now += 1;
                        black_box(store.check_at(black_box(&rule), black_box(ip), Cost::ONE, now));
                    }
                })
            })
        });
    }
    group.finish();
}

fn million_keys(c: &mut Criterion) {
    let mut group = c.benchmark_group("million_keys");
    group.throughput(Throughput::Elements(1));
    for (name, rule) in [
        ("token_bucket", token_bucket()),
        ("sliding_window", sliding_window()),
    ] {
        let store = million_store(&rule);
        let mut i = 0u64;
        let mut now = MANY_KEYS;
        group.bench_function(name, |b| {
            b.iter_custom(|iters| {
                on_cpu(|| {
                    for _ in 0..iters {
                        i += 1;
                        now += 1;
                        let ip = client(i.wrapping_mul(STRIDE) & (MANY_KEYS - 1));
                        black_box(store.check_at(black_box(&rule), ip, Cost::ONE, now));
                    }
                })
            })
        });
        // Free the million entries before the next store is built.
        drop(store);
    }
    group.finish();
}

/// Runs `iters` decisions on each of `threads` threads at once; returns the longest thread's
/// time, i.e. the wall time of the whole batch. Thread `t` makes its `i`-th decision with
/// `decide(t, i)`.
fn run_threads(threads: usize, iters: u64, decide: impl Fn(usize, u64) + Sync) -> Duration {
    let start = Barrier::new(threads);
    std::thread::scope(|scope| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let (start, decide) = (&start, &decide);
                scope.spawn(move || {
                    start.wait();
                    let began = Instant::now();
                    for i in 0..iters {
                        decide(t, i);
                    }
                    began.elapsed()
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|handle| handle.join().expect("bench thread panicked"))
            .max()
            .unwrap_or_default()
    })
}

/// The floor of the `contended` cases: what issue 8 (performance) proposes for a hot key (the token
/// bucket's state in one atomic word, updated by compare-and-swap, no lock) with nothing
/// else of a store. Each client's state is a word of its own, found by its number rather
/// than looked up, and the key is hashed as the store hashes it, so each decision does the
/// store's unavoidable work and shares nothing but the state's cache line. Two threads on one
/// client here show what passing that line between the cores costs on this machine, the part
/// no store design can take away; two on distinct clients show what two cores give when
/// nothing is shared.
struct CasFloor {
    bucket: TokenBucket,
    hasher: DefaultHashBuilder,
    /// Theoretical arrival times, by client number.
    states: Box<[AtomicU64]>,
}

impl CasFloor {
    fn new(bucket: TokenBucket, clients: usize) -> CasFloor {
        CasFloor {
            bucket,
            hasher: DefaultHashBuilder::default(),
            states: (0..clients).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    /// Decide one request of client `n` at `now_us`.
    fn check(&self, n: u64, now_us: u64) -> bool {
        black_box(self.hasher.hash_one((0u16, client(n))));
        let state = &self.states[n as usize];
        let mut tat = state.load(Ordering::Acquire);
        loop {
            let mut next = tat;
            let decision = self.bucket.check(&mut next, now_us, 1);
            if next == tat {
                return decision.allowed;
            }
            match state.compare_exchange_weak(tat, next, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return decision.allowed,
                Err(seen) => tat = seen,
            }
        }
    }
}

fn contended(c: &mut Criterion) {
    let mut group = c.benchmark_group("contended");
    let rule = token_bucket();
    let Policy::TokenBucket(bucket) = *rule.limits.first() else {
        unreachable!("token_bucket() is a token bucket")
    };
    for threads in [1usize, 2] {
        // Time per iteration = wall time for one decision on *each* thread, so 2 threads with
        // no contention at all would show the same time as 1 thread and twice the throughput.
        group.throughput(Throughput::Elements(threads as u64));
        // Each thread walks its own clients; in the store they meet only in shared shards.
        let own = |t: usize, i: u64| t as u64 * KEYS_PER_THREAD + (i & (KEYS_PER_THREAD - 1));

        let store = new_store(100_000, &rule);
        let mut clock = 0u64;
        group.bench_function(format!("hot_key/{threads}_threads"), |b| {
            b.iter_custom(|iters| {
                // All threads run the same clock, so one client's time barely wobbles.
                let elapsed = run_threads(threads, iters, |_, i| {
                    black_box(store.check_at(&rule, client(1), Cost::ONE, clock + i));
                });
                clock += iters;
                elapsed
            })
        });

        let store = new_store(100_000, &rule);
        for n in 0..threads as u64 * KEYS_PER_THREAD {
            store.check_at(&rule, client(n), Cost::ONE, 0);
        }
        let mut clock = 1u64;
        group.bench_function(format!("distinct_keys/{threads}_threads"), |b| {
            b.iter_custom(|iters| {
                let elapsed = run_threads(threads, iters, |t, i| {
                    black_box(store.check_at(&rule, client(own(t, i)), Cost::ONE, clock + i));
                });
                clock += iters;
                elapsed
            })
        });

        let floor = CasFloor::new(bucket, 2 * KEYS_PER_THREAD as usize);
        let mut clock = 0u64;
        group.bench_function(format!("floor_cas_hot_key/{threads}_threads"), |b| {
            b.iter_custom(|iters| {
                let elapsed = run_threads(threads, iters, |_, i| {
                    black_box(floor.check(1, clock + i));
                });
                clock += iters;
                elapsed
            })
        });
        group.bench_function(format!("floor_cas_distinct_keys/{threads}_threads"), |b| {
            b.iter_custom(|iters| {
                let elapsed = run_threads(threads, iters, |t, i| {
                    black_box(floor.check(own(t, i), clock + i));
                });
                clock += iters;
                elapsed
            })
        });
    }
    group.finish();
}

/// Allocations per decision over `n` calls of `decide(i)`, after one warm-up call.
fn allocations_per_decision(n: u64, mut decide: impl FnMut(u64)) -> f64 {
    decide(0);
    let before = ALLOCATIONS.load(Ordering::Relaxed);
    for i in 1..=n {
        decide(i);
    }
    (ALLOCATIONS.load(Ordering::Relaxed) - before) as f64 / n as f64
}

/// Counts heap allocations per decision on each path and prints them. The hot path (a client
/// already held) must make none; a report, not an assertion, so the timings still run.
fn report_allocations() {
    const N: u64 = 1_000_000;
    let mut rows: Vec<(String, f64, bool)> = Vec::new();

    for (name, rule) in [
        ("token_bucket", token_bucket()),
        ("sliding_window", sliding_window()),
    ] {
        let hot = new_store(100_000, &rule);
        rows.push((
            format!("hot_key/{name}"),
            allocations_per_decision(N, |i| {
                black_box(hot.check_at(&rule, client(1), Cost::ONE, i));
            }),
            true,
        ));

        let many = million_store(&rule);
        rows.push((
            format!("million_keys/{name}"),
            allocations_per_decision(N, |i| {
                let ip = client(i.wrapping_mul(STRIDE) & (MANY_KEYS - 1));
                black_box(many.check_at(&rule, ip, Cost::ONE, MANY_KEYS + i));
            }),
            true,
        ));
    }

    // For comparison, not the hot path: a client seen for the first time.
    let rule = token_bucket();
    let fresh = new_store(2 * N, &rule);
    rows.push((
        "new client, store not full".into(),
        allocations_per_decision(N, |i| {
            black_box(fresh.check_at(&rule, client(i), Cost::ONE, i));
        }),
        false,
    ));
    let full = new_store(1_000, &rule);
    rows.push((
        "new client, store full (evicts)".into(),
        allocations_per_decision(N, |i| {
            black_box(full.check_at(&rule, client(i), Cost::ONE, i));
        }),
        false,
    ));

    println!("\nheap allocations per decision (over {N} decisions each, after warm-up)");
    let mut hot_path_allocates = false;
    for (label, per_decision, hot_path) in &rows {
        let verdict = match (hot_path, *per_decision == 0.0) {
            (true, true) => "ok: none on the hot path",
            (true, false) => "UNEXPECTED: the hot path allocates",
            (false, _) => "(not the hot path)",
        };
        hot_path_allocates |= *hot_path && *per_decision != 0.0;
        println!("  {label:<34} {per_decision:>8.4}  {verdict}");
    }
    if hot_path_allocates {
        println!("  WARNING: a decision for a known client allocated; see above");
    }
    println!();
}

fn main() {
    report_allocations();
    let mut criterion = Criterion::default().configure_from_args();
    hot_key(&mut criterion);
    million_keys(&mut criterion);
    contended(&mut criterion);
    criterion.final_summary();
}
