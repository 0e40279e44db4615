//! OpenTelemetry traces of runs, with `COMPOSER_OTLP_ENDPOINT` set.
//!
//! A run is a trace: its span lasts from its creation to its end, and each
//! attempt of each step is a span under it, from the commit that dispatched
//! it to the commit that applied its end, with an event at every stage
//! between (`commit`, `publish`, `read`, `lease`, `execute`, `report`, as
//! the worker saw them). Steps the engine runs itself (a TRANSFORM, a WAIT,
//! a SUB_WORKFLOW's wait for its child) are spans too. A child run's span
//! sits under its parent's attempt, a failure handler's under the run that
//! failed, so a tree of runs is one trace.
//!
//! Spans are recorded after the fact, by the coordinator whose commit ended
//! them, from what the transaction held: nothing about a span is stored.
//! That works because span ids are derived (`composer_core::trace`): any
//! coordinator can name the parent of what it records, and a worker can be
//! told its attempt's span before that span exists. A run's span is
//! recorded when the run ends; until then a viewer shows its attempts
//! under a parent still to come.
//!
//! Export is the OpenTelemetry SDK's batch processor and OTLP/HTTP
//! exporter. Its HTTP calls go through this process's own client on the
//! async runtime; the batch processor's thread waits for them. A receiver
//! that is down or slow loses spans (the processor's queue is bounded),
//! never steps.

use std::borrow::Cow;
use std::collections::HashMap;
use std::time::{Duration, SystemTime};

use chrono::{DateTime, Utc};
use composer_api::wire::StageTimes;
use composer_core::definition::Workflow;
use composer_core::machine::{self, TaskState, Transition};
use composer_core::trace::{RunTrace, TraceContext};
use opentelemetry::trace::{SpanContext, SpanId, SpanKind, Status, TraceFlags, TraceId, TraceState};
use opentelemetry::{InstrumentationScope, KeyValue};
use opentelemetry_sdk::trace::{BatchSpanProcessor, SpanData, SpanEvents, SpanLinks, SpanProcessor};
use opentelemetry_sdk::Resource;
use uuid::Uuid;

/// Longest answer read from the receiver (an OTLP answer is a few bytes).
const MAX_ANSWER: usize = 64 * 1024;
/// Spans queued for export at most, unless `OTEL_BSP_MAX_QUEUE_SIZE` says
/// (the SDK's own default, 2,048, is less than one commit of a large MAP
/// ends); past it spans are dropped.
pub const MAX_QUEUED_SPANS: usize = 65_536;
/// Least time between two warnings that exports fail.
const WARN_EVERY: Duration = Duration::from_secs(60);
/// How long one export may take before it is given up.
const EXPORT_TIMEOUT: Duration = Duration::from_secs(10);

/// The attribute of every span that names its namespace.
pub const NAMESPACE_ATTRIBUTE: &str = "composer.namespace";

/// Where this coordinator's spans go.
pub struct Traces {
    processor: BatchSpanProcessor,
    scope: InstrumentationScope,
}

impl std::fmt::Debug for Traces {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Traces")
    }
}

