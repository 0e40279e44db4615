//! Command-line flags, each with its `COMPOSER_*` environment variable. The
//! server roles' flags are their libraries' config structs, flattened.
//!
//! - `workflow`: `composer workflow`'s subcommands.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

mod workflow;

pub use crate::bench::BenchArgs;
pub use composer_config::DatabaseArgs;
pub use workflow::WorkflowCommand;

#[derive(Parser)]
#[command(
    name = "composer",
    version,
    about = "Composer: a distributed workflow engine on PostgreSQL and Redis",
    after_help = EXIT_STATUS
)]
pub struct Cli {
    #[command(flatten)]
    pub log: LogArgs,
    #[command(subcommand)]
    pub command: Command,
}

/// The exit statuses, for every `--help`.
pub const EXIT_STATUS: &str = "Exit status: 0 done (a waited-for run SUCCEEDED), 1 the run FAILED or was CANCELLED \
(or a server role stopped on an error), 2 a usage error (a bad flag or argument, a --url that is not a coordinator's, \
or a request the server refused as invalid), 3 not found, 4 the server is unreachable or answered 5xx, 5 a --wait timed out.";

#[derive(Subcommand)]
pub enum Command {
    /// Coordinator and worker in one process; starts its own PostgreSQL and
    /// Redis when no URLs are configured.
    Dev(Box<DevArgs>),
    /// The coordinator: REST API, engine, outbox and background loops, and
    /// the HTTP steps that read no secret.
    Coordinator(Box<CoordinatorArgs>),
    /// A worker running the built-in node types (HTTP).
    Worker(Box<composer_worker::Config>),
    /// Applies database migrations and exits.
    Migrate(DatabaseArgs),
    /// Register and read workflow definitions.
    Workflow(WorkflowArgs),
    /// Start, inspect and control runs.
    Run(RunArgs),
    /// Send events (to triggers and WAIT_FOR_EVENT steps) and list recent ones.
    Event(EventArgs),
    /// Create and control schedules (cron-triggered runs).
    Schedule(ScheduleArgs),
    /// Configure webhooks: signed deliveries from other services turned into events.
    Webhook(WebhookArgs),
    /// See and set the rate and concurrency limits on steps across runs.
    Limit(LimitArgs),
    /// The approvals waiting for people (an inbox), and deciding them.
    Approval(crate::approval::ApprovalArgs),
    /// Create, list and revoke API keys (each with a name, scopes and an expiry).
    Key(crate::access::KeyArgs),
    /// Read the audit log: every change made through the API or the UI, newest first.
    Audit(crate::access::AuditArgs),
    /// Create, list, describe and delete namespaces (each its own workflows, runs and the rest).
    Namespace(crate::access::NamespaceArgs),
    /// Creates a starter project: one workflow written in code (Python, TypeScript or Rust), the worker that
    /// registers it and runs its steps, and a test that runs it offline.
    Init {
        /// python, typescript or rust.
        #[arg(long, value_enum)]
        lang: crate::init::Lang,
        /// The new project's directory (it must not exist, or be empty).
        dir: PathBuf,
        /// The Composer checkout whose client the project uses (default: the one this binary was built in).
        #[arg(long)]
        sdk: Option<PathBuf>,
    },
    /// Prints a shell completion script: `composer completions bash > /etc/bash_completion.d/composer`.
    Completions {
        /// bash, zsh, fish, elvish or powershell.
        shell: clap_complete::Shell,
    },
    /// Measures latency and throughput of K-step workflows against a built-in
    /// HTTP sink (on embedded services unless --target-url is given).
    Bench(BenchArgs),
}

#[derive(Args)]
pub struct CoordinatorArgs {
    #[command(flatten)]
    pub coord: composer_coord::Config,
    #[command(flatten)]
    pub http_steps: HttpSteps,
    #[command(flatten)]
    pub egress: composer_worker::Egress,
}

/// The HTTP steps a coordinator runs itself.
#[derive(Args)]
pub struct HttpSteps {
    /// HTTP steps this coordinator runs at once itself: calls whose config
    /// reads no secret, as its own commits make them ready (the rest go to
    /// workers through the streams). 0: every HTTP step goes to a worker.
    /// Default: 0 for `coordinator` (its calls start from its host: give it
    /// the workers' egress rules first), 256 for `dev`.
    #[arg(long = "http-slots", env = "COMPOSER_COORDINATOR_HTTP_SLOTS")]
    pub slots: Option<usize>,
}

