//! The JSON Schema (2020-12) of a workflow definition, for editors and
//! linters: `composer workflow schema` prints it, and the repository keeps a
//! copy at `docs/workflow.schema.json` that YAML definitions name in their
//! `# yaml-language-server: $schema=` line. It is made from the same types as
//! the OpenAPI document's `WorkflowSpec`, so a new definition field is in both.
//!
//! What it cannot say, the server still checks at registration (a 400 that
//! names the field): see [`CROSS_FIELD_RULES`].

use serde_json::{json, Map, Value};
use utoipa::{PartialSchema, ToSchema};

use composer_core::definition::config::{self, Takes, EXPRESSION_MARK};
use composer_core::definition::WorkflowSpec;

/// The rules of a definition that JSON Schema cannot say, so a definition
/// the schema accepts may still be refused by the server:
pub const CROSS_FIELD_RULES: &[&str] = &[
    "node ids are unique, and every edge names two of them",
    "the edges make no cycle, and no edge is written twice",
    "every `${ … }` and `when` is jq that compiles, naming no function outside the sandbox",
    "durations (`timeout`, backoffs, `duration`) are durations within their limits",
    "a custom type or queue name, and a failure handler's workflow, are only checked when a run needs them",
];

/// The schema, with its definitions under `$defs`: the definition's types,
/// each built-in node type's config ([`config::KINDS`]), and the node a MAP
/// runs. Every field that takes an expression carries
/// `x-composer-expression`: `"template"` (strings in it may hold `${ … }`)
/// or `"jq"` (one bare jq expression).
pub fn workflow() -> Value {
    let mut parts = Vec::new();
    <WorkflowSpec as ToSchema>::schemas(&mut parts);
    parts.push((WorkflowSpec::name().into_owned(), WorkflowSpec::schema()));
    let mut defs = Map::new();
    for (name, mut schema) in parts {
        crate::bounds::apply(&name, &mut schema);
        defs.insert(name, to_json(&schema));
    }
    mark_spec_expressions(&mut defs);
    node_configs(&mut defs);
    let description = format!(
        "A workflow definition as `composer workflow apply` and POST /v1/workflows take it. The server also \
         checks what a schema cannot say: {}.",
        CROSS_FIELD_RULES.join("; ")
    );
    json!({
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "Composer workflow definition",
        "description": description,
        "$ref": format!("#/$defs/{}", WorkflowSpec::name()),
        "$defs": defs,
    })
}

/// Marks the fields outside nodes' configs that take an expression.
fn mark_spec_expressions(defs: &mut Map<String, Value>) {
    for (def, property, takes) in config::SPEC_EXPRESSIONS {
        let Some(mark) = takes.annotation() else { continue };
        let schema = &mut defs[*def];
        let at = match *property {
            "*" => &mut schema["additionalProperties"],
            p => &mut schema["properties"][p],
        };
        assert!(at.is_object(), "config::SPEC_EXPRESSIONS names {def}.{property}, which the schema does not have");
        at[EXPRESSION_MARK] = json!(mark);
    }
}

/// `$defs` name of a built-in type's config: `WAIT_FOR_EVENT` → `WaitForEventConfig`.
fn config_def(kind: &str) -> String {
    let mut name: String = kind
        .split('_')
        .map(|w| {
            let mut c = w.chars();
            c.next().map(|f| f.to_string() + &c.as_str().to_lowercase()).unwrap_or_default()
        })
        .collect();
    name.push_str("Config");
    name
}

/// The schema of one config field: its plain form, or with a template any
/// string holding `${ … }` too.
fn field_schema(f: &config::Field) -> Value {
    let mut schema = match f.takes {
        Takes::Node => {
            let mut node = (f.schema)();
            node["$ref"] = json!("#/$defs/ItemNode");
            node
        }
        Takes::Template => {
            let plain = (f.schema)();
            if plain.as_object().is_some_and(Map::is_empty) {
                plain
            } else {
                json!({"anyOf": [plain, {"type": "string", "pattern": "\\$\\{"}]})
            }
        }
        Takes::Value | Takes::Jq => (f.schema)(),
    };
    schema["description"] = json!(f.doc);
    if let Some(mark) = f.takes.annotation() {
        schema[EXPRESSION_MARK] = json!(mark);
    }
    schema
}

