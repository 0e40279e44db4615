//! Runs: start, list, read (with a long-poll for the end), history, a
//! MAP's items and a step's logs (the control actions are in `control`).

use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use composer_api::rest::HeldView;
use composer_api::schema::Name;
use composer_api::{
    AttemptLines, ErrorBody, HistoryEntryView, HistoryPage, HookRun, ItemPage, LogLineView, RunPage, RunView, StartRun,
    StepLogs, TaskView,
};
use composer_core::duration;
use composer_core::machine::{RunStatus, TaskState};
use composer_store::runs::{self, RunRow, TaskRow};
use serde::Deserialize;
use serde_json::{json, Value};
use utoipa::IntoParams;
use uuid::Uuid;

use super::error::{ApiError, ApiResult};
use super::extract::{json_size, name_param, parsed, run_id, text_param, Body, Limit, Path, Query, Traceparent};
use crate::config::Config;
use crate::definitions::Definitions;
use crate::engine::starts::StartOptions;
use crate::engine::Engine;
use crate::shared::{Draining, RunWatch};
use composer_archive::payloads::Payloads;
use composer_store::Pool;

/// Longest `?wait=` a caller may ask for.
const MAX_WAIT: Duration = Duration::from_secs(60);

/// Longest idempotency key, in characters.
pub const MAX_IDEMPOTENCY_KEY: usize = 256;

/// `GET /v1/runs`'s query.
#[derive(Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(crate) struct ListQuery {
    /// Only runs of this workflow.
    #[param(value_type = Option<Name>)]
    workflow: Option<String>,
    /// Only runs in this status.
    #[serde(default, deserialize_with = "status")]
    #[param(value_type = Option<RunStatus>)]
    status: Option<RunStatus>,
    /// 1 to 1000 (default 50).
    #[param(value_type = Option<i32>, minimum = 1, maximum = 1000)]
    limit: Option<Limit>,
    /// The previous page's next_cursor.
    #[serde(default, deserialize_with = "parsed")]
    #[param(value_type = Option<Uuid>)]
    cursor: Option<Uuid>,
    /// Only the child runs of this run.
    #[serde(default, deserialize_with = "parsed")]
    #[param(value_type = Option<Uuid>)]
    parent_run_id: Option<Uuid>,
    /// Only runs created at or after this moment (RFC 3339).
    #[serde(default, deserialize_with = "parsed")]
    #[param(value_type = Option<String>, format = DateTime)]
    created_after: Option<chrono::DateTime<chrono::Utc>>,
    /// Only runs created before this moment (RFC 3339).
    #[serde(default, deserialize_with = "parsed")]
    #[param(value_type = Option<String>, format = DateTime)]
    created_before: Option<chrono::DateTime<chrono::Utc>>,
}

/// The first UUIDv7 of a moment: runs created from then on have ids at or
/// above it.
pub(crate) fn id_at(t: chrono::DateTime<chrono::Utc>) -> Uuid {
    Uuid::from_u128((t.timestamp_millis().max(0) as u128) << 80)
}

/// A query's `tag.KEY=VALUE` pairs, as the `{key: value}` runs must have,
/// and the rest of the query for its typed parameters.
pub(crate) fn split_tags(query: &str) -> ApiResult<(Option<Value>, String)> {
    let pairs: Vec<(String, String)> =
        serde_urlencoded::from_str(query).map_err(|e| ApiError::bad_request(format!("query: {e}")))?;
    let mut tags = serde_json::Map::new();
    let mut rest = Vec::new();
    for (k, v) in pairs {
        match k.strip_prefix("tag.") {
            Some(key) => {
                if !composer_core::definition::is_tag_key(key) {
                    return Err(ApiError::bad_request(format!("tag.{key}: not a tag key")));
                }
                text_param(&v, "tag")?;
                tags.insert(key.to_string(), Value::String(v));
            }
            None => rest.push((k, v)),
        }
    }
    if tags.len() > composer_core::definition::MAX_TAGS {
        return Err(ApiError::bad_request("tag.*: at most 16"));
    }
    let rest = serde_urlencoded::to_string(&rest).map_err(|e| ApiError::bad_request(format!("query: {e}")))?;
    Ok(((!tags.is_empty()).then_some(Value::Object(tags)), rest))
}

