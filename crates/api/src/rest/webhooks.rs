//! Webhooks: signed deliveries from another service, turned into events.

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use composer_core::schema;

/// The longest tolerance a webhook may set (its schema says it too).
pub const MAX_WEBHOOK_TOLERANCE: Duration = Duration::from_secs(3600);

/// How a webhook's deliveries are signed: HMAC-SHA256 with the webhook's secret.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum WebhookScheme {
    /// `Stripe-Signature: t=TIMESTAMP,v1=HEX[,v1=HEX]` over `TIMESTAMP.BODY`; the
    /// timestamp must be within the tolerance.
    Stripe,
    /// `X-Hub-Signature-256: sha256=HEX` over the body (no timestamp: a
    /// delivery is named by a digest of its body, so a replay is the same event).
    Github,
}

/// A webhook: `POST /v1/webhooks/{name}` turns each delivery whose signature
/// holds into an event.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct WebhookSpec {
    #[schema(value_type = schema::Name)]
    pub name: String,
    pub scheme: WebhookScheme,
    /// The name of the signing secret: each coordinator reads it from its
    /// environment variable `COMPOSER_WEBHOOK_SECRET_<secret>`; it is never
    /// stored or shown.
    #[schema(pattern = "^[A-Z0-9_]{1,64}$")]
    pub secret: String,
    /// How far a delivery's signed timestamp may be from now (`stripe`):
    /// `"5m"` by default; more than 0 and at most `"1h"`, in one unit
    /// (`"90s"`, not `"1m30s"`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tolerance: Option<String>,
    /// The event, a template over `{body, headers}` (the body as JSON, the
    /// headers by lower-case name) yielding `{name, key?, id?, payload?}`. By
    /// default `{name: <the webhook's name>, id: <the delivery's id>, payload: .body}`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = schema::JsonValue)]
    pub event: Option<Value>,
}

/// A webhook as the API shows it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
pub struct WebhookView {
    #[serde(flatten)]
    #[schema(inline)]
    pub spec: WebhookSpec,
    /// Where the other service sends its deliveries: this path, on the
    /// address by which it reaches a coordinator.
    pub url: String,
    /// Whether this coordinator has the secret's variable set (deliveries
    /// are refused with 503 until it has).
    pub secret_set: bool,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

/// `GET /v1/webhooks`: every webhook, by name.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
pub struct WebhookList {
    pub webhooks: Vec<WebhookView>,
}
