//! A run's timeline as SVG: a row per step, each of its attempts a bar from
//! when it was sent to when it ended (or now), coloured by how it ended; the
//! last attempt's wait for a worker lighter than its running. The axis is in
//! time from the run's start; each bar's title has its absolute times.

use std::fmt::Write as _;

use chrono::{DateTime, Utc};

use super::html::{clip, esc, state_class};

const ROW: usize = 22;
const LABEL: usize = 170;
const WIDTH: usize = 720;
const PAD: usize = 6;

/// One step: its attempts, oldest first.
pub struct Bar {
    pub node_id: String,
    pub attempts: Vec<Attempt>,
}

/// One attempt: when it was sent (or the step created), when a worker
/// started it (the last attempt's only: earlier ones are known from the
/// history, which records no lease), when it ended, and how.
pub struct Attempt {
    pub number: i32,
    pub from: DateTime<Utc>,
    pub started: Option<DateTime<Utc>>,
    pub to: Option<DateTime<Utc>>,
    /// A task state (`COMPLETED`, `FAILED`, `RUNNING`, …) or `RETRIED`.
    pub state: String,
}

/// The timeline of bars, from the run's creation to its end (or `now`).
pub fn svg(run_start: DateTime<Utc>, run_end: Option<DateTime<Utc>>, bars: &[Bar], now: DateTime<Utc>) -> String {
    if bars.is_empty() {
        return String::new();
    }
    let last = bars.iter().flat_map(|b| &b.attempts).filter_map(|a| a.to).max().unwrap_or(now);
    let end = run_end.unwrap_or(now).max(last);
    let span = ((end - run_start).num_milliseconds().max(1)) as f64;
    let x = |t: DateTime<Utc>| {
        LABEL as f64 + ((t - run_start).num_milliseconds().max(0) as f64 / span) * (WIDTH - LABEL - PAD) as f64
    };
    let height = PAD * 2 + (bars.len() + 1) * ROW;
    let mut out = String::new();
    let _ = write!(
        out,
        "<svg class=\"timeline\" xmlns=\"http://www.w3.org/2000/svg\" viewBox=\"0 0 {WIDTH} {height}\" width=\"{WIDTH}\" \
         height=\"{height}\" role=\"img\" aria-label=\"the run's timeline\">"
    );
    // The axis: the run's start, its end, and three ticks between.
    for k in 0..=4 {
        let t = run_start + chrono::Duration::milliseconds((span * k as f64 / 4.0) as i64);
        let _ = write!(
            out,
            "<line class=\"tick\" x1=\"{px:.1}\" y1=\"{PAD}\" x2=\"{px:.1}\" y2=\"{bottom}\"/>\
             <text class=\"axis\" x=\"{px:.1}\" y=\"{label}\" text-anchor=\"{anchor}\">{secs}</text>",
            px = x(t),
            bottom = height - ROW,
            label = height - PAD,
            anchor = match k {
                0 => "start",
                4 => "end",
                _ => "middle",
            },
            secs = duration(span * k as f64 / 4.0),
        );
    }
    for (i, b) in bars.iter().enumerate() {
        let y = PAD + i * ROW;
        let state = b.attempts.last().map(|a| a.state.as_str()).unwrap_or("");
        let tries = b.attempts.last().map(|a| a.number).unwrap_or(1);
        let label = if tries > 1 { format!("{} ×{tries}", b.node_id) } else { b.node_id.clone() };
        let _ = write!(
            out,
            "<g class=\"bar {}\" data-node=\"{}\"><text class=\"label\" x=\"{PAD}\" y=\"{}\">{}</text>",
            state_class(state),
            esc(&b.node_id),
            y + ROW - 8,
            esc(&clip(&label, 24)),
        );
        for a in &b.attempts {
            let to = a.to.unwrap_or(now);
            let (x0, x1) = (x(a.from), x(to).max(x(a.from) + 2.0));
            let ran = a.started.map(|s| x(s).clamp(x0, x1)).unwrap_or(x0);
            let title = format!(
                "{} attempt {} {}: sent {}{} → {} ({})",
                b.node_id,
                a.number,
                a.state,
                a.from.format("%H:%M:%S%.3f"),
                a.started.map(|s| format!(", started {}", s.format("%H:%M:%S%.3f"))).unwrap_or_default(),
                a.to.map(|t| t.format("%H:%M:%S%.3f").to_string()).unwrap_or_else(|| "now".into()),
                duration((to - a.from).num_milliseconds() as f64),
            );
            let _ = write!(
                out,
                "<g class=\"attempt {class}\" data-attempt=\"{n}\"><title>{title}</title>\
                 <rect class=\"wait\" x=\"{x0:.1}\" y=\"{ry}\" width=\"{ww:.1}\" height=\"{h}\"/>\
                 <rect class=\"span\" x=\"{ran:.1}\" y=\"{ry}\" width=\"{sw:.1}\" height=\"{h}\"/></g>",
                class = attempt_class(&a.state),
                n = a.number,
                title = esc(&title),
                ry = y + 4,
                ww = (ran - x0).max(0.0),
                sw = (x1 - ran).max(2.0),
                h = ROW - 8,
            );
        }
        out.push_str("</g>");
    }
    out.push_str("</svg>");
    out
}

fn attempt_class(state: &str) -> &'static str {
    match state {
        "RETRIED" => "retried",
        s => state_class(s),
    }
}

/// Milliseconds as people read them: `850 ms`, `12.4 s`, `3 min 5 s`.
fn duration(ms: f64) -> String {
    match ms {
        ms if ms < 1000.0 => format!("{ms:.0} ms"),
        ms if ms < 60_000.0 => format!("{:.1} s", ms / 1000.0),
        ms if ms < 3_600_000.0 => format!("{} min {} s", (ms / 60_000.0) as u64, ((ms % 60_000.0) / 1000.0) as u64),
        ms => format!("{} h {} min", (ms / 3_600_000.0) as u64, ((ms % 3_600_000.0) / 60_000.0) as u64),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_attempt_is_a_bar_in_its_state_and_names_are_escaped() {
        let t0 = Utc::now();
        let at = |ms| t0 + chrono::Duration::milliseconds(ms);
        let attempt = |number, from, started: Option<i64>, to: Option<DateTime<Utc>>, state: &str| Attempt {
            number,
            from: at(from),
            started: started.map(at),
            to,
            state: state.into(),
        };
        let bars = [
            Bar { node_id: "a".into(), attempts: vec![attempt(1, 0, Some(10), Some(at(500)), "COMPLETED")] },
            Bar {
                node_id: "<b>".into(),
                attempts: vec![
                    attempt(1, 500, None, Some(at(600)), "RETRIED"),
                    attempt(2, 700, None, Some(at(800)), "RETRIED"),
                    attempt(3, 850, Some(860), Some(at(900)), "FAILED"),
                ],
            },
            Bar { node_id: "c".into(), attempts: vec![attempt(1, 900, Some(950), None, "RUNNING")] },
        ];
        let svg = svg(t0, None, &bars, at(1000));
        assert_eq!(svg.matches("<g class=\"bar").count(), 3);
        assert_eq!(svg.matches("<g class=\"attempt").count(), 5, "every attempt drawn");
        assert_eq!(svg.matches("class=\"attempt retried\"").count(), 2);
        assert!(svg.contains("class=\"bar failed\"") && svg.contains("×3"));
        assert!(svg.contains("&lt;b&gt;") && !svg.contains("<b>"));
        assert!(svg.contains(">1.0 s</text>"), "the axis ends at the run's length: {svg}");
        assert_eq!(duration(3_725_000.0), "1 h 2 min");
    }
}
