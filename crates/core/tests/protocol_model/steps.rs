//! What each actor may do next, as the code does it: the engine's
//! transactions (start, report, timer, cancel, the sweeps that send it
//! events), the outbox's publishing and deleting, Redis's faults, the
//! lease statements of polls and recovery, the workers' calls, heartbeats,
//! reports and crashes, and time (a lease expiring). Each guard cites the
//! statement or function it is taken from.

use composer_core::machine::{RunStatus, TaskState};

use crate::oracle::{Code, Decision, Happened, Oracle};
use crate::state::{
    Action, Answer, Bug, Config, Exec, Got, Outcome, Row, State, Tx, TxKind, ATTEMPTS, COORDS, TASKS, WORKERS,
};

/// The protocol of one configuration, and the state machine it asks.
pub struct Protocol {
    pub cfg: Config,
    pub oracle: Oracle,
}

pub type Out = Vec<(Action, State)>;

/// Task and attempt as indices of the state's arrays.
fn at(task: u8, attempt: u8) -> (usize, usize) {
    (usize::from(task), usize::from(attempt) - 1)
}

/// `s` with one copy of the message (task, attempt) taken off the stream.
fn taken(s: &State, task: u8, attempt: u8) -> State {
    let (ti, ai) = at(task, attempt);
    let mut n = s.clone();
    n.stream[ti][ai] -= 1;
    n
}

impl Protocol {
    pub fn new(cfg: Config) -> Protocol {
        assert!((1..=TASKS).contains(&cfg.tasks) && usize::from(cfg.max_attempts) <= ATTEMPTS);
        Protocol { oracle: Oracle::new(cfg.tasks, cfg.max_attempts, cfg.at_most_once, cfg.node_timeout), cfg }
    }

    pub fn bug(&self, bug: Bug) -> bool {
        self.cfg.bug == Some(bug)
    }

    fn tasks(&self) -> impl Iterator<Item = u8> {
        0..self.cfg.tasks as u8
    }

    /// Whether coordinator `c` may begin an engine transaction on the run:
    /// no other holds the run's lock (`store::runs::lock_many`'s `FOR UPDATE`).
    pub(crate) fn may_lock(&self, s: &State, c: usize) -> bool {
        match self.bug(Bug::NoRunLock) {
            true => s.tx[c].is_none(),
            false => s.tx.iter().all(Option::is_none),
        }
    }

    pub fn next_steps(&self, s: &State, out: &mut Out) {
        if s.run.is_none() {
            self.start(s, out);
            return;
        }
        self.outbox(s, out);
        self.redis(s, out);
        self.polls(s, out);
        self.executions(s, out);
        self.reports(s, out);
        self.commits(s, out);
        self.engine_events(s, out);
        self.sweeps(s, out);
        self.deadlines(s, out);
        self.time_and_crashes(s, out);
        // Faults within the budget, counted.
        let budget = s.faults < self.cfg.max_faults;
        out.retain(|(a, _)| budget || !a.is_fault());
        for (a, n) in out.iter_mut() {
            n.faults += u8::from(a.is_fault());
            self.collect_garbage(n);
        }
    }

    /// Drops the outbox rows and messages no lease can ever take: of an
    /// attempt before the task's current one (attempts only grow), or of a
    /// task that ended, waits IN_DOUBT or for its backoff, or runs at most
    /// once (no takeover). Each would only be published and denied, so
    /// dropping it at once changes nothing a property reads, and spares
    /// the search every moment it could have been denied at; a row that
    /// would keep the lost-dispatch sweep off its task (`NOT EXISTS`) could
    /// have been published first, at any moment. Likewise a sweep's find
    /// of an attempt the machine would now ignore a failure of (the run
    /// ended, the attempt moved on or is no longer PENDING or RUNNING:
    /// `rules::guards::reportable`), which it would ignore from then on.
    fn collect_garbage(&self, n: &mut State) {
        let takeover = !self.cfg.at_most_once || self.bug(Bug::RetryAtMostOnce);
        for t in 0..self.cfg.tasks {
            let row = n.rows[t];
            let open = matches!(row.state, Some(TaskState::Pending | TaskState::Running));
            if n.found[t] != row.attempt || !open || n.run != Some(RunStatus::Running) {
                n.found[t] = 0;
            }
            let live = match row.state {
                Some(TaskState::Pending) => true,
                Some(TaskState::Running) => takeover,
                _ => false,
            };
            for a in 0..ATTEMPTS {
                if !live || a + 1 < usize::from(row.attempt) {
                    n.outbox[t][a] = 0;
                    n.stream[t][a] = 0;
                }
            }
        }
    }

