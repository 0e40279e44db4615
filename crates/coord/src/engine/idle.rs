//! Polls that wait for work. A worker's long poll that read nothing waits
//! here, and a batch of this coordinator that makes ready a task of the
//! poll's queues (a run's first step, a timer's, an event's) leases the
//! task to that worker in the batch's own commit and hands it to the poll:
//! no outbox row, no stream message, no read and no lease statement of its
//! own, as a result's `next` gets its run's next task.
//!
//! A poll leaves before it answers (its wait ran out, a publish woke it,
//! the coordinator drains, its client went away): if no batch took it
//! meanwhile it is simply gone; if one did, the poll waits for that batch's
//! commit and answers with what it was given. Only a poll whose client went
//! away after a batch took it loses its tasks; their leases expire and the
//! next poll takes them over, as when any poll's answer is lost.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use composer_api::wire::EagerOffer;
use composer_store::transitions::EagerLease;
use tokio::sync::oneshot;
use uuid::Uuid;

use super::loaded::Loaded;

/// Most polls one coordinator keeps waiting for work. Past it a poll waits
/// as one did before there was this queue (woken by publishes, reading the
/// streams), so workers holding ever more polls open cannot make each batch
/// look through more of them.
pub const MAX_WAITING_POLLS: usize = 1024;

/// The polls of one coordinator that wait for work, oldest first.
#[derive(Default)]
pub struct IdlePolls {
    waiting: Mutex<Vec<ParkedPoll>>,
    next_id: AtomicU64,
}

struct ParkedPoll {
    id: u64,
    worker: String,
    /// What the poll takes: up to `slots` tasks of `queues`, of runs of
    /// `priority` or more urgent.
    offer: EagerOffer,
    answer: oneshot::Sender<Vec<EagerLease>>,
}

/// A run's tasks a poll may be given, by queue, in dispatch order.
type ByQueue = HashMap<String, VecDeque<usize>>;

/// A poll waiting here. Dropped, it leaves.
pub struct Parked<'a> {
    polls: &'a IdlePolls,
    id: u64,
    /// What the batch that took the poll gave it, once committed; an error
    /// when that batch rolled back.
    pub answer: oneshot::Receiver<Vec<EagerLease>>,
}

/// The tasks a batch gave a waiting poll, to send once it commits.
pub struct Claimed {
    answer: oneshot::Sender<Vec<EagerLease>>,
    tasks: Vec<Uuid>,
}

impl IdlePolls {
    /// Waits for work for `worker` as `offer` says (its `priority`: the
    /// least urgent run it takes); `None` when [`MAX_WAITING_POLLS`] wait.
    /// A coordinator's own executor waits before every worker's poll.
    pub fn park(&self, worker: &str, offer: EagerOffer) -> Option<Parked<'_>> {
        let mut waiting = self.waiting.lock().unwrap_or_else(|p| p.into_inner());
        if waiting.len() >= MAX_WAITING_POLLS {
            return None;
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (answer, rx) = oneshot::channel();
        // A coordinator's own executor is served first: its steps then need
        // no stream, no poll and no report over the network.
        let at = match offer.coordinator {
            true => waiting.iter().position(|w| !w.offer.coordinator).unwrap_or(waiting.len()),
            false => waiting.len(),
        };
        waiting.insert(at, ParkedPoll { id, worker: worker.to_string(), offer, answer });
        Some(Parked { polls: self, id, answer: rx })
    }

    /// Whether it was still here (no batch took it): it is not any more.
    fn remove(&self, id: u64) -> bool {
        let mut waiting = self.waiting.lock().unwrap_or_else(|p| p.into_inner());
        match waiting.iter().position(|w| w.id == id) {
            Some(at) => {
                waiting.remove(at);
                true
            }
            None => false,
        }
    }

