//! [`ExactCounter`]: exact token counts from a Hugging Face `tokenizer.json`.

use std::fmt;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use ctxwin_core::counter::TokenCounter;
use flate2::read::GzDecoder;
use tokenizers::Tokenizer;

use super::cache::{CacheStats, CountCache, DEFAULT_CACHE_CAPACITY};

/// Largest tokenizer file, compressed or not, that loading accepts (256 MiB; the biggest
/// common ones, o200k and Qwen3, are about 10 MB).
pub const MAX_TOKENIZER_BYTES: u64 = 256 * 1024 * 1024;

const CL100K_GZ: &[u8] = include_bytes!("../../assets/cl100k_base.tokenizer.json.gz");
const CL100K_PATH: &str = "<embedded>/assets/cl100k_base.tokenizer.json.gz";
const SMOLLM2_GZ: &[u8] = include_bytes!("../../assets/smollm2-135m.tokenizer.json.gz");
const SMOLLM2_PATH: &str = "<embedded>/assets/smollm2-135m.tokenizer.json.gz";
const GZIP_MAGIC: [u8; 2] = [0x1f, 0x8b];

/// Why a tokenizer could not be loaded. Every variant names the file.
///
/// # Examples
///
/// ```
/// use ctxwin_std::tokens::{ExactCounter, TokenizerError};
///
/// let error = ExactCounter::from_file("no/such/tokenizer.json").unwrap_err();
/// assert!(matches!(error, TokenizerError::Read { .. }));
/// assert!(error.to_string().contains("no/such/tokenizer.json"));
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TokenizerError {
    /// The file could not be opened or read.
    #[error("cannot read tokenizer file {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// What the OS said.
        source: std::io::Error,
    },
    /// The file, or its decompressed content, is larger than [`MAX_TOKENIZER_BYTES`].
    #[error("tokenizer file {path} is over the {limit}-byte limit")]
    TooLarge {
        /// The file.
        path: PathBuf,
        /// The limit, [`MAX_TOKENIZER_BYTES`].
        limit: u64,
    },
    /// The file starts like gzip but does not decompress.
    #[error("tokenizer file {path} is not valid gzip: {source}")]
    Decompress {
        /// The file.
        path: PathBuf,
        /// What the decoder said.
        source: std::io::Error,
    },
    /// The content is not a `tokenizer.json` the `tokenizers` crate can load.
    #[error("tokenizer file {path} is not a valid tokenizer.json: {source}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// What the parser said (with line and column for JSON errors).
        source: tokenizers::Error,
    },
}

/// A [`TokenCounter`] that counts exactly, with any Hugging Face `tokenizer.json`, and
/// caches per-text counts.
///
/// - [`ExactCounter::cl100k`] uses OpenAI's `cl100k_base` (GPT-4, GPT-3.5), shipped inside
///   the crate; [`ExactCounter::smollm2`] the SmolLM2 tokenizer, also shipped;
///   [`ExactCounter::from_file`] loads any other (o200k, Llama 3, Qwen3, …), plain or gzipped.
/// - Counts are content tokens only: no BOS/EOS or other special tokens are added (chat
///   framing is [`ChatFraming`](super::ChatFraming)'s job). Special-token strings that occur
///   in the text itself (such as `<|endoftext|>`) count as the one special token they are.
/// - `count` takes `&self`: the tokenizer is shared and immutable, the cache sits behind a
///   mutex that is never held while tokenizing. The counter is `Send + Sync`, and clones are
///   cheap handles to the same tokenizer and the same cache.
/// - The only per-call allocations are the tokenizer's own; a cache hit allocates nothing.
///
/// # Examples
///
/// ```
/// use ctxwin_core::counter::TokenCounter;
/// use ctxwin_std::tokens::ExactCounter;
///
/// let counter = ExactCounter::cl100k()?;
/// assert_eq!(counter.count("hello world"), 2);
/// assert_eq!(counter.count("hello world"), 2);
/// assert_eq!(counter.cache_stats().hits, 1);
/// # Ok::<(), ctxwin_std::tokens::TokenizerError>(())
/// ```
#[derive(Clone)]
pub struct ExactCounter {
    tokenizer: Arc<Tokenizer>,
    cache: Arc<CountCache>,
    path: Arc<Path>,
}

