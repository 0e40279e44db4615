//! The state of one event's application: the [`Machine`] the rules run on,
//! and the small pieces they share.

use std::collections::{BTreeMap, HashMap};

use chrono::{DateTime, Utc};
use serde_json::Value;
use uuid::Uuid;

use super::run::Run;
use super::task::Task;
use super::transition::Transition;
use crate::definition::{NodeKind, Workflow};
use crate::expr::Sandbox;

/// Stands for "no timeout" while a wait is being built.
pub(super) const FOREVER: DateTime<Utc> = DateTime::<Utc>::MAX_UTC;

/// `now + d`, or [`FOREVER`] when that is past what a timestamp can hold
/// (durations are bounded at validation; backoffs grow with attempts).
pub(super) fn later(now: DateTime<Utc>, d: std::time::Duration) -> DateTime<Utc> {
    chrono::Duration::from_std(d).ok().and_then(|d| now.checked_add_signed(d)).unwrap_or(FOREVER)
}

/// One event being applied: the run it changes and what changed so far.
pub(super) struct Machine<'a> {
    /// Where its expressions are evaluated.
    pub(super) sb: &'a Sandbox,
    pub(super) wf: &'a Workflow,
    pub(super) run: &'a mut Run,
    pub(super) now: DateTime<Utc>,
    pub(super) new_id: &'a mut dyn FnMut() -> Uuid,
    pub(super) tr: Transition,
    /// MAP bookkeeping for this event.
    pub(super) maps: Maps,
    /// Whether it needed a value its run left unread ([`Run::unread`]):
    /// noted where a value is read, for [`Transition::unread`].
    pub(super) unread: std::cell::Cell<bool>,
    /// What this event's scopes may still convert of the run's values, in
    /// about bytes of JSON ([`EVENT_READS`](super::EVENT_READS) scopes' worth).
    pub(super) read_left: std::cell::Cell<usize>,
}

/// Indexes built on first use within one event.
#[derive(Default)]
pub(super) struct Maps {
    /// Loaded QUEUED items by (MAP task, index) → task.
    pub(super) queued: Option<BTreeMap<(usize, u32), usize>>,
    /// MAP tasks by id → task.
    pub(super) by_id: Option<HashMap<Uuid, usize>>,
    /// MAP tasks whose items changed since they were last looked at.
    pub(super) dirty: Vec<usize>,
    /// The lists of MAPs this event started, by their task, to create items from.
    pub(super) fresh: HashMap<usize, Vec<Value>>,
    /// Items this event created.
    pub(super) created_now: u32,
    /// This event created items from a chunk storage read.
    pub(super) sourced: bool,
    /// MAPs whose reduction failed, with why: they fail at their next look.
    pub(super) broken: HashMap<usize, super::task::Failure>,
    /// MAPs' outputs storage gathered ([`Event::ItemsCollected`](super::Event::ItemsCollected)), by their task.
    pub(super) collected: HashMap<usize, Value>,
    /// The scope a MAP's TRANSFORM items restarted in this event are
    /// evaluated in, by the MAP's task: built (and charged) once.
    pub(super) item_scopes: HashMap<usize, crate::expr::Scope>,
}

/// An HTTP node's evaluated config with its `idempotency_key`: by default
/// `<task id>:<attempt>` of the attempt this execution began with, so that
/// its retries and reclaims send the same key (a new one comes only with a
/// new execution: an operator's retry or rerun); the node's own key, or
/// `"per_attempt"`, as written.
pub(super) fn with_idempotency_key(kind: &NodeKind, mut input: Value, task_id: Uuid, attempt: i32) -> Value {
    if let (NodeKind::Http, Value::Object(config)) = (kind, &mut input) {
        config.entry("idempotency_key").or_insert_with(|| Value::String(format!("{task_id}:{attempt}")));
    }
    input
}

/// A new execution of a task (a retried MAP's item, a rerun item): an
/// idempotency key it had by default names its new attempt.
pub(super) fn renew_idempotency_key(task: &mut Task) {
    let default_key = format!("{}:", task.id);
    if task.input["idempotency_key"].as_str().is_some_and(|k| k.starts_with(&default_key)) {
        task.input["idempotency_key"] = Value::String(format!("{default_key}{}", task.attempt));
    }
}
