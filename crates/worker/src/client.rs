//! The worker's side of the task API: poll, heartbeat, logs, complete and
//! fail, each sent to one of the coordinators in turn, failing over
//! between them.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use composer_api::wire::{StageTimes, PRIORITY_HEADER};
use composer_api::{
    CompleteTask, ErrorBody, ErrorDetail, FailTask, LeasedTask, PollTasks, ReportAck, TakeNext, TaskBatch,
    TaskHeartbeat,
};
use std::sync::Arc;

use composer_api::in_process::{InProcessApi, Refusal};
use serde::Serialize;
use uuid::Uuid;

/// How long one call with log lines may take: they are sent from the
/// lease's heartbeat loop.
const LOG_TIMEOUT: Duration = Duration::from_secs(2);
/// How long one heartbeat may take: a third of the lease is left for the
/// next one.
const HEARTBEAT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a poll's answer may come after its `wait`.
const POLL_SLACK: Duration = Duration::from_secs(10);
/// How long any other call may take (a result's, each time it is sent).
const CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// What became of a result.
#[derive(Debug, PartialEq)]
pub enum Delivery {
    /// A coordinator answered (the result was applied or ignored), with the
    /// tasks it leased to this worker as the result's `next` asked.
    Delivered(Vec<LeasedTask>),
    /// This worker no longer holds the task's lease (or the run is gone):
    /// nothing will ever take the result.
    Gone,
    /// No coordinator took it before the deadline: the lease expires and
    /// the attempt goes to the next poller.
    Failed,
}

/// What a heartbeat found.
#[derive(Debug, PartialEq)]
pub enum Heartbeat {
    /// The lease was extended.
    Extended,
    /// The lease is lost: stop, and drop the result.
    Lost,
    /// No coordinator answered; try again.
    Unknown,
}

/// An attempt's result, as sent.
#[derive(Debug, Clone)]
pub enum Outcome {
    Completed(serde_json::Value),
    Failed(Box<FailTask>),
}

/// The coordinators a worker talks to: over HTTP, or the one in its own
/// process when it has one (then only that one).
pub struct Coordinators {
    local: Option<Arc<dyn InProcessApi>>,
    client: reqwest::Client,
    urls: Vec<String>,
    token: Option<String>,
    /// The namespace whose tasks it works (the `composer-namespace` header).
    namespace: Option<String>,
    next: AtomicUsize,
    /// Keyed at random: turns the call counter into a random start.
    spread: std::collections::hash_map::RandomState,
}

impl Coordinators {
    pub fn new(urls: Vec<String>, token: Option<String>) -> Coordinators {
        let client = reqwest::Client::builder()
            .timeout(CALL_TIMEOUT)
            .connect_timeout(Duration::from_secs(2))
            .build()
            .expect("building the coordinators' client");
        let urls = urls.into_iter().map(|u| u.trim_end_matches('/').to_string()).collect();
        Coordinators {
            local: None,
            client,
            urls,
            token,
            namespace: None,
            next: AtomicUsize::new(0),
            spread: Default::default(),
        }
    }

    /// Works the tasks of namespace `namespace` (none: `default`).
    pub fn in_namespace(mut self, namespace: Option<String>) -> Coordinators {
        self.namespace = namespace;
        self
    }

    /// Talks to the coordinator in this process instead, through `api`.
    pub fn in_process(mut self, api: Arc<dyn InProcessApi>) -> Coordinators {
        self.local = Some(api);
        self
    }

    /// The coordinators in turn from one picked at random (so calls spread
    /// over them, and no pattern of calls keeps a call's first try on the
    /// same one), round and round: one call tries them in this order,
    /// whatever other calls do meanwhile.
    fn turns(&self) -> impl Iterator<Item = &str> {
        use std::hash::BuildHasher;
        let start = self.spread.hash_one(self.next.fetch_add(1, Ordering::Relaxed)) as usize;
        let n = self.urls.len();
        (0..).map(move |k| self.urls.get((start + k) % n.max(1)).map_or("", String::as_str))
    }