impl Traces {
    /// Exports to the OTLP/HTTP receiver at `endpoint` (a base URL, as
    /// `OTEL_EXPORTER_OTLP_ENDPOINT` is: spans go to `<endpoint>/v1/traces`),
    /// with `headers` on every request (a receiver's API key), from the
    /// runtime this is called on.
    pub fn start(endpoint: &str, headers: HashMap<String, String>, instance: &str) -> Result<Traces, String> {
        use opentelemetry_otlp::{WithExportConfig, WithHttpConfig};
        let client = reqwest::Client::builder()
            .timeout(EXPORT_TIMEOUT)
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| format!("cannot build the OTLP client: {e}"))?;
        let http = Http { client, runtime: tokio::runtime::Handle::current(), warned: Default::default() };
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_http_client(http)
            .with_endpoint(format!("{}/v1/traces", endpoint.trim_end_matches('/')))
            .with_timeout(EXPORT_TIMEOUT)
            .with_headers(headers)
            .build()
            .map_err(|e| format!("cannot build the OTLP exporter: {e}"))?;
        let mut config = opentelemetry_sdk::trace::BatchConfigBuilder::default();
        if std::env::var_os("OTEL_BSP_MAX_QUEUE_SIZE").is_none() {
            config = config.with_max_queue_size(MAX_QUEUED_SPANS);
        }
        let mut processor = BatchSpanProcessor::builder(exporter).with_batch_config(config.build()).build();
        let resource = Resource::builder()
            .with_service_name("composer")
            .with_attribute(KeyValue::new("service.instance.id", instance.to_string()))
            .with_attribute(KeyValue::new("service.version", env!("CARGO_PKG_VERSION")))
            .build();
        processor.set_resource(&resource);
        let scope = InstrumentationScope::builder("composer").with_version(env!("CARGO_PKG_VERSION")).build();
        Ok(Traces { processor, scope })
    }

    /// Hands finished spans to the exporter (never waits for it), each
    /// naming the namespace of the work that made it (`composer.namespace`).
    pub fn record(&self, spans: Vec<Span>) {
        // One end for the commit's spans: a run ends with its last steps.
        let end = SystemTime::now();
        let namespace: opentelemetry::Value = match crate::metrics::current() {
            Some(ns) => ns.to_string().into(),
            None => composer_store::namespaces::DEFAULT.into(),
        };
        for mut s in spans {
            s.attributes.push(KeyValue::new(NAMESPACE_ATTRIBUTE, namespace.clone()));
            self.processor.on_end(s.into_data(&self.scope, end));
        }
    }

    /// Sends what is queued, waiting at most the export timeout; blocks,
    /// so the caller is off the async runtime (the export needs it). Spans
    /// still queued when `Traces` is dropped without a flush are lost: the
    /// exporter's thread just ends.
    pub fn flush(&self) {
        if let Err(e) = self.processor.force_flush() {
            tracing::warn!(error = %e, "exporting the last spans failed");
        }
    }
}

/// The exporter's HTTP client: requests run on the async runtime, whatever
/// thread asks.
#[derive(Debug)]
struct Http {
    client: reqwest::Client,
    runtime: tokio::runtime::Handle,
    /// When a failed export was last warned of.
    warned: std::sync::Mutex<Option<std::time::Instant>>,
}

impl Http {
    /// Counts a batch the receiver did not take, and says so in the log at
    /// most once a minute.
    fn failed(&self, why: &str) {
        crate::metrics::inc(composer_metrics::TRACE_EXPORT_FAILURES, &[], 1);
        let mut warned = self.warned.lock().unwrap_or_else(|p| p.into_inner());
        if warned.is_none_or(|at| at.elapsed() >= WARN_EVERY) {
            *warned = Some(std::time::Instant::now());
            tracing::warn!(error = why, "exporting spans failed; they are lost (composer_trace_export_failures_total)");
        }
    }
}

#[async_trait::async_trait]
impl opentelemetry_http::HttpClient for Http {
    async fn send_bytes(
        &self,
        request: axum::http::Request<axum::body::Bytes>,
    ) -> Result<axum::http::Response<axum::body::Bytes>, opentelemetry_http::HttpError> {
        let client = self.client.clone();
        let (parts, body) = request.into_parts();
        let call = async move {
            let mut resp =
                client.request(parts.method, parts.uri.to_string()).headers(parts.headers).body(body).send().await?;
            let mut answer = axum::http::Response::builder().status(resp.status());
            for (name, value) in resp.headers() {
                answer = answer.header(name, value);
            }
            let mut body = Vec::new();
            while let Some(chunk) = resp.chunk().await? {
                if body.len() + chunk.len() > MAX_ANSWER {
                    break;
                }
                body.extend_from_slice(&chunk);
            }
            Ok::<_, opentelemetry_http::HttpError>(answer.body(axum::body::Bytes::from(body))?)
        };
        let answer = match self.runtime.spawn(call).await {
            Ok(answer) => answer,
            Err(e) => Err(e.into()),
        };
        match &answer {
            Ok(r) if !r.status().is_success() => self.failed(&format!("the receiver answered {}", r.status())),
            Ok(_) => {}
            Err(e) => self.failed(&e.to_string()),
        }
        answer
    }
}

