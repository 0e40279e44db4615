//! Signing in to the UI with OpenID Connect: the authorization code flow
//! with PKCE (S256) against the company's identity provider, the ID token
//! checked (its RS256 signature by the provider's published keys, issuer,
//! audience, expiry and nonce), and a person's groups mapped to scopes by
//! `COMPOSER_OIDC_ROLES`. The UI's routes (`/ui/sso`, `/ui/sso/callback`)
//! are in `ui::sso`; this module speaks to the provider.

use std::time::Duration;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use composer_api::Scope;
use ring::digest::{digest, SHA256};
use serde::Deserialize;
use serde_json::Value;
use tokio::sync::OnceCell;

/// The settings of sign-in with OpenID Connect; off while no issuer is set.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct OidcConfig {
    /// The OpenID provider's issuer URL (its `/.well-known/openid-configuration` is read at the first
    /// sign-in); the UI offers single sign-on when it is set.
    #[arg(long = "oidc-issuer", env = "COMPOSER_OIDC_ISSUER")]
    pub issuer: Option<String>,
    /// The client id Composer is registered with at the provider.
    #[arg(long = "oidc-client-id", env = "COMPOSER_OIDC_CLIENT_ID")]
    pub client_id: Option<String>,
    /// The client's secret (sent to the provider's token endpoint only).
    #[arg(long = "oidc-client-secret", env = "COMPOSER_OIDC_CLIENT_SECRET", hide_env_values = true)]
    pub client_secret: Option<String>,
    /// The scopes asked of the provider (space-separated); add the one that makes your provider put the
    /// groups claim in the ID token, if it has one (`groups`).
    #[arg(long = "oidc-scopes", env = "COMPOSER_OIDC_SCOPES", default_value = "openid email profile")]
    pub scopes: String,
    /// The claim of the ID token that lists a person's groups.
    #[arg(long = "oidc-groups-claim", env = "COMPOSER_OIDC_GROUPS_CLAIM", default_value = "groups")]
    pub groups_claim: String,
    /// Which groups get which scopes, `group=scope,scope;group=scope` (`platform=admin;support=read`), or in one
    /// namespace alone, `group@namespace=scope` (`billing-devs@billing=read`).
    /// A person in none of them is refused.
    #[arg(long = "oidc-roles", env = "COMPOSER_OIDC_ROLES", default_value = "")]
    pub roles: String,
}

impl OidcConfig {
    /// Whether sign-in with OpenID Connect is on.
    pub fn enabled(&self) -> bool {
        self.issuer.is_some()
    }

    /// Checks that an issuer comes with its client and a mapping that
    /// parses: the error names the setting.
    pub fn check(&self) -> Result<(), String> {
        if !self.enabled() {
            return Ok(());
        }
        if self.client_id.is_none() || self.client_secret.is_none() {
            return Err("COMPOSER_OIDC_ISSUER needs COMPOSER_OIDC_CLIENT_ID and COMPOSER_OIDC_CLIENT_SECRET".into());
        }
        let roles = roles(&self.roles).map_err(|e| format!("COMPOSER_OIDC_ROLES: {e}"))?;
        if roles.is_empty() {
            return Err("COMPOSER_OIDC_ROLES: name at least one group and its scopes, as platform=admin".into());
        }
        Ok(())
    }
}

/// What one group of `COMPOSER_OIDC_ROLES` gives: scopes in every
/// namespace, or in one.
#[derive(Debug, Clone, PartialEq)]
pub struct Role {
    pub group: String,
    pub namespace: Option<String>,
    pub scopes: Vec<Scope>,
}