impl ExactCounter {
    /// A counter for OpenAI's `cl100k_base`, from the copy embedded in the crate.
    ///
    /// The first call decompresses and parses it (a fraction of a second in release builds);
    /// later calls share that tokenizer for the rest of the process and only get a new cache.
    ///
    /// # Errors
    ///
    /// None in practice: the embedded file is checked by the crate's tests.
    ///
    /// # Examples
    ///
    /// ```
    /// use ctxwin_core::counter::TokenCounter;
    /// use ctxwin_std::tokens::ExactCounter;
    ///
    /// let counter = ExactCounter::cl100k()?;
    /// assert_eq!(counter.count("The quick brown fox"), 4);
    /// # Ok::<(), ctxwin_std::tokens::TokenizerError>(())
    /// ```
    pub fn cl100k() -> Result<ExactCounter, TokenizerError> {
        static CL100K: OnceLock<Arc<Tokenizer>> = OnceLock::new();
        Self::embedded(&CL100K, CL100K_GZ, CL100K_PATH)
    }

    /// A counter for the SmolLM2 tokenizer (GPT-2-style byte-level BPE, 49,152 tokens, digits
    /// split one by one), from the copy embedded in the crate; shared like
    /// [`ExactCounter::cl100k`].
    ///
    /// # Errors
    ///
    /// None in practice: the embedded file is checked by the crate's tests.
    ///
    /// # Examples
    ///
    /// ```
    /// use ctxwin_core::counter::TokenCounter;
    /// use ctxwin_std::tokens::ExactCounter;
    ///
    /// let counter = ExactCounter::smollm2()?;
    /// assert_eq!(counter.count("2026"), 4);
    /// # Ok::<(), ctxwin_std::tokens::TokenizerError>(())
    /// ```
    pub fn smollm2() -> Result<ExactCounter, TokenizerError> {
        static SMOLLM2: OnceLock<Arc<Tokenizer>> = OnceLock::new();
        Self::embedded(&SMOLLM2, SMOLLM2_GZ, SMOLLM2_PATH)
    }

