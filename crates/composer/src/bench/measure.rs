//! What the bench measures and how: the targets it drives, the phases
//! (latency, throughput, MAP, timers, history), PostgreSQL's work per
//! step, and the summary it prints.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use composer_embedded::{LocalPostgres, LocalRedis, PgOptions};
use serde_json::{json, Value};
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use composer_api::{DefinitionView, RunView, StartRun};
use composer_client::Client;
use composer_config::non_empty;
use composer_core::machine::RunStatus;
use composer_store::fixtures;

use crate::cli::BenchArgs;

/// What the bench drives: a Composer URL and the database behind it.
pub(super) struct Target {
    pub(super) url: String,
    pub(super) database_url: Option<String>,
    pub(super) _embedded: Option<Embedded>,
}

/// The embedded default: PostgreSQL (fsync on), Redis, a coordinator and a
/// worker in this process, all stopped on drop.
pub(super) struct Embedded {
    pub(super) coordinator: Option<composer_coord::Running>,
    pub(super) worker: CancellationToken,
    pub(super) _pg: LocalPostgres,
    pub(super) _redis: LocalRedis,
    pub(super) dir: std::path::PathBuf,
}

impl Drop for Embedded {
    fn drop(&mut self) {
        self.worker.cancel();
        if let Some(c) = self.coordinator.take() {
            c.abort();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The payload limit of the embedded coordinator under `--map`: a MAP's
/// output holds every item's (10,000 HTTP outputs are about 1.5 MB).
pub(super) const MAP_BENCH_MAX_PAYLOAD: usize = 16 * 1024 * 1024;

pub(super) async fn start_embedded(concurrency: usize, max_payload: Option<usize>) -> anyhow::Result<Target> {
    let dir = composer_embedded::temp_dir("bench")?;
    let pg_dir = dir.join("pg");
    let redis_dir = dir.join("redis");
    let (pg, redis) = tokio::task::spawn_blocking(move || {
        let pg = LocalPostgres::start(PgOptions { data_dir: pg_dir, port: None, fsync: true, max_connections: 200 })?;
        let redis = LocalRedis::start(&redis_dir, None)?;
        Ok::<_, composer_embedded::Error>((pg, redis))
    })
    .await??;
    composer_store::ensure_database(&pg.url("postgres"), "composer").await?;
    let database_url = pg.url("composer");
    let mut cfg = composer_coord::Config::new(database_url.clone(), redis.url());
    cfg.listen = "127.0.0.1:0".parse()?;
    cfg.db_pool_size = 32;
    if let Some(max) = max_payload {
        cfg.max_payload = max;
    }
    if let Some(n) = std::env::var("COMPOSER_ENGINE_WORKERS").ok().and_then(|v| v.parse().ok()) {
        cfg.engine_workers = n;
    }
    // What keeping the tables' statistics costs: 0 turns it off.
    if let Some(n) = std::env::var("COMPOSER_ANALYZE_MIN_ROWS").ok().and_then(|v| v.parse().ok()) {
        cfg.analyze_min_rows = n;
    }
    if let Some(d) =
        std::env::var("COMPOSER_ANALYZE_INTERVAL").ok().and_then(|v| composer_core::duration::parse(&v).ok())
    {
        cfg.analyze_interval = d;
    }
    // What tracing costs: the bench's coordinator sends its spans where a coordinator would.
    cfg.otlp_endpoint = std::env::var("COMPOSER_OTLP_ENDPOINT").ok().filter(|v| !v.is_empty());
    let coordinator = composer_coord::start(cfg).await?;
    let url = format!("http://{}", coordinator.addr);
    let mut wcfg = composer_worker::Config::new(vec![url.clone()]);
    wcfg.options.concurrency = concurrency.max(1);
    let worker = CancellationToken::new();
    tokio::spawn(composer_worker::Worker::new(wcfg).run(worker.clone()));
    let embedded = Embedded { coordinator: Some(coordinator), worker, _pg: pg, _redis: redis, dir };
    Ok(Target { url, database_url: Some(database_url), _embedded: Some(embedded) })
}

/// The fastest HTTP endpoint we can offer: 200 `{}`.
pub(super) async fn start_sink() -> anyhow::Result<String> {
    let app = axum::Router::new().fallback(|| async { axum::Json(json!({})) });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move { axum::serve(listener, app).await });
    Ok(format!("http://{addr}"))
}

pub(super) fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((p / 100.0) * (sorted.len() - 1) as f64).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

pub(super) fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

pub(super) fn round2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

pub(super) fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

/// Observations and their sum in seconds, per stage of
/// `composer_step_stage_seconds`, read from Prometheus text.
pub(super) type StageSums = HashMap<String, (f64, f64)>;

pub(super) fn parse_stages(text: &str, into: &mut StageSums) {
    const NAME: &str = "composer_step_stage_seconds_";
    for line in text.lines() {
        let Some(rest) = line.strip_prefix(NAME) else { continue };
        let (which, rest) = match rest.split_once("{stage=\"") {
            Some((which @ ("sum" | "count"), rest)) => (which, rest),
            _ => continue,
        };
        let Some((stage, value)) = rest.split_once("\"} ") else { continue };
        let Ok(value) = value.trim().parse::<f64>() else { continue };
        let entry = into.entry(stage.to_string()).or_insert((0.0, 0.0));
        match which {
            "count" => entry.0 += value,
            _ => entry.1 += value,
        }
    }
}

/// The stages as the coordinators and workers at `urls` count them now; a
/// URL that does not answer adds nothing.
pub(super) async fn read_stages(http: &reqwest::Client, urls: &[String]) -> StageSums {
    let mut sums = StageSums::new();
    for url in urls {
        let text = match http.get(url).timeout(Duration::from_secs(5)).send().await {
            Ok(r) if r.status().is_success() => r.text().await.unwrap_or_default(),
            _ => continue,
        };
        parse_stages(&text, &mut sums);
    }
    sums
}

/// How a step's task reached its worker, by the coordinator's counters:
/// through a stream, with a result's answer, or to a poll waiting for work.
pub(super) const DISPATCH_COUNTERS: [&str; 3] =
    ["composer_dispatches_total", "composer_eager_dispatches_total", "composer_idle_poll_dispatches_total"];

/// [`DISPATCH_COUNTERS`] as the coordinator at `url` counts them now
/// (zeros when it does not answer).
pub(super) async fn read_dispatches(http: &reqwest::Client, url: &str) -> [f64; 3] {
    let text = match http.get(url).timeout(Duration::from_secs(5)).send().await {
        Ok(r) if r.status().is_success() => r.text().await.unwrap_or_default(),
        _ => String::new(),
    };
    std::array::from_fn(|i| {
        text.lines()
            .filter_map(|l| l.strip_prefix(DISPATCH_COUNTERS[i])?.strip_prefix(' ')?.trim().parse::<f64>().ok())
            .sum()
    })
}

/// Mean milliseconds per stage between two readings, in the order a step
/// passes them; stages nobody observed are left out.
pub(super) fn stage_means(before: &StageSums, after: &StageSums) -> Vec<(&'static str, f64)> {
    composer_metrics::STAGES
        .iter()
        .filter_map(|&stage| {
            let (n1, s1) = after.get(stage).copied()?;
            let (n0, s0) = before.get(stage).copied().unwrap_or((0.0, 0.0));
            (n1 > n0).then(|| (stage, (s1 - s0) * 1000.0 / (n1 - n0)))
        })
        .collect()
}

/// Step transitions of a finished run: each step's finish to the next one's start.
pub(super) fn transitions(run: &RunView, steps: usize) -> Vec<f64> {
    (1..steps)
        .filter_map(|i| {
            let done = run.task(&format!("s{i}"))?.finished_at?;
            let next = run.task(&format!("s{}", i + 1))?.started_at?;
            Some((next - done).num_microseconds()? as f64 / 1000.0)
        })
        .collect()
}

/// Waits for many runs by listening to the engine's run-finished
/// notifications, so the bench itself adds no queries to what it measures.
pub(super) struct Completions {
    pub(super) waiting: Mutex<HashMap<Uuid, oneshot::Sender<()>>>,
    /// Runs that finished before anyone waited for them.
    pub(super) early: Mutex<std::collections::HashSet<Uuid>>,
}

impl Completions {
    pub(super) async fn watch(self: Arc<Self>, database_url: String, stop: CancellationToken) -> anyhow::Result<()> {
        let channel = composer_store::transitions::RUN_DONE_CHANNEL;
        let mut listener = composer_store::notifications::Listener::connect(&database_url, &[channel]).await?;
        loop {
            let n = tokio::select! {
                _ = stop.cancelled() => return Ok(()),
                n = listener.recv() => match n { Some(n) => n, None => bail!(listener.closed().await) },
            };
            let Ok(id) = n.payload.parse::<Uuid>() else { continue };
            match self.waiting.lock().expect("completions").remove(&id) {
                Some(tx) => {
                    let _ = tx.send(());
                }
                None => {
                    self.early.lock().expect("completions").insert(id);
                }
            }
        }
    }

    pub(super) fn expect(&self, id: Uuid) -> oneshot::Receiver<()> {
        let (tx, rx) = oneshot::channel();
        let mut waiting = self.waiting.lock().expect("completions");
        if self.early.lock().expect("completions").remove(&id) {
            let _ = tx.send(());
        } else {
            waiting.insert(id, tx);
        }
        rx
    }
}

pub(super) async fn connect_db(database_url: &str) -> anyhow::Result<composer_store::tokio_postgres::Client> {
    let (client, _driver) = composer_store::open(database_url).await?;
    Ok(client)
}

/// Inserts `n` finished runs of `workflow` (3 tasks each), in batches of 100,000.
pub(super) async fn prefill(database_url: &str, definition: Uuid, workflow: &str, n: u64) -> anyhow::Result<()> {
    let client = connect_db(database_url).await?;
    let mut done = 0i64;
    while (done as u64) < n {
        let chunk = ((n as i64) - done).min(100_000);
        fixtures::insert_finished_runs(&client, definition, workflow, done, chunk).await?;
        done += chunk;
    }
    client.batch_execute("ANALYZE workflow_runs; ANALYZE task_instances").await?;
    Ok(())
}

/// `n` runs of a one-WAIT workflow, inserted as the engine would leave them;
/// 1,000 come due over the next 20 s, the rest in an hour. Returns (pending,
/// fired, sorted lateness in ms of the ones that came due).
pub(super) async fn timer_lateness(api: &Client, database_url: &str, n: u64) -> anyhow::Result<(u64, usize, Vec<f64>)> {
    const WORKFLOW: &str = "bench-timer";
    let spec = json!({"name": WORKFLOW, "nodes": [{"id": "w", "type": "WAIT", "config": {"duration": "1h"}}]});
    let def: DefinitionView = api.call(reqwest::Method::POST, "/v1/workflows", Some(&spec)).await?;
    let client = connect_db(database_url).await?;
    let due = n.min(1000) as i64;
    let t0 = Instant::now();
    fixtures::insert_pending_waits(&client, def.id, WORKFLOW, def.version, n as i64, due).await?;
    eprintln!(
        "inserted {n} pending WAITs in {:.1} s; waiting for {due} of them to come due …",
        t0.elapsed().as_secs_f64()
    );
    let until = Instant::now() + Duration::from_secs(60);
    loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let (fired, left) = fixtures::wait_progress(&client, WORKFLOW).await?;
        if left == 0 || Instant::now() > until {
            let late = fixtures::wait_lateness_ms(&client, WORKFLOW).await?;
            return Ok((n, fired as usize, late));
        }
    }
}

pub(super) async fn commits(database_url: &str) -> anyhow::Result<i64> {
    Ok(work(database_url, CpuAt::End).await?.commits)
}

/// How long a backend may hold statistics it has not reported: one that
/// went idle less than a second after its last report sends the rest only
/// after PostgreSQL's idle interval (PGSTAT_IDLE_INTERVAL, 10 s).
pub(super) const STATS_SETTLE: Duration = Duration::from_secs(11);

/// What PostgreSQL has done so far: commits, row writes, and the CPU time
/// of its server processes (when it runs on this machine: read from /proc).
#[derive(Debug, Clone, Copy)]
pub(super) struct Work {
    pub(super) commits: i64,
    /// Inserts, updates, HOT updates, deletes.
    pub(super) rows: [i64; 4],
    pub(super) cpu_s: Option<f64>,
}

/// When [`work`] reads the CPU: at the start of its wait for the statistics
/// (the end of a phase) or at its end (just before a phase starts).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum CpuAt {
    Start,
    End,
}