/// `group=scope,scope;group@namespace=scope`, parsed: `group=` gives its
/// scopes in every namespace, `group@namespace=` in that one alone.
pub fn roles(text: &str) -> Result<Vec<Role>, String> {
    let mut out = Vec::new();
    for part in text.split(';').map(str::trim).filter(|p| !p.is_empty()) {
        let (group, scopes) = part.split_once('=').ok_or_else(|| format!("{part:?} is not group=scope,…"))?;
        let (group, namespace) = match group.trim().split_once('@') {
            Some((g, ns)) if composer_core::schema::is_namespace_name(ns) => (g, Some(ns.to_string())),
            Some((_, ns)) => return Err(format!("{ns:?} is not a namespace's name")),
            None => (group.trim(), None),
        };
        let scopes = scopes
            .split(',')
            .map(str::trim)
            .map(|s| serde_json::from_value(Value::from(s)).map_err(|_| format!("{s:?} is not a scope")))
            .collect::<Result<Vec<Scope>, String>>()?;
        out.push(Role { group: group.to_string(), namespace, scopes });
    }
    Ok(out)
}

/// What `groups` are given by `roles`, each once: a scope in every
/// namespace as its name (`read`), in one as `scope@namespace`
/// (`read@billing`), as a session keeps them (`access::Principal::person`).
pub fn scopes_of(roles: &[Role], groups: &[String]) -> Vec<String> {
    let mut grants: Vec<String> = roles
        .iter()
        .filter(|r| groups.contains(&r.group))
        .flat_map(|r| {
            r.scopes.iter().map(|s| match &r.namespace {
                Some(ns) => format!("{}@{ns}", s.name()),
                None => s.name().to_string(),
            })
        })
        .collect();
    grants.sort();
    grants.dedup();
    grants
}

/// A PKCE verifier's S256 challenge.
pub fn challenge(verifier: &str) -> String {
    URL_SAFE_NO_PAD.encode(digest(&SHA256, verifier.as_bytes()))
}

/// What the provider publishes about itself.
#[derive(Debug, Clone, Deserialize)]
pub struct Metadata {
    pub issuer: String,
    pub authorization_endpoint: String,
    pub token_endpoint: String,
    pub jwks_uri: String,
}

/// The person an ID token names.
#[derive(Debug, Clone, PartialEq)]
pub struct Person {
    /// `email`, else `preferred_username`, else `sub`.
    pub name: String,
    pub groups: Vec<String>,
}

/// The provider, discovered once per coordinator.
#[derive(Default)]
pub struct Provider {
    metadata: OnceCell<Metadata>,
}

/// How long a call to the provider may take.
const PROVIDER_TIMEOUT: Duration = Duration::from_secs(10);

/// Most of an answer of the provider's read (`max_provider_answer`).
pub const MAX_PROVIDER_ANSWER: usize = 1024 * 1024;

fn http() -> Result<reqwest::Client, String> {
    let builder = reqwest::Client::builder().timeout(PROVIDER_TIMEOUT);
    builder.redirect(reqwest::redirect::Policy::none()).build().map_err(|e| e.to_string())
}

/// An answer's body as JSON, read up to [`MAX_PROVIDER_ANSWER`].
async fn json_of(mut answer: reqwest::Response, what: &str) -> Result<Value, String> {
    let mut body = Vec::new();
    while let Some(chunk) = answer.chunk().await.map_err(|e| format!("{what}: {e}"))? {
        if body.len() + chunk.len() > MAX_PROVIDER_ANSWER {
            return Err(format!("{what}: an answer over {MAX_PROVIDER_ANSWER} bytes"));
        }
        body.extend_from_slice(&chunk);
    }
    serde_json::from_slice(&body).map_err(|e| format!("{what}: not JSON: {e}"))
}

impl Provider {
    /// The provider's metadata, read at the first sign-in.
    pub async fn metadata(&self, config: &OidcConfig) -> Result<&Metadata, String> {
        let issuer = config.issuer.as_deref().ok_or("single sign-on is not configured")?;
        self.metadata
            .get_or_try_init(|| async {
                let url = format!("{}/.well-known/openid-configuration", issuer.trim_end_matches('/'));
                let answer =
                    http()?.get(&url).send().await.map_err(|e| format!("the identity provider at {url}: {e}"))?;
                let what = format!("the identity provider's metadata at {url}");
                let m: Metadata =
                    serde_json::from_value(json_of(answer, &what).await?).map_err(|e| format!("{what}: {e}"))?;
                if m.issuer.trim_end_matches('/') != issuer.trim_end_matches('/') {
                    return Err(format!("the provider names itself {:?}, not {issuer:?}", m.issuer));
                }
                Ok(m)
            })
            .await
    }