    /// A counter for the `tokenizer.json` at `path`, plain or gzip-compressed (told apart by
    /// the gzip magic bytes, not by the name).
    ///
    /// # Errors
    ///
    /// [`TokenizerError`] naming `path`: unreadable, too large, bad gzip, or not a tokenizer.
    ///
    /// # Examples
    ///
    /// ```
    /// use ctxwin_std::tokens::{ExactCounter, TokenizerError};
    ///
    /// let dir = tempfile::tempdir()?;
    /// let path = dir.path().join("tokenizer.json");
    /// std::fs::write(&path, "{\"model\": 42}")?;
    /// let error = ExactCounter::from_file(&path).unwrap_err();
    /// assert!(matches!(error, TokenizerError::Parse { .. }));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn from_file(path: impl AsRef<Path>) -> Result<ExactCounter, TokenizerError> {
        let path = path.as_ref();
        let bytes = read_limited(path)?;
        let tokenizer = parse(&bytes, path)?;
        tracing::debug!(path = %path.display(), "loaded tokenizer");
        Ok(Self::with_tokenizer(Arc::new(tokenizer), Arc::from(path)))
    }

    fn embedded(
        slot: &OnceLock<Arc<Tokenizer>>,
        gz: &[u8],
        path: &'static str,
    ) -> Result<ExactCounter, TokenizerError> {
        let path = Path::new(path);
        let tokenizer = match slot.get() {
            Some(tokenizer) => Arc::clone(tokenizer),
            None => {
                // Two threads racing here both parse; the loser's copy is dropped.
                let parsed = Arc::new(parse(gz, path)?);
                Arc::clone(slot.get_or_init(|| parsed))
            }
        };
        Ok(Self::with_tokenizer(tokenizer, Arc::from(path)))
    }

    fn with_tokenizer(tokenizer: Arc<Tokenizer>, path: Arc<Path>) -> ExactCounter {
        ExactCounter { tokenizer, cache: Arc::new(CountCache::new(DEFAULT_CACHE_CAPACITY)), path }
    }

    /// The same tokenizer with a new, empty cache of at most `capacity` counts (0: no cache).
    /// The default is [`DEFAULT_CACHE_CAPACITY`](super::DEFAULT_CACHE_CAPACITY).
    ///
    /// ```
    /// use ctxwin_core::counter::TokenCounter;
    /// use ctxwin_std::tokens::ExactCounter;
    ///
    /// let counter = ExactCounter::cl100k()?.with_cache_capacity(0);
    /// counter.count("hi");
    /// counter.count("hi");
    /// assert_eq!(counter.cache_stats().hits, 0);
    /// # Ok::<(), ctxwin_std::tokens::TokenizerError>(())
    /// ```
    pub fn with_cache_capacity(self, capacity: usize) -> ExactCounter {
        ExactCounter { cache: Arc::new(CountCache::new(capacity)), ..self }
    }

    /// Tokens of `text`, bypassing the cache.
    ///
    /// Should the tokenizer fail (it cannot for the shipped files), this logs a warning and
    /// returns the byte length, an upper bound for byte-level BPE, so the failure errs high.
    ///
    /// ```
    /// use ctxwin_std::tokens::ExactCounter;
    ///
    /// let counter = ExactCounter::cl100k()?;
    /// assert_eq!(counter.count_uncached("hello world"), 2);
    /// assert_eq!(counter.cache_stats().lookups(), 0);
    /// # Ok::<(), ctxwin_std::tokens::TokenizerError>(())
    /// ```
    pub fn count_uncached(&self, text: &str) -> u32 {
        if text.is_empty() {
            return 0;
        }
        match self.tokenizer.encode_fast(text, false) {
            Ok(encoding) => saturate(encoding.len()),
            Err(error) => {
                tracing::warn!(path = %self.path.display(), %error, "tokenizer failed; counting bytes");
                saturate(text.len())
            }
        }
    }

    /// Hits, misses and size of the cache (shared by all clones of this counter).
    ///
    /// ```
    /// use ctxwin_core::counter::TokenCounter;
    /// use ctxwin_std::tokens::ExactCounter;
    ///
    /// let counter = ExactCounter::cl100k()?;
    /// counter.count("a");
    /// counter.clone().count("a");
    /// let stats = counter.cache_stats();
    /// assert_eq!((stats.hits, stats.misses, stats.entries), (1, 1, 1));
    /// # Ok::<(), ctxwin_std::tokens::TokenizerError>(())
    /// ```
    pub fn cache_stats(&self) -> CacheStats {
        self.cache.stats()
    }

    /// Drops every cached count (the hit and miss counters stay).
    ///
    /// ```
    /// use ctxwin_core::counter::TokenCounter;
    /// use ctxwin_std::tokens::ExactCounter;
    ///
    /// let counter = ExactCounter::cl100k()?;
    /// counter.count("a");
    /// counter.clear_cache();
    /// assert_eq!(counter.cache_stats().entries, 0);
    /// # Ok::<(), ctxwin_std::tokens::TokenizerError>(())
    /// ```
    pub fn clear_cache(&self) {
        self.cache.clear();
    }

    /// Where the tokenizer came from: the path given to [`ExactCounter::from_file`], or
    /// `<embedded>/assets/…` for the shipped ones.
    ///
    /// ```
    /// use ctxwin_std::tokens::ExactCounter;
    ///
    /// let counter = ExactCounter::cl100k()?;
    /// assert!(counter.path().ends_with("cl100k_base.tokenizer.json.gz"));
    /// # Ok::<(), ctxwin_std::tokens::TokenizerError>(())
    /// ```
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The id of `token` if the vocabulary (or the added tokens) has it as a single token.
    ///
    /// ```
    /// use ctxwin_std::tokens::ExactCounter;
    ///
    /// let counter = ExactCounter::smollm2()?;
    /// assert_eq!(counter.token_id("<|im_start|>"), Some(1));
    /// assert_eq!(ExactCounter::cl100k()?.token_id("<|im_start|>"), None);
    /// # Ok::<(), ctxwin_std::tokens::TokenizerError>(())
    /// ```
    pub fn token_id(&self, token: &str) -> Option<u32> {
        self.tokenizer.token_to_id(token)
    }
}

impl TokenCounter for ExactCounter {
    fn count(&self, text: &str) -> u32 {
        if text.is_empty() {
            return 0;
        }
        let key = self.cache.key(text);
        if let Some(count) = self.cache.get(key) {
            return count;
        }
        let count = self.count_uncached(text);
        self.cache.insert(key, count);
        count
    }
}

impl fmt::Debug for ExactCounter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The tokenizer's own Debug prints the whole vocabulary.
        f.debug_struct("ExactCounter")
            .field("path", &self.path)
            .field("cache", &self.cache_stats())
            .finish_non_exhaustive()
    }
}

