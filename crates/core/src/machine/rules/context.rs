//! What the rules read: whether a run loaded in part holds a node's task
//! (naming the ones it lacks), and the context a node's expressions see.

use serde_json::Value;

use crate::expr::Scope;
use crate::machine::scope_of;
use crate::machine::state::Machine;
use crate::machine::task::Task;
use crate::storable::is_reference;

impl Machine<'_> {
    /// Whether node `n`'s task, or that it has none, is loaded ([`Run::known`]).
    ///
    /// [`Run::known`]: crate::machine::run::Run::known
    pub(super) fn known(&self, n: usize) -> bool {
        self.run.known.as_ref().is_none_or(|k| k.get(n).copied().unwrap_or(true))
    }

    /// Names in `tr.missing` the nodes of `nodes` whose tasks are not
    /// loaded; whether all are.
    pub(super) fn require(&mut self, nodes: impl IntoIterator<Item = usize>) -> bool {
        let mut all = true;
        for n in nodes {
            if !self.known(n) {
                all = false;
                if !self.tr.missing.contains(&n) {
                    self.tr.missing.push(n);
                }
            }
        }
        all
    }

    /// [`Self::require`] for the nodes `node`'s expressions read (every node
    /// when that cannot be known).
    pub(in crate::machine) fn require_reads(&mut self, node: usize) -> bool {
        if self.run.known.is_none() {
            return true;
        }
        let wf = self.wf;
        match &wf.nodes[node].reads {
            Some(reads) => self.require(reads.iter().copied()),
            None => self.require(wf.topo_order.iter().copied()),
        }
    }

    /// What `node`'s expressions see, converted for jaq: the context with
    /// just the nodes they read (all nodes when that cannot be known), and
    /// the run's input only when they may read it.
    pub(in crate::machine) fn scope(&self, node: usize) -> Scope {
        let input = self.wf.nodes[node].reads_input;
        match &self.wf.nodes[node].reads {
            Some(reads) => {
                let tasks = || {
                    reads
                        .iter()
                        .filter_map(|&n| self.run.tasks.iter().find(|t| t.node == n && t.item.is_none() && !t.removed))
                };
                self.note_unread(input, tasks());
                scope_of(self.wf, self.run, tasks(), input, &self.read_left)
            }
            None => {
                self.note_unread(input, self.run.tasks.iter());
                scope_of(self.wf, self.run, self.run.tasks.iter(), input, &self.read_left)
            }
        }
    }

    /// The scope MAP `m`'s items are evaluated in: the MAP's, built (and
    /// charged) once an event, whatever the chunks and restarts of its items.
    pub(in crate::machine) fn items_scope(&mut self, m: usize) -> Scope {
        if let Some(scope) = self.maps.item_scopes.get(&m) {
            return scope.clone();
        }
        let scope = self.scope(self.run.tasks[m].node);
        self.maps.item_scopes.insert(m, scope.clone());
        scope
    }

    /// What the run's output template sees: every node and the input
    /// (`{input, nodes: {<id>: {output, state}}, run}`), converted in place.
    pub(super) fn scope_all(&self) -> Scope {
        self.note_unread(true, self.run.tasks.iter());
        scope_of(self.wf, self.run, self.run.tasks.iter(), true, &self.read_left)
    }

    /// The run's input, for an evaluation that builds its own context (a
    /// LOOP's `until`): noted ([`Machine::note_unread`]) if it is left unread.
    pub(super) fn input(&self) -> &Value {
        self.note_unread(true, std::iter::empty());
        &self.run.input
    }

    /// Notes ([`Machine::unread`]) whether any of the values an evaluation
    /// reads — the run's input (with `input`), the outputs of `tasks` — is
    /// one its run left unread ([`Run::unread`]).
    ///
    /// [`Run::unread`]: crate::machine::run::Run::unread
    pub(super) fn note_unread<'t>(&self, input: bool, tasks: impl Iterator<Item = &'t Task>) {
        if !self.run.unread {
            return;
        }
        let mut values = tasks.filter(|t| t.item.is_none() && !t.removed).filter_map(|t| t.output.as_ref());
        if (input && is_reference(&self.run.input)) || values.any(is_reference) {
            self.unread.set(true);
        }
    }
}
