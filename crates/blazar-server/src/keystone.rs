//! Keystone authentication (auth mode `keystone`): validating users' tokens against Keystone
//! v3 with the service's own credentials, and caching what Keystone said.
//!
//! A validated token is cached, keyed by its SHA-256 digest, until Keystone's `expires_at`;
//! an entry older than the revalidation interval is checked with Keystone again before use,
//! so a revoked token stops working within that interval. The cache is bounded: when full,
//! expired entries go first, then the least recently validated. A refused token is
//! remembered as refused for the same interval, apart (a quarter of the size), so that a
//! client repeating a bad token does not make every request a call to Keystone, and bad
//! tokens never push good ones out. Requests that find the same token unknown or stale at
//! once share one call to Keystone.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use axum::http::HeaderValue;
use blazar_service::{Clock, Identity};
use chrono::{DateTime, Utc};
use serde::Deserialize;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use crate::secret::Secret;

/// Tokens longer than this are refused without asking Keystone (Fernet tokens are ~200
/// bytes; JWS tokens under 1 KiB).
const MAX_TOKEN_BYTES: usize = 8 * 1024;

/// Renew the service's own token this long before it expires.
const SERVICE_TOKEN_MARGIN_SECONDS: i64 = 120;

#[derive(Debug, Clone)]
pub struct KeystoneSettings {
    /// Keystone's identity API, e.g. `http://keystone:5000/v3` (`/v3` is added if missing).
    pub auth_url: String,
    pub username: String,
    pub password: Secret,
    pub user_domain_name: String,
    pub project_name: String,
    pub project_domain_name: String,
    /// Most tokens kept in the cache.
    pub cache_size: usize,
    /// How long a validation is trusted before Keystone is asked again (revocation delay).
    pub revalidate_after: chrono::Duration,
    /// Limit on each call to Keystone.
    pub timeout: std::time::Duration,
}

/// Normalises an auth URL to end in `/v3`, without a trailing slash.
pub fn v3_url(auth_url: &str) -> String {
    let trimmed = auth_url.trim_end_matches('/');
    if trimmed.ends_with("/v3") {
        trimmed.to_string()
    } else {
        format!("{trimmed}/v3")
    }
}

/// Who a token belongs to, as Keystone said.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    pub user_id: String,
    pub user_name: String,
    pub user_domain_id: String,
    pub project_id: String,
    pub project_name: String,
    pub project_domain_id: String,
    pub roles: Vec<String>,
    pub expires_at: DateTime<Utc>,
}

impl Principal {
    pub fn identity(&self) -> Identity {
        Identity {
            user_id: self.user_id.clone(),
            project_id: self.project_id.clone(),
            roles: self.roles.clone(),
        }
    }
}

/// Keystone's answer about a token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Valid(Arc<Principal>),
    /// Unknown, malformed, revoked or expired.
    Invalid,
    /// Valid, but scoped to a domain or the system, or unscoped; Blazar's rules are all
    /// project-scoped.
    NotProjectScoped,
}

#[derive(Debug, Clone, thiserror::Error)]
pub enum KeystoneError {
    /// Keystone could not be reached or answered something unexpected.
    #[error("Keystone is unavailable: {0}")]
    Unavailable(String),
    /// Keystone refused the service's own credentials or permissions.
    #[error("Keystone refused the service's credentials: {0}")]
    Refused(String),
}

#[derive(Deserialize)]
struct TokenBody {
    token: TokenData,
}

#[derive(Deserialize)]
struct Named {
    id: String,
    #[serde(default)]
    name: String,
    #[serde(default)]
    domain: Option<Domain>,
}

#[derive(Deserialize)]
struct Domain {
    id: String,
}

#[derive(Deserialize)]
struct RoleRef {
    name: String,
}

#[derive(Deserialize)]
struct TokenData {
    expires_at: String,
    user: Named,
    #[serde(default)]
    project: Option<Named>,
    #[serde(default)]
    roles: Vec<RoleRef>,
}

