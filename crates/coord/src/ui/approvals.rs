//! The approvals inbox: `/ui/approvals` (mine, my groups', all), and one
//! approval at `/ui/approvals/{run}/{node}` with what it asks, its votes
//! and, while it waits, the form that decides it: the step's `form`
//! (a JSON Schema) as fields, approve or reject, and a comment.

use axum::extract::{Path, Query, State};
use axum::response::{IntoResponse, Redirect};
use composer_api::{Approval, DecideRequest, Scope};
use composer_core::definition::approval::Answer;
use serde_json::{json, Map, Value};

use super::error::{bad, Page, UiError};
use super::extract::{Fields, Params};
use super::html::{html, page, time, Html, Table};
use crate::access::Principal;
use crate::http::approvals::{approval_view, find, inbox, Decider, View};
use crate::shared::RunControl;

/// Most approvals the inbox shows at once.
const SHOWN: i64 = 200;

/// The inbox's views: the query's `view`, the tab's label, and the view.
const VIEWS: [(&str, &str, View); 3] =
    [("mine", "Mine", View::Mine), ("groups", "My groups'", View::Groups), ("all", "All", View::All)];

/// Who the page is for (the guard sets it; the operator outside it).
fn caller(config: &crate::config::Config) -> Principal {
    super::session::caller().unwrap_or_else(|| Principal::operator(config))
}

pub async fn inbox_page(State(c): State<RunControl>, Query(q): Query<Params>) -> Page {
    let view = q.get("view").map(String::as_str).unwrap_or("mine");
    let Some(&(_, _, shown)) = VIEWS.iter().find(|(v, _, _)| *v == view) else {
        return Err(bad("view: mine, groups or all"));
    };
    let who = caller(&c.config);
    let (rows, _) = inbox(&c.pool, c.engine.payloads(), &who, shown, (None, SHOWN)).await?;
    let tabs: Html = VIEWS
        .iter()
        .map(|(v, label, _)| match *v == view {
            true => html!("<a href=\"/ui/approvals?view={}\" aria-current=\"page\">{}</a>", *v, *label),
            false => html!("<a href=\"/ui/approvals?view={}\">{}</a>", *v, *label),
        })
        .collect();
    let rows: Html = rows
        .into_iter()
        .map(approval_view)
        .map(|a| {
            html!(
                "<tr><td><a href=\"/ui/approvals/{}/{}\">{}</a></td><td>{}</td><td>{}</td>\
                 <td>{} of {}</td><td>{}</td><td><a href=\"/ui/runs/{}\"><code>{}</code></a></td></tr>",
                a.run_id,
                &a.node,
                &a.prompt,
                &a.workflow,
                assignees(&a),
                a.votes.iter().filter(|v| v.answer == Answer::Approve).count(),
                a.needed,
                time(a.due_at),
                a.run_id,
                a.run_id
            )
        })
        .collect();
    let table = Table::new("approvals", &["Prompt", "Workflow", "Assignees", "Approved", "Due", "Run"])
        .or_none("No approval waits here.")
        .with(rows);
    let body = html!(
        "<h1>Approvals</h1><p class=\"meta\">Waiting for a decision · signed in as {}{}</p>\
         <nav class=\"tabs\">{}</nav>{}",
        &who.name,
        (!who.groups.is_empty()).then(|| html!(" ({})", who.groups.join(", "))),
        tabs,
        table
    );
    Ok(page("Approvals", body).into_response())
}

fn assignees(a: &Approval) -> String {
    let groups = a.assignees.groups.iter().map(|g| format!("group {g}"));
    a.assignees.people.iter().cloned().chain(groups).collect::<Vec<_>>().join(", ")
}

pub async fn approval_page(State(c): State<RunControl>, Path((id, node)): Path<(String, String)>) -> Page {
    let a = approval_view(find((&c.pool, c.engine.payloads()), &id, &node).await?);
    let votes: Html = a
        .votes
        .iter()
        .map(|v| {
            html!(
                "<tr><td>{}</td><td class=\"{}\">{}</td><td><code>{}</code></td><td>{}</td><td>{}</td><td>{}</td></tr>",
                &v.person,
                v.answer.as_str(),
                v.answer.as_str(),
                if v.data.is_null() { String::new() } else { v.data.to_string() },
                v.comment.as_deref().unwrap_or(""),
                v.via.as_deref().unwrap_or(""),
                time(Some(v.at))
            )
        })
        .collect();
    let table = Table::new("votes", &["Person", "Answer", "Data", "Comment", "By an administrator", "At"])
        .or_none("No vote yet.")
        .with(votes);
    let outcome = match a.state.as_str() {
        "WAITING" => decide_form(&a, caller(&c.config).may(Scope::Admin)),
        "COMPLETED" => html!("<p class=\"notice approved\">Approved by {}.</p>", decided_by(&a)),
        state => html!("<p class=\"notice error\">{}: {}</p>", state, a.error.as_deref().unwrap_or("")),
    };
    let body = html!(
        "<h1>Approval <code>{}</code></h1><p class=\"meta\"><a href=\"/ui/runs/{}\">run {}</a> of {} v{} · \
         {} · due {}{}</p><blockquote class=\"prompt\">{}</blockquote>\
         <p>Assignees: {} · {} approval(s) needed, one rejection rejects</p>{}{}\
         <p><a href=\"/ui/approvals\">← approvals</a></p>",
        &a.node,
        a.run_id,
        a.run_id,
        &a.workflow,
        a.version,
        &a.state,
        a.due_at.map_or_else(|| "never (no timeout)".to_string(), |d| time(Some(d))),
        a.escalated.then_some(" (escalated)"),
        &a.prompt,
        assignees(&a),
        a.needed,
        table,
        outcome
    );
    Ok(page("Approval", body).into_response())
}