    fn post(&self, base: &str, path: &str, body: &impl Serialize) -> reqwest::RequestBuilder {
        let mut req = self.client.post(format!("{base}{path}")).json(body);
        if let Some(n) = &self.namespace {
            req = req.header("composer-namespace", n);
        }
        match &self.token {
            Some(t) => req.bearer_auth(t),
            None => req,
        }
    }

    /// Leases up to `max` tasks of `queues`, waiting up to `wait` for one,
    /// at the next coordinator that answers (each is tried once); the error
    /// names the last one tried and what went wrong.
    pub async fn poll(&self, poll: &PollTasks, wait: Duration) -> Result<TaskBatch, String> {
        if let Some(api) = &self.local {
            return match tokio::time::timeout(wait + POLL_SLACK, api.poll(poll.clone())).await {
                Ok(answer) => answer.map_err(|r| r.to_string()),
                Err(_) => {
                    Err(format!("the coordinator in this process did not answer a poll within {:?}", wait + POLL_SLACK))
                }
            };
        }
        let mut error = String::from("no coordinator");
        for base in self.turns().take(self.urls.len()) {
            let req = self.post(base, "/v1/tasks/poll", poll).timeout(wait + POLL_SLACK);
            error = match req.send().await {
                Ok(resp) if resp.status().is_success() => match resp.json::<TaskBatch>().await {
                    Ok(batch) => return Ok(batch),
                    // Tasks it leased and this worker cannot read are lost to
                    // it until their leases expire, as when an answer is lost.
                    Err(e) => format!("{base}: an answer that does not read: {e}"),
                },
                Ok(resp) => {
                    let status = resp.status();
                    let body = resp.text().await.unwrap_or_default();
                    format!("{base}: HTTP {status}: {}", composer_core::clipped(&body, 512))
                }
                Err(e) => format!("{base}: {e}"),
            };
        }
        Err(error)
    }

    /// Extends a task's lease, trying each coordinator once until one
    /// answers: a coordinator that died must not cost a lease.
    pub async fn heartbeat(&self, task: &LeasedTask, worker_id: &str) -> Heartbeat {
        let body = TaskHeartbeat { worker_id: worker_id.to_string(), run_id: task.run_id, attempt: task.attempt };
        if let Some(api) = &self.local {
            return match tokio::time::timeout(HEARTBEAT_TIMEOUT, api.heartbeat(task.id, body)).await {
                Ok(Ok(())) => Heartbeat::Extended,
                Ok(Err(r)) if r.lease_lost() => Heartbeat::Lost,
                Ok(Err(r)) => {
                    tracing::warn!(task_id = %task.id, refusal = %r, "heartbeat refused");
                    Heartbeat::Unknown
                }
                Err(_) => {
                    tracing::warn!(task_id = %task.id, "heartbeat not answered in time by the coordinator in this process");
                    Heartbeat::Unknown
                }
            };
        }
        let path = format!("/v1/tasks/{}/heartbeat", task.id);
        for base in self.turns().take(self.urls.len()) {
            match self.post(base, &path, &body).timeout(HEARTBEAT_TIMEOUT).send().await {
                Ok(resp) if resp.status().is_success() => return Heartbeat::Extended,
                Ok(resp) => {
                    let status = resp.status();
                    if lease_lost(status, &resp.text().await.unwrap_or_default()) {
                        return Heartbeat::Lost;
                    }
                    tracing::warn!(task_id = %task.id, coordinator = %base, %status, "heartbeat refused");
                }
                Err(e) => tracing::warn!(task_id = %task.id, coordinator = %base, error = %e, "heartbeat failed"),
            }
        }
        Heartbeat::Unknown
    }

