//! Reading a part of a definition from JSON with serde, so that an error
//! names the field at fault, however deep, and says what it expected:
//! `retry.max_attempts: expected an integer, got 1.5`, not the node alone.
//! Any `Deserialize` type is read ([`from_value`]), so a field added to a
//! spec gets its path without anyone listing it: the deserializer walks the
//! [`Value`] itself and each map entry and array element it descends into
//! adds its key or index to an error coming back out.

use std::fmt;

use serde::de::value::BorrowedStrDeserializer;
use serde::de::{self, DeserializeOwned, DeserializeSeed, Expected, Unexpected, Visitor};
use serde_json::{Map, Value};

/// Why a value was not read: `path` from the value read (`.retry.max_attempts`,
/// `[0].on`; empty for the value itself) and what is wrong there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Located {
    /// The path's segments, innermost first (each level adds its own on the way out).
    segments: Vec<String>,
    pub message: String,
}

impl Located {
    /// The path from the value read, `""` for the value itself.
    pub fn path(&self) -> String {
        self.segments.iter().rev().map(String::as_str).collect()
    }

    /// The error's place under `base` (`nodes[a]` gives `nodes[a].retry.max_attempts`);
    /// with no base, the path without its leading dot (`$` for the whole).
    pub fn under(&self, base: &str) -> String {
        let path = self.path();
        match (base, path.strip_prefix('.')) {
            ("", Some(field)) => field.to_string(),
            ("", None) if path.is_empty() => "$".to_string(),
            _ => format!("{base}{path}"),
        }
    }

    fn at(mut self, segment: String) -> Self {
        self.segments.push(segment);
        self
    }

    fn at_key(self, key: &str) -> Self {
        self.at(format!(".{key}"))
    }
}

impl fmt::Display for Located {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.under("") {
            path if path == "$" => f.write_str(&self.message),
            path => write!(f, "{path}: {}", self.message),
        }
    }
}

impl std::error::Error for Located {}

impl de::Error for Located {
    fn custom<T: fmt::Display>(msg: T) -> Self {
        Located { segments: Vec::new(), message: msg.to_string() }
    }

    fn invalid_type(unexp: Unexpected, exp: &dyn Expected) -> Self {
        Self::custom(format_args!("expected {}, got {}", expected(exp), got(&unexp)))
    }

    fn invalid_value(unexp: Unexpected, exp: &dyn Expected) -> Self {
        Self::custom(format_args!("expected {}, got {}", expected(exp), got(&unexp)))
    }

    fn unknown_variant(variant: &str, accepted: &'static [&'static str]) -> Self {
        Self::custom(format_args!("{variant:?} is not accepted (expected one of: {})", accepted.join(", ")))
    }

    fn unknown_field(_field: &str, accepted: &'static [&'static str]) -> Self {
        Self::custom(format_args!("unknown field (expected {})", accepted.join(", ")))
    }

    /// Named by its own path: `concurrency.max: is required`.
    fn missing_field(field: &'static str) -> Self {
        Self::custom("is required").at_key(field)
    }
}

/// What serde says a visitor expected, in the definition's words: a Rust
/// type (`u32`, `f64`, `struct RetrySpec`) never reaches the user.
fn expected(exp: &dyn Expected) -> String {
    let said = exp.to_string();
    let words = match said.as_str() {
        "u8" => "an integer from 0 to 255",
        "u16" => "an integer from 0 to 65535",
        "u32" => "an integer from 0 to 4294967295",
        "u64" | "usize" => "an integer of 0 or more",
        "i8" | "i16" | "i32" | "i64" | "isize" => "an integer",
        "f32" | "f64" => "a number",
        "a sequence" => "an array",
        "a map" => "an object",
        "a unit variant" | "unit" => "null",
        _ if said.starts_with("struct ") => "an object",
        _ => return said,
    };
    words.to_string()
}

