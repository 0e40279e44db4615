//! Building HTML one way. [`Html`] is markup known to be safe; it is made
//! only by the [`html!`] template, which escapes every value put in it
//! (text, a number, or more `Html` as it is), by [`Html::raw`] of a
//! literal, and by the helpers here for the shapes pages repeat: tables,
//! links, badges, forms, notices, JSON, and the page's frame. A page cannot
//! forget to escape: a `&str` or `String` goes in as text.

use std::fmt;

use chrono::{DateTime, Utc};
use uuid::Uuid;

/// Markup known to be safe: written in our source, or data escaped into it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Html(String);

impl Html {
    pub fn new() -> Html {
        Html(String::new())
    }

    /// Markup written in our source: a literal, never data.
    pub fn raw(markup: &'static str) -> Html {
        Html(markup.to_string())
    }

    /// What [`html!`] made; nothing else calls this.
    #[doc(hidden)]
    pub fn from_template(markup: String) -> Html {
        Html(markup)
    }

    pub fn push(&mut self, more: Html) {
        self.0.push_str(&more.0);
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    #[cfg(test)]
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// `parts` one after the other, `between` each two.
    pub fn join(parts: impl IntoIterator<Item = Html>, between: &'static str) -> Html {
        let mut out = Html::new();
        for (i, part) in parts.into_iter().enumerate() {
            if i > 0 {
                out.0.push_str(between);
            }
            out.push(part);
        }
        out
    }
}

impl FromIterator<Html> for Html {
    fn from_iter<I: IntoIterator<Item = Html>>(parts: I) -> Html {
        let mut out = Html::new();
        out.extend(parts);
        out
    }
}

impl Extend<Html> for Html {
    fn extend<I: IntoIterator<Item = Html>>(&mut self, parts: I) {
        for part in parts {
            self.push(part);
        }
    }
}

impl axum::response::IntoResponse for Html {
    fn into_response(self) -> axum::response::Response {
        axum::response::Html(self.0).into_response()
    }
}

/// A value a template may hold, and how it goes into HTML: text escaped,
/// numbers and ids as they are (they hold no markup), `Html` unchanged,
/// `None` as nothing.
pub trait Render {
    fn render(&self, out: &mut fmt::Formatter<'_>) -> fmt::Result;
}

impl Render for str {
    fn render(&self, out: &mut fmt::Formatter<'_>) -> fmt::Result {
        out.write_str(&esc(self))
    }
}

impl Render for String {
    fn render(&self, out: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.as_str().render(out)
    }
}

impl Render for Html {
    fn render(&self, out: &mut fmt::Formatter<'_>) -> fmt::Result {
        out.write_str(&self.0)
    }
}

impl<T: Render + ?Sized> Render for &T {
    fn render(&self, out: &mut fmt::Formatter<'_>) -> fmt::Result {
        (**self).render(out)
    }
}

impl<T: Render> Render for Option<T> {
    fn render(&self, out: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Some(v) => v.render(out),
            None => Ok(()),
        }
    }
}

/// Types whose `Display` is digits, signs, dots and hex: no markup.
macro_rules! shown_as_displayed {
    ($($t:ty),*) => {$(
        impl Render for $t {
            fn render(&self, out: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt::Display::fmt(self, out)
            }
        }
    )*};
}

shown_as_displayed!(u8, u32, u64, usize, i32, i64, f64, Uuid);

/// A template's value, written by its [`Render`] (with the template's
/// precision, as in `{:.1}`).
#[doc(hidden)]
pub struct Arg<'a, T: ?Sized>(pub &'a T);

impl<T: Render + ?Sized> fmt::Display for Arg<'_, T> {
    fn fmt(&self, out: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.render(out)
    }
}

/// `html!("<a href=\"/ui/runs/{}\">{}</a>", id, name)`: a template of
/// literal markup whose `{}` are filled with escaped values (see
/// [`Render`]). Values are given as arguments only: a template naming a
/// variable (`{name}`) does not compile, so none goes in unescaped.
macro_rules! html {
    ($template:literal $(, $value:expr)* $(,)?) => {
        $crate::ui::html::Html::from_template(format!(concat!($template) $(, $crate::ui::html::Arg(&$value))*))
    };
}
pub(crate) use html;

