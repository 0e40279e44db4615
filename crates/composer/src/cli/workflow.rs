//! `composer workflow`'s subcommands: definitions (apply, diff, list,
//! get, normalize, schema), offline simulation, and moving runs between
//! versions.

use std::path::PathBuf;

use clap::Subcommand;

#[derive(Subcommand)]
pub enum WorkflowCommand {
    /// Registers a definition from a JSON or YAML file. Idempotent by content: a definition identical to a
    /// registered version answers that version; another becomes the next version.
    Apply {
        /// The definition: a .json, .yaml or .yml file, or - for standard input (JSON or YAML).
        #[arg(short = 'f', long = "file")]
        file: PathBuf,
        /// The version this definition is meant to be: refused (exit 1, naming it) when that version is
        /// registered with a different definition or is not the next one.
        #[arg(long)]
        version: Option<i32>,
    },
    /// Shows what registering a definition would change against a registered version (the latest by
    /// default), field by field: `~ path: old -> new`, `+ path: new`, `- path: old`. Exit status: 0 no
    /// change (it is that version), 1 changes, 2 an error.
    Diff {
        /// The definition, a JSON or YAML file (- for standard input).
        #[arg(short = 'f', long = "file")]
        file: PathBuf,
        /// The registered version to compare with (default: the latest).
        #[arg(long)]
        version: Option<i32>,
    },
    /// Lists workflows (latest version of each).
    List,
    /// Shows a workflow's latest definition and its versions.
    Get {
        /// The workflow's name.
        name: String,
    },
    /// Prints a definition from a JSON or YAML file as the server stores it (normalized JSON), offline: what
    /// two definitions are compared as when registering and by `diff`. Exit status 2 when it is invalid.
    Normalize {
        /// The definition, a JSON or YAML file (- for standard input).
        #[arg(short = 'f', long = "file")]
        file: PathBuf,
    },
    /// Prints the JSON Schema (2020-12) of a workflow definition, for editors and linters (no server). The
    /// repository keeps a copy in docs/workflow.schema.json; the server also checks what a schema cannot say
    /// (edges name nodes, each node's config fits its type, expressions compile).
    Schema,
    /// Runs a definition through the state machine offline (no server): worker-run nodes take mocked outputs,
    /// events mocked payloads, timers fire at once. Prints each node's state, evaluated input and output, the
    /// edges taken, and the run's status and output. Exit status: 0 the run succeeded, 1 it failed, 2 the
    /// definition or an argument is invalid.
    Simulate {
        /// The definition, a JSON or YAML file.
        #[arg(short = 'f', long = "file")]
        file: PathBuf,
        /// The run's input: JSON, or @FILE.
        #[arg(long, default_value = "{}")]
        input: String,
        /// An event, {name, key?, id?, payload?} as JSON or @FILE: the run its first matching trigger would
        /// start (its input made by the trigger), instead of --input.
        #[arg(long, conflicts_with = "input")]
        event: Option<String>,
        /// NODE=JSON or NODE=@FILE: the output of an HTTP or custom node, or the payload of a WAIT_FOR_EVENT's
        /// event (default {}). Repeatable.
        #[arg(long = "mock", value_name = "NODE=JSON")]
        mocks: Vec<String>,
        /// An update sent to the run, NAME=JSON (its payload, or @FILE): offered once to the first step that
        /// waits and accepts it (its `updates`), which validates it and completes with its output or refuses
        /// it; repeat it for more, in order.
        #[arg(long = "update", value_name = "NAME=JSON")]
        updates: Vec<String>,
        /// NODE or NODE=MESSAGE: every attempt of the node fails (its retry policy applies); a WAIT_FOR_EVENT
        /// times out instead. Repeatable.
        #[arg(long = "fail", value_name = "NODE[=MESSAGE]")]
        failures: Vec<String>,
        /// `table` for people (`text` is another name of it), `json` or `jsonl` (the report on one line)
        /// for tools. The other commands' formats, but a table by default also in a pipe: the report is for
        /// reading.
        #[arg(short = 'o', long = "output", default_value = "table", value_parser = simulate_formats())]
        output: String,
        /// Ask the caller what each attempt a worker would run does, one JSON line each way: composer writes
        /// {"ask": {node, key, type, input, attempt}} to standard output and reads {"output": V},
        /// {"error": "why", "retryable": BOOL}, {"timeout": true} or {"mock": true} from standard input; the
        /// report follows as {"report": …}. The SDKs' simulate helpers run a workflow's own handlers so.
        #[arg(long)]
        ask: bool,
        /// A run's recorded outputs against this definition (a version it may move to): the run's input,
        /// each step that ended its output (or its failure) as a mock, renamed by --map. Needs the server;
        /// --mock and --fail still apply, after the run's.
        #[arg(long, value_name = "RUN_ID", conflicts_with_all = ["input", "event"])]
        replay: Option<String>,
        /// With --replay: OLD=NEW, a step of the run's version and the step of this definition it becomes.
        /// Repeatable.
        #[arg(long = "map", value_name = "OLD=NEW", requires = "replay")]
        map: Vec<String>,
        /// The largest value, in bytes, the server keeps: its COMPOSER_MAX_PAYLOAD, or its
        /// COMPOSER_MAX_OFFLOADED when it offloads large values (what `composer dev` does). A MAP's
        /// `collect: "all"` shares it among the items.
        #[arg(long, value_name = "BYTES", default_value_t = composer_core::storable::DEFAULT_MAX_PAYLOAD as u64,
              value_parser = clap::value_parser!(u64).range(1..))]
        max_value: u64,
    },
    /// Moves a version's open runs (QUEUED, RUNNING, PAUSED) to another version: each run whose steps all
    /// map to steps of the new version of the same type, whose predecessors have ended in the run, moves
    /// (once, in one commit, recorded in its history); the others stay. --dry-run prints each run's
    /// verdict and what would change; otherwise the job moving them is printed (followed with --wait).
    /// Moving runs back undoes a move.
    Migrate {
        /// The workflow's name.
        name: String,
        /// The version whose runs move.
        #[arg(long)]
        from: i32,
        /// The version they move to.
        #[arg(long)]
        to: i32,
        /// OLD=NEW: a step of --from and the step of --to it becomes (a step not named keeps its id).
        /// Repeatable.
        #[arg(long = "map", value_name = "OLD=NEW")]
        map: Vec<String>,
        /// Only the runs with this tag, KEY=VALUE (repeat it for more).
        #[arg(long = "tag", value_name = "KEY=VALUE")]
        tags: Vec<String>,
        /// Why, for the runs' history.
        #[arg(long)]
        reason: Option<String>,
        /// Only say, for each run, whether it can move and what would change.
        #[arg(long)]
        dry_run: bool,
        /// Wait for the job to end (exit 1 when it refused a run).
        #[arg(long, conflicts_with = "dry_run")]
        wait: bool,
    },
}

fn simulate_formats() -> clap::builder::PossibleValuesParser {
    use clap::builder::PossibleValue;
    [PossibleValue::new("table").alias("text"), PossibleValue::new("json"), PossibleValue::new("jsonl")].into()
}
