//! `/ui/bulk/{id}`: a bulk job's progress, refreshed while it runs, and a
//! button to stop it.

use axum::extract::{Path, Query, State};
use axum::response::{IntoResponse, Redirect};
use composer_store::bulk::JobRow;
use uuid::Uuid;

use super::error::{bad, not_found, Page, UiError};
use super::extract::Params;
use super::html::{badge, html, page, post_form, time, Html};
use composer_store::Pool;

fn job_id(id: &str) -> Result<Uuid, UiError> {
    id.parse().map_err(|_| bad(format!("{id:?} is not a bulk job id")))
}

pub async fn bulk_page(State(pool): State<Pool>, Path(id): Path<String>, Query(q): Query<Params>) -> Page {
    let id = job_id(&id)?;
    let client = composer_store::client(&pool).await?;
    let job = composer_store::bulk::get(&client, id).await?.ok_or_else(|| not_found("bulk job"))?;
    let live = progress(&job);
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
fn progress(job: &JobRow) -> Html {
    let pct = match job.matched > 0 {
        true => (job.looked_at as f64 / job.matched as f64 * 100.0).min(100.0),
        false => 100.0,
    };
    let mut live = html!(
        "<p class=\"status\">{} · {} of {} looked at ({:.0}%) · {} acted on · {} refused by their status</p>\
         <progress max=\"100\" value=\"{:.0}\"></progress>",
        badge(&job.status),
        job.looked_at,
        job.matched,
        pct,
        job.acted_on,
        job.refused,
        pct
    );
    if let Some(e) = &job.last_error {
        live.push(html!("<p class=\"error\">last error: {}</p>", e));
    }
    if job.status == "RUNNING" {
        let stop = Html::raw("<button type=\"submit\" class=\"cancel\">Stop the job</button>");
        live.push(post_form(&format!("/ui/bulk/{}/cancel", job.id), "", stop));
    }
    live
}

pub async fn bulk_cancel(State(pool): State<Pool>, Path(id): Path<String>) -> Page {
    let id = job_id(&id)?;
    let client = composer_store::client(&pool).await?;
    composer_store::bulk::cancel(&client, id).await?.ok_or_else(|| not_found("bulk job"))?;
    Ok(Redirect::to(&format!("/ui/bulk/{id}")).into_response())
}
