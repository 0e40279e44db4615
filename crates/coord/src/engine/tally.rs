//! What the engine counts: each event applied or ignored, each run that
//! ended and how long it took.

use composer_core::definition::Workflow;
use composer_core::machine::{self, RunStatus};
use uuid::Uuid;

/// Counts a run that ended, and its time from creation (its UUIDv7 id
/// carries the millisecond it was created) to now.
pub fn run_finished(wf: &Workflow, run: &machine::Run) {
    let status = run.status.as_str();
    crate::metrics::inc(composer_metrics::RUNS_FINISHED, &[("status", status)], 1);
    if let Some((secs, nanos)) = run.id.get_timestamp().map(|t| t.to_unix()) {
        let created = std::time::UNIX_EPOCH + std::time::Duration::new(secs, nanos);
        if let Ok(took) = std::time::SystemTime::now().duration_since(created) {
            crate::metrics::observe(
                composer_metrics::RUN_DURATION,
                &[("workflow", &wf.spec.name), ("status", status)],
                took,
            );
        }
    }
}

/// Counts an event by what came of it, and logs it at debug.
pub fn event(run_id: Uuid, event: &'static str, tr: &machine::Transition, status: RunStatus) {
    let result = tr.ignored_kind.map(|k| k.as_str()).unwrap_or("applied");
    crate::metrics::inc(composer_metrics::EVENTS, &[("event", event), ("result", result)], 1);
    match &tr.ignored {
        Some(reason) => tracing::debug!(%run_id, event, %reason, "event ignored"),
        None => tracing::debug!(%run_id, event, %status, "event applied"),
    }
}