/// What was found instead, as JSON says it.
fn got(unexp: &Unexpected) -> String {
    match unexp {
        Unexpected::Bool(b) => b.to_string(),
        Unexpected::Unsigned(n) => n.to_string(),
        Unexpected::Signed(n) => n.to_string(),
        Unexpected::Float(f) => f.to_string(),
        Unexpected::Str(s) => format!("{:?}", crate::clipped(s, 80)),
        Unexpected::Unit => "null".to_string(),
        Unexpected::Seq => "an array".to_string(),
        Unexpected::Map => "an object".to_string(),
        other => other.to_string(),
    }
}

/// What a JSON value is, for an error.
fn unexpected(v: &Value) -> Unexpected<'_> {
    match v {
        Value::Null => Unexpected::Unit,
        Value::Bool(b) => Unexpected::Bool(*b),
        Value::Number(n) => match (n.as_u64(), n.as_i64()) {
            (Some(u), _) => Unexpected::Unsigned(u),
            (None, Some(i)) => Unexpected::Signed(i),
            (None, None) => Unexpected::Float(n.as_f64().unwrap_or(f64::NAN)),
        },
        Value::String(s) => Unexpected::Str(s),
        Value::Array(_) => Unexpected::Seq,
        Value::Object(_) => Unexpected::Map,
    }
}

/// Reads a `T` from `v`; the error names the field at fault by its path from `v`.
pub fn from_value<T: DeserializeOwned>(v: &Value) -> Result<T, Located> {
    T::deserialize(At(v))
}

/// A value being read.
struct At<'de>(&'de Value);

/// The `"one of"` an enum's error lists.
struct OneOf(&'static [&'static str]);

impl Expected for OneOf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "one of: {}", self.0.join(", "))
    }
}

impl<'de> de::Deserializer<'de> for At<'de> {
    type Error = Located;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Located> {
        match self.0 {
            Value::Null => visitor.visit_unit(),
            Value::Bool(b) => visitor.visit_bool(*b),
            Value::Number(n) => match (n.as_u64(), n.as_i64()) {
                (Some(u), _) => visitor.visit_u64(u),
                (None, Some(i)) => visitor.visit_i64(i),
                (None, None) => visitor.visit_f64(n.as_f64().unwrap_or(f64::NAN)),
            },
            Value::String(s) => visitor.visit_borrowed_str(s),
            Value::Array(a) => visit_array(a, visitor),
            Value::Object(m) => visit_object(m, visitor),
        }
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Located> {
        match self.0 {
            Value::Null => visitor.visit_none(),
            _ => visitor.visit_some(self),
        }
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(self, _: &'static str, visitor: V) -> Result<V::Value, Located> {
        visitor.visit_newtype_struct(self)
    }

    /// An object only: serde would read a struct from an array of its
    /// fields too (`"retry": []`).
    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _: &'static str,
        _: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Located> {
        match self.0 {
            Value::Object(m) => visit_object(m, visitor),
            other => Err(de::Error::custom(format_args!("must be an object, got {}", got(&unexpected(other))))),
        }
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        _: &'static str,
        variants: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Located> {
        match self.0 {
            Value::String(s) => visitor.visit_enum(Variant { name: s, value: None }),
            Value::Object(m) if m.len() == 1 => match m.iter().next() {
                Some((k, v)) => visitor.visit_enum(Variant { name: k, value: Some(v) }),
                None => Err(de::Error::invalid_type(Unexpected::Map, &OneOf(variants))),
            },
            other => Err(de::Error::invalid_type(unexpected(other), &OneOf(variants))),
        }
    }

    fn deserialize_ignored_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Located> {
        visitor.visit_unit()
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string
        bytes byte_buf unit unit_struct seq tuple tuple_struct map identifier
    }
}

fn visit_array<'de, V: Visitor<'de>>(a: &'de [Value], visitor: V) -> Result<V::Value, Located> {
    let mut items = Items { iter: a.iter().enumerate() };
    let read = visitor.visit_seq(&mut items)?;
    match items.iter.len() {
        0 => Ok(read),
        left => Err(de::Error::invalid_length(a.len(), &format!("{} items", a.len() - left).as_str())),
    }
}

fn visit_object<'de, V: Visitor<'de>>(m: &'de Map<String, Value>, visitor: V) -> Result<V::Value, Located> {
    visitor.visit_map(Entries { iter: m.iter(), value: None })
}

/// An array's elements, each read at its index.
struct Items<'de> {
    iter: std::iter::Enumerate<std::slice::Iter<'de, Value>>,
}

impl<'de> de::SeqAccess<'de> for Items<'de> {
    type Error = Located;

    fn next_element_seed<T: DeserializeSeed<'de>>(&mut self, seed: T) -> Result<Option<T::Value>, Located> {
        match self.iter.next() {
            None => Ok(None),
            Some((i, v)) => seed.deserialize(At(v)).map(Some).map_err(|e| e.at(format!("[{i}]"))),
        }
    }

    fn size_hint(&self) -> Option<usize> {
        Some(self.iter.len())
    }
}

