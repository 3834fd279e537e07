//! "When can I have it?": offers for a lease request, the create that books the earliest
//! one in its own transaction, and how far a lease can be extended.
//!
//! The search itself is pure (`blazar_core::offer`); this module gives it what a lease
//! create would see: the candidates of each reservation (the same host cache, pool matching
//! and instance shapes allocation uses) and their allocations inside the search window only.

use std::collections::{BTreeMap, HashMap};

use blazar_core::engine::Usage;
use blazar_core::lease::When;
use blazar_core::offer::{
    self, Budget, Busy, Ceiling, Demand, Occupancy, Offer, Order, ProbeFor, Search,
};
use blazar_core::{LeaseView, PHYSICAL_HOST, ReservationSpec, ResourceRecord, TimeWindow};
use blazar_db::Tx;
use chrono::{DateTime, Duration, Utc};
use serde_json::json;

use crate::enforcement::EnforcedLease;
use crate::policy::Target;
use crate::resources::{count, filter_key};
use crate::{Identity, Service, ServiceError, ServiceResult, truncate_to_minute};

/// How far ahead a search looks when the request does not say.
pub const DEFAULT_SEARCH_DAYS: i64 = 30;
/// The longest search window taken: a year of allocations is read at most.
pub const MAX_SEARCH_DAYS: i64 = 366;
/// Offers answered when the request does not say.
pub const DEFAULT_OFFERS: usize = 5;
/// The most offers one request may ask for.
pub const MAX_OFFERS: usize = 100;

/// Where and how long to look: a lease of `min_minutes` to `max_minutes` that starts no
/// earlier than `not_before` (now when absent) and ends by `not_after` (when absent, 30
/// days after `not_before` plus the longest duration, within a year).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SearchWindow {
    pub not_before: Option<When>,
    pub not_after: Option<DateTime<Utc>>,
    pub min_minutes: i64,
    pub max_minutes: i64,
}

/// `t`, or the last minute the wire can write (9999-12-31 23:59) if later: a search whose
/// default end went past it could offer (and book) a lease no client can read back.
pub(crate) fn within_the_wire(t: DateTime<Utc>) -> DateTime<Utc> {
    chrono::NaiveDate::from_ymd_opt(9999, 12, 31)
        .and_then(|d| d.and_hms_opt(23, 59, 0))
        .map_or(t, |last| t.min(last.and_utc()))
}

impl SearchWindow {
    /// The core search for this window at minute `now`, or why it is not a valid one.
    pub(crate) fn resolve(
        &self,
        now: DateTime<Utc>,
        cleaning: Duration,
        order: Order,
        limit: usize,
    ) -> ServiceResult<Search> {
        let bad = |m: String| Err(ServiceError::BadRequest(m));
        if self.min_minutes < 1 {
            return bad("The duration must be at least one minute".into());
        }
        if self.max_minutes < self.min_minutes {
            return bad("max_duration must not be shorter than min_duration".into());
        }
        // Before any date arithmetic: a duration of any size may be asked for.
        if self.max_minutes > Duration::days(MAX_SEARCH_DAYS).num_minutes() {
            return bad(format!(
                "The duration is longer than {MAX_SEARCH_DAYS} days"
            ));
        }
        let not_before = self.not_before.map_or(now, |w| w.resolve(now)).max(now);
        // By default a lease of the longest duration wanted may start any time in the next
        // DEFAULT_SEARCH_DAYS (within the longest search taken).
        let reach = (Duration::minutes(self.max_minutes) + Duration::days(DEFAULT_SEARCH_DAYS))
            .min(Duration::days(MAX_SEARCH_DAYS));
        let not_after = self
            .not_after
            .unwrap_or_else(|| within_the_wire(not_before + reach));
        if not_after <= not_before && self.not_after.is_none() {
            // The default end (DEFAULT_SEARCH_DAYS on, clamped to the wire's last date)
            // was not asked for: say what was.
            return bad(format!(
                "not_before ({}) leaves no time to search before the last date the API \
                 accepts",
                not_before.format("%Y-%m-%d %H:%M")
            ));
        }
        if not_after <= not_before {
            return bad(format!(
                "not_after ({}) must be later than not_before ({})",
                not_after.format("%Y-%m-%d %H:%M"),
                not_before.format("%Y-%m-%d %H:%M")
            ));
        }
        if not_after - not_before > Duration::days(MAX_SEARCH_DAYS) {
            return bad(format!(
                "The search window is longer than {MAX_SEARCH_DAYS} days; narrow not_before \
                 and not_after"
            ));
        }
        if not_after - not_before < Duration::minutes(self.min_minutes) {
            return bad(format!(
                "A lease of {} minute(s) cannot fit between not_before ({}) and not_after \
                 ({}); widen the search or shorten the duration",
                self.min_minutes,
                not_before.format("%Y-%m-%d %H:%M"),
                not_after.format("%Y-%m-%d %H:%M")
            ));
        }
        Ok(Search {
            not_before,
            not_after,
            min_minutes: self.min_minutes,
            max_minutes: self.max_minutes,
            cleaning,
            order,
            limit,
            start_by: None,
        })
    }
}

/// `POST /v1/leases/offers`: a lease request without dates, and where to look.
#[derive(Debug, Clone)]
pub struct OfferRequest {
    /// Reservation requests as a lease create takes them.
    pub reservations: Vec<blazar_core::ReservationRequest>,
    pub window: SearchWindow,
    pub limit: usize,
    pub order: Order,
}

