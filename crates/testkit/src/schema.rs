//! The definition schema (`composer workflow schema`) walked field by field,
//! and the smallest definition that holds a given value at a given field:
//! how tests cover every field that takes an expression without a list of
//! them. A new field of a definition, or of a node type's config, is in the
//! walk the day it is in the schema.
//!
//! Each `$defs` entry the walk meets needs a place in a definition
//! ([`definition_with`]); a new one that has none fails loudly.

use serde_json::{json, Map, Value};

/// The annotation on every field that takes an expression.
pub const MARK: &str = "x-composer-expression";

/// One field of the schema: the `$defs` entry it is in, its path inside it
/// (`*` for every property of a map), and its mark (`template`, `jq`).
#[derive(Debug, Clone, PartialEq)]
pub struct SchemaField {
    pub def: String,
    pub path: Vec<String>,
    pub mark: Option<String>,
}

impl SchemaField {
    /// `HttpConfig.url`, `MapConfig.collect.reduce`, `DefinitionTags.*`.
    pub fn name(&self) -> String {
        format!("{}.{}", self.def, self.path.join("."))
    }

    /// Whether it takes an expression.
    pub fn is_expression(&self) -> bool {
        self.mark.is_some()
    }

    /// Whether it is a node's config field (evaluated when the node starts).
    pub fn is_node_config(&self) -> bool {
        self.def.ends_with("Config")
    }
}

/// The schema this build makes.
pub fn schema() -> Value {
    composer_api::definition_schema::workflow()
}

/// Every field of every `$defs` entry that has fields, with its mark;
/// fields of objects inside a field (`collect.reduce`) included.
pub fn fields(schema: &Value) -> Vec<SchemaField> {
    let mut out = Vec::new();
    for (def, s) in schema["$defs"].as_object().into_iter().flatten() {
        if let Some(mark) = s[MARK].as_str() {
            out.push(SchemaField { def: def.clone(), path: vec!["*".into()], mark: Some(mark.into()) });
        }
        if s["additionalProperties"].is_object() {
            let mark = s["additionalProperties"][MARK].as_str().map(String::from);
            out.push(SchemaField { def: def.clone(), path: vec!["*".into()], mark });
        }
        for (name, p) in s["properties"].as_object().into_iter().flatten() {
            out.push(SchemaField {
                def: def.clone(),
                path: vec![name.clone()],
                mark: p[MARK].as_str().map(String::from),
            });
            for branch in branches(p) {
                for (sub, q) in branch["properties"].as_object().into_iter().flatten() {
                    out.push(SchemaField {
                        def: def.clone(),
                        path: vec![name.clone(), sub.clone()],
                        mark: q[MARK].as_str().map(String::from),
                    });
                }
            }
        }
    }
    out
}

fn branches(p: &Value) -> Vec<&Value> {
    ["oneOf", "anyOf", "allOf"].iter().flat_map(|k| p[*k].as_array().into_iter().flatten()).collect()
}

/// The first example the schema gives for property `name` of `def` (on the
/// property, or on its first branch that has one).
fn example(schema: &Value, def: &str, name: &str) -> Option<Value> {
    let p = &schema["$defs"][def]["properties"][name];
    std::iter::once(p).chain(branches(p)).find_map(|b| b["examples"].get(0).cloned())
}

/// A built-in type's smallest config: its required fields (one of a
/// one-of group) at their first example, except `except`, which the
/// caller sets.
pub fn minimal_config(schema: &Value, def: &str, except: Option<&str>) -> Map<String, Value> {
    let s = &schema["$defs"][def];
    let mut config = Map::new();
    let mut wanted: Vec<String> =
        s["required"].as_array().into_iter().flatten().filter_map(|r| r.as_str().map(String::from)).collect();
    if let Some(groups) = s["oneOf"].as_array() {
        let in_group = |f: &str| groups.iter().any(|g| g["required"][0] == f);
        if !except.is_some_and(in_group) {
            if let Some(first) = groups.first().and_then(|g| g["required"][0].as_str()) {
                wanted.push(first.into());
            }
        }
    }
    for name in wanted.into_iter().filter(|n| Some(n.as_str()) != except) {
        let value =
            example(schema, def, &name).unwrap_or_else(|| panic!("{def}.{name} is required and has no example"));
        config.insert(name, value);
    }
    config
}

