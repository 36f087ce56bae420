//! [`LlmSummarizer`]: the core's [`Summarizer`] seam answered by a model, blocking, with the
//! core's [`Extractive`] summarizer as the fallback for every failure.

use std::time::Instant;

use ctxwin_core::{
    Role, summarize::Detail, summarize::Extractive, summarize::SummarizeError,
    summarize::Summarizer, summarize::SummaryRequest, summarize::TaskRequest,
    summarize::TextBuffer, summarize::task_summary,
};

use super::{CallTally, FallbackReason, LlmClient};
use crate::message::ChatMessage;

/// A [`Summarizer`] that asks an OpenAI-compatible server ([`LlmClient::summarize`]) and falls
/// back to the core's [`Extractive`] summarizer whenever the answer does not come or is not
/// usable: server down, timeout, HTTP error, empty answer, an answer longer than its input or
/// than the request's budget (as the manager's counter counts it), an answer that is not a
/// summary. Each fallback is counted by [`FallbackReason`] and logged.
///
/// It blocks the manager's `push` for the length of an HTTP call: fine for batch jobs and
/// tests; an agent loop should let [`Session`](crate::session::Session) run the model on a
/// background worker instead ([`SessionBuilder::llm`](crate::session::SessionBuilder::llm)).
///
/// ```
/// use ctxwin_core::{strategy::Builtin, Config, ContextManager, estimator::Estimator, Message, StrategyKind, TinyCapacities};
/// use ctxwin_std::llm::{LlmClientBuilder, LlmExtractor, LlmSummarizer};
///
/// // No server listens on port 9: every summary falls back to the extractive one.
/// let client = LlmClientBuilder::new("http://127.0.0.1:9").max_retries(0).build()?;
/// let strategy = Builtin { summarizer: LlmSummarizer::new(client.clone()), extractor: LlmExtractor::new(client) };
/// let config = Config { strategy: StrategyKind::Summarization, summarize_threshold: 2, summarize_batch: 1, locked_tail: 2, low_water_percent: 100, ..Config::DEFAULT };
/// let mut manager = ContextManager::<TinyCapacities>::builder().config(config).strategy(strategy).build()?;
/// for turn in 0..5 {
///     manager.push(Message::user(&format!("Step {turn}: edit src/step{turn}.rs")))?;
/// }
/// let summarizer = &manager.strategy().summarizer;
/// assert!(summarizer.tally().fallbacks().server_down >= 1);
/// assert_eq!(manager.stats().summaries(), 1, "the extractive summary took over");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug)]
pub struct LlmSummarizer {
    client: LlmClient,
    fallback: Extractive,
    tally: CallTally,
}

impl LlmSummarizer {
    /// A summarizer asking `client`'s server.
    pub fn new(client: LlmClient) -> Self {
        Self { client, fallback: Extractive, tally: CallTally::default() }
    }

    /// The client it asks.
    pub fn client(&self) -> &LlmClient {
        &self.client
    }

    /// What the model did: answers used, fallbacks by reason, call durations.
    pub fn tally(&self) -> &CallTally {
        &self.tally
    }

    /// The model's summary of `request`, if it fits the request's budget.
    fn ask(&mut self, request: &SummaryRequest<'_>) -> Result<String, FallbackReason> {
        let mut messages: Vec<ChatMessage> =
            request.messages.clone().map(|m| ChatMessage::from_stored(&m)).collect();
        let mut previous = Some(request.previous.trim()).filter(|p| !p.is_empty());
        if messages.is_empty() {
            // Shortening a summary alone (to a line, or a digest): the summary is the input.
            let text = previous.take().ok_or(FallbackReason::Other)?;
            messages.push(ChatMessage::text(Role::System, text));
        }
        let started = Instant::now();
        // Three quarters of the budget: the manager's counter may count the answer higher
        // than the model's tokenizer does.
        let max_tokens = (request.budget / 4).saturating_mul(3).max(1);
        let answer = self.client.summarize(previous, &messages, max_tokens);
        self.tally.record(started.elapsed());
        let summary = answer.map_err(|error| {
            tracing::warn!(%error, "LLM summary failed; the extractive summarizer takes over");
            FallbackReason::of(&error)
        })?;
        let tokens = request.counter.count(&summary.text);
        if tokens > request.budget {
            tracing::warn!(
                tokens,
                budget = request.budget,
                "LLM summary over its budget; the extractive summarizer takes over"
            );
            return Err(FallbackReason::TooLong);
        }
        Ok(summary.text)
    }
}

impl Summarizer for LlmSummarizer {
    fn summarize(
        &mut self,
        request: &SummaryRequest<'_>,
        out: &mut TextBuffer<'_>,
    ) -> Result<(), SummarizeError> {
        let reason = match self.ask(request) {
            Ok(text) => {
                out.clear();
                out.push_str(&text);
                if !out.is_truncated() {
                    self.tally.accept();
                    return Ok(());
                }
                FallbackReason::TooLong
            }
            Err(reason) => reason,
        };
        self.tally.fall_back(reason);
        out.clear();
        let result = self.fallback.summarize(request, out);
        if result.is_err() {
            out.clear();
        }
        result
    }

