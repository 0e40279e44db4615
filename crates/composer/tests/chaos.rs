//! The chaos soak: two coordinators and two workers as real processes,
//! killed with SIGKILL at random and restarted, Redis wiped and PostgreSQL
//! restarted in the middle, while a mix of workflows runs (HTTP chains,
//! WAIT, WAIT_FOR_EVENT, steps that fail and recover, steps that fail for
//! good). At the end every run must have ended as its workflow says, no
//! task may have had a result applied twice, and no step may have called
//! its target more than a bound.
//!
//! `cargo test` runs a short soak; `scripts/chaos` a long one
//! (`CHAOS_RUNS`, `CHAOS_KILLS`, `CHAOS_SEED`).

#![allow(clippy::unwrap_used)] // a test fails by panicking

use std::collections::HashMap;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use composer_embedded::{free_port, temp_dir, LocalPostgres, LocalRedis, PgOptions};
use composer_testkit::{eventually, FakeHttp};
use serde_json::{json, Value};

const BIN: &str = env!("CARGO_BIN_EXE_composer");

/// Most calls one step may make to its target: the first, one more when a
/// worker is killed after calling and before reporting, and one more for a
/// lease that expired under a second kill.
const MAX_CALLS_PER_STEP: usize = 3;

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// xorshift64: reproducible from the printed seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n.max(1)
    }
}

/// The kinds of workflow in the mix, with the status each must end in.
const KINDS: [(&str, &str); 5] = [
    ("chain", "SUCCEEDED"),
    ("timer", "SUCCEEDED"),
    ("event", "SUCCEEDED"),
    ("flaky", "SUCCEEDED"),
    ("broken", "FAILED"),
];

fn definitions(sink: &FakeHttp) -> Vec<Value> {
    let step = |id: &str, path: &str, attempts: u32| {
        json!({"id": id, "type": "HTTP",
               "config": {"method": "POST", "url": sink.url(&format!("/{path}/${{ .run.id }}/{id}"))},
               "retry": {"max_attempts": attempts, "initial_backoff": "100ms"}})
    };
    vec![
        // Steps that take a while, so that kills land while tasks run.
        json!({"name": "chain", "nodes": [step("a", "slow/150", 3), step("b", "slow/150", 3), step("c", "slow/150", 3)],
               "edges": [{"from": "a", "to": "b"}, {"from": "b", "to": "c"}]}),
        json!({"name": "timer", "nodes": [{"id": "pause", "type": "WAIT", "config": {"duration": "1s"}}, step("a", "ok", 3)],
               "edges": [{"from": "pause", "to": "a"}]}),
        json!({"name": "event", "nodes": [
                {"id": "paid", "type": "WAIT_FOR_EVENT", "config": {"event": "paid", "key": "${ .input.order }"}},
                step("a", "ok", 3)],
               "edges": [{"from": "paid", "to": "a"}]}),
        json!({"name": "flaky", "nodes": [step("a", "flaky/2", 5)]}),
        json!({"name": "broken", "nodes": [step("a", "fail", 2)]}),
    ]
}

/// A `composer` server process (coordinator or worker) we can kill and restart.
struct Server {
    args: Vec<(&'static str, String)>,
    role: &'static str,
    child: Option<Child>,
}

impl Server {
    fn start(role: &'static str, args: Vec<(&'static str, String)>, log: &Path) -> Server {
        let mut s = Server { args, role, child: None };
        s.spawn(log);
        s
    }

    fn spawn(&mut self, log: &Path) {
        let mut cmd = Command::new(BIN);
        cmd.arg(self.role).env("COMPOSER_LOG", "warn");
        for (k, _) in std::env::vars() {
            if k.starts_with("COMPOSER_") && k != "COMPOSER_LOG" {
                cmd.env_remove(k);
            }
        }
        for (k, v) in &self.args {
            cmd.env(k, v);
        }
        let out = std::fs::OpenOptions::new().create(true).append(true).open(log).expect("log file");
        let err = out.try_clone().expect("log file");
        self.child = Some(cmd.stdin(Stdio::null()).stdout(out).stderr(err).spawn().expect("spawning composer"));
    }

    fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill();
    }
}

struct Api {
    http: reqwest::Client,
    urls: Vec<String>,
}