/// One resource an offer would grant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OfferedResource {
    /// The id the API shows: a host's id, a floating IP's, segment's or device's uuid.
    pub id: String,
    /// The host name, floating IP address, segment id or device name.
    pub name: String,
    /// Units on it: instances on a host for instance reservations, one otherwise.
    pub units: i64,
}

/// What one reservation of the request would be granted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OfferedReservation {
    pub resource_type: &'static str,
    /// Hosts, addresses, segments or devices; instances for instance reservations. `None`
    /// when the resources are not named (a member's query names a private property) and
    /// the request asked for a range: how many match would tell the property's values.
    pub amount: Option<i64>,
    pub resources: Vec<OfferedResource>,
}

/// A window the whole request fits in, bookable with a plain create of those dates.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseOffer {
    pub window: TimeWindow,
    pub reservations: Vec<OfferedReservation>,
}

/// Whether a lease can be extended, and how far.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Extension {
    pub lease_id: String,
    /// The lease's end now.
    pub end: DateTime<Utc>,
    /// The end asked about, if one was.
    pub requested_end: Option<DateTime<Utc>>,
    /// Whether an update to `requested_end` would be granted now.
    pub possible: Option<bool>,
    /// Why not, when it would be refused (the update's own message).
    pub refusal: Option<String>,
    /// Whether the lease reaches `requested_end` on exactly the resources it holds (an
    /// update of a lease that has not started may also move it to others).
    pub keeps_resources: Option<bool>,
    /// The latest end the lease reaches keeping every resource it holds, searched up to
    /// `horizon`; `None` when it cannot be extended at all.
    pub latest_end: Option<DateTime<Utc>>,
    pub horizon: DateTime<Utc>,
}

