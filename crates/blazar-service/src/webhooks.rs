//! Webhooks: lease events POSTed to HTTP(S) endpoints that projects register.
//!
//! A delivery is written for every matching webhook in the transaction that writes the
//! notification, so what a subscriber receives is exactly what committed. Deliverers (any
//! replica) claim due deliveries in a short transaction, POST outside any transaction, and
//! record the outcome (up to 16 POSTs of a batch at once, so a slow endpoint delays the
//! others by one timeout at most, per batch): a 2xx answer delivers; anything else, or no answer within the
//! timeout, is tried again after a pause that doubles from `retry_base` up to `retry_max`,
//! until `max_attempts`, when the delivery is dead (kept, listed, and redeliverable). A
//! lease's later events wait behind its earlier pending one, so each webhook sees a lease's
//! events in order.
//!
//! Each delivery is signed: `X-Blazar-Signature: sha256=<hex HMAC-SHA256>` over
//! `<X-Blazar-Timestamp>.<body>` with the webhook's secret, so the receiver can check both
//! the sender and the age of the message (and refuse replays of old ones).

use std::collections::HashMap;
use std::net::IpAddr;
use std::time::Duration;

use async_trait::async_trait;
use blazar_core::{Webhook, WebhookDelivery};
use blazar_db::ClaimedDelivery;
use futures::{FutureExt, StreamExt};
use hmac::{Hmac, Mac};
use serde_json::json;
use sha2::Sha256;

use crate::tokens::{hex, random_hex};
use crate::{Identity, Service, ServiceError, ServiceResult};

/// How deliveries are tried.
#[derive(Debug, Clone)]
pub struct WebhookSettings {
    /// Attempts before a delivery is dead.
    pub max_attempts: u32,
    /// The pause after the first failed attempt; it doubles with each further one.
    pub retry_base: Duration,
    /// The longest pause between attempts.
    pub retry_max: Duration,
    /// Longest wait for an endpoint's answer; then the attempt failed.
    pub timeout: Duration,
    /// Whether webhooks may reach internal addresses (loopback, private, link-local, ...;
    /// see [`is_internal_address`]). Without it a project could make the server POST to
    /// the services beside it, or to a cloud's metadata address, and read the answer's
    /// status from the delivery list.
    pub allow_internal: bool,
}

impl Default for WebhookSettings {
    fn default() -> Self {
        WebhookSettings {
            max_attempts: 8,
            retry_base: Duration::from_secs(30),
            retry_max: Duration::from_secs(3_600),
            timeout: Duration::from_secs(10),
            allow_internal: false,
        }
    }
}

/// Addresses a webhook may not reach unless internal destinations are allowed: this host
/// (loopback, unspecified), private and shared networks (RFC 1918, RFC 6598, IPv6 unique
/// local), link-local (where clouds serve instance metadata), multicast and broadcast, and
/// IPv6 forms that carry such an IPv4 address.
pub fn is_internal_address(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => {
            let [a, b, c, _] = v4.octets();
            v4.is_loopback()
                || v4.is_private()
                || v4.is_link_local()
                || v4.is_unspecified()
                || v4.is_broadcast()
                || v4.is_multicast()
                || a == 0
                || (a == 100 && (64..128).contains(&b))
                // The other special-purpose blocks that are not global (RFC 6890): protocol
                // assignments, benchmarking, documentation, and the reserved 240/4.
                || (a, b, c) == (192, 0, 0)
                || (a == 198 && (18..20).contains(&b))
                || matches!((a, b, c), (192, 0, 2) | (198, 51, 100) | (203, 0, 113))
                || a >= 240
        }
        IpAddr::V6(v6) => {
            if let Some(v4) = v6.to_ipv4_mapped() {
                return is_internal_address(IpAddr::V4(v4));
            }
            let s = v6.segments();
            v6.is_loopback()
                || v6.is_unspecified()
                || v6.is_multicast()
                || v6.is_unique_local()
                || v6.is_unicast_link_local()
                // IPv4-compatible (`::a.b.c.d`, deprecated but still parsed and routed by
                // some stacks), NAT64 and 6to4 embed an IPv4 address that can be internal.
                || s[..6] == [0; 6]
                || s[0] == 0x0064
                || s[0] == 0x2002
                // Discard-only (RFC 6666), IETF protocol assignments such as Teredo, which
                // embeds an IPv4 address too (RFC 6890), and documentation.
                || s[..4] == [0x0100, 0, 0, 0]
                || (s[0] == 0x2001 && s[1] < 0x0200)
                || (s[0] == 0x2001 && s[1] == 0x0db8)
        }
    }
}