/// Reads [`Work`] once every backend has reported what came before the call.
pub(super) async fn work(database_url: &str, cpu_at: CpuAt) -> anyhow::Result<Work> {
    let client = connect_db(database_url).await?;
    let pid = fixtures::backend_pid(&client).await?;
    let cpu_start = server_cpu_seconds(pid);
    tokio::time::sleep(STATS_SETTLE).await;
    Ok(Work {
        commits: fixtures::commits(&client).await?,
        rows: fixtures::row_writes(&client).await?,
        cpu_s: if cpu_at == CpuAt::Start { cpu_start } else { server_cpu_seconds(pid) },
    })
}

/// CPU seconds (user + system) of the PostgreSQL server that runs backend
/// `pid`: its postmaster and every child of it. A backend that exited is
/// not counted, so pooled connections (which stay) give the truest figure.
pub(super) fn server_cpu_seconds(backend: i32) -> Option<f64> {
    // Fields after the command (which is in parentheses and may hold spaces).
    let stat = |pid: &str| -> Option<Vec<String>> {
        let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        Some(text.rsplit_once(')')?.1.split_whitespace().map(str::to_string).collect())
    };
    // After the command: state, ppid, …; utime and stime are the 12th and 13th.
    let postmaster = stat(&backend.to_string())?.get(1)?.clone();
    let ticks = |f: &[String]| -> f64 { f[11].parse::<f64>().unwrap_or(0.0) + f[12].parse::<f64>().unwrap_or(0.0) };
    let mut total = ticks(&stat(&postmaster)?);
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if !name.bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        if let Some(f) = stat(&name) {
            if f.len() > 12 && f[1] == postmaster {
                total += ticks(&f);
            }
        }
    }
    // SAFETY: sysconf has no preconditions; it reads a constant of the system.
    #[allow(unsafe_code)]
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    (hz > 0).then(|| total / hz as f64)
}

