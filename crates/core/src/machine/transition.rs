//! What applying one event changed ([`Transition`]), or why it changed
//! nothing ([`IgnoreKind`]).

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use uuid::Uuid;

use super::effect::Effect;
use super::event::Event;
use super::history::{HistoryEntry, HistoryKind};

/// Why an event changed nothing, as a stable name fit for a metric label.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum IgnoreKind {
    AlreadyStarted,
    RunFinished,
    UnknownTask,
    StaleAttempt,
    AlreadyFinished,
    NotWaiting,
    NotDue,
    NotFailed,
    NotPaused,
    NotDispatched,
    NotInDoubt,
    /// A vote that may not be cast (not an assignee, decided already, data
    /// that does not match the form).
    Refused,
}

impl IgnoreKind {
    pub const ALL: [IgnoreKind; 12] = [
        IgnoreKind::AlreadyStarted,
        IgnoreKind::RunFinished,
        IgnoreKind::UnknownTask,
        IgnoreKind::StaleAttempt,
        IgnoreKind::AlreadyFinished,
        IgnoreKind::NotWaiting,
        IgnoreKind::NotDue,
        IgnoreKind::NotFailed,
        IgnoreKind::NotPaused,
        IgnoreKind::NotDispatched,
        IgnoreKind::NotInDoubt,
        IgnoreKind::Refused,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            IgnoreKind::AlreadyStarted => "already_started",
            IgnoreKind::RunFinished => "run_finished",
            IgnoreKind::UnknownTask => "unknown_task",
            IgnoreKind::StaleAttempt => "stale_attempt",
            IgnoreKind::AlreadyFinished => "already_finished",
            IgnoreKind::NotWaiting => "not_waiting",
            IgnoreKind::NotDue => "not_due",
            IgnoreKind::NotFailed => "not_failed",
            IgnoreKind::NotPaused => "not_paused",
            IgnoreKind::NotDispatched => "not_dispatched",
            IgnoreKind::NotInDoubt => "not_in_doubt",
            IgnoreKind::Refused => "refused",
        }
    }
}

/// What applying one event changed. Indices point into `run.tasks`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Transition {
    /// Why the event was ignored; nothing else is set when it was.
    pub ignored: Option<String>,
    /// A stable name for the reason, fit for a metric label.
    pub ignored_kind: Option<IgnoreKind>,
    /// Tasks that existed before the event and were changed by it.
    pub updated: Vec<usize>,
    /// Tasks created by the event (appended to `run.tasks`).
    pub created: Vec<usize>,
    /// Tasks (created or updated) to send to a worker.
    pub dispatch: Vec<usize>,
    /// The run's status, output or error changed.
    pub run_changed: bool,
    pub history: Vec<HistoryEntry>,
    /// MAP tasks that ended with items still queued or open, some of them
    /// maybe not in `run.tasks`: storage cancels those.
    pub cancel_items: Vec<usize>,
    /// What the engine must do, in the event's transaction, before the
    /// run can go on; each result comes back as an event.
    pub effects: Vec<Effect>,
    /// SUB_WORKFLOW tasks whose current attempt needs its child run started.
    pub children: Vec<usize>,
    /// MAP items the transition's MAPs will create in all: charged to the
    /// run tree's fan-out budget when they start.
    pub charged_items: u64,
    /// The lists of MAPs that have items still to create, for storage:
    /// `(MAP task, the first chunk's index, the elements from it on)`.
    pub sources: Vec<(usize, u32, Vec<Value>)>,
    /// MAPs that stopped creating items for this event with slots still
    /// free: they carry on after the commit.
    pub continue_maps: Vec<usize>,
    /// The run's input was replaced (a rerun with an edited input).
    pub input_changed: bool,
    /// Tasks whose limit keys a target's `Retry-After` holds, and until when.
    pub limit_holds: Vec<(usize, DateTime<Utc>)>,
    /// Tasks whose attempt its worker reported the end of: the worker has
    /// stopped, so what the attempt held is free at once (an attempt ended
    /// otherwise — a timeout, a cancel — may still be running there).
    pub reported: Vec<usize>,
    /// Nodes whose tasks a run loaded in part ([`Run::known`](crate::machine::Run::known)) lacked and
    /// this event needed. A transition with any is void: the engine drops
    /// it, loads these nodes' tasks, and applies the event again.
    pub missing: Vec<usize>,
    /// The event needed a value its run left unread ([`Run::unread`](crate::machine::Run::unread)). A
    /// transition with it is void: the engine drops it, reads the run's
    /// values, and applies the event again.
    pub unread: bool,
}

impl Transition {
    pub(super) fn ignore(Ignore(kind, reason): Ignore, about: Probe) -> Transition {
        let mut payload = json!({"event": about.name, "reason": reason});
        if let Some(id) = about.task_id {
            payload["task_id"] = json!(id);
        }
        if let Some(attempt) = about.attempt {
            payload["attempt"] = json!(attempt);
        }
        Transition {
            ignored: Some(reason),
            ignored_kind: Some(kind),
            history: vec![HistoryEntry { kind: HistoryKind::EventIgnored, payload }],
            ..Transition::default()
        }
    }

    /// Folds a follow-up transition (applied to the same run right after this
    /// one, in the same commit) into this one.
    pub fn merge(&mut self, next: Transition) {
        for t in next.created {
            self.created.push(t);
        }
        for t in next.updated {
            self.touch(t);
        }
        for t in next.dispatch {
            if !self.dispatch.contains(&t) {
                self.dispatch.push(t);
            }
        }
        self.run_changed |= next.run_changed;
        self.history.extend(next.history);
        for t in next.cancel_items {
            if !self.cancel_items.contains(&t) {
                self.cancel_items.push(t);
            }
        }
        for e in next.effects {
            if !self.effects.contains(&e) {
                self.effects.push(e);
            }
        }
        // The engine starts a child only for a task's current attempt, once.
        self.children.extend(next.children);
        self.charged_items += next.charged_items;
        self.input_changed |= next.input_changed;
        self.sources.extend(next.sources);
        self.limit_holds.extend(next.limit_holds);
        self.reported.extend(next.reported);
        debug_assert!(next.missing.is_empty(), "a void transition (missing tasks) was merged");
        debug_assert!(!next.unread, "a void transition (a value unread) was merged");
        for m in next.continue_maps {
            if !self.continue_maps.contains(&m) {
                self.continue_maps.push(m);
            }
        }
    }

    pub(super) fn touch(&mut self, task: usize) {
        if !self.updated.contains(&task) && !self.created.contains(&task) {
            self.updated.push(task);
        }
    }

    pub fn log(&mut self, kind: HistoryKind, payload: Value) {
        self.history.push(HistoryEntry { kind, payload });
    }
}

/// What the history says of an event that was ignored: taken before the
/// event is applied (and consumed).
pub(super) struct Probe {
    name: &'static str,
    task_id: Option<Uuid>,
    attempt: Option<i32>,
}

impl Probe {
    pub(super) fn of(event: &Event) -> Probe {
        let attempt = match event {
            Event::TaskCompleted { attempt, .. }
            | Event::TaskFailed { attempt, .. }
            | Event::TaskInDoubt { attempt, .. }
            | Event::ChildFinished { attempt, .. } => Some(*attempt),
            _ => None,
        };
        Probe { name: event.name(), task_id: event.task_id(), attempt }
    }
}

/// Why an event changes nothing: a stable kind and a message for people.
pub(super) struct Ignore(pub(super) IgnoreKind, pub(super) String);
