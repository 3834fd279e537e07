//! Authorization: which rule guards each use case, and Blazar's default rules. A deployment
//! can replace the defaults with its own rules (the server loads an oslo.policy-style file).

use crate::{Identity, ServiceError, ServiceResult};

/// What an action touches: the owner of the object, or the caller's own project for
/// actions on nothing in particular.
#[derive(Debug, Clone, Copy)]
pub struct Target<'a> {
    pub project_id: &'a str,
    pub user_id: &'a str,
}

impl<'a> Target<'a> {
    /// The caller's own project and user.
    pub fn own(identity: &'a Identity) -> Self {
        Target {
            project_id: &identity.project_id,
            user_id: &identity.user_id,
        }
    }
}

pub trait Authorizer: Send + Sync {
    /// Whether `rule` lets `caller` act on `target`.
    fn allows(&self, rule: &str, caller: &Identity, target: &Target<'_>) -> bool;
}

/// Blazar's default rules (its `blazar/policies`), with Keystone's implied roles
/// (admin implies member implies reader):
/// `admin` = role admin; leases and floating-IP reads = reader of the target project or
/// admin; lease writes = member of the target project or admin; inventory = admin.
pub struct DefaultPolicy;

impl DefaultPolicy {
    fn project_member_or_admin(caller: &Identity, target: &Target<'_>) -> bool {
        caller.is_admin() || (caller.is_member() && caller.project_id == target.project_id)
    }

    fn project_reader_or_admin(caller: &Identity, target: &Target<'_>) -> bool {
        caller.is_admin() || (caller.is_reader() && caller.project_id == target.project_id)
    }
}

impl Authorizer for DefaultPolicy {
    fn allows(&self, rule: &str, caller: &Identity, target: &Target<'_>) -> bool {
        match rule {
            "admin" => caller.is_admin(),
            "blazar:leases:get"
            | "blazar:floatingips:get"
            | "blazar:handovers:get"
            | crate::quotas::QUOTAS_GET => Self::project_reader_or_admin(caller, target),
            "blazar:leases:post"
            | "blazar:leases:put"
            | "blazar:leases:delete"
            | "blazar:leases:reallocate" => Self::project_member_or_admin(caller, target),
            // Counts in refusals are for everyone; private properties are guarded apart.
            crate::leases::EXPLAIN_REFUSAL => true,
            // Calendars are for users; whose leases they show is decided apart.
            crate::timeline::TIMELINE_RULE => true,
            r if r.starts_with("blazar:oshosts:")
                || r.starts_with("blazar:floatingips:")
                || r.starts_with("blazar:networks:")
                || r.starts_with("blazar:devices:")
                || r.starts_with("blazar:flavors:")
                || r == "blazar:reconcile"
                || r == crate::quotas::QUOTAS_PUT
                || r == crate::quotas::QUOTAS_DELETE =>
            {
                caller.is_admin()
            }
            _ => false,
        }
    }
}

/// The 403 Blazar answers when a policy rule refuses an action.
pub fn policy_denied(rule: &str) -> ServiceError {
    ServiceError::Forbidden(format!("Policy doesn't allow {rule} to be performed"))
}

impl crate::Service {
    /// Checks `rule` for `caller` on `target`; a refusal is Blazar's 403.
    pub(crate) fn authorize(
        &self,
        rule: &str,
        caller: &Identity,
        target: &Target<'_>,
    ) -> ServiceResult<()> {
        if self.authorizer.allows(rule, caller, target) {
            Ok(())
        } else {
            Err(policy_denied(rule))
        }
    }

    /// [`Self::authorize`] for lease creates and updates: a refusal names the rule in its
    /// reasons.
    pub(crate) fn authorize_explained(
        &self,
        rule: &str,
        caller: &Identity,
        target: &Target<'_>,
    ) -> ServiceResult<()> {
        self.authorize(rule, caller, target)
            .map_err(|e| e.with_reason(crate::Reason::rule(rule)))
    }

    /// Checks `rule` for `caller` on the caller's own project.
    pub(crate) fn authorize_own(&self, rule: &str, caller: &Identity) -> ServiceResult<()> {
        self.authorize(rule, caller, &Target::own(caller))
    }

    /// Whether the caller passes the `admin` rule (sees every project's leases, private
    /// properties).
    pub(crate) fn is_admin(&self, caller: &Identity) -> bool {
        self.authorizer
            .allows("admin", caller, &Target::own(caller))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn who(project: &str, roles: &[&str]) -> Identity {
        Identity {
            user_id: "u".into(),
            project_id: project.into(),
            roles: roles.iter().map(|r| r.to_string()).collect(),
        }
    }

    #[test]
    fn default_rules_table() {
        let p = DefaultPolicy;
        let mine = Target {
            project_id: "p1",
            user_id: "u",
        };
        let theirs = Target {
            project_id: "p2",
            user_id: "x",
        };
        let rows: &[(&str, &[&str], &Target, bool)] = &[
            ("blazar:leases:get", &["reader"], &mine, true),
            ("blazar:leases:get", &["reader"], &theirs, false),
            ("blazar:leases:get", &["admin"], &theirs, true),
            ("blazar:leases:post", &["reader"], &mine, false),
            ("blazar:leases:post", &["member"], &mine, true),
            ("blazar:leases:delete", &["member"], &theirs, false),
            ("blazar:leases:delete", &["admin"], &theirs, true),
            ("blazar:oshosts:get", &["member"], &mine, false),
            ("blazar:oshosts:get", &["admin"], &mine, true),
            ("blazar:floatingips:get", &["reader"], &mine, true),
            ("blazar:floatingips:post", &["member"], &mine, false),
            ("blazar:timeline:get", &[], &mine, true),
            ("blazar:timeline:get", &["reader"], &mine, true),
            ("blazar:quotas:get", &["reader"], &mine, true),
            ("blazar:quotas:get", &["member"], &theirs, false),
            ("blazar:quotas:put", &["member"], &mine, false),
            ("blazar:quotas:put", &["admin"], &theirs, true),
            ("blazar:quotas:delete", &["admin"], &theirs, true),
            ("admin", &["member"], &mine, false),
            ("blazar:unknown", &["admin"], &mine, false),
        ];
        for (rule, roles, target, expected) in rows {
            assert_eq!(
                p.allows(rule, &who("p1", roles), target),
                *expected,
                "{rule} {roles:?} {target:?}"
            );
        }
    }
}
