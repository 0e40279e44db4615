//! The Rust starter's workflow (what `composer init --lang rust` writes),
//! compiled and tested here as the project's own `cargo test` would: its
//! test runs the workflow offline with the steps' own code.

#![allow(clippy::unwrap_used)] // a test fails by panicking

#[path = "../../composer/templates/rust/src/workflow.rs"]
mod workflow;

#[test]
fn the_starter_makes_a_definition_the_server_accepts() {
    workflow::workflow().check().unwrap();
}
