//! Client commands: thin wrappers over the REST API (through the shared
//! `composer_client`) that print JSON.
//!
//! - `logs`: `run logs`, a step's log lines, read whole or followed.
//! - `export`: `run export`, runs written as an archive's files.
//! - `migrate`: `workflow migrate`, and `workflow simulate --replay`.

use std::process::ExitCode;
use std::time::Duration;

use composer_api::{EventSent, RunView, SendEvent, StartRun};
use composer_client::Client;
use composer_core::duration;
use composer_core::machine::RunStatus;
use serde_json::Value;

mod export;
mod logs;
mod migrate;

use crate::connect::{api, call};
use crate::input::encode;

use crate::cli::{
    ClientArgs, EventCommand, LimitCommand, RunCommand, RunFilter, ScheduleCommand, WebhookCommand, WorkflowCommand,
};
use crate::input::{json_arg, read_spec, usage, Failure, NOT_FOUND, RUN_FAILED, UNAVAILABLE, USAGE, WAIT_TIMED_OUT};
use crate::output::{self, Format};

type Method = reqwest::Method;

/// The exit status of an error from a client command.
pub fn exit_code(e: &anyhow::Error) -> u8 {
    if let Some(f) = e.downcast_ref::<Failure>() {
        return f.code;
    }
    match e.downcast_ref::<composer_client::Error>() {
        // A URL that is not one, or a server that is not a coordinator: the
        // URL given is wrong, whatever answers there.
        Some(composer_client::Error::BadUrl { .. } | composer_client::Error::NotComposer { .. }) => USAGE,
        Some(composer_client::Error::Unreachable { .. } | composer_client::Error::Decode(_)) => UNAVAILABLE,
        Some(composer_client::Error::Api { status: 404, .. }) => NOT_FOUND,
        Some(composer_client::Error::Api { status, .. }) if *status >= 500 => UNAVAILABLE,
        Some(composer_client::Error::Api { .. }) => USAGE,
        None => 1,
    }
}

/// `--tag KEY=VALUE` flags as the API's tags.
fn tag_args(tags: &[String]) -> anyhow::Result<Option<serde_json::Map<String, Value>>> {
    if tags.is_empty() {
        return Ok(None);
    }
    let mut out = serde_json::Map::new();
    for t in tags {
        let (k, v) = t.split_once('=').ok_or_else(|| usage(format!("--tag {t:?}: expected KEY=VALUE")))?;
        out.insert(k.to_string(), Value::String(v.to_string()));
    }
    Ok(Some(out))
}

/// A run filter's fields as the API names them (`tags` an object): the
/// query of `GET /v1/runs` and the `filter` of `POST /v1/runs/bulk`.
fn filter_fields(filter: RunFilter) -> anyhow::Result<Vec<(&'static str, Value)>> {
    let RunFilter { workflow, status, tags, created_after, created_before } = filter;
    let status = status.map(|s| s.to_ascii_uppercase());
    let mut out: Vec<(&'static str, Value)> = [
        ("workflow", workflow),
        ("status", status),
        ("created_after", created_after),
        ("created_before", created_before),
    ]
    .into_iter()
    .filter_map(|(k, v)| Some((k, Value::String(v?))))
    .collect();
    if let Some(t) = tag_args(&tags)? {
        out.push(("tags", Value::Object(t)));
    }
    Ok(out)
}

