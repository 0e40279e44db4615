//! `composer bench --ab OTHER_BINARY`: this binary against another one, in
//! one sitting. Both sides run as they are deployed — a coordinator and a
//! worker process of their own binary, on a fresh database of one
//! PostgreSQL (fsync on) and one Redis — and are driven and measured by the
//! same code (this binary's), alternately, `--ab-rounds` times each. The
//! summary gives each side's medians and the ratio this/other.

use std::path::{Path, PathBuf};
use std::process::{ExitCode, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use composer_embedded::{LocalPostgres, LocalRedis, PgOptions};
use serde_json::{json, Value};

use super::args::BenchArgs;
use super::measure::measure;
use super::samples::{median, percentile, round2, round3};
use super::summary::Results;
use super::target::{start_sink, Target};

/// One binary under test.
struct Side {
    name: &'static str,
    bin: PathBuf,
    version: String,
}

pub async fn run(args: &BenchArgs, other: &Path) -> anyhow::Result<ExitCode> {
    if args.ab_rounds == 0 || args.ab_rounds > 20 {
        bail!("--ab-rounds must be between 1 and 20");
    }
    let this = std::env::current_exe().context("cannot find this binary")?;
    let sides = [side("other", other)?, side("this", &this)?];
    let dir = composer_embedded::temp_dir("bench-ab")?;
    let _cleanup = RemoveOnDrop(dir.clone());
    eprintln!("starting PostgreSQL (fsync on) and Redis for both sides …");
    let (pg_dir, redis_dir) = (dir.join("pg"), dir.join("redis"));
    let (pg, redis) = tokio::task::spawn_blocking(move || {
        let pg = LocalPostgres::start(PgOptions { data_dir: pg_dir, port: None, fsync: true, max_connections: 200 })?;
        let redis = LocalRedis::start(&redis_dir, None)?;
        Ok::<_, composer_embedded::Error>((pg, redis))
    })
    .await??;
    let sink = start_sink().await?;
    let http = reqwest::Client::builder().pool_max_idle_per_host(256).build()?;
    let mut results: [Vec<Results>; 2] = [Vec::new(), Vec::new()];
    for round in 1..=args.ab_rounds {
        for (i, side) in sides.iter().enumerate() {
            eprintln!("round {round}/{}: {} ({}) …", args.ab_rounds, side.name, side.version);
            let env = Env { pg: &pg, redis: &redis, dir: &dir, round };
            let r = one(args, side, &env, &http, &sink).await.with_context(|| format!("{} side", side.name))?;
            eprintln!("  {:.1} steps/s", r.steps_per_s());
            results[i].push(r);
        }
    }
    if args.json {
        let per_side = |i: usize| -> Value {
            json!({"binary": sides[i].bin, "version": sides[i].version,
                   "runs": results[i].iter().map(|r| r.json(args)).collect::<Vec<_>>()})
        };
        println!("{}", json!({"ab": {"other": per_side(0), "this": per_side(1), "medians": medians(&results)}}));
    } else {
        print(args, &sides, &results);
    }
    Ok(ExitCode::SUCCESS)
}

fn side(name: &'static str, bin: &Path) -> anyhow::Result<Side> {
    let out = std::process::Command::new(bin)
        .arg("--version")
        .output()
        .with_context(|| format!("cannot run {}", bin.display()))?;
    // Binaries before this one answered --version with exit status 2.
    let version = String::from_utf8_lossy(&out.stdout).trim().to_string();
    if !version.starts_with("composer ") {
        bail!("{} --version did not answer \"composer …\": is it a composer binary?", bin.display());
    }
    Ok(Side { name, bin: bin.to_path_buf(), version })
}

/// What every side's run shares.
struct Env<'a> {
    pg: &'a LocalPostgres,
    redis: &'a LocalRedis,
    dir: &'a Path,
    round: usize,
}

