//! `ctxwin stats --proxy`: what each conversation of `ctxwin proxy` cost, from the bills kept
//! in the conversations' newest checkpoints ([`ctxwin_proxy::stored_bills`]): billed prompt
//! tokens, the bill against an estimate of sending the client's body direct, the stable share
//! of the forwarded prompts' bytes. As a table, or with `--json` as the same numbers the
//! proxy's `/metrics/conversations` serves.

use ctxwin_proxy::bills::bill_json;
use ctxwin_proxy::conv::bill::Bill;
use serde_json::json;

use crate::args::ProxyArgs;
use crate::error::CliError;
use crate::output::{Output, Table, thousands};
use crate::state::Globals;

pub(crate) fn run(globals: &Globals<'_>) -> Result<Output, CliError> {
    let none = ProxyArgs { upstream: None, listen: None, max_resident: None };
    let config = super::proxy::config(globals, &none, |key| std::env::var(key).ok())?;
    let mut bills = ctxwin_proxy::stored_bills(&config).map_err(CliError::Io)?;
    bills.sort_by(|a, b| b.1.billed_milli.cmp(&a.1.billed_milli).then(a.0.cmp(&b.0)));
    Ok(report(&bills))
}

/// The table and the JSON of `bills` (largest first), with their total.
fn report(bills: &[(String, Bill)]) -> Output {
    let mut total = Bill::default();
    for (_, bill) in bills {
        total.add_counts(bill);
    }
    let mut table = Table::new(&[
        ("conversation", false),
        ("requests", true),
        ("uncached", true),
        ("cache write", true),
        ("cache read", true),
        ("read share", true),
        ("bill × direct", true),
        ("stable bytes", true),
    ]);
    let share = |value: Option<f64>| value.map_or("-".into(), |v| format!("{:.0}%", v * 100.0));
    let rows = bills.iter().map(|(key, bill)| (short(key), bill)).chain([("total".into(), &total)]);
    for (name, bill) in rows {
        table.row(vec![
            name,
            thousands(bill.requests),
            thousands(bill.uncached),
            thousands(bill.cache_write),
            thousands(bill.cache_read),
            share(bill.cache_read_share()),
            bill.vs_direct().map_or("-".into(), |r| format!("{r:.2}")),
            share(bill.stable_share()),
        ]);
    }
    let text = if bills.is_empty() {
        "no proxy conversation has a checkpoint yet\n".to_string()
    } else {
        table.render()
    };
    let conversations: Vec<_> =
        bills.iter().map(|(key, bill)| bill_json(Some(key), bill)).collect();
    Output::report(text, json!({"total": bill_json(None, &total), "conversations": conversations}))
}

/// A conversation key (`<tenant>.<conversation>`, 64 hex digits each) shortened for a table:
/// the first 8 digits of each.
fn short(key: &str) -> String {
    match key.split_once('.') {
        Some((tenant, conversation)) => {
            let cut = |s: &str| s.chars().take(8).collect::<String>();
            format!("{}.{}", cut(tenant), cut(conversation))
        }
        None => key.chars().take(17).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_totals_the_conversations() {
        let bill = |billed: u64, direct: u64| Bill {
            requests: 2,
            uncached: 10,
            cache_write: 20,
            cache_read: 70,
            billed_milli: billed,
            direct_milli: direct,
            prompt_bytes: 1_000,
            stable_bytes: 900,
            ..Bill::default()
        };
        let key = format!("{}.{}", "a".repeat(64), "b".repeat(64));
        let bills = vec![(key.clone(), bill(3_000, 6_000)), ("old".into(), bill(1_000, 1_000))];
        let output = report(&bills);
        let text = output.render(false).unwrap();
        assert!(text.contains("aaaaaaaa.bbbbbbbb"), "{text}");
        assert!(text.lines().any(|l| l.starts_with("total") && l.contains("0.57")), "{text}");
        let json: serde_json::Value = serde_json::from_str(&output.render(true).unwrap()).unwrap();
        assert_eq!(json["total"]["requests"], 4);
        assert_eq!(json["conversations"][0]["conversation"], key.as_str());
        assert_eq!(json["conversations"][0]["bill_vs_direct"], 0.5);
        assert!(report(&[]).render(false).unwrap().contains("no proxy conversation"));
    }
}
