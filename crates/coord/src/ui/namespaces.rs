//! `/ui/namespaces`: the namespaces the caller may enter, each with what it
//! uses of its quotas, the form that chooses which one the other pages
//! show (a cookie the door reads, `http::door::UI_COOKIE`), and for a
//! cluster-wide administrator the forms that create and delete one, as
//! `POST /v1/namespaces` and `DELETE /v1/namespaces/{name}` do. The page is
//! the cluster's: served whichever namespace a browser is in.

use std::sync::Arc;

use axum::extract::{Form, Path, Query, State};
use axum::http::{header, HeaderMap};
use axum::response::{IntoResponse, Redirect};
use axum::Extension;
use composer_store::namespaces::{NamespaceRow, Usage, DEFAULT};
use composer_store::Pool;

use super::error::Page;
use super::extract::Params;
use super::guard::MayEnter;
use super::html::{hidden, html, notice, page, post_form, time, Html, Table};
use super::{notices, session};
use crate::access::Principal;
use crate::http::door::{ui_cookie, valid_name, Created, Namespaces, UI_COOKIE};
use crate::http::namespaces::MAX_NAMESPACE_DESCRIPTION;
use composer_api::Scope;

/// The columns of the namespaces' table.
const HEAD: [&str; 10] = [
    "Name",
    "Description",
    "State",
    "Open runs",
    "Starts per second",
    "Schedules",
    "Limits",
    "Stored bytes",
    "Created",
    "",
];

/// How long a browser keeps the namespace it chose: a year.
const CHOSEN_FOR_SECS: u64 = 365 * 24 * 3600;

pub async fn namespaces_page(
    State(pool): State<Pool>,
    State(config): State<Arc<crate::config::Config>>,
    Extension(namespaces): Extension<Arc<dyn Namespaces>>,
    Extension(may): Extension<MayEnter>,
    Extension(who): Extension<Principal>,
    headers: HeaderMap,
    Query(q): Query<Params>,
) -> Page {
    let client = composer_store::client(&pool).await?;
    let rows = composer_store::namespaces::list(&client, config.max_namespaces).await?;
    let here = ui_cookie(&headers).unwrap_or_else(|| DEFAULT.to_string());
    let admin = who.may(Scope::Admin);
    let mut body = Vec::new();
    for row in rows.iter().filter(|r| may.may_enter(&r.name)) {
        let usage = match row.state.as_str() {
            "active" => namespaces.usage(&row.name).await.ok().flatten(),
            _ => None,
        };
        body.push(namespace_row(row, usage, row.name == here, admin));
    }
    let table = Table::new("namespaces", &HEAD).or_none("You may enter no namespace.");
    let said = q.get("msg").and_then(|m| notices::text(m)).map(notice);
    let create = admin.then(|| Html::raw(CREATE_FORM));
    let body = html!(
        "<h1>Namespaces</h1>{}<p class=\"meta\">The other pages show the namespace chosen here: now <code>{}</code>. \
         Each cell of use reads <em>used / quota</em>.</p>{}{}",
        said,
        here,
        table.with(body.into_iter().collect()),
        create
    );
    Ok(page("Namespaces", body).into_response())
}

fn namespace_row(row: &NamespaceRow, usage: Option<Usage>, chosen: bool, admin: bool) -> Html {
    let q = row.quotas;
    let of = |used: Option<i64>, quota: Option<i64>| {
        let used = used.map_or_else(|| "–".to_string(), |u| u.to_string());
        match quota {
            Some(q) => format!("{used} / {q}"),
            None => used,
        }
    };
    let choose = match (chosen, row.state.as_str()) {
        (true, _) => html!("<strong>shown</strong>"),
        (false, "active") => post_form(
            "/ui/namespaces/switch",
            "",
            html!("{}<button type=\"submit\">Show</button>", hidden("namespace", &row.name)),
        ),
        _ => Html::new(),
    };
    let delete = (admin && row.name != DEFAULT && row.state == "active").then(|| {
        post_form(
            &format!("/ui/namespaces/{}/delete", row.name),
            "",
            Html::raw("<button type=\"submit\" >Delete with its data</button>"),
        )
    });
    html!(
        "<tr data-namespace=\"{}\"><td><code>{}</code></td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td>\
         <td>{}</td><td>{}</td><td>{} by {}</td><td>{}{}</td></tr>",
        row.name,
        row.name,
        row.description,
        row.state,
        of(usage.map(|u| u.open_runs), q.open_runs),
        q.starts_per_second.map_or_else(|| "–".to_string(), |s| s.to_string()),
        of(usage.map(|u| u.schedules), q.schedules),
        of(usage.map(|u| u.limits), q.limits),
        of(usage.map(|u| u.stored_bytes), q.stored_bytes),
        time(Some(row.created_at)),
        row.created_by,
        choose,
        delete,
    )
}

