//! Sentinel zones: asking the sentinels where the master is, and hearing
//! their announcements that it moved (the zone's connection follows it:
//! `zone_conn::watch_master`).

use std::sync::Arc;
use std::time::Duration;

use ngx::async_::Task;
use redis::aio::MultiplexedConnection;
use redis::{IntoConnectionInfo, ProtocolVersion, PushInfo};
use rustls::ClientConfig;
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};

use super::open::{data_config, open, Opened};
use super::timers::timeout;
use super::RedisError;

/// How long one sentinel may take to answer.
const SENTINEL_TIMEOUT: Duration = Duration::from_millis(500);
/// How often a sentinel zone checks that its connection still goes to the master.
pub const MASTER_CHECK: Duration = Duration::from_millis(500);

/// Asks the sentinels, in turn, where the master is.
pub async fn sentinel_master(
    sentinels: &[String],
    master: &str,
    tls: Option<&Arc<ClientConfig>>,
) -> Result<(String, u16), RedisError> {
    Sentinels::default().master(sentinels, master, tls).await
}

/// A connection to the sentinel that answered last, kept for the next
/// question (the watcher asks every [`MASTER_CHECK`]).
#[derive(Default)]
pub struct Sentinels {
    conn: Option<(MultiplexedConnection, Task<()>)>,
}

impl Sentinels {
    /// The master's address: asked of the kept sentinel, else of each
    /// sentinel in turn (the first that answers is kept).
    pub async fn master(
        &mut self,
        sentinels: &[String],
        master: &str,
        tls: Option<&Arc<ClientConfig>>,
    ) -> Result<(String, u16), RedisError> {
        let ask = |mut c: MultiplexedConnection| async move {
            let cmd = redis::cmd("SENTINEL").arg("get-master-addr-by-name").arg(master).to_owned();
            let addr = cmd.query_async::<Option<(String, u16)>>(&mut c).await;
            (c, addr)
        };
        if let Some((c, driver)) = self.conn.take() {
            if let Ok((c, Ok(Some(addr)))) = timeout(SENTINEL_TIMEOUT, ask(c)).await {
                self.conn = Some((c, driver));
                return Ok(addr);
            }
        }
        let mut last = format!("no sentinel answered for master \"{master}\"");
        for s in sentinels {
            let opened = async {
                let info = s.as_str().into_connection_info().map_err(|e| RedisError::Io(e.to_string()))?;
                let Opened { conn, driver } = open(&info, tls, data_config()).await?;
                let (c, addr) = ask(conn).await;
                Ok::<_, RedisError>((c, driver, addr))
            };
            match timeout(SENTINEL_TIMEOUT, opened).await {
                Ok(Ok((c, driver, Ok(Some(addr))))) => {
                    self.conn = Some((c, driver));
                    return Ok(addr);
                }
                Ok(Ok((_, _, Ok(None)))) => last = format!("sentinel {s} does not know master \"{master}\""),
                Ok(Ok((_, _, Err(e)))) => last = format!("sentinel {s}: {e}"),
                Ok(Err(e)) => last = format!("sentinel {s}: {e}"),
                Err(_) => last = format!("sentinel {s} timed out"),
            }
        }
        Err(RedisError::Io(last))
    }
}

/// A subscription to a sentinel's `+switch-master` announcements (RESP3
/// pushes on an ordinary connection: the `redis` crate's pub/sub connection
/// would need a tokio runtime).
pub struct Switches {
    pub pushes: UnboundedReceiver<PushInfo>,
    _conn: MultiplexedConnection,
    _driver: Task<()>,
}

/// Subscribes to `+switch-master` on the first sentinel that answers.
pub async fn subscribe_switches(sentinels: &[String], tls: Option<&Arc<ClientConfig>>) -> Option<Switches> {
    for s in sentinels {
        let sub = async {
            let info = s.as_str().into_connection_info().map_err(|e| RedisError::Io(e.to_string()))?;
            let settings = info.redis_settings().clone().set_protocol(ProtocolVersion::RESP3);
            let info = info.set_redis_settings(settings);
            let (tx, pushes) = unbounded_channel();
            let Opened { mut conn, driver } = open(&info, tls, data_config().set_push_sender(tx)).await?;
            conn.subscribe("+switch-master").await.map_err(|e| RedisError::Io(e.to_string()))?;
            Ok::<_, RedisError>(Switches { pushes, _conn: conn, _driver: driver })
        };
        if let Ok(Ok(sw)) = timeout(SENTINEL_TIMEOUT, sub).await {
            return Some(sw);
        }
    }
    None
}
