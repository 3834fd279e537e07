//! The policy engine: Blazar's default rules in oslo.policy's check-string language, which an
//! operator's policy file (oslo.policy's YAML format) may override rule by rule. It is the
//! [`Authorizer`] the service consults for every action.
//!
//! The language is oslo.policy's: `rule:NAME`, `role:NAME`, `project_id:%(project_id)s`,
//! `user_id:%(user_id)s`, `is_admin:True`, `@` (always), `!` (never), `and`, `or`, `not` and
//! parentheses, with `not` binding tighter than `and`, and `and` tighter than `or`. Where
//! oslo.policy quietly turns a rule it cannot read into "deny" and ignores unknown rule
//! names, this engine refuses the file at start, naming the line: a typo in a policy file
//! must not silently change who may do what.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use blazar_service::{Authorizer, Identity, Target};
use yaml_rust2::parser::{Event, Parser};
use yaml_rust2::scanner::{Marker, TScalarStyle};

/// Blazar's registered rules and their defaults (`blazar/policies/*.py`, spec section 10),
/// plus the inventory families blazar-rs serves beyond upstream Blazar.
const DEFAULT_RULES: &[(&str, &str)] = &[
    ("admin", "is_admin:True or role:admin"),
    // Deprecated in Blazar; kept so that operator files referring to it still load.
    ("admin_or_owner", "rule:admin or project_id:%(project_id)s"),
    (
        "project_member_api",
        "role:member and project_id:%(project_id)s",
    ),
    (
        "project_reader_api",
        "role:reader and project_id:%(project_id)s",
    ),
    (
        "project_member_or_admin",
        "rule:project_member_api or rule:admin",
    ),
    (
        "project_reader_or_admin",
        "rule:project_reader_api or rule:admin",
    ),
    ("blazar:leases:get", "rule:project_reader_or_admin"),
    ("blazar:leases:post", "rule:project_member_or_admin"),
    ("blazar:leases:put", "rule:project_member_or_admin"),
    ("blazar:leases:delete", "rule:project_member_or_admin"),
    // Whether a refused lease create or update says why (how many resources match, how many
    // are free, that a required address is taken) or gives Blazar's bare message. Whatever
    // it says, a non-admin whose query names a private property gets the bare message.
    ("blazar:leases:explain_refusal", "@"),
    // Chameleon: the owner of a lease may move it off a host (PUT os-hosts/{id}/allocation
    // with a lease_id); without one it is blazar:oshosts:reallocate.
    ("blazar:leases:reallocate", "rule:project_member_or_admin"),
    ("blazar:oshosts:get", "rule:admin"),
    ("blazar:oshosts:post", "rule:admin"),
    ("blazar:oshosts:put", "rule:admin"),
    ("blazar:oshosts:delete", "rule:admin"),
    ("blazar:oshosts:get_allocations", "rule:admin"),
    ("blazar:oshosts:get_resource_properties", "rule:admin"),
    ("blazar:oshosts:update_resource_properties", "rule:admin"),
    ("blazar:oshosts:reallocate", "rule:admin"),
    // Compare the cloud with the database and repair it (POST /v1/reconcile).
    ("blazar:reconcile", "rule:admin"),
    ("blazar:floatingips:get", "rule:project_reader_or_admin"),
    ("blazar:floatingips:post", "rule:admin"),
    ("blazar:floatingips:put", "rule:admin"),
    ("blazar:floatingips:delete", "rule:admin"),
    ("blazar:floatingips:get_allocations", "rule:admin"),
    ("blazar:floatingips:get_resource_properties", "rule:admin"),
    (
        "blazar:floatingips:update_resource_properties",
        "rule:admin",
    ),
    ("blazar:networks:get", "rule:admin"),
    ("blazar:networks:post", "rule:admin"),
    ("blazar:networks:put", "rule:admin"),
    ("blazar:networks:delete", "rule:admin"),
    ("blazar:networks:get_allocations", "rule:admin"),
    ("blazar:networks:get_resource_properties", "rule:admin"),
    ("blazar:networks:update_resource_properties", "rule:admin"),
    ("blazar:devices:get", "rule:admin"),
    ("blazar:devices:post", "rule:admin"),
    ("blazar:devices:put", "rule:admin"),
    ("blazar:devices:delete", "rule:admin"),
    ("blazar:devices:reallocate", "rule:admin"),
    ("blazar:devices:get_allocations", "rule:admin"),
    ("blazar:devices:get_resource_properties", "rule:admin"),
    ("blazar:devices:update_resource_properties", "rule:admin"),
    ("blazar:flavors:get", "rule:admin"),
    ("blazar:flavors:post", "rule:admin"),
    ("blazar:flavors:put", "rule:admin"),
    ("blazar:flavors:delete", "rule:admin"),
    ("blazar:handovers:get", "rule:project_reader_or_admin"),
    // Occupancy calendars (GET /v1/<resources>/timeline) are for every user; only admins and
    // a lease's own project see whose lease an interval is.
    ("blazar:timeline:get", "@"),
    // Per-project quotas: a project's readers see its own, admins see and set every one.
    ("blazar:quotas:get", "rule:project_reader_or_admin"),
    ("blazar:quotas:put", "rule:admin"),
    ("blazar:quotas:delete", "rule:admin"),
];

