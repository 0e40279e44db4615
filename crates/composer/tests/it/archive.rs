//! Archive and export: retention writes an expired month's runs to the
//! archive (`COMPOSER_ARCHIVE_URL`) before it drops them, and
//! `GET /v1/archive/runs/{id}` reads a run back as the API showed it; a
//! month with an open run, or one of whose runs changed while it was read,
//! is kept. `composer run export` writes live runs in the same format.

use std::process::Command;
use std::time::Duration;

use composer_api::ArchivedRun;
use composer_testkit::{eventually, Engine, EngineOptions};
use serde_json::{json, Value};
use uuid::Uuid;

const BIN: &str = env!("CARGO_BIN_EXE_composer");
const T: Duration = Duration::from_secs(30);

/// A directory of its own under the system's temporary one, removed when dropped.
struct Dir(std::path::PathBuf);

impl Dir {
    fn new(name: &str) -> Dir {
        let dir = std::env::temp_dir().join(format!("composer-archive-{name}-{}", Uuid::now_v7()));
        std::fs::create_dir_all(&dir).unwrap();
        Dir(dir)
    }
    fn path(&self) -> &str {
        self.0.to_str().unwrap()
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A coordinator (and no worker) whose retention (30 days, a pass every
/// 200 ms) archives to `url`, with S3 settings `options`.
async fn archiving(url: String, options: Vec<(String, String)>) -> Engine {
    let mut e = Engine::with(EngineOptions { coordinators: 0, workers: 0, ..Default::default() }).await;
    let mut config = e.coordinator_config();
    config.archive_url = Some(url);
    config.archive_options = options;
    config.retention_days = 30;
    config.partition_interval = Duration::from_millis(200);
    e.start_coordinator_with(config).await;
    e
}

/// A run with something of everything an archive keeps: a step with log
/// lines over two attempts, a MAP with items, a long history.
async fn a_finished_run(e: &Engine) -> Uuid {
    e.register(&json!({"name": "kept", "nodes": [
        {"id": "step", "type": "resize", "queue": "py", "retry": {"max_attempts": 2, "initial_backoff": "10ms"}},
        {"id": "each", "type": "MAP", "config": {"items": [1, 2, 3], "node": {"type": "TRANSFORM", "config": {"output": "${ .item }"}}}}],
        "edges": [{"from": "step", "to": "each"}]}))
    .await;
    let run = e.start_run("kept", json!({"customer": "c-1"})).await;
    for (attempt, end) in [(1, "fail"), (2, "complete")] {
        let poll = json!({"worker_id": "w", "queues": ["py"], "max": 1, "wait": "10s"});
        let (_, body) = e.post("/v1/tasks/poll", &poll).await;
        let task = body["tasks"][0].clone();
        let id = task["id"].as_str().unwrap();
        let mut report = json!({"worker_id": "w", "run_id": task["run_id"], "attempt": task["attempt"]});
        report["lines"] = json!([format!("attempt {attempt} begins"), "working"]);
        assert_eq!(e.post(&format!("/v1/tasks/{id}/logs"), &report).await.0, 200);
        report.as_object_mut().unwrap().remove("lines");
        match end {
            "fail" => report["error"] = json!("flaky"),
            _ => report["output"] = json!({"size": 7}),
        }
        let (status, answer) = e.post(&format!("/v1/tasks/{id}/{end}"), &report).await;
        assert_eq!(status, 200, "{answer}");
    }
    assert_eq!(e.wait_for_run(run, T).await["status"], "SUCCEEDED");
    run
}

/// Moves `run`'s rows to a UUIDv7 of the month four months back (made
/// here), as if it had been started then; returns its id there and the month.
async fn moved_to_an_old_month(e: &Engine, run: Uuid) -> (Uuid, String) {
    let c = e.db.pool().get().await.unwrap();
    let month: String = c
        .query_one(
            "SELECT to_char(date_trunc('month', now() AT TIME ZONE 'UTC') - interval '4 months', 'YYYY_MM')",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    let then: f64 = c
        .query_one(
            "SELECT extract(epoch FROM (date_trunc('month', now() AT TIME ZONE 'UTC') - interval '4 months' + interval '2 days') AT TIME ZONE 'UTC')::float8",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    let old = Uuid::new_v7(uuid::Timestamp::from_unix(uuid::NoContext, then as u64, 0));
    // One transaction, so that the archive never sees the month without the run.
    let mut sql = format!(
        "ROLLBACK; BEGIN;
         DO $$ DECLARE m timestamp := date_trunc('month', now() AT TIME ZONE 'UTC') - interval '4 months'; t text;
         BEGIN FOREACH t IN ARRAY ARRAY['workflow_runs','task_instances','run_events'] LOOP
           EXECUTE format('CREATE TABLE IF NOT EXISTS %I PARTITION OF %I FOR VALUES FROM (%L) TO (%L)', t || '_p{month}', t,
             composer_month_uuid(m AT TIME ZONE 'UTC'), composer_month_uuid((m + interval '1 month') AT TIME ZONE 'UTC'));
         END LOOP; END $$;"
    );
    // Its times go back with it: retention drops a month only when nothing
    // of it changed in the last minute.
    let tables = [
        ("workflow_runs", "id", "updated_at"),
        ("task_instances", "run_id", "updated_at"),
        ("run_events", "run_id", "created_at"),
    ];
    for (table, key, shifted) in tables {
        sql.push_str(&format!(
            "CREATE TEMP TABLE moved AS SELECT * FROM {table} WHERE {key} = '{run}';
             UPDATE moved SET {key} = '{old}', {shifted} = {shifted} - interval '4 months';
             DELETE FROM {table} WHERE {key} = '{run}';
             INSERT INTO {table} SELECT * FROM moved;
             DROP TABLE moved;"
        ));
    }
    for table in ["task_logs", "task_log_usage", "run_log_usage"] {
        sql.push_str(&format!("UPDATE {table} SET run_id = '{old}' WHERE run_id = '{run}';"));
    }
    sql.push_str(&format!("UPDATE task_logs SET at = at - interval '4 months' WHERE run_id = '{old}'; COMMIT;"));
    // Attaching a partition locks its parent: with the coordinator's loops
    // reading the tables in their own order, PostgreSQL may pick this
    // transaction to break a deadlock. It is then tried again.
    eventually(T, "the run moved to an old month", || async { c.batch_execute(&sql).await }).await;
    (old, month)
}

/// Holds `e`'s archiving lock (as a coordinator's pass does) until the
/// transaction it returns ends: retention does not archive meanwhile.
async fn archiving_held(c: &mut tokio_postgres::Client) -> tokio_postgres::Transaction<'_> {
    let tx = c.transaction().await.unwrap();
    eventually(T, "the archiving lock", || async {
        let row = tx
            .query_one("SELECT pg_try_advisory_xact_lock(hashtext('composer_archive:' || current_schema()))", &[])
            .await
            .unwrap();
        row.get::<_, bool>(0).then_some(())
    })
    .await;
    tx
}

/// What the API shows of `run`: the run, its whole history, its MAP's
/// items and its step's log lines of each attempt.
async fn shown(e: &Engine, run: Uuid) -> (Value, Vec<Value>, Vec<Value>, Vec<Value>) {
    let (status, view) = e.get(&format!("/v1/runs/{run}")).await;
    assert_eq!(status, 200, "{view}");
    let (_, history) = e.get(&format!("/v1/runs/{run}/events?limit=1000")).await;
    let (_, items) = e.get(&format!("/v1/runs/{run}/items?node=each&limit=1000")).await;
    let mut logs = Vec::new();
    for attempt in [1, 2] {
        let (_, page) = e.get(&format!("/v1/runs/{run}/tasks/step/logs?attempt={attempt}")).await;
        logs.push(json!({"node": "step", "attempt": attempt, "lines": page["lines"]}));
    }
    let array = |v: &Value| v.as_array().unwrap().clone();
    (view, array(&history["events"]), array(&items["items"]), logs)
}

fn assert_is_what_was_shown(
    archived: &ArchivedRun,
    (view, history, items, logs): &(Value, Vec<Value>, Vec<Value>, Vec<Value>),
) {
    let archived = serde_json::to_value(archived).unwrap();
    assert_eq!(&archived["run"], view, "the run and its tasks");
    assert_eq!(archived["history"].as_array().unwrap(), history, "its whole history");
    assert!(history.len() > 8, "a history of some length: {history:?}");
    assert_eq!(archived["items"]["each"].as_array().unwrap(), items, "its MAP's items");
    assert_eq!(items.len(), 3);
    assert_eq!(archived["logs"].as_array().unwrap(), logs, "its log lines, by attempt");
}

/// Retention with an archive: an expired month holding an open run is
/// kept whole; once its runs have ended it is written to the archive, then
/// dropped, and each run reads back from the archive as the API showed it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_month_is_archived_before_it_is_dropped_and_reads_back_as_shown() {
    let dir = Dir::new("retention");
    let e = archiving(format!("file://{}", dir.path()), Vec::new()).await;

    let run = a_finished_run(&e).await;
    let c = e.db.pool().get().await.unwrap();
    // Held open first: a month with an open run stays, unarchived.
    c.execute("UPDATE workflow_runs SET status = 'RUNNING' WHERE id = $1", &[&run]).await.unwrap();
    let (old, month) = moved_to_an_old_month(&e, run).await;
    // A window in which the month must NOT go: five partition passes.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(e.get(&format!("/v1/runs/{old}")).await.0, 200, "a month with an open run is kept");
    let (status, body) = e.get(&format!("/v1/archive/runs/{old}")).await;
    assert_eq!((status, body["error"]["code"].as_str()), (404, Some("not_found")), "{body}");
    assert!(!dir.0.join(format!("default/runs/{month}/manifest.json")).exists());

    // Ended, a while ago (a run changed in the minute before the archive's
    // read is kept for the next pass): archived, then dropped. What the
    // API shows is read while retention is held off.
    let mut hold = e.db.pool().get().await.unwrap();
    let held = archiving_held(&mut hold).await;
    c.execute(
        "UPDATE workflow_runs SET status = 'SUCCEEDED', updated_at = now() - interval '2 minutes' WHERE id = $1",
        &[&old],
    )
    .await
    .unwrap();
    let before = shown(&e, old).await;
    held.commit().await.unwrap();
    let archived = eventually(T, "the run in the archive", || async {
        let (status, body) = e.get(&format!("/v1/archive/runs/{old}")).await;
        (status == 200).then_some(body)
    })
    .await;
    let archived: ArchivedRun = serde_json::from_value(archived).unwrap();
    assert_is_what_was_shown(&archived, &before);
    eventually(T, "its rows gone once it was written", || async {
        (e.get(&format!("/v1/runs/{old}")).await.0 == 404).then_some(())
    })
    .await;
    let manifest: Value =
        serde_json::from_slice(&std::fs::read(dir.0.join(format!("default/runs/{month}/manifest.json"))).unwrap())
            .unwrap();
    assert_eq!(
        (manifest["format"].as_str(), manifest["runs"].as_u64()),
        (Some("composer-runs/2"), Some(1)),
        "{manifest}"
    );
    assert_eq!(manifest["selection"], json!({"month": month}));
    eventually(T, "its log lines gone with it", || async {
        let left: i64 = c.query_one("SELECT count(*) FROM task_logs WHERE run_id = $1", &[&old]).await.unwrap().get(0);
        (left == 0).then_some(())
    })
    .await;

    // The UI: the run's page sends the browser to the archived run, shown read-only.
    let browser = reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).build().unwrap();
    let moved = browser.get(format!("{}/ui/runs/{old}", e.url())).send().await.unwrap();
    assert_eq!(moved.status(), 303, "the run page of an archived run");
    assert_eq!(moved.headers()["location"], format!("/ui/archive/runs/{old}").as_str());
    let page = browser.get(format!("{}/ui/archive/runs/{old}", e.url())).send().await.unwrap();
    assert_eq!(page.status(), 200);
    let page = page.text().await.unwrap();
    for shown in ["Archived run", "SUCCEEDED", "attempt 1 begins", "flaky", "3 MAP items", "c-1"] {
        assert!(page.contains(shown), "the archived run's page shows {shown:?}: {page}");
    }
    assert!(!page.contains("<form"), "and nothing to act with: {page}");

    // A run the API never had is not in the archive.
    let (status, body) = e.get(&format!("/v1/archive/runs/{}", Uuid::now_v7())).await;
    assert_eq!((status, body["error"]["code"].as_str()), (404, Some("not_found")), "{body}");
    let (status, body) = e.get("/v1/archive/runs/nope").await;
    assert_eq!(status, 400, "{body}");
    e.stop().await;
}

/// A run whose values are offloaded is archived with a copy of each of
/// their objects beside its line, which holds their references: the line
/// stays small whatever the values, the run reads back from the archive
/// as the API showed it (from the copies: the originals are gone by
/// then), and a copy changed in the archive is an error, not a value.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_of_large_values_is_archived_with_copies_of_its_objects_and_reads_back_as_shown() {
    let (dir, offloaded) = (Dir::new("large"), Dir::new("large-offloaded"));
    let places = (format!("file://{}", dir.path()), offloaded.path().to_string(), Vec::new());
    archived_with_copies(places, dir.0.clone(), offloaded.0.clone()).await;
}

/// The same, the archive and the offloaded values both on S3 (a real S3
/// protocol server), one bucket.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_of_large_values_is_archived_with_copies_of_its_objects_on_s3() {
    let s3 = composer_testkit::S3Server::start("runs").await;
    let places = ("s3://runs/archive".to_string(), "s3://runs/objects".to_string(), s3.options());
    archived_with_copies(places, s3.bucket_dir("runs").join("archive"), s3.bucket_dir("runs").join("objects")).await;
}

