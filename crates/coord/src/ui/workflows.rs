//! `/ui/workflows`: each workflow's latest version; `/ui/workflows/{name}`:
//! one version's graph, its versions and its definition.

use std::collections::HashMap;
use std::sync::Arc;

use axum::extract::{Path, Query, State};
use axum::response::IntoResponse;

use super::dag;
use super::error::{bad, not_found, Page};
use super::extract::{self, Params};
use super::html::{html, page, time, url_enc, workflow_link, Html, Table};
use crate::engine::Engine;
use composer_store::Pool;

pub async fn workflows_page(State(pool): State<Pool>) -> Page {
    let client = composer_store::client(&pool).await?;
    let rows = composer_store::definitions::latest_of_each(&client, 1000).await?;
    let listed: Html = rows
        .iter()
        .map(|d| {
            html!(
                "<tr><td>{}</td><td>v{}</td><td>{}</td><td><a href=\"/ui/runs?workflow={}\">runs</a></td></tr>",
                workflow_link(&d.name),
                d.version,
                time(Some(d.created_at)),
                url_enc(&d.name)
            )
        })
        .collect();
    let table = Table::new("", &["Name", "Latest version", "Registered", ""]).with(listed);
    Ok(page("Workflows", html!("<h1>Workflows</h1>{}", table)).into_response())
}

pub async fn workflow_page(
    State(pool): State<Pool>,
    State(engine): State<Arc<Engine>>,
    Path(name): Path<String>,
    Query(q): Query<Params>,
) -> Page {
    composer_core::storable::check_text(&name, "workflow").map_err(bad)?;
    let version = match extract::text(&q, "version")? {
        "" => None,
        v => Some(v.parse::<i32>().map_err(|_| bad("version: not a number"))?),
    };
    let client = composer_store::client(&pool).await?;
    let def =
        composer_store::definitions::by_name(&client, &name, version).await?.ok_or_else(|| not_found("workflow"))?;
    let versions = composer_store::definitions::versions(&client, &name, None, 100).await?;
    let compiled = engine.compile(&def).ok();
    let graph = compiled
        .as_ref()
        .map(|wf| html!("<div class=\"graph\">{}</div>", dag::svg(wf, &HashMap::new(), &Default::default())));
    let triggers = compiled.as_ref().map(|wf| triggers(wf, &def.spec)).unwrap_or_default();
    let versions: Html = versions
        .iter()
        .map(|v| {
            html!(
                "<li><a href=\"/ui/workflows/{}?version={}\">v{}</a> {}</li>",
                url_enc(&v.name),
                v.version,
                v.version,
                time(Some(v.created_at))
            )
        })
        .collect();
    let spec = serde_json::to_string_pretty(&def.spec).unwrap_or_default();
    let body = html!(
        "<h1>{} <small>v{}</small></h1><p><a href=\"/ui/runs?workflow={}\">Its runs</a> · \
         <a href=\"/ui/workflows/{}/migrate\">Move open runs to another version</a></p>{}{}\
         <h2>Versions</h2><ul class=\"versions\">{}</ul><h2>Definition</h2><pre class=\"spec\">{}</pre>",
        def.name,
        def.version,
        url_enc(&def.name),
        url_enc(&def.name),
        graph,
        triggers,
        versions,
        spec
    );
    Ok(page(&def.name, body).into_response())
}

/// The events that start its runs, and what each trigger's flow control
/// does with them, in words.
fn triggers(wf: &composer_core::definition::Workflow, spec: &serde_json::Value) -> Html {
    if wf.triggers.is_empty() {
        return Html::new();
    }
    let items: Html = wf
        .triggers
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let flow = match t.flow() {
                None => "one run per event".to_string(),
                Some(f) => {
                    let key = spec["triggers"][i]["key"].as_str().unwrap_or("the event's key");
                    format!("{}; per key {}", f.describe(), key)
                }
            };
            html!(
                "<li>{}: <a href=\"/ui/events?name={}\">{}</a> — <span class=\"flow\">{}</span></li>",
                i,
                url_enc(&t.event),
                t.event,
                flow
            )
        })
        .collect();
    html!("<h2>Triggers</h2><ul class=\"triggers\">{}</ul>", items)
}
