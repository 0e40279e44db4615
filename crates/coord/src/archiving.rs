//! Retention with an archive: each month that ended before the cut-off
//! and holds no open run is written to the archive (every run's record, in
//! id order, then the manifest), and only then dropped — and only if
//! nothing of it (a run, a step, a history or log line) changed since the
//! archive began to read it (`composer_drop_month` checks under a lock). A
//! failed write keeps the month's rows: the next pass tries again.

use chrono::{DateTime, Datelike, TimeZone, Utc};
use composer_api::rest::Manifest;
use composer_archive::payloads::{Payloads, Ref};
use composer_archive::Writer;
use composer_store::runs::RunFilter;
use composer_store::{partitions, Client};

use crate::archive::{Archive, ArchiveError};
use crate::http::archive::{id_at, record_as_kept};

/// Run ids read at once.
const PAGE: i64 = 1000;

/// How long before an archive's read began a run of its month must not have
/// changed for the month to be dropped: a change committed while the read
/// ran (a retry of an ended run) may carry an earlier time.
const SETTLED: chrono::Duration = chrono::Duration::minutes(1);

/// The first moment of month `YYYY_MM` and of the month after it.
fn month_bounds(month: &str) -> Option<(DateTime<Utc>, DateTime<Utc>)> {
    let (y, m) = month.split_once('_')?;
    let (y, m): (i32, u32) = (y.parse().ok()?, m.parse().ok()?);
    let start = Utc.with_ymd_and_hms(y, m, 1, 0, 0, 0).single()?;
    let next = if start.month() == 12 { (y + 1, 1) } else { (y, m + 1) };
    Some((start, Utc.with_ymd_and_hms(next.0, next.1, 1, 0, 0, 0).single()?))
}

/// Writes every run of `month` to `archive`: their records in id order,
/// then the manifest.
async fn write_month(
    client: &mut Client,
    payloads: &Payloads,
    archive: &Archive,
    month: &str,
) -> Result<Manifest, ArchiveError> {
    let (start, end) = month_bounds(month)
        .ok_or_else(|| composer_archive::Error::Location(format!("month {month:?}: expected YYYY_MM")))?;
    let (since, until) = (id_at(start), id_at(end));
    let filter = RunFilter { since: Some(since), until: Some(until), ..RunFilter::default() };
    let selection = serde_json::json!({"month": month});
    let Some((namespace, dir)) = archive.month(month) else { return Err(no_archive()) };
    let copies = Archive::payloads_in(&dir);
    let mut writer = Writer::new(dir, namespace, selection).with_payloads(composer_archive::payloads::DIR);
    let mut after = None;
    loop {
        let page = composer_store::runs::matching_ids(client, &filter, after, PAGE).await?;
        for id in &page {
            if let Some(mut run) = record_as_kept(client, payloads, *id).await? {
                // Its offloaded values stay references in its line, each
                // object copied beside it first: a run of any size fits a
                // line, and its copies are there before the manifest.
                for value in crate::payloads::archived_slots(&mut run) {
                    if let Some(r) = Ref::of(value) {
                        payloads.copy_to(&r, &copies).await?;
                    }
                }
                writer.add(&run).await?;
            }
        }
        after = page.last().copied();
        if (page.len() as i64) < PAGE {
            break;
        }
    }
    Ok(writer.finish(crate::clock::now()).await?)
}

/// With an archive set: writes each month that ended before `before` and
/// holds no open run to the archive, then drops it (a month a run of which
/// changed meanwhile is kept for the next pass). Returns the months
/// dropped. A month that cannot be written is kept, logged and counted
/// (`composer_archive_failures_total`), and the next one is tried. Only one
/// coordinator archives a namespace at a time: `lock` holds the lock, in a
/// transaction of its own, which ends (and lets the lock go) however this
/// pass does.
pub async fn archive_expired(
    client: &mut Client,
    lock: &mut Client,
    archive: &Archive,
    payloads: &Payloads,
    before: DateTime<Utc>,
) -> Result<Vec<String>, ArchiveError> {
    if !archive.is_set() {
        return Ok(Vec::new());
    }
    let held = composer_store::begin(lock).await?;
    if !partitions::try_lock_archiving(&held).await? {
        tracing::debug!("another coordinator archives this namespace now");
        return Ok(Vec::new());
    }
    let mut dropped = Vec::new();
    for month in partitions::expired_months(client, before).await? {
        if partitions::month_has_open_runs(client, &month).await? {
            continue;
        }
        let began = crate::clock::now();
        let manifest = match write_month(client, payloads, archive, &month).await {
            Ok(m) => m,
            Err(e) => {
                crate::metrics::inc(composer_metrics::ARCHIVE_FAILURES, &[], 1);
                tracing::error!(month, error = %e, "archiving an expired month failed: it is kept for the next pass");
                continue;
            }
        };
        tracing::info!(month, runs = manifest.runs, parts = manifest.parts.len(), "archived an expired month");
        if partitions::drop_month(client, &month, began - SETTLED).await? {
            dropped.push(month);
        }
    }
    held.commit().await?;
    Ok(dropped)
}

fn no_archive() -> ArchiveError {
    composer_archive::Error::Location("is not set (COMPOSER_ARCHIVE_URL)".into()).into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_month_is_bounded_by_its_first_moment_and_the_next_month_s() {
        let (s, e) = month_bounds("2026_12").unwrap();
        assert_eq!(s.to_rfc3339(), "2026-12-01T00:00:00+00:00");
        assert_eq!(e.to_rfc3339(), "2027-01-01T00:00:00+00:00");
        assert_eq!(month_bounds("2026_13"), None);
        assert_eq!(month_bounds("2026-01"), None);
        // A run is of the month its id's time is in.
        let three_days_in = (s + chrono::Duration::days(3)).timestamp() as u64;
        let id = uuid::Uuid::new_v7(uuid::Timestamp::from_unix(uuid::NoContext, three_days_in, 0));
        assert_eq!(composer_archive::month_of(id).as_deref(), Some("2026_12"));
        assert!(id_at(s) <= id && id < id_at(e));
    }
}