impl HttpSteps {
    /// What `dev` runs unless told otherwise: its worker already calls
    /// from its host, with its environment.
    pub const DEV_DEFAULT: usize = 256;
}

#[derive(Args)]
pub struct DevArgs {
    #[command(flatten)]
    pub coord: composer_coord::Config,
    #[command(flatten)]
    pub http_steps: HttpSteps,
    #[command(flatten)]
    pub worker: composer_worker::Options,
    /// Where the embedded PostgreSQL and Redis keep their files.
    #[arg(long, env = "COMPOSER_DATA_DIR", default_value = ".composer")]
    pub data_dir: PathBuf,
    /// Serve the examples' demo target at `/demo` (echo, status codes,
    /// delays, flaky calls, payments, exports); `false` leaves it out.
    #[arg(long, env = "COMPOSER_DEMO_TARGET", default_value_t = true, action = clap::ArgAction::Set)]
    pub demo_target: bool,
    /// The worker calls the coordinator of this process directly (no HTTP
    /// between them); `false` sends its calls over HTTP as a separate
    /// worker's are. A worker given `--coordinator-urls` always uses them.
    #[arg(long, env = "COMPOSER_WORKER_IN_PROCESS", default_value_t = true, action = clap::ArgAction::Set)]
    pub worker_in_process: bool,
}

#[derive(Args)]
pub struct WorkflowArgs {
    #[command(flatten)]
    pub client: ClientArgs,
    #[command(subcommand)]
    pub command: WorkflowCommand,
}

#[derive(Args)]
pub struct RunArgs {
    #[command(flatten)]
    pub client: ClientArgs,
    #[command(subcommand)]
    pub command: RunCommand,
}

#[derive(Args)]
pub struct ScheduleArgs {
    #[command(flatten)]
    pub client: ClientArgs,
    #[command(subcommand)]
    pub command: ScheduleCommand,
}

#[derive(Subcommand)]
pub enum ScheduleCommand {
    /// Creates (or replaces) a schedule, from a JSON or YAML file or from flags.
    Create {
        /// The schedule: {id, workflow, version?, cron, timezone?, input?, overlap?, catchup_window?, paused?}.
        #[arg(short = 'f', long = "file", conflicts_with_all = ["id", "workflow", "cron"])]
        file: Option<PathBuf>,
        /// The schedule's id (letters, digits, '_', '-', '.').
        #[arg(long, required_unless_present = "file")]
        id: Option<String>,
        /// The workflow it starts.
        #[arg(long, required_unless_present = "file")]
        workflow: Option<String>,
        /// Five fields (minute hour day month weekday), or six with seconds first.
        #[arg(long, required_unless_present = "file")]
        cron: Option<String>,
        #[arg(long)]
        version: Option<i32>,
        /// An IANA time zone (default UTC).
        #[arg(long)]
        timezone: Option<String>,
        /// Each run's input, as JSON.
        #[arg(long)]
        input: Option<String>,
        /// skip (default), allow or buffer_one.
        #[arg(long)]
        overlap: Option<String>,
        /// How far back missed fire times still fire after downtime (default 1m).
        #[arg(long)]
        catchup_window: Option<String>,
        /// Create it paused.
        #[arg(long)]
        paused: bool,
    },
    /// Lists schedules by id.
    List {
        /// Schedules per page (at most 1000).
        #[arg(long, default_value_t = 50)]
        limit: u32,
        /// The `next_after` of the previous page.
        #[arg(long)]
        after: Option<String>,
    },
    /// Shows a schedule with its next fire times.
    Get {
        /// The schedule's id.
        id: String,
    },
    /// Deletes a schedule (its runs stay).
    Delete {
        /// The schedule's id.
        id: String,
    },
    /// Stops a schedule firing.
    Pause {
        /// The schedule's id.
        id: String,
    },
    /// Fires again from the next fire time.
    Resume {
        /// The schedule's id.
        id: String,
    },
    /// Starts one run now.
    Trigger {
        /// The schedule's id.
        id: String,
    },
    /// Starts the runs the schedule would have started between two past
    /// times (each once, however often asked).
    Backfill {
        /// The schedule's id.
        id: String,
        /// The first fire time included (RFC 3339, such as 2026-11-01T00:00:00Z).
        #[arg(long)]
        from: String,
        /// The end of the range, not included; at most now.
        #[arg(long)]
        to: String,
        /// allow (default: all at once), skip or buffer_all (one at a time).
        #[arg(long)]
        overlap: Option<String>,
    },
}