    /// `POST /v1/runs`: the run, its first task and that task's outbox row
    /// commit together.
    ///
    /// Eager dispatch (a task leased in the commit that dispatches it, to
    /// the reporting worker that asked for its next task or to an idle
    /// worker's waiting poll: `engine::loaded::give_eagerly`) is left out:
    /// it reaches the very state the outbox row, its publish and that
    /// worker's poll reach (the task RUNNING under that worker's lease, no
    /// row, no message), with nothing in between, so it adds no state; and
    /// it never takes an at-most-once step (`may_lease_in_commit`).
    fn start(&self, s: &State, out: &mut Out) {
        let d = self.oracle.decide(s.view(), Happened::Started);
        let mut n = s.clone();
        self.write(&mut n, &d);
        out.push((Action::Start, n));
    }

    /// Writes what the machine decided (`store::transitions`): every task it
    /// changed is overwritten and its lease ended; a dispatched task gets an
    /// outbox row. The engine locks the run's row, not its tasks', so a row
    /// may have moved since the transaction read it: [`Protocol::decide`]
    /// refuses the commit first when one read PENDING did.
    fn write(&self, n: &mut State, d: &Decision) {
        n.run = Some(d.run);
        for t in 0..TASKS {
            if let Some((state, attempt)) = d.written[t] {
                let old = n.rows[t];
                let recoveries = if old.attempt == attempt { old.recoveries } else { 0 };
                n.rows[t] = Row { state: Some(state), attempt, owner: None, expired: false, recoveries };
            }
            if d.dispatched[t] {
                n.outbox[t][usize::from(n.rows[t].attempt) - 1] += 1;
                n.ghost[t].lost = false;
            }
        }
    }

    /// The publisher (right after a commit) or the outbox enqueuer (once a
    /// row is due: the grace and the claim timeout are time, abstracted
    /// away, so any row may go out at any moment, by any coordinator): XADD,
    /// then the row is deleted; or (a fault) the publisher dies between the
    /// XADD and the DELETE, and the row, due again, goes out again later.
    /// A coordinator that dies between its commit and its publish needs no
    /// action of its own: the row waits for whichever publishes it. With
    /// the bug, the row is deleted first and the message kept in the
    /// publisher's memory until its XADD.
    fn outbox(&self, s: &State, out: &mut Out) {
        for t in self.tasks() {
            for a in (1..=self.cfg.max_attempts).filter(|&a| s.has_row(usize::from(t), a)) {
                let (ti, ai) = at(t, a);
                if self.bug(Bug::DeleteOutboxBeforePublish) {
                    for c in (0..COORDS).filter(|&c| s.sending[c].is_none()) {
                        let mut n = s.clone();
                        n.outbox[ti][ai] -= 1;
                        n.sending[c] = Some((t, a));
                        out.push((Action::DeleteThenPublish { coord: c as u8, task: t, attempt: a }, n));
                    }
                    continue;
                }
                for row_kept in [false, true] {
                    let mut n = s.clone();
                    n.outbox[ti][ai] -= u8::from(!row_kept);
                    self.add_message(&mut n, t, a);
                    if n != *s {
                        out.push((Action::Publish { task: t, attempt: a, row_kept }, n));
                    }
                }
            }
        }
        for c in 0..COORDS {
            if let Some((t, a)) = s.sending[c] {
                let mut n = s.clone();
                n.sending[c] = None;
                self.add_message(&mut n, t, a);
                out.push((Action::Xadd { coord: c as u8, task: t, attempt: a }, n));
            }
        }
    }

    fn add_message(&self, n: &mut State, t: u8, a: u8) {
        let (ti, ai) = at(t, a);
        n.stream[ti][ai] = (n.stream[ti][ai] + 1).min(self.cfg.copies);
    }

