//! Coordinators and workers in this process, on a test's own database and
//! key prefix, with helpers that speak the REST API.

use std::time::Duration;

use composer_api::StartRun;
use composer_coord::Running;
use composer_worker::{Stats, Worker};
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::eventually::eventually;
use crate::services::{services, unique_prefix, TestDb};

/// How an [`Engine`] is set up; the defaults suit fast tests.
pub struct EngineOptions {
    pub coordinators: usize,
    pub workers: usize,
    pub worker_concurrency: usize,
    pub lease_ttl: Duration,
    /// Adjusts every coordinator's configuration.
    pub coordinator: fn(&mut composer_coord::Config),
    /// Adjusts every worker's configuration.
    pub worker: fn(&mut composer_worker::Config),
    /// Workers call the first coordinator in this process directly
    /// (`Worker::in_process`, as `composer dev`'s does) instead of over HTTP.
    pub in_process: bool,
}

impl Default for EngineOptions {
    fn default() -> Self {
        EngineOptions {
            coordinators: 1,
            workers: 1,
            worker_concurrency: 8,
            lease_ttl: Duration::from_secs(3),
            coordinator: |_| {},
            worker: |_| {},
            in_process: false,
        }
    }
}

/// A running worker of the engine.
pub struct WorkerHandle {
    pub id: String,
    pub stats: Stats,
    shutdown: CancellationToken,
    join: tokio::task::JoinHandle<Result<(), composer_worker::Error>>,
}

impl WorkerHandle {
    /// Graceful stop: in-flight tasks finish and report.
    pub async fn stop(self) {
        self.shutdown.cancel();
        let _ = self.join.await;
    }

    /// Stops at once, like a crash: no report, no ack, leases left to expire.
    pub fn abort(self) {
        self.join.abort();
    }
}

pub struct Engine {
    pub db: TestDb,
    pub prefix: String,
    pub redis_url: String,
    pub coordinators: Vec<Running>,
    pub workers: Vec<WorkerHandle>,
    opts: EngineOptions,
    http: reqwest::Client,
}

impl Engine {
    pub async fn start() -> Engine {
        Engine::with(EngineOptions::default()).await
    }

    pub async fn with(opts: EngineOptions) -> Engine {
        let db = TestDb::create().await;
        let redis_url = services().redis_url.clone();
        Engine::on(db, redis_url, opts).await
    }

    /// An engine on the given database and Redis (tests that break a service
    /// bring their own).
    pub async fn on(db: TestDb, redis_url: String, opts: EngineOptions) -> Engine {
        let http = reqwest::Client::builder().timeout(Duration::from_secs(90)).build().expect("test HTTP client");
        let mut e = Engine {
            db,
            prefix: unique_prefix(),
            redis_url,
            coordinators: Vec::new(),
            workers: Vec::new(),
            opts,
            http,
        };
        for _ in 0..e.opts.coordinators {
            e.start_coordinator().await;
        }
        for i in 0..e.opts.workers {
            e.start_worker(&format!("w{i}"), e.opts.worker_concurrency).await;
        }
        e
    }

    pub fn coordinator_config(&self) -> composer_coord::Config {
        let mut c = composer_coord::Config::new(self.db.url.clone(), self.redis_url.clone());
        c.redis.prefix = self.prefix.clone();
        c.listen = "127.0.0.1:0".parse().expect("loopback address");
        c.stream_shards = 2;
        c.db_pool_size = 8;
        c.outbox_poll_interval = Duration::from_millis(200);
        c.timer_interval = Duration::from_millis(100);
        c.recovery_interval = Duration::from_millis(500);
        c.metrics_interval = Duration::from_secs(1);
        c.lease_ttl = self.opts.lease_ttl;
        (self.opts.coordinator)(&mut c);
        c
    }

    pub async fn start_coordinator(&mut self) -> &Running {
        self.start_coordinator_with(self.coordinator_config()).await
    }

    pub async fn start_coordinator_with(&mut self, config: composer_coord::Config) -> &Running {
        let running = composer_coord::start(config).await.expect("starting a coordinator");
        self.coordinators.push(running);
        self.coordinators.last().expect("just pushed")
    }

    pub fn coordinator_urls(&self) -> Vec<String> {
        self.coordinators.iter().map(|c| format!("http://{}", c.addr)).collect()
    }

