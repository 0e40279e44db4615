//! Schedules: the pass of the timer loop that fires them. Every coordinator
//! runs the pass; a schedule is handled under its row lock (`FOR UPDATE SKIP LOCKED`), and the runs it starts
//! commit with the move of its `next_fire_at`, so each fire time starts one
//! run however many coordinators there are.

use chrono::{DateTime, Utc};
use composer_core::schedule::{Overlap, Schedule};
use composer_store::schedules;
use serde_json::json;
use uuid::Uuid;

use crate::engine::{EngineError, Started};
use crate::shared::Shared;

/// Fire times this many past are forgotten by the fires table (the key
/// there only guards fire times still being handled).
const FIRES_KEPT: chrono::Duration = chrono::Duration::days(7);

/// The definition a schedule starts runs of, if it is still registered.
pub(crate) async fn definition(
    tx: &composer_store::Transaction<'_>,
    schedule: &Schedule,
) -> Result<Option<composer_store::definitions::DefinitionRow>, composer_store::Error> {
    composer_store::definitions::by_name(tx, &schedule.spec.workflow, schedule.spec.version).await
}

/// Handles every schedule with work to do, one transaction each; returns
/// how many runs were started.
pub async fn fire_due(shared: &Shared) -> Result<usize, EngineError> {
    let mut started = 0;
    for _ in 0..shared.config.timer_batch.max(1) {
        match fire_one(shared).await? {
            Some(n) => started += n,
            None => break,
        }
    }
    Ok(started)
}

/// One due schedule: a buffered fire whose blocking run ended, then the fire
/// times due (within the catch-up window, oldest first) under the overlap
/// policy; older ones are missed. `None` when no schedule was due.
async fn fire_one(shared: &Shared) -> Result<Option<usize>, EngineError> {
    let mut client = composer_store::client(&shared.pool).await?;
    let tx = client.transaction().await?;
    let Some(row) = schedules::lock_due(&tx).await? else { return Ok(None) };
    let schedule = match Schedule::parse(&row.spec) {
        Ok(s) => s,
        Err(e) => {
            // Stored by an older version with other rules: stop it firing.
            tracing::error!(schedule = %row.id, error = %e, "stored schedule is invalid; it will not fire");
            schedules::advance(&tx, &row.id, None, None, row.last_run_id).await?;
            tx.commit().await?;
            return Ok(Some(0));
        }
    };
    let now = Utc::now();
    let mut pass = Pass { shared, tx: &tx, schedule: &schedule, last: row.last_run_id, started: Vec::new() };
    let mut open = match row.last_run_id {
        Some(id) => schedules::run_is_open(&tx, id).await?,
        None => false,
    };
    let mut buffered = row.buffered_fire_at;
    if let (Some(t), false) = (buffered, open) {
        buffered = None;
        open = pass.start(t, true).await?;
    }
    let due = match row.next_fire_at {
        Some(from) if from <= now => schedule.due(from, now),
        next => composer_core::schedule::Due { fire: Vec::new(), missed: 0, next },
    };
    for t in due.fire {
        match (schedule.overlap, open) {
            (Overlap::Allow, _) | (_, false) => open = pass.start(t, false).await? || open,
            (Overlap::BufferOne, true) if buffered.is_none() => {
                schedules::record_fire(&tx, &row.id, t, "buffered", None).await?;
                composer_metrics::inc(composer_metrics::SCHEDULE_FIRES, &[("outcome", "buffered")], 1);
                buffered = Some(t);
            }
            _ => {
                schedules::record_fire(&tx, &row.id, t, "skipped", None).await?;
                composer_metrics::inc(composer_metrics::SCHEDULE_FIRES, &[("outcome", "skipped")], 1);
            }
        }
    }
    if due.missed > 0 {
        composer_metrics::inc(composer_metrics::SCHEDULE_FIRES, &[("outcome", "missed")], due.missed);
        tracing::warn!(schedule = %row.id, missed = due.missed, "fire times older than the catch-up window were skipped");
    }
    let last = pass.last;
    let runs = std::mem::take(&mut pass.started);
    schedules::advance(&tx, &row.id, due.next, buffered, last).await?;
    tx.commit().await?;
    let n = runs.len();
    for s in runs {
        shared.engine.started(s);
    }
    composer_metrics::inc(composer_metrics::SCHEDULE_FIRES, &[("outcome", "started")], n as u64);
    Ok(Some(n))
}

/// One schedule's pass of the timer loop, inside its transaction.
struct Pass<'a> {
    shared: &'a Shared,
    tx: &'a composer_store::Transaction<'a>,
    schedule: &'a Schedule,
    last: Option<Uuid>,
    started: Vec<Started>,
}

impl Pass<'_> {
    /// Starts the run of fire time `t` (`buffered`: recorded already);
    /// returns whether it is open. A fire time already recorded (handled by
    /// another pass) starts nothing.
    async fn start(&mut self, t: DateTime<Utc>, buffered: bool) -> Result<bool, EngineError> {
        let id = &self.schedule.spec.id;
        if !buffered && !schedules::record_fire(self.tx, id, t, "started", None).await? {
            return Ok(false);
        }
        let Some(def) = definition(self.tx, self.schedule).await? else {
            tracing::error!(schedule = %id, workflow = %self.schedule.spec.workflow, "schedule's workflow is not registered");
            composer_metrics::inc(composer_metrics::SCHEDULE_FIRES, &[("outcome", "failed")], 1);
            return Ok(false);
        };
        let trigger = json!({"schedule": id, "fire_time": t});
        let input = self.schedule.spec.input.clone().unwrap_or_else(|| json!({}));
        let opts = crate::engine::StartOptions { trigger: Some(&trigger), ..Default::default() };
        match self.shared.engine.start_run_in(self.tx, &def, &input, opts).await {
            Ok(started) => {
                schedules::set_fire_run(self.tx, id, t, started.row.id).await?;
                self.last = Some(started.row.id);
                let open = !started.row.status.is_terminal();
                self.started.push(started);
                Ok(open)
            }
            Err(EngineError::Rejected(why)) => {
                tracing::error!(schedule = %id, error = %why, "schedule's run could not start");
                composer_metrics::inc(composer_metrics::SCHEDULE_FIRES, &[("outcome", "failed")], 1);
                Ok(false)
            }
            Err(e) => Err(e),
        }
    }
}

/// Forgets fires recorded more than a week ago.
pub async fn forget_old_fires(client: &composer_store::Client) -> Result<u64, composer_store::Error> {
    schedules::forget_fires(client, Utc::now() - FIRES_KEPT).await
}