    /// Redis's faults: a message lost (a failover, a restart without its
    /// data), or delivered again (the coordinator that read it for a poll
    /// died after the lease and before the XACK, and a later poll claims
    /// it from the consumer group's pending list).
    fn redis(&self, s: &State, out: &mut Out) {
        for (t, a) in self.messages(s) {
            let (ti, ai) = at(t, a);
            let mut n = taken(s, t, a);
            if s.rows[ti].attempt == a {
                n.ghost[ti].lost = true;
            }
            out.push((Action::LoseMessage { task: t, attempt: a }, n));
            if s.stream[ti][ai] < self.cfg.copies {
                let mut n = s.clone();
                n.stream[ti][ai] += 1;
                out.push((Action::Redeliver { task: t, attempt: a }, n));
            }
        }
    }

    /// The (task, attempt) of each message on the stream (copies once).
    fn messages<'s>(&self, s: &'s State) -> impl Iterator<Item = (u8, u8)> + 's {
        let attempts = self.cfg.max_attempts;
        self.tasks().flat_map(move |t| (1..=attempts).map(move |a| (t, a))).filter(|&(t, a)| {
            let (ti, ai) = at(t, a);
            s.stream[ti][ai] > 0
        })
    }

    /// A worker's poll (one slot: an idle worker polls). First the expired
    /// leases of its queue (`store::leases::take_over_expired`), then a
    /// message, leased by `store::leases::lease`: PENDING at the message's
    /// attempt, else RUNNING at it under an expired lease and not at most
    /// once; the message is acknowledged either way (`coord::tasks::lease_read`).
    fn polls(&self, s: &State, out: &mut Out) {
        let amo_ok = !self.cfg.at_most_once || self.bug(Bug::RetryAtMostOnce);
        for w in (0..WORKERS as u8).filter(|&w| s.workers[usize::from(w)].is_none()) {
            for t in self.tasks() {
                let row = s.rows[usize::from(t)];
                let exhausted = row.recoveries >= self.cfg.max_dispatches;
                if row.state == Some(TaskState::Running) && row.expired && amo_ok && !exhausted {
                    let mut n = s.clone();
                    n.rows[usize::from(t)] =
                        Row { owner: Some(w), expired: false, recoveries: row.recoveries + 1, ..row };
                    n.workers[usize::from(w)] =
                        Some(Exec { task: t, attempt: row.attempt, called: false, report: None });
                    out.push((Action::TakeOver { worker: w, task: t }, n));
                }
                for (_, a) in self.messages(s).filter(|&(m, _)| m == t) {
                    let ti = usize::from(t);
                    let mut n = taken(s, t, a);
                    let got = match row.state {
                        _ if row.attempt != a => Got::Denied,
                        Some(TaskState::Pending) => Got::Granted,
                        Some(TaskState::Running) if row.expired && amo_ok => Got::TakenOver,
                        _ => Got::Denied,
                    };
                    if got != Got::Denied {
                        n.rows[ti] = Row { state: Some(TaskState::Running), owner: Some(w), expired: false, ..row };
                        n.workers[usize::from(w)] = Some(Exec { task: t, attempt: a, called: false, report: None });
                    }
                    out.push((Action::Poll { worker: w, task: t, attempt: a, got }, n));
                }
            }
        }
    }

    /// A worker's execution: it calls the target (counted for an
    /// at-most-once step), heartbeats (`LeaseManager::renew`: RUNNING, the
    /// attempt, the owner; expiry is not checked, so an expired lease
    /// nobody took over is renewed), or crashes and forgets.
    fn executions(&self, s: &State, out: &mut Out) {
        for w in 0..WORKERS as u8 {
            let Some(e) = s.workers[usize::from(w)] else { continue };
            let t = usize::from(e.task);
            if !e.called && e.report.is_none() {
                let mut n = s.clone();
                n.workers[usize::from(w)] = Some(Exec { called: true, ..e });
                if self.cfg.at_most_once {
                    n.ghost[t].unsettled = (n.ghost[t].unsettled + 1).min(3);
                }
                out.push((Action::Call { worker: w }, n));
            }
            let row = s.rows[t];
            let holds = row.state == Some(TaskState::Running) && row.attempt == e.attempt && row.owner == Some(w);
            if holds && row.expired {
                let mut n = s.clone();
                n.rows[t].expired = false;
                out.push((Action::Heartbeat { worker: w, kept: true }, n));
            } else if !holds && e.report.is_none() {
                // 409: the execution is cancelled and its result dropped.
                let mut n = s.clone();
                n.workers[usize::from(w)] = None;
                out.push((Action::Heartbeat { worker: w, kept: false }, n));
            }
            let mut n = s.clone();
            n.workers[usize::from(w)] = None;
            out.push((Action::WorkerCrash { worker: w }, n));
        }
    }

    /// A worker's result reaches a coordinator, whose engine locks the run
    /// and reads it: the result's transaction begins. A worker whose report
    /// was lost with a coordinator's rollback sends it again (to any).
    fn reports(&self, s: &State, out: &mut Out) {
        for w in 0..WORKERS as u8 {
            let Some(e) = s.workers[usize::from(w)] else { continue };
            let in_flight =
                s.tx.iter().flatten().any(|tx| matches!(tx.kind, TxKind::Report { worker, .. } if worker == w));
            let outcomes: &[Outcome] = match e.report {
                None if e.called && self.cfg.at_most_once => &[Outcome::Completed, Outcome::Failed, Outcome::Unknown],
                // Not at most once, a broken-off request is a retryable failure like another.
                None if e.called => &[Outcome::Completed, Outcome::Failed],
                Some(Outcome::Completed) if !in_flight => &[Outcome::Completed],
                Some(Outcome::Failed) if !in_flight => &[Outcome::Failed],
                Some(Outcome::Unknown) if !in_flight => &[Outcome::Unknown],
                _ => &[],
            };
            for c in (0..COORDS).filter(|&c| self.may_lock(s, c)) {
                for &outcome in outcomes {
                    let mut n = s.clone();
                    n.workers[usize::from(w)] = Some(Exec { report: Some(outcome), ..e });
                    let kind = TxKind::Report { worker: w, task: e.task, attempt: e.attempt, outcome };
                    n.tx[c] = Some(Tx { kind, read: s.view(), owners: [s.rows[0].owner, s.rows[1].owner] });
                    out.push((Action::Report { worker: w, coord: c as u8, outcome }, n));
                }
            }
        }
    }

    /// A transaction commits what the machine made of what it read, and
    /// the reporting worker, if it still waits, has its answer. A commit
    /// that moved rolls back: its worker, answered 503, sends the report
    /// again (as after a coordinator's crash).
    fn commits(&self, s: &State, out: &mut Out) {
        for c in 0..COORDS {
            let Some(tx) = s.tx[c] else { continue };
            let (answer, decision) = self.decide(s, &tx);
            let mut n = s.clone();
            n.tx[c] = None;
            if let (TxKind::Report { worker, task, attempt, .. }, false) = (tx.kind, answer == Answer::Moved) {
                let w = usize::from(worker);
                if s.workers[w].is_some_and(|e| e.task == task && e.attempt == attempt && e.report.is_some()) {
                    n.workers[w] = None;
                }
            }
            if let Some(d) = &decision {
                self.write(&mut n, d);
                self.count(&mut n, &tx);
            }
            out.push((Action::Commit { coord: c as u8, answer }, n));
        }
    }

    /// What a transaction's commit answers and, unless it refused, what the
    /// machine decided from the transaction's read. The write of a task read
    /// PENDING is guarded (`store::transitions::TaskUpdates::execute`: `NOT
    /// u.was_pending OR t.state = 'PENDING'`): if a poll leased it since the
    /// read, the whole commit fails with `Error::Moved` and writes nothing.
    fn decide(&self, s: &State, tx: &Tx) -> (Answer, Option<Decision>) {
        let happened = match tx.kind {
            TxKind::Report { worker, task, attempt, outcome } => {
                // `coord::engine::batch::events::lease_lost`, on the rows as read.
                let held = tx.read.tasks[usize::from(task)] == Some((TaskState::Running, attempt))
                    && tx.owners[usize::from(task)] == Some(worker);
                let stale = self.bug(Bug::AcceptStaleReport);
                if !held && !stale {
                    return (Answer::LeaseLost, None);
                }
                let attempt = match stale {
                    true => tx.read.tasks[usize::from(task)].map_or(attempt, |(_, a)| a),
                    false => attempt,
                };
                match outcome {
                    Outcome::Completed => Happened::Completed { task, attempt },
                    Outcome::Failed => Happened::Failed { task, attempt, code: Code::Known },
                    Outcome::Unknown => Happened::Failed { task, attempt, code: Code::Transport },
                }
            }
            TxKind::Exhausted { task, attempt } => {
                let code = match self.bug(Bug::MaxDispatchesNotUnknown) {
                    true => Code::Known,
                    false => Code::MaxDispatches,
                };
                Happened::Failed { task, attempt, code }
            }
            TxKind::Deadline { task, .. } => Happened::TimerFired { task },
        };
        let d = self.oracle.decide(tx.read, happened);
        if d.ignored.is_none() && !self.bug(Bug::UnguardedWrite) {
            let moved = |t: usize| {
                let read_pending = matches!(tx.read.tasks[t], Some((TaskState::Pending, _)));
                read_pending && d.written[t].is_some() && s.rows[t].state != Some(TaskState::Pending)
            };
            if (0..TASKS).any(moved) {
                return (Answer::Moved, None);
            }
        }
        match d.ignored {
            Some(kind) => (Answer::Ignored(kind), None),
            None => (Answer::Applied, Some(d)),
        }
    }

    /// The ghost counters of an applied report: one more result of its
    /// attempt, and an at-most-once call whose outcome is now known.
    fn count(&self, n: &mut State, tx: &Tx) {
        let TxKind::Report { task, attempt, outcome, .. } = tx.kind else { return };
        let attempt = match self.bug(Bug::AcceptStaleReport) {
            true => tx.read.tasks[usize::from(task)].map_or(attempt, |(_, a)| a),
            false => attempt,
        };
        let g = &mut n.ghost[usize::from(task)];
        g.applied[usize::from(attempt) - 1] = (g.applied[usize::from(attempt) - 1] + 1).min(2);
        if outcome != Outcome::Unknown {
            g.unsettled = g.unsettled.saturating_sub(1);
        }
    }

    /// Events the engine applies at once, each one transaction whose result
    /// does not depend on what a concurrent lease statement changes (a
    /// WAITING task, a cancel, an at-most-once lease only its holder
    /// renews): a backoff's timer, an operator's cancel, and the in-doubt
    /// sweep (`coord::loops::put_in_doubt`: RUNNING, at most once, lease
    /// expired, run active). A cancel that read a task PENDING which a poll
    /// leases before its commit fails (`Error::Moved`) and changes nothing:
    /// the operator's retry is a later cancel.
    fn engine_events(&self, s: &State, out: &mut Out) {
        if !self.may_lock(s, 0) || !self.may_lock(s, 1) {
            return;
        }
        for t in self.tasks() {
            let row = s.rows[usize::from(t)];
            if row.state == Some(TaskState::Waiting) {
                let d = self.oracle.decide(s.view(), Happened::TimerFired { task: t });
                if d.ignored.is_none() {
                    let mut n = s.clone();
                    self.write(&mut n, &d);
                    out.push((Action::TimerFired { task: t }, n));
                }
            }
            let active = matches!(s.run, Some(RunStatus::Running));
            if active && self.cfg.at_most_once && row.state == Some(TaskState::Running) && row.expired {
                let d = self.oracle.decide(s.view(), Happened::InDoubt { task: t, attempt: row.attempt });
                if d.ignored.is_none() {
                    let mut n = s.clone();
                    self.write(&mut n, &d);
                    out.push((Action::InDoubt { task: t }, n));
                }
            }
        }
        if s.run == Some(RunStatus::Running) {
            let d = self.oracle.decide(s.view(), Happened::Cancelled);
            let mut n = s.clone();
            self.write(&mut n, &d);
            if self.bug(Bug::DispatchAfterCancel) {
                for t in 0..TASKS {
                    if s.rows[t].state == Some(TaskState::Pending) {
                        n.rows[t] = s.rows[t];
                    }
                }
            }
            n.cancel_acked = true;
            out.push((Action::Cancel, n));
        }
    }
}
