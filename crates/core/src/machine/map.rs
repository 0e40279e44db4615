//! MAP: one task per item of a list computed when the MAP starts.
//!
//! The MAP's own task is RUNNING while its items run and carries their counts
//! ([`MapProgress`]). Items are created as the MAP needs them, a chunk of
//! [`ITEM_CHUNK`] at a time, with their inputs evaluated then: QUEUED until a
//! slot under `max_concurrency` frees, then dispatched like any node. The
//! list itself is kept in storage (the writer's `map_sources`) for the
//! chunks not created yet, so memory and each transaction stay bounded
//! whatever the number of items. An item's result changes the item and the
//! MAP's counts (and a reduction's accumulator) and nothing else; the engine
//! loads only the items an event names, and when the state machine needs
//! others (the next to start, the next chunk of the list, all of them to
//! gather the output) it says so in [`Transition::effects`].

use crate::definition::limit::keys_in;
use std::collections::BTreeMap;

use serde_json::{json, Value};
use uuid::Uuid;

use super::codes;
use super::effect::{Effect, Need};
use super::history::HistoryKind;
use super::lifecycle::{RunStatus, TaskState};
use super::state::{renew_idempotency_key, Machine};
use super::task::{Failure, Item, MapProgress, Task};
use super::transition::{Ignore, IgnoreKind};
use crate::definition::{Collect, MapConfig, NodeKind, MAP_MAX_ITEMS, MIN_COLLECTED_ITEM_BYTES};
use crate::expr::Scope;
use crate::storable;

