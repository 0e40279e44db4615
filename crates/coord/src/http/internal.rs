//! The Rust worker's report path (`/internal`): a result for one attempt,
//! applied only while the reporting worker holds the task's lease, as the
//! task API's `/complete` and `/fail` are.

use std::sync::Arc;

use axum::extract::State;
use axum::http::HeaderMap;
use axum::Json;
use composer_api::wire::{EagerOffer, ReportReply, ReportStatus, TaskReport, EAGER_HEADER, PRIORITY_HEADER};
use composer_api::ErrorBody;
use composer_core::machine::Event;
use serde_json::Value;

use super::error::ApiResult;
use super::extract::{task_id, Body, Path};
use super::tasks::completed;
use super::tasks::MAX_ERROR_CHARS;
use crate::engine::Reported;
use crate::shared::Shared;

/// Report a task's result (Rust workers).
///
/// A worker's report of one attempt of a task. Applied only while `worker_id` holds the lease of
/// `attempt`: a report of a worker that lost its lease, or of one that never held it, is a 409. An
/// error longer than 65,536 characters is cut to that length.
///
/// Eager dispatch: with a `composer-eager` header (`slots=<n>; lease_ms=<ms>;
/// queues=<q>,…`) the worker offers to run up to `slots` tasks of those
/// queues that the report makes ready. The commit that applies the report
/// leases them to it, and the answer's `next` carries them: no stream, no
/// lease of their own. Tasks it does not take go through the streams.
///
/// With a `composer-priority` header (`1` to `5`, the run's priority as the
/// task's stream said it) the report waits for the coordinator's next batch
/// at that priority, so the reports of a backlog do not hold up those of a
/// more urgent run.
#[utoipa::path(
    post, path = "/internal/v1/tasks/{id}/result", operation_id = "reportTaskResult", tag = "workers",
    params(
        ("id" = Uuid, Path, description = "the task"),
        ("composer-eager" = Option<composer_api::wire::EagerHeader>, Header, description = "`slots=<1-16>; lease_ms=<1000-3600000>; queues=<queue>,…`: tasks this worker takes with the answer; one that does not read is ignored"),
        ("composer-priority" = Option<u8>, Header, description = "`1` to `5`, the run's priority: the report waits for a batch at that priority; one that does not read is the default, 3"),
    ),
    request_body = TaskReport,
    responses(
        (status = 200, description = "applied, or ignored with the reason (a duplicate, late or stale report); `next` holds the tasks leased to this worker with it", body = ReportReply),
        (status = 409, description = "this worker does not hold the task's lease: the result was dropped", body = ErrorBody),
    )
)]
pub(crate) async fn report(
    State(s): State<Arc<Shared>>,
    Path(id): Path<String>,
    headers: HeaderMap,
    Body(r): Body<TaskReport, true>,
) -> ApiResult<Json<ReportReply>> {
    let started = std::time::Instant::now();
    let task_id = task_id(&id)?;
    // A hint, not part of the result: one that does not read is ignored
    // (refused, the report would fail its attempt for good).
    let offer = headers.get(EAGER_HEADER).and_then(|v| {
        let parsed = v.to_str().map_err(|_| "not plain text".to_string()).and_then(EagerOffer::parse);
        parsed.inspect_err(|e| tracing::debug!(%task_id, error = %e, "ignoring a malformed {EAGER_HEADER} header")).ok()
    });
    let event = match r.status {
        // An output that cannot be stored (too large, too deep, a NUL) ends
        // the attempt for good, naming why: retrying would get it again.
        ReportStatus::Completed => completed(task_id, r.attempt, r.output.unwrap_or(Value::Null), s.config.max_payload),
        ReportStatus::Failed => Event::TaskFailed {
            task_id,
            attempt: r.attempt,
            error: capped(r.error.unwrap_or_else(|| "failed without an error message".into()))
                .replace('\0', "\u{FFFD}"),
            retryable: r.retryable,
            code: r.code,
            status: r.http_status.filter(|s| (100..=599).contains(s)),
            retry_after: r.retry_after_ms.map(std::time::Duration::from_millis),
        },
    };
    let priority = headers
        .get(PRIORITY_HEADER)
        .and_then(|v| composer_api::wire::priority_of_header(v.as_bytes()))
        .unwrap_or(composer_core::priority::DEFAULT);
    let reported = Reported { stages: r.stages, offer, priority };
    let handled = s.engine.handle_reported(r.run_id, event, r.worker_id, reported).await?;
    composer_metrics::observe(composer_metrics::REPORT_DURATION, &[], started.elapsed());
    composer_metrics::observe(composer_metrics::STEP_STAGE, &[("stage", "report_to_commit")], started.elapsed());
    if !handled.next.is_empty() {
        composer_metrics::inc(composer_metrics::EAGER_DISPATCHES, &[], handled.next.len() as u64);
    }
    let next = handled.next.into_iter().map(|g| g.dispatch).collect();
    Ok(Json(ReportReply { applied: handled.ignored.is_none(), ignored: handled.ignored, next }))
}

/// An error cut to [`MAX_ERROR_CHARS`], saying so. Cut rather than refused:
/// a worker whose report is refused sends it again, and would for ever.
fn capped(error: String) -> String {
    match error.char_indices().nth(MAX_ERROR_CHARS) {
        None => error,
        Some((end, _)) => {
            const MARK: &str = " [cut]";
            let keep = error[..end].char_indices().nth_back(MARK.chars().count() - 1).map_or(0, |(i, _)| i);
            format!("{}{MARK}", &error[..keep])
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_error_over_the_cap_is_cut_to_it_and_says_so() {
        let short = "x".repeat(MAX_ERROR_CHARS);
        assert_eq!(capped(short.clone()), short);
        let long = "é".repeat(MAX_ERROR_CHARS + 1);
        let cut = capped(long);
        assert_eq!(cut.chars().count(), MAX_ERROR_CHARS);
        assert!(cut.ends_with(" [cut]"), "{}", &cut[cut.len() - 20..]);
    }
}
