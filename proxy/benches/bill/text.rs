//! Realistic text for the generated session: a source tree (Rust, TypeScript, Python) whose
//! files the agent reads and edits, build and test logs, server logs, grep output.

use crate::rng::Rng;

const NOUNS: &[&str] = &[
    "invoice",
    "ledger",
    "account",
    "payment",
    "refund",
    "tax_rate",
    "customer",
    "currency",
    "balance",
    "statement",
    "subscription",
    "coupon",
    "receipt",
    "batch",
    "settlement",
    "webhook",
    "audit_entry",
    "price",
    "discount",
    "period",
    "credit_note",
    "usage_record",
    "plan",
    "seat",
];
const VERBS: &[&str] = &[
    "compute",
    "apply",
    "validate",
    "load",
    "store",
    "reconcile",
    "round",
    "merge",
    "split",
    "render",
    "parse",
    "encode",
    "fetch",
    "retry",
    "flush",
    "post",
    "void",
    "close",
    "open",
    "schedule",
    "prorate",
    "charge",
    "export",
    "import",
];
const TYPES: &[&str] = &[
    "Invoice",
    "LedgerEntry",
    "Account",
    "Payment",
    "Money",
    "TaxRate",
    "Customer",
    "Currency",
    "Statement",
    "Subscription",
    "Coupon",
    "Receipt",
    "Batch",
    "Settlement",
    "WebhookEvent",
    "AuditEntry",
    "PriceBook",
    "Discount",
    "Period",
    "CreditNote",
    "UsageRecord",
    "Plan",
];
const ERRORS: &[&str] = &["BillingError", "LedgerError", "StoreError", "ExportError"];
const ADJECTIVES: &[&str] =
    &["closed", "negative", "stale", "duplicated", "missing", "locked", "expired", "empty"];
const MODULES: &[&str] = &[
    "ledger",
    "invoice",
    "tax",
    "payments",
    "export",
    "webhooks",
    "store",
    "pricing",
    "audit",
    "subscriptions",
    "money",
    "reports",
];

/// One source file of the generated repository.
#[derive(Clone, Debug)]
pub struct File {
    /// Its path in the repository (`src/ledger/posting.rs`).
    pub path: String,
    /// Its lines, without line ends.
    pub lines: Vec<String>,
}

/// The generated repository the session works on.
#[derive(Clone, Debug)]
pub struct Repo {
    /// Its files.
    pub files: Vec<File>,
}

/// Lines as Claude Code's `Read` shows them: `cat -n` style, the number right-aligned in six
/// columns, a tab, the line.
pub fn numbered(lines: &[String], first: usize) -> String {
    let mut out = String::with_capacity(lines.iter().map(|l| l.len() + 8).sum());
    for (i, line) in lines.iter().enumerate() {
        if i > 0 {
            out.push('\n');
        }
        out.push_str(&format!("{:>6}\t{line}", first + i));
    }
    out
}

/// `text` with the `cat -n` prefix of each line removed (what the model reads as the file's
/// content when it quotes it in an `Edit`).
pub fn strip_line_numbers(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for (i, line) in text.split('\n').enumerate() {
        if i > 0 {
            out.push('\n');
        }
        let trimmed = line.trim_start_matches(' ');
        let digits = trimmed.bytes().take_while(u8::is_ascii_digit).count();
        if digits > 0 && trimmed.as_bytes().get(digits) == Some(&b'\t') {
            out.push_str(&trimmed[digits + 1..]);
        } else {
            out.push_str(line);
        }
    }
    out
}

fn pick(rng: &mut Rng, words: &'static [&'static str]) -> &'static str {
    words[rng.range(0, words.len() - 1)]
}

fn ident(rng: &mut Rng) -> String {
    format!("{}_{}", pick(rng, VERBS), pick(rng, NOUNS))
}

