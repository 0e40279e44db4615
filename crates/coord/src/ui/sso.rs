//! `/ui/sso` and `/ui/sso/callback`: signing in with the company's identity
//! provider (`crate::oidc`). The sign-in begins with a random state, PKCE
//! verifier and nonce, kept in the store by the state's hash and bound to
//! this browser by a cookie; the provider's answer is taken once, its code
//! exchanged, its ID token checked, and the person's groups mapped to
//! scopes: a person no group gives a scope is refused, with no session.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{AppendHeaders, IntoResponse, Redirect, Response};
use axum::Extension;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use ring::rand::{SecureRandom, SystemRandom};

use super::error::UiError;
use super::extract::Params;
use super::html::{html, page, url_enc};
use super::session;
use crate::config::Config;
use crate::oidc::{self, Provider};
use composer_store::sessions::{Person, SignIn};
use composer_store::Pool;

/// The cookie that binds a sign-in under way to the browser that began it;
/// over HTTPS `__Host-` (so no sibling site can set one for us).
fn cookie_name(secure: bool) -> &'static str {
    if secure {
        "__Host-composer_sso"
    } else {
        "composer_sso"
    }
}

/// How long a sign-in may take, from its start to the provider's answer.
pub const SIGN_IN_TTL: Duration = Duration::from_secs(600);

/// Sign-ins under way at once (`max_sign_ins`): past it a new one is a
/// 503 until some end, so that nobody can fill the table.
pub const MAX_SIGN_INS: i64 = 10_000;

/// Longest `next` a sign-in keeps; a longer one goes to the runs.
const MAX_NEXT: usize = 512;

fn random(bytes: usize) -> Result<String, UiError> {
    let mut b = vec![0u8; bytes];
    SystemRandom::new()
        .fill(&mut b)
        .map_err(|_| UiError(StatusCode::SERVICE_UNAVAILABLE, "no random numbers for a sign-in".into()))?;
    Ok(URL_SAFE_NO_PAD.encode(b))
}

/// Where the provider sends the browser back: this coordinator, by the
/// name the browser used (the `Host` the host guard let in).
fn redirect_uri(headers: &HeaderMap) -> String {
    let host = headers.get(header::HOST).and_then(|h| h.to_str().ok()).unwrap_or("localhost");
    let scheme = if session::over_https(headers) { "https" } else { "http" };
    format!("{scheme}://{host}/ui/sso/callback")
}

/// The sign-on settings, or a 404 when single sign-on is off.
fn configured(config: &Config) -> Result<&crate::oidc::OidcConfig, UiError> {
    match config.oidc.enabled() {
        true => Ok(&config.oidc),
        false => Err(UiError(StatusCode::NOT_FOUND, "single sign-on is not configured (COMPOSER_OIDC_ISSUER)".into())),
    }
}

/// Begins a sign-in: to the provider's authorization endpoint.
pub async fn begin(
    State(config): State<Arc<Config>>,
    State(pool): State<Pool>,
    Extension(provider): Extension<Arc<Provider>>,
    headers: HeaderMap,
    Query(q): Query<Params>,
) -> Result<Response, UiError> {
    let c = configured(&config)?;
    let m = provider.metadata(c).await.map_err(|e| UiError(StatusCode::BAD_GATEWAY, e))?;
    let (state, verifier, nonce) = (random(32)?, random(32)?, random(16)?);
    let next = super::login::safe_next(q.get("next").filter(|n| n.len() <= MAX_NEXT));
    let sign_in = SignIn { verifier, nonce, next };
    let client = composer_store::client(&pool).await?;
    let hash = session::hash(&state);
    if !composer_store::sessions::begin_sign_in(&client, &hash, &sign_in, SIGN_IN_TTL, MAX_SIGN_INS).await? {
        let why = format!("{MAX_SIGN_INS} sign-ins are under way (MAX_SIGN_INS): try again in a few minutes");
        return Err(UiError(StatusCode::SERVICE_UNAVAILABLE, why));
    }
    let joiner = if m.authorization_endpoint.contains('?') { '&' } else { '?' };
    let url = format!(
        "{}{joiner}response_type=code&client_id={}&redirect_uri={}&scope={}&state={}&nonce={}&code_challenge={}\
         &code_challenge_method=S256",
        m.authorization_endpoint,
        url_enc(c.client_id.as_deref().unwrap_or("")),
        url_enc(&redirect_uri(&headers)),
        url_enc(&c.scopes),
        state,
        sign_in.nonce,
        oidc::challenge(&sign_in.verifier),
    );
    let cookie = match session::over_https(&headers) {
        true => format!(
            "{}={state}; Path=/; HttpOnly; SameSite=Lax; Secure; Max-Age={}",
            cookie_name(true),
            SIGN_IN_TTL.as_secs()
        ),
        false => format!(
            "{}={state}; Path=/ui/sso; HttpOnly; SameSite=Lax; Max-Age={}",
            cookie_name(false),
            SIGN_IN_TTL.as_secs()
        ),
    };
    Ok(([(header::SET_COOKIE, cookie)], Redirect::to(&url)).into_response())
}

