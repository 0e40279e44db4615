use serde_json::{json, Value};

use super::{InputSchema, Mismatch, MAX_DEPTH};

fn compiled(schema: Value) -> InputSchema {
    InputSchema::compile(&schema, "input_schema").unwrap_or_else(|e| panic!("{schema}: {e}"))
}

fn refused(schema: Value) -> String {
    match InputSchema::compile(&schema, "input_schema") {
        Ok(_) => panic!("{schema} compiled"),
        Err(e) => e.to_string(),
    }
}

/// Where the check says `input` fails, and why.
fn miss(schema: &InputSchema, input: Value) -> (String, String) {
    match schema.check(&input) {
        Err(Mismatch::At { at, why }) => (at, why),
        other => panic!("{input}: {other:?}"),
    }
}

fn passes(schema: &InputSchema, input: Value) {
    if let Err(e) = schema.check(&input) {
        panic!("{input}: {e}");
    }
}

/// Each keyword, one value that passes and one that fails (and where).
#[test]
fn every_keyword_passes_what_it_allows_and_names_where_it_fails() {
    let cases: Vec<(Value, Value, Value, &str)> = vec![
        (json!({"type": "integer"}), json!(3), json!(3.5), ""),
        (json!({"type": "integer"}), json!(3.0), json!("3"), ""),
        (json!({"type": ["string", "null"]}), json!(null), json!(1), ""),
        (json!({"enum": [1, "a", null]}), json!(1.0), json!(2), ""),
        (json!({"const": {"a": [1]}}), json!({"a": [1.0]}), json!({"a": [2]}), ""),
        (json!({"multipleOf": 0.01}), json!(19.99), json!(19.995), ""),
        (json!({"multipleOf": 3}), json!(9), json!(10), ""),
        (json!({"maximum": 5}), json!(5), json!(6), ""),
        (json!({"exclusiveMaximum": 5}), json!(4.9), json!(5), ""),
        (json!({"minimum": 1}), json!(1), json!(0), ""),
        (json!({"exclusiveMinimum": 1}), json!(2), json!(1), ""),
        (json!({"maxLength": 2}), json!("éé"), json!("abc"), ""),
        (json!({"minLength": 2}), json!("ab"), json!("a"), ""),
        (json!({"pattern": "^[A-Z]{3}$"}), json!("EUR"), json!("euro"), ""),
        (json!({"pattern": "\\d"}), json!("a1b"), json!("ab"), ""),
        (json!({"maxItems": 1}), json!([1]), json!([1, 2]), ""),
        (json!({"minItems": 1}), json!([1]), json!([]), ""),
        (json!({"uniqueItems": true}), json!([1, 2]), json!([1, 1.0]), ""),
        (json!({"items": {"type": "string"}}), json!(["a"]), json!(["a", 2]), "/1"),
        (json!({"prefixItems": [{"type": "string"}], "items": false}), json!(["a"]), json!(["a", 1]), "/1"),
        (json!({"contains": {"type": "string"}}), json!([1, "a"]), json!([1, 2]), ""),
        (json!({"contains": {"const": 1}, "minContains": 2}), json!([1, 1]), json!([1, 2]), ""),
        (json!({"contains": {"const": 1}, "maxContains": 1}), json!([1, 2]), json!([1, 1]), ""),
        (json!({"maxProperties": 1}), json!({"a": 1}), json!({"a": 1, "b": 2}), ""),
        (json!({"minProperties": 1}), json!({"a": 1}), json!({}), ""),
        (json!({"required": ["a"]}), json!({"a": 1}), json!({"b": 1}), ""),
        (json!({"dependentRequired": {"a": ["b"]}}), json!({"a": 1, "b": 1}), json!({"a": 1}), ""),
        (json!({"dependentSchemas": {"a": {"required": ["b"]}}}), json!({"b": 1}), json!({"a": 1}), ""),
        (json!({"properties": {"a": {"type": "string"}}}), json!({"a": "x", "b": 1}), json!({"a": 1}), "/a"),
        (json!({"patternProperties": {"^x-": {"type": "integer"}}}), json!({"x-a": 1}), json!({"x-a": "1"}), "/x-a"),
        (
            json!({"properties": {"a": true}, "additionalProperties": false}),
            json!({"a": 1}),
            json!({"a": 1, "b": 2}),
            "",
        ),
        (json!({"additionalProperties": {"type": "integer"}}), json!({"a": 1}), json!({"a/b": "x"}), "/a~1b"),
        (json!({"propertyNames": {"maxLength": 2}}), json!({"ab": 1}), json!({"abc": 1}), ""),
        (json!({"allOf": [{"type": "integer"}, {"minimum": 2}]}), json!(2), json!(1), ""),
        (json!({"anyOf": [{"type": "integer"}, {"type": "null"}]}), json!(null), json!("1"), ""),
        (json!({"oneOf": [{"type": "integer"}, {"minimum": 2}]}), json!(1), json!(3), ""),
        (json!({"not": {"type": "string"}}), json!(1), json!("a"), ""),
        (
            json!({"if": {"properties": {"kind": {"const": "card"}}}, "then": {"required": ["pan"]}, "else": {"required": ["iban"]}}),
            json!({"kind": "sepa", "iban": "x"}),
            json!({"kind": "card", "iban": "x"}),
            "",
        ),
        (json!(false), json!(null), json!(null), ""),
        (
            json!({"$defs": {"n": {"type": "integer"}}, "items": {"$ref": "#/$defs/n"}}),
            json!([1]),
            json!([1, "2"]),
            "/1",
        ),
    ];
    for (schema, good, bad, at) in cases {
        let s = compiled(schema.clone());
        if schema != json!(false) {
            passes(&s, good);
        }
        let (where_, why) = miss(&s, bad.clone());
        assert_eq!(where_, at, "{schema} on {bad}: {why}");
        assert!(!why.is_empty());
    }
}

