//! The client commands as a person or a script uses them: output formats,
//! exit statuses, input from files and stdin, whole histories.

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::Duration;

use composer_testkit::{Engine, EngineOptions, FakeHttp};
use serde_json::{json, Value};

const BIN: &str = env!("CARGO_BIN_EXE_composer");

pub(crate) struct Out {
    pub(crate) code: i32,
    pub(crate) stdout: String,
    pub(crate) stderr: String,
}

/// Runs the CLI against `url` off the async runtime (the coordinator under
/// test shares it).
pub(crate) async fn cli(url: &str, args: &[&str], stdin: Option<&str>) -> Out {
    let (url, args, stdin) =
        (url.to_string(), args.iter().map(|a| a.to_string()).collect::<Vec<_>>(), stdin.map(str::to_string));
    tokio::task::spawn_blocking(move || {
        let mut cmd = Command::new(BIN);
        cmd.args(&args).env("COMPOSER_URL", &url).env("COMPOSER_LOG", "warn").env_remove("COMPOSER_API_TOKEN");
        cmd.stdin(if stdin.is_some() { Stdio::piped() } else { Stdio::null() })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().unwrap();
        if let Some(text) = stdin {
            child.stdin.take().unwrap().write_all(text.as_bytes()).unwrap();
        }
        let out = child.wait_with_output().unwrap();
        Out {
            code: out.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    })
    .await
    .unwrap()
}

#[tokio::test]
async fn help_and_version_answer_with_status_0_and_a_bad_flag_with_2() {
    let version = cli("http://127.0.0.1:9", &["--version"], None).await;
    assert_eq!((version.code, version.stdout.starts_with("composer ")), (0, true), "{}", version.stdout);
    let help = cli("http://127.0.0.1:9", &["run", "--help"], None).await;
    assert_eq!(help.code, 0, "{}", help.stderr);
    assert!(help.stdout.contains("Usage"), "{}", help.stdout);
    let bad = cli("http://127.0.0.1:9", &["run", "--no-such-flag"], None).await;
    assert_eq!(bad.code, 2, "{}", bad.stderr);
    let cancel = cli("http://127.0.0.1:9", &["run", "cancel", "--help"], None).await;
    assert!(
        cancel.stdout.contains("queued, running or paused"),
        "paused and queued runs can be cancelled too: {}",
        cancel.stdout
    );
    for role in ["worker", "dev"] {
        let help = cli("http://127.0.0.1:9", &[role, "--help"], None).await;
        let listen = help.stdout.lines().skip_while(|l| !l.contains("--worker-listen")).nth(1).unwrap_or_default();
        assert!(listen.contains("/metrics") && !help.stdout.contains("XREADGROUP"), "{role}: {}", help.stdout);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_outcome_has_its_exit_status() {
    let e = Engine::start().await;
    let http = FakeHttp::start().await;
    let url = e.url();
    e.register(&json!({"name": "ok", "nodes": [{"id": "t", "type": "TRANSFORM", "config": {"output": 1}}]})).await;
    e.register(&json!({"name": "fails", "nodes": [
        {"id": "call", "type": "HTTP", "retry": {"max_attempts": 1}, "config": {"url": http.url("/bad/x")}}]}))
        .await;
    e.register(&json!({"name": "waits", "nodes": [
        {"id": "w", "type": "WAIT_FOR_EVENT", "config": {"event": "never", "key": "k"}}]}))
        .await;

    assert_eq!(cli(&url, &["run", "start", "ok", "--wait", "-o", "json"], None).await.code, 0);
    let failed = cli(&url, &["run", "start", "fails", "--wait", "-o", "json"], None).await;
    assert_eq!(failed.code, 1, "{}", failed.stderr);
    let slow = cli(&url, &["run", "start", "waits", "--wait", "--timeout", "1500ms"], None).await;
    assert_eq!(slow.code, 5, "{}", slow.stderr);
    assert!(slow.stderr.contains("running: w waiting"), "progress on stderr: {}", slow.stderr);
    let missing = cli(&url, &["run", "get", "01a2e0a0-0000-7000-8000-000000000000"], None).await;
    assert_eq!(missing.code, 3, "{}", missing.stderr);
    let no_workflow = cli(&url, &["run", "start", "nowhere"], None).await;
    assert_eq!(no_workflow.code, 3, "{}", no_workflow.stderr);
    let unreachable = cli("http://127.0.0.1:9", &["run", "list"], None).await;
    assert_eq!(unreachable.code, 4, "{}", unreachable.stderr);
    let said = &unreachable.stderr;
    assert_eq!(said.lines().count(), 1, "{said}");
    assert!(said.contains("cannot reach the coordinator at http://127.0.0.1:9"), "{said}");
    assert_eq!(said.matches("error sending request").count(), 1, "each cause once: {said}");
    assert_eq!(cli(&url, &["run", "list", "--bogus"], None).await.code, 2);
    let bad_input = cli(&url, &["run", "start", "ok", "--input", "{not json"], None).await;
    assert_eq!(bad_input.code, 2, "{}", bad_input.stderr);
    assert!(bad_input.stderr.contains("--input"), "{}", bad_input.stderr);
    let refused = cli(&url, &["run", "list", "--status", "SIDEWAYS"], None).await;
    assert_eq!(refused.code, 2, "a request the server refuses as invalid: {}", refused.stderr);
    e.stop().await;
}

/// Issue 51's small CLI items: `--timeout` means nothing without `--wait`,
/// `run retry` can wait for the end, `--input @-` reads standard input, and
/// the refusal to rerun a run that succeeded names the CLI's flag.
#[tokio::test]
async fn run_retry_waits_timeout_needs_wait_input_comes_from_stdin_and_rerun_names_its_flag() {
    let e = Engine::start().await;
    let http = FakeHttp::start().await;
    let url = e.url();
    e.register(
        &json!({"name": "echo", "nodes": [{"id": "t", "type": "TRANSFORM", "config": {"output": "${ .input.v }"}}]}),
    )
    .await;
    // Fails its first attempt only: a retry of the run then succeeds.
    e.register(&json!({"name": "once", "nodes": [
        {"id": "call", "type": "HTTP", "retry": {"max_attempts": 1}, "config": {"url": http.url("/flaky/1/x")}}]}))
        .await;

    let lone = cli(&url, &["run", "start", "echo", "--timeout", "5s"], None).await;
    assert_eq!(lone.code, 2, "{}", lone.stderr);
    assert!(lone.stderr.contains("--wait"), "{}", lone.stderr);

    let piped =
        cli(&url, &["run", "start", "echo", "--input", "@-", "--wait", "-o", "json"], Some(r#"{"v": 42}"#)).await;
    assert_eq!(piped.code, 0, "{}", piped.stderr);
    let run: serde_json::Value = serde_json::from_str(&piped.stdout).unwrap();
    assert_eq!(run["output"], json!({"t": 42}), "{run}");

    let failed = cli(&url, &["run", "start", "once", "--wait", "-o", "json"], None).await;
    assert_eq!(failed.code, 1, "{}", failed.stderr);
    let id = serde_json::from_str::<serde_json::Value>(&failed.stdout).unwrap()["id"].as_str().unwrap().to_string();
    let retried = cli(&url, &["run", "retry", &id, "--wait", "--timeout", "60s", "-o", "json"], None).await;
    assert_eq!(retried.code, 0, "{}", retried.stderr);
    assert_eq!(serde_json::from_str::<serde_json::Value>(&retried.stdout).unwrap()["status"], "SUCCEEDED");

    let again = cli(&url, &["run", "rerun", &id, "--from", "call"], None).await;
    assert_ne!(again.code, 0, "{}", again.stderr);
    assert!(again.stderr.contains("--allow-completed"), "{}", again.stderr);
    e.stop().await;
}

/// Pointed at a server that is not a coordinator (port 8080 is often
/// another's), the CLI says so and prints nothing of its answer: exit 2,
/// the URL is wrong. A 5xx without the header (a proxy in front of a
/// coordinator that is down) stays an outage.
#[tokio::test]
async fn another_server_is_not_taken_for_a_coordinator() {
    let other = FakeHttp::start().await;
    // `/ok/...` answers any path under it with JSON and 200; `/nothing`
    // with a 404 that is not the API's.
    for base in [other.url("/ok/x"), other.url("/nothing")] {
        let runs = [
            vec!["run", "list"],
            vec!["run", "get", "01a2e0a0-0000-7000-8000-000000000000"],
            vec!["workflow", "apply", "-f", "-"],
        ];
        for args in runs {
            let spec = json!({"name": "w", "nodes": [{"id": "t", "type": "TRANSFORM", "config": {"output": 1}}]});
            let stdin = (args[0] == "workflow").then(|| spec.to_string());
            let out = cli(&base, &args, stdin.as_deref()).await;
            assert_eq!((out.code, out.stdout.as_str()), (2, ""), "{args:?} at {base}: {}", out.stderr);
            let said = format!(
                "the server at {base} is not a Composer coordinator (its answer, HTTP {}, has no composer-version \
                 header); set COMPOSER_URL or --url to a coordinator",
                if base.ends_with("/ok/x") { 200 } else { 404 }
            );
            assert_eq!(out.stderr.trim(), format!("error: {said}"), "{args:?}");
        }
    }
    assert_eq!(other.calls_prefix("/ok/x/v1/"), 3, "each asked, and answered: {:?}", other.all());
    let down = cli(&other.url("/fail"), &["run", "list"], None).await;
    assert_eq!(down.code, 4, "{}", down.stderr);
}

/// A URL without http:// or https:// is a usage error, named by where it
/// came from, refused before any request (not "cannot reach").
#[tokio::test]
async fn a_url_without_a_scheme_is_a_usage_error_naming_its_variable_or_flag() {
    let other = FakeHttp::start().await;
    let bare = other.url("/ok/x").trim_start_matches("http://").to_string();
    let from_env = cli(&bare, &["run", "list"], None).await;
    assert_eq!(from_env.code, 2, "{}", from_env.stderr);
    for part in [bare.as_str(), "http:// or https://", "the environment variable COMPOSER_URL"] {
        assert!(from_env.stderr.contains(part), "{part}: {}", from_env.stderr);
    }
    assert!(!from_env.stderr.contains("cannot reach"), "{}", from_env.stderr);
    // On the command line, the flag's value is the one refused, not the
    // variable's (set here to a good URL).
    let from_flag = cli(&other.url("/ok/x"), &["run", "get", "x", "--url", "127.0.0.1:8080"], None).await;
    assert_eq!(from_flag.code, 2, "{}", from_flag.stderr);
    assert!(from_flag.stderr.contains("'127.0.0.1:8080' for '--url <URL>'"), "{}", from_flag.stderr);
    assert!(!from_flag.stderr.contains("COMPOSER_URL"), "{}", from_flag.stderr);
    assert_eq!(other.all().len(), 0, "no request went out");
}

/// A schedule's or a webhook's file given to `workflow apply` is refused
/// before anything is sent, naming the command it needs (the server said only
/// `catchup_window: unknown field`).
#[tokio::test]
async fn applying_a_schedule_or_webhook_file_as_a_workflow_names_the_command_it_needs() {
    let other = FakeHttp::start().await;
    let examples = concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples");
    for (file, command) in [
        (format!("{examples}/schedules/nightly_report.json"), "composer schedule create -f"),
        (format!("{examples}/webhooks/stripe.json"), "composer webhook create -f"),
    ] {
        let out = cli(&other.url("/ok/x"), &["workflow", "apply", "-f", &file], None).await;
        assert_eq!(out.code, 2, "{file}: {}", out.stderr);
        assert!(out.stderr.contains("not a workflow definition") && out.stderr.contains(command), "{}", out.stderr);
    }
    assert_eq!(other.all().len(), 0, "no request went out");
}

/// Every answer of a coordinator says it is one: the API's, the UI's, the
/// operator's, a refusal and the fallback's 404.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_answer_of_a_coordinator_carries_its_version() {
    let e = Engine::start().await;
    let http = reqwest::Client::new();
    let get = |path: &'static str| {
        let (http, url) = (http.clone(), e.url());
        async move { http.get(format!("{url}{path}")).send().await.unwrap() }
    };
    for (path, status) in
        [("/v1/runs", 200), ("/healthz", 200), ("/metrics", 200), ("/ui", 200), ("/no/such/path", 404)]
    {
        let resp = get(path).await;
        assert_eq!(resp.status().as_u16(), status, "{path}");
        let version = resp.headers().get(composer_client::VERSION_HEADER).map(|v| v.to_str().unwrap().to_string());
        assert_eq!(version.as_deref(), Some(env!("CARGO_PKG_VERSION")), "{path}");
    }
    let other_host = http.get(format!("{}/v1/runs", e.url())).header("host", "elsewhere.example").send().await.unwrap();
    assert_eq!(other_host.status().as_u16(), 421);
    assert!(other_host.headers().contains_key(composer_client::VERSION_HEADER), "a refusal too");
    let not_allowed = http.delete(format!("{}/v1/runs", e.url())).send().await.unwrap();
    assert_eq!(not_allowed.status().as_u16(), 405);
    assert!(not_allowed.headers().contains_key(composer_client::VERSION_HEADER), "the method fallback too");
    e.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outputs_inputs_and_whole_histories() {
    let e = Engine::start().await;
    let url = e.url();
    // A definition from stdin, in YAML.
    let yaml = "name: many\nnodes:\n  - id: each\n    type: MAP\n    config:\n      items: \"${ [range(1100)] }\"\n      node: {type: TRANSFORM, config: {output: \"${ .item }\"}}\n";
    let applied = cli(&url, &["workflow", "apply", "-f", "-", "-o", "json"], Some(yaml)).await;
    assert_eq!(applied.code, 0, "{}", applied.stderr);
    assert_eq!(serde_json::from_str::<Value>(&applied.stdout).unwrap()["name"], "many");

    // Input from a file, and an idempotency key that returns the same run.
    let dir = composer_embedded::temp_dir("cli-input").unwrap();
    let input = dir.join("input.json");
    std::fs::write(&input, r#"{"from": "file"}"#).unwrap();
    let at_file = format!("@{}", input.display());
    let start = |key: &'static str| {
        let (url, at_file) = (url.clone(), at_file.clone());
        async move {
            cli(&url, &["run", "start", "many", "--input", &at_file, "--idempotency-key", key, "-o", "json"], None)
                .await
        }
    };
    let first: Value = serde_json::from_str(&start("k-1").await.stdout).unwrap();
    let again: Value = serde_json::from_str(&start("k-1").await.stdout).unwrap();
    assert_eq!(first["id"], again["id"], "the same key, the same run");
    let id: uuid::Uuid = first["id"].as_str().unwrap().parse().unwrap();
    let run = e.wait_for_run(id, Duration::from_secs(60)).await;
    assert_eq!(run["input"], json!({"from": "file"}));

    // The whole history, past the API's page of 1,000, one event per line.
    let events = cli(&url, &["run", "events", &id.to_string(), "-o", "jsonl"], None).await;
    assert_eq!(events.code, 0, "{}", events.stderr);
    let lines: Vec<Value> = events.stdout.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert!(lines.len() > 1100, "{} events", lines.len());
    let seqs: Vec<i64> = lines.iter().map(|l| l["seq"].as_i64().unwrap()).collect();
    assert!(seqs.windows(2).all(|w| w[0] < w[1]), "in order, no page twice");

    let table = cli(&url, &["run", "list", "-o", "table"], None).await;
    let header = table.stdout.lines().next().unwrap_or_default().to_string();
    assert!(header.starts_with("ID") && header.contains("WORKFLOW") && header.contains("STATUS"), "{header}");
    assert!(table.stdout.contains("SUCCEEDED"), "{}", table.stdout);
    let jsonl = cli(&url, &["run", "list", "-o", "jsonl"], None).await;
    assert_eq!(jsonl.stdout.lines().count(), 1);
    // One filter, the same flags for a list and a bulk action.
    let tagged = cli(&url, &["run", "start", "many", "--tag", "team=a", "-o", "json"], None).await;
    let tagged: Value = serde_json::from_str(&tagged.stdout).unwrap();
    e.wait_for_run(tagged["id"].as_str().unwrap().parse().unwrap(), Duration::from_secs(60)).await;
    let filter =
        ["--workflow", "many", "--status", "succeeded", "--tag", "team=a", "--created-after", "2000-01-01T00:00:00Z"];
    let listed = cli(&url, &[&["run", "list", "-o", "jsonl"][..], &filter[..]].concat(), None).await;
    assert_eq!(listed.code, 0, "{}", listed.stderr);
    let ids: Vec<Value> =
        listed.stdout.lines().map(|l| serde_json::from_str::<Value>(l).unwrap()["id"].clone()).collect();
    assert_eq!(ids, vec![tagged["id"].clone()], "only the tagged run");
    let counted =
        cli(&url, &[&["run", "bulk", "--action", "cancel", "--dry-run", "-o", "json"][..], &filter[..]].concat(), None)
            .await;
    assert_eq!(counted.code, 0, "{}", counted.stderr);
    assert_eq!(serde_json::from_str::<Value>(&counted.stdout).unwrap()["matched"], 1, "{}", counted.stdout);
    let piped = cli(&url, &["run", "get", &id.to_string()], None).await;
    assert!(serde_json::from_str::<Value>(&piped.stdout).is_ok(), "JSON when not on a terminal");

    let completions = cli(&url, &["completions", "bash"], None).await;
    assert!(completions.code == 0 && completions.stdout.contains("_composer"), "{}", completions.stderr);
    let _ = std::fs::remove_dir_all(dir);
    e.stop().await;
}

/// `composer bench --ab` runs both binaries (here this one twice) as
/// processes on one PostgreSQL and Redis and prints both sides' medians.
#[tokio::test]
async fn bench_ab_runs_two_binaries_alternately_and_prints_both_sides() {
    let args = [
        "bench",
        "--ab",
        BIN,
        "--ab-rounds",
        "1",
        "--steps",
        "2",
        "--warmup",
        "1",
        "--latency-runs",
        "3",
        "--runs",
        "20",
        "--concurrency",
        "4",
        "--json",
    ];
    let out = cli("http://127.0.0.1:9", &args, None).await;
    assert_eq!(out.code, 0, "{}", out.stderr);
    let line: Value = serde_json::from_str(out.stdout.trim()).expect(&out.stdout);
    let ab = &line["ab"];
    for side in ["other", "this"] {
        let runs = ab[side]["runs"].as_array().expect("runs of each side");
        assert_eq!(runs.len(), 1, "{side}: one round");
        assert!(runs[0]["throughput"]["steps_per_s"].as_f64().unwrap() > 0.0, "{side}");
        assert!(runs[0]["postgres_per_step"]["cpu_ms"].as_f64().is_some(), "{side}: {}", runs[0]);
        // The worker's /metrics are read too: its stages are there.
        assert!(runs[0]["step_stages_mean_ms"]["lease_to_start"].as_f64().is_some(), "{side}: {}", runs[0]);
    }
    let steps = &ab["medians"]["steps/s"];
    assert!(steps["ratio"].as_f64().is_some(), "{steps}");
    let bad = cli("http://127.0.0.1:9", &["bench", "--ab", "/nonexistent/composer"], None).await;
    assert_eq!(bad.code, 1, "{}", bad.stderr);
    assert!(bad.stderr.contains("cannot run /nonexistent/composer"), "{}", bad.stderr);
    // More workflows in flight than a worker may have slots: refused, not a hang.
    let bad = cli("http://127.0.0.1:9", &["bench", "--concurrency", "10001"], None).await;
    assert_eq!(bad.code, 1, "{}", bad.stderr);
    assert!(bad.stderr.contains("--concurrency must be between 1 and 10000"), "{}", bad.stderr);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limits_are_set_listed_and_deleted_and_simulate_says_it_leaves_them_out() {
    let e = Engine::start().await;
    let url = e.url();
    let set =
        cli(&url, &["limit", "set", "stripe:acct/1", "--rate", "25/1s", "--burst", "50", "-o", "json"], None).await;
    assert_eq!(set.code, 0, "{}", set.stderr);
    let limit: Value = serde_json::from_str(&set.stdout).unwrap();
    assert_eq!(
        (limit["key"].clone(), limit["rate"].clone(), limit["burst"].clone()),
        (json!("stripe:acct/1"), json!("25/1s"), json!(50))
    );
    assert_eq!(limit["tokens"], 50.0, "a new bucket starts full");
    let list = cli(&url, &["limit", "list", "-o", "table"], None).await;
    assert_eq!(list.code, 0, "{}", list.stderr);
    assert!(
        list.stdout.starts_with("KEY") && list.stdout.contains("stripe:acct/1") && list.stdout.contains("25/1s"),
        "{}",
        list.stdout
    );
    let bad = cli(&url, &["limit", "set", "k", "--rate", "fast"], None).await;
    assert_eq!(bad.code, 2, "{}", bad.stderr);
    assert!(bad.stderr.contains("rate"), "{}", bad.stderr);
    assert_eq!(cli(&url, &["limit", "delete", "stripe:acct/1"], None).await.code, 0);
    assert_eq!(cli(&url, &["limit", "get", "stripe:acct/1"], None).await.code, 3, "gone");

    let spec = json!({"name": "charge", "nodes": [{"id": "pay", "type": "HTTP", "config": {"url": "http://h/pay"},
        "limits": [{"key": "stripe:${ .input.account }", "rate": "25/1s"}]}]})
    .to_string();
    let sim = cli(&url, &["workflow", "simulate", "-f", "-", "--input", r#"{"account": "a1"}"#], Some(&spec)).await;
    assert_eq!(sim.code, 0, "{}", sim.stderr);
    assert!(sim.stdout.contains("limits: stripe:a1 (not simulated)"), "{}", sim.stdout);
    assert!(sim.stdout.contains("note: limits are not simulated"), "{}", sim.stdout);
    e.stop().await;
}

/// A task of the `py` queue, leased by `worker` through the task API.
async fn lease(e: &Engine, worker: &str) -> Value {
    let poll = json!({"worker_id": worker, "queues": ["py"], "max": 1, "wait": "10s"});
    let (status, body) = e.post("/v1/tasks/poll", &poll).await;
    assert_eq!((status, body["tasks"].as_array().map(Vec::len)), (200, Some(1)), "{body}");
    body["tasks"][0].clone()
}

/// `worker` reports on `task`: `action` is logs, complete or fail, `body` its own fields.
async fn report(e: &Engine, worker: &str, task: &Value, action: &str, mut body: Value) {
    body["worker_id"] = json!(worker);
    body["run_id"] = task["run_id"].clone();
    body["attempt"] = task["attempt"].clone();
    let (status, answer) = e.post(&format!("/v1/tasks/{}/{action}", task["id"].as_str().unwrap()), &body).await;
    assert_eq!(status, 200, "{action}: {answer}");
}

fn texts(lines: impl IntoIterator<Item = Value>) -> Vec<String> {
    lines.into_iter().map(|l| l["line"].as_str().unwrap().to_string()).collect()
}

fn jsonl(out: &Out) -> Vec<Value> {
    out.stdout.lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

/// `run logs`: a step's lines, of its latest attempt or the one asked
/// for; an attempt or a node the run does not have is named in the error;
/// `--follow` prints the lines sent meanwhile, each once, across pages,
/// until the attempt ends, and exits as it ended; a MAP item's lines too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_logs_prints_a_steps_lines_picks_an_attempt_and_follows_until_it_ends() {
    let e = Engine::with(EngineOptions { workers: 0, lease_ttl: Duration::from_secs(60), ..Default::default() }).await;
    let url = e.url();
    e.register(&json!({"name": "logged", "nodes": [
        {"id": "step", "type": "resize", "queue": "py", "retry": {"max_attempts": 2, "initial_backoff": "10ms"}},
        {"id": "tidy", "type": "TRANSFORM", "config": {"output": 1}}], "edges": [{"from": "step", "to": "tidy"}]}))
        .await;
    let run = e.start_run("logged", json!({})).await.to_string();
    let first = lease(&e, "w1").await;
    report(&e, "w1", &first, "logs", json!({"lines": ["one", "two \u{1b}[31mred"]})).await;
    report(&e, "w1", &first, "fail", json!({"error": "flaky"})).await;
    let second = lease(&e, "w2").await;
    report(&e, "w2", &second, "logs", json!({"lines": ["second starts"]})).await;

    let latest = cli(&url, &["run", "logs", &run, "step", "-o", "table"], None).await;
    assert_eq!((latest.code, latest.stdout.lines().count()), (0, 1), "the latest attempt: {}", latest.stderr);
    assert!(latest.stdout.trim_end().ends_with("Z  w2  second starts"), "when, who, what: {}", latest.stdout);
    let picked = cli(&url, &["run", "logs", &run, "step", "--attempt", "1", "-o", "table"], None).await;
    let said = &picked.stdout;
    assert!(said.contains("w1  two \\u{1b}[31mred") && !said.contains('\u{1b}'), "spelled out: {said}");
    let whole = cli(&url, &["run", "logs", &run, "step", "--attempt", "1", "-o", "json"], None).await;
    let whole: Value = serde_json::from_str(&whole.stdout).unwrap();
    assert_eq!(texts(whole["lines"].as_array().unwrap().clone()), ["one", "two \u{1b}[31mred"]);
    assert_eq!(whole["attempts"], json!([{"attempt": 1, "lines": 2}, {"attempt": 2, "lines": 1}]));
    let none = cli(&url, &["run", "logs", &run, "step", "--attempt", "3"], None).await;
    assert_eq!(none.code, 3, "{}", none.stderr);
    assert!(none.stderr.contains("no attempt 3: it has had 2 attempts"), "{}", none.stderr);
    let nope = cli(&url, &["run", "logs", &run, "nope"], None).await;
    assert_eq!(nope.code, 3, "{}", nope.stderr);
    assert!(nope.stderr.contains("no node \"nope\"; its nodes: step, tidy"), "{}", nope.stderr);

    // Followed: the lines sent meanwhile (more than a page), each once, to the end.
    let follow = {
        let (url, run) = (url.clone(), run.clone());
        tokio::spawn(async move { cli(&url, &["run", "logs", &run, "step", "-f", "-o", "jsonl"], None).await })
    };
    // A fixed time: the follower (a process whose output is read only at
    // its end) must be polling before the lines come, or it would read them
    // at its start and prove nothing about following.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let sent: Vec<String> = (0..1100).map(|i| format!("line {i}")).collect();
    for chunk in sent.chunks(100) {
        report(&e, "w2", &second, "logs", json!({ "lines": chunk })).await;
    }
    // A window in which the follower must not end: the attempt still runs.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(!follow.is_finished(), "it follows while the attempt runs");
    report(&e, "w2", &second, "logs", json!({"lines": ["last"]})).await;
    report(&e, "w2", &second, "complete", json!({"output": {}})).await;
    let followed = tokio::time::timeout(Duration::from_secs(30), follow).await.unwrap().unwrap();
    assert_eq!(followed.code, 0, "{}", followed.stderr);
    let expected: Vec<String> =
        [vec!["second starts".to_string()], sent, vec!["last".to_string()]].into_iter().flatten().collect();
    assert_eq!(texts(jsonl(&followed)), expected, "every line once, in order");
    // A failed attempt: its lines, and the status of a failure.
    let failed = cli(&url, &["run", "logs", &run, "step", "--attempt", "1", "-f", "-o", "jsonl"], None).await;
    assert_eq!((failed.code, texts(jsonl(&failed))), (1, vec!["one".into(), "two \u{1b}[31mred".into()]));

    // A MAP item's lines, and an item it does not have.
    e.register(&json!({"name": "mapped", "nodes": [{"id": "each", "type": "MAP",
        "config": {"items": [1, 2], "node": {"type": "resize", "queue": "py"}}}]}))
        .await;
    let run = e.start_run("mapped", json!({})).await.to_string();
    let item = lease(&e, "w3").await;
    report(&e, "w3", &item, "logs", json!({"lines": ["an item's line"]})).await;
    let node = item["node_id"].as_str().unwrap();
    let out = cli(&url, &["run", "logs", &run, node, "-o", "jsonl"], None).await;
    assert_eq!((out.code, texts(jsonl(&out))), (0, vec!["an item's line".to_string()]), "{}", out.stderr);
    let out = cli(&url, &["run", "logs", &run, "each[5]"], None).await;
    assert_eq!(out.code, 3, "{}", out.stderr);
    assert!(out.stderr.contains("no item 5: its items are 2, each[0] to each[1]"), "{}", out.stderr);
    e.stop().await;
}

/// A failed step's error is in `run get`'s and `run events`' tables whole
/// (below the table, wrapped between words), not cut to a column's width.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tables_error_is_shown_whole_not_cut() {
    let e = Engine::with(EngineOptions { workers: 0, lease_ttl: Duration::from_secs(60), ..Default::default() }).await;
    let url = e.url();
    e.register(&json!({"name": "refused", "nodes": [
        {"id": "charge", "type": "resize", "queue": "py", "retry": {"max_attempts": 1}}]}))
        .await;
    let run = e.start_run("refused", json!({})).await;
    let task = lease(&e, "w1").await;
    let error = format!(
        "the card issuer declined the charge: {}(code card_declined, see https://example.com/docs/errors/card_declined)",
        "insufficient funds on the account; ".repeat(4)
    );
    report(&e, "w1", &task, "fail", json!({ "error": error })).await;
    assert_eq!(e.wait_for_run(run, Duration::from_secs(30)).await["status"], "FAILED");
    for command in ["get", "events"] {
        let out = cli(&url, &["run", command, &run.to_string(), "-o", "table"], None).await;
        assert_eq!(out.code, 0, "{}", out.stderr);
        let words = out.stdout.split_whitespace().collect::<Vec<_>>().join(" ");
        assert!(words.contains(&error), "run {command}: the whole error: {}", out.stdout);
        assert!(out.stdout.contains("charge error:\n  the card issuer"), "run {command}: {}", out.stdout);
    }
    e.stop().await;
}

/// `apply --version`, `diff` and `normalize`: a definition against what is
/// registered, as the server normalizes both.
#[tokio::test]
async fn diff_shows_what_a_file_changes_and_apply_refuses_a_version_declared_twice() {
    let e = composer_testkit::Engine::start().await;
    let url = e.url();
    let v1 = r#"{"name": "greet", "nodes": [{"id": "a", "type": "TRANSFORM", "config": {"output": 1}}]}"#;
    let v2 = r#"{"nodes": [{"type": "TRANSFORM", "id": "a", "config": {"output": 2}}], "name": "greet"}"#;
    let missing = cli(&url, &["workflow", "diff", "-f", "-"], Some(v1)).await;
    assert_eq!(missing.code, 1, "{}{}", missing.stdout, missing.stderr);
    assert!(missing.stdout.contains("is not registered"), "{}", missing.stdout);
    let applied = cli(&url, &["workflow", "apply", "-f", "-", "--version", "1", "-o", "json"], Some(v1)).await;
    assert_eq!(applied.code, 0, "{}", applied.stderr);
    let same = cli(&url, &["workflow", "diff", "-f", "-", "-o", "table"], Some(v1)).await;
    assert_eq!((same.code, same.stdout.contains("0 change(s)")), (0, true), "{}", same.stdout);
    let changed = cli(&url, &["workflow", "diff", "-f", "-", "-o", "table"], Some(v2)).await;
    assert_eq!(changed.code, 1, "{}{}", changed.stdout, changed.stderr);
    assert!(changed.stdout.contains("~ nodes[a].config.output: 1 -> 2"), "{}", changed.stdout);
    let refused = cli(&url, &["workflow", "apply", "-f", "-", "--version", "1"], Some(v2)).await;
    assert_ne!(refused.code, 0);
    assert!(refused.stderr.contains("version 1 is registered with a different definition"), "{}", refused.stderr);
    let normalized = cli(
        &url,
        &["workflow", "normalize", "-f", "-"],
        Some("name: greet\nnodes:\n- {id: a, type: TRANSFORM, config: {output: 2}}\n"),
    )
    .await;
    assert_eq!(normalized.code, 0, "{}", normalized.stderr);
    let v: serde_json::Value = serde_json::from_str(&normalized.stdout).unwrap();
    let mut want: serde_json::Value = serde_json::from_str(v2).unwrap();
    want["edges"] = serde_json::json!([]);
    assert_eq!(v, want, "as the server stores it: every field in its place");
    e.stop().await;
}

/// `composer init`: each language's starter is written whole, names the
/// checkout its client comes from, and the Python one's test passes
/// offline (the TypeScript package's tests build and test its starter, the
/// worker crate's compiles and tests the Rust one's workflow).
#[tokio::test]
async fn init_writes_a_starter_whose_test_passes_offline() {
    let root = std::fs::canonicalize(concat!(env!("CARGO_MANIFEST_DIR"), "/../..")).unwrap();
    let tmp = tempfile_dir("init");
    let sdk = root.to_string_lossy().to_string();
    for (lang, file) in [("python", "workflow.py"), ("typescript", "src/workflow.ts"), ("rust", "src/workflow.rs")] {
        let dir = tmp.join(lang);
        let out =
            cli("http://127.0.0.1:9", &["init", "--lang", lang, dir.to_str().unwrap(), "--sdk", &sdk], None).await;
        assert_eq!(out.code, 0, "{lang}: {}", out.stderr);
        assert!(dir.join(file).is_file(), "{lang}");
        let again = cli("http://127.0.0.1:9", &["init", "--lang", lang, dir.to_str().unwrap()], None).await;
        assert_eq!(again.code, 2, "a directory that is not empty: {}", again.stderr);
    }
    let cargo = std::fs::read_to_string(tmp.join("rust/Cargo.toml")).unwrap();
    assert!(cargo.contains(&format!("path = \"{sdk}/crates/worker\"")), "{cargo}");
    let package = std::fs::read_to_string(tmp.join("typescript/package.json")).unwrap();
    assert!(package.contains(&format!("\"file:{sdk}/clients/typescript\"")), "{package}");
    let test = std::process::Command::new("python3")
        .args(["-m", "unittest", "-v", "test_workflow"])
        .current_dir(tmp.join("python"))
        .env("PYTHONPATH", root.join("clients/python"))
        .env("COMPOSER_BIN", BIN)
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&test.stderr);
    assert!(test.status.success() && said.contains("OK"), "{said}");
    std::fs::remove_dir_all(&tmp).unwrap();
}

/// A new empty directory under the system's temp dir.
fn tempfile_dir(what: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("composer-{what}-{}", uuid::Uuid::now_v7()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// `workflow simulate --replay` runs a new version on a run's recorded
/// outputs; `workflow migrate` prints the dry run's verdicts, and with
/// `--wait` the job that moved the runs.
#[tokio::test]
async fn simulate_replays_a_runs_outputs_on_a_new_version_and_migrate_moves_the_open_runs() {
    let e = Engine::start().await;
    let url = e.url();
    let wait = json!({"id": "w", "type": "WAIT_FOR_EVENT", "config": {"event": "paid", "key": "${ .input.k }"}});
    let v1 = json!({"name": "replayed", "nodes": [wait, {"id": "t", "type": "TRANSFORM", "config": {"output": "${ .nodes.w.output.x }"}}],
        "edges": [{"from": "w", "to": "t"}]});
    e.register(&v1).await;
    let done = e.start_run("replayed", json!({"k": "done"})).await;
    let open = e.start_run("replayed", json!({"k": "open"})).await;
    for id in [done, open] {
        e.wait_until(id, Duration::from_secs(30), |r| r["tasks"][0]["state"] == "WAITING").await;
    }
    let (status, _) = e.post("/v1/events", &json!({"name": "paid", "key": "done", "payload": {"x": 21}})).await;
    assert_eq!(status, 200);
    assert_eq!(e.wait_for_run(done, Duration::from_secs(30)).await["status"], "SUCCEEDED");
    // v2 renames the wait and doubles what it read.
    let v2 = json!({"name": "replayed", "nodes": [
        {"id": "payment", "type": "WAIT_FOR_EVENT", "config": {"event": "paid", "key": "${ .input.k }"}},
        {"id": "t", "type": "TRANSFORM", "config": {"output": "${ .nodes.payment.output.x * 2 }"}}],
        "edges": [{"from": "payment", "to": "t"}]});
    let dir = tempfile_dir("cli-migrate");
    let file = dir.join("v2.json");
    std::fs::write(&file, v2.to_string()).unwrap();
    let file = file.display().to_string();
    let run = done.to_string();
    let replay = ["workflow", "simulate", "-f", &file, "--replay", &run, "--map", "w=payment", "-o", "json"];
    let simulated = cli(&url, &replay, None).await;
    assert_eq!(simulated.code, 0, "{}{}", simulated.stdout, simulated.stderr);
    let report: Value = serde_json::from_str(&simulated.stdout).unwrap();
    assert_eq!(report["output"]["t"], 42, "the recorded payload, read by v2: {report}");
    let unmapped = cli(&url, &["workflow", "simulate", "-f", &file, "--replay", &run, "-o", "json"], None).await;
    let report: Value = serde_json::from_str(&unmapped.stdout).unwrap();
    assert_ne!(report["output"]["t"], 42, "without --map the wait's payload is not its: {report}");
    let bad = cli(&url, &["workflow", "simulate", "-f", &file, "--replay", "nope"], None).await;
    assert_eq!(bad.code, 2, "{}", bad.stderr);
    assert!(bad.stderr.contains("--replay"), "{}", bad.stderr);

    e.register(&v2).await;
    let migrate = ["workflow", "migrate", "replayed", "--from", "1", "--to", "2", "--map", "w=payment"];
    let dry = cli(&url, &[&migrate[..], &["--dry-run", "-o", "json"]].concat(), None).await;
    assert_eq!(dry.code, 0, "{}", dry.stderr);
    let dry: Value = serde_json::from_str(&dry.stdout).unwrap();
    assert_eq!((&dry["movable"], &dry["runs"][0]["run_id"]), (&json!(1), &json!(open.to_string())), "{dry}");
    let moved = cli(&url, &[&migrate[..], &["--wait", "--reason", "renamed", "-o", "json"]].concat(), None).await;
    assert_eq!(moved.code, 0, "{}", moved.stderr);
    let job: Value = serde_json::from_str(&moved.stdout).unwrap();
    assert_eq!((&job["status"], &job["acted_on"]), (&json!("SUCCEEDED"), &json!(1)), "{job}");
    let twice = cli(&url, &["workflow", "migrate", "replayed", "--from", "1", "--to", "2", "--map", "w"], None).await;
    assert_eq!(twice.code, 2, "{}", twice.stderr);
    let (status, _) = e.post("/v1/events", &json!({"name": "paid", "key": "open", "payload": {"x": 5}})).await;
    assert_eq!(status, 200);
    let run = e.wait_for_run(open, Duration::from_secs(30)).await;
    assert_eq!((&run["version"], &run["output"]["t"]), (&json!(2), &json!(10)), "{run}");
    let _ = std::fs::remove_dir_all(dir);
    e.stop().await;
}
