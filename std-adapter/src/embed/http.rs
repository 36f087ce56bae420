//! [`HttpEmbedder`]: an [`Embedder`] over an OpenAI-compatible `/v1/embeddings` endpoint.

use std::time::Duration;

use super::{EmbedError, Embedder};
use crate::llm::{LlmClient, LlmClientBuilder};

/// Texts per request by default: one llama-server batch of short chat turns.
const DEFAULT_BATCH: usize = 32;

/// Characters of a text sent by default. Small embedding models read 256–512 tokens;
/// 1,000 characters of English stay under 300.
const DEFAULT_MAX_CHARS: usize = 1_000;

/// Vectors from `POST {base}/v1/embeddings`, in batches, over an [`LlmClient`] (its timeouts,
/// retries and bearer key). Texts are cut to [`max_chars`](Self::max_chars) characters
/// first (embedding models have a short input limit).
///
/// ```
/// use ctxwin_std::embed::{Embedder, HttpEmbedder};
/// let embedder = HttpEmbedder::new("http://127.0.0.1:8090", "all-MiniLM-L6-v2")?;
/// assert_eq!(embedder.model(), "all-MiniLM-L6-v2");
/// # Ok::<(), ctxwin_std::embed::EmbedError>(())
/// ```
#[derive(Clone, Debug)]
pub struct HttpEmbedder {
    client: LlmClient,
    model: String,
    batch: usize,
    max_chars: usize,
}

impl HttpEmbedder {
    /// An embedder for the server at `base_url` and model `model` with settings for a
    /// request on the build path: 3 s per attempt, 1 s to connect, no retry. A slower or
    /// failing server makes that build rank lexically (and the next builds, for the session's
    /// cooldown).
    ///
    /// # Errors
    /// [`EmbedError::Config`] for an empty model name, [`EmbedError::Request`] for a bad URL.
    ///
    /// ```
    /// use ctxwin_std::embed::{EmbedError, HttpEmbedder};
    /// assert!(matches!(HttpEmbedder::new("127.0.0.1:8090", "m"), Err(EmbedError::Request(_))));
    /// assert!(matches!(HttpEmbedder::new("http://127.0.0.1:8090", " "), Err(EmbedError::Config(_))));
    /// ```
    pub fn new(base_url: &str, model: &str) -> Result<Self, EmbedError> {
        let client = LlmClientBuilder::new(base_url)
            .model(model)
            .timeout(Duration::from_secs(3))
            .connect_timeout(Duration::from_secs(1))
            .max_retries(0)
            .build()?;
        Self::with_client(client, model)
    }

    /// An embedder over `client` (build it with the model name set: it is sent as `model`).
    ///
    /// # Errors
    /// [`EmbedError::Config`] for an empty model name.
    ///
    /// ```
    /// use ctxwin_std::embed::HttpEmbedder;
    /// use ctxwin_std::llm::LlmClientBuilder;
    /// let client = LlmClientBuilder::new("https://api.openai.com/v1")
    ///     .model("text-embedding-3-small")
    ///     .api_key("sk-test")
    ///     .build()?;
    /// let embedder = HttpEmbedder::with_client(client, "text-embedding-3-small")?.batch(64);
    /// assert_eq!(embedder.batch_size(), 64);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn with_client(client: LlmClient, model: &str) -> Result<Self, EmbedError> {
        if model.trim().is_empty() {
            return Err(EmbedError::Config("the embeddings model name is empty".into()));
        }
        Ok(Self {
            client,
            model: model.to_owned(),
            batch: DEFAULT_BATCH,
            max_chars: DEFAULT_MAX_CHARS,
        })
    }

    /// Texts per request (at least 1; 32 by default).
    pub fn batch(mut self, texts: usize) -> Self {
        self.batch = texts.max(1);
        self
    }

    /// Texts per request.
    ///
    /// ```
    /// let e = ctxwin_std::embed::HttpEmbedder::new("http://h:1", "m")?.batch(0);
    /// assert_eq!(e.batch_size(), 1);
    /// # Ok::<(), ctxwin_std::embed::EmbedError>(())
    /// ```
    pub fn batch_size(&self) -> usize {
        self.batch
    }

    /// Characters of each text sent (at least 1; 1,000 by default).
    ///
    /// ```
    /// let e = ctxwin_std::embed::HttpEmbedder::new("http://h:1", "m")?.max_chars(400);
    /// assert_eq!(e.input_chars(), 400);
    /// # Ok::<(), ctxwin_std::embed::EmbedError>(())
    /// ```
    pub fn max_chars(mut self, chars: usize) -> Self {
        self.max_chars = chars.max(1);
        self
    }

    /// Characters of each text sent.
    pub fn input_chars(&self) -> usize {
        self.max_chars
    }
}

impl Embedder for HttpEmbedder {
    fn model(&self) -> &str {
        &self.model
    }

    fn embed(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>, EmbedError> {
        let mut out: Vec<Vec<f32>> = Vec::with_capacity(texts.len());
        for chunk in texts.chunks(self.batch) {
            let cut: Vec<&str> = chunk.iter().map(|t| prefix(t, self.max_chars)).collect();
            out.extend(self.client.embeddings(&cut)?.vectors);
        }
        if out.len() != texts.len() {
            return Err(EmbedError::Count { inputs: texts.len(), vectors: out.len() });
        }
        if let Some(first) = out.first()
            && let Some(other) = out.iter().find(|v| v.len() != first.len())
        {
            return Err(EmbedError::Dimensions { expected: first.len(), found: other.len() });
        }
        Ok(out)
    }
}

/// The first `chars` characters of `text`.
fn prefix(text: &str, chars: usize) -> &str {
    text.char_indices().nth(chars).map_or(text, |(at, _)| &text[..at])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes_cut_on_character_boundaries() {
        assert_eq!(prefix("héllo", 2), "hé");
        assert_eq!(prefix("hé", 9), "hé");
        assert_eq!(prefix("", 1), "");
    }

    #[test]
    fn an_unreachable_server_is_a_request_error() {
        let embedder = HttpEmbedder::with_client(
            LlmClientBuilder::new("http://127.0.0.1:1").max_retries(0).build().unwrap(),
            "m",
        )
        .unwrap();
        assert!(matches!(embedder.embed(&["x"]), Err(EmbedError::Request(_))));
        assert!(embedder.embed(&[]).unwrap().is_empty());
    }
}
