//! `/ui/overview` (runs by status, throughput, step latency, failures by
//! workflow, queue backlogs) and `/ui/queues` (each queue's backlog and lag,
//! and the workers that read it): what they read, and how they show it.
//!
//! A worker is known to a queue by two things, neither of which is "when it
//! last polled": its consumer in the queue's streams (one per shard: merged
//! here), whose idle time is since it last read a task from them; and a
//! poll of it waiting for work on this coordinator now (`IdlePolls`). A
//! worker fed by hand-overs and results reads no stream for minutes while
//! it works, and a long-polling one reads none while there is no work: the
//! page says "waiting for work" for the second, and names the stream time
//! for what it is.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::{Query, State};
use axum::response::IntoResponse;
use axum::Extension;
use composer_store::stats::QueueLoad;

use super::error::{Page, UiError};
use super::extract::{id_at, Params};
use super::html::{badge, html, page, url_enc, Html, Table};
use crate::engine::Engine;
use composer_store::{Client, Pool};
use composer_stream::Streams;

/// How long one coordinator shows the same overview.
const OVERVIEW_TTL: Duration = Duration::from_secs(10);

/// Most queues the overview and queues pages list.
const MAX_QUEUES_SHOWN: usize = 200;

/// The overview as last made, and when: made at most once per
/// [`OVERVIEW_TTL`] however many pages are open (it counts a day of runs).
pub type OverviewCache = Arc<tokio::sync::Mutex<Option<(Instant, Html)>>>;

/// `/ui/overview`, refreshed while open.
pub async fn overview_page(
    State(pool): State<Pool>,
    State(engine): State<Arc<Engine>>,
    State(streams): State<Streams>,
    Extension(cache): Extension<OverviewCache>,
    Query(q): Query<Params>,
) -> Page {
    // One request makes it while the others wait for its answer.
    let mut cached = cache.lock().await;
    let body = match cached.as_ref() {
        Some((at, body)) if at.elapsed() < OVERVIEW_TTL => body.clone(),
        _ => {
            let body = Overview::read(&pool, &engine, &streams).await?.render();
            *cached = Some((Instant::now(), body.clone()));
            body
        }
    };
    drop(cached);
    if q.contains_key("fragment") {
        return Ok(body.into_response());
    }
    Ok(page("Overview", html!("<div data-live=\"/ui/overview?fragment=1\">{}</div>", body)).into_response())
}

/// `/ui/queues`, refreshed while open.
pub async fn queues_page(
    State(pool): State<Pool>,
    State(engine): State<Arc<Engine>>,
    State(streams): State<Streams>,
    Query(q): Query<Params>,
) -> Page {
    let client = composer_store::client(&pool).await?;
    let body = queues(&queue_rows(&client, &engine, &streams).await?);
    if q.contains_key("fragment") {
        return Ok(body.into_response());
    }
    Ok(page("Queues", html!("<div data-live=\"/ui/queues?fragment=1\">{}</div>", body)).into_response())
}

/// Runs by status over a window.
pub struct StatusCounts {
    pub window: &'static str,
    pub counts: Vec<(String, i64)>,
}

/// p50, p95 and p99, in milliseconds.
pub type Percentiles = (f64, f64, f64);

/// A queue as the pages show it.
pub struct QueueRow {
    pub queue: String,
    pub pending: i64,
    pub running: i64,
    /// Seconds the oldest PENDING task has waited.
    pub lag_s: Option<f64>,
    /// The workers that read it, by id.
    pub readers: Vec<Reader>,
}

/// A worker of a queue, its stream shards merged.
#[derive(Debug, Clone, PartialEq)]
pub struct Reader {
    /// The worker's id (its consumer in the streams is `api:ID`).
    pub worker: String,
    /// Seconds since it last read a task from the queue's streams (the
    /// freshest of its shards); `None` when it is known only by its poll.
    pub read_s: Option<f64>,
    /// Messages it read and has not acknowledged, over the shards.
    pub holding: u64,
    /// A poll of it waits for work of this queue on this coordinator now.
    pub waiting: bool,
}

