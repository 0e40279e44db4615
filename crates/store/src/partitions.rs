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

/// Drops whole months that ended before `before`; returns them as `YYYY_MM`.
pub async fn drop_before(client: &Client, before: DateTime<Utc>) -> Result<Vec<String>> {
    let rows = client.query("SELECT composer_drop_partitions($1)", &[&before]).await?;
    Ok(rows.iter().map(|r| r.get(0)).collect())
}
