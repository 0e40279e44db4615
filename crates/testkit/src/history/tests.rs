//! Each property holds on a good history and names the counterexample on a
//! history planted with its violation.

use super::*;

fn start(workflow: &str, key: Option<&str>, id: &str, sent: Instant) -> Op {
    Op::Start {
        workflow: workflow.into(),
        key: key.map(str::to_string),
        sent,
        answered: sent,
        answer: Answer::Started(id.into()),
    }
}

fn run(id: &str, workflow: &str, status: &str, key: Option<&str>) -> RunRow {
    RunRow { id: id.into(), workflow: workflow.into(), status: status.into(), idempotency_key: key.map(str::to_string) }
}

fn event(run: &str, seq: i64, kind: HistoryKind, task: &str, attempt: i64) -> EventRow {
    EventRow {
        run: run.into(),
        seq,
        kind: kind.as_str().into(),
        task: Some(task.into()),
        node: Some("a".into()),
        attempt: Some(attempt),
    }
}

/// A run that was started, dispatched twice (a retry) and succeeded.
fn good() -> History {
    let t0 = Instant::now();
    let mut h = History { timer_tolerance: Duration::from_millis(100), ..History::default() };
    h.promises.insert(
        "w".into(),
        Promise { ends: Some("SUCCEEDED"), at_most_once: vec!["a"], after_wait: Some(("a", Duration::from_secs(2))) },
    );
    h.ops.push(start("w", Some("k1"), "r1", t0));
    h.runs.push(run("r1", "w", "SUCCEEDED", Some("k1")));
    h.events.extend([
        event("r1", 1, HistoryKind::TaskDispatched, "t1", 1),
        event("r1", 2, HistoryKind::TaskRetryScheduled, "t1", 1),
        event("r1", 3, HistoryKind::TaskDispatched, "t1", 2),
        event("r1", 4, HistoryKind::TaskCompleted, "t1", 2),
    ]);
    h.calls.push(Call { run: "r1".into(), node: "a".into(), at: t0 + Duration::from_secs(2) });
    h
}

fn only(h: &History, property: &str) -> Vec<String> {
    let v = h.check();
    assert!(v.iter().all(|v| v.property == property), "other properties broke too: {v:?}");
    v.iter().map(|v| v.example.clone()).collect()
}

#[test]
fn a_good_history_holds_every_property() {
    assert_eq!(good().check(), Vec::new());
}

#[test]
fn an_acknowledged_start_missing_or_open_or_ending_wrong_is_named() {
    let mut h = good();
    h.runs.clear();
    assert_eq!(only(&h, ACKNOWLEDGED_STARTS_END), ["run r1 of w was acknowledged and is not in the database"]);
    h.runs.push(run("r1", "w", "RUNNING", Some("k1")));
    assert_eq!(only(&h, ACKNOWLEDGED_STARTS_END), ["run r1 of w is RUNNING"]);
    h.runs[0].status = "FAILED".into();
    assert_eq!(only(&h, ACKNOWLEDGED_STARTS_END), ["run r1 of w ended FAILED, not SUCCEEDED"]);
    // A cancelled run may end cancelled, whatever its workflow promises.
    h.runs[0].status = "CANCELLED".into();
    h.ops.push(Op::Cancel { run: "r1".into(), acknowledged: None });
    assert_eq!(h.check(), Vec::new(), "a cancel sent and not answered may have been applied");
}

#[test]
fn a_start_that_was_not_acknowledged_may_be_lost() {
    let mut h = good();
    h.runs.clear();
    h.calls.clear();
    h.events.clear();
    if let Op::Start { answer, .. } = &mut h.ops[0] {
        *answer = Answer::NotAcknowledged("timed out".into());
    }
    assert_eq!(h.check(), Vec::new());
}

#[test]
fn a_result_applied_twice_is_named_with_both_rows() {
    let mut h = good();
    h.events.push(event("r1", 5, HistoryKind::TaskCompleted, "t1", 2));
    assert_eq!(
        only(&h, NO_RESULT_TWICE),
        ["task t1 attempt 2 of run r1: TaskCompleted (seq 4), TaskCompleted (seq 5)"]
    );
}

