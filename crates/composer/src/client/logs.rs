//! `composer run logs`: a step's log lines, of one attempt, read from
//! `GET /v1/runs/{id}/tasks/{node}/logs` page by page (each page after the
//! last line's `seq`, so no line twice); with `--follow`, new ones as they
//! come until the attempt ends. The step's state comes from the run
//! (`GET /v1/runs/{id}`), a MAP item's from its MAP's items
//! (`GET /v1/runs/{id}/items`).

use std::process::ExitCode;
use std::time::Duration;

use composer_api::{DefinitionView, ItemPage, RunView, StepLogs, TaskView};
use composer_client::Client;
use composer_core::machine::TaskState;
use reqwest::Method;

use crate::input::{encode, Failure, NOT_FOUND, RUN_FAILED};
use crate::output::{self, Format};

/// How often `--follow` asks for new lines (a worker sends about once a second).
const POLL: Duration = Duration::from_millis(500);
/// Lines a page: the route's most.
const PAGE: u32 = 1000;
/// Node ids an unknown node's error lists at most.
const LISTED: usize = 20;

/// `run logs RUN NODE [--attempt N] [--follow]`.
pub async fn logs(
    api: &Client,
    format: Format,
    run: &str,
    node: &str,
    attempt: Option<i32>,
    follow: bool,
) -> anyhow::Result<ExitCode> {
    let step = Step::new(run, node);
    let (mut view, task) = step.now(api).await?;
    let mut task = match task {
        Some(t) => t,
        None => {
            step.is_a_node(api, &view).await?;
            if !follow {
                return Err(not_found(format!("step {node} of run {run} has not started: it has no log yet")));
            }
            let (now, started) = step.started(api).await?;
            view = now;
            started
        }
    };
    let current = task.attempt.max(1);
    let attempt = attempt.unwrap_or(current);
    if attempt > current {
        let had = if current == 1 { "1 attempt".to_string() } else { format!("{current} attempts, 1 to {current}") };
        return Err(not_found(format!("step {node} of run {run} has no attempt {attempt}: it has had {had}")));
    }
    let mut log = Log { format, path: step.logs_path(attempt), after: 0, last: None, lines: Vec::new() };
    if !follow {
        log.drain(api).await?;
        return log.finish();
    }
    loop {
        // A run that ended leaves no attempt open (a step that never got
        // its turn stays PENDING).
        let ended = attempt_ended(&task, attempt) || view.status.is_terminal();
        if !log.drain(api).await? {
            return Ok(ExitCode::SUCCESS); // nobody reads any more (`| head`)
        }
        if ended {
            break;
        }
        tokio::time::sleep(POLL).await;
        let (now, step_now) = step.now(api).await?;
        view = now;
        task = step_now.ok_or_else(|| not_found(format!("step {node} of run {run} is gone")))?;
    }
    log.finish()?;
    let fine = matches!(task.state, TaskState::Completed | TaskState::Skipped) && task.attempt == attempt;
    Ok(if fine { ExitCode::SUCCESS } else { ExitCode::from(RUN_FAILED) })
}

/// Whether `attempt` of the step is over: a later one began, the step
/// ended or is IN_DOUBT, or the attempt failed and waits for its retry (a
/// WAITING step with an error; one waiting for an event or a timer has none).
fn attempt_ended(task: &TaskView, attempt: i32) -> bool {
    task.attempt > attempt
        || task.state.is_terminal()
        || task.state == TaskState::InDoubt
        || (task.state == TaskState::Waiting && task.error.is_some())
}

/// The step asked for: a node of the run, or an item of a MAP (`ship_each[3]`).
struct Step<'a> {
    run: &'a str,
    node: &'a str,
    item: Option<(&'a str, i32)>,
}

