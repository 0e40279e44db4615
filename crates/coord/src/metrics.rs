//! The coordinator's metrics, each counted in the namespace of the work
//! that counts it: a cell's tasks and the requests the door hands to a
//! cell run in its namespace ([`in_namespace`]), tasks they spawn go on in
//! it ([`spawn`]), and every count, gauge and timing made meanwhile carries
//! a `namespace` label (none in `default`, whose series are as they always
//! were); their log lines are in a span naming it, and their traces' spans
//! carry it (`trace::NAMESPACE_ATTRIBUTE`). The workspace's clippy
//! settings allow no other way to count or spawn in this crate, so no
//! metric forgets its namespace.

#![allow(clippy::disallowed_methods)] // the one door to what the lints forbid elsewhere

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use composer_metrics::Metric;

tokio::task_local! {
    static NAMESPACE: Arc<str>;
}

/// The label every metric of namespace `ns` carries.
pub const LABEL: &str = "namespace";

/// `f`, its metrics counted in namespace `ns` (in `default` when `None`),
/// and its log lines in a span that names it (`namespace{namespace=…}`).
pub async fn in_namespace<F: Future>(ns: Option<Arc<str>>, f: F) -> F::Output {
    use tracing::Instrument;
    match ns {
        Some(ns) => {
            let span = tracing::info_span!("namespace", namespace = %ns);
            NAMESPACE.scope(ns, f.instrument(span)).await
        }
        None => f.await,
    }
}

/// The namespace the running task counts in, unless it is `default`.
pub fn current() -> Option<Arc<str>> {
    NAMESPACE.try_with(Arc::clone).ok()
}

/// `tokio::spawn`, the task counting in the namespace of the one that spawned it.
pub fn spawn<F>(f: F) -> tokio::task::JoinHandle<F::Output>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    tokio::spawn(in_namespace(current(), f))
}

/// `labels` with the current namespace's, when it is not `default`.
fn with_namespace<R>(labels: &[(&'static str, &str)], then: impl FnOnce(&[(&'static str, &str)]) -> R) -> R {
    match current() {
        None => then(labels),
        Some(ns) => {
            let mut all = labels.to_vec();
            all.push((LABEL, &ns));
            then(&all)
        }
    }
}

pub fn inc(metric: &Metric, labels: &[(&'static str, &str)], by: u64) {
    with_namespace(labels, |l| composer_metrics::inc(metric, l, by))
}

pub fn declare(metric: &Metric, labels: &[(&'static str, &str)]) {
    with_namespace(labels, |l| composer_metrics::declare(metric, l))
}

pub fn set(metric: &Metric, labels: &[(&'static str, &str)], value: f64) {
    with_namespace(labels, |l| composer_metrics::set(metric, l, value))
}

pub fn observe(metric: &Metric, labels: &[(&'static str, &str)], d: Duration) {
    with_namespace(labels, |l| composer_metrics::observe(metric, l, d))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_count_carries_its_task_s_namespace_and_a_spawned_task_keeps_it() {
        let m = &composer_metrics::LEASE_TAKEOVERS;
        inc(m, &[], 1);
        let billing: Arc<str> = Arc::from("billing-metrics-test");
        in_namespace(Some(billing.clone()), async {
            inc(m, &[], 2);
            spawn(async { inc(m, &[], 3) }).await.unwrap();
        })
        .await;
        assert_eq!(composer_metrics::value(m, &[(LABEL, "billing-metrics-test")]), 5.0);
        assert!(composer_metrics::value(m, &[]) >= 1.0, "default's series has no label");
    }
}
