//! `${ .secrets.NAME }` in a task's input is resolved here, at execution,
//! from the worker's own environment (`COMPOSER_SECRET_NAME`). Coordinators
//! never see the value: it is not in PostgreSQL, on a stream, in the API or
//! in a log. Whatever the task reports back is scrubbed of the values used
//! ([`crate::scrub`] finds them in their encoded forms too), in case the
//! target echoes them. A secret may be bound to the hosts it may be sent to
//! (`COMPOSER_SECRET_NAME_HOSTS`), which the HTTP node enforces.

use composer_core::expr::{secret_name, segments, Segment};
use serde_json::Value;

use crate::scrub::Scrubber;

/// Where secret NAME comes from.
pub fn env_var(name: &str) -> String {
    format!("COMPOSER_SECRET_{name}")
}

/// Where the hosts secret NAME may be sent to come from.
pub fn hosts_var(name: &str) -> String {
    format!("COMPOSER_SECRET_{name}_HOSTS")
}

/// What ends the name of a host binding's variable; no secret's name ends so.
const HOSTS_SUFFIX: &str = "_HOSTS";

/// A secret a task uses.
#[derive(Clone)]
struct Secret {
    name: String,
    value: String,
    /// When set, the only hosts it may be sent to.
    hosts: Option<Vec<HostPattern>>,
}

/// `api.example.com`, or `*.example.com` for any host under it (not itself).
#[derive(Clone, Debug, PartialEq)]
enum HostPattern {
    Exact(String),
    Under(String),
}

impl HostPattern {
    fn parse(text: &str) -> Option<HostPattern> {
        let text = text.trim().to_ascii_lowercase();
        let (under, host) = match text.strip_prefix("*.") {
            Some(rest) => (true, rest.to_string()),
            None => (false, text),
        };
        let valid = !host.is_empty()
            && !host.starts_with('.')
            && host.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | ':' | '[' | ']'));
        let host = host.trim_start_matches('[').trim_end_matches(']').to_string();
        valid.then_some(if under { HostPattern::Under(host) } else { HostPattern::Exact(host) })
    }

    fn allows(&self, host: &str) -> bool {
        match self {
            HostPattern::Exact(h) => h == host,
            HostPattern::Under(parent) => {
                host.strip_suffix(parent.as_str()).is_some_and(|sub| sub.len() > 1 && sub.ends_with('.'))
            }
        }
    }
}

impl std::fmt::Display for HostPattern {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HostPattern::Exact(h) => f.write_str(h),
            HostPattern::Under(h) => write!(f, "*.{h}"),
        }
    }
}

/// A bound secret that may not be sent to a host.
#[derive(Debug, Clone, PartialEq)]
pub struct Refusal {
    /// The secret's name (never its value).
    pub name: String,
    /// The hosts it may be sent to, as configured.
    pub hosts: String,
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "secret {} may be sent only to {} ({})", self.name, self.hosts, hosts_var(&self.name))
    }
}

/// The secrets one task uses: what to scrub from its result, what its
/// errors must not quote, and where the bound ones may go. Shows only
/// names when printed.
#[derive(Clone, Default)]
pub struct Secrets {
    used: Vec<Secret>,
    scrubber: Scrubber,
    /// Finds short secrets in every form too (see [`Secrets::holds`]).
    detector: Scrubber,
}

impl std::fmt::Debug for Secrets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.used.iter().map(|s| &s.name)).finish()
    }
}

impl Secrets {
    pub fn is_empty(&self) -> bool {
        self.used.is_empty()
    }

    /// Whether `text` holds one of the values, in any form scrubbing finds
    /// (for a short secret too, in any case or encoding): such text is
    /// never quoted in an error.
    pub fn holds(&self, text: &str) -> bool {
        !self.detector.is_empty() && self.detector.finds(text)
    }

    /// Names of the secrets bound to hosts.
    pub fn bound(&self) -> impl Iterator<Item = &str> {
        self.used.iter().filter(|s| s.hosts.is_some()).map(|s| s.name.as_str())
    }