    /// How many polls wait now.
    pub fn waiting(&self) -> usize {
        self.waiting.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// The worker and queues of each worker's poll waiting now (the queues
    /// page shows those workers as waiting for work). Not a coordinator's
    /// own executor: it takes no task waiting in a queue.
    pub fn waiting_workers(&self) -> Vec<(String, Vec<String>)> {
        let waiting = self.waiting.lock().unwrap_or_else(|p| p.into_inner());
        let workers = waiting.iter().filter(|w| !w.answer.is_closed() && !w.offer.coordinator);
        workers.map(|w| (w.worker.clone(), w.offer.queues.clone())).collect()
    }

    /// Gives the waiting polls, in the order they wait, the tasks
    /// the batch's runs dispatch (the most urgent runs first), leased in
    /// the batch's commit as a result's `next` is. The polls given anything
    /// leave the queue: the caller sends them their tasks after the commit
    /// ([`Claimed::send`]), or drops them if the batch fails, which tells
    /// the polls to read again.
    pub fn give<'a>(&self, runs: impl IntoIterator<Item = &'a mut Loaded>) -> Vec<Claimed> {
        let mut waiting = self.waiting.lock().unwrap_or_else(|p| p.into_inner());
        waiting.retain(|w| !w.answer.is_closed());
        if waiting.is_empty() {
            return Vec::new();
        }
        // What each run can give, by queue: worked out once per batch.
        let mut ready: Vec<(&mut Loaded, ByQueue)> = runs
            .into_iter()
            .filter(|l| !l.tr.dispatch.is_empty())
            .map(|l| {
                let givable: ByQueue = l.givable().into_iter().map(|(q, tasks)| (q.to_string(), tasks)).collect();
                (l, givable)
            })
            .filter(|(_, givable)| !givable.is_empty())
            .collect();
        ready.sort_by_key(|(l, _)| l.priority);
        // A poll of none of these queues is passed over at a glance.
        let queues: std::collections::HashSet<String> =
            ready.iter().flat_map(|(_, givable)| givable.keys().cloned()).collect();
        let mut claimed = Vec::new();
        let mut at = 0;
        while at < waiting.len() && !ready.is_empty() {
            let w = &waiting[at];
            if !w.offer.queues.iter().any(|q| queues.contains(q)) {
                at += 1;
                continue;
            }
            let mut tasks = Vec::new();
            for (loaded, givable) in ready.iter_mut().filter(|(l, _)| l.priority <= w.offer.priority) {
                for queue in &w.offer.queues {
                    let Some(of_queue) = givable.get_mut(queue) else { continue };
                    while tasks.len() < w.offer.slots as usize {
                        let next = match w.offer.coordinator {
                            true => of_queue.iter().position(|&i| loaded.coordinator_may_run(i)),
                            false => (!of_queue.is_empty()).then_some(0),
                        };
                        let Some(i) = next.and_then(|at| of_queue.remove(at)) else { break };
                        tasks.push(loaded.lease_in_commit(i, &w.worker, w.offer.lease));
                    }
                }
                givable.retain(|_, of_queue| !of_queue.is_empty());
                if tasks.len() >= w.offer.slots as usize {
                    break;
                }
            }
            ready.retain(|(_, givable)| !givable.is_empty());
            if tasks.is_empty() {
                at += 1;
                continue;
            }
            let w = waiting.remove(at);
            claimed.push(Claimed { answer: w.answer, tasks });
        }
        claimed
    }
}

impl Claimed {
    /// Sends the poll what the commit leased to it, taken from `leased`.
    pub fn send(self, leased: &mut HashMap<Uuid, EagerLease>) {
        let given: Vec<EagerLease> = self.tasks.iter().filter_map(|t| leased.remove(t)).collect();
        let n = given.len();
        if self.answer.send(given).is_err() {
            // Its client went away: the leases expire and are taken over.
            tracing::warn!(tasks = n, "a poll left after a batch took it; its tasks wait for their leases to expire");
        }
    }
}

impl Parked<'_> {
    /// Stops waiting: `None` when no batch took the poll, else what the
    /// batch that did gave it, once committed (`None` too if it rolled back).
    pub async fn leave(mut self) -> Option<Vec<EagerLease>> {
        if self.polls.remove(self.id) {
            return None;
        }
        (&mut self.answer).await.ok()
    }
}

