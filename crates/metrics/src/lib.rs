//! Process-wide metrics in the Prometheus text format, all named
//! `composer_*`, each declared once as a constant ([`EVENTS`], …) with its
//! type, help text, the role of the process that counts it and its labels.
//! Counters, gauges and histograms are keyed by metric and label values; a
//! [`Registry`] per role ([`COORDINATOR`], [`WORKER`]) holds them and
//! [`Registry::render`] writes them with their help text, so `composer dev`,
//! which runs both roles in one process, serves each role's metrics on that
//! role's listener and a scraper of both counts nothing twice. A
//! mutex-guarded map is plenty at our rates (thousands of updates per second)
//! and keeps this crate free of dependencies.
//!
//! A counter is exported from zero, so that `rate()` sees its first events:
//! one without labels as `name 0`, one whose label values are known here
//! (a schedule fire's outcome) as one zero series per value, and one whose
//! values are known to the process (an engine event's name) from the moment
//! the process [`declare`](Registry::declare)s them.
//!
//! Labels whose values users choose ([`BOUNDED_LABELS`]: workflow and queue
//! names, node types) keep at most [`MAX_LABEL_VALUES`] values per metric
//! and namespace (a series' `namespace` label, which the coordinator adds);
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

/// The process role whose registry a metric is counted in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Coordinator,
    Worker,
    /// Counted by both, each in its own registry.
    Both,
}