/// pgbench's rate for one task's minimal writes — a task row and an outbox
/// row in one commit — on the same server, for `seconds`, with `clients`.
pub(super) async fn baseline(database_url: &str, seconds: u64, clients: usize) -> anyhow::Result<f64> {
    let client = connect_db(database_url).await?;
    fixtures::create_baseline_tables(&client).await?;
    let script = std::env::temp_dir().join(format!("composer-baseline-{}.sql", std::process::id()));
    std::fs::write(&script, fixtures::BASELINE_SCRIPT)?;
    let pgbench = composer_embedded::postgres_bin_dir()?.join("pgbench");
    let out = tokio::process::Command::new(pgbench)
        .args(["-n", "-M", "prepared", "-c", &clients.to_string(), "-j", "2", "-T", &seconds.max(1).to_string(), "-f"])
        .arg(&script)
        .arg(database_url)
        .output()
        .await
        .context("running pgbench")?;
    let _ = std::fs::remove_file(&script);
    fixtures::drop_baseline_tables(&client).await?;
    let text = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        bail!("pgbench failed: {}{}", text, String::from_utf8_lossy(&out.stderr));
    }
    text.lines()
        .find_map(|l| l.strip_prefix("tps = ").and_then(|r| r.split_whitespace().next()).and_then(|n| n.parse().ok()))
        .context("no tps line in pgbench's output")
}