fn parse_time(text: &str) -> Result<DateTime<Utc>, KeystoneError> {
    DateTime::parse_from_rfc3339(text)
        .map(|t| t.with_timezone(&Utc))
        .map_err(|e| KeystoneError::Unavailable(format!("unreadable expires_at {text:?}: {e}")))
}

fn principal_of(data: TokenData) -> Result<Option<Principal>, KeystoneError> {
    let expires_at = parse_time(&data.expires_at)?;
    let Some(project) = data.project else {
        return Ok(None);
    };
    Ok(Some(Principal {
        user_domain_id: data.user.domain.map(|d| d.id).unwrap_or_default(),
        user_id: data.user.id,
        user_name: data.user.name,
        project_domain_id: project.domain.map(|d| d.id).unwrap_or_default(),
        project_id: project.id,
        project_name: project.name,
        roles: data.roles.into_iter().map(|r| r.name).collect(),
        expires_at,
    }))
}

/// One validation of a token under way, shared by the requests that wait for it.
type Asked = tokio::sync::OnceCell<Result<Verdict, KeystoneError>>;

/// A request's part in a shared validation. Dropped, it takes the validation out of the
/// map once it is answered (the next validation of the token reads the cache, or asks
/// anew) or once no other request waits on it: a request whose client went away before
/// the answer must not leave its entry behind.
struct AskingTurn<'a> {
    asking: &'a Mutex<HashMap<[u8; 32], Arc<Asked>>>,
    key: [u8; 32],
    asked: Arc<Asked>,
}

impl Drop for AskingTurn<'_> {
    fn drop(&mut self) {
        if let Ok(mut asking) = self.asking.lock()
            && let Some(current) = asking.get(&self.key)
            && Arc::ptr_eq(current, &self.asked)
            // The map's and this turn's: nobody else waits.
            && (self.asked.initialized() || Arc::strong_count(&self.asked) <= 2)
        {
            asking.remove(&self.key);
        }
    }
}

struct CacheEntry {
    principal: Arc<Principal>,
    checked_at: DateTime<Utc>,
}

/// What the cache knows about a token.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Cached {
    /// Validated within the revalidation interval.
    Fresh(Arc<Principal>),
    /// Refused (`Invalid` or `NotProjectScoped`) within the revalidation interval.
    Refused(Verdict),
    /// Validated, but long enough ago that Keystone must be asked again.
    Stale,
    /// Past its expiry: refused without asking Keystone.
    Expired,
    Missing,
}

/// Validated tokens by the SHA-256 digest of the token (the token itself is not kept), and
/// refused ones apart.
pub(crate) struct TokenCache {
    entries: HashMap<[u8; 32], CacheEntry>,
    capacity: usize,
    /// Refused tokens: the refusal and when Keystone gave it.
    refused: HashMap<[u8; 32], (Verdict, DateTime<Utc>)>,
}

impl TokenCache {
    pub(crate) fn new(capacity: usize) -> Self {
        TokenCache {
            entries: HashMap::new(),
            capacity,
            refused: HashMap::new(),
        }
    }

    /// Remembers Keystone's refusal of a token (forgetting it as valid).
    pub(crate) fn refuse(&mut self, key: [u8; 32], verdict: Verdict, now: DateTime<Utc>) {
        self.entries.remove(&key);
        let capacity = self.capacity / 4;
        if capacity == 0 {
            return;
        }
        if !self.refused.contains_key(&key)
            && self.refused.len() >= capacity
            && let Some(oldest) = self
                .refused
                .iter()
                .min_by_key(|(_, (_, at))| *at)
                .map(|(k, _)| *k)
        {
            self.refused.remove(&oldest);
        }
        self.refused.insert(key, (verdict, now));
    }

    pub(crate) fn key(token: &str) -> [u8; 32] {
        Sha256::digest(token.as_bytes()).into()
    }

