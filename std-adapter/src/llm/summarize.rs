//! Rolling conversation summaries, and the checks an answer must pass to count as one.

use std::collections::HashSet;
use std::time::Duration;

use super::budget::fit;
use super::prompts::{SUMMARY_SYSTEM_PROMPT, render_transcript, summary_request};
use super::{LlmClient, LlmError, LlmUsage};
use crate::message::ChatMessage;

/// Words per n-gram when comparing texts.
const SHINGLE: usize = 4;

/// A checked summary from [`LlmClient::summarize`].
#[derive(Clone, Debug, PartialEq)]
pub struct LlmSummary {
    /// The summary, trimmed, without a leading "Summary:" label.
    pub text: String,
    /// Token usage the server reported.
    pub usage: Option<LlmUsage>,
    /// Wall time of the request, retries included.
    pub latency: Duration,
    /// Attempts made (1 without retries).
    pub attempts: u32,
    /// Tokens (by the client's counter) of the input summarized, before any cut.
    pub input_tokens: u32,
    /// The input was over the input budget and was cut before sending.
    pub input_cut: bool,
    /// The answer hit `max_summary_tokens` and was cut back to its last complete sentence
    /// (only with [`LlmClientBuilder::keep_truncated_summaries`]).
    ///
    /// [`LlmClientBuilder::keep_truncated_summaries`]: super::LlmClientBuilder::keep_truncated_summaries
    pub truncated: bool,
}

impl LlmClient {
    /// Folds `messages` into `previous_summary` (if any) and returns a new summary of at most
    /// `max_summary_tokens`, the Fifth design's prompt ([`SUMMARY_SYSTEM_PROMPT`]).
    ///
    /// Tool calls and results are rendered one line each; input over the client's input
    /// budget is cut (long messages in the middle, then the oldest dropped). The answer is
    /// checked before it is returned.
    ///
    /// [`SUMMARY_SYSTEM_PROMPT`]: super::SUMMARY_SYSTEM_PROMPT
    ///
    /// # Errors
    ///
    /// [`LlmError::NothingToSummarize`] for no messages; transport errors as in
    /// [`complete`](Self::complete); and rejected answers, which callers should meet with a
    /// fallback: [`LlmError::EmptyAnswer`], [`LlmError::Truncated`] (the answer hit
    /// `max_summary_tokens`), [`LlmError::NotASummary`] (a refusal, the instructions echoed,
    /// the last message repeated) and [`LlmError::NotShorter`].
    ///
    /// ```no_run
    /// use ctxwin_std::{ChatMessage, core::Role};
    /// let client = ctxwin_std::llm::LlmClientBuilder::new("http://127.0.0.1:8089").build()?;
    /// let messages = [
    ///     ChatMessage::text(Role::User, "Rename the crate to ctxwin-std."),
    ///     ChatMessage::text(Role::Assistant, "Renamed it in std-adapter/Cargo.toml."),
    /// ];
    /// match client.summarize(None, &messages, 200) {
    ///     Ok(summary) => println!("{}", summary.text),
    ///     Err(err) if err.is_rejected_answer() => println!("fall back: {err}"),
    ///     Err(err) => return Err(err),
    /// }
    /// # Ok::<(), ctxwin_std::llm::LlmError>(())
    /// ```
    pub fn summarize(
        &self,
        previous_summary: Option<&str>,
        messages: &[ChatMessage],
        max_summary_tokens: u32,
    ) -> Result<LlmSummary, LlmError> {
        if messages.is_empty() {
            return Err(LlmError::NothingToSummarize);
        }
        let previous = previous_summary.map(str::trim).filter(|p| !p.is_empty());
        let lines = render_transcript(messages);
        let count = |text: &str| self.count_tokens(text);
        let input_tokens = lines
            .iter()
            .map(|line| count(line))
            .chain(previous.map(count))
            .fold(0u32, u32::saturating_add);
        let pieces: Vec<String> =
            previous.map(str::to_owned).into_iter().chain(lines.iter().cloned()).collect();
        let pinned = usize::from(previous.is_some());
        let fitted = fit(pieces, pinned, self.input_token_budget, &count);
        let (kept_previous, transcript) = fitted.pieces.split_at(pinned.min(fitted.pieces.len()));
        let max_summary_tokens = max_summary_tokens.max(1);
        let max_words = (max_summary_tokens.saturating_mul(3) / 4).max(1);
        let user =
            summary_request(kept_previous.first().map(String::as_str), transcript, max_words);
        let completion = self.complete(SUMMARY_SYSTEM_PROMPT, &user, max_summary_tokens)?;
        let truncated = completion.was_truncated();
        let answer = match (truncated, self.keep_truncated_summaries) {
            (false, _) => completion.text.as_str(),
            (true, true) => up_to_last_sentence(&completion.text)
                .ok_or(LlmError::Truncated { max_tokens: max_summary_tokens })?,
            (true, false) => return Err(LlmError::Truncated { max_tokens: max_summary_tokens }),
        };
        let text = strip_label(answer);
        let checks = SummaryChecks {
            input_tokens,
            last_message: lines.last().map(String::as_str),
            instructions: &[SUMMARY_SYSTEM_PROMPT, "Write the updated summary in at most words"],
        };
        checks.check(text, &count)?;
        tracing::debug!(
            input_tokens,
            summary_tokens = count(text),
            input_cut = fitted.cut,
            "LLM summary accepted"
        );
        Ok(LlmSummary {
            text: text.to_owned(),
            usage: completion.usage,
            latency: completion.latency,
            attempts: completion.attempts,
            input_tokens,
            input_cut: fitted.cut,
            truncated,
        })
    }
}

