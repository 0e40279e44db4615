//! The task API as calls, for a worker in its coordinator's process
//! (`composer dev`, the bench): the coordinator implements
//! [`InProcessApi`] with its routes' own checks and engine calls, and the
//! worker calls it instead of sending HTTP, treating its answers and
//! refusals as it treats the routes' (a lost lease stops the task, a result
//! refused for what it says becomes the attempt's failure, the rest is
//! tried again until the report's deadline). No HTTP, no JSON, no token.

use std::future::Future;
use std::pin::Pin;

use crate::{CompleteTask, FailTask, PollTasks, ReportAck, TaskBatch, TaskHeartbeat, TaskLogs};
use uuid::Uuid;

/// A call's answer, to come.
pub type Pending<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A call the coordinator refused, as its route would have answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub status: u16,
    /// The stable code (`lease_lost`, `invalid_request`, …).
    pub code: String,
    pub message: String,
}

/// The task API of a coordinator in this process.
pub trait InProcessApi: Send + Sync + 'static {
    fn poll(&self, poll: PollTasks) -> Pending<'_, Result<TaskBatch, Refusal>>;
    fn heartbeat(&self, task: Uuid, heartbeat: TaskHeartbeat) -> Pending<'_, Result<(), Refusal>>;
    fn logs(&self, task: Uuid, logs: TaskLogs) -> Pending<'_, Result<(), Refusal>>;
    /// A result, at the run's `priority`.
    fn complete(&self, task: Uuid, priority: u8, report: CompleteTask) -> Pending<'_, Result<ReportAck, Refusal>>;
    /// A failure, at the run's `priority`.
    fn fail(&self, task: Uuid, priority: u8, report: FailTask) -> Pending<'_, Result<ReportAck, Refusal>>;
}

impl Refusal {
    /// The coordinator's own word that this worker no longer holds the lease.
    pub fn lease_lost(&self) -> bool {
        self.status == 409 && self.code == crate::LEASE_LOST
    }
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "the coordinator in this process refused: HTTP {} {}: {}", self.status, self.code, self.message)
    }
}
