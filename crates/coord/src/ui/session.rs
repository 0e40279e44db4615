//! A login to the UI: a random session id in a cookie, kept in PostgreSQL
//! by its hash (`composer_store::sessions`), whether the page being made
//! is for one, and the throttle on wrong tokens.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::http::{header, HeaderMap};
use ring::digest::{digest, SHA256};
use ring::rand::{SecureRandom, SystemRandom};

/// The cookie that carries a logged-in browser's session id.
pub const COOKIE: &str = "composer_session";

/// Random bytes in a session id: 256 bits, hex in the cookie.
const ID_BYTES: usize = 32;

/// Wrong tokens one client address may send in a minute; past it, 429.
pub const LOGIN_FAILURES_PER_ADDRESS: u32 = 10;

/// Wrong tokens all addresses together may send in a minute; past it,
/// every login waits for the next minute (many addresses, one guesser).
pub const LOGIN_FAILURES_PER_MINUTE: u32 = 100;

/// The window the two limits count in.
const WINDOW: Duration = Duration::from_secs(60);

tokio::task_local! {
    /// Set by the login guard around a request whose cookie names a live
    /// session; the page's frame reads it. A coordinator with no API token
    /// has no login and never sets it.
    static IN_SESSION: ();
}

tokio::task_local! {
    /// Who the page or form being answered is for, and in which namespace,
    /// set by the login guard around every UI request: the actor of what a
    /// form does, and the namespace the page's frame names.
    static CALLER: (crate::access::Principal, Option<Arc<str>>);
}

/// Answers `page` for `who`, in `namespace` (`None`: a page of the cluster's).
pub async fn as_caller<F: std::future::Future>(
    who: crate::access::Principal,
    namespace: Option<Arc<str>>,
    page: F,
) -> F::Output {
    CALLER.scope((who, namespace), page).await
}

/// The actor of a form being answered (`anonymous` outside the guard).
pub fn actor() -> String {
    CALLER.try_with(|(p, _)| p.name.clone()).unwrap_or_else(|_| "anonymous".to_string())
}

/// Who the page or form being answered is for (`None` outside the guard).
pub fn caller() -> Option<crate::access::Principal> {
    CALLER.try_with(|(p, _)| p.clone()).ok()
}

/// The namespace of the page being made, if it is a namespace's page.
pub fn namespace() -> Option<Arc<str>> {
    CALLER.try_with(|(_, ns)| ns.clone()).ok().flatten()
}

/// Makes `page` for a live session: its frame offers Log out.
pub async fn in_session<F: std::future::Future>(page: F) -> F::Output {
    IN_SESSION.scope((), page).await
}

/// Whether the page being made is for a live session.
pub fn is_in_session() -> bool {
    IN_SESSION.try_with(|_| ()).is_ok()
}

