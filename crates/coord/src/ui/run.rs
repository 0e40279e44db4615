//! `/ui/runs/{id}`: one run — what it is and where it came from, its
//! buttons, why it waits, its graph, steps and timeline, its children, its
//! input and its history. The part that changes while it runs refreshes
//! itself (`?fragment=1`).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use axum::extract::{Path, Query, State};
use axum::response::IntoResponse;
use composer_core::machine::RunStatus;
use composer_store::runs::{self, HistoryRow, RunFilter, RunRow, TaskRow};
use uuid::Uuid;

use super::control;
use super::dag;
use super::error::{not_found, Page, UiError};
use super::extract::{self, Params};
use super::html::{badge, clip, html, json_details, notice, page, run_link, time, url_enc, workflow_link, Html, Table};
use super::notices;
use super::runs::tag_links;
use super::steps;
use super::timeline;
use crate::engine::Engine;
use composer_store::{Client, Pool};
use composer_stream::Streams;

/// History lines shown on a run's page.
const HISTORY_SHOWN: i64 = 500;

/// Child runs a run's page lists.
const CHILDREN_SHOWN: i64 = 1000;

/// What a run's page reads: the store, the engine (to compile the run's
/// definition) and the streams (to say why a step waits for a worker).
struct Sources<'a> {
    pool: &'a Pool,
    engine: &'a Engine,
    streams: &'a Streams,
}

pub async fn run_page(
    State(pool): State<Pool>,
    State(engine): State<Arc<Engine>>,
    State(streams): State<Streams>,
    State(archive): State<crate::archive::Archive>,
    Path(id): Path<String>,
    Query(q): Query<Params>,
) -> Page {
    let from = Sources { pool: &pool, engine: &engine, streams: &streams };
    let run_id = extract::run_id(&id)?;
    let mut client = composer_store::client(&pool).await?;
    let Some((mut run, mut tasks)) = runs::get(&client, run_id).await? else {
        // Gone from the database: the archive may have it.
        if matches!(archive.read(run_id).await, Ok(Some(_))) {
            return Ok(axum::response::Redirect::to(&format!("/ui/archive/runs/{run_id}")).into_response());
        }
        return Err(not_found("run"));
    };
    crate::payloads::for_page(engine.payloads(), &mut run, &mut tasks).await?;
    let children = RunFilter { parent: Some(run_id), ..Default::default() };
    let children = runs::list(&mut client, &children, None, CHILDREN_SHOWN).await?;
    let live = live_part(&from, &client, &run, &tasks, &children).await?;
    if q.contains_key("fragment") {
        return Ok(live.into_response());
    }
    let handlers = runs::handlers_of(&client, run_id).await?;
    let history = runs::history(&client, run_id, 0, HISTORY_SHOWN).await?;
    let refreshed = (!run.status.is_terminal()).then(|| html!(" data-live=\"/ui/runs/{}?fragment=1\"", run.id));
    let body = html!(
        "<h1>Run <code>{}</code></h1>{}{}<div{}>{}</div>{}{}",
        run.id,
        meta(&run, &handlers),
        q.get("msg").and_then(|m| notices::text(m)).map(notice),
        refreshed,
        live,
        json_details("Input", &run.input),
        history_table(&run, &history)
    );
    Ok(page(&format!("Run {}", run.id), body).into_response())
}

