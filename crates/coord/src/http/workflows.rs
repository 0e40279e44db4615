//! Workflow definitions: register a version, read them.

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use composer_api::schema::Name;
use composer_api::{DefinitionView, ErrorBody, WorkflowList};
use composer_core::definition::{Workflow, WorkflowSpec};
use composer_store::definitions::{self, DefinitionRow, Registered};
use serde::Deserialize;
use serde_json::Value;
use utoipa::IntoParams;

use super::error::{ApiError, ApiResult};
use super::extract::{parsed, text_param, Body, Limit, Path, Query, MAX_PAGE};
use composer_store::Pool;

/// `GET /v1/workflows/{name}`'s query.
#[derive(Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(crate) struct VersionsQuery {
    /// 1 to 1000 (default 50).
    #[param(value_type = Option<i32>, minimum = 1, maximum = 1000)]
    limit: Option<Limit>,
    /// Versions older than this one (the previous page's versions_next).
    #[serde(default, deserialize_with = "parsed")]
    #[param(value_type = Option<i32>)]
    before: Option<i32>,
}

/// `POST /v1/workflows`'s query.
#[derive(Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(crate) struct RegisterQuery {
    /// The version the caller declares this definition to be: answered when
    /// it is registered with this definition, created when it is the next
    /// version, 409 otherwise.
    #[serde(default, deserialize_with = "parsed")]
    #[param(value_type = Option<i32>, minimum = 1)]
    version: Option<i32>,
}

fn definition_view(d: &DefinitionRow, with_spec: bool) -> DefinitionView {
    DefinitionView {
        id: d.id,
        name: d.name.clone(),
        version: d.version,
        created_at: d.created_at,
        spec: with_spec.then(|| d.spec.clone()),
        versions: None,
        versions_next: None,
    }
}

/// Register a workflow definition.
///
/// The definition is validated whole (every node, edge, expression and its `input_schema`; a 400
/// names the field at fault). Registration is idempotent by content: a definition identical to
/// any registered version of its name answers that version (200); another becomes the next
/// version (201). `?version=N` declares which version the caller means: a version registered
/// with a different definition, or one that is not the next, is a 409 naming it. Runs stay on
/// the version they started with; a start without a version takes the latest.
#[utoipa::path(
    post, path = "/v1/workflows", operation_id = "registerWorkflow", tag = "workflows",
    params(RegisterQuery),
    request_body = WorkflowSpec,
    responses(
        (status = 201, description = "a new version", body = DefinitionView),
        (status = 200, description = "identical to a registered version, which it answers", body = DefinitionView),
        (status = 409, description = "the declared version is registered with another definition, or is not the next", body = ErrorBody),
    )
)]
pub(crate) async fn register_workflow(
    State(pool): State<Pool>,
    Query(q): Query<RegisterQuery>,
    Body(spec): Body<Value>,
) -> ApiResult<Response> {
    if q.version.is_some_and(|v| v < 1) {
        return Err(ApiError::bad_request("version: must be 1 or more"));
    }
    // Compiling a definition's expressions is CPU work: off the async runtime.
    // Off the async runtime, on a thread with the evaluation stack (jq's
    // parser recurses as deep as an expression nests).
    let wf = tokio::task::spawn_blocking(move || composer_core::expr::on_eval_stack(|| Workflow::parse(&spec)))
        .await
        .map_err(|e| ApiError::internal(format!("definition compiler stopped: {e}")))?
        .map_err(|e| ApiError::internal(format!("definition compiler stopped: {e}")))?
        .map_err(|e| ApiError::InvalidDefinition(e.to_string()))?;
    let normalized = serde_json::to_value(&wf.spec).map_err(|e| ApiError::bad_request(e.to_string()))?;
    let mut client = composer_store::client(&pool).await?;
    let events: Vec<String> = wf.triggers.iter().map(|t| t.event.clone()).collect();
    let (status, row) = match definitions::register(&mut client, &wf.spec.name, &normalized, &events, q.version).await?
    {
        Registered::Created(row) => (StatusCode::CREATED, row),
        Registered::Unchanged(row) => (StatusCode::OK, row),
        Registered::Refused(why) => return Err(ApiError::Conflict(why)),
    };
    tracing::info!(workflow = %row.name, version = row.version, created = status == StatusCode::CREATED, "workflow registered");
    Ok((status, Json(definition_view(&row, false))).into_response())
}

/// List workflows.
///
/// The latest version of every workflow, without its spec: read one workflow for its definition.
#[utoipa::path(
    get, path = "/v1/workflows", operation_id = "listWorkflows", tag = "workflows",
    responses((status = 200, description = "the latest version of each workflow", body = WorkflowList))
)]
pub(crate) async fn list_workflows(State(pool): State<Pool>) -> ApiResult<Json<WorkflowList>> {
    let client = composer_store::client(&pool).await?;
    let rows = definitions::latest_of_each(&client, MAX_PAGE).await?;
    Ok(Json(WorkflowList { workflows: rows.iter().map(|d| definition_view(d, false)).collect() }))
}

/// Get a workflow.
///
/// The latest version with its spec, and a page of its versions (metadata only, newest first;
/// `?limit=`, and `?before=` with the previous page's `versions_next`).
#[utoipa::path(
    get, path = "/v1/workflows/{name}", operation_id = "getWorkflow", tag = "workflows",
    params(
        ("name" = Name, Path, description = "the workflow"),
        VersionsQuery,
    ),
    responses((status = 200, description = "the latest version with its spec, and a page of versions", body = DefinitionView))
)]
pub(crate) async fn get_workflow(
    State(pool): State<Pool>,
    Path(name): Path<String>,
    Query(q): Query<VersionsQuery>,
) -> ApiResult<Json<DefinitionView>> {
    text_param(&name, "workflow name")?;
    let limit = Limit::or(q.limit, 50);
    let before = q.before;
    let client = composer_store::client(&pool).await?;
    let Some(latest) = definitions::by_name(&client, &name, None).await? else {
        return Err(ApiError::not_found(format!("workflow {name:?} not found")));
    };
    let versions = definitions::versions(&client, &name, before, limit).await?;
    let mut v = definition_view(&latest, true);
    v.versions_next = if versions.len() as i64 == limit { versions.last().map(|d| d.version) } else { None };
    v.versions = Some(versions.iter().map(|d| definition_view(d, false)).collect());
    Ok(Json(v))
}

/// Get one version of a workflow.
///
/// The version with its spec, as it was registered (normalized). 404 when the workflow or the
/// version does not exist.
#[utoipa::path(
    get, path = "/v1/workflows/{name}/versions/{version}", operation_id = "getWorkflowVersion", tag = "workflows",
    params(
        ("name" = Name, Path, description = "the workflow"),
        ("version" = i32, Path, minimum = 1, description = "the version"),
    ),
    responses((status = 200, description = "the version with its spec", body = DefinitionView))
)]
pub(crate) async fn get_workflow_version(
    State(pool): State<Pool>,
    Path((name, version)): Path<(String, String)>,
) -> ApiResult<Json<DefinitionView>> {
    let version: i32 = version
        .parse()
        .map_err(|_| ApiError::bad_request(format!("version must be a positive integer, got {version:?}")))?;
    text_param(&name, "workflow name")?;
    let client = composer_store::client(&pool).await?;
    match definitions::by_name(&client, &name, Some(version)).await? {
        Some(d) => Ok(Json(definition_view(&d, true))),
        None => Err(ApiError::not_found(format!("workflow {name:?} version {version} not found"))),
    }
}
