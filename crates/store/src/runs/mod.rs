//! Runs and tasks: their rows, the engine's locked read ([`lock_many`]) and
//! the reads behind the API. The engine's write is in [`crate::transitions`].
//!
//! Every change to a run happens in a transaction that first takes the run
//! row's lock (`SELECT … FOR UPDATE`), so events for one run apply one after
//! another on any number of coordinators, while different runs proceed in
//! parallel.
//!
//! - `rows`: the rows of runs and tasks, and the columns every read names.
//! - `machine_view`: rows in the state machine's form.
//! - `start`: a new run's row, and the idempotency key's lock.
//! - `concurrency`: concurrency keys and the runs QUEUED behind them.
//! - `locked`: the engine's read of the runs it locks.
//! - `maps`: a MAP's items and list.
//! - `children`: the child runs of SUB_WORKFLOW and LOOP attempts.
//! - `priority_change`: a new priority for an open run tree.
//! - `migrate`: a run moved to another version of its workflow.
//! - `faulted`: failing a run whose events fail every time.
//! - `reads`: what the API reads of one run.
//! - `history`: a run's history lines and the edges they record.
//! - `filter`: the runs a filter matches (lists, bulk jobs, counts).

mod children;
mod concurrency;
mod faulted;
mod filter;
mod history;
mod locked;
mod machine_view;
mod maps;
mod migrate;
mod priority_change;
mod reads;
mod rows;
mod start;

pub use children::{
    childless_attempts, claim_child_slot, orphaned_children, stale_children, stale_item_children, unreported_children,
    ChildHolder, ChildSlot, FinishedChild,
};
pub use concurrency::{
    concurrency_usage, lock_concurrency_key, lock_queued, queue_head, queue_position, queued_keys, set_running,
    try_lock_concurrency_key,
};
pub use faulted::fail_faulted;
pub use filter::{count_matching, list, matching_ids, nodes_missing, RunFilter};
pub use history::{history, taken_edges, HistoryRow};
pub use locked::{load_nodes, lock_many, InPart, Locked};
pub use machine_view::{into_machine, to_machine_task};
pub use maps::{items, load_items, load_sources, stalled_maps, Items};
pub use migrate::move_to;
pub use priority_change::{set_priority, PriorityChange, MAX_PRIORITY_MOVES};
pub use reads::{exists, get, handlers_of, named_objects, queue_backlog, status, task_of_node};
pub use rows::{Parent, RunRow, TaskRow};
pub use start::{insert_run, insert_runs, lock_idempotency_key, NewRun};
