//! The pure core of Composer. Nothing here performs I/O: the state machine is a
//! function from (run, event, clock) to a transition, so every rule of the
//! engine can be tested with plain values.
//!
//! - [`api`]: the REST API's request and response bodies.
//! - [`config`]: what every role's configuration shares (service URLs, limits).
//! - [`duration`]: durations written like `500ms`, `30s`, `10m`.
//! - [`expr`]: jq expressions and `${ … }` templates (jaq).
//! - [`definition`]: the workflow language, parsed and validated into a
//!   [`definition::Workflow`] that the engine caches per version.
//! - [`machine`]: runs and tasks, their states, and the rules that move them.
//! - [`wire`]: the messages that cross process boundaries (dispatches, reports).

#![cfg_attr(not(test), deny(clippy::unwrap_used))]
#![deny(clippy::dbg_macro, clippy::todo, clippy::print_stderr)]
#![forbid(unsafe_code)]

pub mod api;
pub mod config;
pub mod definition;
pub mod duration;
pub mod expr;
pub mod machine;
pub mod simulate;
pub mod storable;
pub mod wire;
