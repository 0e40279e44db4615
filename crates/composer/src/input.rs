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

/// Percent-encodes a path segment or a query value the command line was
/// given (every command's URLs are made with it).
pub use composer_api::rest::encode;

/// A workflow definition from a file, refusing by name a schedule's or a
/// webhook's file given to `workflow apply` (the server would say only that
/// their fields are unknown to a definition).
pub fn read_definition(file: &std::path::Path) -> anyhow::Result<Value> {
    let spec = read_spec(file)?;
    if let Some(kind) = other_kind(&spec) {
        let (what, command) = kind;
        return Err(usage(format!(
            "{} is {what}, not a workflow definition: register it with `composer {command} create -f {}`",
            file.display(),
            file.display()
        )));
    }
    Ok(spec)
}

/// What a file without `nodes` looks like instead: a schedule (a `cron`) or
/// a webhook (a `scheme`).
fn other_kind(spec: &Value) -> Option<(&'static str, &'static str)> {
    let o = spec.as_object()?;
    if o.contains_key("nodes") {
        return None;
    }
    if o.contains_key("cron") {
        Some(("a schedule (it has a cron)", "schedule"))
    } else if o.contains_key("scheme") {
        Some(("a webhook (it has a scheme)", "webhook"))
    } else {
        None
    }
}

/// JSON from an argument, from the file `@FILE` names, or from standard
/// input for `@-`.
pub fn json_arg(flag: &str, arg: &str) -> anyhow::Result<Value> {
    let (text, from) = match arg.strip_prefix('@') {
        Some("-") => {
            let mut text = String::new();
            std::io::Read::read_to_string(&mut std::io::stdin(), &mut text)
                .map_err(|e| usage(format!("{flag} @-: standard input: {e}")))?;
            (text, "standard input")
        }
        Some(path) => (std::fs::read_to_string(path).map_err(|e| usage(format!("{flag} {arg}: {e}")))?, path),
        None => (arg.to_string(), "the argument"),
    };
    serde_json::from_str(&text).map_err(|e| usage(format!("{flag}: {from} is not valid JSON: {e}")))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::other_kind;

    #[test]
    fn a_schedule_or_a_webhook_is_told_from_a_definition() {
        assert_eq!(
            other_kind(&json!({"id": "n", "cron": "0 2 * * *", "workflow": "w"})).map(|k| k.1),
            Some("schedule")
        );
        assert_eq!(
            other_kind(&json!({"name": "stripe", "scheme": "stripe", "secret": "S"})).map(|k| k.1),
            Some("webhook")
        );
        assert_eq!(other_kind(&json!({"name": "w", "nodes": [], "cron": 1})), None, "a definition, however odd");
        assert_eq!(other_kind(&json!({"name": "w"})), None, "left to the server to refuse");
    }
}
