//! The batch loops and the one entry point. [`Engine::handle`] queues an
//! [`EventRequest`] and waits for its answer; a loop takes whatever waits
//! (up to a batch, by priority) and applies it in one transaction. A batch
//! that fails is applied again piece by piece, so one bad event cannot fail
//! the others; an event that fails twice in a row fails its run.

use std::sync::Arc;

use composer_core::machine::RunStatus;
use composer_store::runs::{self, RunRow};
use tokio::sync::oneshot;
use uuid::Uuid;

use super::batch::BatchResult;
use super::error::{EngineError, Result};
use super::queue::{Lane, LiveLoop, Pending, QueuedStart};
use super::request::{Answer, EventRequest};
use super::Engine;

/// Where the answer to one piece of a batch's work goes.
enum Reply {
    Event(Uuid, oneshot::Sender<Result<Answer>>),
    Start(oneshot::Sender<Result<RunRow>>),
}

impl Engine {
    /// Applies the request's event to its run under the run's lock and
    /// commits the result: the one way a run changes. Requests that arrive
    /// together share a transaction (see [`Engine::run_batches`]): batching
    /// is what keeps PostgreSQL commits per step low under load, and adds no
    /// wait when there is nothing to batch with. Who asks decides the
    /// priority it waits at and what the batch checks ([`super::By`]).
    pub async fn handle(&self, mut request: EventRequest) -> Result<Answer> {
        let (reply, answer) = oneshot::channel();
        // Nothing to tell when no span is recorded.
        if self.traces.is_none() {
            request.trace_note = None;
        }
        self.queue.push(request.priority(), Pending::Event { request, reply })?;
        answer.await.map_err(|_| EngineError::Stopped)?
    }

    /// Takes whatever work is queued (up to a batch) and applies it in one
    /// transaction; several of these loops run so that one batch's commit
    /// overlaps the next one's work, and one more for urgent work only
    /// ([`Lane::Urgent`]).
    pub async fn run_batches(self: Arc<Self>, lane: Lane, shutdown: tokio_util::sync::CancellationToken) {
        use futures_util::FutureExt;
        let _live = LiveLoop::enter(&self.live_loops);
        loop {
            let taken = async {
                match lane {
                    Lane::All => self.queue.take().await,
                    Lane::Urgent => self.queue.take_urgent().await,
                }
            };
            let work = tokio::select! {
                _ = shutdown.cancelled() => {
                    self.queue.close();
                    return;
                }
                work = taken => match work { Some(w) => w, None => return },
            };
            // A panic outside the state machine (which is contained per
            // event) drops this batch's replies (their callers see the
            // coordinator stopping) but not the loop.
            if let Err(panic) = std::panic::AssertUnwindSafe(self.clone().process(work)).catch_unwind().await {
                tracing::error!(
                    error = composer_core::panic_message(&*panic),
                    "engine batch panicked; its events were not applied"
                );
            }
        }
    }

    /// Applies one batch's work and answers each piece.
    async fn process(self: Arc<Self>, work: Vec<Pending>) {
        let mut requests = Vec::new();
        let mut starts = Vec::new();
        let mut replies = Vec::with_capacity(work.len());
        for p in work {
            match p {
                Pending::Event { request, reply } => {
                    replies.push(Reply::Event(request.run_id, reply));
                    requests.push(request);
                }
                Pending::Start { start, reply } => {
                    starts.push(start);
                    replies.push(Reply::Start(reply));
                }
            }
        }
        // Kept to apply the events one by one should the batch fail; a
        // batch of one has nothing to isolate, and costs no copy.
        let backup = (replies.len() > 1).then(|| requests.clone());
        let run_ids: Vec<Uuid> = requests.iter().map(|a| a.run_id).collect();
        match self.apply_batch(requests, &starts).await {
            Ok(result) => {
                self.follow_up(result.after_commit);
                self.clear_faults(&run_ids);
                answer(replies, result.events, result.starts);
            }
            // One bad event must not fail the others: apply each on its own.
            Err(e) if backup.is_some() => {
                tracing::warn!(error = %e, work = replies.len(), "batch failed; applying its work one by one");
                self.one_by_one(replies, backup.unwrap_or_default(), &starts).await;
            }
            Err(e) => match replies.into_iter().next() {
                Some(Reply::Event(run_id, reply)) => {
                    let _ = reply.send(self.on_failure(run_id, e).await);
                }
                Some(Reply::Start(reply)) => {
                    let _ = reply.send(Err(e));
                }
                None => {}
            },
        }
    }

