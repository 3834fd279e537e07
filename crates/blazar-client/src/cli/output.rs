//! Output formatters (`-f table|json|yaml|value|csv|shell`, `-c COLUMN`, sorting, table
//! fitting), reproducing cliff's `ShowOne` and `Lister` commands as python-blazarclient
//! drives them.

use std::io::IsTerminal;

use clap::{Arg, Args, ValueEnum};
use serde_json::{Map, Value};

use super::Failure;
use super::python::{Py, literal_eval};
use super::table::{Align, Table};
use super::yaml;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ShowFormat {
    Json,
    Shell,
    Table,
    Value,
    Yaml,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ListFormat {
    Csv,
    Json,
    Table,
    Value,
    Yaml,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum QuoteMode {
    All,
    Minimal,
    None,
    Nonnumeric,
}

/// cliff's table formatter options.
#[derive(Debug, Clone, Args)]
pub struct TableArgs {
    /// Maximum display width, <1 to disable. You can also use the CLIFF_MAX_TERM_WIDTH
    /// environment variable, but the parameter takes precedence
    #[arg(
        long,
        value_name = "INTEGER",
        env = "CLIFF_MAX_TERM_WIDTH",
        default_value_t = 0
    )]
    pub max_width: i64,
    /// Fit the table to the display width. Implied if --max-width greater than 0. Set the
    /// environment variable CLIFF_FIT_WIDTH=1 to always enable
    #[arg(long)]
    pub fit_width: bool,
    /// Print empty table if there is no data to show
    #[arg(long)]
    pub print_empty: bool,
}

/// Options of commands that show one object.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Output formatters")]
pub struct ShowOutput {
    /// The output format
    #[arg(short = 'f', long = "format", value_enum, default_value_t = ShowFormat::Table)]
    pub format: ShowFormat,
    /// Specify the column(s) to include, can be repeated to show multiple columns
    #[arg(short = 'c', long = "column", value_name = "COLUMN")]
    pub columns: Vec<String>,
    /// Whether to disable indenting the JSON
    #[arg(long)]
    pub noindent: bool,
    /// Add a prefix to all variable names (shell format)
    #[arg(long, default_value = "")]
    pub prefix: String,
    #[command(flatten)]
    pub table: TableArgs,
}

/// Options of commands that list objects.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Output formatters")]
pub struct ListOutput {
    /// The output format
    #[arg(short = 'f', long = "format", value_enum, default_value_t = ListFormat::Table)]
    pub format: ListFormat,
    /// Specify the column(s) to include, can be repeated to show multiple columns
    #[arg(short = 'c', long = "column", value_name = "COLUMN")]
    pub columns: Vec<String>,
    /// When to include quotes (csv format)
    #[arg(long = "quote", value_enum, default_value_t = QuoteMode::Nonnumeric)]
    pub quote: QuoteMode,
    /// Whether to disable indenting the JSON
    #[arg(long)]
    pub noindent: bool,
    /// Specify the column(s) to sort the data (columns specified first have a priority,
    /// non-existing columns are ignored), can be repeated
    #[arg(long = "sort-column", value_name = "SORT_COLUMN")]
    pub sort_columns: Vec<String>,
    /// Sort the column(s) in ascending order
    #[arg(long, conflicts_with = "sort_descending")]
    pub sort_ascending: bool,
    /// Sort the column(s) in descending order
    #[arg(long)]
    pub sort_descending: bool,
    #[command(flatten)]
    pub table: TableArgs,
}

/// `--sort-by` and the output options, as list commands take them. Each command gives its
/// own default column with [`sort_by_default`].
#[derive(Debug, Clone, Args)]
pub struct SortedListOutput {
    /// Column name used to sort result
    // Not required: the default each command sets supplies it.
    #[arg(long, value_name = "COLUMN", required = false)]
    pub sort_by: String,
    #[command(flatten)]
    pub out: ListOutput,
}