/// What the overview shows, as read.
pub struct Overview {
    pub as_of: String,
    pub windows: Vec<StatusCounts>,
    /// Runs ended per minute (`HH:MM`).
    pub per_minute: Vec<(String, i64)>,
    pub latency_ms: Vec<(&'static str, Option<Percentiles>)>,
    /// Failed runs by workflow.
    pub failures: Vec<(String, i64)>,
    pub queues: Vec<QueueRow>,
}

impl Overview {
    async fn read(pool: &Pool, engine: &Engine, streams: &Streams) -> Result<Overview, UiError> {
        use composer_store::stats;
        let client = composer_store::client(pool).await?;
        let now = crate::clock::now();
        let (hour, day) = (id_at(now - chrono::Duration::hours(1)), id_at(now - chrono::Duration::days(1)));
        let windows = vec![
            StatusCounts { window: "hour", counts: stats::runs_by_status(&client, hour).await? },
            StatusCounts { window: "day", counts: stats::runs_by_status(&client, day).await? },
        ];
        let per_minute = stats::ended_per_minute(&client, id_at(now - chrono::Duration::hours(2)))
            .await?
            .into_iter()
            .map(|(m, n)| (m.format("%H:%M").to_string(), n))
            .collect();
        let latency = stats::step_latency(&client, hour).await?;
        Ok(Overview {
            as_of: format!("as of {} UTC, made at most every {} s", now.format("%H:%M:%S"), OVERVIEW_TTL.as_secs()),
            windows,
            per_minute,
            latency_ms: vec![("running time", latency.ran), ("wait to start", latency.waited)],
            failures: stats::failures_by_workflow(&client, day).await?,
            queues: queue_rows(&client, engine, streams).await?,
        })
    }