fn rust_statement(rng: &mut Rng, k: usize, depth: usize) -> Vec<String> {
    let pad = "    ".repeat(depth);
    let noun = pick(rng, NOUNS);
    let ty = pick(rng, TYPES);
    let err = pick(rng, ERRORS);
    let n = rng.range(2, 9_999);
    match rng.range(0, 9) {
        0 => vec![format!(
            "{pad}let {noun}_{k} = self.{}s.get(&id).ok_or({err}::Missing {{ id, kind: \"{noun}\" }})?;",
            pick(rng, NOUNS)
        )],
        1 => vec![
            format!("{pad}if {noun}_{k}.amount.cents() > {n} {{"),
            format!("{pad}    return Err({err}::OverLimit {{ id, limit: {n} }});"),
            format!("{pad}}}"),
        ],
        2 => vec![
            format!("{pad}for line in &{noun}_{k}.lines {{"),
            format!(
                "{pad}    total = total.checked_add(line.amount.round_to({}))?;",
                rng.range(0, 4)
            ),
            format!("{pad}}}"),
        ],
        3 => vec![format!(
            "{pad}tracing::debug!(id = %id, step = {k}, \"{} {noun} {n}\");",
            pick(rng, VERBS)
        )],
        4 => vec![format!(
            "{pad}let rate_{k} = TaxRate::from_basis_points({n}).context(\"{} {noun}\")?;",
            pick(rng, VERBS)
        )],
        5 => vec![
            format!("{pad}match {noun}_{k}.status {{"),
            format!("{pad}    Status::Open => self.{}(&{noun}_{k})?,", ident(rng)),
            format!(
                "{pad}    Status::{} => return Ok({ty}::default()),",
                capitalize(pick(rng, ADJECTIVES))
            ),
            format!("{pad}    other => return Err({err}::State {{ id, state: other }}),"),
            format!("{pad}}}"),
        ],
        6 => vec![format!(
            "{pad}// {} the {noun} before {} it: see issue #{n}.",
            capitalize(pick(rng, VERBS)),
            pick(rng, VERBS)
        )],
        7 => vec![format!(
            "{pad}let {noun}s_{k}: Vec<{ty}> = batch.iter().filter(|e| e.period == period).cloned().collect();"
        )],
        8 => vec![format!(
            "{pad}self.metrics.{noun}_{}.fetch_add({}, Ordering::Relaxed);",
            pick(rng, VERBS),
            rng.range(1, 8)
        )],
        _ => vec![format!(
            "{pad}total = total.saturating_sub(Money::cents({n}, {noun}_{k}.currency));"
        )],
    }
}

fn capitalize(word: &str) -> String {
    let mut out = String::new();
    for part in word.split('_') {
        let mut chars = part.chars();
        if let Some(first) = chars.next() {
            out.extend(first.to_uppercase());
            out.push_str(chars.as_str());
        }
    }
    out
}

fn rust_file(rng: &mut Rng, bytes: usize, salt: usize) -> Vec<String> {
    let module = pick(rng, MODULES);
    let mut lines = vec![
        format!(
            "//! {} {}: {} and {} of {}s.",
            capitalize(module),
            pick(rng, NOUNS),
            pick(rng, VERBS),
            pick(rng, VERBS),
            pick(rng, NOUNS)
        ),
        String::new(),
        "use std::collections::BTreeMap;".into(),
        "use std::sync::atomic::Ordering;".into(),
        String::new(),
        format!(
            "use crate::{{money::Money, {}::{}, error::{}}};",
            pick(rng, MODULES),
            pick(rng, TYPES),
            pick(rng, ERRORS)
        ),
        String::new(),
    ];
    let mut size: usize = lines.iter().map(|l| l.len() + 1).sum();
    let mut k = salt * 1000;
    while size < bytes {
        k += 1;
        let (verb, noun, ty, err) =
            (pick(rng, VERBS), pick(rng, NOUNS), pick(rng, TYPES), pick(rng, ERRORS));
        let mut item = vec![
            format!(
                "/// {}s the {noun} of `id` for `period` and returns the {} it {}s.",
                capitalize(verb),
                pick(rng, TYPES),
                pick(rng, VERBS)
            ),
            "///".into(),
            format!(
                "/// Fails with [`{err}::{}`] when the {noun} is {}.",
                capitalize(pick(rng, ADJECTIVES)),
                pick(rng, ADJECTIVES)
            ),
            format!(
                "pub fn {verb}_{noun}_{k}(&self, id: {ty}Id, period: Period) -> Result<{ty}, {err}> {{"
            ),
            format!(
                "    let mut total = Money::zero(Currency::{});",
                rng.pick(&["Eur", "Usd", "Gbp", "Chf"])
            ),
        ];
        for _ in 0..rng.range(3, 12) {
            item.extend(rust_statement(rng, k, 1));
        }
        item.push(format!("    Ok({ty}::new(id, total))"));
        item.push("}".into());
        item.push(String::new());
        if rng.chance(0.15) {
            item.extend([
                "#[cfg(test)]".to_string(),
                format!("mod tests_{k} {{"),
                "    use super::*;".into(),
                String::new(),
                "    #[test]".into(),
                format!("    fn {verb}s_{noun}_{k}_to_the_cent() {{"),
                format!("        let book = fixtures::book_{}();", rng.range(1, 40)),
                format!("        assert_eq!(book.{verb}_{noun}_{k}(ID, PERIOD).unwrap().total(), Money::cents({}, Currency::Eur));", rng.range(100, 99_999)),
                "    }".into(),
                "}".into(),
                String::new(),
            ]);
        }
        size += item.iter().map(|l| l.len() + 1).sum::<usize>();
        lines.extend(item);
    }
    lines
}