    /// Exchanges an authorization code for the person its ID token names,
    /// checked against `nonce`.
    pub async fn person(
        &self,
        config: &OidcConfig,
        code: &str,
        verifier: &str,
        redirect_uri: &str,
        nonce: &str,
    ) -> Result<Person, String> {
        let m = self.metadata(config).await?;
        let (client_id, secret) = (config.client_id.as_deref().unwrap_or(""), config.client_secret.as_deref());
        let form = [
            ("grant_type", "authorization_code"),
            ("code", code),
            ("redirect_uri", redirect_uri),
            ("code_verifier", verifier),
        ];
        let http = http()?;
        // RFC 6749 2.3.1: the id and secret are form-encoded before Basic.
        let (id, secret) = (composer_api::rest::encode(client_id), secret.map(composer_api::rest::encode));
        let answer = http
            .post(&m.token_endpoint)
            .basic_auth(id, secret)
            .form(&form)
            .send()
            .await
            .map_err(|e| format!("the token endpoint: {e}"))?;
        let status = answer.status();
        let body = json_of(answer, "the token endpoint's answer").await?;
        if !status.is_success() {
            return Err(format!("the token endpoint refused the code ({status}): {}", body["error"]));
        }
        let token = body["id_token"].as_str().ok_or("the token endpoint gave no id_token")?;
        let answer = http.get(&m.jwks_uri).send().await.map_err(|e| format!("the provider's keys: {e}"))?;
        let keys = json_of(answer, "the provider's keys").await?;
        let claims = verified(token, &keys)?;
        check_claims(&claims, &m.issuer, client_id, nonce, crate::clock::now().timestamp())?;
        Ok(person(&claims, &config.groups_claim))
    }
}

/// The claims of an RS256 JWT whose signature one of `keys` (a JWKS) verifies.
pub fn verified(token: &str, keys: &Value) -> Result<Value, String> {
    let mut parts = token.split('.');
    let (Some(head), Some(body), Some(sig), None) = (parts.next(), parts.next(), parts.next(), parts.next()) else {
        return Err("the ID token is not a JWT".into());
    };
    let decode = |p: &str| URL_SAFE_NO_PAD.decode(p).map_err(|_| "the ID token is not base64url".to_string());
    let header: Value = serde_json::from_slice(&decode(head)?).map_err(|_| "the ID token's header is not JSON")?;
    if header["alg"] != "RS256" {
        return Err(format!("the ID token is signed with {}, not RS256", header["alg"]));
    }
    let kid = header["kid"].as_str();
    let candidates: Vec<&Value> = keys["keys"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|k| k["kty"] == "RSA" && k["use"].as_str().is_none_or(|u| u == "sig"))
        .filter(|k| kid.is_none() || k["kid"].as_str() == kid)
        .collect();
    if candidates.is_empty() {
        return Err("no key of the provider's signs this ID token".into());
    }
    let signed = &token[..head.len() + 1 + body.len()];
    let signature = decode(sig)?;
    // Without a `kid`, any of the provider's signing keys may be the one.
    let verifies = |key: &&Value| {
        let (Ok(n), Ok(e)) = (decode(key["n"].as_str().unwrap_or("")), decode(key["e"].as_str().unwrap_or(""))) else {
            return false;
        };
        let public = ring::signature::RsaPublicKeyComponents { n: &n, e: &e };
        public.verify(&ring::signature::RSA_PKCS1_2048_8192_SHA256, signed.as_bytes(), &signature).is_ok()
    };
    if !candidates.iter().any(verifies) {
        return Err("the ID token's signature does not verify".into());
    }
    serde_json::from_slice(&decode(body)?).map_err(|_| "the ID token's claims are not JSON".into())
}

