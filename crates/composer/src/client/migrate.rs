//! `workflow migrate`: a version's open runs moved to another version
//! (`POST /v1/workflows/{name}/migrate`), its dry run's verdicts or the job
//! moving them; and `workflow simulate --replay`: a run's recorded outputs
//! as the mocks of a simulation of the version it may move to.

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::time::Duration;

use composer_api::{BulkJobView, MigrateRequest, RunView};
use composer_client::Client;
use composer_core::machine::TaskState;
use reqwest::Method;
use serde_json::Value;

use crate::input::{encode, usage};
use crate::output::{self, Format};

/// How often `--wait` looks at the job.
const POLL: Duration = Duration::from_millis(500);

/// `workflow migrate NAME --from N --to M …`'s flags.
pub struct Migrate {
    pub name: String,
    pub from: i32,
    pub to: i32,
    pub map: Vec<String>,
    /// Only the runs with every one of these tags.
    pub tags: Option<serde_json::Map<String, Value>>,
    pub reason: Option<String>,
    pub dry_run: bool,
    pub wait: bool,
}

/// Prints the dry run's verdicts, or the job (once it ended, with `wait`:
/// exit 1 when it refused a run).
pub async fn migrate(api: &Client, format: Format, m: Migrate) -> anyhow::Result<ExitCode> {
    let filter = m.tags.map(|tags| composer_api::BulkFilter { tags: Some(Value::Object(tags)), ..Default::default() });
    let req = MigrateRequest {
        from_version: m.from,
        to_version: m.to,
        filter,
        map: pairs("--map", &m.map)?,
        reason: m.reason,
        dry_run: m.dry_run,
    };
    let path = format!("/v1/workflows/{}/migrate", encode(&m.name));
    let answer: Value = api.call(Method::POST, &path, Some(&serde_json::to_value(&req)?)).await?;
    if m.dry_run || !m.wait {
        output::one(format, &answer);
        return Ok(ExitCode::SUCCESS);
    }
    let mut job: BulkJobView = serde_json::from_value(answer)?;
    while job.status == "RUNNING" {
        // Polling the job a coordinator works through.
        tokio::time::sleep(POLL).await;
        job = api.call(Method::GET, &format!("/v1/bulk/{}", job.id), None::<&Value>).await?;
    }
    output::one(format, &serde_json::to_value(&job)?);
    Ok(if job.refused > 0 { ExitCode::from(1) } else { ExitCode::SUCCESS })
}

/// `OLD=NEW` flags as a mapping.
fn pairs(flag: &str, args: &[String]) -> anyhow::Result<BTreeMap<String, String>> {
    let mut out = BTreeMap::new();
    for a in args {
        let (old, new) = a.split_once('=').ok_or_else(|| usage(format!("{flag} {a:?}: expected OLD=NEW")))?;
        if out.insert(old.to_string(), new.to_string()).is_some() {
            return Err(usage(format!("{flag}: {old:?} is named twice")));
        }
    }
    Ok(out)
}

/// What `--replay RUN` simulates with: the run's input, and for each step
/// that ended its output as a `--mock` (a failure as a `--fail`), under
/// the name `--map` gives it.
pub struct Replayed {
    pub input: String,
    pub mocks: Vec<String>,
    pub failures: Vec<String>,
}

pub async fn replayed(api: &Client, run: &str, map: &[String]) -> anyhow::Result<Replayed> {
    let id = run.parse().map_err(|_| usage(format!("--replay {run:?}: expected a run id (a UUID)")))?;
    let map = pairs("--map", map)?;
    let run: RunView = api.get_run(id).await?;
    let mut r = Replayed { input: serde_json::to_string(&run.input)?, mocks: Vec::new(), failures: Vec::new() };
    for t in run.tasks.iter().flatten() {
        let node = map.get(&t.node_id).unwrap_or(&t.node_id);
        match (t.state, &t.output) {
            (TaskState::Completed, Some(output)) => r.mocks.push(format!("{node}={output}")),
            (TaskState::Failed, _) => r.failures.push(format!("{node}={}", t.error.as_deref().unwrap_or("failed"))),
            _ => {}
        }
    }
    Ok(r)
}
