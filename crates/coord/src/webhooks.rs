//! Webhooks: a delivery from another service, signed with a secret both
//! sides hold, turned into an event ([`crate::triggers::send`]). This
//! module is the pure part — checking a spec, reading and verifying a
//! signature, naming a delivery — so that it can be tested without a
//! server; `http::webhooks` serves it.
//!
//! The secret is never stored: a webhook names it, and each coordinator
//! reads `COMPOSER_WEBHOOK_SECRET_<NAME>` from its environment. The
//! signature is compared in constant time (ring's `hmac::verify`), and a
//! delivery that fails any check records nothing.

use std::time::Duration;

use composer_api::{WebhookScheme, WebhookSpec};
use composer_core::expr::{Sandbox, Template};
use ring::hmac;
use serde_json::{json, Value};

/// The default timestamp tolerance (`webhook_tolerance`).
pub const DEFAULT_TOLERANCE: Duration = Duration::from_secs(300);
/// The longest tolerance a webhook may set.
pub const MAX_TOLERANCE: Duration = composer_api::MAX_WEBHOOK_TOLERANCE;
/// Most headers of a delivery its transform sees (the rest are dropped).
pub const MAX_HEADERS: usize = 100;
/// Longest header value its transform sees, in bytes.
pub const MAX_HEADER_VALUE: usize = 4096;

/// The environment variable holding webhook secret `name`.
pub fn secret_var(name: &str) -> String {
    format!("COMPOSER_WEBHOOK_SECRET_{name}")
}

/// A webhook spec, checked: its tolerance and compiled transform.
pub struct Webhook {
    pub spec: WebhookSpec,
    pub tolerance: Duration,
    pub event: Option<Template>,
}

/// The subject of namespace `namespace`'s webhook `name` in the flight
/// recorder and the quarantine, which are kept once for every namespace:
/// its name, after its namespace's but in `default`.
pub fn subject(namespace: &str, name: &str) -> crate::engine::flight::Subject {
    match namespace == composer_store::namespaces::DEFAULT {
        true => crate::engine::flight::Subject::Webhook(name.to_string()),
        false => crate::engine::flight::Subject::Webhook(format!("{namespace}/{name}")),
    }
}

/// Checks a spec of namespace `namespace` (compiling its transform on a
/// thread with the evaluation stack, its subject in the flight recorder);
/// the error names the field.
pub fn parse(spec: WebhookSpec, namespace: &str) -> Result<Webhook, String> {
    let subject = subject(namespace, &spec.name);
    composer_core::expr::on_eval_stack(|| crate::engine::flight::recording(&subject, || check(spec)))
        .and_then(|checked| checked)
}

fn check(spec: WebhookSpec) -> Result<Webhook, String> {
    let tolerance = tolerance(&spec)?;
    let event = match &spec.event {
        None => None,
        Some(v) if v.to_string().contains(".secrets") => {
            return Err("event: a webhook's transform cannot read secrets".into());
        }
        Some(v) => Some(Template::compile(v).map_err(|(p, m)| format!("event{p}: {m}"))?),
    };
    Ok(Webhook { spec, tolerance, event })
}

/// What a delivery's signature is checked with, from a spec, without
/// compiling its transform (a delivery compiles it only once its signature
/// holds): the spec's name and secret name checked, and its tolerance.
pub fn tolerance(spec: &WebhookSpec) -> Result<Duration, String> {
    composer_core::definition::check_name("name", &spec.name).map_err(|e| e.to_string())?;
    if spec.secret.is_empty()
        || spec.secret.len() > 64
        || !spec.secret.bytes().all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_')
    {
        return Err("secret: the name of a secret is 1 to 64 of A-Z, 0-9 and '_' (never the secret itself)".into());
    }
    match spec.tolerance.as_deref() {
        None => Ok(DEFAULT_TOLERANCE),
        Some(t) => {
            let d = composer_core::duration::parse(t).map_err(|e| format!("tolerance: {e}"))?;
            if d.is_zero() || d > MAX_TOLERANCE {
                return Err("tolerance: must be more than 0 and at most 1h".into());
            }
            Ok(d)
        }
    }
}

