//! Moving an open run to another version of its workflow.
//!
//! [`plan`] decides from the two definitions and the run's steps whether
//! the run can move, and says what would change: every step it has
//! (started, waiting or ended) goes to a step of the new version (of the
//! same id, or the one the mapping names), of the same type, whose
//! predecessors in the new version have all ended in the run — so no step
//! that has started would have had to wait for one that has not run, and
//! nothing ended runs again. [`move_run`] renames the run's steps to the
//! new version's nodes; the engine then applies [`Event::Migrate`] under
//! the new version, which records the move and starts what the new
//! version readies (a step added after one that has ended).
//!
//! [`Event::Migrate`]: crate::machine::Event::Migrate

use std::collections::{BTreeMap, HashMap};

use serde::{Deserialize, Serialize};

use crate::definition::{NodeKind, Workflow};
use crate::machine::{Run, TaskState};

/// Old node id → new node id; a step whose node it does not name keeps its id.
pub type Mapping = BTreeMap<String, String>;

/// Whether a run can move, and what would change.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Plan {
    /// Why the run cannot move; empty when it can.
    pub reasons: Vec<String>,
    /// Each step the run has, with the new version's step it becomes.
    pub steps: Vec<StepMove>,
    /// The new version's steps the run has not reached and the old version
    /// lacks: they run when the run reaches them.
    pub added: Vec<String>,
    /// The old version's steps the run has not reached and the new version
    /// lacks (none maps to them): they will not run.
    pub dropped: Vec<String>,
}

impl Plan {
    pub fn movable(&self) -> bool {
        self.reasons.is_empty()
    }
}

/// One step of the run, and the step of the new version it becomes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct StepMove {
    pub from: String,
    /// `None` when the new version has no step for it (the run cannot move).
    pub to: Option<String>,
    pub state: TaskState,
}

/// Whether `run` (on `old`) can move to `new` under `map`, and what would
/// change. Only the run's own steps are looked at (a MAP's items go with
/// their MAP; a child run keeps its own version).
pub fn plan(old: &Workflow, new: &Workflow, run: &Run, map: &Mapping) -> Plan {
    let mut p = Plan::default();
    if run.status.is_terminal() {
        p.reasons.push(format!("the run is {}: only an open run moves", run.status));
    }
    for (from, to) in map {
        if old.node_index(from).is_none_or(|n| old.nodes[n].item_of.is_some()) {
            p.reasons.push(format!("the mapping names `{from}`, which the run's version has no step of"));
        }
        if new.node_index(to).is_none_or(|n| new.nodes[n].item_of.is_some()) {
            p.reasons.push(format!("the mapping names `{to}`, which the new version has no step of"));
        }
    }
    if let Some(schema) = &new.input_schema {
        if let Err(e) = schema.check(&run.input) {
            p.reasons.push(format!("the run's input does not fit the new version's input_schema: {e}"));
        }
    }
    let steps: Vec<(usize, TaskState)> =
        run.tasks.iter().filter(|t| t.item.is_none() && !t.removed).map(|t| (t.node, t.state)).collect();
    let mut taken: HashMap<usize, &str> = HashMap::new();
    let mut target: Vec<Option<usize>> = vec![None; old.nodes.len()];
    for &(node, state) in &steps {
        let from = old.nodes[node].id.as_str();
        let to = map.get(from).map_or(from, String::as_str);
        let found = new.node_index(to).filter(|&n| new.nodes[n].item_of.is_none());
        p.steps.push(StepMove { from: from.to_string(), to: found.map(|_| to.to_string()), state });
        let Some(n) = found else {
            p.reasons.push(format!("step `{from}` is {state} and the new version has no step `{to}`: map it to one"));
            continue;
        };
        if let Some(other) = taken.insert(n, from) {
            p.reasons.push(format!("steps `{other}` and `{from}` would both become `{to}`"));
        }
        if let Some(why) = incompatible(old, node, new, n) {
            p.reasons.push(format!("step `{from}` is {state}, and {why}"));
        }
        target[node] = Some(n);
    }
    // What a step that has started read must have ended in the new version too.
    let ended: Vec<bool> = {
        let mut ended = vec![false; new.nodes.len()];
        for &(node, state) in &steps {
            if let (Some(n), true) = (target[node], state.is_terminal()) {
                ended[n] = true;
            }
        }
        ended
    };
    for &(node, state) in &steps {
        let Some(n) = target[node] else { continue };
        for &e in &new.incoming[n] {
            let pred = new.edges[e].from;
            if !ended[pred] {
                p.reasons.push(format!(
                    "step `{}` is {state}, and the new version puts `{}` before it, which has not ended in this run",
                    old.nodes[node].id, new.nodes[pred].id
                ));
            }
        }
    }
    let reached: Vec<bool> = {
        let mut reached = vec![false; new.nodes.len()];
        target.iter().flatten().for_each(|&n| reached[n] = true);
        reached
    };
    let mapped_to: Vec<&str> = map.values().map(String::as_str).collect();
    for n in new.nodes.iter().filter(|n| n.item_of.is_none()) {
        let i = new.node_index(&n.id).unwrap_or(usize::MAX);
        if !reached.get(i).copied().unwrap_or(true)
            && old.node_index(&n.id).is_none()
            && !mapped_to.contains(&n.id.as_str())
        {
            p.added.push(n.id.clone());
        }
    }
    for (i, n) in old.nodes.iter().enumerate().filter(|(_, n)| n.item_of.is_none()) {
        let to = map.get(&n.id).unwrap_or(&n.id);
        if target[i].is_none() && new.node_index(to).is_none() {
            p.dropped.push(n.id.clone());
        }
    }
    p
}