/// One run of one side: its own database and key prefix, its coordinator
/// and worker, the measurements, then everything of it removed.
async fn one(
    args: &BenchArgs,
    side: &Side,
    env: &Env<'_>,
    http: &reqwest::Client,
    sink: &str,
) -> anyhow::Result<Results> {
    let db = format!("bench_ab_{}_{}", side.name, env.round);
    let admin = env.pg.url("postgres");
    composer_store::ensure_database(&admin, &db).await?;
    let database_url = env.pg.url(&db);
    let log = std::fs::File::create(env.dir.join(format!("{db}.log")))?;
    let common = |cmd: &mut tokio::process::Command| {
        cmd.env("COMPOSER_DATABASE_URL", &database_url)
            .env("COMPOSER_REDIS_URL", env.redis.url())
            .env("COMPOSER_REDIS_PREFIX", format!("{db}:"))
            .env("COMPOSER_LOG", "warn")
            .env_remove("COMPOSER_API_TOKEN")
            .env_remove("COMPOSER_WORKER_TOKEN")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .kill_on_drop(true);
    };
    let addr_file = env.dir.join(format!("{db}.addr"));
    let mut coordinator = tokio::process::Command::new(&side.bin);
    coordinator
        .arg("coordinator")
        .env("COMPOSER_LISTEN", "127.0.0.1:0")
        .env("COMPOSER_ADDR_FILE", &addr_file)
        .env("COMPOSER_DB_POOL_SIZE", "32")
        // HTTP steps on the coordinator, as `dev` runs them (a binary
        // before them ignores the setting).
        .env("COMPOSER_COORDINATOR_HTTP_SLOTS", "256")
        .stderr(log.try_clone()?);
    common(&mut coordinator);
    let mut coordinator = coordinator.spawn().context("cannot start the coordinator")?;
    let url = wait_for_addr(&addr_file, &mut coordinator).await?;
    let worker_addr = format!("127.0.0.1:{}", composer_embedded::free_port()?);
    let mut worker = tokio::process::Command::new(&side.bin);
    worker
        .arg("worker")
        .env("COMPOSER_COORDINATOR_URLS", &url)
        .env("COMPOSER_WORKER_CONCURRENCY", args.concurrency.to_string())
        .env("COMPOSER_WORKER_LISTEN", &worker_addr)
        .stderr(log);
    common(&mut worker);
    let mut worker = worker.spawn().context("cannot start the worker")?;
    wait_for_ready(http, &url).await?;
    let processes = [("coordinator", coordinator.id()), ("worker", worker.id()), ("driver", Some(std::process::id()))];
    let processes = processes.into_iter().filter_map(|(what, pid)| Some((what, pid?))).collect();
    let target = Target { url, database_url: Some(database_url.clone()), _embedded: None, processes };
    let measured = measure(args, &target, http, sink, &[format!("http://{worker_addr}/metrics")]).await;
    let _ = worker.kill().await;
    let _ = coordinator.kill().await;
    drop_database(&admin, &db).await?;
    measured
}

