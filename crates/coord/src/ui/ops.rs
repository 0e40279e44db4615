//! What the overview and queues pages show, rendered from what the caller
//! read: no storage here, only HTML.

use std::fmt::Write as _;

use super::html::{badge, esc, url_enc};

/// Runs by status over a window.
pub struct StatusCounts {
    pub window: &'static str,
    pub counts: Vec<(String, i64)>,
}

/// p50, p95 and p99, in milliseconds.
pub type Percentiles = (f64, f64, f64);

/// A queue as the queues page shows it.
pub struct QueueRow {
    pub queue: String,
    pub pending: i64,
    pub running: i64,
    /// Seconds the oldest PENDING task has waited.
    pub lag_s: Option<f64>,
    /// The workers that read it: name, seconds since their last read, messages they hold.
    pub readers: Vec<(String, f64, u64)>,
}

/// The overview: runs by status, throughput, step latency, failures by
/// workflow, and queue backlogs.
pub fn overview(
    as_of: &str,
    windows: &[StatusCounts],
    per_minute: &[(String, i64)],
    latency_ms: &[(&str, Option<Percentiles>)],
    failures: &[(String, i64)],
    queues: &[QueueRow],
) -> String {
    let mut html = format!("<h1>Overview</h1><p class=\"hint\">{}</p><div class=\"cards\">", esc(as_of));
    for w in windows {
        let _ = write!(html, "<section class=\"card\"><h2>Runs, last {}</h2><table class=\"counts\"><tbody>", w.window);
        for (status, n) in &w.counts {
            let _ = write!(html, "<tr><td>{}</td><td class=\"n\">{n}</td></tr>", badge(status));
        }
        if w.counts.is_empty() {
            html.push_str("<tr><td class=\"empty\">none</td></tr>");
        }
        html.push_str("</tbody></table></section>");
    }
    for (label, latency) in latency_ms {
        let _ = write!(html, "<section class=\"card latency\"><h2>Steps, last hour: {}</h2>", esc(label));
        match latency {
            Some((p50, p95, p99)) => {
                let _ = write!(
                    html,
                    "<table class=\"counts\"><tbody><tr><td>p50</td><td class=\"n\">{p50:.1} ms</td></tr>\
                     <tr><td>p95</td><td class=\"n\">{p95:.1} ms</td></tr><tr><td>p99</td><td class=\"n\">{p99:.1} ms</td></tr>\
                     </tbody></table>"
                );
            }
            None => html.push_str("<p class=\"empty\">no step ended</p>"),
        }
        html.push_str("</section>");
    }
    html.push_str("</div>");
    html.push_str("<h2>Runs ended per minute, last hour</h2>");
    html.push_str(&bars(per_minute));
    html.push_str("<h2>Failures by workflow, last day</h2><table class=\"runs\"><thead><tr><th>Workflow</th><th>Failed runs</th></tr></thead><tbody>");
    for (wf, n) in failures {
        let _ = write!(
            html,
            "<tr><td><a href=\"/ui/runs?workflow={}&amp;status=FAILED\">{}</a></td><td class=\"n\">{n}</td></tr>",
            url_enc(wf),
            esc(wf)
        );
    }
    if failures.is_empty() {
        html.push_str("<tr><td colspan=\"2\" class=\"empty\">No run failed.</td></tr>");
    }
    html.push_str("</tbody></table><h2>Queue backlogs</h2>");
    html.push_str(&queue_table(queues));
    html
}

/// The queues page: each queue's backlog and lag, and who reads it.
pub fn queues(queues: &[QueueRow]) -> String {
    let mut html = String::from("<h1>Queues and workers</h1>");
    html.push_str(&queue_table(queues));
    html.push_str("<h2>Workers</h2><table class=\"runs workers\"><thead><tr><th>Worker</th><th>Queue</th><th>Last read</th><th>Holding</th></tr></thead><tbody>");
    let mut any = false;
    for q in queues {
        for (name, idle_s, pending) in &q.readers {
            any = true;
            let _ = write!(
                html,
                "<tr><td><code>{}</code></td><td>{}</td><td>{idle_s:.1} s ago</td><td class=\"n\">{pending}</td></tr>",
                esc(name),
                esc(&q.queue)
            );
        }
    }
    if !any {
        html.push_str("<tr><td colspan=\"4\" class=\"empty\">No worker has read these queues.</td></tr>");
    }
    html.push_str("</tbody></table>");
    html
}

