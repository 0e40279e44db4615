//! A small explicit-state model checker, generic over a [`Model`]: a
//! breadth-first search over every state the model can reach from its
//! initial states, checking each state's invariants and each step's
//! properties on the way, and after the search a progress check over the
//! graph it recorded (from every state, a path without faults to a goal).
//!
//! Breadth first, so the first violation found has a shortest trace. States
//! are kept once (a hash set of values, with their index); each remembers
//! the state and action it was first reached by, which is the trace.

use std::collections::HashMap;
use std::fmt;
use std::hash::{BuildHasherDefault, Hash, Hasher};

/// What a model gives the checker: its states and actions, the properties
/// each state and step must have, and which actions the system takes on
/// its own (not a fault, not an operator) for the progress check.
pub trait Model {
    type State: Clone + Eq + Hash;
    type Action: Clone + fmt::Display;
    type Property: Copy + Eq + fmt::Debug;

    fn initial(&self) -> Vec<Self::State>;
    /// Every action enabled in `s`, with the state it leads to.
    fn successors(&self, s: &Self::State, out: &mut Vec<(Self::Action, Self::State)>);
    /// A property every reachable state must have.
    fn invariant(&self, s: &Self::State) -> Result<(), Broken<Self::Property>>;
    /// A property of one step (what an action may change).
    fn step(&self, before: &Self::State, a: &Self::Action, after: &Self::State) -> Result<(), Broken<Self::Property>>;
    /// Whether the system takes this step on its own (no fault, no
    /// operator): the progress check's paths take only those.
    fn on_its_own(&self, a: &Self::Action) -> bool;
    /// Where every run must be able to get to on its own.
    fn is_goal(&self, s: &Self::State) -> bool;
    /// The property a state that cannot reach a goal breaks.
    fn progress(&self) -> Self::Property;
    /// One state, for a person reading a trace.
    fn describe(&self, s: &Self::State) -> String;
    /// The one state that stands for all those a symmetry of the model
    /// makes equivalent (actors renamed): the search keeps only it.
    fn canonical(&self, s: Self::State) -> Self::State {
        s
    }
}

/// A property broken, and how.
#[derive(Debug, Clone)]
pub struct Broken<P> {
    pub property: P,
    pub why: String,
}

/// How far a search may go before it gives up (and says so).
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub max_states: usize,
    pub max_depth: usize,
}

/// What a search found.
pub struct Report<M: Model> {
    /// Distinct states reached.
    pub states: usize,
    /// Steps taken (edges of the graph, duplicates included).
    pub steps: usize,
    /// The longest shortest path from an initial state, in steps.
    pub depth: usize,
    /// False when a limit stopped the search: then nothing was proved.
    pub exhaustive: bool,
    pub violation: Option<Violation<M>>,
}

/// A broken property and the shortest way there.
pub struct Violation<M: Model> {
    pub property: M::Property,
    pub why: String,
    pub initial: M::State,
    /// Each action and the state it led to.
    pub trace: Vec<(M::Action, M::State)>,
}

/// FxHash's mixing: the states are small and hashed often, and std's
/// SipHash took most of the search's time in a debug build.
#[derive(Default, Clone, Copy)]
pub struct Fx(u64);

impl Fx {
    fn add(&mut self, word: u64) {
        self.0 = (self.0.rotate_left(5) ^ word).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
}

impl Hasher for Fx {
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            self.add(u64::from_le_bytes(word));
        }
    }
    fn write_u8(&mut self, n: u8) {
        self.add(u64::from(n));
    }
    fn write_u16(&mut self, n: u16) {
        self.add(u64::from(n));
    }
    fn write_u32(&mut self, n: u32) {
        self.add(u64::from(n));
    }
    fn write_u64(&mut self, n: u64) {
        self.add(n);
    }
    fn write_usize(&mut self, n: usize) {
        self.add(n as u64);
    }
    fn finish(&self) -> u64 {
        self.0
    }
}

pub type FxMap<K, V> = HashMap<K, V, BuildHasherDefault<Fx>>;

/// No parent: an initial state.
const ROOT: u32 = u32::MAX;

/// The search's memory: every state once, how it was first reached, and
/// the fault-free edges for the progress check.
struct Graph<M: Model> {
    states: Vec<M::State>,
    index: FxMap<M::State, u32>,
    parent: Vec<(u32, Option<M::Action>)>,
    /// (to, from) of every step the system takes on its own.
    calm: Vec<(u32, u32)>,
}

impl<M: Model> Graph<M> {
    /// The state's index, and whether it is new.
    fn add(&mut self, s: M::State, parent: u32, a: Option<M::Action>) -> (u32, bool) {
        if let Some(&i) = self.index.get(&s) {
            return (i, false);
        }
        let i = u32::try_from(self.states.len()).expect("fewer than 2^32 states");
        self.index.insert(s.clone(), i);
        self.states.push(s);
        self.parent.push((parent, a));
        (i, true)
    }

    /// The shortest trace to state `i` (as first reached), and `last` after it.
    fn violation(&self, i: u32, last: Option<(M::Action, M::State)>, broken: Broken<M::Property>) -> Violation<M> {
        let mut trace = Vec::new();
        let mut at = i;
        while self.parent[at as usize].0 != ROOT {
            let (p, a) = &self.parent[at as usize];
            trace.push((a.clone().expect("a reached state has its action"), self.states[at as usize].clone()));
            at = *p;
        }
        trace.reverse();
        trace.extend(last);
        let initial = self.states[at as usize].clone();
        Violation { property: broken.property, why: broken.why, initial, trace }
    }
}