#[derive(Args)]
pub struct EventArgs {
    #[command(flatten)]
    pub client: ClientArgs,
    #[command(subcommand)]
    pub command: EventCommand,
}

#[derive(Args)]
pub struct LogArgs {
    /// Log filter (tracing EnvFilter syntax).
    #[arg(long = "log", global = true, env = "COMPOSER_LOG", default_value = "info")]
    pub level: String,
    /// `text` or `json`.
    #[arg(long = "log-format", global = true, env = "COMPOSER_LOG_FORMAT", default_value = "text",
          value_parser = ["text", "json"])]
    pub format: String,
}

pub use crate::connect::ClientArgs;

/// The `COMPOSER_*` variable behind the flag a parse error is about, found
/// by looking the flag up in the command tree (a flag's variable is not
/// always its name: `--concurrency` reads `COMPOSER_WORKER_CONCURRENCY`);
/// none when the value refused is not the variable's.
pub fn env_var_of_error(e: &clap::Error) -> Option<String> {
    use clap::error::{ContextKind, ContextValue};
    let Some(ContextValue::String(arg)) = e.get(ContextKind::InvalidArg) else { return None };
    let long = arg.strip_prefix("--")?.split([' ', '=']).next()?;
    let var = find_env(&<Cli as clap::CommandFactory>::command(), long)?;
    // A value refused that is not the variable's came from the command line
    // (which wins over the variable).
    if let (Some(ContextValue::String(value)), Some(set)) = (e.get(ContextKind::InvalidValue), std::env::var_os(&var)) {
        if set != value.as_str() {
            return None;
        }
    }
    Some(var)
}

fn find_env(command: &clap::Command, long: &str) -> Option<String> {
    let own = command.get_arguments().find(|a| a.get_long() == Some(long)).and_then(|a| a.get_env());
    own.map(|v| v.to_string_lossy().into_owned())
        .or_else(|| command.get_subcommands().find_map(|sub| find_env(sub, long)))
}