/// pydantic's shape: `$defs` and `$ref`, `anyOf` for optionals, titles.
#[test]
fn a_pydantic_models_schema_checks_nested_models_and_names_the_deep_path() {
    let s = compiled(json!({
        "$defs": {"Line": {"properties": {"sku": {"title": "Sku", "type": "string"},
                                           "qty": {"title": "Qty", "type": "integer", "minimum": 1}},
                            "required": ["sku", "qty"], "title": "Line", "type": "object"}},
        "properties": {"customer": {"title": "Customer", "type": "string"},
                       "lines": {"items": {"$ref": "#/$defs/Line"}, "title": "Lines", "type": "array"},
                       "note": {"anyOf": [{"type": "string"}, {"type": "null"}], "default": null}},
        "required": ["customer", "lines"], "title": "Order", "type": "object"
    }));
    passes(&s, json!({"customer": "c1", "lines": [{"sku": "a", "qty": 2}], "note": null}));
    let (at, why) = miss(&s, json!({"customer": "c1", "lines": [{"sku": "a", "qty": 2}, {"sku": "b", "qty": "2"}]}));
    assert_eq!(at, "/lines/1/qty");
    assert!(why.contains("expected integer, got string \"2\""), "{why}");
    let (at, why) = miss(&s, json!({"lines": []}));
    assert_eq!((at.as_str(), why.as_str()), ("", "the property \"customer\" is required"));
    let e = s.check(&json!({"customer": "c", "lines": [], "note": 5})).unwrap_err().to_string();
    assert!(e.starts_with("the input does not match input_schema at /note: matches none of anyOf's 2 schemas"), "{e}");
}

#[test]
fn a_bad_schema_is_refused_at_registration_naming_the_keyword() {
    for (schema, says) in [
        (json!({"type": "int"}), "input_schema.type: \"int\" is not a type"),
        (
            json!({"properties": {"a": {"minLength": -1}}}),
            "input_schema.properties.a.minLength: must be a whole number",
        ),
        (json!({"pattern": "(a"}), "input_schema.pattern: \"(a\" is not a regular expression"),
        (json!({"pattern": "(?=a)"}), "input_schema.pattern"),
        (json!({"pattern": "(a)\\1"}), "input_schema.pattern"),
        (json!({"$ref": "https://example.com/s.json"}), "only references within input_schema"),
        (json!({"$ref": "file:///etc/passwd"}), "only references within input_schema"),
        (json!({"$ref": "#/$defs/missing"}), "leads to nothing"),
        (json!({"items": [{"type": "string"}]}), "use prefixItems"),
        (json!({"unevaluatedProperties": false}), "input_schema.unevaluatedProperties: not supported"),
        (json!({"$defs": {"a": {"$dynamicRef": "#x"}}}), "input_schema.$defs.a.$dynamicRef"),
        (json!({"$schema": "http://json-schema.org/draft-07/schema#"}), "only JSON Schema draft 2020-12"),
        (json!({"anyOf": []}), "input_schema.anyOf: must be a non-empty array"),
        (json!({"multipleOf": 0}), "must be greater than 0"),
        (json!({"properties": {"a": {"$id": "x"}}}), "only the root schema may have an $id"),
        (json!("string"), "a schema is an object or a boolean"),
    ] {
        let e = refused(schema.clone());
        assert!(e.contains(says), "{schema}: {e}");
    }
}

#[test]
fn unknown_keywords_and_annotations_are_ignored_as_the_standard_says() {
    let s = compiled(json!({
        "$schema": "https://json-schema.org/draft/2020-12/schema", "$id": "https://example.com/order",
        "title": "t", "description": "d", "format": "email", "examples": [1], "deprecated": true,
        "discriminator": {"propertyName": "kind"}, "x-anything": {"type": "integer"}
    }));
    passes(&s, json!("not an email"));
}

