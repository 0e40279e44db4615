//! The outbox `INSERT … SELECT` shared by every statement that dispatches
//! tasks (the engine's write and the recovery sweeps). Callers supply a FROM
//! clause with task rows `t` (id, run_id, node_id, node_type, queue, attempt,
//! input_json) and their run `r` (workflow_definition_id, workflow_version).
//!
//! The stream is `<prefix>tasks:<queue>.<shard>` with
//! `shard = ((hashtextextended(id) % n) + n) % n`: `hashtextextended` can be
//! negative, and the double modulo keeps the shard in `0..n`.

/// Where the stream prefix and shard count come from in the statement.
pub struct DispatchParams {
    /// Placeholder of the shard count (`int8`), e.g. `$1`.
    pub shards: &'static str,
    /// Placeholder of the Redis key prefix (`text`), e.g. `$2`.
    pub prefix: &'static str,
}

pub fn dispatch_insert(p: &DispatchParams) -> String {
    let DispatchParams { shards: n, prefix } = p;
    format!(
        "INSERT INTO outbox (task_id, stream, payload, type, status, next_attempt_at)
         SELECT t.id,
                {prefix}::text || 'tasks:' || COALESCE(t.queue, lower(t.node_type)) || '.'
                    || (((hashtextextended(t.id::text, 0) % {n}::int8) + {n}::int8) % {n}::int8)::text,
                jsonb_build_object(
                    'task_id', t.id, 'run_id', t.run_id,
                    'workflow_id', r.workflow_definition_id, 'workflow_version', r.workflow_version,
                    'node_id', t.node_id, 'node_type', t.node_type,
                    'attempt', t.attempt, 'input', t.input_json),
                'TASK_EXECUTION', 'PENDING', now()"
    )
}
