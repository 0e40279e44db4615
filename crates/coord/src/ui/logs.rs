//! `/ui/runs/{id}/logs?node=&attempt=&after=`: what a step's worker sent,
//! one attempt at a time (its current one unless `attempt` says), with its
//! control characters spelled out; and the link to it from a step's row.

use axum::extract::{Path, Query, State};
use axum::response::IntoResponse;
use composer_store::logs::LogLine;
use uuid::Uuid;

use super::error::{not_found, Page};
use super::extract::{self, Params};
use super::html::{html, page, url_enc, Html};
use composer_store::Pool;

/// Lines on one page.
const PAGE: i64 = 1000;

pub async fn logs_page(
    State(pool): State<Pool>,
    State(engine): State<std::sync::Arc<crate::engine::Engine>>,
    Path(id): Path<String>,
    Query(q): Query<Params>,
) -> Page {
    let run_id = extract::run_id(&id)?;
    let node = extract::text(&q, "node")?;
    let mut client = composer_store::client(&pool).await?;
    let task = composer_store::runs::task_of_node(&client, run_id, node).await?.ok_or_else(|| not_found("step"))?;
    let attempt: i32 = q.get("attempt").and_then(|a| a.parse().ok()).unwrap_or(task.attempt.max(1));
    let after: i32 = q.get("after").and_then(|a| a.parse().ok()).unwrap_or(0);
    let attempts = composer_store::logs::attempts(&client, task.id).await?;
    let lines = crate::step_logs::read(engine.payloads(), &mut client, task.id, attempt, after, PAGE).await?;
    let others: Html = attempts
        .iter()
        .map(|&(a, n)| match a == attempt {
            true => html!("<strong>attempt {}</strong> ({}) ", a, lines_count(n)),
            false => html!(
                "<a href=\"/ui/runs/{}/logs?node={}&attempt={}\">attempt {}</a> ({}) ",
                run_id,
                url_enc(node),
                a,
                a,
                lines_count(n)
            ),
        })
        .collect();
    let shown = match lines.is_empty() {
        true => html!("<p class=\"hint\">Attempt {} has no lines.</p>", attempt),
        false => html!("<ol class=\"log\">{}</ol>", lines.iter().map(line).collect::<Html>()),
    };
    let more = lines.last().filter(|_| lines.len() as i64 == PAGE).map(|last| {
        html!(
            "<a class=\"next\" href=\"/ui/runs/{}/logs?node={}&attempt={}&after={}\">More →</a>",
            run_id,
            url_enc(node),
            attempt,
            last.seq
        )
    });
    let body = html!(
        "<h1>Logs of <code>{}</code></h1><p><a href=\"/ui/runs/{}\">← run</a> · what its worker sent \
         (times are when the coordinator stored each line, UTC)</p><p class=\"attempts\">{}</p>{}{}",
        node,
        run_id,
        others,
        shown,
        more
    );
    Ok(page("Logs", body).into_response())
}

/// A line per item: one that holds a newline stays one entry, and control
/// characters (terminal escapes, bidi overrides) are shown as what they are
/// instead of acting on the page.
fn line(l: &LogLine) -> Html {
    html!(
        "<li><span class=\"at\" title=\"{}\">{}</span><span class=\"line\">{}</span></li>",
        l.worker_id,
        l.at.format("%H:%M:%S%.3f").to_string(),
        visible_controls(&l.line)
    )
}

/// The link to a step's log from its row, with how many lines it has.
pub fn link(run: Uuid, node: &str, lines: i64) -> Html {
    html!(
        "<div class=\"logs\"><a href=\"/ui/runs/{}/logs?node={}\">logs</a> ({})</div>",
        run,
        url_enc(node),
        lines_count(lines)
    )
}

/// "1 line", "2 lines".
fn lines_count(n: i64) -> String {
    if n == 1 {
        "1 line".to_string()
    } else {
        format!("{n} lines")
    }
}

/// A log line with its control characters spelled out (`\u{1b}`), but for
/// tabs and newlines, and the bidirectional overrides and isolates that
/// would reorder what follows them.
fn visible_controls(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    for c in line.chars() {
        let bidi = matches!(c, '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}' | '\u{200E}' | '\u{200F}');
        if (c.is_control() && c != '\n' && c != '\t') || bidi {
            out.push_str(&format!("\\u{{{:x}}}", c as u32));
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_log_lines_escapes_and_overrides_are_spelled_out_and_its_newlines_kept() {
        assert_eq!(visible_controls("a\u{1b}[31mred\u{202e}x\ty\nz"), "a\\u{1b}[31mred\\u{202e}x\ty\nz");
        assert_eq!((lines_count(1), lines_count(2)), ("1 line".to_string(), "2 lines".to_string()));
    }
}