    pub(crate) fn lookup(
        &mut self,
        key: &[u8; 32],
        now: DateTime<Utc>,
        revalidate_after: chrono::Duration,
    ) -> Cached {
        if let Some((verdict, at)) = self.refused.get(key) {
            if now - *at < revalidate_after {
                return Cached::Refused(verdict.clone());
            }
            self.refused.remove(key);
        }
        let Some(entry) = self.entries.get(key) else {
            return Cached::Missing;
        };
        if entry.principal.expires_at <= now {
            self.entries.remove(key);
            return Cached::Expired;
        }
        if now - entry.checked_at >= revalidate_after {
            return Cached::Stale;
        }
        Cached::Fresh(entry.principal.clone())
    }

    pub(crate) fn insert(&mut self, key: [u8; 32], principal: Arc<Principal>, now: DateTime<Utc>) {
        if self.capacity == 0 {
            return;
        }
        if !self.entries.contains_key(&key) && self.entries.len() >= self.capacity {
            self.entries.retain(|_, e| e.principal.expires_at > now);
            if self.entries.len() >= self.capacity
                && let Some(oldest) = self
                    .entries
                    .iter()
                    .min_by_key(|(_, e)| e.checked_at)
                    .map(|(k, _)| *k)
            {
                self.entries.remove(&oldest);
            }
        }
        self.refused.remove(&key);
        self.entries.insert(
            key,
            CacheEntry {
                principal,
                checked_at: now,
            },
        );
    }

    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }
}

/// A user's token as the calendar's sign-in hands it to the page.
pub struct UserToken {
    pub token: String,
    pub expires_at: String,
    pub project_id: String,
    pub roles: Vec<String>,
}

struct ServiceToken {
    token: HeaderValue,
    expires_at: DateTime<Utc>,
}

/// A Keystone client that validates tokens and caches the answers.
pub struct Keystone {
    settings: KeystoneSettings,
    url: String,
    http: reqwest::Client,
    clock: Arc<dyn Clock>,
    service_token: tokio::sync::Mutex<Option<ServiceToken>>,
    cache: Mutex<TokenCache>,
    /// Validations under way, by token digest: requests for the same token wait for one
    /// answer instead of each asking Keystone.
    asking: Mutex<HashMap<[u8; 32], Arc<Asked>>>,
}

fn sensitive(value: &str) -> Result<HeaderValue, KeystoneError> {
    let mut header = HeaderValue::from_str(value)
        .map_err(|_| KeystoneError::Unavailable("a token is not a valid header value".into()))?;
    header.set_sensitive(true);
    Ok(header)
}

impl Keystone {
    pub fn new(settings: KeystoneSettings, clock: Arc<dyn Clock>) -> anyhow::Result<Keystone> {
        let http = reqwest::Client::builder()
            .timeout(settings.timeout)
            .connect_timeout(settings.timeout)
            .build()
            .map_err(|e| anyhow::anyhow!("cannot build the HTTP client for Keystone: {e}"))?;
        Ok(Keystone {
            url: v3_url(&settings.auth_url),
            cache: Mutex::new(TokenCache::new(settings.cache_size)),
            asking: Mutex::new(HashMap::new()),
            settings,
            http,
            clock,
            service_token: tokio::sync::Mutex::new(None),
        })
    }

    /// A client whose service credentials were tried at once: wrong credentials stop the
    /// start; an unreachable Keystone does not (it is asked again on the first request).
    pub async fn connect(
        settings: KeystoneSettings,
        clock: Arc<dyn Clock>,
    ) -> anyhow::Result<Keystone> {
        let keystone = Keystone::new(settings, clock)?;
        match keystone.check_service_credentials().await {
            Ok(()) => {
                tracing::info!(keystone.url = %keystone.url, "Keystone accepted the service credentials")
            }
            Err(e @ KeystoneError::Refused(_)) => anyhow::bail!("{e}"),
            Err(e) => {
                tracing::warn!(error = %e, "Keystone is not reachable now; tokens are validated once it is")
            }
        }
        Ok(keystone)
    }

    /// Keystone's base URL (without `/v3`), for `WWW-Authenticate`.
    pub fn public_uri(&self) -> &str {
        self.url.strip_suffix("/v3").unwrap_or(&self.url)
    }

