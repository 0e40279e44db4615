//! The engine's queue: work waits here for a batch loop, which takes
//! whatever is queued (up to a batch, by priority) into one transaction.
//! Which work a loop takes is its [`Lane`].

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use composer_core::priority::{Share, HIGHEST, LOWEST};
use composer_store::definitions::DefinitionRow;
use composer_store::runs::RunRow;
use serde_json::Value;
use tokio::sync::{oneshot, Notify};

use super::error::{EngineError, Result};
use super::request::{Answer, EventRequest};

/// Most events and starts one transaction applies.
pub const MAX_BATCH: usize = 128;

/// Work waiting for a batch: an event for a run, or a new run to start.
pub enum Pending {
    Event {
        request: EventRequest,
        reply: oneshot::Sender<Result<Answer>>,
    },
    /// A run without an idempotency key or a concurrency limit (whose
    /// locks could make two batches wait for each other).
    Start {
        start: QueuedStart,
        reply: oneshot::Sender<Result<RunRow>>,
    },
}

/// A run to start in a batch: its definition and input, the tags and
/// `traceparent` its start gave, and its priority instead of its
/// definition's.
pub struct QueuedStart {
    pub def: DefinitionRow,
    pub input: Value,
    pub tags: Option<serde_json::Map<String, Value>>,
    pub traceparent: Option<String>,
    pub priority: Option<u8>,
}

impl Pending {
    /// Answers that the engine is stopping.
    pub fn refuse(self) {
        match self {
            Pending::Event { reply, .. } => {
                let _ = reply.send(Err(EngineError::Stopped));
            }
            Pending::Start { reply, .. } => {
                let _ = reply.send(Err(EngineError::Stopped));
            }
        }
    }
}

/// Which work a batch loop takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lane {
    /// Any, by the weighted share.
    All,
    /// Only work more urgent than the default priority, so that it never
    /// waits for a batch of a backlog to commit (see [`Queue`]).
    Urgent,
}

/// Batch loops of [`Lane::Urgent`] a coordinator runs besides its
/// `COMPOSER_ENGINE_WORKERS` of [`Lane::All`].
pub const URGENT_LOOPS: usize = 1;

/// Work waiting for the batch loops, by priority: a batch takes it by the
/// weighted share of [`Share`] (higher priorities first, none starved), so
/// a priority-1 report does not wait behind a backlog's. At most `capacity`
/// wait; more is refused at once ([`EngineError::Busy`]).
///
/// Work more urgent than the default priority also has a loop of its own
/// ([`Queue::take_urgent`]): on a busy engine every other loop is inside a
/// transaction of up to a batch of the backlog, and a priority-1 report
/// would wait for one of them to commit, then commit with a batch of the
/// backlog's work, instead of in a transaction of its own size.
pub struct Queue {
    queued: Mutex<Queued>,
    capacity: usize,
    ready: Notify,
    urgent: Notify,
}

/// The least urgent level [`Queue::take_urgent`] takes.
pub use composer_core::priority::URGENT;

#[derive(Default)]
struct Queued {
    by_priority: [VecDeque<Pending>; 5],
    len: usize,
    share: Share,
    closed: bool,
}

