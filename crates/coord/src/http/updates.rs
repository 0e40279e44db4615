//! `POST /v1/runs/{id}/update`: an update to a run, taken by a waiting step
//! that accepts it, validated there, and answered with the step's output or
//! the reason it refused, once per update id.
//!
//! An accepted update completes its step through the engine, whose
//! transaction records the answer with the step's completion (`By::Update`):
//! a retry with the same id, on any coordinator, after any crash, reads
//! that answer and applies nothing again. A refused one is recorded with
//! its reason, and changes nothing of the run.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::Json;
use composer_api::{UpdateAnswer, UpdateRequest};
use composer_core::definition::{update_scope, Decision, Update};
use composer_core::machine::{Event, TaskState};
use composer_store::updates::{Accepted, UpdateRow};
use composer_store::Pool;
use serde_json::Value;
use uuid::Uuid;

use super::error::{ApiError, ApiResult};
use super::extract::{json_size, run_id, Body, Path};
use crate::config::Config;
use crate::engine::evaluator::Subject;
use crate::engine::{By, Engine, EngineError, EventRequest};

/// How long an update waits by default for a step that accepts it.
pub const DEFAULT_UPDATE_WAIT: Duration = Duration::from_secs(10);

/// The longest an update may wait for one (`max_update_wait`).
pub const MAX_UPDATE_WAIT: Duration = Duration::from_secs(60);

/// Longest update id, in characters.
pub const MAX_UPDATE_ID: usize = 256;

/// How often a waiting update looks again for a step that accepts it.
const LOOK_AGAIN: Duration = Duration::from_millis(100);

/// Update a run.
///
/// Sends an update to a running run: the step that accepts it by name (a waiting step whose
/// `updates` names it) validates it and, when it accepts, completes with its output, which is the
/// answer; when it refuses, the answer says why and the run is unchanged. Waits up to `timeout`
/// (10s by default, at most 60s) for such a step to be waiting. Each update id is answered once: the
/// same id sent again answers the same (`duplicate`), and is applied once.
#[utoipa::path(
    post, path = "/v1/runs/{id}/update", operation_id = "updateRun", tag = "runs",
    params(("id" = Uuid, Path, description = "the run")),
    request_body = UpdateRequest,
    responses(
        (status = 200, description = "the step's answer: accepted with its output, or refused with why", body = UpdateAnswer),
        (status = 404, description = "no such run", body = composer_api::ErrorBody),
        (status = 409, description = "no step accepts the update (not within the timeout, or the run ended)", body = composer_api::ErrorBody),
        (status = 422, description = "the id was used for another update (another name or payload)", body = composer_api::ErrorBody),
    )
)]
pub(crate) async fn update_run(
    State(config): State<Arc<Config>>,
    State(pool): State<Pool>,
    State(engine): State<Arc<Engine>>,
    Path(id): Path<String>,
    Body(req): Body<UpdateRequest>,
) -> ApiResult<Json<UpdateAnswer>> {
    let run = run_id(&id)?;
    let update = Checked::of(&config, req)?;
    let until = tokio::time::Instant::now() + update.wait;
    loop {
        if let Some(answer) = update.recorded(&pool, run).await? {
            return Ok(Json(answer));
        }
        if let Some(answer) = update.try_once(&pool, &engine, run).await? {
            return Ok(Json(answer));
        }
        if tokio::time::Instant::now() + LOOK_AGAIN > until {
            return Err(ApiError::UpdateNotAccepted(format!(
                "no step of run {run} accepts update {:?} now (waited {:?}; a step takes it while it waits)",
                update.name, update.wait
            )));
        }
        tokio::time::sleep(LOOK_AGAIN).await;
    }
}

/// An update request within its limits.
struct Checked {
    id: String,
    name: String,
    payload: Value,
    digest: String,
    wait: Duration,
    /// The largest value the engine stores (`COMPOSER_MAX_PAYLOAD`, or with
    /// offloading `COMPOSER_MAX_OFFLOADED`): an output past it refuses.
    max: usize,
}

impl Checked {
    fn of(config: &Config, req: UpdateRequest) -> ApiResult<Checked> {
        composer_core::definition::check_name("name", &req.name).map_err(ApiError::bad_request)?;
        if req.id.as_ref().is_some_and(|id| id.is_empty() || id.chars().count() > MAX_UPDATE_ID) {
            return Err(ApiError::bad_request(format!("id must be 1 to {MAX_UPDATE_ID} characters")));
        }
        let max = config.max_payload;
        if json_size(&req.payload) > max {
            return Err(ApiError::too_large("update payload", max));
        }
        composer_core::storable::check(&req.payload, "payload", max).map_err(ApiError::bad_request)?;
        let wait = match &req.timeout {
            None => DEFAULT_UPDATE_WAIT,
            Some(t) => composer_core::duration::parse(t).ok().filter(|d| *d <= MAX_UPDATE_WAIT).ok_or_else(|| {
                ApiError::bad_request(format!("timeout must be a duration of at most 60s, got {t:?}"))
            })?,
        };
        let text = serde_json::to_string(&req.payload).map_err(|e| ApiError::bad_request(e.to_string()))?;
        let digest = ring::digest::digest(&ring::digest::SHA256, text.as_bytes());
        Ok(Checked {
            id: req.id.unwrap_or_else(|| Uuid::now_v7().to_string()),
            name: req.name,
            payload: req.payload,
            digest: digest.as_ref().iter().map(|b| format!("{b:02x}")).collect(),
            wait,
            max: config.max_value(),
        })
    }

