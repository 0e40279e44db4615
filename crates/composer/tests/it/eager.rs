//! Eager dispatch: a worker's result that asks for `next` gets the task it
//! makes ready, leased to it in the result's own commit, with its answer —
//! no outbox row, no stream message, no lease statement of its own. A
//! worker that never runs what it was given loses it when the lease expires.

use std::time::Duration;

use composer_store::leases::LeaseManager;
use composer_testkit::{eventually, http_node, Engine, EngineOptions, FakeHttp};
use redis::AsyncCommands;
use serde_json::{json, Value};
use uuid::Uuid;

const T: Duration = Duration::from_secs(30);

fn no_workers() -> EngineOptions {
    EngineOptions { workers: 0, ..Default::default() }
}

/// Completes `task`'s first attempt for `worker`, asking for `next`.
async fn complete(e: &Engine, run: Uuid, task: Uuid, worker: &str, next: Option<Value>) -> (u16, Value) {
    let mut body = json!({"run_id": run, "attempt": 1, "worker_id": worker, "output": {"by": worker}});
    if let Some(next) = next {
        body["next"] = next;
    }
    e.post(&format!("/v1/tasks/{task}/complete"), &body).await
}

/// The task of `node`, once it exists, with its lease, as stored.
async fn stored(e: &Engine, run: Uuid, node: &str) -> (Uuid, String, Option<String>, Option<f64>) {
    eventually(T, format!("task {node} to be created"), || async {
        let c = e.db.pool().get().await.unwrap();
        let row = c
            .query_opt(
                "SELECT id, state, lease_owner, extract(epoch FROM lease_expires_at - now())::float8
                   FROM task_instances WHERE run_id = $1 AND node_id = $2",
                &[&run, &node],
            )
            .await
            .unwrap();
        row.map(|r| (r.get(0), r.get(1), r.get(2), r.get(3)))
    })
    .await
}

async fn outbox_rows_of(e: &Engine, task: Uuid) -> i64 {
    let c = e.db.pool().get().await.unwrap();
    c.query_one("SELECT count(*) FROM outbox WHERE task_id = $1", &[&task]).await.unwrap().get(0)
}

/// Messages on all of `queue`'s streams (every priority and shard).
async fn messages_on(e: &Engine, queue: &str) -> usize {
    let keys = composer_stream::Keys::new(e.prefix.clone());
    let client = redis::Client::open(e.redis_url.as_str()).unwrap();
    let mut c = client.get_multiplexed_async_connection().await.unwrap();
    let mut n = 0;
    for name in keys.streams_of([queue], e.coordinator_config().stream_shards) {
        let len: usize = c.xlen(name).await.unwrap();
        n += len;
    }
    n
}

fn chain() -> Value {
    json!({"name": "eager-chain", "nodes": [
        {"id": "a", "type": "step"}, {"id": "b", "type": "step"}, {"id": "c", "type": "other"}],
        "edges": [{"from": "a", "to": "b"}, {"from": "b", "to": "c"}]})
}

