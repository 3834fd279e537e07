//! Name-or-id arguments, resolved as python-blazarclient does: an argument shaped like an
//! id is used as is; anything else is looked up by name in the list, and must match once.

use serde_json::{Map, Value};

use super::{CliResult, Context, Failure};

/// What ids of a resource look like.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IdShape {
    /// A UUID (leases, networks, devices, flavors). Like the Python client's
    /// `re.match`, only the start of the argument must look like one.
    Uuid,
    /// Digits (Nova hypervisor ids, Blazar host ids), or a UUID: Blazar keeps the
    /// hypervisor's id, which is a UUID on recent Nova, where the Python client breaks.
    NumericOrUuid,
}

pub fn looks_like_uuid(text: &str) -> bool {
    let groups = [8, 4, 4, 4, 12];
    let mut rest = text;
    for (i, len) in groups.iter().enumerate() {
        if rest.len() < *len || !rest[..*len].bytes().all(|b| b.is_ascii_hexdigit()) {
            return false;
        }
        rest = &rest[*len..];
        if i < groups.len() - 1 {
            match rest.strip_prefix('-') {
                Some(r) => rest = r,
                None => return false,
            }
        }
    }
    true
}

pub fn looks_like_id(text: &str, shape: IdShape) -> bool {
    match shape {
        IdShape::Uuid => looks_like_uuid(text),
        IdShape::NumericOrUuid => {
            (!text.is_empty() && text.bytes().all(|b| b.is_ascii_digit())) || looks_like_uuid(text)
        }
    }
}

/// How to find one kind of object by name.
pub struct Lookup<'a> {
    /// The resource word of the Python client's messages (`lease`, `host`).
    pub resource: &'a str,
    /// `GET` path and envelope key of the list.
    pub list_path: &'a str,
    pub list_key: &'a str,
    /// The keys holding a name, tried in order (the first is the Python client's).
    pub name_keys: &'a [&'a str],
    pub shape: IdShape,
    /// The command that lists them, for the hint.
    pub list_command: &'a str,
}

/// The id for `name_or_id`.
pub async fn find_id(ctx: &Context, lookup: &Lookup<'_>, name_or_id: &str) -> CliResult<String> {
    if looks_like_id(name_or_id, lookup.shape) {
        return Ok(name_or_id.to_string());
    }
    let items: Vec<Map<String, Value>> = ctx.client.get(lookup.list_path, lookup.list_key).await?;
    let matches: Vec<String> = items
        .iter()
        .filter(|item| {
            lookup.name_keys.iter().any(|key| match item.get(*key) {
                Some(Value::String(s)) => s == name_or_id,
                Some(Value::Number(n)) => n.to_string() == name_or_id,
                _ => false,
            })
        })
        .filter_map(|item| match item.get("id") {
            Some(Value::String(s)) => Some(s.clone()),
            Some(Value::Number(n)) => Some(n.to_string()),
            _ => None,
        })
        .collect();
    match matches.as_slice() {
        [id] => Ok(id.clone()),
        [] => Err(Failure::plain(format!(
            "Unable to find resource with name '{name_or_id}'; `blazar {}` lists the existing ones",
            lookup.list_command
        ))),
        _ => Err(Failure::plain(format!(
            "There are more than one appropriate resources for the name '{name_or_id}' and type \
             '{}'; use the id instead (`blazar {}` shows them)",
            lookup.resource, lookup.list_command
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn id_shapes() {
        let uuid = "b0cf48be-bbac-42eb-990a-5c69948b066a";
        assert!(looks_like_id(uuid, IdShape::Uuid));
        assert!(looks_like_id(&format!("{uuid}-and-more"), IdShape::Uuid));
        assert!(!looks_like_id("lease-1", IdShape::Uuid));
        assert!(!looks_like_id("12", IdShape::Uuid));
        assert!(looks_like_id("12", IdShape::NumericOrUuid));
        assert!(looks_like_id(uuid, IdShape::NumericOrUuid));
        assert!(!looks_like_id("compute-1", IdShape::NumericOrUuid));
        assert!(!looks_like_id("", IdShape::NumericOrUuid));
    }
}
