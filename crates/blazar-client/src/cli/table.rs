//! ASCII tables drawn the way cliff draws them with prettytable: `+---+` rules, one space of
//! padding, multi-line cells aligned at the top, and cliff's fitting of wide tables to a
//! maximum width.

use unicode_width::UnicodeWidthStr;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Align {
    Left,
    Right,
}

pub struct Table {
    pub columns: Vec<String>,
    pub align: Vec<Align>,
    pub rows: Vec<Vec<String>>,
    /// Per-column wrap width, set by [`Table::fit`].
    max_width: Vec<Option<usize>>,
}

/// Display width, as wcwidth counts it (East Asian wide characters take two cells).
pub fn width(text: &str) -> usize {
    UnicodeWidthStr::width(text)
}

/// What cliff and prettytable do to a cell before measuring it.
fn clean(cell: &str) -> String {
    let cell = cell.replace("\r\n", "\n").replace('\r', " ");
    if !cell.contains('\t') {
        return cell;
    }
    // Python's str.expandtabs(8), line by line.
    let mut out = String::new();
    for (i, line) in cell.split('\n').enumerate() {
        if i > 0 {
            out.push('\n');
        }
        let mut column = 0;
        for c in line.chars() {
            if c == '\t' {
                let spaces = 8 - column % 8;
                out.push_str(&" ".repeat(spaces));
                column += spaces;
            } else {
                out.push(c);
                column += 1;
            }
        }
    }
    out
}

fn pad(text: &str, width_wanted: usize, align: Align) -> String {
    let fill = " ".repeat(width_wanted.saturating_sub(width(text)));
    match align {
        Align::Left => format!("{text}{fill}"),
        Align::Right => format!("{fill}{text}"),
    }
}

impl Table {
    pub fn new(columns: Vec<String>, align: Vec<Align>, rows: Vec<Vec<String>>) -> Table {
        let count = columns.len();
        Table {
            columns,
            align,
            rows: rows
                .into_iter()
                .map(|row| row.iter().map(|c| clean(c)).collect())
                .collect(),
            max_width: vec![None; count],
        }
    }

    fn natural_widths(&self) -> Vec<usize> {
        let mut widths: Vec<usize> = self.columns.iter().map(|c| width(c)).collect();
        for row in &self.rows {
            for (i, cell) in row.iter().enumerate() {
                let cell_width = cell.split('\n').map(width).max().unwrap_or(0);
                let cell_width = match self.max_width.get(i).copied().flatten() {
                    Some(max) => cell_width.min(max),
                    None => cell_width,
                };
                if let Some(w) = widths.get_mut(i) {
                    *w = (*w).max(cell_width);
                }
            }
        }
        widths
    }

    /// cliff's `_assign_max_widths`: when the table is wider than `term_width`, columns
    /// wider than an equal share are shrunk to share what the narrow ones leave, never below
    /// `min_width`; their cells are then wrapped.
    pub fn fit(&mut self, term_width: usize, min_width: usize) {
        let widths = self.natural_widths();
        let total: usize = 1 + widths.iter().map(|w| w + 3).sum::<usize>();
        if total <= term_width || self.columns.is_empty() {
            return;
        }
        let count = self.columns.len();
        let usable = term_width.saturating_sub(1 + 3 * count);
        let optimal = usable / count;
        let mut shrink = Vec::new();
        let mut remaining = usable as isize;
        for (i, w) in widths.iter().enumerate() {
            if *w <= optimal {
                remaining -= *w as isize;
            } else {
                shrink.push(i);
            }
        }
        let Some((&last, rest)) = shrink.split_last() else {
            return;
        };
        let share = remaining / shrink.len() as isize;
        for &i in rest {
            self.max_width[i] = Some((share.max(min_width as isize)) as usize);
            remaining -= share;
        }
        self.max_width[last] = Some(remaining.max(min_width as isize) as usize);
    }

    pub fn render(&self) -> String {
        let widths = self.natural_widths();
        let rule: String = {
            let mut r = String::from("+");
            for w in &widths {
                r.push_str(&"-".repeat(w + 2));
                r.push('+');
            }
            r
        };
        let mut out = String::new();
        out.push_str(&rule);
        out.push('\n');
        out.push('|');
        for (i, column) in self.columns.iter().enumerate() {
            out.push(' ');
            out.push_str(&pad(column, widths[i], self.align[i]));
            out.push_str(" |");
        }
        out.push('\n');
        out.push_str(&rule);
        for row in &self.rows {
            let cells: Vec<Vec<String>> = row
                .iter()
                .enumerate()
                .map(|(i, cell)| {
                    cell.split('\n')
                        .flat_map(|line| match self.max_width[i] {
                            Some(max) if width(line) > max => wrap(line, max),
                            _ => vec![line.to_string()],
                        })
                        .collect()
                })
                .collect();
            let height = cells.iter().map(Vec::len).max().unwrap_or(1);
            for y in 0..height {
                out.push('\n');
                out.push('|');
                for (i, lines) in cells.iter().enumerate() {
                    let line = lines.get(y).map(String::as_str).unwrap_or("");
                    out.push(' ');
                    out.push_str(&pad(line, widths[i], self.align[i]));
                    out.push_str(" |");
                }
            }
        }
        if !self.rows.is_empty() {
            out.push('\n');
            out.push_str(&rule);
        }
        out
    }
}

