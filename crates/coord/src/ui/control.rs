//! The buttons and forms of a run's page that change the run — retry,
//! pause, resume, cancel, priority, rerun from steps, complete a step by
//! hand, resolve a step in doubt — and their answers: the same events as the
//! API's, by the operator, after which the page says what happened.

use std::collections::HashMap;

use axum::extract::{Form, Path, State};
use axum::response::{IntoResponse, Redirect};
use composer_core::machine::{Event, Resolution, RunStatus};
use composer_store::runs::{self, RunRow, TaskRow};
use uuid::Uuid;

use super::error::{not_found, Page};
use super::extract::{self, Fields, Params};
use super::html::{html, options, post_form, url_enc, Html};
use crate::engine::{By, Control, EngineError, EventRequest};
use crate::http::control::change_priority;
use crate::shared::RunControl;

/// The run's buttons its status allows, with a reason to give, and its
/// priority while it is open.
pub fn buttons(run: &RunRow) -> Html {
    let shown: Html = [
        ("retry", "Retry", run.status == RunStatus::Failed),
        ("pause", "Pause", run.status == RunStatus::Running),
        ("resume", "Resume", run.status == RunStatus::Paused),
        ("cancel", "Cancel", !run.status.is_terminal()),
    ]
    .into_iter()
    .filter(|(_, _, shown)| *shown)
    .map(|(action, label, _)| {
        html!(
            "<button type=\"submit\" formaction=\"/ui/runs/{}/{}\" class=\"{}\">{}</button>",
            run.id,
            action,
            action,
            label
        )
    })
    .collect();
    let reason = (!shown.is_empty()).then(|| {
        Html::raw("<input name=\"reason\" maxlength=\"1024\" placeholder=\"why (optional, kept in the history)\">")
    });
    let mut out = html!("<form class=\"actions\" method=\"post\">{}{}</form>", shown, reason);
    if !run.status.is_terminal() {
        let levels: Vec<String> = composer_core::priority::levels().map(|p| p.to_string()).collect();
        let chosen = run.priority.to_string();
        let fields = html!(
            "<label>Priority <select name=\"priority\">{}</select></label><button type=\"submit\">Set</button>",
            options(levels.iter().map(|p| (p.as_str(), p.as_str())), Some(&chosen))
        );
        out.push(html!(
            "<form class=\"priority\" method=\"post\" action=\"/ui/runs/{}/priority\">{}</form>",
            run.id,
            fields
        ));
    }
    out
}

/// The three ways to resolve an IN_DOUBT step, as forms.
pub fn resolve_forms(run: Uuid, node: &str) -> Html {
    let action = format!("/ui/runs/{run}/tasks/{}/resolve", url_enc(node));
    let completed = Html::raw(
        "<input type=\"hidden\" name=\"outcome\" value=\"completed\">\
         <label>Output (JSON) <textarea name=\"output\" rows=\"2\">{}</textarea></label>\
         <button type=\"submit\" class=\"resolve-completed\">It did: complete the step</button>",
    );
    let failed = Html::raw(
        "<input type=\"hidden\" name=\"outcome\" value=\"failed\"><label>Error <input name=\"error\" required></label>\
         <button type=\"submit\" class=\"resolve-failed\">It did not: fail the step</button>",
    );
    let retry = Html::raw(
        "<input type=\"hidden\" name=\"outcome\" value=\"retry\">\
         <button type=\"submit\" class=\"resolve-retry\">Send it again</button>",
    );
    html!(
        "<div class=\"resolve\"><p>Did this attempt take effect? It will not be sent again by itself.</p>{}{}{}</div>",
        post_form(&action, "", completed),
        post_form(&action, "", failed),
        post_form(&action, "", retry)
    )
}

/// Ending a step by hand with an output, as a form.
pub fn complete_form(run: Uuid, node: &str) -> Html {
    let fields = Html::raw(
        "<label>Output (JSON) <textarea name=\"output\" rows=\"2\">{}</textarea></label>\
         <label>Why <input name=\"reason\" maxlength=\"1024\"></label>\
         <button type=\"submit\" class=\"complete\">Complete the step: the run goes on</button>",
    );
    let action = format!("/ui/runs/{run}/tasks/{}/complete", url_enc(node));
    html!(
        "<details class=\"complete\"><summary>Complete by hand…</summary>{}</details>",
        post_form(&action, "", fields)
    )
}