impl Machine<'_> {
    pub(super) fn map_config(&self, t: usize) -> &MapConfig {
        match &self.wf.nodes[self.run.tasks[t].node].kind {
            NodeKind::Map(m) => m,
            _ => unreachable!("a task with progress is a MAP's"),
        }
    }

    /// The items of a MAP's list, evaluated in `scope` (under the items'
    /// budget): no more than its run tree may still create.
    pub(super) fn evaluate_items(&self, config: &MapConfig, scope: Option<&Scope>) -> Result<Vec<Value>, String> {
        let left = self.run.items_left;
        config.items.eval_in_with(self.sb, scope, crate::expr::Limits::MAP_ITEMS).and_then(items).and_then(|items| {
            match items.len() as u64 {
                n if n > left => Err(format!(
                    "{n} items, more than the {left} its run tree may still create \
                     (the fan-out budget, COMPOSER_MAX_TREE_ITEMS)"
                )),
                _ => Ok(items),
            }
        })
    }

    /// Starts a MAP over `items`: its task RUNNING with the counts, the list
    /// kept for the chunks to come, and as many items created and started as
    /// `max_concurrency` allows (at most [`ITEMS_PER_EVENT`] in this event).
    /// A MAP that gathers every output and has more items than the payload
    /// limit can hold fails before any starts.
    pub(super) fn start_map(&mut self, t: usize, items: Vec<Value>, scope: Option<Scope>) {
        // Its items are evaluated in the scope its `items` was: built once.
        if let Some(scope) = scope {
            self.maps.item_scopes.entry(t).or_insert(scope);
        }
        let config = self.map_config(t).clone();
        if items.is_empty() {
            let output = match &config.collect {
                Collect::All => json!([]),
                Collect::None => json!({"count": 0, "succeeded": 0, "failed": 0}),
                Collect::Reduce { init, .. } => init.clone(),
            };
            self.finish(t, TaskState::Completed, Some(output), None);
            return;
        }
        let total = items.len() as u32;
        if config.collect == Collect::All && collected_share(self.run.max_payload, total) < MIN_COLLECTED_ITEM_BYTES {
            let error = format!(
                "{total} items: their outputs cannot all be collected within the payload limit ({} bytes, \
                 COMPOSER_MAX_PAYLOAD); use collect: \"none\" or a reduction",
                self.run.max_payload
            );
            self.finish(t, TaskState::Failed, None, Some(Failure::fatal(codes::PAYLOAD, error)));
            return;
        }
        {
            let task = &mut self.run.tasks[t];
            task.state = TaskState::Running;
            task.input = json!({"items": total, "max_concurrency": config.max_concurrency});
            task.progress = Some(MapProgress { total, queued: total, created: Some(0), ..MapProgress::default() });
            if let Collect::Reduce { init, .. } = &config.collect {
                task.output = Some(init.clone());
            }
        }
        self.tr.charged_items += total as u64;
        let payload = self.task_payload(t, json!({"items": total, "max_concurrency": config.max_concurrency}));
        self.tr.log(HistoryKind::MapStarted, payload);
        self.index_map(t);
        self.maps.fresh.insert(t, items);
        self.advance(t);
    }

    /// Creates items `from..` of MAP `m` from `values`, QUEUED, each input
    /// evaluated with `.item` and `.index` bound over the MAP's scope (so the
    /// run's context is converted once per chunk, not once per item); a
    /// TRANSFORM item completes at once.
    pub(super) fn create_items(&mut self, m: usize, from: u32, values: &[Value]) {
        // Items of a later chunk see what the MAP read when it started.
        if !self.require_reads(self.run.tasks[m].node) {
            return;
        }
        let wf = self.wf;
        let config = self.map_config(m).clone();
        let template = &wf.nodes[config.template];
        let map_id = self.run.tasks[m].id;
        let scope = self.items_scope(m);
        let max = self.run.max_payload;
        let share = self.item_share(m);
        if let Some(p) = &mut self.run.tasks[m].progress {
            p.created = Some(from + values.len() as u32);
        }
        self.tr.touch(m);
        self.maps.created_now += values.len() as u32;
        for (k, value) in values.iter().enumerate() {
            let index = from + k as u32;
            let item = Item { map: map_id, index };
            let at = self.run.tasks.len();
            let mut task = Task::new((self.new_id)(), config.template, Some(item));
            task.state = TaskState::Queued;
            self.run.tasks.push(task);
            self.tr.created.push(at);
            if let NodeKind::Transform { .. } = &template.kind {
                // Once an item before it failed the MAP, a TRANSFORM item is
                // not evaluated: it is cancelled with the MAP, as a queued
                // one is, and keeps its item for a retry to evaluate.
                match self.failing(m, &config) {
                    true => self.run.tasks[at].input = json!({"item": value}),
                    false => self.transform_item(m, at, value, &scope, share),
                }
                continue;
            }
            let sb = self.sb;
            let evaluated = scope.with_item(value, index as usize).and_then(|scope| match &template.kind {
                // A child's input is data for a run, not a request a worker
                // resolves secrets in: nothing to escape.
                NodeKind::SubWorkflow { .. } => template
                    .template
                    .eval_value(sb, Some(&scope))
                    .and_then(|v| storable::check(&v, "config", max).map(|()| v))
                    .map_err(|e| format!("config: {e}")),
                _ => template
                    .template
                    .eval_input(sb, Some(&scope))
                    .and_then(|v| storable::check(&v, "config", max).map(|()| v))
                    .map_err(|e| format!("config: {e}"))
                    .and_then(|v| {
                        self.run.tasks[at].limit_keys = keys_in(sb, &template.limits, Some(&scope))?;
                        Ok(v)
                    }),
            });
            match evaluated {
                Err(error) => {
                    self.finish(at, TaskState::Failed, None, Some(Failure::fatal(codes::of_evaluation(&error), error)))
                }
                Ok(input) => {
                    let id = self.run.tasks[at].id;
                    self.run.tasks[at].input = super::state::with_idempotency_key(&template.kind, input, id, 1);
                    if let Some(queued) = &mut self.maps.queued {
                        queued.insert((m, index), at);
                    }
                }
            }
        }
    }

    /// Evaluates TRANSFORM item `t` of MAP `m` over `value`, in the MAP's
    /// `scope`: it ends at once, completed, or failed (keeping its item, for
    /// a retry to evaluate again).
    fn transform_item(&mut self, m: usize, t: usize, value: &Value, scope: &Scope, share: Option<usize>) {
        let node = &self.wf.nodes[self.run.tasks[t].node];
        let NodeKind::Transform { output } = &node.kind else { return };
        let index = self.run.tasks[t].item.map_or(0, |i| i.index);
        let max = self.run.max_payload;
        let evaluated = scope
            .with_item(value, index as usize)
            .and_then(|scope| output.eval_in(self.sb, Some(&scope)))
            .and_then(|v| storable::check(&v, "config.output", max).map(|()| v))
            .map_err(|e| format!("config.output: {e}"));
        let failure = match evaluated {
            Err(error) => Err(Failure::fatal(codes::of_evaluation(&error), error)),
            Ok(output) => match share.and_then(|s| over(&output, s, values_total(self, m))) {
                Some(failure) => Err(failure),
                None => Ok(output),
            },
        };
        match failure {
            Ok(output) => self.finish(t, TaskState::Completed, Some(output), None),
            Err(failure) => {
                self.run.tasks[t].input = json!({"item": value});
                self.finish(t, TaskState::Failed, None, Some(failure));
            }
        }
    }

    /// Starts queued item `t` of MAP `m`, its slot taken: a worker's or a
    /// child's is dispatched; a TRANSFORM's (queued when a retry runs it
    /// again) is evaluated at once over the item it kept.
    fn start_item(&mut self, m: usize, t: usize) {
        if !matches!(self.wf.nodes[self.run.tasks[t].node].kind, NodeKind::Transform { .. }) {
            self.dispatch(t);
            return;
        }
        // Open, as the slot taken counts it.
        self.run.tasks[t].state = TaskState::Running;
        let value = self.run.tasks[t].input["item"].clone();
        let scope = self.items_scope(m);
        let share = self.item_share(m);
        self.transform_item(m, t, &value, &scope, share);
    }

    /// The bytes of the collected output one item of MAP `m` may use
    /// (`collect: "all"`): the payload limit, less the room kept for what
    /// holds the output, shared by the items. `None` when the
    /// MAP does not gather its items' outputs.
    pub(super) fn item_share(&self, m: usize) -> Option<usize> {
        let p = self.run.tasks[m].progress?;
        (self.map_config(m).collect == Collect::All).then(|| collected_share(self.run.max_payload, p.total))
    }

    /// An item's output that is more than its share of its MAP's collected
    /// output fails the item (for good: it would again), so that a MAP whose
    /// items all ran never fails for the size of what it gathers.
    pub(super) fn over_share(&mut self, t: usize, output: &Value) -> Option<Failure> {
        let item = self.run.tasks[t].item?;
        let m = self.map_task(item.map)?;
        let share = self.item_share(m)?;
        over(output, share, values_total(self, m))
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

    /// Storage gathered the output of a MAP whose items have all ended: it
    /// completes with it, as with every item loaded.
    pub(super) fn on_items_collected(&mut self, task_id: Uuid, output: Value) -> Result<(), Ignore> {
        self.require_active()?;
        let m = self.find(task_id)?;
        let task = &self.run.tasks[m];
        let p = task.progress.unwrap_or_default();
        let entries = output.as_array().map_or(0, Vec::len);
        if task.state.is_terminal() || p.completed + p.failed != p.total || entries != p.total as usize {
            let why = format!(
                "the MAP is {} with {} of {} items ended; {entries} entries gathered",
                task.state,
                p.completed + p.failed,
                p.total
            );
            return Err(Ignore(IgnoreKind::NotDue, why));
        }
        self.maps.collected.insert(m, output);
        self.maps.dirty.push(m);
        self.route();
        Ok(())
    }

    /// A MAP fails once more of its items failed than it tolerates (its
    /// first failed item, by default), starts queued items while slots are
    /// free (not while the run is paused), and completes when every item has
    /// finished.
    ///
    /// Items may end while the MAP fills (a TRANSFORM item ends as it is
    /// created, and a reduction over it may fail): whether the MAP fails is
    /// asked again after filling, before it may complete.
    pub(super) fn advance(&mut self, m: usize) {
        if self.run.tasks[m].progress.is_none() || self.run.tasks[m].state.is_terminal() || self.fails_now(m) {
            return;
        }
        let config = self.map_config(m).clone();
        if self.run.status == RunStatus::Running {
            self.fill(m, &config);
        }
        if self.fails_now(m) {
            return;
        }
        let p = self.run.tasks[m].progress.unwrap_or_default();
        if p.completed + p.failed == p.total {
            self.complete_map(m);
        }
    }

    /// Whether MAP `m` is to fail: a reduction over an item failed, or more
    /// items failed than it tolerates.
    fn failing(&self, m: usize, config: &MapConfig) -> bool {
        let p = self.run.tasks[m].progress.unwrap_or_default();
        self.maps.broken.contains_key(&m) || config.tolerated.exceeded(p.failed, p.total)
    }

    /// Fails MAP `m` if a reduction over one of its items failed or more of
    /// its items failed than it tolerates; whether it did.
    fn fails_now(&mut self, m: usize) -> bool {
        if let Some(failure) = self.maps.broken.remove(&m) {
            self.fail_map(m, Some(failure));
            return true;
        }
        let p = self.run.tasks[m].progress.unwrap_or_default();
        if self.map_config(m).tolerated.exceeded(p.failed, p.total) {
            self.fail_map(m, None);
            return true;
        }
        false
    }

    pub(super) fn fill(&mut self, m: usize, config: &MapConfig) {
        let max = config.max_concurrency.unwrap_or(crate::definition::MAP_DEFAULT_CONCURRENCY);
        loop {
            let p = self.run.tasks[m].progress.unwrap_or_default();
            // An item that ended as it was created may have failed the MAP:
            // start nothing more before the MAP is looked at.
            if p.open >= max || p.queued == 0 || self.failing(m, config) {
                return;
            }
            if let Some(t) = self.next_queued(m) {
                if let Some(p) = &mut self.run.tasks[m].progress {
                    p.queued -= 1;
                    p.open += 1;
                }
                self.tr.touch(m);
                self.tr.touch(t);
                self.start_item(m, t);
                continue;
            }
            let map = self.run.tasks[m].id;
            // Created items wait QUEUED in storage: load the next ones.
            let created_waiting = p.queued.saturating_sub(p.total - p.created());
            if created_waiting > 0 {
                let count = (max - p.open).min(created_waiting);
                self.tr.effects.retain(|e| !matches!(e, Effect::LoadItems(Need::Queued { map: id, .. }) if *id == map));
                self.tr.effects.push(Effect::LoadItems(Need::Queued { map, count }));
                return;
            }
            // Every created item has started: create the next chunk, from the
            // list in memory when this event started the MAP, else from storage.
            // One chunk from storage per event, up to ITEMS_PER_EVENT from
            // memory: the rest after the commit.
            if self.maps.created_now >= ITEMS_PER_EVENT || (self.maps.sourced && !self.maps.fresh.contains_key(&m)) {
                if !self.tr.continue_maps.contains(&m) {
                    self.tr.continue_maps.push(m);
                }
                return;
            }
            let from = p.created();
            let count = ITEM_CHUNK.min(p.total - from);
            match self.maps.fresh.get(&m) {
                Some(list) => {
                    let values = list[from as usize..(from + count) as usize].to_vec();
                    self.create_items(m, from, &values);
                }
                None => {
                    let need = Effect::LoadItems(Need::Sources { map, from, count });
                    if !self.tr.effects.contains(&need) {
                        self.tr.effects.push(need);
                    }
                    return;
                }
            }
        }
    }

    /// The engine read the chunk of a MAP's list from `from`: those items
    /// are created, and the MAP carries on.
    pub(super) fn on_sources_loaded(&mut self, task_id: Uuid, from: u32, values: Vec<Value>) -> Result<(), Ignore> {
        self.require_active()?;
        let m = self.find(task_id)?;
        let created = self.run.tasks[m].progress.map(|p| p.created());
        if self.run.tasks[m].state.is_terminal() || created != Some(from) {
            return Err(Ignore(IgnoreKind::NotDue, format!("the MAP has created {created:?} items, not {from}")));
        }
        let left = self.run.tasks[m].progress.map_or(0, |p| p.total - from) as usize;
        self.create_items(m, from, &values[..values.len().min(left)]);
        self.maps.sourced = true;
        self.maps.dirty.push(m);
        self.route();
        Ok(())
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
    /// failed item's is `{"error": …}`, cut to its share; needs every item
    /// loaded), their counts (`collect: "none"`), or the reduction's result.
    pub(super) fn complete_map(&mut self, m: usize) {
        let p = self.run.tasks[m].progress.unwrap_or_default();
        let counts = json!({"count": p.total, "succeeded": p.completed, "failed": p.failed});
        match &self.map_config(m).collect {
            Collect::None => return self.finish(m, TaskState::Completed, Some(counts), None),
            Collect::Reduce { .. } => {
                let acc = self.run.tasks[m].output.take().unwrap_or(Value::Null);
                return self.finish(m, TaskState::Completed, Some(acc), None);
            }
            Collect::All => {}
        }
        let share = self.item_share(m).unwrap_or(usize::MAX);
        let output = match self.maps.collected.remove(&m) {
            Some(output) => output,
            None => {
                let items = self.items_of(m);
                if items.len() < p.total as usize {
                    let map = self.run.tasks[m].id;
                    let need = match self.run.collects_in_storage {
                        true => Effect::LoadItems(Need::Collect { map, share }),
                        false => Effect::LoadItems(Need::All { map }),
                    };
                    if !self.tr.effects.contains(&need) {
                        self.tr.effects.push(need);
                    }
                    return;
                }
                let entry = |t: &Task| collected_entry(t.state, t.output.clone(), t.error.as_deref(), share);
                Value::Array(items.values().map(|&at| entry(&self.run.tasks[at])).collect())
            }
        };
        match storable::check(&output, "output", self.run.max_payload) {
            Ok(()) => self.finish(m, TaskState::Completed, Some(output), None),
            Err(e) => self.finish(m, TaskState::Failed, None, Some(Failure::fatal(codes::PAYLOAD, e))),
        }
    }

    /// An item ended: a MAP with a reduction applies it to the item (its
    /// failure fails the MAP at its next look).
    pub(super) fn reduce_item(&mut self, t: usize) {
        let Some(item) = self.run.tasks[t].item else { return };
        let Some(m) = self.map_task(item.map) else { return };
        let Collect::Reduce { init, with } = &self.map_config(m).collect else { return };
        let task = &self.run.tasks[t];
        let acc = self.run.tasks[m].output.clone().unwrap_or_else(|| init.clone());
        let ctx = json!({"acc": acc, "item": {"index": item.index, "state": task.state, "output": task.output,
                                             "error": task.error}});
        let max = self.run.max_payload;
        match with.eval(self.sb, &ctx).and_then(|v| storable::check(&v, "collect.reduce", max).map(|()| v)) {
            Ok(acc) => self.run.tasks[m].output = Some(acc),
            Err(e) => {
                let failure =
                    Failure::fatal(codes::of_evaluation(&e), format!("collect.reduce at item {}: {e}", item.index));
                self.maps.broken.entry(m).or_insert(failure);
            }
        }
        self.tr.touch(m);
        if !self.maps.dirty.contains(&m) {
            self.maps.dirty.push(m);
        }
    }

    /// The MAP fails: naming its first failed item (or `why`); no more items
    /// start, and the open ones are cancelled.
    pub(super) fn fail_map(&mut self, m: usize, why: Option<Failure>) {
        let items = self.items_of(m);
        let failure = why.unwrap_or_else(|| {
            let first = items.iter().find(|(_, &at)| self.run.tasks[at].state == TaskState::Failed);
            let p = self.run.tasks[m].progress.unwrap_or_default();
            let error = match first {
                Some((index, &at)) if p.failed <= 1 => {
                    format!("item {index} failed: {}", self.run.tasks[at].error.as_deref().unwrap_or("unknown error"))
                }
                Some((index, &at)) => format!(
                    "{} of {} items failed, more than it tolerates; item {index}: {}",
                    p.failed,
                    p.total,
                    self.run.tasks[at].error.as_deref().unwrap_or("unknown error")
                ),
                None => "an item failed".to_string(),
            };
            Failure::fatal(codes::ITEM_FAILED, error)
        });
        self.finish(m, TaskState::Failed, None, Some(failure));
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
        if p.total == 0 || items.len() < p.created() as usize {
            self.restart_map_afresh(m);
            return;
        }
        let progress = self.requeue_unfinished(&items, p);
        self.maps.queued = None;
        // A reduction starts again from the items that keep their outputs;
        // one that fails now fails the MAP at its look below.
        let acc = match self.reduce_again(m) {
            Some(Err(failure)) => {
                self.maps.broken.entry(m).or_insert(failure);
                None
            }
            Some(Ok(acc)) => Some(acc),
            None => None,
        };
        let task = &mut self.run.tasks[m];
        task.output = acc;
        task.state = TaskState::Running;
        task.begin_next_attempt();
        task.progress = Some(progress);
        self.tr.touch(m);
        let payload = self.task_payload(m, json!({"items": p.total, "retrying": progress.queued}));
        self.tr.log(HistoryKind::MapStarted, payload);
        self.advance(m);
    }

    /// A MAP that failed before it had items (or whose items are not all
    /// loaded) starts again from its list, as a new attempt.
    fn restart_map_afresh(&mut self, m: usize) {
        let task = &mut self.run.tasks[m];
        task.progress = None;
        task.begin_next_attempt();
        self.tr.touch(m);
        let mut ctx = None;
        self.start(m, &mut ctx);
    }

    /// Every item of `items` that did not complete is QUEUED again at a new
    /// attempt; the MAP's counts from `was`: the completed ones, and the
    /// items not created yet still to come.
    fn requeue_unfinished(&mut self, items: &BTreeMap<u32, usize>, was: MapProgress) -> MapProgress {
        let mut progress = MapProgress {
            total: was.total,
            queued: was.total - was.created(),
            created: was.created,
            ..MapProgress::default()
        };
        for &at in items.values() {
            let item = &mut self.run.tasks[at];
            if item.state == TaskState::Completed {
                progress.completed += 1;
                continue;
            }
            item.state = TaskState::Queued;
            item.begin_next_attempt();
            renew_idempotency_key(item);
            item.output = None;
            item.wake_at = None;
            progress.queued += 1;
            self.tr.touch(at);
        }
        progress
    }

    /// A reduction's accumulator over the completed items of MAP `m`, in
    /// item order (`None` when the MAP does not reduce), or the failure of
    /// the first item it failed at.
    fn reduce_again(&self, m: usize) -> Option<Result<Value, Failure>> {
        let Collect::Reduce { init, with } = &self.map_config(m).collect else { return None };
        let mut acc = Ok(init.clone());
        for &at in self.items_of(m).values() {
            let t = &self.run.tasks[at];
            let Ok(so_far) = &acc else { break };
            if t.state != TaskState::Completed {
                continue;
            }
            let index = t.item.map_or(0, |i| i.index);
            let ctx = json!({"acc": so_far, "item": {"index": index, "state": t.state, "output": t.output,
                                                    "error": null}});
            let max = self.run.max_payload;
            acc = with
                .eval(self.sb, &ctx)
                .and_then(|v| storable::check(&v, "collect.reduce", max).map(|()| v))
                .map_err(|e| Failure::fatal(codes::of_evaluation(&e), format!("collect.reduce at item {index}: {e}")));
        }
        Some(acc)
    }
}

impl Machine<'_> {
    /// Hands storage the lists of the MAPs this event started that still
    /// have items to create: the chunks from the first one not created.
    pub(super) fn keep_sources(&mut self) {
        for (m, list) in std::mem::take(&mut self.maps.fresh) {
            let task = &self.run.tasks[m];
            let Some(p) = task.progress.filter(|p| p.created() < p.total && !task.state.is_terminal()) else {
                continue;
            };
            let first = p.created() / ITEM_CHUNK;
            let rest = list.into_iter().skip((first * ITEM_CHUNK) as usize).collect();
            self.tr.sources.push((m, first, rest));
        }
    }
}