    /// Applies each piece of a failed batch in a batch of its own.
    async fn one_by_one(self: &Arc<Self>, replies: Vec<Reply>, requests: Vec<EventRequest>, starts: &[QueuedStart]) {
        let (mut requests, mut starts) = (requests.into_iter(), starts.iter());
        for reply in replies {
            match reply {
                Reply::Event(run_id, reply) => {
                    let Some(request) = requests.next() else { break };
                    let r = match self.apply_batch(vec![request], &[]).await {
                        Ok(mut result) => {
                            self.follow_up(std::mem::take(&mut result.after_commit));
                            result.events.pop().unwrap_or(Err(EngineError::RunNotFound(run_id)))
                        }
                        Err(e) => self.on_failure(run_id, e).await,
                    };
                    let _ = reply.send(r);
                }
                Reply::Start(reply) => {
                    let Some(start) = starts.next() else { break };
                    let r = self.apply_batch(Vec::new(), std::slice::from_ref(start)).await.and_then(
                        |mut result: BatchResult| {
                            self.follow_up(std::mem::take(&mut result.after_commit));
                            result.starts.pop().ok_or(EngineError::Stopped)
                        },
                    );
                    let _ = reply.send(r);
                }
            }
        }
    }

    fn clear_faults(&self, runs: &[Uuid]) {
        let mut faults = self.faults.lock().expect("fault counts");
        if !faults.is_empty() {
            for run_id in runs {
                faults.remove(run_id);
            }
        }
    }

    /// An event of one run failed on its own. The first permanent failure
    /// fails the event (its sender may retry); a repeat fails the run with
    /// the message, so a poisoned run cannot stall a loop, a worker or the
    /// timer loop forever.
    async fn on_failure(&self, run_id: Uuid, e: EngineError) -> Result<Answer> {
        if !e.is_permanent() {
            return Err(e);
        }
        let repeats = {
            let mut faults = self.faults.lock().expect("fault counts");
            if faults.len() > 10_000 {
                faults.clear();
            }
            let n = faults.entry(run_id).or_insert(0);
            *n += 1;
            *n
        };
        tracing::error!(%run_id, error = %e, repeats, "event failed permanently");
        if repeats < 2 {
            return Err(e);
        }
        let message = format!("run failed: {e}");
        let mut client = composer_store::client(&self.pool).await?;
        runs::fail_faulted(&mut client, run_id, &message).await?;
        self.faults.lock().expect("fault counts").remove(&run_id);
        crate::metrics::inc(composer_metrics::RUNS_FINISHED, &[("status", RunStatus::Failed.as_str())], 1);
        Ok(Answer::new(RunStatus::Failed, Some(message)))
    }
}

/// Answers each piece of a batch that committed, in the order it was given.
fn answer(replies: Vec<Reply>, events: Vec<Result<Answer>>, starts: Vec<RunRow>) {
    let (mut events, mut starts) = (events.into_iter(), starts.into_iter());
    for reply in replies {
        match reply {
            Reply::Event(run_id, reply) => {
                let _ = reply.send(events.next().unwrap_or(Err(EngineError::RunNotFound(run_id))));
            }
            Reply::Start(reply) => {
                let _ = reply.send(starts.next().ok_or(EngineError::Stopped));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use composer_core::machine::Event;
    use tokio::sync::Notify;

    // Paused time: the sleep below ends only once the first request is
    // queued and waits, at once and whatever the load.
    #[tokio::test(start_paused = true)]
    async fn a_full_queue_is_refused_at_once_not_queued_without_end() {
        // No database is reached: nothing runs the queue.
        let pool = composer_store::connect("postgres://nobody@127.0.0.1:9/none", 1, std::time::Duration::from_secs(1))
            .expect("a lazy pool");
        let bounds = super::super::Bounds { max_payload: 1024, ..super::super::Bounds::DEFAULT };
        let engine = Arc::new(Engine::new(pool, 1, Arc::new(Notify::new()), None, bounds, 1));
        let waiting = crate::metrics::spawn({
            let engine = engine.clone();
            async move { engine.handle(EventRequest::new(Uuid::now_v7(), Event::CancelRun)).await }
        });
        tokio::task::yield_now().await;
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        let second = engine.handle(EventRequest::new(Uuid::now_v7(), Event::CancelRun)).await;
        assert!(matches!(second, Err(EngineError::Busy)), "{second:?}");
        waiting.abort();
    }
}
