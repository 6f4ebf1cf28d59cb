//! The floor a Redis decision is measured against: the fixed window as envoyproxy/ratelimit
//! runs it, `INCRBY key 1` and `PEXPIRE key 60000 NX` pipelined, one round trip per decision,
//! on one multiplexed connection as tollgate's store uses (`scripts/redis_instructions_per_decision.sh pair`,
//! `scripts/redis_cpu_at_rate.sh pair`).
//!
//! usage: `REDIS_URL=redis://127.0.0.1:6379 redis_pair N [cold|hot] [RATE]` (8 callers at once;
//! cold: a new key per decision, hot: one key). With `REDIS_CLUSTER_NODES=host:port,...` it
//! speaks to a Redis Cluster instead (the pair's two commands share one key, so one slot: one
//! master each time, as a decision of tollgate's does). With RATE (decisions a second), the
//! callers together start that many a second instead of as many as they can.

use std::time::Duration;

use redis::AsyncConnectionConfig;
use redis::aio::ConnectionLike;
use redis::cluster::ClusterClient;

const CALLERS: u64 = 8;
/// redis-rs gives up on an answer after 500 ms by default; a loaded machine (or redis-server
/// under valgrind) may take longer, and a floor that fails measures nothing.
const PATIENCE: Duration = Duration::from_secs(30);

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    const USAGE: &str = "usage: redis_pair N [cold|hot] [RATE]";
    let mut args = std::env::args().skip(1);
    let total: u64 = args.next().ok_or(USAGE)?.parse()?;
    let cold = match args.next().as_deref() {
        None | Some("cold") => true,
        Some("hot") => false,
        Some(other) => return Err(format!("{USAGE}: cold or hot, not {other}").into()),
    };
    // Each caller starts one decision every CALLERS / RATE seconds.
    let period = match args.next() {
        None => None,
        Some(rate) => {
            let rate: f64 = rate.parse()?;
            if !(rate.is_finite() && rate > 0.0 && rate <= 1e7) {
                return Err(format!("{USAGE}: RATE is a number of decisions a second, 0 to 10^7").into());
            }
            Some(Duration::from_secs_f64(CALLERS as f64 / rate))
        }
    };
    match std::env::var("REDIS_CLUSTER_NODES") {
        Ok(nodes) => {
            let nodes = nodes.split(',').map(|node| format!("redis://{}", node.trim()));
            let connection = ClusterClient::builder(nodes)
                .connection_timeout(PATIENCE)
                .response_timeout(PATIENCE)
                .build()?
                .get_async_connection()
                .await?;
            run(connection, total, cold, period).await
        }
        Err(_) => {
            let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
            let config = AsyncConnectionConfig::new()
                .set_connection_timeout(Some(PATIENCE))
                .set_response_timeout(Some(PATIENCE));
            let connection = redis::Client::open(url)?
                .get_multiplexed_async_connection_with_config(&config)
                .await?;
            run(connection, total, cold, period).await
        }
    }
}

/// `total` decisions from `CALLERS` callers sharing `connection`, each at its own pace.
async fn run<C>(
    connection: C,
    total: u64,
    cold: bool,
    period: Option<Duration>,
) -> Result<(), Box<dyn std::error::Error>>
where
    C: ConnectionLike + Clone + Send + 'static,
{
    let start = tokio::time::Instant::now();
    let callers = (0..CALLERS).map(|caller| {
        let mut connection = connection.clone();
        tokio::spawn(async move {
            // Paced callers start a period apart from one another, staggered over it.
            let mut pace = period.map(|period| {
                let offset = period.mul_f64(caller as f64 / CALLERS as f64);
                let mut pace = tokio::time::interval_at(start + offset, period);
                pace.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
                pace
            });
            let mut n = caller;
            while n < total {
                if let Some(pace) = pace.as_mut() {
                    pace.tick().await;
                }
                let key = if cold {
                    format!("pair:{{{n}}}")
                } else {
                    "pair:{hot}".to_owned()
                };
                let (_count, _set): (u64, u64) = redis::pipe()
                    .cmd("INCRBY")
                    .arg(&key)
                    .arg(1)
                    .cmd("PEXPIRE")
                    .arg(&key)
                    .arg(60_000)
                    .arg("NX")
                    .query_async(&mut connection)
                    .await?;
                n += CALLERS;
            }
            Ok::<_, redis::RedisError>(())
        })
    });
    for caller in callers.collect::<Vec<_>>() {
        caller.await??;
    }
    Ok(())
}