/// An object's entries, each value read at its key.
struct Entries<'de> {
    iter: serde_json::map::Iter<'de>,
    value: Option<(&'de str, &'de Value)>,
}

impl<'de> de::MapAccess<'de> for Entries<'de> {
    type Error = Located;

    fn next_key_seed<K: DeserializeSeed<'de>>(&mut self, seed: K) -> Result<Option<K::Value>, Located> {
        let Some((key, value)) = self.iter.next() else { return Ok(None) };
        self.value = Some((key, value));
        seed.deserialize(BorrowedStrDeserializer::<Located>::new(key)).map(Some).map_err(|e| e.at_key(key))
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, Located> {
        match self.value.take() {
            Some((key, value)) => seed.deserialize(At(value)).map_err(|e| e.at_key(key)),
            None => Err(de::Error::custom("a value was read before its key")),
        }
    }

    fn size_hint(&self) -> Option<usize> {
        Some(self.iter.len())
    }
}

/// An enum's variant (a string, or an object of one key) and its content.
struct Variant<'de> {
    name: &'de str,
    value: Option<&'de Value>,
}

impl<'de> de::EnumAccess<'de> for Variant<'de> {
    type Error = Located;
    type Variant = Self;

    fn variant_seed<V: DeserializeSeed<'de>>(self, seed: V) -> Result<(V::Value, Self), Located> {
        let read = seed.deserialize(BorrowedStrDeserializer::<Located>::new(self.name))?;
        Ok((read, self))
    }
}

