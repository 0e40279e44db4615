//! Versioned migrations, applied in one transaction under an advisory lock so
//! that coordinators starting together apply each exactly once.

use crate::{Client, Result};

const MIGRATIONS: &[(i32, &str, &str)] = &[
    (1, "init", include_str!("../migrations/0001_init.sql")),
    (2, "events", include_str!("../migrations/0002_events.sql")),
    (3, "outbox_queue_and_checks", include_str!("../migrations/0003_outbox_queue_and_checks.sql")),
    (4, "retention_keeps_open_runs", include_str!("../migrations/0004_retention_keeps_open_runs.sql")),
    (5, "recoveries", include_str!("../migrations/0005_recoveries.sql")),
    (6, "paused_runs", include_str!("../migrations/0006_paused_runs.sql")),
    (7, "attempt_deadlines", include_str!("../migrations/0007_attempt_deadlines.sql")),
    (8, "run_deadlines", include_str!("../migrations/0008_run_deadlines.sql")),
    (9, "map_items", include_str!("../migrations/0009_map_items.sql")),
    (10, "sub_workflows", include_str!("../migrations/0010_sub_workflows.sql")),
    (11, "concurrency_limits", include_str!("../migrations/0011_concurrency_limits.sql")),
    (12, "schedules", include_str!("../migrations/0012_schedules.sql")),
    (13, "ui_sessions", include_str!("../migrations/0013_ui_sessions.sql")),
    (14, "run_trees", include_str!("../migrations/0014_run_trees.sql")),
    (15, "failure_handling", include_str!("../migrations/0015_failure_handling.sql")),
    (16, "map_sources", include_str!("../migrations/0016_map_sources.sql")),
    (17, "tags_and_bulk", include_str!("../migrations/0017_tags_and_bulk.sql")),
    (18, "task_logs", include_str!("../migrations/0018_task_logs.sql")),
    (19, "schedule_backfill", include_str!("../migrations/0019_schedule_backfill.sql")),
    (20, "triggers_and_webhooks", include_str!("../migrations/0020_triggers_and_webhooks.sql")),
    (21, "step_limits", include_str!("../migrations/0021_step_limits.sql")),
    (22, "traces", include_str!("../migrations/0022_traces.sql")),
    (23, "priorities_and_fairness", include_str!("../migrations/0023_priorities_and_fairness.sql")),
    (24, "runs_read_in_part", include_str!("../migrations/0024_runs_read_in_part.sql")),
    (25, "quarantine", include_str!("../migrations/0025_quarantine.sql")),
    (26, "schedule_fire_errors", include_str!("../migrations/0026_schedule_fire_errors.sql")),
    (27, "events_name_their_log_entry", include_str!("../migrations/0027_events_name_their_log_entry.sql")),
    (28, "api_keys_and_audit", include_str!("../migrations/0028_api_keys_and_audit.sql")),
    (29, "sso_sessions", include_str!("../migrations/0029_sso_sessions.sql")),
    (30, "namespaces", include_str!("../migrations/0030_namespaces.sql")),
    (31, "namespace_quotas", include_str!("../migrations/0031_namespace_quotas.sql")),
    (32, "archive_drops_one_month", include_str!("../migrations/0032_archive_drops_one_month.sql")),
    (33, "bulk_migrate", include_str!("../migrations/0033_bulk_migrate.sql")),
    (34, "offloaded_event_payloads", include_str!("../migrations/0034_offloaded_event_payloads.sql")),
    (35, "step_log_chunks", include_str!("../migrations/0035_step_log_chunks.sql")),
    (36, "payload_usage", include_str!("../migrations/0036_payload_usage.sql")),
    (37, "deadlines", include_str!("../migrations/0037_deadlines.sql")),
    (38, "event_replays", include_str!("../migrations/0038_event_replays.sql")),
    (39, "run_updates", include_str!("../migrations/0039_run_updates.sql")),
    (40, "approvals", include_str!("../migrations/0040_approvals.sql")),
    (41, "trigger_flows", include_str!("../migrations/0041_trigger_flows.sql")),
];

/// Applies the migrations this build knows and the database lacks; returns
/// how many it applied.
pub async fn migrate(client: &mut Client) -> Result<usize> {
    let tx = crate::begin(client).await?;
    tx.batch_execute(
        "SELECT pg_advisory_xact_lock(hashtext('composer_migrations'));
         CREATE TABLE IF NOT EXISTS composer_schema_migrations (
             version integer PRIMARY KEY,
             name text NOT NULL,
             applied_at timestamptz NOT NULL DEFAULT now())",
    )
    .await?;
    let applied: Vec<i32> =
        tx.query("SELECT version FROM composer_schema_migrations", &[]).await?.iter().map(|r| r.get(0)).collect();
    let mut count = 0;
    for (version, name, sql) in MIGRATIONS {
        if applied.contains(version) {
            continue;
        }
        tx.batch_execute(sql).await?;
        tx.execute("INSERT INTO composer_schema_migrations (version, name) VALUES ($1, $2)", &[version, name]).await?;
        count += 1;
    }
    tx.commit().await?;
    Ok(count)
}
