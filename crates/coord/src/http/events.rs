//! External events: recorded once, starting the runs their triggers
//! start, and delivered to the steps waiting for them, or kept for one to
//! come.

use std::sync::Arc;

use axum::extract::State;
use axum::Json;
use composer_api::{EventPage, EventSent, EventView, SendEvent};
use serde_json::Value;

use super::error::{ApiError, ApiResult};
use super::extract::{json_size, Body, Traceparent};
use crate::config::Config;
use crate::engine::Engine;
use crate::triggers::Incoming;
use composer_store::Pool;

/// Longest event key, in characters.
pub use composer_core::definition::MAX_EVENT_KEY;
/// Longest event name, in characters.
pub use composer_core::definition::MAX_EVENT_NAME;
/// Longest event id, in characters.
pub const MAX_EVENT_ID: usize = 256;

/// Send an event.
///
/// Records the event once by its name and `id` (one is made without it), starts a run for every
/// trigger of a workflow's latest version that listens to its name and whose `when` holds, in the
/// same commit, and then completes every task waiting for `(name, key)` (a WAIT_FOR_EVENT node)
/// with the payload. With no waiter, the event is kept for `COMPOSER_EVENT_RETENTION` for one to
/// come. An event sent again with the same name and id (within a week) does nothing again and
/// answers what the first sending started, with `duplicate`.
#[utoipa::path(
    post, path = "/v1/events", operation_id = "sendEvent", tag = "runs",
    params(("traceparent" = Option<String>, Header, description = "A W3C trace context: the runs the event starts continue it, the steps it completes link to it; one that does not read, or names the trace Composer made for a run, is ignored")),
    request_body = SendEvent,
    responses(
        (status = 200, description = "recorded: the runs it started, the steps it completed", body = EventSent),
        (status = 422, description = "the id was recorded for another event (another key or payload)", body = composer_api::ErrorBody),
    )
)]
pub(crate) async fn send_event(
    State(config): State<Arc<Config>>,
    State(pool): State<Pool>,
    State(engine): State<Arc<Engine>>,
    traceparent: Traceparent,
    Body(ev): Body<SendEvent>,
) -> ApiResult<Json<EventSent>> {
    let traceparent = traceparent.of_caller(&pool).await?;
    check(&config, &ev.name, &ev.key, ev.id.as_deref(), &ev.payload)?;
    let incoming = Incoming {
        name: &ev.name,
        key: &ev.key,
        id: ev.id.as_deref(),
        payload: &ev.payload,
        source: "api",
        traceparent: traceparent.as_deref(),
    };
    Ok(Json(answer(crate::triggers::send(&config, &pool, &engine, incoming).await?, &ev.key, &ev.payload)?))
}

/// The answer to a sending, unless its id was recorded for another event
/// (another key or payload): a mistake to report, not a retry to answer.
pub(crate) fn answer(sent: crate::triggers::Sent, key: &str, payload: &serde_json::Value) -> ApiResult<EventSent> {
    match &sent.first {
        Some((k, p)) if k != key || !same_payload(p, payload) => {
            Err(ApiError::EventIdReused { id: sent.answer.id.clone() })
        }
        _ => Ok(sent.answer),
    }
}

/// Whether `payload` is the one recorded as `recorded`: an offloaded one
/// is when its object's SHA-256 is.
fn same_payload(recorded: &Value, payload: &Value) -> bool {
    match composer_archive::payloads::Ref::of(recorded) {
        Some(stored) => stored.holds(payload),
        None => super::runs::same_json(recorded, payload),
    }
}

