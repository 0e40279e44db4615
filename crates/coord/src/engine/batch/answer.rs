//! Phase 8, after the commit: give the tasks the commit leased to the
//! workers whose reports took them and to the waiting polls, publish,
//! count, and say what the commit owes other runs.

use std::collections::HashMap;

use composer_core::machine::AfterCommit;
use composer_store::transitions::EagerLease;
use uuid::Uuid;

use super::super::loaded::Loaded;
use super::super::tally;
use super::super::write::Receipt;
use super::{Batch, BatchResult, HandOver};

impl Batch<'_> {
    pub(super) fn answer(mut self, mut receipt: Receipt, mut handed: HandOver) -> BatchResult {
        let handed_eager = handed.receipt.as_mut().map(|r| std::mem::take(&mut r.eager)).unwrap_or_default();
        if !receipt.eager.is_empty() || !handed_eager.is_empty() {
            let sent: HashMap<Uuid, EagerLease> =
                receipt.eager.drain(..).chain(handed_eager).map(|g| (g.dispatch.task_id, g)).collect();
            self.deliver(sent, &mut handed);
        }
        let mut handlers_owe = self.engine.written(receipt);
        if let Some(r) = handed.receipt.take() {
            handlers_owe.extend(self.engine.written(r));
            handlers_owe.extend(handed.promoted.iter().flat_map(Loaded::after_commit));
            crate::metrics::inc(composer_metrics::SLOTS_HANDED_OVER, &[], handed.promoted.len() as u64);
        }
        self.count(&handed);
        // A key whose slots went over here needs no pass after the commit;
        // one whose lock was busy, or whose hand-over failed, gets one.
        let passes = std::mem::take(&mut handed.freed)
            .into_iter()
            .filter(|k| !handed.handed.contains(k))
            .map(|(workflow, key)| (Uuid::nil(), AfterCommit::FreeSlot { workflow, key }));
        let after_commit = self
            .runs
            .values()
            .flat_map(Loaded::after_commit)
            .filter(|(_, e)| !matches!(e, AfterCommit::FreeSlot { .. }))
            .chain(passes)
            .chain(handlers_owe)
            .collect();
        BatchResult { events: self.answers, starts: self.created, after_commit }
    }

    /// Gives each reporting worker its leased tasks with its answer, and
    /// each waiting poll its own.
    fn deliver(&mut self, mut sent: HashMap<Uuid, EagerLease>, handed: &mut HandOver) {
        let given = std::mem::take(&mut self.given).into_iter().chain(std::mem::take(&mut handed.given));
        for (at, tasks) in given {
            if let Some(Ok(handled)) = self.answers.get_mut(at) {
                handled.next.extend(tasks.iter().filter_map(|t| sent.remove(t)));
            }
        }
        for poll in std::mem::take(&mut self.to_idle).into_iter().chain(std::mem::take(&mut handed.to_idle)) {
            poll.send(&mut sent);
        }
    }

    /// Counts the runs that ended and the events' durations, and gives each
    /// new run its state as its first transitions left it.
    fn count(&mut self, handed: &HandOver) {
        let ended =
            self.runs.values().chain(&handed.promoted).filter(|l| l.tr.run_changed && l.run.status.is_terminal());
        for l in ended {
            tally::run_finished(&l.wf, &l.run);
            self.engine.remember_large(l.run.id, false);
        }
        for _ in 0..self.requests {
            crate::metrics::observe(composer_metrics::EVENT_DURATION, &[], self.began.elapsed());
        }
        if !self.created.is_empty() {
            crate::metrics::inc(composer_metrics::RUNS_STARTED, &[], self.created.len() as u64);
        }
        for row in &mut self.created {
            if let Some(l) = self.runs.get(&row.id) {
                row.status = l.run.status;
                row.output = l.run.output.clone();
                row.error = l.run.error.clone();
            }
        }
    }
}