    /// Logs in with the service's credentials now: tells at start whether they work.
    pub async fn check_service_credentials(&self) -> Result<(), KeystoneError> {
        let mut guard = self.service_token.lock().await;
        *guard = Some(self.login().await?);
        Ok(())
    }

    /// Asks Keystone for a token (`POST /auth/tokens`, without the catalog).
    async fn authenticate(&self, body: &Value) -> Result<reqwest::Response, KeystoneError> {
        self.http
            .post(format!("{}/auth/tokens?nocatalog", self.url))
            .json(body)
            .send()
            .await
            .map_err(|e| KeystoneError::Unavailable(format!("{}: {e}", self.url)))
    }

    async fn login(&self) -> Result<ServiceToken, KeystoneError> {
        let s = &self.settings;
        let body = json!({"auth": {
            "identity": {"methods": ["password"], "password": {"user": {
                "name": s.username,
                "domain": {"name": s.user_domain_name},
                "password": s.password.expose(),
            }}},
            "scope": {"project": {"name": s.project_name, "domain": {"name": s.project_domain_name}}},
        }});
        let response = self.authenticate(&body).await?;
        let status = response.status();
        if status == reqwest::StatusCode::UNAUTHORIZED {
            return Err(KeystoneError::Refused(format!(
                "user {} (domain {}) could not log in to project {} (domain {}): wrong \
                 username, password or project",
                s.username, s.user_domain_name, s.project_name, s.project_domain_name
            )));
        }
        if !status.is_success() {
            return Err(KeystoneError::Unavailable(format!(
                "logging in to {} answered {status}",
                self.url
            )));
        }
        let mut token = response
            .headers()
            .get("x-subject-token")
            .cloned()
            .ok_or_else(|| KeystoneError::Unavailable("no X-Subject-Token in the login".into()))?;
        token.set_sensitive(true);
        let body: TokenBody = response
            .json()
            .await
            .map_err(|e| KeystoneError::Unavailable(format!("unreadable login answer: {e}")))?;
        Ok(ServiceToken {
            token,
            expires_at: parse_time(&body.token.expires_at)?,
        })
    }

    /// A user's own project-scoped token from their password (the calendar's sign-in):
    /// `None` when Keystone refuses the credentials or the scope.
    pub async fn password_token(
        &self,
        username: &str,
        password: &str,
        project: &str,
        domain: &str,
    ) -> Result<Option<UserToken>, KeystoneError> {
        let body = json!({"auth": {
            "identity": {"methods": ["password"], "password": {"user": {
                "name": username, "domain": {"name": domain}, "password": password,
            }}},
            "scope": {"project": {"name": project, "domain": {"name": domain}}},
        }});
        let response = self.authenticate(&body).await?;
        let status = response.status();
        // 401 for wrong credentials; 400 and 404 for a scope that names nothing.
        if status == reqwest::StatusCode::UNAUTHORIZED
            || status == reqwest::StatusCode::BAD_REQUEST
            || status == reqwest::StatusCode::NOT_FOUND
        {
            return Ok(None);
        }
        if !status.is_success() {
            return Err(KeystoneError::Unavailable(format!(
                "a user's login to {} answered {status}",
                self.url
            )));
        }
        let token = response
            .headers()
            .get("x-subject-token")
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
            .ok_or_else(|| KeystoneError::Unavailable("no X-Subject-Token in the login".into()))?;
        let body: TokenBody = response
            .json()
            .await
            .map_err(|e| KeystoneError::Unavailable(format!("unreadable login answer: {e}")))?;
        let Some(principal) = principal_of(body.token)? else {
            return Ok(None);
        };
        Ok(Some(UserToken {
            token,
            expires_at: principal.expires_at.to_rfc3339(),
            project_id: principal.project_id,
            roles: principal.roles,
        }))
    }

