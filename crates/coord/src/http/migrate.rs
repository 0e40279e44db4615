//! `POST /v1/workflows/{name}/migrate`: a version's open runs moved to
//! another version. A dry run gives each run's verdict
//! (`composer_core::machine::migrate::plan`); otherwise a bulk job
//! (`crate::bulk`) moves them, each in the commit that marks it moved, so a
//! crash mid-job moves none twice and skips none. A run that cannot move
//! is refused by the engine under its lock, whatever the dry run said.

use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use composer_api::{BulkFilter, BulkJobView, ErrorBody, MigrateDryRun, MigrateRequest, RunVerdict};
use composer_core::definition::Workflow;
use composer_core::machine::migrate;
use composer_store::bulk::{JobRow, NewJob};
use composer_store::definitions::{self, DefinitionRow};
use composer_store::runs;

use super::error::{ApiError, ApiResult};
use super::extract::{name_param, stored_name_param, Body, Path};
use crate::access::Principal;
use crate::shared::{RunControl, Wakes};

/// Most steps a migration's `map` names (`max_migrate_map`).
pub const MAX_MIGRATE_MAP: usize = 100;

/// Most runs a dry run gives a verdict for (`max_migrate_verdicts`).
pub const MAX_MIGRATE_VERDICTS: i64 = 1_000;

/// Move runs to another version.
///
/// Moves the open runs (QUEUED, RUNNING, PAUSED) of `from_version` that the filter matches to
/// `to_version`. A run moves when every step it has reached maps to a step of the new version of
/// the same type (same id, or the one `map` names) whose predecessors have all ended in the run:
/// nothing that has ended runs again, and what the new version adds runs when reached. A dry run
/// answers each run's verdict (at most 1,000, oldest first): whether it can move, why not, and what
/// would change. Otherwise a bulk job moves the movable ones, each once, in one commit, recorded in
/// its history (`RunMigrated`, with who and why); the others are counted as refused. A move is
/// undone by moving the run back.
#[utoipa::path(
    post, path = "/v1/workflows/{name}/migrate", operation_id = "migrateRuns", tag = "workflows",
    params(("name" = String, Path, description = "the workflow")),
    request_body = MigrateRequest,
    responses(
        (status = 200, description = "a dry run: each run's verdict", body = MigrateDryRun),
        (status = 202, description = "the job moving them, started", body = BulkJobView),
        (status = 404, description = "no such workflow or version", body = ErrorBody),
    )
)]
pub(crate) async fn migrate_runs(
    State(c): State<RunControl>,
    State(wakes): State<Arc<Wakes>>,
    Extension(by): Extension<Principal>,
    Path(name): Path<String>,
    Body(req): Body<MigrateRequest>,
) -> ApiResult<Response> {
    Ok(match migrate(&c, &wakes, &by.name, &name, req).await? {
        Moved::DryRun(answer) => (StatusCode::OK, Json(answer)).into_response(),
        Moved::Job(row) => (StatusCode::ACCEPTED, Json(super::bulk::view(&row)?)).into_response(),
    })
}

/// What a checked migration request did.
pub enum Moved {
    DryRun(MigrateDryRun),
    Job(Box<JobRow>),
}

/// Checks a migration request, and answers its dry run or starts its job
/// (the API's and the UI's). `actor`: who asked, as the job and the runs'
/// history name them.
pub async fn migrate(c: &RunControl, wakes: &Wakes, actor: &str, name: &str, req: MigrateRequest) -> ApiResult<Moved> {
    let checked = check(c, name, &req).await?;
    let mut client = composer_store::client(&c.pool).await?;
    let filter = filter_of(name, req.filter.as_ref());
    let mut run_filter = crate::bulk::run_filter(&filter, None);
    run_filter.version = Some(req.from_version);
    run_filter.open = true;
    if req.dry_run {
        let ids = runs::matching_ids(&mut client, &run_filter, None, MAX_MIGRATE_VERDICTS + 1).await?;
        return Ok(Moved::DryRun(dry_run(&client, c.engine.payloads(), &checked, &req, &ids).await?));
    }
    let matched = runs::count_matching(&mut client, &run_filter, super::bulk::COUNT_CAP).await?;
    let target = crate::bulk::Target {
        definition: checked.to.0.id,
        from_version: req.from_version,
        to_version: req.to_version,
        map: req.map.clone(),
    };
    let (target, filter) = (serde_json::to_value(&target), serde_json::to_value(&filter));
    let (target, filter) = (target.map_err(corrupt)?, filter.map_err(corrupt)?);
    let reason = super::control::reason(req.reason)?;
    let job = NewJob {
        filter: &filter,
        action: "migrate",
        rerun_from: None,
        migrate: Some(&target),
        actor,
        reason: reason.as_deref(),
        matched,
    };
    let row = composer_store::bulk::create(&client, &job).await?;
    wakes.bulk.notify_one();
    Ok(Moved::Job(Box::new(row)))
}

