//! Every phase of the K-step bench against one target, in order: register
//! the workflow, start the task-API pollers, fill a history, then latency
//! (with the step's stages), throughput with PostgreSQL's work, and the
//! optional baseline and timers.

use std::time::Instant;

use anyhow::{bail, Context};
use tokio_util::sync::CancellationToken;

use composer_client::Client;
use composer_config::non_empty;

use super::args::BenchArgs;
use super::phases::{measure_latency, measure_throughput, register, timer_lateness};
use super::postgres::{baseline, prefill, work, CpuAt, PerStep};
use super::scrape::{dispatch_share, read_dispatches, read_stages, stage_means};
use super::summary::Results;
use super::target::Target;
use super::task_api::poll_worker;

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
    // Any server: under --ab the other side may be a coordinator built
    // before coordinators named themselves (the composer-version header).
    let api = Client::new(http.clone(), &target.url, non_empty(&args.api_token)).any_server();
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
    // The embedded worker's metrics are in its coordinator's /metrics.
    let read = || read_stages(http, &urls);
    let stages_before = read().await;
    let dispatched_before = read_dispatches(http, &urls[0]).await;
    let latency = measure_latency(&api, &workflow, args).await?;
    let stages = stage_means(&stages_before, &read().await);
    let dispatched_at = read_dispatches(http, &urls[0]).await;
    let before = match &target.database_url {
        Some(db) => Some(work(db, CpuAt::End).await?),
        None => None,
    };
    let cpu_before = cpu_now(target);
    let wall = measure_throughput(&api, target, &workflow, args).await?;
    let total_steps = (args.runs * args.steps) as f64;
    let process_cpu_ms = cpu_per_step(target, &cpu_before, &cpu_now(target), total_steps);
    let dispatched_after = read_dispatches(http, &urls[0]).await;
    let dispatch = [dispatch_share(dispatched_before, dispatched_at), dispatch_share(dispatched_at, dispatched_after)];
    let per_step = match (&target.database_url, before) {
        (Some(db), Some(b)) => Some(PerStep::between(b, work(db, CpuAt::Start).await?, total_steps)),
        _ => None,
    };
    let commits_per_step = per_step.map(|p| p.commits);
    let (baseline_tps, timers) = optional_phases(args, target, &api, wall).await?;
    Ok(Results {
        latency,
        stages,
        dispatch,
        wall,
        total_steps,
        commits_per_step,
        per_step,
        process_cpu_ms,
        baseline_tps,
        timers,
    })
}

/// CPU seconds so far of each of the target's processes (`None`: gone).
fn cpu_now(target: &Target) -> Vec<Option<f64>> {
    target.processes.iter().map(|(_, pid)| super::postgres::process_cpu_seconds(*pid)).collect()
}

/// Each process's CPU ms per step between two readings.
fn cpu_per_step(
    target: &Target,
    before: &[Option<f64>],
    after: &[Option<f64>],
    steps: f64,
) -> Vec<(&'static str, f64)> {
    let spent = before.iter().zip(after).map(|(b, a)| Some((a.as_ref()? - b.as_ref()?) * 1000.0 / steps));
    target.processes.iter().zip(spent).filter_map(|((what, _), ms)| Some((*what, ms?))).collect()
}

/// The phases a flag asks for: pgbench's baseline and the timers' lateness.
async fn optional_phases(
    args: &BenchArgs,
    target: &Target,
    api: &Client,
    wall: f64,
) -> anyhow::Result<(Option<f64>, Option<(u64, usize, Vec<f64>)>)> {
    let baseline_tps = match (&target.database_url, args.baseline) {
        (Some(db), true) => Some(baseline(db, wall.ceil() as u64, args.concurrency.min(32)).await?),
        (None, true) => bail!("--baseline needs the database: set COMPOSER_DATABASE_URL with --target-url"),
        _ => None,
    };
    let timers = match (args.timers, &target.database_url) {
        (0, _) => None,
        (n, Some(db)) => Some(timer_lateness(api, db, n).await?),
        (_, None) => bail!("--timers needs the database (COMPOSER_DATABASE_URL)"),
    };
    Ok((baseline_tps, timers))
}