    /// The service's own token, logging in again when it is missing, near its expiry, or
    /// (`renew`) refused.
    async fn service_token(&self, renew: bool) -> Result<HeaderValue, KeystoneError> {
        let mut guard = self.service_token.lock().await;
        let margin = chrono::Duration::seconds(SERVICE_TOKEN_MARGIN_SECONDS);
        let usable = guard
            .as_ref()
            .filter(|t| !renew && t.expires_at - margin > self.clock.now());
        if let Some(token) = usable {
            return Ok(token.token.clone());
        }
        let fresh = self.login().await?;
        let token = fresh.token.clone();
        *guard = Some(fresh);
        tracing::debug!("logged in to Keystone with the service credentials");
        Ok(token)
    }

    /// Asks Keystone about a token.
    async fn ask(&self, token: &str) -> Result<Verdict, KeystoneError> {
        let subject = sensitive(token)?;
        for attempt in 0..2 {
            let service = self.service_token(attempt > 0).await?;
            let response = self
                .http
                .get(format!("{}/auth/tokens?nocatalog", self.url))
                .header("x-auth-token", service)
                .header("x-subject-token", subject.clone())
                .send()
                .await
                .map_err(|e| KeystoneError::Unavailable(format!("{}: {e}", self.url)))?;
            match response.status() {
                s if s.is_success() => {
                    let body: TokenBody = response.json().await.map_err(|e| {
                        KeystoneError::Unavailable(format!("unreadable token validation: {e}"))
                    })?;
                    return Ok(match principal_of(body.token)? {
                        Some(p) if p.expires_at > self.clock.now() => Verdict::Valid(Arc::new(p)),
                        Some(_) => Verdict::Invalid,
                        None => Verdict::NotProjectScoped,
                    });
                }
                reqwest::StatusCode::NOT_FOUND => return Ok(Verdict::Invalid),
                // Our own token expired or was revoked: log in again, once.
                reqwest::StatusCode::UNAUTHORIZED if attempt == 0 => continue,
                reqwest::StatusCode::UNAUTHORIZED | reqwest::StatusCode::FORBIDDEN => {
                    return Err(KeystoneError::Refused(format!(
                        "user {} may not validate tokens (Keystone answered {}); give it the \
                         service role in project {}",
                        self.settings.username,
                        response.status(),
                        self.settings.project_name
                    )));
                }
                other => {
                    return Err(KeystoneError::Unavailable(format!(
                        "token validation answered {other}"
                    )));
                }
            }
        }
        Err(KeystoneError::Unavailable(
            "the service token was refused twice".into(),
        ))
    }

    /// Validates a user's token, from the cache when Keystone was asked recently enough.
    pub async fn validate(&self, token: &str) -> Result<Verdict, KeystoneError> {
        if token.is_empty() || token.len() > MAX_TOKEN_BYTES {
            return Ok(Verdict::Invalid);
        }
        let key = TokenCache::key(token);
        let now = self.clock.now();
        let cached = match self.cache.lock() {
            Ok(mut cache) => cache.lookup(&key, now, self.settings.revalidate_after),
            Err(_) => Cached::Missing,
        };
        match cached {
            Cached::Fresh(principal) => return Ok(Verdict::Valid(principal)),
            Cached::Refused(verdict) => return Ok(verdict),
            Cached::Expired => return Ok(Verdict::Invalid),
            Cached::Stale | Cached::Missing => {}
        }
        let asked = match self.asking.lock() {
            Ok(mut asking) => asking.entry(key).or_default().clone(),
            Err(_) => Arc::default(),
        };
        // However this request ends (answered, or dropped with its client), the entry goes
        // once nobody waits on it any more.
        let turn = AskingTurn {
            asking: &self.asking,
            key,
            asked,
        };
        turn.asked
            .get_or_init(|| async {
                let verdict = self.ask(token).await;
                if let (Ok(verdict), Ok(mut cache)) = (&verdict, self.cache.lock()) {
                    let now = self.clock.now();
                    match verdict {
                        Verdict::Valid(principal) => cache.insert(key, principal.clone(), now),
                        refused => cache.refuse(key, refused.clone(), now),
                    }
                }
                verdict
            })
            .await
            .clone()
    }