    /// Sends a task's log lines, at most [`composer_api::MAX_LOG_LINES`] to a call, trying each
    /// coordinator once: logs are worth a try, not a wait. False when the
    /// lease is lost or no coordinator took them.
    pub async fn send_logs(
        &self,
        task_id: Uuid,
        run_id: Uuid,
        worker_id: &str,
        attempt: i32,
        lines: Vec<String>,
    ) -> bool {
        for chunk in lines.chunks(composer_api::MAX_LOG_LINES) {
            let body =
                composer_api::TaskLogs { worker_id: worker_id.to_string(), run_id, attempt, lines: chunk.to_vec() };
            if let Some(api) = &self.local {
                match tokio::time::timeout(LOG_TIMEOUT, api.logs(task_id, body)).await {
                    Ok(Ok(())) => continue,
                    Ok(Err(r)) if r.lease_lost() => return false,
                    Ok(Err(r)) => {
                        tracing::warn!(%task_id, refusal = %r, lines = chunk.len(), "the task's log lines were refused; dropped");
                        return false;
                    }
                    Err(_) => {
                        tracing::warn!(%task_id, lines = chunk.len(), "the coordinator in this process did not take the task's log lines in time; dropped");
                        return false;
                    }
                }
            }
            let mut sent = false;
            for base in self.turns().take(self.urls.len()) {
                let req = self.post(base, &format!("/v1/tasks/{task_id}/logs"), &body).timeout(LOG_TIMEOUT);
                match req.send().await {
                    Ok(resp) if resp.status().is_success() => {
                        sent = true;
                        break;
                    }
                    Ok(resp) if resp.status() == reqwest::StatusCode::CONFLICT => return false,
                    Ok(resp) => tracing::debug!(%task_id, status = %resp.status(), "log lines refused"),
                    Err(e) => tracing::debug!(%task_id, error = %e, "log lines not sent"),
                }
            }
            if !sent {
                tracing::warn!(%task_id, lines = chunk.len(), "no coordinator took the task's log lines; dropped");
                return false;
            }
        }
        true
    }

    /// Sends an attempt's result, rotating through coordinators with
    /// backoff until one answers or `deadline` passes. A result a
    /// coordinator refuses for what it says (a 4xx of its own: an output
    /// too large to send, a field it does not take) would be refused again:
    /// it becomes the attempt's failure, naming the refusal, sent once in
    /// its place; running the task again would only make the same result.
    /// With `next`, the answer may carry tasks leased to this worker (eager
    /// dispatch). The result names its run's `priority`, at which it waits
    /// for the coordinator's batch.
    pub async fn finish(
        &self,
        task: &LeasedTask,
        worker_id: &str,
        outcome: Outcome,
        deadline: Duration,
        next: Option<&TakeNext>,
        stages: Option<StageTimes>,
    ) -> Delivery {
        let give_up = tokio::time::Instant::now() + deadline;
        let mut backoff = Duration::from_millis(50);
        let mut outcome = outcome;
        let mut replaced = false;
        let mut turns = self.turns();
        loop {
            // What a refused result said of its stages may be what was refused.
            let stages = stages.filter(|_| !replaced);
            let answer = match &self.local {
                // Each try within the time an HTTP call has, and never past
                // the deadline: a coordinator that never answers (stopped
                // past its grace, aborted) must not hold the lease forever.
                Some(api) => {
                    let until = give_up.min(tokio::time::Instant::now() + CALL_TIMEOUT);
                    let answer = local_answer(api.as_ref(), task, worker_id, &outcome, next, stages, replaced);
                    tokio::time::timeout_at(until, answer).await.unwrap_or_else(|_| {
                        tracing::warn!(task_id = %task.id, "the coordinator in this process did not answer the result in time; trying again");
                        AfterAnswer::TryAgain
                    })
                }
                None => {
                    let base = turns.next().unwrap_or_default();
                    let req = self.result_request(base, task, worker_id, &outcome, next, stages);
                    answer_to_result(req.send().await, task, worker_id, base, replaced).await
                }
            };
            match answer {
                AfterAnswer::Done(delivery) => return delivery,
                AfterAnswer::Replace(failure) => {
                    outcome = Outcome::Failed(failure);
                    replaced = true;
                    continue;
                }
                AfterAnswer::TryAgain => {}
            }
            if tokio::time::Instant::now() + backoff > give_up {
                return Delivery::Failed;
            }
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(Duration::from_secs(2));
        }
    }

