//! One failure model, checked three ways. Random definitions — chains of
//! every node kind, MAPs over every item kind with every `collect`,
//! `on_item_failure` and `tolerated_failures`, LOOPs, SUB_WORKFLOWs, failure
//! and `always` edges, conditions, FAIL, failure handlers — with scripted
//! outcomes for every attempt a worker runs (success, retryable and final
//! failures, timeouts, outcomes lost IN_DOUBT and resolved), some cancelled
//! half way, are run by the engine (real PostgreSQL and Redis, a worker on
//! the task API answering as scripted), by `simulate`, and by the small
//! reference interpreter below, written from the book's rules (docs/language/). All three
//! must agree on every step's state and output, every MAP item's, every
//! child run's state, the failure handler's run, and the run's end.
//!
//! The definitions are chains (one step at a time, MAPs one item at a
//! time), so that what happens does not depend on timing: where work runs
//! in parallel the engine may legitimately interleave it otherwise than the
//! simulation, and the comparison would test the clock, not the rules.
//!
//! `COMPOSER_MODEL_CASES` sets how many cases the engine runs (1,000 by
//! default), `COMPOSER_MODEL_PURE_CASES` how many the reference and
//! `simulate` compare alone (3,000), `COMPOSER_MODEL_SEED` the engine's
//! first seed: a soak sets them to tens of thousands.

use std::collections::BTreeMap;
use std::time::Duration;

use composer_core::machine::Resolution;
use composer_core::simulate::{self, Options, Outcome};
use composer_testkit::eventually;
use serde_json::{json, Value};

/// xorshift64*: cases are reproducible from their seed.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum On {
    Success,
    Failure,
    Always,
}

