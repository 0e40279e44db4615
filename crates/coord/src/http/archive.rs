//! Runs as an archive keeps them: a run's record ([`record`]: the run as
//! getRun shows it, its whole history, every MAP's items, every step's log
//! lines), `GET /v1/export/runs` that pages the records of the runs a
//! filter matches (what `composer run export` writes), and
//! `GET /v1/archive/runs/{id}` that reads back a run retention archived.

use std::collections::BTreeMap;

use axum::extract::State;
use axum::Json;
use composer_api::{ArchivedRun, AttemptLog, ErrorBody, ExportPage, HistoryEntryView, LogLineView};
use composer_store::runs::{self, RunFilter};
use composer_store::{Client, Pool};
use serde::Deserialize;
use utoipa::IntoParams;
use uuid::Uuid;

use super::error::{ApiError, ApiResult};
use super::extract::{name_param, parsed, run_id, Limit, Path, Query};
pub(crate) use super::runs::id_at;
use crate::archive::Archive;
use composer_archive::payloads::Payloads;

/// History lines or MAP items read at once.
const PAGE: i64 = 1000;

/// The run `run_id` as the API shows it, with its whole history, every MAP's
/// items and every step's log lines; `None` where there is no such run.
pub async fn record(
    client: &Client,
    payloads: &Payloads,
    run_id: Uuid,
) -> Result<Option<ArchivedRun>, composer_store::Error> {
    let Some(mut record) = record_as_kept(client, payloads, run_id).await? else { return Ok(None) };
    for value in crate::payloads::archived_slots(&mut record) {
        crate::payloads::resolve(payloads, value).await?;
    }
    Ok(Some(record))
}

/// [`record`] with its values as the rows keep them: an offloaded one
/// still a reference to its object (what the archive writes, beside a
/// copy of the object). Its log lines are read whole.
pub async fn record_as_kept(
    client: &Client,
    payloads: &Payloads,
    run_id: Uuid,
) -> Result<Option<ArchivedRun>, composer_store::Error> {
    let Some((run, tasks)) = runs::get(client, run_id).await? else { return Ok(None) };
    let view = super::runs::view_as_kept(client, &run, &tasks).await?;
    let mut history = Vec::new();
    loop {
        let after = history.last().map_or(0, |h: &HistoryEntryView| h.seq);
        let page = runs::history(client, run_id, after, PAGE).await?;
        let full = page.len() as i64 == PAGE;
        history.extend(page.into_iter().map(|e| HistoryEntryView {
            seq: e.seq,
            kind: e.kind,
            payload: e.payload,
            created_at: e.created_at,
        }));
        if !full {
            break;
        }
    }
    let mut items = BTreeMap::new();
    let mut nodes: BTreeMap<Uuid, String> = tasks.iter().map(|t| (t.id, t.node_id.clone())).collect();
    for map in tasks.iter().filter(|t| t.progress.is_some()) {
        let mut all = Vec::new();
        loop {
            let after = all.last().and_then(|t: &runs::TaskRow| t.item_index).unwrap_or(-1);
            let page = runs::items(client, run_id, map.id, after, PAGE).await?;
            let full = page.len() as i64 == PAGE;
            all.extend(page);
            if !full {
                break;
            }
        }
        nodes.extend(all.iter().map(|t| (t.id, t.node_id.clone())));
        items.insert(map.node_id.clone(), super::runs::task_views_as_kept(client, run_id, &all).await?);
    }
    let ids: Vec<Uuid> = nodes.keys().copied().collect();
    let mut logs: Vec<AttemptLog> = Vec::new();
    for (task, line) in crate::step_logs::of_tasks(payloads, client, &ids).await? {
        let node = nodes.get(&task).cloned().unwrap_or_default();
        let view = LogLineView { seq: line.seq, worker_id: line.worker_id, at: line.at, line: line.line };
        match logs.last_mut() {
            Some(l) if l.node == node && l.attempt == line.attempt => l.lines.push(view),
            _ => logs.push(AttemptLog { node, attempt: line.attempt, lines: vec![view] }),
        }
    }
    Ok(Some(ArchivedRun { run: view, history, items, logs }))
}

/// `GET /v1/export/runs`'s query.
#[derive(Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(crate) struct ExportQuery {
    /// Only this workflow's runs.
    #[param(value_type = Option<composer_api::schema::Name>)]
    workflow: Option<String>,
    /// Only runs created at or after this moment (RFC 3339).
    #[serde(default, deserialize_with = "parsed")]
    #[param(value_type = Option<String>, format = DateTime)]
    from: Option<chrono::DateTime<chrono::Utc>>,
    /// Only runs created before this moment (RFC 3339).
    #[serde(default, deserialize_with = "parsed")]
    #[param(value_type = Option<String>, format = DateTime)]
    to: Option<chrono::DateTime<chrono::Utc>>,
    /// The run id to start after (the previous page's next_after).
    #[serde(default, deserialize_with = "parsed")]
    #[param(value_type = Option<Uuid>)]
    after: Option<Uuid>,
    /// Runs per page: 1 to 100 (default 20). A run comes whole, with its
    /// history, MAP items and logs.
    #[param(value_type = Option<i32>, minimum = 1, maximum = 100)]
    limit: Option<Limit>,
}