impl Service {
    /// A permit of the window searches that run outside a writing transaction, held from
    /// before the search's read until its answer is built, waited for until `deadline`:
    /// the search's budget counts the wait, so a queue of long searches answers 503 at the
    /// deadline instead of holding the searches behind it for their budgets one after
    /// another. The earliest window of a create is searched again inside its writing
    /// transaction and takes none there: writers of allocations are one at a time already
    /// (SQLite's writer, PostgreSQL's allocation lock), and a writer must not wait behind
    /// readers.
    pub(crate) async fn search_permit(
        &self,
        deadline: SearchDeadline,
    ) -> ServiceResult<tokio::sync::SemaphorePermit<'_>> {
        permit_by(&self.searches, deadline).await
    }

    /// Offers for a lease request: ranked windows in which a create of the same
    /// reservations would succeed, with what each would be granted.
    pub async fn lease_offers(
        &self,
        identity: &Identity,
        request: &OfferRequest,
    ) -> ServiceResult<Vec<LeaseOffer>> {
        self.authorize_explained("blazar:leases:post", identity, &Target::own(identity))?;
        if request.limit == 0 || request.limit > MAX_OFFERS {
            return Err(ServiceError::BadRequest(format!(
                "limit must be between 1 and {MAX_OFFERS}"
            )));
        }
        // Offers are advice the caller books afterwards: one that started in the current
        // minute would be refused as past by a create made after that minute ends.
        let now = blazar_core::time::first_whole_minute(self.now());
        let search = request.window.resolve(
            now,
            self.settings().cleaning(),
            request.order,
            request.limit,
        )?;
        let mut specs = self.validated_requests(&request.reservations)?;
        // The local usage filters (Blazar's MaxLeaseDurationFilter) refuse an offer request
        // as a create: a request whose shortest lease they refuse is answered as that
        // create would be.
        let limits = in_tx!(self, read, |tx| {
            self.project_limits(tx, &identity.project_id).await
        })?;
        let alone = crate::quotas::request_excesses(&limits, &specs);
        if !alone.is_empty() {
            return Err(Screened::Quota(alone).refusal(&identity.project_id));
        }
        // The minute a create's quotas are reckoned from (a create rounds down).
        let quota_now = truncate_to_minute(self.now());
        let screen = |start, end| self.screen(identity, &limits, quota_now, start, end);
        let mut search = search;
        // Offers start no further ahead than the project may book: searched that way, so
        // that later windows do not crowd out the bookable ones.
        if let Some(ahead) = limits.limit(blazar_core::quota::QuotaKind::StartAhead) {
            search.start_by =
                Duration::try_seconds(ahead).and_then(|ahead| quota_now.checked_add_signed(ahead));
        }
        let at = |minutes: i64| search.not_before + Duration::minutes(minutes);
        screen(search.not_before, at(search.min_minutes))
            .await
            .map_err(|screened| screened.refusal(&identity.project_id))?;
        // Of a range of durations, the longest they allow (a lease only gets harder to allow
        // as it grows): about twenty questions, none to the database.
        if screen(search.not_before, at(search.max_minutes))
            .await
            .is_err()
        {
            let (mut allowed, mut refused) = (search.min_minutes, search.max_minutes);
            while refused - allowed > 1 {
                let mid = allowed + (refused - allowed) / 2;
                match screen(search.not_before, at(mid)).await {
                    Ok(()) => allowed = mid,
                    Err(_) => refused = mid,
                }
            }
            search.max_minutes = allowed;
        }
        self.ask_cloud_for_flavors(identity, &mut specs).await?;
        let deadline = SearchDeadline::from_now();
        let _permit = self.search_permit(deadline).await?;
        let offers = in_tx!(self, read, |tx| {
            let offers = self
                .find_offers(tx, identity, &specs, &search, None, deadline)
                .await?;
            self.describe_offers(tx, identity, &specs, offers).await
        })?;
        // And no offer they would refuse is made (one that starts too far ahead, say).
        let mut kept = Vec::with_capacity(offers.len());
        for offer in offers {
            if screen(offer.window.start(), offer.window.end())
                .await
                .is_ok()
            {
                kept.push(offer);
            }
        }
        Ok(kept)
    }

    /// Keeps advice (the next offer of a refusal) to windows `identity`'s project may book:
    /// its start no further ahead than the project may book, and none at all when a lease of
    /// the search's length is refused where the search begins (the lease-length quota or a
    /// usage filter: a longer wait would not help). `None` when nothing can be offered; else
    /// what [`Self::advice_allowed`] checks a found window with.
    pub(crate) async fn advice_screen(
        &self,
        identity: &Identity,
        search: &mut Search,
    ) -> ServiceResult<Option<AdviceScreen>> {
        let limits = in_tx!(self, read, |tx| {
            self.project_limits(tx, &identity.project_id).await
        })?;
        let now = truncate_to_minute(self.now());
        if let Some(ahead) = limits.limit(blazar_core::quota::QuotaKind::StartAhead) {
            search.start_by =
                Duration::try_seconds(ahead).and_then(|ahead| now.checked_add_signed(ahead));
        }
        let screen = AdviceScreen { limits, now };
        let end = search.not_before + Duration::minutes(search.min_minutes);
        Ok(self
            .advice_allowed(identity, &screen, search.not_before, end)
            .await
            .then_some(screen))
    }

    /// Whether a create of `identity`'s from `start` to `end` passes what the window alone
    /// decides (see [`Self::advice_screen`]).
    pub(crate) async fn advice_allowed(
        &self,
        identity: &Identity,
        screen: &AdviceScreen,
        start: DateTime<Utc>,
        end: DateTime<Utc>,
    ) -> bool {
        self.screen(identity, &screen.limits, screen.now, start, end)
            .await
            .is_ok()
    }

    /// What the window alone decides of a create of `identity`'s from `start` to `end` at
    /// minute `now`: the local usage filters, then the quotas on lease duration and start
    /// ahead (`limits`, the project's), in the order a create meets them. The filters that tell someone outside are not asked
    /// for advice: a create asks them.
    async fn screen(
        &self,
        identity: &Identity,
        limits: &blazar_core::quota::QuotaValues,
        now: DateTime<Utc>,
        start: DateTime<Utc>,
        end: DateTime<Utc>,
    ) -> Result<(), Screened> {
        let context = self
            .enforcement
            .context(&identity.user_id, &identity.project_id);
        let lease = EnforcedLease {
            start,
            end,
            values: json!({
                "start_date": crate::enforcement::iso(start),
                "end_date": crate::enforcement::iso(end),
                "user_id": identity.user_id,
                "project_id": identity.project_id,
                "status": "CREATING",
                "reservations": [],
            }),
        };
        for filter in self.enforcement.consulted(true) {
            filter
                .check_create(&context, &lease)
                .await
                .map_err(|d| Screened::Filter(filter.name(), d))?;
        }
        if let Ok(window) = TimeWindow::new(start, end) {
            let excesses = crate::quotas::window_excesses(limits, window, now, None);
            if !excesses.is_empty() {
                return Err(Screened::Quota(excesses));
            }
        }
        Ok(())
    }

    /// The offers for `specs` as of `tx`, leaving out the allocations of lease `except`.
    pub(crate) async fn find_offers(
        &self,
        tx: &mut Tx,
        identity: &Identity,
        specs: &[ReservationSpec],
        search: &Search,
        except: Option<&str>,
        deadline: SearchDeadline,
    ) -> ServiceResult<Vec<Offer>> {
        let demands = self.demands(tx, identity, specs).await?;
        let limits = self
            .search_limits(tx, &identity.project_id, except, search)
            .await?;
        probed_offers(
            tx,
            &demands,
            &limits,
            search,
            except,
            ProbeFor::Grants,
            deadline,
        )
        .await
    }

    /// The project's limits a search for it keeps within: its concurrent quotas and its
    /// monthly budget over the search window, leaving out lease `except`'s holdings.
    async fn search_limits(
        &self,
        tx: &mut Tx,
        project_id: &str,
        except: Option<&str>,
        search: &Search,
    ) -> ServiceResult<ProjectLimits> {
        let (ceilings, budget) = self
            .search_quotas(tx, project_id, except, search.not_before, search.not_after)
            .await?;
        Ok(ProjectLimits { ceilings, budget })
    }

    /// The first window of `search` (ranked by its order) in which `specs` fit, as of `tx`.
    /// What each reservation would be granted there is left to the create that books it,
    /// so the probe may leave more out (`ProbeFor::Windows`).
    pub(crate) async fn first_offer(
        &self,
        tx: &mut Tx,
        identity: &Identity,
        specs: &[ReservationSpec],
        search: &Search,
        deadline: SearchDeadline,
    ) -> ServiceResult<Option<Offer>> {
        let demands = self.demands(tx, identity, specs).await?;
        let search = Search {
            limit: 1,
            ..search.clone()
        };
        let limits = self
            .search_limits(tx, &identity.project_id, None, &search)
            .await?;
        let found = probed_offers(
            tx,
            &demands,
            &limits,
            &search,
            None,
            ProbeFor::Windows,
            deadline,
        )
        .await?;
        Ok(found.into_iter().next())
    }

    /// What each reservation spec needs, its flavor resolved.
    async fn demands(
        &self,
        tx: &mut Tx,
        identity: &Identity,
        specs: &[ReservationSpec],
    ) -> ServiceResult<Vec<Demand>> {
        let mut demands = Vec::with_capacity(specs.len());
        for spec in specs {
            let mut spec = spec.clone();
            crate::instance::resolve_flavor(tx, &mut spec).await?;
            demands.push(self.demand(tx, identity, &spec).await?);
        }
        Ok(demands)
    }

    /// What a reservation spec needs, with its candidates as allocation would choose them.
    async fn demand(
        &self,
        tx: &mut Tx,
        _identity: &Identity,
        spec: &ReservationSpec,
    ) -> ServiceResult<Demand> {
        Ok(match spec {
            ReservationSpec::Host(host) => {
                let queries = [
                    ("hypervisor_properties", &host.hypervisor_properties),
                    ("resource_properties", &host.resource_properties),
                ];
                let (_, matching) = self
                    .host_cache
                    .matching(tx, &queries, &filter_key(&queries))
                    .await?;
                Demand::Whole {
                    kind: PHYSICAL_HOST.to_string(),
                    candidates: matching.to_vec(),
                    required: Vec::new(),
                    min: count(host.min),
                    max: count(host.max),
                }
            }
            ReservationSpec::Instance(_) | ReservationSpec::FlavorInstance(_) => {
                let shape = crate::instance::Shape::of(spec, &self.trait_hosts)?;
                let hosts = crate::instance::shape_hosts(
                    tx,
                    &shape,
                    self.settings.ratios,
                    &self.host_cache,
                )
                .await?;
                Demand::Slots {
                    kind: PHYSICAL_HOST.to_string(),
                    hosts: hosts.to_vec(),
                    slot: shape.slot,
                    amount: shape.amount,
                    affinity: shape.affinity,
                }
            }
            ReservationSpec::FloatingIp(_)
            | ReservationSpec::Network(_)
            | ReservationSpec::Device(_) => {
                let (candidates, required, missing) =
                    crate::pool::matching(tx, spec, false).await?;
                let (min, max) = crate::pool::count(spec);
                // A required address that is not a reservable one of the network: no window
                // will ever grant it (a create is refused the same way).
                let (min, max) = match missing {
                    Some(_) => (usize::MAX, usize::MAX),
                    None => (count(min), count(max)),
                };
                Demand::Whole {
                    kind: spec.kind().to_string(),
                    candidates,
                    required,
                    min,
                    max,
                }
            }
        })
    }

    /// Whether `identity` is told when `spec` fits but not which resources it would get: a
    /// non-admin whose query names a private property (which resources match would tell
    /// the property's values, as the timeline and refusals keep them).
    pub(crate) async fn hides_resources(
        &self,
        tx: &mut Tx,
        identity: &Identity,
        spec: &ReservationSpec,
    ) -> ServiceResult<bool> {
        let keys = spec.query_keys();
        if keys.is_empty() || self.is_admin(identity) {
            return Ok(false);
        }
        let private = tx.private_property_names(spec.kind()).await?;
        Ok(keys.iter().any(|k| private.contains(*k)))
    }

    /// The reservations of a dry run's lease whose grants `identity` is not shown (see
    /// [`Self::hides_resources`]): a dry run books nothing, so it would otherwise tell
    /// which resources have a private property for free, as an offer does not.
    pub async fn withheld_grants(
        &self,
        identity: &Identity,
        view: &LeaseView,
    ) -> ServiceResult<std::collections::HashSet<String>> {
        if self.is_admin(identity) {
            return Ok(Default::default());
        }
        in_tx!(self, read, |tx| {
            let mut withheld = std::collections::HashSet::new();
            for r in &view.reservations {
                if self.hides_resources(tx, identity, &r.spec).await? {
                    withheld.insert(r.id.clone());
                }
            }
            Ok(withheld)
        })
    }

    /// Offers as the API shows them: ids and names of what each reservation would get.
    /// A member whose query names a private property is told when, not which resources:
    /// which ones match would tell the property's values (as the timeline and refusals
    /// keep them).
    async fn describe_offers(
        &self,
        tx: &mut Tx,
        identity: &Identity,
        specs: &[ReservationSpec],
        offers: Vec<Offer>,
    ) -> ServiceResult<Vec<LeaseOffer>> {
        let mut hidden = Vec::with_capacity(specs.len());
        for spec in specs {
            hidden.push(self.hides_resources(tx, identity, spec).await?);
        }
        let inventory = self.host_cache.inventory(tx).await?;
        let mut pools: HashMap<&str, BTreeMap<i64, ResourceRecord>> = HashMap::new();
        for spec in specs {
            let kind = spec.kind();
            if kind != PHYSICAL_HOST && !pools.contains_key(kind) {
                let records = tx.list_resources(kind).await?;
                pools.insert(kind, records.into_iter().map(|r| (r.id, r)).collect());
            }
        }
        Ok(offers
            .into_iter()
            .map(|o| LeaseOffer {
                window: o.window,
                reservations: specs
                    .iter()
                    .zip(&hidden)
                    .zip(o.granted)
                    .map(|((spec, &hidden), granted)| OfferedReservation {
                        resource_type: spec.resource_type(),
                        amount: if hidden {
                            let asked = crate::Requested::of(spec);
                            asked
                                .amount
                                .or(asked.min.filter(|min| Some(*min) == asked.max))
                                .map(i64::from)
                        } else {
                            Some(granted.iter().map(|(_, units)| *units).sum())
                        },
                        resources: granted
                            .into_iter()
                            .filter(|_| !hidden)
                            .map(|(id, units)| {
                                let (uid, name) = if spec.kind() == PHYSICAL_HOST {
                                    let name = inventory
                                        .get(id)
                                        .map(|h| h.facts.hypervisor_hostname.clone())
                                        .unwrap_or_default();
                                    (id.to_string(), name)
                                } else {
                                    pools
                                        .get(spec.kind())
                                        .and_then(|p| p.get(&id))
                                        .map(|r| {
                                            (r.resource.uid.clone(), r.resource.display_name())
                                        })
                                        .unwrap_or_else(|| (id.to_string(), String::new()))
                                };
                                OfferedResource {
                                    id: uid,
                                    name,
                                    units,
                                }
                            })
                            .collect(),
                    })
                    .collect(),
            })
            .collect())
    }
}

