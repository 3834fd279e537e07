//! The property query language of `hypervisor_properties` and `resource_properties`.
//!
//! Blazar's syntax is JSON text: `""`/`"[]"` (no constraint), `[op, "$key", "value"]`, or
//! `["and", cond, ...]`. blazar-rs adds `["or", cond, ...]`, nests `and`/`or` at any depth
//! (Blazar silently truncates a nested `and`), accepts unquoted JSON numbers as values, and
//! compares two numeric operands as numbers (Blazar compares capabilities as strings, so
//! `"10" < "9"`).

use std::cmp::Ordering;
use std::fmt;

use serde_json::Value;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Eq,
    Ne,
    Ge,
    Le,
    Gt,
    Lt,
}

impl Op {
    fn parse(s: &str) -> Option<Op> {
        Some(match s {
            "==" | "=" => Op::Eq,
            "!=" => Op::Ne,
            ">=" => Op::Ge,
            "<=" => Op::Le,
            ">" => Op::Gt,
            "<" => Op::Lt,
            _ => return None,
        })
    }

    fn holds(self, ord: Ordering) -> bool {
        match self {
            Op::Eq => ord == Ordering::Equal,
            Op::Ne => ord != Ordering::Equal,
            Op::Ge => ord != Ordering::Less,
            Op::Le => ord != Ordering::Greater,
            Op::Gt => ord == Ordering::Greater,
            Op::Lt => ord == Ordering::Less,
        }
    }
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Op::Eq => "==",
            Op::Ne => "!=",
            Op::Ge => ">=",
            Op::Le => "<=",
            Op::Gt => ">",
            Op::Lt => "<",
        })
    }
}

/// A parsed query. `None` from [`PropertyQuery::parse`] means "no constraint".
#[derive(Debug, Clone, PartialEq)]
pub enum PropertyQuery {
    Cond { op: Op, key: String, value: String },
    And(Vec<PropertyQuery>),
    Or(Vec<PropertyQuery>),
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{reason}")]
pub struct QueryError {
    pub reason: String,
}

fn malformed(reason: impl Into<String>) -> QueryError {
    QueryError {
        reason: reason.into(),
    }
}

impl PropertyQuery {
    /// Parses a query string as sent in a reservation request.
    pub fn parse(text: &str) -> Result<Option<PropertyQuery>, QueryError> {
        let text = text.trim();
        if text.is_empty() {
            return Ok(None);
        }
        let value: Value = serde_json::from_str(text)
            .map_err(|e| malformed(format!("the query is not valid JSON ({e})")))?;
        match &value {
            Value::Array(items) if items.is_empty() => Ok(None),
            _ => Self::from_value(&value).map(Some),
        }
    }

    fn from_value(value: &Value) -> Result<PropertyQuery, QueryError> {
        let Value::Array(items) = value else {
            return Err(malformed(format!(
                "expected a JSON list such as [\"==\", \"$key\", \"value\"], got {value}"
            )));
        };
        let Some(Value::String(head)) = items.first() else {
            return Err(malformed(format!(
                "a query list must start with an operator (==, !=, >=, <=, >, <, and, or), got {value}"
            )));
        };
        match head.as_str() {
            "and" | "or" => {
                if items.len() < 2 {
                    return Err(malformed(format!(
                        "\"{head}\" needs at least one condition"
                    )));
                }
                let parts = items[1..]
                    .iter()
                    .map(Self::from_value)
                    .collect::<Result<Vec<_>, _>>()?;
                Ok(if head == "and" {
                    PropertyQuery::And(parts)
                } else {
                    PropertyQuery::Or(parts)
                })
            }
            op_text => {
                let op = Op::parse(op_text).ok_or_else(|| {
                    malformed(format!(
                        "unknown operator {op_text:?}; use one of ==, !=, >=, <=, >, <, and, or"
                    ))
                })?;
                if items.len() != 3 {
                    return Err(malformed(format!(
                        "a condition has exactly three items [op, \"$key\", \"value\"], got {value}"
                    )));
                }
                let key = match &items[1] {
                    Value::String(k) if k.len() > 1 && k.starts_with('$') => k[1..].to_string(),
                    other => {
                        return Err(malformed(format!(
                            "a property name starts with '$' (like \"$gpu\"), got {other}"
                        )));
                    }
                };
                let value = match &items[2] {
                    Value::String(v) if !v.is_empty() => v.clone(),
                    Value::Number(n) => n.to_string(),
                    Value::Bool(b) => b.to_string(),
                    other => {
                        return Err(malformed(format!(
                            "the value compared with ${key} must be a non-empty string, a number or a boolean, got {other}"
                        )));
                    }
                };
                Ok(PropertyQuery::Cond { op, key, value })
            }
        }
    }

    /// Every property name the query refers to (without the `$`).
    pub fn keys(&self) -> Vec<&str> {
        let mut out = Vec::new();
        self.collect_keys(&mut out);
        out
    }

