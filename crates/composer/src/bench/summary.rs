//! Everything measured, as the JSON line or the printed summary.

use serde_json::{json, Value};

use super::args::BenchArgs;
use super::phases::Latency;
use super::postgres::PerStep;
use super::samples::{p, percentile, round2, round3};

/// Everything measured, for the JSON line or the summary.
pub(super) struct Results {
    pub(super) latency: Latency,
    /// Mean ms per stage of a step over the latency phase.
    pub(super) stages: Vec<(&'static str, f64)>,
    /// Of the tasks the coordinator dispatched in the latency and the
    /// throughput phase, the share of each of [`super::scrape::DISPATCH_COUNTERS`].
    pub(super) dispatch: [Option<[f64; 3]>; 2],
    pub(super) wall: f64,
    pub(super) total_steps: f64,
    pub(super) commits_per_step: Option<f64>,
    pub(super) per_step: Option<PerStep>,
    /// CPU ms per step over the throughput phase of each process measured
    /// ([`super::target::Target::processes`]).
    pub(super) process_cpu_ms: Vec<(&'static str, f64)>,
    pub(super) baseline_tps: Option<f64>,
    pub(super) timers: Option<(u64, usize, Vec<f64>)>,
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

    /// The CPU ms per step of the process measured as `what`.
    pub(super) fn cpu_ms_of(&self, what: &str) -> Option<f64> {
        self.process_cpu_ms.iter().find(|(w, _)| *w == what).map(|(_, ms)| *ms)
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
            "process_cpu_ms_per_step": self.process_cpu_ms.iter().map(|(w, ms)| (w.to_string(), json!(round3(*ms))))
                .collect::<serde_json::Map<_, _>>(),
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
        self.print_work(steps_per_s);
    }

    /// What each step cost: PostgreSQL's work, each process's CPU, and
    /// pgbench's rate when measured.
    fn print_work(&self, steps_per_s: f64) {
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
        for (what, ms) in &self.process_cpu_ms {
            println!("CPU per step of {what}: {ms:.3} ms");
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
