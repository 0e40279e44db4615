//! The pure core of Composer. Nothing here performs I/O: the state machine is a
//! function from (run, event, clock) to a transition, so every rule of the
//! engine can be tested with plain values.
//!
//! - [`duration`]: durations written like `500ms`, `30s`, `10m`.
//! - [`expr`]: jq expressions and `${ … }` templates (jaq).
//! - [`flow`]: a trigger's debounce, batch and throttle, per key: what an
//!   event and the passing of time do to what the key holds.
//! - [`http`]: what an HTTP node makes of its target's answer.
//! - [`limiter`]: which steps held by their limits may go now (token
//!   buckets, concurrency slots, a target's `Retry-After`).
//! - [`definition`]: the workflow language, parsed and validated into a
//!   [`definition::Workflow`] that the engine caches per version.
//! - [`machine`]: runs and tasks, their states, and the rules that move them.
//! - [`simulate`]: a run through the state machine with a mocked world.
//! - [`priority`]: priorities 1 to 5 and the weighted share that serves them.
//! - [`storable`]: what PostgreSQL and JSON readers accept back.
//! - [`schedule`]: cron schedules: their spec, validation and fire times.
//! - [`schema`]: OpenAPI schemas the Rust types cannot say (`openapi` feature).
//! - [`trace`]: W3C `traceparent` headers, and the span ids of runs and attempts.
//! - [`whole`]: integers that JSON writes as `2.0`.

pub mod definition;
pub mod duration;
pub mod expr;
pub mod flow;
pub mod http;
pub mod limiter;
pub mod machine;
pub mod priority;
pub mod schedule;
#[cfg(feature = "openapi")]
pub mod schema;
pub mod simulate;
pub mod storable;
pub mod trace;
pub mod whole;

/// The message a caught panic carried (`panic!("…")` gives a `&str` or a
/// `String`), for the error that replaces it.
pub fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".to_string())
}

/// `text` cut to at most `max` bytes (on a character boundary), marked with
/// `…` when cut: for a value quoted in an error, which someone else may have
/// made as large as they could.
pub fn clipped(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_string();
    }
    let mut cut = max;
    while !text.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{}… ({} bytes)", &text[..cut], text.len())
}