/// Text for HTML: element content and double-quoted attribute values alike.
fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            // A control that reorders text (U+202E shows "gpj.exe" as
            // "exe.jpg") is shown by its name, never obeyed.
            c if is_bidi_control(c) => out.push_str(&format!("[U+{:04X}]", c as u32)),
            c => out.push(c),
        }
    }
    out
}

/// Characters that change the direction of the text around them: the
/// embeddings, overrides and isolates, and the invisible direction marks.
fn is_bidi_control(c: char) -> bool {
    matches!(c, '\u{061C}' | '\u{200E}' | '\u{200F}' | '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}')
}

/// At most `max` characters of `s`, with `…` when cut.
pub fn clip(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        return s.to_string();
    }
    let mut out: String = s.chars().take(max.saturating_sub(1)).collect();
    out.push('…');
    out
}

/// A query value or a path segment.
pub use composer_api::rest::encode as url_enc;

/// A moment as the pages show it (UTC); nothing for none.
pub fn time(t: Option<DateTime<Utc>>) -> String {
    t.map(|t| t.format("%Y-%m-%d %H:%M:%S%.3f").to_string()).unwrap_or_default()
}

/// Most bytes of JSON a page shows for one value.
const MAX_SHOWN: usize = 64 * 1024;

/// A JSON value, pretty, collapsed under `label`.
pub fn json_details(label: &str, v: &serde_json::Value) -> Html {
    if v.is_null() {
        return Html::new();
    }
    let mut shown = serde_json::to_string_pretty(v).unwrap_or_default();
    let mut note = "";
    if shown.len() > MAX_SHOWN {
        let mut cut = MAX_SHOWN;
        while !shown.is_char_boundary(cut) {
            cut -= 1;
        }
        shown.truncate(cut);
        note = "\n… (cut: read the whole value from the API)";
    }
    html!("<details><summary>{}</summary><pre>{}{}</pre></details>", label, shown, note)
}

/// The class that colours a task state or run status.
pub fn state_class(state: &str) -> &'static str {
    match state {
        "COMPLETED" | "SUCCEEDED" => "ok",
        "FAILED" => "failed",
        "RUNNING" | "PENDING" => "running",
        "WAITING" | "PAUSED" | "QUEUED" => "waiting",
        "IN_DOUBT" => "doubt",
        "SKIPPED" | "CANCELLED" => "off",
        _ => "none",
    }
}

/// A state or status in its colour.
pub fn badge(state: &str) -> Html {
    html!("<span class=\"badge {}\">{}</span>", state_class(state), state)
}

/// A run id as its last 12 characters, the whole in its title.
pub fn short(id: &Uuid) -> Html {
    let s = id.to_string();
    html!("<code title=\"{}\">{}</code>", s, &s[s.len() - 12..])
}

/// A link to a run's page, by its short id.
pub fn run_link(id: &Uuid) -> Html {
    html!("<a href=\"/ui/runs/{}\">{}</a>", id, short(id))
}

/// A link to a workflow's page, by its name.
pub fn workflow_link(name: &str) -> Html {
    html!("<a href=\"/ui/workflows/{}\">{}</a>", url_enc(name), name)
}

/// What a form did, said above the page.
pub fn notice(said: &str) -> Html {
    html!("<p class=\"notice\">{}</p>", said)
}

/// How far a job (a bulk job, a replay) got, as its page shows it.
pub struct Progress<'a> {
    pub status: &'a str,
    /// What it looks at (`runs`, `events`).
    pub what: &'static str,
    pub looked_at: i64,
    pub matched: i64,
    /// What it did with them, after the count.
    pub counts: Html,
    pub last_error: Option<&'a str>,
    /// Where the stop button posts, and what it says.
    pub stop: (String, &'static str),
}

