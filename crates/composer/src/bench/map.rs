//! `--map N`: one MAP of N HTTP items, in items per second and commits per item.

use std::time::{Duration, Instant};

use anyhow::bail;
use serde_json::json;

use composer_api::{DefinitionView, StartRun};
use composer_client::Client;
use composer_core::machine::RunStatus;

use super::args::BenchArgs;
use super::postgres::commits;
use super::samples::round2;
use super::target::Target;

/// Where each item calls: the sink, answering `--map-item-bytes` of padding.
fn item_url(sink: &str, pad: u32) -> String {
    match pad {
        0 => format!("{sink}/item"),
        n => format!("{sink}/pad/{n}"),
    }
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
        "node": {"type": "HTTP", "config": {"method": "POST", "url": item_url(sink, args.map_item_bytes), "body": {"i": "${ .index }"}}}});
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
            println!(
                "  (an embedded coordinator offloads values past 256 KiB, as composer dev does: the MAP's output holds \
                 every item's)"
            );
        }
        println!("  {n} items in {wall:.2} s: {items_per_s:.1} items/s");
        if let Some(c) = commits_per_item {
            println!("  PostgreSQL commits per item: {c:.2}");
        }
    }
    Ok(())
}