pub(super) async fn start(api: &Client, workflow: &str) -> anyhow::Result<Uuid> {
    let req = StartRun {
        workflow: workflow.to_string(),
        version: None,
        input: None,
        idempotency_key: None,
        tags: None,
        priority: None,
    };
    Ok(api.start_run(&req).await?.id)
}

/// Sorted samples of the latency phase, in ms.
pub(super) struct Latency {
    e2e: Vec<f64>,
    pub(super) starts: Vec<f64>,
    pub(super) gets: Vec<f64>,
    pub(super) steps: Vec<f64>,
}

/// One run at a time, after a warm-up: end-to-end latency, step
/// transitions, and the start and get calls on their own.
pub(super) async fn measure_latency(api: &Client, workflow: &str, args: &BenchArgs) -> anyhow::Result<Latency> {
    for _ in 0..args.warmup {
        let id = start(api, workflow).await?;
        api.wait_for_run(id, Duration::from_secs(600)).await?;
    }
    let mut l = Latency { e2e: Vec::new(), starts: Vec::new(), gets: Vec::new(), steps: Vec::new() };
    for _ in 0..args.latency_runs {
        let t0 = Instant::now();
        let id = start(api, workflow).await?;
        l.starts.push(ms(t0.elapsed()));
        let run = api.wait_for_run(id, Duration::from_secs(600)).await?;
        l.e2e.push(ms(t0.elapsed()));
        if run.status != RunStatus::Succeeded {
            bail!("a latency run did not succeed: {run:?}");
        }
        l.steps.extend(transitions(&run, args.steps));
        let t1 = Instant::now();
        api.get_run(id).await?;
        l.gets.push(ms(t1.elapsed()));
    }
    for v in [&mut l.e2e, &mut l.starts, &mut l.gets, &mut l.steps] {
        v.sort_by(f64::total_cmp);
    }
    Ok(l)
}

