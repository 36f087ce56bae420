//! Per-tokenizer-family weight tables for the class-count estimator.

use super::classes::{FEATURE_COUNT, Features};

/// How many 1/256 tokens each of the estimator's 24 text features costs, for one tokenizer
/// family.
///
/// The features, in array order (a *run* is a maximal sequence of the named characters):
///
/// | # | feature | # | feature |
/// |---|---|---|---|
/// | 0 | letter runs (any script) | 12 | Greek or Cyrillic chars |
/// | 1 | ASCII letters | 13 | Greek chars (extra) |
/// | 2 | Σ over letter runs of max(ASCII letters − 6, 0) | 14 | Hebrew/Arabic/… chars |
/// | 3 | lower→UPPER transitions (camelCase) | 15 | Indic/Thai/… chars |
/// | 4 | Σ over ASCII digit runs of ⌈len/3⌉ | 16 | Han chars |
/// | 5 | ASCII digits | 17 | Kana chars |
/// | 6 | punctuation-like runs | 18 | Hangul chars |
/// | 7 | ASCII punctuation | 19 | symbols (U+0080–00BF, U+2000–2E7F, …) |
/// | 8 | whitespace runs containing a line break | 20 | CJK punctuation |
/// | 9 | whitespace runs ending in ≥ 2 spaces/tabs | 21 | supplementary-plane chars (emoji) |
/// | 10 | `\u` escapes | 22 | ASCII control chars |
/// | 11 | Latin-script non-ASCII letters | 23 | runs of non-ASCII letters |
///
/// Refit a table with `scripts/fit-estimator.py` (a non-negative least-squares fit of the
/// relative error on a corpus with exact token counts).
///
/// # Examples
///
/// ```
/// use ctxwin_core::estimator::Weights;
///
/// // Weights for a hypothetical tokenizer: one token per letter run, nothing else.
/// let mut table = [0u16; Weights::FEATURE_COUNT];
/// table[0] = 256;
/// let words = Weights::new(table);
/// assert_eq!(words.per_feature()[0], 256);
/// assert_ne!(words, Weights::CL100K);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Weights {
    per_feature: [u16; FEATURE_COUNT],
}

impl Weights {
    /// Number of features (and weights) the estimator uses.
    pub const FEATURE_COUNT: usize = FEATURE_COUNT;

    /// OpenAI's `cl100k_base` (GPT-4, GPT-3.5). Fitted on half of a 4,349-message mixed
    /// corpus; held-out mean absolute error 8.1–8.6% per message at ×1. Also a fair fit for
    /// `o200k_base`, Llama 3 and Qwen3 (15–18% at ×1, 1–7% of messages under at ×5/4).
    ///
    /// ```
    /// use ctxwin_core::estimator::{Estimator, Margin, Weights};
    /// use ctxwin_core::counter::TokenCounter;
    ///
    /// let tight = Estimator::with(Weights::CL100K, Margin::TIGHT);
    /// assert_eq!(tight.count("hello world"), 3);
    /// ```
    pub const CL100K: Weights = Weights::new([
        117, 35, 0, 11, 390, 0, 143, 19, 271, 237, 1398, 278, 89, 132, 178, 232, 254, 230, 188, 97,
        0, 429, 256, 233,
    ]);

    /// SmolLM2 (HuggingFaceTB, 49,152-token GPT-2-style BPE that splits digits one by one),
    /// which emits about 1.31× as many tokens as `cl100k_base`.
    ///
    /// Fitted by `scripts/fit-estimator.py --fit smollm2` on the whole 4,349-message corpus,
    /// with the control-character weight held at one token (too rare to fit). Fitted on one
    /// half, it scored 7.4% mean absolute error per message at ×1 on the other half, 4.5% of
    /// messages under at ×5/4 and no 20-message total under.
    ///
    /// ```
    /// use ctxwin_core::estimator::{Estimator, Margin, Weights};
    /// use ctxwin_core::counter::TokenCounter;
    ///
    /// // SmolLM2 spends a token per digit.
    /// let smol = Estimator::with(Weights::SMOLLM2, Margin::TIGHT);
    /// let gpt4 = Estimator::with(Weights::CL100K, Margin::TIGHT);
    /// assert!(smol.count("31415926535") > gpt4.count("31415926535"));
    /// ```
    pub const SMOLLM2: Weights = Weights::new([
        148, 35, 0, 0, 147, 246, 244, 19, 268, 58, 944, 682, 191, 19, 241, 376, 449, 441, 624, 262,
        0, 862, 256, 152,
    ]);

    /// A table from its 24 weights in 1/256 token, in the feature order documented on
    /// [`Weights`].
    ///
    /// ```
    /// use ctxwin_core::estimator::Weights;
    ///
    /// let copy = Weights::new(Weights::CL100K.per_feature());
    /// assert_eq!(copy, Weights::CL100K);
    /// ```
    pub const fn new(per_feature: [u16; FEATURE_COUNT]) -> Weights {
        Weights { per_feature }
    }

    /// The 24 weights in 1/256 token, in feature order.
    ///
    /// ```
    /// use ctxwin_core::estimator::Weights;
    ///
    /// // A `\u` escape costs cl100k about 5.5 tokens.
    /// assert_eq!(Weights::CL100K.per_feature()[10], 1398);
    /// ```
    pub const fn per_feature(&self) -> [u16; FEATURE_COUNT] {
        self.per_feature
    }

    /// Σ wᵢ·fᵢ in 1/256 token. Cannot overflow: 24 · (2¹⁶ − 1) · (2³² − 1) < 2⁶⁴.
    pub(crate) fn cost(&self, features: &Features) -> u64 {
        self.per_feature
            .iter()
            .zip(features.values())
            .map(|(&w, &f)| u64::from(w) * u64::from(f))
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cost_is_the_dot_product() {
        let features = Features::of("ab").unwrap();
        // One letter run (117) and two ASCII letters (2 * 35).
        assert_eq!(Weights::CL100K.cost(&features), 187);
        assert_eq!(Weights::SMOLLM2.cost(&features), 148 + 2 * 35);
    }

    #[test]
    fn cost_of_maximal_weights_and_counts_does_not_overflow() {
        let heavy = Weights::new([u16::MAX; FEATURE_COUNT]);
        let saturated = Features::from_values([u32::MAX; FEATURE_COUNT]);
        let expected = 24 * u64::from(u16::MAX) * u64::from(u32::MAX);
        assert_eq!(heavy.cost(&saturated), expected);
    }
}