/// Running a run again from steps it reached, as a form.
pub fn rerun_form(run: &RunRow, tasks: &[TaskRow]) -> Html {
    let steps: Html = tasks
        .iter()
        .map(|t| {
            html!(
                "<label class=\"step\"><input type=\"checkbox\" name=\"from\" value=\"{}\"> {}</label>",
                t.node_id,
                t.node_id
            )
        })
        .collect();
    let succeeded = (run.status == RunStatus::Succeeded).then(|| {
        Html::raw("<label><input type=\"checkbox\" name=\"allow_completed\" value=\"1\"> also if it succeeded</label>")
    });
    let fields = html!(
        "<p>Each chosen step and everything after it runs again (what is open there is cancelled); the history \
         stays.</p><div class=\"steps\">{}</div>\
         <label>New input (JSON; blank keeps the run's) <textarea name=\"input\" rows=\"3\"></textarea></label>\
         <label>Why <input name=\"reason\" maxlength=\"1024\"></label>{}\
         <button type=\"submit\" class=\"rerun\">Rerun</button>",
        steps,
        succeeded
    );
    html!(
        "<details class=\"rerun\"><summary>Rerun from steps…</summary>{}</details>",
        post_form(&format!("/ui/runs/{}/rerun", run.id), "", fields)
    )
}

/// Back to the run's page, saying `msg`.
fn back(run_id: Uuid, msg: &str) -> Page {
    Ok(Redirect::to(&format!("/ui/runs/{run_id}?msg={msg}")).into_response())
}

/// A form's fields that may be read once each (the last of a repeated one).
fn params(body: &[u8]) -> Params {
    serde_urlencoded::from_bytes(body).unwrap_or_default()
}

/// Retry, pause, resume and cancel.
pub async fn run_action(
    State(c): State<RunControl>,
    Path((id, action)): Path<(String, String)>,
    body: axum::body::Bytes,
) -> Page {
    let run_id = extract::run_id(&id)?;
    let form = params(&body);
    let Ok(reason) = extract::reason(form.get("reason").map(String::as_str).unwrap_or("")) else {
        return back(run_id, "reason-invalid");
    };
    let event = match action.as_str() {
        "cancel" => Event::CancelRun,
        "retry" => Event::RetryRun,
        "pause" => Event::PauseRun,
        "resume" => Event::ResumeRun,
        _ => return Err(not_found("action")),
    };
    let control = Control { actor: super::session::actor(), reason };
    apply_control(&c, run_id, event, control, &action).await
}

/// The priority form's answer: the same change as the API's.
pub async fn priority_action(State(c): State<RunControl>, Path(id): Path<String>, Form(form): Form<Params>) -> Page {
    let run_id = extract::run_id(&id)?;
    let priority = form.get("priority").and_then(|p| p.parse::<u8>().ok());
    let Some(priority) = priority.filter(|&p| composer_core::priority::is_level(p.into())) else {
        return back(run_id, "priority-invalid");
    };
    match change_priority(&c, &super::session::actor(), run_id, priority).await? {
        runs::PriorityChange::NotFound => Err(not_found("run")),
        runs::PriorityChange::Ended(_) => back(run_id, "priority-refused"),
        runs::PriorityChange::Changed { .. } => back(run_id, "priority-done"),
    }
}