/// What a transaction knew of a run's open tasks when it loaded them, and
/// what its events told of their attempts: what the spans its commit ends
/// are made of. Empty unless traces are on.
#[derive(Debug, Default)]
pub struct Seen {
    /// Each task loaded: its attempt, state, and since when it has been in
    /// that state (its lease's start while RUNNING).
    pub tasks: HashMap<Uuid, (i32, TaskState, DateTime<Utc>)>,
    /// What a worker said of an attempt's stages.
    pub stages: HashMap<Uuid, StageTimes>,
    /// The trace of an event a waiting task received.
    pub links: HashMap<Uuid, TraceContext>,
}

impl Seen {
    pub fn task(&mut self, id: Uuid, attempt: i32, state: TaskState, since: DateTime<Utc>) {
        self.tasks.insert(id, (attempt, state, since));
    }
}

/// What an event tells the trace of the task it names.
#[derive(Debug, Clone, Copy, Default)]
pub struct TraceNote {
    pub task_id: Option<Uuid>,
    pub stages: Option<StageTimes>,
    pub link: Option<TraceContext>,
}

impl TraceNote {
    pub fn add_to(self, seen: &mut Seen) {
        let Some(task) = self.task_id else { return };
        if let Some(s) = self.stages {
            seen.stages.insert(task, s);
        }
        if let Some(l) = self.link {
            seen.links.insert(task, l);
        }
    }
}

/// A span ended by a commit, its end still to be stamped (the commit's time).
#[derive(Debug, Clone)]
pub struct Span {
    trace_id: [u8; 16],
    span_id: [u8; 8],
    parent: Option<[u8; 8]>,
    kind: SpanKind,
    name: String,
    start: SystemTime,
    attributes: Vec<KeyValue>,
    events: Vec<(&'static str, SystemTime)>,
    links: Vec<TraceContext>,
    error: Option<String>,
}

impl Span {
    fn into_data(self, scope: &InstrumentationScope, end: SystemTime) -> SpanData {
        let context = |trace: [u8; 16], span: [u8; 8]| {
            SpanContext::new(
                TraceId::from_bytes(trace),
                SpanId::from_bytes(span),
                TraceFlags::SAMPLED,
                false,
                TraceState::default(),
            )
        };
        let events = self
            .events
            .into_iter()
            .map(|(name, at)| opentelemetry::trace::Event::new(name, at.min(end), Vec::new(), 0))
            .collect();
        let links = self
            .links
            .into_iter()
            .map(|l| opentelemetry::trace::Link::new(context(l.trace_id, l.span_id), Vec::new(), 0))
            .collect();
        SpanData {
            span_context: context(self.trace_id, self.span_id),
            parent_span_id: self.parent.map_or(SpanId::INVALID, SpanId::from_bytes),
            parent_span_is_remote: false,
            span_kind: self.kind,
            name: Cow::Owned(self.name),
            start_time: self.start.min(end),
            end_time: end,
            attributes: self.attributes,
            dropped_attributes_count: 0,
            events: {
                let mut e = SpanEvents::default();
                e.events = events;
                e
            },
            links: {
                let mut l = SpanLinks::default();
                l.links = links;
                l
            },
            status: match self.error {
                Some(message) => Status::error(printable(&message)),
                None => Status::Unset,
            },
            instrumentation_scope: scope.clone(),
        }
    }