/// Each built-in type's config as a definition of its own, a node's
/// `config` by its `type` (a custom type's: any object, a template), and
/// the node a MAP runs (a node without an id).
fn node_configs(defs: &mut Map<String, Value>) {
    let mut by_type = Vec::new();
    for kind in config::KINDS {
        let properties: Map<String, Value> =
            kind.fields.iter().map(|f| (f.name.to_string(), field_schema(f))).collect();
        let required: Vec<&str> = kind.fields.iter().filter(|f| f.required).map(|f| f.name).collect();
        let mut schema = json!({"type": "object", "description": kind.doc, "additionalProperties": false,
                                "properties": properties, "required": required});
        if !kind.one_of.is_empty() {
            schema["oneOf"] = kind.one_of.iter().map(|f| json!({"required": [f]})).collect();
        }
        defs.insert(config_def(kind.name), schema);
        let mut then = json!({"properties": {"config": {"$ref": format!("#/$defs/{}", config_def(kind.name))}}});
        if kind.fields.iter().any(|f| f.required) || !kind.one_of.is_empty() {
            then["required"] = json!(["config"]);
        }
        by_type.push(json!({"if": {"properties": {"type": {"const": kind.name}}, "required": ["type"]}, "then": then}));
    }
    let built_in: Vec<&str> = config::KINDS.iter().map(|k| k.name).collect();
    defs.insert(
        "CustomConfig".into(),
        json!({"type": "object", EXPRESSION_MARK: "template",
               "description": "A custom type's config: any object, sent to its worker with every `${ … }` evaluated"}),
    );
    by_type.push(json!({
        "if": {"properties": {"type": {"not": {"enum": built_in}}}, "required": ["type"]},
        "then": {"properties": {"config": {"$ref": "#/$defs/CustomConfig"}}},
    }));
    let node = defs.get_mut("NodeSpec").expect("NodeSpec is a definition");
    node["allOf"] = Value::Array(by_type);
    let mut item = node.clone();
    if let Some(p) = item["properties"].as_object_mut() {
        p.remove("id");
    }
    if let Some(r) = item["required"].as_array_mut() {
        r.retain(|f| f != "id");
    }
    item["description"] = json!("The node a MAP runs per item, with `.item` and `.index` bound: a node without an id");
    defs.insert("ItemNode".into(), item);
}

/// A schema as JSON, its references pointing into `$defs` and its OpenAPI
/// `example` written as JSON Schema's `examples`.
fn to_json(schema: &impl serde::Serialize) -> Value {
    let mut v = serde_json::to_value(schema).expect("a schema serializes");
    rewrite(&mut v);
    v
}

fn rewrite(v: &mut Value) {
    match v {
        Value::Object(o) => {
            if let Some(Value::String(r)) = o.get_mut("$ref") {
                if let Some(name) = r.strip_prefix("#/components/schemas/") {
                    *r = format!("#/$defs/{name}");
                }
            }
            if let Some(example) = o.remove("example") {
                o.insert("examples".into(), json!([example]));
            }
            o.values_mut().for_each(rewrite);
        }
        Value::Array(a) => a.iter_mut().for_each(rewrite),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    /// The copy editors read (`# yaml-language-server: $schema=…`) is the
    /// schema this build makes.
    #[test]
    fn the_repository_s_copy_is_the_schema_of_these_types() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/workflow.schema.json");
        let copy: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        assert!(
            copy == super::workflow(),
            "docs/workflow.schema.json is out of date: run `composer workflow schema > docs/workflow.schema.json`"
        );
    }

    #[test]
    fn every_reference_names_a_definition() {
        let schema = super::workflow();
        let text = schema.to_string();
        let mut refs = 0;
        for (at, _) in text.match_indices("\"$ref\":\"#/$defs/") {
            let rest = &text[at + "\"$ref\":\"#/$defs/".len()..];
            let name = &rest[..rest.find('"').unwrap()];
            assert!(schema["$defs"][name].is_object(), "{name}");
            refs += 1;
        }
        assert!(refs > 10, "{refs}");
        assert!(!text.contains("#/components/"), "every reference points into $defs");
    }

    /// The schema refuses the names and limit keys the server refuses
    /// (`.` and `..`: a URL path cannot carry them), so a client generated
    /// from it does too; the patterns written again in attributes are the
    /// same.
    #[test]
    fn names_a_url_cannot_carry_are_refused_by_the_schema_too() {
        use composer_core::definition::{check_name, check_path_segment};
        use composer_core::schema::{LIMIT_KEY_PATTERN, NAME_PATTERN};
        let name = regex::Regex::new(NAME_PATTERN).unwrap();
        let long = "x".repeat(128);
        for text in [".", "..", "...", "....", ".a", "..a", "a.", "a..", "a.b", "", "a b", "a/b", "é", &long] {
            let by_schema = name.is_match(text) && (1..=128).contains(&text.chars().count());
            assert_eq!(by_schema, check_name("name", text).is_ok(), "{text:?}");
        }
        let key = regex::Regex::new(LIMIT_KEY_PATTERN).unwrap();
        for text in [".", "..", "...", ".a", "..a", "a..", "a.b", "", "stripe:a/b", " ", "é", "a\0"] {
            let by_rule = !text.is_empty() && !text.contains('\0') && check_path_segment(text).is_ok();
            assert_eq!(key.is_match(text), by_rule, "{text:?}");
        }
        let defs = &super::workflow()["$defs"];
        assert_eq!(defs["Name"]["pattern"], NAME_PATTERN);
        assert_eq!(defs["NodeSpec"]["properties"]["type"]["pattern"], NAME_PATTERN);
        assert_eq!(defs["SubWorkflowConfig"]["properties"]["workflow"]["pattern"], NAME_PATTERN);
        assert_eq!(defs["LoopConfig"]["properties"]["workflow"]["pattern"], NAME_PATTERN);
        assert_eq!(defs["LimitSpec"]["properties"]["key"]["pattern"], LIMIT_KEY_PATTERN);
    }
}
