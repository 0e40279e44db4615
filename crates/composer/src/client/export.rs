//! `composer run export`: the runs a filter matches, read from
//! `GET /v1/export/runs` a page at a time and written as an archive's files
//! (gzip JSON Lines parts, then `manifest.json`) to a directory or an S3
//! prefix, by the same writer retention archives with.

use std::process::ExitCode;

use composer_api::{encode, ExportPage};
use composer_client::Client;
use reqwest::Method;
use serde_json::json;

use crate::cli::ExportFilter;
use crate::connect::call;
use crate::output::{self, Format};

/// Runs a page: the route's most.
const PAGE: u32 = 100;

/// `run export [--workflow W] [--from T] [--to T] --out DIR|s3://…`.
pub async fn export(api: &Client, format: Format, filter: ExportFilter, out: &str) -> anyhow::Result<ExitCode> {
    let store = composer_archive::Store::open(out).map_err(|e| anyhow::anyhow!("--out: {e}"))?;
    let selection = json!({"workflow": filter.workflow, "from": filter.from, "to": filter.to});
    let mut writer = composer_archive::Writer::new(store, api.namespace(), selection);
    let mut query = String::new();
    for (name, value) in [("workflow", &filter.workflow), ("from", &filter.from), ("to", &filter.to)] {
        if let Some(v) = value {
            query.push_str(&format!("&{name}={}", encode(v)));
        }
    }
    let mut after: Option<uuid::Uuid> = None;
    loop {
        let mut path = format!("/v1/export/runs?limit={PAGE}{query}");
        if let Some(a) = after {
            path.push_str(&format!("&after={a}"));
        }
        let page: ExportPage = api.call(Method::GET, &path, None::<&()>).await?;
        for run in &page.runs {
            writer.add(run).await?;
        }
        match page.next_after {
            Some(next) => after = Some(next),
            None => break,
        }
    }
    let manifest = writer.finish(chrono::Utc::now()).await?;
    let summary = json!({"out": out, "runs": manifest.runs, "parts": manifest.parts.len()});
    match format {
        Format::Table => {
            output::emit(&format!("wrote {} run(s) in {} part(s) to {out}\n", manifest.runs, manifest.parts.len()))
        }
        _ => output::one(format, &summary),
    }
    Ok(ExitCode::SUCCESS)
}

/// `run archived ID`: the run as the archive keeps it.
pub async fn archived(api: &Client, id: &str) -> anyhow::Result<serde_json::Value> {
    call(api, Method::GET, &format!("/v1/archive/runs/{}", encode(id)), None).await
}