pub async fn workflow(args: ClientArgs, cmd: WorkflowCommand) -> anyhow::Result<ExitCode> {
    let api = api(&args)?;
    let format = Format::resolve(args.output.as_deref());
    match cmd {
        WorkflowCommand::Apply { file, version } => {
            let spec = crate::input::read_definition(&file)?;
            let path = match version {
                Some(v) => format!("/v1/workflows?version={v}"),
                None => "/v1/workflows".to_string(),
            };
            output::one(format, &call(&api, Method::POST, &path, Some(&spec)).await?);
        }
        WorkflowCommand::Diff { file, version } => return diff(&api, format, &file, version).await,
        WorkflowCommand::Normalize { file } => {
            let (_, normalized) = normalized(&file)?;
            output::emit(&(serde_json::to_string_pretty(&normalized)? + "\n"));
        }
        WorkflowCommand::List => {
            let answer = call(&api, Method::GET, "/v1/workflows", None).await?;
            output::list(format, &answer, "workflows", output::WORKFLOW_COLUMNS);
        }
        WorkflowCommand::Get { name } => {
            output::one(format, &call(&api, Method::GET, &format!("/v1/workflows/{}", encode(&name)), None).await?)
        }
        WorkflowCommand::Simulate {
            file,
            input,
            event,
            mocks,
            failures,
            updates,
            output,
            ask,
            replay,
            map,
            max_value,
        } => {
            let how = crate::simulate::How { format: &output, ask, max_value: max_value as usize, updates: &updates };
            let Some(run) = replay else {
                let start = match &event {
                    Some(e) => crate::simulate::Start::Event(e),
                    None => crate::simulate::Start::Input(&input),
                };
                return Ok(crate::simulate::run(&file, start, &mocks, &failures, how));
            };
            let (wf, _) = normalized(&file)?;
            let r = migrate::replayed(&api, &run, &map).await?;
            // The run's steps this definition has, then the flags' (which win).
            let has = |m: &String| m.split_once('=').is_some_and(|(node, _)| wf.node_index(node).is_some());
            let mocks: Vec<String> = r.mocks.into_iter().filter(has).chain(mocks).collect();
            let failures: Vec<String> = r.failures.into_iter().filter(has).chain(failures).collect();
            let start = crate::simulate::Start::Input(&r.input);
            return Ok(crate::simulate::run(&file, start, &mocks, &failures, how));
        }
        WorkflowCommand::Migrate { name, from, to, map, tags, reason, dry_run, wait } => {
            let m = migrate::Migrate { name, from, to, map, tags: tag_args(&tags)?, reason, dry_run, wait };
            return migrate::migrate(&api, format, m).await;
        }
        WorkflowCommand::Schema => {
            let schema = composer_api::definition_schema::workflow();
            println!("{}", serde_json::to_string_pretty(&schema).unwrap_or_default());
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// The definition in `file`, compiled, and as the server stores it.
fn normalized(file: &std::path::Path) -> anyhow::Result<(composer_core::definition::Workflow, Value)> {
    let spec = crate::input::read_definition(file)?;
    let parsed = composer_core::expr::on_eval_stack(|| composer_core::definition::Workflow::parse(&spec))
        .map_err(|e| anyhow::anyhow!(e))?;
    let wf = parsed.map_err(|e| usage(format!("{} is not a valid definition: {e}", file.display())))?;
    let value = serde_json::to_value(&wf.spec)?;
    Ok((wf, value))
}

/// `composer workflow diff`: the definition in `file`, normalized as the
/// server normalizes it, against a registered version.
async fn diff(api: &Client, format: Format, file: &std::path::Path, version: Option<i32>) -> anyhow::Result<ExitCode> {
    let (wf, new) = normalized(file)?;
    let name = encode(&wf.spec.name);
    let path = match version {
        Some(v) => format!("/v1/workflows/{name}/versions/{v}"),
        None => format!("/v1/workflows/{name}"),
    };
    let registered = match api.call::<Value>(Method::GET, &path, None::<&Value>).await {
        Ok(r) => r,
        Err(e) if e.status() == Some(404) && version.is_none() => {
            output::emit(&format!("workflow {:?} is not registered: registering it creates version 1\n", wf.spec.name));
            return Ok(ExitCode::from(1));
        }
        Err(e) => return Err(e.into()),
    };
    let changes = crate::diff::changes(&registered["spec"], &new);
    let against = registered["version"].as_i64().unwrap_or_default();
    match format {
        Format::Table => {
            let mut text = format!("{} against version {against}: {} change(s)\n", wf.spec.name, changes.len());
            for line in crate::diff::lines(&changes) {
                text.push_str(&line);
                text.push('\n');
            }
            output::emit(&text);
        }
        _ => {
            let changes: Vec<Value> =
                changes.iter().map(|c| serde_json::json!({"path": c.path, "old": c.old, "new": c.new})).collect();
            let answer = serde_json::json!({"workflow": wf.spec.name, "version": against, "changes": changes});
            output::one(format, &answer);
        }
    }
    Ok(if changes.is_empty() { ExitCode::SUCCESS } else { ExitCode::from(1) })
}

pub async fn run(args: ClientArgs, cmd: RunCommand) -> anyhow::Result<ExitCode> {
    let api = api(&args)?;
    let format = Format::resolve(args.output.as_deref());
    let run_path = |id: &str, action: &str| format!("/v1/runs/{}{action}", encode(id));
    match cmd {
        RunCommand::Start { workflow, input, idempotency_key, version, tags, priority, wait, timeout } => {
            let input = json_arg("--input", &input)?;
            let tags = tag_args(&tags)?;
            let req = StartRun { workflow, version, input: Some(input), idempotency_key, tags, priority };
            return start_and_show(&api, format, &req, wait.then_some(timeout)).await;
        }
        RunCommand::Get { id } => output::one(format, &call(&api, Method::GET, &run_path(&id, ""), None).await?),
        RunCommand::List { filter, limit, cursor } => {
            let path = format!("/v1/runs?{}", list_query(filter, limit, cursor)?);
            output::list(format, &call(&api, Method::GET, &path, None).await?, "runs", output::RUN_COLUMNS);
        }
        RunCommand::Events { id } => {
            let events = whole_history(&api, &run_path(&id, "/events")).await?;
            output::all(format, &events, output::EVENT_COLUMNS);
        }
        RunCommand::Logs { id, node, attempt, follow } => {
            return logs::logs(&api, format, &id, &node, attempt, follow).await;
        }
        RunCommand::Export { filter, out } => return export::export(&api, format, filter, &out).await,
        RunCommand::Archived { id } => output::one(format, &export::archived(&api, &id).await?),
        RunCommand::Cancel { id, reason } => control(&api, format, &run_path(&id, "/cancel"), reason).await?,
        RunCommand::Retry { id, reason, wait, timeout } => {
            let body = reason.map(|r| serde_json::json!({"reason": r}));
            let run: RunView =
                serde_json::from_value(call(&api, Method::POST, &run_path(&id, "/retry"), body.as_ref()).await?)?;
            return show_run(&api, format, run, wait.then_some(timeout)).await;
        }
        RunCommand::Pause { id, reason } => control(&api, format, &run_path(&id, "/pause"), reason).await?,
        RunCommand::Resume { id, reason } => control(&api, format, &run_path(&id, "/resume"), reason).await?,
        RunCommand::Priority { id, priority } => {
            let body = serde_json::json!({ "priority": priority });
            output::one(format, &call(&api, Method::PUT, &run_path(&id, "/priority"), Some(&body)).await?)
        }
        RunCommand::Rerun { id, from, input, allow_completed, reason } => {
            let mut body = serde_json::json!({"from": from, "allow_completed": allow_completed});
            if let Some(i) = input {
                body["input"] = json_arg("--input", &i)?;
            }
            let body = with_reason(body, reason);
            output::one(format, &call(&api, Method::POST, &run_path(&id, "/rerun"), Some(&body)).await?)
        }
        RunCommand::Complete { id, node, output: step_output, reason } => {
            let body = with_reason(serde_json::json!({"output": json_arg("--output", &step_output)?}), reason);
            let path = run_path(&id, &format!("/tasks/{}/complete", encode(&node)));
            output::one(format, &call(&api, Method::POST, &path, Some(&body)).await?)
        }
        RunCommand::Why { id } => {
            let answer = call(&api, Method::GET, &run_path(&id, "/explain"), None).await?;
            show_explain(format, &answer, &id);
        }
        RunCommand::Bulk { action, filter, from, reason, dry_run } => {
            let body = bulk_body(action, filter, from, reason, dry_run)?;
            output::one(format, &call(&api, Method::POST, "/v1/runs/bulk", Some(&body)).await?)
        }
        RunCommand::BulkStatus { job } => {
            output::one(format, &call(&api, Method::GET, &format!("/v1/bulk/{}", encode(&job)), None).await?)
        }
        RunCommand::BulkCancel { job } => {
            output::one(format, &call(&api, Method::POST, &format!("/v1/bulk/{}/cancel", encode(&job)), None).await?)
        }
        RunCommand::Update { id, name, payload, update_id, timeout } => {
            return update(&api, format, &id, (name, payload), (update_id, timeout)).await;
        }
        RunCommand::Resolve { id, node, outcome, output: step_output, error } => {
            let body = resolution(outcome, step_output, error)?;
            let path = run_path(&id, &format!("/tasks/{}/resolve", encode(&node)));
            output::one(format, &call(&api, Method::POST, &path, Some(&body)).await?)
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `run start`: starts the run and prints it; with `wait`, prints it once
/// it ended instead, and exits as it ended (or as a wait that ran out).
async fn start_and_show(
    api: &Client,
    format: Format,
    req: &StartRun,
    wait: Option<Duration>,
) -> anyhow::Result<ExitCode> {
    let run = api.start_run(req).await?;
    show_run(api, format, run, wait).await
}

/// Prints a run; with `wait`, prints it once it ended instead, and exits as
/// it ended (or as a wait that ran out).
async fn show_run(api: &Client, format: Format, run: RunView, wait: Option<Duration>) -> anyhow::Result<ExitCode> {
    let Some(timeout) = wait else {
        output::one(format, &serde_json::to_value(&run)?);
        return Ok(ExitCode::SUCCESS);
    };
    let run = wait_showing_progress(api, run.id, timeout).await?;
    output::one(format, &serde_json::to_value(&run)?);
    match run.status {
        RunStatus::Succeeded => Ok(ExitCode::SUCCESS),
        RunStatus::Queued | RunStatus::Running | RunStatus::Paused => Err(Failure {
            code: WAIT_TIMED_OUT,
            message: format!("run {} still {} after {}", run.id, run.status, duration::format(timeout)),
        }
        .into()),
        _ => Ok(ExitCode::from(RUN_FAILED)),
    }
}

/// `run list`'s query: the page, then the filter (a tag as `tag.KEY=VALUE`).
fn list_query(filter: RunFilter, limit: u32, cursor: Option<String>) -> anyhow::Result<String> {
    let mut query = vec![format!("limit={limit}")];
    if let Some(c) = cursor {
        query.push(format!("cursor={}", encode(&c)));
    }
    for (k, v) in filter_fields(filter)? {
        match v {
            Value::Object(tags) => {
                for (k, v) in tags {
                    query.push(format!("tag.{}={}", encode(&k), encode(v.as_str().unwrap_or_default())));
                }
            }
            v => query.push(format!("{k}={}", encode(v.as_str().unwrap_or_default()))),
        }
    }
    Ok(query.join("&"))
}

/// Every page of a run's history at `path`, to the end.
async fn whole_history(api: &Client, path: &str) -> anyhow::Result<Vec<Value>> {
    let mut events = Vec::new();
    let mut after = 0i64;
    loop {
        let page = call(api, Method::GET, &format!("{path}?after={after}&limit=1000"), None).await?;
        events.extend(page["events"].as_array().cloned().unwrap_or_default());
        match page["next_after"].as_i64() {
            Some(next) => after = next,
            None => return Ok(events),
        }
    }
}

/// A control action (cancel, retry, pause, resume) at `path`, with its reason if given.
async fn control(api: &Client, format: Format, path: &str, reason: Option<String>) -> anyhow::Result<()> {
    let body = reason.map(|r| serde_json::json!({"reason": r}));
    output::one(format, &call(api, Method::POST, path, body.as_ref()).await?);
    Ok(())
}

/// `body` with `reason` added when one is given.
fn with_reason(mut body: Value, reason: Option<String>) -> Value {
    if let Some(r) = reason {
        body["reason"] = Value::String(r);
    }
    body
}

/// `run why`: the explanation as JSON, or as a line per open step.
fn show_explain(format: Format, answer: &Value, id: &str) {
    match format {
        Format::Json | Format::Jsonl => output::one(format, answer),
        Format::Table => {
            println!(
                "{} {}: {}",
                answer["run_id"].as_str().unwrap_or(id),
                answer["status"].as_str().unwrap_or(""),
                answer["summary"].as_str().unwrap_or("")
            );
            for n in answer["nodes"].as_array().into_iter().flatten() {
                println!(
                    "  {} ({}): {}",
                    n["node_id"].as_str().unwrap_or(""),
                    n["state"].as_str().unwrap_or(""),
                    n["reason"].as_str().unwrap_or("")
                );
            }
        }
    }
}

/// `run bulk`'s request.
fn bulk_body(
    action: String,
    filter: RunFilter,
    from: Vec<String>,
    reason: Option<String>,
    dry_run: bool,
) -> anyhow::Result<Value> {
    let filter: serde_json::Map<String, Value> =
        filter_fields(filter)?.into_iter().map(|(k, v)| (k.to_string(), v)).collect();
    let mut body = serde_json::json!({"filter": filter, "action": action, "dry_run": dry_run});
    if !from.is_empty() {
        body["from"] = serde_json::json!(from);
    }
    Ok(with_reason(body, reason))
}

/// Waits for the run to end, writing to stderr what it is doing whenever
/// that changes (`running: charge (attempt 2)`); returns the run as last seen.
async fn wait_showing_progress(api: &Client, id: uuid::Uuid, timeout: Duration) -> anyhow::Result<RunView> {
    let give_up = tokio::time::Instant::now() + timeout;
    let mut shown = String::new();
    loop {
        let left = give_up.saturating_duration_since(tokio::time::Instant::now());
        let run = api.wait_for_run(id, left.min(Duration::from_secs(1))).await?;
        let now: Vec<String> = run
            .tasks
            .iter()
            .flatten()
            .filter(|t| !t.state.is_terminal())
            .map(|t| match t.attempt {
                1 => format!("{} {}", t.node_id, t.state.as_str().to_lowercase()),
                n => format!("{} {} (attempt {n})", t.node_id, t.state.as_str().to_lowercase()),
            })
            .collect();
        let line = format!("{}: {}", run.status.as_str().to_lowercase(), now.join(", "));
        if line != shown && !run.status.is_terminal() {
            eprintln!("{line}");
            shown = line;
        }
        if run.status.is_terminal() || tokio::time::Instant::now() >= give_up {
            return Ok(run);
        }
    }
}

pub async fn event(args: ClientArgs, cmd: EventCommand) -> anyhow::Result<ExitCode> {
    let api = api(&args)?;
    let format = Format::resolve(args.output.as_deref());
    match cmd {
        EventCommand::Send { name, key, payload, id } => {
            let payload = json_arg("--payload", &payload)?;
            let body = SendEvent { name, key: key.unwrap_or_default(), payload, id };
            let sent: EventSent = api.call(Method::POST, "/v1/events", Some(&body)).await?;
            output::one(format, &serde_json::to_value(sent)?);
        }
        EventCommand::List { name, source, limit, before } => {
            let mut query = format!("/v1/events?limit={limit}");
            for (k, v) in [("name", name), ("source", source), ("before", before.map(|b| b.to_string()))] {
                if let Some(v) = v {
                    query.push_str(&format!("&{k}={}", encode(&v)));
                }
            }
            let answer = call(&api, Method::GET, &query, None).await?;
            output::list(format, &answer, "events", output::RECENT_EVENT_COLUMNS);
        }
        EventCommand::Replay { from, to, name, key, failed_only, reason, dry_run } => {
            let now = chrono::Utc::now();
            let mut filter = serde_json::json!({
                "from": moment("--from", &from, now)?,
                "to": to.map(|t| moment("--to", &t, now)).transpose()?.unwrap_or_else(|| now.to_rfc3339()),
                "failed_only": failed_only,
            });
            for (k, v) in [("name", name), ("key", key)] {
                if let Some(v) = v {
                    filter[k] = Value::String(v);
                }
            }
            let body = with_reason(serde_json::json!({"filter": filter, "dry_run": dry_run}), reason);
            output::one(format, &call(&api, Method::POST, "/v1/events/replay", Some(&body)).await?)
        }
        EventCommand::ReplayStatus { replay } => {
            let path = format!("/v1/events/replay/{}", encode(&replay));
            output::one(format, &call(&api, Method::GET, &path, None).await?)
        }
        EventCommand::ReplayCancel { replay } => {
            let path = format!("/v1/events/replay/{}/cancel", encode(&replay));
            output::one(format, &call(&api, Method::POST, &path, None).await?)
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `run resolve`'s body: the outcome, with the step's output or error.
fn resolution(outcome: String, output: Option<String>, error: Option<String>) -> anyhow::Result<Value> {
    let mut body = serde_json::json!({"outcome": outcome});
    if let Some(o) = output {
        body["output"] = json_arg("--output", &o)?;
    }
    if let Some(e) = error {
        body["error"] = Value::String(e);
    }
    Ok(body)
}

/// `run update`: the step's answer; exit 1 when it refused.
async fn update(
    api: &Client,
    format: Format,
    run: &str,
    (name, payload): (String, String),
    (id, timeout): (Option<String>, Option<String>),
) -> anyhow::Result<ExitCode> {
    let mut body = serde_json::json!({"name": name, "payload": json_arg("--payload", &payload)?});
    for (k, v) in [("id", id), ("timeout", timeout)] {
        if let Some(v) = v {
            body[k] = Value::String(v);
        }
    }
    let answer = call(api, Method::POST, &format!("/v1/runs/{}/update", encode(run)), Some(&body)).await?;
    output::one(format, &answer);
    Ok(if answer["accepted"] == true { ExitCode::SUCCESS } else { ExitCode::from(1) })
}

/// A moment given as RFC 3339, or as a duration (`2h`) before `now`.
fn moment(flag: &str, v: &str, now: chrono::DateTime<chrono::Utc>) -> anyhow::Result<String> {
    if let Ok(t) = chrono::DateTime::parse_from_rfc3339(v) {
        return Ok(t.to_rfc3339());
    }
    let ago = composer_core::duration::parse(v)
        .ok()
        .and_then(|d| chrono::Duration::from_std(d).ok())
        .and_then(|d| now.checked_sub_signed(d))
        .ok_or_else(|| anyhow::anyhow!("{flag}: {v:?} is neither an RFC 3339 time nor a duration such as 2h"))?;
    Ok(ago.to_rfc3339())
}

pub async fn webhook(args: ClientArgs, cmd: WebhookCommand) -> anyhow::Result<ExitCode> {
    let api = api(&args)?;
    let format = Format::resolve(args.output.as_deref());
    let path = |name: &str| format!("/v1/webhooks/{}", encode(name));
    let answer = match cmd {
        WebhookCommand::Create { file, name, scheme, secret, tolerance, event } => {
            let spec = match file {
                Some(file) => read_spec(&file)?,
                None => {
                    let mut spec = serde_json::json!({"name": name, "scheme": scheme, "secret": secret});
                    if let Some(t) = tolerance {
                        spec["tolerance"] = Value::from(t);
                    }
                    if let Some(e) = event {
                        spec["event"] = json_arg("--event", &e)?;
                    }
                    spec
                }
            };
            call(&api, Method::POST, "/v1/webhooks", Some(&spec)).await?
        }
        WebhookCommand::List => {
            let answer = call(&api, Method::GET, "/v1/webhooks", None).await?;
            output::list(format, &answer, "webhooks", output::WEBHOOK_COLUMNS);
            return Ok(ExitCode::SUCCESS);
        }
        WebhookCommand::Get { name } => call(&api, Method::GET, &path(&name), None).await?,
        WebhookCommand::Delete { name } => call(&api, Method::DELETE, &path(&name), None).await?,
    };
    output::one(format, &answer);
    Ok(ExitCode::SUCCESS)
}

pub async fn limit(args: ClientArgs, cmd: LimitCommand) -> anyhow::Result<ExitCode> {
    let api = api(&args)?;
    let format = Format::resolve(args.output.as_deref());
    let path = |key: &str| format!("/v1/limits/{}", encode(key));
    let answer = match cmd {
        LimitCommand::List { after, limit } => {
            let mut query = format!("/v1/limits?limit={limit}");
            if let Some(after) = after {
                query.push_str(&format!("&after={}", encode(&after)));
            }
            let answer = call(&api, Method::GET, &query, None).await?;
            output::list(format, &answer, "limits", output::LIMIT_COLUMNS);
            return Ok(ExitCode::SUCCESS);
        }
        LimitCommand::Get { key } => call(&api, Method::GET, &path(&key), None).await?,
        LimitCommand::Set { key, rate, burst, concurrency } => {
            let mut body = serde_json::Map::new();
            for (field, v) in [
                ("rate", rate.map(Value::from)),
                ("burst", burst.map(Value::from)),
                ("concurrency", concurrency.map(Value::from)),
            ] {
                if let Some(v) = v {
                    body.insert(field.into(), v);
                }
            }
            call(&api, Method::PUT, &path(&key), Some(&Value::Object(body))).await?
        }
        LimitCommand::Delete { key } => call(&api, Method::DELETE, &path(&key), None).await?,
    };
    output::one(format, &answer);
    Ok(ExitCode::SUCCESS)
}

pub async fn schedule(args: ClientArgs, cmd: ScheduleCommand) -> anyhow::Result<ExitCode> {
    let api = api(&args)?;
    let format = Format::resolve(args.output.as_deref());
    let path = |id: &str, action: &str| format!("/v1/schedules/{}{action}", encode(id));
    let answer = match cmd {
        ScheduleCommand::Create {
            file,
            id,
            workflow,
            cron,
            version,
            timezone,
            input,
            overlap,
            catchup_window,
            paused,
        } => {
            let spec = match file {
                Some(file) => read_spec(&file)?,
                None => {
                    let mut spec = serde_json::json!({"id": id, "workflow": workflow, "cron": cron});
                    let input = match input {
                        Some(i) => Some(json_arg("--input", &i)?),
                        None => None,
                    };
                    let optional = [
                        ("version", version.map(Value::from)),
                        ("timezone", timezone.map(Value::from)),
                        ("input", input),
                        ("overlap", overlap.map(Value::from)),
                        ("catchup_window", catchup_window.map(Value::from)),
                        ("paused", paused.then_some(Value::Bool(true))),
                    ];
                    for (k, v) in optional {
                        if let Some(v) = v {
                            spec[k] = v;
                        }
                    }
                    spec
                }
            };
            call(&api, Method::POST, "/v1/schedules", Some(&spec)).await?
        }
        ScheduleCommand::List { limit, after } => {
            let mut query = format!("/v1/schedules?limit={limit}");
            if let Some(a) = after {
                query.push_str(&format!("&after={}", encode(&a)));
            }
            let answer = call(&api, Method::GET, &query, None).await?;
            output::list(format, &answer, "schedules", output::SCHEDULE_COLUMNS);
            return Ok(ExitCode::SUCCESS);
        }
        ScheduleCommand::Get { id } => call(&api, Method::GET, &path(&id, ""), None).await?,
        ScheduleCommand::Delete { id } => call(&api, Method::DELETE, &path(&id, ""), None).await?,
        ScheduleCommand::Pause { id } => call(&api, Method::POST, &path(&id, "/pause"), None).await?,
        ScheduleCommand::Resume { id } => call(&api, Method::POST, &path(&id, "/resume"), None).await?,
        ScheduleCommand::Trigger { id } => call(&api, Method::POST, &path(&id, "/trigger"), None).await?,
        ScheduleCommand::Backfill { id, from, to, overlap } => {
            let mut body = serde_json::json!({"from": from, "to": to});
            if let Some(o) = overlap {
                body["overlap"] = Value::from(o);
            }
            call(&api, Method::POST, &path(&id, "/backfill"), Some(&body)).await?
        }
    };
    output::one(format, &answer);
    Ok(ExitCode::SUCCESS)
}
