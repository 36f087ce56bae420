//! An [`Embedder`] that remembers every vector it was given, so that a bench building many
//! sessions over the same turns embeds each text once.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use ctxwin_std::embed::{EmbedError, Embedder};

/// Wraps an embedder with a text → vector memory (unbounded: for benches).
///
/// ```
/// use std::sync::Arc;
/// use ctxwin_benches::embedcache::CachedEmbedder;
/// use ctxwin_std::embed::{EmbedError, Embedder};
///
/// struct Len;
/// impl Embedder for Len {
///     fn model(&self) -> &str { "len" }
///     fn embed(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>, EmbedError> {
///         Ok(texts.iter().map(|t| vec![t.len() as f32]).collect())
///     }
/// }
/// let cached = CachedEmbedder::new(Arc::new(Len));
/// cached.embed(&["ab", "abc"])?;
/// cached.embed(&["ab"])?;
/// assert_eq!(cached.sent(), 2);
/// # Ok::<(), EmbedError>(())
/// ```
pub struct CachedEmbedder {
    inner: Arc<dyn Embedder>,
    memory: Mutex<HashMap<String, Vec<f32>>>,
    sent: Mutex<u64>,
}

impl CachedEmbedder {
    /// Remembers what `inner` returns.
    pub fn new(inner: Arc<dyn Embedder>) -> Self {
        Self { inner, memory: Mutex::default(), sent: Mutex::new(0) }
    }

    /// Texts sent to the inner embedder so far.
    pub fn sent(&self) -> u64 {
        *self.sent.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Embedder for CachedEmbedder {
    fn model(&self) -> &str {
        self.inner.model()
    }

    fn embed(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>, EmbedError> {
        let missing: Vec<&str> = {
            let memory = self.memory.lock().unwrap_or_else(PoisonError::into_inner);
            let mut seen = std::collections::HashSet::new();
            texts.iter().copied().filter(|t| !memory.contains_key(*t) && seen.insert(*t)).collect()
        };
        if !missing.is_empty() {
            let vectors = self.inner.embed(&missing)?;
            if vectors.len() != missing.len() {
                return Err(EmbedError::Count { inputs: missing.len(), vectors: vectors.len() });
            }
            *self.sent.lock().unwrap_or_else(PoisonError::into_inner) += missing.len() as u64;
            let mut memory = self.memory.lock().unwrap_or_else(PoisonError::into_inner);
            for (text, vector) in missing.into_iter().zip(vectors) {
                memory.insert(text.to_owned(), vector);
            }
        }
        let memory = self.memory.lock().unwrap_or_else(PoisonError::into_inner);
        texts
            .iter()
            .map(|t| memory.get(*t).cloned().ok_or(EmbedError::Count { inputs: 1, vectors: 0 }))
            .collect()
    }
}