impl<'a> Step<'a> {
    fn new(run: &'a str, node: &'a str) -> Step<'a> {
        let item = node
            .strip_suffix(']')
            .and_then(|n| n.rsplit_once('['))
            .and_then(|(map, i)| Some((map, i.parse::<i32>().ok().filter(|i| *i >= 0)?)));
        Step { run, node, item }
    }

    fn run_path(&self) -> String {
        format!("/v1/runs/{}", encode(self.run))
    }

    fn logs_path(&self, attempt: i32) -> String {
        format!("{}/tasks/{}/logs?attempt={attempt}", self.run_path(), encode(self.node))
    }

    /// The run, and the step's task as it is now (none before it starts).
    async fn now(&self, api: &Client) -> anyhow::Result<(RunView, Option<TaskView>)> {
        let run: RunView = get(api, &self.run_path()).await?;
        let node = self.item.map_or(self.node, |(map, _)| map);
        let top = run.tasks.iter().flatten().find(|t| t.node_id == node).cloned();
        let (Some((map, index)), Some(map_task)) = (self.item, &top) else { return Ok((run, top)) };
        let Some(progress) = &map_task.progress else {
            let kind = &map_task.node_type;
            return Err(not_found(format!("node {map} of run {} is a {kind}, not a MAP: it has no items", self.run)));
        };
        if index as u32 >= progress.total {
            let has = match progress.total {
                0 => "none".to_string(),
                n => format!("{n}, {map}[0] to {map}[{}]", n - 1),
            };
            return Err(not_found(format!("MAP {map} of run {} has no item {index}: its items are {has}", self.run)));
        }
        let path = format!("{}/items?node={}&after={}&limit=1", self.run_path(), encode(map), index - 1);
        let page: ItemPage = get(api, &path).await?;
        Ok((run, page.items.into_iter().find(|t| t.item_index == Some(index))))
    }

    /// Refuses a node the run's definition does not have, naming the ones it has.
    async fn is_a_node(&self, api: &Client, run: &RunView) -> anyhow::Result<()> {
        let node = self.item.map_or(self.node, |(map, _)| map);
        let path = format!("/v1/workflows/{}/versions/{}", encode(&run.workflow), run.version);
        // The definition's nodes, in its order (a step starts only when
        // its turn comes); the run's tasks if it cannot be read.
        let spec = get::<DefinitionView>(api, &path).await.ok().and_then(|d| d.spec).unwrap_or_default();
        let nodes = spec["nodes"].as_array().cloned().unwrap_or_default();
        let mut ids: Vec<String> = nodes.iter().filter_map(|n| n["id"].as_str().map(str::to_string)).collect();
        for t in run.tasks.iter().flatten() {
            if !ids.contains(&t.node_id) {
                ids.push(t.node_id.clone());
            }
        }
        if ids.iter().any(|id| id == node) {
            return Ok(());
        }
        let mut listed = ids.iter().take(LISTED).map(String::as_str).collect::<Vec<_>>().join(", ");
        if ids.len() > LISTED {
            listed.push_str(&format!(" and {} more", ids.len() - LISTED));
        }
        Err(not_found(format!("run {} has no node {node:?}; its nodes: {listed}", self.run)))
    }

    /// Waits for the step to start (`--follow` on a step not started yet):
    /// the run then, and the step's task.
    async fn started(&self, api: &Client) -> anyhow::Result<(RunView, TaskView)> {
        loop {
            tokio::time::sleep(POLL).await;
            let (run, task) = self.now(api).await?;
            if let Some(t) = task {
                return Ok((run, t));
            }
            if run.status.is_terminal() {
                return Err(not_found(format!(
                    "run {} ended ({}) without starting step {}",
                    self.run,
                    run.status.as_str(),
                    self.node
                )));
            }
        }
    }
}

/// One attempt's log as read so far.
struct Log {
    format: Format,
    path: String,
    /// The last line's `seq`: the next page starts after it.
    after: i32,
    /// The last page (for `-o json`'s document).
    last: Option<StepLogs>,
    /// Every line (kept for `-o json` only, printed at the end).
    lines: Vec<composer_api::LogLineView>,
}

impl Log {
    /// Reads and prints the lines after the last one, every page; false
    /// when standard output is closed.
    async fn drain(&mut self, api: &Client) -> anyhow::Result<bool> {
        loop {
            let mut page: StepLogs = get(api, &format!("{}&after={}&limit={PAGE}", self.path, self.after)).await?;
            if let Some(last) = page.lines.last() {
                self.after = last.seq;
            }
            let lines = std::mem::take(&mut page.lines);
            let more = page.next_after.is_some();
            self.last = Some(page);
            if self.format == Format::Json {
                self.lines.extend(lines);
            } else if !output::log_lines(self.format, &lines) {
                return Ok(false);
            }
            if !more {
                return Ok(true);
            }
        }
    }

    /// `-o json`: the whole log as one document, the route's with every line.
    fn finish(self) -> anyhow::Result<ExitCode> {
        if let (Format::Json, Some(mut page)) = (self.format, self.last) {
            page.lines = self.lines;
            page.next_after = None;
            output::one(Format::Json, &serde_json::to_value(&page)?);
        }
        Ok(ExitCode::SUCCESS)
    }
}

async fn get<T: serde::de::DeserializeOwned>(api: &Client, path: &str) -> anyhow::Result<T> {
    Ok(api.call(Method::GET, path, None::<&()>).await?)
}

fn not_found(message: String) -> anyhow::Error {
    Failure { code: NOT_FOUND, message }.into()
}
