//! The optional embeddings server of hybrid recall: settings from `--embeddings-url` /
//! `CTXWIN_EMBED_URL` / `[retrieval] embeddings_url` (and the model's name likewise), checked
//! and turned into an `HttpEmbedder` (refused in a build without the `http` feature).

use std::sync::Arc;

use ctxwin_std::embed::Embedder;
#[cfg(feature = "http")]
use ctxwin_std::embed::HttpEmbedder;

use super::config_file::EmbeddingsSection;
use super::error::CliError;

/// The embedder for the configured server, or `None` without one. `flags` are
/// `--embeddings-url` and `--embeddings-model` (clap fills them from `CTXWIN_EMBED_URL` and
/// `CTXWIN_EMBED_MODEL` too); each wins over the file's key.
pub(crate) fn embedder(
    flags: (Option<&str>, Option<&str>),
    file: &EmbeddingsSection,
) -> Result<Option<Arc<dyn Embedder>>, CliError> {
    let Some(url) = flags.0.or(file.url.as_deref()).map(str::trim).filter(|u| !u.is_empty()) else {
        return Ok(None);
    };
    let model = flags.1.or(file.model.as_deref()).map(str::trim).unwrap_or_default();
    if model.is_empty() {
        return Err(CliError::Config(format!(
            "embeddings server {url:?} has no model name: set [retrieval] embeddings_model (or \
             --embeddings-model); cached vectors are keyed by it"
        )));
    }
    http(url, model).map(Some)
}

#[cfg(feature = "http")]
fn http(url: &str, model: &str) -> Result<Arc<dyn Embedder>, CliError> {
    match HttpEmbedder::new(url, model) {
        Ok(embedder) => Ok(Arc::new(embedder)),
        Err(e) => Err(CliError::Config(format!(
            "embeddings url {url:?}: {e}; give a base URL like http://127.0.0.1:8090"
        ))),
    }
}

#[cfg(not(feature = "http"))]
fn http(_: &str, _: &str) -> Result<Arc<dyn Embedder>, CliError> {
    Err(CliError::without_feature("http", "an embeddings server (hybrid recall)"))
}

#[cfg(all(test, feature = "http"))]
mod tests {
    use super::*;

    #[test]
    fn flags_win_and_a_model_is_required() {
        let file = EmbeddingsSection { url: Some("http://file:1".into()), model: Some("m".into()) };
        assert!(embedder((None, None), &EmbeddingsSection::default()).unwrap().is_none());
        assert!(embedder((None, None), &file).unwrap().is_some());
        assert!(embedder((Some("http://flag:1"), None), &file).unwrap().is_some());
        let no_model = EmbeddingsSection { model: None, ..file.clone() };
        assert!(matches!(embedder((None, None), &no_model), Err(CliError::Config(_))));
        assert!(matches!(embedder((Some("flag:1"), None), &file), Err(CliError::Config(_))));
    }
}
