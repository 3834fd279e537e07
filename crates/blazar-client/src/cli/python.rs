//! Python's view of values, because python-blazarclient's output is made of it: `str()`,
//! `repr()`, `json.dumps()` and `ast.literal_eval()` over JSON data, reproduced so that our
//! tables match the Python client's byte for byte.

use std::fmt::Write as _;

use serde_json::Value;

/// A Python value as the Python client holds it after decoding JSON (or after
/// `ast.literal_eval` of a string).
#[derive(Debug, Clone, PartialEq)]
pub enum Py {
    None,
    Bool(bool),
    Int(i128),
    Float(f64),
    Str(String),
    List(Vec<Py>),
    Tuple(Vec<Py>),
    Dict(Vec<(Py, Py)>),
}

impl From<&Value> for Py {
    fn from(value: &Value) -> Py {
        match value {
            Value::Null => Py::None,
            Value::Bool(b) => Py::Bool(*b),
            Value::Number(n) => match (n.as_i64(), n.as_u64(), n.as_f64()) {
                (Some(i), _, _) => Py::Int(i.into()),
                (None, Some(u), _) => Py::Int(u.into()),
                (None, None, Some(f)) => Py::Float(f),
                (None, None, None) => Py::Str(n.to_string()),
            },
            Value::String(s) => Py::Str(s.clone()),
            Value::Array(items) => Py::List(items.iter().map(Py::from).collect()),
            Value::Object(map) => Py::Dict(
                map.iter()
                    .map(|(k, v)| (Py::Str(k.clone()), Py::from(v)))
                    .collect(),
            ),
        }
    }
}

impl Py {
    /// `str(value)`.
    pub fn str(&self) -> String {
        match self {
            Py::Str(s) => s.clone(),
            other => other.repr(),
        }
    }

    /// `repr(value)`.
    pub fn repr(&self) -> String {
        let mut out = String::new();
        self.write_repr(&mut out);
        out
    }

    fn write_repr(&self, out: &mut String) {
        match self {
            Py::None => out.push_str("None"),
            Py::Bool(true) => out.push_str("True"),
            Py::Bool(false) => out.push_str("False"),
            Py::Int(i) => {
                let _ = write!(out, "{i}");
            }
            Py::Float(f) => out.push_str(&float_repr(*f)),
            Py::Str(s) => out.push_str(&str_repr(s)),
            Py::List(items) => {
                out.push('[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push_str(", ");
                    }
                    item.write_repr(out);
                }
                out.push(']');
            }
            Py::Tuple(items) => {
                out.push('(');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push_str(", ");
                    }
                    item.write_repr(out);
                }
                if items.len() == 1 {
                    out.push(',');
                }
                out.push(')');
            }
            Py::Dict(entries) => {
                out.push('{');
                for (i, (k, v)) in entries.iter().enumerate() {
                    if i > 0 {
                        out.push_str(", ");
                    }
                    k.write_repr(out);
                    out.push_str(": ");
                    v.write_repr(out);
                }
                out.push('}');
            }
        }
    }

    /// `json.dumps(value, indent=indent)` (with `ensure_ascii`, as oslo's jsonutils calls
    /// it). `None` when Python would raise `TypeError` (a key that is a tuple).
    pub fn json_dumps(&self, indent: Option<usize>) -> Option<String> {
        let mut out = String::new();
        self.write_json(&mut out, indent, 0)?;
        Some(out)
    }

    fn write_json(&self, out: &mut String, indent: Option<usize>, level: usize) -> Option<()> {
        let newline = |out: &mut String, level: usize| {
            if let Some(width) = indent {
                out.push('\n');
                out.push_str(&" ".repeat(width * level));
            }
        };
        let separator = if indent.is_some() { "," } else { ", " };
        match self {
            Py::None => out.push_str("null"),
            Py::Bool(true) => out.push_str("true"),
            Py::Bool(false) => out.push_str("false"),
            Py::Int(i) => {
                let _ = write!(out, "{i}");
            }
            Py::Float(f) => out.push_str(&json_float(*f)),
            Py::Str(s) => out.push_str(&json_string(s)),
            Py::List(items) | Py::Tuple(items) => {
                if items.is_empty() {
                    out.push_str("[]");
                    return Some(());
                }
                out.push('[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push_str(separator);
                    }
                    newline(out, level + 1);
                    item.write_json(out, indent, level + 1)?;
                }
                newline(out, level);
                out.push(']');
            }
            Py::Dict(entries) => {
                if entries.is_empty() {
                    out.push_str("{}");
                    return Some(());
                }
                out.push('{');
                for (i, (k, v)) in entries.iter().enumerate() {
                    if i > 0 {
                        out.push_str(separator);
                    }
                    newline(out, level + 1);
                    // json.dumps turns scalar keys into strings and refuses the others.
                    let key = match k {
                        Py::Str(s) => s.clone(),
                        Py::Int(i) => i.to_string(),
                        Py::Float(f) => json_float(*f),
                        Py::Bool(b) => b.to_string(),
                        Py::None => "null".to_string(),
                        _ => return None,
                    };
                    out.push_str(&json_string(&key));
                    out.push_str(": ");
                    v.write_json(out, indent, level + 1)?;
                }
                newline(out, level);
                out.push('}');
            }
        }
        Some(())
    }
}