#[derive(Subcommand)]
pub enum RunCommand {
    /// Starts a run.
    Start {
        /// The workflow's name.
        workflow: String,
        /// The run's input: JSON, @FILE holding JSON, or @- to read it from standard input.
        #[arg(long, default_value = "{}")]
        input: String,
        /// Starting again with the same key (for this workflow) returns the run it started.
        #[arg(long)]
        idempotency_key: Option<String>,
        /// Pin a definition version (default: latest).
        #[arg(long)]
        version: Option<i32>,
        /// A tag of the run, KEY=VALUE (repeat it for more).
        #[arg(long = "tag", value_name = "KEY=VALUE")]
        tags: Vec<String>,
        /// Its priority, 1 (served first) to 5 (last), instead of its definition's.
        #[arg(long, value_parser = clap::value_parser!(u8).range(1..=5))]
        priority: Option<u8>,
        /// Wait for the run to end, showing the step running now on stderr; exit non-zero unless it SUCCEEDED.
        #[arg(long)]
        wait: bool,
        /// Give up waiting after this long (with --wait).
        #[arg(long, default_value = "10m", value_parser = composer_core::duration::parse, requires = "wait")]
        timeout: Duration,
    },
    /// Shows a run with its tasks.
    Get {
        /// The run's id.
        id: String,
    },
    /// Lists runs, newest first.
    List {
        #[command(flatten)]
        filter: RunFilter,
        /// Runs per page (at most 1000).
        #[arg(long, default_value_t = 20)]
        limit: u32,
        /// The `next_cursor` of the previous page.
        #[arg(long)]
        cursor: Option<String>,
    },
    /// Shows a run's whole history (every page).
    Events {
        /// The run's id.
        id: String,
    },
    /// Prints a step's log lines (what its worker sent), of its latest attempt or --attempt N.
    ///
    /// In a table each line follows when it was stored and the worker that sent it (its control characters
    /// spelled out); -o jsonl prints each line as an object, -o json the whole log as one document. A LOOP
    /// iteration's or a SUB_WORKFLOW's steps are in its child run: give that run's id.
    Logs {
        /// The run's id.
        id: String,
        /// The step's node id (a MAP item: ship_each[3]).
        node: String,
        /// The attempt, from 1 (default: the step's latest).
        #[arg(long, value_parser = clap::value_parser!(i32).range(1..))]
        attempt: Option<i32>,
        /// Keep printing new lines until the attempt ends (waiting first for a step not started yet), then exit
        /// 0 if it COMPLETED and 1 if not (it failed, was cancelled or is IN_DOUBT). With -o json the document
        /// comes at the end.
        #[arg(short = 'f', long)]
        follow: bool,
    },
    /// Writes the runs a filter matches, whole (tasks, history, MAP items, logs), as an archive's files
    /// (gzip JSON Lines parts, then manifest.json) in DIR or s3://BUCKET/PREFIX (credentials from AWS_*).
    Export {
        #[command(flatten)]
        filter: ExportFilter,
        /// Where: a directory (made if missing) or s3://BUCKET/PREFIX.
        #[arg(long)]
        out: String,
    },
    /// Shows a run retention archived (COMPOSER_ARCHIVE_URL), read back from the archive.
    Archived {
        /// The run's id.
        id: String,
    },
    /// Cancels an open run (queued, running or paused): its open steps are cancelled.
    Cancel {
        /// The run's id.
        id: String,
        /// Why, for the run's history.
        #[arg(long)]
        reason: Option<String>,
    },
    /// Retries a failed run's failed steps.
    Retry {
        /// The run's id.
        id: String,
        /// Why, for the run's history.
        #[arg(long)]
        reason: Option<String>,
        /// Wait for the run to end, showing the step running now on stderr; exit non-zero unless it SUCCEEDED.
        #[arg(long)]
        wait: bool,
        /// Give up waiting after this long (with --wait).
        #[arg(long, default_value = "10m", value_parser = composer_core::duration::parse, requires = "wait")]
        timeout: Duration,
    },
    /// Pauses a running run: tasks already started finish, nothing new starts until it is resumed.
    Pause {
        /// The run's id.
        id: String,
        /// Why, for the run's history.
        #[arg(long)]
        reason: Option<String>,
    },
    /// Resumes a paused run.
    Resume {
        /// The run's id.
        id: String,
        /// Why, for the run's history.
        #[arg(long)]
        reason: Option<String>,
    },
    /// Gives an open run (and the open runs under it) another priority, 1
    /// (served first) to 5 (last): its steps not started yet, already
    /// dispatched ones too, are served at it.
    Priority {
        /// The run's id.
        id: String,
        /// 1 (served first) to 5 (last).
        #[arg(value_parser = clap::value_parser!(u8).range(1..=5))]
        priority: u8,
    },
    /// Runs a run again from some of its steps: each and everything after it
    /// is reset and runs again (with the run's input, or --input).
    Rerun {
        /// The run's id.
        id: String,
        /// A step to run again from (a MAP item: ship_each[3]); repeat it for more.
        #[arg(long, required = true, value_name = "NODE")]
        from: Vec<String>,
        /// The run's new input: JSON, or @FILE holding JSON.
        #[arg(long)]
        input: Option<String>,
        /// Rerun a run that SUCCEEDED.
        #[arg(long)]
        allow_completed: bool,
        /// Why, for the run's history.
        #[arg(long)]
        reason: Option<String>,
    },
    /// Ends a step with an output, whatever it is doing, and the run goes on.
    Complete {
        /// The run's id.
        id: String,
        /// The step's node id (a MAP item: ship_each[3]).
        node: String,
        /// The step's output: JSON, or @FILE holding JSON.
        #[arg(long)]
        output: String,
        /// Why, for the run's history.
        #[arg(long)]
        reason: Option<String>,
    },
    /// Says why a run waits: for every open step, what holds it.
    Why {
        /// The run's id.
        id: String,
    },
    /// Acts on every run a filter matches (a job: composer run bulk-status JOB).
    Bulk {
        /// cancel, retry, pause, resume or rerun.
        #[arg(long, value_parser = ["cancel", "retry", "pause", "resume", "rerun"])]
        action: String,
        #[command(flatten)]
        filter: RunFilter,
        /// With rerun: a step to run again from; repeat it for more.
        #[arg(long, value_name = "NODE")]
        from: Vec<String>,
        /// Why, for each run's history.
        #[arg(long)]
        reason: Option<String>,
        /// Only count the runs the filter matches.
        #[arg(long)]
        dry_run: bool,
    },
    /// Shows how far a bulk job got.
    BulkStatus {
        /// The job's id.
        job: String,
    },
    /// Stops a bulk job.
    BulkCancel {
        /// The job's id.
        job: String,
    },
    /// Sends an update to a run's waiting step that accepts it, and prints
    /// its answer: the step's output (exit 0) or why it refused (exit 1).
    Update {
        /// The run's id.
        id: String,
        /// The update's name (a step's `updates[].name`).
        name: String,
        /// Its payload as JSON (or @FILE).
        #[arg(long, default_value = "null")]
        payload: String,
        /// Its id: sent again with the same id, it is answered the same and applied once.
        #[arg(long = "update-id")]
        update_id: Option<String>,
        /// How long to wait for a step that accepts it (10s by default, at most 60s).
        #[arg(long)]
        timeout: Option<String>,
    },
    /// Says how an IN_DOUBT step (delivery: at_most_once) ended: it
    /// completed (--output), failed (--error) or is to be sent again (retry).
    Resolve {
        /// The run's id.
        id: String,
        /// The step's node id (a MAP item: ship_each[3]).
        node: String,
        /// completed, failed or retry.
        #[arg(long, value_parser = ["completed", "failed", "retry"])]
        outcome: String,
        /// With completed: the step's output as JSON (or @FILE).
        #[arg(long)]
        output: Option<String>,
        /// With failed: the step's error.
        #[arg(long)]
        error: Option<String>,
    },
}

