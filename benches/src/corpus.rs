//! The estimator's accuracy corpus: `core/testdata/estimator-sample.jsonl`, 504 messages (42
//! of each of 12 content types) with exact counts for five tokenizers.

use crate::DataError;

/// The corpus sample the core's accuracy tests use, embedded at build time.
pub const ESTIMATOR_SAMPLE: &str = include_str!("../../core/testdata/estimator-sample.jsonl");

/// Tokenizers the corpus has exact counts for, in column order.
pub const TOKENIZERS: [&str; 5] = ["cl100k", "o200k", "llama3", "qwen3", "smollm2"];

/// One corpus message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sample {
    /// Content type (`prose`, `code`, `json`, `zh`, …).
    pub kind: String,
    /// The text.
    pub text: String,
    /// Exact token counts, in [`TOKENIZERS`] order.
    pub exact: [u32; 5],
}

impl Sample {
    /// Exact count for OpenAI's `cl100k_base`.
    pub fn cl100k(&self) -> u32 {
        self.exact[0]
    }
}

/// Parses corpus JSONL (`{"type", "text", "cl100k", "o200k", "llama3", "qwen3", "smollm2"}`
/// per line; blank lines skipped).
///
/// # Errors
///
/// [`DataError::Corpus`] naming the first bad line.
///
/// ```
/// let line = r#"{"type":"prose","text":"hi","cl100k":1,"o200k":1,"llama3":1,"qwen3":1,"smollm2":1}"#;
/// let samples = ctxwin_benches::corpus::parse_sample(line)?;
/// assert_eq!((samples[0].kind.as_str(), samples[0].cl100k()), ("prose", 1));
/// # Ok::<(), ctxwin_benches::DataError>(())
/// ```
pub fn parse_sample(jsonl: &str) -> Result<Vec<Sample>, DataError> {
    jsonl
        .lines()
        .enumerate()
        .filter(|(_, line)| !line.trim().is_empty())
        .map(|(index, line)| {
            let bad = |problem: String| DataError::Corpus { line: index + 1, problem };
            let value: serde_json::Value =
                serde_json::from_str(line).map_err(|e| bad(e.to_string()))?;
            let text_field = |key: &str| {
                value[key]
                    .as_str()
                    .map(str::to_owned)
                    .ok_or_else(|| bad(format!("no string {key:?}")))
            };
            let mut exact = [0u32; 5];
            for (slot, key) in exact.iter_mut().zip(TOKENIZERS) {
                *slot = value[key]
                    .as_u64()
                    .and_then(|n| u32::try_from(n).ok())
                    .ok_or_else(|| bad(format!("no count {key:?}")))?;
            }
            Ok(Sample { kind: text_field("type")?, text: text_field("text")?, exact })
        })
        .collect()
}

/// The embedded corpus ([`ESTIMATOR_SAMPLE`]), parsed.
///
/// # Errors
///
/// None in practice: the file is checked by this crate's tests.
///
/// ```
/// let samples = ctxwin_benches::corpus::estimator_sample()?;
/// assert_eq!(samples.len(), 504);
/// # Ok::<(), ctxwin_benches::DataError>(())
/// ```
pub fn estimator_sample() -> Result<Vec<Sample>, DataError> {
    parse_sample(ESTIMATOR_SAMPLE)
}

/// Content types in first-seen order.
///
/// ```
/// let samples = ctxwin_benches::corpus::estimator_sample()?;
/// assert_eq!(ctxwin_benches::corpus::kinds(&samples).len(), 12);
/// # Ok::<(), ctxwin_benches::DataError>(())
/// ```
pub fn kinds(samples: &[Sample]) -> Vec<&str> {
    let mut kinds: Vec<&str> = Vec::new();
    for sample in samples {
        if !kinds.contains(&sample.kind.as_str()) {
            kinds.push(&sample.kind);
        }
    }
    kinds
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_embedded_sample_has_42_messages_of_each_of_12_types() {
        let samples = estimator_sample().unwrap();
        let kinds = kinds(&samples);
        assert_eq!(kinds.len(), 12);
        for kind in kinds {
            assert_eq!(samples.iter().filter(|s| s.kind == kind).count(), 42, "{kind}");
        }
        assert!(samples.iter().all(|s| s.cl100k() > 0 && !s.text.is_empty()));
    }

    #[test]
    fn a_missing_count_names_its_line() {
        let jsonl = "\n{\"type\":\"x\",\"text\":\"y\",\"cl100k\":1}\n";
        let error = parse_sample(jsonl).unwrap_err();
        assert!(matches!(error, DataError::Corpus { line: 2, .. }), "{error}");
        assert!(error.to_string().contains("o200k"));
    }
}
