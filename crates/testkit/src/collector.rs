//! A real OpenTelemetry collector for the traces' tests: Rotel (an OTLP
//! receiver, from PyPI's `rotel`, installed by `scripts/deps`), started on
//! free ports with its debug log of every span it receives, which
//! [`Collector::spans`] reads back.
//!
//! Its binary is `COMPOSER_TEST_ROTEL`, else the one Python's `rotel`
//! package carries.

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::eventually::{eventually, eventually_blocking};

/// A span as the collector received it.
#[derive(Debug, Clone, Default)]
pub struct ReceivedSpan {
    pub trace_id: String,
    /// Empty for a root span.
    pub parent_id: String,
    pub id: String,
    pub name: String,
    /// `SPAN_KIND_INTERNAL`, `SPAN_KIND_CLIENT`, …
    pub kind: String,
    pub start_ns: u128,
    pub end_ns: u128,
    /// Values as the collector prints them: `Str(x)` as `x`, `Int(1)` as `1`.
    pub attributes: HashMap<String, String>,
    /// The events' names, in order.
    pub events: Vec<String>,
    /// `(trace id, span id)` of each link.
    pub links: Vec<(String, String)>,
    /// `STATUS_CODE_ERROR` and its message, when the span failed.
    pub status: Option<(String, String)>,
}

/// A running collector; stopped when dropped.
pub struct Collector {
    child: Child,
    dir: PathBuf,
    /// The OTLP/HTTP base URL (`COMPOSER_OTLP_ENDPOINT`).
    pub endpoint: String,
}