/// Why a webhook may not be sent to `host` (a name or an address literal), if it may not.
pub fn internal_destination(host: &url::Host<&str>) -> Option<String> {
    let why = |what: &str| {
        Some(format!(
            "{what} is an internal address, which webhooks may not reach on this server"
        ))
    };
    match host {
        url::Host::Ipv4(ip) if is_internal_address(IpAddr::V4(*ip)) => why(&ip.to_string()),
        url::Host::Ipv6(ip) if is_internal_address(IpAddr::V6(*ip)) => why(&ip.to_string()),
        url::Host::Domain(name) => {
            let name = name.trim_end_matches('.').to_ascii_lowercase();
            if name == "localhost" || name.ends_with(".localhost") {
                why(&name)
            } else {
                None
            }
        }
        _ => None,
    }
}

/// One POST of a delivery.
#[derive(Debug, Clone)]
pub struct WebhookRequest {
    pub url: String,
    pub headers: Vec<(String, String)>,
    pub body: String,
    pub timeout: Duration,
}

/// Sends webhook deliveries: the HTTP status the endpoint answered, or why there was none.
#[async_trait]
pub trait WebhookSender: Send + Sync {
    async fn post(&self, request: &WebhookRequest) -> Result<u16, String>;
}

/// A webhook to register.
#[derive(Debug, Clone, Default)]
pub struct NewWebhook {
    pub url: String,
    /// Empty: every event type.
    pub event_types: Vec<String>,
    /// Another project's (admins only).
    pub project_id: Option<String>,
    /// Every project's events (admins only).
    pub all_projects: bool,
    pub description: String,
}

/// What one run of the deliverer did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct DeliveryReport {
    pub delivered: usize,
    pub retried: usize,
    pub dead: usize,
}

/// Deliveries in flight at once in one deliverer.
pub const CONCURRENT_POSTS: usize = 16;
/// Deliveries of one project's webhooks in flight at once in one deliverer: a project at its
/// share gets no more until one of them ends.
const PROJECT_SHARE: usize = 6;
/// Deliveries of one webhook in flight at once in one deliverer: less than its project's
/// share, so that an endpoint that hangs leaves the project's others room (it
/// took every slot of its project, and the project's healthy endpoints waited a minute).
const WEBHOOK_SHARE: usize = 4;
/// Deliveries in flight at once to endpoints that gave no answer in time at their latest
/// attempt, whatever their projects: each such endpoint is tried one delivery at a time, but
/// sixteen of them, of three projects, held every slot for a whole timeout.
const SILENT_SHARE: usize = CONCURRENT_POSTS / 2;
/// How long past its timeout a POST may take before its attempt is given up.
const ATTEMPT_GRACE: Duration = Duration::from_secs(1);
/// What a claim allows past its POST: the write of the attempt's outcome.
const CLAIM_MARGIN: Duration = Duration::from_secs(30);

/// Whose delivery an attempt is: its webhook's project (`None`: an every-project webhook),
/// the webhook, and whether its endpoint was silent when it was claimed.
type From = (Option<String>, String, bool);

/// Deliveries in flight, per project and per webhook, and those to silent endpoints.
#[derive(Default, Clone)]
struct InFlight {
    by_project: HashMap<Option<String>, usize>,
    by_webhook: HashMap<String, usize>,
    silent: usize,
}

impl InFlight {
    fn started(&mut self, (project, webhook, silent): &From) {
        *self.by_project.entry(project.clone()).or_default() += 1;
        *self.by_webhook.entry(webhook.clone()).or_default() += 1;
        self.silent += usize::from(*silent);
    }

    fn ended(&mut self, (project, webhook, silent): &From) {
        if let Some(n) = self.by_project.get_mut(project) {
            *n = n.saturating_sub(1);
        }
        if let Some(n) = self.by_webhook.get_mut(webhook) {
            *n = n.saturating_sub(1);
        }
        if *silent {
            self.silent = self.silent.saturating_sub(1);
        }
    }

    /// Whether one more delivery of `webhook` (of `project`; `silent`, its endpoint) keeps
    /// all within their shares; counted as started if so.
    fn admit(&mut self, project: Option<&str>, webhook: &str, silent: bool) -> bool {
        let project = project.map(String::from);
        let of_project = self.by_project.get(&project).copied().unwrap_or(0);
        let of_webhook = self.by_webhook.get(webhook).copied().unwrap_or(0);
        if of_project >= PROJECT_SHARE
            || of_webhook >= WEBHOOK_SHARE
            || (silent && self.silent_at_share())
        {
            return false;
        }
        self.started(&(project, webhook.to_string(), silent));
        true
    }

    /// Whether the deliveries to silent endpoints have their share in flight.
    fn silent_at_share(&self) -> bool {
        self.silent >= SILENT_SHARE
    }

