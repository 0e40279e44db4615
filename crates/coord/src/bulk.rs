//! Bulk jobs at work: every coordinator takes a running job in turn (its
//! row locked, so one at a time works it), acts on the next batch of the
//! runs its filter matches, oldest first, and records the batch. Each run's
//! action is marked in its own commit (`Engine::handle_bulk`), so a batch
//! worked again after a crash acts on no run twice, and a run whose action
//! failed for a passing reason is looked at again, not skipped. A migrate
//! job's runs are those still open on the version it moves from.

use composer_api::BulkFilter;
use composer_core::machine::migrate::Mapping;
use composer_core::machine::{Event, RunStatus};
use composer_store::bulk::{self, Batch, JobRow};
use composer_store::runs::{self, RunFilter};
use futures_util::future::join_all;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::engine::{By, Control, EngineError, EventRequest};
use crate::shared::Shared;

/// Runs one batch of a bulk job acts on.
pub const BATCH: i64 = 100;

/// Works one batch of one running job, if any; true when there was one
/// and the next may follow at once (false after a passing failure: the
/// caller waits before the run is looked at again).
pub async fn work_one_batch(s: &Shared) -> Result<bool, composer_store::Error> {
    let mut client = composer_store::client(&s.pool).await?;
    let tx = composer_store::begin(&mut client).await?;
    let Some(job) = bulk::claim(&tx).await? else { return Ok(false) };
    let filter: BulkFilter = serde_json::from_value(job.filter.clone())
        .map_err(|e| composer_store::Error::Corrupt(format!("bulk job {}: its filter: {e}", job.id)))?;
    let mut read = composer_store::client(&s.pool).await?;
    let mut run_filter = run_filter(&filter, Some(job.until_id));
    let target = job.migrate.as_ref().map(Target::of).transpose()?;
    if let Some(t) = &target {
        // Runs still on the version moved from, and open: a run moved is
        // not looked at again.
        run_filter.version = Some(t.from_version);
        run_filter.open = true;
    }
    let ids = runs::matching_ids(&mut read, &run_filter, job.cursor, BATCH).await?;
    let mut batch = Batch {
        cursor: ids.last().copied(),
        looked_at: ids.len() as i64,
        done: (ids.len() as i64) < BATCH,
        ..Batch::default()
    };
    let control = Control { actor: job.actor.clone(), reason: job.reason.clone() };
    let acts = ids.iter().map(|&run| act(s, &read, &job, target.as_ref(), run, control.clone()));
    let outcomes = join_all(acts).await;
    // A run that failed for a passing reason (the engine busy, a connection
    // lost) is looked at again: the batch ends before it, and the runs after
    // it are counted when looked at again (one acted on is marked, and
    // counts as acted on then; one moved no longer matches).
    let again = outcomes.iter().position(|o| matches!(o, Err(e) if !e.is_permanent()));
    let mut last_error = None;
    if let Some(i) = again {
        batch = Batch { cursor: i.checked_sub(1).map(|p| ids[p]), looked_at: i as i64, done: false, ..batch };
        last_error = outcomes[i].as_ref().err().map(ToString::to_string);
    }
    for outcome in outcomes.into_iter().take(again.unwrap_or(usize::MAX)) {
        match outcome {
            Ok(true) => batch.acted_on += 1,
            Ok(false) => batch.refused += 1,
            Err(e) => {
                batch.refused += 1;
                last_error = Some(e.to_string());
            }
        }
    }
    bulk::advance(&tx, job.id, &batch, last_error.as_deref()).await?;
    tx.commit().await?;
    if batch.done {
        tracing::info!(job = %job.id, action = %job.action, "bulk job done");
    }
    Ok(again.is_none())
}

/// Acts on one run: true when the action was applied now or by an earlier
/// try of this batch, false when the run's state refused it.
async fn act(
    s: &Shared,
    read: &composer_store::Client,
    job: &JobRow,
    target: Option<&Target>,
    run: Uuid,
    control: Control,
) -> Result<bool, EngineError> {
    let event = match target {
        Some(t) => t.event(),
        None => match event(read, &job.action, job.rerun_from.as_deref().unwrap_or_default(), run).await? {
            Some(event) => event,
            None => return Ok(false),
        },
    };
    // A run this job acted on already (an earlier try of the batch) counts
    // as applied.
    match s.engine.handle(EventRequest::new(run, event).by(By::Bulk(control, job.id))).await {
        Err(EngineError::AlreadyDone) => Ok(true),
        handled => Ok(handled?.ignored.is_none()),
    }
}

/// The event of a bulk action for one run: `None` when the run has not
/// reached a step a rerun starts from.
pub async fn event(
    read: &composer_store::Client,
    action: &str,
    rerun_from: &[String],
    run: Uuid,
) -> Result<Option<Event>, EngineError> {
    Ok(Some(match action {
        "cancel" => Event::CancelRun,
        "retry" => Event::RetryRun,
        "pause" => Event::PauseRun,
        "resume" => Event::ResumeRun,
        "rerun" => {
            let mut tasks = Vec::new();
            for node in rerun_from {
                match runs::task_of_node(read, run, node).await? {
                    Some(t) => tasks.push(t.id),
                    None => return Ok(None),
                }
            }
            Event::RerunFrom { tasks, input: None, allow_completed: true }
        }
        other => return Err(composer_store::Error::Corrupt(format!("bulk action {other:?}")).into()),
    }))
}

/// What a migrate job moves runs to, as stored with it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Target {
    /// The id of the version moved to.
    pub definition: Uuid,
    pub from_version: i32,
    pub to_version: i32,
    #[serde(default)]
    pub map: Mapping,
}

impl Target {
    fn of(stored: &serde_json::Value) -> Result<Target, composer_store::Error> {
        serde_json::from_value(stored.clone())
            .map_err(|e| composer_store::Error::Corrupt(format!("a migrate job's target: {e}")))
    }

    fn event(&self) -> Event {
        Event::Migrate {
            definition: self.definition,
            from_version: self.from_version,
            to_version: self.to_version,
            map: self.map.clone(),
        }
    }
}

/// A bulk filter as the runs' filter (runs created before `until` only).
pub fn run_filter(f: &BulkFilter, until: Option<Uuid>) -> RunFilter<'_> {
    let id_at = |t: chrono::DateTime<chrono::Utc>| Uuid::from_u128((t.timestamp_millis().max(0) as u128) << 80);
    let before = f.created_before.map(id_at);
    RunFilter {
        workflow: f.workflow.as_deref(),
        status: f.status,
        parent: None,
        since: f.created_after.map(id_at),
        until: match (before, until) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        },
        tags: f.tags.as_ref(),
        ..RunFilter::default()
    }
}

/// The status a run must be in for an action to change it, when there is
/// one: a dry run counts only those.
pub fn acts_on(action: &str) -> Option<RunStatus> {
    match action {
        "retry" => Some(RunStatus::Failed),
        "pause" => Some(RunStatus::Running),
        "resume" => Some(RunStatus::Paused),
        _ => None,
    }
}
