//! A run's timeline as SVG: one bar per step from when it was created to
//! when it ended (or now), coloured by its state, with its attempts; the
//! axis in seconds from the run's start, the times themselves in each bar's
//! title.

use std::fmt::Write as _;

use chrono::{DateTime, Utc};

use super::html::{clip, esc, state_class};

const ROW: usize = 22;
const LABEL: usize = 170;
const WIDTH: usize = 720;
const PAD: usize = 6;

/// One bar: a step, when it began and ended, its state and attempts.
pub struct Bar {
    pub node_id: String,
    pub state: String,
    pub attempt: i32,
    pub from: DateTime<Utc>,
    pub started: Option<DateTime<Utc>>,
    pub to: Option<DateTime<Utc>>,
}

/// The timeline of bars, from the run's creation to its end (or `now`).
pub fn svg(run_start: DateTime<Utc>, run_end: Option<DateTime<Utc>>, bars: &[Bar], now: DateTime<Utc>) -> String {
    if bars.is_empty() {
        return String::new();
    }
    let end = run_end.unwrap_or(now).max(bars.iter().filter_map(|b| b.to).max().unwrap_or(now));
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
    // The axis: the run's start, its middle and its end, in seconds.
    for k in 0..=4 {
        let t = run_start + chrono::Duration::milliseconds((span * k as f64 / 4.0) as i64);
        let _ = write!(
            out,
            "<line class=\"tick\" x1=\"{px:.1}\" y1=\"{PAD}\" x2=\"{px:.1}\" y2=\"{bottom}\"/>\
             <text class=\"axis\" x=\"{px:.1}\" y=\"{label}\" text-anchor=\"{anchor}\">{secs}</text>",
            anchor = match k {
                0 => "start",
                4 => "end",
                _ => "middle",
            },
            px = x(t),
            bottom = height - ROW,
            label = height - PAD,
            secs = seconds(span * k as f64 / 4.0),
        );
    }
    for (i, b) in bars.iter().enumerate() {
        let y = PAD + i * ROW;
        let to = b.to.unwrap_or(now);
        let (x0, x1) = (x(b.from), x(to).max(x(b.from) + 2.0));
        // The part before a worker started it: waiting to be dispatched, leased or retried.
        let waited = b.started.map(|s| x(s).clamp(x0, x1)).unwrap_or(x0);
        let attempts = if b.attempt > 1 { format!(" · {} attempts", b.attempt) } else { String::new() };
        let title = format!(
            "{} {}{attempts}: {} → {} ({})",
            b.node_id,
            b.state,
            b.from.format("%H:%M:%S%.3f"),
            b.to.map(|t| t.format("%H:%M:%S%.3f").to_string()).unwrap_or_else(|| "now".into()),
            seconds((to - b.from).num_milliseconds() as f64),
        );
        let _ = write!(
            out,
            "<g class=\"bar {class}\" data-node=\"{id}\"><title>{title}</title>\
             <text class=\"label\" x=\"{PAD}\" y=\"{ty}\">{label}</text>\
             <rect class=\"wait\" x=\"{x0:.1}\" y=\"{ry}\" width=\"{ww:.1}\" height=\"{h}\"/>\
             <rect class=\"span\" x=\"{waited:.1}\" y=\"{ry}\" width=\"{sw:.1}\" height=\"{h}\"/></g>",
            class = state_class(&b.state),
            id = esc(&b.node_id),
            title = esc(&title),
            ty = y + ROW - 8,
            label = esc(&clip(
                &format!("{}{}", b.node_id, if b.attempt > 1 { format!(" ×{}", b.attempt) } else { String::new() }),
                24
            )),
            ry = y + 4,
            ww = (waited - x0).max(0.0),
            sw = (x1 - waited).max(2.0),
            h = ROW - 8,
        );
    }
    out.push_str("</svg>");
    out
}

/// Milliseconds as people read them: `850 ms`, `12.4 s`, `3 min 5 s`.
fn seconds(ms: f64) -> String {
    match ms {
        ms if ms < 1000.0 => format!("{ms:.0} ms"),
        ms if ms < 60_000.0 => format!("{:.1} s", ms / 1000.0),
        ms => format!("{} min {} s", (ms / 60_000.0) as u64, ((ms % 60_000.0) / 1000.0) as u64),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_step_is_a_bar_in_its_state_and_names_are_escaped() {
        let t0 = Utc::now();
        let at = |ms| t0 + chrono::Duration::milliseconds(ms);
        let bars = [
            Bar {
                node_id: "a".into(),
                state: "COMPLETED".into(),
                attempt: 1,
                from: at(0),
                started: Some(at(10)),
                to: Some(at(500)),
            },
            Bar {
                node_id: "<b>".into(),
                state: "FAILED".into(),
                attempt: 3,
                from: at(500),
                started: None,
                to: Some(at(900)),
            },
            Bar {
                node_id: "c".into(),
                state: "RUNNING".into(),
                attempt: 1,
                from: at(900),
                started: Some(at(950)),
                to: None,
            },
        ];
        let svg = svg(t0, None, &bars, at(1000));
        assert_eq!(svg.matches("<g class=\"bar").count(), 3);
        assert!(svg.contains("class=\"bar failed\"") && svg.contains("3 attempts"));
        assert!(svg.contains("&lt;b&gt;") && !svg.contains("<b>"));
        assert!(svg.contains("1000 ms") || svg.contains("1.0 s"), "the axis ends at the run's length");
    }
}
