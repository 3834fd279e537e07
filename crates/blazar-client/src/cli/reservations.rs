//! `--reservation k=v,...` and `--physical-reservation min=..,max=..,...` as
//! python-blazarclient 4.6 reads them: the same splitting (values may contain commas),
//! int-like values as JSON integers, JSON lists decoded, and per-type defaults added.

use clap::Args;
use serde_json::{Map, Value};

use super::{CliResult, Failure};

/// The defaults python-blazarclient adds for each resource type (`None`: nothing added).
fn defaults(resource_type: &str) -> Option<Vec<(&'static str, Option<Value>)>> {
    let text = |s: &str| Some(Value::String(s.to_string()));
    Some(match resource_type {
        "physical:host" => vec![
            ("min", text("")),
            ("max", text("")),
            ("hypervisor_properties", text("")),
            ("resource_properties", text("")),
            ("before_end", None),
            ("resource_type", text("physical:host")),
        ],
        "virtual:floatingip" => vec![
            ("amount", Some(Value::from(1))),
            ("network_id", None),
            ("required_floatingips", Some(Value::Array(Vec::new()))),
            ("resource_type", text("virtual:floatingip")),
        ],
        "virtual:instance" => vec![
            ("vcpus", text("")),
            ("memory_mb", text("")),
            ("disk_gb", text("")),
            ("amount", text("")),
            ("affinity", text("None")),
            ("resource_properties", text("")),
            ("resource_type", text("virtual:instance")),
        ],
        "flavor:instance" => vec![
            ("flavor_id", text("")),
            ("amount", text("")),
            ("affinity", text("None")),
            ("resource_type", text("flavor:instance")),
        ],
        _ => return None,
    })
}

/// The type whose defaults apply: python-blazarclient looks for the type's name anywhere
/// in the argument, in this order.
fn detect_type(argument: &str) -> Option<&'static str> {
    [
        "physical:host",
        "virtual:instance",
        "virtual:floatingip",
        "flavor:instance",
    ]
    .into_iter()
    .find(|t| argument.contains(t))
}

/// oslo's `is_int_like`: `str(int(v)) == v`.
pub fn is_int_like(value: &str) -> Option<i64> {
    value.parse::<i64>().ok().filter(|i| i.to_string() == value)
}

/// Splits `head,key=value` at the last `,key=` with a known key (or, with `keys` `None`,
/// any key), as the regex `^(?:(.*),)?(KEYS)=(.*)$` does.
fn split_last<'a>(
    text: &'a str,
    keys: Option<&[&str]>,
) -> Option<(Option<&'a str>, &'a str, &'a str)> {
    let try_at = |rest: &'a str| -> Option<(&'a str, &'a str)> {
        match keys {
            Some(keys) => keys.iter().find_map(|key| {
                rest.strip_prefix(key)
                    .and_then(|r| r.strip_prefix('='))
                    .map(|value| (&rest[..key.len()], value))
            }),
            // `(.*)=(.*)`: the key runs to the last `=`.
            None => rest.rfind('=').map(|at| (&rest[..at], &rest[at + 1..])),
        }
    };
    for (comma, _) in text
        .match_indices(',')
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
    {
        if let Some((key, value)) = try_at(&text[comma + 1..]) {
            return Some((Some(&text[..comma]), key, value));
        }
    }
    try_at(text).map(|(key, value)| (None, key, value))
}

fn decode_list(argument: &str, key: &str, value: &str) -> CliResult<Value> {
    serde_json::from_str(value).map_err(|e| {
        Failure::plain(format!(
            "Invalid reservation argument '{argument}': {key} must be a JSON list such as \
             [\"172.24.4.200\"] ({e})"
        ))
    })
}

/// One `--reservation` of `lease-create`.
pub fn parse_create(argument: &str) -> CliResult<Map<String, Value>> {
    let err_msg = format!(
        "Invalid reservation argument '{argument}'. Reservation arguments must be of the form \
         --reservation <key=value>"
    );
    let defaults = detect_type(argument).and_then(defaults);
    parse_with_defaults(argument, defaults.as_deref(), &err_msg)
}