fn corrupt(e: serde_json::Error) -> ApiError {
    ApiError::from(composer_store::Error::Corrupt(e.to_string()))
}

/// The two versions, compiled.
struct Checked {
    from: (DefinitionRow, Arc<Workflow>),
    to: (DefinitionRow, Arc<Workflow>),
}

/// Checks a request: its names, its versions (both of `name`, and two),
/// its filter and its map (each step named is one of its version's).
async fn check(c: &RunControl, name: &str, req: &MigrateRequest) -> ApiResult<Checked> {
    stored_name_param("name", name)?;
    if req.from_version == req.to_version {
        return Err(ApiError::bad_request("to_version: the runs are on this version already"));
    }
    if let Some(f) = &req.filter {
        super::bulk::check_fields(f)?;
        if f.workflow.as_deref().is_some_and(|w| w != name) {
            return Err(ApiError::bad_request("filter.workflow: the runs moved are the path's workflow's"));
        }
        if f.status.is_some_and(|s| s.is_terminal()) {
            return Err(ApiError::bad_request("filter.status: only open runs move (QUEUED, RUNNING, PAUSED)"));
        }
    }
    if req.map.len() > MAX_MIGRATE_MAP {
        return Err(ApiError::bad_request(format!("map: at most {MAX_MIGRATE_MAP} steps")));
    }
    let client = composer_store::client(&c.pool).await?;
    let from = version(c, &client, name, req.from_version, "from_version").await?;
    let to = version(c, &client, name, req.to_version, "to_version").await?;
    for (old, new) in &req.map {
        name_param("map", old)?;
        name_param("map", new)?;
        if from.1.node_index(old).is_none_or(|n| from.1.nodes[n].item_of.is_some()) {
            return Err(ApiError::bad_request(format!("map: version {} has no step {old:?}", req.from_version)));
        }
        if to.1.node_index(new).is_none_or(|n| to.1.nodes[n].item_of.is_some()) {
            return Err(ApiError::bad_request(format!("map: version {} has no step {new:?}", req.to_version)));
        }
    }
    Ok(Checked { from, to })
}

async fn version(
    c: &RunControl,
    client: &composer_store::Client,
    name: &str,
    version: i32,
    what: &str,
) -> ApiResult<(DefinitionRow, Arc<Workflow>)> {
    if version < 1 {
        return Err(ApiError::bad_request(format!("{what}: versions start at 1")));
    }
    let def = definitions::by_name(client, name, Some(version))
        .await?
        .ok_or_else(|| ApiError::not_found(format!("workflow {name:?} has no version {version}")))?;
    let wf = c.engine.compile(&def)?;
    Ok((def, wf))
}

/// The job's filter: the request's, of the path's workflow.
fn filter_of(name: &str, f: Option<&BulkFilter>) -> BulkFilter {
    BulkFilter { workflow: Some(name.to_string()), ..f.cloned().unwrap_or_default() }
}

/// Each run's verdict, as it stands now (read without a lock: the job
/// decides again under it). The runs are read first, then planned off the
/// request threads (a new version's input_schema is checked on each input).
async fn dry_run(
    client: &composer_store::Client,
    payloads: &composer_archive::payloads::Payloads,
    checked: &Checked,
    req: &MigrateRequest,
    ids: &[uuid::Uuid],
) -> ApiResult<MigrateDryRun> {
    let old = checked.from.1.clone();
    let mut read = Vec::new();
    for &id in ids.iter().take(MAX_MIGRATE_VERDICTS as usize) {
        // A run removed since (retention), or moved between the reads of
        // its row and its steps, is left out.
        let Some((mut row, tasks)) = runs::get(client, id).await? else { continue };
        if row.workflow_version != req.from_version {
            continue;
        }
        // Its input is checked against the new version's schema.
        crate::payloads::resolve_run(payloads, &mut row, &mut Default::default()).await?;
        if let Ok(run) = runs::into_machine(&old, &mut row, tasks) {
            read.push(run);
        }
    }
    let (new, map) = (checked.to.1.clone(), req.map.clone());
    let verdicts = tokio::task::spawn_blocking(move || {
        read.into_iter()
            .map(|run| {
                let plan = migrate::plan(&old, &new, &run, &map);
                RunVerdict { run_id: run.id, status: run.status, movable: plan.movable(), plan }
            })
            .collect::<Vec<_>>()
    })
    .await
    .map_err(|e| ApiError::from(composer_store::Error::Corrupt(format!("a dry run's planning: {e}"))))?;
    let movable = verdicts.iter().filter(|v| v.movable).count() as i64;
    Ok(MigrateDryRun {
        from_version: req.from_version,
        to_version: req.to_version,
        movable,
        unmovable: verdicts.len() as i64 - movable,
        runs: verdicts,
        truncated: ids.len() as i64 > MAX_MIGRATE_VERDICTS,
    })
}