/// The default column of `--sort-by` in a command that flattens in [`SortedListOutput`]:
/// `#[command(mut_args(sort_by_default("name")))]`. (`mut_arg` would move the option to the
/// end, and with it its place in completion scripts.)
pub fn sort_by_default(column: &'static str) -> impl FnMut(Arg) -> Arg {
    move |arg| {
        if arg.get_id() == "sort_by" {
            arg.default_value(column)
        } else {
            arg
        }
    }
}

impl ShowOutput {
    pub fn is_human(&self) -> bool {
        self.format == ShowFormat::Table
    }
}

impl ListOutput {
    pub fn is_human(&self) -> bool {
        self.format == ListFormat::Table
    }
}

fn normalize_column(name: &str) -> String {
    name.trim().to_lowercase().replace(' ', "_")
}

/// cliff's `_generate_columns_and_selector`: the columns named by `-c`, in the order they
/// are displayed, or an error naming what exists.
fn select_columns(
    requested: &[String],
    available: &[String],
    tuple: bool,
) -> Result<Option<Vec<bool>>, Failure> {
    if requested.is_empty() {
        return Ok(None);
    }
    let wanted: Vec<String> = requested.iter().map(|c| normalize_column(c)).collect();
    let selector: Vec<bool> = available
        .iter()
        .map(|c| wanted.contains(&normalize_column(c)))
        .collect();
    if !selector.iter().any(|s| *s) {
        let requested = Py::List(requested.iter().map(|c| Py::Str(c.clone())).collect());
        let available_items: Vec<Py> = available.iter().map(|c| Py::Str(c.clone())).collect();
        let available = if tuple {
            Py::Tuple(available_items)
        } else {
            Py::List(available_items)
        };
        return Err(Failure::plain(format!(
            "No recognized column names in {}. Recognized columns are {}.",
            requested.repr(),
            available.repr()
        )));
    }
    Ok(Some(selector))
}

/// python-blazarclient's `format_output_data`: strings that Python can evaluate into a list
/// or dict are shown as such; lists become one line per item, dicts indented JSON, `None` an
/// empty string.
pub fn format_value(value: &Value) -> Py {
    let original = Py::from(value);
    let evaluated = match &original {
        Py::Str(text) => literal_eval(text).unwrap_or_else(|| original.clone()),
        other => other.clone(),
    };
    let dumps = |v: &Py| v.json_dumps(Some(4)).unwrap_or_else(|| v.repr());
    match evaluated {
        Py::List(items) => Py::Str(
            items
                .iter()
                .map(|item| match item {
                    Py::Dict(_) => dumps(item),
                    other => other.str(),
                })
                .collect::<Vec<_>>()
                .join("\n"),
        ),
        dict @ Py::Dict(_) => Py::Str(dumps(&dict)),
        Py::None => Py::Str(String::new()),
        _ => original,
    }
}

/// The fields of one object, sorted by name, each formatted by [`format_value`] when
/// `format_values` (which every show command but `host-property-show -f json` does).
pub fn show_fields(object: &Map<String, Value>, format_values: bool) -> Vec<(String, Py)> {
    let mut fields: Vec<(String, Py)> = object
        .iter()
        .map(|(k, v)| {
            let value = if format_values {
                format_value(v)
            } else {
                Py::from(v)
            };
            (k.clone(), value)
        })
        .collect();
    fields.sort_by(|a, b| a.0.cmp(&b.0));
    fields
}

fn terminal_width() -> Option<usize> {
    terminal_size::terminal_size().map(|(w, _)| w.0 as usize)
}

/// cliff's choice of a width to fit tables to: `--max-width`, else the terminal's when
/// stdout is one (or `--fit-width`), else none.
fn fit_width(args: &TableArgs) -> Option<usize> {
    if args.max_width > 0 {
        return usize::try_from(args.max_width).ok();
    }
    let fit = args.fit_width
        || std::env::var("CLIFF_FIT_WIDTH").is_ok_and(|v| v.trim() == "1")
        || std::io::stdout().is_terminal();
    if fit { terminal_width() } else { None }
}