    /// How many projects and webhooks have their share in flight, and whether the silent
    /// endpoints have theirs.
    fn full_count(&self) -> usize {
        at_share(&self.by_project, PROJECT_SHARE).count()
            + at_share(&self.by_webhook, WEBHOOK_SHARE).count()
            + usize::from(self.silent_at_share())
    }

    /// The projects and the webhooks that have their share in flight, and whether the
    /// silent endpoints have theirs.
    fn full(&self) -> (Vec<Option<String>>, Vec<String>, bool) {
        (
            at_share(&self.by_project, PROJECT_SHARE).cloned().collect(),
            at_share(&self.by_webhook, WEBHOOK_SHARE).cloned().collect(),
            self.silent_at_share(),
        )
    }
}

/// The keys of `counts` at `share` or over.
fn at_share<K>(counts: &HashMap<K, usize>, share: usize) -> impl Iterator<Item = &K> {
    counts
        .iter()
        .filter(move |(_, n)| **n >= share)
        .map(|(k, _)| k)
}

impl DeliveryReport {
    /// Counts an attempt of a delivery of `project`'s that ended, and that it is no longer
    /// in flight.
    fn ended(&mut self, flying: &mut InFlight, (from, outcome): (From, ServiceResult<Outcome>)) {
        flying.ended(&from);
        self.count(outcome);
    }

    /// Counts one attempt's outcome. An attempt whose outcome could not be written is left
    /// to its claim running out: it is tried again then.
    fn count(&mut self, outcome: ServiceResult<Outcome>) {
        match outcome {
            Ok(Outcome::Delivered) => self.delivered += 1,
            Ok(Outcome::Retried) => self.retried += 1,
            Ok(Outcome::Dead) => self.dead += 1,
            Err(e) => tracing::error!(error = %e, "could not record a webhook delivery's attempt"),
        }
    }
}

/// How one attempt ended.
enum Outcome {
    Delivered,
    Retried,
    Dead,
}
/// Deliveries listed at most.
pub const DELIVERIES_LISTED: usize = 1_000;
const SECRET_BYTES: usize = 32;
/// Webhooks a project may have (each event is written once per webhook that takes it).
pub const MAX_WEBHOOKS_PER_PROJECT: i64 = 25;
/// How long a delivered delivery stays listed.
const KEEP_DELIVERED_DAYS: i64 = 7;
const MAX_URL: usize = 2_048;
const MAX_EVENT_TYPES: usize = 64;

/// `sha256=<hex>`: the HMAC-SHA256 of `<timestamp>.<body>` keyed with `secret`.
pub fn webhook_signature(secret: &str, timestamp: i64, body: &str) -> String {
    // HMAC accepts keys of any length, so this cannot fail.
    let mut mac = match Hmac::<Sha256>::new_from_slice(secret.as_bytes()) {
        Ok(mac) => mac,
        Err(_) => return String::new(),
    };
    mac.update(timestamp.to_string().as_bytes());
    mac.update(b".");
    mac.update(body.as_bytes());
    format!("sha256={}", hex(&mac.finalize().into_bytes()))
}

/// The pause before attempt `attempts + 1`, after `attempts` failed ones.
fn backoff(settings: &WebhookSettings, attempts: u32) -> Duration {
    let factor = 2u32.saturating_pow(attempts.saturating_sub(1));
    settings
        .retry_base
        .saturating_mul(factor)
        .min(settings.retry_max)
}

fn check_url(url: &str, allow_internal: bool) -> ServiceResult<String> {
    let url = url.trim();
    // A refusal quotes the start of the URL only: the whole of a huge one says nothing more.
    let quoted: String = url.chars().take(100).collect();
    let more = if quoted.len() < url.len() { "..." } else { "" };
    let bad = |why: &str| {
        ServiceError::BadRequest(format!("Invalid webhook url {quoted:?}{more}: {why}"))
    };
    if url.len() > MAX_URL {
        return Err(bad("longer than 2048 characters"));
    }
    // URL parsing drops some of them (a tab, a trailing NUL): refused, so that what is
    // registered is what was given.
    if url.chars().any(char::is_control) {
        return Err(bad("control characters are not allowed"));
    }
    let parsed = url::Url::parse(url).map_err(|e| bad(&e.to_string()))?;
    if !matches!(parsed.scheme(), "http" | "https") {
        return Err(bad("give an http or https URL"));
    }
    let Some(host) = parsed
        .host()
        .filter(|h| !matches!(h, url::Host::Domain("")))
    else {
        return Err(bad("it names no host"));
    };
    // Names are resolved and checked again at each delivery.
    if !allow_internal && let Some(why) = internal_destination(&host) {
        return Err(bad(&why));
    }
    if !parsed.username().is_empty() || parsed.password().is_some() {
        return Err(bad(
            "credentials do not belong in the URL; deliveries are signed",
        ));
    }
    Ok(parsed.to_string())
}