#[tokio::test]
async fn a_result_that_asks_for_next_gets_the_next_task_leased_with_its_answer_and_nothing_goes_through_a_stream() {
    let e = Engine::with(no_workers()).await;
    let run = e.run(&chain()).await;
    let (a, state, ..) = stored(&e, run, "a").await;
    assert_eq!(state, "PENDING");
    let leases = LeaseManager::new(e.db.pool());
    assert!(leases.acquire(run, a, "w1", Duration::from_secs(30), 1).await.unwrap().is_granted());

    let (status, answer) = complete(&e, run, a, "w1", Some(json!({"queues": ["step", "other"]}))).await;
    assert_eq!((status, &answer["applied"]), (200, &json!(true)), "{answer}");
    let next = answer["next"].as_array().expect("the answer carries the next task");
    let (b, state, owner, left) = stored(&e, run, "b").await;
    assert_eq!(next.len(), 1, "{answer}");
    assert_eq!(next[0]["id"], json!(b));
    assert_eq!((next[0]["node_id"].as_str(), next[0]["attempt"].as_i64()), (Some("b"), Some(1)));
    assert!(next[0]["traceparent"].is_string(), "{answer}");
    assert_eq!(next[0]["priority"], 3, "the run's priority, for the next result's header: {answer}");
    assert_eq!((state.as_str(), owner.as_deref()), ("RUNNING", Some("w1")), "leased in the result's commit");
    let left = left.unwrap();
    assert!(left > 1.0 && left <= 3.0, "leased for the coordinator's lease (the test kit's 3 s): {left}");
    assert_eq!(outbox_rows_of(&e, b).await, 0, "an eager task has no outbox row");
    let c = e.db.pool().get().await.unwrap();
    let in_order: bool = c
        .query_one(
            // a's end is the coordinator's reading of PostgreSQL's clock (its
            // offset measured over a round trip, which a loaded machine
            // stretches), b's start PostgreSQL's own: 50 ms apart at most.
            "SELECT b.started_at >= a.finished_at - interval '50 milliseconds' FROM task_instances a, task_instances b
              WHERE a.run_id = $1 AND a.node_id = 'a' AND b.run_id = $1 AND b.node_id = 'b'",
            &[&run],
        )
        .await
        .unwrap()
        .get(0);
    assert!(in_order, "b's lease is written after a's end, in the same commit");
    assert_eq!(messages_on(&e, "step").await, 1, "only a's message went through a stream");

    // The given task is the worker's like any leased one: it reports it. A
    // `next` of queues the next task is not on gets nothing.
    let (status, answer) = complete(&e, run, b, "w1", Some(json!({"queues": ["step"], "max": 4}))).await;
    assert_eq!((status, &answer["applied"]), (200, &json!(true)), "{answer}");
    assert!(answer.get("next").is_none(), "c is on queue other: {answer}");
    let (c, state, owner, _) = stored(&e, run, "c").await;
    assert_eq!((state.as_str(), owner), ("PENDING", None), "c goes through its stream");
    assert!(leases.acquire(run, c, "w2", Duration::from_secs(30), 1).await.unwrap().is_granted());
    // Without `next`, nothing is given.
    let (status, answer) = complete(&e, run, c, "w2", None).await;
    assert_eq!((status, answer.get("next")), (200, None), "{answer}");
    let done = e.wait_for_run(run, T).await;
    assert_eq!(done["status"], "SUCCEEDED", "{done}");
    assert_eq!(e.task(run, "b").await["output"]["by"], "w1");
    e.stop().await;
}

/// The failure table's row for a worker that dies, for a task it was given
/// with a result's answer: it is never on a stream, so only its lease
/// brings it back — the same attempt, run once.
#[tokio::test]
async fn a_worker_that_dies_holding_an_eagerly_given_task_loses_it_by_lease_expiry_and_it_runs_once() {
    let mut e =
        Engine::with(EngineOptions { workers: 0, lease_ttl: Duration::from_secs(1), ..Default::default() }).await;
    let http = FakeHttp::start().await;
    let spec = json!({"name": "eager-orphan",
        "nodes": [http_node("a", &http.url("/ok/a"), 1), http_node("b", &http.url("/ok/b"), 1)],
        "edges": [{"from": "a", "to": "b"}]});
    let run = e.run(&spec).await;
    let (a, ..) = stored(&e, run, "a").await;
    let leases = LeaseManager::new(e.db.pool());
    assert!(leases.acquire(run, a, "doomed", Duration::from_secs(30), 1).await.unwrap().is_granted());
    let (status, answer) = complete(&e, run, a, "doomed", Some(json!({"queues": ["http"]}))).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["next"].as_array().map(Vec::len), Some(1), "{answer}");
    // The worker dies before it starts b: nothing of b is on a stream.
    let (b, ..) = stored(&e, run, "b").await;
    e.wait_for_lease_expiry(b, T).await;
    composer_coord::loops::recover_tasks(&e.coordinators[0].shared).await;
    e.start_worker("survivor", 2).await;
    let done = e.wait_for_run(run, T).await;
    assert_eq!(done["status"], "SUCCEEDED", "{done}");
    assert_eq!(http.calls("/ok/b"), 1, "the orphaned task is executed exactly once");
    let b = done["tasks"].as_array().unwrap().iter().find(|t| t["node_id"] == "b").unwrap().clone();
    assert_eq!(b["attempt"], 1, "recovery dispatches the same attempt again");
    e.stop().await;
}

