//! A run's steps: the table on its page (each step's state, data, log,
//! MAP items, child run, and the forms that end it by hand), and
//! `/ui/runs/{id}/items?node=`, a MAP's items by index.

use axum::extract::{Path, Query, State};
use axum::response::IntoResponse;
use composer_core::machine::{RunStatus, TaskState};
use composer_store::runs::{self, RunRow, TaskRow};
use std::collections::HashMap;
use uuid::Uuid;

use super::control::{complete_form, resolve_forms};
use super::error::{not_found, Page, UiError};
use super::extract::{self, Params};
use super::html::{badge, html, json_details, page, run_link, state_class, time, url_enc, Html, Table};
use super::logs;
use composer_store::Pool;

/// Items on one page of a MAP's items.
const ITEMS_PAGE: usize = 200;

/// The steps table of `run`; `child_of` is the child run each step started.
pub async fn table(
    client: &composer_store::Client,
    run: &RunRow,
    tasks: &[TaskRow],
    child_of: &HashMap<Uuid, &RunRow>,
) -> Result<Html, UiError> {
    let ids: Vec<Uuid> = tasks.iter().map(|t| t.id).collect();
    let log_lines = composer_store::logs::counts(client, &ids).await?;
    let rows: Html = tasks.iter().map(|t| step_row(run, t, log_lines.get(&t.id), child_of.get(&t.id))).collect();
    let table = Table::new("tasks", &["Node", "Type", "State", "Attempt", "Started", "Finished", "Error", "Data"]);
    Ok(html!("<h2>Steps</h2>{}", table.with(rows)))
}

fn step_row(run: &RunRow, t: &TaskRow, log_lines: Option<&i64>, child: Option<&&RunRow>) -> Html {
    let mut extra = Html::new();
    if let Some(n) = log_lines {
        extra.push(logs::link(run.id, &t.node_id, *n));
    }
    if let Some(p) = t.map_progress() {
        extra.push(html!(
            "<div class=\"items\">{} items: {} done, {} failed, {} running, {} queued · \
             <a href=\"/ui/runs/{}/items?node={}\">items</a></div>",
            p.total,
            p.completed,
            p.failed,
            p.open,
            p.queued,
            run.id,
            url_enc(&t.node_id)
        ));
    }
    if let Some(c) = child {
        extra.push(html!("<div>child run {} {}</div>", run_link(&c.id), badge(c.status.as_str())));
    }
    if t.node_type == "APPROVAL" && t.item_index.is_none() {
        let href = html!("/ui/approvals/{}/{}", run.id, url_enc(&t.node_id));
        extra.push(html!("<div><a class=\"approval\" href=\"{}\">the approval: its votes and form</a></div>", href));
    }
    if t.state == TaskState::InDoubt {
        extra.push(resolve_forms(run.id, &t.node_id));
    }
    let completable = !run.status.is_terminal() || run.status == RunStatus::Failed;
    if completable && (!t.state.is_terminal() || t.state == TaskState::Failed) {
        extra.push(complete_form(run.id, &t.node_id));
    }
    html!(
        "<tr class=\"task {}\" data-node=\"{}\"><td>{}{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td>\
         <td class=\"error\">{}</td><td>{}{}</td></tr>",
        state_class(t.state.as_str()),
        t.node_id,
        t.node_id,
        extra,
        t.node_type,
        badge(t.state.as_str()),
        t.attempt,
        time(t.started_at),
        time(t.finished_at),
        t.error.as_deref().unwrap_or(""),
        json_details("input", &t.input),
        t.output.as_ref().map(|o| json_details("output", o)),
    )
}

/// `/ui/runs/{id}/items?node=&after=`: a page of a MAP's items.
pub async fn items_page(
    State(pool): State<Pool>,
    State(engine): State<std::sync::Arc<crate::engine::Engine>>,
    Path(id): Path<String>,
    Query(q): Query<Params>,
) -> Page {
    let run_id = extract::run_id(&id)?;
    let node = extract::text(&q, "node")?;
    let after: i32 = extract::text(&q, "after")?.parse().unwrap_or(-1);
    let client = composer_store::client(&pool).await?;
    let (_, tasks) = runs::get(&client, run_id).await?.ok_or_else(|| not_found("run"))?;
    let map = tasks.iter().find(|t| t.node_id == node && t.progress.is_some()).ok_or_else(|| not_found("MAP node"))?;
    let mut items = runs::items(&client, run_id, map.id, after, ITEMS_PAGE as i64).await?;
    crate::payloads::tasks_for_page(engine.payloads(), run_id, &mut items).await?;
    let ids: Vec<Uuid> = items.iter().map(|t| t.id).collect();
    let log_lines = composer_store::logs::counts(&client, &ids).await?;
    let rows: Html = items
        .iter()
        .map(|t| {
            html!(
                "<tr><td>{}{}</td><td>{}</td><td>{}</td><td>{}</td><td class=\"error\">{}</td><td>{}{}</td></tr>",
                t.node_id,
                log_lines.get(&t.id).map(|n| logs::link(run_id, &t.node_id, *n)),
                badge(t.state.as_str()),
                t.attempt,
                time(t.finished_at),
                t.error.as_deref().unwrap_or(""),
                json_details("input", &t.input),
                t.output.as_ref().map(|o| json_details("output", o))
            )
        })
        .collect();
    let table = Table::new("tasks", &["Item", "State", "Attempt", "Finished", "Error", "Data"]);
    let more = match (items.len(), items.last().and_then(|t| t.item_index)) {
        (ITEMS_PAGE, Some(last)) => Some(html!(
            "<a class=\"next\" href=\"/ui/runs/{}/items?node={}&after={}\">More →</a>",
            run_id,
            url_enc(node),
            last
        )),
        _ => None,
    };
    let body = html!(
        "<h1>Items of <code>{}</code></h1><p><a href=\"/ui/runs/{}\">← run</a></p>{}{}",
        node,
        run_id,
        table.with(rows),
        more
    );
    Ok(page("Items", body).into_response())
}
