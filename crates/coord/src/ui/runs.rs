//! `/ui/runs`: the runs list — filters (workflow, status, time range, tags),
//! newest first, keyset pages — and its act form: an action on each chosen
//! run now, or a bulk job (or its dry run) over every run the filter matches.

use std::sync::Arc;

use axum::extract::{Query, State};
use axum::response::{IntoResponse, Redirect};
use chrono::{DateTime, Utc};
use composer_core::machine::RunStatus;
use composer_store::runs::{self, RunFilter, RunRow};
use uuid::Uuid;

use super::error::{bad, Page, UiError};
use super::extract::{self, Fields, Params};
use super::html::{badge, clip, hidden, html, options, page, run_link, time, url_enc, workflow_link, Html, Table};
use crate::engine::{By, Control, EventRequest};
use crate::shared::{RunControl, Wakes};
use composer_store::Pool;

/// Runs on one page of the list.
pub const PAGE: i64 = 50;

/// Most runs the act form takes at once (a page of the list).
const MAX_CHOSEN: usize = PAGE as usize;

/// Actions the list offers on chosen runs and on every run its filter matches.
const LIST_ACTIONS: [&str; 5] = ["cancel", "retry", "pause", "resume", "rerun"];

/// The query parameters the list is filtered by.
const FILTERS: [&str; 5] = ["workflow", "status", "since", "until", "tag"];

/// The list's filter, read from its query (or the act form's `f_` fields).
struct ListFilter {
    workflow: String,
    status: Option<RunStatus>,
    since: Option<DateTime<Utc>>,
    until: Option<DateTime<Utc>>,
    tags: Option<serde_json::Value>,
}

impl ListFilter {
    fn read(q: &Params) -> Result<ListFilter, UiError> {
        let status = match extract::text(q, "status")? {
            "" => None,
            s => Some(RunStatus::parse(s).ok_or_else(|| bad(format!("unknown status {s:?}")))?),
        };
        Ok(ListFilter {
            workflow: extract::text(q, "workflow")?.to_string(),
            status,
            since: extract::filter_time(extract::text(q, "since")?)?,
            until: extract::filter_time(extract::text(q, "until")?)?,
            tags: extract::tags(extract::text(q, "tag")?)?,
        })
    }

    fn runs(&self) -> RunFilter<'_> {
        RunFilter {
            workflow: (!self.workflow.is_empty()).then_some(self.workflow.as_str()),
            status: self.status,
            parent: None,
            since: self.since.map(extract::id_at),
            until: self.until.map(extract::id_at),
            tags: self.tags.as_ref(),
            ..RunFilter::default()
        }
    }

    fn is_empty(&self) -> bool {
        self.workflow.is_empty()
            && self.status.is_none()
            && self.since.is_none()
            && self.until.is_none()
            && self.tags.is_none()
    }

    /// The same filter as a bulk job's.
    fn bulk(&self) -> composer_api::BulkFilter {
        composer_api::BulkFilter {
            workflow: (!self.workflow.is_empty()).then(|| self.workflow.clone()),
            status: self.status,
            tags: self.tags.clone(),
            created_after: self.since,
            created_before: self.until,
        }
    }
}

/// `/ui/runs`: a page of runs, a box per run to act on the chosen ones; the
/// table refreshes itself (`?fragment=1`) while nothing in it is chosen.
pub async fn runs_page(State(pool): State<Pool>, Query(q): Query<Params>) -> Page {
    let filter = ListFilter::read(&q)?;
    let cursor = match extract::text(&q, "cursor")? {
        "" => None,
        c => Some(c.parse::<Uuid>().map_err(|_| bad("cursor: not a run id"))?),
    };
    let mut client = composer_store::client(&pool).await?;
    let rows = runs::list(&mut client, &filter.runs(), cursor, PAGE).await?;
    // The filters as they came, for the next page's link and the refresh.
    let keep = |k: &str| q.get(k).map(|v| format!("&{k}={}", url_enc(v))).unwrap_or_default();
    let filters: String = FILTERS.iter().map(|k| keep(k)).collect();
    let table = Table::new("runs", &["", "Run", "Workflow", "Status", "Tags", "Started", "Finished", "Error"])
        .or_none("No runs match.")
        .live(format!("/ui/runs?fragment=1{filters}{}", keep("cursor")));
    let listed: Html = rows.iter().map(run_row).collect();
    if q.contains_key("fragment") {
        return Ok(table.body(listed).into_response());
    }
    let older = match rows.last() {
        Some(last) if rows.len() as i64 == PAGE => {
            html!("<a class=\"next\" href=\"/ui/runs?cursor={}{}\">Older runs →</a>", last.id, filters)
        }
        _ => Html::new(),
    };
    let body = html!(
        "<h1>Runs</h1>{}{}{}{}{}",
        acted_notice(&q),
        filter_form(&q),
        act_form(&q, &filter),
        table.with(listed),
        older
    );
    Ok(page("Runs", body).into_response())
}