#[tokio::test]
async fn a_worker_runs_a_chain_on_one_slot_through_its_results_and_without_eager_through_the_streams() {
    let http = FakeHttp::start().await;
    let spec = |name: &str| {
        json!({"name": name, "nodes": [
            http_node("a", &http.url("/ok/a"), 1), http_node("b", &http.url("/ok/b"), 1),
            http_node("c", &http.url("/ok/c"), 1)],
            "edges": [{"from": "a", "to": "b"}, {"from": "b", "to": "c"}]})
    };
    let mut e = Engine::with(no_workers()).await;
    let stats = e.start_worker("eager", 2).await.stats.clone();
    let run = e.run(&spec("chain-eager")).await;
    assert_eq!(e.wait_for_run(run, T).await["status"], "SUCCEEDED");
    assert_eq!(stats.eager(), 2, "b and c came with the reports of a and b");
    assert_eq!(stats.executed(), 3);
    e.stop().await;

    let mut e =
        Engine::with(EngineOptions { workers: 0, worker: |c| c.options.eager = false, ..Default::default() }).await;
    let stats = e.start_worker("streams", 2).await.stats.clone();
    let run = e.run(&spec("chain-streams")).await;
    assert_eq!(e.wait_for_run(run, T).await["status"], "SUCCEEDED");
    assert_eq!((stats.eager(), stats.executed()), (0, 3), "COMPOSER_WORKER_EAGER=false");
    e.stop().await;
    assert_eq!(http.calls("/ok/c"), 2);
}

/// Starts a run of `workflow` at `priority`.
async fn start_at(e: &Engine, workflow: &str, priority: u8) -> Uuid {
    let (status, body) = e.post("/v1/runs", &json!({"workflow": workflow, "input": {}, "priority": priority})).await;
    assert!(status == 200 || status == 201 || status == 202, "{status} {body}");
    body["id"].as_str().unwrap().parse().unwrap()
}

/// A queued run a result's end lets start (a concurrency limit's freed
/// slot, handed over in the same transaction) has its first step given
/// with that result's answer when the worker asked for more: no stream.
/// Not a run less urgent than the one that reported, or than the priority
/// the worker offered for.
#[tokio::test]
async fn a_run_the_results_freed_slot_starts_gives_its_first_step_with_the_answer() {
    let e = Engine::with(EngineOptions {
        workers: 0,
        coordinator: |c| c.timer_interval = Duration::from_secs(3600),
        ..Default::default()
    })
    .await;
    e.register(&json!({"name": "eager-solo", "concurrency": {"max": 1}, "nodes": [{"id": "a", "type": "step"}]})).await;
    let first = start_at(&e, "eager-solo", 3).await;
    let second = start_at(&e, "eager-solo", 3).await;
    let (_, run) = e.get(&format!("/v1/runs/{second}")).await;
    assert_eq!(run["status"], "QUEUED", "{run}");
    let leases = LeaseManager::new(e.db.pool());
    let next = Some(json!({"queues": ["step"], "max": 4}));

    let (a1, ..) = stored(&e, first, "a").await;
    assert!(leases.acquire(first, a1, "w1", Duration::from_secs(30), 1).await.unwrap().is_granted());
    let (status, answer) = complete(&e, first, a1, "w1", next.clone()).await;
    assert_eq!((status, &answer["applied"]), (200, &json!(true)), "{answer}");
    let given = answer["next"].as_array().expect("the started run's step comes with the answer");
    let (a2, state, owner, _) = stored(&e, second, "a").await;
    assert_eq!(given.len(), 1, "{answer}");
    assert_eq!((given[0]["id"].clone(), given[0]["run_id"].clone()), (json!(a2), json!(second)), "{answer}");
    assert_eq!((state.as_str(), owner.as_deref()), ("RUNNING", Some("w1")), "leased in the result's commit");
    assert_eq!(outbox_rows_of(&e, a2).await, 0, "an eager task has no outbox row");

    // A third run, of priority 5, is not given to a report of priority 3.
    let third = start_at(&e, "eager-solo", 5).await;
    let (_, run) = e.get(&format!("/v1/runs/{third}")).await;
    assert_eq!(run["status"], "QUEUED", "{run}");
    let (status, answer) = complete(&e, second, a2, "w1", next).await;
    assert_eq!((status, &answer["applied"]), (200, &json!(true)), "{answer}");
    assert!(answer.get("next").is_none(), "a less urgent run goes through its stream: {answer}");
    let (a3, state, owner, _) = stored(&e, third, "a").await;
    assert_eq!((state.as_str(), owner), ("PENDING", None));
    // The first run's message and the third's: the second's step had none.
    eventually(T, "the third run's step to be sent", || async { (messages_on(&e, "step").await >= 2).then_some(()) })
        .await;
    assert!(leases.acquire(third, a3, "w2", Duration::from_secs(30), 1).await.unwrap().is_granted());
    let (status, _) = complete(&e, third, a3, "w2", None).await;
    assert_eq!(status, 200);
    for run in [first, second, third] {
        assert_eq!(e.wait_for_run(run, T).await["status"], "SUCCEEDED");
    }
    assert_eq!(messages_on(&e, "step").await, 2, "nothing of the second run's step was sent");

    // A report of a run lowered to 4 since its step was sent at 2 (to a
    // slot kept for urgent work, say): its offer was made for 2, so a run
    // of 4 is not given to it.
    let fourth = start_at(&e, "eager-solo", 4).await;
    let fifth = start_at(&e, "eager-solo", 4).await;
    let (a4, ..) = stored(&e, fourth, "a").await;
    assert!(leases.acquire(fourth, a4, "w3", Duration::from_secs(30), 1).await.unwrap().is_granted());
    let body = json!({"run_id": fourth, "attempt": 1, "worker_id": "w3", "output": {}, "next": {"queues": ["step"]}});
    let (status, answer) = e.post_with(&format!("/v1/tasks/{a4}/complete"), &body, &[("composer-priority", "2")]).await;
    assert_eq!((status, &answer["applied"]), (200, &json!(true)), "{answer}");
    assert!(answer.get("next").is_none(), "an offer made for priority 2 takes no run of 4: {answer}");
    let (a5, state, owner, _) = stored(&e, fifth, "a").await;
    assert_eq!((state.as_str(), owner), ("PENDING", None));
    assert!(leases.acquire(fifth, a5, "w3", Duration::from_secs(30), 1).await.unwrap().is_granted());
    let (status, _) = complete(&e, fifth, a5, "w3", None).await;
    assert_eq!(status, 200);
    assert_eq!(e.wait_for_run(fifth, T).await["status"], "SUCCEEDED");
    e.stop().await;
}

