//! Building HTML by hand: every piece of data goes through [`esc`], and the
//! page's frame is [`page`].

use std::fmt::Write as _;

/// Text for HTML: element content and double-quoted attribute values alike.
pub fn esc(s: &str) -> String {
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

/// A query value.
pub fn url_enc(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// Most bytes of JSON a page shows for one value.
const MAX_SHOWN: usize = 64 * 1024;

/// A JSON value, pretty, collapsed under `label`.
pub fn json_details(label: &str, v: &serde_json::Value) -> String {
    if v.is_null() {
        return String::new();
    }
    let mut text = serde_json::to_string_pretty(v).unwrap_or_default();
    let mut note = "";
    if text.len() > MAX_SHOWN {
        let mut cut = MAX_SHOWN;
        while !text.is_char_boundary(cut) {
            cut -= 1;
        }
        text.truncate(cut);
        note = "\n… (cut: read the whole value from the API)";
    }
    format!("<details><summary>{}</summary><pre>{}{note}</pre></details>", esc(label), esc(&text))
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

pub fn badge(state: &str) -> String {
    format!("<span class=\"badge {}\">{}</span>", state_class(state), esc(state))
}

/// A whole page: the frame, the navigation and `body`.
pub fn page(title: &str, body: &str) -> String {
    let mut out = String::with_capacity(body.len() + 1024);
    let _ = write!(
        out,
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <title>{} · Composer</title><link rel=\"stylesheet\" href=\"/ui/static/app.css\">\
         <script src=\"/ui/static/app.js\" defer></script></head><body>\
         <header><a class=\"brand\" href=\"/ui/runs\">Composer</a>\
         <nav><a href=\"/ui/overview\">Overview</a><a href=\"/ui/runs\">Runs</a><a href=\"/ui/workflows\">Workflows</a>\
         <a href=\"/ui/schedules\">Schedules</a><a href=\"/ui/events\">Events</a><a href=\"/ui/limits\">Limits</a><a href=\"/ui/queues\">Queues</a></nav><form method=\"post\" action=\"/ui/logout\">\
         <button type=\"submit\" class=\"logout\">Log out</button></form></header><main>{body}</main></body></html>",
        esc(title)
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn data_cannot_open_a_tag_or_leave_an_attribute() {
        assert_eq!(esc("<script>alert('x')</script>"), "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;");
        assert_eq!(esc("\" onmouseover=\"x"), "&quot; onmouseover=&quot;x");
        assert_eq!(url_enc("a b&c=d/é"), "a%20b%26c%3Dd%2F%C3%A9");
        let shown = json_details("in", &serde_json::json!({"k": "</pre><script>"}));
        assert!(!shown.contains("<script>") && shown.contains("&lt;/pre&gt;"), "{shown}");
    }

    #[test]
    fn a_huge_value_is_cut_on_a_character_boundary() {
        let v = serde_json::Value::String("é".repeat(100_000));
        let shown = json_details("out", &v);
        assert!(shown.len() < 80 * 1024 && shown.contains("cut"), "{}", shown.len());
    }
}