/// Most runs one export page holds.
pub const MAX_EXPORT_PAGE: i64 = 100;

/// An export page ends once its runs are this many bytes of JSON (it holds
/// at least one run, however large): a page of 100 runs with long
/// histories and many MAP items is not held whole in memory.
pub const MAX_EXPORT_PAGE_BYTES: usize = 32 << 20;

/// How many bytes of JSON `v` is, counted without keeping them.
fn json_bytes(v: &impl serde::Serialize) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0 += b.len();
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut count = Count(0);
    let _ = serde_json::to_writer(&mut count, v);
    count.0
}

/// Export runs.
///
/// The runs a filter matches, oldest first, each whole: the run with its tasks as getRun shows
/// it, its history, its MAP items and its steps' logs. Pass the answer's `next_after` as `?after=`
/// for the next page. `composer run export` writes these pages as an archive's files.
#[utoipa::path(
    get, path = "/v1/export/runs", operation_id = "exportRuns", tag = "runs",
    params(ExportQuery),
    responses(
        (status = 200, description = "a page of whole runs, oldest first", body = ExportPage),
        (status = 400, description = "a parameter is invalid", body = ErrorBody),
    )
)]
pub(crate) async fn export_runs(
    State(pool): State<Pool>,
    State(engine): State<std::sync::Arc<crate::engine::Engine>>,
    Query(q): Query<ExportQuery>,
) -> ApiResult<Json<ExportPage>> {
    if let Some(w) = &q.workflow {
        name_param("workflow", w)?;
    }
    let limit = Limit::or(q.limit, 20);
    if limit > MAX_EXPORT_PAGE {
        return Err(ApiError::bad_request(format!("limit: at most {MAX_EXPORT_PAGE} runs per page")));
    }
    let filter = RunFilter {
        workflow: q.workflow.as_deref(),
        since: q.from.map(id_at),
        until: q.to.map(id_at),
        ..RunFilter::default()
    };
    let mut client = composer_store::client(&pool).await?;
    let ids = runs::matching_ids(&mut client, &filter, q.after, limit).await?;
    let (mut runs, mut bytes, mut last) = (Vec::with_capacity(ids.len()), 0, None);
    for id in &ids {
        if bytes >= MAX_EXPORT_PAGE_BYTES {
            break;
        }
        // A run deleted by retention between the two reads is left out.
        if let Some(run) = record(&client, engine.payloads(), *id).await? {
            bytes += json_bytes(&run);
            runs.push(run);
        }
        last = Some(*id);
    }
    let full = ids.len() as i64 == limit || last != ids.last().copied();
    Ok(Json(ExportPage { runs, next_after: if full { last } else { None } }))
}

/// Get an archived run.
///
/// A run retention archived (`COMPOSER_ARCHIVE_URL`) before it dropped the run's month, read back
/// from the archive: the run as getRun showed it, its history, MAP items and logs.
#[utoipa::path(
    get, path = "/v1/archive/runs/{id}", operation_id = "getArchivedRun", tag = "runs",
    params(("id" = Uuid, Path, description = "the run")),
    responses(
        (status = 200, description = "the run as it was archived", body = ArchivedRun),
        (status = 404, description = "no archive is set, or it holds no such run", body = ErrorBody),
        (status = 503, description = "the archive could not be read", body = ErrorBody),
    )
)]
pub(crate) async fn get_archived_run(
    State(archive): State<Archive>,
    Path(id): Path<String>,
) -> ApiResult<axum::response::Response> {
    let id = run_id(&id)?;
    if !archive.is_set() {
        return Err(ApiError::not_found("no archive is set (COMPOSER_ARCHIVE_URL): no run is archived"));
    }
    match archive.read(id).await {
        // Its offloaded values are written in from the archive's copies,
        // never held whole.
        Ok(Some((run, copies))) => Ok(crate::payloads::answer_archived(&copies, run).await?),
        Ok(None) => Err(ApiError::not_found(format!("run {id} is not in the archive"))),
        Err(e) => {
            // What storage said stays in the log: it may name the bucket,
            // the endpoint or what the request was signed with.
            tracing::warn!(error = %e, run = %id, "reading the archive failed");
            Err(ApiError::Unavailable(
                "the archive could not be read; retry later (the coordinator's log says why)".into(),
            ))
        }
    }
}