/// `args.runs` workflows with `args.concurrency` in flight; returns the wall
/// time in seconds. Completions come from NOTIFY when the database is known,
/// so the bench adds no polling to what it measures.
pub(super) async fn measure_throughput(
    api: &Client,
    target: &Target,
    workflow: &str,
    args: &BenchArgs,
) -> anyhow::Result<f64> {
    let stop = CancellationToken::new();
    let completions = Arc::new(Completions { waiting: Mutex::new(HashMap::new()), early: Mutex::default() });
    if let Some(db) = &target.database_url {
        tokio::spawn(completions.clone().watch(db.clone(), stop.clone()));
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let next = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let mut clients = Vec::new();
    for _ in 0..args.concurrency {
        let (api, next, completions, workflow) = (api.clone(), next.clone(), completions.clone(), workflow.to_string());
        let by_db = target.database_url.is_some();
        let runs = args.runs;
        clients.push(tokio::spawn(async move {
            while next.fetch_add(1, Ordering::Relaxed) < runs {
                let id = start(&api, &workflow).await?;
                if by_db {
                    completions.expect(id).await.context("completion watcher stopped")?;
                } else {
                    api.wait_for_run(id, Duration::from_secs(600)).await?;
                }
            }
            Ok::<_, anyhow::Error>(())
        }));
    }
    for c in clients {
        c.await??;
    }
    stop.cancel();
    Ok(started.elapsed().as_secs_f64())
}

pub(super) fn validate(args: &BenchArgs) -> anyhow::Result<()> {
    if args.steps == 0 || args.steps > 100 {
        bail!("--steps must be between 1 and 100");
    }
    if args.concurrency == 0 || args.concurrency > composer_worker::MAX_WORKER_SLOTS {
        // The embedded worker has a slot per workflow in flight.
        bail!("--concurrency must be between 1 and {}", composer_worker::MAX_WORKER_SLOTS);
    }
    if let Some(n) = args.task_api {
        if n == 0 || n > 64 {
            bail!("--task-api must be between 1 and 64 pollers");
        }
        if args.map.is_some() {
            bail!("--task-api and --map are separate benches");
        }
    }
    if let Some(n) = args.map {
        if n == 0 || n > composer_core::definition::MAP_MAX_ITEMS {
            bail!("--map must be between 1 and {}", composer_core::definition::MAP_MAX_ITEMS);
        }
    }
    Ok(())
}

/// `--map N`: one run of a MAP of N HTTP items to the sink, after a warm-up
/// run of 100 items; prints items per second and commits per item.
pub(super) async fn bench_map(
    api: &Client,
    target: &Target,
    sink: &str,
    args: &BenchArgs,
    n: usize,
) -> anyhow::Result<()> {
    let mut config = json!({"items": "${ [range(.input.n)] }",
        "node": {"type": "HTTP", "config": {"method": "POST", "url": format!("{sink}/item"), "body": {"i": "${ .index }"}}}});
    if let Some(c) = args.map_concurrency {
        config["max_concurrency"] = json!(c);
    }
    config["collect"] = json!(args.collect);
    let workflow = "bench-map";
    let spec = json!({"name": workflow, "nodes": [{"id": "each", "type": "MAP", "config": config}]});
    let _: DefinitionView = api.call(reqwest::Method::POST, "/v1/workflows", Some(&spec)).await?;
    let run_map = |items: usize| async move {
        let req = StartRun {
            workflow: workflow.to_string(),
            version: None,
            input: Some(json!({"n": items})),
            idempotency_key: None,
            tags: None,
            priority: None,
        };
        let t0 = Instant::now();
        let id = api.start_run(&req).await?.id;
        let run = api.wait_for_run(id, Duration::from_secs(3600)).await?;
        if run.status != RunStatus::Succeeded {
            bail!("the MAP run did not succeed: {:?}", run.error);
        }
        Ok::<_, anyhow::Error>(t0.elapsed().as_secs_f64())
    };
    run_map(100).await?;
    let before = match &target.database_url {
        Some(db) => Some(commits(db).await?),
        None => None,
    };
    let wall = run_map(n).await?;
    let commits_per_item = match (&target.database_url, before) {
        (Some(db), Some(b)) => Some(round2((commits(db).await? - b) as f64 / n as f64)),
        _ => None,
    };
    let items_per_s = round2(n as f64 / wall);
    if args.json {
        let concurrency = args.map_concurrency;
        println!(
            "{}",
            json!({"map": {"items": n, "max_concurrency": concurrency, "collect": args.collect, "wall_s": round2(wall),
                   "items_per_s": items_per_s, "commits_per_item": commits_per_item}})
        );
    } else {
        let concurrency = args.map_concurrency.map_or("all".to_string(), |c| c.to_string());
        println!(
            "composer bench --map — one MAP of {n} HTTP items (max_concurrency {concurrency}, collect {}), against {}",
            args.collect,
            api.base()
        );
        if args.collect == "all" {
            println!("  (an embedded coordinator allows 16 MiB payloads here: the MAP's output holds every item's)");
        }
        println!("  {n} items in {wall:.2} s: {items_per_s:.1} items/s");
        if let Some(c) = commits_per_item {
            println!("  PostgreSQL commits per item: {c:.2}");
        }
    }
    Ok(())
}

/// The queue and type of `--task-api` steps.
pub(super) const TASK_API_QUEUE: &str = "bench-task-api";
pub(super) const TASK_API_TYPE: &str = "bench-echo";

/// Registers the K-step workflow (HTTP steps against the sink, or custom
/// steps for the task API); returns its definition.
pub(super) async fn register(
    api: &Client,
    sink: &str,
    workflow: &str,
    steps: usize,
    task_api: bool,
) -> anyhow::Result<DefinitionView> {
    let nodes: Vec<Value> = (1..=steps)
        .map(|i| match task_api {
            false => json!({"id": format!("s{i}"), "type": "HTTP", "config": {"url": format!("{sink}/s{i}")}}),
            true => json!({"id": format!("s{i}"), "type": TASK_API_TYPE, "queue": TASK_API_QUEUE, "config": {"i": i}}),
        })
        .collect();
    let edges: Vec<Value> = (1..steps).map(|i| json!({"from": format!("s{i}"), "to": format!("s{}", i + 1)})).collect();
    let spec = json!({"name": workflow, "nodes": nodes, "edges": edges});
    Ok(api.call(reqwest::Method::POST, "/v1/workflows", Some(&spec)).await?)
}

/// Every phase against one target: latency (with the step's stages, read
/// from the target's /metrics and `metrics_urls`), throughput with
/// PostgreSQL's work, and the optional baseline and timers.
pub(super) async fn measure(
    args: &BenchArgs,
    target: &Target,
    http: &reqwest::Client,
    sink: &str,
    metrics_urls: &[String],
) -> anyhow::Result<Results> {
    let api = Client::new(http.clone(), &target.url, non_empty(&args.api_token));
    let workflow = match args.task_api {
        Some(_) => format!("bench-task-api-{}", args.steps),
        None => format!("bench-{}", args.steps),
    };
    let def = register(&api, sink, &workflow, args.steps, args.task_api.is_some()).await?;
    let pollers = CancellationToken::new();
    let _stop_pollers = pollers.clone().drop_guard();
    for i in 0..args.task_api.unwrap_or(0) {
        let (http, url, token) = (http.clone(), target.url.clone(), non_empty(&args.api_token));
        tokio::spawn(poll_worker(http, url, token, format!("bench-poller-{i}"), pollers.clone()));
    }
    if args.history > 0 {
        let db = target.database_url.as_deref().context("--history needs the database (COMPOSER_DATABASE_URL)")?;
        let t0 = Instant::now();
        prefill(db, def.id, &workflow, args.history).await?;
        eprintln!("filled {} finished runs in {:.1} s", args.history, t0.elapsed().as_secs_f64());
    }

    let mut urls = vec![format!("{}/metrics", target.url.trim_end_matches('/'))];
    urls.extend(metrics_urls.iter().cloned());
    // The embedded worker runs in this process, without a listener: its
    // registry is read here.
    let in_process = target._embedded.is_some();
    let read = || async {
        let mut sums = read_stages(http, &urls).await;
        if in_process {
            parse_stages(&composer_metrics::WORKER.render(), &mut sums);
        }
        sums
    };
    let stages_before = read().await;
    let dispatched_before = read_dispatches(http, &urls[0]).await;
    let latency = measure_latency(&api, &workflow, args).await?;
    let stages = stage_means(&stages_before, &read().await);
    let dispatched_at = read_dispatches(http, &urls[0]).await;
    let before = match &target.database_url {
        Some(db) => Some(work(db, CpuAt::End).await?),
        None => None,
    };
    let wall = measure_throughput(&api, target, &workflow, args).await?;
    let dispatched_after = read_dispatches(http, &urls[0]).await;
    let total_steps = (args.runs * args.steps) as f64;
    let share = |from: [f64; 3], to: [f64; 3]| -> Option<[f64; 3]> {
        let d: [f64; 3] = std::array::from_fn(|i| to[i] - from[i]);
        let all: f64 = d.iter().sum();
        (all > 0.0).then(|| d.map(|n| n / all))
    };
    let dispatch = [share(dispatched_before, dispatched_at), share(dispatched_at, dispatched_after)];
    let per_step = match (&target.database_url, before) {
        (Some(db), Some(b)) => {
            let a = work(db, CpuAt::Start).await?;
            Some(PerStep {
                commits: (a.commits - b.commits) as f64 / total_steps,
                rows: std::array::from_fn(|i| (a.rows[i] - b.rows[i]) as f64 / total_steps),
                cpu_ms: a.cpu_s.zip(b.cpu_s).map(|(a, b)| (a - b) * 1000.0 / total_steps),
            })
        }
        _ => None,
    };
    let commits_per_step = per_step.map(|p| p.commits);
    let baseline_tps = match (&target.database_url, args.baseline) {
        (Some(db), true) => Some(baseline(db, wall.ceil() as u64, args.concurrency.min(32)).await?),
        (None, true) => bail!("--baseline needs the database: set COMPOSER_DATABASE_URL with --target-url"),
        _ => None,
    };
    let timers = match (args.timers, &target.database_url) {
        (0, _) => None,
        (n, Some(db)) => Some(timer_lateness(&api, db, n).await?),
        (_, None) => bail!("--timers needs the database (COMPOSER_DATABASE_URL)"),
    };
    Ok(Results { latency, stages, dispatch, wall, total_steps, commits_per_step, per_step, baseline_tps, timers })
}

/// The median of some samples; `None` for none.
pub(super) fn median(mut v: Vec<f64>) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    Some(if n % 2 == 1 { v[n / 2] } else { (v[n / 2 - 1] + v[n / 2]) / 2.0 })
}

