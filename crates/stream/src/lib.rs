//! Redis Streams: the dispatch channel between the outbox and workers.
//!
//! Streams are named `<prefix>tasks:<queue>.<shard>`; the shard count lives at
//! `<prefix>stream_shards`, published by coordinators and read by workers.
//! One consumer group per stream. Redis holds no truth: losing a stream loses
//! messages, never runs (the coordinators' sweeps re-dispatch from PostgreSQL).

#![cfg_attr(not(test), deny(clippy::unwrap_used))]
#![deny(clippy::dbg_macro, clippy::todo, clippy::print_stderr)]
#![forbid(unsafe_code)]

use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig, MultiplexedConnection};
use redis::streams::{StreamAutoClaimOptions, StreamAutoClaimReply, StreamReadOptions, StreamReadReply};
use redis::{AsyncCommands, AsyncConnectionConfig, Value};

/// The consumer group every worker joins.
pub const GROUP: &str = "composer-workers";
/// The message field that carries the dispatch JSON.
pub const FIELD: &str = "task";

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("redis: {0}")]
    Redis(#[from] redis::RedisError),
    #[error("invalid message {id} on {stream}: {reason}")]
    BadMessage { stream: String, id: String, reason: String },
    #[error("Redis CA file {0}")]
    Tls(String),
}

impl Error {
    /// The stream's consumer group is missing (Redis restarted without
    /// persistence, or the stream was deleted): create it and read again.
    pub fn is_no_group(&self) -> bool {
        matches!(self, Error::Redis(e) if e.code() == Some("NOGROUP"))
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Names of keys under one prefix (tests give each their own).
#[derive(Debug, Clone)]
pub struct Keys {
    prefix: String,
}

impl Keys {
    pub fn new(prefix: impl Into<String>) -> Keys {
        Keys { prefix: prefix.into() }
    }

    /// The stream a task on `queue` goes to: the one place stream names are made.
    pub fn stream(&self, queue: &str, shard: u32) -> String {
        format!("{}tasks:{queue}.{shard}", self.prefix)
    }

    /// The queue of a stream named by [`Keys::stream`].
    pub fn queue_of<'a>(&self, stream: &'a str) -> Option<&'a str> {
        let rest = stream.strip_prefix(&self.prefix)?.strip_prefix("tasks:")?;
        rest.rsplit_once('.').map(|(queue, _)| queue)
    }

    pub fn shard_count(&self) -> String {
        format!("{}stream_shards", self.prefix)
    }
}

/// A message read from a stream.
#[derive(Debug, Clone)]
pub struct Message {
    pub stream: String,
    pub id: String,
    pub payload: String,
}

/// The shared, self-reconnecting connection: publishing, acks, metadata.
#[derive(Clone)]
pub struct Streams {
    client: redis::Client,
    conn: ConnectionManager,
    keys: Keys,
}

impl Streams {
    /// Connects, retrying in the background on loss. Fails only when the URL
    /// is invalid or Redis cannot be reached at all now.
    pub async fn connect(url: &str, keys: Keys) -> Result<Streams> {
        Streams::connect_with(url, keys, None).await
    }