pub fn render_show(fields: Vec<(String, Py)>, out: &ShowOutput) -> Result<String, Failure> {
    let names: Vec<String> = fields.iter().map(|(k, _)| k.clone()).collect();
    let fields: Vec<(String, Py)> = match select_columns(&out.columns, &names, true)? {
        None => fields,
        Some(selector) => fields
            .into_iter()
            .zip(selector)
            .filter_map(|(f, keep)| keep.then_some(f))
            .collect(),
    };
    let mut text = String::new();
    match out.format {
        ShowFormat::Table => {
            if fields.is_empty() {
                text.push('\n');
                return Ok(text);
            }
            let rows = fields
                .iter()
                .map(|(k, v)| vec![k.clone(), v.str()])
                .collect();
            let mut table = Table::new(
                vec!["Field".into(), "Value".into()],
                vec![Align::Left, Align::Left],
                rows,
            );
            if let Some(width) = fit_width(&out.table) {
                table.fit(width, 16);
            }
            text.push_str(&table.render());
            text.push('\n');
        }
        ShowFormat::Json => {
            let object = Py::Dict(fields.into_iter().map(|(k, v)| (Py::Str(k), v)).collect());
            let indent = if out.noindent { None } else { Some(2) };
            text.push_str(&object.json_dumps(indent).unwrap_or_default());
            text.push('\n');
        }
        ShowFormat::Value => {
            for (_, value) in fields {
                text.push_str(&value.str());
                text.push('\n');
            }
        }
        ShowFormat::Yaml => {
            for (key, value) in fields {
                text.push_str(&yaml::dump(&Py::Dict(vec![(Py::Str(key), value)])));
            }
        }
        ShowFormat::Shell => {
            for (key, value) in fields {
                let name = key.to_lowercase().replace([' ', ':', '-'], "_");
                let value = match value {
                    Py::Str(s) => s.replace('"', "\\\""),
                    other => other.str(),
                };
                text.push_str(&format!("{}{name}=\"{value}\"\n", out.prefix));
            }
        }
    }
    Ok(text)
}

/// Python's ordering of two values, for sorting rows; `None` where Python would raise
/// `TypeError` (the rows then keep their order).
fn py_cmp(a: &Py, b: &Py) -> Option<std::cmp::Ordering> {
    use Py::*;
    let number = |v: &Py| match v {
        Bool(b) => Some(f64::from(u8::from(*b))),
        Int(i) => Some(*i as f64),
        Float(f) => Some(*f),
        _ => Option::None,
    };
    match (a, b) {
        (Str(x), Str(y)) => Some(x.cmp(y)),
        (Int(x), Int(y)) => Some(x.cmp(y)),
        (List(x), List(y)) | (Tuple(x), Tuple(y)) => {
            for (p, q) in x.iter().zip(y) {
                match py_cmp(p, q)? {
                    std::cmp::Ordering::Equal => continue,
                    other => return Some(other),
                }
            }
            Some(x.len().cmp(&y.len()))
        }
        _ => number(a)?.partial_cmp(&number(b)?),
    }
}

/// Refuses a `--sort-by` that is not one of the listed columns, in the Python client's words.
pub fn check_sort(sort_by: &str, columns: &[&str]) -> Result<(), Failure> {
    if columns.contains(&sort_by) {
        return Ok(());
    }
    Err(Failure::plain(format!(
        "Invalid sort option {sort_by}; use one of {}",
        columns.join(", ")
    )))
}

