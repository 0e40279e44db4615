//! The engine's side of publishing after commit (`crate::publish` is the
//! loop that does it): what a commit dispatched is handed over here, and
//! the ids of rows published since are taken back for the next
//! transaction to delete.

use std::sync::Mutex;
use std::time::Instant;

use composer_store::outbox::Outbound;
use tokio::sync::mpsc;

/// Commits whose dispatches may wait for the publishing loop (while Redis
/// is slow to answer, say); past this their rows go out through the
/// enqueuers after the grace, so a stalled Redis cannot make this queue
/// grow without end.
const PUBLISH_QUEUE: usize = 4096;

/// The committed dispatches of one transaction and when it committed.
pub struct Committed {
    pub at: Instant,
    pub rows: Vec<Outbound>,
}

/// The engine's side: hand over what a commit dispatched, take the ids of
/// rows published since.
pub struct Publisher {
    queue: mpsc::Sender<Committed>,
    /// Outbox rows whose messages are on their streams, not yet deleted.
    pub(crate) published: Mutex<Vec<i64>>,
}

/// The publishing loop's side of a [`Publisher`].
pub struct Inbox(pub mpsc::Receiver<Committed>);

impl Publisher {
    pub fn new() -> (Publisher, Inbox) {
        let (queue, inbox) = mpsc::channel(PUBLISH_QUEUE);
        (Publisher { queue, published: Mutex::new(Vec::new()) }, Inbox(inbox))
    }

    /// Publishes `rows`, committed just now. When the loop has stopped, or
    /// is [`PUBLISH_QUEUE`] commits behind, they go out through the
    /// enqueuers after the grace.
    pub fn send(&self, rows: Vec<Outbound>) {
        if rows.is_empty() {
            return;
        }
        if let Err(mpsc::error::TrySendError::Full(c)) = self.queue.try_send(Committed { at: Instant::now(), rows }) {
            tracing::warn!(rows = c.rows.len(), "the publisher is behind; these dispatches go out after the grace");
        }
    }

    /// Ids of published rows, for a transaction to delete; hand them back
    /// with [`Publisher::give_back`] if it does not commit.
    pub fn take_published(&self) -> Vec<i64> {
        std::mem::take(&mut *self.published.lock().expect("published ids"))
    }

    pub fn give_back(&self, ids: Vec<i64>) {
        if !ids.is_empty() {
            self.published.lock().expect("published ids").extend(ids);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use composer_api::wire::Dispatch;
    use uuid::Uuid;

    fn row(id: i64) -> Outbound {
        let dispatch = Dispatch {
            task_id: Uuid::now_v7(),
            run_id: Uuid::now_v7(),
            workflow_id: Uuid::now_v7(),
            workflow_version: 1,
            node_id: "a".into(),
            node_type: "HTTP".into(),
            attempt: 1,
            input: serde_json::json!({}),
            published_at_us: None,
            traceparent: None,
            dispatched_at_us: None,
        };
        Outbound { id, queue: "http".into(), shard: 0, priority: composer_core::priority::DEFAULT, dispatch }
    }

    #[test]
    fn a_publisher_that_falls_behind_leaves_further_commits_to_the_outbox_instead_of_queueing_them() {
        let (publisher, mut inbox) = Publisher::new();
        for i in 0..PUBLISH_QUEUE as i64 + 10 {
            publisher.send(vec![row(i)]);
        }
        publisher.send(Vec::new());
        let mut queued = 0;
        while let Ok(c) = inbox.0.try_recv() {
            assert_eq!(c.rows[0].id, queued as i64, "in commit order");
            queued += 1;
        }
        assert_eq!(queued, PUBLISH_QUEUE);
    }

    #[test]
    fn published_ids_given_back_are_taken_again() {
        let (publisher, _inbox) = Publisher::new();
        publisher.give_back(vec![1, 2]);
        let ids = publisher.take_published();
        assert_eq!(ids, vec![1, 2]);
        assert!(publisher.take_published().is_empty());
        publisher.give_back(ids);
        assert_eq!(publisher.take_published(), vec![1, 2]);
    }
}
