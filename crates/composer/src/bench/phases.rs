//! The phases a K-step workflow is measured by: registering it, latency
//! (one run at a time), throughput (many in flight, completions heard from
//! PostgreSQL's notifications), and how late timers fire.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use serde_json::{json, Value};
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use composer_api::{DefinitionView, RunView, StartRun};
use composer_client::Client;
use composer_core::machine::RunStatus;
use composer_store::fixtures;

use super::args::BenchArgs;
use super::postgres::connect_db;
use super::samples::ms;
use super::target::Target;
use super::task_api::{TASK_API_QUEUE, TASK_API_TYPE};

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
    pub(super) e2e: Vec<f64>,
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
