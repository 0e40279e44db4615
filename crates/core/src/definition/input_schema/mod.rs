//! A workflow's `input_schema`: a JSON Schema (draft 2020-12) that every
//! run's input is checked against when the run is created, whatever
//! starts it (the API, a trigger, a schedule, a parent, a failure handler).
//!
//! The schema is compiled once, at registration, into a tree of [`Schema`]s:
//! a keyword with a value of the wrong shape, a `pattern` that is not a
//! regular expression, a `$ref` that leads nowhere or outside the schema,
//! and the 2020-12 keywords this checker does not implement are refused
//! then, naming where. Keywords it does not know are ignored, as the
//! standard says (annotations such as `title`, `format` and `examples`).
//!
//! The schema is written by whoever registers the workflow, the input by
//! whoever starts a run: neither may make a check take long or overflow a
//! stack. A check costs at most [`MAX_STEPS`] steps and nests at most
//! [`MAX_DEPTH`] schemas deep; past either the start is refused, naming
//! the limit. Regular expressions are the `regex` crate's: linear in the
//! text, without look-around or back-references (refused at registration).
//!
//! - `tree`: a compiled schema, keyword by keyword, and the check's limits.
//! - `check`: a value against a compiled schema, within the budget.

mod check;
mod tree;

use std::collections::HashMap;

use regex::Regex;
use serde_json::{Map, Value};

use super::check::ValidationError;

pub use check::Mismatch;
use tree::{Keywords, Schema, Type};
pub use tree::{MAX_DEPTH, MAX_PATTERNS, MAX_PATTERN_SIZE, MAX_SCHEMAS, MAX_STEPS};

/// The dialect, when `$schema` names one.
const DIALECTS: [&str; 2] =
    ["https://json-schema.org/draft/2020-12/schema", "https://json-schema.org/draft/2020-12/schema#"];

/// 2020-12 keywords this checker does not implement: refused rather than
/// ignored, so a schema never checks less than its author wrote.
const UNSUPPORTED: [(&str, &str); 10] = [
    ("$dynamicRef", "dynamic references are not supported"),
    ("$dynamicAnchor", "dynamic anchors are not supported"),
    ("$recursiveRef", "dynamic references are not supported"),
    ("$recursiveAnchor", "dynamic anchors are not supported"),
    ("$anchor", "anchors are not supported: use \"$ref\": \"#/$defs/NAME\""),
    ("$vocabulary", "vocabularies are not supported"),
    ("unevaluatedProperties", "not supported: use additionalProperties"),
    ("unevaluatedItems", "not supported: use items"),
    ("additionalItems", "a draft-07 keyword: in 2020-12 use prefixItems and items"),
    ("dependencies", "a draft-07 keyword: in 2020-12 use dependentRequired or dependentSchemas"),
];

/// A compiled `input_schema`.
#[derive(Debug, Clone)]
pub struct InputSchema {
    /// The schema as written: two compiled schemas are equal when it is.
    source: Value,
    root: Schema,
    /// The schemas `$ref`s lead to, by [`Schema`]'s `reference` index.
    targets: Vec<Schema>,
}

impl InputSchema {
    /// Compiles `schema` (the definition's `input_schema`, at `path`).
    pub fn compile(schema: &Value, path: &str) -> Result<InputSchema, ValidationError> {
        if let Some(Value::String(dialect)) = schema.get("$schema") {
            if !DIALECTS.contains(&dialect.as_str()) {
                return Err(ValidationError::new(
                    format!("{path}.$schema"),
                    format!("{dialect:?}: only JSON Schema draft 2020-12 ({}) is supported", DIALECTS[0]),
                ));
            }
        }
        let mut c =
            Compiler { doc: schema, refs: HashMap::new(), pending: Vec::new(), patterns: HashMap::new(), schemas: 0 };
        let root = c.schema(schema, path, true)?;
        let mut targets: Vec<Option<Schema>> = Vec::new();
        while let Some((index, pointer)) = c.pending.pop() {
            let at = format!("{path}{}", pointer.replace('/', "."));
            let value = resolve(schema, &pointer).ok_or_else(|| {
                ValidationError::new(path, format!("a $ref leads to #{pointer}, which is not in the schema"))
            })?;
            let compiled = c.schema(value, &at, pointer.is_empty())?;
            if targets.len() <= index {
                targets.resize(index + 1, None);
            }
            targets[index] = Some(compiled);
        }
        let targets = targets.into_iter().map(|t| t.unwrap_or(Schema::Bool(true))).collect();
        Ok(InputSchema { source: schema.clone(), root, targets })
    }

