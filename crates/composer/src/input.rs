//! What the command line reads besides flags: definitions from JSON or
//! YAML files, and the failure (with its exit status) a bad one gives.

use serde_json::Value;

/// Why a client command stopped, with its exit status (`cli::EXIT_STATUS`).
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct Failure {
    pub code: u8,
    pub message: String,
}

pub const RUN_FAILED: u8 = 1;
pub const USAGE: u8 = 2;
pub const NOT_FOUND: u8 = 3;
pub const UNAVAILABLE: u8 = 4;
pub const WAIT_TIMED_OUT: u8 = 5;

pub fn usage(message: impl Into<String>) -> anyhow::Error {
    Failure { code: USAGE, message: message.into() }.into()
}

/// A definition from a JSON or YAML file (by its extension), or from
/// standard input for `-` (JSON or YAML: YAML reads JSON too).
pub fn read_spec(file: &std::path::Path) -> anyhow::Result<Value> {
    let stdin = file.as_os_str() == "-";
    let text = if stdin {
        let mut text = String::new();
        std::io::Read::read_to_string(&mut std::io::stdin(), &mut text)
            .map_err(|e| usage(format!("standard input: {e}")))?;
        text
    } else {
        std::fs::read_to_string(file).map_err(|e| usage(format!("cannot read {}: {e}", file.display())))?
    };
    let is_yaml = stdin || matches!(file.extension().and_then(|e| e.to_str()), Some("yaml" | "yml"));
    Ok(if is_yaml {
        yaml_serde::from_str(&text).map_err(|e| usage(format!("{} is not valid YAML: {e}", file.display())))?
    } else {
        serde_json::from_str(&text).map_err(|e| usage(format!("{} is not valid JSON: {e}", file.display())))?
    })
}
