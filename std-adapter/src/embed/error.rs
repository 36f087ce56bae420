//! What can go wrong when asking for vectors.

#[cfg(feature = "http")]
use crate::llm::LlmError;

/// Why an [`Embedder`](super::Embedder) gave no vectors. Retrieval treats every variant the
/// same way: this build ranks lexically.
///
/// ```
/// use ctxwin_std::embed::EmbedError;
/// let err = EmbedError::Count { inputs: 3, vectors: 2 };
/// assert!(err.to_string().contains("3 texts"));
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EmbedError {
    /// The embeddings request failed (transport, HTTP status, malformed answer, timeout).
    #[cfg(feature = "http")]
    #[error("embeddings request failed: {0}")]
    Request(#[from] LlmError),
    /// The embedder returned another number of vectors than texts.
    #[error("the embedder returned {vectors} vectors for {inputs} texts")]
    Count {
        /// Texts asked for.
        inputs: usize,
        /// Vectors returned.
        vectors: usize,
    },
    /// A vector's length differs from the others' (or from the cached ones': the model
    /// behind the name changed).
    #[error(
        "embedding of {found} dimensions where {expected} were expected; give a changed model \
         a new name"
    )]
    Dimensions {
        /// The length seen first.
        expected: usize,
        /// The length found.
        found: usize,
    },
    /// The embedder failed moments ago; it is not asked again until its cooldown ends.
    #[error("the embedder failed moments ago; ranking lexically until its cooldown ends")]
    CoolingDown,
    /// The embedder was set up wrongly (empty model name, zero batch size).
    #[error("embedder misconfigured: {0}")]
    Config(String),
}
