use chrono::{TimeZone, Utc};
use serde_json::{json, Value};

use super::*;
use crate::definition::{NodeKind, Workflow};

fn config(c: Value) -> Result<ApprovalConfig, String> {
    let wf = json!({"name": "a", "nodes": [{"id": "ok", "type": "APPROVAL", "config": c}]});
    match Workflow::parse(&wf) {
        Ok(wf) => match &wf.nodes[0].kind {
            NodeKind::Approval(a) => Ok(a.clone()),
            other => panic!("{other:?}"),
        },
        Err(e) => Err(e.to_string()),
    }
}

fn vote(person: &str, answer: Answer, data: Value) -> Vote {
    Vote { person: person.into(), answer, data, comment: None, via: None, at: Utc.timestamp_opt(0, 0).unwrap() }
}

fn now() -> DateTime<Utc> {
    Utc.timestamp_opt(1_000_000, 0).unwrap()
}

#[test]
fn a_config_names_what_is_wrong_with_it() {
    let base = json!({"prompt": "ok?", "assignees": {"people": ["ana"]}});
    assert!(config(base.clone()).is_ok());
    for (change, says) in [
        (json!({"prompt": null}), "prompt"),
        (json!({"assignees": null}), "assignees"),
        (json!({"quorum": 0}), "quorum"),
        (json!({"quorum": "most"}), "quorum"),
        (json!({"quorum": 101}), "quorum"),
        (json!({"quorum": "all", "assignees": {"groups": ["ops"]}}), "a group's members are not known"),
        (json!({"form": {"type": "nothing"}}), "form"),
        (json!({"timeout": "0s"}), "timeout"),
        (json!({"escalate": "soon"}), "escalate"),
        (json!({"escalate": {"people": ["bo"]}}), "escalate.after"),
        (json!({"escalate": {"after": "1h", "timeout": "2h"}}), "escalate.timeout"),
        (json!({"escalate": {"after": "1h"}, "timeout": "1h"}), "before the timeout"),
        (json!({"quorum": "all", "escalate": {"after": "1h", "groups": ["ops"]}}), "escalate.groups"),
        (json!({"notify": {"workflow": "x", "input": {}}}), "notify.input"),
        (json!({"notify": {"workflow": "../x"}}), "notify.workflow"),
        (json!({"colour": 1}), "colour"),
        (json!({"assignees": {}}), "names no person"),
        (json!({"assignees": {"people": [""]}}), "not a name"),
        (json!({"assignees": {"poeple": ["a"]}}), "poeple"),
        (json!({"quorum": 3, "assignees": {"people": ["a", "b"]}}), "only 2 people"),
        (json!({"prompt": "${ .secrets.token }"}), "cannot read secrets"),
        (json!({"escalate": {"after": "1h", "people": [1]}}), "not a name"),
    ] {
        let mut c = base.clone();
        for (k, v) in change.as_object().unwrap() {
            if v.is_null() {
                c.as_object_mut().unwrap().remove(k);
            } else {
                c[k] = v.clone();
            }
        }
        let err = config(c.clone()).expect_err(&c.to_string());
        assert!(err.contains(says), "{c}: {err}");
    }
}

#[test]
fn a_request_is_the_evaluated_config_checked() {
    let a = config(json!({"prompt": "p", "assignees": "${ .input.who }", "quorum": 2, "timeout": "1h"})).unwrap();
    let r = a.request(&json!({"prompt": "Refund 5?", "assignees": {"people": ["ana", "bo", "ana"]}}), now()).unwrap();
    assert_eq!(r["assignees"], json!({"people": ["ana", "bo"], "groups": []}), "each name once");
    assert_eq!(r["needed"], 2);
    assert_eq!(r["due_at"], json!(now() + chrono::Duration::hours(1)));
    let err = |evaluated: Value| a.request(&evaluated, now()).unwrap_err();
    assert!(err(json!({"prompt": "p", "assignees": {"people": ["ana"]}})).contains("only 1 people"));
    assert!(err(json!({"prompt": "p", "assignees": {}})).contains("names no person"));
    assert!(err(json!({"prompt": "p", "assignees": {"people": [3]}})).contains("not a name"));
    assert!(err(json!({"prompt": "p", "assignees": {"people": [""]}})).contains("not a name"));
    assert!(err(json!({"prompt": "p", "assignees": "ana"})).contains("config.assignees"));
    assert!(err(json!({"prompt": {}, "assignees": {"people": ["a", "b"]}})).contains("config.prompt"));
    let long = "x".repeat(MAX_PROMPT_CHARS + 1);
    assert!(err(json!({"prompt": long, "assignees": {"people": ["a", "b"]}})).contains("config.prompt"));
    let many: Vec<String> = (0..=MAX_ASSIGNEES).map(|i| format!("p{i}")).collect();
    assert!(err(json!({"prompt": "p", "assignees": {"people": many}})).contains("at most"));
    // A group may hold any number of people.
    assert!(a.request(&json!({"prompt": "p", "assignees": {"groups": ["ops"]}}), now()).is_ok());
}

