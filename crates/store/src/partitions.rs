//! Monthly partitions: created ahead of need, dropped past retention. Both SQL
//! functions take an advisory lock, so every coordinator may call them.

use chrono::{DateTime, Utc};
use uuid::Uuid;

use crate::{Client, Result};

/// Creates the partitions from this month to `months_ahead` ahead; returns how
/// many tables were created.
pub async fn ensure(client: &Client, months_ahead: i32) -> Result<i32> {
    let row = client.query_one("SELECT composer_ensure_partitions($1)", &[&months_ahead]).await?;
    Ok(row.get(0))
}

/// The least and the greatest of `ids` (run ids, the partition key): bounds
/// a statement adds (`run_id BETWEEN lo AND hi`) so that PostgreSQL skips the
/// months none of them is in when it starts the statement. `= ANY($1)` and a
/// join with `unnest($1)` prune nothing on their own, and every month of
/// history and every month made ahead costs an index descent per id.
pub fn span(ids: &[Uuid]) -> (Uuid, Uuid) {
    let lo = ids.iter().min().copied().unwrap_or_default();
    let hi = ids.iter().max().copied().unwrap_or_default();
    (lo, hi)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_span_holds_every_id_in_the_order_postgresql_compares_uuids() {
        let ids: Vec<Uuid> = (0..3).map(|_| Uuid::now_v7()).collect();
        let (lo, hi) = span(&[ids[2], ids[0], ids[1]]);
        assert_eq!((lo, hi), (ids[0], ids[2]), "v7 ids sort by time");
        // PostgreSQL compares uuids byte by byte, as Uuid's Ord does.
        let a = Uuid::from_bytes([0x7f; 16]);
        let b = Uuid::from_bytes([0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(span(&[b, a]), (a, b));
        assert_eq!(span(&[]), (Uuid::nil(), Uuid::nil()));
    }
}
