//! What the processes' `/metrics` say: the time a step spends in each
//! stage, and how the coordinator dispatched its tasks.

use std::collections::HashMap;
use std::time::Duration;

/// Observations and their sum in seconds, per stage of
/// `composer_step_stage_seconds`, read from Prometheus text.
pub(super) type StageSums = HashMap<String, (f64, f64)>;

pub(super) fn parse_stages(text: &str, into: &mut StageSums) {
    const NAME: &str = "composer_step_stage_seconds_";
    for line in text.lines() {
        let Some(rest) = line.strip_prefix(NAME) else { continue };
        let (which, rest) = match rest.split_once("{stage=\"") {
            Some((which @ ("sum" | "count"), rest)) => (which, rest),
            _ => continue,
        };
        let Some((stage, value)) = rest.split_once("\"} ") else { continue };
        let Ok(value) = value.trim().parse::<f64>() else { continue };
        let entry = into.entry(stage.to_string()).or_insert((0.0, 0.0));
        match which {
            "count" => entry.0 += value,
            _ => entry.1 += value,
        }
    }
}

/// The stages as the coordinators and workers at `urls` count them now; a
/// URL that does not answer adds nothing.
pub(super) async fn read_stages(http: &reqwest::Client, urls: &[String]) -> StageSums {
    let mut sums = StageSums::new();
    for url in urls {
        let text = match http.get(url).timeout(Duration::from_secs(5)).send().await {
            Ok(r) if r.status().is_success() => r.text().await.unwrap_or_default(),
            _ => continue,
        };
        parse_stages(&text, &mut sums);
    }
    sums
}

/// Each of [`DISPATCH_COUNTERS`]' share of the tasks dispatched between
/// two readings; `None` when none were.
pub(super) fn dispatch_share(from: [f64; 3], to: [f64; 3]) -> Option<[f64; 3]> {
    let d: [f64; 3] = std::array::from_fn(|i| to[i] - from[i]);
    let all: f64 = d.iter().sum();
    (all > 0.0).then(|| d.map(|n| n / all))
}

/// Mean milliseconds per stage between two readings, in the order a step
/// passes them; stages nobody observed are left out.
pub(super) fn stage_means(before: &StageSums, after: &StageSums) -> Vec<(&'static str, f64)> {
    composer_metrics::STAGES
        .iter()
        .filter_map(|&stage| {
            let (n1, s1) = after.get(stage).copied()?;
            let (n0, s0) = before.get(stage).copied().unwrap_or((0.0, 0.0));
            (n1 > n0).then(|| (stage, (s1 - s0) * 1000.0 / (n1 - n0)))
        })
        .collect()
}

/// How a step's task reached its worker, by the coordinator's counters:
/// through a stream, with a result's answer, or to a poll waiting for work.
pub(super) const DISPATCH_COUNTERS: [&str; 3] =
    ["composer_dispatches_total", "composer_eager_dispatches_total", "composer_idle_poll_dispatches_total"];

/// [`DISPATCH_COUNTERS`] as the coordinator at `url` counts them now
/// (zeros when it does not answer).
pub(super) async fn read_dispatches(http: &reqwest::Client, url: &str) -> [f64; 3] {
    let text = match http.get(url).timeout(Duration::from_secs(5)).send().await {
        Ok(r) if r.status().is_success() => r.text().await.unwrap_or_default(),
        _ => String::new(),
    };
    std::array::from_fn(|i| {
        text.lines()
            .filter_map(|l| l.strip_prefix(DISPATCH_COUNTERS[i])?.strip_prefix(' ')?.trim().parse::<f64>().ok())
            .sum()
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn stage_means_come_from_the_histograms_of_every_process_read() {
        let text = |n: u32, secs: f64| {
            format!(
                "# TYPE composer_step_stage_seconds histogram\n\
                 composer_step_stage_seconds_bucket{{stage=\"read_to_lease\",le=\"0.001\"}} {n}\n\
                 composer_step_stage_seconds_sum{{stage=\"read_to_lease\"}} {secs}\n\
                 composer_step_stage_seconds_count{{stage=\"read_to_lease\"}} {n}\n\
                 composer_step_stage_seconds_sum{{stage=\"report_to_commit\"}} 0.5\n\
                 composer_step_stage_seconds_count{{stage=\"report_to_commit\"}} 100\n\
                 composer_report_duration_seconds_sum 9\n"
            )
        };
        let (mut before, mut after) = (super::StageSums::new(), super::StageSums::new());
        super::parse_stages(&text(10, 0.01), &mut before);
        // Two workers' /metrics add up.
        super::parse_stages(&text(20, 0.03), &mut after);
        super::parse_stages(&text(10, 0.02), &mut after);
        let means = super::stage_means(&before, &after);
        assert_eq!(means.len(), 2, "{means:?}");
        assert_eq!(means[0].0, "report_to_commit");
        assert!((means[0].1 - 5.0).abs() < 1e-9, "{means:?}: 100 more observations, 0.5 s more");
        assert_eq!(means[1].0, "read_to_lease");
        assert!((means[1].1 - 2.0).abs() < 1e-9, "{means:?}: 20 more observations, 0.04 s more");
    }
}