const CREATE_FORM: &str = "<h2>Create a namespace</h2><form method=\"post\" action=\"/ui/namespaces\">\
     <label>Name <input name=\"name\" required maxlength=\"63\" pattern=\"[a-z][a-z0-9-]*\" placeholder=\"billing\"></label>\
     <label>Description <input name=\"description\" maxlength=\"1000\"></label>\
     <button type=\"submit\">Create</button></form><p class=\"meta\">Its workflows, runs, schedules, limits, events \
     and audit log are its own; a key bound to it reaches nothing else. Quotas are set with \
     <code>composer namespace quotas</code>.</p>";

/// Chooses the namespace the other pages show: one the caller may enter
/// and that is served.
pub async fn switch(
    State(pool): State<Pool>,
    Extension(may): Extension<MayEnter>,
    headers: HeaderMap,
    Form(form): Form<Params>,
) -> Page {
    let name = form.get("namespace").map(String::as_str).unwrap_or_default();
    if !valid_name(name) || !may.may_enter(name) {
        return Ok(Redirect::to("/ui/namespaces?msg=namespace-refused").into_response());
    }
    let client = composer_store::client(&pool).await?;
    let row = composer_store::namespaces::get(&client, name).await?;
    if row.is_none_or(|r| r.state != "active") {
        return Ok(Redirect::to("/ui/namespaces?msg=namespace-refused").into_response());
    }
    let cookie = chosen(name, session::over_https(&headers));
    Ok(([(header::SET_COOKIE, cookie)], Redirect::to("/ui/runs")).into_response())
}

/// The `Set-Cookie` that makes namespace `name` the one a browser's pages show.
pub fn chosen(name: &str, secure: bool) -> String {
    let secure = if secure { "; Secure" } else { "" };
    format!("{UI_COOKIE}={name}; Path=/ui; HttpOnly; SameSite=Strict; Max-Age={CHOSEN_FOR_SECS}{secure}")
}

/// Where a person signing in with `grants` lands: the namespace the
/// browser shows if they may enter it (`None`: no change), else the first
/// their grants name.
pub fn landing(grants: &[String], headers: &HeaderMap) -> Option<String> {
    let shown = ui_cookie(headers).unwrap_or_else(|| DEFAULT.to_string());
    if Principal::person_may_enter(grants, &shown) {
        return None;
    }
    grants.iter().find_map(|g| g.split_once('@')).map(|(_, ns)| ns.to_string())
}

/// Creates a namespace (a cluster-wide administrator's form).
pub async fn create(
    Extension(namespaces): Extension<Arc<dyn Namespaces>>,
    Extension(who): Extension<Principal>,
    Form(form): Form<Params>,
) -> Page {
    let name = form.get("name").map(|n| n.trim()).unwrap_or_default();
    let description = form.get("description").map(|d| d.trim()).unwrap_or_default();
    if !valid_name(name) || description.chars().count() > MAX_NAMESPACE_DESCRIPTION || description.contains('\0') {
        return Ok(Redirect::to("/ui/namespaces?msg=namespace-invalid").into_response());
    }
    let msg = match namespaces.create(name, description, &who.name).await? {
        Created::New(_) | Created::Exists(_) => "namespace-created",
        Created::Deleting | Created::TooMany => "namespace-refused",
    };
    Ok(Redirect::to(&format!("/ui/namespaces?msg={msg}")).into_response())
}

/// Deletes a namespace with its data (a cluster-wide administrator's form).
pub async fn delete(Extension(namespaces): Extension<Arc<dyn Namespaces>>, Path(name): Path<String>) -> Page {
    if !valid_name(&name) || name == DEFAULT {
        return Ok(Redirect::to("/ui/namespaces?msg=namespace-refused").into_response());
    }
    let msg = match namespaces.delete(&name).await? {
        Some(_) => "namespace-deleted",
        None => "namespace-refused",
    };
    Ok(Redirect::to(&format!("/ui/namespaces?msg={msg}")).into_response())
}
