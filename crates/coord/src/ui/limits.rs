//! `/ui/limits`: limits on steps across runs — each key's values and use
//! now — and the forms that set or delete one, as `PUT /v1/limits/{key}`
//! and `DELETE` do.

use axum::extract::{Form, Query, State};
use axum::response::{IntoResponse, Redirect};
use composer_core::definition::check_path_segment;
use composer_core::definition::limit::{LimitValues, LimitValuesSpec, MAX_LIMIT_KEY};
use composer_store::limits::LimitRow;

use super::error::Page;
use super::extract::Params;
use super::html::{hidden, html, notice, page, post_form, time, url_enc, Html, Table};
use super::notices;
use composer_store::Pool;

/// Keys on one page.
const PAGE: i64 = 500;

pub async fn limits_page(State(pool): State<Pool>, Query(q): Query<Params>) -> Page {
    let after = q.get("after").filter(|a| !a.is_empty() && a.len() <= MAX_LIMIT_KEY);
    let client = composer_store::client(&pool).await?;
    let limits = composer_store::limits::list(&client, after.map(String::as_str), PAGE).await?;
    let said = q.get("msg").and_then(|m| notices::text(m)).map(notice);
    let table = Table::new(
        "limits",
        &["Key", "Rate", "Burst", "Tokens", "Concurrency", "In use", "Waiting", "Held until", "Set by", ""],
    )
    .or_none("No limits yet: a node's limits appear once a step waits for them.");
    let next = limits
        .last()
        .filter(|_| limits.len() as i64 == PAGE)
        .map(|last| html!("<p class=\"pager\"><a href=\"/ui/limits?after={}\">Next page</a></p>", url_enc(&last.key)));
    let body = html!(
        "<h1>Limits</h1>{}{}{}{}",
        said,
        table.with(limits.iter().map(limit_row).collect()),
        next,
        Html::raw(SET_FORM)
    );
    Ok(page("Limits", body).into_response())
}

fn limit_row(l: &LimitRow) -> Html {
    let v = crate::http::limits::view(l);
    let delete = post_form(
        "/ui/limits",
        "",
        html!("{}<button type=\"submit\" name=\"delete\" value=\"1\">Delete</button>", hidden("key", &v.key)),
    );
    html!(
        "<tr data-key=\"{}\"><td><code>{}</code></td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td>\
         <td>{}</td><td>{}</td><td>{}</td></tr>",
        v.key,
        v.key,
        v.rate,
        v.burst,
        v.tokens.map(|t| format!("{t:.1}")),
        v.concurrency,
        v.in_use,
        v.waiting,
        time(v.held_until),
        v.set_by,
        delete,
    )
}

const SET_FORM: &str = "<h2>Set a limit</h2><form class=\"set-limit\" method=\"post\" action=\"/ui/limits\">\
     <label>Key <input name=\"key\" required maxlength=\"256\" placeholder=\"stripe:acct_1\"></label>\
     <label>Rate <input name=\"rate\" placeholder=\"25/1s\"></label>\
     <label>Burst <input name=\"burst\" type=\"number\" min=\"1\"></label>\
     <label>Concurrency <input name=\"concurrency\" type=\"number\" min=\"1\"></label>\
     <button type=\"submit\">Save</button></form><p class=\"meta\">A limit set here wins over the definitions \
     that use its key until it is deleted. A part left empty is not limited.</p>";

/// The limits page's forms: set a key's values, or delete them.
pub async fn limit_action(State(pool): State<Pool>, Form(form): Form<Params>) -> Page {
    let invalid = || Ok(Redirect::to("/ui/limits?msg=limit-invalid").into_response());
    // As typed: a key may begin or end with a space.
    let key = form.get("key").map(String::as_str).unwrap_or_default();
    if key.is_empty() || key.len() > MAX_LIMIT_KEY || key.contains('\0') {
        return invalid();
    }
    let client = composer_store::client(&pool).await?;
    if form.contains_key("delete") {
        composer_store::limits::delete(&client, key).await?;
        return Ok(Redirect::to("/ui/limits?msg=limit-deleted").into_response());
    }
    let field = |name: &str| form.get(name).map(|v| v.trim()).filter(|v| !v.is_empty());
    let number = |name: &str| field(name).map(|v| v.parse::<u32>().map_err(|_| ())).transpose();
    let (Ok(burst), Ok(concurrency)) = (number("burst"), number("concurrency")) else { return invalid() };
    if check_path_segment(key).is_err() {
        return invalid();
    }
    let spec = LimitValuesSpec { rate: field("rate").map(str::to_string), burst, concurrency };
    let Ok(values) = LimitValues::parse("", &spec) else { return invalid() };
    composer_store::limits::set(&client, key, &values).await?;
    Ok(Redirect::to("/ui/limits?msg=limit-done").into_response())
}
