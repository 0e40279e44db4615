//! The error codes the engine gives; a worker may report codes of its own.

/// A worker's failure that named no code.
pub const TASK_FAILED: &str = "task_failed";
/// The target answered with a status the node does not accept (`status` says which).
pub const HTTP_STATUS: &str = "http_status";
/// The request could not be made or its answer read (connection, TLS, DNS).
pub const TRANSPORT: &str = "transport";
/// The request, or the attempt (the node's `timeout`), ran out of time.
pub const TIMEOUT: &str = "timeout";
/// The request was refused before it was sent (egress rules, a secret's hosts, a redirect).
pub const REFUSED: &str = "refused";
/// The node's evaluated config cannot be used (a bad header, URL or method).
pub const CONFIG: &str = "config";
/// An expression failed when the node started (its config, a MAP's items, an edge's `when`).
pub const EXPRESSION: &str = "expression";
/// A value was too large, too deep or unstorable (`COMPOSER_MAX_PAYLOAD`).
pub const PAYLOAD: &str = "payload";
/// A SUB_WORKFLOW's or LOOP's child run failed or was cancelled.
pub const CHILD_FAILED: &str = "child_failed";
/// A SUB_WORKFLOW's or LOOP's child run could not start: its workflow is
/// not registered, its input was refused, its run tree's budget is spent.
pub const CHILD_NOT_STARTED: &str = "child_not_started";
/// An APPROVAL was rejected (by whom, and why, in its message).
pub const APPROVAL_REJECTED: &str = "approval_rejected";
/// An APPROVAL had no decision by its deadline (its escalation's, if it escalated).
pub const APPROVAL_TIMEOUT: &str = "approval_timeout";
/// A WAIT_FOR_EVENT timed out.
pub const EVENT_TIMEOUT: &str = "event_timeout";
/// A MAP's item failed (or more than it tolerates).
pub const ITEM_FAILED: &str = "item_failed";
/// The attempt was dispatched more often than `COMPOSER_MAX_DISPATCHES`.
pub const MAX_DISPATCHES: &str = "max_dispatches";
/// No worker has a handler for the node's type on its queue.
pub const NO_HANDLER: &str = "no_handler";
/// A LOOP ran `max_iterations` without its `until` holding.
pub const MAX_ITERATIONS: &str = "max_iterations";
/// An operator resolved an in-doubt attempt as failed.
pub const RESOLVED: &str = "resolved";
/// An at-most-once attempt whose outcome is unknown; also what a custom
/// handler reports when it cannot tell whether its effect happened.
pub const IN_DOUBT: &str = "in_doubt";
/// The request could not connect: it was not sent.
pub const CONNECT: &str = "connect";
/// A coordinator refused a worker's report of the attempt as it stood
/// (an output too large to send, a field it does not take): the attempt
/// failed with the coordinator's reason instead of running again.
pub const REPORT_REFUSED: &str = "report_refused";

/// The code of a failure to evaluate a value: [`PAYLOAD`] when the value
/// was evaluated but cannot be kept (what `storable::check` and
/// `storable::check_text` refuse), else [`EXPRESSION`].
pub fn of_evaluation(error: &str) -> &'static str {
    let refused = ["(COMPOSER_MAX_PAYLOAD)", "which cannot be stored", "is nested deeper than the limit"];
    if refused.iter().any(|r| error.contains(r)) {
        PAYLOAD
    } else {
        EXPRESSION
    }
}
