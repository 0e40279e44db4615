//! Composer as real processes: the `composer` binary's server roles.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use composer_testkit::{eventually, eventually_blocking, http_node, services, unique_prefix, FakeHttp, TestDb};
use serde_json::{json, Value};

pub(crate) const BIN: &str = env!("CARGO_BIN_EXE_composer");

/// A child process that is killed if the test ends without stopping it.
pub(crate) struct Proc(pub(crate) Child);

impl Proc {
    pub(crate) fn spawn(cmd: &mut Command) -> Proc {
        Proc(cmd.stdin(Stdio::null()).stdout(Stdio::null()).spawn().expect("spawning composer"))
    }

    /// SIGTERM, then wait for a clean exit.
    pub(crate) fn terminate(&mut self, timeout: Duration) -> std::process::ExitStatus {
        // SAFETY: signalling our own child by pid.
        #[allow(unsafe_code)]
        unsafe {
            libc::kill(self.0.id() as libc::pid_t, libc::SIGTERM);
        }
        eventually_blocking(timeout, "composer to exit on SIGTERM", || self.0.try_wait().expect("waiting for composer"))
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A `composer` command with no COMPOSER_* configuration inherited: the
/// binary cargo built with the tests, or `COMPOSER_TEST_BIN` (a release
/// build, for a measurement by hand).
pub(crate) fn composer(args: &[&str]) -> Command {
    let mut cmd = Command::new(std::env::var("COMPOSER_TEST_BIN").unwrap_or_else(|_| BIN.to_string()));
    cmd.args(args).env("COMPOSER_LOG", "warn");
    for (k, _) in std::env::vars() {
        if k.starts_with("COMPOSER_") && k != "COMPOSER_LOG" {
            cmd.env_remove(k);
        }
    }
    cmd
}

pub(crate) async fn wait_for_file(path: &Path, timeout: Duration) -> String {
    eventually(timeout, format!("{} to appear", path.display()), || async {
        std::fs::read_to_string(path).ok().filter(|s| !s.is_empty())
    })
    .await
}

pub(crate) struct Client {
    pub(crate) http: reqwest::Client,
    pub(crate) base: String,
}

impl Client {
    pub(crate) fn new(base: &str) -> Client {
        Client { http: reqwest::Client::new(), base: base.trim().to_string() }
    }

    pub(crate) async fn post(&self, path: &str, body: &Value) -> (u16, Value) {
        let r = self.http.post(format!("{}{path}", self.base)).json(body).send().await.expect("POST");
        (r.status().as_u16(), r.json().await.unwrap_or(Value::Null))
    }

    pub(crate) async fn get(&self, path: &str) -> Value {
        self.http.get(format!("{}{path}", self.base)).send().await.expect("GET").json().await.expect("JSON")
    }

    pub(crate) async fn wait_for_run(&self, id: &str, timeout: Duration) -> Value {
        let api = composer_client::Client::new(self.http.clone(), &self.base, None);
        let run = api.wait_for_run(id.parse().expect("run id"), timeout).await.expect("reading the run");
        assert_ne!(run.status, composer_core::machine::RunStatus::Running, "run {id} did not end: {run:?}");
        serde_json::to_value(run).expect("a run is JSON")
    }
}

fn processes_mentioning(needle: &str) -> Vec<String> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        if let Ok(raw) = std::fs::read(entry.path().join("cmdline")) {
            let cmdline = String::from_utf8_lossy(&raw).replace('\0', " ");
            if cmdline.contains(needle) {
                found.push(cmdline);
            }
        }
    }
    found
}

#[tokio::test]
async fn two_coordinator_processes_and_one_worker_process_complete_30_runs() {
    let db = TestDb::create().await;
    let http = FakeHttp::start().await;
    let dir: PathBuf = composer_embedded::temp_dir("procs").unwrap();
    let (mut coordinators, urls) = coordinator_procs(&db, &unique_prefix(), &dir, 2, |_| {}).await;
    let mut worker = Proc::spawn(worker_cmd(&urls.join(",")).env("COMPOSER_WORKER_CONCURRENCY", "16"));

    let clients: Vec<Client> = urls.iter().map(|u| Client::new(u)).collect();
    let spec = json!({"name": "three", "nodes": [
        http_node("a", &http.url("/ok/a"), 3), http_node("b", &http.url("/ok/b"), 3), http_node("c", &http.url("/ok/c"), 3)],
        "edges": [{"from": "a", "to": "b"}, {"from": "b", "to": "c"}]});
    let (status, body) = clients[0].post("/v1/workflows", &spec).await;
    assert_eq!(status, 201, "{body}");
    let mut ids = Vec::new();
    for i in 0..30 {
        let (status, run) = clients[i % 2].post("/v1/runs", &json!({"workflow": "three"})).await;
        assert_eq!(status, 201, "{run}");
        ids.push(run["id"].as_str().unwrap().to_string());
    }
    let mut expected_keys = HashSet::new();
    for (i, id) in ids.iter().enumerate() {
        let run = clients[(i + 1) % 2].wait_for_run(id, Duration::from_secs(60)).await;
        assert_eq!(run["status"], "SUCCEEDED", "{run}");
        for t in run["tasks"].as_array().unwrap() {
            assert_eq!(t["attempt"], 1);
            expected_keys.insert(format!("{}:1", t["id"].as_str().unwrap()));
        }
    }
    let calls = http.all();
    assert_eq!(calls.len(), 90, "30 runs × 3 steps, each called exactly once");
    let keys: HashSet<String> = calls.iter().map(|c| c.idempotency_key.clone().unwrap()).collect();
    assert_eq!(keys, expected_keys, "every call is one of the runs' tasks, none twice");

    assert!(worker.terminate(Duration::from_secs(30)).success());
    for c in &mut coordinators {
        assert!(c.terminate(Duration::from_secs(30)).success());
    }
    let _ = std::fs::remove_dir_all(dir);
}

/// A poll waiting on one coordinator is woken by another's publish
/// (announced through Redis), not left to its next idle read.
#[tokio::test]
async fn a_poll_waiting_on_one_coordinator_is_woken_by_anothers_publish() {
    let db = TestDb::create().await;
    let dir: PathBuf = composer_embedded::temp_dir("wakes").unwrap();
    let (mut coordinators, urls) = coordinator_procs(&db, &unique_prefix(), &dir, 2, |_| {}).await;
    let clients: Vec<Client> = urls.iter().map(|u| Client::new(u)).collect();
    let spec = json!({"name": "one", "nodes": [{"id": "a", "type": "resize", "queue": "py"}]});
    let (status, body) = clients[1].post("/v1/workflows", &spec).await;
    assert_eq!(status, 201, "{body}");
    let ask = json!({"worker_id": "w", "queues": ["py"], "wait": "20s"});
    for _ in 0..3 {
        let poll = clients[0].post("/v1/tasks/poll", &ask);
        let start = async {
            // A head start, so a fixed time: once the poll waits (its first
            // read found nothing), which no coordinator process shows.
            tokio::time::sleep(Duration::from_millis(300)).await;
            let (status, run) = clients[1].post("/v1/runs", &json!({"workflow": "one"})).await;
            assert_eq!(status, 201, "{run}");
        };
        let ((status, polled), ()) = tokio::join!(poll, start);
        assert_eq!((status, polled["tasks"].as_array().map(Vec::len)), (200, Some(1)), "{polled}");
    }
    let metrics = reqwest::get(format!("{}/metrics", clients[0].base)).await.unwrap().text().await.unwrap();
    let wakes: f64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix("composer_poll_wakes_total "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no composer_poll_wakes_total:\n{metrics}"));
    assert!(wakes >= 1.0, "the other coordinator's publishes woke no poll here:\n{metrics}");
    for c in &mut coordinators {
        assert!(c.terminate(Duration::from_secs(30)).success());
    }
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test]
async fn composer_dev_needs_no_configuration_and_leaves_no_process_behind() {
    let dir: PathBuf = composer_embedded::temp_dir("dev").unwrap();
    let http = FakeHttp::start().await;
    let addr_file = dir.join("addr");
    let mut dev = Proc::spawn(
        composer(&["dev"])
            .current_dir(&dir)
            .env("COMPOSER_LISTEN", "127.0.0.1:0")
            .env("COMPOSER_ADDR_FILE", &addr_file),
    );
    let url = wait_for_file(&addr_file, Duration::from_secs(60)).await;
    let data_dir = dir.join(".composer");
    assert!(data_dir.join("postgres").join("PG_VERSION").exists(), "the embedded PostgreSQL lives under ./.composer");
    assert!(!processes_mentioning(data_dir.to_str().unwrap()).is_empty(), "embedded services are running");

    let client = Client::new(&url);
    let (status, body) =
        client.post("/v1/workflows", &json!({"name": "dev", "nodes": [http_node("a", &http.url("/ok/dev"), 1)]})).await;
    assert_eq!(status, 201, "{body}");
    let (status, run) = client.post("/v1/runs", &json!({"workflow": "dev"})).await;
    assert_eq!(status, 201, "{run}");
    let run = client.wait_for_run(run["id"].as_str().unwrap(), Duration::from_secs(30)).await;
    assert_eq!(run["status"], "SUCCEEDED", "{run}");

    // The schedule commands, end to end through the CLI.
    let cli = |args: &[&str]| {
        let out = composer(args).env("COMPOSER_URL", &url).output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout).to_string();
        assert!(out.status.success(), "{args:?}: {stdout} {}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_str::<Value>(&stdout).unwrap_or_else(|e| panic!("{args:?} printed {stdout}: {e}"))
    };
    let created = cli(&[
        "schedule",
        "create",
        "--id",
        "hourly",
        "--workflow",
        "dev",
        "--cron",
        "0 * * * *",
        "--timezone",
        "Asia/Tokyo",
        "--overlap",
        "buffer_one",
        "--input",
        "{\"x\": 1}",
    ]);
    assert_eq!(created["next_fire_times"].as_array().unwrap().len(), 5, "{created}");
    assert_eq!(cli(&["schedule", "get", "hourly"])["overlap"], "buffer_one");
    assert_eq!(cli(&["schedule", "pause", "hourly"])["paused"], true);
    assert_eq!(cli(&["schedule", "resume", "hourly"])["paused"], false);
    let triggered = cli(&["schedule", "trigger", "hourly"]);
    assert_eq!(triggered["trigger"]["schedule"], "hourly", "{triggered}");
    // (Its HTTP step calls the fake service in this test's runtime, which
    // the blocking CLI calls hold: let it finish before stopping.)
    let run = client.wait_for_run(triggered["id"].as_str().unwrap(), Duration::from_secs(30)).await;
    assert_eq!(run["status"], "SUCCEEDED", "{run}");
    assert_eq!(cli(&["schedule", "list"])["schedules"].as_array().unwrap().len(), 1);
    assert_eq!(cli(&["schedule", "delete", "hourly"])["deleted"], "hourly");
    let bad = composer(&["schedule", "create", "--id", "x", "--workflow", "dev", "--cron", "nope"])
        .env("COMPOSER_URL", &url)
        .output()
        .unwrap();
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("cron"), "{}", String::from_utf8_lossy(&bad.stderr));

    assert!(dev.terminate(Duration::from_secs(30)).success(), "composer dev exits cleanly on SIGTERM");
    no_process_left_behind(&data_dir).await;
    let _ = std::fs::remove_dir_all(dir);
}