fn check_event_types(types: Vec<String>) -> ServiceResult<Vec<String>> {
    if types.len() > MAX_EVENT_TYPES {
        return Err(ServiceError::BadRequest(format!(
            "At most {MAX_EVENT_TYPES} event types"
        )));
    }
    let mut out: Vec<String> = Vec::with_capacity(types.len());
    for t in types {
        let t = t.trim().to_string();
        // A type no notification has would make a webhook that never hears anything.
        if !crate::notifications::EVENT_TYPES.contains(&t.as_str()) {
            return Err(ServiceError::BadRequest(format!(
                "Unknown event type {t:?}: known types are {}",
                crate::notifications::EVENT_TYPES.join(", ")
            )));
        }
        if !out.contains(&t) {
            out.push(t);
        }
    }
    out.sort();
    Ok(out)
}

impl Service {
    pub fn with_webhook_settings(mut self, settings: WebhookSettings) -> Self {
        self.webhooks = std::sync::Arc::new(settings);
        self
    }

    pub(crate) fn wake_webhooks(&self) {
        self.webhook_wake.notify_one();
    }

    /// Registers a webhook of the caller's project, or (admins) of another project or of
    /// every project. The answer carries the secret; it is never shown again.
    pub async fn create_webhook(
        &self,
        identity: &Identity,
        new: NewWebhook,
    ) -> ServiceResult<Webhook> {
        // A write: the rule of lease creates (members and admins; not readers).
        self.authorize_own("blazar:leases:post", identity)?;
        let admin = self.is_admin(identity);
        let project_id = match (
            new.all_projects,
            new.project_id.map(|p| p.trim().to_string()),
        ) {
            (true, Some(_)) => {
                return Err(ServiceError::BadRequest(
                    "give project_id or all_projects, not both".into(),
                ));
            }
            (true, None) if !admin => {
                return Err(ServiceError::Forbidden(
                    "only an admin may receive every project's events".into(),
                ));
            }
            (true, None) => None,
            (false, Some(p)) if p.is_empty() => {
                return Err(ServiceError::BadRequest(
                    "project_id must not be empty".into(),
                ));
            }
            (false, Some(p)) if p != identity.project_id && !admin => {
                return Err(ServiceError::Forbidden(
                    "only an admin may register a webhook of another project".into(),
                ));
            }
            (false, Some(p)) => {
                crate::check_project_id(&p)?;
                Some(p)
            }
            (false, None) => Some(identity.project_id.clone()),
        };
        if new.description.chars().count() > 255 {
            return Err(ServiceError::BadRequest(
                "description must be at most 255 characters".into(),
            ));
        }
        crate::check_text("description", &new.description, true)?;
        let webhook = Webhook {
            id: crate::new_id(),
            project_id,
            url: check_url(&new.url, self.webhooks.allow_internal)?,
            secret: random_hex(SECRET_BYTES)?,
            event_types: check_event_types(new.event_types)?,
            description: new.description,
            created_by: Some(identity.user_id.clone()).filter(|u| !u.is_empty()),
            created_at: self.now(),
        };
        in_tx!(self, write, |tx| {
            tx.lock_project_webhooks(webhook.project_id.as_deref())
                .await?;
            if tx.count_webhooks(webhook.project_id.as_deref()).await? >= MAX_WEBHOOKS_PER_PROJECT {
                return Err(ServiceError::BadRequest(format!(
                    "A project has at most {MAX_WEBHOOKS_PER_PROJECT} webhooks; delete one first"
                )));
            }
            tx.insert_webhook(&webhook).await?;
            Ok(())
        })?;
        tracing::info!(
            webhook.id = %webhook.id,
            project.id = webhook.project_id.as_deref().unwrap_or("*"),
            "webhook registered"
        );
        Ok(webhook)
    }

    /// A webhook the caller may see: its project's, or any for an admin.
    async fn visible_webhook(&self, identity: &Identity, id: &str) -> ServiceResult<Webhook> {
        self.authorize_own("blazar:leases:get", identity)?;
        let admin = self.is_admin(identity);
        let found = in_tx!(self, read, |tx| { Ok(tx.webhook(id).await?) })?;
        match found {
            Some(w) if admin || w.project_id.as_deref() == Some(identity.project_id.as_str()) => {
                Ok(w)
            }
            _ => Err(webhook_not_found(id)),
        }
    }

    pub async fn get_webhook(&self, identity: &Identity, id: &str) -> ServiceResult<Webhook> {
        self.visible_webhook(identity, id).await
    }

    /// The caller's project's webhooks (every webhook for an admin).
    pub async fn list_webhooks(&self, identity: &Identity) -> ServiceResult<Vec<Webhook>> {
        self.authorize_own("blazar:leases:get", identity)?;
        let project = (!self.is_admin(identity)).then_some(identity.project_id.as_str());
        in_tx!(self, read, |tx| { Ok(tx.list_webhooks(project).await?) })
    }