impl Api {
    /// Sends to whichever coordinator answers, until `deadline`: processes
    /// are being killed, so a refused connection or a 503 is retried.
    async fn send(&self, method: reqwest::Method, path: &str, body: Option<&Value>, deadline: Instant) -> (u16, Value) {
        let mut i = 0;
        loop {
            let url = format!("{}{path}", self.urls[i % self.urls.len()]);
            i += 1;
            let mut req = self.http.request(method.clone(), &url).timeout(Duration::from_secs(10));
            if let Some(b) = body {
                req = req.json(b);
            }
            if let Ok(resp) = req.send().await {
                let status = resp.status().as_u16();
                if status < 500 {
                    return (status, resp.json().await.unwrap_or(Value::Null));
                }
            }
            assert!(Instant::now() < deadline, "no coordinator answered {path} in time");
            // The pace of a client's retries while processes are killed.
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_soak() {
    let runs = env_or("CHAOS_RUNS", 60) as usize;
    let kills = env_or("CHAOS_KILLS", 6) as usize;
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    let seed = env_or("CHAOS_SEED", now.as_nanos() as u64 | 1);
    let mut rng = Rng(seed.max(1));
    eprintln!("chaos: {runs} runs, {kills} kills, seed {seed}");
    let started = Instant::now();

    let dir = temp_dir("chaos").expect("temp dir");
    let mut pg =
        LocalPostgres::start(PgOptions { data_dir: dir.join("pg"), port: None, fsync: false, max_connections: 200 })
            .expect("PostgreSQL");
    let mut redis = LocalRedis::start(&dir.join("redis"), None).expect("redis-server");
    composer_store::ensure_database(&pg.url("postgres"), "chaos").await.expect("database");
    let db_url = pg.url("chaos");
    let sink = FakeHttp::start().await;
    let log = dir.join("composer.log");

    let ports = [free_port().expect("port"), free_port().expect("port")];
    let urls: Vec<String> = ports.iter().map(|p| format!("http://127.0.0.1:{p}")).collect();
    let common = |extra: Vec<(&'static str, String)>| {
        let mut v = vec![
            ("COMPOSER_DATABASE_URL", db_url.clone()),
            ("COMPOSER_REDIS_URL", redis.url()),
            ("COMPOSER_REDIS_PREFIX", "chaos:".to_string()),
        ];
        v.extend(extra);
        v
    };
    let mut servers: Vec<Server> = Vec::new();
    for port in ports {
        servers.push(Server::start(
            "coordinator",
            common(vec![
                ("COMPOSER_LISTEN", format!("127.0.0.1:{port}")),
                ("COMPOSER_STATE_DIR", dir.join(format!("state-{port}")).display().to_string()),
                ("COMPOSER_STREAM_SHARDS", "2".into()),
                ("COMPOSER_TIMER_INTERVAL", "200ms".into()),
                ("COMPOSER_RECOVERY_INTERVAL", "1s".into()),
                // The coordinators run HTTP steps too: killed, they take
                // their calls in flight with them.
                ("COMPOSER_COORDINATOR_HTTP_SLOTS", "256".into()),
                ("COMPOSER_LOST_DISPATCH_AGE", "3s".into()),
                ("COMPOSER_OUTBOX_CLAIM_TIMEOUT", "3s".into()),
                ("COMPOSER_DB_POOL_SIZE", "8".into()),
            ]),
            &log,
        ));
    }
    for _ in 0..2 {
        servers.push(Server::start(
            "worker",
            common(vec![
                ("COMPOSER_COORDINATOR_URLS", urls.join(",")),
                ("COMPOSER_LEASE_TTL", "2s".into()),
                ("COMPOSER_RECLAIM_INTERVAL", "1s".into()),
                ("COMPOSER_WORKER_CONCURRENCY", "8".into()),
            ]),
            &log,
        ));
    }
    let api = Api { http: reqwest::Client::new(), urls };
    let deadline = Instant::now() + Duration::from_secs(120 + runs as u64);
    for spec in definitions(&sink) {
        let (status, body) = api.send(reqwest::Method::POST, "/v1/workflows", Some(&spec), deadline).await;
        assert!(status == 200 || status == 201, "registering: {status} {body}");
    }

    // Runs start in waves while processes are killed between them.
    let mut started_runs: Vec<(String, &str)> = Vec::new();
    let mut orders = Vec::new();
    let waves = (kills + 2).max(1);
    let mut kill_no = 0;
    for wave in 0..waves {
        let n = runs / waves + usize::from(wave < runs % waves);
        for _ in 0..n {
            let (kind, expect) = KINDS[rng.next(KINDS.len() as u64) as usize];
            let order = format!("o-{}", started_runs.len());
            let body = json!({"workflow": kind, "input": {"order": order}, "idempotency_key": order});
            let (status, run) = api.send(reqwest::Method::POST, "/v1/runs", Some(&body), deadline).await;
            assert!(status == 200 || status == 201, "starting a run: {status} {run}");
            started_runs.push((run["id"].as_str().expect("run id").to_string(), expect));
            if kind == "event" {
                orders.push(order);
            }
        }
        if kill_no < kills {
            let victim = rng.next(servers.len() as u64) as usize;
            servers[victim].kill();
            kill_no += 1;
            // Chaos, so a fixed time: the victim stays down a random while.
            tokio::time::sleep(Duration::from_millis(300 + rng.next(700))).await;
            servers[victim].spawn(&log);
        }
        if wave == waves / 3 {
            redis.restart().expect("wiping Redis");
        }
        if wave == 2 * waves / 3 {
            pg.restart().expect("restarting PostgreSQL");
        }
        // The pace of the waves: work runs between the kills.
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    for order in &orders {
        let body = json!({"name": "paid", "key": order, "payload": {"order": order}});
        let (status, sent) = api.send(reqwest::Method::POST, "/v1/events", Some(&body), deadline).await;
        assert_eq!(status, 200, "sending an event: {sent}");
    }

    // Every run ends as its workflow says.
    let mut statuses: HashMap<&str, usize> = HashMap::new();
    for (id, expect) in &started_runs {
        let left = deadline.saturating_duration_since(Instant::now());
        let run = eventually(left, format!("run {id} to end"), || async {
            let (_, run) = api.send(reqwest::Method::GET, &format!("/v1/runs/{id}"), None, deadline).await;
            if run["status"] != "RUNNING" {
                Ok(run)
            } else {
                Err(run)
            }
        })
        .await;
        assert_eq!(run["status"], *expect, "run {id}: {run}");
        *statuses.entry(expect).or_default() += 1;
    }

    // No task had a result applied twice.
    let (db, conn) = tokio_postgres::connect(&db_url, tokio_postgres::NoTls).await.expect("connecting");
    tokio::spawn(conn);
    let doubled = db
        .query(
            "SELECT type, payload->>'task_id', payload->>'attempt', count(*) FROM run_events
              WHERE type IN ('TaskCompleted', 'TaskFailed', 'TaskRetryScheduled')
              GROUP BY 1, 2, 3 HAVING count(*) > 1",
            &[],
        )
        .await
        .expect("history");
    assert!(doubled.is_empty(), "results applied twice: {} attempts", doubled.len());

    // Calls per step stay bounded.
    let mut calls: HashMap<String, usize> = HashMap::new();
    for r in sink.all() {
        *calls.entry(r.path).or_default() += 1;
    }
    let succeeding = |p: &str| p.starts_with("/ok/") || p.starts_with("/slow/");
    let max_calls = calls.iter().filter(|(p, _)| succeeding(p)).map(|(_, n)| *n).max().unwrap_or(0);
    let extra = calls.iter().filter(|(p, _)| succeeding(p)).map(|(_, n)| n - 1).sum::<usize>();
    assert!(max_calls <= MAX_CALLS_PER_STEP, "a step called its target {max_calls} times");
    eprintln!(
        "chaos: {} runs ended as expected ({statuses:?}) in {:.0?} with {kill_no} SIGKILLs, a Redis wipe and a \
         PostgreSQL restart; no result applied twice; most calls by one step {max_calls}, extra calls {extra} of {}",
        started_runs.len(),
        started.elapsed(),
        calls.iter().filter(|(p, _)| succeeding(p)).count(),
    );
    drop(servers);
    drop(pg);
    drop(redis);
    let _ = std::fs::remove_dir_all(&dir);
}
