//! `composer bench`: latency and throughput of K-step HTTP workflows against a
//! built-in sink, PostgreSQL commits per step, and (with `--baseline`)
//! pgbench's rate for one task's minimal writes on the same server, so a
//! figure can be read against what the machine can do at all.

use std::collections::HashMap;
use std::process::ExitCode;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use composer_embedded::{LocalPostgres, LocalRedis, PgOptions};
use serde_json::{json, Value};
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use composer_core::config::non_empty;

use crate::cli::BenchArgs;
use crate::client::Api;

/// What the bench drives: a Composer URL and the database behind it.
struct Target {
    url: String,
    database_url: Option<String>,
    _embedded: Option<Embedded>,
}

/// The embedded default: PostgreSQL (fsync on), Redis, a coordinator and a
/// worker in this process, all stopped on drop.
struct Embedded {
    coordinator: Option<composer_coord::Running>,
    worker: CancellationToken,
    _pg: LocalPostgres,
    _redis: LocalRedis,
    dir: std::path::PathBuf,
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

async fn start_embedded(concurrency: usize) -> anyhow::Result<Target> {
    let dir = composer_embedded::temp_dir("bench")?;
    let pg_dir = dir.join("pg");
    let redis_dir = dir.join("redis");
    let (pg, redis) = tokio::task::spawn_blocking(move || {
        let pg = LocalPostgres::start(PgOptions { data_dir: pg_dir, port: None, fsync: true, max_connections: 200 })?;
        let redis = LocalRedis::start(&redis_dir, None)?;
        Ok::<_, composer_embedded::Error>((pg, redis))
    })
    .await??;
    let (client, conn) =
        composer_store::tokio_postgres::connect(&pg.url("postgres"), composer_store::tokio_postgres::NoTls).await?;
    tokio::spawn(conn);
    client.batch_execute("CREATE DATABASE composer").await?;
    let database_url = pg.url("composer");
    let mut cfg = composer_coord::Config::new(database_url.clone(), redis.url());
    cfg.listen = "127.0.0.1:0".parse()?;
    cfg.db_pool_size = 32;
    if let Some(n) = std::env::var("COMPOSER_ENGINE_WORKERS").ok().and_then(|v| v.parse().ok()) {
        cfg.engine_workers = n;
    }
    let coordinator = composer_coord::start(cfg).await?;
    let url = format!("http://{}", coordinator.addr);
    let mut wcfg = composer_worker::Config::new(database_url.clone(), redis.url(), vec![url.clone()]);
    wcfg.options.concurrency = concurrency.max(1);
    wcfg.options.db_pool_size = 16;
    let worker = CancellationToken::new();
    tokio::spawn(composer_worker::Worker::new(wcfg).run(worker.clone()));
    let embedded = Embedded { coordinator: Some(coordinator), worker, _pg: pg, _redis: redis, dir };
    Ok(Target { url, database_url: Some(database_url), _embedded: Some(embedded) })
}

/// The fastest HTTP endpoint we can offer: 200 `{}`.
async fn start_sink() -> anyhow::Result<String> {
    let app = axum::Router::new().fallback(|| async { axum::Json(json!({})) });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move { axum::serve(listener, app).await });
    Ok(format!("http://{addr}"))
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((p / 100.0) * (sorted.len() - 1) as f64).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn round2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

/// Step transitions of a finished run: each step's finish to the next one's start.
fn transitions(run: &Value, steps: usize) -> Vec<f64> {
    let tasks = run["tasks"].as_array().cloned().unwrap_or_default();
    let at = |node: &str, field: &str| -> Option<chrono::DateTime<chrono::Utc>> {
        tasks.iter().find(|t| t["node_id"] == node)?[field].as_str()?.parse().ok()
    };
    (1..steps)
        .filter_map(|i| {
            let done = at(&format!("s{i}"), "finished_at")?;
            let next = at(&format!("s{}", i + 1), "started_at")?;
            Some((next - done).num_microseconds()? as f64 / 1000.0)
        })
        .collect()
}

/// Waits for many runs by listening to the engine's run-finished
/// notifications, so the bench itself adds no queries to what it measures.
struct Completions {
    waiting: Mutex<HashMap<Uuid, oneshot::Sender<()>>>,
    /// Runs that finished before anyone waited for them.
    early: Mutex<std::collections::HashSet<Uuid>>,
}

impl Completions {
    async fn watch(self: Arc<Self>, database_url: String, stop: CancellationToken) -> anyhow::Result<()> {
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

    fn expect(&self, id: Uuid) -> oneshot::Receiver<()> {
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

/// Inserts `n` finished runs of `workflow` with three completed tasks each,
/// spread over the last `n` milliseconds (so they land in this month's
/// partition), in batches of 100,000.
async fn prefill(database_url: &str, workflow: &str, n: u64) -> anyhow::Result<()> {
    let (client, conn) =
        composer_store::tokio_postgres::connect(database_url, composer_store::tokio_postgres::NoTls).await?;
    tokio::spawn(conn);
    let def: Uuid = client
        .query_one("SELECT id FROM workflow_definitions WHERE name = $1 ORDER BY version DESC LIMIT 1", &[&workflow])
        .await?
        .get(0);
    let mut done = 0i64;
    while (done as u64) < n {
        let chunk = ((n as i64) - done).min(100_000);
        client
            .execute(
                "WITH runs AS (
                    INSERT INTO workflow_runs (id, workflow_definition_id, workflow_name, workflow_version, status, input,
                                               output, created_at, updated_at, finished_at)
                    SELECT (lpad(to_hex((extract(epoch FROM now()) * 1000)::bigint - 60000 - $3 - g), 12, '0')
                            || '7' || substr(md5(g::text || $3::text), 1, 19))::uuid,
                           $1, $2, 1, 'SUCCEEDED', '{}', '{}', now(), now(), now()
                      FROM generate_series(1, $4::bigint) g
                    RETURNING id)
                 INSERT INTO task_instances (run_id, id, node_id, node_type, queue, state, attempt, input_json, output_json,
                                             started_at, finished_at)
                 SELECT runs.id, gen_random_uuid(), 's' || s, 'HTTP', 'http', 'COMPLETED', 1, '{}', '{}', now(), now()
                   FROM runs, generate_series(1, 3) s",
                &[&def, &workflow, &done, &chunk],
            )
            .await?;
        done += chunk;
    }
    client.batch_execute("ANALYZE workflow_runs; ANALYZE task_instances").await?;
    Ok(())
}

/// `n` runs of a one-WAIT workflow, inserted as the engine would leave them;
/// 1,000 come due over the next 20 s, the rest in an hour. Returns (pending,
/// fired, sorted lateness in ms of the ones that came due).
async fn timer_lateness(api: &Api, database_url: &str, n: u64) -> anyhow::Result<(u64, usize, Vec<f64>)> {
    let spec = json!({"name": "bench-timer", "nodes": [{"id": "w", "type": "WAIT", "config": {"duration": "1h"}}]});
    let def = api.call(reqwest::Method::POST, "/v1/workflows", Some(&spec)).await?;
    let def_id: Uuid = def["id"].as_str().context("definition id")?.parse()?;
    let (client, conn) =
        composer_store::tokio_postgres::connect(database_url, composer_store::tokio_postgres::NoTls).await?;
    tokio::spawn(conn);
    let due = n.min(1000) as i64;
    let t0 = Instant::now();
    client
        .execute(
            "WITH gen AS (
                SELECT g, (lpad(to_hex((extract(epoch FROM now()) * 1000)::bigint - 30000 - g), 12, '0')
                           || '7' || substr(md5('t' || g::text), 1, 19))::uuid AS id
                  FROM generate_series(1, $3::bigint) g),
             runs AS (
                INSERT INTO workflow_runs (id, workflow_definition_id, workflow_name, workflow_version, status, input)
                SELECT id, $1, 'bench-timer', $2, 'RUNNING', '{}' FROM gen)
             INSERT INTO task_instances (run_id, id, node_id, node_type, state, attempt, input_json, wake_at)
             SELECT id, gen_random_uuid(), 'w', 'WAIT', 'WAITING', 1, jsonb_build_object('due', due), due
               FROM (SELECT id, CASE WHEN g <= $4 THEN now() + interval '5 seconds' + (g * interval '20 seconds') / $4
                                     ELSE now() + interval '1 hour' END AS due
                       FROM gen) d",
            &[&def_id, &def["version"].as_i64().map(|v| v as i32).unwrap_or(1), &(n as i64), &due],
        )
        .await?;
    client.batch_execute("ANALYZE task_instances").await?;
    eprintln!(
        "inserted {n} pending WAITs in {:.1} s; waiting for {due} of them to come due …",
        t0.elapsed().as_secs_f64()
    );
    let until = Instant::now() + Duration::from_secs(60);
    loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let row = client
            .query_one(
                "SELECT count(*) FILTER (WHERE t.state = 'COMPLETED'),
                        count(*) FILTER (WHERE t.state = 'WAITING' AND t.wake_at <= now() + interval '25 seconds')
                   FROM task_instances t JOIN workflow_runs r ON r.id = t.run_id
                  WHERE r.workflow_name = 'bench-timer'",
                &[],
            )
            .await?;
        let (fired, left): (i64, i64) = (row.get(0), row.get(1));
        if left == 0 || Instant::now() > until {
            let late: Vec<f64> = client
                .query(
                    "SELECT (extract(epoch FROM (t.finished_at - (t.input_json->>'due')::timestamptz)) * 1000)::float8
                       FROM task_instances t JOIN workflow_runs r ON r.id = t.run_id
                      WHERE r.workflow_name = 'bench-timer' AND t.state = 'COMPLETED'
                      ORDER BY 1",
                    &[],
                )
                .await?
                .iter()
                .filter_map(|r| r.try_get::<_, f64>(0).ok())
                .collect();
            return Ok((n, fired as usize, late));
        }
    }
}

async fn commits(database_url: &str) -> anyhow::Result<i64> {
    let (client, conn) =
        composer_store::tokio_postgres::connect(database_url, composer_store::tokio_postgres::NoTls).await?;
    tokio::spawn(conn);
    // Statistics are flushed by each backend at most once a second.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let row =
        client.query_one("SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()", &[]).await?;
    Ok(row.get(0))
}

/// pgbench's rate for one task's minimal writes — a task row and an outbox
/// row in one commit — on the same server, for `seconds`, with `clients`.
async fn baseline(database_url: &str, seconds: u64, clients: usize) -> anyhow::Result<f64> {
    let (client, conn) =
        composer_store::tokio_postgres::connect(database_url, composer_store::tokio_postgres::NoTls).await?;
    tokio::spawn(conn);
    client
        .batch_execute(
            "DROP TABLE IF EXISTS bench_baseline_task, bench_baseline_outbox;
             CREATE TABLE bench_baseline_task (id uuid PRIMARY KEY, run_id uuid NOT NULL, state text NOT NULL,
                 attempt int NOT NULL, input_json jsonb NOT NULL, created_at timestamptz NOT NULL DEFAULT now());
             CREATE TABLE bench_baseline_outbox (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, task_id uuid NOT NULL,
                 stream text NOT NULL, payload jsonb NOT NULL, next_attempt_at timestamptz NOT NULL DEFAULT now());",
        )
        .await?;
    let script = std::env::temp_dir().join(format!("composer-baseline-{}.sql", std::process::id()));
    std::fs::write(
        &script,
        "BEGIN;\n\
         INSERT INTO bench_baseline_task (id, run_id, state, attempt, input_json) VALUES (gen_random_uuid(), gen_random_uuid(), 'PENDING', 1, jsonb_build_object('url', 'sink'));\n\
         INSERT INTO bench_baseline_outbox (task_id, stream, payload) VALUES (gen_random_uuid(), 'tasks.http.0', jsonb_build_object('attempt', 1));\n\
         END;\n",
    )?;
    let pgbench = composer_embedded::postgres_bin_dir()?.join("pgbench");
    let out = tokio::process::Command::new(pgbench)
        .args(["-n", "-M", "prepared", "-c", &clients.to_string(), "-j", "2", "-T", &seconds.max(1).to_string(), "-f"])
        .arg(&script)
        .arg(database_url)
        .output()
        .await
        .context("running pgbench")?;
    let _ = std::fs::remove_file(&script);
    client.batch_execute("DROP TABLE IF EXISTS bench_baseline_task, bench_baseline_outbox").await?;
    let text = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        bail!("pgbench failed: {}{}", text, String::from_utf8_lossy(&out.stderr));
    }
    text.lines()
        .find_map(|l| l.strip_prefix("tps = ").and_then(|r| r.split_whitespace().next()).and_then(|n| n.parse().ok()))
        .context("no tps line in pgbench's output")
}