fn run_row(r: &RunRow) -> Html {
    let tags = r.tags.as_ref().and_then(|t| t.as_object()).map(tag_links);
    html!(
        "<tr data-status=\"{}\"><td><input type=\"checkbox\" name=\"run\" value=\"{}\" form=\"act\" \
         aria-label=\"choose run {}\"></td><td>{}</td><td>{} v{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td>\
         <td class=\"error\">{}</td></tr>",
        r.status.as_str(),
        r.id,
        r.id,
        run_link(&r.id),
        workflow_link(&r.workflow_name),
        r.workflow_version,
        badge(r.status.as_str()),
        tags,
        time(Some(r.created_at)),
        time(r.finished_at),
        clip(r.error.as_deref().unwrap_or(""), 120),
    )
}

/// Tags as links to the runs that carry each.
pub fn tag_links(tags: &serde_json::Map<String, serde_json::Value>) -> Html {
    let links = tags.iter().map(|(k, v)| {
        let v = v.as_str().unwrap_or_default();
        html!("<a class=\"tag\" href=\"/ui/runs?tag={}\">{}={}</a>", url_enc(&format!("{k}={v}")), k, clip(v, 40))
    });
    Html::join(links, " ")
}

/// The filters, as the query has them.
fn filter_form(q: &Params) -> Html {
    let field = |k: &str| q.get(k).map(String::as_str).unwrap_or("");
    let statuses = std::iter::once(("", "any status")).chain(RunStatus::ALL.iter().map(|s| (s.as_str(), s.as_str())));
    html!(
        "<form class=\"filters\" method=\"get\" action=\"/ui/runs\">\
         <label>Workflow <input name=\"workflow\" value=\"{}\"></label>\
         <label>Status <select name=\"status\">{}</select></label>\
         <label>Tags <input name=\"tag\" value=\"{}\" placeholder=\"customer=42, region=eu\"></label>\
         <label>From (UTC) <input type=\"datetime-local\" name=\"since\" value=\"{}\"></label>\
         <label>To (UTC) <input type=\"datetime-local\" name=\"until\" value=\"{}\"></label>\
         <button type=\"submit\">Filter</button> <a href=\"/ui/runs\">Clear</a></form>",
        field("workflow"),
        options(statuses, q.get("status").map(String::as_str)),
        field("tag"),
        field("since"),
        field("until"),
    )
}

/// The act form: an action, its steps (rerun) and reason, on the chosen
/// runs or, when the list is filtered, on every run that matches.
fn act_form(q: &Params, filter: &ListFilter) -> Html {
    let carried: Html =
        FILTERS.iter().map(|k| hidden(&format!("f_{k}"), q.get(*k).map(String::as_str).unwrap_or(""))).collect();
    let every = match filter.is_empty() {
        true => Html::raw("<span class=\"hint\">Filter the list to act on every run that matches.</span>"),
        false => Html::raw(
            "<button type=\"submit\" name=\"scope\" value=\"filter\" class=\"bulk\">\
             Apply to every run that matches (a bulk job)</button>\
             <button type=\"submit\" name=\"scope\" value=\"count\">How many match?</button>",
        ),
    };
    html!(
        "<form id=\"act\" class=\"act\" method=\"post\" action=\"/ui/runs/act\">{}\
         <label>Action <select name=\"action\">{}</select></label>\
         <label>From steps (rerun) <input name=\"from\" placeholder=\"charge, ship\"></label>\
         <label>Reason <input name=\"reason\" maxlength=\"1024\"></label>\
         <button type=\"submit\" name=\"scope\" value=\"selected\">Apply to the checked runs</button>{}</form>",
        carried,
        options(LIST_ACTIONS.iter().map(|a| (*a, *a)), None),
        every
    )
}