fn ts_file(rng: &mut Rng, bytes: usize, salt: usize) -> Vec<String> {
    let mut lines = vec![
        format!(
            "import {{ {}, {} }} from \"../api/{}\";",
            pick(rng, TYPES),
            pick(rng, TYPES),
            pick(rng, MODULES)
        ),
        "import { formatMoney } from \"../money\";".into(),
        String::new(),
    ];
    let mut size = 80;
    let mut k = salt * 1000;
    while size < bytes {
        k += 1;
        let (verb, noun, ty) = (pick(rng, VERBS), pick(rng, NOUNS), pick(rng, TYPES));
        let camel = format!("{verb}{}{k}", capitalize(noun));
        let mut item = vec![
            "/**".to_string(),
            format!(
                " * {} the {} shown in the {} panel.",
                capitalize(verb),
                noun.replace('_', " "),
                pick(rng, MODULES)
            ),
            " */".into(),
            format!(
                "export async function {camel}(client: ApiClient, id: string): Promise<{ty}> {{"
            ),
            format!(
                "  const response = await client.get(`/v2/{noun}s/${{id}}?expand={}`);",
                pick(rng, NOUNS)
            ),
            "  if (!response.ok) {".into(),
            format!("    throw new ApiError(response.status, \"{verb} {noun} failed ({k})\");"),
            "  }".into(),
            format!("  const body = (await response.json()) as {ty}Payload;"),
        ];
        for _ in 0..rng.range(2, 8) {
            let n = rng.range(1, 9999);
            item.push(match rng.range(0, 3) {
                0 => format!(
                    "  const {}{k} = body.{}.filter((row) => row.amount > {n});",
                    pick(rng, NOUNS).replace('_', ""),
                    pick(rng, NOUNS)
                ),
                1 => format!("  console.debug(\"{camel}\", id, {n});"),
                2 => format!("  body.total = formatMoney(body.total_cents - {n}, body.currency);"),
                _ => format!(
                    "  // {} before rendering: the {} panel expects cents",
                    pick(rng, VERBS),
                    pick(rng, MODULES)
                ),
            });
        }
        item.push(format!("  return new {ty}(body);"));
        item.push("}".into());
        item.push(String::new());
        size += item.iter().map(|l| l.len() + 1).sum::<usize>();
        lines.extend(item);
    }
    lines
}

