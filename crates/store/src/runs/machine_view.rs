//! Rows in the state machine's form: a locked run and its tasks become a
//! [`machine::Run`], moved out of the rows rather than copied.

use composer_core::definition::Workflow;
use composer_core::machine;

use super::rows::{RunRow, TaskRow};
use crate::{Error, Result};

/// The state machine's view of a run. The run's data (input, output,
/// error) and the tasks' are moved out of the rows, not copied: the row is
/// left with its metadata only.
pub fn into_machine(wf: &Workflow, run: &mut RunRow, tasks: Vec<TaskRow>) -> Result<machine::Run> {
    let tasks = tasks.into_iter().map(|t| to_machine_task(wf, t)).collect::<Result<Vec<_>>>()?;
    Ok(machine::Run {
        id: run.id,
        status: run.status,
        input: std::mem::take(&mut run.input),
        output: run.output.take(),
        error: run.error.take(),
        tasks,
        max_read: composer_core::machine::SCOPE_MAX_BYTES,
        max_payload: composer_core::storable::DEFAULT_MAX_PAYLOAD,
        // The engine gives what the tree's budget has left.
        items_left: u64::MAX,
        deadline: run.deadline,
        parent: run.parent.map(|p| machine::ParentRef {
            run_id: p.run_id,
            task_id: p.task_id,
            attempt: p.attempt,
            iteration: u32::try_from(p.iteration).unwrap_or(0),
        }),
        concurrency_key: run.concurrency_key.clone(),
        known: None,
        // Its items are in storage, which gathers a MAP's output.
        collects_in_storage: true,
        // The engine says when it gathered a MAP's output.
        holds_gathered_output: false,
        // The engine says when it left values unread.
        unread: false,
    })
}

/// A task row in the state machine's form. An item (`ship_each[3]`) runs
/// its MAP's template node.
pub fn to_machine_task(wf: &Workflow, t: TaskRow) -> Result<machine::Task> {
    let unknown =
        || Error::Corrupt(format!("task {} names node {:?}, unknown to its workflow version", t.id, t.node_id));
    let (node, item) = match (t.parent_task_id, t.item_index) {
        (Some(map), Some(index)) => {
            let map_id = t.node_id.rsplit_once('[').map(|(id, _)| id).ok_or_else(unknown)?;
            let item = machine::Item { map, index: u32::try_from(index).map_err(|_| unknown())? };
            (wf.map_template(map_id).ok_or_else(unknown)?, Some(item))
        }
        _ => (wf.node_index(&t.node_id).ok_or_else(unknown)?, None),
    };
    let progress = match &t.progress {
        Some(p) => Some(
            <machine::MapProgress as serde::Deserialize>::deserialize(p)
                .map_err(|e| Error::Corrupt(format!("task {} has unreadable MAP progress: {e}", t.id)))?,
        ),
        None => None,
    };
    // An unreadable one (of a newer version, say) leaves the code unknown.
    let error_info = t.error_info.and_then(|v| serde_json::from_value(v).ok());
    Ok(machine::Task {
        id: t.id,
        node,
        state: t.state,
        attempt: t.attempt,
        input: t.input,
        output: t.output,
        error: t.error,
        wake_at: t.wake_at,
        finished_at: t.finished_at,
        event: t.event_name.zip(t.event_key),
        item,
        progress,
        error_info,
        iteration: t.iteration.and_then(|i| u32::try_from(i).ok()),
        removed: false,
        limit_keys: match t.limit_keys {
            None => Vec::new(),
            Some(keys) => serde_json::from_value(keys)
                .map_err(|e| Error::Corrupt(format!("task {} has unreadable limit keys: {e}", t.id)))?,
        },
    })
}