/// Waits for the embedded services under `data_dir` to exit with `composer dev`.
async fn no_process_left_behind(data_dir: &Path) {
    eventually(Duration::from_secs(10), "the embedded services to exit with composer dev", || async {
        let left = processes_mentioning(data_dir.to_str().unwrap());
        if left.is_empty() {
            Ok(())
        } else {
            Err(format!("processes left behind: {left:?}"))
        }
    })
    .await;
}

/// A SIGTERM sent while `composer dev` is still starting its embedded
/// services (or as soon as it announces its address) stops it cleanly once
/// they are up: it used to be killed by the signal's default, exiting by the
/// signal and leaving the embedded PostgreSQL and Redis running.
#[tokio::test]
async fn a_sigterm_while_dev_starts_stops_it_cleanly_and_leaves_no_process_behind() {
    let dir: PathBuf = composer_embedded::temp_dir("dev-early-term").unwrap();
    let data_dir = dir.join(".composer");
    let mut dev = Proc::spawn(
        composer(&["dev"])
            .current_dir(&dir)
            .env("COMPOSER_LISTEN", "127.0.0.1:0")
            .env("COMPOSER_ADDR_FILE", dir.join("addr")),
    );
    // initdb has begun: the embedded PostgreSQL is being made.
    eventually(Duration::from_secs(60), "the embedded PostgreSQL to be begun", || async {
        if data_dir.join("postgres").exists() {
            Ok(())
        } else {
            Err("no data directory yet")
        }
    })
    .await;
    let status = dev.terminate(Duration::from_secs(90));
    assert!(status.success(), "composer dev exits cleanly on a SIGTERM while it starts: {status}");
    no_process_left_behind(&data_dir).await;
    let _ = std::fs::remove_dir_all(dir);
}

/// As root, the embedded PostgreSQL runs as `postgres`, which cannot enter a
/// 0700 directory of root's (a home, a `mktemp -d`): `composer dev` there
/// keeps its data where `postgres` can reach it, linked from
/// `.composer/postgres`, and finds the same data at its next start.
#[tokio::test]
async fn composer_dev_as_root_under_a_closed_directory_keeps_its_data_where_postgres_can_reach_it() {
    use std::os::unix::fs::PermissionsExt;
    #[allow(unsafe_code)] // geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("not root: PostgreSQL runs as this user, and nothing is closed to it");
        return;
    }
    let dir: PathBuf = composer_embedded::temp_dir("dev-closed").unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    let addr_file = dir.join("addr");
    let start = || {
        let _ = std::fs::remove_file(&addr_file);
        Proc::spawn(
            composer(&["dev"])
                .current_dir(&dir)
                .env("COMPOSER_LISTEN", "127.0.0.1:0")
                .env("COMPOSER_ADDR_FILE", &addr_file),
        )
    };
    let mut dev = start();
    let url = wait_for_file(&addr_file, Duration::from_secs(60)).await;
    let link = dir.join(".composer").join("postgres");
    let moved = std::fs::read_link(&link).expect(".composer/postgres links to where the data is");
    assert!(moved.join("PG_VERSION").exists(), "{}", moved.display());
    let client = Client::new(&url);
    let spec = json!({"name": "kept", "nodes": [{"id": "t", "type": "TRANSFORM", "config": {"output": 1}}]});
    assert_eq!(client.post("/v1/workflows", &spec).await.0, 201);
    assert!(dev.terminate(Duration::from_secs(30)).success());

    let mut dev = start();
    let url = wait_for_file(&addr_file, Duration::from_secs(60)).await;
    let kept = Client::new(&url).get("/v1/workflows/kept").await;
    assert_eq!(kept["version"], 1, "the same data at the next start: {kept}");
    assert_eq!(std::fs::read_link(&link).unwrap(), moved);
    assert!(dev.terminate(Duration::from_secs(30)).success());
    let _ = std::fs::remove_dir_all(moved);
    let _ = std::fs::remove_dir_all(dir);
}

/// Two coordinator processes (and a worker) on a test's own database and
/// prefix, with fast recovery, for the tests that SIGKILL one of them.
pub(crate) struct TwoCoordinators {
    pub(crate) coordinators: Vec<Proc>,
    worker: Option<Proc>,
    urls: Vec<String>,
    dir: PathBuf,
    _db: TestDb,
}

impl TwoCoordinators {
    pub(crate) async fn start(name: &str, with_worker: bool) -> TwoCoordinators {
        let db = TestDb::create().await;
        let dir = composer_embedded::temp_dir(name).unwrap();
        let (coordinators, urls) = coordinator_procs(&db, &unique_prefix(), &dir, 2, |cmd| {
            cmd.env("COMPOSER_RECOVERY_INTERVAL", "1s")
                .env("COMPOSER_OUTBOX_CLAIM_TIMEOUT", "2s")
                .env("COMPOSER_LEASE_TTL", "2s")
                // Killed, a coordinator takes its own HTTP steps with it too.
                .env("COMPOSER_COORDINATOR_HTTP_SLOTS", "8");
        })
        .await;
        let worker = with_worker.then(|| Proc::spawn(&mut worker_cmd(&urls.join(","))));
        TwoCoordinators { coordinators, worker, urls, dir, _db: db }
    }

    pub(crate) fn clients(&self) -> Vec<Client> {
        self.urls.iter().map(|u| Client::new(u)).collect()
    }

    /// Sends `events` in order to the first coordinator, one at a time,
    /// and SIGKILLs it once `kill_after` of them were answered; returns how
    /// many were answered before the kill stopped the sender. The one in
    /// flight at the kill may have committed with its answer lost.
    pub(crate) async fn send_events_and_kill(&mut self, events: Vec<Value>, kill_after: usize) -> usize {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let victim = self.urls[0].clone();
        let so_far = std::sync::Arc::new(AtomicUsize::new(0));
        let sends = tokio::spawn({
            let so_far = so_far.clone();
            async move {
                let http = reqwest::Client::new();
                for event in &events {
                    match http.post(format!("{victim}/v1/events")).json(event).send().await {
                        Ok(r) if r.status() == 200 => so_far.fetch_add(1, Ordering::Relaxed),
                        _ => break,
                    };
                }
            }
        });
        eventually(Duration::from_secs(30), "the first events to be answered", || async {
            (so_far.load(Ordering::Relaxed) >= kill_after).then_some(())
        })
        .await;
        kill9(&mut self.coordinators[0]);
        sends.await.unwrap();
        so_far.load(Ordering::Relaxed)
    }

