//! The fixed texts a page shows after one of its forms, by the code in its
//! `?msg=`: a link can choose among them, never put its own words on a page.

/// Each code and its text.
const NOTICES: &[(&str, &str)] = &[
    ("retry-done", "retry: done"),
    ("retry-refused", "retry refused: the run's status does not allow it"),
    ("pause-done", "pause: done"),
    ("pause-refused", "pause refused: the run's status does not allow it"),
    ("resume-done", "resume: done"),
    ("resume-refused", "resume refused: the run's status does not allow it"),
    ("cancel-done", "cancel: done"),
    ("cancel-refused", "cancel refused: the run's status does not allow it"),
    ("resolve-done", "resolve: done"),
    ("resolve-refused", "resolve refused: the step is not IN_DOUBT"),
    ("resolve-invalid", "resolve refused: a completed step needs its output as JSON, a failed one an error"),
    ("rerun-done", "rerun: done, the run goes on from those steps"),
    (
        "rerun-refused",
        "rerun refused: the run's status does not allow it (a SUCCEEDED run needs \"also if it succeeded\")",
    ),
    ("rerun-invalid", "rerun refused: name 1 to 100 steps the run has reached, and any new input as a JSON value"),
    ("complete-done", "complete: done, the run goes on"),
    ("complete-refused", "complete refused: the step has ended already, or its run has"),
    ("complete-invalid", "complete refused: the output must be JSON"),
    ("reason-invalid", "refused: a reason is at most 1,024 characters"),
    ("priority-done", "priority: changed; its steps not started yet are served at it"),
    ("priority-refused", "priority refused: the run has ended"),
    ("priority-invalid", "priority refused: choose 1 (served first) to 5 (last)"),
    (
        "backfill-done",
        "backfill: queued; the timer loop starts the runs (fire times asked for before are not queued again)",
    ),
    ("limit-done", "limit: saved; waiting steps go as soon as it lets them"),
    ("limit-deleted", "limit: deleted; the key goes back to what its definitions say"),
    ("limit-invalid", "limit refused: a key of 1 to 256 bytes; rate as N/period (25/1s); burst and concurrency from 1"),
    ("namespace-created", "namespace: created; choose Show to see it"),
    ("namespace-deleted", "namespace: being deleted; its data is dropped within a minute"),
    ("namespace-invalid", "namespace refused: 1 to 63 lowercase letters, digits and '-', starting with a letter"),
    ("namespace-refused", "refused: no such namespace you may enter, one being deleted, or too many namespaces"),
    (
        "backfill-invalid",
        "backfill refused: give from and to (UTC) with from before to, to not in the future, at most 10,000 fire times",
    ),
];

/// The text of `code`, if it is one of ours.
pub fn text(code: &str) -> Option<&'static str> {
    NOTICES.iter().find(|(c, _)| *c == code).map(|(_, text)| *text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_button_has_its_notices_and_nothing_else_is_shown() {
        for action in ["retry", "pause", "resume", "cancel"] {
            assert!(text(&format!("{action}-done")).is_some() && text(&format!("{action}-refused")).is_some());
        }
        assert_eq!(text("Your account is locked: call +1 555"), None);
    }
}
