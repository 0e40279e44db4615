//! `composer workflow diff`: what registering a definition would change
//! against a registered version, field by field. Both sides are compared
//! as the server keeps them (normalized by the definition's own types), so
//! a reordered key or a default written out is no change.

use serde_json::{Map, Value};

/// One difference: where (`nodes[charge].retry.max_attempts`), and the
/// registered and the new value (`None` where there is none).
#[derive(Debug, Clone, PartialEq)]
pub struct Change {
    pub path: String,
    pub old: Option<Value>,
    pub new: Option<Value>,
}

/// Every difference from `old` to `new`, fields in the order of their names.
pub fn changes(old: &Value, new: &Value) -> Vec<Change> {
    let mut out = Vec::new();
    walk("", old, new, &mut out);
    out
}

/// The lines `composer workflow diff` prints: `- path: old`, `+ path: new`,
/// `~ path: old -> new`.
pub fn lines(changes: &[Change]) -> Vec<String> {
    changes
        .iter()
        .map(|c| match (&c.old, &c.new) {
            (Some(o), Some(n)) => format!("~ {}: {} -> {}", c.path, brief(o), brief(n)),
            (Some(o), None) => format!("- {}: {}", c.path, brief(o)),
            (None, Some(n)) => format!("+ {}: {}", c.path, brief(n)),
            (None, None) => format!("  {}", c.path),
        })
        .collect()
}

fn walk<'v>(path: &str, old: &'v Value, new: &'v Value, out: &mut Vec<Change>) {
    match (old, new) {
        (Value::Object(a), Value::Object(b)) => objects(path, a, b, out),
        (Value::Array(a), Value::Array(b)) if keyed(path) => {
            let named =
                |list: &'v [Value]| -> Vec<(String, &'v Value)> { list.iter().map(|v| (id_of(path, v), v)).collect() };
            let (a, b) = (named(a), named(b));
            for (k, v) in &a {
                match b.iter().find(|(j, _)| j == k) {
                    Some((_, w)) => walk(&format!("{path}[{k}]"), v, w, out),
                    None => out.push(Change { path: format!("{path}[{k}]"), old: Some((*v).clone()), new: None }),
                }
            }
            for (k, w) in &b {
                if !a.iter().any(|(j, _)| j == k) {
                    out.push(Change { path: format!("{path}[{k}]"), old: None, new: Some((*w).clone()) });
                }
            }
        }
        (Value::Array(a), Value::Array(b)) if a.len() == b.len() => {
            for (i, (v, w)) in a.iter().zip(b).enumerate() {
                walk(&format!("{path}[{i}]"), v, w, out);
            }
        }
        (a, b) if a == b => {}
        (a, b) => out.push(Change { path: shown(path), old: Some(a.clone()), new: Some(b.clone()) }),
    }
}

fn objects(path: &str, a: &Map<String, Value>, b: &Map<String, Value>, out: &mut Vec<Change>) {
    let at = |k: &str| if path.is_empty() { k.to_string() } else { format!("{path}.{k}") };
    for (k, v) in a {
        match b.get(k) {
            Some(w) => walk(&at(k), v, w, out),
            None => out.push(Change { path: at(k), old: Some(v.clone()), new: None }),
        }
    }
    for (k, w) in b {
        if !a.contains_key(k) {
            out.push(Change { path: at(k), old: None, new: Some(w.clone()) });
        }
    }
}

/// Lists whose members are named: nodes by id, edges by their ends.
fn keyed(path: &str) -> bool {
    path == "nodes" || path == "edges"
}

fn id_of(path: &str, v: &Value) -> String {
    let text = |k: &str| v.get(k).and_then(Value::as_str).unwrap_or("?").to_string();
    match path {
        "edges" => {
            let on = v.get("on").and_then(Value::as_str).filter(|o| *o != "success");
            format!("{}->{}{}", text("from"), text("to"), on.map(|o| format!(" on {o}")).unwrap_or_default())
        }
        _ => text("id"),
    }
}

fn shown(path: &str) -> String {
    if path.is_empty() {
        "(the definition)".to_string()
    } else {
        path.to_string()
    }
}

/// A value on one line, cut at 120 characters.
fn brief(v: &Value) -> String {
    let text = v.to_string();
    match text.char_indices().nth(120) {
        Some((at, _)) => format!("{}…", &text[..at]),
        None => text,
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn nodes_and_edges_are_matched_by_name_and_fields_by_path() {
        let old = json!({"name": "o", "nodes": [
            {"id": "a", "type": "step", "retry": {"max_attempts": 3}},
            {"id": "b", "type": "TRANSFORM", "config": {"output": 1}}],
            "edges": [{"from": "a", "to": "b"}]});
        let new = json!({"name": "o", "description": "d", "nodes": [
            {"id": "c", "type": "FAIL", "config": {"message": "m"}},
            {"id": "a", "type": "step", "retry": {"max_attempts": 5}}],
            "edges": [{"from": "a", "to": "c", "on": "failure"}]});
        let got = lines(&changes(&old, &new));
        assert_eq!(
            got,
            [
                "- edges[a->b]: {\"from\":\"a\",\"to\":\"b\"}",
                "+ edges[a->c on failure]: {\"from\":\"a\",\"on\":\"failure\",\"to\":\"c\"}",
                "~ nodes[a].retry.max_attempts: 3 -> 5",
                "- nodes[b]: {\"config\":{\"output\":1},\"id\":\"b\",\"type\":\"TRANSFORM\"}",
                "+ nodes[c]: {\"config\":{\"message\":\"m\"},\"id\":\"c\",\"type\":\"FAIL\"}",
                "+ description: \"d\"",
            ],
        );
        assert!(changes(&old, &old).is_empty());
    }
}
