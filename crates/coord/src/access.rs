//! Who is calling, and what they may do: the [`Principal`] a request's
//! bearer token names — an API key (`composer_store::keys`), or one of the
//! environment's tokens — and its scopes.
//!
//! A key is `cmp_<id>_<secret>`: the id finds its row, the secret's SHA-256
//! must equal the row's. Rows are cached for [`KEY_CACHE_TTL`], so a key is
//! not a PostgreSQL round trip per request; a revocation reaches the other
//! coordinators within that time (the one that revoked forgets at once).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use composer_api::Scope;
use composer_store::keys::KeyRow;
use composer_store::Pool;
use ring::digest::{digest, SHA256};
use ring::rand::{SecureRandom, SystemRandom};
use uuid::Uuid;

use crate::config::Config;

/// Every key begins so: a scanner of leaked secrets can find ours.
pub const KEY_PREFIX: &str = "cmp_";

/// Random bytes in a key's secret part: 256 bits, hex in the key.
const SECRET_BYTES: usize = 32;

/// How long a coordinator trusts its copy of a key's row (`key_cache_ttl`):
/// a revocation reaches every coordinator within it.
pub const KEY_CACHE_TTL: Duration = Duration::from_secs(5);

/// Keys (known or not) one coordinator keeps (`key_cache_entries`); past
/// it the cache starts over, so unknown ids sent at random cannot grow it.
pub const KEY_CACHE_ENTRIES: usize = 10_000;

/// Who is calling.
#[derive(Debug, Clone, PartialEq)]
pub struct Principal {
    /// The actor runs' history and the audit log name.
    pub name: String,
    /// The key, when a key (not an environment token) was given.
    pub key_id: Option<Uuid>,
    scopes: Vec<Scope>,
    queues: Option<Vec<String>>,
    /// The API token's holder: the one who may create a key of any scope.
    root: bool,
    /// The only namespace it may act in; `None`: every namespace.
    namespace: Option<String>,
    /// A person's groups at the identity provider (none for a key or a
    /// token): the approvals assigned to one are theirs to decide.
    pub groups: Vec<String>,
}

/// Most of a person's groups a session keeps.
pub const MAX_GROUPS: usize = 256;

/// Names a key may not take: the environment's principals'.
pub const RESERVED_NAMES: [&str; 3] = ["anonymous", "worker", "metrics"];

impl Principal {
    fn new(name: &str, scopes: Vec<Scope>) -> Principal {
        Principal {
            name: name.to_string(),
            key_id: None,
            scopes,
            queues: None,
            root: false,
            namespace: None,
            groups: Vec::new(),
        }
    }

    /// An administrator named `name`, who plays the workers' and the
    /// metrics reader's roles too only while no token of theirs is set (so
    /// that an API user cannot report a step's result beside the workers).
    fn administrator(config: &Config, name: &str) -> Principal {
        let mut scopes = vec![Scope::Admin];
        if config.worker_token.is_none() {
            scopes.push(Scope::TasksWork);
        }
        if config.metrics_token.is_none() {
            scopes.push(Scope::MetricsRead);
        }
        Principal::new(name, scopes)
    }

    /// Everyone on a coordinator that set no token for the route: what
    /// `composer dev` on loopback has always been.
    pub fn anonymous(config: &Config) -> Principal {
        Principal::administrator(config, "anonymous")
    }

    /// The holder of `COMPOSER_API_TOKEN`: an administrator named
    /// `COMPOSER_API_TOKEN_NAME`, and the root of every key.
    pub fn api_token(config: &Config) -> Principal {
        Principal { root: true, ..Principal::administrator(config, &config.api_token_name) }
    }

    /// A person signed in to the UI with the identity provider, in
    /// namespace `namespace`, with the scopes their groups give there:
    /// each of `grants` is a scope in every namespace (`read`) or in one
    /// (`read@billing`; see `oidc::roles`).
    pub fn person(name: &str, grants: &[String], namespace: &str) -> Principal {
        let here = |grant: &String| match grant.split_once('@') {
            Some((scope, ns)) => (ns == namespace).then(|| scope.to_string()),
            None => Some(grant.clone()),
        };
        let scopes = grants
            .iter()
            .filter_map(here)
            .filter_map(|s| serde_json::from_value(serde_json::Value::from(s)).ok())
            .collect();
        Principal::new(name, scopes)
    }