    /// The first bound secret that may not be sent to `host`.
    pub fn refused_for(&self, host: &str) -> Option<Refusal> {
        let host = host.trim_start_matches('[').trim_end_matches(']').to_ascii_lowercase();
        self.used.iter().find_map(|s| {
            let hosts = s.hosts.as_ref()?;
            (!hosts.iter().any(|h| h.allows(&host))).then(|| Refusal {
                name: s.name.clone(),
                hosts: hosts.iter().map(ToString::to_string).collect::<Vec<_>>().join(","),
            })
        })
    }

    /// `text` with the values replaced by `[secret]`.
    pub fn scrub_str(&self, text: &str) -> String {
        if self.scrubber.is_empty() {
            return text.to_string();
        }
        self.scrubber.scrub(text)
    }

    /// Scrubs `message`, then cuts it to [`MAX_ERROR_CHARS`].
    pub fn scrub_message(&self, message: &str) -> String {
        let scrubbed = self.scrub_str(message);
        if scrubbed.chars().count() <= MAX_ERROR_CHARS {
            return scrubbed;
        }
        let mut cut: String = scrubbed.chars().take(MAX_ERROR_CHARS).collect();
        cut.push('…');
        cut
    }

    /// Replaces the values anywhere in `v`, keys included.
    pub fn scrub(&self, v: &mut Value) {
        if self.scrubber.is_empty() {
            return;
        }
        match v {
            Value::String(s) if self.scrubber.finds(s) => *s = self.scrubber.scrub(s),
            Value::Array(items) => items.iter_mut().for_each(|i| self.scrub(i)),
            Value::Object(map) => {
                if map.keys().any(|k| self.scrubber.finds(k)) {
                    *map = std::mem::take(map)
                        .into_iter()
                        .map(|(k, v)| (if self.scrubber.finds(&k) { self.scrubber.scrub(&k) } else { k }, v))
                        .collect();
                }
                map.values_mut().for_each(|i| self.scrub(i));
            }
            _ => {}
        }
    }
}

/// Replaces every secret reference in `input`; returns the secrets used, or
/// why one cannot be (an unknown secret, a malformed binding): a failure of
/// the attempt, not retryable.
pub fn resolve(input: &Value) -> Result<(Value, Secrets), String> {
    resolve_from(input, Source::Environment)
}

/// Where a task's secrets come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// The worker's environment (`COMPOSER_SECRET_NAME`).
    Environment,
    /// Nowhere: a coordinator's own HTTP executor holds no secret (it is
    /// never handed a step that reads one; one that did would fail).
    Nothing,
}

/// [`resolve`], with secrets from `source`.
pub fn resolve_from(input: &Value, source: Source) -> Result<(Value, Secrets), String> {
    let mut used = Vec::new();
    let out = walk(input, &mut used, source)?;
    let values = || used.iter().map(|s: &Secret| s.value.as_str());
    let (scrubber, detector) = (Scrubber::new(values()), Scrubber::detector(values()));
    Ok((out, Secrets { used, scrubber, detector }))
}

fn walk(v: &Value, used: &mut Vec<Secret>, source: Source) -> Result<Value, String> {
    Ok(match v {
        Value::String(s) if s.contains("${") => Value::String(resolve_str(s, used, source)?),
        Value::Array(items) => Value::Array(items.iter().map(|i| walk(i, used, source)).collect::<Result<_, _>>()?),
        Value::Object(map) => {
            let mut out = serde_json::Map::new();
            for (k, item) in map {
                out.insert(unescape_key(k), walk(item, used, source)?);
            }
            Value::Object(out)
        }
        other => other.clone(),
    })
}

/// Keys never reference secrets; an escaped `$${` in one is the text `${`.
fn unescape_key(k: &str) -> String {
    if !k.contains("$${") {
        return k.to_string();
    }
    match segments(k) {
        Ok(parts) => parts
            .into_iter()
            .map(|p| match p {
                Segment::Text(t) => t,
                Segment::Escaped => "${",
                Segment::Expr { raw, .. } => raw,
            })
            .collect(),
        Err(_) => k.to_string(),
    }
}

