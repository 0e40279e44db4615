//! Publishing dispatches: the XADDs with their marks, the check that
//! Redis kept them, and the announcement on the wake channel that wakes
//! other coordinators' waiting polls.

use std::sync::atomic::Ordering;
use std::time::Duration;

use crate::error::Result;
use crate::message::FIELD;
use crate::streams::Streams;

impl Streams {
    /// XADDs every `(stream, payload)`: one pipeline, or on a cluster one
    /// per stream, all at once; all or error.
    /// Each stream's mark ([`crate::marks`]) is raised after its messages; then the
    /// publish is announced on [`crate::Keys::wake_channel`], in the background.
    pub async fn publish(&self, batch: &[(&str, &str)]) -> Result<()> {
        let number = self.marks.next_number();
        self.per_stream_then(
            batch,
            |pipe, stream, payload| {
                pipe.cmd("XADD").arg(stream).arg("*").arg(FIELD).arg(payload).ignore();
            },
            |pipe, stream| self.marks.raise(pipe, &self.keys, stream, number),
        )
        .await?;
        self.announce();
        self.marks.wrote(batch.iter().map(|(stream, _)| *stream), number);
        Ok(())
    }

    /// Whether Redis lost writes of this process since its last look: a
    /// mark it raised on a stream is gone or lower than it raised it (a
    /// failover to a replica that lacked the latest writes, a restart from
    /// an older snapshot or AOF), so messages published before that mark
    /// may be gone too. A loss is told once.
    pub async fn lost_writes(&self) -> Result<bool> {
        self.marks.lost(&self.conn, &self.keys).await
    }

    /// Says on [`crate::Keys::wake_channel`] that this one published: after the
    /// messages are on their streams, and apart from them, so that a failed
    /// announcement (a Redis user without access to channels) fails no
    /// publish; that failure is logged once.
    fn announce(&self) {
        let mut cmd = redis::cmd("PUBLISH");
        cmd.arg(self.keys.wake_channel()).arg(&self.marks.owner);
        let mut conn = self.conn.clone();
        let failed = self.announce_failed.clone();
        tokio::spawn(async move {
            if let Err(e) = cmd.query_async::<()>(&mut conn).await {
                if !failed.swap(true, Ordering::Relaxed) {
                    tracing::warn!(error = %e, "Redis: cannot announce publishes (PUBLISH); polls on other coordinators see them at their next idle read");
                }
            }
        });
    }

    /// Calls `announced` for each publish of another [`Streams`] (another
    /// coordinator) on the same keys, as it is announced; runs until
    /// dropped. Subscribes again after losing its connection (to the next
    /// node of a cluster): one second later, up to a minute while refused. Announcements are a hint: one
    /// lost while reconnecting is a publish its waiters see on their next read.
    pub async fn announced(&self, announced: impl Fn()) {
        use futures_util::StreamExt;
        let channel = self.keys.wake_channel();
        let mut node = 0usize;
        let mut pause = Duration::from_secs(1);
        loop {
            let client = &self.subscribe_to[node % self.subscribe_to.len()];
            node = node.wrapping_add(1);
            match client.get_async_pubsub().await {
                Ok(mut sub) => match sub.subscribe(&channel).await {
                    Ok(()) => {
                        pause = Duration::from_secs(1);
                        let mut messages = sub.on_message();
                        while let Some(msg) = messages.next().await {
                            if msg.get_payload::<String>().is_ok_and(|by| by != self.marks.owner) {
                                announced();
                            }
                        }
                        tracing::warn!("Redis: the subscription to publishes ended; subscribing again");
                    }
                    Err(e) => tracing::warn!(error = %e, "Redis: cannot subscribe to publishes"),
                },
                Err(e) => tracing::warn!(error = %e, "Redis: cannot connect to subscribe to publishes"),
            }
            tokio::time::sleep(pause).await;
            // A refusal that lasts (a user without channels) is retried, and logged, once a minute.
            pause = (pause * 2).min(Duration::from_secs(60));
        }
    }
}