    /// The same person, in `groups` at the identity provider.
    pub fn in_groups(self, groups: Vec<String>) -> Principal {
        Principal { groups, ..self }
    }

    /// Whether a person with `grants` holds any scope in namespace `namespace`.
    pub fn person_may_enter(grants: &[String], namespace: &str) -> bool {
        grants.iter().any(|g| g.split_once('@').is_none_or(|(_, ns)| ns == namespace))
    }

    /// Who takes an action in the UI or on an unguarded path: the API
    /// token's holder, or `anonymous` on a coordinator without one.
    pub fn operator(config: &Config) -> Principal {
        match config.api_token {
            Some(_) => Principal::api_token(config),
            None => Principal::anonymous(config),
        }
    }

    /// Whether it may create a key holding `scope`: the API token's holder
    /// any scope, anyone else only one it holds (so an administrator's key
    /// cannot make a worker's key).
    pub fn may_grant(&self, scope: Scope) -> bool {
        self.root || self.may(scope)
    }

    /// The only queues it may work, when it is limited to some.
    pub fn queues(&self) -> Option<&[String]> {
        self.queues.as_deref()
    }

    /// The only namespace it may act in, when it is bound to one.
    pub fn namespace(&self) -> Option<&str> {
        self.namespace.as_deref()
    }

    /// Why it may not act in namespace `namespace`, bound to another (said
    /// before its scopes are looked at: it holds none there).
    pub fn bound_elsewhere(&self, namespace: &str) -> String {
        let bound = self.namespace().unwrap_or_default();
        format!("{} is bound to namespace {bound}; this call is in namespace {namespace}", self.name)
    }

    /// Whether it may act in namespace `namespace`.
    pub fn may_enter(&self, namespace: &str) -> bool {
        self.namespace.as_deref().is_none_or(|n| n == namespace)
    }

    /// Whether it holds `scope`. An administrator holds every scope under
    /// `/v1` but `tasks:work`: working queues and reading `/metrics` are
    /// roles of their own.
    pub fn may(&self, scope: Scope) -> bool {
        let roles = [Scope::TasksWork, Scope::MetricsRead];
        self.scopes.iter().any(|s| *s == scope || (*s == Scope::Admin && !roles.contains(&scope)))
    }

    /// Whether it may take tasks of `queue`.
    pub fn may_work(&self, queue: &str) -> bool {
        self.may(Scope::TasksWork) && self.queues.as_ref().is_none_or(|q| q.iter().any(|q| q == queue))
    }
}

/// The namespace a request is in, as the door (`http::door`) named it.
#[derive(Debug, Clone)]
pub struct InNamespace(pub std::sync::Arc<str>);

/// The caller a request's bearer token names: a token of the environment's
/// or a live key; `None` for none, or one the cluster does not know.
pub async fn caller(
    config: &Config,
    keys: &Keys,
    headers: &axum::http::HeaderMap,
) -> composer_store::Result<Option<Principal>> {
    let given = headers.get(axum::http::header::AUTHORIZATION).and_then(|h| h.to_str().ok());
    let Some(given) = composer_config::auth::bearer(given) else { return Ok(None) };
    match environment(config, given) {
        Some(p) => Ok(Some(p)),
        None => keys.principal(given).await,
    }
}

/// The principal an environment token names, if `given` is one.
pub fn environment(config: &Config, given: &str) -> Option<Principal> {
    use composer_config::auth::tokens_match;
    let is = |token: &Option<String>| token.as_deref().is_some_and(|t| tokens_match(given.as_bytes(), t.as_bytes()));
    if is(&config.api_token) {
        Some(Principal::api_token(config))
    } else if is(&config.worker_token) {
        Some(Principal::new("worker", vec![Scope::TasksWork]))
    } else if is(&config.metrics_token) {
        Some(Principal::new("metrics", vec![Scope::MetricsRead]))
    } else {
        None
    }
}

/// A random (version 4) id, from the operating system's random source.
pub fn random_id() -> Option<Uuid> {
    let mut bytes = [0u8; 16];
    SystemRandom::new().fill(&mut bytes).ok()?;
    Some(uuid::Builder::from_random_bytes(bytes).into_uuid())
}

/// A new key: its id, the key to hand out once, and the hash to keep.
pub fn mint() -> Option<(Uuid, String, Vec<u8>)> {
    let mut bytes = [0u8; SECRET_BYTES];
    SystemRandom::new().fill(&mut bytes).ok()?;
    let secret: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    let id = random_id()?;
    let hash = digest(&SHA256, secret.as_bytes()).as_ref().to_vec();
    Some((id, format!("{KEY_PREFIX}{}_{secret}", id.simple()), hash))
}

