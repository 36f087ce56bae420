//! Formatting retrieved messages as a block for the payload's dynamic context.

use ctxwin_core::Role;

use super::{ArchivedMessage, SearchHit};

/// First line of every block.
const HEADER: &str = "[Retrieved from archive]";

/// An entry is only included when it can get at least this many characters (its prefix
/// included), so a tight budget gives fewer readable lines rather than many stubs.
const MIN_LINE_CHARS: usize = 48;

/// Formats search hits (best first) as a dynamic-context block of at most `max_chars`
/// characters: a header line, then one line per hit, `- (msg ID, ROLE) text`, with whitespace
/// collapsed and long texts cut with `…`. The budget is shared fairly; the lowest-ranked hits
/// are left out when it cannot give each a readable line. Empty when nothing fits.
///
/// # Examples
///
/// ```
/// use ctxwin_std::archive::{Archive, ArchivedMessage, as_dynamic_context};
/// use ctxwin_std::{ChatMessage, core::Role};
///
/// let mut archive = Archive::open_in_memory()?;
/// archive.store_unit("s", &[ArchivedMessage::new(123, 9,
///     ChatMessage::text(Role::User, "use\nPostgres 16 for the queue"))])?;
/// let hits = archive.search(Some("s"), "postgres", 5)?;
/// assert_eq!(
///     as_dynamic_context(&hits, 500),
///     "[Retrieved from archive]\n- (msg 123, user) use Postgres 16 for the queue"
/// );
/// assert_eq!(as_dynamic_context(&hits, 10), "");
/// # Ok::<(), ctxwin_std::archive::ArchiveError>(())
/// ```
pub fn as_dynamic_context(hits: &[SearchHit], max_chars: usize) -> String {
    let entries: Vec<(u64, Role, &str)> =
        hits.iter().map(|hit| (hit.id, hit.role, hit.content.as_str())).collect();
    format_block(&entries, max_chars)
}

/// Like [`as_dynamic_context`] for whole archived messages (from `recent`, `unit` or
/// `drill_down`), in the order given; uses the stored (possibly reduced) content.
///
/// ```
/// use ctxwin_std::archive::{ArchivedMessage, messages_as_dynamic_context};
/// use ctxwin_std::{ChatMessage, core::Role};
/// let m = ArchivedMessage::new(5, 5, ChatMessage::text(Role::Assistant, "done"));
/// assert_eq!(
///     messages_as_dynamic_context(&[m], 200),
///     "[Retrieved from archive]\n- (msg 5, assistant) done"
/// );
/// ```
pub fn messages_as_dynamic_context(messages: &[ArchivedMessage], max_chars: usize) -> String {
    let entries: Vec<(u64, Role, &str)> =
        messages.iter().map(|m| (m.id, m.message.role, m.message.content.as_str())).collect();
    format_block(&entries, max_chars)
}

fn format_block(entries: &[(u64, Role, &str)], max_chars: usize) -> String {
    // Each line costs its newline too.
    let Some(budget) = max_chars.checked_sub(HEADER.chars().count()) else {
        return String::new();
    };
    let fitting = (budget / MIN_LINE_CHARS).min(entries.len());
    let lines: Vec<(String, String)> = entries
        .iter()
        .take(fitting)
        .map(|(id, role, text)| {
            let flat = text.split_whitespace().collect::<Vec<_>>().join(" ");
            (format!("\n- (msg {id}, {role}) "), flat)
        })
        .collect();
    if lines.is_empty() {
        return String::new();
    }
    let needs: Vec<usize> =
        lines.iter().map(|(prefix, text)| prefix.chars().count() + text.chars().count()).collect();
    let allotted = water_fill(&needs, budget);
    let mut block = String::from(HEADER);
    for ((prefix, text), allot) in lines.iter().zip(allotted) {
        let room = allot.saturating_sub(prefix.chars().count());
        block.push_str(prefix);
        if text.chars().count() <= room {
            block.push_str(text);
        } else {
            block.extend(text.chars().take(room.saturating_sub(1)));
            block.push('…');
        }
    }
    block
}

/// Shares `budget` among `needs` so that no one gets more than it needs and the rest is split
/// evenly (smallest needs served first).
fn water_fill(needs: &[usize], budget: usize) -> Vec<usize> {
    let mut order: Vec<usize> = (0..needs.len()).collect();
    order.sort_by_key(|&i| needs.get(i).copied().unwrap_or(0));
    let mut allotted = vec![0; needs.len()];
    let mut left = budget;
    for (served, &index) in order.iter().enumerate() {
        let share = left / (needs.len() - served);
        let give = needs.get(index).copied().unwrap_or(0).min(share);
        if let Some(slot) = allotted.get_mut(index) {
            *slot = give;
        }
        left -= give;
    }
    allotted
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::ChatMessage;
    use proptest::prelude::*;

    fn message(id: u64, text: &str) -> ArchivedMessage {
        ArchivedMessage::new(id, id, ChatMessage::text(Role::User, text))
    }

    #[test]
    fn long_entries_share_the_budget_and_short_ones_keep_their_text() {
        let long = "word ".repeat(200);
        let block = messages_as_dynamic_context(
            &[message(1, &long), message(2, "short"), message(3, &long)],
            300,
        );
        assert!(block.chars().count() <= 300);
        assert!(block.contains("- (msg 2, user) short\n"));
        assert_eq!(block.matches('…').count(), 2);
        assert!(block.starts_with("[Retrieved from archive]\n- (msg 1, user) word word"));
    }

    #[test]
    fn tight_budget_keeps_the_top_entries() {
        let many: Vec<_> = (1..=10).map(|i| message(i, "some text to show")).collect();
        let block = messages_as_dynamic_context(&many, 24 + 2 * MIN_LINE_CHARS);
        assert_eq!(block.lines().count(), 3);
        assert!(block.contains("(msg 1,") && block.contains("(msg 2,"));
    }

    #[test]
    fn nothing_to_show_is_empty() {
        assert_eq!(messages_as_dynamic_context(&[], 1_000), "");
    }

    proptest! {
        #[test]
        fn never_exceeds_the_budget(
            texts in proptest::collection::vec(any::<String>(), 0..8),
            max_chars in 0_usize..2_000,
        ) {
            let messages: Vec<_> =
                (0_u64..).zip(&texts).map(|(i, t)| message(i, t)).collect();
            let block = messages_as_dynamic_context(&messages, max_chars);
            prop_assert!(block.chars().count() <= max_chars);
        }
    }
}