/// A run status, in any case.
fn status<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<RunStatus>, D::Error> {
    let v = String::deserialize(d)?;
    RunStatus::parse(&v.to_ascii_uppercase()).map(Some).ok_or_else(|| {
        serde::de::Error::custom(format!(
            "status: expected QUEUED, RUNNING, PAUSED, SUCCEEDED, FAILED or CANCELLED, got {v:?}"
        ))
    })
}

/// `GET /v1/runs/{id}`'s query.
#[derive(Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(crate) struct WaitQuery {
    /// Long-poll up to this long (e.g. 30s, at most 60s) for the run to end.
    #[param(pattern = "^[0-9]{1,3}(ms|s)$")]
    wait: Option<String>,
}

/// `GET /v1/runs/{id}/events`'s query.
#[derive(Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(crate) struct HistoryQuery {
    /// The seq to start after (the previous page's next_after).
    #[serde(default, deserialize_with = "parsed")]
    #[param(value_type = Option<i64>)]
    after: Option<i64>,
    /// 1 to 1000 (default 100).
    #[param(value_type = Option<i32>, minimum = 1, maximum = 1000)]
    limit: Option<Limit>,
}

/// `GET /v1/runs/{id}/items`'s query.
#[derive(Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(crate) struct ItemsQuery {
    /// The MAP node's id.
    #[param(value_type = Name)]
    pub(crate) node: String,
    /// The item index to start after.
    #[serde(default, deserialize_with = "parsed")]
    #[param(value_type = Option<i32>, minimum = -1)]
    pub(crate) after: Option<i32>,
    /// 1 to 1000 (default 100).
    #[param(value_type = Option<i32>, minimum = 1, maximum = 1000)]
    pub(crate) limit: Option<Limit>,
}

/// `GET /v1/runs/{id}/tasks/{node}/logs`'s query.
#[derive(Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(crate) struct LogsQuery {
    /// The attempt (the step's current one without it).
    #[serde(default, deserialize_with = "parsed")]
    #[param(value_type = Option<i32>, minimum = 1)]
    attempt: Option<i32>,
    /// The line (`seq`) to start after.
    #[serde(default, deserialize_with = "parsed")]
    #[param(value_type = Option<i32>, minimum = 0)]
    after: Option<i32>,
    /// 1 to 1000 (default 500).
    #[param(value_type = Option<i32>, minimum = 1, maximum = 1000)]
    limit: Option<Limit>,
}

/// Start a run.
///
/// Starts a run of the workflow's latest version (or `version`) with `input` (`{}` without it).
/// With an `idempotency_key`, a second start with the same key and input answers the first run
/// (200); the same key with another input is a 422. A workflow with a concurrency limit may start
/// the run QUEUED. A W3C `traceparent` header puts the run's trace under the caller's span.
#[utoipa::path(
    post, path = "/v1/runs", operation_id = "startRun", tag = "runs",
    params(("traceparent" = Option<String>, Header, description = "A W3C trace context the run's trace continues; one that does not read, or names the trace Composer made for a run, is ignored")),
    request_body = StartRun,
    responses(
        (status = 201, description = "started", body = RunView),
        (status = 200, description = "the run already started with this idempotency key", body = RunView),
        (status = 422, description = "the idempotency key was used for a run with another input (idempotency_key_reused)", body = ErrorBody),
        (status = 429, description = "over a quota of the namespace (the message names it; see Retry-After)", body = ErrorBody),
    )
)]
pub(crate) async fn start_run(
    State(config): State<Arc<Config>>,
    State(pool): State<Pool>,
    State(engine): State<Arc<Engine>>,
    State(definitions): State<Definitions>,
    State(quotas): State<Arc<crate::quotas::QuotaState>>,
    traceparent: Traceparent,
    Body(req): Body<StartRun>,
) -> ApiResult<Response> {
    let traceparent = traceparent.of_caller(&pool).await?;
    let input = req.input.unwrap_or_else(|| json!({}));
    let max = config.max_value();
    if json_size(&input) > max {
        return Err(ApiError::too_large("run input", max));
    }
    composer_core::storable::check(&input, "input", max).map_err(ApiError::bad_request)?;
    let def = definitions.get(&pool, &req.workflow, req.version).await?;
    let def = def.ok_or_else(|| match req.version {
        Some(v) => ApiError::not_found(format!("workflow {:?} version {v} not found", req.workflow)),
        None => ApiError::not_found(format!("workflow {:?} not found", req.workflow)),
    })?;
    if let Some(key) = &req.idempotency_key {
        if key.is_empty() || key.chars().count() > MAX_IDEMPOTENCY_KEY {
            return Err(ApiError::bad_request(format!(
                "idempotency_key must be 1 to {MAX_IDEMPOTENCY_KEY} characters"
            )));
        }
    }
    quotas.may_start(&pool).await?;
    let opts = StartOptions {
        idempotency_key: req.idempotency_key.as_deref(),
        trigger: None,
        tags: req.tags.as_ref(),
        traceparent: traceparent.as_deref(),
        priority: req.priority.map(priority_of).transpose()?,
        owed: None,
    };
    let (row, created) = engine.start_run(&def, &input, opts).await?;
    if let (false, Some(key)) = (created, &req.idempotency_key) {
        // An offloaded input is the same when its object's SHA-256 is.
        let same = match composer_archive::payloads::Ref::of(&row.input) {
            Some(stored) => stored.holds(&input),
            None => same_json(&row.input, &input),
        };
        if !same {
            return Err(ApiError::IdempotencyKeyReused { key: key.clone(), run: row.id });
        }
    }
    let status = if created { StatusCode::CREATED } else { StatusCode::OK };
    Ok((status, Json(run_view(&row, None))).into_response())
}

