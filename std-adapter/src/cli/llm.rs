//! The optional LLM server: settings from `--llm-url` / `CTXWIN_LLM_URL` / `[llm]`, checked
//! and turned into an [`LlmClient`], and the one place where it meets the session.

use std::time::Duration;

use crate::llm::{LlmClient, LlmClientBuilder};
use crate::session::SessionBuilder;

use super::config_file::LlmSection;
use super::error::CliError;

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
    let origin = match origin {
        Origin::Flag => "--llm-url",
        Origin::File => "[llm] url in ctxwin.toml",
    };
    builder.build().map(Some).map_err(|e| {
        CliError::Config(format!(
            "{origin} {url:?}: {e}; give a base URL like http://127.0.0.1:8080"
        ))
    })
}

/// Connects the LLM client to the session being built — the only place the command line hands
/// a client to a session.
///
/// The session does not take an LLM yet (summaries stay the core's extractive ones): the
/// client is checked and reported by `ctxwin stats`, and nothing pretends it is used. Once
/// `SessionBuilder` accepts one, this becomes `builder.llm(client.clone())`.
pub(crate) fn attach_llm(builder: SessionBuilder, client: Option<&LlmClient>) -> SessionBuilder {
    if let Some(client) = client {
        tracing::debug!(
            url = client.base_url(),
            "cli: LLM configured; the session cannot use it yet"
        );
    }
    builder
}

/// What `ctxwin stats` says about the LLM.
pub(crate) fn describe(client: Option<&LlmClient>) -> String {
    match client {
        Some(client) => format!(
            "{} (configured; summaries stay extractive until the session takes an LLM)",
            client.base_url()
        ),
        None => "none (extractive summaries)".into(),
    }
}

#[cfg(test)]
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
        assert_eq!(error.exit(), super::super::Exit::Config);
        let zero = LlmSection { timeout_secs: Some(0), ..LlmSection::default() };
        assert!(client(Some("http://127.0.0.1:1"), &zero).is_err());
        let key = LlmSection {
            api_key_env: Some("CTXWIN_TEST_NO_SUCH_VARIABLE".into()),
            ..LlmSection::default()
        };
        assert!(client(Some("http://127.0.0.1:1"), &key).is_err());
    }

    #[test]
    fn stats_never_claim_the_llm_summarizes() {
        let client = client(Some("http://127.0.0.1:9"), &LlmSection::default()).unwrap();
        assert!(describe(client.as_ref()).contains("stay extractive"));
        assert!(describe(None).starts_with("none"));
    }
}