/// The built-in type whose config is `$defs` entry `def` (`HttpConfig` → `HTTP`).
pub fn kind_of(schema: &Value, def: &str) -> Option<String> {
    let rules = schema["$defs"]["NodeSpec"]["allOf"].as_array()?;
    rules.iter().find_map(|r| {
        let target = r["then"]["properties"]["config"]["$ref"].as_str()?;
        (target == format!("#/$defs/{def}"))
            .then(|| r["if"]["properties"]["type"]["const"].as_str().map(String::from))?
    })
}

/// `value` at `path` inside `object`, objects made on the way.
fn put(object: &mut Map<String, Value>, path: &[String], value: Value) {
    let (first, rest) = path.split_first().expect("a path has a field");
    let key = if first == "*" { "t".to_string() } else { first.clone() };
    if rest.is_empty() {
        object.insert(key, value);
        return;
    }
    let inner = object.entry(key).or_insert_with(|| json!({}));
    if !inner.is_object() {
        *inner = json!({});
    }
    put(inner.as_object_mut().expect("made an object"), rest, value);
}

/// A node of type `kind` with `config`.
fn node(id: &str, kind: &str, config: Map<String, Value>) -> Value {
    json!({"id": id, "type": kind, "config": config})
}

/// A WAIT_FOR_EVENT node `n` that accepts update `u`, `value` at `path` in it.
fn waiting_with_update(path: &[String], value: Value) -> Value {
    let mut u = json!({"name": "u"}).as_object().cloned().unwrap_or_default();
    put(&mut u, path, value);
    json!({"id": "n", "type": "WAIT_FOR_EVENT", "config": {"event": "ev", "key": "k"}, "updates": [u]})
}

/// A field inside an object (`escalate.people`) has that object's
/// required fields beside it, each at its first example.
fn seed(config: &mut Map<String, Value>, schema: &Value, def: &str, path: &[String]) {
    let [outer, _, ..] = path else { return };
    let field = &schema["$defs"][def]["properties"][outer.as_str()];
    let Some(p) = std::iter::once(field).chain(branches(field)).find(|b| b["required"].is_array()) else { return };
    let required = p["required"].as_array().into_iter().flatten().filter_map(Value::as_str);
    let seeded = required.filter_map(|r| Some((r.to_string(), p["properties"][r]["examples"].get(0)?.clone())));
    config.insert(outer.clone(), Value::Object(seeded.collect()));
}

/// A trigger with `value` at `field` (of the trigger or of its flow control).
fn trigger_with(schema: &Value, field: &SchemaField, value: Value) -> Value {
    let mut t = json!({"event": "ev"}).as_object().cloned().unwrap_or_default();
    let flow = match field.def.as_str() {
        "DebounceSpec" => "debounce",
        "BatchSpec" => "batch",
        "ThrottleSpec" => "throttle",
        _ => {
            // A flow's key is refused without a flow to count.
            if field.path[0] == "key" {
                t.insert("singleton".into(), json!("skip"));
            }
            put(&mut t, &field.path, value);
            return Value::Object(t);
        }
    };
    let mut f = minimal_config(schema, &field.def, field.path.first().map(String::as_str));
    put(&mut f, &field.path, value);
    t.insert(flow.into(), Value::Object(f));
    Value::Object(t)
}