/// Families whose every action is admin-only by default. A rule of one of them that is not
/// registered above (an action added to the service later) is decided by the `admin` rule,
/// as Blazar's `DefaultPolicy` does, rather than denied to everyone.
const INVENTORY_PREFIXES: &[&str] = &[
    "blazar:oshosts:",
    "blazar:floatingips:",
    "blazar:networks:",
    "blazar:devices:",
    "blazar:flavors:",
];

/// Keystone's default implied roles (`keystone-manage bootstrap` creates them): admin implies
/// member, member implies reader. A caller holding a role also holds what it implies.
const IMPLIED_ROLES: &[(&str, &str)] = &[("admin", "member"), ("member", "reader")];

/// Why a policy could not be loaded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicyError {
    pub path: Option<PathBuf>,
    pub line: Option<usize>,
    pub message: String,
}

impl fmt::Display for PolicyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (&self.path, self.line) {
            (Some(path), Some(line)) => {
                write!(
                    f,
                    "policy file {}, line {line}: {}",
                    path.display(),
                    self.message
                )
            }
            (Some(path), None) => write!(f, "policy file {}: {}", path.display(), self.message),
            (None, Some(line)) => write!(f, "policy, line {line}: {}", self.message),
            (None, None) => write!(f, "policy: {}", self.message),
        }
    }
}

impl std::error::Error for PolicyError {}

/// Where a rule's check string comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    Default,
    File { line: usize },
}

/// One rule of the effective policy.
#[derive(Debug, Clone)]
pub struct Rule {
    pub name: String,
    pub check_str: String,
    pub origin: Origin,
    check: Check,
}

/// The credential a generic check compares with a value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Credential {
    UserId,
    ProjectId,
    IsAdmin,
}

/// A value with `%(project_id)s` / `%(user_id)s` taken from the target.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Template(Vec<Piece>);

#[derive(Debug, Clone, PartialEq, Eq)]
enum Piece {
    Text(String),
    TargetProjectId,
    TargetUserId,
}

impl Template {
    fn parse(text: &str) -> Result<Template, String> {
        let mut pieces = Vec::new();
        let mut literal = String::new();
        let mut rest = text;
        while let Some(at) = rest.find('%') {
            literal.push_str(&rest[..at]);
            rest = &rest[at..];
            if let Some(after) = rest.strip_prefix("%%") {
                literal.push('%');
                rest = after;
                continue;
            }
            let Some(close) = rest.find(")s").filter(|_| rest.starts_with("%(")) else {
                return Err(format!(
                    "'{text}': a '%' must start %(project_id)s or %(user_id)s (or be written %%)"
                ));
            };
            let key = &rest[2..close];
            let piece = match key {
                "project_id" => Piece::TargetProjectId,
                "user_id" => Piece::TargetUserId,
                other => {
                    return Err(format!(
                        "'{text}': the target has no '{other}'; it has project_id and user_id"
                    ));
                }
            };
            if !literal.is_empty() {
                pieces.push(Piece::Text(std::mem::take(&mut literal)));
            }
            pieces.push(piece);
            rest = &rest[close + 2..];
        }
        literal.push_str(rest);
        if !literal.is_empty() {
            pieces.push(Piece::Text(literal));
        }
        Ok(Template(pieces))
    }

    fn render(&self, target: &Target<'_>) -> String {
        let mut out = String::new();
        for piece in &self.0 {
            match piece {
                Piece::Text(t) => out.push_str(t),
                Piece::TargetProjectId => out.push_str(target.project_id),
                Piece::TargetUserId => out.push_str(target.user_id),
            }
        }
        out
    }
}

/// A parsed check string.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Check {
    Always(bool),
    Rule(String),
    Role(Template),
    Compare(Credential, Template),
    Not(Box<Check>),
    And(Vec<Check>),
    Or(Vec<Check>),
}

