//! Values kept as objects (offloaded: `composer_archive::payloads`) read
//! back for whoever runs or shows them: the engine's rows before the state
//! machine sees them, a leased task's input before its worker does, and
//! the API's views of runs and steps. No reader sees a reference.

use axum::body::Bytes;
use axum::http::header::CONTENT_TYPE;
use axum::response::{IntoResponse, Response};
use composer_api::rest::{ArchivedRun, ExportPage, ItemPage, RunView, TaskView};
use composer_archive::payloads::{Payloads, Ref};
use composer_store::runs::{RunRow, TaskRow};
use ring::rand::{SecureRandom, SystemRandom};
use serde_json::Value;
use uuid::Uuid;

/// What an answer says it is about, for the audit log, when its body is
/// streamed (a run's answer writes its large values in from their objects,
/// never held whole): the audit layer records this instead of reading the
/// body, which it passes on untouched.
#[derive(Clone, Debug)]
pub(crate) struct AnswerNames(pub Value);

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

/// An archived run's input and output for its page, as [`for_page`] does
/// for a run, read from the archive's copies (`p`).
pub async fn archived_for_page(p: &Payloads, run: &mut RunView) -> Result<(), composer_store::Error> {
    let read_at = format!("/v1/archive/runs/{}", run.id);
    for value in run.input.iter_mut().chain(run.output.iter_mut()) {
        shown_at(p, &read_at, value).await?;
    }
    Ok(())
}

async fn shown(p: &Payloads, run_id: Uuid, value: &mut Value) -> Result<(), composer_store::Error> {
    shown_at(p, &format!("/v1/runs/{run_id}"), value).await
}

/// `value` read back for a page, or past [`MAX_SHOWN_OFFLOADED`] a note
/// that it is read at `read_at`.
async fn shown_at(p: &Payloads, read_at: &str, value: &mut Value) -> Result<(), composer_store::Error> {
    match Ref::of(value) {
        Some(r) if r.bytes > MAX_SHOWN_OFFLOADED => {
            *value = Value::String(format!(
                "a value of {} bytes kept as an object: read it from the API (GET {read_at})",
                r.bytes
            ));
            Ok(())
        }
        Some(_) => resolve(p, value).await.map(drop),
        None => Ok(()),
    }
}

/// Offloaded values past this many bytes are written into an API answer
/// from their objects a part at a time ([`answer`]); smaller ones are read
/// whole first, so that an object missing or changed gives an error
/// answer rather than an answer cut short.
pub const STREAMED_PAST: u64 = 8 << 20;

/// A run as the API shows it (`view`, its values and its tasks' as their
/// rows hold them), answered as JSON with each offloaded value written in
/// from its object ([`answer_with`]).
pub async fn answer(p: &Payloads, mut view: RunView) -> Result<Response, composer_store::Error> {
    let names = serde_json::json!({
        "id": view.id, "status": view.status, "workflow": view.workflow, "version": view.version,
        "priority": view.priority,
    });
    let mut tasks = view.tasks.take().unwrap_or_default();
    let mut slots: Vec<&mut Value> = view.input.iter_mut().chain(view.output.iter_mut()).collect();
    slots.extend(task_slots(&mut tasks));
    let marked = mark(slots)?;
    view.tasks = Some(tasks);
    let mut answer = answer_with(p, &view, marked, Reading::Checked).await?;
    // A control's answer (cancel, retry, …) is audited by these, not read whole.
    answer.extensions_mut().insert(AnswerNames(names));
    Ok(answer)
}

/// A page of a MAP's items answered as [`answer`] answers a run.
pub async fn answer_items(p: &Payloads, mut page: ItemPage) -> Result<Response, composer_store::Error> {
    let marked = mark(task_slots(&mut page.items).collect())?;
    answer_with(p, &page, marked, Reading::Checked).await
}

