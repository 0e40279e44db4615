//! APPROVAL: a person's vote, its escalation, and its deadline. The request the step's attempt keeps as its input is what a
//! vote is judged by ([`crate::definition::approval`]).

use serde_json::json;
use uuid::Uuid;

use crate::definition::approval::{self, Tally, Vote};
use crate::definition::NodeKind;
use crate::machine::codes;
use crate::machine::history::HistoryKind;
use crate::machine::lifecycle::TaskState;
use crate::machine::state::Machine;
use crate::machine::task::Failure;
use crate::machine::transition::{Ignore, IgnoreKind};

impl Machine<'_> {
    /// `vote` on the approval `task_id` at `attempt`, cast by a person in
    /// `groups` after the `earlier` votes storage holds: recorded in the
    /// history, and the step completes (approved) or fails (rejected) when
    /// it decides. A vote that may not be cast is refused, saying why.
    pub(super) fn on_approval_vote(
        &mut self,
        task_id: Uuid,
        attempt: i32,
        vote: Vote,
        groups: &[String],
        earlier: &[Vote],
    ) -> Result<(), Ignore> {
        self.require_active()?;
        let t = self.find(task_id)?;
        let task = &self.run.tasks[t];
        let NodeKind::Approval(config) = &self.wf.nodes[task.node].kind else {
            return Err(Ignore(IgnoreKind::NotWaiting, "the step is not an APPROVAL".into()));
        };
        if task.state != TaskState::Waiting {
            return Err(Ignore(IgnoreKind::NotWaiting, format!("the approval is {}, not waiting", task.state)));
        }
        if task.attempt != attempt {
            return Err(Ignore(
                IgnoreKind::StaleAttempt,
                format!("attempt {attempt} is not the step's {}", task.attempt),
            ));
        }
        let tally =
            config.tally(&task.input, earlier, &vote, groups).map_err(|why| Ignore(IgnoreKind::Refused, why))?;
        if let Tally::Approved(output) = &tally {
            let max = self.run.max_payload;
            crate::storable::check(output, "the approval's output", max)
                .map_err(|why| Ignore(IgnoreKind::Refused, why))?;
        }
        let mut noted = json!({"person": vote.person, "answer": vote.answer});
        if let Some(via) = &vote.via {
            noted["via"] = json!(via);
        }
        let payload = self.task_payload(t, json!({"vote": noted}));
        self.tr.log(HistoryKind::ApprovalVoted, payload);
        match tally {
            Tally::Open => self.tr.touch(t),
            Tally::Approved(output) => {
                self.finish(t, TaskState::Completed, Some(output), None);
                self.route();
            }
            Tally::Rejected(why) => {
                self.finish(t, TaskState::Failed, None, Some(Failure::fatal(codes::APPROVAL_REJECTED, why)));
                self.route();
            }
        }
        Ok(())
    }

    /// An approval's timer: its escalation (more people may decide, and
    /// it waits for its deadline), or its deadline (it fails).
    pub(super) fn approval_timed_out(&mut self, t: usize) -> Result<(), Ignore> {
        let task = &self.run.tasks[t];
        // A second firing of a timer another coordinator fired first.
        if approval::next_wake(&task.input).is_none_or(|w| w > self.now) {
            return Err(Ignore(IgnoreKind::NotDue, "the approval's next time has not come".into()));
        }
        if let Some(request) = approval::escalated(&task.input, self.now) {
            let task = &mut self.run.tasks[t];
            task.wake_at = approval::next_wake(&request);
            let payload = json!({"assignees": request["assignees"], "due_at": request["due_at"]});
            task.input = request;
            self.tr.touch(t);
            let payload = self.task_payload(t, payload);
            self.tr.log(HistoryKind::ApprovalEscalated, payload);
            return Ok(());
        }
        let escalated = if task.input["escalated"] == true { " (escalated)" } else { "" };
        let error = format!("no decision by {}{escalated}", task.input["due_at"].as_str().unwrap_or("its deadline"));
        self.finish(t, TaskState::Failed, None, Some(Failure::fatal(codes::APPROVAL_TIMEOUT, error)));
        self.route();
        Ok(())
    }
}
