//! The `[retrieval]` section of `ctxwin.toml`, read alike by the command line and the proxy.

use serde::Deserialize;

use super::retrieve::RetrievalSettings;

/// The `[retrieval]` section as written: each key optional, unknown keys refused by name.
///
/// ```
/// use ctxwin_std::session::{RetrievalSection, RetrievalSettings};
/// let section: RetrievalSection = serde_json::from_str(r#"{"auto": false, "max_items": 5}"#)?;
/// let settings = section.resolve(RetrievalSettings::DEFAULT)?;
/// assert!(!settings.auto && settings.max_items == 5);
/// assert!(serde_json::from_str::<RetrievalSection>(r#"{"auto_recall": true}"#).is_err());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RetrievalSection {
    /// Base URL of an OpenAI-compatible `/v1/embeddings` server for hybrid recall.
    pub embeddings_url: Option<String>,
    /// The embeddings model's name.
    pub embeddings_model: Option<String>,
    /// [`RetrievalSettings::auto`].
    pub auto: Option<bool>,
    /// [`RetrievalSettings::max_share_percent`].
    pub max_share_percent: Option<u8>,
    /// [`RetrievalSettings::max_items`].
    pub max_items: Option<usize>,
    /// [`RetrievalSettings::candidates`].
    pub candidates: Option<usize>,
    /// [`RetrievalSettings::neighbours`].
    pub neighbours: Option<bool>,
    /// [`RetrievalSettings::recency`].
    pub recency: Option<f64>,
}

impl RetrievalSection {
    /// `base` with the keys this section sets, checked.
    ///
    /// # Errors
    /// A message naming the key when `max_share_percent` is over 100 or `recency` outside
    /// 0–10.
    pub fn resolve(&self, base: RetrievalSettings) -> Result<RetrievalSettings, String> {
        let settings = RetrievalSettings {
            auto: self.auto.unwrap_or(base.auto),
            max_share_percent: self.max_share_percent.unwrap_or(base.max_share_percent),
            max_items: self.max_items.unwrap_or(base.max_items),
            candidates: self.candidates.unwrap_or(base.candidates),
            neighbours: self.neighbours.unwrap_or(base.neighbours),
            recency: self.recency.unwrap_or(base.recency),
        };
        if settings.max_share_percent > 100 {
            return Err("[retrieval] max_share_percent must be 0-100".into());
        }
        if !(0.0..=10.0).contains(&settings.recency) {
            return Err("[retrieval] recency must be between 0 and 10".into());
        }
        Ok(settings)
    }
}
