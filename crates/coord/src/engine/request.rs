//! What is asked of the engine: an event for a run, and who asks
//! ([`EventRequest`]), and what the engine answers ([`Answer`]).

use composer_api::wire::{EagerOffer, StageTimes};
use composer_core::machine::Event;
use composer_core::priority;
use uuid::Uuid;

use crate::trace::TraceNote;

/// An event to apply to a run, who asks, and what it tells its task's
/// span: the one thing [`super::Engine::handle`] takes.
#[derive(Debug, Clone)]
pub struct EventRequest {
    pub run_id: Uuid,
    pub event: Event,
    pub by: By,
    /// What the event tells its task's span (kept only while traces are on).
    pub trace_note: Option<TraceNote>,
}

impl EventRequest {
    /// An event the engine itself sends: a timer, a child's end, recovery.
    pub fn new(run_id: Uuid, event: Event) -> EventRequest {
        EventRequest { run_id, event, by: By::Engine, trace_note: None }
    }

    /// The same event, asked by `by`.
    pub fn by(self, by: By) -> EventRequest {
        EventRequest { by, ..self }
    }

    /// The same event, with what it tells its task's span (an event that
    /// completes a wait links the span of the event that came).
    pub fn noting(self, note: TraceNote) -> EventRequest {
        EventRequest { trace_note: Some(note), ..self }
    }

    /// A worker's report of its attempt: applied only while `worker` holds
    /// the attempt's lease, at the priority its run was sent at.
    pub fn reported(run_id: Uuid, event: Event, worker: String, report: Report) -> EventRequest {
        let Report { stages, offer, priority } = report;
        let note = TraceNote { task_id: event.task_id(), stages, link: None };
        EventRequest { run_id, event, by: By::Worker(Reporter { worker, offer, priority }), trace_note: Some(note) }
    }

    /// How urgently it waits for a batch: a control action before the work
    /// of every priority (a cancel must not wait behind the backlog it may
    /// be meant to stop), a report at its run's priority, the rest at the
    /// default.
    pub fn priority(&self) -> u8 {
        match &self.by {
            By::Operator(_) => priority::HIGHEST,
            By::Worker(r) => r.priority,
            By::Engine | By::Bulk(..) => priority::DEFAULT,
            // A caller waits for its answer.
            By::Update(_) => priority::HIGHEST,
        }
    }
}

/// Who asks for an event, and what that asks of the batch.
#[derive(Debug, Clone, Default)]
pub enum By {
    /// The engine itself: a timer, a child's end, recovery, an event that
    /// came for a waiting step.
    #[default]
    Engine,
    /// A worker's report, which must hold the task's lease at the event's
    /// attempt (checked in the batch's transaction).
    Worker(Reporter),
    /// An operator's control action: its history records who and why.
    Operator(Control),
    /// One run of a bulk job: applied at most once per (job, run), marked
    /// in the batch's transaction ([`super::EngineError::AlreadyDone`]
    /// when it was).
    Bulk(Control, Uuid),
    /// An update a waiting step accepted: applied at most once per (run,
    /// update id), recorded with its answer in the batch's transaction
    /// ([`super::EngineError::AlreadyDone`] when it was).
    Update(Box<composer_store::updates::Accepted>),
}

/// The worker whose report an event is, and what it offers: tasks the
/// event makes ready, of the offer's queues, are leased to it in the same
/// commit (eager dispatch).
#[derive(Debug, Clone)]
pub struct Reporter {
    pub worker: String,
    pub offer: Option<EagerOffer>,
    /// The priority its run was sent at.
    pub priority: u8,
}

/// What a worker's report says besides its event: its stage times, what
/// it offers to run next, and its run's priority.
#[derive(Debug)]
pub struct Report {
    pub stages: Option<StageTimes>,
    pub offer: Option<EagerOffer>,
    pub priority: u8,
}

/// Who took a control action, and why, as its history records them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Control {
    /// The name of the token that asked (`COMPOSER_API_TOKEN_NAME`).
    pub actor: String,
    pub reason: Option<String>,
}

/// The result of handling one event.
#[derive(Debug, Clone)]
pub struct Answer {
    pub status: composer_core::machine::RunStatus,
    /// Why the event changed nothing (duplicate, late, stale …).
    pub ignored: Option<String>,
    /// Tasks leased with the answer to the worker whose report this was
    /// (see [`By::Worker`]).
    pub next: Vec<composer_store::transitions::EagerLease>,
}

impl Answer {
    pub fn new(status: composer_core::machine::RunStatus, ignored: Option<String>) -> Answer {
        Answer { status, ignored, next: Vec::new() }
    }
}