/// Why old node `o` cannot become new node `n`: another type, or a MAP
/// whose items are of another type.
fn incompatible(old: &Workflow, o: usize, new: &Workflow, n: usize) -> Option<String> {
    let (a, b) = (&old.nodes[o], &new.nodes[n]);
    if a.node_type != b.node_type {
        return Some(format!("the new version's `{}` is a {} step, not a {}", b.id, b.node_type, a.node_type));
    }
    if let (NodeKind::Map(x), NodeKind::Map(y)) = (&a.kind, &b.kind) {
        let (x, y) = (&old.nodes[x.template].node_type, &new.nodes[y.template].node_type);
        if x != y {
            return Some(format!("the new version's `{}` maps {y} items, not {x}", b.id));
        }
    }
    None
}

/// Renames `run`'s steps (and the MAP items it holds) to `new`'s nodes when
/// [`plan`] says it can move; returns the renamed nodes' ids (old → new,
/// those that differ) for storage. Nothing is changed when it cannot.
pub fn move_run(old: &Workflow, new: &Workflow, run: &mut Run, map: &Mapping) -> Result<Vec<(String, String)>, Plan> {
    let plan = plan(old, new, run, map);
    if !plan.movable() {
        return Err(plan);
    }
    let index = |id: &str| new.node_index(map.get(id).map_or(id, String::as_str));
    let mut renamed = Vec::new();
    for t in run.tasks.iter_mut().filter(|t| !t.removed) {
        let node = &old.nodes[t.node];
        t.node = match node.item_of {
            None => index(&node.id).ok_or_else(|| plan.clone())?,
            Some(m) => match &new.nodes[index(&old.nodes[m].id).ok_or_else(|| plan.clone())?].kind {
                NodeKind::Map(x) => x.template,
                _ => return Err(plan),
            },
        };
    }
    for s in &plan.steps {
        match &s.to {
            Some(to) if *to != s.from => renamed.push((s.from.clone(), to.clone())),
            _ => {}
        }
    }
    Ok(renamed)
}

#[cfg(test)]
mod tests {
    use chrono::Utc;
    use proptest::prelude::*;
    use serde_json::{json, Value};
    use uuid::Uuid;

    use super::*;
    use crate::machine::{apply, Event, HistoryKind, RunStatus, Transition};

    /// A workflow of HTTP nodes (`id` or `id:TYPE`) and edges.
    fn wf(nodes: &[&str], edges: &[(&str, &str)]) -> Workflow {
        let nodes: Vec<Value> = nodes
            .iter()
            .map(|n| match n.split_once(':') {
                Some((id, "TRANSFORM")) => json!({"id": id, "type": "TRANSFORM", "config": {"output": 1}}),
                Some((id, t)) => json!({"id": id, "type": t}),
                None => json!({"id": n, "type": "HTTP", "config": {"url": format!("http://h/{n}")}}),
            })
            .collect();
        let edges: Vec<Value> = edges.iter().map(|(f, t)| json!({"from": f, "to": t})).collect();
        Workflow::parse(&json!({"name": "t", "nodes": nodes, "edges": edges})).unwrap()
    }

