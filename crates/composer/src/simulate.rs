//! `composer workflow simulate`: a definition through the state machine,
//! offline (`composer_core::simulate`), printed for people or tools.

use std::path::Path;
use std::process::ExitCode;

use anyhow::{anyhow, Context};
use composer_core::definition::Workflow;
use composer_core::expr::Sandbox;
use composer_core::machine::RunStatus;
use composer_core::simulate::{simulate_asking, Ask, Options, Outcome, Report};
use serde_json::Value;

/// What the simulated run starts from.
pub enum Start<'a> {
    /// `--input`: JSON or @FILE.
    Input(&'a str),
    /// `--event`: the event whose first matching trigger starts the run.
    Event(&'a str),
}

/// How a simulation runs and says what happened.
pub struct How<'a> {
    /// `table` (or `text`), `json` or `jsonl`.
    pub format: &'a str,
    /// Each attempt a worker would run is asked over standard input and
    /// output ([`Asker`]), and the report ends the output as
    /// `{"report": …}` on one line.
    pub ask: bool,
    /// The largest value the engine keeps ([`Options::max_value`]).
    pub max_value: usize,
    /// `--update NAME=JSON`, in order ([`Options::updates`]).
    pub updates: &'a [String],
}

/// Exit status: 0 the simulated run succeeded, 1 it failed (or no trigger
/// starts a run for the event), 2 the definition or an argument is invalid
/// (the message on stderr).
pub fn run(file: &Path, start: Start<'_>, mocks: &[String], failures: &[String], how: How<'_>) -> ExitCode {
    let How { format, ask, max_value, updates } = how;
    let (input, event) = match start {
        Start::Input(i) => (i, None),
        Start::Event(e) => match json_arg(e).context("--event").and_then(event_of) {
            Ok(e) => ("{}", Some(e)),
            Err(e) => {
                eprintln!("error: {e:#}");
                return ExitCode::from(2);
            }
        },
    };
    let prepared = prepare(file, input, mocks, failures);
    let (wf, mut opts) = match prepared {
        Ok(p) => p,
        Err(e) => {
            eprintln!("error: {e:#}");
            return ExitCode::from(2);
        }
    };
    opts.max_value = Some(max_value);
    for u in updates {
        match u.split_once('=').map(|(name, v)| (name, json_arg(v))) {
            Some((name, Ok(payload))) => opts.updates.push((name.to_string(), payload)),
            Some((name, Err(e))) => {
                eprintln!("error: --update {name}: {e:#}");
                return ExitCode::from(2);
            }
            None => {
                eprintln!("error: --update {u:?}: expected NAME=JSON or NAME=@FILE");
                return ExitCode::from(2);
            }
        }
    }
    // Expressions run where the coordinator runs them: on an evaluation
    // thread, so a hostile definition fails its node here too instead of
    // overflowing the main thread's stack.
    let mut asker = Asker::default();
    let simulated = composer_core::expr::sandboxed(std::time::Instant::now, |sb| {
        if let Some(event) = &event {
            opts.input = triggered_input(sb, &wf, event)?;
        }
        // The start is refused as the server refuses it.
        if let Some(schema) = &wf.input_schema {
            schema.check(&opts.input).map_err(|m| format!("no run: workflow {:?}: {m}", wf.spec.name))?;
        }
        let mut answer = |a: &Ask<'_>| if ask { asker.ask(a) } else { None };
        Ok::<Report, String>(simulate_asking(sb, &wf, &opts, &mut answer))
    });
    if let Some(e) = asker.broken {
        eprintln!("error: --ask: {e}");
        return ExitCode::from(2);
    }
    let report = match simulated {
        Ok(Ok(report)) => report,
        Ok(Err(no_run)) => {
            eprintln!("{no_run}");
            return ExitCode::from(1);
        }
        Err(e) => {
            eprintln!("error: the simulation failed: {e}");
            return ExitCode::from(2);
        }
    };
    match format {
        _ if ask => println!("{}", serde_json::json!({"report": report})),
        "json" => println!("{}", serde_json::to_string_pretty(&report).unwrap_or_default()),
        "jsonl" => println!("{}", serde_json::to_string(&report).unwrap_or_default()),
        _ => print!("{}", text(&report)),
    }
    match report.status {
        RunStatus::Succeeded => ExitCode::SUCCESS,
        _ => ExitCode::from(1),
    }
}

/// `--ask`: each attempt a worker would run is written to standard output
/// as one line, `{"ask": {node, key, type, input, attempt}}`, and answered
/// by one line on standard input: `{"output": V}`, `{"error": "why",
/// "retryable": true}`, `{"timeout": true}` or `{"mock": true}` (what
/// `--mock` and `--fail` say). A line that is none of these, or the end of
/// the input, stops the asking: the run goes on as mocked, and the command
/// exits 2 naming it.
#[derive(Default)]
struct Asker {
    broken: Option<String>,
}

/// Longest answer line read: a step's output is at most a payload.
const MAX_ANSWER: u64 = 64 << 20;