/// An archived run answered as [`answer`] answers a run, its offloaded
/// values written in from the archive's copies of their objects (`p`).
pub async fn answer_archived(p: &Payloads, mut run: ArchivedRun) -> Result<Response, composer_store::Error> {
    let marked = mark(archived_slots(&mut run))?;
    answer_with(p, &run, marked, Reading::Checked).await
}

/// A page of an export answered as [`answer`] answers a run, but each
/// value read only when the answer reaches it ([`Reading::AsReached`]):
/// a page may hold many runs' values, none of which it holds whole.
pub async fn answer_export(p: &Payloads, mut page: ExportPage) -> Result<Response, composer_store::Error> {
    let marked = mark(page.runs.iter_mut().flat_map(archived_slots).collect())?;
    answer_with(p, &page, marked, Reading::AsReached).await
}

/// The JSON text of the offloaded value `r` names, as an answer: read
/// whole and checked up to [`STREAMED_PAST`]; past it, checked for its
/// size before the answer begins and for its SHA-256 as it goes, as a
/// chunked answer that is cut short (no last chunk) when the text turns
/// out not to be the reference's. `None` where the run has no such value:
/// no object, or not of the reference's size (or, read whole, SHA-256).
pub async fn answer_value(p: &Payloads, r: Ref) -> Result<Option<Response>, composer_store::Error> {
    use futures_util::StreamExt;
    let not_this = |e: &composer_archive::Error| e.is_missing() || matches!(e, composer_archive::Error::Format { .. });
    let body = match r.bytes <= STREAMED_PAST {
        true => match p.read_text(&r).await {
            Ok(text) => axum::body::Body::from(text),
            Err(e) if not_this(&e) => return Ok(None),
            Err(e) => return Err(store_error(e)),
        },
        false => match p.stream_text(&r).await {
            Ok(parts) => axum::body::Body::from_stream(parts.inspect(|part| {
                if let Err(e) = part {
                    tracing::warn!(error = %e, "an offloaded value's answer is cut short (its object changed, the reference was not its own, or storage failed)");
                }
            })),
            Err(e) if not_this(&e) => return Ok(None),
            Err(e) => return Err(store_error(e)),
        },
    };
    Ok(Some(([(CONTENT_TYPE, "application/json")], body).into_response()))
}

/// Every value an archived run holds: the run's input and output, its
/// steps' and its MAP items'. The history and the log lines hold none.
pub fn archived_slots(run: &mut ArchivedRun) -> Vec<&mut Value> {
    let view = &mut run.run;
    let mut slots: Vec<&mut Value> = view.input.iter_mut().chain(view.output.iter_mut()).collect();
    slots.extend(task_slots(view.tasks.as_deref_mut().unwrap_or_default()));
    for items in run.items.values_mut() {
        slots.extend(task_slots(items));
    }
    slots
}

/// The values of steps as the API shows them: each one's input and output.
fn task_slots(tasks: &mut [TaskView]) -> impl Iterator<Item = &mut Value> {
    tasks.iter_mut().flat_map(|t| std::iter::once(&mut t.input).chain(t.output.iter_mut()))
}

/// The references among `slots`, each replaced by a mark no value can
/// hold: a string with a random part, which the JSON text holds in quotes
/// only where it was put.
fn mark(slots: Vec<&mut Value>) -> Result<Marked, composer_store::Error> {
    let mut nonce = [0u8; 16];
    SystemRandom::new()
        .fill(&mut nonce)
        .map_err(|_| composer_store::Error::Objects("no randomness for an answer's marks".into()))?;
    let prefix = format!("composer-value-{}-", nonce.iter().map(|b| format!("{b:02x}")).collect::<String>());
    let mut refs = Vec::new();
    for v in slots {
        if let Some(r) = Ref::of(v) {
            *v = Value::String(format!("{prefix}{}", refs.len()));
            refs.push(r);
        }
    }
    Ok(Marked { prefix, refs })
}

/// The marks [`mark`] put and the references they stand for, in order.
struct Marked {
    prefix: String,
    refs: Vec<Ref>,
}