/// A run of large values archived to `archive_url` from values offloaded
/// to `offload_url` (with S3 settings `options`), whose files are under
/// `archive_dir` and `offloaded` on this machine.
async fn archived_with_copies(
    (archive_url, offload_url, options): (String, String, Vec<(String, String)>),
    archive_dir: std::path::PathBuf,
    offloaded: std::path::PathBuf,
) {
    let mut e = Engine::with(EngineOptions { coordinators: 0, workers: 0, ..Default::default() }).await;
    let mut config = e.coordinator_config();
    config.archive_url = Some(archive_url);
    config.archive_options = options;
    config.offload_url = Some(offload_url);
    config.offload_threshold = 1024;
    config.retention_days = 30;
    config.partition_interval = Duration::from_millis(200);
    e.start_coordinator_with(config).await;
    e.register(&json!({"name": "large", "nodes": [
        {"id": "copy", "type": "TRANSFORM", "config": {"output": "${ .input.text }"}},
        {"id": "each", "type": "MAP", "config": {"items": [1, 2, 3],
            "node": {"type": "TRANSFORM", "config": {"output": "${ .input.text + (.item | tostring) }"}}}}],
        "edges": [{"from": "copy", "to": "each"}],
        "output": {"first": "${ .nodes.each.output[0] }"}}))
        .await;
    let text = "a large value ".repeat(20_000);
    let run = e.start_run("large", json!({"text": text})).await;
    assert_eq!(e.wait_for_run(run, T).await["status"], "SUCCEEDED");
    let mut hold = e.db.pool().get().await.unwrap();
    let held = archiving_held(&mut hold).await;
    let (old, month) = moved_to_an_old_month(&e, run).await;
    let (status, view) = e.get(&format!("/v1/runs/{old}")).await;
    assert_eq!(status, 200, "{view:.300}");
    assert_eq!(view["output"]["first"], format!("{text}1"));
    let (_, items) = e.get(&format!("/v1/runs/{old}/items?node=each&limit=10")).await;
    assert_eq!(items["items"][2]["output"], format!("{text}3"));
    held.commit().await.unwrap();
    let archived = eventually(T, "the run in the archive", || async {
        let (status, body) = e.get(&format!("/v1/archive/runs/{old}")).await;
        (status == 200).then_some(body)
    })
    .await;
    assert_eq!(archived["run"], view, "the run and its steps, values and all");
    assert_eq!(archived["items"]["each"], items["items"], "its MAP's items");

    // The line holds references; the values are objects beside it.
    let month_dir = archive_dir.join(format!("default/runs/{month}"));
    let store = composer_archive::Store::open(month_dir.to_str().unwrap()).unwrap();
    let line = serde_json::to_string(&composer_archive::read_run(&store, old).await.unwrap().unwrap()).unwrap();
    let manifest = composer_archive::manifest(&store).await.unwrap().unwrap();
    assert_eq!(manifest.payloads.as_deref(), Some("payloads"), "the manifest says where the values are");
    assert!(line.len() < 16 << 10, "a line of {} bytes", line.len());
    assert!(!line.contains("a large value a large value") && line.contains("$composer_offloaded"), "{line}");
    let copies = objects_under(&month_dir.join("payloads"));
    // The input, the step's output, three items' outputs, the MAP's and the run's.
    assert!(copies.len() >= 7, "{copies:?}");

    // Read from the copies: the offloaded originals are gone.
    eventually(T, "its rows gone once it was written", || async {
        (e.get(&format!("/v1/runs/{old}")).await.0 == 404).then_some(())
    })
    .await;
    std::fs::remove_dir_all(&offloaded).unwrap();
    let (status, again) = e.get(&format!("/v1/archive/runs/{old}")).await;
    assert_eq!((status, &again), (200, &archived));
    let page = reqwest::get(format!("{}/ui/archive/runs/{old}", e.url())).await.unwrap();
    assert_eq!(page.status(), 200);
    assert!(page.text().await.unwrap().contains("a large value a large value"), "the page shows its input");

    // A copy changed in the archive: an error that holds no value.
    let changed = copies.iter().find(|c| std::fs::metadata(c).unwrap().len() > 200_000).unwrap();
    std::fs::write(changed, serde_json::to_vec(&"another value".repeat(20_000)).unwrap()).unwrap();
    let (status, body) = e.get(&format!("/v1/archive/runs/{old}")).await;
    assert_eq!((status, body["error"]["code"].as_str()), (500, Some("internal")), "{body:.300}");
    assert!(!body.to_string().contains("another value"), "{body:.300}");
    e.stop().await;
}

