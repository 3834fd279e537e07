//! `-f yaml`: PyYAML's `safe_dump(..., default_flow_style=False)` reproduced for the values
//! the CLI prints (scalars, lists, dicts), including its choice of quoting and its folding of
//! long lines at 80 columns, so scripts that parse the Python client's YAML see the same text.

use std::sync::LazyLock;

use regex::Regex;

use super::python::{Py, float_repr};

const BEST_INDENT: usize = 2;
const BEST_WIDTH: usize = 80;

/// PyYAML's implicit resolvers (YAML 1.1), keyed by the first characters they apply to. A
/// string that one of them matches would read back as something else, so it gets quoted.
static RESOLVERS: LazyLock<Vec<(&'static str, Regex)>> = LazyLock::new(|| {
    let patterns = [
        (
            "yYnNtTfFoO",
            r"^(?:yes|Yes|YES|no|No|NO|true|True|TRUE|false|False|FALSE|on|On|ON|off|Off|OFF)$",
        ),
        (
            "-+0123456789.",
            r"^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+][0-9]+)?|\.[0-9][0-9_]*(?:[eE][-+][0-9]+)?|[-+]?[0-9][0-9_]*(?::[0-5]?[0-9])+\.[0-9_]*|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$",
        ),
        (
            "-+0123456789",
            r"^(?:[-+]?0b[0-1_]+|[-+]?0[0-7_]+|[-+]?(?:0|[1-9][0-9_]*)|[-+]?0x[0-9a-fA-F_]+|[-+]?[1-9][0-9_]*(?::[0-5]?[0-9])+)$",
        ),
        ("<", r"^(?:<<)$"),
        ("~nN", r"^(?:~|null|Null|NULL|)$"),
        (
            "0123456789",
            r"^(?:[0-9][0-9][0-9][0-9]-[0-9][0-9]-[0-9][0-9]|[0-9][0-9][0-9][0-9]-[0-9][0-9]?-[0-9][0-9]?(?:[Tt]|[ \t]+)[0-9][0-9]?:[0-9][0-9]:[0-9][0-9](?:\.[0-9]*)?(?:[ \t]*(?:Z|[-+][0-9][0-9]?(?::[0-9][0-9])?))?)$",
        ),
        ("=", r"^(?:=)$"),
        ("!&*", r"^(?:!|&|\*)$"),
    ];
    patterns
        .into_iter()
        .filter_map(|(first, pattern)| Regex::new(pattern).ok().map(|re| (first, re)))
        .collect()
});

/// Whether a plain (unquoted) scalar `text` would be read back as a string.
fn plain_is_string(text: &str) -> bool {
    let Some(first) = text.chars().next() else {
        return false; // the empty plain scalar is null
    };
    !RESOLVERS
        .iter()
        .any(|(firsts, re)| firsts.contains(first) && re.is_match(text))
}

struct Analysis {
    empty: bool,
    multiline: bool,
    allow_block_plain: bool,
    allow_single_quoted: bool,
}

fn is_break(c: char) -> bool {
    matches!(c, '\n' | '\u{85}' | '\u{2028}' | '\u{2029}')
}

/// What PyYAML's plain and single-quoted writers walk a scalar by: runs of spaces, of line
/// breaks, and of other text; each `'` is a run of its own, as single quotes double it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Run {
    Spaces,
    Breaks,
    Quote,
    Text,
}

impl Run {
    fn of(c: char) -> Run {
        match c {
            ' ' => Run::Spaces,
            '\'' => Run::Quote,
            c if is_break(c) => Run::Breaks,
            _ => Run::Text,
        }
    }
}

/// `chars` cut into [`Run`]s: each with its kind and where it starts.
fn runs(chars: &[char]) -> impl Iterator<Item = (Run, usize, &[char])> {
    let mut start = 0;
    chars
        .chunk_by(|a, b| Run::of(*a) == Run::of(*b) && Run::of(*a) != Run::Quote)
        .map(move |run| {
            let at = start;
            start += run.len();
            (Run::of(run[0]), at, run)
        })
}