/// List runs.
///
/// Runs newest first, keyset-paginated: pass the answer's `next_cursor` as `?cursor=` for the next
/// page. Filter by workflow, status, parent run and creation time; `tag.KEY=VALUE` (repeatable)
/// keeps the runs with those tags. Lists leave out each run's input, output and tasks.
#[utoipa::path(
    get, path = "/v1/runs", operation_id = "listRuns", tag = "runs",
    params(ListQuery),
    responses((status = 200, description = "a page of runs, newest first", body = RunPage))
)]
pub(crate) async fn list_runs(State(pool): State<Pool>, uri: axum::http::Uri) -> ApiResult<Json<RunPage>> {
    let (tags, rest) = split_tags(uri.query().unwrap_or_default())?;
    let q: ListQuery = super::extract::from_query(&rest)?;
    let limit = Limit::or(q.limit, 50);
    if let Some(w) = &q.workflow {
        name_param("workflow", w)?;
    }
    let mut client = composer_store::client(&pool).await?;
    let filter = runs::RunFilter {
        workflow: q.workflow.as_deref(),
        status: q.status,
        parent: q.parent_run_id,
        since: q.created_after.map(id_at),
        until: q.created_before.map(id_at),
        tags: tags.as_ref(),
        ..runs::RunFilter::default()
    };
    let rows = runs::list(&mut client, &filter, q.cursor, limit).await?;
    let next = if rows.len() as i64 == limit { rows.last().map(|r| r.id.to_string()) } else { None };
    Ok(Json(RunPage { runs: rows.iter().map(|r| run_view(r, None)).collect(), next_cursor: next }))
}

/// A run as the API shows it; `tasks` is `None` in lists, which carry no
/// input or output either.
pub fn run_view(r: &RunRow, tasks: Option<&[TaskRow]>) -> RunView {
    let full = tasks.is_some();
    RunView {
        id: r.id,
        workflow: r.workflow_name.clone(),
        version: r.workflow_version,
        workflow_id: r.workflow_definition_id,
        status: r.status,
        input: full.then(|| r.input.clone()),
        output: if full { r.output.clone() } else { None },
        error: r.error.clone(),
        created_at: r.created_at,
        updated_at: r.updated_at,
        finished_at: r.finished_at,
        trigger: r.trigger.clone(),
        tags: r.tags.clone(),
        parent_run_id: r.parent.map(|p| p.run_id),
        parent_task_id: r.parent.map(|p| p.task_id),
        parent_iteration: r.parent.map(|p| p.iteration),
        handles_run_id: r.handles_run_id,
        failure_handler_run_ids: None,
        hook_runs: None,
        tasks: tasks.map(|tasks| tasks.iter().map(task_view).collect()),
        trace_id: composer_core::trace::RunTrace::of(r.id, r.traceparent.as_deref()).trace_id_hex(),
        priority: r.priority,
        fairness_key: r.fairness_key.clone(),
    }
}

