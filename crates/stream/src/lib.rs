//! Redis Streams: the dispatch channel between the outbox and workers.
//!
//! Streams are named `<prefix>tasks:<queue>.<shard>` for priority 3, the
//! default, and `<prefix>tasks:<queue>~p<priority>.<shard>` for the others
//! (1 to 5); the shard count lives at `<prefix>stream_shards`, published by
//! coordinators. Only coordinators touch streams: they publish, and read for
//! their workers' polls.
//! One consumer group per stream. Redis holds no truth: losing a stream loses
//! messages, never runs (the coordinators' sweeps re-dispatch from PostgreSQL).
//! Each publish raises the publisher's mark on each stream it wrote to, after
//! the messages, so that a loss of the latest writes (a failover to a replica
//! behind, a restart from older data) shows as a mark gone back
//! ([`Streams::lost_writes`]) and is repaired at once.
//!
//! A Redis Cluster works too (`redis+cluster://host:port,host:port`, or
//! `rediss+cluster://` over TLS): every command names one stream, so it goes
//! to the node of that stream's slot; batches are split per stream; and the
//! weighted read goes stream by stream, since one XREADGROUP (or script)
//! cannot name streams of different slots.
//!
//! - `keys`: the names of streams and the other keys, under one prefix.
//! - `message`: the consumer group, the field a dispatch rides in, a
//!   message read back.
//! - `conn`: one server or a cluster, opened from its URL.
//! - `streams`: the shared handle, metadata, and sending a batch per stream.
//! - `publish`: XADD with marks, and the wake channel's announcements.
//! - `marks`: how a loss of Redis's latest writes is noticed.
//! - `consume`: the group, reads, claims, acks, consumers.
//! - `weighted`: one poll's read across priorities by the weighted share.
//! - `error`: what the calls fail with.

mod conn;
mod consume;
mod error;
mod keys;
mod marks;
mod message;
mod publish;
mod streams;
mod weighted;

pub use conn::cluster_nodes;
pub use error::{Error, Result};
pub use keys::Keys;
pub use message::{Message, FIELD, GROUP};
pub use streams::Streams;
pub use weighted::Weighted;