/// A simplified `textwrap.wrap`: breaks at spaces (dropping them at line ends) and after
/// hyphens inside words, and cuts words longer than the width.
pub fn wrap(line: &str, max: usize) -> Vec<String> {
    let max = max.max(1);
    let mut chunks: Vec<String> = Vec::new();
    let mut current = String::new();
    for c in line.chars() {
        if c == ' ' {
            if !current.is_empty() && !current.ends_with(' ') {
                chunks.push(std::mem::take(&mut current));
            }
            current.push(c);
        } else {
            if current.ends_with(' ') {
                chunks.push(std::mem::take(&mut current));
            }
            current.push(c);
            if c == '-' && current.chars().filter(|c| c.is_alphanumeric()).count() > 1 {
                chunks.push(std::mem::take(&mut current));
            }
        }
    }
    if !current.is_empty() {
        chunks.push(current);
    }
    let mut lines: Vec<String> = Vec::new();
    let mut line_now = String::new();
    for chunk in chunks {
        let is_space = chunk.trim().is_empty();
        if width(&line_now) + width(&chunk) <= max {
            if !(is_space && line_now.is_empty()) {
                line_now.push_str(&chunk);
            }
            continue;
        }
        if is_space {
            lines.push(std::mem::take(&mut line_now).trim_end().to_string());
            continue;
        }
        if !line_now.trim().is_empty() {
            lines.push(std::mem::take(&mut line_now).trim_end().to_string());
        }
        let mut rest = chunk;
        while width(&rest) > max {
            let mut head = String::new();
            let mut tail = rest.chars();
            for c in tail.by_ref() {
                if width(&head) + width(c.encode_utf8(&mut [0; 4])) > max {
                    let mut remaining = String::from(c);
                    remaining.extend(tail);
                    rest = remaining;
                    break;
                }
                head.push(c);
            }
            lines.push(head);
        }
        line_now = rest;
    }
    if !line_now.trim().is_empty() {
        lines.push(line_now.trim_end().to_string());
    }
    if lines.is_empty() {
        lines.push(String::new());
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(cells: &[&str]) -> Vec<String> {
        cells.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn list_table_like_cliff() {
        let table = Table::new(
            strings(&["id", "hypervisor_hostname", "vcpus"]),
            vec![Align::Left, Align::Left, Align::Right],
            vec![
                strings(&["1", "compute-1", "8"]),
                strings(&["2", "compute-2", "16"]),
            ],
        );
        assert_eq!(
            table.render(),
            "+----+---------------------+-------+\n\
             | id | hypervisor_hostname | vcpus |\n\
             +----+---------------------+-------+\n\
             | 1  | compute-1           |     8 |\n\
             | 2  | compute-2           |    16 |\n\
             +----+---------------------+-------+"
        );
    }

    #[test]
    fn multi_line_cells_align_at_the_top() {
        let table = Table::new(
            strings(&["Field", "Value"]),
            vec![Align::Left, Align::Left],
            vec![
                strings(&["property_values", "r2\nr9"]),
                strings(&["x", "y"]),
            ],
        );
        assert_eq!(
            table.render(),
            "+-----------------+-------+\n\
             | Field           | Value |\n\
             +-----------------+-------+\n\
             | property_values | r2    |\n\
             |                 | r9    |\n\
             | x               | y     |\n\
             +-----------------+-------+"
        );
    }

    #[test]
    fn wrapping() {
        assert_eq!(wrap("aaa bbb ccc", 7), strings(&["aaa bbb", "ccc"]));
        assert_eq!(wrap("abcdefghij", 4), strings(&["abcd", "efgh", "ij"]));
        assert_eq!(wrap("compute-node-1", 9), strings(&["compute-", "node-1"]));
    }

    #[test]
    fn fitting_shrinks_the_wide_columns() {
        let mut table = Table::new(
            strings(&["Field", "Value"]),
            vec![Align::Left, Align::Left],
            vec![strings(&["reservations", &"word ".repeat(30)])],
        );
        table.fit(60, 16);
        assert!(
            table.render().lines().all(|l| width(l) <= 60),
            "{}",
            table.render()
        );
    }
}