    pub fn worker_config(&self, id: &str, concurrency: usize) -> composer_worker::Config {
        let mut c = composer_worker::Config::new(self.coordinator_urls());
        c.options.id = format!("{id}-{}", &Uuid::now_v7().simple().to_string()[20..]);
        c.options.concurrency = concurrency;
        c.options.poll_wait = Duration::from_millis(500);
        c.options.report_deadline = Duration::from_secs(10);
        (self.opts.worker)(&mut c);
        c
    }

    /// Starts a worker with the built-in types.
    pub async fn start_worker(&mut self, id: &str, concurrency: usize) -> &WorkerHandle {
        let worker = self.worker(Worker::new(self.worker_config(id, concurrency)));
        self.spawn_worker(worker)
    }

    /// `worker` as this engine runs its workers: calling the first
    /// coordinator in this process when `in_process` is set.
    pub fn worker(&self, worker: Worker) -> Worker {
        match (self.opts.in_process, self.coordinators.first()) {
            (true, Some(c)) => worker.in_process(c.in_process()),
            _ => worker,
        }
    }

    /// Runs a worker the test built (with its own handlers).
    /// Starts coordinator `i`'s own HTTP executor with `slots`, as
    /// `composer coordinator` does, its configuration adjusted by `adjust`;
    /// it is one of [`Engine::workers`] (its id starts `coordinator-`).
    pub fn start_coordinators_http(
        &mut self,
        i: usize,
        slots: usize,
        adjust: fn(&mut composer_worker::Config),
    ) -> &WorkerHandle {
        let mut config = self.worker_config("http", slots);
        adjust(&mut config);
        let api = self.coordinators[i].http_executor();
        self.spawn_worker(Worker::coordinators_http(config, api, slots))
    }

    pub fn spawn_worker(&mut self, worker: Worker) -> &WorkerHandle {
        let id = worker.id().to_string();
        let stats = Stats::default();
        let shutdown = CancellationToken::new();
        let join = tokio::spawn(worker.run_with_stats(shutdown.clone(), stats.clone()));
        self.workers.push(WorkerHandle { id, stats, shutdown, join });
        self.workers.last().expect("just pushed")
    }

    /// The run's task for `node_id`, as the API shows it.
    pub async fn task(&self, run: Uuid, node_id: &str) -> Value {
        let (_, r) = self.get(&format!("/v1/runs/{run}")).await;
        r["tasks"].as_array().and_then(|t| t.iter().find(|t| t["node_id"] == node_id).cloned()).unwrap_or(Value::Null)
    }

    /// Polls until `check` holds for the run (as the API shows it).
    pub async fn wait_until(&self, run: Uuid, timeout: Duration, check: impl Fn(&Value) -> bool) -> Value {
        let check = &check;
        eventually(timeout, format!("run {run}: the condition awaited"), || async move {
            let (_, r) = self.get(&format!("/v1/runs/{run}")).await;
            if check(&r) {
                Ok(r)
            } else {
                Err(r)
            }
        })
        .await
    }

    /// Waits until the lease on `task` has expired by the database's clock,
    /// the one a takeover or a recovery judges it by (or is gone: a sweep
    /// that acted on the expired lease may have cleared it).
    pub async fn wait_for_lease_expiry(&self, task: Uuid, within: Duration) {
        let pool = self.db.pool();
        eventually(within, format!("the lease on task {task} to expire"), || async {
            let c = pool.get().await.unwrap();
            let sql = "SELECT lease_expires_at IS NULL OR lease_expires_at < now() FROM task_instances WHERE id = $1";
            let expired: bool = c.query_one(sql, &[&task]).await.unwrap().get(0);
            expired.then_some(()).ok_or("a live lease")
        })
        .await;
    }

    /// The run's history entries of `kind`.
    pub async fn history(&self, run: Uuid, kind: &str) -> Vec<Value> {
        let (_, h) = self.get(&format!("/v1/runs/{run}/events?limit=1000")).await;
        h["events"].as_array().map(|e| e.iter().filter(|e| e["type"] == kind).cloned().collect()).unwrap_or_default()
    }

    /// Base URL of the first coordinator.
    pub fn url(&self) -> String {
        self.coordinator_urls().into_iter().next().expect("the engine has a coordinator")
    }