/// A project's limits as read for advice, and the minute a create's quotas are reckoned
/// from (see [`Service::advice_screen`]).
pub(crate) struct AdviceScreen {
    limits: blazar_core::quota::QuotaValues,
    now: DateTime<Utc>,
}

/// Why the window alone would have a create refused.
enum Screened {
    Quota(Vec<blazar_core::quota::QuotaExcess>),
    Filter(&'static str, crate::enforcement::Denial),
}

impl Screened {
    /// The refusal the create would get.
    fn refusal(self, project_id: &str) -> ServiceError {
        match self {
            Screened::Quota(excesses) => {
                crate::quotas::refusal(project_id, excesses, crate::RefusalKind::Forbidden)
            }
            Screened::Filter(filter, denial) => crate::enforcement::refusal(filter, denial),
        }
    }
}

/// How many candidates of a demand a first search probes, at least (four times what it asks
/// for if that is more). Bookings come in groups (a rack, a project's batch), so a probe
/// spans several of them.
const PROBE_CANDIDATES: usize = 256;

/// The offers for `demands` as of `tx`, leaving out the allocations of lease `except`,
/// searched over part of each demand's candidates first (`offer::probe`): offers found
/// there that start at the search's first minute, each next one where the one before ends,
/// each as long as wanted, are the answer (`offer::cannot_be_bettered`: more candidates
/// can only make more windows fit), and only the probed candidates' allocations are read.
/// At a site with thousands of matching hosts that is most searches of a quiet future;
/// otherwise every candidate is read, for one window only up to the probe's. Under project
/// limits, a probe is made only where it is granted as much as a search over every
/// candidate would be (see [`ProjectLimits::probed_alike`]).
async fn probed_offers(
    tx: &mut Tx,
    demands: &[Demand],
    limits: &ProjectLimits,
    search: &Search,
    except: Option<&str>,
    needs: ProbeFor,
    deadline: SearchDeadline,
) -> ServiceResult<Vec<Offer>> {
    let size = |d: &Demand| PROBE_CANDIDATES.max(d.asked().saturating_mul(4));
    let probe = match limits.probed_alike(demands, needs) {
        true => offer::probe(demands, size, needs),
        false => None,
    };
    if let Some(probe) = probe {
        let found = offers_among(tx, &probe, limits, search, except, deadline).await?;
        if offer::cannot_be_bettered(&found, search) {
            return Ok(found);
        }
        // The probe's first window fits over every candidate too: the search over all of
        // them needs their allocations only until it (`offer::bounded_by`).
        if let Some(bounded) = found.first().and_then(|f| offer::bounded_by(search, f)) {
            return offers_among(tx, demands, limits, &bounded, except, deadline).await;
        }
    }
    offers_among(tx, demands, limits, search, except, deadline).await
}

/// A project's limits that a window search keeps within.
pub(crate) struct ProjectLimits {
    ceilings: Vec<Ceiling>,
    budget: Option<Budget>,
}

impl ProjectLimits {
    /// Whether a search over part of the candidates decides these limits as one over all
    /// of them: it grants as many resources (a demand granted a range takes more over more
    /// candidates, which may go past a limit the probe stayed within) and, for weighted
    /// host budgets, the same hosts (a probe for windows only takes the last demand from
    /// other candidates than a create).
    fn probed_alike(&self, demands: &[Demand], needs: ProbeFor) -> bool {
        let ranged = |d: &Demand| matches!(d, Demand::Whole { min, max, .. } if min != max);
        let limited = !self.ceilings.is_empty() || self.budget.is_some();
        let weighted = self.budget.as_ref().is_some_and(|b| !b.weights.is_empty());
        let counts_differ = limited && demands.iter().any(ranged);
        let weights_differ = weighted && needs == ProbeFor::Windows;
        !(counts_differ || weights_differ)
    }
}

/// The offers for `demands` within the project's `limits` as of `tx`, leaving out the
/// allocations of lease `except`.
async fn offers_among(
    tx: &mut Tx,
    demands: &[Demand],
    limits: &ProjectLimits,
    search: &Search,
    except: Option<&str>,
    deadline: SearchDeadline,
) -> ServiceResult<Vec<Offer>> {
    let mut occupancy = occupancy(
        tx,
        demands,
        search.not_before,
        search.not_after + search.cleaning,
        except,
    )
    .await?;
    for ceiling in &limits.ceilings {
        occupancy.limit_by(ceiling.clone());
    }
    if let Some(budget) = &limits.budget {
        occupancy.budget(budget.clone());
    }
    // The search is CPU work that can take a while over a large occupancy: off the async
    // workers, so it never holds up requests that only wait on I/O.
    let (demands, search) = (demands.to_vec(), search.clone());
    tokio::task::spawn_blocking(move || {
        offer::search_until(&demands, &occupancy, &search, || deadline.passed())
    })
    .await
    .map_err(|e| ServiceError::Internal(format!("a window search failed: {e}")))?
    .ok_or_else(search_unavailable)
}

/// A permit of `permits`, or the 503 of a search that did not get one by `deadline`.
async fn permit_by(
    permits: &tokio::sync::Semaphore,
    deadline: SearchDeadline,
) -> ServiceResult<tokio::sync::SemaphorePermit<'_>> {
    match tokio::time::timeout_at(deadline.0.into(), permits.acquire()).await {
        Ok(permit) => {
            permit.map_err(|_| ServiceError::Internal("the server is shutting down".into()))
        }
        Err(_) => Err(search_unavailable()),
    }
}