    /// The answer recorded for this id, as a duplicate; an error when the
    /// id was used for another update.
    async fn recorded(&self, pool: &Pool, run: Uuid) -> ApiResult<Option<UpdateAnswer>> {
        let client = composer_store::client(pool).await?;
        match composer_store::updates::find(&client, run, &self.id).await? {
            Some(row) if row.name != self.name || row.digest != self.digest => {
                Err(ApiError::UpdateIdReused { id: self.id.clone() })
            }
            Some(row) => Ok(Some(answer(row, true))),
            None => Ok(None),
        }
    }

    /// Offers the update to the step that accepts it, if one waits now:
    /// its answer, or `None` when no step took it (yet).
    async fn try_once(&self, pool: &Pool, engine: &Arc<Engine>, run: Uuid) -> ApiResult<Option<UpdateAnswer>> {
        let client = composer_store::client(pool).await?;
        let Some((row, tasks)) = composer_store::runs::get(&client, run).await? else {
            return Err(ApiError::RunNotFound(run));
        };
        if row.status.is_terminal() {
            return Err(ApiError::UpdateNotAccepted(format!(
                "run {run} has ended ({:?}): no step takes updates",
                row.status
            )));
        }
        let wf = engine.workflow(row.workflow_definition_id).await?;
        let accepts = |n: &composer_core::definition::Node| n.updates.iter().find(|u| u.name == self.name).cloned();
        if !wf.nodes.iter().any(|n| accepts(n).is_some()) {
            return Err(ApiError::UpdateNotAccepted(format!(
                "no step of workflow {:?} version {} accepts update {:?}",
                wf.spec.name, row.workflow_version, self.name
            )));
        }
        // The first waiting step (in the order the run created them) that accepts it.
        let waiting = tasks.iter().filter(|t| t.state == TaskState::Waiting).find_map(|t| {
            let node = wf.node_index(&t.node_id).map(|i| &wf.nodes[i])?;
            Some((t, node, accepts(node)?))
        });
        let Some((task, node, update)) = waiting else { return Ok(None) };
        let mut input = row.input.clone();
        crate::payloads::resolve(engine.payloads(), &mut input).await?;
        drop(client);
        let scope = update_scope(&self.id, &self.name, &self.payload, &input);
        match decide(run, &update, scope, self.max).await? {
            Decision::Refused(reason) => {
                let reason = composer_core::clipped(&reason, composer_core::definition::MAX_REFUSAL_CHARS);
                let client = composer_store::client(pool).await?;
                let key = (self.id.as_str(), self.name.as_str(), self.digest.as_str());
                composer_store::updates::record_refused(&client, run, key, &node.id, &reason).await?;
                // The first recorded for this id is the answer.
                Ok(self.recorded(pool, run).await?.map(|a| UpdateAnswer { duplicate: false, ..a }))
            }
            Decision::Accepted(output) => {
                let at = (row.workflow_definition_id, node.id.as_str(), task.id);
                self.apply(engine, run, at, output).await
            }
        }
    }

    /// Completes the step with `output`, recording the answer in the same
    /// transaction: the answer, or `None` when the step took another event
    /// first (looked at again).
    async fn apply(
        &self,
        engine: &Arc<Engine>,
        run: Uuid,
        (definition, node, task_id): (Uuid, &str, Uuid),
        output: Value,
    ) -> ApiResult<Option<UpdateAnswer>> {
        let accepted = Accepted {
            id: self.id.clone(),
            name: self.name.clone(),
            digest: self.digest.clone(),
            node_id: node.to_string(),
            output: output.clone(),
            definition,
        };
        let event = Event::EventReceived { task_id, payload: output.clone() };
        match engine.handle(EventRequest::new(run, event).by(By::Update(Box::new(accepted)))).await {
            Ok(h) if h.ignored.is_none() => Ok(Some(UpdateAnswer {
                id: self.id.clone(),
                name: self.name.clone(),
                node: node.to_string(),
                accepted: true,
                output: Some(output),
                reason: None,
                duplicate: false,
            })),
            // Recorded by another sending of this id, the step moved on, or
            // the run moved to another version since the decision: looked at again.
            Ok(_) | Err(EngineError::AlreadyDone) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }
}

/// The step's decision, through the evaluator's door (its expressions are
/// someone's writing). An evaluation that could not be made (past the
/// backstop, a shutdown) is a 503 to try again, not a refusal recorded for
/// good; a quarantined run's refuses it.
async fn decide(run: Uuid, update: &Update, scope: Value, max: usize) -> ApiResult<Decision> {
    use crate::engine::evaluator::Lost;
    let simple = update.is_simple();
    let input = (update.clone(), scope, max);
    let decided =
        crate::engine::evaluator::evaluate(Subject::Run(run), simple, input, |sb, (u, s, max)| u.decide(sb, &s, max));
    match decided.await {
        Ok(decision) => Ok(decision),
        Err(lost @ Lost::Quarantined(_)) => Ok(Decision::Refused(lost.to_string())),
        Err(lost) => Err(ApiError::Unavailable(format!("the update's expressions could not be evaluated: {lost}"))),
    }
}

fn answer(row: UpdateRow, duplicate: bool) -> UpdateAnswer {
    UpdateAnswer {
        id: row.update_id,
        name: row.name,
        node: row.node_id,
        accepted: row.accepted,
        output: row.output,
        reason: row.reason,
        duplicate,
    }
}
