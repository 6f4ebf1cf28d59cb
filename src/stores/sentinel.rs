//! Redis Sentinel: the store's connection to whichever server the Sentinels name master.
//!
//! The Sentinel protocol is redis-rs's ([`redis::sentinel::SentinelClient`]): it asks the
//! Sentinels in turn (`SENTINEL MASTERS`), skips a master they flag down, and checks with
//! `ROLE` that the one named really is a master. What is ours is when to ask. One background
//! task per store asks at startup, then again
//!
//! - at once when a Sentinel publishes `+switch-master` for our master (the task stays
//!   subscribed to one Sentinel, and to the next when that one goes away): a promotion is
//!   followed as soon as the Sentinels announce it;
//! - when a call fails in a way that says the server is gone or is no longer a master (a
//!   broken connection, `READONLY`), at most every [`ASK_AGAIN_AFTER`]: a switch announced
//!   while no Sentinel was subscribed is still found;
//! - every [`REFRESH`] in any case.
//!
//! A new master gets a new [`ConnectionManager`], made as the single-server one is (lazily,
//! few retries, `REDIS_TIMEOUT_MS`), and swapped in for the next call: a decision costs what it
//! costs on a single Redis plus one atomic load. Calls still out on the old master fail or
//! time out, and the guard's breaker and fail modes deal with them as with any outage; its
//! probe's next `TIME` goes to the new master and closes the breaker.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use arc_swap::ArcSwapOption;
use futures_util::StreamExt;
use redis::aio::{ConnectionManager, ConnectionManagerConfig, PubSubStream};
use redis::sentinel::{SentinelClient, SentinelNodeConnectionInfo, SentinelServerType};
use redis::{ErrorKind, RedisConnectionInfo, RedisError, RedisResult, TlsMode};
use tokio::sync::Notify;

use crate::stores::redis_clock::RedisClock;

/// How often the Sentinels are asked even when nothing suggests a failover.
pub const REFRESH: Duration = Duration::from_secs(5);

/// The least time between two lookups prompted by failed calls: while a dead master is not
/// yet failed over, every call fails, and the Sentinels need not hear of each.
pub const ASK_AGAIN_AFTER: Duration = Duration::from_millis(100);

/// The most one lookup (or subscribing to a Sentinel) may take: it runs in the background,
/// never on a request's path, and a Sentinel that accepts no connection must not stall the
/// next one for longer.
pub const LOOKUP_TIMEOUT: Duration = Duration::from_secs(1);

/// Where to find the master: `REDIS_SENTINELS`, `REDIS_SENTINEL_MASTER` and the credentials.
pub struct SentinelSettings<'a> {
    /// `host:port` of each Sentinel.
    pub sentinels: &'a [String],
    /// The master's name as the Sentinels monitor it.
    pub master: &'a str,
    /// `REDIS_PASSWORD`: the master's (and its replicas').
    pub password: Option<&'a str>,
    /// `REDIS_SENTINEL_PASSWORD`: the Sentinels' own, when they have `requirepass`.
    pub sentinel_password: Option<&'a str>,
    /// `REDIS_TLS`: TLS to the Sentinels and to the master.
    pub tls: bool,
}

/// The master the Sentinels name, and the connection to it.
pub struct SentinelMaster {
    /// The master now, `None` until the Sentinels first name one.
    current: ArcSwapOption<Master>,
    /// Woken by a call that failed as if the master were gone.
    suspect: Arc<Notify>,
    /// True once the first lookup has ended, named a master or not.
    asked: AtomicBool,
    /// Woken when the first lookup ends: calls made at startup wait for it (within their
    /// own deadline) rather than fail.
    first_lookup: Notify,
    /// How connections to a master are made.
    config: ConnectionManagerConfig,
    /// `REDIS_TIMEOUT_MS`, for the `TIME` asked of a new master.
    timeout: Duration,
    /// The store's estimate of the Redis clock: a new master is another machine, with its
    /// own clock.
    clock: Arc<RedisClock>,
}

/// One master, as named.
struct Master {
    /// `host:port`, for log lines.
    address: String,
    manager: ConnectionManager,
    /// Its client, for connections of their own (the subscription to resets).
    client: redis::Client,
}

