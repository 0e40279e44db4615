//! The history checker: what clients asked and were answered, what the
//! targets received and what the database recorded, checked after a fault
//! scenario (or the chaos soak) against the properties Composer promises.
//! Each property is a function of the history alone; a broken one returns
//! the counterexample, printed by [`Violation`]'s `Display`.
//!
//! The properties:
//! - every acknowledged start ends, in the status its workflow must end in;
//! - no step result is applied twice (one result event per task and attempt);
//! - only the current attempt's result is applied (a result is applied for
//!   the attempt last dispatched, never for an older one);
//! - an `at_most_once` step's target is called at most once;
//! - an idempotency key never yields two runs;
//! - a cancelled run dispatches nothing after its cancel;
//! - a timer never fires early by more than the stated tolerance;
//! - a schedule starts one run per fire time, and misses none in between.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;
use std::time::{Duration, Instant};

use composer_core::machine::{HistoryKind, RunStatus};
use serde_json::Value;

/// What a client's start was answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// 200/201 with this run id: acknowledged.
    Started(String),
    /// Refused, or no coordinator answered in time: not acknowledged.
    NotAcknowledged(String),
}

/// One operation a client made, with when it was sent and answered.
#[derive(Debug, Clone)]
pub enum Op {
    Start {
        workflow: String,
        key: Option<String>,
        sent: Instant,
        answered: Instant,
        answer: Answer,
    },
    /// A cancel sent, and when the API acknowledged it (`None`: no answer
    /// came, and it may or may not have been applied).
    Cancel {
        run: String,
        acknowledged: Option<Instant>,
    },
}

/// A call a target received for step `node` of `run`.
#[derive(Debug, Clone)]
pub struct Call {
    pub run: String,
    pub node: String,
    pub at: Instant,
}

/// A run as the database has it at the end.
#[derive(Debug, Clone)]
pub struct RunRow {
    pub id: String,
    pub workflow: String,
    pub status: String,
    pub idempotency_key: Option<String>,
}

/// One history row of a run: its kind and, for a task's, which task and attempt.
#[derive(Debug, Clone)]
pub struct EventRow {
    pub run: String,
    pub seq: i64,
    pub kind: String,
    pub task: Option<String>,
    pub node: Option<String>,
    pub attempt: Option<i64>,
}

/// What a workflow promises, for the checks that depend on it.
#[derive(Debug, Clone, Default)]
pub struct Promise {
    /// The status a run must end in (`None`: any end).
    pub ends: Option<&'static str>,
    /// Steps that must not be sent twice.
    pub at_most_once: Vec<&'static str>,
    /// A step that runs after a WAIT of this long from the run's start.
    pub after_wait: Option<(&'static str, Duration)>,
}

/// Everything recorded in one scenario.
#[derive(Debug, Default)]
pub struct History {
    pub ops: Vec<Op>,
    pub calls: Vec<Call>,
    pub runs: Vec<RunRow>,
    pub events: Vec<EventRow>,
    /// By workflow name.
    pub promises: HashMap<String, Promise>,
    /// How early a timer may fire: the clock skew the scenario allows.
    pub timer_tolerance: Duration,
}

/// A property that did not hold, with the counterexample.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    pub property: &'static str,
    pub example: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.property, self.example)
    }
}

pub const ACKNOWLEDGED_STARTS_END: &str = "every acknowledged start ends as its workflow says";
pub const NO_RESULT_TWICE: &str = "no step result is applied twice";
pub const CURRENT_ATTEMPT_ONLY: &str = "only the current attempt's result is applied";
pub const AT_MOST_ONCE: &str = "an at_most_once step is sent at most once";
pub const ONE_RUN_PER_KEY: &str = "an idempotency key never yields two runs";
pub const NOTHING_AFTER_CANCEL: &str = "a cancelled run dispatches nothing after its cancel";
pub const TIMERS_NOT_EARLY: &str = "a timer never fires early by more than the tolerance";
pub const SCHEDULE_FIRES_ONCE: &str = "a schedule starts one run per fire time, missing none";