/// Polls `queues` for `worker` in the background, as a worker waiting for
/// work does, once the coordinator has it waiting.
async fn waiting_poll(e: &Engine, worker: &str, body: Value) -> tokio::task::JoinHandle<(u16, Value)> {
    let waiting = || e.coordinators[0].shared.engine.idle_polls().waiting();
    let before = waiting();
    let (url, http) = (e.url(), reqwest::Client::new());
    let mut body = body;
    body["worker_id"] = json!(worker);
    let poll = tokio::spawn(async move {
        let resp = http.post(format!("{url}/v1/tasks/poll")).json(&body).send().await.unwrap();
        (resp.status().as_u16(), resp.json::<Value>().await.unwrap())
    });
    eventually(T, "the poll to wait", || async { (waiting() > before).then_some(()) }).await;
    poll
}

/// Whether a polled task was read from a stream (its stages say when).
fn read_from_stream(task: &Value) -> bool {
    task["stages"].get("read_at_us").is_some()
}

/// A worker's poll that found nothing waits where the coordinator's batches
/// see it: a run started meanwhile has its first step leased to that worker
/// in the start's own commit and handed to the poll — no outbox row, no
/// stream message, no read and no lease statement of its own. Never more
/// than the poll asked for: the rest go through their stream.
#[tokio::test]
async fn a_poll_waiting_for_work_gets_a_started_runs_first_step_leased_in_the_starts_commit() {
    let e = Engine::with(no_workers()).await;
    e.register(&json!({"name": "idle-fan", "nodes": [
        {"id": "a", "type": "step"}, {"id": "b", "type": "step"}, {"id": "c", "type": "step"}]}))
        .await;
    // A poll leaves its wait to read the streams now and then: a start in
    // that moment goes through its stream, as it should. Of three tries,
    // one at least is handed over.
    let mut handed = 0;
    let mut held = Vec::new();
    for _ in 0..3 {
        let poll = waiting_poll(&e, "w-idle", json!({"queues": ["step"], "max": 2, "wait": "20s"})).await;
        let run = e.start_run("idle-fan", json!({})).await;
        let (status, answer) = poll.await.unwrap();
        assert_eq!(status, 200, "{answer}");
        let tasks = answer["tasks"].as_array().unwrap();
        assert_eq!(tasks.len(), 2, "as many as the poll asked for, of the run's three: {answer}");
        let through_streams = tasks.iter().filter(|t| read_from_stream(t)).count();
        assert!(through_streams == 0 || through_streams == 2, "one way for all the poll got: {answer}");
        for node in ["a", "b", "c"] {
            let (id, state, owner, _) = stored(&e, run, node).await;
            let given = tasks.iter().any(|t| t["id"] == json!(id));
            if given {
                assert_eq!((state.as_str(), owner.as_deref()), ("RUNNING", Some("w-idle")), "{node}");
                held.push((run, id, "w-idle"));
            } else {
                assert_eq!((state.as_str(), owner), ("PENDING", None), "{node}: the third waits for a poll");
            }
            if given && through_streams == 0 {
                assert_eq!(outbox_rows_of(&e, id).await, 0, "{node}: a handed-over task has no outbox row");
            }
        }
        handed += usize::from(through_streams == 0);
        // The third goes through its stream, to the next poll.
        let (status, answer) =
            e.post("/v1/tasks/poll", &json!({"worker_id": "w-rest", "queues": ["step"], "wait": "10s"})).await;
        assert_eq!(status, 200, "{answer}");
        let rest = answer["tasks"].as_array().unwrap();
        assert_eq!(rest.len(), 1, "{answer}");
        assert!(read_from_stream(&rest[0]), "{answer}");
        held.push((run, rest[0]["id"].as_str().unwrap().parse().unwrap(), "w-rest"));
    }
    assert!(handed >= 1, "no start's steps went to the waiting poll");
    assert_eq!(e.coordinators[0].shared.engine.idle_polls().waiting(), 0);
    // A worker that reads nothing is a reader of its queue all the same
    // (the queues page lists its streams' consumers).
    let streams = &e.coordinators[0].shared.streams;
    let mut readers = Vec::new();
    for shard in 0..e.coordinator_config().stream_shards {
        let name = streams.keys().stream("step", 3, shard);
        readers.extend(streams.consumers(&name).await.unwrap().into_iter().map(|(name, ..)| name));
    }
    assert!(readers.iter().any(|r| r == "api:w-idle"), "{readers:?}");

    // What was given is the worker's like any leased task: it reports it.
    for (run, task, worker) in &held {
        let (status, answer) = complete(&e, *run, *task, worker, None).await;
        assert_eq!((status, &answer["applied"]), (200, &json!(true)), "{answer}");
    }
    for run in held.iter().map(|h| h.0).collect::<std::collections::BTreeSet<_>>() {
        assert_eq!(e.wait_for_run(run, T).await["status"], "SUCCEEDED");
    }
    e.stop().await;
}