impl Check {
    fn referenced_rules<'a>(&'a self, out: &mut Vec<&'a str>) {
        match self {
            Check::Rule(name) => out.push(name),
            Check::Not(inner) => inner.referenced_rules(out),
            Check::And(items) | Check::Or(items) => {
                for item in items {
                    item.referenced_rules(out);
                }
            }
            Check::Always(_) | Check::Role(_) | Check::Compare(..) => {}
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Token {
    Open,
    Close,
    And,
    Or,
    Not,
    Check(String),
}

/// oslo.policy's tokenizer: words split on whitespace, with `(` peeled off the front of a
/// word and `)` off its end.
fn tokenize(text: &str) -> Vec<Token> {
    let mut tokens = Vec::new();
    for word in text.split_whitespace() {
        let body = word.trim_start_matches('(');
        tokens.extend(std::iter::repeat_n(Token::Open, word.len() - body.len()));
        if body.is_empty() {
            continue;
        }
        let clean = body.trim_end_matches(')');
        if !clean.is_empty() {
            tokens.push(match clean.to_ascii_lowercase().as_str() {
                "and" => Token::And,
                "or" => Token::Or,
                "not" => Token::Not,
                _ => Token::Check(clean.to_string()),
            });
        }
        tokens.extend(std::iter::repeat_n(Token::Close, body.len() - clean.len()));
    }
    tokens
}

struct CheckParser {
    tokens: Vec<Token>,
    at: usize,
}

impl CheckParser {
    fn peek(&self) -> Option<&Token> {
        self.tokens.get(self.at)
    }

    fn next(&mut self) -> Option<Token> {
        let token = self.tokens.get(self.at).cloned();
        self.at += 1;
        token
    }

    fn or_expr(&mut self) -> Result<Check, String> {
        let mut items = vec![self.and_expr()?];
        while self.peek() == Some(&Token::Or) {
            self.at += 1;
            items.push(self.and_expr()?);
        }
        Ok(if items.len() == 1 {
            items.remove(0)
        } else {
            Check::Or(items)
        })
    }

    fn and_expr(&mut self) -> Result<Check, String> {
        let mut items = vec![self.not_expr()?];
        while self.peek() == Some(&Token::And) {
            self.at += 1;
            items.push(self.not_expr()?);
        }
        Ok(if items.len() == 1 {
            items.remove(0)
        } else {
            Check::And(items)
        })
    }

    fn not_expr(&mut self) -> Result<Check, String> {
        match self.next() {
            Some(Token::Not) => Ok(Check::Not(Box::new(self.not_expr()?))),
            Some(Token::Open) => {
                let inner = self.or_expr()?;
                match self.next() {
                    Some(Token::Close) => Ok(inner),
                    _ => Err("a '(' is not closed".into()),
                }
            }
            Some(Token::Check(text)) => parse_check(&text),
            Some(Token::Close) => Err("unexpected ')'".into()),
            Some(Token::And) => Err("'and' needs a check on each side".into()),
            Some(Token::Or) => Err("'or' needs a check on each side".into()),
            None => Err("a check is missing at the end".into()),
        }
    }
}

/// One check: `@`, `!`, `rule:`, `role:`, or a credential compared with a value.
fn parse_check(text: &str) -> Result<Check, String> {
    match text {
        "@" => return Ok(Check::Always(true)),
        "!" => return Ok(Check::Always(false)),
        _ => {}
    }
    if text.starts_with('"') || text.starts_with('\'') {
        return Err(format!("quoted strings such as {text} are not supported"));
    }
    let Some((kind, value)) = text.split_once(':') else {
        return Err(format!(
            "'{text}' is not a check (expected kind:value, '@' or '!')"
        ));
    };
    if value.is_empty() {
        return Err(format!("'{text}' has no value after the ':'"));
    }
    match kind {
        "rule" => Ok(Check::Rule(value.to_string())),
        "role" => Ok(Check::Role(Template::parse(value)?)),
        "project_id" => Ok(Check::Compare(
            Credential::ProjectId,
            Template::parse(value)?,
        )),
        "user_id" => Ok(Check::Compare(Credential::UserId, Template::parse(value)?)),
        "is_admin" => match value {
            "True" | "False" => Ok(Check::Compare(
                Credential::IsAdmin,
                Template(vec![Piece::Text(value.to_string())]),
            )),
            other => Err(format!(
                "'{text}': is_admin is compared with True or False, not '{other}'"
            )),
        },
        other => Err(format!(
            "'{text}': unsupported check kind '{other}' (supported: rule, role, project_id, \
             user_id, is_admin, '@', '!')"
        )),
    }
}

/// Parses a check string. An empty string allows everyone, as in oslo.policy.
fn parse_check_str(text: &str) -> Result<Check, String> {
    if text.is_empty() {
        return Ok(Check::Always(true));
    }
    let tokens = tokenize(text);
    if tokens.is_empty() {
        return Err("the check string is blank (write \"@\" to allow everyone)".into());
    }
    let mut parser = CheckParser { tokens, at: 0 };
    let check = parser.or_expr()?;
    match parser.peek() {
        None => Ok(check),
        Some(Token::Close) => Err("unexpected ')'".into()),
        Some(_) => Err("two checks must be joined by 'and' or 'or'".into()),
    }
}

/// What a caller is, as the checks see it.
struct Credentials<'a> {
    identity: &'a Identity,
    roles: BTreeSet<String>,
    is_admin: bool,
}

impl<'a> Credentials<'a> {
    fn of(identity: &'a Identity) -> Self {
        let mut roles: BTreeSet<String> = identity.roles.iter().map(|r| r.to_lowercase()).collect();
        loop {
            let implied: Vec<String> = IMPLIED_ROLES
                .iter()
                .filter(|(has, gives)| roles.contains(*has) && !roles.contains(*gives))
                .map(|(_, gives)| gives.to_string())
                .collect();
            if implied.is_empty() {
                break;
            }
            roles.extend(implied);
        }
        let is_admin = roles.contains("admin");
        Credentials {
            identity,
            roles,
            is_admin,
        }
    }
}

/// The effective policy.
pub struct Policy {
    rules: BTreeMap<String, Rule>,
    path: Option<PathBuf>,
    /// Unregistered inventory rules already reported, so each is logged once.
    reported: Mutex<HashSet<String>>,
}

impl fmt::Debug for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Policy")
            .field("path", &self.path)
            .field("rules", &self.rules.len())
            .finish()
    }
}

