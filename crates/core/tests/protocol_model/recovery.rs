//! The recovery sweeps (`store::recovery`, `coord::loops::recover_tasks`),
//! attempts' deadlines (the timer loop), time (a lease expiring), and the
//! crashes of coordinators: the rest of what [`Protocol`] may do next.

use composer_core::machine::{RunStatus, TaskState};

use crate::state::{Action, Bug, Row, State, Tx, TxKind, COORDS};
use crate::steps::{Out, Protocol};

impl Protocol {
    /// `requeue_expired_leases`: RUNNING, lease expired, not at most once,
    /// the attempt not yet recovered `max` times: PENDING again with a new
    /// outbox row, same attempt (the run's status is not read).
    /// `redispatch_pending_tasks`: a running run's PENDING task with no
    /// outbox row (at any attempt), not recovered `max` times, gets one;
    /// the lost-dispatch age is time, abstracted: any such task may be
    /// taken, its message queued or not. `fail_exhausted`: a task either
    /// sweep would take but for `max` is found (`store::recovery::exhausted`,
    /// a SELECT), then failed through the engine, which reads the run and
    /// its tasks afresh under the run's lock and commits what the machine
    /// makes of that read (`max_dispatches` on a RUNNING at-most-once
    /// attempt: IN_DOUBT).
    pub(crate) fn sweeps(&self, s: &State, out: &mut Out) {
        let amo_ok = !self.cfg.at_most_once || self.bug(Bug::RetryAtMostOnce);
        for t in 0..self.cfg.tasks as u8 {
            let ti = usize::from(t);
            let row = s.rows[ti];
            let spent = row.recoveries >= self.cfg.max_dispatches;
            let expired = row.state == Some(TaskState::Running) && row.expired;
            if expired && amo_ok && !spent {
                let mut n = s.clone();
                n.rows[ti] = Row {
                    state: Some(TaskState::Pending),
                    owner: None,
                    expired: false,
                    recoveries: row.recoveries + 1,
                    ..row
                };
                n.outbox[ti][usize::from(row.attempt) - 1] += 1;
                n.ghost[ti].lost = false;
                out.push((Action::RequeueExpired { task: t }, n));
            }
            let running = s.run == Some(RunStatus::Running);
            let lost = running && row.state == Some(TaskState::Pending) && s.rows_of(ti) == 0;
            if lost && !spent && !self.bug(Bug::NoLostDispatchSweep) {
                let mut n = s.clone();
                n.rows[ti].recoveries += 1;
                n.outbox[ti][usize::from(row.attempt) - 1] += 1;
                n.ghost[ti].lost = false;
                out.push((Action::RedispatchLost { task: t }, n));
            }
            // `store::recovery::exhausted`: its RUNNING half leaves at-most-once tasks out, its PENDING half does not.
            let exhausted = running && spent && ((expired && !self.cfg.at_most_once) || lost);
            if exhausted && s.found[ti] != row.attempt {
                let mut n = s.clone();
                n.found[ti] = row.attempt;
                out.push((Action::FindExhausted { task: t }, n));
            }
            // The sweep's event reaches the engine (`collect_garbage` keeps `found` only while the machine would take it).
            let sent = s.found[ti] > 0 && s.found[ti] == row.attempt;
            for c in (0..COORDS).filter(|&c| sent && self.may_lock(s, c)) {
                let mut n = s.clone();
                let kind = TxKind::Exhausted { task: t, attempt: row.attempt };
                n.tx[c] = Some(Tx { kind, read: s.view(), owners: [s.rows[0].owner, s.rows[1].owner] });
                out.push((Action::FailExhausted { coord: c as u8, task: t }, n));
            }
        }
    }

    /// With a node `timeout`: an attempt's deadline passes while it is
    /// PENDING or RUNNING (`store::timers::due`), and the timer loop sends
    /// `TimerFired` through the engine, which reads the run, its tasks
    /// unlocked, and commits what the machine made of that read
    /// (`rules::timers::attempt_timed_out`: a RUNNING at-most-once attempt
    /// goes IN_DOUBT, any other is failed retryably), unless a poll leased
    /// the attempt it read PENDING meanwhile (`Answer::Moved`): the timer
    /// loop then fires again, on a fresh read.
    pub(crate) fn deadlines(&self, s: &State, out: &mut Out) {
        if !self.cfg.node_timeout {
            return;
        }
        for t in 0..self.cfg.tasks as u8 {
            let row = s.rows[usize::from(t)];
            if !matches!(row.state, Some(TaskState::Pending | TaskState::Running)) {
                continue;
            }
            for c in (0..COORDS).filter(|&c| self.may_lock(s, c)) {
                let mut n = s.clone();
                let kind = TxKind::Deadline { task: t, attempt: row.attempt };
                n.tx[c] = Some(Tx { kind, read: s.view(), owners: [s.rows[0].owner, s.rows[1].owner] });
                out.push((Action::DeadlinePasses { coord: c as u8, task: t }, n));
            }
        }
    }

    /// A lease runs out (its worker stopped heartbeating, or is slow); a
    /// worker crashes (in `executions`) or a coordinator does: its
    /// transaction rolls back (and, with the bug, the message it had yet to
    /// XADD is gone). Its published rows it had yet to delete are the
    /// publish's choice (`steps::outbox`).
    pub(crate) fn time_and_crashes(&self, s: &State, out: &mut Out) {
        for t in 0..self.cfg.tasks as u8 {
            let row = s.rows[usize::from(t)];
            if row.state == Some(TaskState::Running) && !row.expired {
                let mut n = s.clone();
                n.rows[usize::from(t)].expired = true;
                out.push((Action::LeaseExpires { task: t }, n));
            }
        }
        for c in 0..COORDS {
            let mut n = s.clone();
            n.tx[c] = None;
            n.sending[c] = None;
            if n != *s {
                out.push((Action::CoordCrash { coord: c as u8 }, n));
            }
        }
    }
}
