//! What a handler is given and what it answers: the task's context, a
//! failure, and a registered handler.

use std::sync::Arc;

use futures_util::future::BoxFuture;
use serde_json::Value;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::secrets::Secrets;

/// What a handler knows about the task it runs.
#[derive(Debug, Clone)]
pub struct TaskContext {
    pub task_id: Uuid,
    pub run_id: Uuid,
    pub node_id: String,
    pub node_type: String,
    pub attempt: i32,
    /// Cancelled when the lease is lost (taken over, or the run cancelled):
    /// a long handler should stop early; its result is discarded anyway.
    pub cancelled: CancellationToken,
    /// The secrets the input holds: an error should not quote a value that
    /// holds one ([`Secrets::holds`]). The result is scrubbed of them anyway.
    pub secrets: Secrets,
}

/// A failed attempt. Retryable failures are retried by the node's policy;
/// `code` (and, for an HTTP answer, `status`) is what a failure edge can
/// test of it (`.nodes.X.error.code`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskError {
    pub message: String,
    pub retryable: bool,
    /// A stable name for what went wrong (1 to 64 of `a-z`, `0-9`, `_.-`);
    /// `task_failed` when none is given.
    pub code: Option<String>,
    pub status: Option<u16>,
}

impl TaskError {
    pub fn retryable(message: impl Into<String>) -> TaskError {
        TaskError { message: message.into(), retryable: true, code: None, status: None }
    }

    pub fn fatal(message: impl Into<String>) -> TaskError {
        TaskError { message: message.into(), retryable: false, code: None, status: None }
    }

    /// The same failure, with a code for failure edges to test.
    pub fn with_code(mut self, code: impl Into<String>) -> TaskError {
        self.code = Some(code.into());
        self
    }
}

pub(crate) type Handler = Arc<dyn Fn(TaskContext, Value) -> BoxFuture<'static, Result<Value, TaskError>> + Send + Sync>;

pub(crate) struct Registration {
    pub(crate) queue: String,
    pub(crate) handler: Handler,
}