impl Queue {
    pub fn new(capacity: usize) -> Queue {
        Queue {
            queued: Mutex::new(Queued::default()),
            capacity: capacity.max(1),
            ready: Notify::new(),
            urgent: Notify::new(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Queued> {
        // Nothing panics while holding it; a poisoned queue is still whole.
        self.queued.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Queues `work` at `priority` (out of range: the nearest level); when
    /// refused, `work` is dropped unanswered (the caller has the error).
    pub fn push(&self, priority: u8, work: Pending) -> Result<()> {
        let mut w = self.lock();
        if w.closed {
            return Err(EngineError::Stopped);
        }
        if w.len >= self.capacity {
            return Err(EngineError::Busy);
        }
        let level = priority.clamp(HIGHEST, LOWEST);
        w.by_priority[usize::from(level - HIGHEST)].push_back(work);
        w.len += 1;
        drop(w);
        self.ready.notify_one();
        if level <= URGENT {
            self.urgent.notify_one();
        }
        Ok(())
    }

    /// Waits for work and takes up to a batch of it; `None` once closed.
    /// Cancel-safe: nothing is taken until it returns.
    pub async fn take(&self) -> Option<Vec<Pending>> {
        loop {
            let ready = self.ready.notified();
            {
                let mut w = self.lock();
                if w.len > 0 {
                    let batch = w.take(MAX_BATCH, LOWEST);
                    let more = w.len > 0;
                    drop(w);
                    // Another loop takes the rest while this one works.
                    if more {
                        self.ready.notify_one();
                    }
                    return Some(batch);
                }
                if w.closed {
                    return None;
                }
            }
            ready.await;
        }
    }

    /// Waits for work more urgent than the default priority ([`URGENT`] or
    /// higher) and takes up to a batch of only that; `None` once closed.
    /// Cancel-safe, as [`Queue::take`].
    pub async fn take_urgent(&self) -> Option<Vec<Pending>> {
        loop {
            let ready = self.urgent.notified();
            {
                let mut w = self.lock();
                if w.closed {
                    return None;
                }
                let batch = w.take(MAX_BATCH, URGENT);
                if !batch.is_empty() {
                    return Some(batch);
                }
            }
            ready.await;
        }
    }

    /// Refuses new work and answers what is queued, so no request waits
    /// forever while the server drains.
    pub fn close(&self) {
        let queued: Vec<Pending> = {
            let mut w = self.lock();
            w.closed = true;
            w.len = 0;
            w.by_priority.iter_mut().flat_map(std::mem::take).collect()
        };
        self.ready.notify_waiters();
        self.urgent.notify_waiters();
        for p in queued {
            p.refuse();
        }
    }
}

impl Queued {
    /// Up to `n` pieces of work of the levels up to `least` (the least
    /// urgent it takes), by the share.
    fn take(&mut self, n: usize, least: u8) -> Vec<Pending> {
        let mut batch = Vec::with_capacity(n.min(self.len));
        while batch.len() < n {
            let by = &self.by_priority;
            let has = |l: u8| l <= least && !by[usize::from(l - HIGHEST)].is_empty();
            let Some(level) = self.share.next(has) else { break };
            batch.extend(self.by_priority[usize::from(level - HIGHEST)].pop_front());
        }
        self.len -= batch.len();
        batch
    }
}

/// Counts a batch loop as live while it runs, however it ends.
pub struct LiveLoop<'a>(&'a AtomicUsize);

impl<'a> LiveLoop<'a> {
    pub fn enter(count: &'a AtomicUsize) -> LiveLoop<'a> {
        count.fetch_add(1, Ordering::Relaxed);
        LiveLoop(count)
    }
}

impl Drop for LiveLoop<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use composer_core::machine::Event;
    use uuid::Uuid;

    /// Work for run `n` (its id's last bytes), and where its answer goes.
    fn work(n: u16) -> (Pending, oneshot::Receiver<Result<Answer>>) {
        let (reply, answer) = oneshot::channel();
        let request = EventRequest::new(Uuid::from_u128(u128::from(n)), Event::CancelRun);
        (Pending::Event { request, reply }, answer)
    }

    fn runs(batch: &[Pending]) -> Vec<u16> {
        batch
            .iter()
            .map(|p| match p {
                Pending::Event { request, .. } => request.run_id.as_u128() as u16,
                Pending::Start { .. } => unreachable!("only events here"),
            })
            .collect()
    }

    #[tokio::test]
    async fn a_batch_takes_higher_priorities_first_and_a_backlog_still_gets_its_share() {
        let q = Queue::new(1000);
        for n in 0..200 {
            q.push(5, work(n).0).unwrap();
        }
        for n in 1000..1200 {
            q.push(1, work(n).0).unwrap();
        }
        let batch = runs(&q.take().await.unwrap());
        assert_eq!(batch.len(), MAX_BATCH);
        assert_eq!(batch[0], 1000, "the first priority-1 item first, though it came after 200 others");
        let lows: Vec<u16> = batch.iter().copied().filter(|&n| n < 1000).collect();
        // About 1 turn in 17 with only levels 1 and 5 waiting, in order.
        assert_eq!(lows, (0..8).collect::<Vec<_>>(), "{batch:?}");
        let highs: Vec<u16> = batch.iter().copied().filter(|&n| n >= 1000).collect();
        assert_eq!(highs, (1000..1000 + 120).collect::<Vec<_>>(), "first come first served within a level");
    }

    // Paused time: a sleep ends only once every other task waits, so "it
    // waits" is what the waiting task did, at once and whatever the load.
    #[tokio::test(start_paused = true)]
    async fn the_urgent_loop_takes_only_work_above_the_default_and_waits_for_it() {
        let q = std::sync::Arc::new(Queue::new(1000));
        for n in 0..50 {
            q.push(5, work(n).0).unwrap();
            q.push(3, work(100 + n).0).unwrap();
        }
        let waiting = crate::metrics::spawn({
            let q = q.clone();
            async move { q.take_urgent().await.map(|b| runs(&b)) }
        });
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        assert!(!waiting.is_finished(), "nothing above the default: it waits");
        q.push(2, work(1000).0).unwrap();
        q.push(1, work(1001).0).unwrap();
        let mut taken = waiting.await.unwrap().unwrap();
        if taken.len() < 2 {
            taken.extend(runs(&q.take_urgent().await.unwrap()));
        }
        taken.sort();
        assert_eq!(taken, vec![1000, 1001], "only the urgent work, whatever waited before it");
        let rest = runs(&q.take().await.unwrap());
        assert_eq!(rest.len(), 100, "the rest is left to the other loops");
        let waiting = crate::metrics::spawn({
            let q = q.clone();
            async move { q.take_urgent().await.is_none() }
        });
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        q.close();
        assert!(waiting.await.unwrap(), "the close wakes it");
    }

    #[tokio::test]
    async fn a_full_queue_refuses_at_once_and_a_closed_one_answers_what_it_held() {
        let q = Queue::new(2);
        let (a, answer_a) = work(1);
        q.push(3, a).unwrap();
        q.push(3, work(2).0).unwrap();
        assert!(matches!(q.push(1, work(3).0), Err(EngineError::Busy)), "full whatever the priority");
        q.close();
        assert!(matches!(answer_a.await, Ok(Err(EngineError::Stopped))), "what was queued is answered");
        assert!(matches!(q.push(3, work(4).0), Err(EngineError::Stopped)));
        assert!(q.take().await.is_none(), "a closed queue gives nothing");
    }

    #[tokio::test(start_paused = true)]
    async fn a_waiting_loop_wakes_for_work_and_for_the_close() {
        let q = std::sync::Arc::new(Queue::new(10));
        let waiting = crate::metrics::spawn({
            let q = q.clone();
            async move { q.take().await.map(|b| runs(&b)) }
        });
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        q.push(9, work(7).0).unwrap();
        assert_eq!(waiting.await.unwrap(), Some(vec![7]), "a level past the lowest is the lowest");
        let waiting = crate::metrics::spawn({
            let q = q.clone();
            async move { q.take().await.is_none() }
        });
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        q.close();
        assert!(waiting.await.unwrap(), "the close wakes it");
    }
}