/// One task-API worker: polls for up to 32 tasks and completes each at
/// once with its input as output, until `stop`. Each completion asks for
/// the task it makes ready (`next`), which is completed the same way; a
/// coordinator that refuses `next` (an older one) is asked without it.
pub(super) async fn poll_worker(
    http: reqwest::Client,
    url: String,
    token: Option<String>,
    id: String,
    stop: CancellationToken,
) {
    let post = |path: String, body: Value| {
        let mut req = http.post(format!("{url}{path}")).json(&body);
        if let Some(t) = &token {
            req = req.bearer_auth(t);
        }
        req.send()
    };
    let eager = AtomicBool::new(true);
    while !stop.is_cancelled() {
        let poll = json!({"worker_id": id, "queues": [TASK_API_QUEUE], "max": 32, "wait": "1s"});
        let batch: Value = match post("/v1/tasks/poll".into(), poll).await {
            Ok(r) if r.status().is_success() => r.json().await.unwrap_or(Value::Null),
            _ => {
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let tasks = batch["tasks"].as_array().cloned().unwrap_or_default();
        let chains = tasks.into_iter().map(|first| async {
            let mut task = first;
            loop {
                let mut body =
                    json!({"worker_id": id, "run_id": task["run_id"], "attempt": task["attempt"], "output": task["input"]});
                if eager.load(Ordering::Relaxed) {
                    body["next"] = json!({"queues": [TASK_API_QUEUE]});
                }
                let path = format!("/v1/tasks/{}/complete", task["id"].as_str().unwrap_or_default());
                let answer = match post(path.clone(), body.clone()).await {
                    Ok(r) if r.status() == reqwest::StatusCode::BAD_REQUEST && body.get("next").is_some() => {
                        eager.store(false, Ordering::Relaxed);
                        body.as_object_mut().map(|b| b.remove("next"));
                        post(path, body).await
                    }
                    r => r,
                };
                let next = match answer {
                    Ok(r) => r.json::<Value>().await.ok().and_then(|a| a["next"].get(0).cloned()),
                    Err(e) => {
                        eprintln!("task API bench worker: complete failed: {e}");
                        None
                    }
                };
                match next {
                    Some(n) => task = n,
                    None => break,
                }
            }
        });
        futures_util::future::join_all(chains).await;
    }
}

/// PostgreSQL's work per step over the throughput phase.
#[derive(Debug, Clone, Copy)]
pub(super) struct PerStep {
    pub(super) commits: f64,
    /// Inserts, updates, HOT updates (of the updates), deletes.
    pub(super) rows: [f64; 4],
    /// CPU of the server's processes; `None` when it is not on this machine.
    pub(super) cpu_ms: Option<f64>,
}

/// Everything measured, for the JSON line or the summary.
pub(super) struct Results {
    pub(super) latency: Latency,
    /// Mean ms per stage of a step over the latency phase.
    pub(super) stages: Vec<(&'static str, f64)>,
    /// Of the tasks the coordinator dispatched in the latency and the
    /// throughput phase, the share of each of [`DISPATCH_COUNTERS`].
    pub(super) dispatch: [Option<[f64; 3]>; 2],
    pub(super) wall: f64,
    pub(super) total_steps: f64,
    pub(super) commits_per_step: Option<f64>,
    pub(super) per_step: Option<PerStep>,
    pub(super) baseline_tps: Option<f64>,
    pub(super) timers: Option<(u64, usize, Vec<f64>)>,
}

pub(super) fn p(v: &[f64], pct: f64) -> f64 {
    round2(percentile(v, pct))
}

impl Results {
    pub(super) fn steps_per_s(&self) -> f64 {
        self.total_steps / self.wall
    }

    pub(super) fn latency_p50(&self) -> f64 {
        percentile(&self.latency.e2e, 50.0)
    }

    pub(super) fn transition_p50(&self) -> f64 {
        percentile(&self.latency.steps, 50.0)
    }

    pub(super) fn timer_p99(&self) -> Option<f64> {
        self.timers.as_ref().map(|(_, _, late)| percentile(late, 99.0))
    }

    pub(super) fn json(&self, args: &BenchArgs) -> Value {
        let l = &self.latency;
        let steps_per_s = self.total_steps / self.wall;
        let dispatched: serde_json::Map<String, Value> = ["latency", "throughput"]
            .iter()
            .zip(self.dispatch)
            .map(|(phase, share)| {
                let share = share.map(|s| {
                    json!({"stream": round3(s[0]), "with_result": round3(s[1]),
                                                 "to_waiting_poll": round3(s[2])})
                });
                (phase.to_string(), share.unwrap_or(Value::Null))
            })
            .collect();
        json!({
            "system": "composer",
            "version": env!("CARGO_PKG_VERSION"),
            "steps": args.steps,
            "task_api_pollers": args.task_api,
            "latency_ms": {"p50": p(&l.e2e, 50.0), "p95": p(&l.e2e, 95.0), "p99": p(&l.e2e, 99.0)},
            "step_transition_ms": {"p50": p(&l.steps, 50.0), "p99": p(&l.steps, 99.0)},
            "step_stages_mean_ms": self.stages.iter().map(|(s, ms)| (s.to_string(), json!(round3(*ms))))
                .collect::<serde_json::Map<_, _>>(),
            "dispatched": dispatched,
            "start_run_ms": {"p50": p(&l.starts, 50.0), "p99": p(&l.starts, 99.0)},
            "get_run_ms": {"p50": p(&l.gets, 50.0), "p99": p(&l.gets, 99.0)},
            "history_runs": args.history,
            "throughput": {"workflows": args.runs, "concurrency": args.concurrency, "seconds": round2(self.wall),
                           "workflows_per_s": round2(args.runs as f64 / self.wall),
                           "steps_per_s": round2(steps_per_s)},
            "commits_per_step": self.commits_per_step.map(round2),
            "postgres_per_step": self.per_step.map(|p| json!({
                "cpu_ms": p.cpu_ms.map(round3),
                "rows": {"inserted": round2(p.rows[0]), "updated": round2(p.rows[1]),
                         "hot_updated": round2(p.rows[2]), "deleted": round2(p.rows[3])}})),
            "timers": self.timers.as_ref().map(|(pending, fired, late)| json!({"pending": pending, "fired": fired,
                "lateness_ms": {"p50": p(late, 50.0), "p99": p(late, 99.0),
                                "max": round2(late.last().copied().unwrap_or(f64::NAN))}})),
            "baseline": self.baseline_tps.map(|tps| json!({"what": "pgbench: task row + outbox row per commit",
                "commits_per_s": round2(tps), "steps_per_s_ratio": round2(steps_per_s / tps)})),
        })
    }

    pub(super) fn print(&self, args: &BenchArgs, base: &str) {
        let l = &self.latency;
        let steps_per_s = self.total_steps / self.wall;
        match args.task_api {
            Some(n) => println!(
                "composer bench — {} sequential custom steps per workflow, served by {n} task-API pollers, against {base}",
                args.steps
            ),
            None => println!("composer bench — {} sequential HTTP steps per workflow, against {base}", args.steps),
        }
        println!(
            "latency ({} runs, one at a time): p50 {:.2} ms, p95 {:.2} ms, p99 {:.2} ms",
            args.latency_runs,
            p(&l.e2e, 50.0),
            p(&l.e2e, 95.0),
            p(&l.e2e, 99.0)
        );
        println!(
            "step transition (finish → next start): p50 {:.2} ms, p99 {:.2} ms",
            p(&l.steps, 50.0),
            p(&l.steps, 99.0)
        );
        if !self.stages.is_empty() {
            let parts: Vec<String> =
                self.stages.iter().map(|(s, ms)| format!("{} {ms:.3}", s.replace('_', " "))).collect();
            println!("step stages (mean ms, one run at a time): {}", parts.join(", "));
        }
        for (phase, share) in ["latency", "throughput"].iter().zip(self.dispatch) {
            if let Some([stream, result, poll]) = share {
                println!(
                    "tasks dispatched in the {phase} phase: {:.0} % through a stream, {:.0} % with a result, {:.0} % to a waiting poll",
                    stream * 100.0,
                    result * 100.0,
                    poll * 100.0
                );
            }
        }
        println!(
            "start run: p50 {:.2} ms, p99 {:.2} ms; get run: p50 {:.2} ms, p99 {:.2} ms (with {} runs of history)",
            p(&l.starts, 50.0),
            p(&l.starts, 99.0),
            p(&l.gets, 50.0),
            p(&l.gets, 99.0),
            args.history
        );
        println!(
            "throughput: {} workflows, {} in flight, in {:.2} s: {:.1} workflows/s, {:.1} steps/s",
            args.runs,
            args.concurrency,
            self.wall,
            args.runs as f64 / self.wall,
            steps_per_s
        );
        if let Some((pending, fired, late)) = &self.timers {
            println!(
                "timers: {fired} of {pending} pending WAITs came due; fired late by p50 {:.0} ms, p99 {:.0} ms, max {:.0} ms",
                percentile(late, 50.0),
                percentile(late, 99.0),
                late.last().copied().unwrap_or(f64::NAN)
            );
        }
        if let Some(c) = self.commits_per_step {
            println!("PostgreSQL commits per step: {c:.2}");
        }
        if let Some(p) = self.per_step {
            let cpu = p.cpu_ms.map_or("not on this machine".to_string(), |c| format!("{c:.3} ms"));
            println!(
                "PostgreSQL per step: CPU {cpu}; rows inserted {:.2}, updated {:.2} ({:.2} HOT), deleted {:.2}",
                p.rows[0], p.rows[1], p.rows[2], p.rows[3]
            );
        }
        if let Some(tps) = self.baseline_tps {
            println!(
                "baseline (pgbench, task + outbox row per commit, same server, {:.0} s): {tps:.0} commits/s; ours {:.2}× of it",
                self.wall.ceil(),
                steps_per_s / tps
            );
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn stage_means_come_from_the_histograms_of_every_process_read() {
        let text = |n: u32, secs: f64| {
            format!(
                "# TYPE composer_step_stage_seconds histogram\n\
                 composer_step_stage_seconds_bucket{{stage=\"read_to_lease\",le=\"0.001\"}} {n}\n\
                 composer_step_stage_seconds_sum{{stage=\"read_to_lease\"}} {secs}\n\
                 composer_step_stage_seconds_count{{stage=\"read_to_lease\"}} {n}\n\
                 composer_step_stage_seconds_sum{{stage=\"report_to_commit\"}} 0.5\n\
                 composer_step_stage_seconds_count{{stage=\"report_to_commit\"}} 100\n\
                 composer_report_duration_seconds_sum 9\n"
            )
        };
        let (mut before, mut after) = (super::StageSums::new(), super::StageSums::new());
        super::parse_stages(&text(10, 0.01), &mut before);
        // Two workers' /metrics add up.
        super::parse_stages(&text(20, 0.03), &mut after);
        super::parse_stages(&text(10, 0.02), &mut after);
        let means = super::stage_means(&before, &after);
        assert_eq!(means.len(), 2, "{means:?}");
        assert_eq!(means[0].0, "report_to_commit");
        assert!((means[0].1 - 5.0).abs() < 1e-9, "{means:?}: 100 more observations, 0.5 s more");
        assert_eq!(means[1].0, "read_to_lease");
        assert!((means[1].1 - 2.0).abs() < 1e-9, "{means:?}: 20 more observations, 0.04 s more");
    }

    /// On a server of its own: on a shared one, other tests' backends come
    /// and go, and an exited backend's CPU leaves the sum.
    #[tokio::test]
    async fn the_work_of_a_local_postgres_is_read_from_its_statistics_and_proc() {
        let dir = composer_embedded::temp_dir("bench-work").unwrap();
        let data_dir = dir.join("pg");
        let opts = composer_embedded::PgOptions { data_dir, port: None, fsync: false, max_connections: 20 };
        let pg =
            tokio::task::spawn_blocking(move || composer_embedded::LocalPostgres::start(opts)).await.unwrap().unwrap();
        composer_store::ensure_database(&pg.url("postgres"), "w").await.unwrap();
        let url = pg.url("w");
        let client = super::connect_db(&url).await.unwrap();
        let before = super::work(&url, super::CpuAt::End).await.unwrap();
        client.batch_execute("CREATE TABLE w (n int); INSERT INTO w SELECT generate_series(1, 100); UPDATE w SET n = n + 1; DELETE FROM w WHERE n > 50; SELECT count(*) FROM generate_series(1, 3000000)").await.unwrap();
        // The connection stays: an idle backend reports its statistics
        // within PostgreSQL's idle interval, which work() waits out.
        let after = super::work(&url, super::CpuAt::End).await.unwrap();
        let rows: Vec<i64> = (0..4).map(|i| after.rows[i] - before.rows[i]).collect();
        assert_eq!(rows, vec![100, 100, 100, 51], "inserted, updated, HOT (no index), deleted");
        assert!(after.commits > before.commits);
        let (a, b) = (after.cpu_s.expect("a local server's CPU"), before.cpu_s.unwrap());
        assert!(a > b, "{b} → {a}: counting three million rows took no CPU?");
        drop(client);
        drop(pg);
        let _ = std::fs::remove_dir_all(dir);
    }
}
