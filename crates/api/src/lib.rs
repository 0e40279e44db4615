//! What crosses a process boundary, defined once for the server that
//! serves it and every client that sends it (the CLI, the bench, the test
//! kit, the workers), with the OpenAPI schema the document is built from.
//!
//! - [`rest`]: the REST API's request and response bodies (re-exported here).
//! - [`wire`]: the dispatch a worker reads from a stream and the report it
//!   sends back.
//! - [`definition_schema`]: the JSON Schema of a workflow definition, for
//!   editors.
//! - [`bounds`]: what the server checks that a schema can say, written into
//!   both documents' schemas from the server's constants.
//! - [`in_process`]: the task API as calls, for a worker in its
//!   coordinator's process.

pub mod bounds;
pub mod definition_schema;
pub mod in_process;
pub mod rest;
pub mod wire;

pub use composer_core::schema;
pub use rest::*;