    pub fn render(&self) -> Html {
        let cards: Html =
            self.windows.iter().map(status_card).chain(self.latency_ms.iter().map(latency_card)).collect();
        let failures = Table::new("runs", &["Workflow", "Failed runs"]).or_none("No run failed.").with(
            self.failures
                .iter()
                .map(|(wf, n)| {
                    html!(
                        "<tr><td><a href=\"/ui/runs?workflow={}&amp;status=FAILED\">{}</a></td><td class=\"n\">{}</td></tr>",
                        url_enc(wf),
                        wf,
                        n
                    )
                })
                .collect(),
        );
        html!(
            "<h1>Overview</h1><p class=\"hint\">{}</p><div class=\"cards\">{}</div>\
             <h2>Runs ended per minute, last hour</h2>{}<h2>Failures by workflow, last day</h2>{}\
             <h2>Queue backlogs</h2>{}",
            self.as_of,
            cards,
            bars(&self.per_minute),
            failures,
            queue_table(&self.queues)
        )
    }
}

fn status_card(w: &StatusCounts) -> Html {
    let rows: Html = match w.counts.is_empty() {
        true => Html::raw("<tr><td class=\"empty\">none</td></tr>"),
        false => w
            .counts
            .iter()
            .map(|(status, n)| html!("<tr><td>{}</td><td class=\"n\">{}</td></tr>", badge(status), n))
            .collect(),
    };
    html!(
        "<section class=\"card\"><h2>Runs, last {}</h2><table class=\"counts\"><tbody>{}</tbody></table></section>",
        w.window,
        rows
    )
}

fn latency_card((label, latency): &(&'static str, Option<Percentiles>)) -> Html {
    let shown = match latency {
        Some((p50, p95, p99)) => html!(
            "<table class=\"counts\"><tbody><tr><td>p50</td><td class=\"n\">{:.1} ms</td></tr>\
             <tr><td>p95</td><td class=\"n\">{:.1} ms</td></tr><tr><td>p99</td><td class=\"n\">{:.1} ms</td></tr>\
             </tbody></table>",
            p50,
            p95,
            p99
        ),
        None => Html::raw("<p class=\"empty\">no step ended</p>"),
    };
    html!("<section class=\"card latency\"><h2>Steps, last hour: {}</h2>{}</section>", *label, shown)
}

/// The queues page: each queue's backlog and lag, and who reads it.
pub fn queues(queues: &[QueueRow]) -> Html {
    let workers: Html = queues
        .iter()
        .flat_map(|q| q.readers.iter().map(move |r| (q, r)))
        .map(|(q, r)| {
            let poll = match r.waiting {
                true => Html::raw("<span class=\"badge waiting\">waiting for work</span>"),
                false => Html::raw("none now"),
            };
            let read = r.read_s.map(|s| format!("{s:.1} s ago")).unwrap_or_else(|| "—".into());
            html!(
                "<tr data-worker=\"{}\"><td><code>{}</code></td><td>{}</td><td class=\"poll\">{}</td><td>{}</td>\
                 <td class=\"n\">{}</td></tr>",
                r.worker,
                r.worker,
                q.queue,
                poll,
                read,
                r.holding
            )
        })
        .collect();
    let workers = Table::new(
        "runs workers",
        &["Worker", "Queue", "Poll on this coordinator", "Last read from the stream", "Holding"],
    )
    .or_none("No worker has read these queues.")
    .with(workers);
    html!(
        "<h1>Queues and workers</h1>{}<h2>Workers</h2><p class=\"hint\">A worker is listed once per queue it reads. \
         <b>Waiting for work</b>: a poll of it waits on this coordinator now, and gets the next task of the queue \
         (a poll waiting on another coordinator shows on that coordinator's page only). \
         <b>Last read from the stream</b>: when it last read a task of the queue from the queue's streams; a \
         waiting poll reads none while there is no work, and a task handed to a waiting poll or with a result \
         passes no stream, so this says nothing of whether the worker is alive. <b>Holding</b>: tasks read and \
         not yet leased.</p>{}",
        queue_table(queues),
        workers
    )
}

fn queue_table(queues: &[QueueRow]) -> Html {
    let rows = queues.iter().map(|q| {
        let lag = q.lag_s.map(|s| format!("{s:.1} s")).unwrap_or_else(|| "—".into());
        let waiting = q.readers.iter().filter(|r| r.waiting).count();
        let last_read = q.readers.iter().filter_map(|r| r.read_s).reduce(f64::min);
        let readers = match (q.readers.len(), waiting, last_read) {
            (0, _, _) => "none".to_string(),
            (n, 1.., _) => format!("{n} ({waiting} waiting for work here)"),
            (n, 0, Some(read)) => format!("{n} (last read from the stream {read:.1} s ago)"),
            (n, 0, None) => n.to_string(),
        };
        html!(
            "<tr data-queue=\"{}\"><td>{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td><td>{}</td><td>{}</td></tr>",
            q.queue,
            q.queue,
            q.pending,
            q.running,
            lag,
            readers
        )
    });
    Table::new("runs queues", &["Queue", "Waiting", "Running", "Oldest waiting", "Workers"])
        .or_none("No queue has work.")
        .with(rows.collect())
}

/// A bar chart of counts per minute, as SVG.
fn bars(points: &[(String, i64)]) -> Html {
    if points.is_empty() {
        return Html::raw("<p class=\"empty\">No run ended.</p>");
    }
    let max = points.iter().map(|p| p.1).max().unwrap_or(1).max(1) as f64;
    let (w, h, bw) = (720.0, 120.0, 720.0 / points.len() as f64);
    let rects: Html = points
        .iter()
        .enumerate()
        .map(|(i, (minute, n))| {
            let bh = (*n as f64 / max) * h;
            html!(
                "<rect x=\"{:.1}\" y=\"{:.1}\" width=\"{:.1}\" height=\"{:.1}\"><title>{}: {}</title></rect>",
                i as f64 * bw,
                h - bh,
                (bw - 1.0).max(1.0),
                bh,
                minute,
                n
            )
        })
        .collect();
    html!(
        "<svg class=\"throughput\" xmlns=\"http://www.w3.org/2000/svg\" viewBox=\"0 0 {} {}\" width=\"{}\" height=\"{}\" \
         role=\"img\" aria-label=\"runs ended per minute\">{}<text class=\"axis\" x=\"0\" y=\"{}\">max {:.0}/min</text></svg>",
        w,
        h + 16.0,
        w,
        h + 16.0,
        rects,
        h + 14.0,
        max
    )
}

/// The queues with open work and those the newest definitions send to
/// (at most [`MAX_QUEUES_SHOWN`]), each with the workers that read its
/// streams or wait for its work here.
async fn queue_rows(client: &Client, engine: &Engine, streams: &Streams) -> Result<Vec<QueueRow>, UiError> {
    let mut loads: BTreeMap<String, QueueLoad> =
        composer_store::stats::queue_loads(client).await?.into_iter().map(|l| (l.queue.clone(), l)).collect();
    for def in composer_store::definitions::latest_of_each(client, MAX_QUEUES_SHOWN as i64).await? {
        let Ok(wf) = engine.compile(&def) else { continue };
        for q in wf.nodes.iter().filter_map(|n| n.queue.as_ref()) {
            loads.entry(q.clone()).or_insert_with(|| QueueLoad {
                queue: q.clone(),
                pending: 0,
                running: 0,
                oldest_pending_age: None,
            });
        }
    }
    let waiting: HashSet<(String, String)> = engine
        .idle_polls()
        .waiting_workers()
        .into_iter()
        .flat_map(|(worker, queues)| queues.into_iter().map(move |q| (worker.clone(), q)))
        .collect();
    let mut rows = Vec::with_capacity(loads.len().min(MAX_QUEUES_SHOWN));
    for l in loads.into_values().take(MAX_QUEUES_SHOWN) {
        let mut consumers = Vec::new();
        for shard in 0..engine.shards().max(1) as u32 {
            // Workers read every priority's streams: the default's show them.
            let stream = streams.keys().stream(&l.queue, composer_core::priority::DEFAULT, shard);
            // Redis down: the queue is shown without its readers.
            consumers.extend(streams.consumers(&stream).await.unwrap_or_default());
        }
        let polling = waiting.iter().filter(|(_, q)| *q == l.queue).map(|(w, _)| w.as_str());
        let readers = merge_readers(consumers, polling);
        rows.push(QueueRow {
            queue: l.queue,
            pending: l.pending,
            running: l.running,
            lag_s: l.oldest_pending_age,
            readers,
        });
    }
    Ok(rows)
}

/// One reader per worker: its consumers of the queue's stream shards
/// (`(name, idle ms, pending)`) merged, the freshest read and the messages
/// held summed, and whether a poll of it waits here (`polling`, worker ids,
/// which may name workers no stream knows yet).
fn merge_readers<'a>(consumers: Vec<(String, u64, u64)>, polling: impl Iterator<Item = &'a str>) -> Vec<Reader> {
    let mut by_worker: BTreeMap<String, Reader> = BTreeMap::new();
    let blank = |worker: &str| Reader { worker: worker.to_string(), read_s: None, holding: 0, waiting: false };
    for (name, idle_ms, pending) in consumers {
        // The task API reads as `api:WORKER`.
        let worker = name.strip_prefix("api:").unwrap_or(&name);
        let r = by_worker.entry(worker.to_string()).or_insert_with(|| blank(worker));
        let read = idle_ms as f64 / 1000.0;
        r.read_s = Some(r.read_s.map_or(read, |s| s.min(read)));
        r.holding += pending;
    }
    for worker in polling {
        by_worker.entry(worker.to_string()).or_insert_with(|| blank(worker)).waiting = true;
    }
    by_worker.into_values().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_from_the_database_are_escaped_and_empty_parts_say_so() {
        let queue = QueueRow {
            queue: "<q>".into(),
            pending: 3,
            running: 1,
            lag_s: Some(2.5),
            readers: vec![Reader { worker: "w\"1".into(), read_s: Some(0.4), holding: 2, waiting: false }],
        };
        let overview = Overview {
            as_of: "now".into(),
            windows: vec![],
            per_minute: vec![],
            latency_ms: vec![("running time", None)],
            failures: vec![("<wf>".into(), 2)],
            queues: vec![queue],
        };
        let html = overview.render();
        let html = html.as_str();
        assert!(!html.contains("<q>") && !html.contains("<wf>") && html.contains("&lt;wf&gt;"), "{html}");
        assert!(html.contains("no step ended") && html.contains("No run ended"));
        assert!(html.contains("2.5 s") && html.contains("1 (last read from the stream 0.4 s ago)"));
        let page = queues(&[]);
        assert!(page.as_str().contains("No queue has work") && page.as_str().contains("No worker has read"));
    }

    /// Issue 51: a worker was listed once per stream shard, and a
    /// long-polling one as "last read 146 s ago".
    #[test]
    fn a_worker_is_one_reader_per_queue_and_its_waiting_poll_says_waiting_for_work() {
        let shards = vec![
            ("api:w1".to_string(), 146_000, 1),
            ("api:w2".to_string(), 3_000, 0),
            ("api:w1".to_string(), 90_000, 2),
        ];
        let readers = merge_readers(shards, ["w1", "w3"].into_iter());
        let r = |worker: &str, read_s, holding, waiting| Reader { worker: worker.into(), read_s, holding, waiting };
        assert_eq!(
            readers,
            [r("w1", Some(90.0), 3, true), r("w2", Some(3.0), 0, false), r("w3", None, 0, true)],
            "the freshest read and all it holds; a worker known by its poll only"
        );
        let row = QueueRow { queue: "q".into(), pending: 0, running: 0, lag_s: None, readers };
        let page = queues(&[row]);
        let page = page.as_str();
        assert_eq!(page.matches("<tr data-worker=").count(), 3);
        assert_eq!(page.matches("waiting for work</span>").count(), 2, "{page}");
        assert!(page.contains("3 (2 waiting for work here)"), "{page}");
        assert!(page.contains("on that coordinator's page only"), "says whose polls it sees");
    }

    #[test]
    fn bars_scale_to_the_busiest_minute() {
        let svg = bars(&[("10:00".into(), 5), ("10:01".into(), 10)]);
        let svg = svg.as_str();
        assert_eq!(svg.matches("<rect").count(), 2);
        assert!(svg.contains("height=\"120.0\"") && svg.contains("height=\"60.0\"") && svg.contains("max 10/min"));
    }
}
