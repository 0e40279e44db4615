//! Step logs past the offload threshold: an attempt's lines are appended
//! to rows, and once its rows hold more than `COMPOSER_OFFLOAD_THRESHOLD`
//! they are sealed into a chunk, an object of their run's ([`seal`]). The
//! readers here ([`read`], [`of_tasks`]) give chunks and rows back as one
//! log, in order; nobody else reads a chunk.

use composer_archive::payloads::{Payloads, Ref};
use composer_store::logs::{self, Chunk, LogLine};
use serde_json::{json, Value};
use uuid::Uuid;

use crate::payloads::store_error;

/// Seals the lines the rows of `attempt` of task `task_id` hold, when
/// `row_bytes` (what an append left in them) is past the threshold, a
/// threshold's worth per chunk, in a task of its own: the worker's append
/// is answered meanwhile. An error leaves the lines in their rows, for the
/// next append to seal.
pub fn seal_if_due(
    p: &Payloads,
    pool: &composer_store::Pool,
    run_id: Uuid,
    task_id: Uuid,
    attempt: i32,
    row_bytes: i64,
) {
    let Some(threshold) = p.threshold() else { return };
    if row_bytes <= threshold as i64 || !SEALING.lock().unwrap_or_else(|p| p.into_inner()).insert((task_id, attempt)) {
        return;
    }
    let (p, pool) = (p.clone(), pool.clone());
    crate::metrics::spawn(async move {
        if let Err(e) = seal(&p, &pool, run_id, task_id, attempt, threshold as i64).await {
            tracing::warn!(error = %e, %task_id, attempt, "sealing a step's log lines into an object failed; they stay in rows");
        }
        SEALING.lock().unwrap_or_else(|p| p.into_inner()).remove(&(task_id, attempt));
    });
}

/// The attempts this process is sealing the logs of.
static SEALING: std::sync::LazyLock<std::sync::Mutex<std::collections::HashSet<(Uuid, i32)>>> =
    std::sync::LazyLock::new(Default::default);

/// Most chunks one seal writes: a log that grows faster is sealed further
/// by its next append.
const MAX_CHUNKS_AT_ONCE: usize = 64;

/// The object of each chunk is written with no lock held, then one short
/// commit names it and deletes its rows, unless another coordinator sealed
/// them first (its object is then an orphan, for the sweep).
async fn seal(
    p: &Payloads,
    pool: &composer_store::Pool,
    run_id: Uuid,
    task_id: Uuid,
    attempt: i32,
    threshold: i64,
) -> Result<(), composer_store::Error> {
    let mut client = composer_store::client(pool).await?;
    for _ in 0..MAX_CHUNKS_AT_ONCE {
        let (lines, cost) = logs::to_seal(&client, task_id, attempt, threshold).await?;
        let (Some(first), Some(last)) = (lines.first(), lines.last()) else { return Ok(()) };
        let (first_seq, last_seq) = (first.seq, last.seq);
        let body = Value::Array(lines.iter().map(to_json).collect());
        let Some(object) = p.keep(run_id, &body).await.map_err(store_error)? else { return Ok(()) };
        let tx = composer_store::begin(&mut client).await?;
        let chunk = Chunk { attempt, first_seq, last_seq, object };
        match logs::seal(&tx, run_id, task_id, &chunk, cost).await? {
            Some(left) => {
                tx.commit().await?;
                if left <= threshold {
                    return Ok(());
                }
            }
            None => return Ok(()),
        }
    }
    Ok(())
}

fn to_json(l: &LogLine) -> Value {
    json!({"seq": l.seq, "worker_id": l.worker_id, "at": l.at, "line": l.line})
}

/// The lines a chunk's object holds.
async fn lines_of(p: &Payloads, chunk: &Chunk) -> Result<Vec<LogLine>, composer_store::Error> {
    let corrupt = |why: &str| composer_store::Error::Corrupt(format!("a step log's chunk: {why}"));
    let r = Ref::of(&chunk.object).ok_or_else(|| corrupt("its row names no object"))?;
    let body = p.read(&r).await.map_err(store_error)?;
    let lines: Vec<Stored> = serde_json::from_value(body).map_err(|e| corrupt(&e.to_string()))?;
    Ok(lines
        .into_iter()
        .map(|s| LogLine { attempt: chunk.attempt, seq: s.seq, worker_id: s.worker_id, at: s.at, line: s.line })
        .collect())
}

/// A line as a chunk keeps it.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Stored {
    seq: i32,
    worker_id: String,
    at: chrono::DateTime<chrono::Utc>,
    line: String,
}

/// The lines of one attempt after `after_seq`, at most `limit`, from its
/// chunks and then its rows, read in one snapshot (a seal between the two
/// reads would otherwise hide the lines it moved).
pub async fn read(
    p: &Payloads,
    client: &mut composer_store::Client,
    task_id: Uuid,
    attempt: i32,
    after_seq: i32,
    limit: i64,
) -> Result<Vec<LogLine>, composer_store::Error> {
    let tx = composer_store::begin(client).await?;
    tx.batch_execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY").await?;
    let limit = usize::try_from(limit).unwrap_or(0);
    let mut out = Vec::new();
    let mut after = after_seq;
    for chunk in logs::chunks(&tx, task_id, attempt, after_seq).await? {
        out.extend(lines_of(p, &chunk).await?.into_iter().filter(|l| l.seq > after_seq).take(limit - out.len()));
        if out.len() >= limit {
            return Ok(out);
        }
        after = after.max(chunk.last_seq);
    }
    out.extend(logs::read(&tx, task_id, attempt, after, (limit - out.len()) as i64).await?);
    tx.commit().await?;
    Ok(out)
}

/// Every line of `tasks`, by task, attempt and seq: their chunks' and
/// their rows' (a run's logs, for its archive and export).
pub async fn of_tasks(
    p: &Payloads,
    client: &composer_store::Client,
    tasks: &[Uuid],
) -> Result<Vec<(Uuid, LogLine)>, composer_store::Error> {
    // Rows first: a seal between the two reads then leaves a line in both
    // (one is kept), never in neither.
    let mut all = logs::of_tasks(client, tasks).await?;
    let chunks = logs::chunks_of_tasks(client, tasks).await?;
    if chunks.is_empty() {
        return Ok(all);
    }
    for (task, chunk) in chunks {
        all.extend(lines_of(p, &chunk).await?.into_iter().map(|l| (task, l)));
    }
    all.sort_by(|(a, x), (b, y)| (a, x.attempt, x.seq).cmp(&(b, y.attempt, y.seq)));
    all.dedup_by(|(a, x), (b, y)| (*a, x.attempt, x.seq) == (*b, y.attempt, y.seq));
    Ok(all)
}
