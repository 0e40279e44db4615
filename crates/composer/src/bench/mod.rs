//! `composer bench`: latency and throughput of K-step HTTP workflows against a
//! built-in sink, PostgreSQL commits per step, and (with `--baseline`)
//! pgbench's rate for one task's minimal writes on the same server, so a
//! figure can be read against what the machine can do at all.
//!
//! - `measure`: the phases and the summary; `ab`: two binaries side by side.

use std::process::ExitCode;

use composer_client::Client;
use composer_config::non_empty;

use crate::cli::BenchArgs;

mod ab;
mod measure;

use measure::{bench_map, measure, start_embedded, start_sink, validate, Target, MAP_BENCH_MAX_PAYLOAD};

pub async fn bench(args: BenchArgs) -> anyhow::Result<ExitCode> {
    validate(&args)?;
    if let Some(other) = &args.ab {
        return ab::run(&args, other).await;
    }
    let target = match non_empty(&args.target_url) {
        Some(url) => Target { url, database_url: non_empty(&args.database_url), _embedded: None },
        None => {
            eprintln!("starting embedded PostgreSQL (fsync on), Redis, a coordinator and a worker …");
            start_embedded(args.concurrency, args.map.map(|_| MAP_BENCH_MAX_PAYLOAD)).await?
        }
    };
    let sink = start_sink().await?;
    let http = reqwest::Client::builder().pool_max_idle_per_host(256).build()?;
    if let Some(n) = args.map {
        let api = Client::new(http.clone(), &target.url, non_empty(&args.api_token));
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