/// The rerun form's answer: the same event as the API's.
pub async fn rerun_action(State(c): State<RunControl>, Path(id): Path<String>, body: axum::body::Bytes) -> Page {
    let run_id = extract::run_id(&id)?;
    let form = Fields::read(&body);
    let from: Vec<&str> = form.all("from").collect();
    if from.is_empty() || from.len() > 100 {
        return back(run_id, "rerun-invalid");
    }
    let input = match form.one("input").trim() {
        "" => None,
        typed => match serde_json::from_str::<serde_json::Value>(typed) {
            Ok(v) if composer_core::storable::check(&v, "input", c.config.max_payload).is_ok() => Some(v),
            _ => return back(run_id, "rerun-invalid"),
        },
    };
    let Ok(reason) = extract::reason(form.one("reason")) else { return back(run_id, "reason-invalid") };
    let client = composer_store::client(&c.pool).await?;
    let mut tasks = Vec::with_capacity(from.len());
    for node in from {
        match runs::task_of_node(&client, run_id, node).await? {
            Some(t) => tasks.push(t.id),
            None => return back(run_id, "rerun-invalid"),
        }
    }
    drop(client);
    let event = Event::RerunFrom { tasks, input, allow_completed: form.one("allow_completed") == "1" };
    let control = Control { actor: super::session::actor(), reason };
    apply_control(&c, run_id, event, control, "rerun").await
}

/// The complete form's answer: the same event as the API's.
pub async fn complete_action(
    State(c): State<RunControl>,
    Path((id, node)): Path<(String, String)>,
    body: axum::body::Bytes,
) -> Page {
    let run_id = extract::run_id(&id)?;
    let form = params(&body);
    let output = match serde_json::from_str::<serde_json::Value>(form.get("output").map(String::as_str).unwrap_or("")) {
        Ok(v) if composer_core::storable::check(&v, "output", c.config.max_payload).is_ok() => v,
        _ => return back(run_id, "complete-invalid"),
    };
    let Ok(reason) = extract::reason(form.get("reason").map(String::as_str).unwrap_or("")) else {
        return back(run_id, "reason-invalid");
    };
    let task = task_of(&c.pool, run_id, &node).await?;
    let control = Control { actor: super::session::actor(), reason };
    apply_control(&c, run_id, Event::CompleteTask { task_id: task, output }, control, "complete").await
}

/// A resolve form's answer: the same event as the API's.
pub async fn resolve_action(
    State(c): State<RunControl>,
    Path((id, node)): Path<(String, String)>,
    Form(form): Form<Params>,
) -> Page {
    let run_id = extract::run_id(&id)?;
    let field = |k: &str| form.get(k).map(String::as_str).unwrap_or("");
    let Some(resolution) = resolution(&form, c.config.max_payload) else { return back(run_id, "resolve-invalid") };
    let task = task_of(&c.pool, run_id, &node).await?;
    let control = Control { actor: super::session::actor(), reason: extract::reason(field("reason")).unwrap_or(None) };
    apply_control(&c, run_id, Event::ResolveTask { task_id: task, resolution }, control, "resolve").await
}

/// What a resolve form says of the attempt in doubt, if it says it right.
fn resolution(form: &HashMap<String, String>, max_payload: usize) -> Option<Resolution> {
    let field = |k: &str| form.get(k).map(String::as_str).unwrap_or("");
    match field("outcome") {
        "completed" => match serde_json::from_str::<serde_json::Value>(field("output")) {
            Ok(v) if composer_core::storable::check(&v, "output", max_payload).is_ok() => {
                Some(Resolution::Completed(v))
            }
            _ => None,
        },
        "failed" if !field("error").trim().is_empty() && field("error").len() <= 65_536 => {
            Some(Resolution::Failed(field("error").to_string()))
        }
        "retry" => Some(Resolution::Retry),
        _ => None,
    }
}

/// The task of a run's node, or 404.
async fn task_of(pool: &composer_store::Pool, run_id: Uuid, node: &str) -> Result<Uuid, super::error::UiError> {
    let client = composer_store::client(pool).await?;
    let task = runs::task_of_node(&client, run_id, node).await?.ok_or_else(|| not_found("step"))?;
    Ok(task.id)
}

/// Applies a form's control event and goes back to the run's page, saying
/// `{action}-done` or `{action}-refused`.
async fn apply_control(c: &RunControl, run_id: Uuid, event: Event, control: Control, action: &str) -> Page {
    let outcome = match c.engine.handle(EventRequest::new(run_id, event).by(By::Operator(control))).await {
        Ok(h) if h.ignored.is_some() => "refused",
        Ok(_) => "done",
        Err(EngineError::RunNotFound(_)) => return Err(not_found("run")),
        Err(e) => return Err(e.into()),
    };
    back(run_id, &format!("{action}-{outcome}"))
}