/// A job's status and counts over a progress bar, its last error, and
/// while it runs a button to stop it.
pub fn progress(p: Progress<'_>) -> Html {
    let pct = match p.matched > 0 {
        true => (p.looked_at as f64 / p.matched as f64 * 100.0).min(100.0),
        false => 100.0,
    };
    let mut live = html!(
        "<p class=\"status\">{} · {} of {} {} looked at ({:.0}%) · {}</p><progress max=\"100\" value=\"{:.0}\"></progress>",
        badge(p.status),
        p.looked_at,
        p.matched,
        p.what,
        pct,
        p.counts,
        pct
    );
    if let Some(e) = p.last_error {
        live.push(html!("<p class=\"error\">last error: {}</p>", e));
    }
    if p.status == "RUNNING" {
        let stop = html!("<button type=\"submit\" class=\"cancel\">{}</button>", p.stop.1);
        live.push(post_form(&p.stop.0, "", stop));
    }
    live
}

/// A form that posts `fields` to `action`; `class` may be empty. Our
/// forms carry no token: the session cookie is SameSite=Strict and every
/// POST from another site is refused by its origin (`guard`).
pub fn post_form(action: &str, class: &'static str, fields: Html) -> Html {
    match class {
        "" => html!("<form method=\"post\" action=\"{}\">{}</form>", action, fields),
        class => html!("<form method=\"post\" action=\"{}\" class=\"{}\">{}</form>", action, class, fields),
    }
}

/// A field a form sends unseen.
pub fn hidden(name: &str, value: &str) -> Html {
    html!("<input type=\"hidden\" name=\"{}\" value=\"{}\">", name, value)
}

/// The `<option>`s of a select, `(value, label)`, the one whose value is
/// `chosen` selected.
pub fn options<'a>(choices: impl IntoIterator<Item = (&'a str, &'a str)>, chosen: Option<&str>) -> Html {
    choices
        .into_iter()
        .map(|(value, label)| match chosen == Some(value) {
            true => html!("<option value=\"{}\" selected>{}</option>", value, label),
            false => html!("<option value=\"{}\">{}</option>", value, label),
        })
        .collect()
}

/// A table: its class (or none), its header cells, and the row it shows
/// when it has none.
pub struct Table {
    class: &'static str,
    head: &'static [&'static str],
    none: Option<&'static str>,
    live: Option<String>,
}