/// A key's id and secret part, when `given` has a key's shape.
fn parse(given: &str) -> Option<(Uuid, &str)> {
    let (id, secret) = given.strip_prefix(KEY_PREFIX)?.split_once('_')?;
    let id = (id.len() == 32).then(|| Uuid::try_parse(id).ok()).flatten()?;
    (secret.len() == 2 * SECRET_BYTES && secret.bytes().all(|b| b.is_ascii_hexdigit())).then_some((id, secret))
}

/// The principal a stored key row grants, if the key may be used now.
fn granted(row: &KeyRow, secret: &str, now: chrono::DateTime<chrono::Utc>) -> Option<Principal> {
    let given = digest(&SHA256, secret.as_bytes());
    let same = composer_config::auth::tokens_match(given.as_ref(), &row.secret_hash);
    let live = row.revoked_at.is_none() && row.expires_at.is_none_or(|t| t > now);
    let scopes = row.scopes.iter().filter_map(|s| serde_json::from_value(serde_json::json!(s)).ok()).collect();
    (same && live).then(|| Principal {
        name: row.name.clone(),
        key_id: Some(row.id),
        scopes,
        queues: row.queues.clone(),
        root: false,
        namespace: row.namespace.clone(),
        groups: Vec::new(),
    })
}

/// The keys this coordinator has read lately: rows found, ids not found
/// (kept apart, so ids sent at random cannot push a real key out), and the
/// ids it revoked (so a read that began before the revocation cannot put
/// the row back).
pub struct Keys {
    pool: Pool,
    cache: Mutex<Cache>,
}

#[derive(Default)]
struct Cache {
    found: HashMap<Uuid, (Instant, KeyRow)>,
    missing: HashMap<Uuid, Instant>,
    forgotten: HashMap<Uuid, Instant>,
}

impl Keys {
    pub fn new(pool: Pool) -> Keys {
        Keys { pool, cache: Mutex::default() }
    }

    fn cache(&self) -> std::sync::MutexGuard<'_, Cache> {
        self.cache.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The principal key `given` names; `None` for anything else (no key,
    /// unknown, wrong secret, revoked, expired).
    pub async fn principal(&self, given: &str) -> composer_store::Result<Option<Principal>> {
        let Some((id, secret)) = parse(given) else { return Ok(None) };
        let row = match self.cached(id) {
            Some(row) => row,
            None => {
                let asked = Instant::now();
                let client = composer_store::client(&self.pool).await?;
                let row = composer_store::keys::get(&client, id).await?;
                self.keep(id, row.clone(), asked);
                row
            }
        };
        Ok(row.and_then(|row| granted(&row, secret, crate::clock::now())))
    }

    fn cached(&self, id: Uuid) -> Option<Option<KeyRow>> {
        self.cache().get(id)
    }

    fn keep(&self, id: Uuid, row: Option<KeyRow>, asked: Instant) {
        self.cache().keep(id, row, asked)
    }

    /// Drops what this coordinator knows of a key (it was just revoked).
    pub fn forget(&self, id: Uuid) {
        self.cache().forget(id)
    }
}

impl Cache {
    fn get(&self, id: Uuid) -> Option<Option<KeyRow>> {
        let fresh = |at: &Instant| at.elapsed() < KEY_CACHE_TTL;
        if let Some((_, row)) = self.found.get(&id).filter(|(at, _)| fresh(at)) {
            return Some(Some(row.clone()));
        }
        self.missing.get(&id).filter(|at| fresh(at)).map(|_| None)
    }

    /// Keeps what a read begun at `asked` found, unless this coordinator
    /// revoked the key since.
    fn keep(&mut self, id: Uuid, row: Option<KeyRow>, asked: Instant) {
        if self.forgotten.get(&id).is_some_and(|at| *at >= asked) {
            return;
        }
        let now = Instant::now();
        match row {
            Some(row) => {
                if self.found.len() >= KEY_CACHE_ENTRIES {
                    self.found.retain(|_, (at, _)| at.elapsed() < KEY_CACHE_TTL);
                }
                if self.found.len() < KEY_CACHE_ENTRIES {
                    self.found.insert(id, (now, row));
                }
            }
            None => {
                if self.missing.len() >= KEY_CACHE_ENTRIES {
                    self.missing.clear();
                }
                self.missing.insert(id, now);
            }
        }
    }