fn queue_table(queues: &[QueueRow]) -> String {
    let mut html = String::from(
        "<table class=\"runs queues\"><thead><tr><th>Queue</th><th>Waiting</th><th>Running</th><th>Oldest waiting</th>\
         <th>Workers</th></tr></thead><tbody>",
    );
    for q in queues {
        let lag = q.lag_s.map(|s| format!("{s:.1} s")).unwrap_or_else(|| "—".into());
        let readers =
            match q.readers.iter().map(|r| r.1).fold(None, |m: Option<f64>, v| Some(m.map_or(v, |m| m.min(v)))) {
                None => "none".to_string(),
                Some(idle) => format!("{} (last read {idle:.1} s ago)", q.readers.len()),
            };
        let _ = write!(
            html,
            "<tr data-queue=\"{}\"><td>{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td><td>{lag}</td><td>{readers}</td></tr>",
            esc(&q.queue),
            esc(&q.queue),
            q.pending,
            q.running
        );
    }
    if queues.is_empty() {
        html.push_str("<tr><td colspan=\"5\" class=\"empty\">No queue has work.</td></tr>");
    }
    html.push_str("</tbody></table>");
    html
}

/// A bar chart of counts per minute, as SVG.
fn bars(points: &[(String, i64)]) -> String {
    if points.is_empty() {
        return "<p class=\"empty\">No run ended.</p>".into();
    }
    let max = points.iter().map(|p| p.1).max().unwrap_or(1).max(1) as f64;
    let (w, h, bw) = (720.0, 120.0, 720.0 / points.len() as f64);
    let mut out = format!(
        "<svg class=\"throughput\" xmlns=\"http://www.w3.org/2000/svg\" viewBox=\"0 0 {w} {}\" width=\"{w}\" height=\"{}\" \
         role=\"img\" aria-label=\"runs ended per minute\">",
        h + 16.0,
        h + 16.0
    );
    for (i, (minute, n)) in points.iter().enumerate() {
        let bh = (*n as f64 / max) * h;
        let _ = write!(
            out,
            "<rect x=\"{:.1}\" y=\"{:.1}\" width=\"{:.1}\" height=\"{bh:.1}\"><title>{}: {n}</title></rect>",
            i as f64 * bw,
            h - bh,
            (bw - 1.0).max(1.0),
            esc(minute)
        );
    }
    let _ = write!(out, "<text class=\"axis\" x=\"0\" y=\"{}\">max {max:.0}/min</text></svg>", h + 14.0);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_from_the_database_are_escaped_and_empty_parts_say_so() {
        let queue = QueueRow {
            queue: "<q>".into(),
            pending: 3,
            running: 1,
            lag_s: Some(2.5),
            readers: vec![("w\"1".into(), 0.4, 2)],
        };
        let html = overview("now", &[], &[], &[("running time", None)], &[("<wf>".into(), 2)], &[queue]);
        assert!(!html.contains("<q>") && !html.contains("<wf>") && html.contains("&lt;wf&gt;"), "{html}");
        assert!(html.contains("no step ended") && html.contains("No run ended"));
        assert!(html.contains("2.5 s") && html.contains("1 (last read 0.4 s ago)"));
        let page = queues(&[]);
        assert!(page.contains("No queue has work") && page.contains("No worker has read"));
    }

    #[test]
    fn bars_scale_to_the_busiest_minute() {
        let svg = bars(&[("10:00".into(), 5), ("10:01".into(), 10)]);
        assert_eq!(svg.matches("<rect").count(), 2);
        assert!(svg.contains("height=\"120.0\"") && svg.contains("height=\"60.0\"") && svg.contains("max 10/min"));
    }
}