fn is_blank_or_end(c: Option<&char>) -> bool {
    c.is_none_or(|c| matches!(c, '\0' | ' ' | '\t' | '\r') || is_break(*c))
}

/// `Emitter.analyze_scalar` with `allow_unicode=False`, for block context.
fn analyze(text: &str) -> Analysis {
    if text.is_empty() {
        return Analysis {
            empty: true,
            multiline: false,
            allow_block_plain: true,
            allow_single_quoted: true,
        };
    }
    let chars: Vec<char> = text.chars().collect();
    let mut block_indicators = text.starts_with("---") || text.starts_with("...");
    let mut line_breaks = false;
    let mut special = false;
    // A leading or trailing space or line break (PyYAML keeps the four apart, but only ever
    // asks whether there is any).
    let mut edge_whitespace = false;
    let (mut break_space, mut space_break) = (false, false);
    let (mut previous_space, mut previous_break) = (false, false);
    let mut preceded_by_whitespace = true;
    for (index, &c) in chars.iter().enumerate() {
        let followed_by_whitespace = is_blank_or_end(chars.get(index + 1));
        if index == 0 {
            if "#,[]{}&*!|>'\"%@`".contains(c) {
                block_indicators = true;
            }
            if "?:".contains(c) && followed_by_whitespace {
                block_indicators = true;
            }
            if c == '-' && followed_by_whitespace {
                block_indicators = true;
            }
        } else {
            if c == ':' && followed_by_whitespace {
                block_indicators = true;
            }
            if c == '#' && preceded_by_whitespace {
                block_indicators = true;
            }
        }
        if is_break(c) {
            line_breaks = true;
        }
        if !(c == '\n' || (' '..='~').contains(&c)) {
            // Without allow_unicode every non-ASCII character needs an escape.
            special = true;
        }
        let (space, line_break) = (c == ' ', is_break(c));
        if (space || line_break) && (index == 0 || index == chars.len() - 1) {
            edge_whitespace = true;
        }
        break_space |= space && previous_break;
        space_break |= line_break && previous_space;
        previous_space = space;
        previous_break = line_break;
        preceded_by_whitespace = matches!(c, '\0' | ' ' | '\t' | '\r') || is_break(c);
    }
    let mut allow_block_plain = true;
    let mut allow_single_quoted = true;
    if edge_whitespace {
        allow_block_plain = false;
    }
    if break_space {
        allow_block_plain = false;
        allow_single_quoted = false;
    }
    if space_break || special {
        allow_block_plain = false;
        allow_single_quoted = false;
    }
    if line_breaks || block_indicators {
        allow_block_plain = false;
    }
    Analysis {
        empty: false,
        multiline: line_breaks,
        allow_block_plain,
        allow_single_quoted,
    }
}

/// A scalar ready to emit: its text and whether it may be written plain (its implicit tag
/// is right).
struct Scalar {
    text: String,
    plain_ok: bool,
}

fn scalar(value: &Py) -> Option<Scalar> {
    let text = match value {
        Py::None => "null".to_string(),
        Py::Bool(b) => b.to_string(),
        Py::Int(i) => i.to_string(),
        Py::Float(f) if f.is_nan() => ".nan".to_string(),
        Py::Float(f) if f.is_infinite() => if *f > 0.0 { ".inf" } else { "-.inf" }.to_string(),
        Py::Float(f) => {
            let text = float_repr(*f).to_lowercase();
            if !text.contains('.') && text.contains('e') {
                text.replacen('e', ".0e", 1)
            } else {
                text
            }
        }
        Py::Str(s) => {
            return Some(Scalar {
                plain_ok: plain_is_string(s),
                text: s.clone(),
            });
        }
        Py::List(_) | Py::Tuple(_) | Py::Dict(_) => return None,
    };
    Some(Scalar {
        text,
        plain_ok: true,
    })
}

