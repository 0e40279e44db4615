//! A definition's deadlines (`deadlines`, a run's and each node's): the
//! runs of other workflows started when a run, or a step, has not ended
//! some time after its start. A deadline changes nothing of its run: it is
//! a warning (an SLA), not a timeout.
//!
//! - Armed in the write of the commit that starts the run (its own) or
//!   creates the step (its node's), as rows due `after` that commit's
//!   start ([`super::arming`]). A deadline's run arms none of its own and
//!   joins its run's tree, whose budget every child it starts is charged
//!   to: no chain of definitions can make deadlines start runs without end.
//! - Disarmed in the commit that ends the run.
//! - Fired by the timer loop ([`Engine::fire_deadlines`]): in a short
//!   transaction of its own, each due row is locked (`SKIP LOCKED`), its run
//!   share-locked (skipped while the engine holds it) and looked at: if the
//!   run, or the step, has ended, the row goes; if not, the deadline's run
//!   is created, the run's history notes it (`DeadlinePassed`) and the row
//!   goes, all in that commit. So a deadline starts its run once, whichever
//!   coordinator fires it and whatever crashes; the start's idempotency
//!   key (`deadline:<run>:<node>:<index>:<due time>`) says so a second
//!   time. A firing that fails for a passing reason leaves the row for the
//!   next pass; the others go on.

use std::sync::Arc;

use composer_core::definition::{Deadline, NodeKind};
use composer_core::machine::{RunStatus, TaskState};
use composer_store::deadlines::{self, DeadlineRun, Due, RunNow, NOTIFY};
use serde_json::{json, Value};
use uuid::Uuid;

use super::error::{EngineError, Result};
use super::evaluator::{self, Subject};
use super::starts::{Owed, StartOptions, Started};
use super::store::{RunStore, Tx};
use super::Engine;

/// How long a deadline whose firing failed for a passing reason waits
/// before it is tried again, so that it does not hold the head of the queue.
const RETRY_AFTER: std::time::Duration = std::time::Duration::from_secs(60);

/// What firing one due deadline did.
enum Fired {
    /// Its run was created (or found by its key), for after the commit.
    Started(Box<Started>),
    /// It could not start; its error is in the run's history.
    Refused,
    /// The run or the step had ended, or is gone: the row went.
    Moot,
    /// The engine holds the run: left for a later pass.
    Busy,
}

impl Engine {
    /// Fires the due deadlines, up to `limit` at a time, each in a
    /// transaction of its own; returns how many started a run or noted why
    /// they could not. A deadline whose firing fails for a passing reason
    /// stays armed for the next pass; the others go on.
    pub async fn fire_deadlines(self: &Arc<Self>, limit: i64) -> Result<usize> {
        let mut fired = 0;
        loop {
            let due = deadlines::due(&composer_store::client(&self.pool).await?, limit).await?;
            let mut moved = 0;
            for d in &due {
                match self.fire_one(d).await {
                    Ok(None) => {}
                    Ok(Some(started)) => {
                        moved += 1;
                        fired += usize::from(started);
                    }
                    Err(e) => {
                        tracing::warn!(run_id = %d.run_id, node = d.node_id, error = %e, "deadline not fired; trying again in a minute");
                        let client = composer_store::client(&self.pool).await?;
                        deadlines::put_off(&client, d, RETRY_AFTER).await?;
                    }
                }
            }
            // A full page that moved on may have more behind it.
            if (due.len() as i64) < limit || moved == 0 {
                return Ok(fired);
            }
        }
    }

    /// Fires `d` in a transaction of its own, if it is still due and free:
    /// `Some(true)` when it started a run or noted why it could not,
    /// `Some(false)` when its run or step had ended (it is gone), `None`
    /// when it waits for a later pass.
    async fn fire_one(self: &Arc<Self>, d: &Due) -> Result<Option<bool>> {
        let mut client = composer_store::client(&self.pool).await?;
        let mut tx = composer_store::begin(&mut client).await?;
        let Some(d) = deadlines::lock_due(&tx, d).await? else { return Ok(None) };
        let fired = self.fire(&mut tx, &d).await?;
        if matches!(fired, Fired::Busy) {
            tx.rollback().await?;
            return Ok(None);
        }
        tx.commit().await?;
        Ok(Some(match fired {
            Fired::Started(s) => {
                self.started(*s);
                true
            }
            Fired::Refused => true,
            Fired::Moot | Fired::Busy => false,
        }))
    }