impl Table {
    pub fn new(class: &'static str, head: &'static [&'static str]) -> Table {
        Table { class, head, none: None, live: None }
    }

    /// What the table says in a row of its own when it has no rows.
    pub fn or_none(self, none: &'static str) -> Table {
        Table { none: Some(none), ..self }
    }

    /// The URL its body refreshes from while the page is open (`app.js`).
    pub fn live(self, src: String) -> Table {
        Table { live: Some(src), ..self }
    }

    /// The rows, or the row saying there are none.
    pub fn body(&self, rows: Html) -> Html {
        match (rows.is_empty(), self.none) {
            (true, Some(none)) => html!("<tr><td colspan=\"{}\" class=\"empty\">{}</td></tr>", self.head.len(), none),
            _ => rows,
        }
    }

    /// The whole table around `rows`.
    pub fn with(&self, rows: Html) -> Html {
        let class = match self.class {
            "" => Html::new(),
            class => html!(" class=\"{}\"", class),
        };
        let head: Html = self.head.iter().map(|h| html!("<th>{}</th>", *h)).collect();
        let live = self.live.as_ref().map(|src| html!(" data-live=\"{}\"", src));
        html!("<table{}><thead><tr>{}</tr></thead><tbody{}>{}</tbody></table>", class, head, live, self.body(rows))
    }
}

/// `body` with each of its forms bound to namespace `ns`: a form that posts
/// names it in its action (and each button's `formaction`), a form that
/// gets carries it as a hidden field. So a form acts in the namespace of
/// the page it was on, even when another tab has since chosen another
/// (the door reads the `namespace` parameter before the cookie). The
/// cluster's forms (login, log out, the namespaces page) are left alone.
fn bound_to(body: Html, ns: &str) -> Html {
    let text = body.0;
    let param = format!("namespace={ns}");
    let mut out = String::with_capacity(text.len() + 64);
    let mut rest = text.as_str();
    while let Some(at) = rest.find('<') {
        out.push_str(&rest[..at]);
        rest = &rest[at..];
        let end = rest.find('>').map_or(rest.len(), |e| e + 1);
        let tag = &rest[..end];
        rest = &rest[end..];
        if tag.starts_with("<form") && tag.contains("method=\"get\"") {
            out.push_str(tag);
            out.push_str(&format!("<input type=\"hidden\" name=\"namespace\" value=\"{ns}\">"));
            continue;
        }
        let mut tag = tag.to_string();
        if tag.starts_with("<form") || tag.starts_with("<button") {
            for attr in [" action=\"/ui/", " formaction=\"/ui/"] {
                let Some(start) = tag.find(attr) else { continue };
                let value = start + attr.len() - "/ui/".len();
                let close = tag[value..].find('"').map_or(tag.len(), |c| value + c);
                let target = &tag[value..close];
                let cluster = ["/ui/namespaces", "/ui/login", "/ui/logout"].iter().any(|c| target.starts_with(c));
                if !cluster {
                    let joined = if target.contains('?') { format!("&amp;{param}") } else { format!("?{param}") };
                    tag.insert_str(close, &joined);
                }
            }
        }
        out.push_str(&tag);
    }
    out.push_str(rest);
    Html(out)
}

/// A whole page: the frame, the navigation (with Log out in a session:
/// with no API token there is no login, so nothing to log out of) and
/// `body`, its forms bound to the page's namespace ([`bound_to`]).
pub fn page(title: &str, body: Html) -> Html {
    let body = match super::session::namespace() {
        Some(ns) => bound_to(body, &ns),
        None => body,
    };
    let logout = super::session::is_in_session().then(|| {
        Html::raw(
            "<form method=\"post\" action=\"/ui/logout\">\
             <button type=\"submit\" class=\"logout\">Log out</button></form>",
        )
    });
    // A namespace's pages name it; the cluster's (namespaces, login) do not.
    let namespace = super::session::namespace()
        .map(|ns| html!("<a class=\"namespace\" href=\"/ui/namespaces\" title=\"the namespace shown\">{}</a>", &*ns));
    html!(
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <title>{} · Composer</title><link rel=\"stylesheet\" href=\"/ui/static/app.css\">\
         <script src=\"/ui/static/app.js\" defer></script></head><body>\
         <header><a class=\"brand\" href=\"/ui/runs\">Composer</a>{}\
         <nav><a href=\"/ui/overview\">Overview</a><a href=\"/ui/runs\">Runs</a><a href=\"/ui/workflows\">Workflows</a>\
         <a href=\"/ui/schedules\">Schedules</a><a href=\"/ui/events\">Events</a><a href=\"/ui/approvals\">Approvals</a><a href=\"/ui/limits\">Limits</a><a href=\"/ui/audit\">Audit</a>\
         <a href=\"/ui/queues\">Queues</a><a href=\"/ui/namespaces\">Namespaces</a></nav>{}</header><main>{}</main></body></html>",
        title,
        namespace,
        logout,
        body
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_page_s_forms_act_in_its_namespace() {
        let body = Html(
            "<form class=\"filters\" method=\"get\" action=\"/ui/runs\"><input name=\"q\"></form>\
             <form id=\"act\" method=\"post\" action=\"/ui/runs/act\"><button type=\"submit\">Go</button></form>\
             <form method=\"post\" action=\"/ui/limits?x=1\"></form>\
             <form class=\"actions\" method=\"post\"><button formaction=\"/ui/runs/1/retry\" class=\"retry\">R</button></form>\
             <form method=\"post\" action=\"/ui/logout\"></form><p>a > b</p>"
                .to_string(),
        );
        let bound = bound_to(body, "billing").0;
        assert_eq!(
            bound,
            "<form class=\"filters\" method=\"get\" action=\"/ui/runs\"><input type=\"hidden\" name=\"namespace\" \
             value=\"billing\"><input name=\"q\"></form>\
             <form id=\"act\" method=\"post\" action=\"/ui/runs/act?namespace=billing\"><button type=\"submit\">Go</button></form>\
             <form method=\"post\" action=\"/ui/limits?x=1&amp;namespace=billing\"></form>\
             <form class=\"actions\" method=\"post\"><button formaction=\"/ui/runs/1/retry?namespace=billing\" class=\"retry\">R</button></form>\
             <form method=\"post\" action=\"/ui/logout\"></form><p>a > b</p>"
        );
    }

    /// `Html::from_template` is public only so that `html!` can call it from
    /// the page files: no other code of the crate may, or it could make
    /// markup of unescaped data.
    #[test]
    fn only_the_template_makes_html_from_a_string() {
        let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut stack = vec![src];
        let mut callers = Vec::new();
        while let Some(dir) = stack.pop() {
            for entry in std::fs::read_dir(&dir).unwrap() {
                let path = entry.unwrap().path();
                if path.is_dir() {
                    stack.push(path);
                } else if path.extension().is_some_and(|e| e == "rs")
                    && !path.ends_with("ui/html.rs")
                    && std::fs::read_to_string(&path).unwrap().contains("from_template")
                {
                    callers.push(path.display().to_string());
                }
            }
        }
        assert!(callers.is_empty(), "Html::from_template called outside html!: {callers:?}");
    }

    #[test]
    fn data_cannot_open_a_tag_or_leave_an_attribute() {
        assert_eq!(esc("<script>alert('x')</script>"), "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;");
        assert_eq!(esc("\" onmouseover=\"x"), "&quot; onmouseover=&quot;x");
        assert_eq!(url_enc("a b&c=d/é"), "a%20b%26c%3Dd%2F%C3%A9");
        let shown = json_details("in", &serde_json::json!({"k": "</pre><script>"}));
        assert!(!shown.as_str().contains("<script>") && shown.as_str().contains("&lt;/pre&gt;"), "{shown:?}");
    }

    #[test]
    fn a_template_escapes_text_keeps_markup_and_formats_numbers() {
        let name = String::from("<b>\u{202E}");
        let made = html!("<p title=\"{}\">{} {:.1} {}{}</p>", "a\"b", name, 2.25f64, badge("FAILED"), None::<Html>);
        assert_eq!(
            made.as_str(),
            "<p title=\"a&quot;b\">&lt;b&gt;[U+202E] 2.2 <span class=\"badge failed\">FAILED</span></p>"
        );
        assert_eq!(Html::join([html!("{}", "a&"), Html::raw("<br>")], ", ").as_str(), "a&amp;, <br>");
    }

    #[test]
    fn a_table_says_when_it_has_no_rows() {
        let t = Table::new("runs", &["Run", "<Status>"]).or_none("No runs.");
        assert_eq!(
            t.with(Html::new()).as_str(),
            "<table class=\"runs\"><thead><tr><th>Run</th><th>&lt;Status&gt;</th></tr></thead>\
             <tbody><tr><td colspan=\"2\" class=\"empty\">No runs.</td></tr></tbody></table>"
        );
        let live = Table::new("", &["A"]).live("/ui/x?a=1&b=2".into()).with(Html::raw("<tr></tr>"));
        assert_eq!(
            live.as_str(),
            "<table><thead><tr><th>A</th></tr></thead><tbody data-live=\"/ui/x?a=1&amp;b=2\"><tr></tr></tbody></table>"
        );
    }

    #[test]
    fn a_huge_value_is_cut_on_a_character_boundary() {
        let v = serde_json::Value::String("é".repeat(100_000));
        let shown = json_details("out", &v);
        assert!(shown.as_str().len() < 80 * 1024 && shown.as_str().contains("cut"), "{}", shown.as_str().len());
    }
}
