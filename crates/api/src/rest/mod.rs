//! The REST API's request and response bodies, shared by the coordinator
//! that serves them and by every client (the CLI, the bench, the test kit),
//! so a field is named in one place. One module per area, as the
//! coordinator's `http/` has one file per resource; everything is
//! re-exported here, so `composer_api::rest::X` names any of them.
//!
//! - [`runs`]: starting a run, its priority and control actions, the run
//!   and its tasks as shown, pages of runs, MAP items and history.
//! - [`repair`]: rerun from steps, complete a step by hand, resolve an
//!   IN_DOUBT attempt.
//! - [`explain`]: why a run is where it is.
//! - [`approvals`]: APPROVAL steps waiting for people, and their decisions.
//! - [`updates`]: a request to a waiting step, answered once by its id.
//! - [`bulk`]: one action on every run a filter matches.
//! - [`migrate`]: open runs moved to another version of their workflow.
//! - [`events`]: sending events, what they did, the event log.
//! - [`replay`]: recorded events' triggers run again after a fix.
//! - [`webhooks`]: signed deliveries turned into events.
//! - [`limits`]: limits on steps across runs, and why a step waits.
//! - [`schedules`]: schedules and backfills.
//! - [`workflows`]: definitions and their versions.
//! - [`tasks`]: the task API a worker speaks (poll, heartbeat, complete,
//!   fail).
//! - [`logs`]: a step's log lines, as a worker sends and a reader pages them.
//! - [`access`]: API keys and their scopes, and the audit log.
//! - [`error`]: the error body and the codes a worker acts on.
//! - [`archive`]: a run as an archive or an export keeps it, and their
//!   manifest.

pub mod access;
pub mod approvals;
pub mod archive;
pub mod bulk;
pub mod error;
pub mod events;
pub mod explain;
pub mod limits;
pub mod logs;
pub mod migrate;
pub mod repair;
pub mod replay;
pub mod runs;
pub mod schedules;
pub mod tasks;
pub mod updates;
pub mod webhooks;
pub mod workflows;

pub use access::*;
pub use approvals::*;
pub use archive::*;
pub use bulk::*;
pub use error::*;
pub use events::*;
pub use explain::*;
pub use limits::*;
pub use logs::*;
pub use migrate::*;
pub use repair::*;
pub use replay::*;
pub use runs::*;
pub use schedules::*;
pub use tasks::*;
pub use updates::*;
pub use webhooks::*;
pub use workflows::*;

/// Percent-encodes a path segment or a query value of an API URL: every
/// byte but the unreserved ones (RFC 3986), so a name or an id can never
/// add a segment, a query or a fragment.
pub fn encode(v: &str) -> String {
    v.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}
