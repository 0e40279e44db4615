//! `composer key` (API keys: create, list, revoke) and `composer audit`
//! (the audit log): both need an administrator's key or the API token.

use std::process::ExitCode;

use clap::{Args, Subcommand};
use serde_json::{json, Value};

use crate::connect::{api, call, ClientArgs};
use crate::output::{self, Format};

type Method = reqwest::Method;

#[derive(Args)]
pub struct KeyArgs {
    #[command(flatten)]
    pub client: ClientArgs,
    #[command(subcommand)]
    pub command: KeyCommand,
}

#[derive(Subcommand)]
pub enum KeyCommand {
    /// Creates a key and prints it, this once: only its hash is kept.
    Create {
        /// Who the key is: the actor runs' history and the audit log name.
        name: String,
        /// A scope the key holds (repeat, or comma-separated): read, runs:control, workflows:write,
        /// events:send, schedules:write, webhooks:write, limits:write, tasks:work, metrics:read, admin.
        #[arg(long = "scope", required = true, value_delimiter = ',')]
        scopes: Vec<String>,
        /// With tasks:work, the only queues the key may poll (repeat, or comma-separated).
        #[arg(long = "queue", value_delimiter = ',')]
        queues: Vec<String>,
        /// How long the key lasts, in one unit (90d, 12h); it never expires by default.
        #[arg(long)]
        expires_in: Option<String>,
    },
    /// Lists keys, newest first (never a key itself).
    List,
    /// Revokes a key: it is refused from now on (by every coordinator within 5 s).
    Revoke {
        /// The key's id (as `key list` shows it).
        id: String,
    },
}

#[derive(Args)]
pub struct AuditArgs {
    #[command(flatten)]
    pub client: ClientArgs,
    /// Only this actor's changes (a key's name).
    #[arg(long)]
    pub actor: Option<String>,
    /// The previous page's `next`: older entries.
    #[arg(long)]
    pub before: Option<i64>,
    /// Most entries to show (1 to 1000).
    #[arg(long, default_value_t = 100)]
    pub limit: u32,
}

const KEY_COLUMNS: &[output::Column] = &[
    ("ID", "/id"),
    ("NAME", "/name"),
    ("SCOPES", "/scopes"),
    ("QUEUES", "/queues"),
    ("EXPIRES", "/expires_at"),
    ("REVOKED", "/revoked_at"),
];

const AUDIT_COLUMNS: &[output::Column] = &[
    ("AT", "/at"),
    ("ACTOR", "/actor"),
    ("METHOD", "/method"),
    ("PATH", "/path"),
    ("STATUS", "/status"),
    ("SOURCE", "/source"),
];

pub async fn key(args: ClientArgs, cmd: KeyCommand) -> anyhow::Result<ExitCode> {
    let api = api(&args)?;
    let format = Format::resolve(args.output.as_deref());
    let answer = match cmd {
        KeyCommand::Create { name, scopes, queues, expires_in } => {
            let mut body = json!({"name": name, "scopes": scopes});
            if !queues.is_empty() {
                body["queues"] = json!(queues);
            }
            if let Some(e) = expires_in {
                body["expires_in"] = Value::from(e);
            }
            let created = call(&api, Method::POST, "/v1/keys", Some(&body)).await?;
            if format == Format::Table {
                let key = created["key"].as_str().unwrap_or_default();
                println!("{key}");
                eprintln!("key {} created: keep it now, it is not shown again", created["id"].as_str().unwrap_or("?"));
                return Ok(ExitCode::SUCCESS);
            }
            created
        }
        KeyCommand::List => {
            let answer = call(&api, Method::GET, "/v1/keys", None).await?;
            output::list(format, &answer, "keys", KEY_COLUMNS);
            return Ok(ExitCode::SUCCESS);
        }
        KeyCommand::Revoke { id } => {
            call(&api, Method::DELETE, &format!("/v1/keys/{}", crate::input::encode(&id)), None).await?
        }
    };
    output::one(format, &answer);
    Ok(ExitCode::SUCCESS)
}

pub async fn audit(args: AuditArgs) -> anyhow::Result<ExitCode> {
    let api = api(&args.client)?;
    let format = Format::resolve(args.client.output.as_deref());
    let mut query = format!("/v1/audit?limit={}", args.limit);
    if let Some(actor) = &args.actor {
        query.push_str(&format!("&actor={}", crate::input::encode(actor)));
    }
    if let Some(before) = args.before {
        query.push_str(&format!("&before={before}"));
    }
    let answer = call(&api, Method::GET, &query, None).await?;
    output::list(format, &answer, "entries", AUDIT_COLUMNS);
    Ok(ExitCode::SUCCESS)
}