impl Asker {
    fn ask(&mut self, a: &Ask<'_>) -> Option<Outcome> {
        if self.broken.is_some() {
            return None;
        }
        match Self::exchange(a) {
            Ok(outcome) => outcome,
            Err(e) => {
                self.broken = Some(format!("the answer for {} attempt {}: {e}", a.key, a.attempt));
                None
            }
        }
    }

    fn exchange(a: &Ask<'_>) -> anyhow::Result<Option<Outcome>> {
        use std::io::{BufRead, Read, Write};
        let mut out = std::io::stdout().lock();
        writeln!(out, "{}", serde_json::json!({"ask": a}))?;
        out.flush()?;
        let mut line = String::new();
        std::io::stdin().lock().take(MAX_ANSWER).read_line(&mut line)?;
        if line.is_empty() {
            return Err(anyhow!("standard input ended"));
        }
        outcome_of(serde_json::from_str(&line).context("not a JSON line")?)
    }
}

/// An answer line's outcome (`None`: as mocked).
fn outcome_of(v: Value) -> anyhow::Result<Option<Outcome>> {
    let Value::Object(o) = v else { return Err(anyhow!("expected an object")) };
    if let Some(output) = o.get("output") {
        return Ok(Some(Outcome::Output(output.clone())));
    }
    if let Some(error) = o.get("error") {
        let error = error.as_str().map(str::to_string).unwrap_or_else(|| error.to_string());
        let retryable = o.get("retryable").and_then(Value::as_bool).unwrap_or(true);
        return Ok(Some(Outcome::Fail { error, retryable }));
    }
    if o.get("timeout") == Some(&Value::Bool(true)) {
        return Ok(Some(Outcome::TimeOut));
    }
    if o.get("mock") == Some(&Value::Bool(true)) {
        return Ok(None);
    }
    Err(anyhow!("expected {{\"output\"}}, {{\"error\", \"retryable\"}}, {{\"timeout\": true}} or {{\"mock\": true}}"))
}

/// An event as `--event` gives it, as the triggers see it.
fn event_of(v: Value) -> anyhow::Result<Value> {
    let Value::Object(mut o) = v else { return Err(anyhow!("--event: expected {{name, key?, id?, payload?}}")) };
    let name = match o.remove("name") {
        Some(Value::String(n)) if !n.is_empty() => n,
        _ => return Err(anyhow!("--event: needs a name")),
    };
    let text = |v: Option<Value>, field: &str| match v {
        None => Ok(String::new()),
        Some(Value::String(s)) => Ok(s),
        Some(other) => Err(anyhow!("--event: {field} must be text, got {other}")),
    };
    let key = text(o.remove("key"), "key")?;
    let id = text(o.remove("id"), "id")?;
    let payload = o.remove("payload").unwrap_or(Value::Null);
    if let Some(extra) = o.keys().next() {
        return Err(anyhow!("--event: unknown field {extra:?} (name, key, id, payload)"));
    }
    let id = if id.is_empty() { "simulated".to_string() } else { id };
    Ok(serde_json::json!({"id": id, "name": name, "key": key, "payload": payload}))
}

/// The input the definition's first trigger that matches `event` gives its
/// run (said on stderr), or why none does.
fn triggered_input(sb: &Sandbox, wf: &Workflow, event: &Value) -> Result<Value, String> {
    let name = event["name"].as_str().unwrap_or_default();
    for (i, t) in wf.triggers.iter().enumerate().filter(|(_, t)| t.event == name) {
        match t.fire(sb, event) {
            Ok(Some(fired)) => {
                let key = fired.idempotency_key.map(|k| format!(", idempotency key {k:?}")).unwrap_or_default();
                let Some(flow) = fired.flow else {
                    eprintln!("trigger {i} ({name}) starts the run{key}");
                    return Ok(fired.input);
                };
                let flow_of = composer_core::definition::Flow { hold: flow.hold.clone(), singleton: flow.singleton };
                eprintln!("trigger {i} ({name}) starts the run{key}; {} (key {:?})", flow_of.describe(), flow.key);
                // A batch's run takes its events' inputs as a list: this one alone.
                return Ok(match flow.hold {
                    Some(composer_core::flow::Hold::Batch { .. }) => Value::Array(vec![fired.input]),
                    _ => fired.input,
                });
            }
            Ok(None) => eprintln!("trigger {i} ({name}): its condition does not hold"),
            Err(e) => eprintln!("trigger {i} ({name}) fails: {e}"),
        }
    }
    Err(format!("no run: no trigger of {} starts one for this {name:?} event", wf.spec.name))
}

fn prepare(file: &Path, input: &str, mocks: &[String], failures: &[String]) -> anyhow::Result<(Workflow, Options)> {
    let spec = crate::input::read_spec(file)?;
    let parsed = composer_core::expr::on_eval_stack(|| Workflow::parse(&spec)).map_err(|e| anyhow!(e))?;
    let wf = parsed.map_err(|e| anyhow!("{} is not a valid definition: {e}", file.display()))?;
    let input = json_arg(input).context("--input")?;
    let mut opts = Options { input, ..Default::default() };
    for m in mocks {
        let (node, value) =
            m.split_once('=').ok_or_else(|| anyhow!("--mock {m:?}: expected NODE=JSON or NODE=@FILE"))?;
        known(&wf, node, "--mock")?;
        opts.mocks.insert(node.to_string(), json_arg(value).with_context(|| format!("--mock {node}"))?);
    }
    for f in failures {
        let (node, message) = f.split_once('=').unwrap_or((f, "failed (simulated)"));
        known(&wf, node, "--fail")?;
        opts.failures.insert(node.to_string(), message.to_string());
    }
    Ok((wf, opts))
}

