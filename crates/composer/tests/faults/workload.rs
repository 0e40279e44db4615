//! What runs while the faults are injected, and the history it leaves:
//! HTTP chains, a WAIT before a step, an `at_most_once` step, slow chains
//! some of which are cancelled, a per-second schedule; every start carries
//! an idempotency key and some are sent twice, to two coordinators. Each
//! operation is recorded with its answer, each call at the target with its
//! time, and at the end the database's runs and history rows, for the
//! checker (`composer_testkit::history`).

use std::time::{Duration, Instant};

use composer_testkit::history::{self, Answer, Call, History, Op, Promise, Violation};
use futures_util::future::join_all;
use serde_json::{json, Value};

use crate::cluster::{http_step, Cluster};

/// How long the WAIT of the `timer` workflow waits.
pub const WAIT: Duration = Duration::from_secs(2);
/// How early a timer may fire on a coordinator working on PostgreSQL's clock:
/// half a round trip of the measurement, and the timer loop's slack.
pub const TIMER_TOLERANCE: Duration = Duration::from_millis(250);
const SCHEDULE: &str = "every-second";

/// The workflows, with what each promises.
fn definitions(c: &Cluster) -> Vec<(Value, Promise)> {
    let chain = json!({"name": "chain",
        "nodes": [http_step(c, "a", "ok"), http_step(c, "b", "ok"), http_step(c, "c", "ok")],
        "edges": [{"from": "a", "to": "b"}, {"from": "b", "to": "c"}]});
    let timer = json!({"name": "timer",
        "nodes": [{"id": "pause", "type": "WAIT", "config": {"duration": "2s"}}, http_step(c, "a", "ok")],
        "edges": [{"from": "pause", "to": "a"}]});
    let mut once_step = http_step(c, "a", "slow/300");
    once_step["delivery"] = json!("at_most_once");
    let once = json!({"name": "once", "nodes": [once_step]});
    let slow = json!({"name": "slow",
        "nodes": [http_step(c, "a", "slow/400"), http_step(c, "b", "slow/400"), http_step(c, "c", "slow/400")],
        "edges": [{"from": "a", "to": "b"}, {"from": "b", "to": "c"}]});
    let tick =
        json!({"name": "tick", "nodes": [{"id": "t", "type": "TRANSFORM", "config": {"output": {"tick": true}}}]});
    let ends = |s| Promise { ends: Some(s), ..Promise::default() };
    vec![
        (chain, ends("SUCCEEDED")),
        (timer, Promise { ends: Some("SUCCEEDED"), after_wait: Some(("a", WAIT)), ..Promise::default() }),
        // An attempt lost to a fault goes IN_DOUBT and is resolved as failed.
        (once, Promise { at_most_once: vec!["a"], ..Promise::default() }),
        (slow, ends("SUCCEEDED")),
        (tick, ends("SUCCEEDED")),
    ]
}

/// xorshift64, from a seed the scenario prints.
pub struct Rng(pub u64);

impl Rng {
    pub fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n.max(1)
    }
}

/// The client side of a scenario: what it did, and the history it builds.
pub struct Workload {
    pub history: History,
    rng: Rng,
    next: usize,
    /// Slow runs acknowledged and not yet cancelled.
    slow: Vec<String>,
}

impl Workload {
    /// Registers the workflows and the schedule.
    pub async fn prepare(c: &Cluster, seed: u64) -> Workload {
        let mut history = History { timer_tolerance: TIMER_TOLERANCE, ..History::default() };
        for (spec, promise) in definitions(c) {
            c.register(&spec).await;
            history.promises.insert(spec["name"].as_str().unwrap_or_default().to_string(), promise);
        }
        let schedule = json!({"id": SCHEDULE, "workflow": "tick", "cron": "* * * * * *",
                              "catchup_window": "5m", "overlap": "allow"});
        let deadline = Instant::now() + Duration::from_secs(30);
        let (status, body) =
            c.send(reqwest::Method::POST, "/v1/schedules", Some(&schedule), deadline).await.expect("a schedule");
        assert!(status == 200 || status == 201, "creating the schedule: {status} {body}");
        Workload { history, rng: Rng(seed.max(1)), next: 0, slow: Vec::new() }
    }

    /// Starts `n` runs at once, each from the next coordinator on; a fifth
    /// of them are sent twice, to two coordinators, with one key.
    pub async fn start(&mut self, c: &Cluster, n: usize) {
        const KINDS: [&str; 4] = ["chain", "timer", "once", "slow"];
        let mut starts = Vec::new();
        for _ in 0..n {
            let kind = KINDS[self.rng.below(KINDS.len() as u64) as usize];
            let key = format!("k-{}", self.next);
            let copies = if self.rng.below(5) == 0 { 2 } else { 1 };
            for copy in 0..copies {
                starts.push((kind, key.clone(), self.next + copy));
            }
            self.next += 1;
        }
        let ops = join_all(starts.into_iter().map(|(kind, key, first)| start_one(c, kind, key, first))).await;
        for op in ops {
            if let Op::Start { workflow, answer: Answer::Started(id), .. } = &op {
                if workflow == "slow" {
                    self.slow.push(id.clone());
                }
            }
            self.history.ops.push(op);
        }
    }