/// Explores every state `m` can reach (within `limits`), checking its
/// properties; then, if none broke and the search was exhaustive, checks
/// progress.
pub fn check<M: Model>(m: &M, limits: Limits) -> Report<M> {
    check_visiting(m, limits, |_| {})
}

/// [`check`], showing `visit` each state the first time it is reached.
pub fn check_visiting<M: Model>(m: &M, limits: Limits, mut visit: impl FnMut(&M::State)) -> Report<M> {
    let mut g = Graph::<M> { states: Vec::new(), index: FxMap::default(), parent: Vec::new(), calm: Vec::new() };
    let mut report = Report { states: 0, steps: 0, depth: 0, exhaustive: true, violation: None };
    for s in m.initial() {
        let (i, new) = g.add(m.canonical(s), ROOT, None);
        if new {
            visit(&g.states[i as usize]);
        }
        if let (true, Err(b)) = (new, m.invariant(&g.states[i as usize])) {
            report.violation = Some(g.violation(i, None, b));
            return finish(report, &g, m);
        }
    }
    let (mut next, mut level_end, mut depth) = (0usize, g.states.len(), 0usize);
    let mut out = Vec::new();
    while next < g.states.len() {
        if next == level_end {
            (depth, level_end) = (depth + 1, g.states.len());
            if depth > limits.max_depth {
                report.exhaustive = false;
                break;
            }
        }
        let s = g.states[next].clone();
        out.clear();
        m.successors(&s, &mut out);
        for (a, t) in out.drain(..) {
            report.steps += 1;
            if let Err(b) = m.step(&s, &a, &t) {
                report.violation = Some(g.violation(next as u32, Some((a, t)), b));
                return finish(report, &g, m);
            }
            let calm = m.on_its_own(&a);
            let (j, new) = g.add(m.canonical(t), next as u32, Some(a));
            if calm && j != next as u32 {
                g.calm.push((j, next as u32));
            }
            if new {
                report.depth = depth + 1;
                visit(&g.states[j as usize]);
                if let Err(b) = m.invariant(&g.states[j as usize]) {
                    report.violation = Some(g.violation(j, None, b));
                    return finish(report, &g, m);
                }
            }
        }
        next += 1;
        if g.states.len() > limits.max_states {
            report.exhaustive = false;
            break;
        }
    }
    if report.exhaustive {
        report.violation = stuck(m, &mut g);
    }
    finish(report, &g, m)
}

fn finish<M: Model>(mut report: Report<M>, g: &Graph<M>, m: &M) -> Report<M> {
    report.states = g.states.len();
    report.violation = report.violation.map(|v| replay(m, v));
    report.depth = report.depth.max(report.violation.as_ref().map_or(0, |v| v.trace.len()));
    report
}

/// The first state (in breadth-first order, so one with a shortest trace)
/// from which no path of steps the system takes on its own reaches a goal:
/// found by walking those edges backwards from every goal state.
fn stuck<M: Model>(m: &M, g: &mut Graph<M>) -> Option<Violation<M>> {
    let n = g.states.len();
    let mut calm = std::mem::take(&mut g.calm);
    calm.sort_unstable();
    // Where each state's incoming edges start in `calm` (sorted by target).
    let mut start = vec![0usize; n + 1];
    for &(to, _) in &calm {
        start[to as usize + 1] += 1;
    }
    for i in 0..n {
        start[i + 1] += start[i];
    }
    let mut reaches = vec![false; n];
    let mut todo: Vec<u32> = (0..n as u32).filter(|&i| m.is_goal(&g.states[i as usize])).collect();
    for &i in &todo {
        reaches[i as usize] = true;
    }
    while let Some(to) = todo.pop() {
        for &(_, from) in &calm[start[to as usize]..start[to as usize + 1]] {
            if !reaches[from as usize] {
                reaches[from as usize] = true;
                todo.push(from);
            }
        }
    }
    let first = reaches.iter().position(|r| !r)?;
    let why = "no path the system takes on its own (no fault, no operator) reaches a goal".to_string();
    Some(g.violation(first as u32, None, Broken { property: m.progress(), why }))
}

/// The trace again from its initial state, each step chosen among the
/// successors of the state the last one reached: the search stored
/// canonical states, in which the actors' names may swap from one step to
/// the next; this one names them as they are. The last step, when it broke
/// a step's property, is one that breaks it.
fn replay<M: Model>(m: &M, v: Violation<M>) -> Violation<M> {
    let mut at = v.initial.clone();
    let mut trace = Vec::with_capacity(v.trace.len());
    let mut out = Vec::new();
    for (k, (_, target)) in v.trace.iter().enumerate() {
        let want = m.canonical(target.clone());
        out.clear();
        m.successors(&at, &mut out);
        let breaks = |a: &M::Action, t: &M::State| m.step(&at, a, t).is_err_and(|b| b.property == v.property);
        let same: Vec<_> = out.drain(..).filter(|(_, t)| m.canonical(t.clone()) == want).collect();
        let last = k + 1 == v.trace.len();
        let pick = same.iter().position(|(a, t)| last && breaks(a, t)).unwrap_or(0);
        let Some((a, t)) = same.into_iter().nth(pick) else { return v };
        trace.push((a, t.clone()));
        at = t;
    }
    Violation { trace, ..v }
}

impl<M: Model> Violation<M> {
    /// The trace, one step a line, each followed by the state it led to.
    pub fn render(&self, m: &M) -> String {
        let mut out = format!("{:?} broken: {}\n  start: {}\n", self.property, self.why, m.describe(&self.initial));
        for (n, (a, s)) in self.trace.iter().enumerate() {
            out.push_str(&format!("  {:>2}. {a}\n      -> {}\n", n + 1, m.describe(s)));
        }
        out
    }
}
