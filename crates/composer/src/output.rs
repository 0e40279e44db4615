//! How client commands print: a table for people (the default on a
//! terminal), JSON for tools (the default otherwise), or JSON lines (one
//! object per line, for a list's items).

use std::io::{IsTerminal, Write};

use composer_api::LogLineView;
use serde_json::Value;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Table,
    Json,
    Jsonl,
}

impl Format {
    /// `-o`, else a table on a terminal and JSON in a pipe.
    pub fn resolve(flag: Option<&str>) -> Format {
        match flag {
            Some("table") => Format::Table,
            Some("json") => Format::Json,
            Some("jsonl") => Format::Jsonl,
            _ if std::io::stdout().is_terminal() => Format::Table,
            _ => Format::Json,
        }
    }
}

/// A column: its header and where its value is in an item (a JSON pointer).
pub type Column = (&'static str, &'static str);

pub const RUN_COLUMNS: &[Column] = &[
    ("ID", "/id"),
    ("WORKFLOW", "/workflow"),
    ("VERSION", "/version"),
    ("STATUS", "/status"),
    ("CREATED", "/created_at"),
    ("FINISHED", "/finished_at"),
    ("ERROR", "/error"),
];
pub const TASK_COLUMNS: &[Column] = &[
    ("NODE", "/node_id"),
    ("TYPE", "/node_type"),
    ("STATE", "/state"),
    ("ATTEMPT", "/attempt"),
    ("STARTED", "/started_at"),
    ("FINISHED", "/finished_at"),
    ("ERROR", "/error"),
];
pub const EVENT_COLUMNS: &[Column] =
    &[("SEQ", "/seq"), ("TYPE", "/type"), ("AT", "/created_at"), ("PAYLOAD", "/payload")];
pub const WORKFLOW_COLUMNS: &[Column] = &[("NAME", "/name"), ("VERSION", "/version"), ("CREATED", "/created_at")];
pub const SCHEDULE_COLUMNS: &[Column] = &[
    ("ID", "/id"),
    ("WORKFLOW", "/workflow"),
    ("CRON", "/cron"),
    ("TIMEZONE", "/timezone"),
    ("PAUSED", "/paused"),
    ("NEXT", "/next_fire_times/0"),
    ("LAST RUN", "/last_run_id"),
];

pub const RECENT_EVENT_COLUMNS: &[Column] = &[
    ("SEQ", "/seq"),
    ("RECEIVED", "/received_at"),
    ("NAME", "/name"),
    ("ID", "/id"),
    ("SOURCE", "/source"),
    ("FIRST RUN", "/started_runs/0/run_id"),
    ("HELD BY", "/held/0/flow"),
    ("WAITERS", "/delivered_to_waiters"),
];

pub const WEBHOOK_COLUMNS: &[Column] =
    &[("NAME", "/name"), ("SCHEME", "/scheme"), ("SECRET", "/secret"), ("SECRET SET", "/secret_set"), ("URL", "/url")];

pub const LIMIT_COLUMNS: &[Column] = &[
    ("KEY", "/key"),
    ("RATE", "/rate"),
    ("BURST", "/burst"),
    ("CONCURRENCY", "/concurrency"),
    ("SET BY", "/set_by"),
    ("IN USE", "/in_use"),
    ("WAITING", "/waiting"),
    ("HELD UNTIL", "/held_until"),
];

/// Widest a table cell gets before it is cut.
const MAX_CELL: usize = 60;

/// A cell's text, and whether it is the value whole (not cut, nor a line
/// break or tab turned into a space).
fn cell(item: &Value, pointer: &str) -> (String, bool) {
    let text = match item.pointer(pointer) {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(s)) => s.clone(),
        Some(v) => v.to_string(),
    };
    let flat = text.replace(['\n', '\t'], " ");
    let whole = flat == text;
    if flat.chars().count() > MAX_CELL {
        let mut cut: String = flat.chars().take(MAX_CELL - 1).collect();
        cut.push('…');
        (cut, false)
    } else {
        (flat, whole)
    }
}