/// A new session id, from the operating system's random source.
pub fn new_id() -> Option<String> {
    let mut bytes = [0u8; ID_BYTES];
    SystemRandom::new().fill(&mut bytes).ok()?;
    Some(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// What the store keeps of a session id.
pub fn hash(id: &str) -> Vec<u8> {
    digest(&SHA256, id.as_bytes()).as_ref().to_vec()
}

/// The session id a request's cookie carries.
pub fn from_cookie(headers: &HeaderMap) -> Option<String> {
    headers.get_all(header::COOKIE).iter().filter_map(|h| h.to_str().ok()).flat_map(|h| h.split(';')).find_map(|c| {
        let (name, value) = c.trim().split_once('=')?;
        (name == COOKIE && value.len() == 2 * ID_BYTES && value.bytes().all(|b| b.is_ascii_hexdigit()))
            .then(|| value.to_string())
    })
}

/// Whether the browser reached us over HTTPS (through a proxy that ends
/// TLS: the coordinator itself speaks plain HTTP), so the cookie must be
/// `Secure`. A forged answer only makes a cookie stricter.
pub fn over_https(headers: &HeaderMap) -> bool {
    let forwarded = headers.get("x-forwarded-proto").and_then(|v| v.to_str().ok());
    let origin = headers.get(header::ORIGIN).and_then(|v| v.to_str().ok());
    forwarded.is_some_and(|p| p.trim().eq_ignore_ascii_case("https"))
        || origin.is_some_and(|o| o.starts_with("https://"))
}

/// The `Set-Cookie` value of a new session (`ttl` long), or of none
/// (`None`: the browser drops its cookie).
pub fn set_cookie(id: Option<&str>, ttl: Duration, secure: bool) -> String {
    let (value, max_age) = match id {
        Some(id) => (id, ttl.as_secs()),
        None => ("", 0),
    };
    let secure = if secure { "; Secure" } else { "" };
    format!("{COOKIE}={value}; Path=/ui; HttpOnly; SameSite=Strict; Max-Age={max_age}{secure}")
}

/// Counts wrong tokens per client address and in all, per minute. Memory
/// is bounded: addresses are counted only while the total is under its
/// limit, and forgotten each minute. Per coordinator: behind a load
/// balancer, N coordinators allow N times the limits.
pub struct LoginThrottle {
    since: Instant,
    total: u32,
    by_address: HashMap<IpAddr, u32>,
}

impl LoginThrottle {
    pub fn new(now: Instant) -> LoginThrottle {
        LoginThrottle { since: now, total: 0, by_address: HashMap::new() }
    }

    fn roll(&mut self, now: Instant) {
        if now.duration_since(self.since) >= WINDOW {
            *self = LoginThrottle::new(now);
        }
    }

    /// How long `address` must wait before its next try, if it must.
    pub fn wait(&mut self, now: Instant, address: IpAddr) -> Option<Duration> {
        self.roll(now);
        let mine = self.by_address.get(&address).copied().unwrap_or(0);
        let over = mine >= LOGIN_FAILURES_PER_ADDRESS || self.total >= LOGIN_FAILURES_PER_MINUTE;
        over.then(|| (self.since + WINDOW).saturating_duration_since(now).max(Duration::from_secs(1)))
    }

    /// Counts a wrong token from `address`.
    pub fn failed(&mut self, now: Instant, address: IpAddr) {
        self.roll(now);
        if self.total < LOGIN_FAILURES_PER_MINUTE {
            *self.by_address.entry(address).or_insert(0) += 1;
        }
        self.total = self.total.saturating_add(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_address_waits_after_its_tenth_wrong_token_until_the_minute_ends() {
        let start = Instant::now();
        let (me, other) = (IpAddr::from([192, 0, 2, 1]), IpAddr::from([192, 0, 2, 2]));
        let mut t = LoginThrottle::new(start);
        for _ in 0..LOGIN_FAILURES_PER_ADDRESS {
            assert_eq!(t.wait(start, me), None);
            t.failed(start, me);
        }
        assert_eq!(t.wait(start + Duration::from_secs(15), me), Some(Duration::from_secs(45)));
        assert_eq!(t.wait(start, other), None, "another address is not slowed");
        assert_eq!(t.wait(start + WINDOW, me), None, "a new minute");
    }

    #[test]
    fn many_addresses_together_meet_the_global_limit_and_memory_stays_bounded() {
        let start = Instant::now();
        let mut t = LoginThrottle::new(start);
        for i in 0..(LOGIN_FAILURES_PER_MINUTE * 3) {
            t.failed(start, IpAddr::from(i.to_be_bytes()));
        }
        assert!(t.wait(start, IpAddr::from([198, 51, 100, 7])).is_some());
        assert_eq!(t.by_address.len(), LOGIN_FAILURES_PER_MINUTE as usize);
    }

    #[test]
    fn a_session_id_is_256_random_bits_and_the_cookie_carries_only_it() {
        let (a, b) = (new_id().unwrap(), new_id().unwrap());
        assert_ne!(a, b);
        let mut headers = HeaderMap::new();
        headers.insert(header::COOKIE, format!("theme=dark; {COOKIE}={a}").parse().unwrap());
        assert_eq!(from_cookie(&headers), Some(a.clone()));
        headers.insert(header::COOKIE, format!("{COOKIE}={}", &a[1..]).parse().unwrap());
        assert_eq!(from_cookie(&headers), None, "not a session id");
        let set = set_cookie(Some(&a), Duration::from_secs(3600), true);
        assert_eq!(set, format!("{COOKIE}={a}; Path=/ui; HttpOnly; SameSite=Strict; Max-Age=3600; Secure"));
        assert_eq!(hash(&a).len(), 32);
    }
}
