//! Schemas for the OpenAPI document (the `openapi` feature) where the Rust
//! type says less than the server checks: a field declared `String` or
//! `Value` is refused unless it matches. A field names one with
//! `#[schema(value_type = …)]`.
//!
//! Where the API takes any JSON the schema says so and no more (no type, or
//! `object`): a recursive schema of the JSON grammar, which could also say
//! "no NUL character", is one that client generators cannot read. The server
//! still refuses a NUL (and values too large or too deep) with a 400 or 413.
use std::borrow::Cow;

use utoipa::openapi::schema::{ObjectBuilder, Schema, SchemaType, Type};
use utoipa::openapi::RefOr;

/// What a name of a workflow, node, queue, schedule or webhook may be
/// (`definition::check_name`), its length said apart: A-Z a-z 0-9 _ . -,
/// not `.` or `..`, which a URL path cannot carry. Written without a
/// look-ahead, which not every client's regex engine has: up to two dots
/// and another character, or three dots, then any of them.
pub const NAME_PATTERN: &str = "^(\\.{0,2}[A-Za-z0-9_-]|\\.{3})[A-Za-z0-9_.-]*$";
/// What a limit key may be: text without NUL, but not `.` or `..`
/// (`definition::check_path_segment`).
pub const LIMIT_KEY_PATTERN: &str = "^([^.\\u0000]|\\.[^.\\u0000]|\\.\\.[^\\u0000])[^\\u0000]*$";
/// What a namespace's name may be: 1 to 63 lowercase letters, digits and
/// `-`, starting with a letter.
pub const NAMESPACE_PATTERN: &str = "^[a-z][a-z0-9-]{0,62}$";

/// Whether `name` may name a namespace ([`NAMESPACE_PATTERN`]).
pub fn is_namespace_name(name: &str) -> bool {
    let mut bytes = name.bytes();
    name.len() <= 63
        && bytes.next().is_some_and(|b| b.is_ascii_lowercase())
        && bytes.all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}
/// A string PostgreSQL can store: no NUL character.
pub const NO_NUL: &str = "^[^\\u0000]*$";

/// A workflow, node, queue, schedule or webhook name.
pub struct Name;

impl utoipa::PartialSchema for Name {
    fn schema() -> RefOr<Schema> {
        ObjectBuilder::new()
            .schema_type(Type::String)
            .description(Some("1 to 128 of A-Z a-z 0-9 _ . -, and not `.` or `..` (a URL path cannot carry them)"))
            .pattern(Some(NAME_PATTERN))
            .min_length(Some(1))
            .max_length(Some(128))
            .into()
    }
}

impl utoipa::ToSchema for Name {}

/// A namespace's name.
pub struct NamespaceName;

impl utoipa::PartialSchema for NamespaceName {
    fn schema() -> RefOr<Schema> {
        ObjectBuilder::new()
            .schema_type(Type::String)
            .description(Some("1 to 63 lowercase letters, digits and '-', starting with a letter"))
            .pattern(Some(NAMESPACE_PATTERN))
            .min_length(Some(1))
            .max_length(Some(63))
            .into()
    }
}

impl utoipa::ToSchema for NamespaceName {}

/// A limit key as `PUT /v1/limits/{key}` sets it.
pub struct LimitKey;

impl utoipa::PartialSchema for LimitKey {
    fn schema() -> RefOr<Schema> {
        ObjectBuilder::new()
            .schema_type(Type::String)
            .description(Some("the limit key (URL-encoded): 1 to 256 bytes, no NUL, and not `.` or `..`"))
            .pattern(Some(LIMIT_KEY_PATTERN))
            .min_length(Some(1))
            .max_length(Some(256))
            .into()
    }
}

impl utoipa::ToSchema for LimitKey {}

/// What a tag's key may be (`definition::is_tag_key`).
pub const TAG_KEY_PATTERN: &str = "^[A-Za-z0-9_.-]{1,64}$";
/// `definition::MAX_TAGS` and `MAX_TAG_VALUE`, written again so that this
/// module uses nothing of the definitions it describes (the document's test
/// holds them equal).
const MAX_TAGS: usize = 16;
const MAX_TAG_VALUE: usize = 256;

