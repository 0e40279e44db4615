//! The task API for a worker in this coordinator's process (`composer dev`,
//! the bench): the routes' own checks and engine calls, with no HTTP, no
//! JSON and no token between them. A result is applied by the engine as a
//! reported one is, its answer may lease the next task in the same commit,
//! and a poll waits where this coordinator's batches hand it work; what
//! the worker does with a lease (heartbeats, expiry, recovery) is unchanged.

use std::sync::Arc;

use composer_api::in_process::{InProcessApi, Pending, Refusal};
use composer_api::{CompleteTask, FailTask, PollTasks, ReportAck, TaskBatch, TaskHeartbeat, TaskLogs};
use uuid::Uuid;

use crate::http::tasks::{self, Executor};
use crate::http::ApiError;
use crate::shared::TaskApi;

/// This coordinator's task API, called in its process: by a worker (any
/// task of its queues), or by the coordinator's own HTTP executor (only
/// the HTTP calls reading no secret that its batches hand it).
#[derive(Clone)]
pub struct InProcess(Arc<TaskApi>, Executor);

fn refusal(e: ApiError) -> Refusal {
    let (status, code) = e.status_and_code();
    Refusal { status: status.as_u16(), code: code.to_string(), message: e.to_string() }
}

/// A result's priority as its route reads `composer-priority`: one that is
/// not a level is the default (a hint, never a reason to refuse).
fn level(priority: u8) -> u8 {
    match composer_core::priority::is_level(i64::from(priority)) {
        true => priority,
        false => composer_core::priority::DEFAULT,
    }
}

impl InProcess {
    pub(crate) fn new(api: Arc<TaskApi>) -> InProcess {
        InProcess(api, Executor::Worker)
    }

    pub(crate) fn for_http_executor(api: Arc<TaskApi>) -> InProcess {
        InProcess(api, Executor::Coordinator)
    }
}

impl InProcessApi for InProcess {
    /// `POST /v1/tasks/poll`, refused once this coordinator drains: over
    /// HTTP a stopped coordinator takes no poll (its listener is closed),
    /// but this one would still lease from the streams to the worker in its
    /// process, whose results it could no longer apply.
    fn poll(&self, poll: PollTasks) -> Pending<'_, Result<TaskBatch, Refusal>> {
        Box::pin(async move {
            if self.0.draining.has_begun() {
                return Err(refusal(ApiError::Draining));
            }
            match self.1 {
                Executor::Worker => tasks::poll_tasks(&self.0, poll).await.map_err(refusal),
                Executor::Coordinator => tasks::take_handed(&self.0, poll).await.map_err(refusal),
            }
        })
    }

    /// `POST /v1/tasks/{id}/heartbeat`.
    fn heartbeat(&self, task: Uuid, heartbeat: TaskHeartbeat) -> Pending<'_, Result<(), Refusal>> {
        Box::pin(async move { tasks::extend_lease(&self.0, task, heartbeat).await.map(drop).map_err(refusal) })
    }

    /// `POST /v1/tasks/{id}/logs`.
    fn logs(&self, task: Uuid, logs: TaskLogs) -> Pending<'_, Result<(), Refusal>> {
        Box::pin(async move { tasks::append_logs(&self.0, task, logs).await.map(drop).map_err(refusal) })
    }

    /// `POST /v1/tasks/{id}/complete`, at the run's `priority`.
    fn complete(&self, task: Uuid, priority: u8, report: CompleteTask) -> Pending<'_, Result<ReportAck, Refusal>> {
        let priority = level(priority);
        Box::pin(async move { tasks::complete_task(&self.0, task, report, priority, self.1).await.map_err(refusal) })
    }

    /// `POST /v1/tasks/{id}/fail`, at the run's `priority`.
    fn fail(&self, task: Uuid, priority: u8, report: FailTask) -> Pending<'_, Result<ReportAck, Refusal>> {
        let priority = level(priority);
        Box::pin(async move { tasks::fail_task(&self.0, task, report, priority, self.1).await.map_err(refusal) })
    }
}