/// safe_dump sorts keys; the CLI's keys are always strings.
fn sort_key(key: &Py) -> String {
    key.str()
}

struct Emitter {
    out: String,
    column: usize,
    whitespace: bool,
    indention: bool,
    indent: Option<usize>,
    indents: Vec<Option<usize>>,
    /// Whether the node being emitted is a mapping value (for indentless sequences).
    mapping_context: bool,
}

impl Emitter {
    fn new() -> Emitter {
        Emitter {
            out: String::new(),
            column: 0,
            whitespace: true,
            indention: true,
            indent: None,
            indents: Vec::new(),
            mapping_context: false,
        }
    }

    fn increase_indent(&mut self, flow: bool, indentless: bool) {
        self.indents.push(self.indent);
        self.indent = match self.indent {
            None => Some(if flow { BEST_INDENT } else { 0 }),
            Some(i) if !indentless => Some(i + BEST_INDENT),
            Some(i) => Some(i),
        };
    }

    fn pop_indent(&mut self) {
        self.indent = self.indents.pop().flatten();
    }

    fn write(&mut self, data: &str) {
        self.column += data.chars().count();
        self.out.push_str(data);
    }

    fn write_indicator(
        &mut self,
        indicator: &str,
        need_whitespace: bool,
        whitespace: bool,
        indention: bool,
    ) {
        if self.whitespace || !need_whitespace {
            self.write(indicator);
        } else {
            self.write(&format!(" {indicator}"));
        }
        self.whitespace = whitespace;
        self.indention = self.indention && indention;
    }

    fn write_indent(&mut self) {
        let indent = self.indent.unwrap_or(0);
        if !self.indention || self.column > indent || (self.column == indent && !self.whitespace) {
            self.write_line_break();
        }
        if self.column < indent {
            self.whitespace = true;
            let spaces = " ".repeat(indent - self.column);
            self.write(&spaces);
        }
    }

    fn write_line_break(&mut self) {
        self.whitespace = true;
        self.indention = true;
        self.column = 0;
        self.out.push('\n');
    }

    fn write_chars(&mut self, chars: &[char]) {
        let data: String = chars.iter().collect();
        self.write(&data);
    }

    /// A run of line breaks inside a plain or single-quoted scalar, then the indent of the
    /// line after it. A single break there reads back as a space, so a run that starts with
    /// '\n' takes one break more.
    fn write_breaks(&mut self, breaks: &[char]) {
        if breaks.first() == Some(&'\n') {
            self.write_line_break();
        }
        for _ in breaks {
            self.write_line_break();
        }
        self.write_indent();
    }

    fn node(&mut self, value: &Py, mapping: bool, simple_key: bool) {
        self.mapping_context = mapping;
        match value {
            Py::List(items) | Py::Tuple(items) => {
                if items.is_empty() {
                    self.empty_flow("[", "]");
                } else {
                    self.block_sequence(items);
                }
            }
            Py::Dict(entries) => {
                if entries.is_empty() {
                    self.empty_flow("{", "}");
                } else {
                    self.block_mapping(entries);
                }
            }
            scalar_value => {
                if let Some(s) = scalar(scalar_value) {
                    self.increase_indent(true, false);
                    self.scalar(&s, simple_key);
                    self.pop_indent();
                }
            }
        }
    }

    fn empty_flow(&mut self, open: &str, close: &str) {
        self.write_indicator(open, true, true, false);
        self.increase_indent(true, false);
        self.pop_indent();
        self.write_indicator(close, false, false, false);
    }

    fn block_sequence(&mut self, items: &[Py]) {
        let indentless = self.mapping_context && !self.indention;
        self.increase_indent(false, indentless);
        for item in items {
            self.write_indent();
            self.write_indicator("-", true, false, true);
            self.node(item, false, false);
        }
        self.pop_indent();
    }