/// The starts that take a transaction of their own and commit it right
/// after — through the API with an idempotency key or of a workflow with a
/// concurrency limit, a sub-workflow's child — give their first step to a
/// waiting poll too, leased in the start's commit. An event's trigger does
/// not: its transaction may go on to wait for locks (more triggers, their
/// keys) with the poll's lease running, so its steps go through a stream.
#[tokio::test]
async fn a_start_with_a_key_a_limit_or_a_parent_gives_its_first_step_to_a_waiting_poll_a_trigger_does_not() {
    let e = Engine::with(no_workers()).await;
    let one = |name: &str| json!({"name": name, "nodes": [{"id": "a", "type": "step"}]});
    e.register(&one("keyed-one")).await;
    let mut limited = one("limited-one");
    limited["concurrency"] = json!({"max": 8});
    e.register(&limited).await;
    let mut triggered = one("triggered-one");
    triggered["triggers"] = json!([{"event": "thing.happened"}]);
    e.register(&triggered).await;
    e.register(&json!({"name": "parent-one", "nodes": [
        {"id": "child", "type": "SUB_WORKFLOW", "config": {"workflow": "keyed-one"}}]}))
        .await;
    for kind in ["key", "limit", "trigger", "child"] {
        // As in the test above: a start while the poll reads the streams
        // goes through its stream. Of ten tries, one at least is handed
        // (three missed in a row once, under CI's load); a trigger's three
        // all go through their stream.
        let mut handed = false;
        let mut streamed = 0;
        let tries = if kind == "trigger" { 3 } else { 10 };
        for i in 0..tries {
            let poll = waiting_poll(&e, "w-own-tx", json!({"queues": ["step"], "max": 1, "wait": "20s"})).await;
            let run: Uuid = match kind {
                "key" => {
                    let body = json!({"workflow": "keyed-one", "idempotency_key": format!("k-{i}")});
                    let (status, run) = e.post("/v1/runs", &body).await;
                    assert_eq!(status, 201, "{run}");
                    run["id"].as_str().unwrap().parse().unwrap()
                }
                "limit" => e.start_run("limited-one", json!({})).await,
                "child" => {
                    let parent = e.start_run("parent-one", json!({})).await;
                    eventually(T, "the parent's child", || async {
                        let (_, page) = e.get(&format!("/v1/runs?parent_run_id={parent}")).await;
                        page["runs"][0]["id"].as_str().map(|child| child.parse().unwrap()).ok_or(page)
                    })
                    .await
                }
                _ => {
                    let (status, sent) = e.post("/v1/events", &json!({"name": "thing.happened"})).await;
                    assert_eq!(status, 200, "{sent}");
                    sent["started_runs"][0]["run_id"].as_str().unwrap().parse().unwrap()
                }
            };
            let (status, answer) = poll.await.unwrap();
            assert_eq!(status, 200, "{answer}");
            let task = &answer["tasks"].as_array().unwrap()[0];
            assert_eq!(task["run_id"], json!(run), "{kind}: {answer}");
            let (id, state, owner, _) = stored(&e, run, "a").await;
            assert_eq!((state.as_str(), owner.as_deref()), ("RUNNING", Some("w-own-tx")), "{kind}");
            if !read_from_stream(task) {
                assert_eq!(outbox_rows_of(&e, id).await, 0, "{kind}: a handed-over task has no outbox row");
                handed = true;
            } else {
                streamed += 1;
            }
            let (status, done) = complete(&e, run, id, "w-own-tx", None).await;
            assert_eq!((status, &done["applied"]), (200, &json!(true)), "{kind}: {done}");
            assert_eq!(e.wait_for_run(run, T).await["status"], "SUCCEEDED", "{kind}");
            if handed {
                break;
            }
        }
        match kind {
            "trigger" => assert_eq!((handed, streamed), (false, 3), "{kind}: every step through its stream"),
            _ => assert!(handed, "{kind}: no start's step went to the waiting poll"),
        }
    }
    e.stop().await;
}