impl SentinelMaster {
    /// Ask the Sentinels in the background from now on. Call inside a Tokio runtime.
    pub fn start(
        settings: &SentinelSettings<'_>,
        config: ConnectionManagerConfig,
        timeout: Duration,
        clock: Arc<RedisClock>,
    ) -> RedisResult<Arc<SentinelMaster>> {
        let sentinels = sentinel_urls(settings);
        let mut node = RedisConnectionInfo::default();
        if let Some(password) = settings.password {
            node = node.set_password(password);
        }
        let mut node = SentinelNodeConnectionInfo::default().set_redis_connection_info(node);
        if settings.tls {
            node = node.set_tls_mode(TlsMode::Secure);
        }
        let client = SentinelClient::build(
            sentinels.clone(),
            settings.master,
            Some(node),
            SentinelServerType::Master,
        )?;
        let master = Arc::new(SentinelMaster {
            current: ArcSwapOption::empty(),
            suspect: Arc::new(Notify::new()),
            asked: AtomicBool::new(false),
            first_lookup: Notify::new(),
            config,
            timeout,
            clock,
        });
        tokio::spawn(follow(
            Arc::downgrade(&master),
            master.suspect.clone(),
            client,
            settings.master.to_owned(),
            sentinels,
        ));
        Ok(master)
    }

    /// Run `cmd` on the master now; a failure that says it is gone or demoted has the
    /// Sentinels asked again.
    pub async fn query<T: redis::FromRedisValue>(&self, cmd: &redis::Cmd) -> RedisResult<T> {
        let reply = match self.connection().await {
            Ok(mut connection) => cmd.query_async(&mut connection).await,
            Err(error) => Err(error),
        };
        if let Err(error) = &reply {
            self.failed(error);
        }
        reply
    }

    /// Run `pipe` on the master, as [`query`](Self::query) runs a command.
    pub async fn query_pipeline(&self, pipe: &redis::Pipeline) -> RedisResult<redis::Value> {
        let reply = match self.connection().await {
            Ok(mut connection) => pipe.query_async(&mut connection).await,
            Err(error) => Err(error),
        };
        if let Err(error) = &reply {
            self.failed(error);
        }
        reply
    }

    /// The connection to the master now. At startup, waits for the first lookup (the caller
    /// bounds the wait); after it, fails at once while no master is known.
    async fn connection(&self) -> RedisResult<ConnectionManager> {
        if let Some(master) = &*self.current.load() {
            return Ok(master.manager.clone());
        }
        let first = self.first_lookup.notified();
        if !self.asked.load(Ordering::Acquire) {
            first.await;
        }
        match &*self.current.load() {
            Some(master) => Ok(master.manager.clone()),
            // An I/O error to the guard: counted as a connection failure, as a master that
            // cannot be reached is.
            None => Err(RedisError::from((
                ErrorKind::Io,
                "no Sentinel names a master that is up",
            ))),
        }
    }

    /// The client of the master now, if one is known.
    pub fn client(&self) -> Option<redis::Client> {
        self.current.load().as_ref().map(|master| master.client.clone())
    }

    /// `error` says the master is gone or no longer one: have the Sentinels asked again.
    fn failed(&self, error: &RedisError) {
        if error.is_io_error()
            || error.is_connection_dropped()
            || error.is_connection_refusal()
            || error.code() == Some("READONLY")
        {
            self.suspect.notify_one();
        }
    }

    /// A call failed without an answer (its deadline passed): the master may be frozen or
    /// unreachable, which a lookup may tell.
    pub fn timed_out(&self) {
        self.suspect.notify_one();
    }

    /// Use the master `client` connects to, if it is not the one in use: a new connection,
    /// and the clock estimate started afresh from its `TIME`.
    async fn adopt(&self, client: redis::Client) -> RedisResult<()> {
        let address = client.get_connection_info().addr().to_string();
        let previous = self.current.load_full();
        if previous.as_ref().is_some_and(|master| master.address == address) {
            return Ok(());
        }
        let manager = ConnectionManager::new_lazy_with_config(client.clone(), self.config.clone())?;
        self.current.store(Some(Arc::new(Master {
            address: address.clone(),
            manager: manager.clone(),
            client,
        })));
        match &previous {
            Some(previous) => tracing::warn!(
                master = %address,
                previous = %previous.address,
                "redis sentinel: a new master; decisions go to it from now on"
            ),
            None => tracing::info!(master = %address, "redis sentinel: the master"),
        }
        let sent = tokio::time::Instant::now();
        let time = redis::cmd("TIME");
        if let Ok(Ok((seconds, micros))) =
            tokio::time::timeout(self.timeout, time.query_async::<(u64, u64)>(&mut manager.clone())).await
        {
            self.clock
                .reset(sent, seconds.saturating_mul(1_000_000).saturating_add(micros));
        }
        Ok(())
    }

    /// The first lookup is over: calls waiting for it go on.
    fn first_lookup_done(&self) {
        if !self.asked.swap(true, Ordering::AcqRel) {
            self.first_lookup.notify_waiters();
        }
    }
}

/// `redis://[:password@]host:port` (`rediss://` with TLS) for each Sentinel.
fn sentinel_urls(settings: &SentinelSettings<'_>) -> Vec<String> {
    let scheme = if settings.tls { "rediss" } else { "redis" };
    settings
        .sentinels
        .iter()
        .map(|sentinel| match settings.sentinel_password {
            Some(password) => format!(
                "{scheme}://:{}@{sentinel}",
                percent_encoding::utf8_percent_encode(password, percent_encoding::NON_ALPHANUMERIC)
            ),
            None => format!("{scheme}://{sentinel}"),
        })
        .collect()
}