    async fn send(&self, req: reqwest::RequestBuilder) -> (u16, Value) {
        let resp = req.send().await.expect("request to the coordinator");
        let status = resp.status().as_u16();
        let text = resp.text().await.expect("response body");
        (status, serde_json::from_str(&text).unwrap_or(Value::String(text)))
    }

    pub async fn get(&self, path: &str) -> (u16, Value) {
        self.send(self.http.get(format!("{}{path}", self.url()))).await
    }

    pub async fn delete(&self, path: &str) -> (u16, Value) {
        self.send(self.http.delete(format!("{}{path}", self.url()))).await
    }

    pub async fn post(&self, path: &str, body: &Value) -> (u16, Value) {
        self.send(self.http.post(format!("{}{path}", self.url())).json(body)).await
    }

    /// [`Engine::post`] with headers of its own.
    pub async fn post_with(&self, path: &str, body: &Value, headers: &[(&str, &str)]) -> (u16, Value) {
        let mut req = self.http.post(format!("{}{path}", self.url())).json(body);
        for (name, value) in headers {
            req = req.header(*name, *value);
        }
        self.send(req).await
    }

    pub async fn put(&self, path: &str, body: &Value) -> (u16, Value) {
        self.send(self.http.put(format!("{}{path}", self.url())).json(body)).await
    }

    pub async fn post_raw(&self, path: &str, body: &str) -> (u16, Value) {
        self.send(
            self.http
                .post(format!("{}{path}", self.url()))
                .header("content-type", "application/json")
                .body(body.to_string()),
        )
        .await
    }

    /// Registers a definition, asserting it was accepted.
    pub async fn register(&self, spec: &Value) -> Value {
        let (status, body) = self.post("/v1/workflows", spec).await;
        assert!(status == 200 || status == 201, "register failed with {status}: {body}");
        body
    }

    /// The typed API client of the first coordinator.
    pub fn client(&self) -> composer_client::Client {
        composer_client::Client::new(self.http.clone(), &self.url(), None)
    }

    /// Starts a run of the latest version of `workflow`.
    pub async fn start_run(&self, workflow: &str, input: Value) -> Uuid {
        let req = StartRun {
            workflow: workflow.to_string(),
            version: None,
            input: Some(input),
            idempotency_key: None,
            tags: None,
            priority: None,
        };
        self.client().start_run(&req).await.expect("starting a run").id
    }

    /// Registers `spec` and starts a run of it with empty input.
    pub async fn run(&self, spec: &Value) -> Uuid {
        self.register(spec).await;
        self.start_run(spec["name"].as_str().expect("spec name"), json!({})).await
    }

    /// Waits until the run ends (long-polling the API) and returns it; fails
    /// the test with the run's state if it does not end within `timeout`.
    pub async fn wait_for_run(&self, id: Uuid, timeout: Duration) -> Value {
        let run = self.client().wait_for_run(id, timeout).await.expect("reading the run");
        let json = serde_json::to_value(&run).expect("a run is JSON");
        if !run.status.is_terminal() {
            panic!(
                "run {id} did not end within {timeout:?}: {}",
                serde_json::to_string_pretty(&json).unwrap_or_default()
            );
        }
        json
    }

    /// Waits until bulk job `id` is no longer RUNNING and returns it.
    pub async fn wait_for_bulk_job(&self, id: &str, timeout: Duration) -> Value {
        eventually(timeout, format!("bulk job {id} to end"), || async {
            let (_, job) = self.get(&format!("/v1/bulk/{id}")).await;
            if job["status"] != "RUNNING" {
                Ok(job)
            } else {
                Err(job)
            }
        })
        .await
    }

    /// Stops workers, then coordinators.
    pub async fn stop(mut self) {
        for w in self.workers.drain(..) {
            w.stop().await;
        }
        for c in self.coordinators.drain(..) {
            c.stop().await;
        }
    }
}

/// An HTTP node calling `url`, with quick retries for tests.
pub fn http_node(id: &str, url: &str, max_attempts: u32) -> Value {
    json!({"id": id, "type": "HTTP", "config": {"url": url},
           "retry": {"max_attempts": max_attempts, "initial_backoff": "100ms", "max_backoff": "500ms"}})
}