/// Why a delivery is refused (a 401 that records nothing).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    #[error("no {0} header: the delivery is not signed")]
    Missing(&'static str),
    #[error("the {0} header is malformed")]
    Malformed(&'static str),
    #[error("the signature does not match the body (or the secret differs)")]
    Mismatch,
    #[error("the signed timestamp is {age} s from now, past the tolerance of {tolerance} s (a replay?)")]
    Stale { age: i64, tolerance: u64 },
}

/// The header a scheme's signature is in.
pub fn signature_header(scheme: WebhookScheme) -> &'static str {
    match scheme {
        WebhookScheme::Stripe => "stripe-signature",
        WebhookScheme::Github => "x-hub-signature-256",
    }
}

/// Verifies a delivery's signature (`header`: the scheme's header, if
/// sent) against `body` at `now` (Unix seconds); the signed timestamp, for
/// a scheme that signs one.
pub fn verify(
    scheme: WebhookScheme,
    secret: &[u8],
    header: Option<&str>,
    body: &[u8],
    now: i64,
    tolerance: Duration,
) -> Result<Option<i64>, Refused> {
    let name = signature_header(scheme);
    let header = header.ok_or(Refused::Missing(name))?;
    let key = hmac::Key::new(hmac::HMAC_SHA256, secret);
    match scheme {
        WebhookScheme::Github => {
            let hex = header.strip_prefix("sha256=").ok_or(Refused::Malformed(name))?;
            let tag = from_hex(hex).ok_or(Refused::Malformed(name))?;
            hmac::verify(&key, body, &tag).map(|()| None).map_err(|_| Refused::Mismatch)
        }
        WebhookScheme::Stripe => {
            let mut timestamp = None;
            let mut tags = Vec::new();
            for part in header.split(',') {
                match part.trim().split_once('=') {
                    Some(("t", t)) => timestamp = Some(t.parse::<i64>().map_err(|_| Refused::Malformed(name))?),
                    Some(("v1", hex)) => tags.push(from_hex(hex).ok_or(Refused::Malformed(name))?),
                    Some(_) => {} // other schemes (v0) are not ours
                    None => return Err(Refused::Malformed(name)),
                }
            }
            let t = timestamp.ok_or(Refused::Malformed(name))?;
            if tags.is_empty() || tags.len() > 8 {
                return Err(Refused::Malformed(name));
            }
            let age = now.saturating_sub(t);
            if age.unsigned_abs() > tolerance.as_secs() {
                return Err(Refused::Stale { age, tolerance: tolerance.as_secs() });
            }
            let mut signed = Vec::with_capacity(body.len() + 24);
            signed.extend_from_slice(t.to_string().as_bytes());
            signed.push(b'.');
            signed.extend_from_slice(body);
            // Every tag is checked, so the time taken does not say which matched.
            let matched = tags.iter().fold(false, |m, tag| hmac::verify(&key, &signed, tag).is_ok() | m);
            if matched {
                Ok(Some(t))
            } else {
                Err(Refused::Mismatch)
            }
        }
    }
}

fn from_hex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) || text.len() > 256 {
        return None;
    }
    (0..text.len()).step_by(2).map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok()).collect()
}

/// A delivery's id, from what was signed only (an unsigned header, such
/// as GitHub's `X-GitHub-Delivery`, could be changed to replay it): Stripe's
/// event `id` in the body, else a digest of the signed timestamp and the
/// body. A replay is then the same event however its headers were written.
pub fn delivery_id(scheme: WebhookScheme, body: &Value, raw: &[u8], signed_at: Option<i64>) -> String {
    if let (WebhookScheme::Stripe, Some(id)) = (scheme, body.get("id").and_then(Value::as_str)) {
        if !id.is_empty() && id.chars().count() <= 256 {
            return id.to_string();
        }
    }
    let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
    if let Some(t) = signed_at {
        ctx.update(format!("{t}.").as_bytes());
    }
    ctx.update(raw);
    let hex: String = ctx.finish().as_ref().iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256:{hex}")
}

