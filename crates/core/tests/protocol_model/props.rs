//! The properties the protocol must keep, and [`Protocol`] as a
//! [`Model`] for the checker: which states and steps break them, which
//! actions are faults, and what a run must be able to reach.

use composer_core::machine::{RunStatus, TaskState};

use crate::checker::{Broken, Model};
use crate::state::{describe, task_name, Action, Answer, State, TxKind, ATTEMPTS};
use crate::steps::Protocol;

/// What must hold, in every reachable state or step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Property {
    /// 1. No attempt has two results applied, and an ended task's result never changes.
    NoResultTwice,
    /// 2. A result is applied only from the worker that held the lease of
    ///    the task's current attempt, as the engine's transaction read the
    ///    row (or, with `Config::holder_at_commit`, as it is at the commit).
    OnlyTheHolder,
    /// 3. An at-most-once target is never called while an earlier call's
    ///    outcome is unknown to Composer (with one attempt: at most once in all).
    AtMostOnce,
    /// 4. Once a cancel is acknowledged, no lease is taken and no attempt or task begins.
    NothingAfterCancel,
    /// 5. Every PENDING task of a running run has an outbox row, a message,
    ///    or a publisher holding it, unless Redis lost its message (the
    ///    lost-dispatch sweep's case); every RUNNING one has a lease.
    NoLostWork,
    /// From every state, with no more faults and no operator, the run can
    ///    end or wait IN_DOUBT (for an operator).
    Progress,
}

fn broken(property: Property, why: String) -> Result<(), Broken<Property>> {
    Err(Broken { property, why })
}

impl Model for Protocol {
    type State = State;
    type Action = Action;
    type Property = Property;

    fn initial(&self) -> Vec<State> {
        vec![State::new()]
    }

    fn successors(&self, s: &State, out: &mut Vec<(Action, State)>) {
        self.next_steps(s, out);
    }

    fn invariant(&self, s: &State) -> Result<(), Broken<Property>> {
        for t in 0..self.cfg.tasks {
            let (name, g) = (task_name(t as u8), &s.ghost[t]);
            if let Some(a) = (0..ATTEMPTS).find(|&a| g.applied[a] > 1) {
                return broken(
                    Property::NoResultTwice,
                    format!("{name}@{} had {} results applied", a + 1, g.applied[a]),
                );
            }
            if self.cfg.at_most_once && g.unsettled > 1 {
                let why = format!("{name}'s at-most-once target was called again while a call's outcome was unknown");
                return broken(Property::AtMostOnce, why);
            }
        }
        self.no_lost_work(s)
    }

    fn step(&self, before: &State, a: &Action, after: &State) -> Result<(), Broken<Property>> {
        self.result_kept(before, after)?;
        self.only_the_holder(before, a)?;
        self.nothing_after_cancel(before, after)
    }

    /// An operator's cancel always ends the run: progress must not lean on it.
    fn on_its_own(&self, a: &Action) -> bool {
        !a.is_fault() && *a != Action::Cancel
    }

    fn is_goal(&self, s: &State) -> bool {
        s.run.is_some_and(RunStatus::is_terminal) || s.rows.iter().any(|r| r.state == Some(TaskState::InDoubt))
    }

    fn progress(&self) -> Property {
        Property::Progress
    }

    fn describe(&self, s: &State) -> String {
        describe(s, self.cfg.tasks)
    }

    fn canonical(&self, s: State) -> State {
        crate::symmetry::canonical(s)
    }
}

impl Protocol {
    /// Property 5, in a state.
    fn no_lost_work(&self, s: &State) -> Result<(), Broken<Property>> {
        if s.run != Some(RunStatus::Running) {
            return Ok(());
        }
        for t in 0..self.cfg.tasks {
            let (row, name) = (s.rows[t], task_name(t as u8));
            match row.state {
                Some(TaskState::Pending) => {
                    let attempt = row.attempt;
                    let message = s.stream[t][usize::from(attempt) - 1] > 0;
                    let publishing = s.sending.contains(&Some((t as u8, attempt)));
                    if !(s.has_row(t, attempt) || message || publishing || s.ghost[t].lost) {
                        let why =
                            format!("{name}@{attempt} is PENDING with no outbox row, no message and no publisher");
                        return broken(Property::NoLostWork, why);
                    }
                }
                Some(TaskState::Running) if row.owner.is_none() => {
                    return broken(Property::NoLostWork, format!("{name} is RUNNING with no lease"));
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// Property 1, in a step: an ended task stays as it ended.
    fn result_kept(&self, before: &State, after: &State) -> Result<(), Broken<Property>> {
        for t in 0..self.cfg.tasks {
            let (b, n) = (before.rows[t], after.rows[t]);
            if b.state.is_some_and(TaskState::is_terminal) && (b.state, b.attempt) != (n.state, n.attempt) {
                let why = format!(
                    "{} ended {:?}@{} and became {:?}@{}",
                    task_name(t as u8),
                    b.state,
                    b.attempt,
                    n.state,
                    n.attempt
                );
                return broken(Property::NoResultTwice, why);
            }
        }
        Ok(())
    }

    /// Property 2, in a step: a commit that applied a worker's result.
    fn only_the_holder(&self, before: &State, a: &Action) -> Result<(), Broken<Property>> {
        let Action::Commit { coord, answer: Answer::Applied, .. } = *a else { return Ok(()) };
        let Some(tx) = before.tx[usize::from(coord)] else { return Ok(()) };
        let TxKind::Report { worker, task, attempt, .. } = tx.kind else { return Ok(()) };
        let (read, owner) = match self.cfg.holder_at_commit {
            false => (tx.read.tasks[usize::from(task)], tx.owners[usize::from(task)]),
            true => {
                let row = before.rows[usize::from(task)];
                (row.state.map(|s| (s, row.attempt)), row.owner)
            }
        };
        if read == Some((TaskState::Running, attempt)) && owner == Some(worker) {
            return Ok(());
        }
        let name = task_name(task);
        let why = format!("w{worker}'s result for {name}@{attempt} was applied; the row: {read:?} leased to {owner:?}");
        broken(Property::OnlyTheHolder, why)
    }

    /// Property 4, in a step.
    fn nothing_after_cancel(&self, before: &State, after: &State) -> Result<(), Broken<Property>> {
        if !before.cancel_acked {
            return Ok(());
        }
        for t in 0..self.cfg.tasks {
            let (b, n) = (before.rows[t], after.rows[t]);
            let name = task_name(t as u8);
            if b.state.is_none() != n.state.is_none() || b.attempt != n.attempt {
                return broken(
                    Property::NothingAfterCancel,
                    format!("{name} began attempt {} after the cancel", n.attempt),
                );
            }
            let leased = n.state == Some(TaskState::Running) && n.owner.is_some();
            if leased && (b.state != n.state || b.owner != n.owner) {
                let why = format!("{name}@{} was leased to {:?} after the cancel", n.attempt, n.owner);
                return broken(Property::NothingAfterCancel, why);
            }
        }
        Ok(())
    }
}
