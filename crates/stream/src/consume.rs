//! Reading dispatches as a consumer of the group: making the group,
//! reading and claiming messages, acknowledging them, and listing who reads.

use std::time::Duration;

use redis::streams::{StreamAutoClaimOptions, StreamAutoClaimReply, StreamReadOptions, StreamReadReply};
use redis::AsyncCommands;

use crate::error::Result;
use crate::message::{messages_of, to_message, Message, GROUP};
use crate::streams::Streams;

impl Streams {
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

    /// The consumers of our group on `stream`: each one's name, how long
    /// since it last read (ms), and its messages read and not acknowledged.
    /// None (no group yet) is an empty list.
    pub async fn consumers(&self, stream: &str) -> Result<Vec<(String, u64, u64)>> {
        let mut c = self.conn.clone();
        let r: redis::RedisResult<redis::streams::StreamInfoConsumersReply> = c.xinfo_consumers(stream, GROUP).await;
        match r {
            Ok(reply) => Ok(reply.consumers.into_iter().map(|c| (c.name, c.idle as u64, c.pending as u64)).collect()),
            Err(e) if e.code() == Some("NOGROUP") || e.to_string().contains("no such key") => Ok(Vec::new()),
            Err(e) => Err(e.into()),
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

    /// [`Streams::ack`] for many messages, pipelined.
    pub async fn ack_many(&self, messages: &[(&str, &str)]) -> Result<()> {
        self.per_stream(messages, |pipe, stream, id| {
            pipe.cmd("XACK").arg(stream).arg(GROUP).arg(id).ignore();
            pipe.cmd("XDEL").arg(stream).arg(id).ignore();
        })
        .await
    }

    /// Claims for `name` up to `count` messages of `stream` that a consumer
    /// of the group read and has not acknowledged for `min_idle` (it died
    /// between reading and acknowledging), as XAUTOCLAIM does; none when the
    /// stream or its group is gone.
    pub async fn claim_stale(
        &self,
        name: &str,
        stream: &str,
        min_idle: Duration,
        count: usize,
    ) -> Result<Vec<Message>> {
        let mut c = self.conn.clone();
        let opts = StreamAutoClaimOptions::default().count(count);
        let idle = min_idle.as_millis() as u64;
        let r: redis::RedisResult<StreamAutoClaimReply> =
            c.xautoclaim_options(stream, GROUP, name, idle, "0-0", opts).await;
        let reply = match r {
            Ok(reply) => reply,
            Err(e) if e.code() == Some("NOGROUP") => return Ok(Vec::new()),
            Err(e) => return Err(e.into()),
        };
        reply.claimed.into_iter().map(|e| to_message(stream, e.id, &e.map)).collect()
    }

    /// Reads up to `count` new messages of one stream for consumer `name`,
    /// without blocking, on the shared connection (the task API's
    /// long-poll waits between reads instead).
    pub async fn read_now(&self, name: &str, stream: &str, count: usize) -> Result<Vec<Message>> {
        let opts = StreamReadOptions::default().group(GROUP, name).count(count);
        let mut c = self.conn.clone();
        let reply: Option<StreamReadReply> = c.xread_options(&[stream], &[">"], &opts).await?;
        messages_of(reply)
    }
}