    /// The request that sends `outcome` to the coordinator at `base`, at
    /// the run's priority.
    fn result_request(
        &self,
        base: &str,
        task: &LeasedTask,
        worker_id: &str,
        outcome: &Outcome,
        next: Option<&TakeNext>,
        stages: Option<StageTimes>,
    ) -> reqwest::RequestBuilder {
        let req = match report(task, worker_id, outcome, next, stages) {
            Report::Complete(body) => self.post(base, &format!("/v1/tasks/{}/complete", task.id), &body),
            Report::Fail(body) => self.post(base, &format!("/v1/tasks/{}/fail", task.id), &body),
        };
        req.header(PRIORITY_HEADER, task.priority.to_string())
    }
}

/// A result as the task API takes it.
enum Report {
    Complete(CompleteTask),
    Fail(FailTask),
}

/// The report of `outcome`, asking for `next`, with the attempt's `stages`.
fn report(
    task: &LeasedTask,
    worker_id: &str,
    outcome: &Outcome,
    next: Option<&TakeNext>,
    stages: Option<StageTimes>,
) -> Report {
    match outcome {
        Outcome::Completed(output) => Report::Complete(CompleteTask {
            worker_id: worker_id.to_string(),
            run_id: task.run_id,
            attempt: task.attempt,
            output: output.clone(),
            next: next.cloned(),
            stages,
        }),
        Outcome::Failed(fail) => Report::Fail(FailTask { next: next.cloned(), stages, ..(**fail).clone() }),
    }
}

/// What [`Coordinators::finish`] does after a coordinator's answer to a result.
enum AfterAnswer {
    /// Stop: the delivery ended so.
    Done(Delivery),
    /// The result itself was refused: send this failure in its place.
    Replace(Box<FailTask>),
    /// Try the next coordinator, after the backoff.
    TryAgain,
}

/// Reads the answer of the coordinator at `base` to a result (`replaced`:
/// the result is the failure that replaced a refused one).
async fn answer_to_result(
    sent: reqwest::Result<reqwest::Response>,
    task: &LeasedTask,
    worker_id: &str,
    base: &str,
    replaced: bool,
) -> AfterAnswer {
    let resp = match sent {
        Ok(resp) => resp,
        Err(e) => {
            tracing::warn!(task_id = %task.id, coordinator = %base, error = %e, "result not sent; trying again");
            return AfterAnswer::TryAgain;
        }
    };
    if resp.status().is_success() {
        // An answer that does not read leased nothing this worker
        // can run: a task it names is lost to it until its lease
        // expires, as when the answer is lost.
        let Ok(ack) = resp.json::<ReportAck>().await else {
            return AfterAnswer::Done(Delivery::Delivered(Vec::new()));
        };
        if let Some(reason) = ack.ignored {
            tracing::debug!(task_id = %task.id, %reason, "result ignored by the coordinator");
        }
        return AfterAnswer::Done(Delivery::Delivered(ack.next));
    }
    let status = resp.status();
    let body = resp.text().await.unwrap_or_default();
    let error = serde_json::from_str::<ErrorBody>(&body).ok().map(|b| b.error);
    refused(status.as_u16(), error.as_ref(), task, worker_id, replaced).unwrap_or_else(|| {
        tracing::warn!(task_id = %task.id, coordinator = %base, %status, %body, "result refused; trying again");
        AfterAnswer::TryAgain
    })
}

/// The answer of the coordinator in this process to a result.
async fn local_answer(
    api: &dyn InProcessApi,
    task: &LeasedTask,
    worker_id: &str,
    outcome: &Outcome,
    next: Option<&TakeNext>,
    stages: Option<StageTimes>,
    replaced: bool,
) -> AfterAnswer {
    let answer = match report(task, worker_id, outcome, next, stages) {
        Report::Complete(body) => api.complete(task.id, task.priority, body).await,
        Report::Fail(body) => api.fail(task.id, task.priority, body).await,
    };
    match answer {
        Ok(ack) => {
            if let Some(reason) = ack.ignored {
                tracing::debug!(task_id = %task.id, %reason, "result ignored by the coordinator");
            }
            AfterAnswer::Done(Delivery::Delivered(ack.next))
        }
        Err(Refusal { status, code, message }) => {
            let error = ErrorDetail { code, message };
            refused(status, Some(&error), task, worker_id, replaced).unwrap_or_else(|| {
                tracing::warn!(task_id = %task.id, status, code = %error.code, message = %error.message, "result refused; trying again");
                AfterAnswer::TryAgain
            })
        }
    }
}