    /// Why the schema refuses every list, when its root says so outright
    /// (`false`, a `type`, `const` or `enum` with no array): a batch's run
    /// could never start. `None` when a list may match, or it cannot tell.
    pub fn refuses_every_list(&self) -> Option<String> {
        let Schema::Keywords(k) = &self.root else {
            return matches!(self.root, Schema::Bool(false)).then(|| "input_schema is false".to_string());
        };
        if let Some(types) = k.types.as_ref().filter(|t| !t.contains(&Type::Array)) {
            let names: Vec<&str> = types.iter().map(|t| t.name()).collect();
            return Some(format!("input_schema's type is {}", names.join(" or ")));
        }
        if k.constant.as_ref().is_some_and(|c| !c.is_array()) {
            return Some("input_schema's const is not a list".to_string());
        }
        if k.enumeration.as_ref().is_some_and(|e| !e.iter().any(Value::is_array)) {
            return Some("input_schema's enum has no list".to_string());
        }
        None
    }

    /// Whether `input` matches: the first place it does not, or the limit
    /// the check ran into.
    pub fn check(&self, input: &Value) -> Result<(), Mismatch> {
        check::Checker::new(&self.targets).run(&self.root, input)
    }
}

impl PartialEq for InputSchema {
    fn eq(&self, other: &Self) -> bool {
        self.source == other.source
    }
}

struct Compiler<'d> {
    doc: &'d Value,
    /// The index of each `$ref`'s target, by JSON pointer (`""` the root).
    refs: HashMap<String, usize>,
    /// Targets still to compile.
    pending: Vec<(usize, String)>,
    /// Each pattern compiled, by its text.
    patterns: HashMap<String, Regex>,
    /// Schema objects compiled so far.
    schemas: usize,
}

type Compiled<T> = Result<T, ValidationError>;