/// A rule override read from a file: its check string and line.
struct Override {
    name: String,
    check_str: String,
    line: usize,
}

impl Policy {
    /// Blazar's default rules.
    pub fn defaults() -> Policy {
        let mut rules = BTreeMap::new();
        for (name, check_str) in DEFAULT_RULES {
            // The defaults are constants checked by a unit test; one that did not parse
            // would deny its action, never allow it.
            let check = parse_check_str(check_str).unwrap_or(Check::Always(false));
            rules.insert(
                name.to_string(),
                Rule {
                    name: name.to_string(),
                    check_str: check_str.to_string(),
                    origin: Origin::Default,
                    check,
                },
            );
        }
        Policy {
            rules,
            path: None,
            reported: Mutex::new(HashSet::new()),
        }
    }

    /// The defaults overridden by the policy file at `path`, if any.
    pub fn load(path: Option<&Path>) -> Result<Policy, PolicyError> {
        match path {
            None => Ok(Policy::defaults()),
            Some(path) => {
                let text = std::fs::read_to_string(path).map_err(|e| PolicyError {
                    path: Some(path.to_path_buf()),
                    line: None,
                    message: format!("cannot read it: {e}"),
                })?;
                Policy::from_yaml(&text)
                    .map_err(|mut e| {
                        e.path = Some(path.to_path_buf());
                        e
                    })
                    .map(|mut policy| {
                        policy.path = Some(path.to_path_buf());
                        policy
                    })
            }
        }
    }

    /// The defaults overridden by a policy document in oslo.policy's YAML (or JSON) format:
    /// a mapping from rule name to check string.
    pub fn from_yaml(text: &str) -> Result<Policy, PolicyError> {
        let overrides = read_overrides(text)?;
        let mut policy = Policy::defaults();
        let mut lines: BTreeMap<String, usize> = BTreeMap::new();
        for o in &overrides {
            let check = parse_check_str(&o.check_str).map_err(|message| PolicyError {
                path: None,
                line: Some(o.line),
                message: format!(
                    "rule '{}': cannot read \"{}\": {message}",
                    o.name, o.check_str
                ),
            })?;
            lines.insert(o.name.clone(), o.line);
            policy.rules.insert(
                o.name.clone(),
                Rule {
                    name: o.name.clone(),
                    check_str: o.check_str.clone(),
                    origin: Origin::File { line: o.line },
                    check,
                },
            );
        }
        // Every `rule:` reference must name a rule.
        let mut referenced: HashSet<String> = HashSet::new();
        for rule in policy.rules.values() {
            let mut names = Vec::new();
            rule.check.referenced_rules(&mut names);
            for name in names {
                if !policy.rules.contains_key(name) {
                    return Err(PolicyError {
                        path: None,
                        line: lines.get(&rule.name).copied(),
                        message: format!(
                            "rule '{}' refers to rule:{name}, which is not defined",
                            rule.name
                        ),
                    });
                }
                referenced.insert(name.to_string());
            }
        }
        // A name the service does not know is a typo unless another rule uses it as an alias.
        for o in &overrides {
            let registered = DEFAULT_RULES.iter().any(|(name, _)| *name == o.name);
            if !registered && !referenced.contains(&o.name) {
                return Err(PolicyError {
                    path: None,
                    line: Some(o.line),
                    message: format!(
                        "unknown rule name '{}': it is neither one of Blazar's rules nor used \
                         by another rule (`blazar-server policy show` lists the rules)",
                        o.name
                    ),
                });
            }
        }
        policy.check_cycles(&lines)?;
        Ok(policy)
    }