/// The coordinator writes its address once it listens.
async fn wait_for_addr(file: &Path, child: &mut tokio::process::Child) -> anyhow::Result<String> {
    let until = Instant::now() + Duration::from_secs(60);
    loop {
        if let Ok(url) = std::fs::read_to_string(file) {
            if !url.is_empty() {
                return Ok(url);
            }
        }
        if let Some(status) = child.try_wait()? {
            bail!("the coordinator exited with {status} (its log is beside the data)");
        }
        if Instant::now() > until {
            bail!("the coordinator did not start listening within 60 s");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn wait_for_ready(http: &reqwest::Client, url: &str) -> anyhow::Result<()> {
    let until = Instant::now() + Duration::from_secs(60);
    while Instant::now() < until {
        if let Ok(r) = http.get(format!("{url}/readyz")).send().await {
            if r.status().is_success() {
                return Ok(());
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    bail!("{url}/readyz did not answer 200 within 60 s")
}

async fn drop_database(admin_url: &str, db: &str) -> anyhow::Result<()> {
    let client = super::postgres::connect_db(admin_url).await?;
    client.batch_execute(&format!("DROP DATABASE IF EXISTS \"{db}\" WITH (FORCE)")).await?;
    Ok(())
}

struct RemoveOnDrop(PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The figures compared, each as (label, value of one run); `None` when a
/// side does not have it.
type Figure = (&'static str, fn(&Results) -> Option<f64>);

const FIGURES: [Figure; 17] = [
    ("steps/s", |r| Some(r.steps_per_s())),
    ("coordinator CPU ms/step", |r| r.cpu_ms_of("coordinator")),
    ("worker CPU ms/step", |r| r.cpu_ms_of("worker")),
    ("driver CPU ms/step", |r| r.cpu_ms_of("driver")),
    ("latency p50 ms", |r| Some(r.latency_p50())),
    ("step transition p50 ms", |r| Some(r.transition_p50())),
    ("start run p50 ms", |r| Some(percentile(&r.latency.starts, 50.0))),
    ("start run p99 ms", |r| Some(percentile(&r.latency.starts, 99.0))),
    ("get run p50 ms", |r| Some(percentile(&r.latency.gets, 50.0))),
    ("get run p99 ms", |r| Some(percentile(&r.latency.gets, 99.0))),
    ("commits/step", |r| r.per_step.map(|p| p.commits)),
    ("PostgreSQL CPU ms/step", |r| r.per_step.and_then(|p| p.cpu_ms)),
    ("rows inserted/step", |r| r.per_step.map(|p| p.rows[0])),
    ("rows updated/step", |r| r.per_step.map(|p| p.rows[1])),
    ("of them HOT", |r| r.per_step.map(|p| p.rows[2])),
    ("rows deleted/step", |r| r.per_step.map(|p| p.rows[3])),
    ("timer lateness p99 ms", |r| r.timer_p99()),
];

fn medians(results: &[Vec<Results>; 2]) -> Value {
    let mut out = serde_json::Map::new();
    for (label, get) in FIGURES {
        let m = |i: usize| median(results[i].iter().filter_map(get).collect());
        let (other, this) = (m(0), m(1));
        out.insert(
            label.to_string(),
            json!({"other": other.map(round3), "this": this.map(round3),
                   "ratio": other.zip(this).map(|(o, t)| round2(t / o))}),
        );
    }
    Value::Object(out)
}

fn print(args: &BenchArgs, sides: &[Side; 2], results: &[Vec<Results>; 2]) {
    println!(
        "composer bench --ab — {} sequential HTTP steps, {} workflows at {} in flight, {} runs each, alternating",
        args.steps, args.runs, args.concurrency, args.ab_rounds
    );
    for s in sides {
        println!("  {:5}: {} ({})", s.name, s.bin.display(), s.version);
    }
    println!("{:<26} {:>12} {:>12} {:>12}", "median of the runs", "other", "this", "this/other");
    for (label, get) in FIGURES {
        let m = |i: usize| median(results[i].iter().filter_map(get).collect());
        let cell = |v: Option<f64>| v.map_or("—".to_string(), |v| format!("{v:.3}"));
        let ratio = m(0).zip(m(1)).map_or("—".to_string(), |(o, t)| format!("{:.2}×", t / o));
        if m(0).is_none() && m(1).is_none() {
            continue;
        }
        println!("{label:<26} {:>12} {:>12} {:>12}", cell(m(0)), cell(m(1)), ratio);
    }
    for (i, s) in sides.iter().enumerate() {
        let each: Vec<String> = results[i].iter().map(|r| format!("{:.0}", r.steps_per_s())).collect();
        println!("  {} steps/s by run: {}", s.name, each.join(", "));
    }
    for (i, s) in sides.iter().enumerate() {
        // Binaries before the stages were measured have none.
        let Some(last) = results[i].last().filter(|r| !r.stages.is_empty()) else { continue };
        let parts: Vec<String> = last.stages.iter().map(|(s, ms)| format!("{} {ms:.3}", s.replace('_', " "))).collect();
        println!("  {} step stages (mean ms, last run): {}", s.name, parts.join(", "));
    }
}