pub fn table(items: &[Value], columns: &[Column]) -> String {
    let cells: Vec<Vec<(String, bool)>> =
        items.iter().map(|i| columns.iter().map(|(_, p)| cell(i, p)).collect()).collect();
    let widths: Vec<usize> = columns
        .iter()
        .enumerate()
        .map(|(c, (h, _))| cells.iter().map(|r| r[c].0.chars().count()).max().unwrap_or(0).max(h.len()))
        .collect();
    let line = |cells: Vec<String>| {
        let mut l = String::new();
        for (c, text) in cells.into_iter().enumerate() {
            if c + 1 == columns.len() {
                l.push_str(&text);
            } else {
                l.push_str(&format!("{text:<w$}  ", w = widths[c]));
            }
        }
        l.trim_end().to_string() + "\n"
    };
    let mut out = line(columns.iter().map(|(h, _)| h.to_string()).collect());
    let mut errors = String::new();
    for (item, row) in items.iter().zip(cells) {
        for ((_, pointer), (_, whole)) in columns.iter().zip(&row) {
            if let Some(error) = error_in(item, pointer).filter(|_| !whole) {
                let label = [row[0].0.as_str(), text_at(item, "/type"), text_at(item, "/payload/node_id")]
                    .into_iter()
                    .filter(|t| !t.is_empty())
                    .collect::<Vec<_>>()
                    .join(" ");
                errors.push_str(&format!("\n{label} error:\n{}", wrap(error, 2, width())));
            }
        }
        out.push_str(&line(row.into_iter().map(|(text, _)| text).collect()));
    }
    out + &errors
}

/// The error a cell shows: its value when the column is an error (`/error`),
/// or the `error` of the object it shows (an event's payload).
fn error_in<'a>(item: &'a Value, pointer: &str) -> Option<&'a str> {
    match item.pointer(pointer)? {
        Value::String(s) if pointer.ends_with("/error") => Some(s),
        Value::Object(o) => o.get("error").and_then(Value::as_str),
        _ => None,
    }
}

fn text_at<'a>(item: &'a Value, pointer: &str) -> &'a str {
    item.pointer(pointer).and_then(Value::as_str).unwrap_or_default()
}

/// The terminal's width: `COLUMNS`, else 80.
fn width() -> usize {
    std::env::var("COLUMNS").ok().and_then(|c| c.parse().ok()).filter(|w| *w >= 20).unwrap_or(80)
}

/// `text` whole, each of its lines broken between words to fit `width`
/// columns after an `indent` (a word longer than that on a line of its
/// own, unbroken: a URL stays one to copy).
fn wrap(text: &str, indent: usize, width: usize) -> String {
    let room = width.saturating_sub(indent).max(1);
    let pad = " ".repeat(indent);
    let mut out = String::new();
    for line in text.replace('\t', " ").split('\n').map(|l| l.trim_end_matches('\r')) {
        let mut now = String::new();
        for word in line.split(' ') {
            let fits = now.chars().count() + 1 + word.chars().count() <= room;
            if !now.is_empty() && !fits {
                out.push_str(&format!("{pad}{}\n", now.trim_end()));
                now.clear();
            } else if !now.is_empty() {
                now.push(' ');
            }
            now.push_str(word);
        }
        out.push_str(&format!("{pad}{}\n", now.trim_end()));
    }
    out
}

/// Writes `text` to standard output; a reader that went away (`| head`)
/// is not an error.
pub fn emit(text: &str) {
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(text.as_bytes());
    let _ = out.flush();
}

/// A page of a list: `items` at `field` of the answer.
pub fn list(format: Format, answer: &Value, field: &str, columns: &[Column]) {
    let items = answer.get(field).and_then(Value::as_array).cloned().unwrap_or_default();
    match format {
        Format::Json => emit(&(serde_json::to_string_pretty(answer).unwrap_or_default() + "\n")),
        Format::Jsonl => {
            let lines: String = items.iter().map(|i| serde_json::to_string(i).unwrap_or_default() + "\n").collect();
            emit(&lines)
        }
        Format::Table => {
            let mut text = table(&items, columns);
            for next in ["next_cursor", "next_after"] {
                if let Some(n) = answer.get(next).filter(|n| !n.is_null()) {
                    text.push_str(&format!(
                        "(more: --{} {})\n",
                        next.replace('_', "-").replace("next-", ""),
                        cell(n, "").0
                    ));
                }
            }
            emit(&text)
        }
    }
}

/// A step's log lines as they come: a table's line each (when it was
/// stored, the worker that sent it, the line with its control characters
/// spelled out: a line cannot move the cursor or end early), or a JSON
/// object each. False once standard output is closed.
pub fn log_lines(format: Format, lines: &[LogLineView]) -> bool {
    let text: String = match format {
        Format::Table => lines
            .iter()
            .map(|l| {
                let at = l.at.to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
                format!("{at}  {}  {}\n", spelled(&l.worker_id), spelled(&l.line))
            })
            .collect(),
        _ => lines.iter().map(|l| serde_json::to_string(l).unwrap_or_default() + "\n").collect(),
    };
    let mut out = std::io::stdout().lock();
    out.write_all(text.as_bytes()).and_then(|()| out.flush()).is_ok()
}