    fn check_cycles(&self, lines: &BTreeMap<String, usize>) -> Result<(), PolicyError> {
        // Depth-first search; 1 = on the current path, 2 = done.
        fn visit(
            policy: &Policy,
            name: &str,
            state: &mut BTreeMap<String, u8>,
            path: &mut Vec<String>,
        ) -> Option<Vec<String>> {
            match state.get(name) {
                Some(2) => return None,
                Some(_) => {
                    let start = path.iter().position(|n| n == name).unwrap_or(0);
                    let mut cycle = path[start..].to_vec();
                    cycle.push(name.to_string());
                    return Some(cycle);
                }
                None => {}
            }
            state.insert(name.to_string(), 1);
            path.push(name.to_string());
            if let Some(rule) = policy.rules.get(name) {
                let mut names = Vec::new();
                rule.check.referenced_rules(&mut names);
                for next in names {
                    if let Some(cycle) = visit(policy, next, state, path) {
                        return Some(cycle);
                    }
                }
            }
            path.pop();
            state.insert(name.to_string(), 2);
            None
        }
        let mut state = BTreeMap::new();
        for name in self.rules.keys() {
            if let Some(cycle) = visit(self, name, &mut state, &mut Vec::new()) {
                let line = cycle.iter().find_map(|n| lines.get(n).copied());
                return Err(PolicyError {
                    path: None,
                    line,
                    message: format!(
                        "rules refer to each other in a loop: {}",
                        cycle.join(" -> ")
                    ),
                });
            }
        }
        Ok(())
    }

    /// The effective rules, by name.
    pub fn rules(&self) -> impl Iterator<Item = &Rule> {
        self.rules.values()
    }

    /// The policy file the overrides came from.
    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    /// The effective policy as a policy file: loading it gives the same rules.
    pub fn render(&self) -> String {
        let mut out = String::new();
        match &self.path {
            Some(path) => out.push_str(&format!(
                "# Effective policy: Blazar's defaults overridden by {}.\n",
                path.display()
            )),
            None => out.push_str("# Effective policy: Blazar's defaults.\n"),
        }
        for rule in self.rules.values() {
            out.push_str(&format!(
                "{}: {}",
                quote(&rule.name),
                quote(&rule.check_str)
            ));
            if let Origin::File { line } = rule.origin {
                let default = DEFAULT_RULES
                    .iter()
                    .find(|(name, _)| *name == rule.name)
                    .map(|(_, check)| format!(" (default: {})", quote(check)))
                    .unwrap_or_else(|| " (not one of Blazar's rules: an alias)".into());
                out.push_str(&format!("  # from line {line}{default}"));
            }
            out.push('\n');
        }
        out
    }

    fn eval(&self, check: &Check, creds: &Credentials<'_>, target: &Target<'_>) -> bool {
        match check {
            Check::Always(b) => *b,
            Check::Rule(name) => self
                .rules
                .get(name)
                .is_some_and(|rule| self.eval(&rule.check, creds, target)),
            Check::Role(template) => creds
                .roles
                .contains(&template.render(target).to_lowercase()),
            Check::Compare(credential, template) => {
                let wanted = template.render(target);
                match credential {
                    Credential::UserId => creds.identity.user_id == wanted,
                    Credential::ProjectId => creds.identity.project_id == wanted,
                    Credential::IsAdmin => {
                        (if creds.is_admin { "True" } else { "False" }) == wanted
                    }
                }
            }
            Check::Not(inner) => !self.eval(inner, creds, target),
            Check::And(items) => items.iter().all(|c| self.eval(c, creds, target)),
            Check::Or(items) => items.iter().any(|c| self.eval(c, creds, target)),
        }
    }
}

impl Authorizer for Policy {
    fn allows(&self, rule: &str, caller: &Identity, target: &Target<'_>) -> bool {
        let creds = Credentials::of(caller);
        let allowed = match self.rules.get(rule) {
            Some(r) => self.eval(&r.check, &creds, target),
            None if INVENTORY_PREFIXES.iter().any(|p| rule.starts_with(p)) => {
                if let Ok(mut reported) = self.reported.lock()
                    && reported.insert(rule.to_string())
                {
                    tracing::warn!(
                        policy.rule = rule,
                        "no policy rule is registered for this action; the admin rule decides"
                    );
                }
                self.allows("admin", caller, target)
            }
            None => {
                tracing::error!(policy.rule = rule, "no policy rule has this name; denied");
                false
            }
        };
        tracing::debug!(
            policy.rule = rule,
            user.id = %caller.user_id,
            project.id = %caller.project_id,
            allowed,
            "policy check"
        );
        allowed
    }
}