#[test]
fn a_result_of_an_older_attempt_is_named() {
    let mut h = good();
    h.events[3].attempt = Some(1);
    let v = h.check();
    assert!(v.iter().any(|v| v.property == CURRENT_ATTEMPT_ONLY && v.example.contains("attempt 1 applied (seq 4)")));
}

#[test]
fn an_at_most_once_step_sent_twice_is_named() {
    let mut h = good();
    let again = h.calls[0].clone();
    h.calls.push(again);
    assert_eq!(only(&h, AT_MOST_ONCE), ["step a of run r1 was sent 2 times"]);
}

#[test]
fn two_runs_for_one_key_are_named_from_the_answers_and_from_the_database() {
    let mut h = good();
    let t = Instant::now();
    h.ops.push(start("w", Some("k1"), "r2", t + Duration::from_secs(9)));
    h.runs.push(run("r2", "w", "SUCCEEDED", Some("k1")));
    let v = only(&h, ONE_RUN_PER_KEY);
    assert_eq!(v.len(), 2, "{v:?}");
    assert!(v[0].contains("answered with runs") && v[1].contains("in the database"), "{v:?}");
}

#[test]
fn a_dispatch_after_a_cancel_is_named() {
    let mut h = good();
    h.ops.push(Op::Cancel { run: "r1".into(), acknowledged: Some(Instant::now()) });
    h.runs[0].status = "CANCELLED".into();
    h.events.insert(2, EventRow { kind: HistoryKind::RunCancelled.as_str().into(), seq: 2, ..h.events[1].clone() });
    h.events[1].seq = 1;
    for (i, e) in h.events.iter_mut().enumerate() {
        e.seq = i as i64 + 1;
    }
    assert_eq!(only(&h, NOTHING_AFTER_CANCEL), ["run r1: step a dispatched (seq 4) after its cancel (seq 3)"]);
}

#[test]
fn a_timer_that_fired_early_is_named_and_the_tolerance_counts() {
    let mut h = good();
    h.calls[0].at -= Duration::from_millis(500);
    let v = only(&h, TIMERS_NOT_EARLY);
    assert!(v[0].starts_with("run r1: step a after a 2s WAIT ran 1.5"), "{v:?}");
    h.timer_tolerance = Duration::from_millis(600);
    assert_eq!(h.check(), Vec::new());
}

#[test]
fn a_schedule_fire_time_started_twice_or_skipped_is_named() {
    let mut h = History::default();
    for (id, t) in [("a", "2026-12-05T21:58:20Z"), ("b", "2026-12-05T21:58:21Z"), ("c", "2026-12-05T21:58:21Z")] {
        h.runs.push(run(id, "s", "SUCCEEDED", Some(&format!("schedule:S1:{t}"))));
    }
    // Two runs of one fire time are two runs of one idempotency key, too.
    let v: Vec<String> =
        h.check().into_iter().filter(|v| v.property == SCHEDULE_FIRES_ONCE).map(|v| v.example).collect();
    assert_eq!(v, ["schedule S1 started 2 runs for 2026-12-05T21:58:21Z"]);
    h.runs.truncate(2);
    h.runs.push(run("d", "s", "SUCCEEDED", Some("schedule:S1:2026-12-05T21:58:24Z")));
    let v = only(&h, SCHEDULE_FIRES_ONCE);
    assert_eq!(v.len(), 1);
    assert!(v[0].starts_with("schedule S1 missed 2 fire time(s)"), "{v:?}");
}

#[test]
fn fire_times_read_as_unix_seconds() {
    assert_eq!(parse_rfc3339_secs("1970-01-01T00:00:00Z"), Some(0));
    assert_eq!(parse_rfc3339_secs("2000-03-01T00:00:01Z"), Some(951_868_801));
    assert_eq!(parse_rfc3339_secs("2026-12-05T21:58:20Z"), Some(1_796_507_900));
    assert_eq!(parse_rfc3339_secs("not a time"), None);
}

#[test]
fn a_run_acknowledged_twice_for_one_key_is_one_run() {
    let mut h = good();
    let again = h.ops[0].clone();
    h.ops.push(again);
    h.runs.clear();
    assert_eq!(only(&h, ACKNOWLEDGED_STARTS_END), ["run r1 of w was acknowledged and is not in the database"]);
}
