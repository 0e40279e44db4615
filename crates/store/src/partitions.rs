//! Monthly partitions: created ahead of need, dropped past retention. Both SQL
//! functions take an advisory lock, so every coordinator may call them.

use chrono::{DateTime, Utc};

use crate::{Client, Result};

/// Creates the partitions from this month to `months_ahead` ahead; returns how
/// many tables were created.
pub async fn ensure(client: &Client, months_ahead: i32) -> Result<i32> {
    let row = client.query_one("SELECT composer_ensure_partitions($1)", &[&months_ahead]).await?;
    Ok(row.get(0))
}

/// What retention did with the months that ended before its cut-off.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Expired {
    /// Months dropped, as `YYYY_MM`.
    pub dropped: Vec<String>,
    /// Months kept because they still hold a RUNNING run.
    pub kept_open: Vec<String>,
}

/// Drops whole months that ended before `before`, except a month that still
/// holds an open run: it is kept until that run ends.
pub async fn drop_before(client: &Client, before: DateTime<Utc>) -> Result<Expired> {
    let rows = client.query("SELECT month, dropped FROM composer_drop_partitions($1)", &[&before]).await?;
    let mut out = Expired::default();
    for r in rows {
        let month: String = r.try_get("month")?;
        if r.try_get("dropped")? {
            out.dropped.push(month);
        } else {
            out.kept_open.push(month);
        }
    }
    // The budgets of trees whose root went with its month.
    client
        .execute(
            "DELETE FROM run_trees t WHERE t.created_at < $1
                AND NOT EXISTS (SELECT 1 FROM workflow_runs r WHERE r.id = t.root_run_id)",
            &[&before],
        )
        .await?;
    // The step logs of runs that went with their month.
    crate::logs::delete_orphaned(client, before).await?;
    Ok(out)
}