/// A YAML double-quoted scalar.
fn quote(text: &str) -> String {
    let mut out = String::from("\"");
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

fn yaml_error(mark: Marker, message: impl Into<String>) -> PolicyError {
    PolicyError {
        path: None,
        line: Some(mark.line()),
        message: message.into(),
    }
}

/// Reads a policy document: one mapping from rule names to check strings, each with its line.
fn read_overrides(text: &str) -> Result<Vec<Override>, PolicyError> {
    let mut parser = Parser::new_from_str(text);
    let mut next = || {
        parser.next_token().map_err(|e| PolicyError {
            path: None,
            line: Some(e.marker().line()),
            message: format!("not valid YAML: {}", e.info()),
        })
    };
    let mut overrides: Vec<Override> = Vec::new();
    let mut depth_seen_document = false;
    loop {
        let (event, mark) = next()?;
        match event {
            Event::StreamStart | Event::DocumentEnd => {}
            Event::StreamEnd => return Ok(overrides),
            Event::DocumentStart => {
                if depth_seen_document {
                    return Err(yaml_error(mark, "a policy file holds one YAML document"));
                }
                depth_seen_document = true;
            }
            Event::Scalar(value, style, _, _)
                if style == TScalarStyle::Plain && is_null(&value) =>
            {
                // An empty document (only comments): no overrides.
            }
            Event::MappingStart(..) => loop {
                let (key_event, key_mark) = next()?;
                let name = match key_event {
                    Event::MappingEnd => break,
                    Event::Scalar(name, _, _, _) => name,
                    _ => {
                        return Err(yaml_error(key_mark, "rule names must be strings"));
                    }
                };
                // Errors about a value name the line of its rule.
                let (value_event, _) = next()?;
                let check_str = match value_event {
                    Event::Scalar(value, style, _, _)
                        if style == TScalarStyle::Plain && is_null(&value) =>
                    {
                        return Err(yaml_error(
                            key_mark,
                            format!(
                                "rule '{name}' has no check string (write \"@\" to allow \
                                 everyone, \"!\" to allow no one)"
                            ),
                        ));
                    }
                    Event::Scalar(value, _, _, _) => value,
                    Event::SequenceStart(..) => {
                        return Err(yaml_error(
                            key_mark,
                            format!(
                                "rule '{name}': the list syntax is not supported; write a \
                                 check string such as \"role:admin or role:member\""
                            ),
                        ));
                    }
                    _ => {
                        return Err(yaml_error(
                            key_mark,
                            format!("rule '{name}': the check must be a string"),
                        ));
                    }
                };
                if let Some(first) = overrides.iter().find(|o| o.name == name) {
                    return Err(yaml_error(
                        key_mark,
                        format!(
                            "rule '{name}' is defined twice (first at line {})",
                            first.line
                        ),
                    ));
                }
                overrides.push(Override {
                    name,
                    check_str,
                    line: key_mark.line(),
                });
            },
            Event::Alias(_) => return Err(yaml_error(mark, "YAML aliases are not supported")),
            _ => {
                return Err(yaml_error(
                    mark,
                    "a policy file is a mapping of rule names to check strings",
                ));
            }
        }
    }
}

fn is_null(value: &str) -> bool {
    matches!(value, "" | "~" | "null" | "Null" | "NULL")
}

#[cfg(test)]
mod tests {
    use super::*;
    use blazar_service::DefaultPolicy;

    fn who(project: &str, user: &str, roles: &[&str]) -> Identity {
        Identity {
            user_id: user.into(),
            project_id: project.into(),
            roles: roles.iter().map(|r| r.to_string()).collect(),
        }
    }

    const MINE: Target<'static> = Target {
        project_id: "p1",
        user_id: "u1",
    };
    const THEIRS: Target<'static> = Target {
        project_id: "p2",
        user_id: "u2",
    };

    #[test]
    fn every_default_rule_parses() {
        for (name, check) in DEFAULT_RULES {
            assert!(parse_check_str(check).is_ok(), "{name}: {check}");
        }
        // And the defaults pass the file checks (references, loops).
        Policy::from_yaml("").unwrap();
    }

    /// The engine with no file decides exactly as the service's built-in `DefaultPolicy`.
    #[test]
    fn defaults_match_the_services_default_policy() {
        let engine = Policy::defaults();
        let mut names: Vec<&str> = DEFAULT_RULES.iter().map(|(n, _)| *n).collect();
        names.extend(["blazar:oshosts:future_action", "blazar:unknown", "nothing"]);
        let callers = [
            who("p1", "u1", &[]),
            who("p1", "u1", &["reader"]),
            who("p1", "u1", &["member"]),
            who("p1", "u1", &["admin"]),
            who("p2", "u2", &["member"]),
            who("p2", "u2", &["Admin"]),
            who("p1", "u1", &["other"]),
        ];
        for name in names {
            // The service never asks about Blazar's base rules other than `admin`.
            if !name.starts_with("blazar:") && name != "admin" && name != "nothing" {
                continue;
            }
            for caller in &callers {
                for target in [&MINE, &THEIRS] {
                    assert_eq!(
                        engine.allows(name, caller, target),
                        DefaultPolicy.allows(name, caller, target),
                        "{name} {caller:?} {target:?}"
                    );
                }
            }
        }
    }

    #[test]
    fn check_strings_evaluate_like_oslo_policy() {
        let rows: &[(&str, &[&str], &Target, bool)] = &[
            ("@", &[], &MINE, true),
            ("!", &["admin"], &MINE, false),
            ("", &[], &MINE, true),
            ("role:member", &["member"], &MINE, true),
            ("role:MEMBER", &["member"], &MINE, true),
            ("role:member", &["Member"], &MINE, true),
            ("role:member", &["admin"], &MINE, true),
            ("role:admin", &["member"], &MINE, false),
            ("role:reader", &["member"], &MINE, true),
            ("project_id:%(project_id)s", &[], &MINE, true),
            ("project_id:%(project_id)s", &[], &THEIRS, false),
            ("user_id:%(user_id)s", &[], &MINE, true),
            ("user_id:%(user_id)s", &[], &THEIRS, false),
            ("project_id:p1", &[], &THEIRS, true),
            ("is_admin:True", &["admin"], &MINE, true),
            ("is_admin:True", &["member"], &MINE, false),
            ("is_admin:False", &["member"], &MINE, true),
            ("not role:admin", &["member"], &MINE, true),
            ("not not role:admin", &["member"], &MINE, false),
            ("role:a or role:b and role:c", &["a"], &MINE, true),
            ("role:a or role:b and role:c", &["b"], &MINE, false),
            ("(role:a or role:b) and role:c", &["a"], &MINE, false),
            ("(role:a or role:b) and role:c", &["b", "c"], &MINE, true),
            ("((role:a))", &["a"], &MINE, true),
            ("not role:a and role:b", &["b"], &MINE, true),
            ("not (role:a and role:b)", &["a", "b"], &MINE, false),
            ("role:a AND role:b", &["a", "b"], &MINE, true),
            ("rule:admin", &["admin"], &THEIRS, true),
            ("rule:project_member_api", &["member"], &THEIRS, false),
            ("rule:project_member_api", &["member"], &MINE, true),
            ("rule:project_reader_api", &["member"], &MINE, true),
            ("role:%(project_id)s", &["p1"], &MINE, true),
            ("project_id:pre-%(project_id)s", &[], &MINE, false),
            ("@ and !", &[], &MINE, false),
            ("@ or !", &[], &MINE, true),
        ];
        let policy = Policy::defaults();
        for (text, roles, target, expected) in rows {
            let check = parse_check_str(text).unwrap_or_else(|e| panic!("{text}: {e}"));
            let caller = who("p1", "u1", roles);
            let creds = Credentials::of(&caller);
            assert_eq!(
                policy.eval(&check, &creds, target),
                *expected,
                "{text} with {roles:?} on {target:?}"
            );
        }
    }

    #[test]
    fn malformed_check_strings_are_refused() {
        let rows: &[(&str, &str)] = &[
            ("role:admin and", "missing at the end"),
            ("and role:admin", "needs a check"),
            ("role:admin or or role:b", "needs a check"),
            ("(role:admin", "not closed"),
            ("role:admin)", "unexpected ')'"),
            ("role:admin role:member", "joined by 'and' or 'or'"),
            ("admin", "is not a check"),
            ("role:", "no value"),
            (
                "domain_id:%(domain_id)s",
                "unsupported check kind 'domain_id'",
            ),
            ("http://example.com/check", "unsupported check kind 'http'"),
            ("project_id:%(domain_id)s", "the target has no 'domain_id'"),
            ("project_id:%(project_id)d", "must start %(project_id)s"),
            ("is_admin:true", "True or False"),
            ("'member':%(role.name)s", "quoted strings"),
            ("   ", "blank"),
            ("not", "missing at the end"),
            ("()", "unexpected ')'"),
            // oslo.policy only splits on whitespace, so ")and" stays inside a check.
            ("(role:a or role:b)and role:c", "not closed"),
        ];
        for (text, expected) in rows {
            let err = parse_check_str(text).expect_err(text);
            assert!(err.contains(expected), "{text}: {err}");
        }
    }

    #[test]
    fn a_file_overrides_rules_and_may_define_aliases() {
        let policy = Policy::from_yaml(
            "# operators' rules\n\
             \"blazar:leases:post\": \"rule:admin\"\n\
             blazar:leases:get: 'rule:ops or rule:project_reader_or_admin'\n\
             ops: role:operator\n",
        )
        .unwrap();
        let member = who("p1", "u1", &["member"]);
        let operator = who("p9", "u9", &["operator"]);
        assert!(!policy.allows("blazar:leases:post", &member, &MINE));
        assert!(policy.allows("blazar:leases:get", &operator, &THEIRS));
        assert!(policy.allows("blazar:leases:get", &member, &MINE));
        assert!(!policy.allows("blazar:leases:get", &member, &THEIRS));
        // Untouched rules keep their defaults.
        assert!(policy.allows("blazar:leases:delete", &member, &MINE));
        let post = policy
            .rules()
            .find(|r| r.name == "blazar:leases:post")
            .unwrap();
        assert_eq!(post.origin, Origin::File { line: 2 });
        // Base rules can be overridden too, and every rule using them follows.
        let policy = Policy::from_yaml("admin: role:superuser\n").unwrap();
        assert!(!policy.allows("blazar:oshosts:get", &who("p1", "u1", &["admin"]), &MINE));
        assert!(policy.allows(
            "blazar:oshosts:get",
            &who("p1", "u1", &["superuser"]),
            &MINE
        ));
    }

    /// Every rule the service asks for on a pool inventory is registered, so `policy show`
    /// lists it and an operator's file can override it by name.
    #[test]
    fn every_inventory_rule_the_service_asks_for_is_registered() {
        let actions = [
            "get",
            "post",
            "put",
            "delete",
            "get_allocations",
            "get_resource_properties",
            "update_resource_properties",
        ];
        for spec in [
            &blazar_service::FLOATINGIPS,
            &blazar_service::NETWORKS,
            &blazar_service::DEVICES,
        ] {
            for action in actions {
                let rule = format!("{}:{action}", spec.rules);
                assert!(
                    DEFAULT_RULES.iter().any(|(name, _)| *name == rule),
                    "{rule} is not registered"
                );
            }
        }
    }

    #[test]
    fn json_policy_files_load_too() {
        let policy =
            Policy::from_yaml("{\n  \"blazar:oshosts:get\": \"role:reader\"\n}\n").unwrap();
        assert!(policy.allows("blazar:oshosts:get", &who("p1", "u1", &["reader"]), &MINE));
    }

    #[test]
    fn malformed_files_are_refused_naming_the_line() {
        let rows: &[(&str, usize, &str)] = &[
            (
                "admin: role:admin\nblazar:leases:get: role:admin and\n",
                2,
                "cannot read",
            ),
            (
                "admin: role:admin\n\nblazar:lease:get: role:admin\n",
                3,
                "unknown rule name 'blazar:lease:get'",
            ),
            ("blazar:leases:get: \"role:a\n", 1, "not valid YAML"),
            (
                "blazar:leases:get: rule:nope\n",
                1,
                "rule:nope, which is not defined",
            ),
            ("x: 1\n- y\n", 2, "not valid YAML"),
            ("- role:admin\n", 1, "mapping of rule names"),
            ("blazar:leases:get:\n", 1, "has no check string"),
            ("blazar:leases:get: [role:admin]\n", 1, "list syntax"),
            (
                "blazar:leases:get: role:a\nblazar:leases:get: role:b\n",
                2,
                "defined twice (first at line 1)",
            ),
            (
                "admin: rule:x\nx: rule:y\ny: rule:admin\n",
                1,
                "loop: admin -> x -> y -> admin",
            ),
            ("blazar:leases:get: {a: b}\n", 1, "must be a string"),
            (
                "blazar:leases:get: role:a\n---\nadmin: role:a\n",
                2,
                "one YAML document",
            ),
        ];
        for (text, line, expected) in rows {
            let err = Policy::from_yaml(text).expect_err(text);
            assert_eq!(err.line, Some(*line), "{text}: {err}");
            assert!(err.message.contains(expected), "{text}: {err}");
        }
    }

    #[test]
    fn empty_and_comment_only_files_keep_the_defaults() {
        for text in ["", "# nothing here\n", "---\n", "{}\n"] {
            let policy = Policy::from_yaml(text).unwrap();
            assert!(
                policy.rules().all(|r| r.origin == Origin::Default),
                "{text}"
            );
        }
    }

    #[test]
    fn the_rendered_policy_loads_back_to_the_same_rules() {
        let policy = Policy::from_yaml(
            "blazar:leases:post: rule:admin\nops: role:operator\nblazar:leases:get: rule:ops\n",
        )
        .unwrap();
        let text = policy.render();
        assert!(text.contains("\"blazar:leases:post\": \"rule:admin\"  # from line 1 (default: \"rule:project_member_or_admin\")"), "{text}");
        let again = Policy::from_yaml(&text).unwrap();
        let pairs = |p: &Policy| -> Vec<(String, String)> {
            p.rules()
                .map(|r| (r.name.clone(), r.check_str.clone()))
                .collect()
        };
        assert_eq!(pairs(&policy), pairs(&again));
    }
}
