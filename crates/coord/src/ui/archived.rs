//! `/ui/archive/runs/{id}`: a run retention archived, read back from the
//! archive and shown read-only (no buttons: its rows are gone): what it
//! was, its steps, its MAP items' count, its input, its log lines and its
//! history. A run page whose run is no longer in the database sends the
//! browser here when the archive has it.

use axum::extract::{Path, State};
use axum::response::IntoResponse;
use composer_api::{ArchivedRun, TaskView};

use super::error::{not_found, Page, UiError};
use super::extract;
use super::html::{badge, clip, html, json_details, page, time, workflow_link, Html, Table};
use crate::archive::Archive;

/// Log lines shown per attempt, and history lines shown.
const SHOWN: usize = 500;

pub async fn archived_page(State(archive): State<Archive>, Path(id): Path<String>) -> Page {
    let run_id = extract::run_id(&id)?;
    let run = archive.read(run_id).await.map_err(|e| {
        tracing::warn!(error = %e, run = %run_id, "ui: reading the archive failed");
        UiError(axum::http::StatusCode::SERVICE_UNAVAILABLE, "the archive could not be read; retry shortly".into())
    })?;
    let (mut run, copies) = run.ok_or_else(|| not_found("archived run"))?;
    crate::payloads::archived_for_page(&copies, &mut run.run).await.map_err(|e| {
        tracing::warn!(error = %e, run = %run_id, "ui: reading an archived run's value failed");
        UiError(axum::http::StatusCode::SERVICE_UNAVAILABLE, "the archived run's values could not be read".into())
    })?;
    Ok(page(&format!("Archived run {run_id}"), body(&run)).into_response())
}

fn body(a: &ArchivedRun) -> Html {
    let r = &a.run;
    let in_files: u64 = a.item_files.values().flatten().map(|f| f.items).sum();
    let items = a.items.values().map(Vec::len).sum::<usize>() + in_files as usize;
    let steps = a.run.tasks.as_deref().unwrap_or_default().iter().map(step_row).collect();
    let logs: Html = a
        .logs
        .iter()
        .map(|l| {
            let lines: Vec<&str> = l.lines.iter().take(SHOWN).map(|x| x.line.as_str()).collect();
            html!("<h3><code>{}</code> attempt {}</h3><pre class=\"log\">{}</pre>", l.node, l.attempt, lines.join("\n"))
        })
        .collect();
    let history: Html = a
        .history
        .iter()
        .take(SHOWN)
        .map(|h| {
            html!(
                "<tr><td>{}</td><td>{}</td><td>{}</td><td class=\"actor\">{}</td><td>{}</td></tr>",
                h.seq,
                time(Some(h.created_at)),
                h.kind.as_str(),
                h.payload["actor"].as_str().unwrap_or(""),
                json_details("details", &h.payload)
            )
        })
        .collect();
    html!(
        "<h1>Archived run <code>{}</code></h1><p class=\"notice archived\">Read from the archive: retention \
         dropped its rows, so it can be read but not acted on.</p><p class=\"meta\">Workflow {} v{} · {} · \
         started {} · finished {}{}</p>{}{}<h2>Steps</h2>{}{}{}<h2>History</h2>{}",
        r.id,
        workflow_link(&r.workflow),
        r.version,
        badge(r.status.as_str()),
        time(Some(r.created_at)),
        time(r.finished_at),
        (items > 0).then(|| html!(" · {} MAP items", items.to_string())),
        r.error.as_ref().map(|e| html!("<p class=\"error run-error\">{}</p>", e)),
        r.output.as_ref().map(|o| json_details("Output", o)),
        Table::new("steps", &["Step", "Type", "State", "Attempt", "Started", "Finished", "Error"]).with(steps),
        r.input.as_ref().map(|i| json_details("Input", i)),
        (!logs.is_empty()).then(|| html!("<h2>Logs</h2>{}", logs)),
        Table::new("history", &["#", "When", "What", "By", ""]).with(history)
    )
}

fn step_row(t: &TaskView) -> Html {
    html!(
        "<tr><td><code>{}</code></td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td class=\"error\">{}</td></tr>",
        t.node_id,
        t.node_type,
        badge(t.state.as_str()),
        t.attempt.to_string(),
        time(t.started_at),
        time(t.finished_at),
        clip(t.error.as_deref().unwrap_or(""), 300)
    )
}