/// A run whose MAP has more items than a line holds (2,500, over
/// `ITEMS_IN_LINE`) is archived with that MAP's items in a file of its own:
/// the line names it and holds none of them, and the items page back from
/// the archive as the API paged them while the run was live. An export
/// keeps them the same way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_map_of_many_items_is_archived_in_files_of_its_own_and_pages_back_as_shown() {
    let (dir, exported) = (Dir::new("many-items"), Dir::new("many-items-export"));
    let e = archiving(format!("file://{}", dir.path()), Vec::new()).await;
    e.register(&json!({"name": "many", "nodes": [
        {"id": "each", "type": "MAP", "config": {"items": "${ [range(2500)] }",
            "node": {"type": "TRANSFORM", "config": {"output": "${ {twice: (.item * 2)} }"}}}}]}))
        .await;
    let run = e.start_run("many", json!({})).await;
    assert_eq!(e.wait_for_run(run, T).await["status"], "SUCCEEDED");
    let live = all_items(&e, &format!("/v1/runs/{run}/items?node=each")).await;
    assert_eq!(live.len(), 2500);

    // The export: the items in a file beside the line, read back in pages.
    let url = e.url();
    let out = exported.path().to_string();
    let done = tokio::task::spawn_blocking(move || {
        Command::new(BIN)
            .args(["run", "export", "--workflow", "many", "--out", &out, "-o", "json"])
            .env("COMPOSER_URL", url)
            .env_remove("COMPOSER_API_TOKEN")
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    assert!(done.status.success(), "{}", String::from_utf8_lossy(&done.stderr));
    let store = composer_archive::Store::open(exported.path()).unwrap();
    let read = composer_archive::read_all(&store).await.unwrap();
    assert!(read[0].items.is_empty(), "no item in the line");
    let files = &read[0].item_files["each"];
    assert_eq!(files.iter().map(|f| f.items).sum::<u64>(), 2500);
    let (mut back, mut after) = (Vec::new(), -1);
    loop {
        let page = composer_archive::read_items(&store, run, "each", files, after, 700).await.unwrap();
        let Some(last) = page.last().and_then(|t| t.item_index) else { break };
        after = last;
        back.extend(page.into_iter().map(|t| serde_json::to_value(t).unwrap()));
    }
    assert_eq!(back, live, "the export's items, paged");

    // The archive.
    let mut hold = e.db.pool().get().await.unwrap();
    let held = archiving_held(&mut hold).await;
    let (old, month) = moved_to_an_old_month(&e, run).await;
    let (_, view) = e.get(&format!("/v1/runs/{old}")).await;
    let live = all_items(&e, &format!("/v1/runs/{old}/items?node=each")).await;
    let (_, some) = e.get(&format!("/v1/runs/{old}/items?node=each&after=1234&limit=7")).await;
    held.commit().await.unwrap();
    let archived = eventually(T, "the run in the archive", || async {
        let (status, body) = e.get(&format!("/v1/archive/runs/{old}")).await;
        (status == 200).then_some(body)
    })
    .await;
    assert_eq!(archived["run"], view, "the run and its steps");
    assert!(archived.get("items").is_none(), "no item in the answer's run: {:.300}", archived.to_string());
    let file = format!("items/{old}/0-00000.jsonl.gz");
    assert_eq!(archived["item_files"]["each"], json!([{"file": file, "first": 0, "last": 2499, "items": 2500}]));
    assert!(dir.0.join(format!("default/runs/{month}/{file}")).exists());
    assert_eq!(all_items(&e, &format!("/v1/archive/runs/{old}/items?node=each")).await, live, "paged as shown");
    let (status, page) = e.get(&format!("/v1/archive/runs/{old}/items?node=each&after=1234&limit=7")).await;
    assert_eq!((status, &page), (200, &some), "a page from the middle");
    for (query, status) in [("node=nothing", 404), ("node=each&limit=0", 400), ("node=each&after=x", 400)] {
        let (got, body) = e.get(&format!("/v1/archive/runs/{old}/items?{query}")).await;
        assert_eq!(got, status, "{query}: {body}");
    }
    e.stop().await;
}

/// Every item of a MAP, read from `base` (a route that pages them) a
/// thousand at a time.
async fn all_items(e: &Engine, base: &str) -> Vec<Value> {
    let (mut items, mut after) = (Vec::new(), -1);
    loop {
        let (status, page) = e.get(&format!("{base}&limit=1000&after={after}")).await;
        assert_eq!(status, 200, "{page}");
        items.extend(page["items"].as_array().unwrap().iter().cloned());
        match page["next_after"].as_i64() {
            Some(next) => after = next,
            None => return items,
        }
    }
}

/// Every file under `dir`, however deep.
fn objects_under(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        match entry.file_type().unwrap().is_dir() {
            true => found.extend(objects_under(&entry.path())),
            false => found.push(entry.path()),
        }
    }
    found
}