    fn block_mapping(&mut self, entries: &[(Py, Py)]) {
        self.increase_indent(false, false);
        let mut sorted: Vec<&(Py, Py)> = entries.iter().collect();
        sorted.sort_by_key(|(k, _)| sort_key(k));
        for (key, value) in sorted {
            self.write_indent();
            let simple = scalar(key).is_some_and(|s| {
                let a = analyze(&s.text);
                s.text.chars().count() < 128 && !a.empty && !a.multiline
            });
            if simple {
                self.node(key, true, true);
                self.write_indicator(":", false, false, false);
                self.node(value, true, false);
            } else {
                self.write_indicator("?", true, false, true);
                self.node(key, true, false);
                self.write_indent();
                self.write_indicator(":", true, false, true);
                self.node(value, true, false);
            }
        }
        self.pop_indent();
    }

    fn scalar(&mut self, s: &Scalar, simple_key: bool) {
        let analysis = analyze(&s.text);
        let split = !simple_key;
        if s.plain_ok
            && !(simple_key && (analysis.empty || analysis.multiline))
            && analysis.allow_block_plain
        {
            self.write_plain(&s.text, split);
        } else if analysis.allow_single_quoted && !(simple_key && analysis.multiline) {
            self.write_single_quoted(&s.text, split);
        } else {
            self.write_double_quoted(&s.text, split);
        }
    }

    fn write_plain(&mut self, text: &str, split: bool) {
        if text.is_empty() {
            return;
        }
        if !self.whitespace {
            self.write(" ");
        }
        self.whitespace = false;
        self.indention = false;
        let chars: Vec<char> = text.chars().collect();
        for (kind, _, run) in runs(&chars) {
            match kind {
                Run::Spaces if run.len() == 1 && self.column > BEST_WIDTH && split => {
                    self.write_indent();
                    self.whitespace = false;
                    self.indention = false;
                }
                Run::Breaks => {
                    self.write_breaks(run);
                    self.whitespace = false;
                    self.indention = false;
                }
                // Quotes need no doubling outside single quotes.
                Run::Spaces | Run::Quote | Run::Text => self.write_chars(run),
            }
        }
    }

    fn write_single_quoted(&mut self, text: &str, split: bool) {
        self.write_indicator("'", true, false, false);
        let chars: Vec<char> = text.chars().collect();
        for (kind, start, run) in runs(&chars) {
            let inner = start != 0 && start + run.len() != chars.len();
            match kind {
                Run::Spaces if run.len() == 1 && self.column > BEST_WIDTH && split && inner => {
                    self.write_indent();
                }
                Run::Breaks => self.write_breaks(run),
                Run::Quote => self.write("''"),
                Run::Spaces | Run::Text => self.write_chars(run),
            }
        }
        self.write_indicator("'", false, false, false);
    }

    fn write_double_quoted(&mut self, text: &str, split: bool) {
        self.write_indicator("\"", true, false, false);
        let chars: Vec<char> = text.chars().collect();
        let (mut start, mut end) = (0, 0);
        while end <= chars.len() {
            let ch = chars.get(end).copied();
            let needs_escape = ch.is_none_or(|c| {
                matches!(
                    c,
                    '"' | '\\' | '\u{85}' | '\u{2028}' | '\u{2029}' | '\u{feff}'
                ) || !(' '..='~').contains(&c)
            });
            if needs_escape {
                if start < end {
                    self.write_chars(&chars[start..end]);
                    start = end;
                }
                if let Some(c) = ch {
                    let data = match c {
                        '\0' => "\\0".to_string(),
                        '\x07' => "\\a".to_string(),
                        '\x08' => "\\b".to_string(),
                        '\t' => "\\t".to_string(),
                        '\n' => "\\n".to_string(),
                        '\x0b' => "\\v".to_string(),
                        '\x0c' => "\\f".to_string(),
                        '\r' => "\\r".to_string(),
                        '\x1b' => "\\e".to_string(),
                        '"' => "\\\"".to_string(),
                        '\\' => "\\\\".to_string(),
                        '\u{85}' => "\\N".to_string(),
                        '\u{a0}' => "\\_".to_string(),
                        '\u{2028}' => "\\L".to_string(),
                        '\u{2029}' => "\\P".to_string(),
                        c if (c as u32) <= 0xff => format!("\\x{:02X}", c as u32),
                        c if (c as u32) <= 0xffff => format!("\\u{:04X}", c as u32),
                        c => format!("\\U{:08X}", c as u32),
                    };
                    self.write(&data);
                    start = end + 1;
                }
            }
            if end > 0
                && end + 1 < chars.len()
                && (ch == Some(' ') || start >= end)
                && self.column + (end.saturating_sub(start)) > BEST_WIDTH
                && split
            {
                let mut data: String = chars[start.min(end)..end].iter().collect();
                data.push('\\');
                if start < end {
                    start = end;
                }
                self.write(&data);
                self.write_indent();
                self.whitespace = false;
                self.indention = false;
                if chars.get(start) == Some(&' ') {
                    self.write("\\");
                }
            }
            end += 1;
        }
        self.write_indicator("\"", false, false, false);
    }
}

