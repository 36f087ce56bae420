//! The wire formats, from [`ctxwin_std::format`]: the request envelope (every field and
//! message kept as raw JSON), the analysis of each message into what the session stores, and
//! the managed body composed from what the payload keeps. Re-exported here, where the proxy's
//! modules and its callers find them; nothing of the formats is the proxy's own.

pub use ctxwin_std::format::fingerprint::raw_hash;
pub use ctxwin_std::format::{
    Analyzed, AnswerCalls, BadRequest, CACHE_LIFETIME_MS, KeptPart, ManagedBody, Opaque, Part,
    PromptRanges, Provider, RECALL_TOOL, RecallCall, RecallResult, RecallStream, Request,
    analyze_item, analyze_message, answer_calls, cache_lifetime_ms, follow_up_body, merge_answers,
    message_as_answer, names_recall_tool, raw_hashes, recall_marker, tools_with_recall,
    without_recall_tool,
};