/// Ask the Sentinels now, then whenever a switch is announced, a call fails as if the master
/// were gone, or [`REFRESH`] passes. Ends when the store is gone.
async fn follow(
    master: std::sync::Weak<SentinelMaster>,
    suspect: Arc<Notify>,
    mut client: SentinelClient,
    name: String,
    sentinels: Vec<String>,
) {
    let mut events: Option<PubSubStream> = None;
    let mut failures: u32 = 0;
    loop {
        let Some(strong) = master.upgrade() else {
            return;
        };
        // Subscribed before asking: a switch announced while the lookup runs is not missed.
        if events.is_none() {
            events = subscribe(&sentinels).await;
        }
        let lookup = tokio::time::timeout(LOOKUP_TIMEOUT, client.async_get_client()).await;
        let outcome = match lookup {
            Ok(Ok(found)) => strong.adopt(found).await,
            Ok(Err(error)) => Err(error),
            Err(_) => Err(RedisError::from((
                ErrorKind::Io,
                "the Sentinels did not answer in time",
            ))),
        };
        strong.first_lookup_done();
        drop(strong);
        match outcome {
            Ok(()) => failures = 0,
            Err(error) => {
                failures += 1;
                // The first failure, then every tenth: a master down for long is reported
                // without a line per lookup.
                if failures % 10 == 1 {
                    tracing::warn!(%error, master = %name, failures, "redis sentinel: no master found");
                } else {
                    tracing::debug!(%error, master = %name, "redis sentinel: no master found");
                }
            }
        }
        let refresh = tokio::time::sleep(REFRESH);
        tokio::pin!(refresh);
        loop {
            tokio::select! {
                event = next_event(&mut events) => match event {
                    Some(message) if switches(&message, &name) => break,
                    Some(_) => {}
                    // That Sentinel went away: subscribe to another, and ask.
                    None => {
                        events = None;
                        break;
                    }
                },
                () = suspect.notified() => {
                    tokio::time::sleep(ASK_AGAIN_AFTER).await;
                    break;
                }
                () = &mut refresh => break,
            }
        }
    }
}

/// The next message on the subscription, or never when there is none.
async fn next_event(events: &mut Option<PubSubStream>) -> Option<redis::Msg> {
    match events {
        Some(stream) => stream.next().await,
        None => std::future::pending().await,
    }
}

/// True when `message` announces a new master for `name`: `+switch-master` carries
/// `<name> <old ip> <old port> <new ip> <new port>`.
fn switches(message: &redis::Msg, name: &str) -> bool {
    message
        .get_payload::<String>()
        .is_ok_and(|payload| payload.split(' ').next() == Some(name))
}

/// `+switch-master` from the first Sentinel that takes the subscription, or `None` if none
/// does now (the lookups still follow a failover, and the next lookup tries again).
async fn subscribe(sentinels: &[String]) -> Option<PubSubStream> {
    for sentinel in sentinels {
        let attempt = async {
            let mut pubsub = redis::Client::open(sentinel.as_str())?.get_async_pubsub().await?;
            pubsub.subscribe("+switch-master").await?;
            RedisResult::Ok(pubsub.into_on_message())
        };
        if let Ok(Ok(stream)) = tokio::time::timeout(LOOKUP_TIMEOUT, attempt).await {
            return Some(stream);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sentinel_passwords_are_encoded_and_tls_is_rediss() {
        let sentinels = ["a:26379".to_owned(), "b:26379".to_owned()];
        let settings = SentinelSettings {
            sentinels: &sentinels,
            master: "mymaster",
            password: Some("master"),
            sentinel_password: Some("p@ss"),
            tls: true,
        };
        assert_eq!(
            sentinel_urls(&settings),
            ["rediss://:p%40ss@a:26379", "rediss://:p%40ss@b:26379"]
        );
    }

    #[test]
    fn only_a_switch_of_our_master_counts() {
        let message = |payload: &str| {
            let value = redis::Value::Array(vec![
                redis::Value::BulkString(b"message".to_vec()),
                redis::Value::BulkString(b"+switch-master".to_vec()),
                redis::Value::BulkString(payload.as_bytes().to_vec()),
            ]);
            redis::Msg::from_owned_value(value).unwrap()
        };
        assert!(switches(
            &message("mymaster 10.0.0.1 6379 10.0.0.2 6379"),
            "mymaster"
        ));
        assert!(!switches(
            &message("mymaster2 10.0.0.1 6379 10.0.0.2 6379"),
            "mymaster"
        ));
    }
}