/// One document: what `yaml.safe_dump(value, default_flow_style=False)` writes.
pub fn dump(value: &Py) -> String {
    let mut emitter = Emitter::new();
    emitter.node(value, false, false);
    emitter.write_indent();
    emitter.out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn dump_json(value: serde_json::Value) -> String {
        dump(&Py::from(&value))
    }

    #[test]
    fn scalars_are_quoted_when_they_would_read_back_differently() {
        let out = dump_json(json!({
            "id": "2", "name": "compute-2", "reservable": true, "vcpus": 16, "status": "",
            "created_at": "2026-11-22 08:16:04", "gpu": "true", "none": null,
            "rack": "r1", "colon": "a: b", "hash": "#x", "quote": "it's"
        }));
        assert_eq!(
            out,
            "colon: 'a: b'\ncreated_at: '2026-11-22 08:16:04'\ngpu: 'true'\nhash: '#x'\n\
             id: '2'\nname: compute-2\nnone: null\nquote: it's\nrack: r1\nreservable: true\n\
             status: ''\nvcpus: 16\n"
        );
    }

    #[test]
    fn nested_lists_and_maps() {
        let out = dump_json(json!([
            {"resource_id": "1", "reservations": [{"id": "a", "lease_id": "b"}]},
            {"resource_id": "2", "reservations": []}
        ]));
        assert_eq!(
            out,
            "- reservations:\n  - id: a\n    lease_id: b\n  resource_id: '1'\n\
             - reservations: []\n  resource_id: '2'\n"
        );
        assert_eq!(
            dump_json(json!({"f": 1e16, "g": 2.5, "h": ["a", 1]})),
            "f: 1.0e+16\ng: 2.5\nh:\n- a\n- 1\n"
        );
    }

    #[test]
    fn multi_line_and_unicode_strings() {
        assert_eq!(
            dump_json(json!({"events": "{\n    \"id\": \"x\"\n}"})),
            "events: \"{\\n    \\\"id\\\": \\\"x\\\"\\n}\"\n"
        );
        assert_eq!(
            dump_json(json!({"a": "line1\nline2"})),
            "a: 'line1\n\n  line2'\n"
        );
        assert_eq!(dump_json(json!({"u": "é"})), "u: \"\\xE9\"\n");
        assert_eq!(dump_json(json!([])), "[]\n");
    }

    #[test]
    fn long_plain_scalars_fold_at_80_columns() {
        let words = "word ".repeat(20);
        let out = dump_json(json!({ "k": words.trim_end() }));
        assert_eq!(
            out,
            format!(
                "k: {}\n  {}\n",
                "word ".repeat(16).trim_end(),
                "word ".repeat(4).trim_end()
            )
        );
        let long = format!("{} {}", "x".repeat(100), "y".repeat(10));
        assert_eq!(
            dump_json(json!({ "k": long })),
            format!("k: {}\n  {}\n", "x".repeat(100), "y".repeat(10))
        );
    }
}
