//! MAP: one task per item of a list computed when the MAP starts.
//!
//! The MAP's own task is RUNNING while its items run and carries their counts
//! ([`MapProgress`]). Every item is created when the MAP starts, with its
//! input evaluated then (so the run's context is converted once, not once per
//! item): QUEUED until a slot under `max_concurrency` frees, then dispatched
//! like any node. An item's result changes the item and the MAP's counts and
//! nothing else; the engine loads only the items an event names, and when the
//! state machine needs others (the next to start, all of them to gather the
//! output) it says so in [`Transition::effects`].

use std::collections::BTreeMap;

use serde_json::{json, Value};
use uuid::Uuid;

use super::state::Machine;
use super::types::{codes, Effect, Failure, HistoryKind, Ignore, Item, MapProgress, Need, RunStatus, Task, TaskState};
use crate::definition::{MapConfig, NodeKind};
use crate::expr::Scope;
use crate::storable;

impl Machine<'_> {
    pub(super) fn map_config(&self, t: usize) -> &MapConfig {
        match &self.wf.nodes[self.run.tasks[t].node].kind {
            NodeKind::Map(m) => m,
            _ => unreachable!("a task with progress is a MAP's"),
        }
    }

    /// Starts a MAP: every item is created, its input evaluated with `.item`
    /// and `.index` bound; TRANSFORM items complete at once, the others are
    /// QUEUED, then as many start as `max_concurrency` allows.
    pub(super) fn start_map(&mut self, t: usize, items: Vec<Value>, scope: Scope) {
        if items.is_empty() {
            self.finish(t, TaskState::Completed, Some(json!([])), None);
            return;
        }
        let wf = self.wf;
        let config = self.map_config(t).clone();
        let template = &wf.nodes[config.template];
        let total = items.len() as u32;
        let map_id = self.run.tasks[t].id;
        {
            let task = &mut self.run.tasks[t];
            task.state = TaskState::Running;
            task.input = json!({"items": total, "max_concurrency": config.max_concurrency});
            task.progress = Some(MapProgress { total, queued: total, ..MapProgress::default() });
        }
        let payload = self.task_payload(t, json!({"items": total, "max_concurrency": config.max_concurrency}));
        self.tr.log(HistoryKind::MapStarted, payload);
        self.index_map(t);
        let max = self.run.max_payload;
        for (index, value) in items.into_iter().enumerate() {
            let item = Item { map: map_id, index: index as u32 };
            let at = self.run.tasks.len();
            let mut task = Task::new((self.new_id)(), config.template, Some(item));
            task.state = TaskState::Queued;
            self.run.tasks.push(task);
            self.tr.created.push(at);
            let evaluated = scope.with_item(&value, index).and_then(|scope| match &template.kind {
                NodeKind::Transform { output } => output
                    .eval_in(Some(&scope))
                    .and_then(|v| storable::check(&v, "config.output", max).map(|()| v))
                    .map_err(|e| format!("config.output: {e}")),
                // A child's input is data for a run, not a request a worker
                // resolves secrets in: nothing to escape.
                NodeKind::SubWorkflow { .. } => template
                    .template
                    .eval_in(Some(&scope))
                    .and_then(|v| storable::check(&v, "config", max).map(|()| v))
                    .map_err(|e| format!("config: {e}")),
                _ => template
                    .template
                    .eval_input(Some(&scope))
                    .and_then(|v| storable::check(&v, "config", max).map(|()| v))
                    .map_err(|e| format!("config: {e}")),
            });
            match (evaluated, &template.kind) {
                (Err(error), _) => {
                    self.finish(at, TaskState::Failed, None, Some(Failure::fatal(storable::code_of(&error), error)))
                }
                (Ok(output), NodeKind::Transform { .. }) => self.finish(at, TaskState::Completed, Some(output), None),
                (Ok(input), kind) => {
                    let id = self.run.tasks[at].id;
                    self.run.tasks[at].input = super::rules::with_idempotency_key(kind, input, id, 1);
                    if let Some(queued) = &mut self.maps.queued {
                        queued.insert((t, index as u32), at);
                    }
                }
            }
        }
        self.advance(t);
    }

    /// Counts an item leaving QUEUED or open for `state` on its MAP.
    pub(super) fn item_finishing(&mut self, t: usize, state: TaskState) {
        let task = &self.run.tasks[t];
        let was = task.state;
        if was.is_terminal() || !state.is_terminal() {
            return;
        }
        if task.progress.is_some_and(|p| p.queued + p.open > 0) && !self.tr.cancel_items.contains(&t) {
            // A MAP ending early (cancelled, failed, timed out): its
            // remaining items end with it, in storage too.
            self.tr.cancel_items.push(t);
        }
        let Some(item) = task.item else { return };
        if was == TaskState::Queued {
            if let Some(queued) = &mut self.maps.queued {
                queued.retain(|_, &mut at| at != t);
            }
        }
        let Some(m) = self.map_task(item.map) else { return };
        let Some(p) = &mut self.run.tasks[m].progress else { return };
        if was == TaskState::Queued {
            p.queued = p.queued.saturating_sub(1);
        } else {
            p.open = p.open.saturating_sub(1);
        }
        if state == TaskState::Completed {
            p.completed += 1;
        } else {
            p.failed += 1;
        }
        self.tr.touch(m);
        if !self.maps.dirty.contains(&m) {
            self.maps.dirty.push(m);
        }
    }

    /// Looks again at the MAPs whose items changed.
    pub(super) fn advance_maps(&mut self) {
        while let Some(m) = self.maps.dirty.pop() {
            self.advance(m);
        }
    }

    /// Marks every open MAP for a look (after a resume or a load).
    pub(super) fn mark_open_maps(&mut self) {
        for m in 0..self.run.tasks.len() {
            let task = &self.run.tasks[m];
            if task.progress.is_some() && !task.state.is_terminal() && !self.maps.dirty.contains(&m) {
                self.maps.dirty.push(m);
            }
        }
    }

    pub(super) fn on_items_loaded(&mut self, task_id: Uuid) -> Result<(), Ignore> {
        self.require_active()?;
        let m = self.find(task_id)?;
        self.maps.dirty.push(m);
        self.route();
        Ok(())
    }

    /// A MAP fails with its first failed item (`on_item_failure: fail`),
    /// starts queued items while slots are free (not while the run is
    /// paused), and completes when every item has finished.
    pub(super) fn advance(&mut self, m: usize) {
        let (Some(p), false) = (self.run.tasks[m].progress, self.run.tasks[m].state.is_terminal()) else { return };
        let config = self.map_config(m).clone();
        if p.failed > 0 && !config.continue_on_failure {
            self.fail_map(m);
            return;
        }
        if self.run.status == RunStatus::Running {
            self.fill(m, &config);
        }
        let p = self.run.tasks[m].progress.unwrap_or_default();
        if p.completed + p.failed == p.total {
            self.complete_map(m);
        }
    }

    pub(super) fn fill(&mut self, m: usize, config: &MapConfig) {
        let max = config.max_concurrency.unwrap_or(u32::MAX);
        loop {
            let p = self.run.tasks[m].progress.unwrap_or_default();
            if p.open >= max || p.queued == 0 {
                return;
            }
            let Some(t) = self.next_queued(m) else {
                let map = self.run.tasks[m].id;
                let count = (max - p.open).min(p.queued);
                self.tr.effects.retain(|e| !matches!(e, Effect::LoadItems(Need::Queued { map: id, .. }) if *id == map));
                self.tr.effects.push(Effect::LoadItems(Need::Queued { map, count }));
                return;
            };
            if let Some(p) = &mut self.run.tasks[m].progress {
                p.queued -= 1;
                p.open += 1;
            }
            self.tr.touch(m);
            self.tr.touch(t);
            self.dispatch(t);
        }
    }

    /// The loaded QUEUED item of MAP `m` with the lowest index, taken off the index.
    pub(super) fn next_queued(&mut self, m: usize) -> Option<usize> {
        let tasks = &self.run.tasks;
        let queued = self.maps.queued.get_or_insert_with(|| {
            tasks
                .iter()
                .enumerate()
                .filter(|(_, t)| t.state == TaskState::Queued)
                .filter_map(|(at, t)| {
                    let item = t.item?;
                    let m = tasks.iter().position(|x| x.id == item.map)?;
                    Some(((m, item.index), at))
                })
                .collect()
        });
        let key = *queued.range((m, 0)..=(m, u32::MAX)).next()?.0;
        queued.remove(&key)
    }

    pub(super) fn map_task(&mut self, id: Uuid) -> Option<usize> {
        let tasks = &self.run.tasks;
        let by_id = self.maps.by_id.get_or_insert_with(|| {
            tasks.iter().enumerate().filter(|(_, t)| t.progress.is_some()).map(|(at, t)| (t.id, at)).collect()
        });
        by_id.get(&id).copied()
    }

    pub(super) fn index_map(&mut self, m: usize) {
        let id = self.run.tasks[m].id;
        if let Some(by_id) = &mut self.maps.by_id {
            by_id.insert(id, m);
        }
    }

    /// The loaded items of MAP `m`, by index.
    pub(super) fn items_of(&self, m: usize) -> BTreeMap<u32, usize> {
        let id = self.run.tasks[m].id;
        self.run
            .tasks
            .iter()
            .enumerate()
            .filter_map(|(at, t)| t.item.filter(|i| i.map == id).map(|i| (i.index, at)))
            .collect()
    }

    /// Every item finished: the output is their outputs in item order (a
    /// failed item's is `{"error": …}`). Needs every item loaded.
    pub(super) fn complete_map(&mut self, m: usize) {
        let p = self.run.tasks[m].progress.unwrap_or_default();
        let items = self.items_of(m);
        if items.len() < p.total as usize {
            let map = self.run.tasks[m].id;
            let need = Effect::LoadItems(Need::All { map });
            if !self.tr.effects.contains(&need) {
                self.tr.effects.push(need);
            }
            return;
        }
        let output: Vec<Value> = items
            .values()
            .map(|&at| {
                let t = &self.run.tasks[at];
                match t.state {
                    TaskState::Completed => t.output.clone().unwrap_or(Value::Null),
                    _ => json!({"error": t.error.as_deref().unwrap_or("cancelled")}),
                }
            })
            .collect();
        let output = Value::Array(output);
        match storable::check(&output, "output", self.run.max_payload) {
            Ok(()) => self.finish(m, TaskState::Completed, Some(output), None),
            Err(e) => self.finish(m, TaskState::Failed, None, Some(Failure::fatal(codes::PAYLOAD, e))),
        }
    }

    /// `on_item_failure: fail`: the MAP fails naming its first failed item;
    /// no more items start, and the open ones are cancelled.
    pub(super) fn fail_map(&mut self, m: usize) {
        let items = self.items_of(m);
        let first = items.iter().find(|(_, &at)| self.run.tasks[at].state == TaskState::Failed);
        let error = match first {
            Some((index, &at)) => {
                format!("item {index} failed: {}", self.run.tasks[at].error.as_deref().unwrap_or("unknown error"))
            }
            None => "an item failed".to_string(),
        };
        self.finish(m, TaskState::Failed, None, Some(Failure::fatal(codes::ITEM_FAILED, error)));
        for (_, at) in items {
            if !self.run.tasks[at].state.is_terminal() {
                self.finish(at, TaskState::Cancelled, None, None);
            }
        }
    }

    /// Retrying a failed MAP runs again the items that did not complete, with
    /// the inputs they had; the completed ones keep their outputs. Needs every
    /// item loaded (the engine loads them for a retry). A MAP that failed
    /// before it had items starts afresh.
    pub(super) fn restart_map(&mut self, m: usize) {
        let items = self.items_of(m);
        let p = self.run.tasks[m].progress.unwrap_or_default();
        if p.total == 0 || items.len() < p.total as usize {
            let task = &mut self.run.tasks[m];
            task.progress = None;
            task.attempt += 1;
            task.error = None;
            task.error_info = None;
            task.finished_at = None;
            self.tr.touch(m);
            let mut ctx = None;
            self.start(m, &mut ctx);
            return;
        }
        let mut progress = MapProgress { total: p.total, ..MapProgress::default() };
        for (_, at) in items {
            let item = &mut self.run.tasks[at];
            if item.state == TaskState::Completed {
                progress.completed += 1;
                continue;
            }
            item.state = TaskState::Queued;
            item.attempt += 1;
            // A new execution of the item: a new default idempotency key.
            let default_key = format!("{}:", item.id);
            if item.input["idempotency_key"].as_str().is_some_and(|k| k.starts_with(&default_key)) {
                item.input["idempotency_key"] = json!(format!("{default_key}{}", item.attempt));
            }
            item.error = None;
            item.error_info = None;
            item.output = None;
            item.finished_at = None;
            item.wake_at = None;
            progress.queued += 1;
            self.tr.touch(at);
        }
        self.maps.queued = None;
        let task = &mut self.run.tasks[m];
        task.state = TaskState::Running;
        task.attempt += 1;
        task.error = None;
        task.error_info = None;
        task.finished_at = None;
        task.progress = Some(progress);
        self.tr.touch(m);
        let payload = self.task_payload(m, json!({"items": p.total, "retrying": progress.queued}));
        self.tr.log(HistoryKind::MapStarted, payload);
        self.advance(m);
    }
}
