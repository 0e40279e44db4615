//! Schemas for the OpenAPI document (the `openapi` feature) where the Rust
//! type says less than the server checks: a field declared `String` or
//! `Value` is refused unless it matches. A field names one with
//! `#[schema(value_type = …)]`.
use std::borrow::Cow;

use utoipa::openapi::schema::{AnyOfBuilder, ArrayBuilder, ObjectBuilder, OneOfBuilder, Schema, Type};
use utoipa::openapi::{Ref, RefOr};

/// What a name of a workflow, node, queue or schedule may be.
pub const NAME_PATTERN: &str = "^[A-Za-z0-9_.-]{1,128}$";
/// A string PostgreSQL can store: no NUL character.
pub const NO_NUL: &str = "^[^\\u0000]*$";

/// A workflow, node, queue or schedule name.
pub struct Name;

impl utoipa::PartialSchema for Name {
    fn schema() -> RefOr<Schema> {
        ObjectBuilder::new()
            .schema_type(Type::String)
            .pattern(Some(NAME_PATTERN))
            .min_length(Some(1))
            .max_length(Some(128))
            .into()
    }
}

impl utoipa::ToSchema for Name {}

/// Any JSON value without a NUL character in a string or a key.
pub struct JsonValue;

fn no_nul_string() -> ObjectBuilder {
    ObjectBuilder::new().schema_type(Type::String).pattern(Some(NO_NUL))
}

/// A `JsonValue` or null: an array's item or an object's value.
fn or_null() -> OneOfBuilder {
    OneOfBuilder::new().item(Ref::from_schema_name("JsonValue")).item(ObjectBuilder::new().schema_type(Type::Null))
}

impl utoipa::PartialSchema for JsonValue {
    fn schema() -> RefOr<Schema> {
        // Null is not among the alternatives, so that an optional field
        // (`JsonValue` or null) has exactly one schema for each value.
        AnyOfBuilder::new()
            .description(Some(
                "any JSON value but null, without a NUL character in a string or a key (PostgreSQL cannot store one)",
            ))
            .item(no_nul_string())
            .item(ObjectBuilder::new().schema_type(Type::Number))
            .item(ObjectBuilder::new().schema_type(Type::Boolean))
            .item(ArrayBuilder::new().items(or_null()))
            .item(
                ObjectBuilder::new()
                    .schema_type(Type::Object)
                    .additional_properties(Some(Schema::OneOf(or_null().build())))
                    .property_names(Some(no_nul_string())),
            )
            .into()
    }
}

impl utoipa::ToSchema for JsonValue {
    fn name() -> Cow<'static, str> {
        Cow::Borrowed("JsonValue")
    }
}

/// A JSON object without a NUL character in a string or a key.
pub struct JsonObject;

impl utoipa::PartialSchema for JsonObject {
    fn schema() -> RefOr<Schema> {
        ObjectBuilder::new()
            .schema_type(Type::Object)
            .description(Some("a JSON object without a NUL character in a string or a key"))
            .additional_properties(Some(Schema::OneOf(or_null().build())))
            .property_names(Some(no_nul_string()))
            .into()
    }
}

impl utoipa::ToSchema for JsonObject {
    fn schemas(schemas: &mut Vec<(String, RefOr<Schema>)>) {
        schemas.push(("JsonValue".into(), <JsonValue as utoipa::PartialSchema>::schema()));
    }
}
