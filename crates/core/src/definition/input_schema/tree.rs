//! A compiled schema: the keywords of each schema object that check
//! anything, with their values read and their patterns compiled.

use regex::Regex;
use serde_json::Value;

/// Most steps (a schema applied to a value, a comparison of two items, a
/// stretch of text matched) one input's check may take: about a second
/// of work at worst, a millisecond for a typical input.
pub const MAX_STEPS: u64 = 1_000_000;

/// Most `pattern`s and `patternProperties` one schema compiles (the same
/// text once): each may take up to [`MAX_PATTERN_SIZE`] and as much again
/// of matching cache.
pub const MAX_PATTERNS: usize = 64;

/// Largest compiled size of one pattern (the `regex` crate's size limit).
pub const MAX_PATTERN_SIZE: usize = 256 << 10;

/// Most schema objects one schema compiles, its `$ref` targets compiled
/// once more each: the work and memory of a registration.
pub const MAX_SCHEMAS: usize = 100_000;

/// Most schemas one check may nest (through `$ref`, applicators and the
/// input's own depth).
pub const MAX_DEPTH: usize = 256;

/// One compiled schema: `true`, `false`, or an object of keywords.
#[derive(Debug, Clone)]
pub enum Schema {
    Bool(bool),
    Keywords(Box<Keywords>),
}

/// The keywords of one schema object that check anything.
#[derive(Debug, Clone, Default)]
pub struct Keywords {
    pub types: Option<Vec<Type>>,
    pub enumeration: Option<Vec<Value>>,
    pub constant: Option<Value>,
    /// As written, so a refusal names it as written.
    pub multiple_of: Option<serde_json::Number>,
    pub maximum: Option<f64>,
    pub exclusive_maximum: Option<f64>,
    pub minimum: Option<f64>,
    pub exclusive_minimum: Option<f64>,
    pub max_length: Option<u64>,
    pub min_length: Option<u64>,
    pub pattern: Option<(String, Regex)>,
    pub max_items: Option<u64>,
    pub min_items: Option<u64>,
    pub unique_items: bool,
    pub max_contains: Option<u64>,
    pub min_contains: Option<u64>,
    pub max_properties: Option<u64>,
    pub min_properties: Option<u64>,
    pub required: Vec<String>,
    pub dependent_required: Vec<(String, Vec<String>)>,
    pub reference: Option<usize>,
    pub all_of: Vec<Schema>,
    pub any_of: Vec<Schema>,
    pub one_of: Vec<Schema>,
    pub not: Option<Schema>,
    pub if_then_else: Option<(Schema, Option<Schema>, Option<Schema>)>,
    pub dependent_schemas: Vec<(String, Schema)>,
    pub prefix_items: Vec<Schema>,
    pub items: Option<Schema>,
    pub contains: Option<Schema>,
    /// By name: found in one lookup per property of the input.
    pub properties: std::collections::HashMap<String, Schema>,
    pub pattern_properties: Vec<(String, Regex, Schema)>,
    pub additional_properties: Option<Schema>,
    pub property_names: Option<Schema>,
}

/// A JSON type as `type` names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Type {
    Null,
    Boolean,
    Object,
    Array,
    Number,
    String,
    Integer,
}

impl Type {
    pub(super) fn named(name: &str) -> Option<Type> {
        Some(match name {
            "null" => Type::Null,
            "boolean" => Type::Boolean,
            "object" => Type::Object,
            "array" => Type::Array,
            "number" => Type::Number,
            "string" => Type::String,
            "integer" => Type::Integer,
            _ => return None,
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            Type::Null => "null",
            Type::Boolean => "boolean",
            Type::Object => "object",
            Type::Array => "array",
            Type::Number => "number",
            Type::String => "string",
            Type::Integer => "integer",
        }
    }
}
