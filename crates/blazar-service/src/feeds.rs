//! Calendar feeds: a project's leases as an iCalendar document for calendar applications,
//! which fetch a URL on a timer and cannot send a token. The URL carries its own secret,
//! `/ical/<id>_<secret>.ics`, made and kept as API tokens are (`tokens.rs`: 256 random
//! bits, only the SHA-256 digest stored, compared in constant time); deleting the feed
//! revokes the URL. A feed shows one project's leases, as its members see them.

use blazar_core::{IcalFeed, LeaseFilter, LeaseView};
use subtle::ConstantTimeEq;

use crate::tokens::{digest, random_hex, split_id_secret};
use crate::{Identity, Service, ServiceError, ServiceResult};

const ID_BYTES: usize = 8;
const SECRET_BYTES: usize = 32;
/// Leases in one feed at most: the most recent ones, by start.
pub const FEED_LEASES: usize = 1_000;
/// Feeds one project may have: each is a secret URL to revoke, not something to hoard.
pub const MAX_FEEDS_PER_PROJECT: i64 = 25;

/// A feed just created: the only moment its URL exists outside the caller's hands.
pub struct IssuedFeed {
    pub feed: IcalFeed,
    /// `/ical/<id>_<secret>.ics`, relative to the server's root.
    pub path: String,
}

/// The path of a feed's document.
fn feed_path(id: &str, secret: &str) -> String {
    format!("/ical/{id}_{secret}.ics")
}

/// Splits the last segment of a feed's path into its id and secret.
pub fn split_feed(segment: &str) -> Option<(&str, &str)> {
    split_id_secret(segment.strip_suffix(".ics")?, ID_BYTES, SECRET_BYTES)
}

impl Service {
    /// Creates a feed of the caller's project (an admin may name another), at most
    /// [`MAX_FEEDS_PER_PROJECT`] per project.
    pub async fn create_ical_feed(
        &self,
        identity: &Identity,
        project_id: Option<String>,
        description: String,
    ) -> ServiceResult<IssuedFeed> {
        // A write: the rule of lease creates (members and admins; not readers).
        self.authorize_own("blazar:leases:post", identity)?;
        let project_id = match project_id.map(|p| p.trim().to_string()) {
            Some(p) if p.is_empty() => {
                return Err(ServiceError::BadRequest(
                    "project_id must not be empty".into(),
                ));
            }
            Some(p) if p != identity.project_id && !self.is_admin(identity) => {
                return Err(ServiceError::Forbidden(
                    "only an admin may create a feed of another project".into(),
                ));
            }
            Some(p) => {
                crate::check_project_id(&p)?;
                p
            }
            None => identity.project_id.clone(),
        };
        crate::check_text("description", &description, true)?;
        if description.chars().count() > 255 {
            return Err(ServiceError::BadRequest(
                "description must be at most 255 characters".into(),
            ));
        }
        let secret = random_hex(SECRET_BYTES)?;
        let feed = IcalFeed {
            id: random_hex(ID_BYTES)?,
            secret_sha256: digest(&secret),
            project_id,
            description,
            created_by: Some(identity.user_id.clone()).filter(|u| !u.is_empty()),
            created_at: self.now(),
        };
        in_tx!(self, write, |tx| {
            tx.lock_project_feeds(&feed.project_id).await?;
            if tx.count_ical_feeds(&feed.project_id).await? >= MAX_FEEDS_PER_PROJECT {
                return Err(ServiceError::BadRequest(format!(
                    "A project has at most {MAX_FEEDS_PER_PROJECT} calendar feeds; delete one \
                     first"
                )));
            }
            tx.insert_ical_feed(&feed).await?;
            Ok(())
        })?;
        tracing::info!(feed.id = %feed.id, project.id = %feed.project_id, "calendar feed created");
        let path = feed_path(&feed.id, &secret);
        Ok(IssuedFeed { feed, path })
    }

    /// The feeds of the caller's project (every feed for an admin).
    pub async fn list_ical_feeds(&self, identity: &Identity) -> ServiceResult<Vec<IcalFeed>> {
        self.authorize_own("blazar:leases:get", identity)?;
        let project = (!self.is_admin(identity)).then_some(identity.project_id.as_str());
        in_tx!(self, read, |tx| { Ok(tx.list_ical_feeds(project).await?) })
    }

    /// Deletes a feed, which revokes its URL. Another project's feed is not found, unless
    /// the caller is an admin.
    pub async fn delete_ical_feed(&self, identity: &Identity, id: &str) -> ServiceResult<()> {
        self.authorize_own("blazar:leases:post", identity)?;
        let admin = self.is_admin(identity);
        let deleted = in_tx!(self, write, |tx| {
            let visible = tx
                .ical_feed(id)
                .await?
                .is_some_and(|f| admin || f.project_id == identity.project_id);
            Ok(visible && tx.delete_ical_feed(id).await?)
        })?;
        if !deleted {
            return Err(ServiceError::NotFound(format!(
                "Calendar feed {id} not found"
            )));
        }
        tracing::info!(feed.id = %id, "calendar feed deleted");
        Ok(())
    }

    /// The feed a URL's last segment names and its project's leases (the latest
    /// [`FEED_LEASES`] by start), if the secret matches; not found otherwise, whatever was
    /// wrong, and in the same time whether or not the id exists.
    pub async fn ical_feed_leases(
        &self,
        segment: &str,
    ) -> ServiceResult<(IcalFeed, Vec<LeaseView>)> {
        let not_found = || ServiceError::NotFound("Calendar feed not found".into());
        let (id, secret) = split_feed(segment).ok_or_else(not_found)?;
        let presented = digest(secret);
        let found = in_tx!(self, read, |tx| {
            let feed = tx.ical_feed(id).await?;
            let stored = feed
                .as_ref()
                .map_or_else(|| "0".repeat(64), |f| f.secret_sha256.clone());
            let matches: bool = presented.as_bytes().ct_eq(stored.as_bytes()).into();
            // Checked before any lease is read: a wrong secret then costs what an unknown id
            // costs, and the time taken tells neither whether the id exists nor makes an
            // unauthenticated caller read a project's leases.
            let Some(feed) = feed.filter(|_| matches) else {
                return Ok(None);
            };
            // The latest leases only: a project's history may be years long, and the
            // feed is read by every calendar that subscribed, every few minutes.
            let ids = tx.latest_lease_ids(&feed.project_id, FEED_LEASES).await?;
            let filter = LeaseFilter {
                ids: Some(ids),
                ..LeaseFilter::default()
            };
            let trees = tx.revised_lease_trees(&filter).await?;
            Ok(Some((feed, trees)))
        })?;
        let Some((feed, trees)) = found else {
            return Err(not_found());
        };
        let mut leases: Vec<LeaseView> = trees
            .into_iter()
            .map(|(_, (lease, reservations, events))| LeaseView {
                lease,
                reservations,
                events,
            })
            .collect();
        leases.sort_by_key(|v| std::cmp::Reverse(v.lease.start));
        leases.truncate(FEED_LEASES);
        Ok((feed, leases))
    }
}