    /// Like [`Streams::connect`]; a `rediss://` URL is checked against the
    /// CA in `ca_file` (PEM) instead of the system's roots.
    pub async fn connect_with(url: &str, keys: Keys, ca_file: Option<&std::path::Path>) -> Result<Streams> {
        let client = match ca_file {
            Some(path) => {
                let root_cert = std::fs::read(path).map_err(|e| Error::Tls(format!("{}: {e}", path.display())))?;
                redis::Client::build_with_tls(
                    url,
                    redis::TlsCertificates { client_tls: None, root_cert: Some(root_cert) },
                )?
            }
            None => redis::Client::open(url)?,
        };
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(Duration::from_secs(2)))
            .set_response_timeout(Some(Duration::from_secs(5)))
            .set_number_of_retries(2);
        let conn = ConnectionManager::new_with_config(client.clone(), config).await?;
        Ok(Streams { client, conn, keys })
    }

    pub fn keys(&self) -> &Keys {
        &self.keys
    }

    pub async fn ping(&self) -> Result<()> {
        let mut c = self.conn.clone();
        let _: String = redis::cmd("PING").query_async(&mut c).await?;
        Ok(())
    }

    pub async fn publish_shard_count(&self, shards: u32) -> Result<()> {
        let mut c = self.conn.clone();
        let _: () = c.set(self.keys.shard_count(), shards).await?;
        Ok(())
    }

    pub async fn shard_count(&self) -> Result<Option<u32>> {
        let mut c = self.conn.clone();
        Ok(c.get(self.keys.shard_count()).await?)
    }

    /// XADDs every `(stream, payload)` in one pipeline; all or error.
    pub async fn publish(&self, batch: &[(&str, &str)]) -> Result<()> {
        if batch.is_empty() {
            return Ok(());
        }
        let mut pipe = redis::pipe();
        for (stream, payload) in batch {
            pipe.cmd("XADD").arg(*stream).arg("*").arg(FIELD).arg(*payload).ignore();
        }
        let mut c = self.conn.clone();
        let _: () = pipe.query_async(&mut c).await?;
        Ok(())
    }

    /// Creates the group on `stream` (and the stream) if missing. Reading
    /// from `0` means a group made after messages arrived still gets them.
    pub async fn ensure_group(&self, stream: &str) -> Result<()> {
        let mut c = self.conn.clone();
        let r: redis::RedisResult<()> = c.xgroup_create_mkstream(stream, GROUP, "0").await;
        match r {
            Err(e) if e.code() == Some("BUSYGROUP") => Ok(()),
            other => Ok(other?),
        }
    }

    /// Acknowledges and deletes a handled message, so streams hold only
    /// undelivered and in-flight work.
    pub async fn ack(&self, stream: &str, id: &str) -> Result<()> {
        let mut pipe = redis::pipe();
        pipe.cmd("XACK").arg(stream).arg(GROUP).arg(id).ignore();
        pipe.cmd("XDEL").arg(stream).arg(id).ignore();
        let mut c = self.conn.clone();
        let _: () = pipe.query_async(&mut c).await?;
        Ok(())
    }

    /// Reads up to `count` new messages of one stream for consumer `name`,
    /// without blocking, on the shared connection (the task API's
    /// long-poll waits between reads instead).
    pub async fn read_now(&self, name: &str, stream: &str, count: usize) -> Result<Vec<Message>> {
        let opts = StreamReadOptions::default().group(GROUP, name).count(count);
        let mut c = self.conn.clone();
        let reply: Option<StreamReadReply> = c.xread_options(&[stream], &[">"], &opts).await?;
        let mut out = Vec::new();
        for key in reply.map(|r| r.keys).unwrap_or_default() {
            for entry in key.ids {
                out.push(to_message(&key.key, entry.id, &entry.map)?);
            }
        }
        Ok(out)
    }

    /// [`Streams::ack`] for many messages, in one pipeline.
    pub async fn ack_many(&self, messages: &[(&str, &str)]) -> Result<()> {
        if messages.is_empty() {
            return Ok(());
        }
        let mut pipe = redis::pipe();
        for (stream, id) in messages {
            pipe.cmd("XACK").arg(*stream).arg(GROUP).arg(*id).ignore();
            pipe.cmd("XDEL").arg(*stream).arg(*id).ignore();
        }
        let mut c = self.conn.clone();
        let _: () = pipe.query_async(&mut c).await?;
        Ok(())
    }

    /// Opens a dedicated connection for blocking reads: a blocking XREADGROUP
    /// must not share the multiplexed connection, whose response timeout is
    /// shorter than the block.
    pub async fn consumer(&self, name: &str, block: Duration) -> Result<Consumer> {
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(Duration::from_secs(2)))
            .set_response_timeout(Some(block + Duration::from_secs(5)));
        let conn = self.client.get_multiplexed_async_connection_with_config(&config).await?;
        Ok(Consumer { conn, name: name.to_string(), block, cursors: std::collections::HashMap::new() })
    }
}