/// What a refusal of a result (`status`, with the coordinator's own
/// `error` when it gave one) ends in: the lease is lost, or the result
/// itself is refused (it becomes the attempt's failure, once); `None`: try
/// again.
fn refused(
    status: u16,
    error: Option<&ErrorDetail>,
    task: &LeasedTask,
    worker_id: &str,
    replaced: bool,
) -> Option<AfterAnswer> {
    let error = error?;
    if status == 409 && error.code == composer_api::LEASE_LOST {
        tracing::warn!(task_id = %task.id, "result refused: this worker no longer holds the lease; dropping it");
        return Some(AfterAnswer::Done(Delivery::Gone));
    }
    if !refused_for_good(status) {
        return None;
    }
    if replaced {
        tracing::error!(task_id = %task.id, status, message = %error.message, "the attempt's failure was refused too; dropping it");
        return Some(AfterAnswer::Done(Delivery::Gone));
    }
    tracing::warn!(task_id = %task.id, status, message = %error.message, "result refused; failing the attempt with the reason");
    Some(AfterAnswer::Replace(Box::new(refusal(task, worker_id, status, &error.code, &error.message))))
}

/// Whether a coordinator said this worker no longer holds the lease: its
/// own `lease_lost` 409, not some proxy's.
fn lease_lost(status: reqwest::StatusCode, body: &str) -> bool {
    status == reqwest::StatusCode::CONFLICT
        && serde_json::from_str::<ErrorBody>(body).is_ok_and(|b| b.error.code == composer_api::LEASE_LOST)
}

/// A refusal of the result itself, which no retry of it gets past: a 400,
/// 413 or 422. Not a refusal of the worker (401, 403: a token an operator
/// may mend), nor a 404 (maybe a proxy's), nor a 408 or 429.
fn refused_for_good(status: u16) -> bool {
    matches!(status, 400 | 413 | 422)
}

