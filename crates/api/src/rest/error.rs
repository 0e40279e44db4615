//! The one error body every failed call answers with, and the codes a
//! worker acts on.

use serde::{Deserialize, Serialize};

/// Every error: `{"error": {"code", "message"}}`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, utoipa::ToSchema)]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, utoipa::ToSchema)]
pub struct ErrorDetail {
    /// Stable, for programs: `invalid_request`, `not_found`, `unauthorized` …
    pub code: String,
    /// For people: names the field or the thing concerned.
    pub message: String,
}

/// The error code of a 404 that means the run (and so its task) does not
/// exist: a worker drops a report only on this code.
pub const RUN_NOT_FOUND: &str = "run_not_found";

/// The error code of a 409 that means the reporting worker does not hold
/// the task's lease (it expired and was taken over, or the task ended): the
/// result will never be applied, so the worker drops it.
pub const LEASE_LOST: &str = "lease_lost";