    /// The deadline `d` names in its open run's definition, with its step
    /// (`null` for the run's own); `Err` with what firing it did when the
    /// run or the step has ended, or the deadline is no longer there.
    async fn still_owed(
        &self,
        tx: &composer_store::Transaction<'_>,
        d: &Due,
    ) -> Result<std::result::Result<(DeadlineRun, Deadline, Value), Fired>> {
        let run = match deadlines::run_of(tx, d.run_id).await? {
            RunNow::Busy => return Ok(Err(Fired::Busy)),
            RunNow::Gone => return moot(tx, d).await.map(Err),
            RunNow::Here(run) => run,
        };
        if RunStatus::parse(&run.status).is_none_or(RunStatus::is_terminal) {
            return moot(tx, d).await.map(Err);
        }
        let Some(def) = composer_store::definitions::by_id(tx, run.definition_id).await? else {
            return moot(tx, d).await.map(Err);
        };
        let wf = match self.compile(&def) {
            Ok(wf) => wf,
            Err(EngineError::Rejected(why)) => {
                let noted = json!({"node": (!d.node_id.is_empty()).then_some(&d.node_id)});
                return refused(tx, d, noted, format!("its run's definition: {why}")).await.map(Err);
            }
            Err(e) => return Err(e),
        };
        let node = (!d.node_id.is_empty()).then_some(d.node_id.as_str());
        let list = match node {
            None => &wf.deadlines,
            Some(id) => match wf.nodes.iter().find(|n| n.id == id && n.item_of.is_none()) {
                // An approval's notification, armed as the step's deadline at `NOTIFY`.
                Some(n) if d.idx == NOTIFY => match &n.kind {
                    NodeKind::Approval(a) => a.notify.as_slice(),
                    _ => &[],
                },
                Some(n) => &n.deadlines,
                None => return moot(tx, d).await.map(Err),
            },
        };
        let at = if d.idx == NOTIFY { Some(0) } else { usize::try_from(d.idx).ok() };
        let Some(deadline) = at.and_then(|i| list.get(i)).cloned() else {
            return moot(tx, d).await.map(Err);
        };
        let step = match node {
            None => Value::Null,
            Some(id) => match deadlines::step_of(tx, d.run_id, id).await? {
                Some((state, attempt)) if TaskState::parse(&state).is_some_and(|s| !s.is_terminal()) => {
                    json!({"node": id, "state": state, "attempt": attempt})
                }
                _ => return moot(tx, d).await.map(Err),
            },
        };
        Ok(Ok((run, deadline, step)))
    }