/// A month one of whose runs changed after the archive began to read it
/// (an ended run retried meanwhile) is not dropped: it is written again on
/// the next pass. Once archiving is required, retention without an archive
/// drops nothing. Without an archive the route says none is set.
#[tokio::test]
async fn a_month_that_changed_while_it_was_read_is_kept() {
    let e = Engine::with(EngineOptions { workers: 0, ..Default::default() }).await;
    let (status, body) = e.get(&format!("/v1/archive/runs/{}", Uuid::now_v7())).await;
    assert_eq!(status, 404, "{body}");
    assert!(body["error"]["message"].as_str().unwrap().contains("COMPOSER_ARCHIVE_URL"), "{body}");
    e.register(&json!({"name": "t", "nodes": [{"id": "a", "type": "TRANSFORM", "config": {"output": 1}}]})).await;
    let run = e.start_run("t", json!({})).await;
    assert_eq!(e.wait_for_run(run, T).await["status"], "SUCCEEDED");
    let (old, month) = moved_to_an_old_month(&e, run).await;
    let c = e.db.pool().get().await.unwrap();
    // Once a coordinator with an archive ran here, one without drops nothing
    // unwritten: neither this build's retention nor an older build's call.
    c.execute("INSERT INTO archive_required DEFAULT VALUES", &[]).await.unwrap();
    let none = composer_coord::archive::Archive::default();
    composer_coord::loops::maintain_partitions(&e.db.pool(), 3, 30, &none, &Default::default()).await.unwrap();
    let cutoff = chrono::Utc::now() - chrono::Duration::days(30);
    let expired = composer_store::partitions::drop_before(&c, cutoff).await.unwrap();
    assert_eq!(expired, composer_store::partitions::Expired::default(), "nothing dropped while archiving is required");
    assert_eq!(e.get(&format!("/v1/runs/{old}")).await.0, 200);
    c.execute("DELETE FROM archive_required", &[]).await.unwrap();

    let began = chrono::Utc::now() - chrono::Duration::minutes(1);
    c.execute("UPDATE workflow_runs SET updated_at = now() WHERE id = $1", &[&old]).await.unwrap();
    assert!(!composer_store::partitions::drop_month(&c, &month, began).await.unwrap(), "changed since: kept");
    assert_eq!(e.get(&format!("/v1/runs/{old}")).await.0, 200);
    let later = chrono::Utc::now() + chrono::Duration::seconds(1);
    assert!(composer_store::partitions::drop_month(&c, &month, later).await.unwrap(), "unchanged since: dropped");
    assert_eq!(e.get(&format!("/v1/runs/{old}")).await.0, 404);
    e.stop().await;
}