/// The event a delivery becomes: the transform's `{name, key?, id?,
/// payload?}`, or by default the webhook's name, the delivery's id and the
/// body. An error names what is wrong with the transform's answer.
pub fn event_of(
    sb: &Sandbox,
    hook: &Webhook,
    body: &Value,
    headers: &Value,
    id: String,
) -> Result<WebhookEvent, String> {
    let Some(t) = &hook.event else {
        return Ok(WebhookEvent {
            name: hook.spec.name.clone(),
            key: String::new(),
            id: Some(id),
            payload: body.clone(),
        });
    };
    let out = t.eval(sb, &json!({"body": body, "headers": headers})).map_err(|e| format!("event: {e}"))?;
    let Value::Object(mut o) = out else {
        let shown = composer_core::clipped(&out.to_string(), 200);
        return Err(format!("event: must yield an object {{name, key?, id?, payload?}}, got {shown}"));
    };
    let text = |o: &mut serde_json::Map<String, Value>, field: &str| -> Result<Option<String>, String> {
        match o.remove(field) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(Value::Number(n)) => Ok(Some(n.to_string())),
            Some(other) => {
                Err(format!("event: {field} must be text, got {}", composer_core::clipped(&other.to_string(), 200)))
            }
        }
    };
    let name = text(&mut o, "name")?.ok_or("event: yields no name")?;
    let key = text(&mut o, "key")?.unwrap_or_default();
    let id = text(&mut o, "id")?.or(Some(id));
    let payload = o.remove("payload").unwrap_or_else(|| body.clone());
    if let Some(extra) = o.keys().next() {
        return Err(format!("event: unknown field {extra:?} (name, key, id, payload)"));
    }
    Ok(WebhookEvent { name, key, id, payload })
}

/// What a delivery became.
#[derive(Debug, Clone, PartialEq)]
pub struct WebhookEvent {
    pub name: String,
    pub key: String,
    pub id: Option<String>,
    pub payload: Value,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_webhook_s_subject_names_its_namespace_but_in_default() {
        use crate::engine::flight::Subject;
        assert_eq!(subject("default", "gh"), Subject::Webhook("gh".into()));
        assert_eq!(subject("billing", "gh"), Subject::Webhook("billing/gh".into()));
        // No webhook of `default` can be named as another namespace's subject.
        assert!(composer_core::definition::check_name("webhook", "billing/gh").is_err());
    }

    fn sign(secret: &[u8], data: &[u8]) -> String {
        let tag = hmac::sign(&hmac::Key::new(hmac::HMAC_SHA256, secret), data);
        tag.as_ref().iter().map(|b| format!("{b:02x}")).collect()
    }

    const T: Duration = DEFAULT_TOLERANCE;

