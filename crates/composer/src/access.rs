//! `composer key` (API keys: create, list, revoke), `composer audit` (the
//! audit log) and `composer namespace` (create, list, describe, delete).

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
        /// The only namespace the key may act in (every namespace by default).
        #[arg(long = "bind", value_name = "NAMESPACE")]
        bind: Option<String>,
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
    ("NAMESPACE", "/namespace"),
];

#[derive(Args)]
pub struct NamespaceArgs {
    #[command(flatten)]
    pub client: ClientArgs,
    #[command(subcommand)]
    pub command: NamespaceCommand,
}

#[derive(Subcommand)]
pub enum NamespaceCommand {
    /// Creates a namespace (answers it when it exists).
    Create {
        /// 1 to 63 lowercase letters, digits and '-', starting with a letter.
        name: String,
        /// What the namespace is for (at most 1000 characters).
        #[arg(long, default_value = "")]
        description: String,
    },
    /// Lists namespaces, `default` first.
    List,
    /// Describes one namespace.
    Describe {
        /// The namespace.
        name: String,
    },
    /// Sets a namespace's quotas, every one at once (one left out is none).
    Quotas {
        /// The namespace.
        name: String,
        /// Most runs queued, running or paused at once.
        #[arg(long)]
        open_runs: Option<i64>,
        /// Most runs started from outside a run (the API, schedules, triggers) in one second.
        #[arg(long)]
        starts_per_second: Option<i64>,
        /// Most schedules.
        #[arg(long)]
        schedules: Option<i64>,
        /// Most limit keys with values.
        #[arg(long)]
        limits: Option<i64>,
        /// Most bytes its tables and indexes may hold.
        #[arg(long)]
        stored_bytes: Option<i64>,
    },
    /// Deletes a namespace with everything it holds (a job: done some 15 s later).
    Delete {
        /// The namespace.
        name: String,
    },
}

const NAMESPACE_COLUMNS: &[output::Column] = &[
    ("NAME", "/name"),
    ("STATE", "/state"),
    ("CREATED", "/created_at"),
    ("BY", "/created_by"),
    ("DESCRIPTION", "/description"),
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
        KeyCommand::Create { name, scopes, queues, expires_in, bind } => {
            let mut body = json!({"name": name, "scopes": scopes});
            if !queues.is_empty() {
                body["queues"] = json!(queues);
            }
            if let Some(e) = expires_in {
                body["expires_in"] = Value::from(e);
            }
            if let Some(n) = bind {
                body["namespace"] = Value::from(n);
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

pub async fn namespace(args: ClientArgs, cmd: NamespaceCommand) -> anyhow::Result<ExitCode> {
    let api = api(&args)?;
    let format = Format::resolve(args.output.as_deref());
    let path = |name: &str| format!("/v1/namespaces/{}", crate::input::encode(name));
    let answer = match cmd {
        NamespaceCommand::Create { name, description } => {
            let body = json!({"name": name, "description": description});
            call(&api, Method::POST, "/v1/namespaces", Some(&body)).await?
        }
        NamespaceCommand::List => {
            let answer = call(&api, Method::GET, "/v1/namespaces", None).await?;
            output::list(format, &answer, "namespaces", NAMESPACE_COLUMNS);
            return Ok(ExitCode::SUCCESS);
        }
        NamespaceCommand::Describe { name } => call(&api, Method::GET, &path(&name), None).await?,
        NamespaceCommand::Delete { name } => call(&api, Method::DELETE, &path(&name), None).await?,
        NamespaceCommand::Quotas { name, open_runs, starts_per_second, schedules, limits, stored_bytes } => {
            let body = json!({"open_runs": open_runs, "starts_per_second": starts_per_second, "schedules": schedules, "limits": limits, "stored_bytes": stored_bytes});
            let body = Value::Object(
                body.as_object()
                    .into_iter()
                    .flatten()
                    .filter(|(_, v)| !v.is_null())
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect(),
            );
            call(&api, Method::PUT, &format!("{}/quotas", path(&name)), Some(&body)).await?
        }
    };
    output::one(format, &answer);
    Ok(ExitCode::SUCCESS)
}