/// Items created at once from a MAP's list (and the size of its chunks in
/// storage). Small under test, so that the unit and property tests, whose
/// MAPs are small, go through every path a large MAP takes.
#[cfg(not(test))]
pub const ITEM_CHUNK: u32 = 1_000;
#[cfg(test)]
pub const ITEM_CHUNK: u32 = 3;

/// Most items one event creates; a MAP that could start more carries on in
/// a transaction of its own after the commit.
#[cfg(not(test))]
pub const ITEMS_PER_EVENT: u32 = 10_000;
#[cfg(test)]
pub const ITEMS_PER_EVENT: u32 = 7;

/// Room a MAP's collected output leaves in the payload limit for what holds
/// it (the run's output, with its other nodes' and their keys): a tenth of
/// the limit, at most 64 KiB (so that a 1 GiB limit shares 1,072 bytes
/// with each of 1,000,000 items).
fn collected_room(max_payload: usize) -> usize {
    (max_payload / 10).min(64 * 1024)
}

/// The bytes one item may add to a MAP's collected output of `total` items:
/// `total` outputs of that many bytes, their commas and brackets, and the
/// room left, make the payload limit.
fn collected_share(max_payload: usize, total: u32) -> usize {
    let for_items = max_payload.saturating_sub(collected_room(max_payload)).saturating_sub(2);
    (for_items / total.max(1) as usize).saturating_sub(1)
}