/// What the run is and where it came from: its workflow, parent, trigger,
/// failure handlers, tags, priority, fairness key and trace.
fn meta(run: &RunRow, handlers: &[(Uuid, String)]) -> Html {
    let mut said = html!("Workflow {} v{}", workflow_link(&run.workflow_name), run.workflow_version);
    if let Some(p) = run.parent {
        said.push(html!(" · child of {}", run_link(&p.run_id)));
    }
    if let Some(t) = run.trigger.as_ref().and_then(|t| t["schedule"].as_str()) {
        said.push(html!(" · started by schedule <a href=\"/ui/schedules\">{}</a>", t));
        if run.trigger.as_ref().is_some_and(|t| t["backfill"] == true) {
            said.push(Html::raw(" (backfill)"));
        }
    }
    if let Some(ev) = run.trigger.as_ref().and_then(|t| t["event"].as_str()) {
        let link = html!("<a href=\"/ui/events?name={}\">{}</a>", url_enc(ev), ev);
        said.push(html!(" · started by event {}", link));
        if let Some(flow) = run.trigger.as_ref().and_then(|t| t["flow"].as_str()) {
            let t = run.trigger.as_ref().unwrap_or(&serde_json::Value::Null);
            let events = t["events"].as_u64().unwrap_or(1);
            let key = t["key"].as_str().unwrap_or("");
            said.push(html!(
                " ({} of key <code>{}</code>, {} event{})",
                flow,
                clip(key, 100),
                events,
                if events == 1 { "" } else { "s" }
            ));
        }
    }
    if let Some(ended) = run.handles_run_id {
        match run.trigger.as_ref().and_then(|t| t["hook"].as_str()) {
            Some(hook) => said.push(html!(" · <code>{}</code> hook of {}", hook, run_link(&ended))),
            None => said.push(html!(" · failure handler of {}", run_link(&ended))),
        }
    }
    for (handler, hook) in handlers {
        match hook.as_str() {
            "on_failure" => said.push(html!(" · its failure handler: {}", run_link(handler))),
            hook => said.push(html!(" · its <code>{}</code> hook: {}", hook, run_link(handler))),
        }
    }
    if let Some(tags) = run.tags.as_ref().and_then(|t| t.as_object()).filter(|t| !t.is_empty()) {
        said.push(html!(" · tags {}", tag_links(tags)));
    }
    said.push(html!(" · priority <span class=\"priority\">{}</span>", run.priority));
    if let Some(key) = &run.fairness_key {
        said.push(html!(" · fairness key <code class=\"fairness\">{}</code>", clip(key, 100)));
    }
    let trace = composer_core::trace::RunTrace::of(run.id, run.traceparent.as_deref());
    said.push(html!(" · trace <code class=\"trace\">{}</code>", trace.trace_id_hex()));
    html!("<p class=\"meta\">{}</p>", said)
}

/// The run's history: what happened, when, by whom and why.
fn history_table(run: &RunRow, history: &[HistoryRow]) -> Html {
    let rows: Html = history
        .iter()
        .map(|h| {
            html!(
                "<tr><td>{}</td><td>{}</td><td>{}</td><td class=\"actor\">{}</td><td class=\"reason\">{}</td><td>{}</td></tr>",
                h.seq,
                time(Some(h.created_at)),
                h.kind.as_str(),
                h.payload["actor"].as_str().unwrap_or(""),
                clip(h.payload["reason"].as_str().unwrap_or(""), 200),
                json_details("details", &h.payload)
            )
        })
        .collect();
    let table = Table::new("history", &["#", "When", "What", "By", "Why", ""]).with(rows);
    let rest = (history.len() as i64 == HISTORY_SHOWN).then(|| {
        html!(
            "<p>The first {} lines; the rest at <code>/v1/runs/{}/events?after={}</code>.</p>",
            HISTORY_SHOWN,
            run.id,
            history.last().map(|h| h.seq).unwrap_or(0)
        )
    });
    html!("<h2>History</h2>{}{}", table, rest)
}

/// The part of a run's page that changes while it runs: its buttons,
/// status, why it waits, graph, steps, timeline, rerun form and children.
async fn live_part(
    from: &Sources<'_>,
    client: &Client,
    run: &RunRow,
    tasks: &[TaskRow],
    children: &[RunRow],
) -> Result<Html, UiError> {
    let child_of: HashMap<Uuid, &RunRow> =
        children.iter().filter_map(|c| c.parent.map(|p| (p.task_id, c))).rev().collect();
    let mut live = control::buttons(run);
    live.push(status(run));
    if !run.status.is_terminal() {
        live.push(why_it_waits(from, run.id).await?);
    }
    live.push(graph(from.engine, client, run, tasks, &child_of).await?);
    live.push(steps::table(client, run, tasks, &child_of).await?);
    live.push(timeline(client, run, tasks).await?);
    if run.status != RunStatus::Queued && !tasks.is_empty() {
        live.push(control::rerun_form(run, tasks));
    }
    if !children.is_empty() {
        let listed: Html = children
            .iter()
            .map(|c| html!("<li>{} {} {}</li>", run_link(&c.id), c.workflow_name, badge(c.status.as_str())))
            .collect();
        live.push(html!("<h2>Child runs</h2><ul class=\"children\">{}</ul>", listed));
    }
    Ok(live)
}

