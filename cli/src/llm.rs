//! The optional LLM server: settings from `--llm-url` / `CTXWIN_LLM_URL` / `[llm]`, checked
//! and turned into an [`LlmClient`], and the one place where it meets the session.
//!
//! Built without the `http` feature there is no client: [`LlmClient`] and [`LlmStats`] are
//! uninhabited, a configured URL is refused, and the rest of the command line is unchanged.

use std::time::Duration;

#[cfg(feature = "http")]
pub(crate) use ctxwin_std::llm::LlmClient;
#[cfg(feature = "http")]
use ctxwin_std::llm::LlmClientBuilder;
#[cfg(feature = "http")]
pub(crate) use ctxwin_std::session::LlmStats;
use ctxwin_std::session::{Session, SessionBuilder};

use super::config_file::LlmSection;
use super::error::CliError;

/// No client can exist without the `http` feature.
#[cfg(not(feature = "http"))]
#[derive(Clone, Debug)]
pub(crate) enum LlmClient {}

/// No model works for a session without the `http` feature.
#[cfg(not(feature = "http"))]
#[derive(Clone, Debug, serde::Serialize)]
pub(crate) enum LlmStats {}

/// Where the LLM URL came from, for error messages.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Origin {
    Flag,
    File,
}

/// The client for the configured server, or `None` without one. `flag` is `--llm-url` (clap
/// fills it from `CTXWIN_LLM_URL` too) and wins over the file's `[llm] url`; the file's other
/// `[llm]` keys apply either way.
pub(crate) fn client(flag: Option<&str>, file: &LlmSection) -> Result<Option<LlmClient>, CliError> {
    let (url, origin) = match (flag, file.url.as_deref()) {
        (Some(url), _) => (url, Origin::Flag),
        (None, Some(url)) => (url, Origin::File),
        (None, None) => return Ok(None),
    };
    let url = url.trim();
    let origin = match origin {
        Origin::Flag => "--llm-url",
        Origin::File => "[llm] url in ctxwin.toml",
    };
    build(url, origin, file).map(Some)
}

/// The client for `url` with the file's other `[llm]` settings.
#[cfg(feature = "http")]
fn build(url: &str, origin: &str, file: &LlmSection) -> Result<LlmClient, CliError> {
    let mut builder = LlmClientBuilder::new(url);
    if let Some(model) = &file.model {
        builder = builder.model(model);
    }
    if let Some(var) = &file.api_key_env {
        builder = builder.api_key_env(var);
    }
    if let Some(secs) = file.timeout_secs {
        if secs == 0 {
            return Err(CliError::Config("[llm] timeout_secs must be at least 1".into()));
        }
        builder = builder.timeout(Duration::from_secs(secs));
    }
    builder.build().map_err(|e| {
        CliError::Config(format!(
            "{origin} {url:?}: {e}; give a base URL like http://127.0.0.1:8080"
        ))
    })
}

#[cfg(not(feature = "http"))]
fn build(_: &str, origin: &str, _: &LlmSection) -> Result<LlmClient, CliError> {
    Err(CliError::without_feature("http", origin))
}

/// How long a command waits for the model's answers when `[llm] wait_secs` is not set.
pub(crate) const DEFAULT_WAIT: Duration = Duration::from_secs(120);

/// `[llm] wait_secs`, or [`DEFAULT_WAIT`].
pub(crate) fn wait(file: &LlmSection) -> Duration {
    // Checked when the file is read; clamped again so that no deadline can overflow.
    file.wait_secs
        .map_or(DEFAULT_WAIT, |secs| Duration::from_secs(secs.min(super::config_file::MAX_SECS)))
}

/// Connects the LLM client to the session being built — the only place the command line hands
/// a client to a session. The session then rewrites summaries and extracts entity values on
/// its background worker; the builder must have an archive.
pub(crate) fn attach_llm(builder: SessionBuilder, client: Option<&LlmClient>) -> SessionBuilder {
    match client {
        #[cfg(feature = "http")]
        Some(client) => builder.llm(client.clone()),
        #[cfg(not(feature = "http"))]
        Some(client) => match *client {},
        None => builder,
    }
}

/// Waits up to `wait` for the model's answers so that they are applied before the command
/// checkpoints and the process exits (the worker dies with it). A worker failure is logged:
/// the extractive summaries stay and the originals are in the archive.
#[cfg(feature = "http")]
pub(crate) fn settle(session: &mut Session, wait: Duration) -> Option<LlmStats> {
    session.llm_stats()?;
    match session.wait_for_summaries(wait) {
        Ok(done) if done.pending > 0 => {
            tracing::warn!(pending = done.pending, ?wait, "cli: model answers still pending")
        }
        Ok(_) => {}
        Err(error) => tracing::warn!(%error, "cli: waiting for the model failed"),
    }
    session.llm_stats()
}