    struct Sim {
        wf: Workflow,
        run: Run,
        next: u128,
    }

    impl Sim {
        fn new(wf: Workflow) -> Sim {
            let mut s = Sim { wf, run: Run::new(Uuid::from_u128(1), json!({})), next: 100 };
            s.apply(Event::RunStarted);
            s
        }

        fn apply(&mut self, e: Event) -> Transition {
            let next = &mut self.next;
            let mut ids = || {
                *next += 1;
                Uuid::from_u128(*next)
            };
            apply(&crate::expr::Sandbox::for_tests(), &self.wf, &mut self.run, e, Utc::now(), &mut ids)
        }

        fn state(&self, node: &str) -> Option<TaskState> {
            let n = self.wf.node_index(node)?;
            self.run.tasks.iter().find(|t| t.node == n && !t.removed).map(|t| t.state)
        }

        fn complete(&mut self, node: &str) {
            let n = self.wf.node_index(node).unwrap();
            let t = self.run.tasks.iter().find(|t| t.node == n && !t.removed).unwrap();
            let (task_id, attempt) = (t.id, t.attempt);
            let tr = self.apply(Event::TaskCompleted { task_id, attempt, output: json!({"node": node}) });
            assert!(tr.ignored.is_none(), "{node}: {:?}", tr.ignored);
        }

        /// Moves the run to `new` under `map`, as the engine does.
        fn migrate(&mut self, new: Workflow, map: &[(&str, &str)]) -> Result<Transition, Plan> {
            let map: Mapping = map.iter().map(|(a, b)| (a.to_string(), b.to_string())).collect();
            move_run(&self.wf, &new, &mut self.run, &map)?;
            self.wf = new;
            Ok(self.apply(Event::Migrate { definition: Uuid::nil(), from_version: 1, to_version: 2, map }))
        }
    }

    #[test]
    fn a_step_added_after_the_running_one_runs_when_reached_and_the_move_is_recorded() {
        let mut s = Sim::new(wf(&["a", "b"], &[("a", "b")]));
        s.complete("a");
        let new = wf(&["a", "b", "c"], &[("a", "b"), ("b", "c")]);
        let p = plan(&s.wf, &new, &s.run, &Mapping::new());
        assert!(p.movable(), "{p:?}");
        assert_eq!(p.added, ["c"]);
        let tr = s.migrate(new, &[]).unwrap();
        assert_eq!(tr.history[0].kind, HistoryKind::RunMigrated);
        assert_eq!(tr.history[0].payload["to_version"], 2);
        assert_eq!(
            (s.state("a"), s.state("b"), s.state("c")),
            (Some(TaskState::Completed), Some(TaskState::Pending), None)
        );
        s.complete("b");
        assert_eq!(s.state("c"), Some(TaskState::Pending), "the new step starts once b ends");
        s.complete("c");
        assert_eq!(s.run.status, RunStatus::Succeeded);
    }

    #[test]
    fn a_new_step_whose_predecessors_ended_starts_at_the_move() {
        let mut s = Sim::new(wf(&["a", "b"], &[("a", "b")]));
        s.complete("a");
        let tr = s.migrate(wf(&["a", "b", "audit"], &[("a", "b"), ("a", "audit")]), &[]).unwrap();
        assert_eq!(s.state("audit"), Some(TaskState::Pending));
        assert_eq!(tr.dispatch.len(), 1, "the new step is sent: {tr:?}");
    }

    #[test]
    fn a_step_that_would_have_waited_for_one_not_run_refuses_the_move_and_changes_nothing() {
        let mut s = Sim::new(wf(&["a", "b"], &[("a", "b")]));
        s.complete("a");
        let before = s.run.clone();
        let new = wf(&["a", "check", "b"], &[("a", "check"), ("check", "b")]);
        let refused = s.migrate(new, &[]).unwrap_err();
        assert!(refused.reasons[0].contains("puts `check` before it"), "{refused:?}");
        assert_eq!(s.run, before);
    }