fn parse_with_defaults(
    argument: &str,
    defaults: Option<&[(&'static str, Option<Value>)]>,
    err_msg: &str,
) -> CliResult<Map<String, Value>> {
    let keys: Option<Vec<&str>> = defaults.map(|d| d.iter().map(|(k, _)| *k).collect());
    let mut params = Map::new();
    let mut rest = argument;
    while !rest.is_empty() {
        let Some((head, key, value)) = split_last(rest, keys.as_deref()) else {
            let known = keys
                .as_ref()
                .map(|k| format!(" (keys: {})", k.join(", ")))
                .unwrap_or_default();
            return Err(Failure::plain(format!("{err_msg}{known}")));
        };
        if params.contains_key(key) {
            return Err(Failure::plain(format!("{err_msg}: {key} is given twice")));
        }
        let is_list = defaults.is_some_and(|d| {
            d.iter()
                .any(|(k, v)| *k == key && matches!(v, Some(Value::Array(_))))
        });
        let parsed = if let Some(int) = is_int_like(value) {
            Value::from(int)
        } else if is_list {
            decode_list(argument, key, value)?
        } else {
            Value::String(value.to_string())
        };
        params.insert(key.to_string(), parsed);
        rest = head.unwrap_or("");
    }
    for (key, default) in defaults.unwrap_or(&[]) {
        if let Some(default) = default
            && !params.contains_key(*key)
        {
            params.insert((*key).to_string(), default.clone());
        }
    }
    Ok(params)
}

/// The reservations of a lease request, as lease-create (with Blazar's help texts) and
/// lease-offers take them.
#[derive(Debug, Args)]
pub struct RequestArgs {
    /// Create a reservation for physical compute hosts. Specify option multiple times to
    /// create multiple reservations. min: minimum number of hosts to reserve. max: maximum
    /// number of hosts to reserve. hypervisor_properties: JSON string, see doc.
    /// resource_properties: JSON string, see doc. before_end: JSON string, see doc
    #[arg(
        long = "physical-reservation",
        value_name = "min=INT,max=INT,hypervisor_properties=STR,resource_properties=STR,before_end=STR"
    )]
    physical_reservations: Vec<String>,
    /// Key/value pairs for creating a generic reservation. Specify option multiple times to
    /// create multiple reservations
    #[arg(long = "reservation", value_name = "KEY=VALUE,...")]
    reservations: Vec<String>,
}

impl RequestArgs {
    /// Every `--physical-reservation`, then every `--reservation`, as request objects: what
    /// lease-create, lease-create --earliest and lease-offers send.
    pub fn parse(&self) -> CliResult<Vec<Map<String, Value>>> {
        let (physical, generic) = (&self.physical_reservations, &self.reservations);
        let mut reservations = Vec::with_capacity(physical.len() + generic.len());
        for argument in physical {
            reservations.push(parse_physical(argument)?);
        }
        for argument in generic {
            reservations.push(parse_create(argument)?);
        }
        Ok(reservations)
    }
}

/// One `--physical-reservation` of `lease-create`, checked as python-blazarclient checks
/// it.
pub fn parse_physical(argument: &str) -> CliResult<Map<String, Value>> {
    let err_msg = format!(
        "Invalid physical-reservation argument '{argument}'. Reservation arguments must be of \
         the form --physical-reservation <min=int,max=int,hypervisor_properties=str,\
         resource_properties=str,before_end=str>"
    );
    let defaults = defaults("physical:host").unwrap_or_default();
    let mut params = parse_with_defaults(argument, Some(&defaults), &err_msg)?;
    let count = |key: &str| params.get(key).and_then(Value::as_i64);
    let (Some(min), Some(max)) = (count("min"), count("max")) else {
        return Err(Failure::plain(format!(
            "{err_msg}; min and max must be whole numbers, e.g. min=1,max=2"
        )));
    };
    if min == 0 || max == 0 {
        return Err(Failure::plain(format!(
            "Invalid physical-reservation argument '{argument}'. Reservation arguments min and \
             max values must be greater than or equal to 1"
        )));
    }
    if min > max {
        return Err(Failure::plain(format!(
            "Invalid physical-reservation argument '{argument}'. Reservation argument min value \
             must be less than max value"
        )));
    }
    params.insert(
        "resource_type".into(),
        Value::String("physical:host".into()),
    );
    Ok(params)
}

/// The keys `lease-update --reservation` accepts.
const UPDATE_KEYS: &[&str] = &[
    "id",
    "min",
    "max",
    "hypervisor_properties",
    "resource_properties",
    "vcpus",
    "memory_mb",
    "disk_gb",
    "amount",
    "affinity",
    "network_id",
    "required_floatingips",
];