/// When an answer reads its offloaded values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Reading {
    /// Before it begins, those up to [`STREAMED_PAST`] whole (checked
    /// against their references) and the larger ones looked for: one
    /// missing or changed is an error answer, not an answer cut short.
    Checked,
    /// Each only when the answer comes to it, a part at a time: an answer
    /// of many values (an export's page) holds none of them whole, and
    /// one missing or changed cuts it short.
    AsReached,
}

/// `view`, marked by [`mark`], as a JSON answer with each offloaded value
/// written in from its object where its mark is: the answer never holds a
/// large value whole, nor converts it. When the values are read is
/// `reading`'s; one that turns out changed past the part already sent
/// ([`Payloads::stream_text`]), or storage failing then, cuts the answer
/// short, which its reader sees as a broken answer, never as a whole one.
async fn answer_with(
    p: &Payloads,
    view: &impl serde::Serialize,
    marked: Marked,
    reading: Reading,
) -> Result<Response, composer_store::Error> {
    use futures_util::{StreamExt, TryStreamExt};
    let Marked { prefix, refs } = marked;
    let text = Bytes::from(serde_json::to_vec(view).map_err(|e| composer_store::Error::Corrupt(e.to_string()))?);
    if refs.is_empty() {
        return Ok(([(CONTENT_TYPE, "application/json")], text).into_response());
    }
    let mut values = Vec::with_capacity(refs.len());
    for r in refs {
        let later = |r: Ref| {
            let p = p.clone();
            futures_util::stream::once(async move { p.stream_text(&r).await }).try_flatten().boxed()
        };
        values.push(match (reading, r.bytes > STREAMED_PAST) {
            (Reading::AsReached, _) => later(r),
            // Opened when the answer comes to it: storage gives a read a
            // few minutes, counted from its request.
            (Reading::Checked, true) => {
                p.check(&r).await.map_err(store_error)?;
                later(r)
            }
            (Reading::Checked, false) => {
                futures_util::stream::once(std::future::ready(Ok(p.read_text(&r).await.map_err(store_error)?))).boxed()
            }
        });
    }
    let mut values: Vec<Option<_>> = values.into_iter().map(Some).collect();
    let quoted = format!("\"{prefix}");
    let mut parts = Vec::new();
    let mut at = 0;
    while let Some(found) = find(&text[at..], quoted.as_bytes()) {
        let start = at + found;
        let digits = text[start + quoted.len()..].iter().take_while(|c| c.is_ascii_digit()).count();
        let end = start + quoted.len() + digits;
        let k: Option<usize> = std::str::from_utf8(&text[start + quoted.len()..end]).ok().and_then(|d| d.parse().ok());
        let closed = text.get(end) == Some(&b'"');
        let Some(value) = k.filter(|_| closed).and_then(|k| values.get_mut(k)).and_then(Option::take) else {
            return Err(composer_store::Error::Corrupt("an answer's mark is not one of its values".into()));
        };
        parts.push(futures_util::stream::once(std::future::ready(Ok(text.slice(at..start)))).boxed());
        parts.push(value);
        at = end + 1;
    }
    if values.iter().any(Option::is_some) {
        return Err(composer_store::Error::Corrupt("an answer lost the mark of one of its values".into()));
    }
    parts.push(futures_util::stream::once(std::future::ready(Ok(text.slice(at..)))).boxed());
    let body = futures_util::stream::iter(parts).flatten().inspect(|part| {
        if let Err(e) = part {
            tracing::error!(error = %e, "an offloaded value could not be written to the end of an answer (its object changed, or storage failed): the answer is cut short");
        }
    });
    Ok(([(CONTENT_TYPE, "application/json")], axum::body::Body::from_stream(body)).into_response())
}

/// Where `needle` first is in `hay`.
fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// Tasks' rows read back, when their references are not kept.
pub async fn resolve_tasks(p: &Payloads, tasks: &mut [TaskRow]) -> Result<(), composer_store::Error> {
    let mut read = ReadFrom::default();
    for t in tasks {
        resolve_task(p, t, &mut read).await?;
    }
    Ok(())
}