/// The history rows that apply a step's result.
const RESULTS: [HistoryKind; 3] =
    [HistoryKind::TaskCompleted, HistoryKind::TaskFailed, HistoryKind::TaskRetryScheduled];

fn is_result(kind: &str) -> bool {
    RESULTS.iter().any(|k| k.as_str() == kind)
}

impl History {
    /// Every property's violations (empty: all held).
    pub fn check(&self) -> Vec<Violation> {
        let mut v = self.acknowledged_starts_end();
        v.extend(self.no_result_twice());
        v.extend(self.current_attempt_only());
        v.extend(self.at_most_once());
        v.extend(self.one_run_per_key());
        v.extend(self.nothing_after_cancel());
        v.extend(self.timers_not_early());
        v.extend(self.schedules_fire_once());
        v
    }

    /// How many properties [`History::check`] checks, for a report.
    pub const PROPERTIES: usize = 8;

    /// The runs whose start was acknowledged, each once (a start sent twice
    /// with one key is one run), with their workflow, in the order answered.
    pub fn acknowledged_runs(&self) -> Vec<(&str, &str)> {
        let mut seen = HashSet::new();
        self.ops
            .iter()
            .filter_map(|o| match o {
                Op::Start { workflow, answer: Answer::Started(id), .. } => Some((id.as_str(), workflow.as_str())),
                _ => None,
            })
            .filter(|(id, _)| seen.insert(*id))
            .collect()
    }

    fn run(&self, id: &str) -> Option<&RunRow> {
        self.runs.iter().find(|r| r.id == id)
    }

    fn cancelled(&self) -> HashSet<&str> {
        self.ops.iter().filter_map(|o| if let Op::Cancel { run, .. } = o { Some(run.as_str()) } else { None }).collect()
    }

    pub fn acknowledged_starts_end(&self) -> Vec<Violation> {
        let cancelled = self.cancelled();
        let mut out = Vec::new();
        for (id, workflow) in self.acknowledged_runs() {
            let example = match self.run(id) {
                None => format!("run {id} of {workflow} was acknowledged and is not in the database"),
                Some(r) if !RunStatus::parse(&r.status).is_some_and(RunStatus::is_terminal) => {
                    format!("run {id} of {workflow} is {}", r.status)
                }
                Some(r) => {
                    let wanted =
                        if cancelled.contains(id) { None } else { self.promises.get(workflow).and_then(|p| p.ends) };
                    match wanted {
                        Some(w) if w != r.status => format!("run {id} of {workflow} ended {}, not {w}", r.status),
                        _ => continue,
                    }
                }
            };
            out.push(Violation { property: ACKNOWLEDGED_STARTS_END, example });
        }
        out
    }

    pub fn no_result_twice(&self) -> Vec<Violation> {
        let mut seen: HashMap<(&str, i64), Vec<&EventRow>> = HashMap::new();
        for e in self.events.iter().filter(|e| is_result(&e.kind)) {
            if let (Some(task), Some(attempt)) = (&e.task, e.attempt) {
                seen.entry((task.as_str(), attempt)).or_default().push(e);
            }
        }
        let mut out: Vec<Violation> = seen
            .into_iter()
            .filter(|(_, es)| es.len() > 1)
            .map(|((task, attempt), es)| Violation {
                property: NO_RESULT_TWICE,
                example: format!(
                    "task {task} attempt {attempt} of run {}: {}",
                    es[0].run,
                    es.iter().map(|e| format!("{} (seq {})", e.kind, e.seq)).collect::<Vec<_>>().join(", ")
                ),
            })
            .collect();
        out.sort_by(|a, b| a.example.cmp(&b.example));
        out
    }

    pub fn current_attempt_only(&self) -> Vec<Violation> {
        let mut dispatched: HashMap<&str, i64> = HashMap::new();
        let mut out = Vec::new();
        for e in self.by_seq() {
            let (Some(task), Some(attempt)) = (&e.task, e.attempt) else { continue };
            if e.kind == HistoryKind::TaskDispatched.as_str() {
                dispatched.insert(task, attempt);
            } else if is_result(&e.kind) {
                if let Some(&current) = dispatched.get(task.as_str()) {
                    if current != attempt {
                        out.push(Violation {
                            property: CURRENT_ATTEMPT_ONLY,
                            example: format!(
                                "run {} task {task}: {} of attempt {attempt} applied (seq {}) while attempt {current} was the one dispatched",
                                e.run, e.kind, e.seq
                            ),
                        });
                    }
                }
            }
        }
        out
    }