/// The 503 of a search that did not finish by its deadline.
fn search_unavailable() -> ServiceError {
    ServiceError::Unavailable(format!(
        "The search for a window did not finish within {} s; try again, or narrow \
         not_before and not_after, the range of durations or the reservations",
        SEARCH_BUDGET.as_secs()
    ))
}

/// Longest one window search may take, its wait for a permit included. An earliest create
/// searches before its writing transaction and then again inside it (from the window found,
/// so at once unless that window was taken meanwhile); an offer search holds one of few
/// permits. Real requests take milliseconds at 10,000 hosts; a hundred reservations of
/// eight hosts over a busy month of a 1,000-host site with a range of durations took 10 s.
/// Counted in time, not work, so a loaded server gives up sooner: the answer is 503, not a
/// refusal.
const SEARCH_BUDGET: std::time::Duration = std::time::Duration::from_secs(5);

/// When a window search gives up: [`SEARCH_BUDGET`] after it was asked for.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SearchDeadline(std::time::Instant);

impl SearchDeadline {
    pub(crate) fn from_now() -> Self {
        Self::after(SEARCH_BUDGET)
    }

    fn after(budget: std::time::Duration) -> Self {
        Self(std::time::Instant::now() + budget)
    }

    fn passed(self) -> bool {
        std::time::Instant::now() >= self.0
    }
}