/// `composer run export` writes the runs a filter matches, live or ended,
/// whole, in the archive's format: read back, each is what the API shows.
/// A page past the route's most, or a time that is not one, is a 400.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_export_writes_live_and_ended_runs_as_the_api_shows_them() {
    let dir = Dir::new("export");
    let e = Engine::with(EngineOptions { workers: 0, ..Default::default() }).await;
    let ended = a_finished_run(&e).await;
    let live = e.start_run("kept", json!({"customer": "c-2"})).await;
    e.register(&json!({"name": "other", "nodes": [{"id": "a", "type": "TRANSFORM", "config": {"output": 1}}]})).await;
    // More than a page (100 runs) of another workflow.
    let mut others = Vec::new();
    for i in 0..130 {
        others.push(e.start_run("other", json!({"i": i})).await);
    }

    let export = |workflow: &str, out: String| {
        let (url, workflow) = (e.url(), workflow.to_string());
        tokio::task::spawn_blocking(move || {
            Command::new(BIN)
                .args(["run", "export", "--workflow", &workflow, "--out", &out, "-o", "json"])
                .env("COMPOSER_URL", url)
                .env_remove("COMPOSER_API_TOKEN")
                .output()
                .unwrap()
        })
    };
    let out = export("kept", dir.path().to_string()).await.unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let summary: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!((summary["runs"].as_u64(), summary["parts"].as_u64()), (Some(2), Some(1)), "{summary}");
    let many = Dir::new("export-pages");
    let out = export("other", many.path().to_string()).await.unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let read = composer_archive::read_all(&composer_archive::Store::open(many.path()).unwrap()).await.unwrap();
    assert_eq!(read.iter().map(|r| r.run.id).collect::<Vec<_>>(), others, "every run once, in order, across pages");

    let store = composer_archive::Store::open(dir.path()).unwrap();
    let runs = composer_archive::read_all(&store).await.unwrap();
    assert_eq!(
        runs.iter().map(|r| r.run.id).collect::<Vec<_>>(),
        vec![ended, live],
        "the workflow's runs, oldest first"
    );
    assert_is_what_was_shown(&runs[0], &shown(&e, ended).await);
    let (_, live_view) = e.get(&format!("/v1/runs/{live}")).await;
    assert_eq!(serde_json::to_value(&runs[1].run).unwrap(), live_view, "a live run as it stood");
    let manifest = composer_archive::manifest(&store).await.unwrap().unwrap();
    assert_eq!(manifest.selection["workflow"], "kept");
    assert_eq!(manifest.payloads.as_deref(), Some("payloads"), "where its large values would be");

    for (query, names) in
        [("limit=101", "limit"), ("from=yesterday", "from"), ("workflow=a%20b", "workflow"), ("sort=id", "sort")]
    {
        let (status, body) = e.get(&format!("/v1/export/runs?{query}")).await;
        assert_eq!(status, 400, "{query}: {body}");
        assert!(body["error"]["message"].as_str().unwrap().contains(names), "{query}: {body}");
    }
    e.stop().await;
}