pub async fn bench(args: BenchArgs) -> anyhow::Result<ExitCode> {
    let api_token = non_empty(&args.api_token);
    if args.steps == 0 || args.steps > 100 {
        bail!("--steps must be between 1 and 100");
    }
    if args.concurrency == 0 {
        bail!("--concurrency must be at least 1");
    }
    let target = match non_empty(&args.target_url) {
        Some(url) => Target { url, database_url: non_empty(&args.database_url), _embedded: None },
        None => {
            eprintln!("starting embedded PostgreSQL (fsync on), Redis, a coordinator and a worker …");
            start_embedded(args.concurrency).await?
        }
    };
    let sink = start_sink().await?;
    let api = Api::with(reqwest::Client::builder().pool_max_idle_per_host(256).build()?, &target.url, api_token);
    let workflow = format!("bench-{}", args.steps);
    let nodes: Vec<Value> = (1..=args.steps)
        .map(|i| json!({"id": format!("s{i}"), "type": "HTTP", "config": {"url": format!("{sink}/s{i}")}}))
        .collect();
    let edges: Vec<Value> =
        (1..args.steps).map(|i| json!({"from": format!("s{i}"), "to": format!("s{}", i + 1)})).collect();
    api.call(reqwest::Method::POST, "/v1/workflows", Some(&json!({"name": workflow, "nodes": nodes, "edges": edges})))
        .await?;

    if args.history > 0 {
        let db = target.database_url.as_deref().context("--history needs the database (COMPOSER_DATABASE_URL)")?;
        let t0 = Instant::now();
        prefill(db, &workflow, args.history).await?;
        eprintln!("filled {} finished runs in {:.1} s", args.history, t0.elapsed().as_secs_f64());
    }

    // Latency: one run at a time, after a warm-up.
    for _ in 0..args.warmup {
        let id = api.start(&workflow).await?;
        api.wait(&id, Duration::from_secs(600)).await?;
    }
    let mut e2e = Vec::with_capacity(args.latency_runs);
    let mut starts = Vec::with_capacity(args.latency_runs);
    let mut gets = Vec::with_capacity(args.latency_runs);
    let mut steps = Vec::new();
    for _ in 0..args.latency_runs {
        let t0 = Instant::now();
        let id = api.start(&workflow).await?;
        starts.push(ms(t0.elapsed()));
        let run = api.wait(&id, Duration::from_secs(600)).await?;
        e2e.push(ms(t0.elapsed()));
        if run["status"] != "SUCCEEDED" {
            bail!("a latency run did not succeed: {run}");
        }
        steps.extend(transitions(&run, args.steps));
        let t1 = Instant::now();
        api.call(reqwest::Method::GET, &format!("/v1/runs/{id}"), None).await?;
        gets.push(ms(t1.elapsed()));
    }
    starts.sort_by(f64::total_cmp);
    gets.sort_by(f64::total_cmp);
    e2e.sort_by(f64::total_cmp);
    steps.sort_by(f64::total_cmp);

    // Throughput: `runs` workflows, `concurrency` in flight.
    let before = match &target.database_url {
        Some(db) => Some(commits(db).await?),
        None => None,
    };
    let stop = CancellationToken::new();
    let completions = Arc::new(Completions { waiting: Mutex::new(HashMap::new()), early: Mutex::default() });
    if let Some(db) = &target.database_url {
        tokio::spawn(completions.clone().watch(db.clone(), stop.clone()));
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let next = Arc::new(AtomicUsize::new(0));
    let api = Arc::new(api);
    let started = Instant::now();
    let mut clients = Vec::new();
    for _ in 0..args.concurrency {
        let (api, next, completions, workflow) = (api.clone(), next.clone(), completions.clone(), workflow.clone());
        let by_db = target.database_url.is_some();
        let runs = args.runs;
        clients.push(tokio::spawn(async move {
            while next.fetch_add(1, Ordering::Relaxed) < runs {
                let id = api.start(&workflow).await?;
                if by_db {
                    let done = completions.expect(id.parse()?);
                    done.await.context("completion watcher stopped")?;
                } else {
                    api.wait(&id, Duration::from_secs(600)).await?;
                }
            }
            Ok::<_, anyhow::Error>(())
        }));
    }
    for c in clients {
        c.await??;
    }
    let wall = started.elapsed().as_secs_f64();
    stop.cancel();
    let total_steps = (args.runs * args.steps) as f64;
    let commits_per_step = match (&target.database_url, before) {
        (Some(db), Some(b)) => Some((commits(db).await? - b) as f64 / total_steps),
        _ => None,
    };
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

    let workflows_per_s = args.runs as f64 / wall;
    let steps_per_s = total_steps / wall;
    let report = json!({
        "system": "composer",
        "version": env!("CARGO_PKG_VERSION"),
        "steps": args.steps,
        "latency_ms": {"p50": round2(percentile(&e2e, 50.0)), "p95": round2(percentile(&e2e, 95.0)), "p99": round2(percentile(&e2e, 99.0))},
        "step_transition_ms": {"p50": round2(percentile(&steps, 50.0)), "p99": round2(percentile(&steps, 99.0))},
        "start_run_ms": {"p50": round2(percentile(&starts, 50.0)), "p99": round2(percentile(&starts, 99.0))},
        "get_run_ms": {"p50": round2(percentile(&gets, 50.0)), "p99": round2(percentile(&gets, 99.0))},
        "history_runs": args.history,
        "throughput": {"workflows": args.runs, "concurrency": args.concurrency, "seconds": round2(wall),
                       "workflows_per_s": round2(workflows_per_s), "steps_per_s": round2(steps_per_s)},
        "commits_per_step": commits_per_step.map(round2),
        "timers": timers.as_ref().map(|(pending, fired, late)| json!({"pending": pending, "fired": fired,
            "lateness_ms": {"p50": round2(percentile(late, 50.0)), "p99": round2(percentile(late, 99.0)),
                            "max": round2(late.last().copied().unwrap_or(f64::NAN))}})),
        "baseline": baseline_tps.map(|tps| json!({"what": "pgbench: task row + outbox row per commit",
            "commits_per_s": round2(tps), "steps_per_s_ratio": round2(steps_per_s / tps)})),
    });
    if args.json {
        println!("{report}");
    } else {
        println!("composer bench — {} sequential HTTP steps per workflow, against {}", args.steps, api.base);
        println!(
            "latency ({} runs, one at a time): p50 {:.2} ms, p95 {:.2} ms, p99 {:.2} ms",
            args.latency_runs, report["latency_ms"]["p50"], report["latency_ms"]["p95"], report["latency_ms"]["p99"]
        );
        println!(
            "step transition (finish → next start): p50 {:.2} ms, p99 {:.2} ms",
            report["step_transition_ms"]["p50"], report["step_transition_ms"]["p99"]
        );
        println!(
            "start run: p50 {:.2} ms, p99 {:.2} ms; get run: p50 {:.2} ms, p99 {:.2} ms (with {} runs of history)",
            report["start_run_ms"]["p50"],
            report["start_run_ms"]["p99"],
            report["get_run_ms"]["p50"],
            report["get_run_ms"]["p99"],
            args.history
        );
        println!(
            "throughput: {} workflows, {} in flight, in {:.2} s: {:.1} workflows/s, {:.1} steps/s",
            args.runs, args.concurrency, wall, workflows_per_s, steps_per_s
        );
        if let Some((pending, fired, late)) = &timers {
            println!(
                "timers: {fired} of {pending} pending WAITs came due; fired late by p50 {:.0} ms, p99 {:.0} ms, max {:.0} ms",
                percentile(late, 50.0),
                percentile(late, 99.0),
                late.last().copied().unwrap_or(f64::NAN)
            );
        }
        if let Some(c) = commits_per_step {
            println!("PostgreSQL commits per step: {c:.2}");
        }
        if let Some(tps) = baseline_tps {
            println!(
                "baseline (pgbench, task + outbox row per commit, same server, {:.0} s): {tps:.0} commits/s; ours {:.2}× of it",
                wall.ceil(),
                steps_per_s / tps
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}
