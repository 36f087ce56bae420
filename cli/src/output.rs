//! What commands print: a report (an aligned text form and a JSON form, picked by `--json`)
//! or a payload printed as is; aligned tables; numbers with thousands separators.

use std::io::{self, Write};

use serde_json::Value;

use super::error::CliError;

/// A command's result, printed to standard output.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Output {
    /// A report for people (`text`) and scripts (`json`).
    Report {
        /// The aligned text, ending with a newline.
        text: String,
        /// The same facts as JSON.
        json: Value,
    },
    /// A payload, printed as is whatever `--json` says.
    Raw(String),
}

impl Output {
    /// A report from its two forms.
    pub(crate) fn report(text: String, json: Value) -> Output {
        Output::Report { text, json }
    }

    /// The bytes to print.
    pub(crate) fn render(&self, json: bool) -> Result<String, CliError> {
        match self {
            Output::Raw(text) => Ok(text.clone()),
            Output::Report { text, .. } if !json => Ok(text.clone()),
            Output::Report { json, .. } => serde_json::to_string_pretty(json)
                .map(|text| text + "\n")
                .map_err(|e| CliError::Internal(format!("report does not serialize: {e}"))),
        }
    }

    /// Prints to standard output. A closed pipe (`ctxwin build | head`) is not an error: the
    /// reader has what it wanted.
    pub(crate) fn print(&self, json: bool) -> Result<(), CliError> {
        let text = self.render(json)?;
        let mut stdout = io::stdout().lock();
        match stdout.write_all(text.as_bytes()).and_then(|()| stdout.flush()) {
            Ok(()) => Ok(()),
            Err(error) if error.kind() == io::ErrorKind::BrokenPipe => Ok(()),
            Err(error) => Err(CliError::Io(format!(
                "cannot write to standard output: {error}; check where the output goes"
            ))),
        }
    }
}

pub(crate) use ctxwin_std::session::thousands;

/// Text shortened to one line of at most `width` characters.
pub(crate) fn one_line(text: &str, width: usize) -> String {
    let flat: String = text.split_whitespace().collect::<Vec<_>>().join(" ");
    if flat.chars().count() <= width {
        return flat;
    }
    let cut: String = flat.chars().take(width.saturating_sub(1)).collect();
    format!("{cut}…")
}

/// Rows of `key  value` pairs, keys padded to one width.
pub(crate) fn pairs(rows: &[(&str, String)]) -> String {
    let width = rows.iter().map(|(key, _)| key.chars().count()).max().unwrap_or(0);
    rows.iter().map(|(key, value)| format!("{key:<width$}  {value}\n")).collect()
}

/// A table with a header row; columns marked numeric are right-aligned.
#[derive(Clone, Debug)]
pub(crate) struct Table {
    headers: Vec<&'static str>,
    numeric: Vec<bool>,
    rows: Vec<Vec<String>>,
}

impl Table {
    /// A table with `columns`: (header, right-aligned).
    pub(crate) fn new(columns: &[(&'static str, bool)]) -> Table {
        Table {
            headers: columns.iter().map(|(header, _)| *header).collect(),
            numeric: columns.iter().map(|(_, numeric)| *numeric).collect(),
            rows: Vec::new(),
        }
    }

    /// Adds a row (missing cells are empty, extra ones dropped).
    pub(crate) fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    /// The aligned text; the last column is not padded.
    pub(crate) fn render(&self) -> String {
        let columns = self.headers.len();
        let cell = |row: &[String], index: usize| row.get(index).cloned().unwrap_or_default();
        let mut widths: Vec<usize> = self.headers.iter().map(|h| h.chars().count()).collect();
        for row in &self.rows {
            for (index, width) in widths.iter_mut().enumerate() {
                *width = (*width).max(cell(row, index).chars().count());
            }
        }
        let header: Vec<String> = self.headers.iter().map(|h| (*h).to_string()).collect();
        let mut out = String::new();
        for row in std::iter::once(&header).chain(&self.rows) {
            let mut line = String::new();
            for index in 0..columns {
                let text = cell(row, index);
                let width = widths.get(index).copied().unwrap_or(0);
                let last = index + 1 == columns;
                let right = self.numeric.get(index).copied().unwrap_or(false);
                if index > 0 {
                    line.push_str("  ");
                }
                match (right, last) {
                    (true, _) => line.push_str(&format!("{text:>width$}")),
                    (false, true) => line.push_str(&text),
                    (false, false) => line.push_str(&format!("{text:<width$}")),
                }
            }
            out.push_str(line.trim_end());
            out.push('\n');
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_get_separators() {
        assert_eq!(thousands(0u32), "0");
        assert_eq!(thousands(999u32), "999");
        assert_eq!(thousands(1_000u32), "1,000");
        assert_eq!(thousands(28_672u32), "28,672");
        assert_eq!(thousands(1_234_567u64), "1,234,567");
    }

    #[test]
    fn tables_align() {
        let mut table = Table::new(&[("id", true), ("role", false), ("text", false)]);
        table.row(vec!["7".into(), "user".into(), "hello".into()]);
        table.row(vec!["123".into(), "assistant".into(), "hi".into()]);
        assert_eq!(
            table.render(),
            " id  role       text\n  7  user       hello\n123  assistant  hi\n"
        );
    }

    #[test]
    fn reports_print_either_form() {
        let output = Output::report("a  1\n".into(), serde_json::json!({"a": 1}));
        assert_eq!(output.render(false).unwrap(), "a  1\n");
        assert_eq!(output.render(true).unwrap(), "{\n  \"a\": 1\n}\n");
        assert_eq!(Output::Raw("x".into()).render(true).unwrap(), "x");
    }

    #[test]
    fn long_text_is_cut_to_one_line() {
        assert_eq!(one_line("a\n  b", 10), "a b");
        assert_eq!(one_line("abcdefghij", 5), "abcd…");
        assert_eq!(pairs(&[("a", "1".into()), ("bbb", "2".into())]), "a    1\nbbb  2\n");
    }
}
