//! APPROVAL steps in a simulation: a step's mock is the vote (or the
//! votes, in order) people cast; past them, or without one, the next
//! assignee approves until the quorum is met. A vote the step refuses (a
//! stranger, data the form refuses) is noted, and the step's deadline
//! passes instead; `--fail` lets the deadline pass at once.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use serde_json::Value;
use uuid::Uuid;

use crate::definition::approval::{names, Answer, Vote};
use crate::machine::{Event, Task};

/// The votes cast so far on each approval's attempt, and those refused.
#[derive(Default)]
pub(super) struct Votes {
    cast: HashMap<(Uuid, i32), Vec<Vote>>,
    /// Steps whose simulated vote was refused: their deadline passes.
    pub(super) refused: HashMap<Uuid, String>,
}

impl Votes {
    /// The next vote on the waiting approval `task`, from its mock.
    pub(super) fn next(&self, task: &Task, mock: Option<&Value>, now: DateTime<Utc>) -> Event {
        let earlier = self.cast.get(&(task.id, task.attempt)).cloned().unwrap_or_default();
        let scripted = match mock {
            Some(Value::Array(list)) => list.get(earlier.len()).cloned(),
            Some(one @ Value::Object(_)) if earlier.is_empty() => Some(one.clone()),
            _ => None,
        };
        let scripted = scripted.unwrap_or(Value::Null);
        let answer = match scripted["answer"].as_str() {
            Some("reject") => Answer::Reject,
            _ => Answer::Approve,
        };
        let (person, groups) = match scripted["person"].as_str() {
            Some(p) => (p.to_string(), names(&scripted["groups"])),
            None => next_assignee(&task.input, &earlier),
        };
        let vote = Vote {
            person,
            answer,
            data: scripted.get("data").cloned().unwrap_or_else(|| serde_json::json!({})),
            comment: scripted["comment"].as_str().map(String::from),
            via: None,
            at: now,
        };
        Event::ApprovalVote { task_id: task.id, attempt: task.attempt, vote: Box::new(vote), groups, earlier }
    }

    /// Notes what a vote did: cast, or refused (and why).
    pub(super) fn applied(&mut self, event: &Event, ignored: Option<&str>) {
        let Event::ApprovalVote { task_id, attempt, vote, .. } = event else { return };
        match ignored {
            None => self.cast.entry((*task_id, *attempt)).or_default().push((**vote).clone()),
            Some(why) => {
                self.refused.insert(*task_id, why.to_string());
            }
        }
    }
}

/// The first person named who has not voted, or a member of the first
/// group named.
fn next_assignee(request: &Value, earlier: &[Vote]) -> (String, Vec<String>) {
    let voted = |p: &str| earlier.iter().any(|v| v.person == p);
    let people = names(&request["assignees"]["people"]);
    if let Some(p) = people.into_iter().find(|p| !voted(p)) {
        return (p, Vec::new());
    }
    let group = names(&request["assignees"]["groups"]).into_iter().next().unwrap_or_default();
    let n = (1..).find(|n| !voted(&format!("{group}-member-{n}"))).unwrap_or(1);
    (format!("{group}-member-{n}"), vec![group])
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use serde_json::{json, Value};

    use crate::definition::Workflow;
    use crate::machine::RunStatus;
    use crate::simulate::{simulate, Options, Report};

    fn run(config: Value, mock: Option<Value>, fail: bool) -> Report {
        let wf = Workflow::parse(&json!({"name": "a", "nodes": [
            {"id": "ok", "type": "APPROVAL", "config": config},
            {"id": "then", "type": "TRANSFORM", "config": {"output": "${ .nodes.ok.output.decided_by }"}}],
            "edges": [{"from": "ok", "to": "then"}], "output": {"by": "${ .nodes.then.output }"}}))
        .unwrap();
        let mut opts = Options { input: json!({"boss": "cy"}), ..Default::default() };
        if let Some(m) = mock {
            opts.mocks = HashMap::from([("ok".to_string(), m)]);
        }
        if fail {
            opts.failures = HashMap::from([("ok".to_string(), "nobody".to_string())]);
        }
        simulate(&crate::expr::Sandbox::for_tests(), &wf, &opts)
    }

    fn two_of(people: Value) -> Value {
        json!({"prompt": "ok?", "assignees": {"people": people}, "quorum": 2, "timeout": "1h",
               "form": {"type": "object", "properties": {"n": {"type": "integer"}}}})
    }

    #[test]
    fn without_a_mock_the_assignees_approve_until_the_quorum_is_met() {
        let r = run(two_of(json!(["ana", "${ .input.boss }"])), None, false);
        assert_eq!(r.status, RunStatus::Succeeded, "{r:?}");
        assert_eq!(r.output, Some(json!({"by": "cy"})));
        assert_eq!(r.nodes[0].input.as_ref().unwrap()["assignees"]["people"], json!(["ana", "cy"]));
    }

    #[test]
    fn mocked_votes_are_cast_in_order_and_one_rejection_rejects() {
        let votes = json!([{"person": "ana", "answer": "approve", "data": {"n": 1}},
                           {"person": "cy", "answer": "reject", "comment": "no"}]);
        let r = run(two_of(json!(["ana", "cy"])), Some(votes), false);
        assert_eq!(r.status, RunStatus::Failed);
        assert_eq!(r.nodes[0].error.as_deref(), Some("rejected by cy: no"));
    }

    #[test]
    fn a_refused_vote_is_noted_and_the_deadline_passes_or_escalates() {
        let stranger = json!({"person": "eve", "answer": "approve"});
        let r = run(two_of(json!(["ana", "cy"])), Some(stranger), false);
        assert_eq!(r.status, RunStatus::Failed);
        assert!(r.notes.iter().any(|n| n.contains("eve is not among")), "{:?}", r.notes);
        let bad_data = json!({"answer": "approve", "data": {"n": "one"}});
        let r = run(two_of(json!(["ana", "cy"])), Some(bad_data), false);
        assert!(r.notes.iter().any(|n| n.contains("does not match the form")), "{:?}", r.notes);

        let escalating = json!({"prompt": "ok?", "assignees": {"people": ["ana"]}, "timeout": "3h",
            "escalate": {"people": ["cy"], "after": "1h"}});
        let r = run(escalating.clone(), None, true);
        assert_eq!(r.status, RunStatus::Failed);
        assert!(r.nodes[0].error.as_deref().unwrap().contains("(escalated)"), "{:?}", r.nodes[0].error);
        assert_eq!(r.nodes[0].input.as_ref().unwrap()["assignees"]["people"], json!(["ana", "cy"]));
        // No deadline and no one to decide: it waits.
        let forever = json!({"prompt": "ok?", "assignees": {"people": ["ana"]}});
        let r = run(forever, Some(json!({"person": "eve"})), false);
        assert_eq!(r.status, RunStatus::Running);
    }
}
