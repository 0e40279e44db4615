//! The child run of a SUB_WORKFLOW attempt: started in a transaction of its
//! own after the commit that asked for it, once per attempt (a claimed
//! slot), so that the recovery sweep may ask again.

use std::sync::Arc;

use composer_core::definition::SUB_WORKFLOW_MAX_DEPTH;
use composer_core::machine::{self, Event, RunStatus};
use composer_core::trace::RunTrace;
use composer_store::runs::{self, Parent, RunRow};
use serde_json::Value;
use uuid::Uuid;

use super::admission::{self, NewRunOf};
use super::error::{EngineError, Rejection, Result};
use super::loaded::Loaded;
use super::request::EventRequest;
use super::store::Tx;
use super::{tally, Engine};

impl Engine {
    /// Starts the child run of a SUB_WORKFLOW attempt in a transaction of its
    /// own, unless the attempt no longer waits or has its child already (so
    /// it is safe to call again: the recovery sweep does, for attempts whose
    /// coordinator died before starting their child). A child that cannot
    /// start fails the attempt, naming why.
    pub async fn start_child(
        self: &Arc<Self>,
        run_id: Uuid,
        task_id: Uuid,
        attempt: i32,
        iteration: u32,
    ) -> Result<()> {
        // In a task of its own, as a start's: the transaction may lease the
        // child's first steps to waiting polls, and must tell them what it
        // committed even if its caller (a sweep stopping) goes away.
        let engine = self.clone();
        let own =
            crate::metrics::spawn(async move { engine.start_child_now(run_id, task_id, attempt, iteration).await });
        own.await.map_err(|_| EngineError::Stopped)?
    }

    async fn start_child_now(
        self: &Arc<Self>,
        run_id: Uuid,
        task_id: Uuid,
        attempt: i32,
        iteration: u32,
    ) -> Result<()> {
        let at = i32::try_from(iteration).unwrap_or(i32::MAX);
        let parent = Parent { run_id, task_id, attempt, iteration: at };
        let mut client = composer_store::client(&self.pool).await?;
        let tx = composer_store::begin(&mut client).await?;
        let Some(slot) = runs::claim_child_slot(&tx, run_id, task_id, attempt, at).await? else { return Ok(()) };
        let (row, mut loaded) = match self.create_child(&tx, parent, &slot).await {
            Ok(child) => child,
            Err(EngineError::Rejected(why)) => {
                drop(tx);
                let event = Event::ChildFinished {
                    task_id,
                    attempt,
                    iteration,
                    child: None,
                    status: RunStatus::Failed,
                    output: None,
                    error: Some(why.to_string()),
                };
                self.handle(EventRequest::new(run_id, event)).await?;
                return Ok(());
            }
            Err(e) => return Err(e),
        };
        // Its first steps go to the polls waiting for work, as a start's do.
        let to_idle = self.idle.give(loaded.iter_mut());
        let mut receipt = self.write(&tx, loaded.iter_mut(), &[]).await?;
        tx.commit().await?;
        receipt.answer(to_idle);
        let owed = self.written(receipt);
        self.follow_up(owed);
        crate::metrics::inc(composer_metrics::RUNS_STARTED, &[], 1);
        tracing::debug!(child = %row.id, parent = %run_id, status = %row.status, "child run started");
        if let Some(l) = loaded {
            if l.run.status.is_terminal() {
                tally::run_finished(&l.wf, &l.run);
            }
            self.follow_up(l.after_commit().collect());
        }
        Ok(())
    }

    /// Inserts (and starts, unless its concurrency limit queues it) the
    /// child run a claimed slot asks for.
    async fn create_child(
        &self,
        tx: &composer_store::Transaction<'_>,
        parent: Parent,
        slot: &runs::ChildSlot,
    ) -> Result<(RunRow, Option<Loaded>)> {
        let depth = slot.parent_depth + 1;
        if depth > SUB_WORKFLOW_MAX_DEPTH {
            return Err(Rejection::TooDeep { max: SUB_WORKFLOW_MAX_DEPTH, limit: machine::DEPTH_LIMIT }.into());
        }
        // The attempt's input, read back if it was offloaded.
        let mut spec = slot.spec.clone();
        super::store::Tx(tx, &self.payloads).resolve(&mut spec).await?;
        let name = spec["workflow"].as_str().unwrap_or_default();
        let version = spec["version"].as_i64().and_then(|v| i32::try_from(v).ok());
        let def = composer_store::definitions::by_name(&**tx, name, version)
            .await?
            .ok_or_else(|| Rejection::UnknownWorkflow { name: name.to_string(), version })?;
        let wf = self.compile(&def)?;
        let input = match spec.get("input") {
            None | Some(Value::Null) => serde_json::json!({}),
            Some(v) => v.clone(),
        };
        // The child's span sits under its parent's attempt.
        let traceparent = RunTrace::of(parent.run_id, slot.parent_traceparent.as_deref())
            .attempt(parent.task_id, parent.attempt)
            .header();
        if !composer_store::trees::charge_run(tx, slot.root, self.bounds.tree.runs).await? {
            return Err(Rejection::TreeTooBig { what: "runs", max: self.bounds.tree.runs }.into());
        }
        let how = NewRunOf {
            parent: Some(parent),
            depth,
            root: Some(slot.root),
            abandoned: spec["on_parent_close"] == "abandon",
            traceparent: Some(&traceparent),
            priority: Some(slot.parent_priority),
            fairness_key: slot.parent_fairness_key.as_deref(),
            ..NewRunOf::of(&def, &input)
        };
        admission::create_run(&Tx(tx, &self.payloads), wf, how, self.bounds).await
    }
}
