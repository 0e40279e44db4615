//! Runs as an archive keeps them: a run's record ([`record_as_kept`]: the
//! run as getRun shows it, its whole history, every MAP's items, every
//! step's log lines), `GET /v1/export/runs` that pages the records of the
//! runs a filter matches (what `composer run export` writes),
//! `GET /v1/runs/{id}/values/{object}` that reads one offloaded value
//! (what the export copies beside its lines), and
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
use axum::response::IntoResponse;
use composer_archive::payloads::{Payloads, Ref};

/// History lines or MAP items read at once.
const PAGE: i64 = 1000;

/// The run `run_id` as the API shows it, with its whole history, every
/// MAP's items and every step's log lines, its values as the rows keep
/// them: an offloaded one still a reference to its object (what the
/// archive and the export write, beside a copy of the object). Its log
/// lines are read whole. `None` where there is no such run.
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
    Ok(Some(ArchivedRun { run: view, history, items, item_files: BTreeMap::new(), logs }))
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
    /// `inline` (the default): each offloaded value written into its place. `references`: each
    /// left as its reference (`{"$composer_offloaded": {"run", "object", "sha256", "bytes"}}`),
    /// its text read with getRunValue; what `composer run export` asks for, so that no value is
    /// held whole by either side.
    #[param(inline)]
    values: Option<ExportValues>,
}

/// How an export page gives offloaded values.
#[derive(Deserialize, Clone, Copy, PartialEq, Eq, Default, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub(crate) enum ExportValues {
    /// Each offloaded value in its place.
    #[default]
    Inline,
    /// Each offloaded value left as its reference.
    References,
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
) -> ApiResult<axum::response::Response> {
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
        // Its offloaded values stay references here: the page counts and
        // holds them as such, and an inline answer reads each only as it
        // writes it.
        if let Some(run) = record_as_kept(&client, engine.payloads(), *id).await? {
            bytes += json_bytes(&run);
            runs.push(run);
        }
        last = Some(*id);
    }
    let full = ids.len() as i64 == limit || last != ids.last().copied();
    let page = ExportPage { runs, next_after: if full { last } else { None } };
    Ok(match q.values.unwrap_or_default() {
        ExportValues::References => Json(page).into_response(),
        ExportValues::Inline => crate::payloads::answer_export(engine.payloads(), page).await?,
    })
}

// The document's most for `bytes` below is this constant, written out.
const _: () = assert!(composer_archive::MAX_READ_BYTES == 1073741824);

/// `GET /v1/runs/{id}/values/{object}`'s query: the rest of the reference.
#[derive(Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(crate) struct ValueQuery {
    /// The reference's SHA-256 of the value's JSON text (64 lowercase hex digits).
    #[param(pattern = "^[0-9a-f]{64}$")]
    sha256: String,
    /// The reference's size of the value's JSON text, in bytes: no value is over 1 GiB.
    #[param(minimum = 0, maximum = 1073741824)]
    bytes: u64,
}