    /// Removes a webhook and its deliveries, sent or not.
    pub async fn delete_webhook(&self, identity: &Identity, id: &str) -> ServiceResult<()> {
        let webhook = self.visible_webhook(identity, id).await?;
        self.authorize_own("blazar:leases:post", identity)?;
        let deleted = in_tx!(self, write, |tx| { Ok(tx.delete_webhook(id).await?) })?;
        if !deleted {
            // A concurrent delete got there first: one of them says it deleted it.
            return Err(webhook_not_found(&webhook.id));
        }
        tracing::info!(webhook.id = %id, "webhook deleted");
        Ok(())
    }

    /// A webhook's latest deliveries (of one status if given).
    /// A webhook's deliveries, newest first: `limit` of them (at most and by default
    /// [`DELIVERIES_LISTED`]), after delivery `marker` (the last of the page before).
    pub async fn webhook_deliveries(
        &self,
        identity: &Identity,
        id: &str,
        status: Option<&str>,
        limit: Option<usize>,
        marker: Option<&str>,
    ) -> ServiceResult<Vec<WebhookDelivery>> {
        if let Some(s) = status
            && !matches!(s, "pending" | "delivered" | "dead")
        {
            return Err(ServiceError::BadRequest(format!(
                "Invalid status {s:?}: pending, delivered or dead"
            )));
        }
        self.visible_webhook(identity, id).await?;
        let now = self.now();
        let limit = limit.unwrap_or(DELIVERIES_LISTED).min(DELIVERIES_LISTED);
        in_tx!(self, read, |tx| {
            let before_seq = match marker {
                None => None,
                Some(m) => Some(tx.webhook_delivery_seq(id, m).await?.ok_or_else(|| {
                    ServiceError::BadRequest(format!(
                        "Marker {m} is not a delivery of this webhook"
                    ))
                })?),
            };
            Ok(tx
                .webhook_deliveries(id, status, before_seq, limit, now)
                .await?)
        })
    }

    /// Offers a delivery again now, its attempts counted afresh (a dead letter, once the
    /// endpoint is back).
    pub async fn redeliver_webhook(
        &self,
        identity: &Identity,
        id: &str,
        notification_id: &str,
    ) -> ServiceResult<()> {
        self.visible_webhook(identity, id).await?;
        self.authorize_own("blazar:leases:post", identity)?;
        let now = self.now();
        let offered = in_tx!(self, write, |tx| {
            // Under the claims' lock: a claim that read the delivery's attempts before the
            // reset would otherwise judge it by the old count.
            tx.lock_webhook_claims().await?;
            Ok(tx.redeliver_webhook(id, notification_id, now).await?)
        })?;
        match offered {
            None => {
                return Err(ServiceError::NotFound(format!(
                    "Delivery {notification_id} of webhook {id} not found"
                )));
            }
            Some(false) => {
                return Err(ServiceError::Conflict(format!(
                    "Delivery {notification_id} of webhook {id} is being made right now; \
                     ask again once it has been tried"
                )));
            }
            Some(true) => {}
        }
        self.wake_webhooks();
        Ok(())
    }

