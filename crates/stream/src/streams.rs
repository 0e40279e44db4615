//! The handle every coordinator shares: one self-reconnecting connection
//! with its keys and marks, what it knows of shards and epochs, and how a
//! batch of commands is sent to one server or across a cluster's nodes.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use redis::AsyncCommands;

use crate::conn::Conn;
use crate::error::Result;
use crate::keys::Keys;
use crate::marks::Marks;

/// The shared, self-reconnecting connection: publishing, acks, metadata.
#[derive(Clone)]
pub struct Streams {
    pub(crate) conn: Conn,
    pub(crate) keys: Keys,
    pub(crate) marks: Arc<Marks>,
    /// An announcement of a publish failed (told once).
    pub(crate) announce_failed: Arc<AtomicBool>,
    /// Where [`Streams::announced`] subscribes: the server, or each node of
    /// a cluster in turn (a cluster's PUBLISH reaches every node).
    pub(crate) subscribe_to: Arc<Vec<redis::Client>>,
}

impl Streams {
    /// Connects, retrying in the background on loss. Fails only when the URL
    /// is invalid or Redis cannot be reached at all now.
    pub async fn connect(url: &str, keys: Keys) -> Result<Streams> {
        Streams::connect_with(url, keys, None).await
    }

    /// Like [`Streams::connect`]; a `rediss://` URL is checked against the
    /// CA in `ca_file` (PEM) instead of the system's roots.
    pub async fn connect_with(url: &str, keys: Keys, ca_file: Option<&Path>) -> Result<Streams> {
        let (conn, subscribe_to) = Conn::open(url, ca_file).await?;
        Ok(Streams {
            conn,
            keys,
            marks: Arc::new(Marks::new()),
            announce_failed: Default::default(),
            subscribe_to: Arc::new(subscribe_to),
        })
    }

    pub fn keys(&self) -> &Keys {
        &self.keys
    }

    /// Counts one more start in `second` (unix seconds) and answers the
    /// count so far: one key per second, gone two seconds later. What
    /// `starts_per_second` quotas are held to, across coordinators.
    pub async fn count_start(&self, second: i64) -> Result<i64> {
        let key = self.keys.starts(second);
        let mut c = self.conn.clone();
        let (count,): (i64,) = redis::pipe().incr(&key, 1).expire(&key, 2).ignore().query_async(&mut c).await?;
        Ok(count)
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

    /// Sets the [`Keys::epoch`] key when it is missing: true when this call
    /// set it, that is when Redis lost its messages since a coordinator
    /// last did (or is new). One caller of many gets true (`SET NX`).
    pub async fn claim_new_epoch(&self, id: &str) -> Result<bool> {
        let mut c = self.conn.clone();
        let set: Option<String> =
            redis::cmd("SET").arg(self.keys.epoch()).arg(id).arg("NX").query_async(&mut c).await?;
        Ok(set.is_some())
    }

    /// Deletes the epoch key this caller set, when it could not do what a new
    /// epoch asks (the next caller then will).
    pub async fn forget_epoch(&self) -> Result<()> {
        let mut c = self.conn.clone();
        let _: () = c.del(self.keys.epoch()).await?;
        Ok(())
    }

    /// Sends one command per `(stream, arg)` built by `add`: in one pipeline
    /// on a single server; on a cluster, where a pipeline must stay within
    /// one slot, in one pipeline per stream, concurrently.
    pub(crate) async fn per_stream(
        &self,
        items: &[(&str, &str)],
        add: impl Fn(&mut redis::Pipeline, &str, &str),
    ) -> Result<()> {
        self.per_stream_then(items, add, |_, _| {}).await
    }

    /// [`Streams::per_stream`], with `then` adding a command per stream
    /// after that stream's own.
    pub(crate) async fn per_stream_then(
        &self,
        items: &[(&str, &str)],
        add: impl Fn(&mut redis::Pipeline, &str, &str),
        then: impl Fn(&mut redis::Pipeline, &str),
    ) -> Result<()> {
        if items.is_empty() {
            return Ok(());
        }
        match &self.conn {
            Conn::Single(_) => {
                let mut pipe = redis::pipe();
                let mut streams = BTreeSet::new();
                for (stream, arg) in items {
                    add(&mut pipe, stream, arg);
                    streams.insert(*stream);
                }
                for stream in streams {
                    then(&mut pipe, stream);
                }
                let _: () = pipe.query_async(&mut self.conn.clone()).await?;
            }
            Conn::Cluster(_) => {
                let mut by_stream: BTreeMap<&str, redis::Pipeline> = Default::default();
                for (stream, arg) in items {
                    add(by_stream.entry(stream).or_insert_with(redis::pipe), stream, arg);
                }
                for (stream, pipe) in by_stream.iter_mut() {
                    then(pipe, stream);
                }
                let sends = by_stream.into_values().map(|pipe| {
                    let mut c = self.conn.clone();
                    async move { pipe.query_async::<()>(&mut c).await }
                });
                for r in futures_util::future::join_all(sends).await {
                    r?;
                }
            }
        }
        Ok(())
    }
}