/// What a summary answer is checked against.
struct SummaryChecks<'a> {
    input_tokens: u32,
    last_message: Option<&'a str>,
    instructions: &'a [&'a str],
}

impl SummaryChecks<'_> {
    fn check(&self, text: &str, count: &dyn Fn(&str) -> u32) -> Result<(), LlmError> {
        if text.trim().is_empty() {
            return Err(LlmError::EmptyAnswer);
        }
        if is_refusal(text) {
            return Err(LlmError::NotASummary("it is a refusal"));
        }
        let words = words_of(text);
        if words.len() >= 3 * SHINGLE && self_repetition(&words) >= 0.4 {
            return Err(LlmError::NotASummary("it repeats itself"));
        }
        if words.len() >= SHINGLE {
            let instructions: Vec<String> =
                self.instructions.iter().flat_map(|text| words_of(text)).collect();
            if containment(&words, &instructions) >= 0.5 {
                return Err(LlmError::NotASummary("it echoes the instructions"));
            }
        }
        if words.len() >= 2 * SHINGLE {
            let last = self.last_message.map(words_of).unwrap_or_default();
            if containment(&words, &last) >= 0.8 {
                return Err(LlmError::NotASummary("it repeats the last message"));
            }
        }
        let summary_tokens = count(text);
        if summary_tokens >= self.input_tokens {
            return Err(LlmError::NotShorter { summary_tokens, input_tokens: self.input_tokens });
        }
        Ok(())
    }
}

/// `text` trimmed and without a leading `Summary:` / `**Updated summary:**` label.
fn strip_label(text: &str) -> &str {
    let text = text.trim();
    if let Some((label, rest)) = text.split_once(':') {
        let label = label.trim_matches(|c: char| c == '*' || c == '#' || c.is_whitespace());
        let label = label.to_ascii_lowercase();
        if label.len() <= 30 && label.ends_with("summary") {
            return rest.trim_start_matches('*').trim();
        }
    }
    text
}

/// `text` up to its last sentence end (`.`, `!`, `?` or a line break followed by whitespace),
/// or `None` when it has none.
fn up_to_last_sentence(text: &str) -> Option<&str> {
    let trimmed = text.trim_end();
    let mut ends = trimmed.char_indices().rev().filter(|&(index, c)| {
        let next = trimmed.get(index + c.len_utf8()..).and_then(|rest| rest.chars().next());
        match c {
            '.' | '!' | '?' => next.is_none_or(char::is_whitespace),
            '\n' => true,
            _ => false,
        }
    });
    let (index, c) = ends.next()?;
    let mut kept = trimmed.get(..index + c.len_utf8())?.trim_end();
    // A heading whose content was cut off ("Next steps:") says nothing on its own.
    while kept.ends_with(':') {
        kept = kept.rsplit_once('\n').map_or("", |(before, _)| before).trim_end();
    }
    (!kept.is_empty()).then_some(kept)
}

/// Opens with an apology or inability, or speaks "as an AI".
fn is_refusal(text: &str) -> bool {
    const OPENINGS: [&str; 9] = [
        "i'm sorry",
        "i am sorry",
        "sorry,",
        "i apologize",
        "i cannot",
        "i can't",
        "i'm unable",
        "i am unable",
        "unfortunately, i",
    ];
    const ANYWHERE: [&str; 3] = ["as an ai", "as a language model", "i'm just an ai"];
    let head: String =
        text.chars().take(300).collect::<String>().to_lowercase().replace('\u{2019}', "'");
    let head = head.trim_start();
    OPENINGS.iter().any(|opening| head.starts_with(opening))
        || ANYWHERE.iter().any(|phrase| head.contains(phrase))
}

/// Lower-case alphanumeric words.
fn words_of(text: &str) -> Vec<String> {
    text.split(|c: char| !c.is_alphanumeric())
        .filter(|word| !word.is_empty())
        .map(str::to_lowercase)
        .collect()
}

/// Share of the word n-grams of `words` that already occurred earlier in it: near 0 for
/// prose, high for an answer stuck in a loop.
fn self_repetition(words: &[String]) -> f64 {
    let mut seen: HashSet<&[String]> = HashSet::new();
    let mut total = 0u32;
    let mut repeated = 0u32;
    for gram in words.windows(SHINGLE) {
        total += 1;
        if !seen.insert(gram) {
            repeated += 1;
        }
    }
    if total == 0 { 0.0 } else { f64::from(repeated) / f64::from(total) }
}

