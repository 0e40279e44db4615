//! A run's timeline as SVG: a row per step, each of its attempts a bar from
//! when it was sent to when it ended (or now), coloured by how it ended; the
//! last attempt's wait for a worker lighter than its running. The axis is in
//! time from the run's start; each bar's title has its absolute times. The
//! bars are made from the run's task rows and its history ([`bars_of`]).

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use composer_core::machine::HistoryKind;
use composer_store::runs::{HistoryRow, TaskRow};
use uuid::Uuid;

use super::html::{clip, html, state_class, Html};

const ROW: usize = 22;
const LABEL: usize = 170;
const WIDTH: usize = 720;
const PAD: usize = 6;

/// Most history lines the timeline reads (a run with more shows its later
/// attempts from the task rows alone).
pub const HISTORY_READ: i64 = 2_000;

/// Most attempts of one step the timeline draws (its last ones).
const ATTEMPTS_DRAWN: i32 = 20;

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

/// The run's steps and their attempts, from the task rows and the history:
/// when each attempt was sent (`TaskDispatched`) and how it ended.
pub fn bars_of(tasks: &[TaskRow], history: &[HistoryRow]) -> Vec<Bar> {
    let mut sent: HashMap<(Uuid, i64), DateTime<Utc>> = HashMap::new();
    let mut ended: HashMap<(Uuid, i64), (DateTime<Utc>, &'static str)> = HashMap::new();
    for h in history {
        let task = h.payload["task_id"].as_str().and_then(|t| t.parse::<Uuid>().ok());
        let (Some(task), Some(attempt)) = (task, h.payload["attempt"].as_i64()) else { continue };
        let how = match h.kind {
            HistoryKind::TaskDispatched => {
                sent.entry((task, attempt)).or_insert(h.created_at);
                continue;
            }
            HistoryKind::TaskRetryScheduled => "RETRIED",
            HistoryKind::TaskCompleted => "COMPLETED",
            HistoryKind::TaskFailed => "FAILED",
            HistoryKind::TaskCancelled => "CANCELLED",
            HistoryKind::TaskSkipped => "SKIPPED",
            HistoryKind::TaskInDoubt => "IN_DOUBT",
            _ => continue,
        };
        ended.insert((task, attempt), (h.created_at, how));
    }
    tasks
        .iter()
        .map(|t| {
            let first = (t.attempt - ATTEMPTS_DRAWN + 1).max(1);
            let attempts = (first..=t.attempt).map(|n| attempt_of(t, n, &sent, &ended)).collect();
            Bar { node_id: t.node_id.clone(), attempts }
        })
        .collect()
}

/// Attempt `n` of task `t`: the last one from the task row, earlier ones
/// from when the history says they were sent and ended (or, with no end
/// recorded, until the next was sent).
fn attempt_of(
    t: &TaskRow,
    n: i32,
    sent: &HashMap<(Uuid, i64), DateTime<Utc>>,
    ended: &HashMap<(Uuid, i64), (DateTime<Utc>, &'static str)>,
) -> Attempt {
    let key = (t.id, n as i64);
    let from = if n == 1 { t.created_at } else { sent.get(&key).copied().unwrap_or(t.created_at) };
    if n == t.attempt {
        return Attempt {
            number: n,
            from,
            started: t.started_at,
            to: t.finished_at,
            state: t.state.as_str().to_string(),
        };
    }
    let (to, how) = match ended.get(&key) {
        Some((at, how)) => (Some(*at), *how),
        None => (sent.get(&(t.id, n as i64 + 1)).copied(), "RETRIED"),
    };
    Attempt { number: n, from, started: None, to, state: how.to_string() }
}

/// Where a moment is on the timeline, and where the rows end.
struct Scale {
    start: DateTime<Utc>,
    /// The run's length so far, in milliseconds (at least 1).
    span: f64,
    height: usize,
}

impl Scale {
    fn x(&self, t: DateTime<Utc>) -> f64 {
        LABEL as f64 + ((t - self.start).num_milliseconds().max(0) as f64 / self.span) * (WIDTH - LABEL - PAD) as f64
    }
}

/// The timeline of bars, from the run's creation to its end (or `now`).
pub fn svg(run_start: DateTime<Utc>, run_end: Option<DateTime<Utc>>, bars: &[Bar], now: DateTime<Utc>) -> Html {
    if bars.is_empty() {
        return Html::new();
    }
    let last = bars.iter().flat_map(|b| &b.attempts).filter_map(|a| a.to).max().unwrap_or(now);
    let end = run_end.unwrap_or(now).max(last);
    let scale = Scale {
        start: run_start,
        span: ((end - run_start).num_milliseconds().max(1)) as f64,
        height: PAD * 2 + (bars.len() + 1) * ROW,
    };
    let rows: Html = bars.iter().enumerate().map(|(i, b)| bar(&scale, PAD + i * ROW, b, now)).collect();
    html!(
        "<svg class=\"timeline\" xmlns=\"http://www.w3.org/2000/svg\" viewBox=\"0 0 {} {}\" width=\"{}\" \
         height=\"{}\" role=\"img\" aria-label=\"the run's timeline\">{}{}</svg>",
        WIDTH,
        scale.height,
        WIDTH,
        scale.height,
        axis(&scale),
        rows
    )
}

/// The axis: the run's start, its end, and three ticks between.
fn axis(scale: &Scale) -> Html {
    (0..=4)
        .map(|k| {
            let t = scale.start + chrono::Duration::milliseconds((scale.span * k as f64 / 4.0) as i64);
            let anchor = match k {
                0 => "start",
                4 => "end",
                _ => "middle",
            };
            html!(
                "<line class=\"tick\" x1=\"{0:.1}\" y1=\"{1}\" x2=\"{0:.1}\" y2=\"{2}\"/>\
                 <text class=\"axis\" x=\"{0:.1}\" y=\"{3}\" text-anchor=\"{4}\">{5}</text>",
                scale.x(t),
                PAD,
                scale.height - ROW,
                scale.height - PAD,
                anchor,
                duration(scale.span * k as f64 / 4.0),
            )
        })
        .collect()
}

/// One step's row at `y`: its label and a bar per attempt.
fn bar(scale: &Scale, y: usize, b: &Bar, now: DateTime<Utc>) -> Html {
    let state = b.attempts.last().map(|a| a.state.as_str()).unwrap_or("");
    let tries = b.attempts.last().map(|a| a.number).unwrap_or(1);
    let label = if tries > 1 { format!("{} ×{tries}", b.node_id) } else { b.node_id.clone() };
    let attempts: Html = b.attempts.iter().map(|a| attempt(scale, y, &b.node_id, a, now)).collect();
    html!(
        "<g class=\"bar {}\" data-node=\"{}\"><text class=\"label\" x=\"{}\" y=\"{}\">{}</text>{}</g>",
        state_class(state),
        b.node_id,
        PAD,
        y + ROW - 8,
        clip(&label, 24),
        attempts
    )
}

/// One attempt's bar: its wait for a worker, then its running.
fn attempt(scale: &Scale, y: usize, node_id: &str, a: &Attempt, now: DateTime<Utc>) -> Html {
    let to = a.to.unwrap_or(now);
    let (x0, x1) = (scale.x(a.from), scale.x(to).max(scale.x(a.from) + 2.0));
    let ran = a.started.map(|s| scale.x(s).clamp(x0, x1)).unwrap_or(x0);
    let title = format!(
        "{} attempt {} {}: sent {}{} → {} ({})",
        node_id,
        a.number,
        a.state,
        a.from.format("%H:%M:%S%.3f"),
        a.started.map(|s| format!(", started {}", s.format("%H:%M:%S%.3f"))).unwrap_or_default(),
        a.to.map(|t| t.format("%H:%M:%S%.3f").to_string()).unwrap_or_else(|| "now".into()),
        duration((to - a.from).num_milliseconds() as f64),
    );
    html!(
        "<g class=\"attempt {}\" data-attempt=\"{}\"><title>{}</title>\
         <rect class=\"wait\" x=\"{:.1}\" y=\"{}\" width=\"{:.1}\" height=\"{}\"/>\
         <rect class=\"span\" x=\"{:.1}\" y=\"{}\" width=\"{:.1}\" height=\"{}\"/></g>",
        attempt_class(&a.state),
        a.number,
        title,
        x0,
        y + 4,
        (ran - x0).max(0.0),
        ROW - 8,
        ran,
        y + 4,
        (x1 - ran).max(2.0),
        ROW - 8,
    )
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
        let t0 = crate::clock::now();
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
        let svg = svg.as_str();
        assert_eq!(svg.matches("<g class=\"bar").count(), 3);
        assert_eq!(svg.matches("<g class=\"attempt").count(), 5, "every attempt drawn");
        assert_eq!(svg.matches("class=\"attempt retried\"").count(), 2);
        assert!(svg.contains("class=\"bar failed\"") && svg.contains("×3"));
        assert!(svg.contains("&lt;b&gt;") && !svg.contains("<b>"));
        assert!(svg.contains(">1.0 s</text>"), "the axis ends at the run's length: {svg}");
        assert_eq!(duration(3_725_000.0), "1 h 2 min");
    }
}
