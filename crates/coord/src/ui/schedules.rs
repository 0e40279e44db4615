//! `/ui/schedules`: every schedule, when it fires next, its last run, and a
//! backfill form per schedule (the API's backfill, times in UTC).

use axum::extract::{Form, Path, Query, State};
use axum::response::{IntoResponse, Redirect};
use composer_core::schedule::BackfillOverlap;
use composer_store::schedules::ScheduleRow;

use super::error::{not_found, Page};
use super::extract::{self, Params};
use super::html::{html, notice, page, post_form, run_link, time, url_enc, workflow_link, Html, Table};
use super::notices;
use composer_store::Pool;

pub async fn schedules_page(State(pool): State<Pool>, Query(q): Query<Params>) -> Page {
    let client = composer_store::client(&pool).await?;
    let rows = composer_store::schedules::list(&client, None, 1000).await?;
    let said = q.get("msg").and_then(|m| notices::text(m)).map(|said| {
        let queued = q.get("queued").and_then(|n| n.parse::<u64>().ok());
        notice(&format!("{said}{}", queued.map(|n| format!(" ({n} queued)")).unwrap_or_default()))
    });
    let table = Table::new(
        "",
        &["Id", "Workflow", "Cron", "Time zone", "Overlap", "State", "Next fire", "Last run", "Backfill"],
    )
    .or_none("No schedules.");
    let body = html!("<h1>Schedules</h1>{}{}", said, table.with(rows.iter().map(schedule_row).collect()));
    Ok(page("Schedules", body).into_response())
}

fn schedule_row(r: &ScheduleRow) -> Html {
    let spec = &r.spec;
    let queued = (r.backfill_queued > 0).then(|| html!("{} queued", r.backfill_queued));
    html!(
        "<tr><td>{}</td><td>{}</td><td><code>{}</code></td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td>\
         <td>{}{}</td></tr>",
        r.id,
        workflow_link(&r.workflow),
        spec["cron"].as_str().unwrap_or(""),
        spec["timezone"].as_str().unwrap_or("UTC"),
        spec["overlap"].as_str().unwrap_or("skip"),
        if r.paused { "paused" } else { "active" },
        if r.paused { String::new() } else { time(r.next_fire_at) },
        r.last_run_id.as_ref().map(run_link),
        queued,
        backfill_form(&r.id)
    )
}

fn backfill_form(schedule: &str) -> Html {
    let fields = Html::raw(
        "<label>from <input type=\"datetime-local\" name=\"from\" step=\"1\" required></label> \
         <label>to <input type=\"datetime-local\" name=\"to\" step=\"1\" required></label> (UTC) \
         <select name=\"overlap\"><option value=\"allow\">all at once</option>\
         <option value=\"buffer_all\">one at a time</option><option value=\"skip\">skip while one runs</option></select> \
         <button type=\"submit\">Backfill</button>",
    );
    post_form(&format!("/ui/schedules/{}/backfill", url_enc(schedule)), "backfill", fields)
}

/// The backfill form's answer: the API's backfill, with times in UTC as a
/// browser's `datetime-local` sends them.
pub async fn backfill_action(State(pool): State<Pool>, Path(id): Path<String>, Form(form): Form<Params>) -> Page {
    let invalid = || Ok(Redirect::to("/ui/schedules?msg=backfill-invalid").into_response());
    let time = |name: &str| form.get(name).and_then(|v| extract::local_time(v));
    let (Some(from), Some(to)) = (time("from"), time("to")) else { return invalid() };
    let overlap = form.get("overlap").map_or(Some(BackfillOverlap::Allow), |o| BackfillOverlap::parse(o));
    let Some(overlap) = overlap else { return invalid() };
    let queued = match crate::schedules::backfill(&pool, &id, from, to, overlap).await {
        Ok(done) => done.queued,
        Err(crate::schedules::BackfillError::NotFound) => return Err(not_found("schedule")),
        Err(crate::schedules::BackfillError::Invalid(_)) => return invalid(),
        Err(crate::schedules::BackfillError::Store(e)) => return Err(e.into()),
    };
    Ok(Redirect::to(&format!("/ui/schedules?msg=backfill-done&queued={queued}")).into_response())
}