/// How many times `task`'s attempt was taken over from an expired lease.
async fn recoveries_of(e: &Engine, task: Uuid) -> i32 {
    let c = e.db.pool().get().await.unwrap();
    c.query_one("SELECT recoveries FROM task_instances WHERE id = $1", &[&task]).await.unwrap().get(0)
}

/// Slows every commit that inserts a run with an idempotency key by
/// `seconds` (a deferred constraint trigger), to hold a start in its commit.
async fn slow_keyed_commits(e: &Engine, seconds: f64) {
    let c = e.db.pool().get().await.unwrap();
    c.batch_execute(&format!(
        "CREATE FUNCTION slow_commit() RETURNS trigger LANGUAGE plpgsql AS
           $$ BEGIN PERFORM pg_sleep({seconds}); RETURN NULL; END $$;
         CREATE CONSTRAINT TRIGGER slow_commit AFTER INSERT ON workflow_runs DEFERRABLE INITIALLY DEFERRED
           FOR EACH ROW WHEN (NEW.idempotency_key IS NOT NULL) EXECUTE FUNCTION slow_commit();"
    ))
    .await
    .unwrap();
}

/// A caller that goes away while its start commits (a client's timeout)
/// does not take the hand-over with it: the start's transaction runs to its
/// end, and the poll it leased the first step to is answered with it — not
/// left to read again while the task waits, leased and untold, for its
/// lease to expire.
#[tokio::test]
async fn a_start_whose_caller_leaves_during_the_commit_still_answers_the_poll_it_gave_a_step() {
    let e = Engine::with(no_workers()).await;
    e.register(&json!({"name": "keyed-slow", "nodes": [{"id": "a", "type": "step"}]})).await;
    slow_keyed_commits(&e, 1.5).await;
    let mut handed = false;
    for i in 0..3 {
        let worker = format!("w-left-{i}");
        let poll = waiting_poll(&e, &worker, json!({"queues": ["step"], "max": 1, "wait": "20s"})).await;
        // A fixed time, as nothing shows it: the poll's naps between reads
        // grow to 200 ms, so it is soon waiting nearly all the time.
        tokio::time::sleep(Duration::from_millis(300)).await;
        let http = reqwest::Client::builder().timeout(Duration::from_millis(500)).build().unwrap();
        let body = json!({"workflow": "keyed-slow", "idempotency_key": format!("k-{i}")});
        let gone = http.post(format!("{}/v1/runs", e.url())).json(&body).send().await;
        assert!(gone.is_err(), "the caller gave up during the commit: {gone:?}");
        let (status, answer) = poll.await.unwrap();
        assert_eq!(status, 200, "{answer}");
        let task = answer["tasks"][0].clone();
        let run: Uuid = task["run_id"].as_str().expect("the poll got the start's step").parse().unwrap();
        let (id, state, owner, left) = stored(&e, run, "a").await;
        assert_eq!((state.as_str(), owner.as_deref()), ("RUNNING", Some(worker.as_str())));
        assert!(left.unwrap() > 0.0, "its lease is live: {left:?}");
        assert_eq!(recoveries_of(&e, id).await, 0, "given to the poll, not taken over once its lease expired");
        let (status, done) = complete(&e, run, id, &worker, None).await;
        assert_eq!((status, &done["applied"]), (200, &json!(true)), "{done}");
        if !read_from_stream(&task) {
            handed = true;
            break;
        }
    }
    assert!(handed, "no start's step went to the waiting poll");
    e.stop().await;
}