    async fn fire(&self, tx: &mut composer_store::Transaction<'_>, d: &Due) -> Result<Fired> {
        let (run, deadline, step) = match self.still_owed(tx, d).await? {
            Ok(owed) => owed,
            Err(fired) => return Ok(fired),
        };
        let node = (!d.node_id.is_empty()).then_some(d.node_id.as_str());
        let after = composer_core::duration::format(deadline.after);
        let mut seen = json!({
            "run": {"id": d.run_id, "workflow": run.workflow, "version": run.version, "status": run.status},
            "step": step,
            "deadline": {"after": after, "node": node, "due_at": d.due_at},
        });
        if d.idx == NOTIFY {
            seen = self.notification(tx, d, seen).await?;
        }
        let mut noted = json!({"workflow": deadline.workflow, "node": node, "after": after});
        let input = match self.deadline_input(tx, d.run_id, &deadline, seen, run.input).await? {
            Ok(input) => input,
            Err(why) => return refused(tx, d, noted, why).await,
        };
        let target = match Tx(tx, &self.payloads).definition(&deadline.workflow, deadline.version).await? {
            Some(def) => def,
            None => {
                let version = deadline.version.map(|v| format!(" version {v}")).unwrap_or_default();
                let why = format!("workflow {:?}{version} is not registered", deadline.workflow);
                return refused(tx, d, noted, why).await;
            }
        };
        let trigger = json!({"hook": "deadline", "deadline_of": d.run_id, "node": node, "after": after});
        // One key per arming: a step created again (a rerun) arms anew.
        let key = format!("deadline:{}:{}:{}:{}", d.run_id, d.node_id, d.idx, d.due_at.timestamp_micros());
        let opts = StartOptions {
            idempotency_key: Some(&key),
            trigger: Some(&trigger),
            traceparent: run.traceparent.as_deref(),
            owed: Some(Owed { by: d.run_id, root: run.root }),
            ..Default::default()
        };
        // A savepoint: a start refused half way leaves the rest standing.
        let sp = tx.savepoint("deadline_start").await?;
        match self.start_run_in(&sp, &target, &input, opts).await {
            Ok(s) => {
                sp.commit().await?;
                tracing::info!(run_id = %d.run_id, node = d.node_id, started = %s.row.id, "deadline passed");
                noted["run_id"] = json!(s.row.id);
                deadlines::done(tx, d, Some(&noted)).await?;
                Ok(Fired::Started(Box::new(s)))
            }
            Err(EngineError::Rejected(why)) => {
                sp.rollback().await?;
                refused(tx, d, noted, why.to_string()).await
            }
            Err(e) => Err(e),
        }
    }

    /// An approval's notification: `{run, step, approval, link}`, the
    /// approval as it is now (its prompt, assignees, quorum, deadline).
    async fn notification(&self, tx: &composer_store::Transaction<'_>, d: &Due, seen: Value) -> Result<Value> {
        let mut approval = composer_store::approvals::get_in(tx, d.run_id, &d.node_id).await?;
        if let Some(a) = approval.as_mut() {
            Tx(tx, &self.payloads).resolve(&mut a.request).await?;
        }
        let path = format!("/ui/approvals/{}/{}", d.run_id, d.node_id);
        let link = match &self.ui_url {
            Some(base) => format!("{}{path}", base.trim_end_matches('/')),
            None => path,
        };
        Ok(json!({"run": seen["run"], "step": seen["step"], "approval": approval.map(|a| a.request), "link": link}))
    }

    /// The deadline's input: its template over `{run, step, deadline,
    /// input}` through the evaluator's door, or `{run, step, deadline}`;
    /// `Ok(Err(why))` when it does not evaluate or is too large.
    async fn deadline_input(
        &self,
        tx: &composer_store::Transaction<'_>,
        run_id: Uuid,
        deadline: &Deadline,
        seen: Value,
        mut input: Value,
    ) -> Result<std::result::Result<Value, String>> {
        let max = self.bounds.max_payload;
        let Some(template) = deadline.input.clone() else {
            return Ok(composer_core::storable::check(&seen, "the deadline's input", max).map(|()| seen));
        };
        Tx(tx, &self.payloads).resolve(&mut input).await?;
        let mut scope = seen;
        scope["input"] = input;
        let evaluated = evaluator::evaluate(
            Subject::Run(run_id),
            template.is_simple(),
            (template, scope, max),
            |sb, (template, scope, max)| {
                let v = template.eval(sb, &scope).map_err(|e| format!("deadlines: start.input: {e}"))?;
                composer_core::storable::check(&v, "the deadline's input", max).map(|()| v)
            },
        )
        .await;
        Ok(evaluated.map_err(|lost| format!("deadlines: start.input: {lost}")).and_then(|v| v))
    }
}

async fn moot(tx: &composer_store::Transaction<'_>, d: &Due) -> Result<Fired> {
    deadlines::done(tx, d, None).await?;
    Ok(Fired::Moot)
}

async fn refused(tx: &composer_store::Transaction<'_>, d: &Due, mut noted: Value, why: String) -> Result<Fired> {
    tracing::warn!(run_id = %d.run_id, node = d.node_id, error = %why, "deadline passed; its run could not start");
    noted["run_id"] = Value::Null;
    noted["error"] = json!(composer_core::clipped(&why, 2000));
    deadlines::done(tx, d, Some(&noted)).await?;
    Ok(Fired::Refused)
}