fn decided_by(a: &Approval) -> String {
    a.output.as_ref().and_then(|o| o["decided_by"].as_str()).unwrap_or("").to_string()
}

/// The form that decides: a field per property of the step's `form` (its
/// data), a comment, and (for an administrator) whom the vote is for.
fn decide_form(a: &Approval, admin: bool) -> Html {
    let fields: Html = a.form.as_ref().map(form_fields).unwrap_or_default();
    let behalf = admin.then(|| {
        Html::raw(
            "<label>For (an administrator deciding for a person named) \
             <input name=\"as\" maxlength=\"256\" placeholder=\"yourself\"></label>",
        )
    });
    html!(
        "<form id=\"decide\" class=\"act\" method=\"post\" action=\"/ui/approvals/{}/{}/decide\">{}\
         <label>Comment <textarea name=\"comment\" maxlength=\"2000\"></textarea></label>{}\
         <button type=\"submit\" name=\"answer\" value=\"approve\" class=\"approve\">Approve</button>\
         <button type=\"submit\" name=\"answer\" value=\"reject\" class=\"reject\" formnovalidate>Reject</button></form>",
        a.run_id,
        &a.node,
        fields,
        behalf
    )
}

/// A field per property of a JSON Schema object (`data.NAME`): text, a
/// number, a choice of its `enum`, a box for a boolean; anything else is
/// JSON in a text area. A schema of another shape is one JSON text area.
fn form_fields(schema: &Value) -> Html {
    let Some(props) = schema["properties"].as_object() else {
        return Html::raw("<label>Data (JSON) <textarea name=\"data\">{}</textarea></label>");
    };
    let required: Vec<&str> = schema["required"].as_array().into_iter().flatten().filter_map(Value::as_str).collect();
    props
        .iter()
        .map(|(name, p)| {
            let req = required.contains(&name.as_str()).then_some(" required");
            let label = p["title"].as_str().unwrap_or(name);
            let input = match (p["type"].as_str(), p["enum"].as_array()) {
                (_, Some(choices)) => {
                    let options: Html = choices
                        .iter()
                        .map(|c| html!("<option value=\"{}\">{}</option>", c.to_string(), display(c)))
                        .collect();
                    html!("<select name=\"data.{}\" data-json=\"1\"{}>{}</select>", name, req, options)
                }
                (Some("integer"), _) => html!("<input type=\"number\" step=\"1\" name=\"data.{}\"{}>", name, req),
                (Some("number"), _) => html!("<input type=\"number\" step=\"any\" name=\"data.{}\"{}>", name, req),
                (Some("boolean"), _) => html!("<input type=\"checkbox\" name=\"data.{}\" value=\"true\">", name),
                (Some("string"), _) => html!("<input name=\"data.{}\"{}>", name, req),
                _ => html!("<textarea name=\"data.{}\" data-json=\"1\"{}></textarea>", name, req),
            };
            html!("<label>{} {}</label>", label, input)
        })
        .collect()
}

fn display(v: &Value) -> String {
    v.as_str().map_or_else(|| v.to_string(), String::from)
}

/// The form's data: each `data.NAME` field as the schema's type reads it.
fn data_of(form: &Fields, schema: Option<&Value>) -> Result<Value, UiError> {
    let raw = form.one("data");
    if !raw.trim().is_empty() {
        return serde_json::from_str(raw).map_err(|e| bad(format!("data: not JSON: {e}")));
    }
    let mut data = Map::new();
    let props = schema.and_then(|s| s["properties"].as_object()).cloned().unwrap_or_default();
    for (name, p) in &props {
        let text = form.one(&format!("data.{name}")).trim();
        let v = match (p["type"].as_str(), p.get("enum")) {
            (Some("boolean"), _) => json!(text == "true"),
            _ if text.is_empty() => continue,
            (_, Some(_)) | (None, _) => {
                serde_json::from_str(text).map_err(|e| bad(format!("{name}: not JSON: {e}")))?
            }
            (Some("integer"), _) => json!(text.parse::<i64>().map_err(|_| bad(format!("{name}: a whole number")))?),
            (Some("number"), _) => json!(text.parse::<f64>().map_err(|_| bad(format!("{name}: a number")))?),
            (Some("string"), _) => json!(text),
            _ => serde_json::from_str(text).map_err(|e| bad(format!("{name}: not JSON: {e}")))?,
        };
        data.insert(name.clone(), v);
    }
    Ok(Value::Object(data))
}

pub async fn decide_action(
    State(c): State<RunControl>,
    Path((id, node)): Path<(String, String)>,
    body: axum::body::Bytes,
) -> Page {
    let form = Fields::parse(&body)?;
    let answer = match form.one("answer") {
        "approve" => Answer::Approve,
        "reject" => Answer::Reject,
        _ => return Err(bad("answer: approve or reject")),
    };
    let current = approval_view(find((&c.pool, c.engine.payloads()), &id, &node).await?);
    let text = |k: &str| {
        let v = form.one(k).trim();
        (!v.is_empty()).then(|| v.to_string())
    };
    let req = DecideRequest {
        answer,
        data: Some(data_of(&form, current.form.as_ref())?),
        comment: text("comment"),
        on_behalf_of: text("as"),
    };
    let decider = Decider { config: &c.config, pool: &c.pool, engine: &c.engine };
    let decided = decider.decide(&caller(&c.config), (&id, &node), req).await?;
    Ok(Redirect::to(&format!("/ui/approvals/{}/{}", decided.run_id, decided.node)).into_response())
}
