//! Micro-benchmarks of the pure core: the state machine on a 1,000-node DAG,
//! expression evaluation, and definition validation.
//! Run with `cargo bench -p composer-core`.

#![allow(clippy::unwrap_used)] // a test fails by panicking

use std::hint::black_box;

use chrono::Utc;
use composer_core::definition::Workflow;
use composer_core::expr::{Sandbox, Template};
use composer_core::machine::{apply, Event, Run, TaskState};
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use serde_json::{json, Value};
use uuid::Uuid;

/// `layers` layers of `width` HTTP nodes; each node depends on two nodes of
/// the layer before it.
fn layered(layers: usize, width: usize) -> Value {
    let mut nodes = Vec::new();
    let mut edges = Vec::new();
    for l in 0..layers {
        for w in 0..width {
            let id = format!("n{l}_{w}");
            nodes.push(
                json!({"id": id, "type": "HTTP", "config": {"url": "http://h/x", "body": {"n": "${ .input.n }"}}}),
            );
            if l > 0 {
                edges.push(json!({"from": format!("n{}_{}", l - 1, w), "to": id}));
                if width > 1 {
                    edges.push(json!({"from": format!("n{}_{}", l - 1, (w + 1) % width), "to": id}));
                }
            }
        }
    }
    json!({"name": "bench", "nodes": nodes, "edges": edges})
}

/// Runs a whole workflow through the machine: start, then complete every
/// dispatched task; returns how many events were applied.
fn run_all(wf: &Workflow) -> usize {
    run_all_with(wf, json!({"n": 1}))
}

/// [`run_all`] of a run with this input.
fn run_all_with(wf: &Workflow, input: Value) -> usize {
    let mut run = Run::new(Uuid::nil(), input);
    let mut n = 0u128;
    let mut ids = || {
        n += 1;
        Uuid::from_u128(n)
    };
    let now = Utc::now();
    // The layered DAG's expressions are simple: any thread evaluates them.
    let sb = Sandbox::simple_only();
    let mut pending: Vec<usize> = apply(&sb, wf, &mut run, Event::RunStarted, now, &mut ids).dispatch;
    let mut events = 1;
    while let Some(t) = pending.pop() {
        let task = &run.tasks[t];
        let e = Event::TaskCompleted { task_id: task.id, attempt: task.attempt, output: json!({"ok": true}) };
        pending.extend(apply(&sb, wf, &mut run, e, now, &mut ids).dispatch);
        events += 1;
    }
    assert!(run.tasks.iter().all(|t| t.state == TaskState::Completed));
    events
}

fn state_machine(c: &mut Criterion) {
    let wf = Workflow::parse(&layered(50, 20)).unwrap();
    let events = run_all(&wf);
    let mut g = c.benchmark_group("state_machine");
    g.throughput(Throughput::Elements(events as u64));
    g.bench_function("1000_node_dag_all_events", |b| b.iter(|| black_box(run_all(&wf))));
    let small = Workflow::parse(&layered(3, 1)).unwrap();
    g.throughput(Throughput::Elements(run_all(&small) as u64));
    g.bench_function("3_step_chain_all_events", |b| b.iter(|| black_box(run_all(&small))));
    // A 1 MiB input (1,024 strings of 1 KiB), read by every step or by the
    // first only: a step's scope converts the input only if it may read it.
    let input = json!({"n": 1, "list": vec!["x".repeat(1024); 1024]});
    let chain = |read: &str| {
        let nodes: Vec<Value> = (0..3)
            .map(|i| {
                let from = if i == 0 { ".input.n" } else { read };
                json!({"id": format!("s{i}"), "type": "HTTP", "config": {"url": "http://h/x", "body": {"n": format!("${{ {from} }}")}}})
            })
            .collect();
        let edges = [json!({"from": "s0", "to": "s1"}), json!({"from": "s1", "to": "s2"})];
        Workflow::parse(&json!({"name": "big", "nodes": nodes, "edges": edges})).unwrap()
    };
    let (read, unread) = (chain(".input.n"), chain(".nodes.s0.output.ok"));
    g.bench_function("3_step_chain_1_mib_input_read_by_each", |b| {
        b.iter(|| black_box(run_all_with(&read, input.clone())))
    });
    g.bench_function("3_step_chain_1_mib_input_read_by_first", |b| {
        b.iter(|| black_box(run_all_with(&unread, input.clone())))
    });
    g.finish();
}

fn expressions(c: &mut Criterion) {
    let ctx = json!({"input": {"amount": 42, "who": "ada", "items": [1, 2, 3]},
                     "nodes": {"charge": {"output": {"status": 200, "body": {"id": "ch_1"}}, "state": "COMPLETED"}}});
    let whole = Template::compile(&json!("${ .nodes.charge.output.body.id }")).unwrap();
    let text = Template::compile(&json!("paid ${ .input.amount } by ${ .input.who }")).unwrap();
    let config =
        Template::compile(&json!({"url": "http://h/${ .input.who }", "body": {"sum": "${ .input.items | add }",
        "id": "${ .nodes.charge.output.body.id }", "fixed": 1}}))
        .unwrap();
    let sb = Sandbox::simple_only();
    let mut g = c.benchmark_group("expressions");
    g.throughput(Throughput::Elements(1));
    g.bench_function("whole_path", |b| b.iter(|| black_box(whole.eval(&sb, &ctx).unwrap())));
    g.bench_function("interpolated_text", |b| b.iter(|| black_box(text.eval(&sb, &ctx).unwrap())));
    g.bench_function("http_config_3_expressions", |b| b.iter(|| black_box(config.eval(&sb, &ctx).unwrap())));
    g.finish();
}

fn validation(c: &mut Criterion) {
    let spec100 = layered(10, 10);
    let spec1000 = layered(50, 20);
    let mut g = c.benchmark_group("validation");
    g.bench_function("100_nodes", |b| b.iter(|| black_box(Workflow::parse(&spec100).unwrap())));
    g.bench_function("1000_nodes", |b| b.iter(|| black_box(Workflow::parse(&spec1000).unwrap())));
    g.finish();
}

criterion_group!(benches, state_machine, expressions, validation);
criterion_main!(benches);
