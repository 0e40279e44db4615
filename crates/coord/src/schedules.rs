//! Schedules: the pass of the timer loop that fires them. Every coordinator
//! runs the pass; a schedule is handled under its row lock (`FOR UPDATE SKIP LOCKED`), and the runs it starts
//! commit with the move of its `next_fire_at`, so each fire time starts one
//! run however many coordinators there are. A backfill's fire times, queued
//! on the fires table, are started by the same pass.

use chrono::{DateTime, Utc};
use composer_core::schedule::{BackfillOverlap, Overlap, Schedule};
use composer_store::schedules;
use serde_json::json;
use uuid::Uuid;

use crate::engine::starts::{StartOptions, Started};
use crate::engine::EngineError;
use crate::shared::Shared;
use composer_store::Pool;

/// Fire times this many past are forgotten by the fires table (the key
/// there only guards fire times still being handled).
const FIRES_KEPT: chrono::Duration = chrono::Duration::days(7);

/// The definition a schedule starts runs of, if it is still registered.
pub(crate) async fn definition(
    tx: &composer_store::Transaction<'_>,
    schedule: &Schedule,
) -> Result<Option<composer_store::definitions::DefinitionRow>, composer_store::Error> {
    composer_store::definitions::by_name(&**tx, &schedule.spec.workflow, schedule.spec.version).await
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
    let tx = composer_store::begin(&mut client).await?;
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
    let now = crate::clock::now();
    let mut pass = Pass { shared, tx: &tx, schedule: &schedule, last: row.last_run_id, started: Vec::new() };
    let mut open = match row.last_run_id {
        Some(id) => schedules::run_is_open(&tx, id).await?,
        None => false,
    };
    let mut buffered = row.buffered_fire_at;
    if let (Some(t), false) = (buffered, open) {
        buffered = None;
        open = pass.start(t, Recorded::Yes).await?;
    }
    // Backfilled fire times, oldest first, each under its backfill's overlap.
    for q in schedules::queued(&tx, &row.id, open, BACKFILL_PER_PASS).await? {
        match (BackfillOverlap::parse(&q.overlap).unwrap_or_default(), open) {
            (BackfillOverlap::Allow, _) => open = pass.start(q.fire_time, Recorded::Backfill).await? || open,
            (BackfillOverlap::Skip, true) => {
                schedules::skip_fire(&tx, &row.id, q.fire_time).await?;
                crate::metrics::inc(composer_metrics::SCHEDULE_FIRES, &[("outcome", "skipped")], 1);
            }
            // Waits for the open run to end (a later pass).
            (BackfillOverlap::BufferAll, true) => {}
            (_, false) => open = pass.start(q.fire_time, Recorded::Backfill).await?,
        }
    }
    let due = match row.next_fire_at {
        Some(from) if from <= now => schedule.due(from, now),
        next => composer_core::schedule::Due { fire: Vec::new(), missed: 0, next },
    };
    for t in due.fire {
        match (schedule.overlap, open) {
            (Overlap::Allow, _) | (_, false) => open = pass.start(t, Recorded::No).await? || open,
            (Overlap::BufferOne, true) if buffered.is_none() => {
                schedules::record_fire(&tx, &row.id, t, "buffered", None).await?;
                crate::metrics::inc(composer_metrics::SCHEDULE_FIRES, &[("outcome", "buffered")], 1);
                buffered = Some(t);
            }
            _ => {
                schedules::record_fire(&tx, &row.id, t, "skipped", None).await?;
                crate::metrics::inc(composer_metrics::SCHEDULE_FIRES, &[("outcome", "skipped")], 1);
            }
        }
    }
    if due.missed > 0 {
        crate::metrics::inc(composer_metrics::SCHEDULE_FIRES, &[("outcome", "missed")], due.missed);
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
    crate::metrics::inc(composer_metrics::SCHEDULE_FIRES, &[("outcome", "started")], n as u64);
    Ok(Some(n))
}

/// Backfilled fire times one pass of a schedule handles; the next pass
/// takes the rest.
const BACKFILL_PER_PASS: i64 = 100;

/// Whether a fire time's row in the fires table is there already.
#[derive(Clone, Copy, PartialEq)]
enum Recorded {
    /// A fire time of the cron, to record now.
    No,
    /// Buffered by an earlier pass.
    Yes,
    /// Queued by a backfill.
    Backfill,
}

/// The idempotency key of fire time `t`'s run: a fire time started again —
/// a backfill over fire times whose records were forgotten — finds the
/// run it started while that run is kept.
fn fire_key(schedule: &str, t: DateTime<Utc>) -> String {
    format!("schedule:{schedule}:{}", t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true))
}