/// Sorts objects by one key, as the Python client's `sorted(key=lambda x: x[sort_by])`.
pub fn sort_objects(items: &mut [Map<String, Value>], key: &str) {
    let mut keyed: Vec<(Py, Map<String, Value>)> = items
        .iter()
        .map(|item| {
            (
                Py::from(item.get(key).unwrap_or(&Value::Null)),
                item.clone(),
            )
        })
        .collect();
    let comparable = keyed.windows(2).all(|w| py_cmp(&w[0].0, &w[1].0).is_some());
    if !comparable {
        return;
    }
    keyed.sort_by(|a, b| py_cmp(&a.0, &b.0).unwrap_or(std::cmp::Ordering::Equal));
    for (slot, (_, item)) in items.iter_mut().zip(keyed) {
        *slot = item;
    }
}

fn csv_field(value: &Py, mode: QuoteMode, only_field: bool) -> String {
    let numeric = matches!(value, Py::Bool(_) | Py::Int(_) | Py::Float(_));
    let text = match value {
        Py::None => String::new(),
        other => other.str(),
    };
    let special = |c: char| c == ',' || c == '"' || c == '\n';
    let quote = match mode {
        QuoteMode::All => true,
        QuoteMode::Nonnumeric => !numeric,
        QuoteMode::Minimal => text.chars().any(special) || (only_field && text.is_empty()),
        QuoteMode::None => false,
    };
    if quote {
        let inner = text.replace('\\', "\\\\").replace('"', "\"\"");
        format!("\"{inner}\"")
    } else if mode == QuoteMode::None {
        let mut escaped = String::new();
        for c in text.chars() {
            if special(c) || c == '\\' {
                escaped.push('\\');
            }
            escaped.push(c);
        }
        escaped
    } else {
        text.replace('\\', "\\\\")
    }
}

fn csv_row(values: &[Py], mode: QuoteMode) -> String {
    let only = values.len() == 1;
    let fields: Vec<String> = values.iter().map(|v| csv_field(v, mode, only)).collect();
    format!("{}\n", fields.join(","))
}

