//! `composer init --lang python|typescript|rust DIR`: a starter project
//! with one workflow written in code, the worker that registers it and runs
//! its steps, and a test that runs it offline. The files are in the binary
//! (`crates/composer/templates/`); `{{COMPOSER_SDK}}` in them becomes the
//! Composer checkout whose clients the project uses.

use std::path::{Path, PathBuf};

use anyhow::Context;

/// A language `composer init` writes a starter in.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum Lang {
    Python,
    Typescript,
    Rust,
}

/// The placeholder for the Composer checkout's path.
const SDK: &str = "{{COMPOSER_SDK}}";

macro_rules! files {
    ($lang:literal: $($path:literal),+ $(,)?) => {
        &[$(($path, include_str!(concat!("../templates/", $lang, "/", $path)))),+]
    };
}

const PYTHON: &[(&str, &str)] = files!("python": "README.md", "pyproject.toml", "workflow.py", "test_workflow.py");
const TYPESCRIPT: &[(&str, &str)] = files!("typescript":
    "README.md", "package.json", "tsconfig.json", "src/workflow.ts", "test/workflow.test.ts");
const RUST: &[(&str, &str)] = files!("rust": "README.md", "Cargo.toml", "src/main.rs", "src/workflow.rs");

fn files_of(lang: Lang) -> &'static [(&'static str, &'static str)] {
    match lang {
        Lang::Python => PYTHON,
        Lang::Typescript => TYPESCRIPT,
        Lang::Rust => RUST,
    }
}

/// Writes the starter of `lang` into `dir` (which must not exist or be
/// empty), the clients taken from the Composer checkout `sdk` (found next
/// to this binary when not given). What to run next goes to stdout.
pub fn run(lang: Lang, dir: &Path, sdk: Option<&Path>) -> anyhow::Result<()> {
    if dir.exists() && std::fs::read_dir(dir).map(|mut d| d.next().is_some()).unwrap_or(true) {
        return Err(crate::input::usage(format!("{} exists and is not empty: name a new directory", dir.display())));
    }
    let files = files_of(lang);
    let needs_sdk = files.iter().any(|(_, text)| text.contains(SDK));
    let sdk = match (sdk, needs_sdk) {
        (Some(s), _) => Some(checkout(s)?),
        (None, true) => Some(beside_binary().ok_or_else(|| {
            crate::input::usage(
                "--sdk: no Composer checkout (with clients/ and crates/worker/) next to this binary: name one with --sdk DIR",
            )
        })?),
        (None, false) => None,
    };
    for (path, text) in files {
        let target = dir.join(path);
        if let Some(parent) = target.parent() {
            std::fs::create_dir_all(parent).with_context(|| format!("creating {}", parent.display()))?;
        }
        let text = match &sdk {
            Some(s) => text.replace(SDK, &s.to_string_lossy()),
            None => text.to_string(),
        };
        std::fs::write(&target, text).with_context(|| format!("writing {}", target.display()))?;
    }
    let next = match lang {
        Lang::Python => "pip install <composer>/clients/python && python3 -m unittest test_workflow.py",
        Lang::Typescript => "npm install && npm test",
        Lang::Rust => "cargo test",
    };
    crate::output::emit(&format!(
        "created {} ({} files); next: cd {} && {next} (README.md says the rest)\n",
        dir.display(),
        files.len(),
        dir.display()
    ));
    Ok(())
}

/// `dir` as a Composer checkout: absolute, with the clients in it.
fn checkout(dir: &Path) -> anyhow::Result<PathBuf> {
    let abs = std::fs::canonicalize(dir).map_err(|e| crate::input::usage(format!("--sdk {}: {e}", dir.display())))?;
    if is_checkout(&abs) {
        Ok(abs)
    } else {
        Err(crate::input::usage(format!(
            "--sdk {}: not a Composer checkout (no clients/ and crates/worker/ in it)",
            dir.display()
        )))
    }
}

fn is_checkout(dir: &Path) -> bool {
    dir.join("clients/typescript").is_dir() && dir.join("crates/worker").is_dir()
}

/// The checkout this binary was built in (`target/debug/composer`), if any.
fn beside_binary() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    exe.ancestors().skip(1).take(4).find(|d| is_checkout(d)).map(Path::to_path_buf)
}