fn resolve_str(s: &str, used: &mut Vec<Secret>, from: Source) -> Result<String, String> {
    // Text the template compiler accepted always scans; anything else is text.
    let Ok(segments) = segments(s) else { return Ok(s.to_string()) };
    let mut out = String::with_capacity(s.len());
    for segment in segments {
        match segment {
            Segment::Text(text) => out.push_str(text),
            // Data placed in the input by the coordinator: text, never a reference.
            Segment::Escaped => out.push_str("${"),
            Segment::Expr { source, raw } => match secret_name(source) {
                Some(name) if from == Source::Nothing => {
                    return Err(format!(
                        "secret {name} cannot be read here: a coordinator runs no step that reads a secret"
                    ))
                }
                Some(name) => out.push_str(&lookup(name, used)?.value),
                None => out.push_str(raw),
            },
        }
    }
    Ok(out)
}

/// The secret `name`, read from the environment the first time a task uses it.
fn lookup<'a>(name: &str, used: &'a mut Vec<Secret>) -> Result<&'a Secret, String> {
    if let Some(i) = used.iter().position(|s| s.name == name) {
        return Ok(&used[i]);
    }
    if let Some(bound) = name.strip_suffix(HOSTS_SUFFIX) {
        return Err(format!("{name} is not a secret: {} holds the hosts secret {bound} may be sent to", env_var(name)));
    }
    let value = std::env::var(env_var(name))
        .map_err(|_| format!("unknown secret {name}: set {} in the worker's environment", env_var(name)))?;
    let hosts = match std::env::var(hosts_var(name)) {
        Err(_) => None,
        Ok(list) => Some(parse_hosts(name, &list)?),
    };
    used.push(Secret { name: name.to_string(), value, hosts });
    Ok(&used[used.len() - 1])
}

/// A comma-separated list of hosts, `*.example.com` for any host under one.
fn parse_hosts(name: &str, list: &str) -> Result<Vec<HostPattern>, String> {
    let var = hosts_var(name);
    let hosts = list
        .split(',')
        .filter(|h| !h.trim().is_empty())
        .map(|h| HostPattern::parse(h).ok_or_else(|| format!("{var}: {:?} is not a host (nor *.domain)", h.trim())))
        .collect::<Result<Vec<_>, _>>()?;
    if hosts.is_empty() {
        return Err(format!("{var} is set but names no host: secret {name} could be sent nowhere"));
    }
    Ok(hosts)
}

