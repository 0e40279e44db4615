//! Limits on steps across runs: the engine's writes (a step held back, an
//! attempt's end, a target's `Retry-After`), the limiter's pass that admits
//! waiting steps into the outbox, and the operators' reads and settings.
//!
//! Why it is safe on many coordinators:
//! - A pass runs under one transaction-scoped advisory lock, so passes run
//!   one at a time and every count and bucket they read is current.
//! - The engine touches a run's `limit_waits` rows only under the run's
//!   lock; a pass locks the runs it admits steps of with `SKIP LOCKED`, so it
//!   never waits for the engine and the engine never sees half a pass.
//! - `limit_holds` is written only by the engine and read by passes;
//!   `step_limits` only by passes and `PUT /v1/limits`: no lock cycle.
//!
//! - `writes`: what the engine's write does to limits (`LimitWrites`).
//! - `pass`: the limiter's pass ([`admit`]) and the channel that wakes it.
//! - `operators`: what operators read and set, and why a run's steps wait.

mod operators;
mod pass;
mod writes;

pub use operators::{delete, get, held_in_run, list, set, Held, LimitRow};
pub use pass::{admit, Pass, LIMITS_CHANNEL, PASS_KEYS, PASS_SLACK_PER_KEY, PASS_STEPS_PER_KEY};
pub(crate) use writes::LimitWrites;