fn py_file(rng: &mut Rng, bytes: usize, salt: usize) -> Vec<String> {
    let mut lines = vec![
        format!(
            "\"\"\"{} tooling: {} {}s from the ledger export.\"\"\"",
            capitalize(pick(rng, MODULES)),
            pick(rng, VERBS),
            pick(rng, NOUNS)
        ),
        String::new(),
        "import csv".into(),
        "import decimal".into(),
        "from pathlib import Path".into(),
        String::new(),
    ];
    let mut size = 100;
    let mut k = salt * 1000;
    while size < bytes {
        k += 1;
        let (verb, noun) = (pick(rng, VERBS), pick(rng, NOUNS));
        let mut item = vec![
            format!("def {verb}_{noun}_{k}(rows, period, *, strict=False):"),
            format!(
                "    \"\"\"{} every {} of `period`; raise ValueError when one is {}.\"\"\"",
                capitalize(verb),
                noun.replace('_', " "),
                pick(rng, ADJECTIVES)
            ),
            "    total = decimal.Decimal(0)".into(),
            "    for row in rows:".into(),
        ];
        for _ in 0..rng.range(2, 7) {
            let n = rng.range(1, 9999);
            item.push(match rng.range(0, 2) {
                0 => format!("        if row[\"{}\"] > {n} and strict:", pick(rng, NOUNS)),
                1 => format!("        total += decimal.Decimal(row[\"amount_{k}\"]).quantize(decimal.Decimal(\"0.{:0>2}\"))", rng.range(1, 99)),
                _ => format!("        log.debug(\"{verb} %s {noun} %d\", row[\"id\"], {n})"),
            });
        }
        item.push("    return total".into());
        item.push(String::new());
        item.push(String::new());
        size += item.iter().map(|l| l.len() + 1).sum::<usize>();
        lines.extend(item);
    }
    lines
}

impl Repo {
    /// A repository of `files` files, each between 1 and 40 KB.
    pub fn generate(rng: &mut Rng, files: usize) -> Self {
        let mut out = Vec::with_capacity(files);
        for i in 0..files {
            let bytes = rng.log_uniform(1_000, 40_000);
            let module = MODULES[i % MODULES.len()];
            let name = pick(rng, NOUNS);
            let (path, lines) = match rng.range(0, 9) {
                0..=5 => (format!("src/{module}/{name}_{i}.rs"), rust_file(rng, bytes, i)),
                6..=7 => (
                    format!("web/src/{module}/{}{i}.ts", name.replace('_', "")),
                    ts_file(rng, bytes, i),
                ),
                _ => (format!("scripts/{module}_{name}_{i}.py"), py_file(rng, bytes, i)),
            };
            out.push(File { path, lines });
        }
        Repo { files: out }
    }
}

