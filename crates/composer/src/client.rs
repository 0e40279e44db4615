//! Client commands: thin wrappers over the REST API that print JSON.

use std::process::ExitCode;
use std::time::Duration;

use anyhow::{bail, Context};
use serde_json::{json, Value};

use composer_core::config::non_empty;

use crate::cli::{ClientArgs, EventCommand, RunCommand, WorkflowCommand};

/// A coordinator's REST API, for the client commands and the bench.
pub struct Api {
    http: reqwest::Client,
    pub base: String,
    token: Option<String>,
}

impl Api {
    fn new(args: &ClientArgs) -> Api {
        let http = reqwest::Client::builder().timeout(Duration::from_secs(90)).build().expect("HTTP client");
        Api::with(http, &args.url, non_empty(&args.api_token))
    }

    pub fn with(http: reqwest::Client, base: &str, token: Option<String>) -> Api {
        Api { http, base: base.trim_end_matches('/').to_string(), token }
    }

    /// Starts a run of the latest version of `workflow`; returns its id.
    pub async fn start(&self, workflow: &str) -> anyhow::Result<String> {
        let run = self.call(reqwest::Method::POST, "/v1/runs", Some(&json!({"workflow": workflow}))).await?;
        Ok(run["id"].as_str().context("the coordinator returned no run id")?.to_string())
    }

    /// Long-polls until the run ends, or `timeout` passes (then the run is
    /// returned still RUNNING).
    pub async fn wait(&self, id: &str, timeout: Duration) -> anyhow::Result<Value> {
        let give_up = tokio::time::Instant::now() + timeout;
        loop {
            let run = self.call(reqwest::Method::GET, &format!("/v1/runs/{id}?wait=30s"), None).await?;
            if run["status"] != "RUNNING" || tokio::time::Instant::now() >= give_up {
                return Ok(run);
            }
        }
    }

    pub async fn call(&self, method: reqwest::Method, path: &str, body: Option<&Value>) -> anyhow::Result<Value> {
        let mut req = self.http.request(method, format!("{}{path}", self.base));
        if let Some(t) = &self.token {
            req = req.bearer_auth(t);
        }
        if let Some(b) = body {
            req = req.json(b);
        }
        let resp = req
            .send()
            .await
            .with_context(|| format!("cannot reach the coordinator at {} (COMPOSER_URL)", self.base))?;
        let status = resp.status();
        let text = resp.text().await?;
        let value: Value = serde_json::from_str(&text).unwrap_or(Value::String(text));
        if !status.is_success() {
            let msg = value["error"]["message"].as_str().map(str::to_string).unwrap_or_else(|| value.to_string());
            bail!("{status}: {msg}");
        }
        Ok(value)
    }
}

fn print(v: &Value) {
    println!("{}", serde_json::to_string_pretty(v).unwrap_or_default());
}

pub async fn workflow(args: ClientArgs, cmd: WorkflowCommand) -> anyhow::Result<ExitCode> {
    let api = Api::new(&args);
    match cmd {
        WorkflowCommand::Apply { file } => {
            let text = std::fs::read_to_string(&file).with_context(|| format!("cannot read {}", file.display()))?;
            let is_yaml = matches!(file.extension().and_then(|e| e.to_str()), Some("yaml" | "yml"));
            let spec: Value = if is_yaml {
                serde_yaml::from_str(&text).with_context(|| format!("{} is not valid YAML", file.display()))?
            } else {
                serde_json::from_str(&text).with_context(|| format!("{} is not valid JSON", file.display()))?
            };
            print(&api.call(reqwest::Method::POST, "/v1/workflows", Some(&spec)).await?);
        }
        WorkflowCommand::List => print(&api.call(reqwest::Method::GET, "/v1/workflows", None).await?),
        WorkflowCommand::Get { name } => {
            print(&api.call(reqwest::Method::GET, &format!("/v1/workflows/{name}"), None).await?)
        }
    }
    Ok(ExitCode::SUCCESS)
}

pub async fn run(args: ClientArgs, cmd: RunCommand) -> anyhow::Result<ExitCode> {
    let api = Api::new(&args);
    match cmd {
        RunCommand::Start { workflow, input, version, wait, timeout } => {
            let input: Value = serde_json::from_str(&input).context("--input is not valid JSON")?;
            let mut body = json!({"workflow": workflow, "input": input});
            if let Some(v) = version {
                body["version"] = json!(v);
            }
            let run = api.call(reqwest::Method::POST, "/v1/runs", Some(&body)).await?;
            if !wait {
                print(&run);
                return Ok(ExitCode::SUCCESS);
            }
            let id = run["id"].as_str().context("the coordinator returned no run id")?.to_string();
            let run = api.wait(&id, timeout).await?;
            print(&run);
            match run["status"].as_str() {
                Some("SUCCEEDED") => return Ok(ExitCode::SUCCESS),
                Some("RUNNING") => bail!("run {id} still RUNNING after {}", composer_core::duration::format(timeout)),
                _ => return Ok(ExitCode::FAILURE),
            }
        }
        RunCommand::Get { id } => print(&api.call(reqwest::Method::GET, &format!("/v1/runs/{id}"), None).await?),
        RunCommand::List { workflow, status, limit, cursor } => {
            let mut query = vec![format!("limit={limit}")];
            for (k, v) in [("workflow", workflow), ("status", status), ("cursor", cursor)] {
                if let Some(v) = v {
                    query.push(format!("{k}={}", encode(&v)));
                }
            }
            print(&api.call(reqwest::Method::GET, &format!("/v1/runs?{}", query.join("&")), None).await?)
        }
        RunCommand::Events { id } => {
            print(&api.call(reqwest::Method::GET, &format!("/v1/runs/{id}/events?limit=1000"), None).await?)
        }
        RunCommand::Cancel { id } => {
            print(&api.call(reqwest::Method::POST, &format!("/v1/runs/{id}/cancel"), None).await?)
        }
        RunCommand::Retry { id } => {
            print(&api.call(reqwest::Method::POST, &format!("/v1/runs/{id}/retry"), None).await?)
        }
    }
    Ok(ExitCode::SUCCESS)
}

pub async fn event(args: ClientArgs, cmd: EventCommand) -> anyhow::Result<ExitCode> {
    let api = Api::new(&args);
    match cmd {
        EventCommand::Send { name, key, payload } => {
            let payload: Value = serde_json::from_str(&payload).context("--payload is not valid JSON")?;
            let body = json!({"name": name, "key": key, "payload": payload});
            print(&api.call(reqwest::Method::POST, "/v1/events", Some(&body)).await?);
        }
    }
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