impl Compiler<'_> {
    fn schema(&mut self, v: &Value, path: &str, root: bool) -> Compiled<Schema> {
        let o = match v {
            Value::Bool(b) => return Ok(Schema::Bool(*b)),
            Value::Object(o) => o,
            other => {
                return Err(ValidationError::new(path, format!("a schema is an object or a boolean, not {other}")))
            }
        };
        self.schemas += 1;
        if self.schemas > MAX_SCHEMAS {
            return Err(ValidationError::new(
                path,
                format!("more than {MAX_SCHEMAS} schemas once its $refs are followed (INPUT_SCHEMA_MAX_SCHEMAS)"),
            ));
        }
        for (keyword, why) in UNSUPPORTED {
            if o.contains_key(keyword) {
                return Err(ValidationError::new(format!("{path}.{keyword}"), why));
            }
        }
        if o.contains_key("$id") && !root {
            return Err(ValidationError::new(
                format!("{path}.$id"),
                "only the root schema may have an $id (an embedded resource is not supported)",
            ));
        }
        let mut k = Keywords::default();
        self.assertions(o, path, &mut k)?;
        self.applicators(o, path, &mut k)?;
        Ok(Schema::Keywords(Box::new(k)))
    }

    /// The keywords that check a value itself.
    fn assertions(&mut self, o: &Map<String, Value>, path: &str, k: &mut Keywords) -> Compiled<()> {
        let at = |kw: &str| format!("{path}.{kw}");
        k.types = o.get("type").map(|t| types(t, &at("type"))).transpose()?;
        k.enumeration = match o.get("enum") {
            Some(Value::Array(values)) => Some(values.clone()),
            Some(_) => return Err(ValidationError::new(at("enum"), "must be an array")),
            None => None,
        };
        k.constant = o.get("const").cloned();
        k.multiple_of = match o.get("multipleOf") {
            None => None,
            Some(Value::Number(n)) => Some(n.clone()),
            Some(_) => return Err(ValidationError::new(at("multipleOf"), "must be a number")),
        };
        if k.multiple_of.as_ref().is_some_and(|m| m.as_f64().is_none_or(|m| m <= 0.0 || !m.is_finite())) {
            return Err(ValidationError::new(at("multipleOf"), "must be greater than 0"));
        }
        k.maximum = number(o, "maximum", path)?;
        k.exclusive_maximum = number(o, "exclusiveMaximum", path)?;
        k.minimum = number(o, "minimum", path)?;
        k.exclusive_minimum = number(o, "exclusiveMinimum", path)?;
        k.max_length = count(o, "maxLength", path)?;
        k.min_length = count(o, "minLength", path)?;
        k.pattern = match o.get("pattern") {
            Some(Value::String(p)) => Some((p.clone(), self.regex(p, &at("pattern"))?)),
            Some(_) => return Err(ValidationError::new(at("pattern"), "must be a string")),
            None => None,
        };
        k.max_items = count(o, "maxItems", path)?;
        k.min_items = count(o, "minItems", path)?;
        k.unique_items = match o.get("uniqueItems") {
            Some(Value::Bool(b)) => *b,
            Some(_) => return Err(ValidationError::new(at("uniqueItems"), "must be true or false")),
            None => false,
        };
        k.max_contains = count(o, "maxContains", path)?;
        k.min_contains = count(o, "minContains", path)?;
        k.max_properties = count(o, "maxProperties", path)?;
        k.min_properties = count(o, "minProperties", path)?;
        k.required = o.get("required").map(|r| names(r, &at("required"))).transpose()?.unwrap_or_default();
        if let Some(d) = o.get("dependentRequired") {
            let Value::Object(d) = d else {
                return Err(ValidationError::new(at("dependentRequired"), "must be an object"));
            };
            for (name, r) in d {
                k.dependent_required.push((name.clone(), names(r, &format!("{path}.dependentRequired.{name}"))?));
            }
        }
        Ok(())
    }

    /// The keywords that apply subschemas.
    fn applicators(&mut self, o: &Map<String, Value>, path: &str, k: &mut Keywords) -> Compiled<()> {
        let at = |kw: &str| format!("{path}.{kw}");
        if let Some(r) = o.get("$ref") {
            let Value::String(r) = r else { return Err(ValidationError::new(at("$ref"), "must be a string")) };
            k.reference = Some(self.reference(r, &at("$ref"))?);
        }
        k.all_of = self.list(o, "allOf", path)?;
        k.any_of = self.list(o, "anyOf", path)?;
        k.one_of = self.list(o, "oneOf", path)?;
        k.not = self.sub(o, "not", path)?;
        if let Some(cond) = self.sub(o, "if", path)? {
            k.if_then_else = Some((cond, self.sub(o, "then", path)?, self.sub(o, "else", path)?));
        }
        k.dependent_schemas = self.keyed(o, "dependentSchemas", path)?;
        k.prefix_items = self.list(o, "prefixItems", path)?;
        if let Some(Value::Array(_)) = o.get("items") {
            return Err(ValidationError::new(at("items"), "an array of schemas is draft-07's form: use prefixItems"));
        }
        k.items = self.sub(o, "items", path)?;
        k.contains = self.sub(o, "contains", path)?;
        k.properties = self.keyed(o, "properties", path)?.into_iter().collect();
        for (pattern, schema) in self.keyed(o, "patternProperties", path)? {
            let re = self.regex(&pattern, &format!("{path}.patternProperties.{pattern}"))?;
            k.pattern_properties.push((pattern, re, schema));
        }
        k.additional_properties = self.sub(o, "additionalProperties", path)?;
        k.property_names = self.sub(o, "propertyNames", path)?;
        // Containers of schemas that check nothing themselves: compiled so a
        // mistake in one is found now, whether or not a $ref uses it.
        for defs in ["$defs", "definitions"] {
            self.keyed(o, defs, path)?;
        }
        Ok(())
    }

    fn sub(&mut self, o: &Map<String, Value>, kw: &str, path: &str) -> Compiled<Option<Schema>> {
        o.get(kw).map(|v| self.schema(v, &format!("{path}.{kw}"), false)).transpose()
    }

    fn list(&mut self, o: &Map<String, Value>, kw: &str, path: &str) -> Compiled<Vec<Schema>> {
        match o.get(kw) {
            None => Ok(Vec::new()),
            Some(Value::Array(a)) if !a.is_empty() || kw == "prefixItems" => {
                a.iter().enumerate().map(|(i, v)| self.schema(v, &format!("{path}.{kw}[{i}]"), false)).collect()
            }
            Some(_) => Err(ValidationError::new(format!("{path}.{kw}"), "must be a non-empty array of schemas")),
        }
    }

    fn keyed(&mut self, o: &Map<String, Value>, kw: &str, path: &str) -> Compiled<Vec<(String, Schema)>> {
        match o.get(kw) {
            None => Ok(Vec::new()),
            Some(Value::Object(m)) => m
                .iter()
                .map(|(name, v)| Ok((name.clone(), self.schema(v, &format!("{path}.{kw}.{name}"), false)?)))
                .collect(),
            Some(_) => Err(ValidationError::new(format!("{path}.{kw}"), "must be an object of schemas")),
        }
    }

    /// `pattern` compiled, once per text, within [`MAX_PATTERNS`].
    fn regex(&mut self, pattern: &str, path: &str) -> Compiled<Regex> {
        if let Some(re) = self.patterns.get(pattern) {
            return Ok(re.clone());
        }
        if self.patterns.len() >= MAX_PATTERNS {
            return Err(ValidationError::new(
                path,
                format!("more than {MAX_PATTERNS} different patterns in one schema (INPUT_SCHEMA_MAX_PATTERNS)"),
            ));
        }
        let re = regex::RegexBuilder::new(pattern)
            .size_limit(MAX_PATTERN_SIZE)
            .dfa_size_limit(MAX_PATTERN_SIZE)
            .build()
            .map_err(|e| {
                ValidationError::new(path, format!("{pattern:?} is not a regular expression this checker runs: {e}"))
            })?;
        self.patterns.insert(pattern.to_string(), re.clone());
        Ok(re)
    }

    /// The index of the schema `r` leads to, compiled later.
    fn reference(&mut self, r: &str, path: &str) -> Compiled<usize> {
        let Some(fragment) = r.strip_prefix('#') else {
            return Err(ValidationError::new(
                path,
                format!("{r:?}: only references within input_schema (\"#\", \"#/$defs/NAME\") are followed"),
            ));
        };
        let pointer = percent_decoded(fragment)
            .filter(|p| p.is_empty() || p.starts_with('/'))
            .ok_or_else(|| ValidationError::new(path, format!("{r:?} is not a JSON pointer (#/$defs/NAME)")))?;
        if resolve(self.doc, &pointer).is_none() {
            return Err(ValidationError::new(path, format!("{r:?} leads to nothing in the schema")));
        }
        let next = self.refs.len();
        let index = *self.refs.entry(pointer.clone()).or_insert(next);
        if index == next {
            self.pending.push((index, pointer));
        }
        Ok(index)
    }
}