    pub fn at_most_once(&self) -> Vec<Violation> {
        let workflow: HashMap<&str, &str> = self.runs.iter().map(|r| (r.id.as_str(), r.workflow.as_str())).collect();
        let mut counts: BTreeMap<(&str, &str), usize> = BTreeMap::new();
        for c in &self.calls {
            let once = workflow
                .get(c.run.as_str())
                .and_then(|w| self.promises.get(*w))
                .is_some_and(|p| p.at_most_once.contains(&c.node.as_str()));
            if once {
                *counts.entry((c.run.as_str(), c.node.as_str())).or_default() += 1;
            }
        }
        counts
            .into_iter()
            .filter(|(_, n)| *n > 1)
            .map(|((run, node), n)| Violation {
                property: AT_MOST_ONCE,
                example: format!("step {node} of run {run} was sent {n} times"),
            })
            .collect()
    }

    pub fn one_run_per_key(&self) -> Vec<Violation> {
        let mut out = Vec::new();
        let mut answered: BTreeMap<(&str, &str), HashSet<&str>> = BTreeMap::new();
        for op in &self.ops {
            if let Op::Start { workflow, key: Some(key), answer: Answer::Started(id), .. } = op {
                answered.entry((workflow.as_str(), key.as_str())).or_default().insert(id.as_str());
            }
        }
        let mut stored: BTreeMap<(&str, &str), Vec<&str>> = BTreeMap::new();
        for r in &self.runs {
            if let Some(key) = &r.idempotency_key {
                stored.entry((r.workflow.as_str(), key.as_str())).or_default().push(r.id.as_str());
            }
        }
        for ((workflow, key), ids) in answered.iter().filter(|(_, ids)| ids.len() > 1) {
            let mut ids: Vec<_> = ids.iter().collect();
            ids.sort();
            out.push(Violation {
                property: ONE_RUN_PER_KEY,
                example: format!("key {key} of {workflow} was answered with runs {ids:?}"),
            });
        }
        for ((workflow, key), ids) in stored.iter().filter(|(_, ids)| ids.len() > 1) {
            out.push(Violation {
                property: ONE_RUN_PER_KEY,
                example: format!("key {key} of {workflow} has runs {ids:?} in the database"),
            });
        }
        out
    }

    pub fn nothing_after_cancel(&self) -> Vec<Violation> {
        let cancelled = self.cancelled();
        let mut at: HashMap<&str, i64> = HashMap::new();
        let mut out = Vec::new();
        for e in self.by_seq().into_iter().filter(|e| cancelled.contains(e.run.as_str())) {
            if e.kind == HistoryKind::RunCancelled.as_str() {
                at.entry(e.run.as_str()).or_insert(e.seq);
            } else if e.kind == HistoryKind::TaskDispatched.as_str() {
                if let Some(cancel) = at.get(e.run.as_str()) {
                    out.push(Violation {
                        property: NOTHING_AFTER_CANCEL,
                        example: format!(
                            "run {}: step {} dispatched (seq {}) after its cancel (seq {cancel})",
                            e.run,
                            e.node.as_deref().unwrap_or("?"),
                            e.seq
                        ),
                    });
                }
            }
        }
        out
    }