/// Which runs `run list` and `run bulk` mean: every flag narrows.
#[derive(clap::Args)]
pub struct RunFilter {
    /// Only runs of this workflow.
    #[arg(long)]
    pub workflow: Option<String>,
    /// Only runs in this status: QUEUED, RUNNING, PAUSED, SUCCEEDED, FAILED or CANCELLED.
    #[arg(long)]
    pub status: Option<String>,
    /// Only runs with this tag, KEY=VALUE (repeat it for more).
    #[arg(long = "tag", value_name = "KEY=VALUE")]
    pub tags: Vec<String>,
    /// Only runs created at or after this moment (RFC 3339).
    #[arg(long)]
    pub created_after: Option<String>,
    /// Only runs created before this moment (RFC 3339).
    #[arg(long)]
    pub created_before: Option<String>,
}

/// Which runs `run export` writes.
#[derive(clap::Args)]
pub struct ExportFilter {
    /// Only runs of this workflow.
    #[arg(long)]
    pub workflow: Option<String>,
    /// Only runs created at or after this moment (RFC 3339).
    #[arg(long)]
    pub from: Option<String>,
    /// Only runs created before this moment (RFC 3339).
    #[arg(long)]
    pub to: Option<String>,
}

#[derive(Subcommand)]
pub enum EventCommand {
    /// Records an event: starts the runs of the workflows whose triggers
    /// match it, and completes the steps waiting for (NAME, KEY) with the
    /// payload, or keeps it for a waiter to come.
    Send {
        /// The event's name (a trigger's or a WAIT_FOR_EVENT's `event`).
        name: String,
        /// The key it is for (a WAIT_FOR_EVENT's evaluated `key`); none by default.
        key: Option<String>,
        /// The event's payload as JSON.
        #[arg(long, default_value = "{}")]
        payload: String,
        /// The event's id: sending it again with the same id does nothing again.
        #[arg(long)]
        id: Option<String>,
    },
    /// Lists recent events, newest first, with the runs they started.
    List {
        /// Only events of this name.
        #[arg(long)]
        name: Option<String>,
        /// Only events from this source (api, or webhook:NAME).
        #[arg(long)]
        source: Option<String>,
        /// Events per page (at most 1000).
        #[arg(long, default_value_t = 50)]
        limit: u32,
        /// The `next_before` of the previous page.
        #[arg(long)]
        before: Option<i64>,
    },
    /// Runs the triggers of recorded events again (after a fix): once per
    /// event and trigger that has no run yet; a job (composer event
    /// replay-status REPLAY).
    Replay {
        /// Events received at or after this moment: RFC 3339, or a duration
        /// such as 2h for that long ago.
        #[arg(long)]
        from: String,
        /// Events received before this moment (RFC 3339 or a duration ago); now by default.
        #[arg(long)]
        to: Option<String>,
        /// Only events of this name.
        #[arg(long)]
        name: Option<String>,
        /// Only events with this key.
        #[arg(long)]
        key: Option<String>,
        /// Only events a trigger of which started no run.
        #[arg(long)]
        failed_only: bool,
        /// Why, as the replay records it.
        #[arg(long)]
        reason: Option<String>,
        /// Only count the events and show what the first would start.
        #[arg(long)]
        dry_run: bool,
    },
    /// Shows how far a replay got.
    ReplayStatus {
        /// The replay's id.
        replay: String,
    },
    /// Stops a replay.
    ReplayCancel {
        /// The replay's id.
        replay: String,
    },
}