/// Renders a list: `items` already sorted by the command's `--sort-by`; `list_columns` the
/// columns shown by default.
pub fn render_list(
    items: &[Map<String, Value>],
    list_columns: &[&str],
    out: &ListOutput,
) -> Result<String, Failure> {
    // python-blazarclient's ListCommand.setup_columns.
    let mut requested = out.columns.clone();
    let columns: Vec<String> = match items.first() {
        None => {
            requested.clear();
            Vec::new()
        }
        Some(first) => {
            let mut keys: Vec<String> = first.keys().cloned().collect();
            keys.sort();
            if !requested.is_empty() {
                requested
                    .iter()
                    .filter(|c| keys.contains(c))
                    .cloned()
                    .collect()
            } else if !list_columns.is_empty() {
                list_columns
                    .iter()
                    .filter(|c| keys.iter().any(|k| k == *c))
                    .map(|c| c.to_string())
                    .collect()
            } else {
                keys
            }
        }
    };
    let mut rows: Vec<Vec<Py>> = items
        .iter()
        .map(|item| {
            columns
                .iter()
                .map(|c| match item.get(c) {
                    None | Some(Value::Null) => Py::Str(String::new()),
                    Some(v) => Py::from(v),
                })
                .collect()
        })
        .collect();

    // cliff's --sort-column, last column first so that the first one wins.
    let normalized: Vec<String> = columns.iter().map(|c| normalize_column(c)).collect();
    let indexes: Vec<usize> = out
        .sort_columns
        .iter()
        .filter_map(|c| {
            columns
                .iter()
                .position(|x| x == c)
                .or_else(|| normalized.iter().position(|x| *x == normalize_column(c)))
        })
        .collect();
    for &index in indexes.iter().rev() {
        let comparable = rows
            .windows(2)
            .all(|w| py_cmp(&w[0][index], &w[1][index]).is_some());
        if comparable {
            rows.sort_by(|a, b| {
                let ordering = py_cmp(&a[index], &b[index]).unwrap_or(std::cmp::Ordering::Equal);
                if out.sort_descending {
                    ordering.reverse()
                } else {
                    ordering
                }
            });
        } else {
            eprintln!(
                "Could not sort on field '{}'; unsortable types",
                columns[index]
            );
        }
    }

    let (columns, rows) = match select_columns(&requested, &columns, false)? {
        None => (columns, rows),
        Some(selector) => {
            let pick = |values: Vec<Py>| -> Vec<Py> {
                values
                    .into_iter()
                    .zip(&selector)
                    .filter_map(|(v, keep)| keep.then_some(v))
                    .collect()
            };
            let names = columns.iter().cloned().map(Py::Str).collect::<Vec<_>>();
            let columns = pick(names).into_iter().map(|c| c.str()).collect();
            (columns, rows.into_iter().map(pick).collect())
        }
    };

    let mut text = String::new();
    match out.format {
        ListFormat::Table => {
            if rows.is_empty() && !out.table.print_empty {
                text.push('\n');
                return Ok(text);
            }
            let align = match rows.first() {
                Some(first) => first
                    .iter()
                    .map(|v| match v {
                        Py::Int(_) | Py::Float(_) => Align::Right,
                        _ => Align::Left,
                    })
                    .collect(),
                None => vec![Align::Left; columns.len()],
            };
            let cells = rows
                .iter()
                .map(|row| row.iter().map(Py::str).collect())
                .collect();
            let mut table = Table::new(columns, align, cells);
            if let Some(width) = fit_width(&out.table) {
                table.fit(width, 8);
            }
            text.push_str(&table.render());
            text.push('\n');
        }
        ListFormat::Json => {
            let list = Py::List(
                rows.into_iter()
                    .map(|row| Py::Dict(columns.iter().cloned().map(Py::Str).zip(row).collect()))
                    .collect(),
            );
            let indent = if out.noindent { None } else { Some(2) };
            text.push_str(&list.json_dumps(indent).unwrap_or_default());
            text.push('\n');
        }
        ListFormat::Value => {
            for row in rows {
                let cells: Vec<String> = row.iter().map(Py::str).collect();
                text.push_str(&cells.join(" "));
                text.push('\n');
            }
        }
        ListFormat::Yaml => {
            let list = Py::List(
                rows.into_iter()
                    .map(|row| Py::Dict(columns.iter().cloned().map(Py::Str).zip(row).collect()))
                    .collect(),
            );
            text.push_str(&yaml::dump(&list));
        }
        ListFormat::Csv => {
            let header: Vec<Py> = columns.iter().cloned().map(Py::Str).collect();
            text.push_str(&csv_row(&header, out.quote));
            for row in rows {
                text.push_str(&csv_row(&row, out.quote));
            }
        }
    }
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;
    use serde_json::json;

    #[derive(Parser)]
    struct ListArgs {
        #[command(flatten)]
        out: ListOutput,
    }

    #[derive(Parser)]
    struct ShowArgs {
        #[command(flatten)]
        out: ShowOutput,
    }

    /// The output options of a list command given `options` (split at spaces).
    fn list_out(options: &str) -> ListOutput {
        ListArgs::parse_from(["x"].into_iter().chain(options.split_whitespace())).out
    }

    /// The output options of a show command given `options` (split at spaces).
    fn show_out(options: &str) -> ShowOutput {
        ShowArgs::parse_from(["x"].into_iter().chain(options.split_whitespace())).out
    }

    fn hosts() -> Vec<Map<String, Value>> {
        [
            json!({"id": "1", "hypervisor_hostname": "compute-1", "vcpus": 8, "memory_mb": 16384, "local_gb": 100, "gpu": null}),
            json!({"id": "2", "hypervisor_hostname": "compute-2", "vcpus": 16, "memory_mb": 65536, "local_gb": 500, "gpu": "a,\"b\""}),
        ]
        .into_iter()
        .map(|v| v.as_object().cloned().unwrap())
        .collect()
    }

    const HOST_COLUMNS: &[&str] = &[
        "id",
        "hypervisor_hostname",
        "vcpus",
        "memory_mb",
        "local_gb",
    ];

    /// [`hosts`] as a list command prints them with `options`.
    fn render_hosts(options: &str) -> Result<String, Failure> {
        render_list(&hosts(), HOST_COLUMNS, &list_out(options))
    }

    #[test]
    fn list_formats() {
        assert_eq!(
            render_hosts("-f csv --max-width 0").unwrap(),
            "\"id\",\"hypervisor_hostname\",\"vcpus\",\"memory_mb\",\"local_gb\"\n\
             \"1\",\"compute-1\",8,16384,100\n\"2\",\"compute-2\",16,65536,500\n"
        );
        assert_eq!(
            render_hosts("-f value -c id -c gpu").unwrap(),
            "1 \n2 a,\"b\"\n"
        );
        assert_eq!(
            render_hosts("-f json -c vcpus --noindent").unwrap(),
            "[{\"vcpus\": 8}, {\"vcpus\": 16}]\n"
        );
        assert_eq!(
            render_hosts("-f csv --quote minimal -c gpu").unwrap(),
            "gpu\n\"\"\n\"a,\"\"b\"\"\"\n"
        );
        assert_eq!(
            render_hosts("-f value -c id -c vcpus --sort-column vcpus --sort-descending").unwrap(),
            "2 16\n1 8\n"
        );
        // As in cliff, a sort column that is not displayed is ignored.
        assert_eq!(
            render_hosts("-f value -c id --sort-column vcpus --sort-descending").unwrap(),
            "1\n2\n"
        );
        let empty = render_list(&[], HOST_COLUMNS, &list_out("-c id")).unwrap();
        assert_eq!(empty, "\n");
        let unknown = render_hosts("-c nope").unwrap_err();
        assert_eq!(
            unknown.message,
            "No recognized column names in ['nope']. Recognized columns are []."
        );
    }

    #[test]
    fn show_formats() {
        let object = json!({"id": "2", "reservable": true, "status": null, "vcpus": 16, "name": "say \"hi\""});
        // The object as a show command prints it with `options`.
        let show = |options| {
            render_show(
                show_fields(object.as_object().unwrap(), true),
                &show_out(options),
            )
        };
        assert_eq!(show("-f value -c id -c reservable").unwrap(), "2\nTrue\n");
        assert_eq!(
            show("-f shell --prefix h_ -c name").unwrap(),
            "h_name=\"say \\\"hi\\\"\"\n"
        );
        assert_eq!(
            show("-f json -c status -c vcpus").unwrap(),
            "{\n  \"status\": \"\",\n  \"vcpus\": 16\n}\n"
        );
        assert_eq!(
            show("-f yaml -c id -c reservable").unwrap(),
            "id: '2'\nreservable: true\n"
        );
        let error = show("-c x").unwrap_err();
        assert_eq!(
            error.message,
            "No recognized column names in ['x']. Recognized columns are ('id', 'name', 'reservable', 'status', 'vcpus')."
        );
    }

    #[test]
    fn values_are_formatted_like_python_blazarclient() {
        let cases = [
            (
                json!("{\"arch\": \"x86_64\", \"n\": [1]}"),
                "{\n    \"arch\": \"x86_64\",\n    \"n\": [\n        1\n    ]\n}",
            ),
            (json!(["r2", "r9"]), "r2\nr9"),
            (json!("None"), ""),
            (json!("16"), "16"),
            (json!("true"), "true"),
            (
                json!([{"a": 1}, {"b": null}]),
                "{\n    \"a\": 1\n}\n{\n    \"b\": null\n}",
            ),
            (json!("[]"), ""),
        ];
        for (value, expected) in cases {
            assert_eq!(format_value(&value).str(), expected, "{value}");
        }
        assert_eq!(format_value(&json!(16)), Py::Int(16));
        assert_eq!(format_value(&json!(false)), Py::Bool(false));
    }
}
