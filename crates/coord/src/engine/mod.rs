//! `handle(run_id, event)`: the one way a run changes. One transaction: lock
//! the run row, load its tasks, apply the pure state machine and the effects
//! it asks for, write the changes, outbox rows and history, commit. A crash
//! anywhere rolls all of it back, and the run lock serializes events of one
//! run across every coordinator. What a commit owes other runs (a child to
//! start, a parent to tell, a queued run to admit) runs after it, each in a
//! transaction of its own, with a recovery sweep behind it.
//!
//! - [`runner`]: the [`Engine`]: its queue and batch loops, the batch's
//!   transaction, the work after a commit.
//! - [`batch`]: the queue and what a batch is.
//! - [`effects`]: applies an event and the effects it asks for.
//! - [`evaluator`]: the one door to the evaluator, and the threads that
//!   evaluate what is not simple, off the async runtime.
//! - [`flight`]: the flight recorder, which names what an evaluation that
//!   killed the process was for, and the coordinator's state directory.
//! - [`admission`]: creating a run under its concurrency limit.
//! - [`handler`]: the failure handler a run's end starts, in its commit.
//! - [`loaded`]: a run as a transaction holds it.
//! - [`idle`]: polls waiting for work, which a batch's commit leases tasks to.
//! - [`publisher`]: what a commit hands to the publishing loop.
//! - [`store`]: the seam with storage ([`store::RunStore`]).
//! - [`error`]: [`EngineError`] and the typed [`Rejection`]s.

pub mod admission;
pub mod batch;
pub mod effects;
pub mod error;
pub mod evaluator;
pub mod flight;
pub mod handler;
pub mod idle;
pub mod loaded;
pub mod publisher;
pub mod runner;
pub mod store;

pub use admission::{Limits, TreeBudget};
pub use batch::{Control, Handled};
pub use error::{EngineError, Rejection, Result};
pub use runner::{Engine, Lane, Reported, StartOptions, Started, URGENT_LOOPS};
