//! `composer approval`: the inbox of APPROVAL steps waiting for people
//! (`list --mine`, `--groups`, `--all`), one approval, and a decision.

use std::process::ExitCode;

use clap::{Args, Subcommand};
use serde_json::{json, Value};

use crate::connect::{api, call, ClientArgs};
use crate::input::encode;
use crate::output::{self, Column, Format};

type Method = reqwest::Method;

#[derive(Args)]
pub struct ApprovalArgs {
    #[command(flatten)]
    pub client: ClientArgs,
    #[command(subcommand)]
    pub command: ApprovalCommand,
}

#[derive(Subcommand)]
pub enum ApprovalCommand {
    /// Lists the approvals waiting for a decision, newest first: yours by
    /// default (naming you, or a group of yours).
    List {
        /// Those naming you or a group of yours (the default).
        #[arg(long, conflicts_with_all = ["groups", "all"])]
        mine: bool,
        /// Those assigned to a group of yours.
        #[arg(long, conflicts_with = "all")]
        groups: bool,
        /// Every waiting approval.
        #[arg(long)]
        all: bool,
        /// 1 to 500.
        #[arg(long, default_value_t = 50)]
        limit: u32,
        /// The previous page's next_cursor.
        #[arg(long)]
        cursor: Option<String>,
    },
    /// Shows one approval: what it asks, of whom, its votes.
    Get {
        /// The run's id.
        run: String,
        /// The APPROVAL node.
        node: String,
    },
    /// Votes on an approval: approve or reject. One rejection rejects it;
    /// the quorum's last approval approves it.
    Decide {
        /// The run's id.
        run: String,
        /// The APPROVAL node.
        node: String,
        /// approve or reject.
        #[arg(value_parser = ["approve", "reject"])]
        answer: String,
        /// The form's data as JSON (or @FILE); an approval's must match the step's form.
        #[arg(long)]
        data: Option<String>,
        /// Why, for the record.
        #[arg(long)]
        comment: Option<String>,
        /// An administrator deciding for this assignee (recorded as such).
        #[arg(long = "as")]
        on_behalf_of: Option<String>,
    },
}

/// The inbox's columns.
const COLUMNS: &[Column] = &[
    ("RUN", "/run_id"),
    ("NODE", "/node"),
    ("WORKFLOW", "/workflow"),
    ("NEEDED", "/needed"),
    ("DUE", "/due_at"),
    ("PROMPT", "/prompt"),
];

pub async fn approval(args: ClientArgs, cmd: ApprovalCommand) -> anyhow::Result<ExitCode> {
    let api = api(&args)?;
    let format = Format::resolve(args.output.as_deref());
    let path = |run: &str, node: &str| format!("/v1/approvals/{}/{}", encode(run), encode(node));
    let answer = match cmd {
        ApprovalCommand::List { mine: _, groups, all, limit, cursor } => {
            let view = if all {
                "all"
            } else if groups {
                "groups"
            } else {
                "mine"
            };
            let mut query = format!("/v1/approvals?view={view}&limit={limit}");
            if let Some(c) = cursor {
                query.push_str(&format!("&cursor={}", encode(&c)));
            }
            let answer = call(&api, Method::GET, &query, None).await?;
            let empty = answer["approvals"].as_array().is_none_or(Vec::is_empty);
            if empty && format == Format::Table {
                println!("no approvals ({view})");
            } else {
                output::list(format, &answer, "approvals", COLUMNS);
            }
            return Ok(ExitCode::SUCCESS);
        }
        ApprovalCommand::Get { run, node } => call(&api, Method::GET, &path(&run, &node), None).await?,
        ApprovalCommand::Decide { run, node, answer, data, comment, on_behalf_of } => {
            let mut body = json!({"answer": answer});
            if let Some(d) = data {
                body["data"] = crate::input::json_arg("--data", &d)?;
            }
            for (field, v) in [("comment", comment), ("as", on_behalf_of)] {
                if let Some(v) = v {
                    body[field] = Value::String(v);
                }
            }
            call(&api, Method::POST, &format!("{}/decide", path(&run, &node)), Some(&body)).await?
        }
    };
    output::one(format, &answer);
    Ok(ExitCode::SUCCESS)
}