/// Python's `repr(str)`: single quotes unless the text has one and no double quote.
pub fn str_repr(s: &str) -> String {
    let quote = if s.contains('\'') && !s.contains('"') {
        '"'
    } else {
        '\''
    };
    let mut out = String::with_capacity(s.len() + 2);
    out.push(quote);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c if (c as u32) < 0x20 || (0x7f..0xa0).contains(&(c as u32)) => {
                let _ = write!(out, "\\x{:02x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push(quote);
    out
}

/// JSON string with `ensure_ascii=True`: everything outside ASCII becomes `\uXXXX`.
pub fn json_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{08}' => out.push_str("\\b"),
            '\u{0c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 || (c as u32) > 0x7e => {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    let _ = write!(out, "\\u{unit:04x}");
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// Python's `repr(float)`: the shortest round-trip digits, scientific notation below 1e-4
/// and from 1e16 on, and always a `.0` on integral values.
pub fn float_repr(f: f64) -> String {
    if f.is_nan() {
        return "nan".into();
    }
    if f.is_infinite() {
        return if f > 0.0 { "inf" } else { "-inf" }.into();
    }
    if f == 0.0 {
        return if f.is_sign_negative() { "-0.0" } else { "0.0" }.into();
    }
    // Rust's `{:e}` gives the shortest digits that round-trip, as Python's repr does.
    let scientific = format!("{f:e}");
    let (mantissa, exponent) = scientific.split_once('e').unwrap_or((&scientific, "0"));
    let exponent: i32 = exponent.parse().unwrap_or(0);
    let negative = mantissa.starts_with('-');
    let digits: String = mantissa.chars().filter(char::is_ascii_digit).collect();
    let sign = if negative { "-" } else { "" };
    if !(-4..16).contains(&exponent) {
        let (first, rest) = digits.split_at(1);
        let fraction = if rest.is_empty() {
            String::new()
        } else {
            format!(".{rest}")
        };
        let exponent_sign = if exponent < 0 { '-' } else { '+' };
        return format!(
            "{sign}{first}{fraction}e{exponent_sign}{:02}",
            exponent.abs()
        );
    }
    let point = exponent + 1; // digits before the decimal point
    if point <= 0 {
        format!("{sign}0.{}{digits}", "0".repeat((-point) as usize))
    } else if point as usize >= digits.len() {
        format!(
            "{sign}{digits}{}.0",
            "0".repeat(point as usize - digits.len())
        )
    } else {
        let (int, frac) = digits.split_at(point as usize);
        format!("{sign}{int}.{frac}")
    }
}

fn json_float(f: f64) -> String {
    if f.is_nan() {
        "NaN".into()
    } else if f.is_infinite() {
        if f > 0.0 { "Infinity" } else { "-Infinity" }.into()
    } else {
        float_repr(f)
    }
}

/// `ast.literal_eval(text)`, for the literals JSON-ish strings contain: strings, numbers,
/// `True`/`False`/`None`, lists, tuples and dicts. `None` when Python would raise (sets,
/// bytes and complex numbers are refused too; the Python client keeps the text then, and so
/// do we).
pub fn literal_eval(text: &str) -> Option<Py> {
    let mut parser = Parser {
        // Python strips blanks, and its tokenizer skips blank lines before the expression.
        chars: text
            .trim_start_matches([' ', '\t', '\n', '\r'])
            .chars()
            .collect(),
        at: 0,
    };
    let value = parser.expression(false)?;
    parser.skip_space(true);
    (parser.at == parser.chars.len()).then_some(value)
}

struct Parser {
    chars: Vec<char>,
    at: usize,
}

impl Parser {
    fn peek(&self) -> Option<char> {
        self.chars.get(self.at).copied()
    }

    /// Skips blanks and comments; newlines only inside brackets (or at the very end).
    fn skip_space(&mut self, newlines: bool) {
        while let Some(c) = self.peek() {
            match c {
                ' ' | '\t' | '\x0c' => self.at += 1,
                '\n' | '\r' if newlines => self.at += 1,
                '\\' if self.chars.get(self.at + 1) == Some(&'\n') => self.at += 2,
                '#' => {
                    while self.peek().is_some_and(|c| c != '\n') {
                        self.at += 1;
                    }
                }
                _ => break,
            }
        }
    }

    fn eat(&mut self, c: char, newlines: bool) -> bool {
        self.skip_space(newlines);
        if self.peek() == Some(c) {
            self.at += 1;
            true
        } else {
            false
        }
    }

    /// A top-level expression: one value, or a tuple without parentheses (`1, 2`).
    fn expression(&mut self, nested: bool) -> Option<Py> {
        let first = self.value(nested)?;
        self.skip_space(nested);
        if self.peek() != Some(',') {
            return Some(first);
        }
        let mut items = vec![first];
        while self.eat(',', nested) {
            self.skip_space(nested);
            match self.peek() {
                None | Some(')' | ']' | '}' | '\n' | '\r') => break,
                _ => items.push(self.value(nested)?),
            }
        }
        Some(Py::Tuple(items))
    }

    fn value(&mut self, nested: bool) -> Option<Py> {
        self.skip_space(nested);
        let c = self.peek()?;
        match c {
            '[' => {
                self.at += 1;
                let items = self.sequence(']')?;
                Some(Py::List(items))
            }
            '(' => {
                self.at += 1;
                if self.eat(')', true) {
                    return Some(Py::Tuple(Vec::new()));
                }
                let inner = self.expression(true)?;
                self.eat(')', true).then_some(inner)
            }
            '{' => {
                self.at += 1;
                self.dict()
            }
            '\'' | '"' => self.strings(nested),
            '+' | '-' => {
                self.at += 1;
                match self.value(nested)? {
                    Py::Int(i) if c == '-' => Some(Py::Int(-i)),
                    Py::Float(f) if c == '-' => Some(Py::Float(-f)),
                    number @ (Py::Int(_) | Py::Float(_)) => Some(number),
                    _ => None,
                }
            }
            c if c.is_ascii_digit() || c == '.' => self.number(),
            c if c.is_alphabetic() || c == '_' => {
                let start = self.at;
                while self.peek().is_some_and(|c| c.is_alphanumeric() || c == '_') {
                    self.at += 1;
                }
                let word: String = self.chars[start..self.at].iter().collect();
                match word.as_str() {
                    "True" => Some(Py::Bool(true)),
                    "False" => Some(Py::Bool(false)),
                    "None" => Some(Py::None),
                    // String prefixes: r, u and their cases; bytes and f-strings are refused.
                    "r" | "R" | "u" | "U" if matches!(self.peek(), Some('\'' | '"')) => {
                        self.at = start;
                        self.strings(nested)
                    }
                    _ => None,
                }
            }
            _ => None,
        }
    }

    fn sequence(&mut self, close: char) -> Option<Vec<Py>> {
        let mut items = Vec::new();
        loop {
            if self.eat(close, true) {
                return Some(items);
            }
            items.push(self.value(true)?);
            if self.eat(close, true) {
                return Some(items);
            }
            if !self.eat(',', true) {
                return None;
            }
        }
    }

    fn dict(&mut self) -> Option<Py> {
        let mut entries: Vec<(Py, Py)> = Vec::new();
        if self.eat('}', true) {
            return Some(Py::Dict(entries));
        }
        let first = self.value(true)?;
        if !self.eat(':', true) {
            // `{1, 2}` is a set: not something the client turns into a table cell.
            return None;
        }
        let mut key = first;
        loop {
            let value = self.value(true)?;
            // A repeated key keeps its first position and its last value, as in a dict.
            match entries.iter_mut().find(|(k, _)| *k == key) {
                Some(entry) => entry.1 = value,
                None => entries.push((key, value)),
            }
            if self.eat('}', true) {
                return Some(Py::Dict(entries));
            }
            if !self.eat(',', true) {
                return None;
            }
            if self.eat('}', true) {
                return Some(Py::Dict(entries));
            }
            key = self.value(true)?;
            if !self.eat(':', true) {
                return None;
            }
        }
    }

    /// One or more adjacent string literals, concatenated.
    fn strings(&mut self, nested: bool) -> Option<Py> {
        let mut text = self.string()?;
        loop {
            let save = self.at;
            self.skip_space(nested);
            let prefixed = matches!(self.peek(), Some('r' | 'R' | 'u' | 'U'))
                && matches!(self.chars.get(self.at + 1), Some('\'' | '"'));
            if matches!(self.peek(), Some('\'' | '"')) || prefixed {
                text.push_str(&self.string()?);
            } else {
                self.at = save;
                return Some(Py::Str(text));
            }
        }
    }

    fn string(&mut self) -> Option<String> {
        let mut raw = false;
        if let Some(p @ ('r' | 'R' | 'u' | 'U')) = self.peek() {
            raw = matches!(p, 'r' | 'R');
            self.at += 1;
        }
        let quote = self.peek()?;
        let triple = self.chars.get(self.at + 1) == Some(&quote)
            && self.chars.get(self.at + 2) == Some(&quote);
        self.at += if triple { 3 } else { 1 };
        let mut out = String::new();
        loop {
            let c = self.peek()?;
            if c == quote {
                if !triple {
                    self.at += 1;
                    return Some(out);
                }
                if self.chars.get(self.at + 1) == Some(&quote)
                    && self.chars.get(self.at + 2) == Some(&quote)
                {
                    self.at += 3;
                    return Some(out);
                }
            }
            if c == '\n' && !triple {
                return None;
            }
            self.at += 1;
            if c != '\\' {
                out.push(c);
                continue;
            }
            let escaped = self.peek()?;
            self.at += 1;
            if raw {
                out.push('\\');
                out.push(escaped);
                continue;
            }
            match escaped {
                '\n' => {}
                '\\' | '\'' | '"' => out.push(escaped),
                'n' => out.push('\n'),
                't' => out.push('\t'),
                'r' => out.push('\r'),
                'a' => out.push('\x07'),
                'b' => out.push('\x08'),
                'f' => out.push('\x0c'),
                'v' => out.push('\x0b'),
                'x' => out.push(self.hex_escape(2)?),
                'u' => out.push(self.hex_escape(4)?),
                'U' => out.push(self.hex_escape(8)?),
                '0'..='7' => {
                    let mut value = escaped.to_digit(8)?;
                    for _ in 0..2 {
                        match self.peek().and_then(|c| c.to_digit(8)) {
                            Some(d) => {
                                value = value * 8 + d;
                                self.at += 1;
                            }
                            None => break,
                        }
                    }
                    out.push(char::from_u32(value)?);
                }
                // Python keeps unknown escapes as they are (with a warning).
                other => {
                    out.push('\\');
                    out.push(other);
                }
            }
        }
    }

    fn hex_escape(&mut self, digits: usize) -> Option<char> {
        let text: String = self.chars.get(self.at..self.at + digits)?.iter().collect();
        self.at += digits;
        char::from_u32(u32::from_str_radix(&text, 16).ok()?)
    }

    fn number(&mut self) -> Option<Py> {
        let start = self.at;
        while self
            .peek()
            .is_some_and(|c| c.is_ascii_alphanumeric() || c == '.' || c == '_')
            || (matches!(self.peek(), Some('+' | '-'))
                && matches!(self.chars.get(self.at - 1), Some('e' | 'E'))
                && !self.chars[start..self.at]
                    .iter()
                    .any(|c| matches!(c, 'x' | 'X')))
        {
            self.at += 1;
        }
        let text: String = self.chars[start..self.at].iter().collect();
        if text.contains("__") || text.ends_with('_') {
            return None;
        }
        let clean = text.replace('_', "");
        let lower = clean.to_ascii_lowercase();
        for (prefix, radix) in [("0x", 16), ("0o", 8), ("0b", 2)] {
            if let Some(digits) = lower.strip_prefix(prefix) {
                return i128::from_str_radix(digits, radix).ok().map(Py::Int);
            }
        }
        if lower.ends_with('j') {
            return None;
        }
        if lower.bytes().all(|b| b.is_ascii_digit()) {
            // Python 3 refuses leading zeros ("010"), except for zero itself.
            if lower.len() > 1 && lower.starts_with('0') && lower.bytes().any(|b| b != b'0') {
                return None;
            }
            return lower.parse::<i128>().ok().map(Py::Int);
        }
        lower.parse::<f64>().ok().map(Py::Float)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repr_matches_python() {
        let cases: &[(Py, &str)] = &[
            (Py::Str("it's".into()), "\"it's\""),
            (Py::Str("a'b\"c".into()), "'a\\'b\"c'"),
            (Py::Str("line\nbreak\\".into()), "'line\\nbreak\\\\'"),
            (Py::Str("héllo".into()), "'héllo'"),
            (
                Py::List(vec![Py::Str("false".into()), Py::Str("true".into())]),
                "['false', 'true']",
            ),
            (Py::Tuple(vec![Py::Int(1)]), "(1,)"),
            (
                Py::Dict(vec![
                    (Py::Str("id".into()), Py::Int(1)),
                    (Py::Str("ok".into()), Py::Bool(true)),
                    (Py::Str("none".into()), Py::None),
                ]),
                "{'id': 1, 'ok': True, 'none': None}",
            ),
        ];
        for (value, expected) in cases {
            assert_eq!(value.repr(), *expected);
        }
    }

    #[test]
    fn floats_like_python() {
        let cases = [
            (1.0, "1.0"),
            (0.1, "0.1"),
            (1.5e-5, "1.5e-05"),
            (0.0001, "0.0001"),
            (1e16, "1e+16"),
            (123456789012345.6, "123456789012345.6"),
            (-2.5, "-2.5"),
            (1e22, "1e+22"),
        ];
        for (f, expected) in cases {
            assert_eq!(float_repr(f), expected, "{f}");
        }
    }

    #[test]
    fn json_dumps_like_python() {
        let value = Py::from(&serde_json::json!({
            "id": "x", "n": [1, 2], "e": {}, "l": [], "u": "é", "f": 2.0
        }));
        assert_eq!(
            value.json_dumps(None).unwrap(),
            r#"{"id": "x", "n": [1, 2], "e": {}, "l": [], "u": "\u00e9", "f": 2.0}"#
        );
        assert_eq!(
            value.json_dumps(Some(4)).unwrap(),
            "{\n    \"id\": \"x\",\n    \"n\": [\n        1,\n        2\n    ],\n    \"e\": {},\n    \"l\": [],\n    \"u\": \"\\u00e9\",\n    \"f\": 2.0\n}"
        );
    }

    #[test]
    fn literal_eval_like_python() {
        let ok: &[(&str, Py)] = &[
            ("None", Py::None),
            ("16", Py::Int(16)),
            ("-3", Py::Int(-3)),
            ("0x1f", Py::Int(31)),
            ("1_000", Py::Int(1000)),
            ("1.5e3", Py::Float(1500.0)),
            ("'a' \"b\"", Py::Str("ab".into())),
            ("[]", Py::List(vec![])),
            ("['a', 1,]", Py::List(vec![Py::Str("a".into()), Py::Int(1)])),
            ("1, 2", Py::Tuple(vec![Py::Int(1), Py::Int(2)])),
            ("(1)", Py::Int(1)),
            (
                "{\"arch\": \"x86_64\",\n \"n\": {'a': (1, 2)}}",
                Py::Dict(vec![
                    (Py::Str("arch".into()), Py::Str("x86_64".into())),
                    (
                        Py::Str("n".into()),
                        Py::Dict(vec![(
                            Py::Str("a".into()),
                            Py::Tuple(vec![Py::Int(1), Py::Int(2)]),
                        )]),
                    ),
                ]),
            ),
            ("  [1]  ", Py::List(vec![Py::Int(1)])),
            ("\n[1] # comment\n", Py::List(vec![Py::Int(1)])),
            ("'\\x41\\n'", Py::Str("A\n".into())),
        ];
        for (text, expected) in ok {
            assert_eq!(literal_eval(text).as_ref(), Some(expected), "{text}");
        }
        for bad in [
            "true",
            "r1",
            "x86_64",
            "2026-11-22 08:16:04",
            "2030-01-01T10:00:00.000000",
            "",
            "{1, 2}",
            "b'x'",
            "1j",
            "010",
            "[test]",
            "{\"a\": true}",
            "\"unterminated",
        ] {
            assert_eq!(literal_eval(bad), None, "{bad}");
        }
    }
}