/// An export of runs whose values are offloaded keeps them as references
/// in its lines and copies their text beside them, a part at a time, from
/// `GET /v1/runs/{id}/values/{object}` (9 MiB: past a part and past what
/// an answer reads whole): read back with those copies, each run is what
/// the API shows, and what `GET /v1/export/runs` gives inline. The value
/// route answers only a reference of the run's own; an object changed
/// after its first part cuts its answer short, and fails the export,
/// which then has no manifest.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_export_copies_large_values_beside_its_lines_and_reads_back_as_shown() {
    let (out, offloaded) = (Dir::new("export-large"), Dir::new("export-offloaded"));
    let mut e = Engine::with(EngineOptions { coordinators: 0, workers: 0, ..Default::default() }).await;
    let mut config = e.coordinator_config();
    config.offload_url = Some(offloaded.path().to_string());
    config.offload_threshold = 1024;
    e.start_coordinator_with(config).await;
    e.register(&json!({"name": "large", "nodes": [
        {"id": "copy", "type": "TRANSFORM", "config": {"output": "${ .input.text }"}},
        {"id": "each", "type": "MAP", "config": {"items": [1, 2, 3],
            "node": {"type": "TRANSFORM", "config": {"output": "${ .input.text[:300000] + (.item | tostring) }"}}}}],
        "edges": [{"from": "copy", "to": "each"}],
        "output": {"first": "${ .nodes.each.output[0] }"}}))
        .await;
    let (small, large) = ("a large value ".repeat(20_000), "a larger value ".repeat(650_000));
    let mut runs = Vec::new();
    for text in [&small, &large] {
        let run = e.start_run("large", json!({"text": text})).await;
        assert_eq!(e.wait_for_run(run, T).await["status"], "SUCCEEDED");
        runs.push(run);
    }
    let export = |out: String| {
        let url = e.url();
        tokio::task::spawn_blocking(move || {
            Command::new(BIN)
                .args(["run", "export", "--workflow", "large", "--out", &out, "-o", "json"])
                .env("COMPOSER_URL", url)
                .env_remove("COMPOSER_API_TOKEN")
                .output()
                .unwrap()
        })
    };
    let done = export(out.path().to_string()).await.unwrap();
    assert!(done.status.success(), "{}", String::from_utf8_lossy(&done.stderr));
    let store = composer_archive::Store::open(out.path()).unwrap();
    let manifest = composer_archive::manifest(&store).await.unwrap().unwrap();
    assert_eq!(manifest.payloads.as_deref(), Some("payloads"));
    let mut read = composer_archive::read_all(&store).await.unwrap();
    assert_eq!(read.iter().map(|r| r.run.id).collect::<Vec<_>>(), runs);
    let copies = composer_coord::archive::Archive::payloads_in(&store);
    let (_, inline) = e.get("/v1/export/runs?workflow=large").await;
    for (i, record) in read.iter_mut().enumerate() {
        let line = serde_json::to_string(&*record).unwrap();
        assert!(line.len() < 16 << 10, "a line of {} bytes", line.len());
        for value in composer_coord::payloads::archived_slots(record) {
            composer_coord::payloads::resolve(&copies, value).await.unwrap();
        }
        let (_, view) = e.get(&format!("/v1/runs/{}", record.run.id)).await;
        let (_, items) = e.get(&format!("/v1/runs/{}/items?node=each&limit=10", record.run.id)).await;
        let record = serde_json::to_value(&*record).unwrap();
        assert_eq!(record["run"], view, "the run and its steps, values and all");
        assert_eq!(record["items"]["each"], items["items"], "its MAP's items");
        assert_eq!(inline["runs"][i], record, "the export's page with its values inline");
    }
    let (input, output) = (serde_json::to_vec(&json!({"text": large})).unwrap(), serde_json::to_vec(&large).unwrap());
    let copies: Vec<Vec<u8>> = objects_under(&out.0.join("payloads"))
        .into_iter()
        .filter(|c| std::fs::metadata(c).unwrap().len() > 9 << 20)
        .map(|c| std::fs::read(c).unwrap())
        .collect();
    assert!(copies.contains(&input) && copies.contains(&output), "copies of the 9 MiB input and output");
    // Again into the same place: the copies there that are the values are kept.
    let written = |dir: &std::path::Path| -> Vec<(std::path::PathBuf, std::time::SystemTime)> {
        let copies = objects_under(dir).into_iter();
        copies.map(|c| (c.clone(), std::fs::metadata(&c).unwrap().modified().unwrap())).collect()
    };
    let before = written(&out.0.join("payloads"));
    let again = export(out.path().to_string()).await.unwrap();
    assert!(again.status.success(), "{}", String::from_utf8_lossy(&again.stderr));
    assert_eq!(written(&out.0.join("payloads")), before, "no copy written again");
    // The value route: a reference of the run's own, or a 4xx.
    let (_, page) = e.get("/v1/export/runs?workflow=large&values=references").await;
    /// A reference's run, object, SHA-256 and size.
    type Named = (String, String, String, Value);
    let reference = |i: usize| -> Named {
        let r = page["runs"][i]["run"]["input"]["$composer_offloaded"].clone();
        let s = |k: &str| r[k].as_str().unwrap().to_string();
        (s("run"), s("object"), s("sha256"), r["bytes"].clone())
    };
    let value_url = |(run, object, sha, bytes): &Named| {
        format!("{}/v1/runs/{run}/values/{object}?sha256={sha}&bytes={bytes}", e.url())
    };
    let (small_ref, large_ref) = (reference(0), reference(1));
    for (r, text) in [(&small_ref, &small), (&large_ref, &large)] {
        let answer = reqwest::get(value_url(r)).await.unwrap();
        assert_eq!(answer.status(), 200);
        let input: Value = serde_json::from_slice(&answer.bytes().await.unwrap()).unwrap();
        assert_eq!(input, json!({"text": text}));
    }
    let with = |change: &dyn Fn(&mut Named)| {
        let mut r = small_ref.clone();
        change(&mut r);
        value_url(&r)
    };
    let (large_run, other) = (large_ref.0.clone(), Uuid::now_v7().to_string());
    for (url, status) in [
        (with(&|r| r.2 = "0".repeat(64)), 404),
        (with(&|r| r.3 = json!(1)), 404),
        (with(&|r| r.0 = large_run.clone()), 404),
        (with(&|r| r.0 = other.clone()), 404),
        (with(&|r| r.2 = "ABC".into()), 400),
        (with(&|r| r.3 = json!(2_000_000_000_u64)), 400),
        (with(&|r| r.3 = json!(-1)), 400),
        (with(&|r| r.1 = "not-an-id".into()), 400),
    ] {
        let answer = reqwest::get(&url).await.unwrap();
        let code = answer.status().as_u16();
        let body: Value = answer.json().await.unwrap();
        assert_eq!(code, status, "{url}: {body:.300}");
        assert!(body["error"]["message"].is_string(), "{url}: {body}");
    }
    // Past 8 MiB, a SHA-256 not the object's is found as the answer ends.
    let mut wrong = large_ref.clone();
    wrong.2 = "0".repeat(64);
    let answer = reqwest::get(value_url(&wrong)).await.unwrap();
    assert_eq!(answer.status(), 200);
    assert!(answer.bytes().await.is_err(), "a value not the reference's was read whole");
    // Changed past its first part, the same size: the answer is cut short,
    // and an export fails, leaving no manifest.
    let original = objects_under(&offloaded.0)
        .into_iter()
        .find(|o| o.file_stem().is_some_and(|s| s == large_ref.1.as_str()))
        .unwrap();
    let mut changed = std::fs::read(&original).unwrap();
    let at = changed.len() - 10;
    changed[at] = b'X';
    std::fs::write(&original, changed).unwrap();
    let answer = reqwest::get(value_url(&large_ref)).await.unwrap();
    assert_eq!(answer.status(), 200);
    assert!(answer.bytes().await.is_err(), "a changed value was read whole");
    let answer = reqwest::get(format!("{}/v1/export/runs?workflow=large", e.url())).await.unwrap();
    assert_eq!(answer.status(), 200);
    assert!(answer.bytes().await.is_err(), "a page with a changed value was read whole");
    let again = Dir::new("export-changed");
    let failed = export(again.path().to_string()).await.unwrap();
    let said = String::from_utf8_lossy(&failed.stderr);
    assert!(!failed.status.success() && said.contains(&large_ref.1), "{said}");
    assert!(!again.0.join("manifest.json").exists(), "a failed export has no manifest");
    e.stop().await;
}