    /// Delivers every due delivery this process may claim, through `sender`, until none is
    /// left to claim and none is in flight.
    ///
    /// Up to [`CONCURRENT_POSTS`] go out side by side, and a slot that frees is filled at
    /// once (as is one a commit's wake finds free): a slow or dead endpoint holds up only
    /// its own deliveries, never a batch of others'. Only what is sent at once is claimed,
    /// for one POST and the write of its outcome, so the deliveries of a process that stops
    /// mid-attempt are taken over within that.
    pub async fn deliver_webhooks(
        &self,
        sender: &dyn WebhookSender,
    ) -> ServiceResult<DeliveryReport> {
        let settings = self.webhooks.clone();
        let mut report = DeliveryReport::default();
        self.purge_old_deliveries().await?;
        let claim_for = chrono::Duration::from_std(settings.timeout + ATTEMPT_GRACE + CLAIM_MARGIN)
            .unwrap_or_else(|_| chrono::Duration::hours(1));
        let mut in_flight = futures::stream::FuturesUnordered::new();
        let mut flying = InFlight::default();
        loop {
            let mut free = CONCURRENT_POSTS.saturating_sub(in_flight.len());
            // A few at a time, leaving out the projects and the webhooks that have their
            // share in flight: a project whose endpoints hang holds at most its share of the
            // slots, and an endpoint that hangs at most its own share of its project's.
            while free > 0 {
                let limit = free.min(WEBHOOK_SHARE);
                let full_before = flying.full_count();
                // What is in flight as the claim begins: attempts that end while it waits
                // only leave more room than it counts.
                let claim = self.claim_deliveries(claim_for, limit, flying.clone());
                tokio::pin!(claim);
                // The attempts in flight are driven while the claim waits for its write: one
                // may hold the database's write lock (SQLite) to record its outcome.
                let mut ended_meanwhile = false;
                let claimed = loop {
                    tokio::select! {
                        claimed = &mut claim => break claimed?,
                        Some(outcome) = in_flight.next() => {
                            report.ended(&mut flying, outcome);
                            ended_meanwhile = true;
                        }
                    }
                };
                let got = claimed.len();
                // The claim leaves a lease's later deliveries to a webhook behind its earlier
                // one while that is pending, in flight included: order holds per lease.
                for d in claimed {
                    let from: From = (d.project_id.clone(), d.webhook_id.clone(), d.silent);
                    flying.started(&from);
                    let attempt = self.attempt_delivery(sender, d, &settings);
                    in_flight.push(async move { (from, attempt.await) });
                }
                free = CONCURRENT_POSTS.saturating_sub(in_flight.len());
                // Claimed all there was, unless attempts ended during the claim (it left out
                // their projects, which may have room now) or it filled a project or a
                // webhook (the candidates it turned down for that may have hidden others'
                // due deliveries, which the next claim reaches).
                if got < limit && !ended_meanwhile && flying.full_count() == full_before {
                    break;
                }
            }
            if in_flight.is_empty() {
                return Ok(report);
            }
            tokio::select! {
                Some(outcome) = in_flight.next() => {
                    report.ended(&mut flying, outcome);
                    // Others that ended meanwhile are counted before claiming again.
                    while let Some(Some(outcome)) = in_flight.next().now_or_never() {
                        report.ended(&mut flying, outcome);
                    }
                }
                // A commit wrote deliveries: claim them if a slot is free.
                () = self.webhook_wake.notified() => {}
            }
        }
    }

    /// Claims up to `limit` due deliveries for this process, for `claim_for`, keeping each
    /// project and webhook within its share with those `flying` already.
    async fn claim_deliveries(
        &self,
        claim_for: chrono::Duration,
        limit: usize,
        flying: InFlight,
    ) -> ServiceResult<Vec<ClaimedDelivery>> {
        let now = self.now();
        // Those at their share are left out by the query; the others' room is counted
        // candidate by candidate.
        let (full_projects, full_webhooks, silent_full) = flying.full();
        in_tx!(self, write, |tx| {
            tx.lock_webhook_claims().await?;
            // Afresh on each try of the transaction: a retried one claimed nothing.
            let mut room = flying.clone();
            Ok(tx
                .claim_webhook_deliveries(
                    now,
                    &self.worker_id,
                    claim_for,
                    limit,
                    &full_projects,
                    &full_webhooks,
                    silent_full,
                    |project, webhook, silent| room.admit(project, webhook, silent),
                )
                .await?)
        })
    }

    /// Forgets deliveries that succeeded long ago, once an hour.
    async fn purge_old_deliveries(&self) -> ServiceResult<()> {
        let now = self.now();
        let last = self
            .webhooks_purged
            .load(std::sync::atomic::Ordering::Relaxed);
        if now.timestamp().saturating_sub(last) < 3_600 {
            return Ok(());
        }
        self.webhooks_purged
            .store(now.timestamp(), std::sync::atomic::Ordering::Relaxed);
        let horizon = now - chrono::Duration::days(KEEP_DELIVERED_DAYS);
        in_tx!(self, write, |tx| {
            tx.purge_webhook_deliveries(horizon).await?;
            Ok(())
        })
    }

