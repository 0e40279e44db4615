//! `/ui/login` and `/ui/logout`: the API token exchanged for a session
//! (wrong tokens throttled), and the session revoked.

use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::{ConnectInfo, Form, Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use axum::Extension;
use serde::Deserialize;

use super::error::UiError;
use super::extract::Params;
use super::guard::from_our_pages;
use super::html::{hidden, html, page, url_enc, Html};
use super::session::{self, LoginThrottle};
use crate::config::Config;
use composer_config::auth::tokens_match;
use composer_store::Pool;

/// The login throttle of this coordinator's UI.
pub type Throttle = Arc<Mutex<LoginThrottle>>;

/// A new throttle, counting from now.
pub fn throttle() -> Throttle {
    Arc::new(Mutex::new(LoginThrottle::new(Instant::now())))
}

pub async fn login_page(State(config): State<Arc<Config>>, Query(q): Query<Params>) -> Html {
    login_form(&config, &safe_next(q.get("next")), None)
}

fn login_form(config: &Config, next: &str, error: Option<&str>) -> Html {
    let error = error.map(|e| html!("<p class=\"error\">{}</p>", e));
    let sso = config.oidc.enabled().then(|| {
        html!("<p><a class=\"sso\" href=\"/ui/sso?next={}\">Sign in with single sign-on</a></p>", url_enc(next))
    });
    page(
        "Log in",
        html!(
            "<h1>Log in</h1>{}{}<form method=\"post\" action=\"/ui/login\" class=\"login\">{}<label>API token \
             <input type=\"password\" name=\"token\" autocomplete=\"current-password\" autofocus></label>\
             <button type=\"submit\">Log in</button></form>",
            error,
            sso,
            hidden("next", next)
        ),
    )
}

/// Where to go after logging in: one of our pages, never another site, and
/// nothing that is not a path of visible ASCII (a CR or LF would end the
/// `Location` header and start another).
pub(super) fn safe_next(next: Option<&String>) -> String {
    match next {
        Some(n) if is_ui_path(n) => n.clone(),
        _ => "/ui/runs".to_string(),
    }
}

fn is_ui_path(n: &str) -> bool {
    (n == "/ui" || n.starts_with("/ui/") || n.starts_with("/ui?"))
        && n.bytes().all(|b| b.is_ascii_graphic())
        && !n.contains("//")
        && !n.contains('\\')
        && !n.contains("..")
}

#[derive(Deserialize)]
pub struct LoginForm {
    token: String,
    next: Option<String>,
}

/// The client's address, for the login throttle (behind a proxy, the
/// proxy's: then the limit per address is one for all).
type Peer = Option<Extension<ConnectInfo<SocketAddr>>>;

fn address(peer: &Peer) -> IpAddr {
    peer.as_ref().map_or(IpAddr::from([0, 0, 0, 0]), |Extension(ConnectInfo(a))| a.ip())
}

/// Checks the token (unless this address, or everyone, sent too many wrong
/// ones this minute: 429 with Retry-After, the token unchecked), then
/// starts a session.
pub async fn login(
    State(config): State<Arc<Config>>,
    State(pool): State<Pool>,
    Extension(throttle): Extension<Throttle>,
    peer: Peer,
    headers: HeaderMap,
    Form(f): Form<LoginForm>,
) -> Response {
    let next = safe_next(f.next.as_ref());
    if !from_our_pages(&config, &headers) {
        let refused = login_form(&config, &next, Some("a login from another site is refused"));
        return (StatusCode::FORBIDDEN, refused).into_response();
    }
    let Some(expected) = config.api_token.as_deref() else { return Redirect::to(&next).into_response() };
    let addr = address(&peer);
    let wait = throttle.lock().unwrap_or_else(|p| p.into_inner()).wait(Instant::now(), addr);
    if let Some(wait) = wait {
        let message = "too many wrong tokens: wait a minute (LOGIN_FAILURES_PER_ADDRESS, LOGIN_FAILURES_PER_MINUTE)";
        let retry_after = (header::RETRY_AFTER, wait.as_secs().to_string());
        return (StatusCode::TOO_MANY_REQUESTS, [retry_after], login_form(&config, &next, Some(message)))
            .into_response();
    }
    if !tokens_match(f.token.as_bytes(), expected.as_bytes()) {
        throttle.lock().unwrap_or_else(|p| p.into_inner()).failed(Instant::now(), addr);
        return (StatusCode::UNAUTHORIZED, login_form(&config, &next, Some("wrong token"))).into_response();
    }
    match start_session(&pool, config.ui_session_ttl, &headers).await {
        Ok(cookie) => ([(header::SET_COOKIE, cookie)], Redirect::to(&next)).into_response(),
        Err(e) => e.into_response(),
    }
}

/// A new session, kept in the store for `ttl`: the `Set-Cookie` that gives
/// it to the browser.
async fn start_session(pool: &Pool, ttl: Duration, headers: &HeaderMap) -> Result<String, UiError> {
    let Some(id) = session::new_id() else {
        return Err(UiError(StatusCode::SERVICE_UNAVAILABLE, "no random numbers for a session id".into()));
    };
    let client = composer_store::client(pool).await?;
    composer_store::sessions::create(&client, &session::hash(&id), ttl, None).await?;
    Ok(session::set_cookie(Some(&id), ttl, session::over_https(headers)))
}

/// Ends the session: revoked in the store, so its cookie is worth nothing
/// even if the browser kept a copy.
pub async fn logout(State(pool): State<Pool>, headers: HeaderMap) -> Result<Response, UiError> {
    if let Some(id) = session::from_cookie(&headers) {
        let client = composer_store::client(&pool).await?;
        composer_store::sessions::revoke(&client, &session::hash(&id)).await?;
    }
    let cookie = session::set_cookie(None, Duration::ZERO, session::over_https(&headers));
    Ok(([(header::SET_COOKIE, cookie)], Redirect::to("/ui/login")).into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn next_is_one_of_our_paths_in_visible_ascii() {
        for ok in ["/ui", "/ui/runs?status=FAILED", "/ui/runs/0193?msg=retry-done"] {
            assert_eq!(safe_next(Some(&ok.to_string())), ok);
        }
        for bad in [
            "/ui\r\nSet-Cookie:x=1",
            "/ui/runs\u{0}",
            "/ui/runs é",
            "//evil.example/ui",
            "/ui//evil.example",
            "/ui\\evil",
            "/ui/../v1/runs",
            "/uifoo",
            "https://evil.example/ui",
        ] {
            assert_eq!(safe_next(Some(&bad.to_string())), "/ui/runs", "{bad:?}");
        }
    }
}
