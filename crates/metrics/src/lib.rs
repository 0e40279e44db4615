//! Process-wide metrics in the Prometheus text format, all named
//! `composer_*`, each declared once as a constant ([`EVENTS`], …) with its
//! type and help text. Counters, gauges and histograms are keyed by metric
//! and label values; [`render`] writes them with their help text. A mutex-guarded map
//! is plenty at our rates (thousands of updates per second) and keeps this
//! crate free of dependencies.
//!
//! Labels whose values users choose ([`BOUNDED_LABELS`]: workflow and queue
//! names, node types) keep at most [`MAX_LABEL_VALUES`] values per metric;
//! later ones are counted under [`OTHER`], so the text stays bounded however
//! many workflows are registered.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write;
use std::sync::Mutex;
use std::time::Duration;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Counter,
    Gauge,
    Histogram,
}

/// A metric we export: its name, type and help text. Every one is a constant
/// below, so a call site cannot name a metric that [`render`] does not
/// describe.
#[derive(Debug, PartialEq, Eq)]
pub struct Metric {
    pub name: &'static str,
    pub kind: Kind,
    pub help: &'static str,
}

/// Declares each metric as a constant, and [`ALL`] as the list of them.
macro_rules! metrics {
    ($($(#[$doc:meta])* $id:ident: $kind:ident, $name:literal, $help:literal;)*) => {
        $($(#[$doc])* pub const $id: &Metric = &Metric { name: $name, kind: Kind::$kind, help: $help };)*
        /// Every metric, in the order [`render`] writes them.
        pub const ALL: &[&Metric] = &[$($id),*];
    };
}

metrics! {
    EVENTS: Counter, "composer_events_total",
        "Events handled by the engine, by event and result (applied or the reason it was ignored).";
    EVENT_DURATION: Histogram, "composer_event_duration_seconds",
        "Time to handle one event: lock, state machine, write, commit.";
    REPORT_DURATION: Histogram, "composer_report_duration_seconds",
        "Time a coordinator spends on one worker report.";
    API_ERRORS: Counter, "composer_api_errors_total", "API responses with an error status, by status.";
    RUNS_STARTED: Counter, "composer_runs_started_total", "Runs started.";
    RUNS_FINISHED: Counter, "composer_runs_finished_total", "Runs that reached a terminal status, by status.";
    RUN_DURATION: Histogram, "composer_run_duration_seconds",
        "A run's time from its creation to its end, by workflow and status.";
    API_REQUEST_DURATION: Histogram, "composer_api_request_duration_seconds",
        "Time to answer an API request, by method, route and status class.";
    TASK_DURATION: Histogram, "composer_task_duration_seconds",
        "Time a worker's handler took for one attempt, by node type and outcome.";
    QUEUE_BACKLOG: Gauge, "composer_queue_backlog",
        "Dispatched tasks no worker has started yet, by queue.";
    QUEUE_LAG: Gauge, "composer_queue_lag_seconds",
        "How long the oldest dispatched, unstarted task of a queue has waited, by queue.";
    BUILD_INFO: Gauge, "composer_build_info", "1, labelled with the version of the running binary and its role.";
    DISPATCHES: Counter, "composer_dispatches_total", "Outbox rows published to Redis streams.";
    OUTBOX_PUBLISH_FAILURES: Counter, "composer_outbox_publish_failures_total",
        "Outbox batches that failed to publish (rows went to RETRY).";
    RECOVERIES: Counter, "composer_recoveries_total",
        "What the recovery sweeps repaired, by kind (expired_lease, lost_dispatch, max_dispatches, stranded_event, child_result, child_start, orphaned_child).";
    TIMERS_FIRED: Counter, "composer_timers_fired_total", "Timers fired (WAIT nodes and retry backoffs).";
    SCHEDULE_FIRES: Counter, "composer_schedule_fires_total",
        "Schedule fire times by outcome: started, skipped (overlap), buffered, missed (past the catch-up window), failed (the run could not start).";
    PARTITIONS_CREATED: Counter, "composer_partitions_created_total", "Monthly partitions created.";
    PARTITIONS_DROPPED: Counter, "composer_partitions_dropped_total", "Months of runs dropped past retention.";
    PARTITIONS_KEPT_OPEN: Gauge, "composer_partitions_kept_open",
        "Months past retention kept because they still hold a RUNNING run.";
    LEASE_TAKEOVERS: Counter, "composer_lease_takeovers_total",
        "Leases taken over from a worker whose lease had expired.";
    LEASES_LOST: Counter, "composer_leases_lost_total", "Executions cancelled because their lease was lost.";
    TASK_API_LEASED: Counter, "composer_task_api_leased_total", "Tasks leased to workers of the task API (/v1/tasks/poll).";
    TASKS_EXECUTED: Counter, "composer_tasks_executed_total", "Task executions started by workers, by node type.";
    MAX_DELIVERIES_EXCEEDED: Counter, "composer_max_deliveries_exceeded_total",
        "Messages failed after too many deliveries.";
    RECLAIMED_MESSAGES: Counter, "composer_reclaimed_messages_total",
        "Stream messages reclaimed from stalled consumers.";
    OUTBOX_BACKLOG: Gauge, "composer_outbox_backlog", "Outbox rows not yet published (sampled).";
    OUTBOX_OLDEST_AGE: Gauge, "composer_outbox_oldest_age_seconds", "Age of the oldest outbox row (sampled).";
    OPEN_TASKS: Gauge, "composer_open_tasks", "Tasks in an open state, by state (sampled).";
    RUNNING_RUNS: Gauge, "composer_running_runs", "Runs that are RUNNING (sampled).";
    DUE_TIMERS: Gauge, "composer_due_timers", "WAITING tasks whose wake-up time has passed (sampled).";
    STEP_STAGE: Histogram, "composer_step_stage_seconds",
        "One step's way from a worker's report to the next task's start, by stage: report_to_commit (coordinator), commit_to_publish (coordinator), publish_to_read, read_to_lease, lease_to_start (worker).";
}

/// The stages of [`STEP_STAGE`], in the order a step passes them.
pub const STAGES: [&str; 5] =
    ["report_to_commit", "commit_to_publish", "publish_to_read", "read_to_lease", "lease_to_start"];

/// Upper bounds of histogram buckets, in seconds.
const BUCKETS: [f64; 14] = [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0];

type Labels = Vec<(&'static str, String)>;

/// Labels whose values come from what users register (workflow and queue
/// names, node types), so their number has no bound of its own.
pub const BOUNDED_LABELS: [&str; 3] = ["workflow", "queue", "node_type"];

/// Distinct values one metric keeps of each of [`BOUNDED_LABELS`]; the
/// values first seen after these are folded into [`OTHER`].
pub const MAX_LABEL_VALUES: usize = 200;

/// The value a label beyond [`MAX_LABEL_VALUES`] is counted under.
pub const OTHER: &str = "other";

#[derive(Default)]
struct Histogram {
    counts: [u64; BUCKETS.len()],
    count: u64,
    sum: f64,
}

#[derive(Default)]
struct Registry {
    values: BTreeMap<(&'static str, Labels), f64>,
    histograms: BTreeMap<(&'static str, Labels), Histogram>,
    /// The values kept of each bounded label, per metric.
    kept: BTreeMap<(&'static str, &'static str), BTreeSet<String>>,
}

static REGISTRY: Mutex<Registry> =
    Mutex::new(Registry { values: BTreeMap::new(), histograms: BTreeMap::new(), kept: BTreeMap::new() });

impl Registry {
    /// The labels as recorded: a bounded label's value past the limit is
    /// [`OTHER`]. `keep` records a new value while there is room (a read
    /// does not).
    fn labels(&mut self, metric: &'static str, l: &[(&'static str, &str)], keep: bool) -> Labels {
        l.iter()
            .map(|&(k, v)| {
                if !BOUNDED_LABELS.contains(&k) {
                    return (k, v.to_string());
                }
                let kept = self.kept.entry((metric, k)).or_default();
                if kept.contains(v) {
                    (k, v.to_string())
                } else if kept.len() < MAX_LABEL_VALUES {
                    if keep {
                        kept.insert(v.to_string());
                    }
                    (k, v.to_string())
                } else {
                    (k, OTHER.to_string())
                }
            })
            .collect()
    }
}

/// Adds `by` to a counter.
pub fn inc(metric: &Metric, l: &[(&'static str, &str)], by: u64) {
    if let Ok(mut r) = REGISTRY.lock() {
        let key = (metric.name, r.labels(metric.name, l, true));
        *r.values.entry(key).or_insert(0.0) += by as f64;
    }
}

/// Sets a gauge. (A gauge's [`OTHER`] holds the last value set of any of
/// the values folded into it.)
pub fn set(metric: &Metric, l: &[(&'static str, &str)], value: f64) {
    if let Ok(mut r) = REGISTRY.lock() {
        let key = (metric.name, r.labels(metric.name, l, true));
        r.values.insert(key, value);
    }
}

/// Records one observation of a duration.
pub fn observe(metric: &Metric, l: &[(&'static str, &str)], d: Duration) {
    let secs = d.as_secs_f64();
    if let Ok(mut r) = REGISTRY.lock() {
        let key = (metric.name, r.labels(metric.name, l, true));
        let h = r.histograms.entry(key).or_default();
        for (i, bound) in BUCKETS.iter().enumerate() {
            if secs <= *bound {
                h.counts[i] += 1;
            }
        }
        h.count += 1;
        h.sum += secs;
    }
}

/// How many observations a histogram has and their sum in seconds (for tests).
pub fn histogram(metric: &Metric, l: &[(&'static str, &str)]) -> (u64, f64) {
    let Ok(mut r) = REGISTRY.lock() else { return (0, 0.0) };
    let key = (metric.name, r.labels(metric.name, l, false));
    r.histograms.get(&key).map_or((0, 0.0), |h| (h.count, h.sum))
}

/// The current value of a counter or gauge (for tests).
pub fn value(metric: &Metric, l: &[(&'static str, &str)]) -> f64 {
    let Ok(mut r) = REGISTRY.lock() else { return 0.0 };
    let key = (metric.name, r.labels(metric.name, l, false));
    r.values.get(&key).copied().unwrap_or(0.0)
}

fn write_labels(out: &mut String, l: &Labels, extra: Option<(&str, String)>) {
    if l.is_empty() && extra.is_none() {
        return;
    }
    out.push('{');
    let mut first = true;
    for (k, v) in l.iter().map(|(k, v)| (*k, v.clone())).chain(extra) {
        if !first {
            out.push(',');
        }
        first = false;
        let escaped = v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n");
        let _ = write!(out, "{k}=\"{escaped}\"");
    }
    out.push('}');
}

/// Every metric in the Prometheus text exposition format.
pub fn render() -> String {
    let mut out = String::new();
    let Ok(r) = REGISTRY.lock() else { return out };
    for Metric { name, kind, help } in ALL.iter().copied() {
        let type_name = match kind {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
        };
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {type_name}");
        if *kind == Kind::Histogram {
            for ((n, l), h) in r.histograms.range((*name, Vec::new())..) {
                if n != name {
                    break;
                }
                for (i, bound) in BUCKETS.iter().enumerate() {
                    out.push_str(name);
                    out.push_str("_bucket");
                    write_labels(&mut out, l, Some(("le", bound.to_string())));
                    let _ = writeln!(out, " {}", h.counts[i]);
                }
                let _ = write!(out, "{name}_bucket");
                write_labels(&mut out, l, Some(("le", "+Inf".into())));
                let _ = writeln!(out, " {}", h.count);
                let _ = write!(out, "{name}_sum");
                write_labels(&mut out, l, None);
                let _ = writeln!(out, " {}", h.sum);
                let _ = write!(out, "{name}_count");
                write_labels(&mut out, l, None);
                let _ = writeln!(out, " {}", h.count);
            }
        } else {
            // A counter nobody has counted yet reads 0 rather than being
            // absent, so that rates and alerts work from the start.
            let counted = r.values.range((*name, Vec::new())..).next().is_some_and(|((n, _), _)| n == name);
            if *kind == Kind::Counter && !counted {
                let _ = writeln!(out, "{name} 0");
            }
            for ((n, l), v) in r.values.range((*name, Vec::new())..) {
                if n != name {
                    break;
                }
                out.push_str(name);
                write_labels(&mut out, l, None);
                let _ = writeln!(out, " {v}");
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_grafana_dashboard_names_only_metrics_that_exist() {
        let dashboard = include_str!("../../../docs/grafana-dashboard.json");
        let mut named = 0;
        for word in dashboard.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')) {
            if !word.starts_with("composer_") {
                continue;
            }
            let base = word.trim_end_matches("_bucket");
            assert!(ALL.iter().any(|m| m.name == base), "the dashboard names {word}, which no metric is");
            named += 1;
        }
        assert!(named >= 15, "{named}");
    }

    #[test]
    fn renders_counters_gauges_and_histograms() {
        inc(EVENTS, &[("event", "TaskCompleted"), ("result", "applied")], 2);
        set(OUTBOX_BACKLOG, &[], 7.0);
        observe(EVENT_DURATION, &[], Duration::from_millis(3));
        let text = render();
        assert!(text.contains("composer_events_total{event=\"TaskCompleted\",result=\"applied\"} 2"), "{text}");
        assert!(text.contains("composer_outbox_backlog 7"), "{text}");
        assert!(text.contains("composer_event_duration_seconds_bucket{le=\"0.005\"} 1"), "{text}");
        assert!(text.contains("composer_event_duration_seconds_bucket{le=\"0.001\"} 0"), "{text}");
        assert!(text.contains("# TYPE composer_event_duration_seconds histogram"));
    }

    #[test]
    fn values_of_a_user_chosen_label_past_the_limit_are_counted_as_other() {
        for i in 0..MAX_LABEL_VALUES + 100 {
            inc(TASKS_EXECUTED, &[("node_type", &format!("type-{i}"))], 1);
        }
        inc(TASKS_EXECUTED, &[("node_type", "type-0")], 1);
        let text = render();
        let lines: Vec<&str> = text.lines().filter(|l| l.starts_with("composer_tasks_executed_total{")).collect();
        assert!(lines.len() <= MAX_LABEL_VALUES + 1, "{} series", lines.len());
        assert!(lines.contains(&"composer_tasks_executed_total{node_type=\"type-0\"} 2"), "a kept value still counts");
        assert!(lines.contains(&"composer_tasks_executed_total{node_type=\"other\"} 100"), "{lines:?}");
        assert_eq!(value(TASKS_EXECUTED, &[("node_type", "type-250")]), 100.0, "read as other too");
        inc(EVENTS, &[("event", "TaskCompleted"), ("result", "a-label-we-choose")], 1);
        assert_eq!(value(EVENTS, &[("event", "TaskCompleted"), ("result", "a-label-we-choose")]), 1.0);
    }

    #[test]
    fn a_counter_nobody_counted_yet_reads_zero() {
        let text = render();
        assert!(text.contains("\ncomposer_partitions_created_total 0\n"), "{text}");
    }

    #[test]
    fn every_metric_is_described_once_under_a_composer_name() {
        let text = render();
        for m in ALL {
            assert!(m.name.starts_with("composer_"), "{}", m.name);
            assert_eq!(text.matches(&format!("# HELP {} ", m.name)).count(), 1, "{}", m.name);
            let suffix_ok = match m.kind {
                Kind::Counter => m.name.ends_with("_total"),
                Kind::Histogram => m.name.ends_with("_seconds"),
                Kind::Gauge => !m.name.ends_with("_total"),
            };
            assert!(suffix_ok, "{} does not follow the naming convention of a {:?}", m.name, m.kind);
        }
    }
}
