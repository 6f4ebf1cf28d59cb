//! The floor a Redis decision is measured against: the fixed window as envoyproxy/ratelimit
//! runs it, `INCRBY key 1` and `PEXPIRE key 60000 NX` pipelined, one round trip per decision,
//! on one multiplexed connection as tollgate's store uses (`scripts/redis_instructions_per_decision.sh pair`).
//!
//! usage: `REDIS_URL=redis://127.0.0.1:6379 redis_pair N [cold|hot]` (8 callers at once; cold: a
//! new key per decision, hot: one key).

use redis::aio::MultiplexedConnection;

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let total: u64 = args.next().ok_or("usage: redis_pair N [cold|hot]")?.parse()?;
    let cold = args.next().as_deref() != Some("hot");
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    let connection = redis::Client::open(url)?
        .get_multiplexed_async_connection()
        .await?;
    const CALLERS: u64 = 8;
    let callers = (0..CALLERS).map(|caller| {
        let mut connection: MultiplexedConnection = connection.clone();
        tokio::spawn(async move {
            let mut n = caller;
            while n < total {
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