#[derive(Args)]
pub struct WebhookArgs {
    #[command(flatten)]
    pub client: ClientArgs,
    #[command(subcommand)]
    pub command: WebhookCommand,
}

#[derive(Subcommand)]
pub enum WebhookCommand {
    /// Creates (or replaces) a webhook, from a JSON or YAML file or from flags.
    Create {
        /// The webhook: {name, scheme, secret, tolerance?, event?}.
        #[arg(short = 'f', long = "file", conflicts_with_all = ["name", "scheme", "secret"])]
        file: Option<PathBuf>,
        /// Its name: deliveries go to /v1/webhooks/NAME.
        #[arg(long, required_unless_present = "file")]
        name: Option<String>,
        /// How deliveries are signed: stripe or github.
        #[arg(long, required_unless_present = "file")]
        scheme: Option<String>,
        /// The secret's name: each coordinator reads COMPOSER_WEBHOOK_SECRET_<SECRET>.
        #[arg(long, required_unless_present = "file")]
        secret: Option<String>,
        /// How far a signed timestamp may be from now (default 5m, at most 1h).
        #[arg(long)]
        tolerance: Option<String>,
        /// The event, as JSON: a template over {body, headers} yielding {name, key?, id?, payload?}.
        #[arg(long)]
        event: Option<String>,
    },
    /// Lists webhooks.
    List,
    /// Shows a webhook, and whether the coordinator has its secret.
    Get {
        /// The webhook's name.
        name: String,
    },
    /// Deletes a webhook.
    Delete {
        /// The webhook's name.
        name: String,
    },
}

#[derive(Args)]
pub struct LimitArgs {
    #[command(flatten)]
    pub client: ClientArgs,
    #[command(subcommand)]
    pub command: LimitCommand,
}

#[derive(Subcommand)]
pub enum LimitCommand {
    /// Lists limits with their use now: tokens, steps in flight and waiting.
    List {
        /// The previous page's last key.
        #[arg(long)]
        after: Option<String>,
        /// Most limits to list (1 to 1000).
        #[arg(long, default_value_t = 100)]
        limit: u32,
    },
    /// Shows one limit and its use now.
    Get {
        /// The limit key (as the node's limits evaluate it, e.g. stripe:acct_1).
        key: String,
    },
    /// Sets a key's values at run time; the definitions that use it no longer change them.
    Set {
        /// The limit key.
        key: String,
        /// Steps per period, as N/period (25/1s, 1000/1h).
        #[arg(long)]
        rate: Option<String>,
        /// The most steps that may go at once after a quiet spell (the rate's N by default).
        #[arg(long)]
        burst: Option<u32>,
        /// Steps of the key in flight at once.
        #[arg(long)]
        concurrency: Option<u32>,
    },
    /// Forgets the values set at run time: the key goes back to its definitions.
    Delete {
        /// The limit key.
        key: String,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_command_tree_is_well_formed_and_every_argument_is_described() {
        use clap::CommandFactory;
        let cmd = Cli::command();
        cmd.clone().debug_assert();
        fn walk(cmd: &clap::Command, path: &str, missing: &mut Vec<String>) {
            for arg in cmd.get_arguments() {
                let builtin = matches!(arg.get_id().as_str(), "help" | "version");
                if !builtin && arg.get_help().is_none() && arg.get_long_help().is_none() {
                    missing.push(format!("{path} {}", arg.get_id()));
                }
            }
            for sub in cmd.get_subcommands() {
                walk(sub, &format!("{path} {}", sub.get_name()), missing);
            }
        }
        let mut missing = Vec::new();
        walk(&cmd, "composer", &mut missing);
        assert!(missing.is_empty(), "arguments without help: {missing:?}");
    }

    #[test]
    fn client_flags_are_on_client_commands_only() {
        use clap::CommandFactory;
        let cmd = Cli::command();
        for role in ["dev", "coordinator", "worker", "migrate", "bench"] {
            let sub = cmd.find_subcommand(role).unwrap();
            for flag in ["url", "output"] {
                assert!(sub.get_arguments().all(|a| a.get_id().as_str() != flag), "{role} shows --{flag}");
            }
        }
    }
}
