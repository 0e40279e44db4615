//! `/ui/bulk/{id}`: a bulk job's progress, refreshed while it runs, and a
//! button to stop it.

use axum::extract::{Path, Query, State};
use axum::response::{IntoResponse, Redirect};
use composer_store::bulk::JobRow;
use uuid::Uuid;

use super::error::{bad, not_found, Page, UiError};
use super::extract::Params;
use super::html::{html, page, progress, time, Html, Progress};
use composer_store::Pool;

fn job_id(id: &str) -> Result<Uuid, UiError> {
    id.parse().map_err(|_| bad(format!("{id:?} is not a bulk job id")))
}

pub async fn bulk_page(State(pool): State<Pool>, Path(id): Path<String>, Query(q): Query<Params>) -> Page {
    let id = job_id(&id)?;
    let client = composer_store::client(&pool).await?;
    let job = composer_store::bulk::get(&client, id).await?.ok_or_else(|| not_found("bulk job"))?;
    let live = live(&job);
    if q.contains_key("fragment") {
        return Ok(live.into_response());
    }
    let refreshed = (job.status == "RUNNING").then(|| html!(" data-live=\"/ui/bulk/{}?fragment=1\"", id));
    let filter = serde_json::to_string(&job.filter).unwrap_or_default();
    let body = html!(
        "<h1>Bulk job <code>{}</code></h1><p class=\"meta\">{} · by {}{} · started {} · ended {}</p>\
         <p>Filter <code>{}</code>{}{}</p><div{}>{}</div><p><a href=\"/ui/runs\">← runs</a></p>",
        id,
        job.action,
        job.actor,
        job.reason.as_deref().map(|r| html!(" ({})", r)),
        time(Some(job.created_at)),
        time(job.finished_at),
        filter,
        job.rerun_from.as_ref().map(|f| html!(" · from {}", f.join(", "))),
        job.migrate.as_ref().map(|m| html!(" · v{} → v{}", m["from_version"].to_string(), m["to_version"].to_string())),
        refreshed,
        live
    );
    Ok(page("Bulk job", body).into_response())
}

/// The part that changes while the job runs.
fn live(job: &JobRow) -> Html {
    progress(Progress {
        status: &job.status,
        what: "runs",
        looked_at: job.looked_at,
        matched: job.matched,
        counts: html!("{} acted on · {} refused by their status", job.acted_on, job.refused),
        last_error: job.last_error.as_deref(),
        stop: (format!("/ui/bulk/{}/cancel", job.id), "Stop the job"),
    })
}

pub async fn bulk_cancel(State(pool): State<Pool>, Path(id): Path<String>) -> Page {
    let id = job_id(&id)?;
    let client = composer_store::client(&pool).await?;
    composer_store::bulk::cancel(&client, id).await?.ok_or_else(|| not_found("bulk job"))?;
    Ok(Redirect::to(&format!("/ui/bulk/{id}")).into_response())
}