    /// One attempt of a claimed delivery, its outcome recorded.
    async fn attempt_delivery(
        &self,
        sender: &dyn WebhookSender,
        d: ClaimedDelivery,
        settings: &WebhookSettings,
    ) -> ServiceResult<Outcome> {
        let body = json!({
            "id": d.notification_id,
            "event_type": d.event_type,
            "lease_id": d.lease_id,
            "created_at": d.created_at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
            "payload": d.payload,
        })
        .to_string();
        let timestamp = self.now().timestamp();
        let mut headers = vec![
            ("Content-Type".into(), "application/json".into()),
            ("X-Blazar-Event".into(), d.event_type.clone()),
            ("X-Blazar-Delivery".into(), d.notification_id.clone()),
            ("X-Blazar-Webhook".into(), d.webhook_id.clone()),
            ("X-Blazar-Timestamp".into(), timestamp.to_string()),
            (
                "X-Blazar-Signature".into(),
                webhook_signature(&d.secret, timestamp, &body),
            ),
        ];
        // The API call that caused the event, so the receiver's logs match ours.
        if let Some(id) = &d.request_id {
            headers.push(("X-OpenStack-Request-Id".into(), id.clone()));
        }
        let request = WebhookRequest {
            url: d.url.clone(),
            headers,
            body,
            timeout: settings.timeout,
        };
        let before = u32::try_from(d.attempts).unwrap_or(u32::MAX);
        // Every attempt allowed was made already: by workers that never reported back (each
        // died while sending it; this one is not made, or such a delivery would be sent for
        // ever), or before the allowed attempts were lowered.
        let spent = before >= settings.max_attempts;
        let attempts = if spent { before } else { before + 1 };
        let result = if spent {
            Err(if d.unreported && before == settings.max_attempts {
                format!("gave up after {before} attempts: the last did not report back")
            } else {
                // The allowed attempts were lowered (a restart with a smaller
                // `--webhook-max-attempts`): what the last attempt got is kept in the reason.
                format!(
                    "gave up after {before} attempts, the {} now allowed; the last: {}",
                    settings.max_attempts,
                    d.last_result.as_deref().unwrap_or("no answer recorded")
                )
            })
        } else {
            match tokio::time::timeout(settings.timeout + ATTEMPT_GRACE, sender.post(&request))
                .await
            {
                Ok(result) => result,
                Err(_) => Err(blazar_core::WEBHOOK_NO_ANSWER.into()),
            }
        };
        let now = self.now();
        let (outcome, status, text, next) = match result {
            Ok(code) if (200..300).contains(&code) => {
                (Outcome::Delivered, "delivered", code.to_string(), now)
            }
            other => {
                let text = match other {
                    Ok(code) => code.to_string(),
                    Err(e) => e,
                };
                if attempts >= settings.max_attempts {
                    tracing::warn!(
                        webhook.id = %d.webhook_id,
                        delivery = %d.notification_id,
                        attempts,
                        result = %text,
                        "webhook delivery is dead"
                    );
                    (Outcome::Dead, "dead", text, now)
                } else {
                    let pause = chrono::Duration::from_std(backoff(settings, attempts))
                        .unwrap_or_else(|_| chrono::Duration::hours(1));
                    (Outcome::Retried, "pending", text, now + pause)
                }
            }
        };
        in_tx!(self, write, |tx| {
            tx.record_webhook_attempt(
                &d.webhook_id,
                &d.notification_id,
                &self.worker_id,
                now,
                status,
                !spent,
                &text,
                next,
            )
            .await?;
            Ok(())
        })?;
        Ok(outcome)
    }

    /// Delivers webhooks through `sender` until `shutdown`: when a commit may have written
    /// deliveries, and at least every `poll` (retries coming due, other replicas' work,
    /// expired claims).
    pub async fn run_webhook_deliverer(
        &self,
        sender: &dyn WebhookSender,
        poll: Duration,
        shutdown: impl Future<Output = ()>,
    ) {
        tokio::pin!(shutdown);
        loop {
            // A backlog keeps a run going; shutting down ends it where it is.
            tokio::select! {
                done = self.deliver_webhooks(sender) => {
                    if let Err(e) = done {
                        tracing::error!(error = %e, "could not deliver webhooks");
                    }
                }
                _ = &mut shutdown => break,
            }
            tokio::select! {
                _ = self.webhook_wake.notified() => {}
                _ = tokio::time::sleep(poll) => {}
                _ = &mut shutdown => break,
            }
        }
        // What was in flight is given back uncounted, for another process to send at once.
        // Bounded: a database that cannot answer leaves the claims to run out instead.
        let release = async {
            in_tx!(self, write, |tx| {
                Ok(tx.release_webhook_claims(&self.worker_id).await?)
            })
        };
        match tokio::time::timeout(RELEASE_WAIT, release).await {
            Ok(Ok(0)) => {}
            Ok(Ok(n)) => tracing::info!(deliveries = n, "webhook deliveries in flight given back"),
            Ok(Err(e)) => tracing::warn!(error = %e, "webhook deliveries in flight not given back"),
            Err(_) => tracing::warn!("webhook deliveries in flight not given back in time"),
        }
    }

    /// Pending and dead deliveries, for monitoring.
    pub async fn webhook_backlog(&self) -> ServiceResult<blazar_db::DeliveryCounts> {
        in_tx!(self, read, |tx| { Ok(tx.webhook_delivery_counts().await?) })
    }
}

/// Longest a shutting-down deliverer waits to give its deliveries back.
const RELEASE_WAIT: Duration = Duration::from_secs(5);