fn task_view(t: &TaskRow) -> TaskView {
    TaskView {
        id: t.id,
        node_id: t.node_id.clone(),
        node_type: t.node_type.clone(),
        state: t.state,
        attempt: t.attempt,
        input: t.input.clone(),
        output: t.output.clone(),
        error: t.error.clone(),
        error_info: t.error_info.as_ref().and_then(|v| serde_json::from_value(v.clone()).ok()),
        wake_at: t.wake_at,
        started_at: t.started_at,
        finished_at: t.finished_at,
        parent_task_id: t.parent_task_id,
        item_index: t.item_index,
        progress: t.map_progress(),
        held: None,
    }
}

/// The run as getRun shows it ([`view_as_kept`]) as the API answers it: its offloaded values written into
/// the answer from their objects, never held whole
/// ([`crate::payloads::answer`]).
pub(crate) async fn full_answer(
    client: &composer_store::Client,
    payloads: &Payloads,
    run: &RunRow,
    tasks: &[TaskRow],
) -> ApiResult<Response> {
    let view = view_as_kept(client, run, tasks).await?;
    Ok(crate::payloads::answer(payloads, view).await?)
}

/// The run as getRun shows it: with its tasks, and the failure handlers
/// its end started; its values as the rows keep them (an offloaded one
/// still a reference). One door for the API and the archive, so an
/// archived run is what the API showed.
pub(crate) async fn view_as_kept(
    client: &composer_store::Client,
    run: &RunRow,
    tasks: &[TaskRow],
) -> Result<RunView, composer_store::Error> {
    let mut view = run_view(run, Some(&[]));
    view.tasks = Some(task_views_as_kept(client, run.id, tasks).await?);
    // An open run's are its deadlines'; an ended run's, its hooks' too.
    let hooks = runs::handlers_of(client, run.id).await?;
    if matches!(run.status, RunStatus::Failed | RunStatus::Cancelled) {
        view.failure_handler_run_ids =
            Some(hooks.iter().filter(|(_, hook)| hook == "on_failure").map(|(id, _)| *id).collect());
    }
    view.hook_runs = Some(hooks.into_iter().map(|(run_id, hook)| HookRun { hook, run_id }).collect());
    Ok(view)
}

/// Task views, with why each step its limits hold waits; their values as
/// the rows keep them.
pub(crate) async fn task_views_as_kept(
    client: &composer_store::Client,
    run_id: Uuid,
    tasks: &[TaskRow],
) -> Result<Vec<TaskView>, composer_store::Error> {
    let mut views: Vec<TaskView> = tasks.iter().map(task_view).collect();
    if tasks.iter().any(|t| t.state == TaskState::Pending && t.limit_keys.is_some()) {
        let held = composer_store::limits::held_in_run(client, run_id).await?;
        for v in views.iter_mut().filter(|v| v.state == TaskState::Pending) {
            v.held = held.get(&v.id).map(|h| HeldView { key: h.key.clone(), reason: h.reason.into(), until: h.until });
        }
    }
    Ok(views)
}

/// Get a run.
///
/// A run with its tasks (node tasks; a MAP's items are read with listMapItems). With `?wait=30s`
/// the answer waits up to that long for the run to end, then answers the run as it stands.
#[utoipa::path(
    get, path = "/v1/runs/{id}", operation_id = "getRun", tag = "runs",
    params(
        ("id" = Uuid, Path, description = "the run"),
        WaitQuery,
    ),
    responses((status = 200, description = "the run with its tasks (a MAP's items: listMapItems)", body = RunView))
)]
pub(crate) async fn get_run(
    State(pool): State<Pool>,
    State(engine): State<Arc<Engine>>,
    State(runs): State<RunWatch>,
    State(draining): State<Draining>,
    Path(id): Path<String>,
    Query(q): Query<WaitQuery>,
) -> ApiResult<Response> {
    let run_id = run_id(&id)?;
    let wait = match &q.wait {
        Some(w) => duration::parse(w).map_err(|e| ApiError::bad_request(format!("wait: {e}")))?.min(MAX_WAIT),
        None => Duration::ZERO,
    };
    // Subscribe before reading, so an end that commits in between is seen.
    let mut ended = runs.subscribe();
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        let client = composer_store::client(&pool).await?;
        let Some((run, tasks)) = runs::get(&client, run_id).await? else {
            return Err(ApiError::not_found(format!("run {run_id} not found")));
        };
        if run.status.is_terminal() || tokio::time::Instant::now() >= deadline || draining.has_begun() {
            return full_answer(&client, engine.payloads(), &run, &tasks).await;
        }
        drop(client);
        loop {
            let ended = tokio::select! {
                // Stopping: answer now with the run as it is.
                _ = draining.begun() => break,
                r = tokio::time::timeout_at(deadline, ended.recv()) => r,
            };
            match ended {
                Err(_) => break,
                Ok(Ok(id)) if id == run_id || id.is_nil() => break,
                Ok(Ok(_)) => continue,
                Ok(Err(_)) => break,
            }
        }
    }
}

