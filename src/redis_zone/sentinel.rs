//! Sentinel zones: asking the sentinels where the master is, and hearing
//! their announcements that it moved (the zone's connection follows it:
//! `zone_conn::watch_master`).

use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::{IntoConnectionInfo, TlsCertificates};

use super::conn::client;
use super::RedisError;

/// How long one sentinel may take to answer.
const SENTINEL_TIMEOUT: Duration = Duration::from_millis(500);
/// How often a sentinel zone checks that its connection still goes to the master.
pub const MASTER_CHECK: Duration = Duration::from_millis(500);

/// Asks the sentinels, in turn, where the master is.
pub async fn sentinel_master(
    sentinels: &[String],
    master: &str,
    tls: &Option<TlsCertificates>,
) -> Result<(String, u16), RedisError> {
    Sentinels::default().master(sentinels, master, tls).await
}

/// A connection to the sentinel that answered last, kept for the next
/// question (the watcher asks every [`MASTER_CHECK`]).
#[derive(Default)]
pub struct Sentinels {
    conn: Option<MultiplexedConnection>,
}

impl Sentinels {
    /// The master's address: asked of the kept sentinel, else of each
    /// sentinel in turn (the first that answers is kept).
    pub async fn master(
        &mut self,
        sentinels: &[String],
        master: &str,
        tls: &Option<TlsCertificates>,
    ) -> Result<(String, u16), RedisError> {
        let ask = |mut c: MultiplexedConnection| async move {
            let cmd = redis::cmd("SENTINEL").arg("get-master-addr-by-name").arg(master).to_owned();
            let addr = cmd.query_async::<Option<(String, u16)>>(&mut c).await;
            (c, addr)
        };
        if let Some(c) = self.conn.take() {
            if let Ok((c, Ok(Some(addr)))) = tokio::time::timeout(SENTINEL_TIMEOUT, ask(c)).await {
                self.conn = Some(c);
                return Ok(addr);
            }
        }
        let mut last = format!("no sentinel answered for master \"{master}\"");
        for s in sentinels {
            let open = async {
                let c = client(s.as_str().into_connection_info()?, tls)?.get_multiplexed_async_connection().await?;
                Ok::<_, redis::RedisError>(ask(c).await)
            };
            match tokio::time::timeout(SENTINEL_TIMEOUT, open).await {
                Ok(Ok((c, Ok(Some(addr))))) => {
                    self.conn = Some(c);
                    return Ok(addr);
                }
                Ok(Ok((_, Ok(None)))) => last = format!("sentinel {s} does not know master \"{master}\""),
                Ok(Ok((_, Err(e)))) | Ok(Err(e)) => last = format!("sentinel {s}: {e}"),
                Err(_) => last = format!("sentinel {s} timed out"),
            }
        }
        Err(RedisError::Io(last))
    }
}

/// Subscribes to `+switch-master` on the first sentinel that answers.
pub async fn subscribe_switches(sentinels: &[String], tls: &Option<TlsCertificates>) -> Option<redis::aio::PubSub> {
    for s in sentinels {
        let sub = async {
            let mut ps = client(s.as_str().into_connection_info()?, tls)?.get_async_pubsub().await?;
            ps.subscribe("+switch-master").await?;
            Ok::<_, redis::RedisError>(ps)
        };
        if let Ok(Ok(ps)) = tokio::time::timeout(SENTINEL_TIMEOUT, sub).await {
            return Some(ps);
        }
    }
    None
}