/// The state the browser's cookie binds; none when it has none, or more
/// than one (a cookie planted beside ours).
fn cookie_state(headers: &HeaderMap) -> Option<String> {
    let name = cookie_name(session::over_https(headers));
    let mut found =
        headers.get_all(header::COOKIE).iter().filter_map(|h| h.to_str().ok()).flat_map(|h| h.split(';')).filter_map(
            |c| {
                let (n, value) = c.trim().split_once('=')?;
                (n == name).then(|| value.to_string())
            },
        );
    match (found.next(), found.next()) {
        (Some(one), None) => Some(one),
        _ => None,
    }
}

/// The provider's answer: the person signed in (a session, then their
/// page), or why not.
pub async fn callback(
    State(config): State<Arc<Config>>,
    State(pool): State<Pool>,
    Extension(provider): Extension<Arc<Provider>>,
    headers: HeaderMap,
    Query(q): Query<Params>,
) -> Result<Response, UiError> {
    let c = configured(&config)?;
    let refused = |status, why: String| Err(UiError(status, why));
    if let Some(error) = q.get("error") {
        let said = q.get("error_description").map(String::as_str).unwrap_or("");
        return refused(StatusCode::UNAUTHORIZED, format!("the identity provider refused the sign-in: {error} {said}"));
    }
    let (Some(code), Some(state)) = (q.get("code"), q.get("state")) else {
        return refused(StatusCode::BAD_REQUEST, "the provider's answer has no code or state".into());
    };
    let bound = cookie_state(&headers)
        .is_some_and(|cookie| composer_config::auth::tokens_match(cookie.as_bytes(), state.as_bytes()));
    if !bound {
        return refused(StatusCode::BAD_REQUEST, "this sign-in was not begun in this browser: sign in again".into());
    }
    let client = composer_store::client(&pool).await?;
    let Some(sign_in) = composer_store::sessions::take_sign_in(&client, &session::hash(state)).await? else {
        return refused(StatusCode::BAD_REQUEST, "this sign-in has expired or was used: sign in again".into());
    };
    let who = provider
        .person(c, code, &sign_in.verifier, &redirect_uri(&headers), &sign_in.nonce)
        .await
        .map_err(|e| UiError(StatusCode::UNAUTHORIZED, format!("the sign-in failed: {e}")))?;
    let reserved = crate::access::RESERVED_NAMES.contains(&who.name.as_str()) || who.name == config.api_token_name;
    if reserved {
        return refused(StatusCode::FORBIDDEN, format!("{:?} is an environment token's name", who.name));
    }
    let roles = oidc::roles(&c.roles).unwrap_or_default();
    let scopes = oidc::scopes_of(&roles, &who.groups);
    if scopes.is_empty() {
        tracing::warn!(person = %who.name, groups = ?who.groups, "a sign-in refused: no group of theirs has a role");
        let why = format!(
            "you signed in as {}, but none of your groups ({}) is given access to Composer (COMPOSER_OIDC_ROLES)",
            who.name,
            who.groups.join(", ")
        );
        return refused(StatusCode::FORBIDDEN, why);
    }
    let Some(id) = session::new_id() else {
        return refused(StatusCode::SERVICE_UNAVAILABLE, "no random numbers for a session id".into());
    };
    // Groups an approval could name (1 to 256 characters, no NUL), at most MAX_GROUPS.
    let named = |g: &&String| !g.is_empty() && g.chars().count() <= 256 && !g.contains('\0');
    let groups = who.groups.iter().filter(named).take(crate::access::MAX_GROUPS).cloned().collect();
    let person = Person { actor: who.name.clone(), scopes, groups };
    composer_store::sessions::create(&client, &session::hash(&id), config.ui_session_ttl, Some(&person)).await?;
    tracing::info!(person = %who.name, scopes = ?person.scopes, "signed in to the UI");
    let secure = session::over_https(&headers);
    let session_cookie = session::set_cookie(Some(&id), config.ui_session_ttl, secure);
    let done = match secure {
        true => format!("{}=; Path=/; HttpOnly; SameSite=Lax; Secure; Max-Age=0", cookie_name(true)),
        false => format!("{}=; Path=/ui/sso; HttpOnly; SameSite=Lax; Max-Age=0", cookie_name(false)),
    };
    // A page of ours that moves on, not a redirect: the session's cookie is
    // SameSite=Strict, and a redirect chain begun on the provider's site
    // would not carry it.
    let body = page(
        "Signed in",
        html!(
            "<meta http-equiv=\"refresh\" content=\"0;url={}\"><h1>Signed in</h1><p>As {}. \
             <a href=\"{}\">Continue</a></p>",
            sign_in.next,
            who.name,
            sign_in.next
        ),
    );
    // Someone whose groups give scopes in some namespaces alone lands in one of them.
    let place = super::namespaces::landing(&person.scopes, &headers).map(|ns| super::namespaces::chosen(&ns, secure));
    let cookies = [Some(session_cookie), Some(done), place].into_iter().flatten().map(|c| (header::SET_COOKIE, c));
    Ok((AppendHeaders(cookies), body).into_response())
}
