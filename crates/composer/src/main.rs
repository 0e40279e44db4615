//! `composer`: the one binary. Server roles (`dev`, `coordinator`, `worker`,
//! `migrate`) and the client commands that talk to a coordinator's API.
//!
//! - `cli`: the commands and their flags; `dev`: the server roles and the
//!   embedded services; `client`: the commands that call the API (through
//!   `connect`: the coordinator's URL and token, and the one call), `output`
//!   how they print, `input` the files they read; `access`: API keys and
//!   the audit log; `approval`: the approvals inbox and decisions;
//!   `simulate`: a definition
//!   offline; `diff`: a definition against a registered version; `init`: a
//!   starter project in code; `bench`: `composer bench`.

#![allow(clippy::print_stderr)] // a command-line tool: its errors and progress go to stderr

mod access;
mod approval;
mod bench;
mod cli;
mod client;
mod connect;
mod dev;
mod diff;
mod init;
mod input;
mod output;
mod simulate;

use std::process::ExitCode;

use clap::Parser;

use crate::cli::{Cli, Command};

/// mimalloc rather than the system's malloc: about a fifth of the
/// coordinator's samples were in glibc's allocator (docs/performance-log.md,
/// "The allocator, and the flow-control round").
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let var = cli::env_var_of_error(&e).filter(|v| std::env::var_os(v).is_some());
            let _ = e.print();
            if let Some(var) = var {
                eprintln!("note: the value comes from the environment variable {var}");
            }
            // --help and --version are answers, not usage errors.
            return ExitCode::from(if e.use_stderr() { 2 } else { 0 });
        }
    };
    init_logging(&cli.log);
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        // Expressions evaluated on these threads get `expr_max_time`.
        .on_thread_start(|| composer_core::expr::use_clock(std::time::Instant::now))
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = match cli.command {
        Command::Dev(args) => dev::dev(&runtime, *args),
        Command::Coordinator(args) => runtime.block_on(dev::coordinator(*args)),
        Command::Worker(config) => runtime.block_on(dev::worker(*config)),
        Command::Migrate(args) => runtime.block_on(dev::migrate(args)),
        Command::Workflow(args) => runtime.block_on(client::workflow(args.client, args.command)),
        Command::Run(args) => runtime.block_on(client::run(args.client, args.command)),
        Command::Event(args) => runtime.block_on(client::event(args.client, args.command)),
        Command::Schedule(args) => runtime.block_on(client::schedule(args.client, args.command)),
        Command::Webhook(args) => runtime.block_on(client::webhook(args.client, args.command)),
        Command::Limit(args) => runtime.block_on(client::limit(args.client, args.command)),
        Command::Key(args) => runtime.block_on(access::key(args.client, args.command)),
        Command::Approval(args) => runtime.block_on(approval::approval(args.client, args.command)),
        Command::Audit(args) => runtime.block_on(access::audit(args)),
        Command::Namespace(args) => runtime.block_on(access::namespace(args.client, args.command)),
        Command::Completions { shell } => {
            let mut command = <Cli as clap::CommandFactory>::command();
            let mut script = Vec::new();
            clap_complete::generate(shell, &mut command, "composer", &mut script);
            // A closed pipe (`| head`) is not an error worth a panic.
            let _ = std::io::Write::write_all(&mut std::io::stdout(), &script);
            Ok(ExitCode::SUCCESS)
        }
        Command::Bench(args) => runtime.block_on(bench::bench(args)),
        Command::Init { lang, dir, sdk } => init::run(lang, &dir, sdk.as_deref()).map(|()| ExitCode::SUCCESS),
    };
    // What a stop left behind on the runtime's blocking threads (an export
    // to a receiver that does not answer) does not hold the exit.
    runtime.shutdown_background();
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {}", error_text(&e));
            ExitCode::from(client::exit_code(&e))
        }
    }
}

/// An error and its causes, as `{:#}` writes them, without a cause that
/// the text before it already says (an error that quotes its source).
fn error_text(e: &anyhow::Error) -> String {
    let mut text = e.to_string();
    for cause in e.chain().skip(1) {
        let cause = cause.to_string();
        if !text.contains(&cause) {
            text.push_str(": ");
            text.push_str(&cause);
        }
    }
    text
}

fn init_logging(log: &cli::LogArgs) {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_new(&log.level).unwrap_or_else(|_| EnvFilter::new("info"));
    use std::io::IsTerminal;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal());
    if log.format == "json" {
        builder.json().init();
    } else {
        builder.init();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cause_the_error_already_quotes_is_not_said_twice() {
        #[derive(Debug, thiserror::Error)]
        #[error("invalid configuration: {0}")]
        struct Outer(#[source] std::io::Error);
        let e = anyhow::Error::new(Outer(std::io::Error::other("--x (X) must be 1")));
        assert_eq!(error_text(&e), "invalid configuration: --x (X) must be 1");
        let e = anyhow::Error::new(std::io::Error::other("refused")).context("cannot connect");
        assert_eq!(error_text(&e), "cannot connect: refused");
    }
}