/// Share of `text`'s word n-grams that also occur in `source` (0 when `text` has none).
fn containment(text: &[String], source: &[String]) -> f64 {
    let grams: HashSet<&[String]> = source.windows(SHINGLE).collect();
    let mut total = 0u32;
    let mut found = 0u32;
    for gram in text.windows(SHINGLE) {
        total += 1;
        if grams.contains(gram) {
            found += 1;
        }
    }
    if total == 0 { 0.0 } else { f64::from(found) / f64::from(total) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::llm::estimate_tokens;

    fn checks(input_tokens: u32, last: &str) -> SummaryChecks<'_> {
        SummaryChecks {
            input_tokens,
            last_message: Some(last),
            instructions: &[SUMMARY_SYSTEM_PROMPT],
        }
    }

    fn check(text: &str, input_tokens: u32, last: &str) -> Result<(), LlmError> {
        checks(input_tokens, last).check(text, &estimate_tokens)
    }

    #[test]
    fn a_short_faithful_summary_passes() {
        let last = "Tool run result: test result: FAILED. 3 passed; 1 failed (tests/io.rs:42)";
        let summary = "User asked to fix the build. cargo test fails 1 of 4 in tests/io.rs:42.";
        assert!(check(summary, 500, last).is_ok());
    }

    #[test]
    fn refusals_are_not_summaries() {
        for text in [
            "I'm sorry, but I can't help with that.",
            "I\u{2019}m sorry, I cannot do that",
            "  i cannot summarize this conversation",
            "Here it is. As an AI language model I do not keep history.",
        ] {
            assert!(matches!(check(text, 500, "x"), Err(LlmError::NotASummary(_))), "{text}");
        }
    }

    #[test]
    fn echoed_instructions_are_not_summaries() {
        let echo = "Preserve key decisions, action items, errors, file paths, commands, \
                    identifiers, numbers, and the current task state. Be concise.";
        assert!(matches!(
            check(echo, 500, "x"),
            Err(LlmError::NotASummary("it echoes the instructions"))
        ));
    }

    #[test]
    fn a_copy_of_the_last_message_is_not_a_summary() {
        let last = "Assistant: I will now run cargo build in the workspace root and report back";
        let copy = "I will now run cargo build in the workspace root and report back.";
        assert!(matches!(
            check(copy, 500, last),
            Err(LlmError::NotASummary("it repeats the last message"))
        ));
    }

    #[test]
    fn a_summary_as_long_as_its_input_is_not_shorter() {
        let text = "The user and the assistant talked about many things at length today.";
        let tokens = estimate_tokens(text);
        assert!(matches!(
            check(text, tokens, "x"),
            Err(LlmError::NotShorter { summary_tokens, input_tokens })
                if summary_tokens == tokens && input_tokens == tokens
        ));
        assert!(check(text, tokens + 1, "x").is_ok());
    }

    #[test]
    fn an_answer_stuck_in_a_loop_is_not_a_summary() {
        let looping = "The test suite for io.rs fails on CI, and I need to fix it.\n\n".repeat(4);
        assert!(matches!(
            check(&looping, 5000, "x"),
            Err(LlmError::NotASummary("it repeats itself"))
        ));
        let varied = "Ran cargo test --test io: FAILED at tests/io.rs:42. Fixed src/reader.rs \
                      to keep the last record. Ran cargo test --test io again: passed.";
        assert!(check(varied, 5000, "x").is_ok());
    }

    #[test]
    fn truncated_answers_keep_their_complete_sentences() {
        assert_eq!(up_to_last_sentence("One. Two! Three"), Some("One. Two!"));
        assert_eq!(up_to_last_sentence("Fix io.rs now.\n\nThe reason is"), Some("Fix io.rs now."));
        assert_eq!(up_to_last_sentence("- item one\n- item tw"), Some("- item one"));
        assert_eq!(up_to_last_sentence("see src/io.rs and"), None);
        assert_eq!(up_to_last_sentence("v1.2 is"), None);
        assert_eq!(up_to_last_sentence("Done."), Some("Done."));
        assert_eq!(up_to_last_sentence("Done.\n\nSummary:\nThe"), Some("Done."));
        assert_eq!(up_to_last_sentence("Next steps:\n- fi"), None);
    }

    #[test]
    fn whitespace_is_empty() {
        assert!(matches!(check(" \n\t", 500, "x"), Err(LlmError::EmptyAnswer)));
    }

    #[test]
    fn labels_are_stripped() {
        assert_eq!(strip_label("Summary: chose SQLite."), "chose SQLite.");
        assert_eq!(strip_label("**Updated Summary:** chose SQLite."), "chose SQLite.");
        assert_eq!(strip_label("## Summary:\nchose SQLite."), "chose SQLite.");
        assert_eq!(strip_label("Decision: chose SQLite."), "Decision: chose SQLite.");
        assert_eq!(strip_label("  plain  "), "plain");
    }

    #[test]
    fn containment_counts_shared_ngrams() {
        let a = words_of("one two three four five");
        let b = words_of("zero one two three four");
        assert!((containment(&a, &b) - 0.5).abs() < 1e-9);
        assert_eq!(containment(&words_of("too short"), &b), 0.0);
    }
}
