//! Why shipped bench data could not be loaded.

/// Why the shipped session or corpus could not be read.
///
/// ```
/// use ctxwin_benches::corpus::parse_sample;
/// let error = parse_sample("{\"type\": \"prose\"}\n").unwrap_err();
/// assert!(error.to_string().contains("line 1"));
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DataError {
    /// The gzip-compressed session does not decompress.
    #[error("cannot decompress the shipped session: {0}")]
    Decompress(#[from] std::io::Error),
    /// The session is not valid OpenAI chat-completions JSONL.
    #[error("the shipped session is not valid OpenAI JSONL: {0}")]
    Format(#[from] ctxwin_std::format::FormatError),
    /// A corpus line is not a JSON object with the expected fields.
    #[error("estimator corpus line {line}: {problem}")]
    Corpus {
        /// 1-based line number.
        line: usize,
        /// What is wrong with it.
        problem: String,
    },
}

/// Why a replay could not run.
///
/// ```
/// use ctxwin_benches::WorkloadError;
/// use ctxwin_core::ConfigError;
/// let error = WorkloadError::from(ConfigError::NoBudget);
/// assert!(error.to_string().starts_with("invalid configuration"));
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WorkloadError {
    /// The configuration is invalid.
    #[error("invalid configuration: {0}")]
    Config(#[from] ctxwin_core::ConfigError),
    /// The manager refused an operation.
    #[error("the manager refused: {0}")]
    Core(#[from] ctxwin_core::Error),
    /// Settling a manager ran out of turns before the compactions it waits for.
    #[error("no compaction within 10,000 settling turns after {after} messages")]
    NoCompaction {
        /// Messages pushed when the replay gave up.
        after: usize,
    },
}