    #[test]
    fn a_step_the_new_version_lacks_refuses_until_the_map_names_its_step() {
        let mut s = Sim::new(wf(&["a", "b"], &[("a", "b")]));
        s.complete("a");
        let new = || wf(&["charge", "b"], &[("charge", "b")]);
        let refused = plan(&s.wf, &new(), &s.run, &Mapping::new());
        assert!(refused.reasons[0].contains("no step `a`: map it"), "{refused:?}");
        let mut map = Mapping::new();
        map.insert("a".into(), "charge".into());
        assert_eq!(move_run(&s.wf, &new(), &mut s.run.clone(), &map), Ok(vec![("a".into(), "charge".into())]));
        s.migrate(new(), &[("a", "charge")]).unwrap();
        assert_eq!(s.state("charge"), Some(TaskState::Completed));
        s.complete("b");
        assert_eq!(s.run.status, RunStatus::Succeeded);
    }

    #[test]
    fn refusals_name_each_reason() {
        let mut s = Sim::new(wf(&["a", "b"], &[("a", "b")]));
        s.complete("a");
        let typed = plan(&s.wf, &wf(&["a", "b:resize"], &[("a", "b")]), &s.run, &Mapping::new());
        assert!(typed.reasons[0].contains("is a resize step, not a HTTP"), "{typed:?}");
        let two: Mapping = [("a".to_string(), "b".to_string())].into();
        let both = plan(&s.wf, &wf(&["b", "c"], &[("b", "c")]), &s.run, &two);
        assert!(both.reasons.iter().any(|r| r.contains("would both become `b`")), "{both:?}");
        let unknown: Mapping = [("zz".to_string(), "a".to_string())].into();
        let named = plan(&s.wf, &s.wf, &s.run, &unknown);
        assert!(named.reasons[0].contains("`zz`"), "{named:?}");
        s.complete("b");
        let ended = plan(&s.wf, &s.wf, &s.run, &Mapping::new());
        assert!(ended.reasons[0].contains("only an open run moves"), "{ended:?}");
    }

    #[test]
    fn a_move_is_undone_by_moving_back() {
        let v1 = || wf(&["a", "b", "c"], &[("a", "b"), ("b", "c")]);
        let v2 = || wf(&["a2", "b", "c"], &[("a2", "b"), ("b", "c")]);
        let mut s = Sim::new(v1());
        s.complete("a");
        let before: Vec<(usize, TaskState)> = s.run.tasks.iter().map(|t| (t.node, t.state)).collect();
        s.migrate(v2(), &[("a", "a2")]).unwrap();
        s.migrate(v1(), &[("a2", "a")]).unwrap();
        let after: Vec<(usize, TaskState)> = s.run.tasks.iter().map(|t| (t.node, t.state)).collect();
        assert_eq!(before, after);
        s.complete("b");
        s.complete("c");
        assert_eq!(s.run.status, RunStatus::Succeeded);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]

        /// A chain of n steps run up to step k; the new version inserts a
        /// step before step `at`. The run can move exactly when it has not
        /// reached step `at`, and a moved run finishes with every step of
        /// the new version run once and no ended step run again.
        #[test]
        fn a_run_moves_exactly_when_no_step_it_reached_would_wait_for_the_new_one(
            n in 2usize..7, k in 0usize..7, at in 1usize..7,
        ) {
            let (k, at) = (k.min(n - 1), at.min(n - 1));
            let ids: Vec<String> = (0..n).map(|i| format!("s{i}")).collect();
            let chain = |ids: &[String]| {
                let refs: Vec<&str> = ids.iter().map(String::as_str).collect();
                let edges: Vec<(&str, &str)> = refs.windows(2).map(|w| (w[0], w[1])).collect();
                wf(&refs, &edges)
            };
            let mut s = Sim::new(chain(&ids));
            for id in &ids[..k] {
                s.complete(id);
            }
            let mut new_ids = ids.clone();
            new_ids.insert(at, "new".to_string());
            let reached = at <= k;
            match s.migrate(chain(&new_ids), &[]) {
                Ok(_) => {
                    prop_assert!(!reached, "moved though step {at} had started");
                    for id in &new_ids {
                        if s.state(id) != Some(TaskState::Completed) {
                            s.complete(id);
                        }
                    }
                    prop_assert_eq!(s.run.status, RunStatus::Succeeded);
                    prop_assert!(s.run.tasks.iter().all(|t| t.attempt == 1 && !t.removed));
                    prop_assert_eq!(s.run.tasks.len(), n + 1);
                }
                Err(p) => prop_assert!(reached, "refused: {:?}", p.reasons),
            }
        }
    }
}