impl<'de> de::VariantAccess<'de> for Variant<'de> {
    type Error = Located;

    fn unit_variant(self) -> Result<(), Located> {
        match self.value {
            None | Some(Value::Null) => Ok(()),
            Some(other) => Err(<Located as de::Error>::invalid_type(unexpected(other), &"null").at_key(self.name)),
        }
    }

    fn newtype_variant_seed<T: DeserializeSeed<'de>>(self, seed: T) -> Result<T::Value, Located> {
        match self.value {
            Some(v) => seed.deserialize(At(v)).map_err(|e| e.at_key(self.name)),
            None => Err(de::Error::invalid_type(Unexpected::Str(self.name), &"an object of one key")),
        }
    }

    fn tuple_variant<V: Visitor<'de>>(self, _: usize, visitor: V) -> Result<V::Value, Located> {
        match self.value {
            Some(Value::Array(a)) => visit_array(a, visitor).map_err(|e| e.at_key(self.name)),
            _ => Err(de::Error::custom("must be an object of one key whose value is an array")),
        }
    }

    fn struct_variant<V: Visitor<'de>>(self, _: &'static [&'static str], visitor: V) -> Result<V::Value, Located> {
        match self.value {
            Some(Value::Object(m)) => visit_object(m, visitor).map_err(|e| e.at_key(self.name)),
            _ => Err(de::Error::custom("must be an object of one key whose value is an object")),
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{json, Value};

    use crate::definition::config::{Takes, KINDS};
    use crate::definition::{ValidationError, Workflow};
    use crate::schedule::Schedule;

    /// What serde says in Rust, which no message may show.
    const RUST: [&str; 7] = ["invalid type", "u32", "f64", "struct ", "enum ", "`", "Spec"];

    fn refused(spec: &Value) -> ValidationError {
        let e = Workflow::parse(spec).expect_err(&spec.to_string());
        for word in RUST {
            assert!(!e.message.contains(word), "{spec}: {e} says {word:?}");
        }
        e
    }

    /// A config of `kind` that is valid: each required field (and the first
    /// of `one_of`) with its schema's first example.
    fn valid_config(kind: &crate::definition::config::KindConfig) -> Value {
        let mut config = serde_json::Map::new();
        let needed = kind.fields.iter().filter(|f| f.required || kind.one_of.first() == Some(&f.name));
        for f in needed {
            let example = (f.schema)()["examples"][0].clone();
            assert!(!example.is_null(), "{}.{} has no example", kind.name, f.name);
            config.insert(f.name.to_string(), example);
        }
        Value::Object(config)
    }

    /// A value the field's schema refuses; `None` for a field that takes anything.
    fn wrong_for(schema: &Value) -> Option<Value> {
        let constrained = ["type", "enum", "oneOf", "pattern"].iter().any(|k| schema.get(k).is_some());
        let takes_booleans = match &schema["type"] {
            Value::String(t) => t == "boolean",
            Value::Array(ts) => ts.iter().any(|t| t == "boolean"),
            _ => false,
        };
        constrained.then(|| if takes_booleans { json!(1.5) } else { json!(true) })
    }

    fn workflow(node: Value) -> Value {
        json!({"name": "w", "nodes": [node]})
    }

    #[test]
    fn a_wrong_field_of_any_node_kind_is_named_by_its_whole_path() {
        let kinds = KINDS.iter().map(|k| (k.name, valid_config(k))).chain([("charge", json!({"amount": 1}))]);
        for (kind, config) in kinds {
            let node = json!({"id": "a", "type": kind, "config": config});
            assert!(Workflow::parse(&workflow(node.clone())).is_ok(), "the valid {kind} node: {node}");
            // The node's own fields, the same for every kind: read before
            // the kind looks at its config.
            for (field, wrong, path, says) in [
                ("retry", json!({"max_attempts": 1.5}), "retry.max_attempts", "expected an integer, got 1.5"),
                ("retry", json!({"multiplier": "x"}), "retry.multiplier", "expected a number, got \"x\""),
                ("retry", json!({"on_429": "sometimes"}), "retry.on_429", "(expected one of: respect, ignore)"),
                ("retry", json!({"backoff": "1s"}), "retry.backoff", "unknown field (expected max_attempts"),
                ("retry", json!([]), "retry", "must be an object, got an array"),
                ("limits", json!([{"key": "k", "burst": 1.5}]), "limits[0].burst", "expected an integer"),
                ("limits", json!([{"rate": "1/1s"}]), "limits[0].key", "is required"),
                ("limits", json!({"key": "k"}), "limits", "expected an array, got an object"),
                ("delivery", json!("twice"), "delivery", "at_least_once, at_most_once"),
                ("timeout", json!(5), "timeout", "expected a string, got 5"),
                ("colour", json!(1), "colour", "unknown field (expected id, type"),
            ] {
                let mut bad = node.clone();
                bad[field] = wrong;
                let e = refused(&workflow(bad));
                assert_eq!(e.path, format!("nodes[a].{path}"), "{kind}: {e}");
                assert!(e.message.contains(says), "{kind}: {e} does not say {says:?}");
            }
        }
    }

    #[test]
    fn a_wrong_config_field_of_any_built_in_kind_is_named_by_its_path() {
        for kind in KINDS {
            for field in kind.fields {
                let mut config = valid_config(kind);
                for other in kind.one_of.iter().filter(|o| **o != field.name) {
                    config.as_object_mut().map(|c| c.remove(*other));
                }
                let (wrong, path) = match field.takes {
                    // The node a MAP runs: a node of its own, its path under the MAP's.
                    Takes::Node => (
                        json!({"type": "HTTP", "config": {"url": "http://h"}, "retry": {"max_attempts": 1.5}}),
                        format!("nodes[a].config.{}.retry.max_attempts", field.name),
                    ),
                    _ => match wrong_for(&(field.schema)()) {
                        Some(wrong) => (wrong, format!("nodes[a].config.{}", field.name)),
                        None => continue,
                    },
                };
                config[field.name] = wrong.clone();
                let spec = workflow(json!({"id": "a", "type": kind.name, "config": config}));
                let e = refused(&spec);
                assert!(e.path.starts_with(&path), "{}.{} = {wrong}: {e}", kind.name, field.name);
            }
        }
    }

    #[test]
    fn every_other_part_of_a_definition_is_named_by_its_whole_path() {
        let node = json!({"id": "a", "type": "HTTP", "config": {"url": "http://h"}});
        let two = json!([node, {"id": "b", "type": "HTTP", "config": {"url": "http://h"}}]);
        let cases = [
            ("edges", json!([{"from": "a", "to": "b", "on": "sometimes"}]), "edges[0].on", "success, failure, always"),
            ("edges", json!([{"from": "a", "to": "b", "when": 5}]), "edges[0].when", "expected a string, got 5"),
            ("edges", json!([{"from": "a"}]), "edges[0].to", "is required"),
            ("edges", json!([["a", "b"]]), "edges[0]", "must be an object"),
            ("triggers", json!([{"event": 5}]), "triggers[0].event", "expected a string, got 5"),
            ("triggers", json!([{"event": "e", "input": 1, "keys": 1}]), "triggers[0].keys", "unknown field"),
            ("on_failure", json!({"workflow": "h", "version": 1.5}), "on_failure.version", "an integer"),
            ("on_failure", json!({"workflow": "h", "on": "FAILED"}), "on_failure.on", "expected an array"),
            ("on_failure", json!({"input": {}}), "on_failure.workflow", "is required"),
            ("concurrency", json!({"max": "2"}), "concurrency.max", "expected an integer, got \"2\""),
            ("concurrency", json!({"max": 2, "key": ["k"]}), "concurrency.key", "expected a string, got an array"),
        ];
        for (field, value, path, says) in cases {
            let mut spec = json!({"name": "w", "nodes": two});
            spec[field] = value;
            let e = refused(&spec);
            assert_eq!(e.path, path, "{spec}: {e}");
            assert!(e.message.contains(says), "{spec}: {e} does not say {says:?}");
        }
        let e = Schedule::parse(&json!({"id": "s", "workflow": "w", "cron": "* * * * *", "version": 1.5})).unwrap_err();
        assert_eq!((e.path.as_str(), e.message.as_str()), ("version", "expected an integer, got 1.5"));
        let e = Schedule::parse(&json!({"id": "s", "workflow": "w"})).unwrap_err();
        assert_eq!((e.path.as_str(), e.message.as_str()), ("cron", "is required"));
        let e = Schedule::parse(&json!([1])).unwrap_err();
        assert_eq!((e.path.as_str(), e.message.as_str()), ("$", "must be an object, got an array"));
    }

    #[test]
    fn what_is_read_comes_back_as_it_was_written() {
        let node = json!({"id": "a", "type": "HTTP", "config": {"url": "http://h", "body": {"n": [1, -2, 2.5, null]}},
                          "retry": {"max_attempts": 2.0, "on_429": "ignore"}, "delivery": "at_most_once",
                          "limits": [{"key": "k", "rate": "1/1s"}]});
        let read: crate::definition::NodeSpec = super::from_value(&node).unwrap();
        let through_serde: crate::definition::NodeSpec = serde_json::from_value(node.clone()).unwrap();
        assert_eq!(read, through_serde);
        assert_eq!(read.config, node["config"]);
        assert_eq!(read.retry.and_then(|r| r.max_attempts), Some(2));
    }
}