/// A `cargo test` run of about `bytes` bytes; with `failing`, some tests fail with their
/// panics and the run ends in error.
pub fn cargo_test_log(rng: &mut Rng, repo: &Repo, bytes: usize, failing: bool) -> String {
    let mut out = String::new();
    for krate in ["money", "ledger-core", "billing-store", "billing-api", "billing"] {
        out.push_str(&format!(
            "   Compiling {krate} v0.{}.{} (/work/acme-billing/crates/{krate})\n",
            rng.range(1, 9),
            rng.range(0, 20)
        ));
    }
    if rng.chance(0.5) {
        let file = rng.pick(&repo.files);
        out.push_str(&format!(
            "warning: unused variable: `{}_{}`\n  --> {}:{}:{}\n   |\n{:>3} |     let {}_{} = self.load()?;\n   |         ^^^^ help: if this is intentional, prefix it with an underscore\n   |\n   = note: `#[warn(unused_variables)]` on by default\n\n",
            pick(rng, NOUNS), rng.range(1, 999), file.path, rng.range(1, file.lines.len()), rng.range(5, 30), rng.range(1, 999), pick(rng, NOUNS), rng.range(1, 999)
        ));
    }
    out.push_str(&format!(
        "    Finished `test` profile [unoptimized + debuginfo] target(s) in {}.{:02}s\n",
        rng.range(1, 90),
        rng.range(0, 99)
    ));
    out.push_str(&format!(
        "     Running unittests src/lib.rs (target/debug/deps/billing-{})\n\n",
        rng.hex(16)
    ));
    let mut failed = Vec::new();
    let mut passed = 0;
    let mut lines = String::new();
    while out.len() + lines.len() < bytes.saturating_sub(600) {
        let name = format!(
            "{}::tests::{}s_{}_{}",
            pick(rng, MODULES),
            pick(rng, VERBS),
            pick(rng, NOUNS),
            rng.range(1, 999)
        );
        if failing && rng.chance(0.04) {
            lines.push_str(&format!("test {name} ... FAILED\n"));
            failed.push(name);
        } else {
            lines.push_str(&format!("test {name} ... ok\n"));
            passed += 1;
        }
    }
    if failing && failed.is_empty() {
        let name = format!("{}::tests::rounds_{}_half_even", pick(rng, MODULES), pick(rng, NOUNS));
        lines.push_str(&format!("test {name} ... FAILED\n"));
        failed.push(name);
    }
    out.push_str(&format!("running {} tests\n", passed + failed.len()));
    out.push_str(&lines);
    if !failed.is_empty() {
        out.push_str("\nfailures:\n\n");
        for name in &failed {
            let file = rng.pick(&repo.files);
            let expected = rng.range(100, 99_999);
            out.push_str(&format!(
                "---- {name} stdout ----\n\nthread '{name}' panicked at {}:{}:{}:\nassertion `left == right` failed\n  left: Money {{ cents: {}, currency: Eur }}\n right: Money {{ cents: {expected}, currency: Eur }}\nnote: run with `RUST_BACKTRACE=1` environment variable to display a backtrace\n\n",
                file.path, rng.range(1, file.lines.len()), rng.range(5, 40), expected + 1
            ));
        }
        out.push_str("\nfailures:\n");
        for name in &failed {
            out.push_str(&format!("    {name}\n"));
        }
        out.push_str(&format!("\ntest result: FAILED. {passed} passed; {} failed; 0 ignored; 0 measured; 0 filtered out; finished in {}.{:02}s\n\nerror: test failed, to rerun pass `--lib`", failed.len(), rng.range(0, 20), rng.range(0, 99)));
    } else {
        out.push_str(&format!("\ntest result: ok. {passed} passed; 0 failed; 0 ignored; 0 measured; 0 filtered out; finished in {}.{:02}s", rng.range(0, 20), rng.range(0, 99)));
    }
    out
}

/// A compiler error (the agent's build failed).
pub fn compile_error(rng: &mut Rng, repo: &Repo) -> String {
    let file = rng.pick(&repo.files);
    let line = rng.range(1, file.lines.len());
    format!(
        "   Compiling billing v0.4.2 (/work/acme-billing/crates/billing)\nerror[E0308]: mismatched types\n  --> {}:{line}:{}\n   |\n{line:>3} |     Ok({}::new(id, total))\n   |     -- ^^^^^^^^^^^^^^^^^^^^^^^^ expected `{}`, found `{}`\n   |     |\n   |     arguments to this enum variant are incorrect\n\nerror: could not compile `billing` (lib) due to 1 previous error\nExit code 101",
        file.path,
        rng.range(5, 40),
        pick(rng, TYPES),
        pick(rng, TYPES),
        pick(rng, TYPES)
    )
}