/// `text` with its control characters (but tab) escaped: `\u{1b}`, `\n`.
fn spelled(text: &str) -> String {
    text.chars()
        .map(|c| if c.is_control() && c != '\t' { c.escape_default().to_string() } else { c.to_string() })
        .collect()
}

/// Items gathered from every page.
pub fn all(format: Format, items: &[Value], columns: &[Column]) {
    match format {
        Format::Json => emit(&(serde_json::to_string_pretty(items).unwrap_or_default() + "\n")),
        Format::Jsonl => {
            emit(&items.iter().map(|i| serde_json::to_string(i).unwrap_or_default() + "\n").collect::<String>())
        }
        Format::Table => emit(&table(items, columns)),
    }
}

/// One object: its scalar fields as `key: value`, then its tasks (a run).
pub fn one(format: Format, v: &Value) {
    match format {
        Format::Json => emit(&(serde_json::to_string_pretty(v).unwrap_or_default() + "\n")),
        Format::Jsonl => emit(&(serde_json::to_string(v).unwrap_or_default() + "\n")),
        Format::Table => {
            let mut text = String::new();
            if let Some(obj) = v.as_object() {
                let width = obj.keys().map(|k| k.len()).max().unwrap_or(0);
                for (k, val) in obj {
                    if k == "tasks" {
                        continue;
                    }
                    let shown = match val {
                        Value::Null => continue,
                        Value::String(s) => s.clone(),
                        other => serde_json::to_string(other).unwrap_or_default(),
                    };
                    text.push_str(&field(k, &shown, width));
                }
                if let Some(tasks) = obj.get("tasks").and_then(Value::as_array) {
                    text.push('\n');
                    text.push_str(&table(tasks, TASK_COLUMNS));
                }
            } else {
                text = v.to_string() + "\n";
            }
            emit(&text)
        }
    }
}

/// A field of one object as `key  value`: an error whole (wrapped under
/// its value's column), anything else cut at 200 characters.
fn field(key: &str, value: &str, key_width: usize) -> String {
    if key == "error" {
        let wrapped = wrap(value, key_width + 2, width());
        return format!("{key:<key_width$}  {}", wrapped.get(key_width + 2..).unwrap_or_default());
    }
    let mut shown: String = value.chars().take(200).collect();
    if shown.len() < value.len() {
        shown.push('…');
    }
    format!("{key:<key_width$}  {shown}\n")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_table_aligns_columns_and_cuts_long_cells() {
        let items = vec![
            json!({"id": "a", "status": "SUCCEEDED", "error": null}),
            json!({"id": "bbbb", "status": "FAILED", "error": "x".repeat(100)}),
        ];
        let t = table(&items, &[("ID", "/id"), ("STATUS", "/status"), ("ERROR", "/error")]);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines[0], "ID    STATUS     ERROR");
        assert_eq!(lines[1], "a     SUCCEEDED");
        assert!(lines[2].starts_with("bbbb  FAILED     xxx") && lines[2].ends_with('…'), "{}", lines[2]);
        assert_eq!(lines[3..], ["", "bbbb error:", &format!("  {}", "x".repeat(100))], "the error whole below");
    }

    #[test]
    fn an_error_is_wrapped_between_words_and_kept_whole() {
        let error = format!("step charge failed: {} see https://example.com/{}", "word ".repeat(30), "p".repeat(90));
        let wrapped = wrap(&error, 2, 80);
        assert!(wrapped.lines().all(|l| l.starts_with("  ")), "{wrapped}");
        assert!(wrapped.lines().filter(|l| !l.contains("https")).all(|l| l.chars().count() <= 80), "{wrapped}");
        let words: Vec<&str> = wrapped.split_whitespace().collect();
        assert_eq!(words, error.split_whitespace().collect::<Vec<_>>(), "every word, in order, none cut");
        assert_eq!(wrap("", 2, 80), "  \n");
        let event = json!({"seq": 7, "type": "TaskFailed", "payload": {"node_id": "charge", "error": error}});
        let t = table(&[event], EVENT_COLUMNS);
        assert!(t.contains("\n7 TaskFailed charge error:\n  step charge failed: word"), "{t}");
        let run = field("error", &error, 5);
        assert!(
            run.starts_with("error  step charge failed:") && run.lines().nth(1).unwrap().starts_with("       word")
        );
    }
}
