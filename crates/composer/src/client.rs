//! Client commands: thin wrappers over the REST API (through the shared
//! `composer_client`) that print JSON.

use std::process::ExitCode;
use std::time::Duration;

use anyhow::{bail, Context};
use composer_client::Client;
use composer_core::api::{EventSent, SendEvent, StartRun};
use composer_core::machine::RunStatus;
use serde_json::Value;

use composer_core::config::non_empty;

use crate::cli::{ClientArgs, EventCommand, RunCommand, ScheduleCommand, WorkflowCommand};

type Method = reqwest::Method;

fn api(args: &ClientArgs) -> anyhow::Result<Client> {
    let http =
        reqwest::Client::builder().timeout(Duration::from_secs(90)).build().context("building the HTTP client")?;
    Ok(Client::new(http, &args.url, non_empty(&args.api_token)))
}

/// Calls the API and returns its answer as JSON, for printing.
async fn call(api: &Client, method: Method, path: &str, body: Option<&Value>) -> anyhow::Result<Value> {
    Ok(api.call(method, path, body).await?)
}

fn print(v: &Value) {
    println!("{}", serde_json::to_string_pretty(v).unwrap_or_default());
}

pub async fn workflow(args: ClientArgs, cmd: WorkflowCommand) -> anyhow::Result<ExitCode> {
    let api = api(&args)?;
    match cmd {
        WorkflowCommand::Apply { file } => {
            let spec = read_spec(&file)?;
            print(&call(&api, Method::POST, "/v1/workflows", Some(&spec)).await?);
        }
        WorkflowCommand::List => print(&call(&api, Method::GET, "/v1/workflows", None).await?),
        WorkflowCommand::Get { name } => print(&call(&api, Method::GET, &format!("/v1/workflows/{name}"), None).await?),
        WorkflowCommand::Simulate { file, input, mocks, failures, output } => {
            return Ok(crate::simulate::run(&file, &input, &mocks, &failures, output == "json"));
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// A definition from a JSON or YAML file (by its extension).
pub fn read_spec(file: &std::path::Path) -> anyhow::Result<Value> {
    let text = std::fs::read_to_string(file).with_context(|| format!("cannot read {}", file.display()))?;
    let is_yaml = matches!(file.extension().and_then(|e| e.to_str()), Some("yaml" | "yml"));
    Ok(if is_yaml {
        yaml_serde::from_str(&text).with_context(|| format!("{} is not valid YAML", file.display()))?
    } else {
        serde_json::from_str(&text).with_context(|| format!("{} is not valid JSON", file.display()))?
    })
}

pub async fn run(args: ClientArgs, cmd: RunCommand) -> anyhow::Result<ExitCode> {
    let api = api(&args)?;
    match cmd {
        RunCommand::Start { workflow, input, version, wait, timeout } => {
            let input: Value = serde_json::from_str(&input).context("--input is not valid JSON")?;
            let req = StartRun { workflow, version, input: Some(input), idempotency_key: None };
            let run = api.start_run(&req).await?;
            if !wait {
                print(&serde_json::to_value(&run)?);
                return Ok(ExitCode::SUCCESS);
            }
            let run = api.wait_for_run(run.id, timeout).await?;
            print(&serde_json::to_value(&run)?);
            match run.status {
                RunStatus::Succeeded => return Ok(ExitCode::SUCCESS),
                RunStatus::Queued | RunStatus::Running | RunStatus::Paused => {
                    bail!("run {} still {} after {}", run.id, run.status, composer_core::duration::format(timeout))
                }
                _ => return Ok(ExitCode::FAILURE),
            }
        }
        RunCommand::Get { id } => print(&call(&api, Method::GET, &format!("/v1/runs/{id}"), None).await?),
        RunCommand::List { workflow, status, limit, cursor } => {
            let mut query = vec![format!("limit={limit}")];
            for (k, v) in [("workflow", workflow), ("status", status), ("cursor", cursor)] {
                if let Some(v) = v {
                    query.push(format!("{k}={}", encode(&v)));
                }
            }
            print(&call(&api, Method::GET, &format!("/v1/runs?{}", query.join("&")), None).await?)
        }
        RunCommand::Events { id } => {
            print(&call(&api, Method::GET, &format!("/v1/runs/{id}/events?limit=1000"), None).await?)
        }
        RunCommand::Cancel { id } => print(&call(&api, Method::POST, &format!("/v1/runs/{id}/cancel"), None).await?),
        RunCommand::Retry { id } => print(&call(&api, Method::POST, &format!("/v1/runs/{id}/retry"), None).await?),
        RunCommand::Pause { id } => print(&call(&api, Method::POST, &format!("/v1/runs/{id}/pause"), None).await?),
        RunCommand::Resume { id } => print(&call(&api, Method::POST, &format!("/v1/runs/{id}/resume"), None).await?),
    }
    Ok(ExitCode::SUCCESS)
}

pub async fn event(args: ClientArgs, cmd: EventCommand) -> anyhow::Result<ExitCode> {
    let api = api(&args)?;
    match cmd {
        EventCommand::Send { name, key, payload } => {
            let payload: Value = serde_json::from_str(&payload).context("--payload is not valid JSON")?;
            let body = SendEvent { name, key, payload };
            let sent: EventSent = api.call(Method::POST, "/v1/events", Some(&body)).await?;
            print(&serde_json::to_value(sent)?);
        }
    }
    Ok(ExitCode::SUCCESS)
}

pub async fn schedule(args: ClientArgs, cmd: ScheduleCommand) -> anyhow::Result<ExitCode> {
    let api = api(&args)?;
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
                        Some(i) => Some(serde_json::from_str::<Value>(&i).context("--input is not valid JSON")?),
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
            call(&api, Method::GET, &query, None).await?
        }
        ScheduleCommand::Get { id } => call(&api, Method::GET, &path(&id, ""), None).await?,
        ScheduleCommand::Delete { id } => call(&api, Method::DELETE, &path(&id, ""), None).await?,
        ScheduleCommand::Pause { id } => call(&api, Method::POST, &path(&id, "/pause"), None).await?,
        ScheduleCommand::Resume { id } => call(&api, Method::POST, &path(&id, "/resume"), None).await?,
        ScheduleCommand::Trigger { id } => call(&api, Method::POST, &path(&id, "/trigger"), None).await?,
    };
    print(&answer);
    Ok(ExitCode::SUCCESS)
}

/// Percent-encodes a query value.
fn encode(v: &str) -> String {
    v.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}
