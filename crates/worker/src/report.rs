//! Delivering a result to a coordinator, failing over between them.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use composer_api::wire::{Dispatch, EagerOffer, ReportReply, TaskReport, EAGER_HEADER, PRIORITY_HEADER};
use uuid::Uuid;

/// How long one call with log lines may take: they are sent from the
/// lease's renewal loop.
const LOG_TIMEOUT: Duration = Duration::from_secs(2);

/// What became of a report.
#[derive(Debug, PartialEq)]
pub enum Delivery {
    /// A coordinator answered (the result was applied or ignored): ack.
    /// It leased to this worker the tasks given, as the report offered.
    Delivered(Vec<Dispatch>),
    /// The run no longer exists, or this worker no longer holds the task's
    /// lease: nothing will ever take the result, ack.
    Gone,
    /// No coordinator took it before the deadline: leave the message pending.
    Failed,
}

pub struct Reporter {
    client: reqwest::Client,
    urls: Vec<String>,
    token: Option<String>,
    next: AtomicUsize,
}

impl Reporter {
    pub fn new(urls: Vec<String>, token: Option<String>) -> Reporter {
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(10))
            .connect_timeout(Duration::from_secs(2))
            .build()
            .expect("building the report client");
        let urls = urls.into_iter().map(|u| u.trim_end_matches('/').to_string()).collect();
        Reporter { client, urls, token, next: AtomicUsize::new(0) }
    }

    /// Sends a task's log lines, at most 100 to a call, trying each
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
        for chunk in lines.chunks(100) {
            let body =
                composer_api::TaskLogs { worker_id: worker_id.to_string(), run_id, attempt, lines: chunk.to_vec() };
            let mut sent = false;
            for _ in 0..self.urls.len() {
                let i = self.next.fetch_add(1, Ordering::Relaxed) % self.urls.len();
                let mut req = self
                    .client
                    .post(format!("{}/v1/tasks/{task_id}/logs", self.urls[i]))
                    .timeout(LOG_TIMEOUT)
                    .json(&body);
                if let Some(t) = &self.token {
                    req = req.bearer_auth(t);
                }
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

    /// Posts `report`, rotating through coordinators with backoff until one
    /// answers or `deadline` passes. A report a coordinator refuses for what
    /// it says (a 4xx of its own: an output too large to send, a field it
    /// does not take) would be refused again: it becomes the attempt's
    /// failure, naming the refusal, sent once in its place; running the
    /// task again would only make the same report. With an `offer`, the
    /// answer may carry tasks leased to this worker (eager dispatch). The
    /// report names its run's `priority`, at which it waits for the
    /// coordinator's batch.
    pub async fn send(
        &self,
        task_id: Uuid,
        report: &TaskReport,
        deadline: Duration,
        offer: Option<&EagerOffer>,
        priority: u8,
    ) -> Delivery {
        let give_up = tokio::time::Instant::now() + deadline;
        let mut backoff = Duration::from_millis(50);
        let mut replaced: Option<TaskReport> = None;
        loop {
            let report = replaced.as_ref().unwrap_or(report);
            let i = self.next.fetch_add(1, Ordering::Relaxed) % self.urls.len().max(1);
            let Some(base) = self.urls.get(i) else {
                return Delivery::Failed;
            };
            let mut req = self.client.post(format!("{base}/internal/v1/tasks/{task_id}/result")).json(report);
            if let Some(t) = &self.token {
                req = req.bearer_auth(t);
            }
            if let Some(offer) = offer {
                req = req.header(EAGER_HEADER, offer.header());
            }
            req = req.header(PRIORITY_HEADER, priority.to_string());
            match req.send().await {
                Ok(resp) if resp.status().is_success() => {
                    // An answer that does not parse leased nothing this
                    // worker can run: a task it names would be lost to it
                    // until its lease expires, as when the answer is lost.
                    let Ok(reply) = resp.json::<ReportReply>().await else {
                        return Delivery::Delivered(Vec::new());
                    };
                    if let Some(reason) = reply.ignored {
                        tracing::debug!(%task_id, %reason, "report ignored by the coordinator");
                    }
                    return Delivery::Delivered(reply.next);
                }
                Ok(resp) => {
                    let status = resp.status();
                    let body = resp.text().await.unwrap_or_default();
                    // Only the coordinator saying so means the run is gone; a
                    // 404 from a proxy or a wrong URL must not drop a result.
                    let code = serde_json::from_str::<composer_api::ErrorBody>(&body).ok().map(|b| b.error.code);
                    if status == reqwest::StatusCode::NOT_FOUND && code.as_deref() == Some(composer_api::RUN_NOT_FOUND)
                    {
                        return Delivery::Gone;
                    }
                    if status == reqwest::StatusCode::CONFLICT && code.as_deref() == Some(composer_api::LEASE_LOST) {
                        tracing::warn!(%task_id, "report refused: this worker no longer holds the lease; dropping it");
                        return Delivery::Gone;
                    }
                    if let Some(code) = code.filter(|_| refused_for_good(status)) {
                        let message = serde_json::from_str::<composer_api::ErrorBody>(&body)
                            .map(|b| b.error.message)
                            .unwrap_or_default();
                        if replaced.is_some() {
                            tracing::error!(%task_id, %status, %message, "the attempt's failure was refused too; dropping it");
                            return Delivery::Gone;
                        }
                        tracing::warn!(%task_id, %status, %message, "report refused; failing the attempt with the reason");
                        replaced = Some(refusal(report, status.as_u16(), &code, &message));
                        continue;
                    }
                    tracing::warn!(%task_id, coordinator = %base, %status, %body, "report refused; trying again");
                }
                Err(e) => {
                    tracing::warn!(%task_id, coordinator = %base, error = %e, "report failed; trying again")
                }
            }
            if tokio::time::Instant::now() + backoff > give_up {
                return Delivery::Failed;
            }
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(Duration::from_secs(2));
        }
    }
}

/// A refusal of the report itself, which no retry of it gets past: a 400,
/// 413 or 422. Not a refusal of the worker (401, 403: a token an operator
/// may mend), nor a 404 or 409 (the run and lease cases are handled above;
/// another 404 may be a proxy's), nor a 408 or 429.
fn refused_for_good(status: reqwest::StatusCode) -> bool {
    use reqwest::StatusCode as S;
    matches!(status, S::BAD_REQUEST | S::PAYLOAD_TOO_LARGE | S::UNPROCESSABLE_ENTITY)
}

/// The failure that replaces a refused report: for good, with the
/// coordinator's reason.
fn refusal(report: &TaskReport, status: u16, code: &str, message: &str) -> TaskReport {
    let message = composer_core::clipped(message, 1024);
    TaskReport {
        status: composer_api::wire::ReportStatus::Failed,
        output: None,
        error: Some(format!("the coordinator refused the attempt's result (HTTP {status} {code}): {message}")),
        retryable: false,
        code: Some(composer_core::machine::codes::REPORT_REFUSED.into()),
        http_status: None,
        retry_after_ms: None,
        // What the refused report said of its stages may be what was refused.
        stages: None,
        ..report.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refused_report_becomes_a_failure_for_good_that_says_why() {
        let report = TaskReport {
            run_id: Uuid::now_v7(),
            attempt: 2,
            worker_id: "w".into(),
            status: composer_api::wire::ReportStatus::Completed,
            output: Some(serde_json::json!({"big": "x"})),
            error: None,
            retryable: true,
            code: None,
            http_status: None,
            retry_after_ms: None,
            stages: None,
        };
        let failed = refusal(&report, 413, "payload_too_large", "the request body is too large");
        assert_eq!((failed.run_id, failed.attempt, failed.worker_id.as_str()), (report.run_id, 2, "w"));
        assert_eq!(failed.status, composer_api::wire::ReportStatus::Failed);
        assert!(failed.output.is_none() && !failed.retryable);
        assert_eq!(failed.code.as_deref(), Some("report_refused"));
        assert!(failed.error.unwrap().contains("HTTP 413 payload_too_large"));
        assert!(refused_for_good(reqwest::StatusCode::PAYLOAD_TOO_LARGE));
        assert!(refused_for_good(reqwest::StatusCode::BAD_REQUEST));
        assert!(!refused_for_good(reqwest::StatusCode::TOO_MANY_REQUESTS));
        assert!(!refused_for_good(reqwest::StatusCode::UNAUTHORIZED), "a token can be mended");
        assert!(!refused_for_good(reqwest::StatusCode::NOT_FOUND), "maybe a proxy's");
        assert!(!refused_for_good(reqwest::StatusCode::SERVICE_UNAVAILABLE));
    }
}
