//! The code's names against the model: each task state
//! (`composer_core::machine::TaskState`), run status (`RunStatus`) and
//! reason the machine gives for ignoring an event (`IgnoreKind`) is either
//! covered by the model or on a list of what it leaves out, with why. The
//! matches are exhaustive: a variant added to the code does not compile
//! here until the model decides about it.

use composer_core::machine::{IgnoreKind, RunStatus, TaskState};

use crate::oracle::{Happened, Oracle, View};

/// Whether the model covers a name of the code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Covered {
    Modelled,
    LeftOut(&'static str),
}

pub fn task_state(s: TaskState) -> Covered {
    use TaskState::*;
    match s {
        Pending | Running | Waiting | InDoubt | Completed | Failed | Cancelled => Covered::Modelled,
        Queued => Covered::LeftOut("a MAP item waiting for a slot under max_concurrency: MAP throttling, not dispatch"),
        Skipped => {
            Covered::LeftOut("routing: a node none of whose edges is taken; the model's chain has no conditions")
        }
    }
}

pub fn run_status(s: RunStatus) -> Covered {
    use RunStatus::*;
    match s {
        Running | Succeeded | Failed | Cancelled => Covered::Modelled,
        Queued => Covered::LeftOut("admission under a concurrency limit: the model's run is started"),
        Paused => Covered::LeftOut("an operator's pause holds new attempts back; the model's operator only cancels"),
    }
}

/// An event the machine must ignore for `kind`, with the run it sees and
/// the workflow it runs (steps, at most once), for the kinds the model's
/// guards stand in front of; or why the model never meets the kind.
pub enum Ignored {
    /// (steps, at most once, the run as seen, the event).
    Guard(usize, bool, View, Happened),
    Unused(&'static str),
}

pub fn ignore_kind(kind: IgnoreKind) -> Ignored {
    use IgnoreKind::*;
    use TaskState as T;
    let run = RunStatus::Running;
    match kind {
        // The model starts its run once.
        AlreadyStarted => {
            Ignored::Guard(1, false, View { run, tasks: [Some((T::Pending, 1)), None] }, Happened::Started)
        }
        // A result after a cancel: the engine's lease check refuses it first.
        RunFinished => {
            let view = View { run: RunStatus::Cancelled, tasks: [Some((T::Cancelled, 1)), None] };
            Ignored::Guard(1, false, view, Happened::Completed { task: 0, attempt: 1 })
        }
        // A step that has no task yet.
        UnknownTask => Ignored::Guard(
            2,
            false,
            View { run, tasks: [Some((T::Running, 1)), None] },
            Happened::Completed { task: 1, attempt: 1 },
        ),
        // A result of an earlier attempt: refused first by the lease check.
        StaleAttempt => Ignored::Guard(
            1,
            false,
            View { run, tasks: [Some((T::Running, 2)), None] },
            Happened::Completed { task: 0, attempt: 1 },
        ),
        // A second result: refused first by the lease check.
        AlreadyFinished => {
            let view = View { run, tasks: [Some((T::Completed, 1)), Some((T::Pending, 1))] };
            Ignored::Guard(2, false, view, Happened::Completed { task: 0, attempt: 1 })
        }
        // The model fires a step's timer only while it waits for its backoff.
        NotWaiting => Ignored::Guard(
            1,
            false,
            View { run, tasks: [Some((T::Running, 1)), None] },
            Happened::TimerFired { task: 0 },
        ),
        // The in-doubt sweep takes only at-most-once tasks.
        NotDispatched => Ignored::Guard(
            1,
            false,
            View { run, tasks: [Some((T::Running, 1)), None] },
            Happened::InDoubt { task: 0, attempt: 1 },
        ),
        NotDue => Ignored::Unused("time is abstracted: a timer the model fires is due"),
        NotFailed => Ignored::Unused("the model has no retry of a failed run"),
        NotPaused => Ignored::Unused("the model has no pause, so no resume"),
        NotInDoubt => Ignored::Unused("the model's operator does not resolve IN_DOUBT tasks"),
        Refused => Ignored::Unused("the model has no APPROVAL step, whose votes are the only ones refused"),
    }
}

/// What the machine answers to a [`Ignored::Guard`] case.
pub fn ignored_by_the_machine(steps: usize, at_most_once: bool, view: View, event: Happened) -> Option<IgnoreKind> {
    Oracle::new(steps, 2, at_most_once, false).decide(view, event).ignored
}