/// The same archive and export on S3: a real S3 protocol server (`s3s-fs`)
/// checking every request's signature. A wrong secret is an error that
/// names the storage, never the secret, and writes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn archive_and_export_work_on_s3_storage() {
    let s3 = composer_testkit::S3Server::start("runs").await;
    let e = archiving("s3://runs/archive".into(), s3.options()).await;

    let run = a_finished_run(&e).await;
    let mut hold = e.db.pool().get().await.unwrap();
    let held = archiving_held(&mut hold).await;
    let (old, month) = moved_to_an_old_month(&e, run).await;
    let before = shown(&e, old).await;
    held.commit().await.unwrap();
    let archived = eventually(T, "the run in the archive", || async {
        let (status, body) = e.get(&format!("/v1/archive/runs/{old}")).await;
        (status == 200).then_some(body)
    })
    .await;
    assert_is_what_was_shown(&serde_json::from_value(archived).unwrap(), &before);
    let manifest = s3.bucket_dir("runs").join(format!("archive/default/runs/{month}/manifest.json"));
    assert!(manifest.exists(), "the manifest is an object of the bucket: {}", manifest.display());

    // `run export` to the bucket, with the credentials from AWS_*.
    let export = |secret: String| {
        let (url, options) = (e.url(), s3.options());
        tokio::task::spawn_blocking(move || {
            let mut cmd = Command::new(BIN);
            cmd.args(["run", "export", "--workflow", "kept", "--out", "s3://runs/exports/one", "-o", "json"])
                .env("COMPOSER_URL", url)
                .env_remove("COMPOSER_API_TOKEN");
            for (k, v) in options {
                cmd.env(&k, if k == "AWS_SECRET_ACCESS_KEY" { secret.clone() } else { v });
            }
            cmd.output().unwrap()
        })
    };
    let live = e.start_run("kept", json!({"customer": "c-3"})).await;
    let wrong = export("not-the-secret".into()).await.unwrap();
    let said = String::from_utf8_lossy(&wrong.stderr);
    assert!(!wrong.status.success(), "a wrong secret fails the export");
    assert!(said.contains("object storage") && !said.contains("not-the-secret"), "{said}");
    assert!(!s3.bucket_dir("runs").join("exports/one").exists(), "and writes nothing");
    let out = export(s3.secret_key.clone()).await.unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let store = composer_archive::Store::open_with("s3://runs/exports/one", &s3.options()).unwrap();
    let runs = composer_archive::read_all(&store).await.unwrap();
    assert_eq!(
        runs.iter().map(|r| r.run.id).collect::<Vec<_>>(),
        vec![live],
        "the live run (the other went with its month)"
    );
    e.stop().await;
}