/// The allocations of every candidate of `demands` that reach into `[start, until)`.
async fn occupancy(
    tx: &mut Tx,
    demands: &[Demand],
    start: DateTime<Utc>,
    until: DateTime<Utc>,
    except: Option<&str>,
) -> ServiceResult<Occupancy> {
    let mut ids: BTreeMap<&str, Vec<i64>> = BTreeMap::new();
    for demand in demands {
        match demand {
            Demand::Whole {
                kind,
                candidates,
                required,
                ..
            } => ids
                .entry(kind)
                .or_default()
                .extend(candidates.iter().chain(required)),
            Demand::Slots { kind, hosts, .. } => ids
                .entry(kind)
                .or_default()
                .extend(hosts.iter().map(|(id, _)| *id)),
        }
    }
    let mut occupancy = Occupancy::new();
    for (kind, mut ids) in ids {
        ids.sort_unstable();
        ids.dedup();
        for a in tx.usage_among(kind, &ids, start, until, except).await? {
            let usage = if a.exclusive {
                Usage::default()
            } else {
                a.usage()
            };
            occupancy.add(
                kind,
                a.resource_id,
                Busy {
                    start: a.start,
                    until: a.blocked_until,
                    exclusive: a.exclusive,
                    usage,
                },
            );
        }
    }
    Ok(occupancy)
}

/// Whether `after` holds everything `before` does: each resource of each reservation, with
/// at least as many units.
fn keeps_all(before: &[blazar_db::GrantRow], after: &[blazar_db::GrantRow]) -> bool {
    let units = |rows: &[blazar_db::GrantRow]| {
        let mut by: HashMap<(String, String, String), i64> = HashMap::new();
        for g in rows {
            *by.entry((
                g.reservation_id.clone(),
                g.resource_type.clone(),
                g.resource_id.clone(),
            ))
            .or_default() += g.units.max(1);
        }
        by
    };
    let after = units(after);
    units(before)
        .iter()
        .all(|(key, n)| after.get(key).is_some_and(|m| m >= n))
}

/// What an extension check asks about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExtensionAsk {
    /// Only how far the lease can go.
    Latest,
    /// Whether it can end at this minute.
    EndAt(DateTime<Utc>),
    /// Whether it can end this many minutes later.
    ProlongBy(i64),
}

