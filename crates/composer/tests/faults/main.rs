//! Faults beyond crashes, on real processes: coordinators and workers in
//! network namespaces of their own, cut from PostgreSQL, from Redis or from
//! each other, on lossy and slow links; a PostgreSQL primary that dies and a
//! streaming replica promoted, with asynchronous and synchronous
//! replication; coordinators whose clocks are off or jump; PostgreSQL's disk
//! full. A workload runs through each fault, and the history checker
//! (`composer_testkit::history`) checks what it recorded.
//!
//! - `net`: the namespaces, and the faults as nftables and tc rules.
//! - `procs`: PostgreSQL, redis-server and `composer` processes.
//! - `cluster`: one scenario's processes, and the client.
//! - `workload`: what runs through a fault, and the history it records.
//!
//! `cargo test` runs each scenario short; `scripts/faults` long
//! (`FAULTS_RUNS`, `FAULTS_SEED`). Needs root (namespaces, a tmpfs) and
//! nftables and libfaketime, which `scripts/deps` installs.

#![allow(clippy::unwrap_used)] // a test fails by panicking
#![allow(clippy::print_stderr)] // each scenario reports what it injected and found

mod cluster;
mod net;
mod procs;
mod workload;

use std::time::{Duration, Instant};

use composer_testkit::history::{self, Violation};

use crate::cluster::{Cluster, Options};
use crate::procs::{Clock, Replication};
use crate::workload::{report, Workload};

/// One scenario at a time: each runs a cluster of its own on two cores.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Runs per wave (three waves: before, during and after the fault).
fn runs_per_wave() -> usize {
    std::env::var("FAULTS_RUNS").ok().and_then(|v| v.parse::<usize>().ok()).map_or(8, |n| (n / 3).max(1))
}

fn seed() -> u64 {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    std::env::var("FAULTS_SEED").ok().and_then(|v| v.parse().ok()).unwrap_or(now.as_nanos() as u64 | 1)
}

/// The lock, and whether this machine can run the scenarios at all: a
/// machine that cannot is a failure that says what is missing.
async fn serial() -> tokio::sync::MutexGuard<'static, ()> {
    let guard = ONE_AT_A_TIME.lock().await;
    if let Err(why) = net::can_make_hosts() {
        panic!("the fault scenarios need root, iproute2 and nftables (scripts/deps installs them): {why}");
    }
    guard
}

/// A cluster with the workload prepared and its first wave started.
async fn begin(name: &str, opts: Options) -> (Cluster, Workload) {
    let seed = seed();
    eprintln!("faults: {name}: seed {seed}, {} runs per wave", runs_per_wave());
    let cluster = Cluster::start(name, opts).await;
    cluster.wait_ready(Duration::from_secs(60)).await;
    let mut w = Workload::prepare(&cluster, seed).await;
    w.start(&cluster, runs_per_wave()).await;
    (cluster, w)
}

/// Ends the workload, checks the history and reports; returns the violations.
async fn end(name: &str, cluster: Cluster, mut w: Workload, faults: &str) -> Vec<Violation> {
    w.finish(&cluster, Duration::from_secs(120)).await;
    let violations = w.history.check();
    report(name, &w, faults, &violations);
    if violations.is_empty() {
        let dir = cluster.dir.clone();
        drop(cluster);
        let _ = std::fs::remove_dir_all(dir);
    } else {
        eprintln!("faults: {name}: logs kept in {}", cluster.log().display());
    }
    violations
}

/// The middle wave starts under the fault, with cancels; the fault lasts
/// `hold`, then `heal` ends it (the wave's clients retry until it has).
async fn under_fault(cluster: &Cluster, w: &mut Workload, hold: Duration, heal: impl FnOnce()) {
    under_fault_until(cluster, w, hold, async {}, heal).await
}