/// One schedule's pass of the timer loop, inside its transaction.
struct Pass<'a, 't> {
    shared: &'a Shared,
    tx: &'a composer_store::Transaction<'t>,
    schedule: &'a Schedule,
    last: Option<Uuid>,
    started: Vec<Started>,
}

impl Pass<'_, '_> {
    /// Starts the run of fire time `t`; returns whether it is open. A fire
    /// time of the cron already recorded (handled by another pass) starts
    /// nothing.
    async fn start(&mut self, t: DateTime<Utc>, recorded: Recorded) -> Result<bool, EngineError> {
        let id = &self.schedule.spec.id;
        if recorded == Recorded::No && !schedules::record_fire(self.tx, id, t, "started", None).await? {
            return Ok(false);
        }
        let Some(def) = definition(self.tx, self.schedule).await? else {
            tracing::error!(schedule = %id, workflow = %self.schedule.spec.workflow, "schedule's workflow is not registered");
            let why = format!("workflow {:?} is not registered", self.schedule.spec.workflow);
            return self.not_started(t, &why).await;
        };
        let mut trigger = json!({"schedule": id, "fire_time": t});
        if recorded == Recorded::Backfill {
            trigger["backfill"] = json!(true);
        }
        let input = self.schedule.spec.input.clone().unwrap_or_else(|| json!({}));
        let key = fire_key(id, t);
        let opts = StartOptions { trigger: Some(&trigger), idempotency_key: Some(&key), ..Default::default() };
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
                self.not_started(t, &why.to_string()).await
            }
            Err(e) => Err(e),
        }
    }

    /// A fire time whose run could not start: counted, and recorded as
    /// failed with `why` (a backfilled one is no longer queued; a later
    /// backfill may ask for it again).
    async fn not_started(&self, t: DateTime<Utc>, why: &str) -> Result<bool, EngineError> {
        crate::metrics::inc(composer_metrics::SCHEDULE_FIRES, &[("outcome", "failed")], 1);
        let why = composer_core::clipped(why, 1024);
        schedules::fail_fire(self.tx, &self.schedule.spec.id, t, &why).await?;
        Ok(false)
    }
}

/// What a backfill queued.
pub struct Backfilled {
    /// The cron's fire times in the range, oldest first.
    pub fires: Vec<DateTime<Utc>>,
    /// How many of them were queued (the others were asked for before).
    pub queued: u64,
    /// The schedule is paused, and holds them until resumed.
    pub paused: bool,
}

/// Why a backfill queued nothing.
#[derive(Debug)]
pub enum BackfillError {
    NotFound,
    /// The range (or the stored schedule), in words naming the field.
    Invalid(String),
    Store(composer_store::Error),
}

impl From<composer_store::Error> for BackfillError {
    fn from(e: composer_store::Error) -> Self {
        BackfillError::Store(e)
    }
}

impl From<tokio_postgres::Error> for BackfillError {
    fn from(e: tokio_postgres::Error) -> Self {
        BackfillError::Store(e.into())
    }
}

/// Queues the fire times of schedule `id` in `[from, to)` for the timer
/// loop, under the schedule's lock (the API's and the UI's backfill).
pub async fn backfill(
    pool: &Pool,
    id: &str,
    from: DateTime<Utc>,
    to: DateTime<Utc>,
    overlap: BackfillOverlap,
) -> Result<Backfilled, BackfillError> {
    let mut client = composer_store::client(pool).await?;
    let tx = composer_store::begin(&mut client).await?;
    let row = schedules::lock(&tx, id).await?.ok_or(BackfillError::NotFound)?;
    let schedule = Schedule::parse(&row.spec).map_err(|e| BackfillError::Invalid(e.to_string()))?;
    let fires = schedule.backfill(from, to, crate::clock::now()).map_err(|e| BackfillError::Invalid(e.to_string()))?;
    let max = composer_core::schedule::MAX_BACKFILL_FIRES;
    if row.backfill_queued as usize + fires.len() > max {
        return Err(BackfillError::Invalid(format!(
            "to: the schedule has {} fire times queued already; with these {} it would have more than {max} \
             waiting (schedule_max_backfill): ask again when some have started",
            row.backfill_queued,
            fires.len()
        )));
    }
    let queued = schedules::queue_backfill(&tx, id, &fires, overlap.as_str()).await?;
    tx.commit().await?;
    tracing::info!(schedule = %id, %from, %to, queued, "backfill queued");
    Ok(Backfilled { fires, queued, paused: row.paused })
}

/// Forgets fires recorded more than a week ago.
pub async fn forget_old_fires(client: &composer_store::Client) -> Result<u64, composer_store::Error> {
    schedules::forget_fires(client, crate::clock::now() - FIRES_KEPT).await
}