impl Service {
    /// Whether a lease can be extended (to an end, or by some minutes): what the update
    /// would answer; and the latest end it can reach keeping every resource it holds,
    /// searched up to 30 days past its end or the end asked about. Writes nothing; the
    /// answer holds until someone else books.
    pub async fn lease_extension(
        &self,
        identity: &Identity,
        id: &str,
        ask: ExtensionAsk,
    ) -> ServiceResult<Extension> {
        let now = truncate_to_minute(self.now());
        let permit = self.search_permit(SearchDeadline::from_now()).await?;
        let extension = in_tx!(self, read, |tx| {
            let lease = tx
                .get_lease(id)
                .await?
                .ok_or_else(|| crate::leases::lease_not_found(id))?;
            let target = crate::leases::lease_target(&lease);
            self.authorize("blazar:leases:get", identity, &target)?;
            self.authorize("blazar:leases:put", identity, &target)?;
            // Its update would be refused until the start is done: so is the question.
            if lease.status == blazar_core::LeaseStatus::Starting {
                return Err(ServiceError::Conflict(format!(
                    "Lease {} is STARTING: the cloud is being changed for it; ask again once \
                     it is ACTIVE",
                    lease.id
                )));
            }
            let requested_end = match ask {
                ExtensionAsk::Latest => None,
                ExtensionAsk::EndAt(t) => Some(t),
                ExtensionAsk::ProlongBy(minutes) => Some(lease.end + Duration::minutes(minutes)),
            };
            if let Some(end) = requested_end
                && within_the_wire(end) < end
            {
                return Err(ServiceError::BadRequest(format!(
                    "The lease cannot end after 9999-12-31 23:59 (asked: {})",
                    end.format("%Y-%m-%d %H:%M")
                )));
            }
            let horizon = within_the_wire(
                (lease.end + Duration::days(DEFAULT_SEARCH_DAYS))
                    .max(requested_end.unwrap_or(lease.end))
                    .min(lease.end + Duration::days(MAX_SEARCH_DAYS)),
            );
            let movable = !matches!(
                lease.status,
                blazar_core::LeaseStatus::Terminated
                    | blazar_core::LeaseStatus::Terminating
                    | blazar_core::LeaseStatus::Error
            ) && lease.end > now;
            let latest_end = if movable {
                self.latest_end(tx, &lease, horizon).await?
            } else {
                None
            };
            let holds = tx.grants_of_lease(&lease.id).await?;
            Ok((
                lease.status,
                holds,
                Extension {
                    lease_id: lease.id.clone(),
                    end: lease.end,
                    requested_end,
                    possible: None,
                    refusal: None,
                    keeps_resources: requested_end
                        .map(|end| latest_end.is_some_and(|latest| latest >= end)),
                    latest_end: latest_end.filter(|t| *t > lease.end),
                    horizon,
                },
            ))
        })?;
        let (status, holds, mut extension) = extension;
        // The update's dry runs below are write transactions: no search permit is held there.
        drop(permit);
        // The latest end is one the update would allow, not only one the resources allow:
        // the lease's quotas (length, budget, what the project holds at once) and the usage
        // filters have their say.
        if let Some(latest) = extension.latest_end {
            extension.latest_end = self
                .latest_allowed_end(identity, id, extension.end, latest)
                .await?;
        }
        // Whether it is possible is what the update itself answers: the lease rules, the
        // resources (a lease that has not started may move to others), quotas and usage
        // filters all have their say, as in a dry run of it.
        if let Some(end) = extension.requested_end {
            let update = crate::leases::LeaseUpdate {
                end: Some(When::At(end)),
                ..Default::default()
            };
            match self.dry_run_update_lease(identity, id, &update).await {
                Ok(dry) => {
                    extension.possible = Some(true);
                    // Past the searched horizon the search cannot say; the update can.
                    if end > extension.horizon {
                        extension.keeps_resources = Some(keeps_all(&holds, &dry.grants));
                    }
                }
                Err(
                    e @ (ServiceError::BadRequest(_)
                    | ServiceError::Conflict(_)
                    | ServiceError::Refused(_)),
                ) => {
                    extension.possible = Some(false);
                    let mut why = e.to_string();
                    if let Some(latest) = extension.latest_end {
                        // Blazar's messages mostly end without a full stop.
                        if !why.ends_with(['.', '!', '?']) {
                            why.push('.');
                        }
                        why.push_str(&format!(
                            " Keeping the resources it holds, it can end at {} at the latest.",
                            latest.format("%Y-%m-%d %H:%M")
                        ));
                    }
                    extension.refusal = Some(why);
                }
                Err(e) => return Err(e),
            }
        }
        // The dry runs assume the lease as it was read: one that started or ended meanwhile
        // (its update refused while STARTING) has answers from two states.
        let now_status = in_tx!(self, read, |tx| {
            Ok(tx.get_lease(id).await?.map(|l| l.status))
        })?
        .ok_or_else(|| crate::leases::lease_not_found(id))?;
        if now_status != status {
            return Err(ServiceError::Conflict(format!(
                "Lease {id} changed from {status} while it was checked; ask again"
            )));
        }
        Ok(extension)
    }