/// Hostile schemas end as refusals naming the limit, not a hang or a
/// stack overflow.
#[test]
fn a_schema_that_recurses_or_explodes_is_stopped_by_its_limits() {
    let cycle = compiled(json!({"$ref": "#"}));
    let e = cycle.check(&json!(1)).unwrap_err();
    assert!(matches!(&e, Mismatch::Limit(m) if m.contains(&MAX_DEPTH.to_string())), "{e}");
    // Each level tries both branches: 2^depth without a budget.
    let explode = compiled(json!({"$defs": {"a": {"anyOf": [
        {"type": "array", "items": {"$ref": "#/$defs/a"}}, {"type": "array", "items": {"$ref": "#/$defs/a"}},
        {"type": "string"}]}},
        "$ref": "#/$defs/a"}));
    let mut deep = json!(null);
    for _ in 0..60 {
        deep = json!([deep]);
    }
    let e = explode.check(&deep).unwrap_err();
    assert!(matches!(&e, Mismatch::Limit(m) if m.contains("INPUT_SCHEMA_MAX_STEPS")), "{e}");
    let unique = compiled(json!({"uniqueItems": true}));
    let many: Vec<u32> = (0..5000).collect();
    let e = unique.check(&json!(many)).unwrap_err();
    assert!(matches!(&e, Mismatch::Limit(_)), "{e}");
    // Deeper than the depth through a recursive schema: refused, named.
    let nested = compiled(json!({"$defs": {"n": {"items": {"$ref": "#/$defs/n"}}}, "$ref": "#/$defs/n"}));
    let mut v = json!([]);
    for _ in 0..(MAX_DEPTH + 10) {
        v = json!([v]);
    }
    assert!(matches!(nested.check(&v), Err(Mismatch::Limit(_))));
}

#[test]
fn a_pointer_with_escapes_and_percent_encoding_resolves() {
    let s = compiled(json!({"$defs": {"a/b": {"type": "integer"}, "c d": {"type": "string"}},
        "properties": {"x": {"$ref": "#/$defs/a~1b"}, "y": {"$ref": "#/$defs/c%20d"}}}));
    passes(&s, json!({"x": 1, "y": "s"}));
    assert_eq!(miss(&s, json!({"x": "1"})).0, "/x");
    assert_eq!(miss(&s, json!({"y": 1})).0, "/y");
}

/// Each comparison, lookup and list a keyword walks is paid for: what a
/// review found taking seconds to minutes within the budget now runs into
/// it (or costs one step a property).
#[test]
fn every_keyword_pays_for_the_work_it_does() {
    let limited = |schema: Value, input: Value| {
        let s = compiled(schema.clone());
        match s.check(&input) {
            Err(Mismatch::Limit(m)) => assert!(m.contains("INPUT_SCHEMA_MAX_STEPS"), "{m}"),
            other => panic!("not limited: {other:?}"),
        }
    };
    let n = 100_000;
    // A long const compared through a fan-out of $refs.
    limited(
        json!({"$defs": {"c": {"const": vec![0; n]}, "d1": {"allOf": vec![json!({"$ref": "#/$defs/c"}); 100]}},
               "allOf": vec![json!({"$ref": "#/$defs/d1"}); 200]}),
        json!(vec![0; n]),
    );
    // uniqueItems over long items that differ only at their ends.
    let items: Vec<Value> = (0..1000)
        .map(|i| {
            let mut a = vec![json!(0); 480];
            a.push(json!(i));
            json!(a)
        })
        .collect();
    limited(json!({"uniqueItems": true}), json!(items));
    // dependentRequired's lists, and enum's values, are walked per item.
    limited(json!({"items": {"dependentRequired": {"a": vec!["a"; 60_000]}}}), json!(vec![json!({"a": 1}); 20_000]));
    limited(json!({"items": {"enum": (0..60_000).collect::<Vec<_>>()}}), json!(vec![59_999; 20_000]));
    // A long type list is the set of its types, and says so briefly.
    let mut types = vec![json!("null"); 100_000];
    types.push(json!("number"));
    let s = compiled(json!({"type": types}));
    let (_, why) = miss(&s, json!("x"));
    assert_eq!(why, "expected null or number, got string \"x\"");
}

#[test]
fn patterns_and_schemas_are_bounded_at_registration() {
    let patterns: serde_json::Map<String, Value> =
        (0..=super::MAX_PATTERNS).map(|i| (format!("^a{i}$"), json!(true))).collect();
    assert!(refused(json!({"patternProperties": patterns})).contains("INPUT_SCHEMA_MAX_PATTERNS"));
    // The same pattern many times is one.
    let same: Vec<Value> = (0..1000).map(|_| json!({"pattern": "^[a-z]+$"})).collect();
    compiled(json!({"anyOf": same}));
    let many: serde_json::Map<String, Value> = (0..=super::MAX_SCHEMAS).map(|i| (format!("p{i}"), json!({}))).collect();
    assert!(refused(json!({"properties": many})).contains("INPUT_SCHEMA_MAX_SCHEMAS"));
}

#[test]
fn whole_numbers_past_i64_are_multiples_exactly_and_named_as_written() {
    let s = compiled(json!({"multipleOf": 2}));
    let (_, why) = miss(&s, json!(u64::MAX));
    assert_eq!(why, "18446744073709551615 is not a multiple of 2");
    passes(&s, json!(u64::MAX - 1));
    let (_, why) = miss(&s, json!(i64::MAX));
    assert_eq!(why, "9223372036854775807 is not a multiple of 2");
    assert!(refused(json!({"multipleOf": -1})).contains("greater than 0"));
}
