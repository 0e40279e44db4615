//! Process-wide metrics in the Prometheus text format, all named
//! `composer_*`. Counters, gauges and histograms are keyed by name and label
//! values; [`render`] writes them with their help text. A mutex-guarded map
//! is plenty at our rates (thousands of updates per second) and keeps this
//! crate free of dependencies.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::Mutex;
use std::time::Duration;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Counter,
    Gauge,
    Histogram,
}

/// Every metric we export, with its type and help text.
const DESCRIPTORS: &[(&str, Kind, &str)] = &[
    (
        "composer_events_total",
        Kind::Counter,
        "Events handled by the engine, by event and result (applied or the reason it was ignored).",
    ),
    (
        "composer_event_duration_seconds",
        Kind::Histogram,
        "Time to handle one event: lock, state machine, write, commit.",
    ),
    ("composer_report_duration_seconds", Kind::Histogram, "Time a coordinator spends on one worker report."),
    ("composer_runs_started_total", Kind::Counter, "Runs started."),
    ("composer_runs_finished_total", Kind::Counter, "Runs that reached a terminal status, by status."),
    ("composer_dispatches_total", Kind::Counter, "Outbox rows published to Redis streams."),
    (
        "composer_outbox_publish_failures_total",
        Kind::Counter,
        "Outbox batches that failed to publish (rows went to RETRY).",
    ),
    (
        "composer_recoveries_total",
        Kind::Counter,
        "Tasks re-dispatched by the recovery sweeps, by kind (expired_lease, lost_dispatch).",
    ),
    ("composer_timers_fired_total", Kind::Counter, "Timers fired (WAIT nodes and retry backoffs)."),
    ("composer_partitions_created_total", Kind::Counter, "Monthly partitions created."),
    ("composer_partitions_dropped_total", Kind::Counter, "Months of runs dropped past retention."),
    ("composer_lease_takeovers_total", Kind::Counter, "Leases taken over from a worker whose lease had expired."),
    ("composer_leases_lost_total", Kind::Counter, "Executions cancelled because their lease was lost."),
    ("composer_tasks_executed_total", Kind::Counter, "Task executions started by workers, by node type."),
    ("composer_max_deliveries_exceeded_total", Kind::Counter, "Messages failed after too many deliveries."),
    ("composer_reclaimed_messages_total", Kind::Counter, "Stream messages reclaimed from stalled consumers."),
    ("composer_outbox_backlog", Kind::Gauge, "Outbox rows not yet published (sampled)."),
    ("composer_outbox_oldest_age_seconds", Kind::Gauge, "Age of the oldest outbox row (sampled)."),
    ("composer_open_tasks", Kind::Gauge, "Tasks in an open state, by state (sampled)."),
    ("composer_running_runs", Kind::Gauge, "Runs that are RUNNING (sampled)."),
    ("composer_due_timers", Kind::Gauge, "WAITING tasks whose wake-up time has passed (sampled)."),
];

/// Upper bounds of histogram buckets, in seconds.
const BUCKETS: [f64; 14] = [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0];

type Labels = Vec<(&'static str, String)>;

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
}

static REGISTRY: Mutex<Registry> = Mutex::new(Registry { values: BTreeMap::new(), histograms: BTreeMap::new() });

fn labels(l: &[(&'static str, &str)]) -> Labels {
    l.iter().map(|(k, v)| (*k, v.to_string())).collect()
}

/// Adds `by` to a counter.
pub fn inc(name: &'static str, l: &[(&'static str, &str)], by: u64) {
    if let Ok(mut r) = REGISTRY.lock() {
        *r.values.entry((name, labels(l))).or_insert(0.0) += by as f64;
    }
}

/// Sets a gauge.
pub fn set(name: &'static str, l: &[(&'static str, &str)], value: f64) {
    if let Ok(mut r) = REGISTRY.lock() {
        r.values.insert((name, labels(l)), value);
    }
}

/// Records one observation of a duration.
pub fn observe(name: &'static str, l: &[(&'static str, &str)], d: Duration) {
    let secs = d.as_secs_f64();
    if let Ok(mut r) = REGISTRY.lock() {
        let h = r.histograms.entry((name, labels(l))).or_default();
        for (i, bound) in BUCKETS.iter().enumerate() {
            if secs <= *bound {
                h.counts[i] += 1;
            }
        }
        h.count += 1;
        h.sum += secs;
    }
}

/// The current value of a counter or gauge (for tests).
pub fn value(name: &'static str, l: &[(&'static str, &str)]) -> f64 {
    REGISTRY.lock().map(|r| r.values.get(&(name, labels(l))).copied().unwrap_or(0.0)).unwrap_or(0.0)
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
    for (name, kind, help) in DESCRIPTORS {
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
    fn renders_counters_gauges_and_histograms() {
        inc("composer_events_total", &[("event", "TaskCompleted"), ("result", "applied")], 2);
        set("composer_outbox_backlog", &[], 7.0);
        observe("composer_event_duration_seconds", &[], Duration::from_millis(3));
        let text = render();
        assert!(text.contains("composer_events_total{event=\"TaskCompleted\",result=\"applied\"} 2"), "{text}");
        assert!(text.contains("composer_outbox_backlog 7"), "{text}");
        assert!(text.contains("composer_event_duration_seconds_bucket{le=\"0.005\"} 1"), "{text}");
        assert!(text.contains("composer_event_duration_seconds_bucket{le=\"0.001\"} 0"), "{text}");
        assert!(text.contains("# TYPE composer_event_duration_seconds histogram"));
    }
}