fn saturate(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

fn read_limited(path: &Path) -> Result<Vec<u8>, TokenizerError> {
    let read_error = |source| TokenizerError::Read { path: path.to_owned(), source };
    let file = std::fs::File::open(path).map_err(read_error)?;
    let mut bytes = Vec::new();
    file.take(MAX_TOKENIZER_BYTES + 1).read_to_end(&mut bytes).map_err(read_error)?;
    if bytes.len() as u64 > MAX_TOKENIZER_BYTES {
        return Err(TokenizerError::TooLarge { path: path.to_owned(), limit: MAX_TOKENIZER_BYTES });
    }
    Ok(bytes)
}

/// Parses `bytes` (gzip or plain JSON) into a tokenizer that never truncates or pads.
fn parse(bytes: &[u8], path: &Path) -> Result<Tokenizer, TokenizerError> {
    let json = if bytes.starts_with(&GZIP_MAGIC) {
        let mut json = Vec::new();
        GzDecoder::new(bytes)
            .take(MAX_TOKENIZER_BYTES + 1)
            .read_to_end(&mut json)
            .map_err(|source| TokenizerError::Decompress { path: path.to_owned(), source })?;
        if json.len() as u64 > MAX_TOKENIZER_BYTES {
            return Err(TokenizerError::TooLarge {
                path: path.to_owned(),
                limit: MAX_TOKENIZER_BYTES,
            });
        }
        std::borrow::Cow::Owned(json)
    } else {
        std::borrow::Cow::Borrowed(bytes)
    };
    let parse_error = |source| TokenizerError::Parse { path: path.to_owned(), source };
    let mut tokenizer = Tokenizer::from_bytes(&json).map_err(parse_error)?;
    // A tokenizer.json may carry truncation or padding settings for model inputs; either
    // would make counts wrong (capped or padded).
    tokenizer.with_truncation(None).map_err(parse_error)?;
    tokenizer.with_padding(None);
    Ok(tokenizer)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_text_is_zero_without_a_lookup() {
        let counter = ExactCounter::cl100k().unwrap();
        assert_eq!(counter.count(""), 0);
        assert_eq!(counter.count_uncached(""), 0);
        assert_eq!(counter.cache_stats().lookups(), 0);
    }

    #[test]
    fn embedded_tokenizers_are_shared_but_caches_are_not() {
        let a = ExactCounter::cl100k().unwrap();
        let b = ExactCounter::cl100k().unwrap();
        assert!(Arc::ptr_eq(&a.tokenizer, &b.tokenizer));
        a.count("shared?");
        assert_eq!(b.cache_stats().lookups(), 0);
        let c = a.clone();
        assert!(Arc::ptr_eq(&a.cache, &c.cache));
    }

    #[test]
    fn truncation_and_padding_in_the_file_are_ignored() {
        let json = r#"{"version": "1.0",
            "truncation": {"direction": "Right", "max_length": 2, "strategy": "LongestFirst",
                           "stride": 0},
            "padding": null, "added_tokens": [], "normalizer": null,
            "pre_tokenizer": {"type": "Whitespace"}, "post_processor": null, "decoder": null,
            "model": {"type": "WordLevel", "vocab": {"[UNK]": 0, "a": 1, "b": 2},
                      "unk_token": "[UNK]"}}"#;
        let tokenizer = parse(json.as_bytes(), Path::new("inline.json")).unwrap();
        assert!(tokenizer.get_truncation().is_none());
        let counter = ExactCounter::with_tokenizer(Arc::new(tokenizer), Arc::from(Path::new("x")));
        assert_eq!(counter.count("a b a b c"), 5);
    }

    #[test]
    fn bad_gzip_is_a_decompress_error() {
        let error = parse(&[0x1f, 0x8b, 8, 0, 1, 2, 3], Path::new("broken.gz")).unwrap_err();
        assert!(matches!(error, TokenizerError::Decompress { .. }), "{error}");
        assert!(error.to_string().contains("broken.gz"));
    }

    #[test]
    fn debug_does_not_dump_the_vocabulary() {
        let text = format!("{:?}", ExactCounter::smollm2().unwrap());
        assert!(text.len() < 300, "{text}");
        assert!(text.contains("smollm2"));
    }
}