    pub fn timers_not_early(&self) -> Vec<Violation> {
        let mut sent: HashMap<&str, (&str, Instant)> = HashMap::new();
        for op in &self.ops {
            if let Op::Start { workflow, sent: at, answer: Answer::Started(id), .. } = op {
                sent.entry(id.as_str()).or_insert((workflow.as_str(), *at));
            }
        }
        let mut first: HashMap<(&str, &str), Instant> = HashMap::new();
        for c in &self.calls {
            let e = first.entry((c.run.as_str(), c.node.as_str())).or_insert(c.at);
            *e = (*e).min(c.at);
        }
        let mut out = Vec::new();
        for ((run, node), at) in first {
            let Some((workflow, started)) = sent.get(run) else { continue };
            let Some((after, wait)) = self.promises.get(*workflow).and_then(|p| p.after_wait) else { continue };
            // The timer began after the start was sent: the step may not run sooner than the wait.
            if node == after && at.duration_since(*started) + self.timer_tolerance < wait {
                out.push(Violation {
                    property: TIMERS_NOT_EARLY,
                    example: format!(
                        "run {run}: step {node} after a {wait:?} WAIT ran {:?} after the start was sent (tolerance {:?})",
                        at.duration_since(*started),
                        self.timer_tolerance
                    ),
                });
            }
        }
        out
    }

    /// Schedule runs carry the key `schedule:<id>:<fire time>`: one run per
    /// key, and every second between the first and the last fire time of a
    /// per-second schedule has its run.
    pub fn schedules_fire_once(&self) -> Vec<Violation> {
        let mut fires: BTreeMap<&str, BTreeMap<&str, usize>> = BTreeMap::new();
        for r in &self.runs {
            let Some(rest) = r.idempotency_key.as_deref().and_then(|k| k.strip_prefix("schedule:")) else { continue };
            let Some((schedule, time)) = rest.split_once(':') else { continue };
            *fires.entry(schedule).or_default().entry(time).or_default() += 1;
        }
        let mut out = Vec::new();
        for (schedule, times) in fires {
            for (time, n) in times.iter().filter(|(_, n)| **n > 1) {
                out.push(Violation {
                    property: SCHEDULE_FIRES_ONCE,
                    example: format!("schedule {schedule} started {n} runs for {time}"),
                });
            }
            let secs: Vec<i64> = times.keys().filter_map(|t| parse_rfc3339_secs(t)).collect();
            for pair in secs.windows(2).filter(|w| w[1] - w[0] > 1) {
                out.push(Violation {
                    property: SCHEDULE_FIRES_ONCE,
                    example: format!(
                        "schedule {schedule} missed {} fire time(s) between unix {} and {}",
                        pair[1] - pair[0] - 1,
                        pair[0],
                        pair[1]
                    ),
                });
            }
        }
        out
    }

    fn by_seq(&self) -> Vec<&EventRow> {
        let mut es: Vec<&EventRow> = self.events.iter().collect();
        es.sort_by_key(|e| e.seq);
        es
    }
}

/// `2026-12-05T21:58:20Z` as unix seconds (the form schedule keys use).
fn parse_rfc3339_secs(t: &str) -> Option<i64> {
    let (date, time) = t.strip_suffix('Z')?.split_once('T')?;
    let d: Vec<i64> = date.split('-').map(|p| p.parse().ok()).collect::<Option<_>>()?;
    let h: Vec<i64> = time.split(':').map(|p| p.parse().ok()).collect::<Option<_>>()?;
    let (y, m, day) = (d.first()?, d.get(1)?, d.get(2)?);
    // Days from the civil date (Howard Hinnant's algorithm).
    let y = if *m <= 2 { y - 1 } else { *y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some(days * 86_400 + h.first()? * 3600 + h.get(1)? * 60 + h.get(2)?)
}

/// Reads the runs and history rows of every run in the database `client`
/// is connected to, into `history`.
pub async fn read_database(
    client: &tokio_postgres::Client,
    history: &mut History,
) -> Result<(), tokio_postgres::Error> {
    for r in client.query("SELECT id::text, workflow_name, status, idempotency_key FROM workflow_runs", &[]).await? {
        history.runs.push(RunRow { id: r.get(0), workflow: r.get(1), status: r.get(2), idempotency_key: r.get(3) });
    }
    for r in client.query("SELECT run_id::text, seq, type, payload FROM run_events ORDER BY seq", &[]).await? {
        let payload: Value = r.get(3);
        history.events.push(EventRow {
            run: r.get(0),
            seq: r.get(1),
            kind: r.get(2),
            task: payload["task_id"].as_str().map(str::to_string),
            node: payload["node_id"].as_str().map(str::to_string),
            attempt: payload["attempt"].as_i64(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests;
