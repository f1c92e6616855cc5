//! Sentinel zones: where the master is, and following it when it moves.

use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use redis::aio::MultiplexedConnection;
use redis::{IntoConnectionInfo, TlsCertificates};

use super::conn::{client, Target, ZoneConn};
use super::RedisError;

/// How long one sentinel may take to answer.
const SENTINEL_TIMEOUT: Duration = Duration::from_millis(500);
/// How often a sentinel zone checks that its connection still goes to the master.
const MASTER_CHECK: Duration = Duration::from_millis(500);

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
struct Sentinels {
    conn: Option<MultiplexedConnection>,
}

impl Sentinels {
    /// The master's address: asked of the kept sentinel, else of each
    /// sentinel in turn (the first that answers is kept).
    async fn master(
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

/// A failover that leaves the old master running (SENTINEL FAILOVER, a
/// network split) breaks no connection: follow the sentinels'
/// `+switch-master` announcements (milliseconds after a switch), and check
/// the master's address twice a second besides, and drop a connection to a
/// former master.
pub async fn watch_master(zc: Arc<ZoneConn>) {
    let Target::Sentinel { sentinels, master, .. } = &zc.spec.target else {
        return;
    };
    let mut announcements = None;
    let mut asker = Sentinels::default();
    loop {
        if announcements.is_none() {
            announcements = subscribe_switches(sentinels, &zc.spec.tls).await;
        }
        let switched = match announcements.as_mut() {
            Some(pubsub) => {
                let mut stream = pubsub.on_message();
                tokio::select! {
                    msg = stream.next() => match msg {
                        Some(m) => m.get_payload_bytes().starts_with(format!("{master} ").as_bytes()),
                        None => {
                            drop(stream);
                            announcements = None;
                            false
                        }
                    },
                    _ = tokio::time::sleep(MASTER_CHECK) => false,
                }
            }
            None => {
                tokio::time::sleep(MASTER_CHECK).await;
                false
            }
        };
        let current = zc.state.lock().await.master.clone();
        let Some(current) = current else { continue };
        let moved = switched || asker.master(sentinels, master, &zc.spec.tls).await.is_ok_and(|now| now != current);
        if moved {
            let mut st = zc.state.lock().await;
            st.conn = None;
            st.master = None;
        }
    }
}

/// Subscribes to `+switch-master` on the first sentinel that answers.
async fn subscribe_switches(sentinels: &[String], tls: &Option<TlsCertificates>) -> Option<redis::aio::PubSub> {
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