/// `{key: value}` tags, at most `MAX_TAGS`, with values of `value`.
fn tags(what: &str, value: ObjectBuilder) -> RefOr<Schema> {
    ObjectBuilder::new()
        .schema_type(Type::Object)
        .description(Some(what))
        .property_names(Some(ObjectBuilder::new().schema_type(Type::String).pattern(Some(TAG_KEY_PATTERN))))
        .max_properties(Some(MAX_TAGS))
        .additional_properties(Some(value))
        .into()
}

/// A tag's value as a run is given it: text (at most
/// `MAX_TAG_VALUE` characters), a number or a boolean.
fn tag_value() -> ObjectBuilder {
    ObjectBuilder::new()
        .schema_type(SchemaType::Array(vec![Type::String, Type::Number, Type::Boolean]))
        .pattern(Some(NO_NUL))
}

/// A run's tags as a start gives them.
pub struct RunTags;

impl utoipa::PartialSchema for RunTags {
    fn schema() -> RefOr<Schema> {
        let value = tag_value().max_length(Some(MAX_TAG_VALUE));
        tags("tags: keys of 1 to 64 of A-Z a-z 0-9 _ . -, values text (256 characters at most) or numbers", value)
    }
}

impl utoipa::ToSchema for RunTags {}

/// A definition's tags: each a value or an expression over `{input}`.
pub struct DefinitionTags;

impl utoipa::PartialSchema for DefinitionTags {
    fn schema() -> RefOr<Schema> {
        tags(
            "tags: keys of 1 to 64 of A-Z a-z 0-9 _ . -, values text, numbers or expressions over {input}",
            tag_value(),
        )
    }
}

impl utoipa::ToSchema for DefinitionTags {}

/// Tags a filter asks for: text values.
pub struct TagFilter;

impl utoipa::PartialSchema for TagFilter {
    fn schema() -> RefOr<Schema> {
        tags(
            "the tags a run must have, keys of 1 to 64 of A-Z a-z 0-9 _ . -",
            ObjectBuilder::new().schema_type(Type::String),
        )
    }
}

impl utoipa::ToSchema for TagFilter {}

/// An end of a run that starts its failure handler (`on_failure.on`).
pub struct HandlerEnd;

impl utoipa::PartialSchema for HandlerEnd {
    fn schema() -> RefOr<Schema> {
        ObjectBuilder::new().schema_type(Type::String).enum_values(Some(["FAILED", "CANCELLED"])).into()
    }
}

impl utoipa::ToSchema for HandlerEnd {}

/// Any JSON value, null included. A field that takes one is declared
/// `value_type = JsonValue` and not `Option<JsonValue>`: null is already a
/// value of it, and "this or null" would then match null twice.
pub struct JsonValue;

impl utoipa::PartialSchema for JsonValue {
    fn schema() -> RefOr<Schema> {
        ObjectBuilder::new()
            .schema_type(SchemaType::AnyValue)
            .description(Some(
                "any JSON value; a string or a key may not hold a NUL character (PostgreSQL cannot store one)",
            ))
            .into()
    }
}

impl utoipa::ToSchema for JsonValue {
    fn name() -> Cow<'static, str> {
        Cow::Borrowed("JsonValue")
    }
}

/// A JSON object of any values.
pub struct JsonObject;

impl utoipa::PartialSchema for JsonObject {
    fn schema() -> RefOr<Schema> {
        ObjectBuilder::new()
            .schema_type(Type::Object)
            .description(Some(
                "a JSON object of any values; a string or a key may not hold a NUL character (PostgreSQL cannot store one)",
            ))
            .into()
    }
}

impl utoipa::ToSchema for JsonObject {}

/// A JSON Schema (draft 2020-12): an object of keywords, or `true` or
/// `false` (a definition's `input_schema`).
pub struct JsonSchemaDocument;

impl utoipa::PartialSchema for JsonSchemaDocument {
    fn schema() -> RefOr<Schema> {
        ObjectBuilder::new()
            .schema_type(SchemaType::from_iter([Type::Object, Type::Boolean]))
            .description(Some(
                "a JSON Schema (draft 2020-12) of the run's input; local $refs only, `format` not checked",
            ))
            .into()
    }
}

impl utoipa::ToSchema for JsonSchemaDocument {
    fn name() -> Cow<'static, str> {
        Cow::Borrowed("JsonSchemaDocument")
    }
}