fn types(t: &Value, path: &str) -> Compiled<Vec<Type>> {
    let named = |v: &Value| {
        v.as_str().and_then(Type::named).ok_or_else(|| {
            ValidationError::new(
                path,
                format!("{v} is not a type (null, boolean, object, array, number, string, integer)"),
            )
        })
    };
    match t {
        Value::Array(a) if !a.is_empty() => {
            let mut types = Vec::new();
            for v in a {
                let t = named(v)?;
                if !types.contains(&t) {
                    types.push(t);
                }
            }
            Ok(types)
        }
        Value::Array(_) => Err(ValidationError::new(path, "must name at least one type")),
        v => Ok(vec![named(v)?]),
    }
}

fn number(o: &Map<String, Value>, kw: &str, path: &str) -> Compiled<Option<f64>> {
    match o.get(kw) {
        None => Ok(None),
        Some(Value::Number(n)) => Ok(n.as_f64()),
        Some(_) => Err(ValidationError::new(format!("{path}.{kw}"), "must be a number")),
    }
}

fn count(o: &Map<String, Value>, kw: &str, path: &str) -> Compiled<Option<u64>> {
    match o.get(kw) {
        None => Ok(None),
        Some(Value::Number(n)) => {
            match n.as_u64().or_else(|| n.as_f64().filter(|f| f.fract() == 0.0 && *f >= 0.0).map(|f| f as u64)) {
                Some(c) => Ok(Some(c)),
                None => Err(ValidationError::new(format!("{path}.{kw}"), "must be a whole number, 0 or more")),
            }
        }
        Some(_) => Err(ValidationError::new(format!("{path}.{kw}"), "must be a whole number, 0 or more")),
    }
}

fn names(v: &Value, path: &str) -> Compiled<Vec<String>> {
    let Value::Array(a) = v else { return Err(ValidationError::new(path, "must be an array of property names")) };
    a.iter()
        .map(|n| n.as_str().map(str::to_string).ok_or_else(|| ValidationError::new(path, format!("{n} is not a name"))))
        .collect()
}

/// The value at JSON pointer `pointer` (already percent-decoded) in `doc`.
fn resolve<'d>(doc: &'d Value, pointer: &str) -> Option<&'d Value> {
    if pointer.is_empty() {
        return Some(doc);
    }
    doc.pointer(pointer)
}

/// `fragment` with its `%XX` escapes decoded (a URI fragment's), or `None`
/// when one is malformed.
fn percent_decoded(fragment: &str) -> Option<String> {
    let bytes = fragment.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests;
