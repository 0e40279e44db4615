//! How client commands print: a table for people (the default on a
//! terminal), JSON for tools (the default otherwise), or JSON lines (one
//! object per line, for a list's items).

use std::io::{IsTerminal, Write};

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

fn cell(item: &Value, pointer: &str) -> String {
    let text = match item.pointer(pointer) {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(s)) => s.clone(),
        Some(v) => v.to_string(),
    };
    let text = text.replace(['\n', '\t'], " ");
    if text.chars().count() > MAX_CELL {
        let mut cut: String = text.chars().take(MAX_CELL - 1).collect();
        cut.push('…');
        cut
    } else {
        text
    }
}

pub fn table(items: &[Value], columns: &[Column]) -> String {
    let rows: Vec<Vec<String>> = items.iter().map(|i| columns.iter().map(|(_, p)| cell(i, p)).collect()).collect();
    let widths: Vec<usize> = columns
        .iter()
        .enumerate()
        .map(|(c, (h, _))| rows.iter().map(|r| r[c].chars().count()).max().unwrap_or(0).max(h.len()))
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
    for r in rows {
        out.push_str(&line(r));
    }
    out
}

fn emit(text: &str) {
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
                        cell(n, "")
                    ));
                }
            }
            emit(&text)
        }
    }
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
                    text.push_str(&format!("{k:<width$}  {}\n", shown.chars().take(200).collect::<String>()));
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
    }
}