/// An event whose trigger's start waits for a lock (another start holds
/// its idempotency key) after an earlier trigger's start: the poll waiting
/// meanwhile is not held with a lease running. It answers within its wait;
/// the started step goes through its stream once the event commits, with a
/// whole lease, to one worker.
#[tokio::test]
async fn a_poll_is_not_held_by_an_event_whose_later_trigger_waits_for_a_lock() {
    let e = Engine::with(no_workers()).await;
    e.register(&json!({"name": "two-triggers", "nodes": [{"id": "a", "type": "step"}],
        "triggers": [{"event": "two.ev"}, {"event": "two.ev", "idempotency_key": "K"}]}))
        .await;
    let holder = e.db.pool().get().await.unwrap();
    holder
        .batch_execute(
            "BEGIN; SELECT pg_advisory_xact_lock(hashtextextended('composer_idempotency:' || 'two-triggers' || ':' || 'K', 0))",
        )
        .await
        .unwrap();
    let poll = waiting_poll(&e, "w-held", json!({"queues": ["step"], "max": 1, "wait": "1s"})).await;
    // A fixed time, as nothing shows it: the poll's naps between reads grow
    // to 200 ms, so it is soon waiting nearly all the time (and could be held).
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (url, http) = (e.url(), reqwest::Client::new());
    let sent = tokio::spawn(async move {
        let resp = http.post(format!("{url}/v1/events")).json(&json!({"name": "two.ev"})).send().await.unwrap();
        (resp.status().as_u16(), resp.json::<Value>().await.unwrap())
    });
    // An absence, so a fixed time: longer than the poll's wait and than a
    // lease of the test kit's (3 s), the event still waits for the key.
    tokio::time::sleep(Duration::from_millis(4000)).await;
    assert!(!sent.is_finished(), "the event waits for the key");
    assert!(poll.is_finished(), "the poll was not held by the event's transaction");
    let (status, answer) = poll.await.unwrap();
    assert_eq!((status, answer["tasks"].as_array().map(Vec::len)), (200, Some(0)), "{answer}");
    holder.batch_execute("COMMIT").await.unwrap();
    let (status, sent) = sent.await.unwrap();
    assert_eq!(status, 200, "{sent}");
    let runs = sent["started_runs"].as_array().unwrap();
    assert_eq!(runs.len(), 2, "{sent}");
    for _ in runs {
        let (status, got) =
            e.post("/v1/tasks/poll", &json!({"worker_id": "w-after", "queues": ["step"], "wait": "10s"})).await;
        assert_eq!(status, 200, "{got}");
        let task = &got["tasks"][0];
        assert!(read_from_stream(task), "{got}");
        let run: Uuid = task["run_id"].as_str().unwrap().parse().unwrap();
        let (id, _, owner, left) = stored(&e, run, "a").await;
        assert_eq!(owner.as_deref(), Some("w-after"));
        assert!(left.unwrap() > 1.0, "a whole lease: {left:?}");
        let (status, done) = complete(&e, run, id, "w-after", None).await;
        assert_eq!((status, &done["applied"]), (200, &json!(true)), "{done}");
    }
    e.stop().await;
}

