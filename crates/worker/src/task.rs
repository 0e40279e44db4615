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
    /// The W3C `traceparent` of this attempt's span: pass it on (as the
    /// HTTP node does, in a `traceparent` header) to join the run's trace.
    pub traceparent: Option<String>,
    /// Cancelled when the lease is lost (taken over, or the run cancelled):
    /// a long handler should stop early; its result is discarded anyway.
    pub cancelled: CancellationToken,
    /// The secrets the input holds: an error should not quote a value that
    /// holds one ([`Secrets::holds`]). The result is scrubbed of them anyway.
    pub secrets: Secrets,
    pub(crate) logs: LogBuffer,
}

impl TaskContext {
    /// Adds a line to the step's log (`GET /v1/runs/{id}/tasks/{node}/logs`,
    /// the run page in the UI): sent to a coordinator about once a second
    /// and when the handler ends, scrubbed of the input's secrets. A
    /// coordinator keeps at most `COMPOSER_TASK_LOG_MAX_BYTES` per attempt;
    /// the worker holds at most [`MAX_PENDING_LOG_LINES`] unsent, and says
    /// how many it dropped past that.
    pub fn log(&self, line: impl Into<String>) {
        // A NUL cannot be stored (the coordinator would refuse the batch),
        // and the coordinator keeps 4,096 bytes of a line: cut here, so that
        // no batch of a hundred lines is ever too large to send.
        let mut line = self.secrets.scrub_message(&line.into()).replace('\0', "\u{FFFD}");
        if line.len() > MAX_LOG_LINE_BYTES {
            let mut end = MAX_LOG_LINE_BYTES;
            while !line.is_char_boundary(end) {
                end -= 1;
            }
            line.truncate(end);
        }
        self.logs.push(line);
    }
}

/// The longest line a coordinator keeps, in bytes; `log` cuts a longer one.
pub use composer_api::MAX_LOG_LINE_BYTES;

/// Most lines a task's log holds before they are sent.
pub const MAX_PENDING_LOG_LINES: usize = 1000;

/// Lines a handler logged and the worker has not sent yet.
#[derive(Debug, Clone, Default)]
pub(crate) struct LogBuffer {
    pending: Arc<std::sync::Mutex<Pending>>,
    /// Held while lines are sent, so that they land in order.
    pub(crate) sending: Arc<tokio::sync::Mutex<()>>,
}

#[derive(Debug, Default)]
struct Pending {
    lines: Vec<String>,
    dropped: usize,
}

impl LogBuffer {
    fn push(&self, line: String) {
        let mut p = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        if p.lines.len() < MAX_PENDING_LOG_LINES {
            p.lines.push(line);
        } else {
            p.dropped += 1;
        }
    }

    /// Takes what is pending, with a line saying how many were dropped.
    /// Whether any line waits to be sent.
    pub(crate) fn pending(&self) -> bool {
        let p = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        !p.lines.is_empty() || p.dropped > 0
    }

    pub(crate) fn take(&self) -> Vec<String> {
        let mut p = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        let mut lines = std::mem::take(&mut p.lines);
        if p.dropped > 0 {
            lines.push(format!(
                "[worker: {} lines dropped: more than {MAX_PENDING_LOG_LINES} waited to be sent]",
                p.dropped
            ));
            p.dropped = 0;
        }
        lines
    }
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
    /// How long the target asked to wait before another try (a 429's
    /// `Retry-After`).
    pub retry_after: Option<std::time::Duration>,
}

impl TaskError {
    pub fn retryable(message: impl Into<String>) -> TaskError {
        TaskError { message: message.into(), retryable: true, code: None, status: None, retry_after: None }
    }

    pub fn fatal(message: impl Into<String>) -> TaskError {
        TaskError { message: message.into(), retryable: false, code: None, status: None, retry_after: None }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_buffer_counts_what_it_drops_and_says_so_once() {
        let b = LogBuffer::default();
        for i in 0..MAX_PENDING_LOG_LINES + 3 {
            b.push(format!("line {i}"));
        }
        let lines = b.take();
        assert_eq!(lines.len(), MAX_PENDING_LOG_LINES + 1);
        assert!(lines.last().unwrap().contains("3 lines dropped"), "{:?}", lines.last());
        assert!(b.take().is_empty());
    }
}