    fn forget(&mut self, id: Uuid) {
        self.found.remove(&id);
        self.forgotten.retain(|_, at| at.elapsed() < KEY_CACHE_TTL);
        self.forgotten.insert(id, Instant::now());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_minted_key_parses_to_its_id_and_its_hash_is_of_the_secret() {
        let (id, key, hash) = mint().unwrap();
        let (parsed, secret) = parse(&key).unwrap();
        assert_eq!(parsed, id);
        assert_eq!(digest(&SHA256, secret.as_bytes()).as_ref(), hash.as_slice());
        assert!(!key.contains(&format!("{hash:?}")));
        for bad in ["", "cmp_", "cmp_x_y", &key[..key.len() - 1], &key.replace("cmp_", "cmq_"), &format!("{key}0")] {
            assert!(parse(bad).is_none(), "{bad}");
        }
    }

    fn row(secret: &str) -> KeyRow {
        KeyRow {
            id: random_id().unwrap(),
            name: "ci".into(),
            secret_hash: digest(&SHA256, secret.as_bytes()).as_ref().to_vec(),
            scopes: vec!["read".into(), "tasks:work".into()],
            queues: Some(vec!["images".into()]),
            created_at: crate::clock::now(),
            created_by: "admin".into(),
            expires_at: None,
            revoked_at: None,
            namespace: Some("billing".into()),
        }
    }

    #[test]
    fn a_key_grants_its_scopes_and_queues_only_while_live_and_only_to_its_secret() {
        let now = crate::clock::now();
        let p = granted(&row("s"), "s", now).unwrap();
        assert!(p.may(Scope::Read) && p.may(Scope::TasksWork) && !p.may(Scope::RunsControl) && !p.may(Scope::Admin));
        assert!(p.may_work("images") && !p.may_work("billing"));
        assert!(p.may_enter("billing") && !p.may_enter("default") && !p.may_enter("other"));
        assert!(granted(&row("s"), "t", now).is_none(), "another secret");
        let revoked = KeyRow { revoked_at: Some(now), ..row("s") };
        assert!(granted(&revoked, "s", now).is_none(), "revoked");
        let expired = KeyRow { expires_at: Some(now - chrono::Duration::seconds(1)), ..row("s") };
        assert!(granted(&expired, "s", now).is_none(), "expired");
        let later = KeyRow { expires_at: Some(now + chrono::Duration::seconds(60)), ..row("s") };
        assert!(granted(&later, "s", now).is_some(), "not yet expired");
    }

    /// A read that began before this coordinator revoked the key does not
    /// put the row back; ids not found never push a found key out.
    #[test]
    fn the_cache_keeps_no_revoked_row_and_unknown_ids_cannot_crowd_it() {
        let mut cache = Cache::default();
        let live = row("s");
        let asked = Instant::now();
        cache.forget(live.id);
        cache.keep(live.id, Some(live.clone()), asked);
        assert!(cache.get(live.id).is_none(), "revoked after the read began");
        cache.keep(live.id, Some(live.clone()), Instant::now());
        assert!(cache.get(live.id).is_some_and(|r| r.is_some()), "a read begun after it is kept");
        for _ in 0..KEY_CACHE_ENTRIES + 5 {
            cache.keep(random_id().unwrap(), None, Instant::now());
        }
        assert!(cache.missing.len() <= KEY_CACHE_ENTRIES);
        assert!(cache.get(live.id).is_some_and(|r| r.is_some()), "the found key stays");
    }

    #[test]
    fn an_administrator_holds_every_scope_but_the_workers_and_the_metrics_readers() {
        let admin = Principal::new("admin", vec![Scope::Admin]);
        let roles = [Scope::TasksWork, Scope::MetricsRead];
        assert!(Scope::ALL.iter().filter(|s| !roles.contains(s)).all(|s| admin.may(*s)));
        assert!(!admin.may(Scope::TasksWork) && !admin.may_work("any") && !admin.may(Scope::MetricsRead));
        let open = Principal::anonymous(&Config::new("postgres://unused", "redis://unused"));
        assert!(Scope::ALL.iter().all(|s| open.may(*s)) && open.may_work("any"), "no token: all is open");
        assert!(!open.may_grant(Scope::Admin) || open.may(Scope::Admin));
    }
}
