//! An [`Embedder`] that remembers every vector it was given, so that a bench building many
//! sessions over the same turns embeds each text once.

use std::collections::HashMap;
use std::path::Path;
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

    /// Adds the vectors saved at `path` by [`save`](Self::save) for the same model; returns
    /// how many (0 when the file is missing, of another model or unreadable).
    pub fn load(&self, path: &Path) -> usize {
        let Ok(bytes) = std::fs::read(path) else { return 0 };
        let mut memory = self.memory.lock().unwrap_or_else(PoisonError::into_inner);
        let before = memory.len();
        let mut at = 0usize;
        let mut take = |n: usize| {
            let slice = bytes.get(at..at.checked_add(n)?)?;
            at += n;
            Some(slice)
        };
        let word = |b: &[u8]| u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize;
        let Some(model) = take(4).map(word).and_then(&mut take) else { return 0 };
        if model != self.inner.model().as_bytes() {
            return 0;
        }
        while let Some(len) = take(4).map(word) {
            let (Some(text), Some(dims)) = (take(len).map(<[u8]>::to_vec), take(4).map(word))
            else {
                break;
            };
            let Some(raw) = take(dims * 4) else { break };
            let vector = raw.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]));
            if let Ok(text) = String::from_utf8(text) {
                memory.insert(text, vector.collect());
            }
        }
        memory.len() - before
    }

    /// Writes every vector held to `path` (with the model's name), for [`load`](Self::load).
    ///
    /// # Errors
    /// I/O errors.
    pub fn save(&self, path: &Path) -> std::io::Result<()> {
        let memory = self.memory.lock().unwrap_or_else(PoisonError::into_inner);
        let mut out = Vec::new();
        let word = |out: &mut Vec<u8>, n: usize| {
            out.extend_from_slice(&u32::try_from(n).unwrap_or(u32::MAX).to_le_bytes());
        };
        word(&mut out, self.inner.model().len());
        out.extend_from_slice(self.inner.model().as_bytes());
        for (text, vector) in memory.iter() {
            word(&mut out, text.len());
            out.extend_from_slice(text.as_bytes());
            word(&mut out, vector.len());
            out.extend(vector.iter().flat_map(|x| x.to_le_bytes()));
        }
        std::fs::write(path, out)
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

#[cfg(test)]
mod tests {
    use super::*;

    struct Len(&'static str);
    impl Embedder for Len {
        fn model(&self) -> &str {
            self.0
        }
        fn embed(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>, EmbedError> {
            Ok(texts.iter().map(|t| vec![t.len() as f32, 0.5]).collect())
        }
    }

    #[test]
    fn saved_vectors_load_for_the_same_model_only() {
        let dir = std::env::temp_dir().join(format!("ctxwin-embedcache-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("v.bin");
        let first = CachedEmbedder::new(Arc::new(Len("a")));
        first.embed(&["héllo", "x"]).unwrap();
        first.save(&path).unwrap();
        let again = CachedEmbedder::new(Arc::new(Len("a")));
        assert_eq!(again.load(&path), 2);
        assert_eq!(again.embed(&["héllo"]).unwrap(), [[6.0, 0.5]]);
        assert_eq!(again.sent(), 0);
        assert_eq!(CachedEmbedder::new(Arc::new(Len("b"))).load(&path), 0);
        assert_eq!(again.load(&dir.join("missing")), 0);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