    /// The latest end from `current` (exclusive) to `latest` that an update of the lease
    /// to it is allowed, by its dry run: `latest` itself first (the common case), else by
    /// halving over minutes (an update only gets harder to allow as the end moves later).
    async fn latest_allowed_end(
        &self,
        identity: &Identity,
        id: &str,
        current: DateTime<Utc>,
        latest: DateTime<Utc>,
    ) -> ServiceResult<Option<DateTime<Utc>>> {
        let allowed = |end: DateTime<Utc>| async move {
            let update = crate::leases::LeaseUpdate {
                end: Some(When::At(end)),
                ..Default::default()
            };
            match self.dry_run_update_lease(identity, id, &update).await {
                Ok(_) => Ok(true),
                Err(
                    ServiceError::BadRequest(_)
                    | ServiceError::Conflict(_)
                    | ServiceError::Refused(_),
                ) => Ok(false),
                Err(e) => Err(e),
            }
        };
        if allowed(latest).await? {
            return Ok(Some(latest));
        }
        let (mut fits, mut refused) = (current, latest);
        while (refused - fits).num_minutes() > 1 {
            let mid = fits + Duration::minutes((refused - fits).num_minutes() / 2);
            match allowed(mid).await? {
                true => fits = mid,
                false => refused = mid,
            }
        }
        Ok((fits > current).then_some(fits))
    }

    /// The latest end (up to `horizon`) at which the lease still holds every resource it
    /// holds now: each reservation kept on exactly its resources, instance slots on the
    /// same hosts in the same numbers.
    async fn latest_end(
        &self,
        tx: &mut Tx,
        lease: &blazar_core::Lease,
        horizon: DateTime<Utc>,
    ) -> ServiceResult<Option<DateTime<Utc>>> {
        let held = tx.allocations_of_lease(&lease.id).await?;
        let inventory = self.host_cache.inventory(tx).await?;
        // Per reservation: what it holds, and from when (`held_since`). An update of a
        // running lease allocates from the current minute instead; over resources the
        // lease holds, nobody else can be there in between, so both see the same room.
        let mut reservations: BTreeMap<&str, (DateTime<Utc>, Vec<Demand>)> = BTreeMap::new();
        let mut whole: BTreeMap<(&str, &str), Vec<i64>> = BTreeMap::new();
        for a in &held {
            let entry = reservations
                .entry(&a.reservation_id)
                .or_insert((a.occupancy.start, Vec::new()));
            entry.0 = entry.0.min(a.occupancy.start);
            if a.occupancy.exclusive {
                whole
                    .entry((&a.reservation_id, &a.resource_type))
                    .or_default()
                    .push(a.resource_id);
            } else if let Some(host) = inventory.get(a.resource_id) {
                entry.1.push(Demand::Slots {
                    kind: a.resource_type.clone(),
                    hosts: vec![(
                        a.resource_id,
                        crate::instance::capacity(host, self.settings.ratios),
                    )],
                    slot: Usage {
                        vcpus: a.occupancy.vcpus,
                        memory_mb: a.occupancy.memory_mb,
                        disk_gb: a.occupancy.disk_gb,
                    },
                    amount: a.occupancy.units,
                    affinity: blazar_core::reservation::Affinity::Same,
                });
            }
        }
        for ((reservation, kind), ids) in whole {
            if let Some(entry) = reservations.get_mut(reservation) {
                entry.1.push(Demand::Whole {
                    kind: kind.to_string(),
                    min: ids.len(),
                    max: ids.len(),
                    candidates: ids.clone(),
                    required: ids,
                });
            }
        }
        // Reservations held from the same minute are checked together (most leases: all of
        // them, from the lease's start).
        let mut by_start: BTreeMap<DateTime<Utc>, Vec<Demand>> = BTreeMap::new();
        for (held_from, demands) in reservations.into_values() {
            let from = TimeWindow::new(lease.start, lease.end).map_or(lease.start, |window| {
                crate::leases::held_since(window, std::iter::once(held_from))
            });
            by_start.entry(from).or_default().extend(demands);
        }
        let cleaning = self.settings().cleaning();
        // The lease can end no later than its tightest reservation allows.
        let mut latest = Some(horizon);
        for (from, demands) in by_start {
            let occupancy =
                occupancy(tx, &demands, from, horizon + cleaning, Some(&lease.id)).await?;
            let current = (lease.end - from).num_minutes();
            let end = offer::latest_end(&demands, &occupancy, from, current, horizon, cleaning);
            latest = match (latest, end) {
                (Some(a), Some(b)) => Some(a.min(b)),
                _ => None,
            };
        }
        Ok(latest)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A search that waits for a permit waits at most until its deadline: behind long
    /// searches it answers 503 then, not after their budgets one after another; and it
    /// gets the permit as soon as one is free before that.
    #[tokio::test]
    async fn the_wait_for_a_search_permit_counts_against_the_search_budget() {
        let permits = tokio::sync::Semaphore::new(1);
        let held = permits.acquire().await.unwrap();
        let asked = std::time::Instant::now();
        let refused = permit_by(
            &permits,
            SearchDeadline::after(std::time::Duration::from_millis(100)),
        )
        .await;
        assert!(
            matches!(refused, Err(ServiceError::Unavailable(_))),
            "{refused:?}"
        );
        let waited = asked.elapsed();
        assert!(
            waited >= std::time::Duration::from_millis(100),
            "{waited:?}"
        );
        assert!(waited < std::time::Duration::from_secs(2), "{waited:?}");

        let release = async {
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            drop(held);
        };
        let (got, ()) = tokio::join!(permit_by(&permits, SearchDeadline::from_now()), release);
        assert!(got.is_ok());
    }
}
