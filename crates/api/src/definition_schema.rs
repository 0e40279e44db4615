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

use composer_core::definition::WorkflowSpec;

/// The rules of a definition that JSON Schema cannot say, so a definition
/// the schema accepts may still be refused by the server:
pub const CROSS_FIELD_RULES: &[&str] = &[
    "node ids are unique, and every edge names two of them",
    "the edges make no cycle, and no edge is written twice",
    "a node's config is the one its type takes (HTTP url and method, WAIT duration, MAP items and node, …)",
    "every `${ … }` and `when` is jq that compiles, naming no function outside the sandbox",
    "durations (`timeout`, backoffs, `duration`) are durations within their limits",
    "a custom type or queue name, and a failure handler's workflow, are only checked when a run needs them",
];

/// The schema, with its definitions under `$defs`.
pub fn workflow() -> Value {
    let mut parts = Vec::new();
    <WorkflowSpec as ToSchema>::schemas(&mut parts);
    let mut defs = Map::new();
    defs.insert(WorkflowSpec::name().into_owned(), to_json(&WorkflowSpec::schema()));
    for (name, schema) in parts {
        defs.insert(name, to_json(&schema));
    }
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
}
