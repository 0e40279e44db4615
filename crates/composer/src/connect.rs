//! Where the client commands find the coordinator (`ClientArgs`: its URL,
//! the token or key, the output format) and the one way they call it.

use std::time::Duration;

use anyhow::Context;
use clap::Args;
use composer_client::Client;
use composer_config::non_empty;
use serde_json::Value;

type Method = reqwest::Method;

/// Where the client commands find the coordinator.
#[derive(Args, Clone)]
pub struct ClientArgs {
    /// The coordinator's URL (http:// or https://).
    #[arg(long = "url", global = true, env = "COMPOSER_URL", default_value = "http://127.0.0.1:8080",
          value_parser = coordinator_url)]
    pub url: String,
    /// Bearer token for the coordinator's `/v1` API.
    #[arg(long, global = true, env = "COMPOSER_API_TOKEN", hide_env_values = true)]
    pub api_token: Option<String>,
    /// The namespace every call is in (`default` when left out).
    #[arg(long = "namespace", global = true, env = "COMPOSER_NAMESPACE")]
    pub namespace: Option<String>,
    /// table, json or jsonl (one object per line). Default: a table on a terminal, JSON otherwise.
    #[arg(short = 'o', long = "output", global = true, value_parser = ["table", "json", "jsonl"])]
    pub output: Option<String>,
}

/// `--url`: refused, as a bad flag is (exit status 2, naming the flag and
/// the variable it came from), unless it is an http:// or https:// URL.
fn coordinator_url(url: &str) -> Result<String, String> {
    composer_client::check_url(url).map(|()| url.to_string())
}

/// A client of the coordinator `args` names, with its token or key.
pub(crate) fn api(args: &ClientArgs) -> anyhow::Result<Client> {
    let http =
        reqwest::Client::builder().timeout(Duration::from_secs(90)).build().context("building the HTTP client")?;
    Ok(Client::new(http, &args.url, non_empty(&args.api_token))
        .url_from("COMPOSER_URL or --url")
        .in_namespace(non_empty(&args.namespace)))
}

/// Calls the API and returns its answer as JSON, for printing.
pub(crate) async fn call(api: &Client, method: Method, path: &str, body: Option<&Value>) -> anyhow::Result<Value> {
    Ok(api.call(method, path, body).await?)
}