    pub fn name(&self) -> &str {
        &self.name
    }
}

/// Longest error message a span carries.
const MAX_SPAN_ERROR: usize = 1024;

/// `text` with its control characters written out (`\u{1b}`), so that an
/// error someone wrote cannot forge lines in a receiver's log.
fn printable(text: &str) -> String {
    if !text.chars().any(char::is_control) {
        return text.to_string();
    }
    text.chars().map(|c| if c.is_control() { c.escape_unicode().to_string() } else { c.to_string() }).collect()
}

/// The spans a run's commit ends: the attempts of its tasks that ended (or
/// moved to another attempt), and the run's own when it ended. `now` is the
/// commit's time.
pub fn spans_of(
    wf: &Workflow,
    version: i32,
    run: &machine::Run,
    tr: &Transition,
    traceparent: Option<&str>,
    seen: &Seen,
    now: SystemTime,
) -> Vec<Span> {
    let commit =
        CommitSpans { wf, run, trace: RunTrace::of(run.id, traceparent), seen, created: created(run.id, now), now };
    let mut spans = Vec::new();
    // The run's span first: a burst past the export queue loses the last.
    if tr.run_changed && run.status.is_terminal() {
        spans.push(commit.run_span(version));
    }
    let mut touched: Vec<usize> = tr.updated.iter().chain(&tr.created).copied().collect();
    touched.sort_unstable();
    touched.dedup();
    for i in touched {
        let task = &run.tasks[i];
        if task.removed {
            continue;
        }
        if let Some((attempt, since)) = commit.ended_attempt(task) {
            spans.push(commit.attempt_span(task, attempt, since));
        }
    }
    spans
}

/// When run `id` was created: a UUIDv7 carries the millisecond it was made.
fn created(id: Uuid, now: SystemTime) -> SystemTime {
    id.get_timestamp()
        .map(|t| t.to_unix())
        .map_or(now, |(secs, nanos)| SystemTime::UNIX_EPOCH.checked_add(Duration::new(secs, nanos)).unwrap_or(now))
}

/// What the spans one commit of a run ends are made of.
struct CommitSpans<'a> {
    wf: &'a Workflow,
    run: &'a machine::Run,
    trace: RunTrace,
    seen: &'a Seen,
    /// When the run was created.
    created: SystemTime,
    /// The commit's time.
    now: SystemTime,
}