/// The longest error message a task reports, cut after scrubbing so that
/// a secret is never cut in two and half of it kept.
pub const MAX_ERROR_CHARS: usize = 500;

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A coordinator's executor reads no secret, even one its environment
    /// has; escaped data is still text.
    #[test]
    fn with_no_source_a_reference_fails_naming_it_and_data_stays_text() {
        std::env::set_var("COMPOSER_SECRET_UNIT_NOWHERE", "must-not-leak");
        let refused = resolve_from(&json!({"h": "Bearer ${ .secrets.UNIT_NOWHERE }"}), Source::Nothing).unwrap_err();
        assert!(refused.contains("UNIT_NOWHERE") && !refused.contains("must-not-leak"), "{refused}");
        let (v, used) = resolve_from(&json!({"b": "$${ .secrets.UNIT_NOWHERE }"}), Source::Nothing).unwrap();
        assert_eq!(v, json!({"b": "${ .secrets.UNIT_NOWHERE }"}));
        assert!(used.is_empty());
    }

    #[test]
    fn resolves_from_the_environment_and_scrubs_echoes() {
        std::env::set_var("COMPOSER_SECRET_UNIT_TOKEN", "tok-123");
        let (v, used) = resolve(&json!({"h": {"Authorization": "Bearer ${ .secrets.UNIT_TOKEN }"}, "n": 1})).unwrap();
        assert_eq!(v, json!({"h": {"Authorization": "Bearer tok-123"}, "n": 1}));
        let mut echoed = json!({"headers": {"authorization": "Bearer tok-123"}});
        used.scrub(&mut echoed);
        assert_eq!(echoed, json!({"headers": {"authorization": "Bearer [secret]"}}));
        assert_eq!(format!("{used:?}"), r#"["UNIT_TOKEN"]"#, "printed by name only");
        let e = resolve(&json!("${.secrets.NOPE_NOT_SET}")).unwrap_err();
        assert!(e.contains("COMPOSER_SECRET_NOPE_NOT_SET"), "{e}");
    }

    #[test]
    fn a_reference_arriving_as_data_is_sent_as_text() {
        std::env::set_var("COMPOSER_SECRET_UNIT_PAY", "pay-secret");
        // The coordinator escapes data; only the definition's own text is a reference.
        let input = composer_core::expr::escape_data(json!({"m": "${ .secrets.UNIT_PAY }", "${k}": "$${x}"}));
        let (v, used) = resolve(&input).unwrap();
        assert_eq!(v, json!({"m": "${ .secrets.UNIT_PAY }", "${k}": "$${x}"}), "data comes out as it went in");
        assert!(used.is_empty());
    }

    #[test]
    fn keys_are_scrubbed_and_messages_cut_after_scrubbing() {
        std::env::set_var("COMPOSER_SECRET_UNIT_KEYS", "s3cr3t-value");
        let (_, secrets) = resolve(&json!("${ .secrets.UNIT_KEYS }")).unwrap();
        let mut echoed = json!({"S3CR3T-VALUE": {"x": "s3cr3t%2Dvalue"}});
        secrets.scrub(&mut echoed);
        assert_eq!(echoed, json!({"[secret]": {"x": "[secret]"}}));
        let message = format!("{}s3cr3t-value", "x".repeat(MAX_ERROR_CHARS - 4));
        let cut = secrets.scrub_message(&message);
        assert!(!cut.contains("s3cr"), "no part of a secret survives the cut: {cut}");
    }

    #[test]
    fn a_bound_secret_names_the_hosts_it_may_go_to() {
        std::env::set_var("COMPOSER_SECRET_UNIT_STRIPE", "sk-live-1234");
        std::env::set_var("COMPOSER_SECRET_UNIT_STRIPE_HOSTS", "api.stripe.com, *.Stripe.com,[::1]");
        std::env::set_var("COMPOSER_SECRET_UNIT_FREE", "free-5678");
        let (_, secrets) = resolve(&json!(["${ .secrets.UNIT_STRIPE }", "${ .secrets.UNIT_FREE }"])).unwrap();
        assert_eq!(secrets.bound().collect::<Vec<_>>(), ["UNIT_STRIPE"]);
        for host in ["api.stripe.com", "API.STRIPE.COM", "files.stripe.com", "a.b.stripe.com", "[::1]"] {
            assert_eq!(secrets.refused_for(host), None, "{host}");
        }
        for host in ["stripe.com", "evil.com", "api.stripe.com.evil.com", "notstripe.com", "127.0.0.1"] {
            let refusal = secrets.refused_for(host).expect(host);
            assert_eq!(refusal.name, "UNIT_STRIPE");
            let text = refusal.to_string();
            assert!(text.contains("api.stripe.com,*.stripe.com") && text.contains("UNIT_STRIPE_HOSTS"), "{text}");
            assert!(!text.contains("sk-live"), "{text}");
        }
    }

    #[test]
    fn a_malformed_binding_or_a_binding_used_as_a_secret_fails_the_attempt() {
        std::env::set_var("COMPOSER_SECRET_UNIT_BAD", "bad-value-1");
        std::env::set_var("COMPOSER_SECRET_UNIT_BAD_HOSTS", "api.example.com,/etc/passwd");
        let e = resolve(&json!("${ .secrets.UNIT_BAD }")).unwrap_err();
        assert!(e.contains("COMPOSER_SECRET_UNIT_BAD_HOSTS") && e.contains("/etc/passwd"), "{e}");
        assert!(!e.contains("bad-value-1"), "{e}");
        std::env::set_var("COMPOSER_SECRET_UNIT_NOWHERE", "nowhere-1");
        std::env::set_var("COMPOSER_SECRET_UNIT_NOWHERE_HOSTS", " , ");
        assert!(resolve(&json!("${ .secrets.UNIT_NOWHERE }")).unwrap_err().contains("names no host"));
        let e = resolve(&json!("${ .secrets.UNIT_BAD_HOSTS }")).unwrap_err();
        assert!(e.contains("is not a secret"), "{e}");
    }
}