/// An event's name, key, id and payload within their limits (an event from
/// the API or from a webhook's transform alike).
pub(crate) fn check(
    config: &Config,
    name: &str,
    key: &str,
    id: Option<&str>,
    payload: &serde_json::Value,
) -> ApiResult<()> {
    // Characters, as an OpenAPI maxLength counts them, not bytes.
    if name.is_empty() || name.chars().count() > MAX_EVENT_NAME {
        return Err(ApiError::bad_request(format!("name must be 1 to {MAX_EVENT_NAME} characters")));
    }
    if key.chars().count() > MAX_EVENT_KEY {
        return Err(ApiError::bad_request(format!("key must be at most {MAX_EVENT_KEY} characters")));
    }
    if id.is_some_and(|id| id.is_empty() || id.chars().count() > MAX_EVENT_ID) {
        return Err(ApiError::bad_request(format!("id must be 1 to {MAX_EVENT_ID} characters")));
    }
    // Past COMPOSER_MAX_PAYLOAD only with offloading, as a run's input.
    let max = config.max_event();
    if json_size(payload) > max {
        return Err(ApiError::too_large("event payload", max));
    }
    // A webhook's transform makes these from a body no extractor checked.
    for (what, text) in [("name", Some(name)), ("key", Some(key)), ("id", id)] {
        if text.is_some_and(|t| t.contains('\0')) {
            return Err(ApiError::bad_request(format!(
                "{what} contains a NUL character (\\u0000), which cannot be stored"
            )));
        }
    }
    composer_core::storable::check(payload, "payload", max).map_err(ApiError::bad_request)?;
    Ok(())
}

/// `GET /v1/events`'s query.
#[derive(serde::Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(crate) struct ListQuery {
    /// Only events of this name.
    #[param(max_length = 256)]
    name: Option<String>,
    /// Only events from this source: `api`, or `webhook:NAME`.
    #[param(max_length = 300)]
    source: Option<String>,
    /// The previous page's next_before.
    #[param(minimum = 1)]
    before: Option<i64>,
    /// 1 to 100 (default 50).
    #[param(value_type = Option<i32>, minimum = 1, maximum = 100)]
    limit: Option<super::extract::Limit>,
}

/// Most events one page lists.
pub const MAX_EVENT_PAGE: i64 = 100;

/// List recent events.
///
/// Events recorded in the last week, newest first, each with the runs its triggers started, the
/// triggers that failed, and the waiting steps it completed. A payload over 64 KiB, or kept as an
/// object, is left out (`payload_omitted`, with its size).
#[utoipa::path(
    get, path = "/v1/events", operation_id = "listEvents", tag = "events",
    params(ListQuery),
    responses((status = 200, description = "a page of events, newest first", body = EventPage))
)]
pub(crate) async fn list_events(
    State(pool): State<Pool>,
    super::extract::Query(q): super::extract::Query<ListQuery>,
) -> ApiResult<Json<EventPage>> {
    let limit = super::extract::Limit::or(q.limit, 50);
    if limit > MAX_EVENT_PAGE {
        return Err(ApiError::bad_request(format!("limit must be 1 to {MAX_EVENT_PAGE}")));
    }
    for (what, v, max) in [("name", &q.name, MAX_EVENT_NAME), ("source", &q.source, 300)] {
        if v.as_ref().is_some_and(|v| v.chars().count() > max || v.contains('\0')) {
            return Err(ApiError::bad_request(format!("{what} must be at most {max} characters")));
        }
    }
    if q.before.is_some_and(|b| b < 1) {
        return Err(ApiError::bad_request("before must be 1 or more"));
    }
    let client = composer_store::client(&pool).await?;
    let rows =
        composer_store::triggers::recent(&client, q.name.as_deref(), q.source.as_deref(), q.before, limit).await?;
    let next_before = if rows.len() as i64 == limit { rows.last().map(|e| e.seq) } else { None };
    Ok(Json(EventPage { events: rows.iter().map(event_view).collect(), next_before }))
}

pub(crate) fn event_view(e: &composer_store::triggers::LoggedEvent) -> EventView {
    let sent = crate::triggers::outcome(e);
    EventView {
        seq: e.seq,
        name: e.name.clone(),
        id: e.event_id.clone(),
        key: e.key.clone(),
        payload: e.payload.clone().unwrap_or(Value::Null),
        payload_bytes: i64::from(e.payload_bytes),
        payload_omitted: e.payload.is_none(),
        source: e.source.clone(),
        delivered_to_waiters: e.delivered,
        started_runs: sent.started_runs,
        trigger_errors: sent.trigger_errors,
        held: sent.held,
        received_at: e.received_at,
    }
}