impl CommitSpans<'_> {
    /// The run's span, from its creation to its end.
    fn run_span(&self, version: i32) -> Span {
        let (wf, run) = (self.wf, self.run);
        Span {
            trace_id: self.trace.trace_id,
            span_id: self.trace.run_span,
            parent: self.trace.parent,
            kind: SpanKind::Internal,
            name: format!("run {}", wf.spec.name),
            start: self.created,
            attributes: vec![
                KeyValue::new("composer.run.id", run.id.to_string()),
                KeyValue::new("composer.workflow", wf.spec.name.clone()),
                KeyValue::new("composer.workflow.version", version as i64),
                KeyValue::new("composer.run.status", run.status.as_str()),
            ],
            events: Vec::new(),
            links: Vec::new(),
            error: (run.status == machine::RunStatus::Failed)
                .then(|| composer_core::clipped(run.error.as_deref().unwrap_or("failed"), MAX_SPAN_ERROR)),
        }
    }

    /// The attempt of `task` this commit ended, and since when it ran, if
    /// it ended one.
    fn ended_attempt(&self, task: &machine::Task) -> Option<(i32, SystemTime)> {
        let (attempt, before, since) = match self.seen.tasks.get(&task.id) {
            Some(&(attempt, state, since)) => (attempt, Some(state), SystemTime::from(since)),
            None => (task.attempt, None, self.now),
        };
        // An attempt ends when its task does, or when a retry follows it:
        // at once (another attempt) or after a backoff (WAITING, from an
        // attempt that was out). A wait that ends in a retry was ended
        // already; a step skipped never ran; one reset to run again did not end.
        let out = matches!(before, Some(TaskState::Pending | TaskState::Running | TaskState::InDoubt));
        let ended = task.state.is_terminal()
            || (before != Some(TaskState::Waiting) && task.attempt != attempt)
            || (out && task.state == TaskState::Waiting);
        if before.is_some_and(TaskState::is_terminal) || !ended || task.state == TaskState::Skipped {
            return None;
        }
        Some((attempt, since))
    }

    /// The span of `task`'s `attempt`, from `since` (or its earliest stage)
    /// to the commit, under the run's span.
    fn attempt_span(&self, task: &machine::Task, attempt: i32, since: SystemTime) -> Span {
        let node = &self.wf.nodes[task.node];
        let outcome = match task.state {
            s if s.is_terminal() => s.as_str(),
            _ => "RETRIED",
        };
        let mut attributes = vec![
            KeyValue::new("composer.run.id", self.run.id.to_string()),
            KeyValue::new("composer.task.id", task.id.to_string()),
            KeyValue::new("composer.node", node.id.clone()),
            KeyValue::new("composer.node.type", node.node_type.clone()),
            KeyValue::new("composer.attempt", attempt as i64),
            KeyValue::new("composer.outcome", outcome),
        ];
        if let Some(item) = task.item {
            attributes.push(KeyValue::new("composer.item.index", item.index as i64));
        }
        if let Some(n) = task.iteration {
            attributes.push(KeyValue::new("composer.iterations", n as i64 + 1));
        }
        let events = self.stages(task.id);
        let start = events.iter().map(|&(_, t)| t).fold(since, SystemTime::min);
        let failed = matches!(task.state, TaskState::Failed) || (outcome == "RETRIED");
        Span {
            trace_id: self.trace.trace_id,
            span_id: composer_core::trace::attempt_span_id(task.id, attempt),
            parent: Some(self.trace.run_span),
            kind: if node.node_type == "HTTP" { SpanKind::Client } else { SpanKind::Internal },
            name: task.node_id(node).into_owned(),
            start,
            attributes,
            events,
            links: self.seen.links.get(&task.id).copied().into_iter().collect(),
            error: failed.then(|| composer_core::clipped(task.error.as_deref().unwrap_or("failed"), MAX_SPAN_ERROR)),
        }
    }

    /// The stages a worker said an attempt of task `id` passed, as events.
    /// A worker's clock may be off, or its report made up: a time outside
    /// the run's life is left out.
    fn stages(&self, id: Uuid) -> Vec<(&'static str, SystemTime)> {
        let Some(st) = self.seen.stages.get(&id) else { return Vec::new() };
        let at = |us: Option<i64>| {
            let t = SystemTime::UNIX_EPOCH.checked_add(Duration::from_micros(u64::try_from(us?).ok()?))?;
            (self.created <= t && t <= self.now).then_some(t)
        };
        [
            ("commit", at(st.dispatched_at_us)),
            ("publish", at(st.published_at_us)),
            ("read", at(st.read_at_us)),
            ("lease", at(st.leased_at_us)),
            ("execute", at(st.started_at_us)),
            ("report", at(st.finished_at_us)),
        ]
        .into_iter()
        .filter_map(|(name, t)| Some((name, t?)))
        .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use composer_core::machine::{Event, Run};
    use serde_json::json;

    fn workflow() -> Workflow {
        Workflow::parse(&json!({"name": "w", "nodes": [
            {"id": "call", "type": "HTTP", "config": {"url": "http://x"}, "retry": {"max_attempts": 2}},
            {"id": "shape", "type": "TRANSFORM", "config": {"output": 1}},
            {"id": "never", "type": "TRANSFORM", "config": {"output": 2}}],
            "edges": [{"from": "call", "to": "shape"}, {"from": "call", "to": "never", "when": "false"}]}))
        .unwrap()
    }

    fn apply(wf: &Workflow, run: &mut Run, event: Event) -> Transition {
        machine::apply(
            &composer_core::expr::Sandbox::simple_only(),
            wf,
            run,
            event,
            crate::clock::now(),
            &mut Uuid::now_v7,
        )
    }

    /// What a transaction would see of the run's tasks as they stand.
    fn seen(run: &Run) -> Seen {
        let mut seen = Seen::default();
        for t in &run.tasks {
            seen.task(t.id, t.attempt, t.state, crate::clock::now() - chrono::Duration::milliseconds(5));
        }
        seen
    }

    fn names(spans: &[Span]) -> Vec<&str> {
        spans.iter().map(Span::name).collect()
    }

    #[test]
    fn a_commit_ends_the_spans_of_the_attempts_it_ended_and_the_runs_when_the_run_ends() {
        let wf = workflow();
        let mut run = Run::new(Uuid::now_v7(), json!({}));
        std::thread::sleep(Duration::from_millis(10)); // so that its stages come after its creation
        let tr = apply(&wf, &mut run, Event::RunStarted);
        assert!(spans_of(&wf, 1, &run, &tr, None, &Seen::default(), SystemTime::now()).is_empty(), "nothing ended");

        let call = run.tasks[0].id;
        run.tasks[0].state = TaskState::Running; // as its lease left it
        let before = seen(&run);
        let failed = Event::TaskFailed {
            task_id: call,
            attempt: 1,
            error: "boom".into(),
            retryable: true,
            code: None,
            status: Some(503),
            retry_after: None,
        };
        let tr = apply(&wf, &mut run, failed);
        let spans = spans_of(&wf, 1, &run, &tr, None, &before, SystemTime::now());
        assert_eq!(names(&spans), ["call"], "the first attempt ended, retried");
        assert_eq!(spans[0].error.as_deref(), Some(run.tasks[0].error.as_deref().unwrap()));
        assert_eq!(spans[0].span_id, composer_core::trace::attempt_span_id(call, 1));

        assert_eq!(run.tasks[0].state, TaskState::Waiting, "its backoff");
        let before = seen(&run);
        let later = crate::clock::now() + chrono::Duration::hours(1);
        let sb = composer_core::expr::Sandbox::simple_only();
        let tr = machine::apply(&sb, &wf, &mut run, Event::TimerFired { task_id: call }, later, &mut Uuid::now_v7);
        assert_eq!(run.tasks[0].attempt, 2);
        assert!(spans_of(&wf, 1, &run, &tr, None, &before, SystemTime::now()).is_empty(), "ended once, not twice");

        run.tasks[0].state = TaskState::Running;
        let mut before = seen(&run);
        let now = SystemTime::now();
        let us = |t: SystemTime| t.duration_since(SystemTime::UNIX_EPOCH).unwrap().as_micros() as i64;
        before.stages.insert(
            call,
            StageTimes {
                dispatched_at_us: Some(us(now) - 3_000),
                published_at_us: Some(i64::MAX),
                read_at_us: Some(-5),
                finished_at_us: Some(us(now) - 1_000),
                ..StageTimes::default()
            },
        );
        let tr = apply(&wf, &mut run, Event::TaskCompleted { task_id: call, attempt: 2, output: json!({}) });
        let spans = spans_of(&wf, 1, &run, &tr, None, &before, now + Duration::from_millis(1));
        // `shape` ran inline in the same commit; `never` was skipped, so no span.
        assert_eq!(names(&spans), ["run w", "call", "shape"], "the run's first");
        let call_span = &spans[1];
        assert!(call_span.error.is_none());
        let events: Vec<&str> = call_span.events.iter().map(|(n, _)| *n).collect();
        assert_eq!(events, ["commit", "report"], "times outside the run's life are left out");
        assert!(call_span.start <= now - Duration::from_millis(2), "the span starts at the dispatch");
        let run_span = &spans[0];
        assert_eq!((run_span.trace_id, run_span.parent), (*run.id.as_bytes(), None));
        assert_eq!(run_span.span_id, composer_core::trace::run_span_id(run.id));
        assert!(spans.iter().skip(1).all(|s| s.parent == Some(run_span.span_id)));
    }

    #[test]
    fn a_run_started_under_a_traceparent_puts_its_spans_in_that_trace() {
        let wf = Workflow::parse(
            &json!({"name": "t", "nodes": [{"id": "a", "type": "TRANSFORM", "config": {"output": 1}}]}),
        )
        .unwrap();
        let mut run = Run::new(Uuid::now_v7(), json!({}));
        let tr = apply(&wf, &mut run, Event::RunStarted);
        let tp = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
        let spans = spans_of(&wf, 3, &run, &tr, Some(tp), &Seen::default(), SystemTime::now());
        assert_eq!(names(&spans), ["run t", "a"]);
        let caller = TraceContext::parse(tp).unwrap();
        assert!(spans.iter().all(|s| s.trace_id == caller.trace_id));
        assert_eq!(spans[0].parent, Some(caller.span_id));
        let data = spans[0].clone().into_data(&InstrumentationScope::builder("t").build(), SystemTime::now());
        assert!(data.attributes.contains(&KeyValue::new("composer.workflow.version", 3)));
    }

    #[test]
    fn an_error_cannot_forge_lines_in_a_receivers_log() {
        assert_eq!(printable("x\u{1b}[31mred\r\nINFO fake"), "x\\u{1b}[31mred\\u{d}\\u{a}INFO fake");
        assert_eq!(printable("plain é"), "plain é");
    }
}
