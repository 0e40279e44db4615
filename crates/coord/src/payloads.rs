//! Values kept as objects (offloaded: `composer_archive::payloads`) read
//! back for whoever runs or shows them: the engine's rows before the state
//! machine sees them, a leased task's input before its worker does, and
//! the API's views of runs and steps. No reader sees a reference.

use composer_api::rest::{RunView, TaskView};
use composer_archive::payloads::{Payloads, Ref};
use composer_store::runs::{RunRow, TaskRow};
use serde_json::Value;
use uuid::Uuid;

/// Which value of a run or a task a reference was read from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Which {
    Input,
    Output,
}

/// The references a run's values were read from, by task (`None`: the
/// run's own) and value: a value written back unchanged keeps its object.
#[derive(Debug, Default)]
pub struct ReadFrom(std::collections::HashMap<(Option<Uuid>, Which), Ref>);

impl ReadFrom {
    pub fn get(&self, task: Option<Uuid>, which: Which) -> Option<&Ref> {
        self.0.get(&(task, which))
    }

    fn note(&mut self, task: Option<Uuid>, which: Which, r: Option<Ref>) {
        if let Some(r) = r {
            self.0.insert((task, which), r);
        }
    }
}

/// Object storage's error as storage's: one it answered for (the object is
/// gone or not what the reference says) cannot get better by retrying;
/// storage unreachable or not set (`COMPOSER_OFFLOAD_URL` missing on this
/// coordinator) can, once it is.
pub fn store_error(e: composer_archive::Error) -> composer_store::Error {
    match e {
        composer_archive::Error::Format { .. } => composer_store::Error::Corrupt(format!("an offloaded value: {e}")),
        _ if e.is_missing() => composer_store::Error::Corrupt(format!("an offloaded value: {e}")),
        _ => composer_store::Error::Objects(e.to_string()),
    }
}

/// `value` read back, if it is a reference; the reference.
pub async fn resolve(p: &Payloads, value: &mut Value) -> Result<Option<Ref>, composer_store::Error> {
    if Ref::of(value).is_none() {
        return Ok(None);
    }
    p.resolve(value).await.map_err(store_error)
}

async fn resolve_opt(p: &Payloads, value: &mut Option<Value>) -> Result<Option<Ref>, composer_store::Error> {
    match value {
        Some(v) => resolve(p, v).await,
        None => Ok(None),
    }
}

/// A run's row with its input and output read back.
pub async fn resolve_run(p: &Payloads, run: &mut RunRow, read: &mut ReadFrom) -> Result<(), composer_store::Error> {
    read.note(None, Which::Input, resolve(p, &mut run.input).await?);
    read.note(None, Which::Output, resolve_opt(p, &mut run.output).await?);
    Ok(())
}

/// A task's row with its input and output read back.
pub async fn resolve_task(p: &Payloads, t: &mut TaskRow, read: &mut ReadFrom) -> Result<(), composer_store::Error> {
    read.note(Some(t.id), Which::Input, resolve(p, &mut t.input).await?);
    read.note(Some(t.id), Which::Output, resolve_opt(p, &mut t.output).await?);
    Ok(())
}

/// The most of an offloaded value a page of the UI reads back to show (it
/// shows the first part of any value; past this it says where to read it).
pub const MAX_SHOWN_OFFLOADED: u64 = 8 << 20;

/// A run's row and its tasks' for a page: each offloaded value read back,
/// or, past [`MAX_SHOWN_OFFLOADED`], a note of its size and where it is.
pub async fn for_page(p: &Payloads, run: &mut RunRow, tasks: &mut [TaskRow]) -> Result<(), composer_store::Error> {
    let run_id = run.id;
    shown(p, run_id, &mut run.input).await?;
    if let Some(output) = &mut run.output {
        shown(p, run_id, output).await?;
    }
    tasks_for_page(p, run_id, tasks).await
}

/// [`for_page`] for tasks of run `run_id` alone.
pub async fn tasks_for_page(p: &Payloads, run_id: Uuid, tasks: &mut [TaskRow]) -> Result<(), composer_store::Error> {
    for t in tasks {
        shown(p, run_id, &mut t.input).await?;
        if let Some(output) = &mut t.output {
            shown(p, run_id, output).await?;
        }
    }
    Ok(())
}

async fn shown(p: &Payloads, run_id: Uuid, value: &mut Value) -> Result<(), composer_store::Error> {
    match Ref::of(value) {
        Some(r) if r.bytes > MAX_SHOWN_OFFLOADED => {
            *value = Value::String(format!(
                "a value of {} bytes kept as an object: read it from the API (GET /v1/runs/{run_id})",
                r.bytes
            ));
            Ok(())
        }
        Some(_) => resolve(p, value).await.map(drop),
        None => Ok(()),
    }
}

/// Tasks' rows read back, when their references are not kept.
pub async fn resolve_tasks(p: &Payloads, tasks: &mut [TaskRow]) -> Result<(), composer_store::Error> {
    let mut read = ReadFrom::default();
    for t in tasks {
        resolve_task(p, t, &mut read).await?;
    }
    Ok(())
}

/// A run as the API shows it, with its values (and its tasks') read back.
pub async fn resolve_view(p: &Payloads, view: &mut RunView) -> Result<(), composer_store::Error> {
    if let Some(input) = &mut view.input {
        resolve(p, input).await?;
    }
    resolve_opt(p, &mut view.output).await?;
    if let Some(tasks) = &mut view.tasks {
        resolve_task_views(p, tasks).await?;
    }
    Ok(())
}

/// Steps as the API shows them, with their values read back.
pub async fn resolve_task_views(p: &Payloads, tasks: &mut [TaskView]) -> Result<(), composer_store::Error> {
    for t in tasks {
        resolve(p, &mut t.input).await?;
        resolve_opt(p, &mut t.output).await?;
    }
    Ok(())
}