/// The failure that replaces a refused result: for good, with the
/// coordinator's reason.
fn refusal(task: &LeasedTask, worker_id: &str, status: u16, code: &str, message: &str) -> FailTask {
    let message = composer_core::clipped(message, 1024);
    FailTask {
        worker_id: worker_id.to_string(),
        run_id: task.run_id,
        attempt: task.attempt,
        error: format!("the coordinator refused the attempt's result (HTTP {status} {code}): {message}")
            .replace('\0', "\u{FFFD}"),
        retryable: false,
        code: Some(composer_core::machine::codes::REPORT_REFUSED.into()),
        status: None,
        retry_after_ms: None,
        next: None,
        stages: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn leased() -> LeasedTask {
        LeasedTask {
            id: Uuid::now_v7(),
            run_id: Uuid::now_v7(),
            attempt: 2,
            node_id: "n".into(),
            node_type: "t".into(),
            queue: "q".into(),
            input: serde_json::json!({}),
            lease_ttl_ms: 30_000,
            traceparent: None,
            priority: 3,
            stages: None,
        }
    }

    /// A coordinator in this process that takes every call and never
    /// answers (one stopped past its grace, or aborted).
    struct Silent;

    impl InProcessApi for Silent {
        fn poll(&self, _: PollTasks) -> composer_api::in_process::Pending<'_, Result<TaskBatch, Refusal>> {
            Box::pin(std::future::pending())
        }
        fn heartbeat(&self, _: Uuid, _: TaskHeartbeat) -> composer_api::in_process::Pending<'_, Result<(), Refusal>> {
            Box::pin(std::future::pending())
        }
        fn logs(
            &self,
            _: Uuid,
            _: composer_api::TaskLogs,
        ) -> composer_api::in_process::Pending<'_, Result<(), Refusal>> {
            Box::pin(std::future::pending())
        }
        fn complete(
            &self,
            _: Uuid,
            _: u8,
            _: CompleteTask,
        ) -> composer_api::in_process::Pending<'_, Result<ReportAck, Refusal>> {
            Box::pin(std::future::pending())
        }
        fn fail(
            &self,
            _: Uuid,
            _: u8,
            _: FailTask,
        ) -> composer_api::in_process::Pending<'_, Result<ReportAck, Refusal>> {
            Box::pin(std::future::pending())
        }
    }

    #[tokio::test]
    async fn a_coordinator_in_this_process_that_never_answers_costs_what_an_http_one_would() {
        let c = Coordinators::new(vec!["http://unused".into()], None).in_process(Arc::new(Silent));
        let task = leased();
        let outcome = Outcome::Completed(serde_json::json!({}));
        // The heartbeat's bound is HEARTBEAT_TIMEOUT (5 s); the result's, its deadline.
        let within = HEARTBEAT_TIMEOUT + Duration::from_secs(3);
        let (delivery, beat) = tokio::time::timeout(
            within,
            futures_util::future::join(
                c.finish(&task, "w", outcome, Duration::from_millis(300), None, None),
                c.heartbeat(&task, "w"),
            ),
        )
        .await
        .expect("a call that is never answered ends, as an HTTP call's timeout ends it");
        assert_eq!(delivery, Delivery::Failed, "not taken before the deadline: the lease is left to expire");
        assert_eq!(beat, Heartbeat::Unknown, "no answer is not a lost lease");
        let lines = vec!["a line".to_string()];
        let sent = tokio::time::timeout(within, c.send_logs(task.id, task.run_id, "w", 2, lines)).await;
        assert_eq!(sent.ok(), Some(false), "log lines nobody takes are dropped");
    }

    #[test]
    fn a_refused_result_becomes_a_failure_for_good_that_says_why() {
        let task = leased();
        let failed = refusal(&task, "w", 413, "payload_too_large", "the request body is too large");
        assert_eq!((failed.run_id, failed.attempt, failed.worker_id.as_str()), (task.run_id, 2, "w"));
        assert!(!failed.retryable);
        assert_eq!(failed.code.as_deref(), Some("report_refused"));
        assert!(failed.error.contains("HTTP 413 payload_too_large"), "{}", failed.error);
        assert!(refused_for_good(413));
        assert!(refused_for_good(400));
        assert!(!refused_for_good(429));
        assert!(!refused_for_good(401), "a token can be mended");
        assert!(!refused_for_good(404), "maybe a proxy's");
        assert!(!refused_for_good(503));
    }

    #[test]
    fn each_call_tries_every_coordinator_in_turn_from_a_start_of_its_own() {
        let c = Coordinators::new(vec!["http://a/".into(), "http://b".into(), "http://c".into()], None);
        let mut starts = std::collections::HashSet::new();
        for _ in 0..200 {
            let tried: Vec<&str> = c.turns().take(6).collect();
            let mut once: Vec<&str> = tried[..3].to_vec();
            once.sort();
            assert_eq!(once, ["http://a", "http://b", "http://c"], "{tried:?}");
            assert_eq!(tried[..3], tried[3..], "round and round");
            starts.insert(tried[0]);
        }
        assert_eq!(starts.len(), 3, "calls spread over the coordinators");
    }

    #[test]
    fn only_the_coordinators_own_409_means_the_lease_is_lost() {
        let body = r#"{"error": {"code": "lease_lost", "message": "gone"}}"#;
        assert!(lease_lost(reqwest::StatusCode::CONFLICT, body));
        assert!(!lease_lost(reqwest::StatusCode::CONFLICT, "<html>conflict</html>"), "a proxy's");
        assert!(!lease_lost(reqwest::StatusCode::BAD_REQUEST, body));
    }
}