/// Without the `http` feature: no model, nothing to wait for.
#[cfg(not(feature = "http"))]
pub(crate) fn settle(_: &mut Session, _: Duration) -> Option<LlmStats> {
    None
}

/// One line on what the model did in this command: requests, swaps, fallbacks by reason.
#[cfg(feature = "http")]
pub(crate) fn outcome(stats: &LlmStats) -> String {
    format!(
        "{} summaries requested, {} swapped in, fallbacks: {}; {} extractions, {} accepted, fallbacks: {}",
        stats.summaries_requested,
        stats.summaries_swapped,
        stats.summary_fallbacks,
        stats.extractions_requested,
        stats.extractions_accepted,
        stats.extraction_fallbacks,
    )
}

#[cfg(not(feature = "http"))]
pub(crate) fn outcome(stats: &LlmStats) -> String {
    match *stats {}
}

/// The server's base URL, for reports.
pub(crate) fn base_url(client: &LlmClient) -> String {
    #[cfg(feature = "http")]
    return client.base_url().to_string();
    #[cfg(not(feature = "http"))]
    match *client {}
}

/// What `ctxwin stats` says about the LLM.
pub(crate) fn describe(client: Option<&LlmClient>) -> String {
    match client {
        #[cfg(not(feature = "http"))]
        Some(client) => match *client {},
        #[cfg(feature = "http")]
        Some(client) => format!(
            "{} (rewrites summaries and extracts entities; extractive on failure)",
            client.base_url()
        ),
        None => "none (extractive summaries)".into(),
    }
}

#[cfg(all(test, feature = "http"))]
mod tests {
    use super::*;

    #[test]
    fn the_flag_wins_over_the_file() {
        let file = LlmSection { url: Some("http://127.0.0.1:1".into()), ..LlmSection::default() };
        let from_flag = client(Some("http://127.0.0.1:2"), &file).unwrap().unwrap();
        assert_eq!(from_flag.base_url(), "http://127.0.0.1:2");
        let from_file = client(None, &file).unwrap().unwrap();
        assert_eq!(from_file.base_url(), "http://127.0.0.1:1");
        assert!(client(None, &LlmSection::default()).unwrap().is_none());
    }

    #[test]
    fn bad_settings_are_configuration_errors() {
        let error = client(Some("localhost:8080"), &LlmSection::default()).unwrap_err();
        assert!(error.to_string().starts_with("--llm-url \"localhost:8080\""), "{error}");
        assert_eq!(error.exit(), crate::Exit::Config);
        let zero = LlmSection { timeout_secs: Some(0), ..LlmSection::default() };
        assert!(client(Some("http://127.0.0.1:1"), &zero).is_err());
        let key = LlmSection {
            api_key_env: Some("CTXWIN_TEST_NO_SUCH_VARIABLE".into()),
            ..LlmSection::default()
        };
        assert!(client(Some("http://127.0.0.1:1"), &key).is_err());
    }

    #[test]
    fn a_dead_server_leaves_the_extractive_summary_and_counts_why() {
        use ctxwin_core::{Config, Role, StrategyKind};
        use ctxwin_std::ChatMessage;
        let client = client(Some("http://127.0.0.1:9"), &LlmSection::default()).unwrap();
        assert!(describe(client.as_ref()).contains("extractive on failure"));
        assert!(describe(None).starts_with("none"));
        let config = Config {
            strategy: StrategyKind::Summarization,
            max_messages: 4,
            locked_tail: 2,
            ..Config::DEFAULT
        };
        let archive = std::sync::Arc::new(ctxwin_std::store::MemoryStore::new());
        let builder = SessionBuilder::new("t").config(config).archive_store(archive);
        let mut session = attach_llm(builder, client.as_ref()).build().unwrap();
        for turn in 0..6 {
            let text =
                format!("Turn {turn}: the deploy of service-{turn} failed with error E{turn}.");
            session.push(&ChatMessage::text(Role::User, &text)).unwrap();
            session.push(&ChatMessage::text(Role::Assistant, "Noted; retrying.")).unwrap();
        }
        let stats = settle(&mut session, Duration::from_secs(30)).unwrap();
        assert!(stats.summaries_requested > 0, "{stats:?}");
        assert_eq!(stats.summaries_swapped, 0);
        assert!(stats.summary_fallbacks.server_down > 0, "{stats:?}");
        assert_eq!(stats.pending_jobs, 0);
        assert!(outcome(&stats).contains("server_down"), "{}", outcome(&stats));
        assert!(
            session.manager().session().any(|m| m.is_summary()),
            "the extractive summary stays"
        );
    }
}
