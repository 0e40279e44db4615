//! `/ui/workflows/{name}/migrate`: moving a version's open runs to another
//! version. The page shows the dry run's verdict for each run (whether it
//! moves, why not, what would change) and the form that starts the job;
//! the job's progress is the bulk job's page.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::extract::{Path, Query, State};
use axum::response::{IntoResponse, Redirect};
use composer_api::{MigrateDryRun, MigrateRequest, RunVerdict};

use super::error::{bad, Page, UiError};
use super::extract::{self, Fields, Params};
use super::html::{badge, hidden, html, page, post_form, run_link, url_enc, workflow_link, Html, Table};
use crate::http::migrate::{migrate, Moved};
use crate::shared::{RunControl, Wakes};

/// The versions and mapping a page or its form names.
struct Asked {
    from: i32,
    to: i32,
    map: BTreeMap<String, String>,
    /// The mapping as typed (`old=new, …`).
    typed: String,
}

impl Asked {
    /// `None` until both versions are given.
    fn read(from: &str, to: &str, map: &str) -> Result<Option<Asked>, UiError> {
        if from.is_empty() || to.is_empty() {
            return Ok(None);
        }
        let version = |v: &str, what: &str| v.trim().parse::<i32>().map_err(|_| bad(format!("{what}: not a version")));
        let mut pairs = BTreeMap::new();
        for pair in map.split([',', '\n']).map(str::trim).filter(|p| !p.is_empty()) {
            let (old, new) = pair.split_once('=').ok_or_else(|| bad(format!("map: {pair:?} is not OLD=NEW")))?;
            pairs.insert(old.trim().to_string(), new.trim().to_string());
        }
        Ok(Some(Asked { from: version(from, "from")?, to: version(to, "to")?, map: pairs, typed: map.to_string() }))
    }

    fn request(&self, reason: Option<String>, dry_run: bool) -> MigrateRequest {
        MigrateRequest {
            from_version: self.from,
            to_version: self.to,
            filter: None,
            map: self.map.clone(),
            reason,
            dry_run,
        }
    }
}

pub async fn migrate_page(
    State(c): State<RunControl>,
    State(wakes): State<Arc<Wakes>>,
    Path(name): Path<String>,
    Query(q): Query<Params>,
) -> Page {
    composer_core::storable::check_text(&name, "workflow").map_err(bad)?;
    let asked = Asked::read(extract::text(&q, "from")?, extract::text(&q, "to")?, extract::text(&q, "map")?)?;
    let form = html!(
        "<form method=\"get\" class=\"migrate\">from v<input name=\"from\" size=\"4\" value=\"{}\"> to v\
         <input name=\"to\" size=\"4\" value=\"{}\"> <input name=\"map\" placeholder=\"old=new, …\" value=\"{}\">\
         <button type=\"submit\">Dry run</button></form>",
        asked.as_ref().map(|a| a.from.to_string()).unwrap_or_default(),
        asked.as_ref().map(|a| a.to.to_string()).unwrap_or_default(),
        asked.as_ref().map(|a| a.typed.as_str()).unwrap_or_default()
    );
    let mut body = html!(
        "<h1>Move runs of {}</h1><p>Open runs of one version move to another when every step they reached \
         becomes a step of the same type whose predecessors have ended; nothing that ended runs again.</p>{}",
        workflow_link(&name),
        form
    );
    if let Some(asked) = asked {
        let Moved::DryRun(dry) =
            migrate(&c, &wakes, &super::session::actor(), &name, asked.request(None, true)).await?
        else {
            return Err(bad("a dry run started a job"));
        };
        body.push(verdicts(&name, &asked, &dry));
    }
    Ok(page(&format!("Move runs of {name}"), body).into_response())
}

/// The dry run: a summary, a row per run, and the form that moves them.
fn verdicts(name: &str, asked: &Asked, dry: &MigrateDryRun) -> Html {
    let rows: Html = dry.runs.iter().map(row).collect();
    let table = Table::new("verdicts", &["Run", "Status", "Verdict", "What would change"])
        .or_none("no open run of this version")
        .with(rows);
    let more = dry.truncated.then(|| Html::raw("<p>More runs match than are shown: the job looks at every one.</p>"));
    let mut out = html!(
        "<h2>v{} → v{}</h2><p class=\"summary\">{} can move · {} cannot</p>{}{}",
        asked.from,
        asked.to,
        dry.movable,
        dry.unmovable,
        table,
        more
    );
    if dry.movable > 0 {
        let fields = html!(
            "{}{}{}<input name=\"reason\" placeholder=\"why (for each run's history)\">\
             <button type=\"submit\">Move the runs that can move</button>",
            hidden("from", &asked.from.to_string()),
            hidden("to", &asked.to.to_string()),
            hidden("map", &asked.typed)
        );
        out.push(post_form(&format!("/ui/workflows/{}/migrate", url_enc(name)), "", fields));
    }
    out
}

fn row(v: &RunVerdict) -> Html {
    let verdict = match v.movable {
        true => Html::raw("<span class=\"moves\">moves</span>"),
        false => Html::raw("<span class=\"stays\">stays</span>"),
    };
    let mut changes: Vec<Html> = v.plan.reasons.iter().map(|r| html!("<li class=\"reason\">{}</li>", r)).collect();
    for s in v.plan.steps.iter().filter(|s| s.to.as_deref().is_some_and(|to| to != s.from)) {
        changes.push(html!("<li>{} becomes {}</li>", s.from, s.to.as_deref().unwrap_or_default()));
    }
    changes.extend(v.plan.added.iter().map(|a| html!("<li>{} is new: it runs when reached</li>", a)));
    changes.extend(v.plan.dropped.iter().map(|d| html!("<li>{} is gone: it will not run</li>", d)));
    html!(
        "<tr data-run=\"{}\"><td>{}</td><td>{}</td><td>{}</td><td><ul>{}</ul></td></tr>",
        v.run_id,
        run_link(&v.run_id),
        badge(v.status.as_str()),
        verdict,
        Html::join(changes, "")
    )
}

/// The form's answer: the job's page.
pub async fn migrate_action(
    State(c): State<RunControl>,
    State(wakes): State<Arc<Wakes>>,
    Path(name): Path<String>,
    body: axum::body::Bytes,
) -> Page {
    let form = Fields::parse(&body)?;
    let asked = Asked::read(form.one("from"), form.one("to"), form.one("map"))?
        .ok_or_else(|| bad("from and to: the versions to move runs between"))?;
    let reason = extract::reason(form.one("reason"))?;
    match migrate(&c, &wakes, &super::session::actor(), &name, asked.request(reason, false)).await? {
        Moved::Job(job) => Ok(Redirect::to(&format!("/ui/bulk/{}", job.id)).into_response()),
        Moved::DryRun(_) => Err(bad("a migration asked for a dry run")),
    }
}