/// An archive that cannot be written (here: a wrong secret) keeps the
/// month whole, pass after pass, and counts each failure.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_month_the_archive_cannot_take_is_kept_and_counted() {
    let s3 = composer_testkit::S3Server::start("runs").await;
    let mut options = s3.options();
    options.push(("AWS_SECRET_ACCESS_KEY".into(), "not-the-secret".into()));
    let e = archiving("s3://runs/archive".into(), options).await;
    e.register(&json!({"name": "t", "nodes": [{"id": "a", "type": "TRANSFORM", "config": {"output": 1}}]})).await;
    let run = e.start_run("t", json!({})).await;
    assert_eq!(e.wait_for_run(run, T).await["status"], "SUCCEEDED");
    let (old, _) = moved_to_an_old_month(&e, run).await;
    let failures = || async {
        let metrics = reqwest::get(format!("{}/metrics", e.url())).await.unwrap().text().await.unwrap();
        metrics.lines().find_map(|l| l.strip_prefix("composer_archive_failures_total ")?.parse::<f64>().ok())
    };
    eventually(T, "two archiving failures counted", || async { failures().await.filter(|n| *n >= 2.0) }).await;
    assert_eq!(e.get(&format!("/v1/runs/{old}")).await.0, 200, "the month is kept");
    assert!(!s3.bucket_dir("runs").join("archive").exists(), "and nothing was written");
    e.stop().await;
}