#[test]
fn one_rejection_rejects_and_the_quorums_last_approval_approves() {
    let form = json!({"type": "object", "properties": {"amount": {"type": "integer"}}, "required": ["amount"]});
    let a = config(json!({"prompt": "p", "assignees": "${ .input.who }", "quorum": 2, "form": form})).unwrap();
    let evaluated = json!({"prompt": "p", "assignees": {"people": ["ana", "bo"], "groups": ["ops"]}, "form": form});
    let r = a.request(&evaluated, now()).unwrap();
    let ana = vote("ana", Answer::Approve, json!({"amount": 5}));
    assert_eq!(a.tally(&r, &[], &ana, &[]), Ok(Tally::Open));
    assert!(a.tally(&r, std::slice::from_ref(&ana), &ana, &[]).unwrap_err().contains("already decided"));
    let bad = vote("bo", Answer::Approve, json!({"amount": "five"}));
    assert!(a.tally(&r, std::slice::from_ref(&ana), &bad, &[]).unwrap_err().contains("does not match the form"));
    let eve = vote("eve", Answer::Approve, json!({"amount": 1}));
    assert!(a.tally(&r, &[], &eve, &[]).unwrap_err().contains("not among"));
    assert!(a.tally(&r, &[], &eve, &["sales".into()]).is_err());
    match a.tally(&r, std::slice::from_ref(&ana), &eve, &["ops".into()]).unwrap() {
        Tally::Approved(out) => {
            assert_eq!(out["decision"], "approved");
            assert_eq!(out["decided_by"], "eve");
            assert_eq!(out["data"], json!({"amount": 1}));
            assert_eq!(out["votes"].as_array().unwrap().len(), 2);
        }
        other => panic!("{other:?}"),
    }
    let no = Vote { comment: Some("too much".into()), ..vote("bo", Answer::Reject, Value::Null) };
    assert_eq!(a.tally(&r, &[ana], &no, &[]), Ok(Tally::Rejected("rejected by bo: too much".into())));
    let big = vote("bo", Answer::Approve, json!({"amount": 1, "note": "n".repeat(MAX_VOTE_DATA)}));
    assert!(a.tally(&r, &[], &big, &[]).unwrap_err().contains("over the 65536 a vote may carry"));
    let long = Vote { comment: Some("c".repeat(MAX_COMMENT_CHARS + 1)), ..vote("bo", Answer::Reject, Value::Null) };
    assert!(a.tally(&r, &[], &long, &[]).unwrap_err().contains("comment"));
}

#[test]
fn all_counts_every_person_and_an_escalation_adds_people_once() {
    let a = config(json!({"prompt": "p", "assignees": "${ .input.who }", "quorum": "all", "timeout": "1h",
        "escalate": {"people": ["cy"], "after": "30m"}}))
    .unwrap();
    let evaluated = json!({"prompt": "p", "assignees": {"people": ["ana", "bo"]},
        "escalate": {"people": ["cy", "ana"], "after": "30m"}});
    let r = a.request(&evaluated, now()).unwrap();
    assert_eq!(r["needed"], 2);
    assert!(!may_decide(&r, "cy", &[]));
    let half = now() + chrono::Duration::minutes(30);
    assert_eq!(next_wake(&r), Some(half), "its escalation first");
    assert_eq!(escalated(&r, half - chrono::Duration::seconds(1)), None, "not before it is due");
    let up = escalated(&r, half).unwrap();
    assert_eq!(up["assignees"]["people"], json!(["ana", "bo", "cy"]));
    assert_eq!(next_wake(&up), Some(now() + chrono::Duration::hours(1)), "then its deadline");
    assert!(may_decide(&up, "cy", &[]));
    assert_eq!(escalated(&up, now() + chrono::Duration::days(1)), None, "once");
    // An escalation made by an expression is checked when the step starts.
    let late = json!({"prompt": "p", "assignees": {"people": ["ana", "bo"]}, "escalate": {"after": "2h"}});
    assert!(a.request(&late, now()).unwrap_err().contains("before the timeout"));
    let none = json!({"prompt": "p", "assignees": {"people": ["ana", "bo"]}, "escalate": {"people": ["x"]}});
    assert!(a.request(&none, now()).unwrap_err().contains("escalate.after"));
    let grouped = json!({"prompt": "p", "assignees": {"people": ["ana"], "groups": ["ops"]}});
    assert!(a.request(&grouped, now()).unwrap_err().contains("all"));
}