/// An ended item's entry in its MAP's collected output (`collect: "all"`):
/// a completed item's output, else `{"error": …}` (its error, or
/// `"cancelled"`) cut to the item's `share`.
pub fn collected_entry(state: TaskState, output: Option<Value>, error: Option<&str>, share: usize) -> Value {
    match state {
        TaskState::Completed => output.unwrap_or(Value::Null),
        _ => failed_entry(error.unwrap_or("cancelled"), share),
    }
}

/// A failed item's entry in its MAP's collected output, `{"error": …}` with
/// the error cut so that the entry is no more than `share` bytes as JSON
/// (at least its first 8 characters).
fn failed_entry(error: &str, share: usize) -> Value {
    const WRAPPER: usize = r#"{"error":""}"#.len();
    let mut room = share.saturating_sub(WRAPPER);
    let mut end = 0;
    for (n, (at, c)) in error.char_indices().enumerate() {
        let escaped = match c {
            '"' | '\\' | '\n' | '\r' | '\t' | '\u{8}' | '\u{c}' => 2,
            c if (c as u32) < 0x20 => 6,
            c => c.len_utf8(),
        };
        if escaped > room && n >= 8 {
            break;
        }
        room = room.saturating_sub(escaped);
        end = at + c.len_utf8();
    }
    json!({"error": &error[..end]})
}