/// Get a run's history.
///
/// Every event of the run oldest first, paged by `seq`: pass the answer's `next_after` as `?after=`
/// for the next page.
#[utoipa::path(
    get, path = "/v1/runs/{id}/events", operation_id = "getRunHistory", tag = "runs",
    params(
        ("id" = Uuid, Path, description = "the run"),
        HistoryQuery,
    ),
    responses((status = 200, description = "a page of the run's history, oldest first", body = HistoryPage))
)]
pub(crate) async fn run_events(
    State(pool): State<Pool>,
    Path(id): Path<String>,
    Query(q): Query<HistoryQuery>,
) -> ApiResult<Json<HistoryPage>> {
    let run_id = run_id(&id)?;
    let after = q.after.unwrap_or(0);
    let limit = Limit::or(q.limit, 100);
    let client = composer_store::client(&pool).await?;
    if runs::status(&client, run_id).await?.is_none() {
        return Err(ApiError::not_found(format!("run {run_id} not found")));
    }
    let events = runs::history(&client, run_id, after, limit).await?;
    let next = if events.len() as i64 == limit { events.last().map(|e| e.seq) } else { None };
    let events = events
        .into_iter()
        .map(|e| HistoryEntryView { seq: e.seq, kind: e.kind, payload: e.payload, created_at: e.created_at })
        .collect();
    Ok(Json(HistoryPage { events, next_after: next }))
}

/// List a MAP's items.
///
/// A MAP node's items by index (`?node=ship_each&after=N&limit=M`). The run view lists node tasks
/// only, so that a MAP of 10,000 items does not make every read of its run 10,000 tasks long.
#[utoipa::path(
    get, path = "/v1/runs/{id}/items", operation_id = "listMapItems", tag = "runs",
    params(
        ("id" = Uuid, Path, description = "the run"),
        ItemsQuery,
    ),
    responses((status = 200, description = "a page of the MAP's items, by index", body = ItemPage))
)]
pub(crate) async fn run_items(
    State(pool): State<Pool>,
    State(engine): State<Arc<Engine>>,
    Path(id): Path<String>,
    Query(q): Query<ItemsQuery>,
) -> ApiResult<Response> {
    let run_id = run_id(&id)?;
    let node = &q.node;
    text_param(node, "node")?;
    let after = q.after.unwrap_or(-1);
    let limit = Limit::or(q.limit, 100);
    let client = composer_store::client(&pool).await?;
    let (_, tasks) =
        runs::get(&client, run_id).await?.ok_or_else(|| ApiError::not_found(format!("run {run_id} not found")))?;
    let map = tasks
        .iter()
        .find(|t| &t.node_id == node)
        .ok_or_else(|| ApiError::not_found(format!("run {run_id} has no task for node {node:?} (yet)")))?;
    if map.progress.is_none() && !composer_core::definition::traits_of(&map.node_type).has_items {
        // A node that is not a MAP has no items: nothing found here.
        return Err(ApiError::not_found(format!("node {node:?} is a {}, not a MAP: it has no items", map.node_type)));
    }
    let items = runs::items(&client, run_id, map.id, after, limit).await?;
    let next = if items.len() as i64 == limit { items.last().and_then(|t| t.item_index) } else { None };
    let page = ItemPage { items: task_views_as_kept(&client, run_id, &items).await?, next_after: next };
    Ok(crate::payloads::answer_items(engine.payloads(), page).await?)
}