/// A label and the values it can take, when they are known here; an empty
/// list for values users choose or the process declares.
pub type Label = (&'static str, &'static [&'static str]);

/// A metric we export: its name, type and help text. Every one is a constant
/// below, so a call site cannot name a metric that [`Registry::render`] does
/// not describe.
#[derive(Debug, PartialEq, Eq)]
pub struct Metric {
    pub name: &'static str,
    pub kind: Kind,
    pub role: Role,
    pub help: &'static str,
    pub labels: &'static [Label],
}

/// Declares each metric as a constant, and [`ALL`] as the list of them.
macro_rules! metrics {
    ($($(#[$doc:meta])* $id:ident: $kind:ident($role:ident), $name:literal, $help:literal
       $(, $label:ident = [$($value:literal),* $(,)?])*;)*) => {
        $($(#[$doc])* pub const $id: &Metric = &Metric {
            name: $name, kind: Kind::$kind, role: Role::$role, help: $help,
            labels: &[$((stringify!($label), &[$($value),*])),*],
        };)*
        /// Every metric, in the order a registry writes them.
        pub const ALL: &[&Metric] = &[$($id),*];
    };
}

metrics! {
    EVENTS: Counter(Coordinator), "composer_events_total",
        "Events handled by the engine, by event and result (applied or the reason it was ignored).",
        event = ["RunStarted", "TaskCompleted", "TaskFailed", "TimerFired", "EventReceived", "ApprovalVote", "CancelRun",
                 "RetryRun", "PauseRun", "ResumeRun", "RunTimedOut", "TaskInDoubt", "ResolveTask", "RerunFrom", "CompleteTask",
                 "ItemsLoaded", "ItemsCollected", "SourcesLoaded", "ChildFinished", "Migrate"],
        result = ["applied", "already_started", "run_finished", "unknown_task", "stale_attempt", "already_finished",
                  "not_waiting", "not_due", "not_failed", "not_paused", "not_dispatched", "not_in_doubt",
                  "refused"];
    EVENT_DURATION: Histogram(Coordinator), "composer_event_duration_seconds",
        "Time to handle one event: lock, state machine, write, commit.";
    REPORT_DURATION: Histogram(Coordinator), "composer_report_duration_seconds",
        "Time a coordinator spends on one worker report.";
    API_ERRORS: Counter(Coordinator), "composer_api_errors_total", "API responses with an error status, by status.",
        status = ["400", "401", "403", "404", "405", "409", "413", "414", "415", "421", "422", "429", "500", "503"];
    RUNS_STARTED: Counter(Coordinator), "composer_runs_started_total", "Runs started.";
    PARTIAL_LOADS: Counter(Coordinator), "composer_partial_loads_total",
        "Reads of more tasks of a run loaded in part that an event needed (the event was applied again).";
    UNREAD_LOADS: Counter(Coordinator), "composer_unread_loads_total",
        "Reads of a run's offloaded values an event left unread and then needed (the event was applied again).";
    SLOTS_HANDED_OVER: Counter(Coordinator), "composer_slots_handed_over_total",
        "Queued runs started in the transaction whose runs freed their concurrency key's slots.";
    RUNS_FINISHED: Counter(Coordinator), "composer_runs_finished_total",
        "Runs that reached a terminal status, by status.", status = ["SUCCEEDED", "FAILED", "CANCELLED"];
    RUN_DURATION: Histogram(Coordinator), "composer_run_duration_seconds",
        "A run's time from its creation to its end, by workflow and status.", workflow = [], status = [];
    API_REQUEST_DURATION: Histogram(Coordinator), "composer_api_request_duration_seconds",
        "Time to answer an API request, by method, route and status class.", method = [], route = [], status = [];
    TASK_DURATION: Histogram(Worker), "composer_task_duration_seconds",
        "Time a worker's handler took for one attempt, by node type and outcome.", node_type = [], outcome = [];
    QUEUE_BACKLOG: Gauge(Coordinator), "composer_queue_backlog",
        "Dispatched tasks no worker has started yet, by queue.", queue = [];
    QUEUE_LAG: Gauge(Coordinator), "composer_queue_lag_seconds",
        "How long the oldest dispatched, unstarted task of a queue has waited, by queue.", queue = [];
    BUILD_INFO: Gauge(Both), "composer_build_info", "1, labelled with the version of the running binary and its role.",
        version = [], role = [];
    DISPATCHES: Counter(Coordinator), "composer_dispatches_total", "Outbox rows published to Redis streams.";
    EAGER_DISPATCHES: Counter(Both), "composer_eager_dispatches_total",
        "Tasks leased to a worker in the answer to its report (eager dispatch), not sent through a stream: given (coordinator), run (worker).";
    IDLE_POLL_DISPATCHES: Counter(Coordinator), "composer_idle_poll_dispatches_total",
        "Tasks a batch leased, in its commit, to a task-API poll waiting for work, not sent through a stream.";
    OUTBOX_PUBLISH_FAILURES: Counter(Coordinator), "composer_outbox_publish_failures_total",
        "Outbox batches that failed to publish (rows went to RETRY).";
    TRACE_EXPORT_FAILURES: Counter(Coordinator), "composer_trace_export_failures_total",
        "Batches of spans the OTLP receiver did not take (COMPOSER_OTLP_ENDPOINT): unreachable, too slow, or an error status.";
    RECOVERIES: Counter(Coordinator), "composer_recoveries_total",
        "What the recovery sweeps repaired, by kind (expired_lease, lost_dispatch, max_dispatches, in_doubt, stranded_event, child_result, child_start, orphaned_child, map_continued).",
        kind = ["expired_lease", "lost_dispatch", "max_dispatches", "in_doubt", "stranded_event", "child_result",
                "child_start", "orphaned_child", "map_continued"];
    TIMERS_FIRED: Counter(Coordinator), "composer_timers_fired_total", "Timers fired (WAIT nodes and retry backoffs).";
    EVALUATIONS_MOVED: Counter(Coordinator), "composer_evaluations_moved_total",
        "Work of simple expressions that took more than its inline steps and was done again on the evaluation threads.";
    LIMIT_ADMITTED: Counter(Coordinator), "composer_limit_admitted_total",
        "Steps held by their limits that the limiter let go.";
    SCHEDULE_FIRES: Counter(Coordinator), "composer_schedule_fires_total",
        "Schedule fire times by outcome: started, skipped (overlap), buffered, missed (past the catch-up window), failed (the run could not start).",
        outcome = ["started", "skipped", "buffered", "missed", "failed"];
    PARTITIONS_CREATED: Counter(Coordinator), "composer_partitions_created_total", "Monthly partitions created.";
    PARTITIONS_DROPPED: Counter(Coordinator), "composer_partitions_dropped_total",
        "Months of runs dropped past retention.";
    ARCHIVE_FAILURES: Counter(Coordinator), "composer_archive_failures_total",
        "Expired months retention could not write to the archive (COMPOSER_ARCHIVE_URL): each is kept for the next pass.";
    PARTITIONS_KEPT_OPEN: Gauge(Coordinator), "composer_partitions_kept_open",
        "Months past retention kept because they still hold a RUNNING run.";
    CLOCK_OFFSET: Gauge(Coordinator), "composer_clock_offset_seconds",
        "PostgreSQL's clock minus this coordinator host's, as last measured (the coordinator works on PostgreSQL's).";
    LEASE_TAKEOVERS: Counter(Coordinator), "composer_lease_takeovers_total",
        "Leases a poll took over from a worker whose lease had expired.";
    LEASES_DENIED: Counter(Coordinator), "composer_leases_denied_total",
        "Stream messages a poll read whose task another worker held or that had moved on (a message published twice, or a task taken over): acknowledged and dropped.";
    LEASES_LOST: Counter(Worker), "composer_leases_lost_total", "Executions cancelled because their lease was lost.";
    POLL_WAKES: Counter(Coordinator), "composer_poll_wakes_total",
        "Publishes of other coordinators, announced through Redis, that woke this one's waiting task-API polls.";
    TASK_API_LEASED: Counter(Coordinator), "composer_task_api_leased_total",
        "Tasks leased to workers of the task API (/v1/tasks/poll).";
    TASKS_EXECUTED: Counter(Worker), "composer_tasks_executed_total", "Task executions started by workers, by node type.",
        node_type = [];
    OUTBOX_BACKLOG: Gauge(Coordinator), "composer_outbox_backlog", "Outbox rows not yet published (sampled).";
    OUTBOX_OLDEST_AGE: Gauge(Coordinator), "composer_outbox_oldest_age_seconds",
        "Age of the oldest outbox row (sampled).";
    OPEN_TASKS: Gauge(Coordinator), "composer_open_tasks", "Tasks in an open state, by state (sampled).", state = [];
    NAMESPACE_USAGE: Gauge(Coordinator), "composer_namespace_usage",
        "What the namespace uses of each quota (sampled): open runs, schedules, limits, stored bytes.",
        quota = ["open_runs", "schedules", "limits", "stored_bytes"];
    NAMESPACE_QUOTA: Gauge(Coordinator), "composer_namespace_quota",
        "The namespace's quotas, those it has (sampled).", quota = ["open_runs", "schedules", "limits", "stored_bytes"];
    RUNNING_RUNS: Gauge(Coordinator), "composer_running_runs", "Runs that are RUNNING (sampled).";
    DUE_TIMERS: Gauge(Coordinator), "composer_due_timers", "WAITING tasks whose wake-up time has passed (sampled).";
    STEP_STAGE: Histogram(Both), "composer_step_stage_seconds",
        "One step's way from a worker's result to the next task's start, by stage: report_to_commit, commit_to_publish, publish_to_read, read_to_lease (coordinator), lease_to_start (worker: from the poll's or the result's answer).",
        stage = ["report_to_commit", "commit_to_publish", "publish_to_read", "read_to_lease", "lease_to_start"];
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

struct Values {
    values: BTreeMap<(&'static str, Labels), f64>,
    histograms: BTreeMap<(&'static str, Labels), Histogram>,
    /// The values kept of each bounded label, per metric and namespace
    /// (the `namespace` label's value; none in `default`).
    kept: BTreeMap<(&'static str, &'static str, String), BTreeSet<String>>,
}

/// The metrics of one process role.
pub struct Registry {
    role: Role,
    values: Mutex<Values>,
}

/// The coordinator's metrics, served on its `/metrics`.
pub static COORDINATOR: Registry = Registry::new(Role::Coordinator);

/// A worker's metrics, served on its `--worker-listen` address.
pub static WORKER: Registry = Registry::new(Role::Worker);

impl Values {
    /// The labels as recorded: a bounded label's value past the limit is
    /// [`OTHER`]. `keep` records a new value while there is room (a read
    /// does not).
    fn labels(&mut self, metric: &'static str, l: &[(&'static str, &str)], keep: bool) -> Labels {
        let namespace = l.iter().find(|(k, _)| *k == "namespace").map_or("", |(_, v)| v).to_string();
        l.iter()
            .map(|&(k, v)| {
                if !BOUNDED_LABELS.contains(&k) {
                    return (k, v.to_string());
                }
                let kept = self.kept.entry((metric, k, namespace.clone())).or_default();
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

/// Every combination of the metric's known label values, when each of its
/// labels has known values (none for a metric without labels).
fn known_series(metric: &Metric) -> Vec<Labels> {
    if metric.labels.iter().any(|(_, values)| values.is_empty()) {
        return vec![];
    }
    let mut all: Vec<Labels> = vec![vec![]];
    for &(name, values) in metric.labels {
        all = all
            .into_iter()
            .flat_map(|prefix| {
                values.iter().map(move |v| {
                    let mut l = prefix.clone();
                    l.push((name, v.to_string()));
                    l
                })
            })
            .collect();
    }
    all
}

impl Registry {
    const fn new(role: Role) -> Registry {
        Registry {
            role,
            values: Mutex::new(Values { values: BTreeMap::new(), histograms: BTreeMap::new(), kept: BTreeMap::new() }),
        }
    }

    /// Adds `by` to a counter.
    pub fn inc(&self, metric: &Metric, l: &[(&'static str, &str)], by: u64) {
        if let Ok(mut r) = self.values.lock() {
            let key = (metric.name, r.labels(metric.name, l, true));
            *r.values.entry(key).or_insert(0.0) += by as f64;
        }
    }

    /// Exports a counter's series at zero before its first count, for label
    /// values the process knows (an engine event's name, a node type it runs).
    pub fn declare(&self, metric: &Metric, l: &[(&'static str, &str)]) {
        self.inc(metric, l, 0);
    }

    /// Sets a gauge. (A gauge's [`OTHER`] holds the last value set of any of
    /// the values folded into it.)
    pub fn set(&self, metric: &Metric, l: &[(&'static str, &str)], value: f64) {
        if let Ok(mut r) = self.values.lock() {
            let key = (metric.name, r.labels(metric.name, l, true));
            r.values.insert(key, value);
        }
    }

    /// Records one observation of a duration.
    pub fn observe(&self, metric: &Metric, l: &[(&'static str, &str)], d: Duration) {
        let secs = d.as_secs_f64();
        if let Ok(mut r) = self.values.lock() {
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
    pub fn histogram(&self, metric: &Metric, l: &[(&'static str, &str)]) -> (u64, f64) {
        let Ok(mut r) = self.values.lock() else { return (0, 0.0) };
        let key = (metric.name, r.labels(metric.name, l, false));
        r.histograms.get(&key).map_or((0, 0.0), |h| (h.count, h.sum))
    }

    /// The current value of a counter or gauge (for tests).
    pub fn value(&self, metric: &Metric, l: &[(&'static str, &str)]) -> f64 {
        let Ok(mut r) = self.values.lock() else { return 0.0 };
        let key = (metric.name, r.labels(metric.name, l, false));
        r.values.get(&key).copied().unwrap_or(0.0)
    }

    /// This role's metrics in the Prometheus text exposition format: the
    /// metrics of its role, and any other one counted in it.
    pub fn render(&self) -> String {
        let Ok(r) = self.values.lock() else { return String::new() };
        render_values(self.role, &[&r])
    }

    /// [`Registry::render`] with `other`'s metrics too, each family once (a
    /// series both hold is this one's): the metrics of a process that runs
    /// a second role, such as a coordinator running HTTP steps itself.
    pub fn render_with(&self, other: &Registry) -> String {
        let (Ok(mine), Ok(theirs)) = (self.values.lock(), other.values.lock()) else { return String::new() };
        render_values(self.role, &[&mine, &theirs])
    }
}

/// The text of every metric of `role`, or counted in any of `all`.
fn render_values(role: Role, all: &[&Values]) -> String {
    let mut out = String::new();
    for metric in ALL.iter().copied() {
        let Metric { name, kind, .. } = *metric;
        let of = |(n, _): &&(&str, Labels)| *n == name;
        let counted = all.iter().any(|r| r.values.keys().any(|k| of(&k)) || r.histograms.keys().any(|k| of(&k)));
        if !(metric.role == role || metric.role == Role::Both || counted) {
            continue;
        }
        let type_name = match kind {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
        };
        let _ = writeln!(out, "# HELP {name} {}\n# TYPE {name} {type_name}", metric.help);
        if kind == Kind::Histogram {
            let mut written = BTreeSet::new();
            for r in all {
                for ((_, l), h) in r.histograms.range((name, Vec::new())..).take_while(|((n, _), _)| *n == name) {
                    if written.insert(l) {
                        write_histogram(&mut out, name, l, h);
                    }
                }
            }
            continue;
        }
        let mut series: BTreeMap<&Labels, f64> = BTreeMap::new();
        for r in all {
            for ((_, l), v) in r.values.range((name, Vec::new())..).take_while(|((n, _), _)| *n == name) {
                series.entry(l).or_insert(*v);
            }
        }
        let known = if kind == Kind::Counter { known_series(metric) } else { vec![] };
        for l in &known {
            series.entry(l).or_insert(0.0);
        }
        for (l, v) in series {
            out.push_str(name);
            write_labels(&mut out, l, None);
            let _ = writeln!(out, " {v}");
        }
    }
    out
}

fn write_histogram(out: &mut String, name: &str, l: &Labels, h: &Histogram) {
    for (i, bound) in BUCKETS.iter().enumerate() {
        out.push_str(name);
        out.push_str("_bucket");
        write_labels(out, l, Some(("le", bound.to_string())));
        let _ = writeln!(out, " {}", h.counts[i]);
    }
    let _ = write!(out, "{name}_bucket");
    write_labels(out, l, Some(("le", "+Inf".into())));
    let _ = writeln!(out, " {}", h.count);
    let _ = write!(out, "{name}_sum");
    write_labels(out, l, None);
    let _ = writeln!(out, " {}", h.sum);
    let _ = write!(out, "{name}_count");
    write_labels(out, l, None);
    let _ = writeln!(out, " {}", h.count);
}

/// The coordinator's registry's [`Registry::inc`]: nearly every metric is
/// the coordinator's, so its call sites name no registry. A worker's name
/// [`WORKER`].
pub fn inc(metric: &Metric, l: &[(&'static str, &str)], by: u64) {
    COORDINATOR.inc(metric, l, by);
}

/// The coordinator's [`Registry::declare`].
pub fn declare(metric: &Metric, l: &[(&'static str, &str)]) {
    COORDINATOR.declare(metric, l);
}

/// The coordinator's [`Registry::set`].
pub fn set(metric: &Metric, l: &[(&'static str, &str)], value: f64) {
    COORDINATOR.set(metric, l, value);
}

/// The coordinator's [`Registry::observe`].
pub fn observe(metric: &Metric, l: &[(&'static str, &str)], d: Duration) {
    COORDINATOR.observe(metric, l, d);
}

/// The coordinator's [`Registry::histogram`] (for tests).
pub fn histogram(metric: &Metric, l: &[(&'static str, &str)]) -> (u64, f64) {
    COORDINATOR.histogram(metric, l)
}

/// The coordinator's [`Registry::value`] (for tests).
pub fn value(metric: &Metric, l: &[(&'static str, &str)]) -> f64 {
    COORDINATOR.value(metric, l)
}

/// Whether a worker of this process serves [`WORKER`] on a listener of its
/// own (`--worker-listen`): then the coordinator's `/metrics` leaves them
/// out, so that scraping both counts nothing twice.
static WORKER_SERVED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Says that a worker of this process serves its metrics itself.
pub fn worker_serves_its_own() {
    WORKER_SERVED.store(true, std::sync::atomic::Ordering::Relaxed);
}

/// The coordinator's [`Registry::render`], with the metrics of a worker in
/// its process (its own HTTP executor, `dev`'s worker) that counted any,
/// unless a worker here serves them on a listener of its own.
pub fn render() -> String {
    match WORKER_SERVED.load(std::sync::atomic::Ordering::Relaxed) {
        true => COORDINATOR.render(),
        false => COORDINATOR.render_with(&WORKER),
    }
}

/// The `Content-Type` of [`Registry::render`]'s text.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

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
            WORKER.inc(TASKS_EXECUTED, &[("node_type", &format!("type-{i}"))], 1);
        }
        WORKER.inc(TASKS_EXECUTED, &[("node_type", "type-0")], 1);
        let text = WORKER.render();
        let lines: Vec<&str> = text.lines().filter(|l| l.starts_with("composer_tasks_executed_total{")).collect();
        assert!(lines.len() <= MAX_LABEL_VALUES + 1, "{} series", lines.len());
        assert!(lines.contains(&"composer_tasks_executed_total{node_type=\"type-0\"} 2"), "a kept value still counts");
        assert!(lines.contains(&"composer_tasks_executed_total{node_type=\"other\"} 100"), "{lines:?}");
        assert_eq!(WORKER.value(TASKS_EXECUTED, &[("node_type", "type-250")]), 100.0, "read as other too");
        inc(EVENTS, &[("event", "TaskCompleted"), ("result", "a-label-we-choose")], 1);
        assert_eq!(value(EVENTS, &[("event", "TaskCompleted"), ("result", "a-label-we-choose")]), 1.0);
    }

    #[test]
    fn the_bound_on_a_user_chosen_label_holds_per_namespace() {
        for ns in ["ns-a", "ns-b"] {
            for i in 0..MAX_LABEL_VALUES {
                COORDINATOR.inc(RUNS_STARTED, &[("workflow", &format!("wf-{i}")), ("namespace", ns)], 1);
            }
        }
        for ns in ["ns-a", "ns-b"] {
            let last = [("workflow", "wf-199"), ("namespace", ns)];
            assert_eq!(COORDINATOR.value(RUNS_STARTED, &last), 1.0, "{ns} keeps its own {MAX_LABEL_VALUES}");
        }
    }

    #[test]
    fn a_counter_nobody_counted_yet_reads_zero() {
        let text = render();
        assert!(text.contains("\ncomposer_partitions_created_total 0\n"), "{text}");
    }

    /// `rate()` needs a series before its first event: a labelled counter
    /// is not `name 0` without labels, and its known values start at zero.
    #[test]
    fn a_labelled_counter_is_exported_from_zero_per_known_value_and_never_without_labels() {
        let r = Registry::new(Role::Coordinator);
        let text = r.render();
        for outcome in ["started", "skipped", "buffered", "missed", "failed"] {
            let line = format!("\ncomposer_schedule_fires_total{{outcome=\"{outcome}\"}} 0\n");
            assert!(text.contains(&line), "{line} in\n{text}");
        }
        for status in ["SUCCEEDED", "FAILED", "CANCELLED"] {
            assert!(text.contains(&format!("composer_runs_finished_total{{status=\"{status}\"}} 0\n")), "{status}");
        }
        for m in ALL.iter().filter(|m| m.kind == Kind::Counter && !m.labels.is_empty()) {
            assert!(!text.contains(&format!("\n{} ", m.name)), "{} without labels in\n{text}", m.name);
        }
        assert!(text.contains("composer_events_total{event=\"TaskCompleted\",result=\"stale_attempt\"} 0\n"));
        let worker = Registry::new(Role::Worker);
        assert!(!worker.render().contains("composer_tasks_executed_total{"), "a type comes when it is declared");
        worker.declare(TASKS_EXECUTED, &[("node_type", "resize")]);
        assert!(worker.render().contains("composer_tasks_executed_total{node_type=\"resize\"} 0\n"));
        r.inc(SCHEDULE_FIRES, &[("outcome", "started")], 2);
        let text = r.render();
        assert!(text.contains("composer_schedule_fires_total{outcome=\"started\"} 2\n"), "{text}");
        assert!(text.contains("composer_schedule_fires_total{outcome=\"missed\"} 0\n"), "{text}");
    }

    /// `composer dev` runs both roles in one process: each listener serves
    /// its role's registry, so a scraper of both counts nothing twice.
    #[test]
    fn each_role_renders_its_own_registry() {
        let (coordinator, worker) = (Registry::new(Role::Coordinator), Registry::new(Role::Worker));
        coordinator.inc(RUNS_STARTED, &[], 3);
        worker.inc(TASKS_EXECUTED, &[("node_type", "HTTP")], 2);
        worker.inc(EAGER_DISPATCHES, &[], 1);
        let (c, w) = (coordinator.render(), worker.render());
        assert!(c.contains("\ncomposer_runs_started_total 3\n") && !w.contains("composer_runs_started_total"), "{w}");
        assert!(w.contains("composer_tasks_executed_total{node_type=\"HTTP\"} 2\n"), "{w}");
        assert!(!c.contains("composer_tasks_executed_total"), "{c}");
        assert!(
            w.contains("\ncomposer_eager_dispatches_total 1\n") && c.contains("\ncomposer_eager_dispatches_total 0\n")
        );
        for m in ALL {
            let described = |text: &str| text.contains(&format!("# TYPE {} ", m.name));
            assert_eq!(described(&c), m.role != Role::Worker, "{}", m.name);
            assert_eq!(described(&w), m.role != Role::Coordinator, "{}", m.name);
        }
        coordinator.inc(LEASES_LOST, &[], 1);
        assert!(
            coordinator.render().contains("\ncomposer_leases_lost_total 1\n"),
            "a metric counted in another role's registry is shown, not lost"
        );
    }

    #[test]
    fn known_label_values_are_label_names_of_the_metric() {
        for m in ALL {
            let names: BTreeSet<&str> = m.labels.iter().map(|(n, _)| *n).collect();
            assert_eq!(names.len(), m.labels.len(), "{}: a label twice", m.name);
            assert!(m.labels.iter().all(|(n, _)| *n != "le"), "{}", m.name);
        }
        assert_eq!(STEP_STAGE.labels[0].1, STAGES, "the stages are the label's values");
    }

    /// A process with a worker in it shows the worker's metrics with its
    /// own, each family described once.
    #[test]
    fn a_coordinator_with_a_worker_in_its_process_shows_both_roles_metrics_once() {
        let (coordinator, worker) = (Registry::new(Role::Coordinator), Registry::new(Role::Worker));
        worker.inc(TASKS_EXECUTED, &[("node_type", "in-process-type")], 2);
        coordinator.set(BUILD_INFO, &[("version", "x"), ("role", "coordinator")], 1.0);
        worker.set(BUILD_INFO, &[("version", "x"), ("role", "worker")], 1.0);
        let text = coordinator.render_with(&worker);
        assert!(text.contains("role=\"coordinator\"") && text.contains("role=\"worker\""), "{text}");
        assert!(text.contains("composer_tasks_executed_total{node_type=\"in-process-type\"} 2"), "{text}");
        for m in ALL {
            let help = format!("# HELP {} ", m.name);
            assert!(text.matches(&help).count() <= 1, "{} described twice", m.name);
        }
    }

    #[test]
    fn every_metric_is_described_once_under_a_composer_name() {
        let (coordinator, worker) = (COORDINATOR.render(), WORKER.render());
        for m in ALL {
            assert!(m.name.starts_with("composer_"), "{}", m.name);
            let help = format!("# HELP {} ", m.name);
            let (c, w) = (coordinator.matches(&help).count(), worker.matches(&help).count());
            assert!(c <= 1 && w <= 1 && c + w >= 1, "{}: {c} and {w}", m.name);
            let suffix_ok = match m.kind {
                Kind::Counter => m.name.ends_with("_total"),
                Kind::Histogram => m.name.ends_with("_seconds"),
                Kind::Gauge => !m.name.ends_with("_total"),
            };
            assert!(suffix_ok, "{} does not follow the naming convention of a {:?}", m.name, m.kind);
        }
    }
}