/// Read an offloaded value.
///
/// The JSON text of one of a run's offloaded values, named by its reference
/// (`{"$composer_offloaded": {"run", "object", "sha256", "bytes"}}`, as exportRuns gives it with
/// `values=references`): streamed from object storage and checked against the reference as it
/// goes. The SHA-256 checks the text, it grants nothing: the caller may read the run, and with it
/// its values. A value up to 8 MiB is read whole first: one that is not the reference's is a 404. Past
/// 8 MiB its size is checked first and its SHA-256 only as the answer ends: text that is not the
/// reference's (its object changed, or the reference is not its own) is an answer cut short (a
/// chunked answer without its last chunk), never a whole one.
#[utoipa::path(
    get, path = "/v1/runs/{id}/values/{object}", operation_id = "getRunValue", tag = "runs",
    params(
        ("id" = Uuid, Path, description = "the run"),
        ("object" = Uuid, Path, description = "the reference's object"),
        ValueQuery,
    ),
    responses(
        (status = 200, description = "the value's JSON text", content_type = "application/json", body = serde_json::Value),
        (status = 400, description = "a parameter is invalid", body = ErrorBody),
        (status = 404, description = "no such run, it has no value with this reference, or no object storage is set", body = ErrorBody),
        (status = 503, description = "object storage is unavailable", body = ErrorBody),
    )
)]
pub(crate) async fn get_run_value(
    State(pool): State<Pool>,
    State(engine): State<std::sync::Arc<crate::engine::Engine>>,
    Path((id, object)): Path<(String, String)>,
    Query(q): Query<ValueQuery>,
) -> ApiResult<axum::response::Response> {
    let run = run_id(&id)?;
    let object: Uuid =
        object.parse().map_err(|_| ApiError::bad_request(format!("object: {object:?} is not a UUID")))?;
    if q.sha256.len() != 64 || !q.sha256.bytes().all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(&c)) {
        return Err(ApiError::bad_request("sha256: 64 lowercase hex digits"));
    }
    if q.bytes > composer_archive::MAX_READ_BYTES {
        let most = composer_archive::MAX_READ_BYTES;
        return Err(ApiError::bad_request(format!("bytes: no value is over {most} bytes")));
    }
    let client = composer_store::client(&pool).await?;
    if runs::status(&client, run).await?.is_none() {
        return Err(ApiError::not_found(format!("run {run} not found")));
    }
    if !engine.payloads().is_on() {
        let why = "no object storage is set (COMPOSER_OFFLOAD_URL): no value is offloaded here";
        return Err(ApiError::not_found(format!("run {run} has no offloaded value {object}: {why}")));
    }
    let r = Ref { run, object, sha256: q.sha256, bytes: q.bytes, event: false };
    match crate::payloads::answer_value(engine.payloads(), r).await? {
        Some(answer) => Ok(answer),
        None => Err(ApiError::not_found(format!("run {run} has no offloaded value {object} of that size and SHA-256"))),
    }
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
    archive_set(&archive)?;
    match archive.read(id).await {
        // Its offloaded values are written in from the archive's copies,
        // never held whole.
        Ok(Some((run, copies))) => Ok(crate::payloads::answer_archived(&copies, run).await?),
        Ok(None) => Err(ApiError::not_found(format!("run {id} is not in the archive"))),
        Err(e) => Err(unreadable(id, e)),
    }
}

/// A 404 where no archive is set.
fn archive_set(archive: &Archive) -> ApiResult<()> {
    match archive.is_set() {
        true => Ok(()),
        false => Err(ApiError::not_found("no archive is set (COMPOSER_ARCHIVE_URL): no run is archived")),
    }
}

/// The archive could not be read for run `id`: a 503. What storage said
/// stays in the log: it may name the bucket, the endpoint or what the
/// request was signed with.
fn unreadable(id: Uuid, e: composer_archive::Error) -> ApiError {
    tracing::warn!(error = %e, run = %id, "reading the archive failed");
    ApiError::Unavailable("the archive could not be read; retry later (the coordinator's log says why)".into())
}

/// List an archived run's MAP items.
///
/// A MAP's items of a run retention archived, by index (`?node=ship_each&after=N&limit=M`), as
/// listMapItems pages them while the run was live: from the run's line, or, for a MAP of more than
/// 1,000 items or 16 MiB of them (its `item_files`), from the files the archive keeps them in, a
/// page at a time.
#[utoipa::path(
    get, path = "/v1/archive/runs/{id}/items", operation_id = "listArchivedMapItems", tag = "runs",
    params(
        ("id" = Uuid, Path, description = "the run"),
        super::runs::ItemsQuery,
    ),
    responses(
        (status = 200, description = "a page of the MAP's items, by index", body = composer_api::ItemPage),
        (status = 400, description = "a parameter is invalid", body = ErrorBody),
        (status = 404, description = "no archive is set, it holds no such run, or the run has no such MAP", body = ErrorBody),
        (status = 503, description = "the archive could not be read", body = ErrorBody),
    )
)]
pub(crate) async fn get_archived_run_items(
    State(archive): State<Archive>,
    Path(id): Path<String>,
    Query(q): Query<super::runs::ItemsQuery>,
) -> ApiResult<axum::response::Response> {
    let id = run_id(&id)?;
    super::extract::text_param(&q.node, "node")?;
    archive_set(&archive)?;
    let after = q.after.unwrap_or(-1);
    let limit = Limit::or(q.limit, 100);
    match archive.read_items(id, &q.node, after, limit as usize).await {
        Ok(Some(Some((items, copies)))) => {
            let next = match items.len() as i64 == limit {
                true => items.last().and_then(|t| t.item_index),
                false => None,
            };
            let page = composer_api::ItemPage { items, next_after: next };
            Ok(crate::payloads::answer_items(&copies, page).await?)
        }
        Ok(Some(None)) => Err(ApiError::not_found(format!("archived run {id} has no MAP {:?}", q.node))),
        Ok(None) => Err(ApiError::not_found(format!("run {id} is not in the archive"))),
        Err(e) => Err(unreadable(id, e)),
    }
}