/// What the act form did to the chosen runs, from numbers and a known
/// action in the query (nothing else of a link reaches the page).
fn acted_notice(q: &Params) -> Option<Html> {
    let n = |k: &str| q.get(k).and_then(|v| v.parse::<u64>().ok());
    let action = *LIST_ACTIONS.iter().find(|x| Some(**x) == q.get("action").map(String::as_str))?;
    match (n("acted"), n("refused"), n("matched")) {
        (Some(acted), Some(refused), _) => Some(html!(
            "<p class=\"notice\">{}: {} run(s) acted on, {} refused by their status</p>",
            action,
            acted,
            refused
        )),
        (_, _, Some(m)) => Some(html!("<p class=\"notice\">{}: {} run(s) match the filter now</p>", action, m)),
        _ => None,
    }
}

/// What the act form asks: the action, its steps and reason.
struct Act {
    action: &'static str,
    from: Vec<String>,
    reason: Option<String>,
}

impl Act {
    fn read(form: &Fields) -> Result<Act, UiError> {
        let action = LIST_ACTIONS
            .iter()
            .find(|a| **a == form.one("action"))
            .ok_or_else(|| bad("action: not one the list offers"))?;
        let reason = extract::reason(form.one("reason"))?;
        let from: Vec<String> =
            form.one("from").split(',').map(str::trim).filter(|n| !n.is_empty()).map(String::from).collect();
        if *action == "rerun" && (from.is_empty() || from.len() > 100) {
            return Err(bad("from: a rerun names 1 to 100 steps (charge, ship)"));
        }
        Ok(Act { action, from, reason })
    }
}

/// The act form's answer: back to the list saying what was done, or to
/// the bulk job it started.
pub async fn runs_act(State(c): State<RunControl>, State(wakes): State<Arc<Wakes>>, body: axum::body::Bytes) -> Page {
    let form = Fields::parse(&body)?;
    let act = Act::read(&form)?;
    let back = match form.one("scope") {
        "selected" => {
            let chosen: Vec<Uuid> = form.all("run").map(extract::run_id).collect::<Result<_, _>>()?;
            if chosen.is_empty() || chosen.len() > MAX_CHOSEN {
                return Err(bad(format!("choose 1 to {MAX_CHOSEN} runs")));
            }
            let (acted, refused) = act_on_chosen(&c, &act, chosen).await?;
            format!("/ui/runs?action={}&acted={acted}&refused={refused}", act.action)
        }
        scope @ ("filter" | "count") => {
            let carried: Params = FILTERS.iter().map(|k| (k.to_string(), form.one(&format!("f_{k}")).into())).collect();
            act_on_filter(&c, &wakes, act, &ListFilter::read(&carried)?, scope == "count").await?
        }
        _ => return Err(bad("scope: the chosen runs, or every run that matches")),
    };
    Ok(Redirect::to(&back).into_response())
}

/// The action on each chosen run, now: how many it acted on and how many
/// their status refused.
async fn act_on_chosen(c: &RunControl, act: &Act, chosen: Vec<Uuid>) -> Result<(u64, u64), UiError> {
    let control = Control { actor: super::session::actor(), reason: act.reason.clone() };
    let (mut acted, mut refused) = (0, 0);
    let client = composer_store::client(&c.pool).await?;
    for run in chosen {
        let Some(event) = crate::bulk::event(&client, act.action, &act.from, run).await? else {
            refused += 1;
            continue;
        };
        match c.engine.handle(EventRequest::new(run, event).by(By::Operator(control.clone()))).await {
            Ok(h) if h.ignored.is_none() => acted += 1,
            Ok(_) | Err(crate::engine::EngineError::RunNotFound(_)) => refused += 1,
            Err(e) => return Err(e.into()),
        }
    }
    Ok((acted, refused))
}

/// A bulk job over every run `filter` matches (or, for `count`, how many
/// do): where to go next.
async fn act_on_filter(
    c: &RunControl,
    wakes: &Wakes,
    act: Act,
    filter: &ListFilter,
    count: bool,
) -> Result<String, UiError> {
    if filter.is_empty() {
        return Err(bad("a bulk job needs a filter: a workflow, a status, tags or a time range"));
    }
    let req = composer_api::BulkRequest {
        filter: filter.bulk(),
        action: serde_json::from_value(serde_json::Value::String(act.action.to_string()))
            .map_err(|e| bad(e.to_string()))?,
        from: (act.action == "rerun").then_some(act.from),
        reason: act.reason,
        dry_run: count,
    };
    Ok(match crate::http::bulk::start(&c.pool, wakes, &super::session::actor(), req).await? {
        crate::http::bulk::Started::DryRun(matched) => format!("/ui/runs?action={}&matched={matched}", act.action),
        crate::http::bulk::Started::Job(job) => format!("/ui/bulk/{}", job.id),
    })
}
