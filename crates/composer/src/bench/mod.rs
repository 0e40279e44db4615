//! `composer bench`: latency and throughput of K-step HTTP workflows against a
//! built-in sink, PostgreSQL commits per step, and (with `--baseline`)
//! pgbench's rate for one task's minimal writes on the same server, so a
//! figure can be read against what the machine can do at all.
//!
//! - `measure`: every phase of the K-step bench against one target, in order.
//! - `phases`: registering the workflow, latency, throughput, timers.
//! - `task_api`: `--task-api`, steps served by in-process task-API pollers.
//! - `map`: `--map N`, one MAP of N HTTP items.
//! - `target`: what is driven: a URL and its database, or an embedded
//!   one, and the sink HTTP steps call.
//! - `scrape`: the stages and dispatch counters read from `/metrics`.
//! - `postgres`: PostgreSQL's work, a history to fill it, pgbench's rate.
//! - `samples`: percentiles, medians, rounding.
//! - `summary`: the results as a JSON line or a printed summary.
//! - `ab`: two binaries side by side.
//! - `args`: its flags.

use std::process::ExitCode;

use anyhow::bail;

use composer_client::Client;
use composer_config::non_empty;

mod ab;
mod args;
mod map;
mod measure;
mod phases;
mod postgres;
mod samples;
mod scrape;
mod summary;
mod target;
mod task_api;

pub use args::BenchArgs;

use map::bench_map;
use measure::measure;
use target::{start_embedded, start_sink, Target, MAP_BENCH_MAX_PAYLOAD};

pub async fn bench(args: BenchArgs) -> anyhow::Result<ExitCode> {
    validate(&args)?;
    if let Some(other) = &args.ab {
        return ab::run(&args, other).await;
    }
    let target = match non_empty(&args.target_url) {
        Some(url) => Target {
            url,
            database_url: non_empty(&args.database_url),
            _embedded: None,
            processes: vec![("driver", std::process::id())],
        },
        None => {
            eprintln!("starting embedded PostgreSQL (fsync on), Redis, a coordinator and a worker …");
            start_embedded(args.concurrency, args.map.map(|_| MAP_BENCH_MAX_PAYLOAD)).await?
        }
    };
    let sink = start_sink().await?;
    let http = reqwest::Client::builder().pool_max_idle_per_host(256).build()?;
    if let Some(n) = args.map {
        let api = Client::new(http.clone(), &target.url, non_empty(&args.api_token)).any_server();
        bench_map(&api, &target, &sink, &args, n).await?;
        return Ok(ExitCode::SUCCESS);
    }
    let results = measure(&args, &target, &http, &sink, &args.metrics_urls).await?;
    if args.json {
        println!("{}", results.json(&args));
    } else {
        results.print(&args, &target.url);
    }
    Ok(ExitCode::SUCCESS)
}

/// Refuses flags out of range, and benches that cannot be combined, before anything starts.
fn validate(args: &BenchArgs) -> anyhow::Result<()> {
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