fn binary() -> PathBuf {
    if let Some(p) = std::env::var_os("COMPOSER_TEST_ROTEL") {
        return p.into();
    }
    let found = Command::new("python3")
        .args(["-c", "import os, rotel; print(os.path.join(os.path.dirname(rotel.__file__), 'rotel-agent'))"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| PathBuf::from(String::from_utf8_lossy(&o.stdout).trim()));
    match found {
        Some(p) if p.exists() => p,
        _ => panic!("no OTLP collector: run scripts/deps (it installs rotel from PyPI) or set COMPOSER_TEST_ROTEL"),
    }
}

/// Tries of [`Collector::start`]: a free port can be taken by another test
/// between its choice and the collector's bind.
const START_TRIES: usize = 5;

impl Collector {
    /// A collector on free ports, listening.
    pub fn start() -> Collector {
        for _ in 1..START_TRIES {
            if let Some(c) = Collector::try_start() {
                return c;
            }
        }
        Collector::try_start()
            .unwrap_or_else(|| panic!("the collector could not bind its ports in {START_TRIES} tries"))
    }

    /// `None` when it exited (it could not bind a port): the port that
    /// answered then is somebody else's, where spans would be lost.
    fn try_start() -> Option<Collector> {
        let dir = composer_embedded::temp_dir("otlp").unwrap();
        let (grpc, http) = (composer_embedded::free_port().unwrap(), composer_embedded::free_port().unwrap());
        let out = std::fs::File::create(dir.join("spans.log")).unwrap();
        let mut child = Command::new(binary())
            .arg("start")
            .args(["--otlp-grpc-endpoint", &format!("127.0.0.1:{grpc}")])
            .args(["--otlp-http-endpoint", &format!("127.0.0.1:{http}")])
            .args(["--exporter", "blackhole", "--debug-log", "traces", "--debug-log-verbosity", "detailed"])
            .arg("--pid-file")
            .arg(dir.join("rotel.pid"))
            .arg("--log-file")
            .arg(dir.join("rotel.log"))
            .stdin(Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .spawn()
            .unwrap();
        let exited = |child: &mut Child| child.try_wait().ok().flatten().is_some();
        eventually_blocking(Duration::from_secs(20), format!("the collector to listen on {http}"), || {
            (std::net::TcpStream::connect(("127.0.0.1", http)).is_ok() || exited(&mut child)).then_some(())
        });
        // An absence, so a fixed time: a collector that could not bind one of
        // its ports exits within milliseconds; one still running holds both.
        std::thread::sleep(Duration::from_millis(300));
        let mut collector = Collector { child, dir, endpoint: format!("http://127.0.0.1:{http}") };
        (!exited(&mut collector.child)).then_some(collector)
    }

    /// Every span received so far.
    pub fn spans(&self) -> Vec<ReceivedSpan> {
        parse(&std::fs::read_to_string(self.dir.join("spans.log")).unwrap_or_default())
    }

    /// Waits until `done` holds of the spans received (at most `within`).
    pub async fn wait_for(&self, within: Duration, done: impl Fn(&[ReceivedSpan]) -> bool) -> Vec<ReceivedSpan> {
        let done = &done;
        eventually(within, "the spans awaited to arrive", || async move {
            let spans = self.spans();
            if done(&spans) {
                Ok(spans)
            } else {
                Err(format!("{spans:#?}"))
            }
        })
        .await
    }
}

impl Drop for Collector {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[derive(PartialEq)]
enum Section {
    Head,
    Attributes,
    Events,
    Links,
}

/// Reads the collector's detailed debug log.
fn parse(log: &str) -> Vec<ReceivedSpan> {
    let mut spans: Vec<ReceivedSpan> = Vec::new();
    let mut section = Section::Head;
    let mut link_trace = String::new();
    for line in log.lines() {
        if line.starts_with("Span #") {
            spans.push(ReceivedSpan::default());
            section = Section::Head;
            continue;
        }
        if line.starts_with("ResourceSpans #") || line.starts_with("ScopeSpans #") {
            section = Section::Head;
            if let Some(s) = spans.last_mut() {
                // What follows belongs to no span until the next one.
                if !s.id.is_empty() {
                    spans.push(ReceivedSpan::default());
                }
            }
            continue;
        }
        let Some(span) = spans.last_mut() else { continue };
        let field = |prefix: &str| line.strip_prefix(prefix).map(|v| v.trim().to_string());
        match line {
            "Attributes:" => section = Section::Attributes,
            "Events:" => section = Section::Events,
            "Links:" => section = Section::Links,
            _ if section == Section::Head => {
                if let Some(v) = field("    Trace ID       :") {
                    span.trace_id = v;
                } else if let Some(v) = field("    Parent ID      :") {
                    span.parent_id = v;
                } else if let Some(v) = field("    ID             :") {
                    span.id = v;
                } else if let Some(v) = field("    Name           :") {
                    span.name = v;
                } else if let Some(v) = field("    Kind           :") {
                    span.kind = v;
                } else if let Some(v) = field("Start time:") {
                    span.start_ns = v.parse().unwrap_or(0);
                } else if let Some(v) = field("End time:") {
                    span.end_ns = v.parse().unwrap_or(0);
                } else if let Some(v) = field("    Status code    :") {
                    span.status = Some((v, String::new()));
                } else if let Some(v) = field("    Status message :") {
                    if let Some(s) = &mut span.status {
                        s.1 = v;
                    }
                }
            }
            _ => {
                let Some(kv) = line.trim_start().strip_prefix("-> ") else { continue };
                let Some((k, v)) = kv.split_once(": ") else { continue };
                match section {
                    Section::Attributes => {
                        let v = v
                            .strip_suffix(')')
                            .and_then(|v| v.split_once('('))
                            .map_or(v.to_string(), |(_, inner)| inner.to_string());
                        span.attributes.insert(k.to_string(), v);
                    }
                    Section::Events if k == "Name" => span.events.push(v.to_string()),
                    Section::Links if k == "Trace ID" => link_trace = v.to_string(),
                    Section::Links if k == "ID" => span.links.push((link_trace.clone(), v.to_string())),
                    _ => {}
                }
            }
        }
    }
    spans.retain(|s| !s.id.is_empty());
    spans
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_debug_log_reads_back_as_spans() {
        let log = [
            "ResourceSpans #0",
            "Resource attributes:",
            "     -> service.name: Str(composer)",
            "ScopeSpans #0",
            "Span #0",
            "    Trace ID       : aa",
            "    Parent ID      : ",
            "    ID             : bb",
            "    Name           : run x",
            "    Kind           : SPAN_KIND_INTERNAL",
            "Start time: 1",
            "End time: 2",
            "Attributes:",
            "     -> composer.attempt: Int(2)",
            "     -> composer.node: Str(a: b)",
            "Events:",
            "SpanEvent #0",
            "     -> Name: commit",
            "     -> Timestamp: 1",
            "Links:",
            "SpanLink #0",
            "     -> Trace ID: cc",
            "     -> ID: dd",
            "Span #1",
            "    Trace ID       : aa",
            "    Parent ID      : bb",
            "    ID             : ee",
            "Start time: 1",
            "End time: 2",
            "    Status code    : STATUS_CODE_ERROR",
            "    Status message : boom",
        ]
        .join("\n");
        let spans = parse(&log);
        assert_eq!(spans.len(), 2);
        assert_eq!((spans[0].name.as_str(), spans[0].parent_id.as_str()), ("run x", ""));
        assert_eq!(spans[0].attributes["composer.attempt"], "2");
        assert_eq!(spans[0].attributes["composer.node"], "a: b");
        assert!(!spans[0].attributes.contains_key("service.name"));
        assert_eq!(spans[0].events, ["commit"]);
        assert_eq!(spans[0].links, [("cc".to_string(), "dd".to_string())]);
        assert_eq!(spans[1].status, Some(("STATUS_CODE_ERROR".into(), "boom".into())));
    }
}