/// Its status, when it started and (once ended) when it finished, its
/// error and output.
fn status(run: &RunRow) -> Html {
    html!(
        "<p class=\"status\">{} · started {}{}</p>{}{}",
        badge(run.status.as_str()),
        time(Some(run.created_at)),
        run.finished_at.map(|at| html!(" · finished {}", time(Some(at)))),
        run.error.as_ref().map(|e| html!("<p class=\"error run-error\">{}</p>", e)),
        run.output.as_ref().map(|out| json_details("Output", out))
    )
}

/// Why an open run waits, node by node (the API's explain).
async fn why_it_waits(from: &Sources<'_>, run_id: Uuid) -> Result<Html, UiError> {
    let why = crate::http::explain::explain_run(from.pool, from.engine, from.streams, run_id).await?;
    let nodes = (!why.nodes.is_empty()).then(|| {
        let items: Html = why
            .nodes
            .iter()
            .map(|n| {
                html!(
                    "<li data-node=\"{}\"><code>{}</code> {} {}{}</li>",
                    n.node_id,
                    n.node_id,
                    badge(n.state.as_str()),
                    n.reason,
                    json_details("as data", &n.detail)
                )
            })
            .collect();
        html!("<ul>{}</ul>", items)
    });
    Ok(html!(
        "<section class=\"explain\"><h2>Why it waits</h2><p class=\"summary\">{}</p>{}</section>",
        why.summary,
        nodes
    ))
}

/// The run's graph, coloured by its tasks, the edges it took bold (nothing
/// when its definition no longer compiles).
async fn graph(
    engine: &Engine,
    client: &Client,
    run: &RunRow,
    tasks: &[TaskRow],
    child_of: &HashMap<Uuid, &RunRow>,
) -> Result<Html, UiError> {
    let Some(def) = composer_store::definitions::by_id(client, run.workflow_definition_id).await? else {
        return Ok(Html::new());
    };
    let Ok(wf) = engine.compile(&def) else { return Ok(Html::new()) };
    let held = match dag::any_held(tasks) {
        true => composer_store::limits::held_in_run(client, run.id).await?,
        false => HashMap::new(),
    };
    let states = dag::node_states(&wf, tasks, &held, child_of);
    // The edges the engine took, as the history records them, of the tasks
    // the run has now (a reset task's are gone).
    let current: HashSet<Uuid> = tasks.iter().map(|t| t.id).collect();
    let taken = runs::taken_edges(client, run.id)
        .await?
        .into_iter()
        .filter(|(task, _, _)| current.contains(task))
        .map(|(_, from, to)| (from, to))
        .collect();
    Ok(html!("<div class=\"graph\">{}</div>", dag::svg(&wf, &states, &taken)))
}

/// The run's timeline, with how to read it.
async fn timeline(client: &Client, run: &RunRow, tasks: &[TaskRow]) -> Result<Html, UiError> {
    let history = runs::history(client, run.id, 0, timeline::HISTORY_READ).await?;
    let bars = timeline::bars_of(tasks, &history);
    if bars.is_empty() {
        return Ok(Html::new());
    }
    Ok(html!(
        "<h2>Timeline</h2><p class=\"hint\">From {} (UTC). A bar per attempt, from when it was sent to when it \
         ended, in the colour of how it ended (grey: retried), the last one lighter while it waited for a \
         worker. Hover a bar for its times.</p><div class=\"graph\">{}</div>",
        time(Some(run.created_at)),
        timeline::svg(run.created_at, run.finished_at, &bars, crate::clock::now())
    ))
}