impl Drop for Parked<'_> {
    fn drop(&mut self) {
        self.polls.remove(self.id);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use composer_core::definition::Workflow;
    use composer_store::definitions::DefinitionRow;
    use serde_json::{json, Value};

    use super::super::admission::{create_run, Bounds, NewRunOf};
    use super::super::effects::fake::FakeStore;
    use super::*;

    /// A started run of `spec` at `priority`, as a batch holds it.
    async fn started(spec: Value, priority: u8) -> Loaded {
        let wf = Arc::new(Workflow::parse(&spec).unwrap());
        let def = DefinitionRow {
            id: Uuid::now_v7(),
            name: wf.spec.name.clone(),
            version: 1,
            spec,
            created_at: crate::clock::now(),
        };
        let input = json!({});
        let how = NewRunOf { priority: Some(priority), ..NewRunOf::of(&def, &input) };
        create_run(&FakeStore::default(), wf, how, Bounds::DEFAULT).await.unwrap().1.unwrap()
    }

    fn nodes(kinds: &[(&str, &str)]) -> Value {
        let nodes: Vec<Value> = kinds.iter().map(|(id, kind)| json!({"id": id, "type": kind})).collect();
        json!({"name": "fan", "nodes": nodes})
    }

    fn wanting(queues: &[&str], slots: u32, priority: u8) -> EagerOffer {
        let queues = queues.iter().map(|q| q.to_string()).collect();
        EagerOffer { slots, lease: std::time::Duration::from_secs(30), queues, priority, coordinator: false }
    }

    /// Polls are served in the order they began to wait, each with at most
    /// what it asked for, of its queues, of runs no less urgent than it takes,
    /// the most urgent runs first; no task is given twice; a poll given
    /// nothing stays.
    #[tokio::test]
    async fn a_batch_gives_each_waiting_poll_what_it_asked_for_and_no_task_twice() {
        let urgent =
            started(nodes(&[("a", "step"), ("b", "step"), ("c", "step"), ("d", "step"), ("e", "other")]), 2).await;
        let late = started(nodes(&[("f", "step"), ("g", "step")]), 5).await;
        let (urgent_id, late_id) = (urgent.run.id, late.run.id);
        let mut runs = HashMap::from([(urgent_id, urgent), (late_id, late)]);
        let polls = IdlePolls::default();
        let _p1 = polls.park("p1", wanting(&["step"], 3, 5)).unwrap();
        let _p2 = polls.park("p2", wanting(&["nope"], 8, 5)).unwrap();
        let _p3 = polls.park("p3", wanting(&["other", "step"], 8, 2)).unwrap();
        let _p4 = polls.park("p4", wanting(&["step"], 8, 5)).unwrap();
        let _p5 = polls.park("p5", wanting(&["step"], 8, 5)).unwrap();
        let claimed = polls.give(runs.values_mut());
        let node_of = |c: &Claimed| -> Vec<String> {
            let by_id = |id: &Uuid| {
                runs.values()
                    .flat_map(|l| l.run.tasks.iter().map(move |t| (t.id, l.wf.nodes[t.node].id.clone())))
                    .find(|(t, _)| t == id)
                    .map(|(_, n)| n)
                    .unwrap()
            };
            c.tasks.iter().map(by_id).collect()
        };
        let given: Vec<Vec<String>> = claimed.iter().map(node_of).collect();
        // p1: three of the urgent run's steps; p3 (urgent work only): its
        // last step and its `other`; p4: the late run's two; p5 nothing left.
        assert_eq!(given, [vec!["a", "b", "c"], vec!["e", "d"], vec!["f", "g"]]);
        assert_eq!(polls.waiting(), 2, "p2 (no such queue) and p5 (nothing left) still wait");
        let owners: Vec<(&str, usize)> = vec![("p1", 3), ("p3", 2)];
        for (worker, n) in owners {
            assert_eq!(runs[&urgent_id].eager.iter().filter(|e| e.owner == worker).count(), n, "{worker}");
        }
        assert_eq!(runs[&late_id].eager.iter().filter(|e| e.owner == "p4").count(), 2);
        // A second batch of the same runs has nothing more to give.
        assert!(polls.give(runs.values_mut()).is_empty());
    }

    /// A coordinator's own executor, though it began to wait last, is
    /// served first, and only with HTTP calls that read no secret; a
    /// worker's poll takes the rest.
    #[tokio::test]
    async fn a_coordinators_executor_is_served_first_and_only_with_steps_it_may_run() {
        let call = |id: &str, url: &str| json!({"id": id, "type": "HTTP", "config": {"url": url}});
        let spec = json!({"name": "calls", "nodes": [
            call("secret", "http://x/${ .secrets.T }"), call("plain", "http://x/"),
            {"id": "custom", "type": "charge", "queue": "http"}, call("also", "http://y/")
        ]});
        let run = started(spec, 3).await;
        let mut runs = HashMap::from([(run.run.id, run)]);
        let polls = IdlePolls::default();
        let _worker = polls.park("worker", wanting(&["http"], 8, 5)).unwrap();
        let _own = polls.park("own", EagerOffer { coordinator: true, ..wanting(&["http"], 8, 5) }).unwrap();
        let shown: Vec<String> = polls.waiting_workers().into_iter().map(|(w, _)| w).collect();
        assert_eq!(shown, ["worker"], "the coordinator's executor takes nothing queued: no reader of the queue");
        let claimed = polls.give(runs.values_mut());
        let loaded = runs.values().next().unwrap();
        let node_of = |c: &Claimed| -> Vec<String> {
            let node = |t: &Uuid| loaded.run.tasks.iter().find(|x| x.id == *t).map(|x| x.node).unwrap();
            c.tasks.iter().map(|t| loaded.wf.nodes[node(t)].id.clone()).collect()
        };
        let given: Vec<Vec<String>> = claimed.iter().map(node_of).collect();
        assert_eq!(given, [vec!["plain", "also"], vec!["secret", "custom"]]);
        let owners: Vec<&str> = loaded.eager.iter().map(|e| e.owner.as_str()).collect();
        assert_eq!(owners, ["own", "own", "worker", "worker"]);
    }

    fn offer() -> EagerOffer {
        EagerOffer {
            slots: 2,
            lease: std::time::Duration::from_secs(30),
            queues: vec!["q".into()],
            priority: 5,
            coordinator: false,
        }
    }

    #[tokio::test]
    async fn a_poll_that_leaves_or_is_dropped_before_a_batch_takes_it_is_gone() {
        let polls = IdlePolls::default();
        let first = polls.park("w1", offer()).unwrap();
        let second = polls.park("w2", offer()).unwrap();
        assert_eq!(polls.waiting(), 2);
        let named: Vec<(String, Vec<String>)> = polls.waiting_workers();
        assert_eq!(named, [("w1".to_string(), vec!["q".to_string()]), ("w2".to_string(), vec!["q".to_string()])]);
        assert!(first.leave().await.is_none(), "no batch took it");
        assert_eq!(polls.waiting(), 1);
        assert_eq!(polls.waiting_workers().len(), 1, "one that left is not named");
        drop(second);
        assert_eq!(polls.waiting(), 0, "a poll whose client went away leaves too");
        // A batch with no run to give from takes no poll.
        let _third = polls.park("w3", offer());
        assert!(polls.give(std::iter::empty()).is_empty());
        assert_eq!(polls.waiting(), 1);
    }

    #[test]
    fn past_the_most_waiting_polls_a_poll_is_not_kept() {
        let polls = IdlePolls::default();
        let kept: Vec<Parked> =
            (0..MAX_WAITING_POLLS).map(|i| polls.park(&format!("w{i}"), offer()).unwrap()).collect();
        assert!(polls.park("one-more", offer()).is_none());
        drop(kept);
        assert_eq!(polls.waiting(), 0);
        assert!(polls.park("now", offer()).is_some());
    }

    // Paused time: the timeout below runs out only once nothing else can
    // run, so "it waits" holds at once and whatever the load.
    #[tokio::test(start_paused = true)]
    async fn a_poll_a_batch_took_waits_for_its_commit_or_learns_of_its_rollback() {
        let polls = IdlePolls::default();
        let parked = polls.park("w1", offer()).unwrap();
        // As `give` does for a poll it gives to: out of the queue, with its tasks.
        let taken = polls.waiting.lock().unwrap().remove(0);
        let claimed = Claimed { answer: taken.answer, tasks: vec![Uuid::nil()] };
        let leaving = parked.leave();
        tokio::pin!(leaving);
        let early = tokio::time::timeout(std::time::Duration::from_millis(20), &mut leaving).await;
        assert!(early.is_err(), "it waits for the batch's commit");
        claimed.send(&mut HashMap::new());
        assert_eq!(leaving.await.map(|g| g.len()), Some(0), "what the commit leased to it (here nothing)");

        let parked = polls.park("w2", offer()).unwrap();
        let taken = polls.waiting.lock().unwrap().remove(0);
        drop(Claimed { answer: taken.answer, tasks: vec![] });
        assert_eq!(parked.leave().await.map(|g| g.len()), None, "the batch rolled back: read again");
    }
}
