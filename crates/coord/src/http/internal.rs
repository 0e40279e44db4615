//! The Rust worker's report path (`/internal`): a result for one attempt.

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::Json;
use composer_api::wire::{ReportAck, ReportStatus, TaskReport};
use composer_core::machine::Event;
use serde_json::Value;

use super::error::ApiResult;
use super::extract::{task_id, Body};
use super::runs::completed;
use crate::shared::Shared;

/// A worker's report of one attempt of a task.
#[utoipa::path(
    post, path = "/internal/v1/tasks/{id}/result", operation_id = "reportTaskResult", tag = "workers",
    params(("id" = Uuid, Path, description = "the task")),
    request_body = TaskReport,
    responses((status = 200, description = "applied, or ignored with the reason (a duplicate, late or stale report)", body = ReportAck))
)]
pub(crate) async fn report(
    State(s): State<Arc<Shared>>,
    Path(id): Path<String>,
    Body(r): Body<TaskReport, true>,
) -> ApiResult<Json<ReportAck>> {
    let started = std::time::Instant::now();
    let task_id = task_id(&id)?;
    let event = match r.status {
        // An output that cannot be stored (too large, too deep, a NUL) ends
        // the attempt for good, naming why: retrying would get it again.
        ReportStatus::Completed => completed(task_id, r.attempt, r.output.unwrap_or(Value::Null), s.config.max_payload),
        ReportStatus::Failed => Event::TaskFailed {
            task_id,
            attempt: r.attempt,
            error: r.error.unwrap_or_else(|| "failed without an error message".into()).replace('\0', "\u{FFFD}"),
            retryable: r.retryable,
        },
    };
    let handled = s.engine.handle(r.run_id, event).await?;
    composer_metrics::observe(composer_metrics::REPORT_DURATION, &[], started.elapsed());
    composer_metrics::observe(composer_metrics::STEP_STAGE, &[("stage", "report_to_commit")], started.elapsed());
    Ok(Json(ReportAck { applied: handled.ignored.is_none(), ignored: handled.ignored }))
}
