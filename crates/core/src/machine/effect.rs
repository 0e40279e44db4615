//! What the state machine asks of the engine: work that needs storage
//! within the event's transaction ([`Effect`]), and what a committed
//! transition owes other runs ([`AfterCommit`]).

use uuid::Uuid;

use super::event::Event;

/// Items of a MAP the state machine needs and the run does not hold: the
/// engine loads only the items an event names, so that an item's result
/// costs the same with ten items or ten thousand. It loads these
/// ([`Effect::LoadItems`]), then applies [`Event::ItemsLoaded`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Need {
    /// Up to `count` QUEUED items, lowest index first, to start.
    Queued { map: Uuid, count: u32 },
    /// Every item, to gather the MAP's output.
    All { map: Uuid },
    /// The MAP's collected output, its items' entries in index order
    /// ([`collected_entry`](crate::machine::collected_entry) with `share`),
    /// read by storage a page at a time instead of every item loaded
    /// ([`Run::collects_in_storage`](crate::machine::Run::collects_in_storage)).
    /// Applied as [`Event::ItemsCollected`].
    Collect { map: Uuid, share: usize },
    /// `count` elements of the MAP's list from index `from`, to create
    /// their items ([`Event::SourcesLoaded`]).
    Sources { map: Uuid, from: u32, count: u32 },
}

/// What the state machine asks of the engine within the event's
/// transaction: work that needs storage. The engine does it and applies
/// the result as an event ([`Event::ItemsLoaded`], [`Event::EventReceived`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Effect {
    /// Load MAP items the run does not hold.
    LoadItems(Need),
    /// A task began to wait for `(event, key)`: deliver an event that came
    /// before it, if one is kept.
    TakeBufferedEvent { task_id: Uuid, event: String, key: String },
}

/// What a committed transition owes other runs, run by the engine after the
/// commit (and by the recovery sweeps when a coordinator dies first). See
/// [`super::after_commit`].
#[derive(Debug, Clone, PartialEq)]
pub enum AfterCommit {
    /// Start the child run of a SUB_WORKFLOW attempt, in a transaction of
    /// its own.
    StartChild { task_id: Uuid, attempt: i32, iteration: u32 },
    /// Cancel the open children of a SUB_WORKFLOW or LOOP task that it no
    /// longer waits for: those of attempts (and iterations) before this one,
    /// and this one's own too when it is `current` (it ran and stopped
    /// waiting). Never a later one's: this is run after the commit, when the
    /// task may have moved on to an attempt whose child it waits for.
    CancelChildren { task_id: Uuid, attempt: i32, iteration: u32, current: bool },
    /// A MAP whose items are SUB_WORKFLOWs ended early (its run cancelled
    /// or failed, or an item failed it): the open children of its items,
    /// which storage cancelled without the run holding them, are cancelled.
    CancelItemChildren { map_task_id: Uuid },
    /// The run ended: its parent run's attempt ends with it (`event` is the
    /// parent's [`Event::ChildFinished`]).
    NotifyParent { parent_run: Uuid, event: Event },
    /// A run under a concurrency limit ended: the next queued run of
    /// `(workflow, key)` may start.
    FreeSlot { workflow: String, key: String },
    /// A MAP stopped creating items for one event: it carries on in a
    /// transaction of its own ([`Event::ItemsLoaded`]).
    ContinueMap { task_id: Uuid },
}
