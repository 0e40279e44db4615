//! Replays from the UI: the events page's replay form (a dry run shows
//! what the first events would start), and `/ui/replays/{id}`, a replay's
//! progress, refreshed while it runs, with a button to stop it.

use std::sync::Arc;

use axum::extract::{Path, Query, State};
use axum::response::{IntoResponse, Redirect};
use composer_api::{ReplayDryRun, ReplayFilter, ReplayRequest};
use composer_store::replays::ReplayRow;
use composer_store::Pool;
use uuid::Uuid;

use super::error::{bad, not_found, Page, UiError};
use super::extract::{self, Fields, Params};
use super::html::{html, page, progress, time, Html, Progress, Table};
use crate::http::replay::{Replay, Started};
use crate::shared::{RunControl, Wakes};

/// The events page's replay form.
pub fn form() -> Html {
    Html::raw(
        "<form id=\"replay\" class=\"act\" method=\"post\" action=\"/ui/events/replay\">\
         <label>From (UTC) <input type=\"datetime-local\" name=\"from\" required></label>\
         <label>To (UTC) <input type=\"datetime-local\" name=\"to\" required></label>\
         <label>Name <input name=\"name\" maxlength=\"256\"></label>\
         <label>Key <input name=\"key\" maxlength=\"1024\"></label>\
         <label><input type=\"checkbox\" name=\"failed_only\" value=\"1\"> Only events a trigger failed on</label>\
         <label>Reason <input name=\"reason\" maxlength=\"1024\"></label>\
         <button type=\"submit\" name=\"scope\" value=\"count\">What would it start?</button>\
         <button type=\"submit\" name=\"scope\" value=\"start\" class=\"bulk\">Replay (a job)</button></form>",
    )
}

/// The form's request.
fn request(form: &Fields, dry_run: bool) -> Result<ReplayRequest, UiError> {
    let time = |k: &str| {
        extract::filter_time(form.one(k))?.ok_or_else(|| bad(format!("{k}: a time such as 2026-11-29T18:30")))
    };
    let text = |k: &str| {
        let v = form.one(k).trim();
        composer_core::storable::check_text(v, k).map_err(bad)?;
        Ok::<_, UiError>((!v.is_empty()).then(|| v.to_string()))
    };
    let filter = ReplayFilter {
        name: text("name")?,
        key: text("key")?,
        from: time("from")?,
        to: time("to")?,
        failed_only: !form.one("failed_only").is_empty(),
    };
    Ok(ReplayRequest { filter, reason: extract::reason(form.one("reason"))?, dry_run })
}

/// The form's answer: what a dry run found, or the replay it started.
pub async fn replay_action(
    State(c): State<RunControl>,
    State(wakes): State<Arc<Wakes>>,
    body: axum::body::Bytes,
) -> Page {
    let form = Fields::parse(&body)?;
    let dry_run = match form.one("scope") {
        "count" => true,
        "start" => false,
        _ => return Err(bad("scope: a dry run, or the replay")),
    };
    let replay = Replay { config: &c.config, pool: &c.pool, engine: &c.engine, wakes: &wakes };
    Ok(match replay.start(&super::session::actor(), request(&form, dry_run)?).await? {
        Started::DryRun(d) => page("Replay: a dry run", dry_run_body(&d)).into_response(),
        Started::Job(row) => Redirect::to(&format!("/ui/replays/{}", row.id)).into_response(),
    })
}

fn dry_run_body(d: &ReplayDryRun) -> Html {
    let rows = d
        .preview
        .iter()
        .map(|p| {
            let start: Vec<String> = p
                .would_start
                .iter()
                .map(|t| match &t.flow {
                    Some(flow) => format!("{} (trigger {}, through its {flow})", t.workflow, t.trigger),
                    None => format!("{} (trigger {})", t.workflow, t.trigger),
                })
                .collect();
            let mut fail: Vec<String> = p.would_fail.iter().map(|t| format!("{}: {}", t.workflow, t.error)).collect();
            fail.extend(p.error.clone());
            html!(
                "<tr><td>{}</td><td>{}</td><td><code>{}</code></td><td class=\"would-start\">{}</td>\
                 <td class=\"error\">{}</td></tr>",
                time(Some(p.received_at)),
                p.name,
                p.id,
                start.join(", "),
                fail.join("; ")
            )
        })
        .collect();
    let table = Table::new("preview", &["Received", "Name", "Id", "Would start", "Would fail"])
        .or_none("No event matches.")
        .with(rows);
    html!(
        "<h1>Replay: a dry run</h1><p class=\"notice\">{} event(s) match; the first {} would do this now. \
         Events received before {} are no longer kept.</p>{}<p><a href=\"/ui/events\">← events</a></p>",
        d.matched,
        d.preview.len(),
        time(Some(d.kept_since)),
        table
    )
}

fn replay_id(id: &str) -> Result<Uuid, UiError> {
    id.parse().map_err(|_| bad(format!("{id:?} is not a replay id")))
}

pub async fn replay_page(State(pool): State<Pool>, Path(id): Path<String>, Query(q): Query<Params>) -> Page {
    let id = replay_id(&id)?;
    let client = composer_store::client(&pool).await?;
    let job = composer_store::replays::get(&client, id).await?.ok_or_else(|| not_found("replay"))?;
    let live = live(&job);
    if q.contains_key("fragment") {
        return Ok(live.into_response());
    }
    let refreshed = (job.status == "RUNNING").then(|| html!(" data-live=\"/ui/replays/{}?fragment=1\"", id));
    let body = html!(
        "<h1>Replay <code>{}</code></h1><p class=\"meta\">by {}{} · started {} · ended {}</p>\
         <p>Filter <code>{}</code></p><div{}>{}</div><p><a href=\"/ui/events\">← events</a></p>",
        id,
        job.actor,
        job.reason.as_deref().map(|r| html!(" ({})", r)),
        time(Some(job.created_at)),
        time(job.finished_at),
        serde_json::to_string(&job.filter).unwrap_or_default(),
        refreshed,
        live
    );
    Ok(page("Replay", body).into_response())
}

/// The part that changes while the replay runs.
fn live(job: &ReplayRow) -> Html {
    progress(Progress {
        status: &job.status,
        what: "events",
        looked_at: job.looked_at,
        matched: job.matched,
        counts: html!(
            "<span class=\"started\">{}</span> run(s) started · {} trigger(s) failed again",
            job.started,
            job.failed
        ),
        last_error: job.last_error.as_deref(),
        stop: (format!("/ui/replays/{}/cancel", job.id), "Stop the replay"),
    })
}

pub async fn replay_cancel(State(pool): State<Pool>, Path(id): Path<String>) -> Page {
    let id = replay_id(&id)?;
    let client = composer_store::client(&pool).await?;
    composer_store::replays::cancel(&client, id).await?.ok_or_else(|| not_found("replay"))?;
    Ok(Redirect::to(&format!("/ui/replays/{id}")).into_response())
}