/// One worker's reading end.
pub struct Consumer {
    conn: MultiplexedConnection,
    name: String,
    block: Duration,
    /// Where the next XAUTOCLAIM of each stream starts: a pass goes through
    /// the whole pending list before it starts over, so a message that is
    /// reclaimed and put back does not stay ahead of the rest.
    cursors: std::collections::HashMap<String, String>,
}

impl Consumer {
    /// Reads up to `count` new messages across `streams`, blocking up to the
    /// consumer's block time when there are none.
    pub async fn read(&mut self, streams: &[String], count: usize) -> Result<Vec<Message>> {
        let ids: Vec<&str> = streams.iter().map(|_| ">").collect();
        let opts =
            StreamReadOptions::default().group(GROUP, &self.name).count(count).block(self.block.as_millis() as usize);
        let reply: Option<StreamReadReply> = self.conn.xread_options(streams, &ids, &opts).await?;
        let mut out = Vec::new();
        for key in reply.map(|r| r.keys).unwrap_or_default() {
            for entry in key.ids {
                out.push(to_message(&key.key, entry.id, &entry.map)?);
            }
        }
        Ok(out)
    }

    /// Takes over messages on `stream` idle for longer than `min_idle`
    /// (their consumer died or stalled), with how often each was delivered.
    pub async fn reclaim(&mut self, stream: &str, min_idle: Duration, count: usize) -> Result<Vec<(Message, u64)>> {
        let opts = StreamAutoClaimOptions::default().count(count);
        let start = self.cursors.get(stream).map_or("0-0", String::as_str).to_string();
        let reply: StreamAutoClaimReply =
            self.conn.xautoclaim_options(stream, GROUP, &self.name, min_idle.as_millis() as u64, start, opts).await?;
        self.cursors.insert(stream.to_string(), reply.next_stream_id.clone());
        if reply.claimed.is_empty() {
            return Ok(Vec::new());
        }
        // XAUTOCLAIM does not report delivery counts: ask XPENDING for them.
        let first = &reply.claimed[0].id;
        let last = &reply.claimed[reply.claimed.len() - 1].id;
        let pending: Value = redis::cmd("XPENDING")
            .arg(stream)
            .arg(GROUP)
            .arg(first)
            .arg(last)
            .arg(reply.claimed.len())
            .arg(&self.name)
            .query_async(&mut self.conn)
            .await?;
        let counts = delivery_counts(&pending);
        let mut out = Vec::new();
        for entry in reply.claimed {
            let deliveries = counts.iter().find(|(id, _)| *id == entry.id).map(|(_, n)| *n).unwrap_or(1);
            out.push((to_message(stream, entry.id, &entry.map)?, deliveries));
        }
        Ok(out)
    }
}

fn to_message(stream: &str, id: String, map: &std::collections::HashMap<String, Value>) -> Result<Message> {
    let payload = match map.get(FIELD) {
        Some(Value::BulkString(b)) => String::from_utf8(b.clone()).map_err(|_| Error::BadMessage {
            stream: stream.to_string(),
            id: id.clone(),
            reason: "payload is not UTF-8".into(),
        })?,
        Some(Value::SimpleString(s)) => s.clone(),
        _ => return Err(Error::BadMessage { stream: stream.to_string(), id, reason: format!("no {FIELD:?} field") }),
    };
    Ok(Message { stream: stream.to_string(), id, payload })
}

/// Parses XPENDING's extended form: `[[id, consumer, idle, deliveries], …]`.
fn delivery_counts(v: &Value) -> Vec<(String, u64)> {
    let Value::Array(items) = v else {
        return Vec::new();
    };
    items
        .iter()
        .filter_map(|item| match item {
            Value::Array(f) if f.len() >= 4 => {
                let id = match &f[0] {
                    Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
                    Value::SimpleString(s) => s.clone(),
                    _ => return None,
                };
                let n = match &f[3] {
                    Value::Int(n) => *n as u64,
                    _ => return None,
                };
                Some((id, n))
            }
            _ => None,
        })
        .collect()
}