    /// Cancels half of the slow runs started so far. A cancel whose answer
    /// was lost (a timeout) is recorded too: it may have been applied.
    pub async fn cancel_some(&mut self, c: &Cluster) {
        let deadline = Instant::now() + Duration::from_secs(20);
        let victims: Vec<String> = self.slow.drain(..).step_by(2).collect();
        for id in victims {
            let path = format!("/v1/runs/{id}/cancel");
            let answered = c.send(reqwest::Method::POST, &path, Some(&json!({"reason": "faults"})), deadline).await;
            let acknowledged = matches!(answered, Ok((200, _))).then(Instant::now);
            self.history.ops.push(Op::Cancel { run: id, acknowledged });
        }
    }

    /// Waits until every acknowledged run has ended (resolving IN_DOUBT
    /// steps as an operator would), pauses the schedule, and reads what the
    /// target and the database recorded.
    pub async fn finish(&mut self, c: &Cluster, within: Duration) {
        let deadline = Instant::now() + within;
        let pause = c.send(reqwest::Method::POST, &format!("/v1/schedules/{SCHEDULE}/pause"), None, deadline).await;
        assert!(matches!(pause, Ok((200, _))), "pausing the schedule: {pause:?}");
        let acknowledged: Vec<String> =
            self.history.acknowledged_runs().into_iter().map(|(id, _)| id.to_string()).collect();
        let db = c.db().await;
        loop {
            let open = db
                .query(
                    "SELECT count(*) FROM workflow_runs WHERE id::text = ANY($1) AND status IN ('RUNNING', 'QUEUED')",
                    &[&acknowledged],
                )
                .await
                .expect("open runs")[0]
                .get::<_, i64>(0);
            if open == 0 || Instant::now() >= deadline {
                break;
            }
            resolve_in_doubt(c, &db, deadline).await;
            // Waiting for the runs still open to end.
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        for r in c.sink.all() {
            let parts: Vec<&str> = r.path.rsplitn(3, '/').collect();
            if let [node, run, _] = parts.as_slice() {
                self.history.calls.push(Call { run: run.to_string(), node: node.to_string(), at: r.at });
            }
        }
        history::read_database(&db, &mut self.history).await.expect("reading the history");
    }

    /// Runs whose start was acknowledged (a start sent twice with one key is one run).
    pub fn acknowledged(&self) -> usize {
        self.history.acknowledged_runs().len()
    }
}

async fn start_one(c: &Cluster, workflow: &str, key: String, first: usize) -> Op {
    let body = json!({"workflow": workflow, "input": {"key": key}, "idempotency_key": key});
    let sent = Instant::now();
    let mut i = first;
    let deadline = sent + Duration::from_secs(30);
    let answer = loop {
        let last = match c.call(i, reqwest::Method::POST, "/v1/runs", Some(&body)).await {
            Ok((200 | 201, run)) => break Answer::Started(run["id"].as_str().unwrap_or_default().to_string()),
            Ok((status, v)) => format!("{status} {v}"),
            Err(e) => e,
        };
        i += 1;
        if Instant::now() >= deadline {
            break Answer::NotAcknowledged(last);
        }
        // The pace of a client's retries.
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    Op::Start { workflow: workflow.to_string(), key: Some(key), sent, answered: Instant::now(), answer }
}

/// Resolves every IN_DOUBT step as failed, as an operator who checked the
/// target would.
async fn resolve_in_doubt(c: &Cluster, db: &tokio_postgres::Client, deadline: Instant) {
    let rows = db
        .query("SELECT run_id::text, node_id FROM task_instances WHERE state = 'IN_DOUBT'", &[])
        .await
        .expect("IN_DOUBT steps");
    for r in rows {
        let (run, node): (String, String) = (r.get(0), r.get(1));
        let body = json!({"outcome": "failed", "error": "lost to a fault", "reason": "faults harness"});
        let _ =
            c.send(reqwest::Method::POST, &format!("/v1/runs/{run}/tasks/{node}/resolve"), Some(&body), deadline).await;
    }
}

/// One scenario's line: runs, faults, properties, violations (printed in full).
pub fn report(scenario: &str, w: &Workload, faults: &str, violations: &[Violation]) {
    let schedule_runs = w.history.runs.iter().filter(|r| r.workflow == "tick").count();
    eprintln!(
        "faults: {scenario}: {} runs acknowledged ({} ops, {} schedule runs, {} calls at the target); faults: {faults}; \
         {} properties checked; violations: {}",
        w.acknowledged(),
        w.history.ops.len(),
        schedule_runs,
        w.history.calls.len(),
        History::PROPERTIES,
        violations.len()
    );
    for v in violations {
        eprintln!("  violation: {v}");
    }
}
