//! Which redirects the HTTP node follows. Without `follow_redirects` a
//! redirect is the answer. With it, at most [`MAX_REDIRECTS`], each to an
//! address the egress policy allows, and to another host only when nothing
//! meant for the first host would be carried there: custom headers and
//! bound secrets keep a request on its host, and a redirect that would send
//! the body again is refused to another host: a 307 or 308, and a 301 or 302
//! of any method but POST (a 303, and a 301 or 302 of a POST, go on as a GET
//! without the body). No `Referer` is sent: it would carry the previous URL,
//! query included.

use std::fmt;
use std::sync::Arc;

use crate::egress::{Denied, Policy};

/// Most redirects one request follows.
pub const MAX_REDIRECTS: usize = 10;

/// How a request may be redirected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Follow {
    Never,
    /// Only on the host (and port) of the first URL.
    SameHost,
    /// To any host, unless the body would be sent there again.
    AnyHost(Body),
}

/// What a redirect does to a request's body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Body {
    None,
    /// A POST's body: dropped by 301, 302 and 303, sent again by 307 and 308.
    Post,
    /// Any other method's body: dropped only by 303.
    Other,
}

impl Body {
    pub fn of(method: &reqwest::Method, has_body: bool) -> Body {
        match (has_body, method == reqwest::Method::POST) {
            (false, _) => Body::None,
            (true, true) => Body::Post,
            (true, false) => Body::Other,
        }
    }

    fn sent_again_by(self, status: u16) -> bool {
        match self {
            Body::None => false,
            Body::Post => matches!(status, 307 | 308),
            Body::Other => matches!(status, 301 | 302 | 307 | 308),
        }
    }
}

const EVERY_WAY: [Follow; 5] = [
    Follow::Never,
    Follow::SameHost,
    Follow::AnyHost(Body::None),
    Follow::AnyHost(Body::Post),
    Follow::AnyHost(Body::Other),
];

/// A redirect to another host the request may not follow; the executor
/// says why, from what the request carries.
#[derive(Debug)]
pub struct OtherHost {
    pub status: u16,
    pub to: reqwest::Url,
}

impl OtherHost {
    /// The host, without its port.
    pub fn host(&self) -> &str {
        self.to.host_str().unwrap_or_default()
    }

    /// The host, and its port when it is not the scheme's.
    pub fn authority(&self) -> String {
        match self.to.port() {
            Some(port) => format!("{}:{port}", self.host()),
            None => self.host().to_string(),
        }
    }
}

impl fmt::Display for OtherHost {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "a {} redirect to another host ({})", self.status, self.authority())
    }
}

impl std::error::Error for OtherHost {}

/// One HTTP client per way of following redirects: reqwest's redirect
/// policy belongs to the client, not the request.
#[derive(Clone)]
pub struct Clients(Vec<(Follow, reqwest::Client)>);

impl Clients {
    pub fn new(egress: Arc<Policy>, build: impl Fn(reqwest::redirect::Policy) -> reqwest::Client) -> Clients {
        Clients(EVERY_WAY.iter().map(|&follow| (follow, build(policy(egress.clone(), follow)))).collect())
    }

    pub fn get(&self, follow: Follow) -> &reqwest::Client {
        let (_, client) = self.0.iter().find(|(f, _)| *f == follow).unwrap_or(&self.0[0]);
        client
    }
}

fn policy(egress: Arc<Policy>, follow: Follow) -> reqwest::redirect::Policy {
    if follow == Follow::Never {
        return reqwest::redirect::Policy::none();
    }
    reqwest::redirect::Policy::custom(move |attempt| {
        if attempt.previous().len() > MAX_REDIRECTS {
            return attempt.error(Denied(format!("more than {MAX_REDIRECTS} redirects")));
        }
        if let Err(denied) = egress.check_url(attempt.url()) {
            return attempt.error(denied);
        }
        let status = attempt.status().as_u16();
        let other_host = attempt.previous().first().is_some_and(|first| !same_host(first, attempt.url()));
        let refused = other_host
            && match follow {
                Follow::Never | Follow::SameHost => true,
                Follow::AnyHost(body) => body.sent_again_by(status),
            };
        if refused {
            let to = attempt.url().clone();
            return attempt.error(OtherHost { status, to });
        }
        attempt.follow()
    })
}

fn same_host(a: &reqwest::Url, b: &reqwest::Url) -> bool {
    a.host_str() == b.host_str() && a.port_or_known_default() == b.port_or_known_default()
}
