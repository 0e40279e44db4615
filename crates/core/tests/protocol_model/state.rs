//! The model's vocabulary: its configuration (sizes, the at-most-once
//! flag, the deliberately broken variants), a state of the whole system
//! (the run's and tasks' rows, the outbox, the stream, each worker's and
//! coordinator's memory, and the ghost counters the properties read), the
//! actions that move it, and how both are printed in a trace.

use std::fmt;

use composer_core::machine::{IgnoreKind, RunStatus, TaskState};

use crate::oracle::View;

/// At most two steps, two attempts of each, two workers, two coordinators.
pub const TASKS: usize = 2;
pub const ATTEMPTS: usize = 2;
pub const WORKERS: usize = 2;
pub const COORDS: usize = 2;

/// A deliberately broken protocol, each breaking one property, so that a
/// property the checker never finds broken is shown to be checkable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bug {
    /// The report's attempt and lease are not checked (the handler takes
    /// the attempt from the row): a worker whose lease was taken over has
    /// its result applied.
    AcceptStaleReport,
    /// Events of one run are applied without the run's lock: two reports
    /// read the task RUNNING at once and both apply.
    NoRunLock,
    /// Expired leases of at-most-once tasks are taken over and re-dispatched
    /// like the others.
    RetryAtMostOnce,
    /// A cancel leaves PENDING tasks as they are (it ends what runs).
    DispatchAfterCancel,
    /// The publisher deletes the outbox row before its XADD, keeping the
    /// message in memory until then.
    DeleteOutboxBeforePublish,
    /// The recovery sweep does not re-dispatch PENDING tasks whose message
    /// Redis lost.
    NoLostDispatchSweep,
    /// The engine writes a task it read PENDING whatever the row became
    /// since (the code before the guard in `store::transitions`): a poll's
    /// lease between the read and the commit is overwritten by what the
    /// machine decided from PENDING, a retry of an attempt being sent.
    UnguardedWrite,
    /// The machine takes `max_dispatches` for a known failure (the code
    /// before it joined the unknown outcomes in `rules::report`): a
    /// RUNNING at-most-once attempt the sweep gives up on is retried.
    MaxDispatchesNotUnknown,
}

#[derive(Debug, Clone, Copy)]
pub struct Config {
    /// 1 or 2 steps in a chain.
    pub tasks: usize,
    pub at_most_once: bool,
    /// Attempts per step (the node's `retry.max_attempts`), at most [`ATTEMPTS`].
    pub max_attempts: u8,
    /// `COMPOSER_MAX_DISPATCHES`: re-dispatches of one attempt by recovery.
    pub max_dispatches: u8,
    /// Copies of one message the stream holds at most (more are dropped, as a lost one would be).
    pub copies: u8,
    /// Faults in one run at most: a message lost or delivered again, a
    /// worker's or a coordinator's crash, a publisher's death between its
    /// XADD and its DELETE ([`Action::is_fault`]).
    pub max_faults: u8,
    /// The steps have a node `timeout`: an attempt's deadline may pass
    /// (any moment) while it is PENDING or RUNNING, and the timer loop
    /// fails it through the engine.
    pub node_timeout: bool,
    /// Property 2 asks for the lease holder as the row stands when the
    /// result commits, not as the engine read it (what the code gives).
    pub holder_at_commit: bool,
    pub bug: Option<Bug>,
}

impl Config {
    pub fn new(tasks: usize, at_most_once: bool) -> Config {
        Config {
            tasks,
            at_most_once,
            max_attempts: 2,
            max_dispatches: 1,
            copies: 2,
            max_faults: 2,
            node_timeout: false,
            holder_at_commit: false,
            bug: None,
        }
    }
}

/// A task's row in `task_instances`: its state (`None`: not created yet),
/// attempt, lease (owner, and whether it expired: time is abstracted to
/// that flag) and `recoveries` of the current attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Row {
    pub state: Option<TaskState>,
    pub attempt: u8,
    pub owner: Option<u8>,
    pub expired: bool,
    pub recoveries: u8,
}

/// What a worker does with an attempt it leased: whether it called the
/// target, and the result it reports (sent, waiting for the answer).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Exec {
    pub task: u8,
    pub attempt: u8,
    pub called: bool,
    pub report: Option<Outcome>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Outcome {
    Completed,
    /// The target answered with an error (retryable).
    Failed,
    /// The request broke off: nobody knows whether it took effect.
    Unknown,
}

/// An engine transaction between its read (under the run's lock) and its
/// commit: what it applies, and what it read of the run and the leases.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Tx {
    pub kind: TxKind,
    pub read: View,
    pub owners: [Option<u8>; TASKS],
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TxKind {
    Report { worker: u8, task: u8, attempt: u8, outcome: Outcome },
    Exhausted { task: u8, attempt: u8 },
    Deadline { task: u8, attempt: u8 },
}