/// The smallest definition named `name` that holds `value` at `field`, and
/// otherwise only what evaluates on an empty input: a TRANSFORM, and
/// whatever the field's place needs (an HTTP node for a limit, two nodes
/// for an edge, a MAP for its item node, an object's required fields). Its nodes are `n` (the field's
/// node when the field is a node's) and, for an edge, `m`. A child
/// workflow it names is `echo`; a failure handler, an `on_end` hook or a
/// deadline's run `handler`; an event `ev`.
pub fn definition_with(schema: &Value, name: &str, field: &SchemaField, value: Value) -> Value {
    let plain = json!({"id": "n", "type": "TRANSFORM", "config": {"output": 1}});
    let http = || node("n", "HTTP", minimal_config(schema, "HttpConfig", None));
    let mut def = json!({"name": name, "nodes": [plain.clone()]});
    let o = |v: &mut Value| -> Map<String, Value> { v.as_object().cloned().unwrap_or_default() };
    match field.def.as_str() {
        "WorkflowSpec" => put(def.as_object_mut().unwrap(), &field.path, value),
        "DefinitionTags" => def["tags"] = json!({"t": value}),
        "ConcurrencySpec" => {
            let mut c = o(&mut json!({"max": 1}));
            put(&mut c, &field.path, value);
            def["concurrency"] = Value::Object(c);
        }
        hook @ ("OnFailureSpec" | "HookSpec") => {
            let mut h = o(&mut json!({"workflow": "handler"}));
            put(&mut h, &field.path, value);
            def[if hook == "HookSpec" { "on_end" } else { "on_failure" }] = Value::Object(h);
        }
        "DeadlineSpec" => {
            let mut d = o(&mut json!({"after": "10ms", "start": {"workflow": "handler"}}));
            put(&mut d, &field.path, value);
            def["deadlines"] = json!([d]);
        }
        "DeadlineStartSpec" => {
            let mut s = o(&mut json!({"workflow": "handler"}));
            put(&mut s, &field.path, value);
            def["deadlines"] = json!([{"after": "10ms", "start": s}]);
        }
        "UpdateSpec" => def["nodes"] = json!([waiting_with_update(&field.path, value)]),
        "TriggerSpec" | "DebounceSpec" | "BatchSpec" | "ThrottleSpec" => {
            def["triggers"] = json!([trigger_with(schema, field, value)])
        }
        "EdgeSpec" => {
            def["nodes"] = json!([plain, {"id": "m", "type": "TRANSFORM", "config": {"output": 2}}]);
            let mut e = o(&mut json!({"from": "n", "to": "m"}));
            put(&mut e, &field.path, value);
            def["edges"] = json!([e]);
        }
        "LimitSpec" => {
            let mut l = o(&mut json!({"key": "k", "concurrency": 1}));
            put(&mut l, &field.path, value);
            let mut n = http();
            n["limits"] = json!([l]);
            def["nodes"] = json!([n]);
        }
        "RetrySpec" => {
            let mut n = http();
            let mut r = Map::new();
            put(&mut r, &field.path, value);
            n["retry"] = Value::Object(r);
            def["nodes"] = json!([n]);
        }
        "NodeSpec" => {
            let mut n = o(&mut http());
            put(&mut n, &field.path, value);
            def["nodes"] = json!([n]);
        }
        "ItemNode" => {
            let mut item = o(&mut json!({"type": "HTTP", "config": minimal_config(schema, "HttpConfig", None)}));
            put(&mut item, &field.path, value);
            def["nodes"] = json!([node("n", "MAP", o(&mut json!({"items": [1, 2], "node": item})))]);
        }
        "CustomConfig" => {
            let mut c = Map::new();
            put(&mut c, &field.path, value);
            def["nodes"] = json!([node("n", "custom.kind", c)]);
        }
        def_name => {
            let kind = kind_of(schema, def_name)
                .unwrap_or_else(|| panic!("$defs.{def_name} has fields but no place in a definition: add one here"));
            let mut config = minimal_config(schema, def_name, field.path.first().map(String::as_str));
            seed(&mut config, schema, def_name, &field.path);
            put(&mut config, &field.path, value);
            def["nodes"] = json!([node("n", &kind, config)]);
        }
    }
    def
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_field_has_a_place_and_the_places_are_valid_definitions() {
        let schema = schema();
        let fields = fields(&schema);
        assert!(fields.len() > 60, "{}", fields.len());
        let marked: Vec<String> = fields.iter().filter(|f| f.is_expression()).map(SchemaField::name).collect();
        for expected in ["HttpConfig.url", "MapConfig.collect.reduce", "DefinitionTags.*", "TriggerSpec.when"] {
            assert!(marked.contains(&expected.to_string()), "{expected} in {marked:?}");
        }
        for f in fields.iter().filter(|f| f.is_expression()) {
            // The example of a marked field, or a plain expression.
            let value = match f.mark.as_deref() {
                Some("jq") => json!("true"),
                _ => json!("${ 1 }"),
            };
            let def = definition_with(&schema, "w", f, value);
            let parsed = composer_core::expr::on_eval_stack(|| composer_core::definition::Workflow::parse(&def));
            match parsed.unwrap() {
                Ok(_) => {}
                // A template field whose plain form is text or a list may
                // refuse the number `1` it yields only when a run evaluates it.
                Err(e) => panic!("{}: {def}: {e}", f.name()),
            }
        }
    }
}