/// One `--reservation id=...,k=v` of `lease-update`.
pub fn parse_update(argument: &str) -> CliResult<Map<String, Value>> {
    let mut params = Map::new();
    let mut rest = argument;
    // As python-blazarclient: text before the first known key is ignored.
    while let Some((head, key, value)) = split_last(rest, Some(UPDATE_KEYS)) {
        let parsed = if key == "required_floatingips" {
            decode_list(argument, key, value)?
        } else if let Some(int) = is_int_like(value) {
            Value::from(int)
        } else {
            Value::String(value.to_string())
        };
        params.insert(key.to_string(), parsed);
        match head {
            Some(head) => rest = head,
            None => break,
        }
    }
    if params.is_empty() {
        return Err(Failure::plain(format!(
            "Invalid reservation argument '{argument}'. Reservation arguments must be of the form \
             --reservation <key=value> (keys: {})",
            UPDATE_KEYS.join(", ")
        )));
    }
    if !params.contains_key("id") {
        return Err(Failure::plain(
            "The key-value pair id=<reservation_id> is required for the --reservation argument; \
             `blazar lease-show LEASE -c reservations` shows the reservation ids",
        ));
    }
    Ok(params)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn keys(map: &Map<String, Value>) -> Vec<&str> {
        map.keys().map(String::as_str).collect()
    }

    #[test]
    fn physical_reservation_like_python() {
        let parsed = parse_physical(
            r#"min=1,max=2,hypervisor_properties=[">=", "$memory_mb", "32768"],resource_properties=["==", "$gpu", "true"]"#,
        )
        .unwrap();
        assert_eq!(
            Value::Object(parsed.clone()),
            json!({
                "resource_properties": "[\"==\", \"$gpu\", \"true\"]",
                "hypervisor_properties": "[\">=\", \"$memory_mb\", \"32768\"]",
                "max": 2, "min": 1, "resource_type": "physical:host"
            })
        );
        // Python's dict order: parsed from the end, then the defaults.
        assert_eq!(
            keys(&parsed),
            [
                "resource_properties",
                "hypervisor_properties",
                "max",
                "min",
                "resource_type"
            ]
        );
        let defaults = parse_physical("min=1,max=1").unwrap();
        assert_eq!(
            keys(&defaults),
            [
                "max",
                "min",
                "hypervisor_properties",
                "resource_properties",
                "resource_type"
            ]
        );
        for (bad, fragment) in [
            ("min=2,max=1", "min value must be less than max value"),
            ("min=0,max=1", "greater than or equal to 1"),
            ("max=1", "must be whole numbers"),
            ("min=a,max=1", "must be whole numbers"),
            ("nope", "Invalid physical-reservation argument 'nope'"),
            ("min=1,min=1,max=1", "min is given twice"),
        ] {
            let error = parse_physical(bad).unwrap_err().message;
            assert!(error.contains(fragment), "{bad}: {error}");
        }
    }

    #[test]
    fn generic_reservations_get_their_type_defaults() {
        let fip = parse_create(
            r#"resource_type=virtual:floatingip,network_id=2b1a,amount=1,required_floatingips=["172.24.4.201"]"#,
        )
        .unwrap();
        assert_eq!(
            Value::Object(fip),
            json!({"required_floatingips": ["172.24.4.201"], "amount": 1, "network_id": "2b1a", "resource_type": "virtual:floatingip"})
        );
        let host = parse_create("resource_type=physical:host,min=1,max=01").unwrap();
        assert_eq!(host["max"], json!("01"));
        assert_eq!(host["hypervisor_properties"], json!(""));
        let other = parse_create("resource_type=network,network_name=net-1,a=b=c").unwrap();
        assert_eq!(
            Value::Object(other),
            json!({"a=b": "c", "network_name": "net-1", "resource_type": "network"})
        );
        let error =
            parse_create("resource_type=virtual:floatingip,required_floatingips=[x").unwrap_err();
        assert!(
            error.message.contains("must be a JSON list"),
            "{}",
            error.message
        );
    }

    #[test]
    fn update_reservations() {
        let parsed =
            parse_update("id=2852eded,max=1,resource_properties=[\"==\", \"$a\", \"b,c\"]")
                .unwrap();
        assert_eq!(
            Value::Object(parsed),
            json!({"resource_properties": "[\"==\", \"$a\", \"b,c\"]", "max": 1, "id": "2852eded"})
        );
        assert!(
            parse_update("max=1")
                .unwrap_err()
                .message
                .contains("id=<reservation_id>")
        );
        assert!(parse_update("nothing").is_err());
    }
}
