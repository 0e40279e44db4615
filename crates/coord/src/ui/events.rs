//! `/ui/events`: the webhooks, and the latest events with the runs their
//! triggers started (`?name=` for one event name).

use axum::extract::{Query, State};
use axum::response::IntoResponse;
use composer_store::triggers::{EventRun, LoggedEvent};
use composer_store::webhooks::WebhookRow;

use super::error::Page;
use super::extract::Params;
use super::html::{clip, html, json_details, page, run_link, time, url_enc, Html, Table};
use composer_store::Pool;

/// Events the page lists.
const SHOWN: i64 = 50;

pub async fn events_page(State(pool): State<Pool>, Query(q): Query<Params>) -> Page {
    let name = q.get("name").filter(|n| !n.is_empty() && n.chars().count() <= 256);
    let client = composer_store::client(&pool).await?;
    let hooks = composer_store::webhooks::list(&client, 1000).await?;
    let events = composer_store::triggers::recent(&client, name.map(String::as_str), None, None, SHOWN).await?;
    let webhooks = Table::new("", &["Name", "Scheme", "Delivery URL", "Secret", "Tolerance"])
        .or_none("No webhooks.")
        .with(hooks.iter().map(webhook_row).collect());
    let named = name.map(|n| html!(" named <code>{}</code> (<a href=\"/ui/events\">all</a>)", n));
    let recent = Table::new(
        "events",
        &["Received", "Name", "Id", "Source", "Key", "Runs started", "Steps completed", "Payload"],
    )
    .or_none("No events in the last week.")
    .with(events.iter().map(event_row).collect());
    let body = html!(
        "<h1>Events</h1><h2>Webhooks</h2>{}<h2>Recent events{}</h2><p class=\"hint\">Steps completed: the \
         WAIT_FOR_EVENT steps the event completed, those waiting when it came and those that began to wait for it \
         later, while it was kept.</p>{}<h2>Replay</h2><p class=\"hint\">Runs the triggers of the events received \
         in a time range again, as the workflows' latest versions have them: once per event and trigger that has no \
         run yet (one that failed, or a trigger added since). Waiting steps are not sent the events again.</p>{}",
        webhooks,
        named,
        recent,
        super::replay::form()
    );
    Ok(page("Events", body).into_response())
}

fn webhook_row(h: &WebhookRow) -> Html {
    let secret = h.spec["secret"].as_str().unwrap_or("");
    let set = std::env::var_os(crate::webhooks::secret_var(secret)).is_some_and(|v| !v.is_empty());
    let said = match set {
        true => Html::raw("set"),
        false => Html::raw("<span class=\"error\">not set on this coordinator</span>"),
    };
    html!(
        "<tr><td>{}</td><td>{}</td><td><code>/v1/webhooks/{}</code></td>\
         <td><code>COMPOSER_WEBHOOK_SECRET_{}</code> {}</td><td>{}</td></tr>",
        h.name,
        h.spec["scheme"].as_str().unwrap_or(""),
        h.name,
        secret,
        said,
        h.spec["tolerance"].as_str().unwrap_or("5m"),
    )
}

fn event_row(e: &LoggedEvent) -> Html {
    let payload = match &e.payload {
        Some(p) => json_details("payload", p),
        None => html!("{} bytes, not shown", e.payload_bytes),
    };
    html!(
        "<tr><td>{}</td><td><a href=\"/ui/events?name={}\">{}</a></td><td><code>{}</code></td><td>{}</td><td>{}</td>\
         <td>{}</td><td class=\"n completed\">{}</td><td>{}</td></tr>",
        time(Some(e.received_at)),
        url_enc(&e.name),
        e.name,
        clip(&e.event_id, 48),
        e.source,
        clip(&e.key, 48),
        e.runs.iter().map(started).collect::<Html>(),
        e.delivered,
        payload,
    )
}

/// What one trigger did with the event: the run it started, or why not;
/// what its flow control did (held, replaced, dropped) in words, the note
/// on hover.
fn started(r: &EventRun) -> Html {
    match (r.run_id, &r.error, &r.flow) {
        (Some(id), _, Some(flow)) => html!("{} {} <span class=\"flow\">({})</span> ", run_link(&id), r.workflow, flow),
        (Some(id), _, None) => html!("{} {} ", run_link(&id), r.workflow),
        (None, Some(err), _) => {
            html!("<span class=\"error\" title=\"{}\">{}: failed</span> ", clip(err, 500), r.workflow)
        }
        (None, None, Some(flow)) => {
            let note = r.flow_note.as_deref().unwrap_or("");
            html!(
                "<span class=\"flow\" title=\"{}\">{}: {}</span> ",
                clip(note, 500),
                r.workflow,
                held_word(flow, note)
            )
        }
        (None, None, None) => Html::new(),
    }
}

/// A flow control's note in a word or two: held (for a later run), or no run.
fn held_word(flow: &str, note: &str) -> String {
    if note.starts_with(&format!("{flow}: held")) || note.starts_with("throttle: queued") {
        format!("held by {flow}")
    } else {
        format!("no run ({flow})")
    }
}