/// A service log of about `bytes` bytes.
pub fn server_log(rng: &mut Rng, bytes: usize) -> String {
    let mut out = String::with_capacity(bytes + 200);
    let (mut minute, mut ms) = (rng.range(0, 59), 0usize);
    while out.len() < bytes {
        ms += rng.range(1, 900);
        if ms >= 60_000 {
            ms -= 60_000;
            minute = (minute + 1) % 60;
        }
        let level = if rng.chance(0.05) {
            "WARN "
        } else if rng.chance(0.02) {
            "ERROR"
        } else {
            "INFO "
        };
        let noun = pick(rng, NOUNS);
        let line = match rng.range(0, 3) {
            0 => format!(
                "2026-03-14T10:{minute:02}:{:02}.{:03}Z {level} billing_api::http{{req_id={}}}: {} /v2/{noun}s/{} {} {}ms",
                ms / 1000,
                ms % 1000,
                rng.hex(8),
                rng.pick(&["GET", "POST", "PATCH"]),
                rng.range(1000, 99999),
                rng.pick(&["200", "200", "201", "404", "409", "500"]),
                rng.range(1, 800)
            ),
            1 => format!(
                "2026-03-14T10:{minute:02}:{:02}.{:03}Z {level} billing::{}: {} {noun} batch={} rows={} elapsed={}ms",
                ms / 1000,
                ms % 1000,
                pick(rng, MODULES),
                pick(rng, VERBS),
                rng.range(1, 9999),
                rng.range(1, 50_000),
                rng.range(1, 4000)
            ),
            2 => format!(
                "2026-03-14T10:{minute:02}:{:02}.{:03}Z {level} sqlx::query: summary=\"SELECT {noun}_id, amount_cents FROM {noun}s …\" db.statement=\"\" rows_affected={} rows_returned={} elapsed={}.{:03}ms",
                ms / 1000,
                ms % 1000,
                rng.range(0, 20),
                rng.range(0, 500),
                rng.range(0, 90),
                rng.range(0, 999)
            ),
            _ => format!(
                "2026-03-14T10:{minute:02}:{:02}.{:03}Z {level} billing::webhooks: delivery {} to https://hooks.example.com/{} attempt={} status={}",
                ms / 1000,
                ms % 1000,
                rng.hex(12),
                rng.hex(6),
                rng.range(1, 5),
                rng.pick(&["200", "502", "timeout"])
            ),
        };
        out.push_str(&line);
        out.push('\n');
    }
    out.pop();
    out
}

/// `rg -n PATTERN` over `repo`: the matching lines of every file, at most `limit`.
pub fn grep(repo: &Repo, pattern: &str, limit: usize) -> String {
    let mut out = Vec::new();
    'files: for file in &repo.files {
        for (i, line) in file.lines.iter().enumerate() {
            if line.contains(pattern) {
                out.push(format!("{}:{}:{line}", file.path, i + 1));
                if out.len() >= limit {
                    break 'files;
                }
            }
        }
    }
    if out.is_empty() { "No matches found".to_string() } else { out.join("\n") }
}

/// A word the repository uses (for grep patterns and prose).
pub fn word(rng: &mut Rng) -> String {
    format!("{}_{}", pick(rng, VERBS), pick(rng, NOUNS))
}

/// A noun of the billing domain.
pub fn noun(rng: &mut Rng) -> &'static str {
    pick(rng, NOUNS)
}

/// A verb of the billing domain.
pub fn verb(rng: &mut Rng) -> &'static str {
    pick(rng, VERBS)
}

/// A module name.
pub fn module(rng: &mut Rng) -> &'static str {
    pick(rng, MODULES)
}

/// `n` sentences of an agent's reasoning about `subject`.
pub fn reasoning(rng: &mut Rng, subject: &str, n: usize) -> String {
    let mut out = String::new();
    for i in 0..n {
        if i > 0 {
            out.push(' ');
        }
        let (a, b, c) = (pick(rng, NOUNS), pick(rng, VERBS), pick(rng, MODULES));
        out.push_str(&match rng.range(0, 7) {
            0 => format!("The user wants me to {b} the {a} handling in {subject}."),
            1 => format!("Looking at {subject}, the {a} is {}d before the {} is {}d, which explains the off-by-one-cent totals.", pick(rng, VERBS), pick(rng, NOUNS), pick(rng, VERBS)),
            2 => format!("I should check how {c} calls into this before changing the signature, since {} other call sites may depend on the rounding.", rng.range(2, 9)),
            3 => format!("The test failure says left {} and right {}, so the difference is exactly one rounding step in the {a} path.", rng.range(100, 9999), rng.range(100, 9999)),
            4 => format!("Maybe the simplest fix is to {b} the {a} once at the boundary instead of on every line item."),
            5 => format!("I'll read the {c} module first, then grep for `{b}_{a}` to find every caller."),
            6 => format!("Wait, the {a} could be {} here; the early return has to stay above the loop.", pick(rng, ADJECTIVES)),
            _ => format!("Let me run the {c} tests again after the edit to confirm nothing else regressed."),
        });
    }
    out
}
