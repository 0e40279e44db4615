//! PostgreSQL's side of a bench: the work it did (commits, row writes,
//! CPU), a history to fill it with, and pgbench's rate on the same server
//! as a baseline.

use std::time::Duration;

use anyhow::{bail, Context};
use uuid::Uuid;

use composer_store::fixtures;

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

/// CPU seconds (user + system, every thread) of process `pid` so far.
pub(super) fn process_cpu_seconds(pid: u32) -> Option<f64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let fields: Vec<&str> = text.rsplit_once(')')?.1.split_whitespace().collect();
    let ticks = fields.get(11)?.parse::<f64>().ok()? + fields.get(12)?.parse::<f64>().ok()?;
    // SAFETY: sysconf has no preconditions; it reads a constant of the system.
    #[allow(unsafe_code)]
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    (hz > 0).then(|| ticks / hz as f64)
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

impl PerStep {
    /// The work between two readings, per step of the `steps` taken between them.
    pub(super) fn between(before: Work, after: Work, steps: f64) -> PerStep {
        PerStep {
            commits: (after.commits - before.commits) as f64 / steps,
            rows: std::array::from_fn(|i| (after.rows[i] - before.rows[i]) as f64 / steps),
            cpu_ms: after.cpu_s.zip(before.cpu_s).map(|(a, b)| (a - b) * 1000.0 / steps),
        }
    }
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

#[cfg(test)]
mod tests {
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
