//! Data and measurements for `composer bench`: runs inserted as the engine
//! would leave them (to show what history costs, or to load the timer loop),
//! timer lateness, commit counts, and pgbench's baseline tables. Never used
//! by the engine itself.

use tokio_postgres::Client;
use uuid::Uuid;

use crate::Result;

/// Inserts `count` finished runs of `workflow` with three completed tasks
/// each, spread over the milliseconds before `offset` ms ago (so they land
/// in this month's partition), in one statement.
pub async fn insert_finished_runs(
    client: &Client,
    definition: Uuid,
    workflow: &str,
    offset: i64,
    count: i64,
) -> Result<()> {
    client
        .execute(
            "WITH runs AS (
                INSERT INTO workflow_runs (id, workflow_definition_id, workflow_name, workflow_version, status, input,
                                           output, created_at, updated_at, finished_at)
                SELECT (lpad(to_hex((extract(epoch FROM now()) * 1000)::bigint - 60000 - $3 - g), 12, '0')
                        || '7' || substr(md5(g::text || $3::text), 1, 19))::uuid,
                       $1, $2, 1, 'SUCCEEDED', '{}', '{}', now(), now(), now()
                  FROM generate_series(1, $4::bigint) g
                RETURNING id)
             INSERT INTO task_instances (run_id, id, node_id, node_type, queue, state, attempt, input_json, output_json,
                                         started_at, finished_at)
             SELECT runs.id, gen_random_uuid(), 's' || s, 'HTTP', 'http', 'COMPLETED', 1, '{}', '{}', now(), now()
               FROM runs, generate_series(1, 3) s",
            &[&definition, &workflow, &offset, &count],
        )
        .await?;
    Ok(())
}

/// Inserts `count` RUNNING runs of `workflow` (a single WAIT node `w`) whose
/// WAIT is pending: `due` of them come due over 20 s starting in 5 s, the
/// rest in an hour. Each task's input records when it is due.
pub async fn insert_pending_waits(
    client: &Client,
    definition: Uuid,
    workflow: &str,
    version: i32,
    count: i64,
    due: i64,
) -> Result<()> {
    client
        .execute(
            "WITH gen AS (
                SELECT g, (lpad(to_hex((extract(epoch FROM now()) * 1000)::bigint - 30000 - g), 12, '0')
                           || '7' || substr(md5('t' || g::text), 1, 19))::uuid AS id
                  FROM generate_series(1, $4::bigint) g),
             runs AS (
                INSERT INTO workflow_runs (id, workflow_definition_id, workflow_name, workflow_version, status, input)
                SELECT id, $1, $2, $3, 'RUNNING', '{}' FROM gen)
             INSERT INTO task_instances (run_id, id, node_id, node_type, state, attempt, input_json, wake_at)
             SELECT id, gen_random_uuid(), 'w', 'WAIT', 'WAITING', 1, jsonb_build_object('due', due), due
               FROM (SELECT id, CASE WHEN g <= $5 THEN now() + interval '5 seconds' + (g * interval '20 seconds') / $5
                                     ELSE now() + interval '1 hour' END AS due
                       FROM gen) d",
            &[&definition, &workflow, &version, &count, &due],
        )
        .await?;
    client.batch_execute("ANALYZE workflow_runs; ANALYZE task_instances").await?;
    Ok(())
}

/// Of `workflow`'s WAITs: how many fired, and how many are due within 25 s
/// and still waiting.
pub async fn wait_progress(client: &Client, workflow: &str) -> Result<(i64, i64)> {
    let row = client
        .query_one(
            "SELECT count(*) FILTER (WHERE t.state = 'COMPLETED') AS fired,
                    count(*) FILTER (WHERE t.state = 'WAITING' AND t.wake_at <= now() + interval '25 seconds') AS left
               FROM task_instances t JOIN workflow_runs r ON r.id = t.run_id
              WHERE r.workflow_name = $1",
            &[&workflow],
        )
        .await?;
    Ok((row.try_get("fired")?, row.try_get("left")?))
}

/// How late each fired WAIT of `workflow` completed, in ms, sorted.
pub async fn wait_lateness_ms(client: &Client, workflow: &str) -> Result<Vec<f64>> {
    let rows = client
        .query(
            "SELECT (extract(epoch FROM (t.finished_at - (t.input_json->>'due')::timestamptz)) * 1000)::float8 AS late
               FROM task_instances t JOIN workflow_runs r ON r.id = t.run_id
              WHERE r.workflow_name = $1 AND t.state = 'COMPLETED'
              ORDER BY 1",
            &[&workflow],
        )
        .await?;
    Ok(rows.iter().filter_map(|r| r.try_get::<_, f64>("late").ok()).collect())
}

/// Transactions committed in this database so far (statistics are flushed
/// by each backend at most once a second).
pub async fn commits(client: &Client) -> Result<i64> {
    let row =
        client.query_one("SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()", &[]).await?;
    Ok(row.try_get("xact_commit")?)
}

/// Row writes to this database's tables so far: inserts, updates (of which
/// HOT, changing no index), deletes.
pub async fn row_writes(client: &Client) -> Result<[i64; 4]> {
    let row = client
        .query_one(
            "SELECT coalesce(sum(n_tup_ins), 0)::int8, coalesce(sum(n_tup_upd), 0)::int8,
                    coalesce(sum(n_tup_hot_upd), 0)::int8, coalesce(sum(n_tup_del), 0)::int8
               FROM pg_stat_user_tables",
            &[],
        )
        .await?;
    Ok([row.try_get(0)?, row.try_get(1)?, row.try_get(2)?, row.try_get(3)?])
}

/// The PID of the server process serving this session.
pub async fn backend_pid(client: &Client) -> Result<i32> {
    Ok(client.query_one("SELECT pg_backend_pid()", &[]).await?.try_get(0)?)
}

/// The pgbench script of one task's minimal writes: a task row and an
/// outbox row in one commit, into the tables [`create_baseline_tables`] makes.
pub const BASELINE_SCRIPT: &str = "BEGIN;
INSERT INTO bench_baseline_task (id, run_id, state, attempt, input_json) VALUES (gen_random_uuid(), gen_random_uuid(), 'PENDING', 1, jsonb_build_object('url', 'sink'));
INSERT INTO bench_baseline_outbox (task_id, run_id, queue, shard, attempt) VALUES (gen_random_uuid(), gen_random_uuid(), 'http', 0, 1);
END;
";

pub async fn create_baseline_tables(client: &Client) -> Result<()> {
    client
        .batch_execute(
            "DROP TABLE IF EXISTS bench_baseline_task, bench_baseline_outbox;
             CREATE TABLE bench_baseline_task (id uuid PRIMARY KEY, run_id uuid NOT NULL, state text NOT NULL,
                 attempt int NOT NULL, input_json jsonb NOT NULL, created_at timestamptz NOT NULL DEFAULT now());
             CREATE TABLE bench_baseline_outbox (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
                 task_id uuid NOT NULL, run_id uuid NOT NULL, queue text NOT NULL, shard int NOT NULL,
                 attempt int NOT NULL, next_attempt_at timestamptz NOT NULL DEFAULT now());",
        )
        .await?;
    Ok(())
}

pub async fn drop_baseline_tables(client: &Client) -> Result<()> {
    client.batch_execute("DROP TABLE IF EXISTS bench_baseline_task, bench_baseline_outbox").await?;
    Ok(())
}
