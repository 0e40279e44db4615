//! `/ui/audit`: the audit log, newest first (`?actor=` for one actor's
//! changes, `?before=` for older ones).

use axum::extract::{Query, State};
use axum::response::IntoResponse;
use composer_store::audit::EntryRow;

use super::error::Page;
use super::extract::Params;
use super::html::{clip, html, json_details, page, time, url_enc, Html, Table};
use composer_store::Pool;

/// Entries a page lists.
const SHOWN: i64 = 100;

pub async fn audit_page(State(pool): State<Pool>, Query(q): Query<Params>) -> Page {
    let actor = q.get("actor").filter(|a| !a.is_empty() && a.chars().count() <= 256 && !a.contains('\0'));
    let before = q.get("before").and_then(|b| b.parse::<i64>().ok());
    let client = composer_store::client(&pool).await?;
    let entries = composer_store::audit::page(&client, before, actor.map(String::as_str), SHOWN).await?;
    let table = Table::new("audit", &["At", "Actor", "Source", "Change", "Status", "Asked", "Answered"])
        .or_none("No changes recorded.")
        .with(entries.iter().map(row).collect());
    let named = actor.map(|a| html!(" by <code>{}</code> (<a href=\"/ui/audit\">everyone</a>)", a));
    let older = match entries.last() {
        Some(last) if entries.len() as i64 == SHOWN => match actor {
            Some(a) => html!("<p><a href=\"/ui/audit?before={}&amp;actor={}\">Older</a></p>", last.id, url_enc(a)),
            None => html!("<p><a href=\"/ui/audit?before={}\">Older</a></p>", last.id),
        },
        _ => Html::raw(""),
    };
    let body = html!(
        "<h1>Audit log{}</h1><p class=\"hint\">Every change made through the API or these pages, written before it \
         was made: an entry without a status was not answered. Starting runs and sending events are in runs' own \
         history.</p>{}{}",
        named,
        table,
        older
    );
    Ok(page("Audit log", body).into_response())
}

fn row(e: &EntryRow) -> Html {
    let shown = |label: &str, v: &Option<serde_json::Value>| match v {
        Some(v) => json_details(label, v),
        None => Html::raw(""),
    };
    let status = e.status.map(|s| s.to_string()).unwrap_or_else(|| "none".into());
    html!(
        "<tr><td>{}</td><td><a href=\"/ui/audit?actor={}\">{}</a></td><td>{}</td><td>{} <code>{}</code></td>\
         <td>{}</td><td>{}</td><td>{}</td></tr>",
        time(Some(e.at)),
        url_enc(&e.actor),
        e.actor,
        e.source,
        e.method,
        clip(&e.path, 120),
        status,
        shown("request", &e.request),
        shown("answer", &e.result),
    )
}
