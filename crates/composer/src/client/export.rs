//! `composer run export`: the runs a filter matches, read from
//! `GET /v1/export/runs` a page at a time and written as an archive's files
//! (gzip JSON Lines parts, then `manifest.json`) to a directory or an S3
//! prefix, by the same writer retention archives with. As in an archive,
//! an offloaded value stays a reference in its line, and its text is
//! copied first to `payloads/` beside the parts under the same name (read
//! from `GET /v1/runs/{id}/values/{object}` and written a part at a time,
//! checked against the reference as it goes): no value past a part (8 MiB)
//! is held whole.

use std::process::ExitCode;

use composer_api::{encode, ArchivedRun, ExportPage};
use composer_archive::payloads::{Payloads, Ref, DIR};
use composer_client::Client;
use futures_util::StreamExt;
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
    let values = Payloads::new(store.clone(), usize::MAX);
    let mut writer = composer_archive::Writer::new(store, api.namespace(), selection).with_payloads(DIR);
    let mut query = String::new();
    for (name, value) in [("workflow", &filter.workflow), ("from", &filter.from), ("to", &filter.to)] {
        if let Some(v) = value {
            query.push_str(&format!("&{name}={}", encode(v)));
        }
    }
    let mut after: Option<uuid::Uuid> = None;
    loop {
        let mut path = format!("/v1/export/runs?limit={PAGE}&values=references{query}");
        if let Some(a) = after {
            path.push_str(&format!("&after={a}"));
        }
        let mut page: ExportPage = api.call(Method::GET, &path, None::<&()>).await?;
        for run in &mut page.runs {
            copy_values(api, &values, run).await?;
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

/// Copies the text of each of `run`'s offloaded values from the
/// coordinator to `to`, under the name its reference gives it.
async fn copy_values(api: &Client, to: &Payloads, run: &mut ArchivedRun) -> anyhow::Result<()> {
    let id = run.run.id;
    let mut copied = std::collections::HashSet::new();
    for value in composer_coord::payloads::archived_slots(run) {
        let Some(r) = Ref::of(value) else { continue };
        if r.run != id || r.event {
            anyhow::bail!(
                "the coordinator gave run {id} a reference to a value not its own ({}): nothing of it is exported",
                r.object
            );
        }
        if r.bytes > composer_archive::MAX_READ_BYTES {
            let most = composer_archive::MAX_READ_BYTES;
            anyhow::bail!(
                "the coordinator gave run {id} a value of {} bytes ({}), over the {most} a value may be",
                r.bytes,
                r.object
            );
        }
        // A copy an earlier export into the same place left, and that is
        // the value, is kept.
        if !copied.insert(r.object) || to.holds(&r).await.map_err(|e| anyhow::anyhow!("run {id}: {e}"))? {
            continue;
        }
        let path = format!("/v1/runs/{id}/values/{}?sha256={}&bytes={}", r.object, encode(&r.sha256), r.bytes);
        let answer = api.call_unread(Method::GET, &path, value_time(r.bytes)).await?;
        let what = format!("offloaded value {} of run {id}", r.object);
        let parts = futures_util::stream::unfold(Some(answer), move |answer| {
            let what = what.clone();
            async move {
                let mut answer = answer?;
                match answer.chunk().await {
                    Ok(Some(part)) => Some((Ok(part), Some(answer))),
                    Ok(None) => None,
                    Err(e) => {
                        let problem = format!("reading it from the coordinator: {e}");
                        Some((Err(composer_archive::Error::Format { file: what, problem }), None))
                    }
                }
            }
        });
        to.write_text(&r, parts.boxed()).await.map_err(|e| anyhow::anyhow!("run {id}: {e}"))?;
    }
    Ok(())
}

/// How long reading a value of `bytes` may take from the coordinator:
/// the client's 90 s for any call, and a second a MiB beyond it (1 GiB in
/// about 18 minutes), so a large value on a slow link is not cut off at
/// 90 s and a stalled one does not hang.
fn value_time(bytes: u64) -> std::time::Duration {
    std::time::Duration::from_secs(90 + bytes / (1 << 20))
}

/// `run archived ID`: the run as the archive keeps it.
pub async fn archived(api: &Client, id: &str) -> anyhow::Result<serde_json::Value> {
    call(api, Method::GET, &format!("/v1/archive/runs/{}", encode(id)), None).await
}