/// The items of MAP task `m` in all.
fn values_total(machine: &Machine<'_>, m: usize) -> u32 {
    machine.run.tasks[m].progress.map_or(0, |p| p.total)
}

/// The failure of an item whose output is over its `share` of its MAP's
/// collected output, if it is.
fn over(output: &Value, share: usize, total: u32) -> Option<Failure> {
    let size = serde_json::to_vec(output).map_or(usize::MAX, |v| v.len());
    (size > share).then(|| {
        Failure::fatal(
            codes::PAYLOAD,
            format!(
                "output of {size} bytes is over this item's share of its MAP's collected output ({share} bytes: \
                 the payload limit over {total} items); use collect: \"none\" or a reduction"
            ),
        )
    })
}

/// The list `items` evaluated to.
fn items(v: Value) -> Result<Vec<Value>, String> {
    match v {
        Value::Array(items) if items.len() > MAP_MAX_ITEMS => {
            Err(format!("{} items, more than map_max_items ({MAP_MAX_ITEMS})", items.len()))
        }
        Value::Array(items) => Ok(items),
        other => Err(format!("must be a list, got {}", kind_of(&other))),
    }
}

fn kind_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_gigabyte_shares_a_kibibyte_with_each_of_a_million_items() {
        let gib = 1024 * 1024 * 1024;
        assert_eq!(collected_share(gib, 1_000_000), 1072);
        assert!(collected_share(gib, 1_000_000) >= 1024);
        // 100 items of a 16 KiB limit: the tenth kept is 1,638 bytes.
        assert_eq!(collected_share(16 * 1024, 100), 146);
    }

    proptest! {
        /// Every item at its share, with its commas, the brackets and the
        /// room kept, is within the limit.
        #[test]
        fn items_at_their_share_fit_the_limit(max in 1024usize..(2 << 30), total in 1u32..=1_000_000) {
            let share = collected_share(max, total);
            prop_assume!(share > 0);
            let t = total as usize;
            prop_assert!(t * share + (t - 1) + 2 + collected_room(max) <= max);
        }

        /// A failed item's entry is within its share, or is its error's
        /// first 8 characters, whatever the error holds.
        #[test]
        fn a_failed_entry_is_within_its_share(error in "\\PC{0,300}|[\\x00-\\x1f\"\\\\é€😀]{0,300}", share in 0usize..400) {
            let entry = failed_entry(&error, share);
            let len = serde_json::to_vec(&entry).unwrap().len();
            let kept = entry["error"].as_str().unwrap();
            prop_assert!(error.starts_with(kept));
            prop_assert!(len <= share || kept.chars().count() <= 8, "{len} bytes over {share}: {entry}");
            if len <= share && kept.len() < error.len() {
                // Cut no shorter than it had to be: the next character would not fit.
                let next = error[kept.len()..].chars().next().unwrap();
                let longer = failed_entry(&format!("{kept}{next}"), usize::MAX);
                prop_assert!(serde_json::to_vec(&longer).unwrap().len() > share || kept.chars().count() < 8);
            }
        }
    }

    #[test]
    fn a_list_of_more_than_map_max_items_is_refused_by_count() {
        let at_most = Value::Array(vec![Value::Null; MAP_MAX_ITEMS]);
        assert_eq!(items(at_most).map(|v| v.len()), Ok(MAP_MAX_ITEMS));
        let over = Value::Array(vec![Value::Null; MAP_MAX_ITEMS + 1]);
        assert_eq!(items(over).unwrap_err(), "1000001 items, more than map_max_items (1000000)");
        assert_eq!(items(Value::from("x")).unwrap_err(), "must be a list, got a string");
    }
}