    /// How many tokens are cached.
    pub fn cached_tokens(&self) -> usize {
        self.cache.lock().map(|c| c.len()).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    fn at(minute: i64) -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2030, 1, 1, 0, 0, 0).unwrap() + chrono::Duration::minutes(minute)
    }

    fn principal(user: &str, expires_minute: i64) -> Arc<Principal> {
        Arc::new(Principal {
            user_id: user.into(),
            user_name: user.into(),
            user_domain_id: "default".into(),
            project_id: "p".into(),
            project_name: "p".into(),
            project_domain_id: "default".into(),
            roles: vec!["member".into()],
            expires_at: at(expires_minute),
        })
    }

    #[test]
    fn cache_entries_are_fresh_then_stale_then_expired() {
        let mut cache = TokenCache::new(10);
        let key = TokenCache::key("t1");
        let revalidate = chrono::Duration::minutes(1);
        assert_eq!(cache.lookup(&key, at(0), revalidate), Cached::Missing);
        cache.insert(key, principal("u", 10), at(0));
        assert!(
            matches!(cache.lookup(&key, at(0), revalidate), Cached::Fresh(p) if p.user_id == "u")
        );
        assert_eq!(cache.lookup(&key, at(1), revalidate), Cached::Stale);
        // Revalidated at minute 5: fresh again until minute 6.
        cache.insert(key, principal("u", 10), at(5));
        assert!(matches!(
            cache.lookup(&key, at(5), revalidate),
            Cached::Fresh(_)
        ));
        assert_eq!(cache.lookup(&key, at(10), revalidate), Cached::Expired);
        // An expired entry is dropped.
        assert_eq!(cache.len(), 0);
        assert_eq!(cache.lookup(&key, at(10), revalidate), Cached::Missing);
    }

    #[test]
    fn the_cache_is_bounded_and_evicts_expired_then_oldest() {
        let mut cache = TokenCache::new(3);
        let revalidate = chrono::Duration::minutes(100);
        cache.insert(TokenCache::key("a"), principal("a", 5), at(0));
        cache.insert(TokenCache::key("b"), principal("b", 50), at(1));
        cache.insert(TokenCache::key("c"), principal("c", 50), at(2));
        // At minute 6 "a" has expired: it goes, the others stay.
        cache.insert(TokenCache::key("d"), principal("d", 50), at(6));
        assert_eq!(cache.len(), 3);
        assert_eq!(
            cache.lookup(&TokenCache::key("a"), at(6), revalidate),
            Cached::Missing
        );
        // Nothing expired: the least recently validated ("b") goes.
        cache.insert(TokenCache::key("e"), principal("e", 50), at(7));
        assert_eq!(cache.len(), 3);
        assert_eq!(
            cache.lookup(&TokenCache::key("b"), at(7), revalidate),
            Cached::Missing
        );
        for kept in ["c", "d", "e"] {
            assert!(matches!(
                cache.lookup(&TokenCache::key(kept), at(7), revalidate),
                Cached::Fresh(_)
            ));
        }
        // Re-validating a cached token does not evict anything.
        cache.insert(TokenCache::key("c"), principal("c", 50), at(8));
        assert_eq!(cache.len(), 3);
        // A cache of size 0 keeps nothing.
        let mut none = TokenCache::new(0);
        none.insert(TokenCache::key("a"), principal("a", 5), at(0));
        assert_eq!(none.len(), 0);
    }

    #[test]
    fn refusals_are_remembered_apart_for_the_revalidation_interval() {
        let mut cache = TokenCache::new(8);
        let revalidate = chrono::Duration::minutes(1);
        let bad = TokenCache::key("bad");
        cache.refuse(bad, Verdict::Invalid, at(0));
        assert_eq!(
            cache.lookup(&bad, at(0), revalidate),
            Cached::Refused(Verdict::Invalid)
        );
        // Asked again after the interval.
        assert_eq!(cache.lookup(&bad, at(1), revalidate), Cached::Missing);
        // A valid token refused since (revoked) is refused; valid again replaces it.
        let good = TokenCache::key("good");
        cache.insert(good, principal("u", 50), at(2));
        cache.refuse(good, Verdict::NotProjectScoped, at(2));
        assert_eq!(
            cache.lookup(&good, at(2), revalidate),
            Cached::Refused(Verdict::NotProjectScoped)
        );
        cache.insert(good, principal("u", 50), at(3));
        assert!(matches!(
            cache.lookup(&good, at(3), revalidate),
            Cached::Fresh(_)
        ));
        // Refusals take a quarter of the room (2 of 8), oldest out first, and never push a
        // valid token out.
        for (i, t) in ["r1", "r2", "r3"].iter().enumerate() {
            cache.refuse(TokenCache::key(t), Verdict::Invalid, at(3 + i as i64));
        }
        assert_eq!(
            cache.lookup(
                &TokenCache::key("r1"),
                at(5),
                chrono::Duration::minutes(100)
            ),
            Cached::Missing
        );
        assert!(matches!(
            cache.lookup(&good, at(3), revalidate),
            Cached::Fresh(_)
        ));
    }

    #[test]
    fn a_shared_validation_leaves_the_map_once_answered_or_abandoned() {
        let asking: Mutex<HashMap<[u8; 32], Arc<Asked>>> = Mutex::new(HashMap::new());
        let key = TokenCache::key("t");
        let join = || {
            let asked = asking.lock().unwrap().entry(key).or_default().clone();
            AskingTurn {
                asking: &asking,
                key,
                asked,
            }
        };
        // Abandoned by its only request: gone.
        drop(join());
        assert!(asking.lock().unwrap().is_empty());
        // Abandoned by one of two: kept for the other, gone with it.
        let (first, second) = (join(), join());
        drop(first);
        assert_eq!(asking.lock().unwrap().len(), 1);
        drop(second);
        assert!(asking.lock().unwrap().is_empty());
        // Answered: gone with the first request that leaves, whoever still holds it.
        let (first, second) = (join(), join());
        first.asked.set(Ok(Verdict::Invalid)).unwrap();
        drop(first);
        assert!(asking.lock().unwrap().is_empty());
        assert!(matches!(second.asked.get(), Some(Ok(Verdict::Invalid))));
    }

    #[test]
    fn keystone_answers_are_read() {
        let body = r#"{"token": {"methods": ["password"], "user": {"domain": {"id": "default",
            "name": "Default"}, "id": "u1", "name": "alice", "password_expires_at": null},
            "audit_ids": ["x"], "expires_at": "2030-01-01T01:00:00.000000Z",
            "issued_at": "2030-01-01T00:00:00.000000Z", "project": {"domain": {"id": "d2",
            "name": "D2"}, "id": "p1", "name": "alpha"}, "is_domain": false,
            "roles": [{"id": "r1", "name": "member"}, {"id": "r2", "name": "reader"}]}}"#;
        let parsed: TokenBody = serde_json::from_str(body).unwrap();
        let p = principal_of(parsed.token).unwrap().unwrap();
        assert_eq!(p.user_id, "u1");
        assert_eq!(p.user_domain_id, "default");
        assert_eq!(p.project_id, "p1");
        assert_eq!(p.project_domain_id, "d2");
        assert_eq!(p.roles, vec!["member", "reader"]);
        assert_eq!(p.expires_at, at(60));
        let unscoped = r#"{"token": {"user": {"id": "u1", "name": "alice"},
            "expires_at": "2030-01-01T01:00:00Z"}}"#;
        let parsed: TokenBody = serde_json::from_str(unscoped).unwrap();
        assert_eq!(principal_of(parsed.token).unwrap(), None);
    }

    #[test]
    fn auth_urls_are_normalised() {
        for (given, expected) in [
            ("http://k:5000", "http://k:5000/v3"),
            ("http://k:5000/", "http://k:5000/v3"),
            ("http://k:5000/v3", "http://k:5000/v3"),
            ("http://k/identity/v3/", "http://k/identity/v3"),
        ] {
            assert_eq!(v3_url(given), expected);
        }
    }
}