fn webhook_not_found(id: &str) -> ServiceError {
    ServiceError::NotFound(format!("Webhook {id} not found"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_signature_covers_the_timestamp_and_the_body() {
        let a = webhook_signature("key", 1_700_000_000, "{}");
        assert!(a.starts_with("sha256=") && a.len() == 7 + 64, "{a}");
        assert_ne!(a, webhook_signature("key", 1_700_000_001, "{}"));
        assert_ne!(a, webhook_signature("key", 1_700_000_000, "{ }"));
        assert_ne!(a, webhook_signature("other", 1_700_000_000, "{}"));
        // RFC 4231 test case 2, as a check of the construction.
        let mut mac = Hmac::<Sha256>::new_from_slice(b"Jefe").unwrap();
        mac.update(b"what do ya want for nothing?");
        assert_eq!(
            hex(&mac.finalize().into_bytes()),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }

    #[test]
    fn pauses_double_up_to_the_cap() {
        let s = WebhookSettings {
            retry_base: Duration::from_secs(30),
            retry_max: Duration::from_secs(300),
            ..WebhookSettings::default()
        };
        let pauses: Vec<u64> = (1..=6).map(|n| backoff(&s, n).as_secs()).collect();
        assert_eq!(pauses, [30, 60, 120, 240, 300, 300]);
    }

    #[test]
    fn internal_addresses_are_told_apart_from_public_ones() {
        for internal in [
            "127.0.0.1",
            "127.1.2.3",
            "10.1.2.3",
            "172.16.0.1",
            "172.31.255.255",
            "192.168.1.1",
            "169.254.169.254",
            "100.64.0.1",
            "100.127.255.255",
            "0.0.0.0",
            "0.1.2.3",
            "255.255.255.255",
            "224.0.0.1",
            "192.0.0.1",
            "198.18.0.1",
            "198.19.255.254",
            "192.0.2.10",
            "203.0.113.5",
            "240.0.0.1",
            "::1",
            "::",
            "fe80::1",
            "fc00::1",
            "fd12:3456::1",
            "ff02::1",
            "::ffff:10.0.0.1",
            "64:ff9b::a00:1",
            "2002:a00:1::",
            "::127.0.0.1",
            "::10.0.0.1",
            "100::1",
            "2001:0:4136:e378:8000:63bf:3fff:fdd2",
            "2001:db8::1",
        ] {
            let ip: IpAddr = internal.parse().unwrap();
            assert!(is_internal_address(ip), "{internal}");
        }
        for public in [
            "93.184.215.14",
            "8.8.8.8",
            "172.32.0.1",
            "100.128.0.1",
            "192.169.0.1",
            "192.0.1.1",
            "198.17.255.255",
            "198.20.0.1",
            "223.255.255.1",
            "2606:4700::1111",
            "::ffff:8.8.8.8",
            "2001:4860:4860::8888",
            "2a00:1450:4001::1",
        ] {
            let ip: IpAddr = public.parse().unwrap();
            assert!(!is_internal_address(ip), "{public}");
        }
    }

    #[test]
    fn urls_and_event_types_are_checked() {
        assert!(check_url("https://hooks.example.org/blazar", false).is_ok());
        assert!(check_url("http://93.184.215.14:8080/x", false).is_ok());
        assert!(check_url("http://127.0.0.1:8080/x", true).is_ok());
        for bad in [
            "ftp://x/y",
            "not a url",
            "https://user:pw@example.org/",
            "mailto:a@b",
            // Dropped by URL parsing, which would register another URL than the one given.
            "http://x/\0",
            "http://x/a\tb",
            "http://x/a\r\nX-Injected: 1",
        ] {
            assert!(check_url(bad, true).is_err(), "{bad}");
        }
        for internal in [
            "http://127.0.0.1:8080/x",
            "http://localhost/x",
            "http://LocalHost./x",
            "http://api.localhost/x",
            "http://10.0.0.5/x",
            "http://169.254.169.254/latest/meta-data",
            "http://[::1]/x",
            "http://[::ffff:127.0.0.1]/x",
            "http://[fd00::1]/x",
            "http://0.0.0.0:80/x",
            "http://2130706433/x",
        ] {
            let refused = check_url(internal, false).unwrap_err().to_string();
            assert!(
                refused.contains("internal address"),
                "{internal}: {refused}"
            );
            assert!(check_url(internal, true).is_ok(), "{internal}");
        }
        assert_eq!(
            check_event_types(vec![
                "lease.delete".into(),
                "lease.create".into(),
                "lease.create".into()
            ])
            .unwrap(),
            ["lease.create", "lease.delete"]
        );
        assert!(check_event_types(vec!["lease create".into()]).is_err());
        assert!(check_event_types(vec![String::new()]).is_err());
        assert!(check_event_types(vec!["nope".into()]).is_err());
        assert!(check_event_types(vec!["lease.event".into()]).is_err());
        assert!(check_event_types(vec!["lease.event.start_lease".into()]).is_ok());
        assert!(check_event_types(vec![" lease.degraded ".into()]).is_ok());
    }
}
