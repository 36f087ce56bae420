//! Semantic vectors for archived messages: the [`Embedder`] seam, an OpenAI-compatible
//! `/v1/embeddings` implementation ([`HttpEmbedder`], cargo feature `http`) and the vector
//! arithmetic retrieval ranks with ([`cosine`]).
//!
//! Optional: a session without an embedder retrieves lexically (BM25) only. With one
//! ([`SessionBuilder::embedder`](crate::session::SessionBuilder::embedder)) retrieval fuses
//! BM25 with cosine similarity; every embedder failure falls back to the lexical ranking for
//! that build.
//!
//! # Examples
//!
//! ```
//! use ctxwin_std::embed::{EmbedError, Embedder, cosine};
//!
//! /// Two letters' counts: enough to show the seam.
//! struct Letters;
//! impl Embedder for Letters {
//!     fn model(&self) -> &str {
//!         "letters"
//!     }
//!     fn embed(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>, EmbedError> {
//!         Ok(texts.iter().map(|t| vec![t.matches('a').count() as f32, t.matches('b').count() as f32]).collect())
//!     }
//! }
//! let v = Letters.embed(&["aab", "aa", "bb"])?;
//! assert!(cosine(&v[0], &v[1]) > cosine(&v[0], &v[2]));
//! # Ok::<(), EmbedError>(())
//! ```

mod error;
#[cfg(feature = "http")]
mod http;
mod vector;

pub use error::EmbedError;
#[cfg(feature = "http")]
pub use http::HttpEmbedder;
pub use vector::{cosine, dot, normalized};

/// Turns texts into vectors whose cosine similarity says how close their meanings are.
///
/// Implementations must be deterministic for a model name (the archive caches vectors by
/// message and [`model`](Self::model)) and return one vector per text, all of one length.
/// They are shared between threads.
///
/// ```
/// use ctxwin_std::embed::{EmbedError, Embedder};
/// struct Zero;
/// impl Embedder for Zero {
///     fn model(&self) -> &str { "zero" }
///     fn embed(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>, EmbedError> {
///         Ok(vec![vec![0.0; 4]; texts.len()])
///     }
/// }
/// assert_eq!(Zero.embed(&["a", "b"])?.len(), 2);
/// # Ok::<(), EmbedError>(())
/// ```
pub trait Embedder: Send + Sync {
    /// The model's name: the key of cached vectors (vectors of two models never mix).
    fn model(&self) -> &str;

    /// One vector per text, in order.
    ///
    /// # Errors
    /// [`EmbedError`] when the vectors cannot be had; callers fall back to lexical ranking.
    fn embed(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>, EmbedError>;
}