/// [`under_fault`], the fault lasting past `hold` until `met` too (the
/// fault has been met by what it is about, however slow the wave was).
async fn under_fault_until(
    cluster: &Cluster,
    w: &mut Workload,
    hold: Duration,
    met: impl std::future::Future<Output = ()>,
    heal: impl FnOnce(),
) {
    let wave = async {
        w.start(cluster, runs_per_wave()).await;
        w.cancel_some(cluster).await;
    };
    let fault = async {
        // The fault's length: past a lease's TTL (2 s), so that leases expire under it.
        tokio::time::sleep(hold).await;
        met.await;
        heal();
    };
    futures_util::join!(wave, fault);
}

/// How long `/readyz` of coordinator `i` takes to say no, or None if it
/// still says yes after `within`.
async fn unready_within(cluster: &Cluster, i: usize, within: Duration) -> Option<(Duration, String)> {
    let t0 = Instant::now();
    while t0.elapsed() < within {
        match cluster.call(i, reqwest::Method::GET, "/readyz", None).await {
            Ok((200, _)) => {}
            Ok((status, body)) => return Some((t0.elapsed(), format!("{status} {body}"))),
            Err(e) => return Some((t0.elapsed(), e)),
        }
        // Polling the readiness check.
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    None
}

async fn a_link_cut(name: &str, cut: impl Fn(&Cluster), heal: impl Fn(&Cluster), readyz_says_no: bool) {
    let _one = serial().await;
    let (cluster, mut w) = begin(name, Options::default()).await;
    cut(&cluster);
    if readyz_says_no {
        let said = unready_within(&cluster, 0, Duration::from_secs(10)).await;
        let (took, why) = said.unwrap_or_else(|| panic!("{name}: /readyz of the cut coordinator still says ready"));
        eprintln!("faults: {name}: the cut coordinator's /readyz said no after {took:.1?}: {why}");
        assert!(took < Duration::from_secs(5), "{name}: /readyz took {took:?} to answer: a bounded wait, please");
        assert!(why.starts_with("503 "), "{name}: /readyz did not answer: {why}");
    }
    under_fault(&cluster, &mut w, Duration::from_secs(6), || heal(&cluster)).await;
    w.start(&cluster, runs_per_wave()).await;
    let violations = end(name, cluster, w, name).await;
    assert_eq!(violations, Vec::new(), "{name}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_coordinator_cut_from_postgresql_loses_and_repeats_nothing() {
    a_link_cut(
        "coordinator cut from PostgreSQL for 6 s",
        |c| c.coords[0].host.cut(c.pg.port),
        |c| c.coords[0].host.heal(),
        true,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_coordinator_cut_from_redis_loses_and_repeats_nothing() {
    a_link_cut(
        "coordinator cut from Redis for 6 s",
        |c| c.coords[0].host.cut(c.redis.port),
        |c| c.coords[0].host.heal(),
        true,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_cut_from_one_coordinator_loses_and_repeats_nothing() {
    a_link_cut(
        "worker cut from one coordinator for 6 s",
        |c| c.workers[0].host.cut_from(&c.coords[0].host.ip, c.coords[0].port),
        |c| c.workers[0].host.heal(),
        false,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lossy_and_slow_links_lose_and_repeat_nothing() {
    let every = |c: &Cluster, f: &dyn Fn(&net::Host)| c.coords.iter().chain(&c.workers).for_each(|n| f(&n.host));
    a_link_cut(
        "every link dropping 10% of packets, capped at 2 Mbit/s, for 6 s",
        |c| {
            every(c, &|h| {
                h.lossy(10);
                h.slow("2mbit");
            })
        },
        |c| every(c, &|h| h.heal()),
        false,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_coordinator_refuses_to_start_on_a_clock_30s_off_or_a_full_state_disk() {
    let _one = serial().await;
    let name = "a coordinator started 30 s ahead, and one on a full disk";
    let (cluster, w) = begin(name, Options { coordinators: 1, workers: 1, ..Options::default() }).await;
    let (status, log) = refused(&cluster, "ahead", Clock::Off("+30s"), Vec::new());
    assert!(!status.success(), "{log}");
    assert!(log.contains("s ahead of PostgreSQL's") && log.contains("COMPOSER_MAX_CLOCK_SKEW"), "{log}");
    eprintln!("faults: {name}: refused: {}", log.lines().last().unwrap_or_default());

    let disk = procs::SmallDisk::mount(&cluster.dir.join("state-disk"), 1);
    disk.fill();
    let state = ("COMPOSER_STATE_DIR".to_string(), disk.dir.join("state").display().to_string());
    let (status, log) = refused(&cluster, "full", Clock::True, vec![state]);
    assert!(!status.success(), "{log}");
    assert!(log.contains("COMPOSER_STATE_DIR") && log.contains("No space left on device"), "{log}");
    eprintln!("faults: {name}: refused: {}", log.lines().last().unwrap_or_default());
    drop(disk);
    let violations = end(name, cluster, w, name).await;
    assert_eq!(violations, Vec::new());
}

/// Starts one more coordinator of the cluster, which must exit: how it did, and what it said.
fn refused(
    cluster: &Cluster,
    label: &str,
    clock: Clock,
    env: Vec<(String, String)>,
) -> (std::process::ExitStatus, String) {
    let log = cluster.dir.join(format!("{label}.log"));
    let mut node = procs::Node::new("coordinator", env, clock, log.clone());
    node.push_env("COMPOSER_LISTEN", "0.0.0.0:0".into());
    let given: Vec<String> = node.env().iter().map(|(k, _)| k.clone()).collect();
    for (k, v) in cluster.coords[0].env().iter().filter(|(k, _)| k != "COMPOSER_LISTEN" && !given.contains(k)) {
        node.push_env(k, v.clone());
    }
    node.spawn();
    let status =
        node.exited(Duration::from_secs(30)).unwrap_or_else(|| panic!("the {label} coordinator went on running"));
    (status, std::fs::read_to_string(log).unwrap_or_default())
}

/// Waits until the cluster's log says `text`.
async fn logged(cluster: &Cluster, text: &str, within: Duration) -> bool {
    let until = Instant::now() + within;
    while Instant::now() < until {
        if std::fs::read_to_string(cluster.log()).is_ok_and(|l| l.contains(text)) {
            return true;
        }
        // Polling a log file.
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    false
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn coordinators_whose_clocks_are_off_or_jump_fire_no_timer_early() {
    let _one = serial().await;
    let name = "clocks 3 s behind, 4 s ahead, and jumping 20 s back";
    let jump = std::env::temp_dir().join(format!("faults-clock-{}", std::process::id()));
    std::fs::write(&jump, "+0\n").unwrap();
    let clocks = vec![Clock::Off("-3s"), Clock::Off("+4s"), Clock::Jumping(jump.clone())];
    let opts = Options { coordinators: 3, clocks, ..Options::default() };
    let (cluster, mut w) = begin(name, opts).await;
    std::fs::write(&jump, "-20s\n").unwrap();
    assert!(
        logged(&cluster, "clock skew over COMPOSER_MAX_CLOCK_SKEW", Duration::from_secs(10)).await,
        "the coordinator whose clock jumped did not say so"
    );
    under_fault(&cluster, &mut w, Duration::from_secs(3), || std::fs::write(&jump, "+0\n").unwrap()).await;
    w.start(&cluster, runs_per_wave()).await;
    let violations = end(name, cluster, w, name).await;
    let _ = std::fs::remove_file(jump);
    assert_eq!(violations, Vec::new());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgresql_s_clock_jumping_20s_ahead_fires_timers_early_by_the_jump_and_breaks_nothing_else() {
    let _one = serial().await;
    let name = "PostgreSQL's clock jumping 20 s ahead";
    let jump = std::env::temp_dir().join(format!("faults-pg-clock-{}", std::process::id()));
    std::fs::write(&jump, "+0\n").unwrap();
    let opts = Options { pg_clock: Clock::Jumping(jump.clone()), ..Options::default() };
    let (cluster, mut w) = begin(name, opts).await;
    std::fs::write(&jump, "+20s\n").unwrap();
    assert!(
        logged(&cluster, "clock skew over COMPOSER_MAX_CLOCK_SKEW", Duration::from_secs(10)).await,
        "no coordinator saw PostgreSQL's clock jump"
    );
    // PostgreSQL's clock stays ahead: time itself moved.
    under_fault(&cluster, &mut w, Duration::from_secs(3), || {}).await;
    w.start(&cluster, runs_per_wave()).await;
    // Time itself jumped: a timer that was waiting fires early by the jump.
    w.history.timer_tolerance += Duration::from_secs(20);
    let violations = end(name, cluster, w, name).await;
    let _ = std::fs::remove_file(jump);
    assert_eq!(violations, Vec::new());
}

/// The replica stops receiving (the primary's WAL sender frozen) while a wave of
/// starts runs; then the primary's host dies, and the replica is promoted.
/// With asynchronous replication the primary acknowledged what the replica
/// never got; with synchronous replication it could not acknowledge it.
async fn a_failover(name: &str, replication: Replication) -> (Vec<Violation>, Workload, usize, bool) {
    let opts = Options { replication: Some(replication), ..Options::default() };
    let (cluster, mut w) = begin(name, opts).await;
    cluster.pg.freeze_sender();
    let fail_over = async {
        // The replica lags by this much when the primary dies.
        tokio::time::sleep(Duration::from_secs(2)).await;
        cluster.fail_over();
    };
    futures_util::join!(w.start(&cluster, runs_per_wave()), fail_over);
    w.start(&cluster, runs_per_wave()).await;
    w.cancel_some(&cluster).await;
    let acknowledged = w.acknowledged();
    w.finish(&cluster, Duration::from_secs(120)).await;
    let violations = w.history.check();
    report(name, &w, "the replica 2 s behind, the primary SIGKILLed, the replica promoted", &violations);
    let log = std::fs::read_to_string(cluster.log()).unwrap_or_default();
    let warned = log.contains("PostgreSQL replicates asynchronously");
    let dir = cluster.dir.clone();
    drop(cluster);
    let _ = std::fs::remove_dir_all(dir);
    (violations, w, acknowledged, warned)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_with_synchronous_replication_loses_nothing() {
    let _one = serial().await;
    let (violations, _, _, warned) = a_failover("failover, synchronous replication", Replication::Synchronous).await;
    assert_eq!(violations, Vec::new());
    assert!(!warned, "the coordinators warned of asynchronous replication");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_with_asynchronous_replication_loses_what_the_replica_had_not_received() {
    let _one = serial().await;
    let name = "failover, asynchronous replication";
    let (violations, w, acknowledged, warned) = a_failover(name, Replication::Asynchronous).await;
    assert!(warned, "no coordinator warned at start that PostgreSQL replicates asynchronously");
    // What asynchronous replication loses: the commits the replica had not
    // received. Runs whose start was acknowledged are gone (with the calls
    // their steps made), and an at_most_once step whose sending was
    // recorded only there may be sent again. Nothing else breaks.
    let gone =
        |v: &&Violation| v.property == history::ACKNOWLEDGED_STARTS_END && v.example.contains("not in the database");
    let lost: Vec<&Violation> = violations.iter().filter(gone).collect();
    let others: Vec<&Violation> =
        violations.iter().filter(|v| !gone(v)).filter(|v| v.property != history::AT_MOST_ONCE).collect();
    let known: std::collections::HashSet<&str> = w.history.runs.iter().map(|r| r.id.as_str()).collect();
    let calls_of_lost = w.history.calls.iter().filter(|c| !known.contains(c.run.as_str())).count();
    let resent = violations.iter().filter(|v| v.property == history::AT_MOST_ONCE).count();
    eprintln!(
        "faults: {name}: lost {} of {acknowledged} acknowledged starts (their steps had called the target {calls_of_lost} \
         times); at_most_once steps sent again: {resent}",
        lost.len()
    );
    assert!(
        !lost.is_empty(),
        "the replica was 2 s behind, and no acknowledged start was lost: is replication synchronous?"
    );
    assert_eq!(others, Vec::<&Violation>::new());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_under_postgresql_is_a_503_and_work_resumes_when_it_is_freed() {
    let _one = serial().await;
    let name = "PostgreSQL's disk full for 6 s";
    let (cluster, mut w) = begin(name, Options { small_disk_mb: Some(160), ..Options::default() }).await;
    let disk = cluster.disk.as_ref().unwrap();
    let filler = disk.fill();
    let statuses = full_disk_starts(&cluster).await;
    eprintln!("faults: {name}: starts while full answered {statuses:?}");
    assert!(!statuses.contains_key(&500), "a full disk answered 500: {statuses:?}");
    under_fault(&cluster, &mut w, Duration::from_secs(6), || std::fs::remove_file(&filler).unwrap()).await;
    w.start(&cluster, runs_per_wave()).await;
    let violations = end(name, cluster, w, name).await;
    assert_eq!(violations, Vec::new());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_fsync_that_stalls_3s_under_postgresql_s_wal_slows_commits_and_breaks_nothing() {
    let _one = serial().await;
    let name = "PostgreSQL's WAL fsync stalling 3 s each for 6 s";
    let (cluster, mut w) = begin(name, Options { slow_fsync: Some(3.0), ..Options::default() }).await;
    let disk = cluster.slow.as_ref().unwrap();
    disk.stall(true);
    under_fault(&cluster, &mut w, Duration::from_secs(6), || disk.stall(false)).await;
    w.start(&cluster, runs_per_wave()).await;
    let violations = end(name, cluster, w, name).await;
    assert_eq!(violations, Vec::new());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_under_a_persisting_redis_holds_dispatch_back_until_it_is_freed() {
    let _one = serial().await;
    let name = "Redis's append-only file's disk full for 6 s";
    let (cluster, mut w) = begin(name, Options { redis_disk_mb: Some(16), ..Options::default() }).await;
    let filler = cluster.redis_disk.as_ref().unwrap().fill();
    let redis_log = || std::fs::read_to_string(cluster.dir.join("redis.log")).unwrap_or_default();
    // Under a loaded machine the wave's first writes may come after 6 s:
    // the disk stays full until Redis has met it (30 s at most).
    let met = async {
        let t0 = Instant::now();
        while !redis_log().contains("writing to the AOF file") && t0.elapsed() < Duration::from_secs(30) {
            // Polling Redis's log for the failed write.
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    };
    let heal = || {
        let log = redis_log();
        assert!(log.contains("writing to the AOF file"), "Redis never met the full disk: {log}");
        std::fs::remove_file(&filler).unwrap();
    };
    under_fault_until(&cluster, &mut w, Duration::from_secs(6), met, heal).await;
    w.start(&cluster, runs_per_wave()).await;
    let violations = end(name, cluster, w, name).await;
    assert_eq!(violations, Vec::new());
}

/// Starts sent while the disk is full, one per coordinator: their statuses.
async fn full_disk_starts(c: &Cluster) -> std::collections::BTreeMap<u16, usize> {
    let mut seen = std::collections::BTreeMap::new();
    for i in 0..10 {
        let body = serde_json::json!({"workflow": "chain", "input": {}});
        if let Ok((status, _)) = c.call(i, reqwest::Method::POST, "/v1/runs", Some(&body)).await {
            *seen.entry(status).or_default() += 1;
        }
    }
    seen
}