    fn collect_keys<'a>(&'a self, out: &mut Vec<&'a str>) {
        match self {
            PropertyQuery::Cond { key, .. } => out.push(key),
            PropertyQuery::And(parts) | PropertyQuery::Or(parts) => {
                for p in parts {
                    p.collect_keys(out);
                }
            }
        }
    }

    /// Evaluates the query against a resource; `lookup` returns the value of a property, or
    /// `None` when the resource lacks it (a condition on a missing property is false).
    pub fn matches<'v>(&self, lookup: &impl Fn(&str) -> Option<std::borrow::Cow<'v, str>>) -> bool {
        match self {
            PropertyQuery::Cond { op, key, value } => match lookup(key) {
                Some(actual) => op.holds(compare(&actual, value)),
                None => false,
            },
            PropertyQuery::And(parts) => parts.iter().all(|p| p.matches(lookup)),
            PropertyQuery::Or(parts) => parts.iter().any(|p| p.matches(lookup)),
        }
    }
}

/// Numbers compare as numbers, everything else as strings.
fn compare(actual: &str, expected: &str) -> Ordering {
    match (actual.trim().parse::<f64>(), expected.trim().parse::<f64>()) {
        (Ok(a), Ok(b)) if a.is_finite() && b.is_finite() => {
            a.partial_cmp(&b).unwrap_or(Ordering::Equal)
        }
        _ => actual.cmp(expected),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::borrow::Cow;
    use std::collections::HashMap;

    fn host(props: &[(&str, &str)]) -> HashMap<String, String> {
        props
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn check(query: &str, props: &[(&str, &str)], expected: bool) {
        let q = PropertyQuery::parse(query).unwrap().unwrap();
        let h = host(props);
        let lookup = |k: &str| h.get(k).map(|v| Cow::Owned(v.clone()));
        assert_eq!(q.matches(&lookup), expected, "{query} on {props:?}");
    }

    #[test]
    fn evaluation_table() {
        let big = [
            ("memory_mb", "65536"),
            ("gpu", "true"),
            ("rack", "r1"),
            ("cores", "10"),
        ];
        let small = [
            ("memory_mb", "16384"),
            ("gpu", "false"),
            ("rack", "r2"),
            ("cores", "9"),
        ];
        let rows: &[(&str, bool, bool)] = &[
            (r#"[">=", "$memory_mb", "32768"]"#, true, false),
            (r#"[">=", "$memory_mb", 32768]"#, true, false),
            (r#"["==", "$gpu", "true"]"#, true, false),
            (r#"["=", "$gpu", "true"]"#, true, false),
            (r#"["!=", "$gpu", "true"]"#, false, true),
            (r#"[">", "$cores", "9"]"#, true, false),
            (r#"["<", "$cores", "10"]"#, false, true),
            (r#"["<=", "$rack", "r1"]"#, true, false),
            (r#"["==", "$missing", "x"]"#, false, false),
            (r#"["!=", "$missing", "x"]"#, false, false),
            (
                r#"["and", ["==", "$gpu", "true"], ["==", "$rack", "r1"]]"#,
                true,
                false,
            ),
            (
                r#"["and", ["==", "$gpu", "true"], ["==", "$rack", "r2"]]"#,
                false,
                false,
            ),
            (
                r#"["or", ["==", "$rack", "r1"], ["==", "$rack", "r2"]]"#,
                true,
                true,
            ),
            (
                r#"["and", ["or", ["==", "$rack", "r1"], ["==", "$rack", "r2"]], ["and", ["<", "$cores", "100"], ["==", "$gpu", "false"]]]"#,
                false,
                true,
            ),
        ];
        for (query, on_big, on_small) in rows {
            check(query, &big, *on_big);
            check(query, &small, *on_small);
        }
    }

    #[test]
    fn empty_queries_mean_no_constraint() {
        assert_eq!(PropertyQuery::parse("").unwrap(), None);
        assert_eq!(PropertyQuery::parse("  ").unwrap(), None);
        assert_eq!(PropertyQuery::parse("[]").unwrap(), None);
    }

    #[test]
    fn malformed_queries_are_refused_with_a_reason() {
        let bad = [
            "not json",
            "{}",
            r#"["==", "$gpu"]"#,
            r#"["~", "$gpu", "x"]"#,
            r#"["==", "gpu", "x"]"#,
            r#"["==", "$", "x"]"#,
            r#"["==", "$gpu", ""]"#,
            r#"["and"]"#,
            r#"["and", "x"]"#,
            r#"[1, 2, 3]"#,
        ];
        for text in bad {
            let err = PropertyQuery::parse(text).unwrap_err();
            assert!(!err.reason.is_empty(), "{text}");
        }
    }

    #[test]
    fn keys_are_collected_from_every_level() {
        let q = PropertyQuery::parse(
            r#"["and", ["==", "$a", "1"], ["or", ["==", "$b", "2"], [">", "$c", "3"]]]"#,
        )
        .unwrap()
        .unwrap();
        assert_eq!(q.keys(), vec!["a", "b", "c"]);
    }
}