/// A poll that stopped waiting (its wait ran out) is given nothing after:
/// a run started then goes through its stream, to the next poll. A poll of
/// urgent work only is not given a run of the default priority.
#[tokio::test]
async fn a_poll_that_stopped_waiting_or_waits_for_more_urgent_work_is_given_nothing() {
    let e = Engine::with(no_workers()).await;
    e.register(&json!({"name": "idle-one", "nodes": [{"id": "a", "type": "step"}]})).await;
    let (status, answer) =
        e.post("/v1/tasks/poll", &json!({"worker_id": "gone", "queues": ["step"], "wait": "50ms"})).await;
    assert_eq!((status, answer["tasks"].as_array().map(Vec::len)), (200, Some(0)), "{answer}");
    assert_eq!(e.coordinators[0].shared.engine.idle_polls().waiting(), 0, "the poll left");
    let urgent = waiting_poll(&e, "urgent", json!({"queues": ["step"], "wait": "1s", "priority_at_most": 1})).await;
    let run = e.start_run("idle-one", json!({})).await;
    eventually(T, "the step to be sent", || async { (messages_on(&e, "step").await >= 1).then_some(()) }).await;
    let (status, answer) = urgent.await.unwrap();
    assert_eq!((status, answer["tasks"].as_array().map(Vec::len)), (200, Some(0)), "{answer}");
    let (a, state, owner, _) = stored(&e, run, "a").await;
    assert_eq!((state.as_str(), owner), ("PENDING", None));
    let (status, answer) =
        e.post("/v1/tasks/poll", &json!({"worker_id": "next", "queues": ["step"], "wait": "10s"})).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["tasks"][0]["id"], json!(a), "the next poll reads it from its stream: {answer}");
    assert!(read_from_stream(&answer["tasks"][0]), "{answer}");
    e.stop().await;
}

/// A queued run a result's end lets start, when the result asked for
/// nothing more, has its first step given to a poll waiting for work, in
/// the commit that starts it (or the promotion pass's, when the batch could
/// not take the key's lock).
#[tokio::test]
async fn a_run_a_freed_slot_starts_gives_its_first_step_to_a_waiting_poll() {
    let e = Engine::with(EngineOptions {
        workers: 0,
        coordinator: |c| c.timer_interval = Duration::from_secs(3600),
        ..Default::default()
    })
    .await;
    e.register(&json!({"name": "idle-solo", "concurrency": {"max": 1}, "nodes": [{"id": "a", "type": "step"}]})).await;
    let mut runs = Vec::new();
    for _ in 0..4 {
        runs.push(start_at(&e, "idle-solo", 3).await);
    }
    let (_, queued) = e.get(&format!("/v1/runs/{}", runs[3])).await;
    assert_eq!(queued["status"], "QUEUED", "{queued}");
    let (a, ..) = stored(&e, runs[0], "a").await;
    let leases = LeaseManager::new(e.db.pool());
    assert!(leases.acquire(runs[0], a, "w-idle", Duration::from_secs(30), 1).await.unwrap().is_granted());
    // A poll leaves its wait to read the streams now and then: a promotion
    // in that moment goes through its stream. Of three, one at least is handed.
    let mut handed = 0;
    let mut holding = a;
    for k in 0..3 {
        let poll = waiting_poll(&e, "w-idle", json!({"queues": ["step"], "wait": "20s"})).await;
        let (status, answer) = complete(&e, runs[k], holding, "w-idle", None).await;
        assert_eq!((status, &answer["applied"]), (200, &json!(true)), "{answer}");
        let (status, answer) = poll.await.unwrap();
        assert_eq!(status, 200, "{answer}");
        let (next, state, owner, _) = stored(&e, runs[k + 1], "a").await;
        assert_eq!(answer["tasks"].as_array().map(Vec::len), Some(1), "{answer}");
        assert_eq!(answer["tasks"][0]["id"], json!(next), "the started run's step: {answer}");
        assert_eq!((state.as_str(), owner.as_deref()), ("RUNNING", Some("w-idle")));
        handed += usize::from(!read_from_stream(&answer["tasks"][0]));
        holding = next;
    }
    assert!(handed >= 1, "no started run's step went to the waiting poll");
    let (status, _) = complete(&e, runs[3], holding, "w-idle", None).await;
    assert_eq!(status, 200);
    for run in runs {
        assert_eq!(e.wait_for_run(run, T).await["status"], "SUCCEEDED");
    }
    e.stop().await;
}