impl On {
    fn follows(self, state: &str) -> bool {
        match self {
            On::Success => state == "COMPLETED",
            On::Failure => state == "FAILED",
            On::Always => state == "COMPLETED" || state == "FAILED",
        }
    }
    fn name(self) -> &'static str {
        match self {
            On::Success => "success",
            On::Failure => "failure",
            On::Always => "always",
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
enum Tolerance {
    Fail,
    Continue,
    Count(u32),
    Percent(u32),
}

impl Tolerance {
    fn exceeded(&self, failed: u32, total: u32) -> bool {
        match self {
            Tolerance::Fail => failed > 0,
            Tolerance::Continue => false,
            Tolerance::Count(n) => failed > *n,
            Tolerance::Percent(p) => failed as f64 > total as f64 * *p as f64 / 100.0,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Collect {
    All,
    None,
    /// `.acc + (1 if the item completed, 100 if it failed)`, from 0.
    Count,
    /// Counts completed items, and fails (its reduction errs) at a failed one.
    Strict,
}

#[derive(Debug, Clone)]
enum Item {
    /// A worker runs it: each attempt scripted.
    Step(Vec<Outcome>),
    /// Evaluated: fails or yields the item.
    Transform { fails: bool },
    /// A child run of `kid`, which succeeds or fails every attempt.
    Child { ok: bool },
}

#[derive(Debug, Clone)]
enum Kind {
    Step { script: Vec<Outcome>, max: u32, timeout: bool, at_most_once: bool },
    Transform { fails: bool, v: i64 },
    Wait,
    Fail,
    Map { items: Vec<Item>, max: u32, tolerance: Tolerance, collect: Collect },
    Sub { ok: bool, v: i64, max: u32 },
    Loop { until: u32, max_iterations: u32 },
}

#[derive(Debug, Clone)]
struct Stage {
    id: String,
    kind: Kind,
    /// The edge from the stage before: what it follows, and a literal `when`.
    on: On,
    when: Option<bool>,
}

#[derive(Debug, Clone)]
struct Model {
    name: String,
    stages: Vec<Stage>,
    /// A failure handler (`hnd`), and whether it is for CANCELLED too.
    handler: Option<bool>,
    /// Cancel the run instead of answering this worker's attempt (1-based).
    cancel_at: Option<usize>,
}

fn outcome(rng: &mut Rng, v: i64, lost: bool) -> Outcome {
    match rng.below(100) {
        0..=54 => Outcome::Output(json!({"v": v})),
        55..=74 => Outcome::Fail { error: "retry me".into(), retryable: true },
        75..=84 => Outcome::Fail { error: "broken".into(), retryable: false },
        // An at-most-once attempt that times out is IN_DOUBT, as a lost one is.
        85..=94 if !lost => Outcome::TimeOut,
        _ if lost && rng.chance(50) => Outcome::Unknown(Resolution::Completed(json!({"v": v + 1000}))),
        _ if lost => Outcome::Unknown(Resolution::Failed("lost".into())),
        _ => Outcome::Output(json!({"v": v})),
    }
}

fn script(rng: &mut Rng, attempts: u32, v: i64, lost: bool) -> Vec<Outcome> {
    (0..attempts).map(|a| outcome(rng, v + a as i64, lost)).collect()
}

impl Model {
    fn generate(seed: u64) -> Model {
        let mut rng = Rng::new(seed);
        let n = 1 + rng.below(5) as usize;
        let mut stages = Vec::new();
        for i in 0..n {
            let last = i + 1 == n;
            let v = (seed % 1000) as i64 * 10 + i as i64;
            let kind = match rng.below(100) {
                0..=29 => {
                    let max = 1 + rng.below(3) as u32;
                    let at_most_once = rng.chance(20);
                    let script = script(&mut rng, max, v, at_most_once);
                    let timeout = script.contains(&Outcome::TimeOut);
                    Kind::Step { script, max, timeout, at_most_once }
                }
                30..=39 => Kind::Transform { fails: rng.chance(25), v },
                40..=44 => Kind::Wait,
                45..=49 if last => Kind::Fail,
                45..=74 => {
                    let count = rng.below(5) as usize;
                    let max = 1 + rng.below(2) as u32;
                    let failing = rng.below(count as u64 + 2) as usize;
                    let items = match rng.below(3) {
                        0 => (0..count).map(|k| Item::Step(script(&mut rng, max, v * 10 + k as i64, false))).collect(),
                        1 => (0..count).map(|k| Item::Transform { fails: k == failing }).collect(),
                        _ => (0..count).map(|k| Item::Child { ok: k != failing }).collect(),
                    };
                    let tolerance = match rng.below(4) {
                        0 => Tolerance::Fail,
                        1 => Tolerance::Continue,
                        2 => Tolerance::Count(rng.below(3) as u32),
                        _ => Tolerance::Percent([0, 25, 50, 100][rng.below(4) as usize]),
                    };
                    let collect = [Collect::All, Collect::None, Collect::Count, Collect::Strict][rng.below(4) as usize];
                    Kind::Map { items, max, tolerance, collect }
                }
                75..=87 => Kind::Sub { ok: rng.chance(70), v, max: 1 + rng.below(2) as u32 },
                _ => Kind::Loop { until: rng.below(3) as u32, max_iterations: 1 + rng.below(3) as u32 },
            };
            let on = match rng.below(10) {
                0 | 1 => On::Failure,
                2 | 3 => On::Always,
                _ => On::Success,
            };
            let when = match rng.below(10) {
                0 => Some(false),
                1 => Some(true),
                _ => None,
            };
            stages.push(Stage { id: format!("n{i}"), kind, on, when });
        }
        let handler = rng.chance(40).then(|| rng.chance(50));
        let cancel_at = rng.chance(15).then(|| 1 + rng.below(3) as usize);
        Model { name: format!("m{seed}"), stages, handler, cancel_at }
    }

    fn definition(&self) -> Value {
        let mut nodes = Vec::new();
        let mut edges = Vec::new();
        for (i, s) in self.stages.iter().enumerate() {
            let mut node = json!({"id": s.id});
            match &s.kind {
                Kind::Step { max, timeout, at_most_once, .. } => {
                    node["type"] = json!("step");
                    node["queue"] = json!("model");
                    node["config"] = json!({"key": s.id});
                    node["retry"] = json!({"max_attempts": max, "initial_backoff": "10ms"});
                    // Long enough that an attempt scripted to answer is never
                    // late, with a thousand runs in flight on a loaded machine
                    // (2 s was: the attempt waits its turn in the queue).
                    if *timeout {
                        node["timeout"] = json!("5s");
                    }
                    if *at_most_once {
                        node["delivery"] = json!("at_most_once");
                    }
                }
                Kind::Transform { fails, v } => {
                    node["type"] = json!("TRANSFORM");
                    let output = if *fails { json!("${ error(\"no\") }") } else { json!({"x": v}) };
                    node["config"] = json!({"output": output});
                }
                Kind::Wait => {
                    node["type"] = json!("WAIT");
                    node["config"] = json!({"duration": "10ms"});
                }
                Kind::Fail => {
                    node["type"] = json!("FAIL");
                    node["config"] = json!({"message": "stop"});
                }
                Kind::Map { items, max, tolerance, collect } => {
                    node["type"] = json!("MAP");
                    let item = match items.first() {
                        Some(Item::Step(_)) | None => json!({"type": "step", "queue": "model",
                            "config": {"key": s.id, "index": "${ .index }"},
                            "retry": {"max_attempts": max, "initial_backoff": "10ms"}, "timeout": "5s"}),
                        Some(Item::Transform { .. }) => {
                            let failing = items.iter().position(|i| matches!(i, Item::Transform { fails: true }));
                            let failing = failing.map_or(-1, |f| f as i64);
                            json!({"type": "TRANSFORM", "config": {"output":
                                format!("${{ if .index == {failing} then error(\"no\") else .item end }}")}})
                        }
                        Some(Item::Child { .. }) => {
                            let failing = items.iter().position(|i| matches!(i, Item::Child { ok: false }));
                            let failing = failing.map_or(-1, |f| f as i64);
                            json!({"type": "SUB_WORKFLOW", "retry": {"max_attempts": max, "initial_backoff": "10ms"},
                                "config": {"workflow": "kid", "input": {
                                    "ok": format!("${{ .index != {failing} }}"), "v": "${ .item }"}}})
                        }
                    };
                    let mut config = json!({"items": (0..items.len()).collect::<Vec<_>>(), "max_concurrency": 1,
                                            "node": item});
                    match tolerance {
                        Tolerance::Fail => {}
                        Tolerance::Continue => config["on_item_failure"] = json!("continue"),
                        Tolerance::Count(n) => config["tolerated_failures"] = json!(n),
                        Tolerance::Percent(p) => config["tolerated_failures"] = json!(format!("{p}%")),
                    }
                    config["collect"] = match collect {
                        Collect::All => json!("all"),
                        Collect::None => json!("none"),
                        Collect::Count => json!({"init": 0,
                            "reduce": ".acc + (if .item.state == \"COMPLETED\" then 1 else 100 end)"}),
                        Collect::Strict => json!({"init": 0,
                            "reduce": "if .item.state == \"COMPLETED\" then .acc + 1 else error(\"a failed item\") end"}),
                    };
                    node["config"] = config;
                }
                Kind::Sub { ok, v, max } => {
                    node["type"] = json!("SUB_WORKFLOW");
                    node["config"] = json!({"workflow": "kid", "input": {"ok": ok, "v": v}});
                    node["retry"] = json!({"max_attempts": max, "initial_backoff": "10ms"});
                }
                Kind::Loop { until, max_iterations } => {
                    node["type"] = json!("LOOP");
                    node["config"] = json!({"workflow": "kid", "input": {"ok": true, "v": "${ .iteration.index }"},
                        "until": format!(".iteration.index >= {until}"), "max_iterations": max_iterations});
                    node["retry"] = json!({"max_attempts": 1});
                }
            }
            nodes.push(node);
            if i > 0 {
                let mut edge = json!({"from": self.stages[i - 1].id, "to": s.id, "on": s.on.name()});
                if let Some(w) = s.when {
                    edge["when"] = json!(w.to_string());
                }
                edges.push(edge);
            }
        }
        let mut def = json!({"name": self.name, "nodes": nodes, "edges": edges});
        if let Some(on_cancel) = self.handler {
            def["on_failure"] = json!({"workflow": "hnd"});
            if on_cancel {
                def["on_failure"]["on"] = json!(["FAILED", "CANCELLED"]);
            }
        }
        def
    }

    /// What `simulate` is told: each worker attempt's script, each child's
    /// end (a child run is not simulated), the cancel.
    fn options(&self) -> Options {
        let mut o = Options { cancel_at: self.cancel_at, ..Default::default() };
        for s in &self.stages {
            match &s.kind {
                Kind::Step { script, .. } => {
                    o.outcomes.insert(s.id.clone(), script.clone());
                }
                Kind::Map { items, .. } => {
                    for (k, item) in items.iter().enumerate() {
                        let key = format!("{}[{k}]", s.id);
                        match item {
                            Item::Step(script) => {
                                o.outcomes.insert(key, script.clone());
                            }
                            Item::Child { ok: true } => {
                                o.mocks.insert(key, json!({"v": k}));
                            }
                            Item::Child { ok: false } => {
                                o.failures.insert(key, "kid failed".into());
                            }
                            Item::Transform { .. } => {}
                        }
                    }
                }
                Kind::Sub { ok: true, v, .. } => {
                    o.mocks.insert(s.id.clone(), json!({"v": v}));
                }
                Kind::Sub { ok: false, .. } => {
                    o.failures.insert(s.id.clone(), "kid failed".into());
                }
                Kind::Loop { max_iterations, .. } => {
                    for i in 0..*max_iterations {
                        o.mocks.insert(format!("{}[{i}]", s.id), json!({"v": i}));
                    }
                }
                _ => {}
            }
        }
        o
    }
}

/// What is compared: the run's end and output, each node's state (and
/// output when it completed), each MAP's items, the child runs' ends (in
/// order), the failure handler's run. `None` where a side cannot say (the
/// simulation runs no child and no handler).
#[derive(Debug, Clone, PartialEq)]
struct Observation {
    run: String,
    output: Option<Value>,
    nodes: BTreeMap<String, (String, Option<Value>)>,
    items: BTreeMap<String, Vec<(String, Option<Value>)>>,
    children: Option<Vec<String>>,
    handler: Option<Option<String>>,
}

/// An output as compared: an error entry of a MAP's collected output is
/// `{"error": "*"}` (its words are each side's), however deep.
fn normal(v: Option<Value>) -> Option<Value> {
    fn walk(v: Value) -> Value {
        match v {
            Value::Object(o) if o.len() == 1 && o.get("error").is_some_and(Value::is_string) => json!({"error": "*"}),
            Value::Object(o) => Value::Object(o.into_iter().map(|(k, v)| (k, walk(v))).collect()),
            Value::Array(a) => Value::Array(a.into_iter().map(walk).collect()),
            v => v,
        }
    }
    v.map(walk)
}

/// A step's (or item's) end: its state, and its output when it completed.
type End = (String, Option<Value>);

/// The reference interpreter: the book's rules (docs/language/), one stage at a time.
struct Reference<'m> {
    model: &'m Model,
    delivered: usize,
    cancelled: bool,
    children: Vec<String>,
}

impl Reference<'_> {
    /// A worker's attempt is delivered, or a child run starts: false when
    /// the run is cancelled then.
    fn deliver(&mut self) -> bool {
        self.delivered += 1;
        if self.model.cancel_at == Some(self.delivered) {
            self.cancelled = true;
        }
        !self.cancelled
    }

    /// A worker-run step with `max` attempts: its end and output.
    fn step(&mut self, script: &[Outcome], max: u32) -> (String, Option<Value>) {
        for attempt in 1..=max {
            if !self.deliver() {
                return ("CANCELLED".into(), None);
            }
            let o = &script[(attempt as usize - 1).min(script.len() - 1)];
            match o {
                Outcome::Output(v) | Outcome::Unknown(Resolution::Completed(v)) => {
                    return ("COMPLETED".into(), Some(v.clone()))
                }
                Outcome::Fail { retryable: false, .. } | Outcome::Unknown(_) => return ("FAILED".into(), None),
                Outcome::Fail { retryable: true, .. } | Outcome::TimeOut if attempt < max => {}
                Outcome::Fail { .. } | Outcome::TimeOut => return ("FAILED".into(), None),
            }
        }
        ("FAILED".into(), None)
    }

    /// A child run of `kid` per attempt.
    fn child(&mut self, ok: bool, v: Value, max: u32) -> (String, Option<Value>) {
        for _ in 0..max {
            if !self.deliver() {
                self.children.push("CANCELLED".into());
                return ("CANCELLED".into(), None);
            }
            if ok {
                self.children.push("SUCCEEDED".into());
                return ("COMPLETED".into(), Some(json!({"v": v})));
            }
            self.children.push("FAILED".into());
        }
        ("FAILED".into(), None)
    }

    fn map(&mut self, items: &[Item], max: u32, tolerance: &Tolerance, collect: Collect) -> (End, Vec<End>) {
        let total = items.len() as u32;
        let mut states: Vec<End> = vec![("QUEUED".into(), None); items.len()];
        let (mut failed, mut acc) = (0u32, 0i64);
        for (k, item) in items.iter().enumerate() {
            let end = match item {
                Item::Step(script) => self.step(script, max),
                Item::Transform { fails: true } => ("FAILED".into(), None),
                Item::Transform { fails: false } => ("COMPLETED".into(), Some(json!(k))),
                Item::Child { ok } => self.child(*ok, json!(k), max),
            };
            if end.0 == "CANCELLED" {
                for s in states.iter_mut().skip(k) {
                    *s = ("CANCELLED".into(), None);
                }
                return (("CANCELLED".into(), None), states);
            }
            acc += if end.0 == "COMPLETED" { 1 } else { 100 };
            failed += (end.0 == "FAILED") as u32;
            let broken = collect == Collect::Strict && end.0 == "FAILED";
            states[k] = end;
            if broken || tolerance.exceeded(failed, total) {
                for s in states.iter_mut().skip(k + 1) {
                    *s = ("CANCELLED".into(), None);
                }
                return (("FAILED".into(), None), states);
            }
        }
        let succeeded = total - failed;
        let output = match collect {
            Collect::All => Value::Array(
                states
                    .iter()
                    .map(|(s, o)| if s == "COMPLETED" { o.clone().unwrap() } else { json!({"error": "*"}) })
                    .collect(),
            ),
            Collect::None => json!({"count": total, "succeeded": succeeded, "failed": failed}),
            Collect::Count => json!(acc),
            Collect::Strict => json!(succeeded),
        };
        (("COMPLETED".into(), Some(output)), states)
    }

    fn run(model: &Model) -> Observation {
        let mut r = Reference { model, delivered: 0, cancelled: false, children: Vec::new() };
        let mut nodes = BTreeMap::new();
        let mut items = BTreeMap::new();
        let mut unhandled = false;
        let mut prev: Option<String> = None;
        for (i, s) in model.stages.iter().enumerate() {
            if r.cancelled || unhandled {
                nodes.insert(s.id.clone(), ("NOT_REACHED".into(), None));
                continue;
            }
            let active = match &prev {
                None => true,
                Some(p) => s.on.follows(p) && s.when != Some(false),
            };
            let (state, output) = if !active {
                ("SKIPPED".into(), None)
            } else {
                match &s.kind {
                    Kind::Step { script, max, .. } => r.step(script, *max),
                    Kind::Transform { fails: true, .. } | Kind::Fail => ("FAILED".into(), None),
                    Kind::Transform { fails: false, v } => ("COMPLETED".into(), Some(json!({"x": v}))),
                    Kind::Wait => ("COMPLETED".into(), Some(json!({}))),
                    Kind::Sub { ok, v, max } => r.child(*ok, json!(v), *max),
                    Kind::Loop { until, max_iterations } => {
                        let mut end = ("FAILED".into(), None);
                        for index in 0..*max_iterations {
                            if !r.deliver() {
                                r.children.push("CANCELLED".into());
                                end = ("CANCELLED".into(), None);
                                break;
                            }
                            r.children.push("SUCCEEDED".into());
                            if index >= *until {
                                end = (
                                    "COMPLETED".into(),
                                    Some(json!({"output": {"v": index}, "iterations": index + 1})),
                                );
                                break;
                            }
                        }
                        end
                    }
                    Kind::Map { items: list, max, tolerance, collect } => {
                        let (end, states) = r.map(list, *max, tolerance, *collect);
                        items.insert(s.id.clone(), states);
                        end
                    }
                }
            };
            let handled = model.stages.get(i + 1).is_some_and(|next| next.on != On::Success);
            unhandled = state == "FAILED" && !handled;
            prev = Some(state.clone());
            nodes.insert(s.id.clone(), (state, output));
        }
        let run = match (r.cancelled, unhandled) {
            (true, _) => "CANCELLED",
            (false, true) => "FAILED",
            (false, false) => "SUCCEEDED",
        };
        let output = (run == "SUCCEEDED").then(|| {
            let last = model.stages.last().unwrap();
            match &nodes[&last.id] {
                (s, Some(o)) if s == "COMPLETED" => json!({ last.id.clone(): o }),
                _ => json!({}),
            }
        });
        let handler = model
            .handler
            .map(|on_cancel| (run == "FAILED" || (run == "CANCELLED" && on_cancel)).then(|| "SUCCEEDED".to_string()));
        Observation { run: run.into(), output, nodes, items, children: Some(r.children), handler }
    }
}

/// What `simulate` makes of the model.
fn simulated(model: &Model) -> Observation {
    let wf = composer_core::definition::Workflow::parse(&model.definition()).unwrap();
    let report =
        composer_core::expr::sandboxed(std::time::Instant::now, |sb| simulate::simulate(sb, &wf, &model.options()))
            .unwrap();
    let mut nodes = BTreeMap::new();
    let mut items = BTreeMap::new();
    for n in &report.nodes {
        let output = (n.state == "COMPLETED").then(|| n.output.clone()).flatten();
        nodes.insert(n.id.clone(), (n.state.clone(), normal(output)));
        if n.node_type == "MAP" && n.state != "NOT_REACHED" && n.state != "SKIPPED" {
            let list = n
                .items
                .iter()
                .map(|i| (i.state.clone(), normal((i.state == "COMPLETED").then(|| i.output.clone()).flatten())))
                .collect();
            items.insert(n.id.clone(), list);
        }
    }
    Observation {
        run: report.status.to_string(),
        output: normal(report.output.clone()),
        nodes,
        items,
        children: None,
        handler: None,
    }
}

fn expected(model: &Model) -> Observation {
    let mut o = Reference::run(model);
    for (_, (_, out)) in o.nodes.iter_mut() {
        *out = normal(out.take());
    }
    for list in o.items.values_mut() {
        for (_, out) in list.iter_mut() {
            *out = normal(out.take());
        }
    }
    o
}

/// Whether the reference and `simulate` agree on `model`.
fn agree(model: &Model) -> Result<(), String> {
    let (mut want, got) = (expected(model), simulated(model));
    want.children = None;
    want.handler = None;
    match got == want {
        true => Ok(()),
        false => Err(format!("simulate: {got:?}\nreference: {want:?}")),
    }
}

/// A smaller model that still disagrees: stages dropped, items dropped,
/// one at a time, while it does.
fn shrink(mut model: Model) -> Model {
    loop {
        let mut smaller = None;
        for i in 0..model.stages.len() {
            let mut m = model.clone();
            m.stages.remove(i);
            if !m.stages.is_empty() && agree(&m).is_err() {
                smaller = Some(m);
                break;
            }
        }
        if smaller.is_none() {
            'items: for i in 0..model.stages.len() {
                if let Kind::Map { items, .. } = &model.stages[i].kind {
                    for k in 0..items.len() {
                        let mut m = model.clone();
                        if let Kind::Map { items, .. } = &mut m.stages[i].kind {
                            items.remove(k);
                        }
                        if agree(&m).is_err() {
                            smaller = Some(m);
                            break 'items;
                        }
                    }
                }
            }
        }
        match smaller {
            Some(m) => model = m,
            None => return model,
        }
    }
}

/// The reference and `simulate` agree on thousands of generated cases (no
/// service needed); a case that does not agree is shrunk and printed whole,
/// to become a unit test.
#[test]
fn the_reference_interpreter_and_simulate_agree_on_every_generated_case() {
    let cases: u64 = std::env::var("COMPOSER_MODEL_PURE_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(3000);
    for seed in 0..cases {
        let model = Model::generate(seed);
        if agree(&model).is_err() {
            let small = shrink(model);
            let why = agree(&small).unwrap_err();
            panic!("seed {seed}, shrunk:\n{}\n{small:#?}\n{why}", small.definition());
        }
    }
}

/// The runs of the engine case by case: what the worker answers each
/// attempt of a run, and how many it was delivered.
struct Scripts {
    runs: std::sync::Mutex<std::collections::HashMap<uuid::Uuid, (Model, usize)>>,
    /// The attempts delivered so far, by task id. An attempt whose lease
    /// expired is taken over at the same attempt (a held one whose lease
    /// runs out before its timeout fires): the same attempt again, not the
    /// next delivery of the reference's count.
    seen: std::sync::Mutex<std::collections::HashSet<(String, i32)>>,
}

impl Scripts {
    /// What to do with an attempt of `run`'s step `key` (`n2`, or `n2[1]` for
    /// an item): `None` to cancel the run instead.
    fn answer(&self, run: uuid::Uuid, task: &str, key: &str, attempt: i32) -> Option<Option<Outcome>> {
        let mut runs = self.runs.lock().unwrap();
        let (model, delivered) = runs.get_mut(&run)?;
        if self.seen.lock().unwrap().insert((task.to_string(), attempt)) {
            *delivered += 1;
            if model.cancel_at == Some(*delivered) {
                return Some(None);
            }
        }
        // A child run's own step: it started; it goes on.
        if key == "kid" {
            return Some(Some(Outcome::Output(json!({}))));
        }
        let (id, index) = match key.split_once('[') {
            Some((id, rest)) => (id, rest.trim_end_matches(']').parse::<usize>().ok()),
            None => (key, None),
        };
        let stage = model.stages.iter().find(|s| s.id == id)?;
        let script = match (&stage.kind, index) {
            (Kind::Step { script, .. }, None) => script,
            (Kind::Map { items, .. }, Some(k)) => match &items[k] {
                Item::Step(script) => script,
                _ => return None,
            },
            _ => return None,
        };
        Some(Some(script[(attempt.max(1) as usize - 1).min(script.len() - 1)].clone()))
    }
}

/// The worker of the model's steps, on the task API: answers each attempt
/// as its run's script says, holds a timed-out one, loses one whose outcome
/// is unknown (and resolves it once it is IN_DOUBT), or cancels the run.
async fn work(url: String, scripts: std::sync::Arc<Scripts>, stop: tokio_util::sync::CancellationToken) {
    let http = reqwest::Client::new();
    while !stop.is_cancelled() {
        let poll = json!({"worker_id": "model", "queues": ["model"], "max": 50, "wait": "500ms"});
        let Ok(r) = http.post(format!("{url}/v1/tasks/poll")).json(&poll).send().await else { continue };
        let leased: Value = r.json().await.unwrap_or(Value::Null);
        for task in leased["tasks"].as_array().cloned().unwrap_or_default() {
            let (http, url, scripts) = (http.clone(), url.clone(), scripts.clone());
            tokio::spawn(async move {
                let mut run: uuid::Uuid = task["run_id"].as_str().unwrap().parse().unwrap();
                let own = run;
                // A child's step counts as its parent's work starting.
                if task["input"]["key"] == "kid" {
                    let view: Value =
                        http.get(format!("{url}/v1/runs/{run}")).send().await.unwrap().json().await.unwrap();
                    run = view["parent_run_id"].as_str().unwrap().parse().unwrap();
                }
                let attempt = task["attempt"].as_i64().unwrap() as i32;
                let id = task["id"].as_str().unwrap();
                let input = &task["input"];
                let key = match input["index"].as_i64() {
                    Some(i) => format!("{}[{i}]", input["key"].as_str().unwrap()),
                    None => input["key"].as_str().unwrap().to_string(),
                };
                // The run's script is known once its start answered.
                let answer =
                    eventually(Duration::from_secs(10), format!("a script for {key} of run {run}"), || async {
                        scripts.answer(run, id, &key, attempt)
                    })
                    .await;
                let body = |extra: Value| {
                    let mut b = json!({"worker_id": "model", "run_id": own, "attempt": attempt});
                    b.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
                    b
                };
                match answer {
                    None => {
                        http.post(format!("{url}/v1/runs/{run}/cancel")).json(&json!({})).send().await.unwrap();
                    }
                    Some(Outcome::Output(output)) => {
                        let b = body(json!({"output": output}));
                        http.post(format!("{url}/v1/tasks/{id}/complete")).json(&b).send().await.unwrap();
                    }
                    Some(Outcome::Fail { error, retryable }) => {
                        let b = body(json!({"error": error, "retryable": retryable}));
                        http.post(format!("{url}/v1/tasks/{id}/fail")).json(&b).send().await.unwrap();
                    }
                    // Held past the node's timeout: no answer.
                    Some(Outcome::TimeOut) => {}
                    // Lost: no answer, no heartbeat; once IN_DOUBT, an operator resolves it.
                    Some(Outcome::Unknown(resolution)) => {
                        let node = task["node_id"].as_str().unwrap().to_string();
                        let what = format!("{node} of run {run} in doubt, or the run ended");
                        let in_doubt = eventually(Duration::from_secs(120), what, || async {
                            let view: Value =
                                http.get(format!("{url}/v1/runs/{run}")).send().await.unwrap().json().await.unwrap();
                            let doubt = view["tasks"]
                                .as_array()
                                .into_iter()
                                .flatten()
                                .any(|t| t["node_id"] == node.as_str() && t["state"] == "IN_DOUBT");
                            (doubt || view["status"] != "RUNNING").then_some(doubt)
                        })
                        .await;
                        if !in_doubt {
                            return;
                        }
                        let how = match resolution {
                            Resolution::Completed(output) => json!({"outcome": "completed", "output": output}),
                            _ => json!({"outcome": "failed", "error": "lost"}),
                        };
                        http.post(format!("{url}/v1/runs/{run}/tasks/{node}/resolve")).json(&how).send().await.unwrap();
                    }
                }
            });
        }
    }
}

/// What the engine did with a run of the model.
async fn observed(e: &composer_testkit::Engine, model: &Model, run: uuid::Uuid) -> Observation {
    let view = e.wait_for_run(run, Duration::from_secs(120)).await;
    let mut nodes = BTreeMap::new();
    let mut items = BTreeMap::new();
    for s in &model.stages {
        let task = view["tasks"].as_array().into_iter().flatten().find(|t| t["node_id"] == s.id.as_str());
        let state = task.map_or("NOT_REACHED".to_string(), |t| t["state"].as_str().unwrap().to_string());
        let output = task.filter(|_| state == "COMPLETED").map(|t| t["output"].clone());
        if matches!(s.kind, Kind::Map { .. }) && state != "NOT_REACHED" && state != "SKIPPED" {
            let (_, page) = e.get(&format!("/v1/runs/{run}/items?node={}&limit=1000", s.id)).await;
            let list = page["items"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|i| {
                    let state = i["state"].as_str().unwrap().to_string();
                    let output = (state == "COMPLETED").then(|| i["output"].clone());
                    (state, normal(output))
                })
                .collect();
            items.insert(s.id.clone(), list);
        }
        nodes.insert(s.id.clone(), (state, normal(output)));
    }
    // A cancelled run's children are cancelled right after its commit.
    let mut children = eventually(Duration::from_secs(10), format!("the children of run {run} to end"), || async {
        let (_, page) = e.get(&format!("/v1/runs?parent_run_id={run}&limit=1000")).await;
        let children = page["runs"].as_array().cloned().unwrap_or_default();
        if children.iter().all(|c| c["status"] != "RUNNING") {
            Ok(children)
        } else {
            Err(page)
        }
    })
    .await;
    children.reverse();
    let children = children.iter().map(|c| c["status"].as_str().unwrap().to_string()).collect();
    let handler = match model.handler {
        None => None,
        Some(_) => match view["failure_handler_run_ids"][0].as_str() {
            None => Some(None),
            Some(h) => Some(Some(
                e.wait_for_run(h.parse().unwrap(), Duration::from_secs(60)).await["status"]
                    .as_str()
                    .unwrap()
                    .to_string(),
            )),
        },
    };
    let output = view["output"].clone();
    Observation {
        run: view["status"].as_str().unwrap().to_string(),
        output: normal((!output.is_null()).then_some(output)),
        nodes,
        items,
        children: Some(children),
        handler,
    }
}

/// The engine, on real PostgreSQL and Redis with a worker on the task API
/// answering each attempt as scripted, ends every generated run as the
/// reference interpreter and `simulate` say: every step's state and output,
/// every MAP item's, the child runs, the failure handler, the run's end.
#[tokio::test]
async fn the_engine_simulate_and_the_reference_agree_on_generated_runs() {
    let cases: u64 = std::env::var("COMPOSER_MODEL_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(1000);
    let first: u64 = std::env::var("COMPOSER_MODEL_SEED").ok().and_then(|v| v.parse().ok()).unwrap_or(100_000);
    let e = composer_testkit::Engine::with(composer_testkit::EngineOptions {
        workers: 0,
        lease_ttl: Duration::from_secs(2),
        coordinator: |c| {
            c.recovery_interval = Duration::from_millis(300);
            c.timer_interval = Duration::from_millis(50);
        },
        ..Default::default()
    })
    .await;
    // A child run: its first step is the worker's (where its parent may be
    // cancelled while it runs), then it succeeds with `v` or fails.
    e.register(&json!({"name": "kid", "nodes": [
        {"id": "s", "type": "step", "queue": "model", "config": {"key": "kid"}, "retry": {"max_attempts": 1}},
        {"id": "t", "type": "TRANSFORM", "config": {"output": {"v": "${ .input.v }"}}},
        {"id": "f", "type": "FAIL", "config": {"message": "kid failed"}}],
        "edges": [{"from": "s", "to": "t"}, {"from": "t", "to": "f", "when": ".input.ok == false"}],
        "output": "${ .nodes.t.output }"}))
        .await;
    e.register(&json!({"name": "hnd", "nodes": [{"id": "h", "type": "TRANSFORM", "config": {"output": 1}}]})).await;
    let scripts = std::sync::Arc::new(Scripts { runs: Default::default(), seen: Default::default() });
    let stop = tokio_util::sync::CancellationToken::new();
    let worker = tokio::spawn(work(e.url(), scripts.clone(), stop.clone()));
    let models: Vec<Model> = (first..first + cases).map(Model::generate).collect();
    for m in &models {
        e.register(&m.definition()).await;
    }
    let mut runs = Vec::new();
    for m in &models {
        let (status, body) = e.post("/v1/runs", &json!({"workflow": m.name})).await;
        assert_eq!(status, 201, "{body}");
        let run: uuid::Uuid = body["id"].as_str().unwrap().parse().unwrap();
        scripts.runs.lock().unwrap().insert(run, (m.clone(), 0));
        runs.push(run);
    }
    for (m, run) in models.iter().zip(runs) {
        let engine = observed(&e, m, run).await;
        let want = expected(m);
        assert_eq!(
            engine,
            want,
            "{}: the engine (left) and the reference (right) disagree on\n{m:#?}\n{}",
            m.name,
            m.definition()
        );
        let mut engine = engine;
        engine.children = None;
        engine.handler = None;
        assert_eq!(engine, simulated(m), "{}: the engine (left) and simulate (right) disagree", m.name);
    }
    stop.cancel();
    let _ = worker.await;
    e.stop().await;
}