    /// The core's structured task summary first (the fallback, and the structure the model
    /// is asked to keep: it is sent as the summary so far), then the model's update of it
    /// with the task's messages, kept when it fits the budget and still names the task.
    fn summarize_task(
        &mut self,
        request: &TaskRequest<'_>,
        out: &mut TextBuffer<'_>,
    ) -> Result<(), SummarizeError> {
        task_summary(request, out)?;
        let structured = out.as_str().to_string();
        let asked = SummaryRequest {
            previous: &structured,
            messages: request.messages.clone(),
            budget: request.budget,
            detail: Detail::Paragraph,
            counter: request.counter,
        };
        let header = format!("Task {}:", request.number);
        let reason = match self.ask(&asked) {
            Ok(text) if text.trim_start().starts_with(&header) => {
                out.clear();
                out.push_str(text.trim());
                if !out.is_truncated() {
                    self.tally.accept();
                    return Ok(());
                }
                FallbackReason::TooLong
            }
            Ok(_) => FallbackReason::NotASummary,
            Err(reason) => reason,
        };
        self.tally.fall_back(reason);
        out.clear();
        out.push_str(&structured);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::llm::LlmClientBuilder;
    use crate::llm::mock::server;
    use ctxwin_core::{
        ContextManager, Message, TinyCapacities, counter::TokenCounter, estimator::Estimator,
        summarize::Detail,
    };
    use std::net::TcpListener;

    fn summarize(
        summarizer: &mut LlmSummarizer,
        budget: u32,
    ) -> (Result<(), SummarizeError>, String) {
        let mut manager = ContextManager::<TinyCapacities>::new();
        let first = manager.push(Message::user("Fix the failing test in tests/io.rs")).unwrap();
        manager
            .push(Message::assistant("The reader drops the last record; fixing src/reader.rs"))
            .unwrap();
        let last =
            manager.push(Message::user("Also bump the version to 1.4.2 and tag it")).unwrap();
        let counter = Estimator::new();
        let request = SummaryRequest {
            previous: "",
            messages: manager.summary_source(first, last),
            budget,
            detail: Detail::Paragraph,
            counter: &counter,
        };
        let mut bytes = [0u8; 2048];
        let mut out = TextBuffer::new(&mut bytes);
        let result = summarizer.summarize(&request, &mut out);
        (result, out.as_str().to_owned())
    }

    #[test]
    fn a_usable_answer_is_written() {
        let url = server(vec!["Fixing src/reader.rs; then release 1.4.2.".into()]);
        let mut summarizer = LlmSummarizer::new(LlmClientBuilder::new(url).build().unwrap());
        let (result, text) = summarize(&mut summarizer, 100);
        assert_eq!(result, Ok(()));
        assert_eq!(text, "Fixing src/reader.rs; then release 1.4.2.");
        assert_eq!((summarizer.tally().accepted(), summarizer.tally().fallbacks().total()), (1, 0));
        assert_eq!(summarizer.tally().latencies().count(), 1);
    }

    #[test]
    fn unusable_answers_fall_back_to_the_extractive_summary() {
        let long: Vec<String> = (0..40).map(|step| format!("step {step} done")).collect();
        let long = long.join(", ");
        let url = server(vec![
            "   ".into(),
            "I'm sorry, but I cannot help with that.".into(),
            long.clone(),
        ]);
        let client = LlmClientBuilder::new(url).max_retries(0).build().unwrap();
        let mut summarizer = LlmSummarizer::new(client);
        for _ in 0..3 {
            let (result, text) = summarize(&mut summarizer, 30);
            assert_eq!(result, Ok(()));
            assert!(text.contains("tests/io.rs"), "the extractive summary: {text}");
            assert!(Estimator::new().count(&text) <= 30, "{text}");
        }
        let fallbacks = summarizer.tally().fallbacks();
        assert_eq!((fallbacks.empty_answer, fallbacks.not_a_summary), (1, 1));
        assert_eq!(fallbacks.too_long, 1, "{long} is longer than its input or its budget");
        assert_eq!(summarizer.tally().accepted(), 0);
    }

    #[test]
    fn a_server_that_is_down_falls_back() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        drop(listener);
        let client = LlmClientBuilder::new(url).max_retries(0).build().unwrap();
        let mut summarizer = LlmSummarizer::new(client);
        let (result, text) = summarize(&mut summarizer, 60);
        assert_eq!(result, Ok(()));
        assert!(!text.is_empty());
        assert_eq!(summarizer.tally().fallbacks().server_down, 1);
    }

    fn summarize_task(summarizer: &mut LlmSummarizer) -> (Result<(), SummarizeError>, String) {
        let mut manager = ContextManager::<TinyCapacities>::new();
        let first = manager.push(Message::user("Fix the failing test in tests/io.rs")).unwrap();
        let last = manager
            .push(Message::assistant("Decided to fix src/reader.rs: it dropped the last record."))
            .unwrap();
        let counter = Estimator::new();
        let request = TaskRequest {
            number: 3,
            goal: "fix tests/io.rs",
            outcome: "fixed",
            messages: manager.summary_source(first, last),
            budget: 200,
            counter: &counter,
        };
        let mut bytes = [0u8; 2048];
        let mut out = TextBuffer::new(&mut bytes);
        let result = summarizer.summarize_task(&request, &mut out);
        (result, out.as_str().to_owned())
    }

    #[test]
    fn a_task_summary_is_the_models_when_it_names_the_task_else_the_structured_one() {
        let url = server(vec![
            "Task 3: fix tests/io.rs\nOutcome: fixed; src/reader.rs dropped the last record".into(),
            "Fixed the reader.".into(),
        ]);
        let client = LlmClientBuilder::new(url).max_retries(0).build().unwrap();
        let mut summarizer = LlmSummarizer::new(client);
        let (result, text) = summarize_task(&mut summarizer);
        assert_eq!(result, Ok(()));
        assert!(text.ends_with("src/reader.rs dropped the last record"), "{text}");
        let (result, text) = summarize_task(&mut summarizer);
        assert_eq!(result, Ok(()));
        assert!(
            text.starts_with(
                "Task 3: fix tests/io.rs\nOutcome: fixed\nFiles: tests/io.rs, src/reader.rs"
            ),
            "{text}"
        );
        assert_eq!(summarizer.tally().fallbacks().not_a_summary, 1);
    }
}