/// How far an ID token's times may be off this clock.
const LEEWAY_SECS: i64 = 60;

/// The checks of OpenID Connect Core 3.1.3.7 on an ID token's claims.
pub fn check_claims(claims: &Value, issuer: &str, client_id: &str, nonce: &str, now: i64) -> Result<(), String> {
    if claims["iss"].as_str() != Some(issuer) {
        return Err(format!("the ID token's issuer is {}, not {issuer:?}", claims["iss"]));
    }
    let audience = match &claims["aud"] {
        Value::String(a) => vec![a.as_str()],
        Value::Array(a) => a.iter().filter_map(Value::as_str).collect(),
        _ => vec![],
    };
    if !audience.contains(&client_id) || (audience.len() > 1 && claims["azp"].as_str() != Some(client_id)) {
        return Err("the ID token is not for this client".into());
    }
    if claims["exp"].as_i64().is_none_or(|exp| exp + LEEWAY_SECS < now) {
        return Err("the ID token has expired".into());
    }
    if claims["nonce"].as_str() != Some(nonce) {
        return Err("the ID token's nonce is not this sign-in's".into());
    }
    Ok(())
}

/// Who the claims name, and their groups: by their `email` when the
/// provider has verified it, else by `sub` (a name a person cannot choose;
/// `preferred_username` often is one).
pub fn person(claims: &Value, groups_claim: &str) -> Person {
    let verified = claims["email_verified"] == Value::Bool(true);
    let email = claims["email"].as_str().filter(|_| verified);
    let name = email.or(claims["sub"].as_str()).unwrap_or("unknown");
    let groups = match &claims[groups_claim] {
        Value::Array(g) => g.iter().filter_map(Value::as_str).map(String::from).collect(),
        Value::String(g) => vec![g.clone()],
        _ => vec![],
    };
    Person { name: name.chars().take(256).collect(), groups }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn roles_map_groups_to_scopes_and_a_bad_one_names_itself() {
        let r = roles("platform=admin; support = read,runs:control ;").unwrap();
        assert_eq!(r.len(), 2);
        let groups = |g: &[&str]| g.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(scopes_of(&r, &groups(&["support"])), vec!["read", "runs:control"]);
        assert_eq!(scopes_of(&r, &groups(&["interns"])), Vec::<String>::new());
        assert!(roles("platform=root").unwrap_err().contains("\"root\""));
        assert!(roles("platform").unwrap_err().contains("group=scope"));
        assert!(roles("billing@Bad=read").unwrap_err().contains("\"Bad\" is not a namespace"));
    }

    #[test]
    fn a_role_in_one_namespace_gives_its_scopes_there_alone() {
        let r = roles("platform=read; billing@billing=runs:control,read; ops@ops-a=admin").unwrap();
        assert_eq!(
            r[1],
            Role {
                group: "billing".into(),
                namespace: Some("billing".into()),
                scopes: vec![Scope::RunsControl, Scope::Read]
            }
        );
        let grants = scopes_of(&r, &["billing".to_string(), "platform".to_string()]);
        assert_eq!(grants, vec!["read", "read@billing", "runs:control@billing"]);
        let billing = crate::access::Principal::person("p", &grants, "billing");
        assert!(billing.may(Scope::RunsControl) && billing.may(Scope::Read) && !billing.may(Scope::Admin));
        let default = crate::access::Principal::person("p", &grants, "default");
        assert!(default.may(Scope::Read) && !default.may(Scope::RunsControl));
        let only_billing = scopes_of(&r, &["billing".to_string()]);
        assert!(crate::access::Principal::person_may_enter(&only_billing, "billing"));
        assert!(!crate::access::Principal::person_may_enter(&only_billing, "default"));
        assert!(!crate::access::Principal::person("p", &only_billing, "ops-a").may(Scope::Read));
    }

    #[test]
    fn an_issuer_needs_its_client_and_roles() {
        let mut c = OidcConfig { groups_claim: "groups".into(), ..Default::default() };
        assert!(c.check().is_ok(), "off");
        c.issuer = Some("https://idp".into());
        assert!(c.check().unwrap_err().contains("COMPOSER_OIDC_CLIENT_ID"));
        c.client_id = Some("composer".into());
        c.client_secret = Some("s".into());
        assert!(c.check().unwrap_err().contains("COMPOSER_OIDC_ROLES"));
        c.roles = "ops=read".into();
        assert!(c.check().is_ok());
        c.roles = "ops=everything".into();
        assert!(c.check().unwrap_err().contains("\"everything\" is not a scope"));
    }

    #[test]
    fn the_s256_challenge_is_the_rfc_7636_example() {
        // RFC 7636, appendix B.
        assert_eq!(
            challenge("dBjftJeZ4CVP-mB92K27uhbUJU1p1r_wW1gFWFOEjXk"),
            "E9Melhoa2OwvFrEMTJguCHaoeK1t8URWbuGJSstw-cM"
        );
    }

    #[test]
    fn an_id_token_s_claims_are_checked_as_openid_connect_says() {
        let ok = json!({"iss": "https://idp", "aud": "composer", "exp": 1000, "nonce": "n", "sub": "u1"});
        assert_eq!(check_claims(&ok, "https://idp", "composer", "n", 1000), Ok(()));
        let with = |k: &str, v: Value| {
            let mut c = ok.clone();
            c[k] = v;
            c
        };
        for (claims, why) in [
            (with("iss", json!("https://evil")), "issuer"),
            (with("aud", json!("other")), "not for this client"),
            (with("aud", json!(["composer", "other"])), "not for this client"),
            (with("exp", json!(900)), "expired"),
            (with("nonce", json!("m")), "nonce"),
        ] {
            let err = check_claims(&claims, "https://idp", "composer", "n", 1000).unwrap_err();
            assert!(err.contains(why), "{err}");
        }
        let azp = with("aud", json!(["composer", "other"]));
        assert!(check_claims(&with_azp(azp), "https://idp", "composer", "n", 1000).is_ok());
    }

    fn with_azp(mut c: Value) -> Value {
        c["azp"] = json!("composer");
        c
    }

    #[test]
    fn a_token_not_signed_by_the_provider_s_key_is_refused() {
        let keys = json!({"keys": [{"kty": "RSA", "kid": "k", "n": "AQAB", "e": "AQAB"}]});
        let part = |v: Value| URL_SAFE_NO_PAD.encode(v.to_string());
        let unsigned = format!("{}.{}.", part(json!({"alg": "none"})), part(json!({"sub": "x"})));
        assert!(verified(&unsigned, &keys).unwrap_err().contains("not RS256"));
        let forged = format!("{}.{}.{}", part(json!({"alg": "RS256", "kid": "k"})), part(json!({"sub": "x"})), "AAAA");
        assert!(verified(&forged, &keys).unwrap_err().contains("signature"));
        let other = format!("{}.{}.AAAA", part(json!({"alg": "RS256", "kid": "z"})), part(json!({})));
        assert!(verified(&other, &keys).unwrap_err().contains("no key"));
        assert!(verified("a.b", &keys).is_err());
    }

    #[test]
    fn a_person_is_named_by_a_verified_email_else_by_subject() {
        let p = person(&json!({"sub": "u1", "email": "a@x", "email_verified": true, "groups": ["ops", 3]}), "groups");
        assert_eq!(p, Person { name: "a@x".into(), groups: vec!["ops".into()] });
        assert_eq!(person(&json!({"sub": "u1", "email": "boss@x"}), "groups").name, "u1", "an email not verified");
        let chosen = json!({"sub": "u1", "preferred_username": "boss", "email_verified": false, "email": "boss@x"});
        assert_eq!(person(&chosen, "groups").name, "u1");
        assert_eq!(person(&json!({"sub": "u1", "roles": "ops"}), "roles").groups, vec!["ops".to_string()]);
        assert_eq!(person(&json!({"sub": "u1"}), "groups").name, "u1");
    }
}