    #[test]
    fn a_stripe_signature_over_the_timestamp_and_body_is_checked_with_its_tolerance() {
        let (secret, body, now) = (b"whsec_test".as_slice(), br#"{"id":"evt_1"}"#.as_slice(), 1_700_000_000);
        let good = sign(secret, format!("{now}.{}", std::str::from_utf8(body).unwrap()).as_bytes());
        let header = format!("t={now},v1={good}");
        assert_eq!(verify(WebhookScheme::Stripe, secret, Some(&header), body, now + 10, T), Ok(Some(now)));
        let rolled = format!("t={now},v1={},v1={good}", "00".repeat(32));
        assert_eq!(
            verify(WebhookScheme::Stripe, secret, Some(&rolled), body, now, T),
            Ok(Some(now)),
            "a second secret's tag"
        );
        assert_eq!(
            verify(WebhookScheme::Stripe, secret, Some(&header), br#"{"id":"evt_2"}"#, now, T),
            Err(Refused::Mismatch),
            "another body"
        );
        assert_eq!(verify(WebhookScheme::Stripe, b"other", Some(&header), body, now, T), Err(Refused::Mismatch));
        assert_eq!(
            verify(WebhookScheme::Stripe, secret, Some(&header), body, now + 301, T),
            Err(Refused::Stale { age: 301, tolerance: 300 }),
            "a replay after the tolerance"
        );
        let resigned = format!("t={},v1={good}", now + 100);
        assert_eq!(
            verify(WebhookScheme::Stripe, secret, Some(&resigned), body, now, T),
            Err(Refused::Mismatch),
            "a new timestamp on an old tag"
        );
        for bad in ["", "t=x,v1=ab", &format!("v1={good}"), &format!("t={now}"), &format!("t={now},v1=zz"), "garbage"] {
            assert_eq!(
                verify(WebhookScheme::Stripe, secret, Some(bad), body, now, T),
                Err(Refused::Malformed("stripe-signature")),
                "{bad:?}"
            );
        }
        assert_eq!(
            verify(WebhookScheme::Stripe, secret, None, body, now, T),
            Err(Refused::Missing("stripe-signature"))
        );
    }

    #[test]
    fn a_github_signature_is_over_the_body() {
        let (secret, body) = (b"gh-secret".as_slice(), br#"{"action":"opened"}"#.as_slice());
        let header = format!("sha256={}", sign(secret, body));
        assert_eq!(verify(WebhookScheme::Github, secret, Some(&header), body, 0, T), Ok(None));
        assert_eq!(verify(WebhookScheme::Github, secret, Some(&header), b"{}", 0, T), Err(Refused::Mismatch));
        let upper = header.to_uppercase().replace("SHA256=", "sha256=");
        assert_eq!(verify(WebhookScheme::Github, secret, Some(&upper), body, 0, T), Ok(None), "hex in either case");
        for bad in ["sha1=abcd", "sha256=abc", "sha256="] {
            let r = verify(WebhookScheme::Github, secret, Some(bad), body, 0, T);
            assert!(matches!(r, Err(Refused::Malformed(_)) | Err(Refused::Mismatch)), "{bad:?}: {r:?}");
        }
    }

    #[test]
    fn a_spec_is_checked_and_its_transform_makes_the_event() {
        let spec = |v: Value| serde_json::from_value::<WebhookSpec>(v).unwrap();
        let base = json!({"name": "shop", "scheme": "stripe", "secret": "SHOP_SIGNING"});
        let hook = parse(spec(base.clone()), "default").unwrap();
        assert_eq!(hook.tolerance, DEFAULT_TOLERANCE);
        let body = json!({"id": "evt_9", "type": "order.created"});
        let raw = body.to_string();
        let ev = event_of(
            &Sandbox::simple_only(),
            &hook,
            &body,
            &json!({}),
            delivery_id(WebhookScheme::Stripe, &body, raw.as_bytes(), Some(1)),
        )
        .unwrap();
        assert_eq!((ev.name.as_str(), ev.id.as_deref(), &ev.payload), ("shop", Some("evt_9"), &body));
        let anon = json!({"type": "x"});
        let at = |t| delivery_id(WebhookScheme::Stripe, &anon, b"{}", Some(t));
        assert!(at(1).starts_with("sha256:") && at(1) == at(1) && at(1) != at(2), "by the signed timestamp and body");
        let gh = |raw: &[u8]| delivery_id(WebhookScheme::Github, &body, raw, None);
        assert!(gh(b"{}") == gh(b"{}") && gh(b"{}") != gh(b"{ }"), "by the signed body only");
        for (field, value, words) in [
            ("secret", json!("whsec_abc"), "never the secret"),
            ("tolerance", json!("2h"), "at most 1h"),
            ("tolerance", json!("0s"), "more than 0"),
            ("event", json!("${ .secrets.X }"), "cannot read secrets"),
            ("event", json!("${ .body | }"), "event"),
            ("name", json!("a b"), "name"),
        ] {
            let mut bad = base.clone();
            bad[field] = value;
            let e = parse(spec(bad), "default").err().unwrap_or_default();
            assert!(e.contains(words), "{field}: {e}");
        }
        let mut with = base.clone();
        with["event"] =
            json!({"name": "${ .body.type }", "key": "${ .body.id }", "id": "${ .headers[\"x-delivery\"] }"});
        let hook = parse(spec(with), "default").unwrap();
        let ev =
            event_of(&Sandbox::simple_only(), &hook, &body, &json!({"x-delivery": "d-1"}), "sha256:00".into()).unwrap();
        assert_eq!((ev.name.as_str(), ev.key.as_str(), ev.id.as_deref()), ("order.created", "evt_9", Some("d-1")));
        let mut odd = base;
        odd["event"] = json!("${ [1] }");
        let e = event_of(
            &Sandbox::simple_only(),
            &parse(spec(odd), "default").unwrap(),
            &body,
            &json!({}),
            "sha256:00".into(),
        )
        .unwrap_err();
        assert!(e.contains("must yield an object"), "{e}");
    }
}
