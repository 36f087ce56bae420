//! [`LlmExtractor`]: the core's [`Extractor`] seam answered by a model, blocking, with the
//! core's [`Patterns`] extractor as the fallback for every failure.

use std::collections::BTreeMap;
use std::time::Instant;

use ctxwin_core::{entities::EntitiesMut, entities::Extractor, entities::Patterns};

use super::{CallTally, FallbackReason, LlmClient};

/// An [`Extractor`] that asks an OpenAI-compatible server ([`LlmClient::extract`]) for the
/// declared keys as one JSON object, and falls back to the core's [`Patterns`] extractor
/// when the answer does not come or is not usable (not JSON, an undeclared key, a nested
/// value; see [`parse_extraction`](super::parse_extraction)). Values the model leaves out or
/// answers `null` for keep their current value; values longer than the table holds are
/// skipped. Each fallback is counted by [`FallbackReason`] and logged.
///
/// Like [`LlmSummarizer`](super::LlmSummarizer) it blocks the push it runs in; a
/// [`Session`](crate::session::Session) built with
/// [`SessionBuilder::llm`](crate::session::SessionBuilder::llm) runs extraction on its
/// background worker instead.
///
/// ```
/// use ctxwin_core::{strategy::Builtin, Config, ContextManager, EntitySchema, estimator::Estimator, summarize::Extractive, Message, TinyCapacities};
/// use ctxwin_std::llm::{LlmClientBuilder, LlmExtractor};
///
/// let client = LlmClientBuilder::new("http://127.0.0.1:9").max_retries(0).build()?;
/// let strategy = Builtin { summarizer: Extractive, extractor: LlmExtractor::new(client) };
/// let config = Config { entity_schema: EntitySchema::new(&["branch"])?, ..Config::DEFAULT };
/// let mut manager = ContextManager::<TinyCapacities>::builder().config(config).strategy(strategy).build()?;
/// manager.push(Message::user("branch: fix-io"))?;
/// // No server: the pattern extractor found the value.
/// assert_eq!(manager.entities().get("branch"), Some("fix-io"));
/// assert_eq!(manager.strategy().extractor.tally().fallbacks().server_down, 1);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug)]
pub struct LlmExtractor {
    client: LlmClient,
    fallback: Patterns,
    tally: CallTally,
}

impl LlmExtractor {
    /// An extractor asking `client`'s server.
    pub fn new(client: LlmClient) -> Self {
        Self { client, fallback: Patterns, tally: CallTally::default() }
    }

    /// The client it asks.
    pub fn client(&self) -> &LlmClient {
        &self.client
    }

    /// What the model did: answers used, fallbacks by reason, call durations.
    pub fn tally(&self) -> &CallTally {
        &self.tally
    }
}

impl Extractor for LlmExtractor {
    fn extract(&mut self, text: &str, entities: &mut EntitiesMut<'_>) {
        let keys: Vec<String> = entities.keys().map(str::to_owned).collect();
        if keys.is_empty() {
            return;
        }
        let current: BTreeMap<String, String> = keys
            .iter()
            .filter_map(|key| Some((key.clone(), entities.get(key)?.to_owned())))
            .collect();
        let schema: Vec<&str> = keys.iter().map(String::as_str).collect();
        let started = Instant::now();
        let answer = self.client.extract(&schema, &current, text);
        self.tally.record(started.elapsed());
        match answer {
            Ok(updated) => {
                self.tally.accept();
                for (key, value) in updated {
                    if current.get(&key) != Some(&value)
                        && let Err(error) = entities.set(&key, &value)
                    {
                        tracing::debug!(key, %error, "LLM entity value skipped");
                    }
                }
            }
            Err(error) => {
                tracing::warn!(%error, "LLM extraction failed; the pattern extractor takes over");
                self.tally.fall_back(FallbackReason::of(&error));
                self.fallback.extract(text, entities);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::llm::LlmClientBuilder;
    use crate::llm::mock::server;
    use ctxwin_core::{Config, ContextManager, EntitySchema, Message, TinyCapacities};

    fn manager(
        extractor: LlmExtractor,
    ) -> ContextManager<
        TinyCapacities,
        ctxwin_core::estimator::Estimator,
        ctxwin_core::strategy::Builtin<ctxwin_core::summarize::Extractive, LlmExtractor>,
    > {
        let schema = EntitySchema::new(&["branch", "owner"]).unwrap();
        let config = Config { entity_schema: schema, ..Config::DEFAULT };
        let strategy = ctxwin_core::strategy::Builtin {
            summarizer: ctxwin_core::summarize::Extractive,
            extractor,
        };
        ContextManager::builder().config(config).strategy(strategy).build().unwrap()
    }

    #[test]
    fn declared_values_are_set_and_nulls_keep_the_old_value() {
        let url = server(vec![
            r#"{"branch": "fix-io", "owner": null}"#.into(),
            r#"```json
{"owner": "Dana"}
```"#
                .into(),
        ]);
        let mut manager = manager(LlmExtractor::new(LlmClientBuilder::new(url).build().unwrap()));
        manager.push(Message::user("Switched to fix-io.")).unwrap();
        assert_eq!(manager.entities().get("branch"), Some("fix-io"));
        manager.push(Message::user("Dana owns the reader.")).unwrap();
        assert_eq!(manager.entities().get("branch"), Some("fix-io"));
        assert_eq!(manager.entities().get("owner"), Some("Dana"));
        let extractor = &manager.strategy().extractor;
        assert_eq!((extractor.tally().accepted(), extractor.tally().fallbacks().total()), (2, 0));
    }

    #[test]
    fn undeclared_keys_and_prose_fall_back_to_patterns() {
        let url = server(vec![
            r#"{"branch": "x", "password": "hunter2"}"#.into(),
            "The branch is fix-io.".into(),
        ]);
        let client = LlmClientBuilder::new(url).max_retries(0).build().unwrap();
        let mut manager = manager(LlmExtractor::new(client));
        manager.push(Message::user("owner: Dana")).unwrap();
        manager.push(Message::user("branch = fix-io")).unwrap();
        assert_eq!(manager.entities().get("owner"), Some("Dana"));
        assert_eq!(manager.entities().get("branch"), Some("fix-io"));
        let extractor = &manager.strategy().extractor;
        assert_eq!(
            (extractor.tally().accepted(), extractor.tally().fallbacks().bad_extraction),
            (0, 2)
        );
    }
}