/// A node of the definition, or one item of a MAP (`ship_each[3]`).
fn known(wf: &Workflow, node: &str, flag: &str) -> anyhow::Result<()> {
    if wf.node_index(node).is_some() {
        return Ok(());
    }
    let item = node.strip_suffix(']').and_then(|n| n.split_once('['));
    // A MAP's items and a LOOP's iterations are named by their index.
    let indexed = |id: &str| {
        wf.map_template(id).is_some()
            || wf
                .node_index(id)
                .is_some_and(|n| matches!(wf.nodes[n].kind, composer_core::definition::NodeKind::Loop(_)))
    };
    match item {
        Some((parent, index)) if indexed(parent) && index.parse::<u32>().is_ok() => Ok(()),
        Some((parent, _)) if indexed(parent) => {
            Err(anyhow!("{flag} {node}: an item or iteration is named by its index, such as {parent}[0]"))
        }
        _ => Err(anyhow!("{flag} {node}: the definition has no node {node:?}")),
    }
}

/// JSON, or `@FILE` holding JSON.
fn json_arg(arg: &str) -> anyhow::Result<Value> {
    let text = match arg.strip_prefix('@') {
        Some(path) => std::fs::read_to_string(path).with_context(|| format!("cannot read {path}"))?,
        None => arg.to_string(),
    };
    serde_json::from_str(&text).context("not valid JSON")
}

fn text(r: &Report) -> String {
    let mut out = format!("run {}\n", r.status);
    let width = r.nodes.iter().map(|n| n.id.len()).max().unwrap_or(0);
    let type_width = r.nodes.iter().map(|n| n.node_type.len()).max().unwrap_or(0);
    for n in &r.nodes {
        let mut line = format!("  {:width$}  {:type_width$}  {}", n.id, n.node_type, n.state);
        if n.attempts > 1 {
            line.push_str(&format!(" after {} attempts", n.attempts));
        }
        out.push_str(line.trim_end());
        out.push('\n');
        for (label, v) in [("input", &n.input), ("output", &n.output)] {
            let empty = v.as_ref().is_some_and(|v| v.as_object().is_some_and(|o| o.is_empty()));
            if let Some(v) = v.as_ref().filter(|_| !empty || label == "output") {
                out.push_str(&format!("  {:width$}    {label}: {v}\n", ""));
            }
        }
        if let Some(e) = &n.error {
            out.push_str(&format!("  {:width$}    error: {e}\n", ""));
        }
        if !n.limit_keys.is_empty() {
            out.push_str(&format!("  {:width$}    limits: {} (not simulated)\n", "", n.limit_keys.join(", ")));
        }
    }
    if !r.edges.is_empty() {
        out.push_str("edges\n");
        for e in &r.edges {
            let on = match e.on {
                "success" => String::new(),
                other => format!(" (on {other})"),
            };
            let taken = if e.taken { "taken" } else { "not taken" };
            out.push_str(&format!("  {} -> {}{on}  {taken}\n", e.from, e.to));
        }
    }
    match (&r.output, &r.error) {
        (Some(o), _) => out.push_str(&format!("output {o}\n")),
        (None, Some(e)) => out.push_str(&format!("error {e}\n")),
        _ => {}
    }
    if !r.hooks.is_empty() {
        out.push_str("hooks (started by the end)\n");
        for h in &r.hooks {
            let what = match (&h.input, &h.error) {
                (Some(input), _) => format!("input {input}"),
                (None, Some(e)) => format!("not started: {e}"),
                _ => String::new(),
            };
            out.push_str(&format!("  {} -> {}  {what}\n", h.hook, h.workflow));
        }
    }
    if !r.updates.is_empty() {
        out.push_str("updates\n");
        for u in &r.updates {
            let answer = match (&u.output, &u.reason) {
                (Some(o), _) => format!("accepted, output {o}"),
                (None, Some(why)) => format!("refused: {why}"),
                _ => String::new(),
            };
            out.push_str(&format!("  {} -> step {}  {answer}\n", u.name, u.node));
        }
    }
    if !r.deadlines.is_empty() {
        out.push_str("deadlines\n");
        for d in &r.deadlines {
            let of = d.node.as_deref().map_or("the run".to_string(), |n| format!("step {n}"));
            let fires = if d.fires { "fires" } else { "does not fire" };
            out.push_str(&format!("  {of} after {} -> {}  {fires}\n", d.after, d.workflow));
        }
    }
    for note in &r.notes {
        out.push_str(&format!("note: {note}\n"));
    }
    out
}