    /// Stops the worker and the surviving coordinator cleanly (SIGTERM).
    pub(crate) fn stop(mut self) {
        if let Some(w) = &mut self.worker {
            assert!(w.terminate(Duration::from_secs(30)).success());
        }
        assert!(self.coordinators[1].terminate(Duration::from_secs(30)).success());
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// `n` coordinator processes on one database and prefix, each command
/// adjusted by `adjust`, and their URLs once each listens.
pub(crate) async fn coordinator_procs(
    db: &TestDb,
    prefix: &str,
    dir: &Path,
    n: usize,
    adjust: impl Fn(&mut Command),
) -> (Vec<Proc>, Vec<String>) {
    let redis = services().redis_url.clone();
    let (mut procs, mut urls) = (Vec::new(), Vec::new());
    for i in 0..n {
        let addr_file = dir.join(format!("c{i}.addr"));
        let mut cmd = coordinator_cmd(db, &redis, prefix, "127.0.0.1:0", &addr_file);
        adjust(&mut cmd);
        procs.push(Proc::spawn(&mut cmd));
        urls.push(wait_for_file(&addr_file, Duration::from_secs(30)).await);
    }
    (procs, urls)
}

pub(crate) fn kill9(p: &mut Proc) {
    let _ = p.0.kill();
    let _ = p.0.wait();
}

pub(crate) fn coordinator_cmd(db: &TestDb, redis: &str, prefix: &str, listen: &str, addr_file: &Path) -> Command {
    let mut cmd = composer(&["coordinator"]);
    cmd.env("COMPOSER_DATABASE_URL", &db.url)
        .env("COMPOSER_REDIS_URL", redis)
        .env("COMPOSER_REDIS_PREFIX", prefix)
        .env("COMPOSER_LISTEN", listen)
        .env("COMPOSER_STREAM_SHARDS", "2")
        .env("COMPOSER_TIMER_INTERVAL", "100ms")
        .env("COMPOSER_ADDR_FILE", addr_file)
        // The tests here watch workers run HTTP steps: the coordinator runs
        // none itself unless a test says so (those in `http_steps`, and
        // the kills of `TwoCoordinators`).
        .env("COMPOSER_COORDINATOR_HTTP_SLOTS", "0")
        // Beside the address file, in the test's own directory: the default
        // (in the home directory) would outlive the test.
        .env("COMPOSER_STATE_DIR", addr_file.with_extension("state"));
    cmd
}

/// A coordinator whose leases last 2 s, so a lost one goes on soon.
fn lease_2s(cmd: &mut Command) -> &mut Command {
    cmd.env("COMPOSER_LEASE_TTL", "2s")
}

/// A worker process: coordinator URLs are all it needs (no database, no Redis).
fn worker_cmd(coordinators: &str) -> Command {
    let mut cmd = composer(&["worker"]);
    cmd.env("COMPOSER_COORDINATOR_URLS", coordinators);
    cmd
}

async fn history_count(client: &Client, run: &str, kind: &str) -> usize {
    let h = client.get(&format!("/v1/runs/{run}/events?limit=1000")).await;
    h["events"].as_array().map(|e| e.iter().filter(|e| e["type"] == kind).count()).unwrap_or(0)
}

/// The coordinator dies while handling a report: its transaction rolls back,
/// the worker's report fails, and after the lease expires the next poll
/// takes the attempt over, runs it again and it is applied once.
#[tokio::test]
async fn a_coordinator_crash_mid_event_rolls_back_and_the_attempt_is_taken_over() {
    let db = TestDb::create().await;
    let redis = services().redis_url.clone();
    let prefix = unique_prefix();
    let http = FakeHttp::start().await;
    let dir = composer_embedded::temp_dir("crash-mid-event").unwrap();
    let port = composer_embedded::free_port().unwrap();
    let listen = format!("127.0.0.1:{port}");
    let addr_file = dir.join("a.addr");
    let mut a = Proc::spawn(lease_2s(
        coordinator_cmd(&db, &redis, &prefix, &listen, &addr_file).env("COMPOSER_RECOVERY_INTERVAL", "1h"),
    ));
    let url = wait_for_file(&addr_file, Duration::from_secs(30)).await;
    let client = Client::new(&url);
    let (status, _) =
        client.post("/v1/workflows", &json!({"name": "crash", "nodes": [http_node("x", &http.url("/ok/x"), 1)]})).await;
    assert_eq!(status, 201);
    let (_, run) = client.post("/v1/runs", &json!({"workflow": "crash"})).await;
    let run_id: uuid::Uuid = run["id"].as_str().unwrap().parse().unwrap();

    // Hold the run lock so the coordinator stalls inside handle().
    let (locker, conn) = tokio_postgres::connect(&db.url, tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(conn);
    locker.batch_execute("BEGIN").await.unwrap();
    locker.execute("SELECT 1 FROM workflow_runs WHERE id = $1 FOR UPDATE", &[&run_id]).await.unwrap();

    let mut cfg = composer_worker::Config::new(vec![url.clone()]);
    cfg.options.report_deadline = Duration::from_secs(1);
    cfg.options.poll_wait = Duration::from_millis(500);
    let shutdown = tokio_util::sync::CancellationToken::new();
    let stats = composer_worker::Stats::default();
    let worker = tokio::spawn(composer_worker::Worker::new(cfg).run_with_stats(shutdown.clone(), stats.clone()));

    // Killed once the task ran and its report's batch waits on the held row.
    let pool = db.pool();
    let waiting_on_a_lock =
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'";
    eventually(Duration::from_secs(30), "the task to run and its report to wait on the held run", || async {
        if http.calls("/ok/x") == 0 {
            return Err("the task did not run yet");
        }
        let c = pool.get().await.unwrap();
        let waiting: i64 = c.query_one(waiting_on_a_lock, &[]).await.unwrap().get(0);
        (waiting > 0).then_some(()).ok_or("nothing waits on the held run")
    })
    .await;
    kill9(&mut a);
    locker.batch_execute("ROLLBACK").await.unwrap();

    let c = pool.get().await.unwrap();
    let state: String =
        c.query_one("SELECT state FROM task_instances WHERE run_id = $1", &[&run_id]).await.unwrap().get(0);
    assert_eq!(state, "RUNNING", "nothing was applied by the crashed coordinator");
    let completed: i64 = c
        .query_one("SELECT count(*) FROM run_events WHERE run_id = $1 AND type = 'TaskCompleted'", &[&run_id])
        .await
        .unwrap()
        .get(0);
    assert_eq!(completed, 0);

    // Bring a coordinator back only once the worker gave up on its report, so
    // the attempt must come back by the takeover of its expired lease.
    eventually(Duration::from_secs(30), "the worker to give up on the report", || async {
        (stats.report_failed() > 0).then_some(())
    })
    .await;
    std::fs::remove_file(&addr_file).unwrap();
    let mut again = Proc::spawn(lease_2s(
        coordinator_cmd(&db, &redis, &prefix, &listen, &addr_file).env("COMPOSER_RECOVERY_INTERVAL", "1h"),
    ));
    wait_for_file(&addr_file, Duration::from_secs(30)).await;
    let run = client.wait_for_run(&run_id.to_string(), Duration::from_secs(60)).await;
    assert_eq!(run["status"], "SUCCEEDED", "{run}");
    assert_eq!(run["tasks"][0]["attempt"], 1);
    assert_eq!(history_count(&client, &run_id.to_string(), "TaskCompleted").await, 1, "applied exactly once");
    let keys: HashSet<String> = http.requests("/ok/x").into_iter().map(|r| r.idempotency_key.unwrap()).collect();
    assert!(http.calls("/ok/x") >= 2, "the attempt taken over ran again");
    assert_eq!(keys.len(), 1, "with the same Idempotency-Key, so the target can deduplicate");

    shutdown.cancel();
    let _ = worker.await;
    assert!(again.terminate(Duration::from_secs(30)).success());
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test]
async fn a_worker_killed_mid_task_is_finished_by_another_at_the_same_attempt() {
    let mut e =
        composer_testkit::Engine::with(composer_testkit::EngineOptions { workers: 0, ..Default::default() }).await;
    let http = FakeHttp::start().await;
    let mut victim = Proc::spawn(
        // Its lease is the coordinator's (the test kit's, 3 s).
        &mut worker_cmd(&e.url()),
    );
    let id = e.run(&json!({"name": "victim", "nodes": [http_node("k", &http.url("/slow/2000/k"), 1)]})).await;
    eventually(Duration::from_secs(30), "the worker process to start the task", || async {
        (http.calls("/slow/2000/k") > 0).then_some(())
    })
    .await;
    kill9(&mut victim);

    e.start_worker("survivor", 2).await;
    let run = e.wait_for_run(id, Duration::from_secs(60)).await;
    assert_eq!(run["status"], "SUCCEEDED", "{run}");
    assert_eq!(run["tasks"][0]["attempt"], 1, "finished at the same attempt");
    assert_eq!(e.history(id, "TaskCompleted").await.len(), 1);
    let keys: HashSet<String> = http.requests("/slow/2000/k").into_iter().map(|r| r.idempotency_key.unwrap()).collect();
    assert_eq!((http.calls("/slow/2000/k"), keys.len()), (2, 1), "run again once, under the same Idempotency-Key");
    e.stop().await;
}

#[tokio::test]
async fn a_sigkilled_coordinator_leaves_the_other_to_finish_every_run() {
    let http = FakeHttp::start().await;
    let mut c = TwoCoordinators::start("kill-coordinator", true).await;
    let clients = c.clients();
    let spec = json!({"name": "survive", "nodes": [
        http_node("a", &http.url("/slow/100/a"), 3), http_node("b", &http.url("/ok/b"), 3), http_node("c", &http.url("/ok/c"), 3)],
        "edges": [{"from": "a", "to": "b"}, {"from": "b", "to": "c"}]});
    assert_eq!(clients[1].post("/v1/workflows", &spec).await.0, 201);
    let mut ids = Vec::new();
    for i in 0..20 {
        let (status, run) = clients[i % 2].post("/v1/runs", &json!({"workflow": "survive"})).await;
        assert_eq!(status, 201, "{run}");
        ids.push(run["id"].as_str().unwrap().to_string());
    }
    // Killed mid-flight: once a first run is past its first step.
    eventually(Duration::from_secs(30), "a first run to reach its second step", || async {
        (http.calls("/ok/b") > 0).then_some(())
    })
    .await;
    kill9(&mut c.coordinators[0]);

    for id in &ids {
        let run = clients[1].wait_for_run(id, Duration::from_secs(60)).await;
        assert_eq!(run["status"], "SUCCEEDED", "{run}");
        assert_eq!(history_count(&clients[1], id, "TaskCompleted").await, 3, "each step applied once");
    }
    c.stop();
}

/// A coordinator is SIGKILLed while a MAP is half done (its items created a
/// chunk at a time): the other finishes it, every item's result is applied
/// once, and the output has every item in order.
#[tokio::test]
async fn a_map_half_done_when_a_coordinator_is_killed_finishes_with_each_item_applied_once() {
    let http = FakeHttp::start().await;
    let mut c = TwoCoordinators::start("kill-mid-map", true).await;
    let clients = c.clients();
    let url = format!("{}/${{ .index }}", http.url("/slow/10/item"));
    let spec = json!({"name": "map_survives", "nodes": [
        {"id": "each", "type": "MAP", "config": {"items": "${ [range(1500)] }", "max_concurrency": 16,
         "node": {"type": "HTTP", "retry": {"max_attempts": 3}, "config": {"url": url}}}}]});
    assert_eq!(clients[0].post("/v1/workflows", &spec).await.0, 201);
    let (status, run) = clients[0].post("/v1/runs", &json!({"workflow": "map_survives"})).await;
    assert_eq!(status, 201, "{run}");
    let id = run["id"].as_str().unwrap().to_string();
    eventually(Duration::from_secs(60), "the MAP to get going (60 items done)", || async {
        let run = clients[1].get(&format!("/v1/runs/{id}")).await;
        (run["tasks"][0]["progress"]["completed"].as_u64().unwrap_or(0) >= 60).then_some(()).ok_or(run)
    })
    .await;
    kill9(&mut c.coordinators[0]);

    let run = clients[1].wait_for_run(&id, Duration::from_secs(90)).await;
    assert_eq!(run["status"], "SUCCEEDED", "{run}");
    let output = run["output"]["each"].as_array().unwrap();
    assert_eq!(output.len(), 1500, "past the first chunk of items, created later");
    for (i, o) in output.iter().enumerate() {
        assert_eq!(o["body"]["path"], json!(format!("/slow/10/item/{i}")), "item {i} in its place");
    }
    let mut applied: Vec<u64> = Vec::new();
    let mut after = 0;
    loop {
        let h = clients[1].get(&format!("/v1/runs/{id}/events?limit=1000&after={after}")).await;
        applied.extend(
            h["events"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|e| e["type"] == "TaskCompleted")
                .filter_map(|e| e["payload"]["item_index"].as_u64()),
        );
        match h["next_after"].as_i64() {
            Some(next) => after = next,
            None => break,
        }
    }
    applied.sort_unstable();
    assert_eq!(applied, (0..1500).collect::<Vec<u64>>(), "each item's result applied once");
    c.stop();
}

/// A coordinator is SIGKILLed while child runs are starting and ending: the
/// other finishes the parent, and each (task, attempt) has one child.
#[tokio::test]
async fn children_starting_when_a_coordinator_is_killed_are_started_once_and_finish() {
    let http = FakeHttp::start().await;
    let mut c = TwoCoordinators::start("kill-mid-children", true).await;
    let clients = c.clients();
    let child = json!({"name": "one_call", "nodes": [
        {"id": "call", "type": "HTTP", "config": {"url": format!("{}/${{ .input.i }}", http.url("/slow/30/child"))}}],
        "output": "${ .input.i }"});
    let parent = json!({"name": "fan_out", "nodes": [
        {"id": "each", "type": "MAP", "config": {"items": "${ [range(40)] }", "max_concurrency": 8,
         "node": {"type": "SUB_WORKFLOW", "config": {"workflow": "one_call", "input": {"i": "${ .item }"}}}}}]});
    assert_eq!(clients[0].post("/v1/workflows", &child).await.0, 201);
    assert_eq!(clients[0].post("/v1/workflows", &parent).await.0, 201);
    let (status, run) = clients[0].post("/v1/runs", &json!({"workflow": "fan_out"})).await;
    assert_eq!(status, 201, "{run}");
    let id = run["id"].as_str().unwrap().to_string();
    eventually(Duration::from_secs(60), "the children to get going (10 done)", || async {
        let run = clients[1].get(&format!("/v1/runs/{id}")).await;
        (run["tasks"][0]["progress"]["completed"].as_u64().unwrap_or(0) >= 10).then_some(()).ok_or(run)
    })
    .await;
    kill9(&mut c.coordinators[0]);

    let run = clients[1].wait_for_run(&id, Duration::from_secs(90)).await;
    assert_eq!(run["status"], "SUCCEEDED", "{run}");
    assert_eq!(run["output"]["each"], json!((0..40).collect::<Vec<_>>()), "each child's output in its item's place");
    let kids = clients[1].get(&format!("/v1/runs?parent_run_id={id}&limit=1000")).await;
    let kids = kids["runs"].as_array().unwrap();
    let holders: HashSet<&str> = kids.iter().map(|k| k["parent_task_id"].as_str().unwrap()).collect();
    assert_eq!((kids.len(), holders.len()), (40, 40), "one child per item (every item at attempt 1)");
    assert!(kids.iter().all(|k| k["status"] == "SUCCEEDED"));
    let items = clients[1].get(&format!("/v1/runs/{id}/items?node=each&limit=1000")).await;
    assert!(items["items"].as_array().unwrap().iter().all(|i| i["attempt"] == 1), "{items}");
    c.stop();
}

/// A coordinator is SIGKILLed while runs end and their hooks start (a
/// failure handler and `on_end` for a failed run, `on_success` and
/// `on_end` for one that succeeded): each end started each of its hooks
/// exactly once, whichever coordinator committed it.
#[tokio::test]
async fn hooks_starting_when_a_coordinator_is_killed_start_once_per_end() {
    let http = FakeHttp::start().await;
    let mut c = TwoCoordinators::start("kill-mid-handlers", true).await;
    let clients = c.clients();
    let handler =
        json!({"name": "note_end", "nodes": [{"id": "n", "type": "TRANSFORM", "config": {"output": "${ .input }"}}]});
    let hooked = |name: &str, last: &str| {
        json!({"name": name, "on_failure": {"workflow": "note_end"}, "on_success": {"workflow": "note_end"},
            "on_end": {"workflow": "note_end"},
            "nodes": [http_node("a", &http.url("/slow/50/a"), 1), http_node("b", &http.url(last), 1)],
            "edges": [{"from": "a", "to": "b"}]})
    };
    assert_eq!(clients[0].post("/v1/workflows", &handler).await.0, 201);
    assert_eq!(clients[0].post("/v1/workflows", &hooked("fails_loudly", "/bad/b")).await.0, 201);
    assert_eq!(clients[0].post("/v1/workflows", &hooked("succeeds_loudly", "/ok/b")).await.0, 201);
    let mut ids = Vec::new();
    for i in 0..60 {
        let workflow = if i % 3 == 2 { "succeeds_loudly" } else { "fails_loudly" };
        let (status, run) = clients[i % 2].post("/v1/runs", &json!({"workflow": workflow})).await;
        assert_eq!(status, 201, "{run}");
        ids.push((run["id"].as_str().unwrap().to_string(), workflow));
    }
    // Killed as the runs begin to end (and their hooks to start).
    eventually(Duration::from_secs(30), "a first run to reach its last step", || async {
        (http.calls("/bad/b") > 0 && http.calls("/ok/b") > 0).then_some(())
    })
    .await;
    kill9(&mut c.coordinators[0]);
    for (id, workflow) in &ids {
        let run = clients[1].wait_for_run(id, Duration::from_secs(60)).await;
        let (end, hooks) = match *workflow {
            "fails_loudly" => ("FAILED", ["on_failure", "on_end"]),
            _ => ("SUCCEEDED", ["on_success", "on_end"]),
        };
        assert_eq!(run["status"], end, "{run}");
        let started = run["hook_runs"].as_array().unwrap();
        let mut named: Vec<&str> = started.iter().map(|h| h["hook"].as_str().unwrap()).collect();
        named.sort_unstable();
        let mut want = hooks.to_vec();
        want.sort_unstable();
        assert_eq!(named, want, "each hook once per end: {run}");
        for h in started {
            let h = clients[1].wait_for_run(h["run_id"].as_str().unwrap(), Duration::from_secs(60)).await;
            assert_eq!((h["status"].as_str(), h["handles_run_id"].as_str()), (Some("SUCCEEDED"), Some(id.as_str())));
        }
    }
    let all = clients[1].get("/v1/runs?workflow=note_end&limit=1000").await;
    assert_eq!(all["runs"].as_array().unwrap().len(), 120, "no hook started twice");
    c.stop();
}

/// A coordinator is SIGKILLed while runs' deadlines fire (a run's own and
/// a step's): each deadline started its run exactly once, whichever
/// coordinator fired it.
#[tokio::test]
async fn deadlines_firing_when_a_coordinator_is_killed_fire_once_each() {
    let mut c = TwoCoordinators::start("kill-mid-deadlines", true).await;
    let clients = c.clients();
    let note =
        json!({"name": "note_late", "nodes": [{"id": "n", "type": "TRANSFORM", "config": {"output": "${ .input }"}}]});
    let page = |after: &str| json!({"after": after, "start": {"workflow": "note_late"}});
    let slow = json!({"name": "slow_to_end", "deadlines": [page("700ms")],
        "nodes": [{"id": "w", "type": "WAIT", "config": {"duration": "4s"}, "deadlines": [page("500ms")]}]});
    assert_eq!(clients[0].post("/v1/workflows", &note).await.0, 201);
    assert_eq!(clients[0].post("/v1/workflows", &slow).await.0, 201);
    let mut ids = Vec::new();
    for i in 0..40 {
        let (status, run) = clients[i % 2].post("/v1/runs", &json!({"workflow": "slow_to_end"})).await;
        assert_eq!(status, 201, "{run}");
        ids.push(run["id"].as_str().unwrap().to_string());
    }
    // Killed as the deadlines begin to fire.
    eventually(Duration::from_secs(30), "a first deadline to fire", || async {
        let page = clients[1].get("/v1/runs?workflow=note_late&limit=1").await;
        (!page["runs"].as_array().unwrap().is_empty()).then_some(())
    })
    .await;
    kill9(&mut c.coordinators[0]);
    for id in &ids {
        let run = clients[1].wait_for_run(id, Duration::from_secs(60)).await;
        assert_eq!(run["status"], "SUCCEEDED", "{run}");
        let started = run["hook_runs"].as_array().unwrap();
        assert_eq!(started.len(), 2, "each of its two deadlines once: {run}");
        let mut nodes = Vec::new();
        for h in started {
            let d = clients[1].wait_for_run(h["run_id"].as_str().unwrap(), Duration::from_secs(60)).await;
            assert_eq!((d["status"].as_str(), d["handles_run_id"].as_str()), (Some("SUCCEEDED"), Some(id.as_str())));
            nodes.push(d["trigger"]["node"].clone());
        }
        nodes.sort_by_key(Value::to_string);
        assert_eq!(nodes, [json!("w"), Value::Null], "{run}");
    }
    let all = clients[1].get("/v1/runs?workflow=note_late&limit=1000").await;
    assert_eq!(all["runs"].as_array().unwrap().len(), 80, "no deadline fired twice");
    c.stop();
}

/// A coordinator is SIGKILLed while a LOOP iterates: the other finishes it,
/// and each iteration had one child run.
#[tokio::test]
async fn a_loop_mid_way_when_a_coordinator_is_killed_starts_each_iteration_once() {
    let http = FakeHttp::start().await;
    let mut c = TwoCoordinators::start("kill-mid-loop", true).await;
    let clients = c.clients();
    let step = json!({"name": "one_step", "output": "${ .input.i }",
        "nodes": [http_node("call", &format!("{}/${{ .input.i }}", http.url("/slow/40/step")), 3)]});
    let looping = json!({"name": "iterate", "nodes": [{"id": "l", "type": "LOOP", "config": {"workflow": "one_step",
        "input": {"i": "${ .iteration.index }"}, "until": ".iteration.output >= 29", "max_iterations": 100}}]});
    assert_eq!(clients[0].post("/v1/workflows", &step).await.0, 201);
    assert_eq!(clients[0].post("/v1/workflows", &looping).await.0, 201);
    let (status, run) = clients[0].post("/v1/runs", &json!({"workflow": "iterate"})).await;
    assert_eq!(status, 201, "{run}");
    let id = run["id"].as_str().unwrap().to_string();
    eventually(Duration::from_secs(60), "the loop to get going (8 iterations called)", || async {
        (http.calls_prefix("/slow/40/step/") >= 8).then_some(())
    })
    .await;
    kill9(&mut c.coordinators[0]);
    let run = clients[1].wait_for_run(&id, Duration::from_secs(90)).await;
    assert_eq!(run["status"], "SUCCEEDED", "{run}");
    assert_eq!(run["output"]["l"], json!({"output": 29, "iterations": 30}));
    let kids = clients[1].get(&format!("/v1/runs?parent_run_id={id}&limit=1000")).await;
    let mut iterations: Vec<i64> =
        kids["runs"].as_array().unwrap().iter().map(|k| k["parent_iteration"].as_i64().unwrap()).collect();
    iterations.sort_unstable();
    assert_eq!(iterations, (0..30).collect::<Vec<i64>>(), "each iteration started once");
    c.stop();
}

/// A coordinator is SIGKILLed while at-most-once requests are in flight:
/// the worker's reports reach the other coordinator, and no request is
/// sent twice.
#[tokio::test]
async fn at_most_once_attempts_in_flight_when_a_coordinator_is_killed_are_applied_once_and_never_sent_twice() {
    let http = FakeHttp::start().await;
    let mut c = TwoCoordinators::start("kill-at-most-once", true).await;
    let clients = c.clients();
    let url = format!("{}/${{ .input.i }}", http.url("/slow/1500/pay"));
    let spec = json!({"name": "pay_once", "nodes": [{"id": "pay", "type": "HTTP", "delivery": "at_most_once",
        "config": {"url": url}, "retry": {"max_attempts": 3}}]});
    assert_eq!(clients[0].post("/v1/workflows", &spec).await.0, 201);
    let mut ids = Vec::new();
    for i in 0..10 {
        let (status, run) = clients[0].post("/v1/runs", &json!({"workflow": "pay_once", "input": {"i": i}})).await;
        assert_eq!(status, 201, "{run}");
        ids.push(run["id"].as_str().unwrap().to_string());
    }
    eventually(Duration::from_secs(30), "the 10 requests to go out", || async {
        (http.calls_prefix("/slow/1500/pay/") >= 10).then_some(())
    })
    .await;
    kill9(&mut c.coordinators[0]);
    for id in &ids {
        let run = clients[1].wait_for_run(id, Duration::from_secs(60)).await;
        assert_eq!(run["status"], "SUCCEEDED", "{run}");
    }
    assert_eq!(http.calls_prefix("/slow/1500/pay/"), 10, "each request sent once");
    c.stop();
}

/// Kills the first coordinator once bulk job `job` has looked at a batch
/// (100 runs), and answers the job once it ended, as the other sees it.
async fn killed_mid_job(c: &mut TwoCoordinators, job: &str) -> Value {
    let survivor = c.clients().remove(1);
    eventually(Duration::from_secs(60), "the job to get going (100 runs looked at)", || async {
        let j = survivor.get(&format!("/v1/bulk/{job}")).await;
        (j["looked_at"].as_i64().unwrap_or(0) >= 100 || j["status"] != "RUNNING").then_some(()).ok_or(j)
    })
    .await;
    kill9(&mut c.coordinators[0]);
    eventually(Duration::from_secs(90), "the job to finish", || async {
        let j = survivor.get(&format!("/v1/bulk/{job}")).await;
        if j["status"] != "RUNNING" {
            Ok(j)
        } else {
            Err(j)
        }
    })
    .await
}

/// A coordinator is SIGKILLed while a bulk job works: the other takes the
/// job over, and each run was acted on once.
#[tokio::test]
async fn a_bulk_job_when_its_coordinator_is_killed_is_finished_by_the_other_acting_on_each_run_once() {
    let mut c = TwoCoordinators::start("kill-mid-bulk", true).await;
    let clients = c.clients();
    let spec = json!({"name": "rerun_me", "tags": {"batch": "nightly"},
        "nodes": [{"id": "t", "type": "TRANSFORM", "config": {"output": "${ .input.i }"}}]});
    assert_eq!(clients[0].post("/v1/workflows", &spec).await.0, 201);
    let mut ids = Vec::new();
    for i in 0..300 {
        let (status, run) = clients[i % 2].post("/v1/runs", &json!({"workflow": "rerun_me", "input": {"i": i}})).await;
        assert_eq!(status, 201, "{run}");
        ids.push(run["id"].as_str().unwrap().to_string());
    }
    for id in &ids {
        assert_eq!(clients[1].wait_for_run(id, Duration::from_secs(60)).await["status"], "SUCCEEDED");
    }
    let (status, job) = clients[0]
        .post("/v1/runs/bulk", &json!({"filter": {"tags": {"batch": "nightly"}}, "action": "rerun", "from": ["t"]}))
        .await;
    assert_eq!(status, 202, "{job}");
    let job = job["id"].as_str().unwrap().to_string();
    let done = killed_mid_job(&mut c, &job).await;
    assert_eq!((done["status"].as_str(), done["acted_on"].as_i64()), (Some("SUCCEEDED"), Some(300)), "{done}");
    for id in &ids {
        clients[1].wait_for_run(id, Duration::from_secs(60)).await;
        assert_eq!(history_count(&clients[1], id, "RunRerun").await, 1, "run {id} acted on once");
    }
    c.stop();
}

/// A coordinator is SIGKILLed while a migrate job moves runs to a new
/// version: the other finishes the job, each run moved once and none
/// skipped, and every moved run finishes on the new version.
#[tokio::test]
async fn a_migration_when_its_coordinator_is_killed_moves_each_run_once_and_they_finish_on_the_new_version() {
    let mut c = TwoCoordinators::start("kill-mid-migrate", true).await;
    let clients = c.clients();
    let wait = json!({"id": "w", "type": "WAIT_FOR_EVENT", "config": {"event": "go", "key": "all"}});
    let v1 = json!({"name": "long_lived", "nodes": [wait]});
    let v2 = json!({"name": "long_lived", "nodes": [wait, {"id": "after", "type": "TRANSFORM", "config": {"output": 2}}],
        "edges": [{"from": "w", "to": "after"}]});
    assert_eq!(clients[0].post("/v1/workflows", &v1).await.0, 201);
    let mut ids = Vec::new();
    for i in 0..300 {
        let (status, run) = clients[i % 2].post("/v1/runs", &json!({"workflow": "long_lived"})).await;
        assert_eq!(status, 201, "{run}");
        ids.push(run["id"].as_str().unwrap().to_string());
    }
    assert_eq!(clients[0].post("/v1/workflows", &v2).await.0, 201);
    let (status, job) = clients[0]
        .post("/v1/workflows/long_lived/migrate", &json!({"from_version": 1, "to_version": 2, "reason": "add after"}))
        .await;
    assert_eq!(status, 202, "{job}");
    let job = job["id"].as_str().unwrap().to_string();
    let done = killed_mid_job(&mut c, &job).await;
    assert_eq!((done["status"].as_str(), done["refused"].as_i64()), (Some("SUCCEEDED"), Some(0)), "{done}");
    for id in &ids {
        assert_eq!(history_count(&clients[1], id, "RunMigrated").await, 1, "run {id} moved once");
    }
    let (status, sent) = clients[1].post("/v1/events", &json!({"name": "go", "key": "all"})).await;
    assert_eq!(status, 200, "{sent}");
    for id in &ids {
        let run = clients[1].wait_for_run(id, Duration::from_secs(60)).await;
        assert_eq!((&run["status"], &run["version"]), (&json!("SUCCEEDED"), &json!(2)), "{run}");
        assert_eq!(run["output"]["after"], 2, "{run}");
    }
    c.stop();
}

/// A coordinator is SIGKILLed while schedules fire every second: the other
/// carries on, every fire time has one run, and none is lost.
#[tokio::test]
async fn a_schedule_firing_when_a_coordinator_is_killed_starts_one_run_per_fire_time() {
    let mut c = TwoCoordinators::start("kill-mid-schedule", false).await;
    let clients = c.clients();
    let wf = json!({"name": "tick", "nodes": [{"id": "t", "type": "TRANSFORM", "config": {"output": 1}}]});
    assert_eq!(clients[0].post("/v1/workflows", &wf).await.0, 201);
    let spec = json!({"id": "tick", "workflow": "tick", "cron": "* * * * * *", "overlap": "allow"});
    assert_eq!(clients[0].post("/v1/schedules", &spec).await.0, 201);
    let runs =
        || async { clients[1].get("/v1/runs?workflow=tick&limit=1000").await["runs"].as_array().map_or(0, Vec::len) };
    let before = eventually(Duration::from_secs(30), "two fires before the kill", || async {
        let n = runs().await;
        (n >= 2).then_some(n)
    })
    .await;
    kill9(&mut c.coordinators[0]);
    eventually(Duration::from_secs(30), "three more fires after the kill, by the survivor", || async {
        (runs().await >= before + 3).then_some(())
    })
    .await;
    assert_eq!(clients[1].post("/v1/schedules/tick/pause", &json!({})).await.0, 200);

    let page = clients[1].get("/v1/runs?workflow=tick&limit=1000").await;
    let mut fire_times = Vec::new();
    for r in page["runs"].as_array().unwrap() {
        let run = clients[1].get(&format!("/v1/runs/{}", r["id"].as_str().unwrap())).await;
        let t = chrono::DateTime::parse_from_rfc3339(run["trigger"]["fire_time"].as_str().unwrap()).unwrap();
        fire_times.push(t.timestamp());
    }
    fire_times.sort_unstable();
    assert!(fire_times.len() >= 4, "{fire_times:?}");
    let distinct: HashSet<i64> = fire_times.iter().copied().collect();
    assert_eq!(distinct.len(), fire_times.len(), "one run per fire time: {fire_times:?}");
    let (first, last) = (fire_times[0], fire_times[fire_times.len() - 1]);
    assert_eq!(fire_times, (first..=last).collect::<Vec<_>>(), "no fire time lost across the kill");
    c.stop();
}

/// A secret used in a header reaches the target, and nothing else: not the
/// database, not the API, not a log line (at debug level), not the step's
/// output even when the target echoes it.
#[tokio::test]
async fn a_secret_reaches_the_target_and_nothing_else() {
    const SECRET: &str = "s3cr3t-Value-9f2c";
    let db = TestDb::create().await;
    let redis = services().redis_url.clone();
    let prefix = unique_prefix();
    let http = FakeHttp::start().await;
    let dir = composer_embedded::temp_dir("secrets").unwrap();
    let addr_file = dir.join("c.addr");
    let coord_log = std::fs::File::create(dir.join("coordinator.log")).unwrap();
    let mut coordinator = Proc::spawn(
        coordinator_cmd(&db, &redis, &prefix, "127.0.0.1:0", &addr_file).env("COMPOSER_LOG", "debug").stderr(coord_log),
    );
    let url = wait_for_file(&addr_file, Duration::from_secs(30)).await;
    let worker_log = std::fs::File::create(dir.join("worker.log")).unwrap();
    let mut worker = Proc::spawn(
        worker_cmd(&url).env("COMPOSER_SECRET_PAY_TOKEN", SECRET).env("COMPOSER_LOG", "debug").stderr(worker_log),
    );
    let client = Client::new(&url);
    let spec = json!({"name": "pay", "nodes": [
        {"id": "charge", "type": "HTTP", "config": {"url": http.url("/headers/charge"),
            "headers": {"Authorization": "Bearer ${ .secrets.PAY_TOKEN }"}}},
        {"id": "typo", "type": "HTTP", "config": {"url": http.url("/ok/typo"),
            "headers": {"Authorization": "Bearer ${ .secrets.PAY_TOKN }"}}, "retry": {"max_attempts": 1}}],
        "edges": [{"from": "charge", "to": "typo"}]});
    assert_eq!(client.post("/v1/workflows", &spec).await.0, 201);
    let (_, run) = client.post("/v1/runs", &json!({"workflow": "pay"})).await;
    let id = run["id"].as_str().unwrap().to_string();
    let run = client.wait_for_run(&id, Duration::from_secs(30)).await;

    assert_eq!(http.requests("/headers/charge")[0].headers["authorization"], format!("Bearer {SECRET}"));
    let charge = &run["tasks"][0];
    assert_eq!(charge["state"], "COMPLETED");
    assert_eq!(charge["output"]["body"]["headers"]["authorization"], "Bearer [secret]", "echoes are scrubbed");
    assert_eq!(run["status"], "FAILED", "an unknown secret fails its node");
    assert!(run["tasks"][1]["error"].as_str().unwrap().contains("unknown secret PAY_TOKN"), "{run}");
    assert_eq!(http.calls("/ok/typo"), 0);

    let mut api = client.get(&format!("/v1/runs/{id}")).await.to_string();
    api += &client.get(&format!("/v1/runs/{id}/events?limit=1000")).await.to_string();
    api += &client.get("/v1/workflows/pay").await.to_string();
    api += &client.get("/v1/runs?limit=100").await.to_string();
    assert!(!api.contains(SECRET), "the API never returns the secret");

    let pg_dump = composer_embedded::postgres_bin_dir().unwrap().join("pg_dump");
    let dump = Command::new(pg_dump).arg("--data-only").arg(&db.url).output().expect("pg_dump");
    assert!(dump.status.success(), "{}", String::from_utf8_lossy(&dump.stderr));
    let dump = String::from_utf8_lossy(&dump.stdout);
    assert!(dump.contains("PAY_TOKEN"), "the dump holds the reference");
    assert!(!dump.contains(SECRET), "but never the secret");

    assert!(worker.terminate(Duration::from_secs(30)).success());
    assert!(coordinator.terminate(Duration::from_secs(30)).success());
    for log in ["coordinator.log", "worker.log"] {
        let text = std::fs::read_to_string(dir.join(log)).unwrap();
        assert!(text.contains("DEBUG") || text.contains("INFO"), "{log} has log lines");
        assert!(!text.contains(SECRET), "{log} must not contain the secret");
    }
    let _ = std::fs::remove_dir_all(dir);
}

/// `--api-token` on the command line protects the API, for the coordinator
/// and for `dev` alike (both once read only the environment variable, so an
/// open listener was refused "without COMPOSER_API_TOKEN" while the flag was
/// given, and a loopback one ran without a token).
#[tokio::test]
async fn the_api_token_flag_protects_the_api_of_coordinator_and_dev() {
    let db = TestDb::create().await;
    let redis = services().redis_url.clone();
    let dir = composer_embedded::temp_dir("token-flag").expect("temp dir");
    for role in ["coordinator", "dev"] {
        let addr_file = dir.join(format!("{role}.addr"));
        let mut cmd = composer(&[
            role,
            "--database-url",
            &db.url,
            "--redis-url",
            &redis,
            "--redis-prefix",
            &unique_prefix(),
            "--listen",
            "0.0.0.0:0",
            "--api-token",
            "api-secret-0123456789",
            "--worker-token",
            "worker-secret-0123456789",
            "--addr-file",
            addr_file.to_str().expect("utf-8 path"),
        ]);
        let mut proc = Proc::spawn(&mut cmd);
        let url = wait_for_file(&addr_file, Duration::from_secs(30)).await.replace("0.0.0.0", "127.0.0.1");
        let http = reqwest::Client::new();
        let without = http.get(format!("{url}/v1/workflows")).send().await.expect("GET");
        assert_eq!(without.status().as_u16(), 401, "{role} without a token");
        let with =
            http.get(format!("{url}/v1/workflows")).bearer_auth("api-secret-0123456789").send().await.expect("GET");
        assert_eq!(with.status().as_u16(), 200, "{role} with the flag's token");
        assert!(proc.terminate(Duration::from_secs(20)).success(), "{role} exits cleanly");
    }
    let _ = std::fs::remove_dir_all(dir);
}

/// A bad value from the environment names the variable it came from, also
/// when the variable is not the flag's name in upper case.
#[test]
fn a_bad_value_from_the_environment_names_its_variable() {
    let out = composer(&["worker"]).env("COMPOSER_WORKER_CONCURRENCY", "abc").output().expect("running composer");
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("COMPOSER_WORKER_CONCURRENCY"), "{stderr}");
    let out = composer(&["worker"])
        .env("COMPOSER_COORDINATOR_URLS", "http://127.0.0.1:9")
        .env("COMPOSER_WORKER_URGENT_SLOTS", "20000")
        .output()
        .expect("running composer");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("COMPOSER_WORKER_URGENT_SLOTS") && stderr.contains("more than 10000"), "{stderr}");
}

/// A missing setting names both the flag and the variable.
#[test]
fn a_missing_database_url_names_flag_and_variable() {
    let out = composer(&["coordinator"]).output().expect("running composer");
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--database-url (COMPOSER_DATABASE_URL) is not set"), "{stderr}");
}

/// `composer workflow simulate`: no server, exit status by the run's end.
#[test]
fn simulate_runs_a_definition_offline_and_exits_by_its_outcome() {
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples");
    let simulate = |args: &[&str]| {
        let out = composer(&["workflow", "simulate"]).args(args).output().expect("composer");
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let branching = examples.join("branching.yaml");
    let file = branching.to_str().unwrap();
    let (code, out, _) = simulate(&["-f", file, "--input", r#"{"amount": 500}"#, "-o", "json"]);
    assert_eq!(code, Some(0), "{out}");
    let report: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(report["status"], "SUCCEEDED");
    assert_eq!(report["output"]["done"], json!({"amount": 500, "reviewed": true}), "{report}");
    let taken: Vec<&str> = report["edges"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["taken"] == true)
        .map(|e| e["to"].as_str().unwrap())
        .collect();
    assert_eq!(taken, vec!["review", "done"], "the big branch, through the WAIT that fired at once");
    // The formats of the other commands: table (also called text), json, jsonl.
    let input = r#"{"amount": 500}"#;
    let (_, table, _) = simulate(&["-f", file, "--input", input, "-o", "table"]);
    assert!(table.contains("run SUCCEEDED"), "{table}");
    assert_eq!(simulate(&["-f", file, "--input", input, "-o", "text"]).1, table);
    assert_eq!(simulate(&["-f", file, "--input", input]).1, table, "a table by default, in a pipe too");
    let (code, line, _) = simulate(&["-f", file, "--input", input, "-o", "jsonl"]);
    assert_eq!((code, line.lines().count()), (Some(0), 1), "{line}");
    assert_eq!(serde_json::from_str::<Value>(&line).unwrap(), report);

    let hello = examples.join("hello.json");
    let (code, out, _) = simulate(&["-f", hello.to_str().unwrap(), "--fail", "check=down for maintenance"]);
    assert_eq!(code, Some(1), "hello needs the coordinator's URL: {out}");
    assert!(out.contains("the input names no coordinator URL"), "{out}");
    let given = r#"{"coordinator": "http://coordinator.example"}"#;
    let (code, out, _) = simulate(&["-f", hello.to_str().unwrap(), "--input", given]);
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("http://coordinator.example/healthz"), "{out}");
    let (code, out, _) =
        simulate(&["-f", hello.to_str().unwrap(), "--input", given, "--fail", "check=down for maintenance"]);
    assert_eq!(code, Some(1), "a failed run exits 1: {out}");
    assert!(out.contains("run FAILED") && out.contains("down for maintenance"), "{out}");

    // The hooks an end starts and the deadlines that fire are shown.
    let hooks_dir = composer_embedded::temp_dir("simulate-hooks").unwrap();
    let def = hooks_dir.join("late.json");
    let page = json!({"after": "1s", "start": {"workflow": "page"}});
    std::fs::write(
        &def,
        json!({"name": "late", "on_success": {"workflow": "notify", "input": {"id": "${ .run.id }"}},
            "deadlines": [page], "nodes": [{"id": "w", "type": "WAIT", "config": {"duration": "5s"}}]})
        .to_string(),
    )
    .unwrap();
    let (code, out, _) = simulate(&["-f", def.to_str().unwrap()]);
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("hooks (started by the end)\n  on_success -> notify  input {\"id\":"), "{out}");
    assert!(out.contains("deadlines\n  the run after 1s -> page  fires"), "{out}");
    let (code, _, err) = simulate(&["-f", hello.to_str().unwrap(), "--mock", "check={not json"]);
    assert_eq!(code, Some(2), "a bad argument exits 2");
    assert!(err.contains("--mock check"), "{err}");

    let dir = composer_embedded::temp_dir("simulate").unwrap();
    let bad = dir.join("bad.json");
    std::fs::write(
        &bad,
        r#"{"name": "bad", "nodes": [{"id": "t", "type": "TRANSFORM", "config": {"output": "${ env }"}}]}"#,
    )
    .unwrap();
    let (code, _, err) = simulate(&["-f", bad.to_str().unwrap()]);
    assert_eq!(code, Some(2), "an invalid definition exits 2");
    assert!(err.contains("nodes[t].config.output") && err.contains("env is not available"), "{err}");
    let _ = std::fs::remove_dir_all(dir);
    let _ = std::fs::remove_dir_all(hooks_dir);
}

/// Every file in examples/ is a definition Composer accepts (and its logic
/// runs offline to an end).
#[test]
fn every_example_is_a_valid_definition() {
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples");
    let mut seen = 0;
    for entry in std::fs::read_dir(&examples).unwrap().flatten() {
        let path = entry.path();
        if path.is_dir() || path.extension().is_some_and(|e| e == "md") {
            continue;
        }
        let out = composer(&["workflow", "simulate", "-f", path.to_str().unwrap(), "-o", "json"]).output().unwrap();
        assert_ne!(out.status.code(), Some(2), "{}: {}", path.display(), String::from_utf8_lossy(&out.stderr));
        // An example runs wherever Composer does: it names no host or port
        // of this machine (a target it needs comes from the run's input).
        let text = std::fs::read_to_string(&path).unwrap();
        for local in ["127.0.0.1", "localhost", ":8080"] {
            assert!(!text.contains(local), "{} names {local}", path.display());
        }
        // Named after the workflow it defines.
        let name = path.file_stem().unwrap().to_str().unwrap();
        assert!(
            text.contains(&format!("\"name\": \"{name}\"")) || text.contains(&format!("\nname: {name}\n")),
            "{} defines another workflow than its name says",
            path.display()
        );
        seen += 1;
    }
    assert!(seen >= 4, "examples/ holds {seen} files");
    for entry in std::fs::read_dir(examples.join("schedules")).unwrap().flatten() {
        let spec: Value = serde_json::from_slice(&std::fs::read(entry.path()).unwrap()).unwrap();
        composer_core::schedule::Schedule::parse(&spec).unwrap_or_else(|e| panic!("{}: {e}", entry.path().display()));
        assert_eq!(entry.path().file_stem().unwrap().to_str(), spec["id"].as_str(), "named after its schedule");
    }
    // A definition with triggers, and the webhook that sends its events.
    let fulfil: Value = serde_json::from_slice(&std::fs::read(examples.join("fulfil_on_order.json")).unwrap()).unwrap();
    let wf = composer_core::definition::Workflow::parse(&fulfil).unwrap();
    let event = json!({"id": "e", "name": "order.created", "key": "", "payload": {"order": 1, "total": 5}});
    let fired = composer_core::expr::sandboxed(std::time::Instant::now, |sb| wf.triggers[0].fire(sb, &event)).unwrap();
    assert_eq!(fired.unwrap().unwrap().idempotency_key.as_deref(), Some("order-1"));
    for entry in std::fs::read_dir(examples.join("webhooks")).unwrap().flatten() {
        let hook: composer_api::WebhookSpec = serde_json::from_slice(&std::fs::read(entry.path()).unwrap()).unwrap();
        assert_eq!(entry.path().file_stem().unwrap().to_str(), Some(hook.name.as_str()), "named after its webhook");
        composer_coord::webhooks::parse(hook, "default").unwrap();
    }
    // Simulate starts from an event as its trigger would.
    let def = examples.join("fulfil_on_order.json");
    let simulate = |event: &str| {
        composer(&["workflow", "simulate", "-f", def.to_str().unwrap(), "--event", event, "-o", "json"])
            .output()
            .unwrap()
    };
    let out = simulate(r#"{"name": "order.created", "payload": {"order": 4, "total": 9}}"#);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(stderr.contains("trigger 0 (order.created) starts the run, idempotency key \"order-4\""), "{stderr}");
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["output"]["pack"]["order"], 4, "{report}");
    let none = simulate(r#"{"name": "order.created", "payload": {"order": 4, "total": 0}}"#);
    let stderr = String::from_utf8_lossy(&none.stderr);
    assert_eq!(none.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("condition does not hold") && stderr.contains("no run"), "{stderr}");
    assert_eq!(simulate(r#"{"payload": 1}"#).status.code(), Some(2), "an event needs a name");
    // A batched trigger's run takes a list: the event's input alone, said so.
    let dir = composer_embedded::temp_dir("simulate-batch").unwrap();
    let batched = dir.join("batched.json");
    let spec = json!({"name": "digest", "nodes": [{"id": "n", "type": "TRANSFORM", "config": {"output": "${ .input }"}}],
                      "triggers": [{"event": "order.created", "batch": {"max_size": 50, "max_wait": "1m"}}]});
    std::fs::write(&batched, spec.to_string()).unwrap();
    let out = composer(&[
        "workflow",
        "simulate",
        "-f",
        batched.to_str().unwrap(),
        "--event",
        r#"{"name": "order.created", "payload": 7}"#,
        "-o",
        "json",
    ])
    .output()
    .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("batched: one run for the list of up to 50 events' inputs"), "{stderr}");
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["output"]["n"], json!([7]), "{report}");
    let _ = std::fs::remove_dir_all(dir);
}

/// The attack that aborted every coordinator (a closure-passing recursion
/// overflowed a stack while jaq dropped it) now fails its node; and what an
/// evaluation that still kills a coordinator was for is failed once at the
/// restart instead of killing it again, whatever kind of thing it was (here
/// the SIGABRT is sent by hand, and each kind of subject written into a slot
/// of the flight recorder as a dying thread leaves it): a run is failed; a
/// definition's start-time expressions and a webhook's transform are
/// quarantined, for every later start, trigger and delivery, until a new
/// version or the webhook created again replaces them.
#[tokio::test]
async fn a_coordinator_killed_mid_evaluation_fails_what_it_was_evaluating_once_and_serves() {
    const GH_SECRET: &str = "flight-gh-secret";
    let db = TestDb::create().await;
    let redis = services().redis_url.clone();
    let prefix = unique_prefix();
    let dir = composer_embedded::temp_dir("flight").unwrap();
    let listen = format!("127.0.0.1:{}", composer_embedded::free_port().unwrap());
    let addr_file = dir.join("a.addr");
    let flight = addr_file.with_extension("state").join(format!("flight-{}", listen.replace(['.', ':'], "_")));
    let start = || {
        Proc::spawn(
            coordinator_cmd(&db, &redis, &prefix, &listen, &addr_file)
                .env("COMPOSER_WEBHOOK_SECRET_FLIGHT_GH", GH_SECRET),
        )
    };
    let mut a = start();
    let client = Client::new(&wait_for_file(&addr_file, Duration::from_secs(30)).await);
    let after_wait = |name: &str, output: &str| {
        json!({"name": name, "nodes": [
            {"id": "pause", "type": "WAIT", "config": {"duration": "1s"}},
            {"id": "t", "type": "TRANSFORM", "config": {"output": output}}],
            "edges": [{"from": "pause", "to": "t"}]})
    };
    for (name, output) in
        [("bomb", "${ def f(x): f(x); f(0) }"), ("bomb2", "${ def f(g): f(1); f(0) }"), ("fine", "${ 1 }")]
    {
        assert_eq!(client.post("/v1/workflows", &after_wait(name, output)).await.0, 201);
    }
    for bomb in ["bomb", "bomb2"] {
        let (_, run) = client.post("/v1/runs", &json!({"workflow": bomb})).await;
        let run = client.wait_for_run(run["id"].as_str().unwrap(), Duration::from_secs(60)).await;
        assert_eq!(run["status"], "FAILED", "{run}");
        assert!(run["error"].as_str().unwrap().contains("expr_max_"), "{run}");
    }
    assert!(a.0.try_wait().unwrap().is_none(), "the coordinator is still up");
    let tagged = json!({"name": "tagged", "tags": {"who": "${ .input.who }"},
        "triggers": [{"event": "tag.me", "input": "${ .event.payload }"}],
        "nodes": [{"id": "t", "type": "TRANSFORM", "config": {"output": 1}}]});
    let (_, registered) = client.post("/v1/workflows", &tagged).await;
    let definition: uuid::Uuid = registered["id"].as_str().unwrap().parse().unwrap();
    let hook = json!({"name": "gh", "scheme": "github", "secret": "FLIGHT_GH",
                      "event": {"name": "tag.me", "payload": "${ .body }"}});
    assert_eq!(client.post("/v1/webhooks", &hook).await.0, 201);
    let deliver = |body: &'static str| {
        let tag =
            ring::hmac::sign(&ring::hmac::Key::new(ring::hmac::HMAC_SHA256, GH_SECRET.as_bytes()), body.as_bytes());
        let sig = format!("sha256={}", tag.as_ref().iter().map(|b| format!("{b:02x}")).collect::<String>());
        let url = format!("{}/v1/webhooks/gh", client.base);
        async move {
            let r =
                reqwest::Client::new().post(url).header("x-hub-signature-256", sig).body(body).send().await.unwrap();
            (r.status().as_u16(), r.json::<Value>().await.unwrap_or(Value::Null))
        }
    };
    assert_eq!(deliver(r#"{"who": "before"}"#).await.0, 200);

    let (_, held) = client.post("/v1/runs", &json!({"workflow": "fine"})).await;
    let held = held["id"].as_str().unwrap().to_string();
    // Each kind of subject in turn, as the thread that aborted held it; the
    // others' slots hold what other threads evaluated then, never blamed.
    use composer_coord::engine::flight::{crash_mark, Subject, SLOT_BYTES};
    let bystander = Subject::Run(uuid::Uuid::now_v7());
    for subject in [Subject::Run(held.parse().unwrap()), Subject::Definition(definition), Subject::Webhook("gh".into())]
    {
        // SAFETY: signalling our own child by pid.
        #[allow(unsafe_code)]
        unsafe {
            libc::kill(a.0.id() as libc::pid_t, libc::SIGABRT);
        }
        let _ = a.0.wait();
        let mut recorded = std::fs::read(&flight).unwrap();
        assert_eq!(recorded[0], b'!', "the abort marked the flight file");
        recorded[..4].copy_from_slice(&crash_mark(1));
        recorded[2 * SLOT_BYTES..3 * SLOT_BYTES].copy_from_slice(&subject.encode());
        recorded[4 * SLOT_BYTES..5 * SLOT_BYTES].copy_from_slice(&bystander.encode());
        std::fs::write(&flight, recorded).unwrap();
        std::fs::remove_file(&addr_file).unwrap();
        a = start();
        wait_for_file(&addr_file, Duration::from_secs(30)).await;
    }
    let run = client.wait_for_run(&held, Duration::from_secs(30)).await;
    assert_eq!(run["status"], "FAILED", "{run}");
    assert!(run["error"].as_str().unwrap().contains("expr_crash"), "{run}");
    // What replaces a quarantined thing is evaluated again.
    let mut fixed = tagged.clone();
    fixed["tags"]["who"] = json!("${ .input.who | tostring }");
    let (_, v2) = client.post("/v1/workflows", &fixed).await;
    assert_eq!(v2["version"], 2, "{v2}");
    let (status, started) = client.post("/v1/runs", &json!({"workflow": "tagged", "input": {"who": "x"}})).await;
    assert_eq!(status, 201, "{started}");
    assert_eq!(client.post("/v1/webhooks", &hook).await.0, 200);
    let (status, delivered) = deliver(r#"{"who": "again"}"#).await;
    assert_eq!(status, 200, "{delivered}");
    assert!(a.terminate(Duration::from_secs(30)).success());
    let _ = std::fs::remove_dir_all(dir);
}

/// The closure-passing recursion that aborted coordinators aborted
/// `workflow simulate` too (8 MiB main thread): it fails its node instead.
#[test]
fn simulate_fails_a_hostile_expressions_node_instead_of_overflowing_its_stack() {
    let dir = composer_embedded::temp_dir("simulate-bomb").unwrap();
    let file = dir.join("bomb.json");
    let spec = json!({"name": "bomb", "nodes": [
        {"id": "t", "type": "TRANSFORM", "config": {"output": "${ def f(x): f(x); f(0) }"}}]});
    std::fs::write(&file, spec.to_string()).unwrap();
    let out = composer(&["workflow", "simulate", "-f", file.to_str().unwrap()]).output().expect("composer");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "a failed run exits 1: {stdout} {}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("expr_max_"), "{stdout}");
    let _ = std::fs::remove_dir_all(dir);
}

/// SIGTERM stops a coordinator within COMPOSER_SHUTDOWN_GRACE even while
/// its engine is inside a long application (a MAP whose 300 items each run
/// an expression to its time limit: minutes of evaluation in one event).
#[tokio::test]
async fn sigterm_stops_a_coordinator_within_its_grace_whatever_it_is_doing() {
    let db = TestDb::create().await;
    let redis = services().redis_url.clone();
    let prefix = unique_prefix();
    let dir = composer_embedded::temp_dir("grace").unwrap();
    let listen = format!("127.0.0.1:{}", composer_embedded::free_port().unwrap());
    let addr_file = dir.join("a.addr");
    let mut a = Proc::spawn(
        coordinator_cmd(&db, &redis, &prefix, &listen, &addr_file)
            .env("COMPOSER_SHUTDOWN_GRACE", "1s")
            .env("COMPOSER_EVAL_BACKSTOP", "10m"),
    );
    let url = wait_for_file(&addr_file, Duration::from_secs(30)).await;
    let client = Client::new(&url);
    // Every item runs to its time limit: once one failed the MAP, the rest
    // would not be evaluated.
    let slow = json!({"name": "slow", "nodes": [{"id": "each", "type": "MAP", "config": {
        "items": "${ [range(300)] }", "on_item_failure": "continue",
        "node": {"type": "TRANSFORM", "config": {"output": "${ last(range(1e15)) }"}}}}]});
    assert_eq!(client.post("/v1/workflows", &slow).await.0, 201);
    let starting = tokio::spawn(async move { client.post("/v1/runs", &json!({"workflow": "slow"})).await });
    // A fixed time, as the point is what has not happened in it: the start
    // reached the engine and is deep in its first event, not answered.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(!starting.is_finished(), "the run's first event is still being applied");
    let status = a.terminate(Duration::from_secs(15));
    assert!(status.code().is_some(), "it exited on its own, not by a signal: {status:?}");
    starting.abort();
    let _ = std::fs::remove_dir_all(dir);
}

/// A coordinator is SIGKILLed while events with triggers pour in: a sender
/// whose answer was lost sends again with the same id, and each (event,
/// trigger) has started exactly one run — the event and its runs commit
/// together, so the kill leaves both or neither.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_sent_when_a_coordinator_is_killed_start_each_triggered_run_once() {
    let mut c = TwoCoordinators::start("kill-mid-events", false).await;
    let clients = c.clients();
    let spec = json!({"name": "triggered", "nodes": [{"id": "t", "type": "TRANSFORM", "config": {"output": "${ .input }"}}],
                      "triggers": [{"event": "signup"}, {"event": "signup", "input": {"twice": "${ .event.id }"}}]});
    assert_eq!(clients[1].post("/v1/workflows", &spec).await.0, 201);
    const EVENTS: usize = 200;
    let event = |i: usize| json!({"name": "signup", "id": format!("u-{i}"), "payload": {"user": i}});
    // Killed while they pour in: once the first few were answered.
    let answered = c.send_events_and_kill((0..EVENTS).map(event).collect(), 10).await;
    assert!(answered < EVENTS, "the kill came before every event was sent ({answered})");
    // Every sender retries on the survivor, with its event's id.
    for i in 0..EVENTS {
        let (status, sent) = clients[1].post("/v1/events", &event(i)).await;
        assert_eq!(status, 200, "{sent}");
        assert_eq!(sent["started_runs"].as_array().unwrap().len(), 2, "u-{i}: {sent}");
        // The one in flight at the kill may have committed, its answer lost.
        if i != answered {
            assert_eq!(sent["duplicate"], json!(i < answered), "u-{i} (answered {answered}): {sent}");
        }
    }
    let mut runs = 0;
    let mut cursor = String::new();
    loop {
        let page = clients[1].get(&format!("/v1/runs?workflow=triggered&limit=1000{cursor}")).await;
        runs += page["runs"].as_array().unwrap().len();
        match page["next_cursor"].as_str() {
            Some(next) => cursor = format!("&cursor={next}"),
            None => break,
        }
    }
    assert_eq!(runs, 2 * EVENTS, "one run per (event, trigger)");
    c.stop();
}

/// SIGTERM waited 5 s more than its grace when the OTLP receiver took the
/// connection and never answered: the last spans' flush now has only what
/// is left of the grace.
#[tokio::test]
async fn sigterm_does_not_wait_past_its_grace_for_a_trace_receiver_that_hangs() {
    let db = TestDb::create().await;
    let redis = services().redis_url.clone();
    let dir = composer_embedded::temp_dir("grace-otlp").unwrap();
    let listen = format!("127.0.0.1:{}", composer_embedded::free_port().unwrap());
    let addr_file = dir.join("a.addr");
    // Takes connections and reads nothing: an export hangs to its timeout.
    let receiver = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let endpoint = format!("http://{}", receiver.local_addr().unwrap());
    let mut a = Proc::spawn(
        coordinator_cmd(&db, &redis, &unique_prefix(), &listen, &addr_file)
            .env("COMPOSER_SHUTDOWN_GRACE", "1s")
            .env("COMPOSER_OTLP_ENDPOINT", &endpoint),
    );
    let client = Client::new(&wait_for_file(&addr_file, Duration::from_secs(30)).await);
    let spec = json!({"name": "traced", "nodes": [{"id": "t", "type": "TRANSFORM", "config": {"output": 1}}]});
    assert_eq!(client.post("/v1/workflows", &spec).await.0, 201);
    for _ in 0..5 {
        let (_, run) = client.post("/v1/runs", &json!({"workflow": "traced"})).await;
        client.wait_for_run(run["id"].as_str().unwrap(), Duration::from_secs(30)).await;
    }
    let started = Instant::now();
    let status = a.terminate(Duration::from_secs(15));
    assert!(status.success(), "{status:?}");
    // The grace (1 s), and time to start stopping; the export's own
    // timeout is 5 s, which this used to add.
    assert!(started.elapsed() < Duration::from_secs(4), "stopped in {:?}", started.elapsed());
    drop(receiver);
    let _ = std::fs::remove_dir_all(dir);
}
