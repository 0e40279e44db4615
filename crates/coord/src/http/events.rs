//! External events: delivered to the steps waiting for them, or kept for
//! one to come.

use std::sync::Arc;

use axum::extract::State;
use axum::Json;
use composer_api::{EventSent, SendEvent};
use composer_core::machine::Event;

use super::error::{ApiError, ApiResult};
use super::extract::{json_size, Body};
use crate::shared::Shared;

/// Longest event name, in characters.
pub const MAX_EVENT_NAME: usize = 256;
/// Longest event key, in characters.
pub const MAX_EVENT_KEY: usize = 1024;

/// Send an event.
///
/// Completes every task waiting for `(name, key)` (a WAIT_FOR_EVENT node) with the payload. With no
/// waiter, the event is kept for `COMPOSER_EVENT_RETENTION` for one to come.
#[utoipa::path(
    post, path = "/v1/events", operation_id = "sendEvent", tag = "runs",
    request_body = SendEvent,
    responses((status = 200, description = "delivered to the waiting steps, or kept for one to come", body = EventSent))
)]
pub(crate) async fn send_event(State(s): State<Arc<Shared>>, Body(ev): Body<SendEvent>) -> ApiResult<Json<EventSent>> {
    // Characters, as an OpenAPI maxLength counts them, not bytes.
    if ev.name.is_empty() || ev.name.chars().count() > MAX_EVENT_NAME {
        return Err(ApiError::bad_request(format!("name must be 1 to {MAX_EVENT_NAME} characters")));
    }
    if ev.key.chars().count() > MAX_EVENT_KEY {
        return Err(ApiError::bad_request(format!("key must be at most {MAX_EVENT_KEY} characters")));
    }
    if json_size(&ev.payload) > s.config.max_payload {
        return Err(ApiError::too_large("event payload", s.config.max_payload));
    }
    composer_core::storable::check(&ev.payload, "payload", s.config.max_payload).map_err(ApiError::bad_request)?;
    let mut client = composer_store::client(&s.pool).await?;
    let (event_id, waiters) =
        composer_store::events::record(&mut client, &ev.name, &ev.key, &ev.payload, s.config.event_retention).await?;
    // Recorded first: an error below leaves the event buffered, for the
    // recovery sweep to deliver to these waiters, or for a later waiter.
    // It is marked consumed only once every waiter has it.
    let mut taken_by = None;
    let mut matched = 0;
    for w in waiters {
        let event = Event::EventReceived { task_id: w.task_id, payload: ev.payload.clone() };
        if s.engine.handle(w.run_id, event).await?.ignored.is_none() {
            taken_by.get_or_insert(w.task_id);
            matched += 1;
        }
    }
    if let Some(task_id) = taken_by {
        composer_store::events::mark_consumed(&client, event_id, task_id).await?;
    }
    Ok(Json(EventSent { matched, buffered: matched == 0 }))
}
