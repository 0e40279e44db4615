//! Logins to the web UI, kept by the SHA-256 of their id (the caller
//! hashes; the id itself is only ever in the browser's cookie). Every
//! statement touches rows by their key or by expiry, so any number of
//! coordinators may run them at once.

use std::time::Duration;

use crate::{Client, Result};

/// Who a session is: a person signed in with the identity provider, with
/// the scopes their groups give; `None` for the API token's holder.
#[derive(Debug, Clone, PartialEq)]
pub struct Person {
    pub actor: String,
    pub scopes: Vec<String>,
    /// Their groups at the provider: approvals assigned to one are theirs to decide.
    pub groups: Vec<String>,
}

/// Records a session that lasts `ttl` (of `person`, or of the API token's
/// holder), and drops the sessions that have expired (so the table holds
/// only live ones; deleting an expired row twice, from two coordinators,
/// is harmless).
pub async fn create(client: &Client, id_hash: &[u8], ttl: Duration, person: Option<&Person>) -> Result<()> {
    let stmt = client
        .prepare_cached(
            "WITH expired AS (DELETE FROM ui_sessions WHERE expires_at < now())
             INSERT INTO ui_sessions (id_hash, expires_at, actor, scopes, groups)
             VALUES ($1, now() + make_interval(secs => $2), $3, $4, $5)",
        )
        .await?;
    let (actor, scopes, groups) = (person.map(|p| &p.actor), person.map(|p| &p.scopes), person.map(|p| &p.groups));
    client.execute(&stmt, &[&id_hash, &ttl.as_secs_f64(), &actor, &scopes, &groups]).await?;
    Ok(())
}

/// A live session: `Some(None)` for the API token's holder, `Some(person)`
/// for a person signed in, `None` when there is none or it expired.
pub async fn live(client: &Client, id_hash: &[u8]) -> Result<Option<Option<Person>>> {
    let stmt = client
        .prepare_cached("SELECT actor, scopes, groups FROM ui_sessions WHERE id_hash = $1 AND expires_at > now()")
        .await?;
    let Some(row) = client.query_opt(&stmt, &[&id_hash]).await? else { return Ok(None) };
    let (actor, scopes): (Option<String>, Option<Vec<String>>) = (row.try_get(0)?, row.try_get(1)?);
    let groups: Option<Vec<String>> = row.try_get(2)?;
    Ok(Some(actor.map(|actor| Person {
        actor,
        scopes: scopes.unwrap_or_default(),
        groups: groups.unwrap_or_default(),
    })))
}

/// A sign-in under way, as the provider's answer will need it.
#[derive(Debug, Clone, PartialEq)]
pub struct SignIn {
    pub verifier: String,
    pub nonce: String,
    pub next: String,
}

/// Records a sign-in begun, for `ttl`, by the hash of its state, unless
/// `at_most` are under way already (false then); drops those that expired.
pub async fn begin_sign_in(
    client: &Client,
    state_hash: &[u8],
    s: &SignIn,
    ttl: Duration,
    at_most: i64,
) -> Result<bool> {
    let stmt = client
        .prepare_cached(
            "WITH expired AS (DELETE FROM ui_sso_logins WHERE expires_at < now())
             INSERT INTO ui_sso_logins (state_hash, verifier, nonce, next, expires_at)
             SELECT $1, $2, $3, $4, now() + make_interval(secs => $5)
             WHERE (SELECT count(*) FROM ui_sso_logins WHERE expires_at >= now()) < $6",
        )
        .await?;
    let n = client.execute(&stmt, &[&state_hash, &s.verifier, &s.nonce, &s.next, &ttl.as_secs_f64(), &at_most]).await?;
    Ok(n == 1)
}

/// Takes a sign-in by the hash of its state: once (the row is deleted),
/// and only while it has not expired.
pub async fn take_sign_in(client: &Client, state_hash: &[u8]) -> Result<Option<SignIn>> {
    let stmt = client
        .prepare_cached(
            "DELETE FROM ui_sso_logins WHERE state_hash = $1 AND expires_at > now() RETURNING verifier, nonce, next",
        )
        .await?;
    let row = client.query_opt(&stmt, &[&state_hash]).await?;
    row.map(|r| Ok(SignIn { verifier: r.try_get(0)?, nonce: r.try_get(1)?, next: r.try_get(2)? })).transpose()
}

/// Ends a session (logout); ending one that is gone is no error.
pub async fn revoke(client: &Client, id_hash: &[u8]) -> Result<()> {
    let stmt = client.prepare_cached("DELETE FROM ui_sessions WHERE id_hash = $1").await?;
    client.execute(&stmt, &[&id_hash]).await?;
    Ok(())
}
