//! `ctxwin proxy`: the OpenAI/Anthropic proxy of `ctxwin-proxy`, run in the foreground.
//!
//! Settings: the `[proxy]` section of `DIR/ctxwin.toml` (when the file exists), then the
//! `CTXWIN_PROXY_*` environment variables, then the flags; conversations live in `DIR/proxy/`
//! unless those say otherwise. The proxy keeps its own archive and checkpoints
//! there, so the state directory's lock is not taken: `ctxwin` commands on the CLI's own
//! session keep working while the proxy runs. With `[store] url` (or `CTXWIN_STORE_URL`)
//! naming a PostgreSQL database, the proxy keeps its conversations there instead, and any
//! number of instances on that database serve any conversation (a fleet).

use ctxwin_proxy::{ProxyConfig, RunError};

use crate::args::ProxyArgs;
use crate::error::CliError;
use crate::output::Output;
use crate::state::Globals;

/// Builds and checks the configuration (a bad value is [`CliError::Config`]).
pub(crate) fn config(
    globals: &Globals<'_>,
    args: &ProxyArgs,
    env: impl Fn(&str) -> Option<String>,
) -> Result<ProxyConfig, CliError> {
    let bad = |message: String| CliError::Config(format!("proxy: {message}"));
    refuse_unused_globals(globals).map_err(bad)?;
    let mut config = ProxyConfig { state_dir: globals.dir.join("proxy"), ..ProxyConfig::default() };
    let file = globals.dir.join("ctxwin.toml");
    if file.is_file() {
        config.apply_file(&file).map_err(|e| bad(e.to_string()))?;
    }
    config.apply_env(env).map_err(|e| bad(e.to_string()))?;
    if let Some(upstream) = &args.upstream {
        config.upstream.clone_from(upstream);
    }
    if let Some(listen) = &args.listen {
        config.listen = listen.parse().map_err(|_| {
            bad(format!("--listen `{listen}` is not HOST:PORT (e.g. 127.0.0.1:8787)"))
        })?;
    }
    if let Some(max) = &args.max_resident {
        config.max_resident =
            max.parse().map_err(|_| bad(format!("--max-resident `{max}` is not a number")))?;
    }
    config.validate().map_err(|e| bad(e.to_string()))?;
    Ok(config)
}

/// The global settings `ctxwin proxy` does not use, refused by name rather than ignored.
fn refuse_unused_globals(globals: &Globals<'_>) -> Result<(), String> {
    let unused = [
        (
            "--tokenizer (CTXWIN_TOKENIZER)",
            globals.tokenizer.is_some(),
            "it counts tokens with the estimator, calibrated by each answer's billed usage",
        ),
        ("--llm-url (CTXWIN_LLM_URL)", globals.llm_url.is_some(), "it writes no summaries"),
        (
            "--embeddings-url (CTXWIN_EMBED_URL)",
            globals.embeddings.0.is_some(),
            "its retrieval ranks by BM25 alone",
        ),
        (
            "--embeddings-model (CTXWIN_EMBED_MODEL)",
            globals.embeddings.1.is_some(),
            "its retrieval ranks by BM25 alone",
        ),
    ];
    match unused.iter().find(|(_, set, _)| *set) {
        Some((flag, _, why)) => Err(format!("{flag} is not used by the proxy ({why}); remove it")),
        None => Ok(()),
    }
}

/// Runs the proxy until Ctrl-C or SIGTERM.
pub(crate) fn run(globals: &Globals<'_>, args: &ProxyArgs) -> Result<Output, CliError> {
    let config = config(globals, args, |key| std::env::var(key).ok())?;
    ctxwin_proxy::init_logging();
    ctxwin_proxy::run_blocking(config).map_err(|error| match error {
        RunError::Listen { .. } => {
            CliError::Io(format!("proxy: {error}; is another process using that port?"))
        }
        RunError::Start(_) | RunError::Serve(_) => CliError::Io(format!("proxy: {error}")),
    })?;
    Ok(Output::Raw(String::new()))
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    fn globals(dir: &Path) -> Globals<'_> {
        Globals { dir, tokenizer: None, llm_url: None, embeddings: (None, None), command: "proxy" }
    }

    fn args(listen: Option<&str>) -> ProxyArgs {
        ProxyArgs {
            upstream: Some("http://127.0.0.1:9".into()),
            listen: listen.map(Into::into),
            max_resident: None,
        }
    }

    #[test]
    fn file_then_env_then_flags() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("ctxwin.toml"),
            "[context]\n[proxy]\nupstream = \"http://file:1\"\nmax_resident = 3\n",
        )
        .unwrap();
        let none = ProxyArgs { upstream: None, listen: None, max_resident: None };
        let config = config(&globals(dir.path()), &none, |_| None).unwrap();
        assert_eq!((config.upstream.as_str(), config.max_resident), ("http://file:1", 3));
        assert_eq!(config.state_dir, dir.path().join("proxy"));
        let env = |k: &str| (k == "CTXWIN_PROXY_MAX_RESIDENT").then(|| "5".to_string());
        let config = super::config(&globals(dir.path()), &args(Some("127.0.0.1:1")), env).unwrap();
        assert_eq!((config.upstream.as_str(), config.max_resident), ("http://127.0.0.1:9", 5));
        assert_eq!(config.listen.port(), 1);
        let error = super::config(&globals(dir.path()), &args(Some("nope")), |_| None).unwrap_err();
        assert!(matches!(error, CliError::Config(_)), "{error}");
    }

    #[test]
    fn the_init_template_leaves_the_proxys_defaults() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("ctxwin.toml"), crate::config_file::default_toml()).unwrap();
        let config = config(&globals(dir.path()), &args(None), |_| None).unwrap();
        assert_eq!(config.observation_limit, None, "tool outputs whole");
        assert!(!config.retrieval.auto, "the proxy's retrieval is off unless the file sets it");
        assert_eq!(config.origins.cli_window, Some(32_768));
    }

    #[test]
    fn global_flags_the_proxy_does_not_use_are_refused_by_name() {
        let dir = tempfile::tempdir().unwrap();
        let with_tokenizer = Globals { tokenizer: Some("cl100k"), ..globals(dir.path()) };
        let error = config(&with_tokenizer, &args(None), |_| None).unwrap_err().to_string();
        assert!(error.contains("--tokenizer") && error.contains("not used"), "{error}");
        let with_embeddings =
            Globals { embeddings: (None, Some("all-MiniLM-L6-v2")), ..globals(dir.path()) };
        let error = config(&with_embeddings, &args(None), |_| None).unwrap_err().to_string();
        assert!(error.contains("--embeddings-model"), "{error}");
        assert!(config(&globals(dir.path()), &args(None), |_| None).is_ok());
    }
}