/// A priority a request gives: a level, or a 400 that says which are.
pub(crate) fn priority_of(p: u8) -> ApiResult<u8> {
    match composer_core::priority::is_level(p.into()) {
        true => Ok(p),
        false => {
            Err(ApiError::bad_request(format!("priority: must be a whole number from 1 (first) to 5 (last), got {p}")))
        }
    }
}

/// Read a step's logs.
///
/// The lines its worker sent for one attempt (`POST /v1/tasks/{id}/logs`), oldest first, and which
/// attempts have any: a step that was retried keeps each attempt's lines.
#[utoipa::path(
    get, path = "/v1/runs/{id}/tasks/{node}/logs", operation_id = "getStepLogs", tag = "runs",
    params(
        ("id" = Uuid, Path, description = "the run"),
        ("node" = String, Path, description = "the step's node id (a MAP item: `ship_each[3]`)"),
        LogsQuery,
    ),
    responses(
        (status = 200, description = "a page of the attempt's lines", body = StepLogs),
        (status = 404, description = "no such run or step", body = ErrorBody),
    )
)]
pub(crate) async fn step_logs(
    State(pool): State<Pool>,
    State(engine): State<Arc<Engine>>,
    Path((id, node)): Path<(String, String)>,
    Query(q): Query<LogsQuery>,
) -> ApiResult<Json<StepLogs>> {
    let run = run_id(&id)?;
    text_param(&node, "node")?;
    if q.attempt.is_some_and(|a| a < 1) {
        return Err(ApiError::bad_request("attempt: 1 or more"));
    }
    if q.after.is_some_and(|a| a < 0) {
        return Err(ApiError::bad_request("after: 0 or more"));
    }
    let after = q.after.unwrap_or(0);
    let limit = Limit::or(q.limit, 500);
    let mut client = composer_store::client(&pool).await?;
    let task = runs::task_of_node(&client, run, &node)
        .await?
        .ok_or_else(|| ApiError::not_found(format!("run {run} has no step {node:?}")))?;
    let attempt = q.attempt.unwrap_or(task.attempt.max(1));
    let attempts = composer_store::logs::attempts(&client, task.id).await?;
    let lines = crate::step_logs::read(engine.payloads(), &mut client, task.id, attempt, after, limit).await?;
    let next_after = if lines.len() as i64 == limit { lines.last().map(|l| l.seq) } else { None };
    Ok(Json(StepLogs {
        attempt,
        attempts: attempts.into_iter().map(|(attempt, lines)| AttemptLines { attempt, lines }).collect(),
        lines: lines
            .into_iter()
            .map(|l| LogLineView { seq: l.seq, worker_id: l.worker_id, at: l.at, line: l.line })
            .collect(),
        next_after,
    }))
}

/// Whether two JSON values hold the same data: objects whatever the order
/// of their keys, and numbers by value where one is not an integer (a run's
/// input comes back from PostgreSQL with `1e2` written `100`).
pub(crate) fn same_json(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) if x.is_f64() || y.is_f64() => x.as_f64() == y.as_f64(),
        (Value::Array(x), Value::Array(y)) => x.len() == y.len() && x.iter().zip(y).all(|(x, y)| same_json(x, y)),
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len() && x.iter().all(|(k, v)| y.get(k).is_some_and(|w| same_json(v, w)))
        }
        _ => a == b,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_input_is_the_same_whatever_its_key_order_or_number_spelling() {
        let stored: Value = serde_json::from_str(r#"{"b": [1, 100, 0.5], "a": {"x": null}}"#).unwrap();
        let sent: Value = serde_json::from_str(r#"{"a": {"x": null}, "b": [1, 1e2, 5e-1]}"#).unwrap();
        assert!(same_json(&stored, &sent));
        for other in [r#"{"a": {"x": null}, "b": [1, 100]}"#, r#"{"a": {"x": 0}, "b": [1, 100, 0.5]}"#, r#"{"a": {}}"#]
        {
            assert!(!same_json(&stored, &serde_json::from_str(other).unwrap()), "{other}");
        }
        assert!(!same_json(&json!(9007199254740993u64), &json!(9007199254740992u64)), "integers exactly");
    }
}