/// What the properties count, kept in the state (it is part of what a
/// state is: two histories that differ here are different states).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Ghost {
    /// Reports applied per attempt.
    pub applied: [u8; ATTEMPTS],
    /// Calls of an at-most-once target whose outcome Composer does not know.
    pub unsettled: u8,
    /// Redis lost a message of the current attempt since it was last dispatched.
    pub lost: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct State {
    /// `None` until the start commits.
    pub run: Option<RunStatus>,
    pub cancel_acked: bool,
    pub rows: [Row; TASKS],
    /// Outbox rows per task and attempt, not yet published.
    pub outbox: [[u8; ATTEMPTS]; TASKS],
    /// Messages on the stream per task and attempt.
    pub stream: [[u8; ATTEMPTS]; TASKS],
    pub workers: [Option<Exec>; WORKERS],
    pub tx: [Option<Tx>; COORDS],
    /// A message whose row was deleted before its XADD (only [`Bug::DeleteOutboxBeforePublish`]).
    pub sending: [Option<(u8, u8)>; COORDS],
    pub ghost: [Ghost; TASKS],
    /// The attempt of each task a max-dispatches sweep found exhausted
    /// (`store::recovery::exhausted`), 0 if none: from then on, while that
    /// attempt is PENDING or RUNNING, its failure may reach the engine at
    /// any moment, any number of times (each sweep that found it sends it
    /// once; the model does not count them). The engine reads the row
    /// afresh then: a poll may have leased it since the sweep's SELECT.
    pub found: [u8; TASKS],
    /// Faults so far.
    pub faults: u8,
}

impl State {
    pub fn new() -> State {
        State {
            run: None,
            cancel_acked: false,
            rows: [Row::default(); TASKS],
            outbox: [[0; ATTEMPTS]; TASKS],
            stream: [[0; ATTEMPTS]; TASKS],
            workers: [None; WORKERS],
            tx: [None; COORDS],
            sending: [None; COORDS],
            ghost: [Ghost::default(); TASKS],
            found: [0; TASKS],
            faults: 0,
        }
    }

    /// Outbox rows of a task, at any attempt (what the lost-dispatch sweep's `NOT EXISTS` asks).
    pub fn rows_of(&self, task: usize) -> u8 {
        self.outbox[task].iter().sum()
    }

    pub fn has_row(&self, task: usize, attempt: u8) -> bool {
        attempt >= 1 && self.outbox[task][usize::from(attempt - 1)] > 0
    }

    /// What the machine reads of the run now.
    pub fn view(&self) -> View {
        let task = |r: &Row| r.state.map(|s| (s, r.attempt));
        View { run: self.run.unwrap_or(RunStatus::Running), tasks: [task(&self.rows[0]), task(&self.rows[1])] }
    }
}

/// The actions, each with what it found where the state decides it (a
/// lease granted or denied, an answer), so that a trace reads on its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    Start,
    Publish { task: u8, attempt: u8, row_kept: bool },
    DeleteThenPublish { coord: u8, task: u8, attempt: u8 },
    Xadd { coord: u8, task: u8, attempt: u8 },
    LoseMessage { task: u8, attempt: u8 },
    Redeliver { task: u8, attempt: u8 },
    Poll { worker: u8, task: u8, attempt: u8, got: Got },
    TakeOver { worker: u8, task: u8 },
    Call { worker: u8 },
    Heartbeat { worker: u8, kept: bool },
    Report { worker: u8, coord: u8, outcome: Outcome },
    Commit { coord: u8, answer: Answer },
    WorkerCrash { worker: u8 },
    CoordCrash { coord: u8 },
    LeaseExpires { task: u8 },
    RequeueExpired { task: u8 },
    RedispatchLost { task: u8 },
    InDoubt { task: u8 },
    FindExhausted { task: u8 },
    FailExhausted { coord: u8, task: u8 },
    DeadlinePasses { coord: u8, task: u8 },
    TimerFired { task: u8 },
    Cancel,
}

impl Action {
    /// What goes wrong (the rest is the protocol, an operator, or time).
    pub fn is_fault(&self) -> bool {
        matches!(
            self,
            Action::LoseMessage { .. }
                | Action::Redeliver { .. }
                | Action::WorkerCrash { .. }
                | Action::CoordCrash { .. }
                | Action::Publish { row_kept: true, .. }
        )
    }
}

/// What a poll's lease statement did with a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Got {
    Granted,
    TakenOver,
    Denied,
}

/// What an engine transaction's commit answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    Applied,
    Ignored(IgnoreKind),
    /// The engine's 409 `lease_lost` (not the machine's: `coord::engine::batch::events`).
    LeaseLost,
    /// `store::Error::Moved`: a task the transaction read PENDING and
    /// changes is no longer PENDING (a poll leased it), so nothing is
    /// written and the transaction rolls back; whoever sent the event sends
    /// it again later, and the engine reads the row afresh.
    Moved,
}

pub fn task_name(t: u8) -> char {
    ['a', 'b'][usize::from(t)]
}

impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use Action::*;
        let n = task_name;
        match *self {
            Start => write!(f, "the start commits (the run, its first task, the task's outbox row)"),
            Publish { task, attempt, row_kept: false } => {
                write!(f, "the outbox row of {}@{attempt} is published and deleted", n(task))
            }
            Publish { task, attempt, row_kept: true } => {
                write!(f, "the outbox row of {}@{attempt} is published; its publisher dies before the DELETE", n(task))
            }
            DeleteThenPublish { coord, task, attempt } => {
                write!(f, "c{coord} deletes the row of {}@{attempt}, to XADD it next", n(task))
            }
            Xadd { coord, task, attempt } => write!(f, "c{coord} XADDs {}@{attempt}", n(task)),
            LoseMessage { task, attempt } => write!(f, "Redis loses a message of {}@{attempt}", n(task)),
            Redeliver { task, attempt } => {
                write!(f, "{}@{attempt} is delivered again (its reader died before the XACK)", n(task))
            }
            Poll { worker, task, attempt, got } => write!(f, "w{worker} polls {}@{attempt}: {got:?}", n(task)),
            TakeOver { worker, task } => write!(f, "w{worker}'s poll takes over {}'s expired lease", n(task)),
            Call { worker } => write!(f, "w{worker} calls the target"),
            Heartbeat { worker, kept } => write!(f, "w{worker} heartbeats: {}", if kept { "renewed" } else { "lost" }),
            Report { worker, coord, outcome } => write!(f, "w{worker} reports {outcome:?} to c{coord}, which reads"),
            Commit { coord, answer } => write!(f, "c{coord} commits: {answer:?}"),
            WorkerCrash { worker } => write!(f, "w{worker} crashes"),
            CoordCrash { coord } => write!(f, "c{coord} crashes"),
            LeaseExpires { task } => write!(f, "{}'s lease expires", n(task)),
            RequeueExpired { task } => write!(f, "recovery requeues {} (expired lease)", n(task)),
            RedispatchLost { task } => write!(f, "recovery re-dispatches {} (lost dispatch)", n(task)),
            InDoubt { task } => write!(f, "recovery puts {} IN_DOUBT", n(task)),
            FindExhausted { task } => write!(f, "a max-dispatches sweep finds {} exhausted", n(task)),
            FailExhausted { coord, task } => {
                write!(f, "c{coord}'s engine fails {} (max dispatches) for the sweep, reads", n(task))
            }
            DeadlinePasses { coord, task } => {
                write!(f, "{}'s deadline passes: c{coord}'s timer loop times it out, reads", n(task))
            }
            TimerFired { task } => write!(f, "{}'s backoff ends: its next attempt is dispatched", n(task)),
            Cancel => write!(f, "an operator cancels the run"),
        }
    }
}

/// One state on one line: the run, each task's row, the outbox, the
/// stream, the workers, the transactions in flight, the ghost counters.
pub fn describe(s: &State, tasks: usize) -> String {
    let mut out = format!("run {}", s.run.map_or("-", |r| r.as_str()));
    for (t, r) in s.rows.iter().enumerate().take(tasks) {
        let state = r.state.map_or("-", |s| s.as_str());
        out.push_str(&format!(" | {}:{state}@{} r{}", task_name(t as u8), r.attempt, r.recoveries));
        if let Some(w) = r.owner {
            out.push_str(&format!(" w{w}{}", if r.expired { " expired" } else { "" }));
        }
        let g = &s.ghost[t];
        out.push_str(&format!(" applied{:?} unsettled{}{}", g.applied, g.unsettled, if g.lost { " lost" } else { "" }));
        if s.found[t] > 0 {
            out.push_str(&format!(" found exhausted@{}", s.found[t]));
        }
    }
    for t in 0..tasks {
        for a in 0..ATTEMPTS {
            if s.outbox[t][a] > 0 {
                out.push_str(&format!(" | row {}@{}x{}", task_name(t as u8), a + 1, s.outbox[t][a]));
            }
            if s.stream[t][a] > 0 {
                out.push_str(&format!(" | msg {}@{}x{}", task_name(t as u8), a + 1, s.stream[t][a]));
            }
        }
    }
    for (w, e) in s.workers.iter().enumerate() {
        if let Some(e) = e {
            let report = e.report.map_or(String::new(), |o| format!(" reporting {o:?}"));
            let called = if e.called { " called" } else { "" };
            out.push_str(&format!(" | w{w} runs {}@{}{called}{report}", task_name(e.task), e.attempt));
        }
    }
    for (c, tx) in s.tx.iter().enumerate() {
        match tx.map(|tx| tx.kind) {
            Some(TxKind::Report { worker, task, attempt, outcome }) => {
                out.push_str(&format!(" | c{c} applies w{worker}'s {outcome:?} of {}@{attempt}", task_name(task)));
            }
            Some(TxKind::Exhausted { task, attempt }) => {
                out.push_str(&format!(" | c{c} fails {}@{attempt} (max dispatches)", task_name(task)));
            }
            Some(TxKind::Deadline { task, attempt }) => {
                out.push_str(&format!(" | c{c} times {}@{attempt} out", task_name(task)));
            }
            None => {}
        }
    }
    if s.cancel_acked {
        out.push_str(" | cancel acknowledged");
    }
    out
}
