//! `ctxwin.toml`: the state directory's configuration, written commented by `ctxwin init`.
//!
//! Sections: top-level `session` (the archive key), `[context]` (every
//! [`ctxwin_core::Config`] field, by its name, and `checkpoint_interval_messages`),
//! `[checkpoints]`, `[store]`, `[tokenizer]`, `[llm]`, `[retrieval]`, `[limits]`, `[tasks]`, `[proxy]`. Every key is
//! optional; unknown keys are refused so a typo never goes unnoticed.

use std::path::{Path, PathBuf};
use std::time::Duration;

use ctxwin_core::{Config, OutboxMode, StrategyKind, UnansweredCalls};
use ctxwin_std::session::CheckpointPolicy;
use ctxwin_std::session::{RetrievalSection, RetrievalSettings, TaskDetection};
use serde::Deserialize;

use super::error::CliError;
use ctxwin_std::statefs;

/// The file name inside the state directory.
pub(crate) const FILE_NAME: &str = "ctxwin.toml";

/// The largest configuration file read.
const MAX_CONFIG_BYTES: u64 = 1024 * 1024;

/// The session name when the file sets none.
const DEFAULT_SESSION: &str = "main";

/// Checkpoints kept when the file sets no `[checkpoints] keep`.
const DEFAULT_KEEP: usize = 10;

/// The `[context]` key of the session's periodic checkpoints: a std-side setting, no longer a
/// core [`Config`] field, read from where configuration files have always had it.
const CHECKPOINT_INTERVAL_KEY: &str = "checkpoint_interval_messages";

/// A parsed, validated `ctxwin.toml`.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct FileConfig {
    /// The session's name in the archive.
    pub session: String,
    /// The core's configuration.
    pub context: Config,
    /// `[context] checkpoint_interval_messages`: messages between periodic checkpoints.
    pub checkpoint_interval_messages: u32,
    /// Checkpoints kept.
    pub keep_checkpoints: usize,
    /// `[store] url`: where the archive and checkpoints are instead of this directory (a
    /// `postgres://` URL), as written; `CTXWIN_STORE_URL` overrides it.
    pub store_url: Option<String>,
    /// `[tokenizer] path`, as written.
    pub tokenizer: Option<String>,
    /// `[llm]`.
    pub llm: LlmSection,
    /// `[limits]`.
    pub limits: Limits,
    /// `[retrieval]`, resolved.
    pub retrieval: RetrievalSettings,
    /// `[retrieval] embeddings_url` and `embeddings_model`.
    pub embeddings: EmbeddingsSection,
    /// `[tasks] detect`: how task boundaries nobody announces are found.
    pub task_detection: TaskDetection,
}

/// `[tasks]`: task boundaries (`ctxwin task start` / `done` set them explicitly).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct TasksSection {
    detect: Option<String>,
}

impl TasksSection {
    /// `detect`, checked (off when left out).
    fn detection(&self) -> Result<TaskDetection, String> {
        match self.detect.as_deref() {
            None => Ok(TaskDetection::Off),
            Some(name) => TaskDetection::parse(name).ok_or_else(|| {
                format!("[tasks] detect must be \"off\" or \"new-request\", not {name:?}")
            }),
        }
    }
}

/// The embeddings server of hybrid recall (`[retrieval] embeddings_url`, `embeddings_model`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct EmbeddingsSection {
    /// Base URL of an OpenAI-compatible `/v1/embeddings` server.
    pub url: Option<String>,
    /// The model's name.
    pub model: Option<String>,
}

/// The `[limits]` section, checked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Limits {
    /// Largest message or conversation file read, in bytes.
    pub max_input_bytes: u64,
    /// How long a command waits for another's lock on the state directory.
    pub lock_wait: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_input_bytes: statefs::DEFAULT_MAX_INPUT_BYTES,
            lock_wait: statefs::DEFAULT_LOCK_WAIT,
        }
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct LimitsSection {
    max_input_bytes: Option<u64>,
    lock_wait_secs: Option<u64>,
}

/// The longest duration any setting may name: a day. Longer ones are refused, so that no
/// deadline computed from them can overflow.
pub(crate) const MAX_SECS: u64 = 86_400;

/// The `[llm]` section: an OpenAI-compatible server for summaries and entity extraction.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct LlmSection {
    /// Base URL (`http://host:port`).
    pub url: Option<String>,
    /// The `model` field of requests.
    pub model: Option<String>,
    /// Environment variable holding the API key.
    pub api_key_env: Option<String>,
    /// Seconds per attempt.
    pub timeout_secs: Option<u64>,
    /// Seconds a command waits for the model's answers before it checkpoints and exits.
    pub wait_secs: Option<u64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct CheckpointSection {
    keep: Option<usize>,
}

/// `[store]`: where the archive and checkpoints are.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct StoreSection {
    url: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct TokenizerSection {
    path: Option<String>,
}

/// Everything but `[context]`, which is checked key by key first.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Sections {
    session: Option<String>,
    #[serde(default)]
    context: toml::Table,
    #[serde(default)]
    checkpoints: CheckpointSection,
    #[serde(default)]
    store: StoreSection,
    #[serde(default)]
    tokenizer: TokenizerSection,
    #[serde(default)]
    llm: LlmSection,
    #[serde(default)]
    limits: LimitsSection,
    #[serde(default)]
    retrieval: RetrievalSection,
    #[serde(default)]
    tasks: TasksSection,
    /// `ctxwin proxy`'s settings: accepted here, checked by `ctxwin-proxy` when the proxy
    /// starts.
    #[serde(default, rename = "proxy")]
    _proxy: Option<toml::Table>,
}

impl Default for FileConfig {
    fn default() -> Self {
        FileConfig {
            session: DEFAULT_SESSION.into(),
            context: Config::DEFAULT,
            checkpoint_interval_messages: CheckpointPolicy::DEFAULT.interval_messages,
            keep_checkpoints: DEFAULT_KEEP,
            store_url: None,
            tokenizer: None,
            llm: LlmSection::default(),
            limits: Limits::default(),
            retrieval: RetrievalSettings::DEFAULT,
            embeddings: EmbeddingsSection::default(),
            task_detection: TaskDetection::Off,
        }
    }
}

impl FileConfig {
    /// Parses and validates the text of a `ctxwin.toml` (`origin` names it in errors).
    pub(crate) fn parse(text: &str, origin: &Path) -> Result<FileConfig, CliError> {
        let bad = |what: String| CliError::Config(format!("{}: {what}", origin.display()));
        let sections: Sections = toml::from_str(text).map_err(|e| bad(one_line(&e.to_string())))?;
        let known = known_context_keys();
        if let Some(key) = sections.context.keys().find(|key| !known.contains(key)) {
            return Err(bad(format!(
                "unknown key `{key}` in [context]; known keys: {}",
                known.join(", ")
            )));
        }
        let mut table = sections.context;
        let checkpoint_interval_messages = match table.remove(CHECKPOINT_INTERVAL_KEY) {
            None => CheckpointPolicy::DEFAULT.interval_messages,
            Some(value) => value.try_into::<u32>().map_err(|_| {
                bad(format!(
                    "[context] {CHECKPOINT_INTERVAL_KEY} must be a number of messages (0 disables)"
                ))
            })?,
        };
        // The core's schema deserializer borrows its keys, which an owned TOML value cannot
        // lend: the keys are read here and declared one by one.
        let keys = match table.remove("entity_schema") {
            None => Vec::new(),
            Some(value) => value.try_into::<Vec<String>>().map_err(|_| {
                bad("[context] entity_schema must be a list of strings, e.g. [\"file\", \"branch\"]".into())
            })?,
        };
        let mut context: Config = toml::Value::Table(table)
            .try_into()
            .map_err(|e: toml::de::Error| bad(format!("[context] {}", one_line(&e.to_string()))))?;
        for key in &keys {
            context.entity_schema.push(key).map_err(|e| bad(format!("[context] entity_schema {key:?}: {e} (at most 8 keys of ASCII letters, digits, _ and -)")))?;
        }
        context.validate().map_err(|e| bad(format!("[context] {e}")))?;
        if context.outbox == OutboxMode::Discard {
            return Err(bad(
                "[context] outbox = \"discard\" would drop evicted messages unarchived; remove it"
                    .into(),
            ));
        }
        let session = sections.session.unwrap_or_else(|| DEFAULT_SESSION.into());
        if session.trim().is_empty() {
            return Err(bad("session must not be empty".into()));
        }
        let keep_checkpoints = sections.checkpoints.keep.unwrap_or(DEFAULT_KEEP);
        if keep_checkpoints == 0 {
            return Err(bad("[checkpoints] keep must be at least 1".into()));
        }
        for (key, value) in [
            ("[llm] timeout_secs", sections.llm.timeout_secs),
            ("[llm] wait_secs", sections.llm.wait_secs),
            ("[limits] lock_wait_secs", sections.limits.lock_wait_secs),
        ] {
            if value.is_some_and(|secs| secs > MAX_SECS) {
                return Err(bad(format!("{key} must be at most {MAX_SECS} (a day)")));
            }
        }
        if let Some(url) = &sections.store.url
            && !matches!(
                ctxwin_std::store::Location::parse(url),
                ctxwin_std::store::Location::Postgres(_)
            )
        {
            return Err(bad(
                "[store] url must be a postgres:// or postgresql:// URL (leave it out to keep the store in the state directory)".into(),
            ));
        }
        let defaults = Limits::default();
        let limits = Limits {
            max_input_bytes: sections.limits.max_input_bytes.unwrap_or(defaults.max_input_bytes),
            lock_wait: sections
                .limits
                .lock_wait_secs
                .map_or(defaults.lock_wait, Duration::from_secs),
        };
        if limits.max_input_bytes == 0 {
            return Err(bad("[limits] max_input_bytes must be at least 1".into()));
        }
        let task_detection = sections.tasks.detection().map_err(bad)?;
        Ok(FileConfig {
            session,
            context,
            checkpoint_interval_messages,
            keep_checkpoints,
            store_url: sections.store.url,
            tokenizer: sections.tokenizer.path,
            llm: sections.llm,
            limits,
            retrieval: sections.retrieval.resolve(RetrievalSettings::DEFAULT).map_err(bad)?,
            embeddings: EmbeddingsSection {
                url: sections.retrieval.embeddings_url,
                model: sections.retrieval.embeddings_model,
            },
            task_detection,
        })
    }

    /// Reads and validates the file at `path`.
    pub(crate) fn load(path: &Path) -> Result<FileConfig, CliError> {
        let what = path.display().to_string();
        let bytes =
            statefs::read_bounded_file(path, MAX_CONFIG_BYTES, &what).map_err(
                |error| match error {
                    statefs::StateFsError::Io { source, .. } => CliError::io("read", path, &source),
                    other => CliError::Config(format!("{other}; fix or rewrite the configuration")),
                },
            )?;
        let text = statefs::utf8(bytes, &what)
            .map_err(|e| CliError::Config(format!("{e}; the configuration must be UTF-8 TOML")))?;
        FileConfig::parse(&text, path)
    }

    /// `[tokenizer] path` resolved against `base` (the directory holding the state
    /// directory) when relative.
    pub(crate) fn tokenizer_path(&self, base: &Path) -> Option<PathBuf> {
        self.tokenizer.as_deref().map(|path| match Path::new(path) {
            relative if relative.is_relative() && !is_builtin_tokenizer(path) => {
                base.join(relative)
            }
            other => other.to_path_buf(),
        })
    }
}

/// Whether `name` names a tokenizer shipped inside ctxwin.
pub(crate) fn is_builtin_tokenizer(name: &str) -> bool {
    matches!(name, "cl100k" | "smollm2")
}

/// TOML errors span several lines (a caret under the input); the first line says it all.
fn one_line(message: &str) -> String {
    let mut lines = message.lines().filter(|line| !line.trim().is_empty());
    let first = lines.next().unwrap_or("invalid TOML").trim().to_string();
    let last = message.lines().rev().find(|line| !line.trim().is_empty()).unwrap_or("").trim();
    if last.is_empty() || last == first { first } else { format!("{first}: {last}") }
}

/// The names of [`Config`]'s fields, from its serialized form, and the checkpoint interval.
fn known_context_keys() -> Vec<String> {
    let mut keys = match toml::Value::try_from(Config::DEFAULT) {
        Ok(toml::Value::Table(table)) => table.keys().cloned().collect(),
        _ => Vec::new(),
    };
    keys.push(CHECKPOINT_INTERVAL_KEY.into());
    keys
}

/// One documented key of the `[context]` section.
struct Key {
    name: &'static str,
    /// Its default, as TOML, from the core's defaults.
    value: fn(&Config) -> String,
    doc: &'static str,
}

/// The `[context]` keys `ctxwin init` writes, in order, each with its default and meaning.
const CONTEXT_KEYS: &[Key] = &[
    Key {
        name: "context_window",
        value: |d| d.context_window.to_string(),
        doc: "The model's context window, in tokens.",
    },
    Key {
        name: "reserved_for_reply",
        value: |d| d.reserved_for_reply.to_string(),
        doc: "Tokens kept free for the reply; the budget is context_window minus this (with fit_budgets, at most a quarter of the window).",
    },
    Key {
        name: "permanent_budget",
        value: |d| d.permanent_budget.to_string(),
        doc: "Budget of the permanent level: system prompt, rules, tool definitions (never evicted).",
    },
    Key {
        name: "session_budget",
        value: |d| d.session_budget.to_string(),
        doc: "Budget of the session level: summaries and key decisions ([Memory Summary]).",
    },
    Key {
        name: "working_budget",
        value: |d| d.working_budget.to_string(),
        doc: "Budget of the working level: recent turns. The volatile level gets the rest. Level budgets are quotas: what a level leaves unused, the history may use.",
    },
    Key {
        name: "fit_budgets",
        value: |d| d.fit_budgets.to_string(),
        doc: "Cap the reply reserve (1/4 of the window) and the level budgets (1/4, 1/4, 1/2 of the budget) so any window from 2,048 fits; false takes them as written.",
    },
    Key {
        name: "trigger_percent",
        value: |d| d.trigger_percent.to_string(),
        doc: "High-water mark: a compaction starts above this share of the budget (1-100).",
    },
    Key {
        name: "low_water_percent",
        value: |d| d.low_water_percent.to_string(),
        doc: "Low-water mark: a compaction evicts (and summarizes) down to this share in one step; between compactions payloads only grow, so the provider's prompt cache holds. At or above trigger_percent: evict just enough at every push.",
    },
    Key {
        name: "dynamic_placement",
        value: |_| "\"after_tools\"".into(),
        doc: "Where `build --dynamic` text goes: \"after_tools\" (reads as standing instructions; a change breaks the cache after the tools) or \"before_newest_user\" (a change costs only the newest turn).",
    },
    Key {
        name: "locked_tail",
        value: |d| d.locked_tail.to_string(),
        doc: "The newest messages, never evicted.",
    },
    Key {
        name: "lock_newest_user",
        value: |d| d.lock_newest_user.to_string(),
        doc: "Whether the newest user message (the live request) is never evicted, wherever it is.",
    },
    Key {
        name: "max_messages",
        value: |d| d.max_messages.to_string(),
        doc: "Most messages kept in the history; 0 for no limit.",
    },
    Key {
        name: "observation_limit",
        value: |d| d.observation_limit.to_string(),
        doc: "Tool outputs above this many tokens are kept as head and tail (the archive keeps all).\n\
              # Written commented: `ctxwin proxy` honours it too when set, and otherwise keeps tool\n\
              # outputs whole while the window has room ([proxy] observation_limit overrides it).",
    },
    Key {
        name: "compaction_limit",
        value: |d| d.compaction_limit.to_string(),
        doc: "At a compaction, old tool outputs above this many tokens are cut to head and tail before\n\
              # whole turns leave (never the live request's, never a never_cut tool's); 0: off.",
    },
    Key {
        name: "message_overhead",
        value: |d| d.message_overhead.to_string(),
        doc: "Framing tokens per message (role, separators): 4 for OpenAI, 5 for ChatML.",
    },
    Key {
        name: "request_overhead",
        value: |d| d.request_overhead.to_string(),
        doc: "Framing tokens per request (the reply primer).",
    },
    Key {
        name: "tool_call_overhead",
        value: |d| d.tool_call_overhead.to_string(),
        doc: "Tokens per tool call besides its id, name and arguments (type and function framing).",
    },
    Key {
        name: "unanswered_calls",
        value: |d| format!("{:?}", unanswered_calls_name(d.unanswered_calls)),
        doc: "Tool calls left without a result: \"synthesize_aborted\" or \"drop_calls\".",
    },
    Key {
        name: "strategy",
        value: |d| format!("{:?}", d.strategy.as_str()),
        doc: "What leaves the window and what stays of it.",
    },
    Key {
        name: "summarize_threshold",
        value: |d| d.summarize_threshold.to_string(),
        doc: "summarization: user turns in the history above which the oldest are folded.",
    },
    Key {
        name: "summarize_batch",
        value: |d| d.summarize_batch.to_string(),
        doc: "summarization: user turns folded at a time.",
    },
    Key {
        name: "summary_tokens",
        value: |d| d.summary_tokens.to_string(),
        doc: "Most tokens one summary may cost.",
    },
    Key {
        name: "importance_threshold",
        value: |d| d.importance_threshold.to_string(),
        doc: "importance: score (in thousandths) from which a leaving unit is summarized.",
    },
    Key {
        name: "working_age_ms",
        value: |d| d.working_age_ms.to_string(),
        doc: "hierarchical: age after which a turn becomes a paragraph summary.",
    },
    Key {
        name: "session_age_ms",
        value: |d| d.session_age_ms.to_string(),
        doc: "hierarchical: age after which a paragraph becomes one line.",
    },
    Key {
        name: CHECKPOINT_INTERVAL_KEY,
        value: |_| CheckpointPolicy::DEFAULT.interval_messages.to_string(),
        doc: "Messages between checkpoints inside one command (each command also checkpoints at its end); 0 disables.",
    },
    Key {
        name: "entity_schema",
        value: |_| "[]".into(),
        doc: "Facts tracked from user messages, e.g. [\"file\", \"branch\"] (at most 8 keys).",
    },
];

/// The name `[context] unanswered_calls` takes for `calls`.
fn unanswered_calls_name(calls: UnansweredCalls) -> &'static str {
    match calls {
        UnansweredCalls::SynthesizeAborted => "synthesize_aborted",
        UnansweredCalls::DropCalls => "drop_calls",
    }
}

/// The template's `[proxy]` section: `ctxwin proxy`'s settings, every one commented.
const PROXY_SECTION: &str = "\n\
[proxy]\n\
# `ctxwin proxy`: an agent gets a managed window by pointing its base URL here. Flags and\n\
# CTXWIN_PROXY_* variables override these. The provider's base URL:\n\
# upstream = \"https://api.anthropic.com\"\n\
# listen = \"127.0.0.1:8787\"\n\
# Conversations' archive and checkpoints (default: DIR/proxy).\n\
# state_dir = \".ctxwin/proxy\"\n\
# The window of a model [proxy.windows] does not list. [context] context_window above is\n\
# the CLI's, not the proxy's: the proxy says at start which window each model gets.\n\
# default_window = 32768\n\
# Tokens kept for the reply when a request names no max_tokens (one that does gets it).\n\
# reserve = 4096\n\
# Tool outputs above this many tokens are sent as head and tail; 0 or unset: whole while\n\
# the window has room (unset here, [context] observation_limit applies when set).\n\
# observation_limit = 0\n\
# At a compaction, old tool outputs above this many tokens are cut to head and tail before\n\
# whole turns leave (never the live request's); 0 or unset: turns leave whole.\n\
# compaction_limit = 0\n\
# Tools whose outputs are never cut, by either limit (the model quotes file reads in its edits).\n\
# never_cut = [\"Read\"]\n\
# Tools whose older output a repeated call (same arguments) supersedes: cut to a note at the\n\
# next compaction, the newest of each kept ahead of older turns; [] for none.\n\
# supersede = [\"Read\", \"read_file\"]\n\
# A cut output names its archived original, and the proxy declares a ctxwin_recall tool\n\
# (after the client's tools) that the model calls to read it whole; the proxy answers it\n\
# itself. On when a limit above is set; false: off.\n\
# recall_tool = true\n\
# A header carrying each request's time (ms since the Unix epoch) taken instead of the clock:\n\
# for benches and replays of recorded sessions, behind trusted clients. Unset: the clock.\n\
# clock_header = \"x-request-time-ms\"\n\
# Conversations kept in memory; the least recently used idle ones are unloaded above it.\n\
# max_resident = 256\n\
# The key clients send in x-ctxwin-key (required to listen off loopback).\n\
# api_key = \"change-me\"\n\
# body_limit = 33554432\n\
# MiB of parsed request bodies kept, so that a conversation's next request reads only what\n\
# it adds (about the newest body of a hundred 2 MB conversations); 0: every body read whole.\n\
# parse_cache_mib = 256\n\
# upstream_timeout_secs = 300\n\
# checkpoint_idle_ms = 1000\n\
# checkpoint_every = 64\n\
# A header naming each request's tenant (otherwise its credential does).\n\
# tenant_header = \"x-team-id\"\n\
# Retrieval ([retrieval] above) is shared, but off in the proxy unless auto = true is set\n\
# there (its renewals cost more than they brought back in the bill bench); the proxy's block\n\
# takes at most 10% of the budget unless max_share_percent says otherwise.\n\
\n\
# Context windows by model name: an exact match first, then the longest prefix.\n\
# [proxy.windows]\n\
# \"claude\" = 200000\n\
# \"gpt-4o\" = 128000\n";

/// The `[context]` key the template writes commented: the proxy reads it too, and a value
/// written there would turn the proxy's whole tool outputs into cut ones.
const COMMENTED_CONTEXT_KEY: &str = "observation_limit";

/// The commented configuration `ctxwin init` writes: every key with its default and meaning.
pub(crate) fn default_toml() -> String {
    let d = Config::DEFAULT;
    let strategies: Vec<&str> = StrategyKind::ALL.iter().map(|s| s.as_str()).collect();
    let mut text = String::from(
        "# ctxwin configuration, written by `ctxwin init`. Every key is optional: a missing key\n\
         # takes the default shown. Unknown keys are refused.\n\n\
         # The session's name: its key in the archive.\n",
    );
    text.push_str(&format!("session = {DEFAULT_SESSION:?}\n\n[context]\n"));
    for key in CONTEXT_KEYS {
        text.push_str(&format!("# {}\n", key.doc));
        if key.name == "strategy" {
            text.push_str(&format!("# One of: {}.\n", strategies.join(", ")));
        }
        let commented = if key.name == COMMENTED_CONTEXT_KEY { "# " } else { "" };
        text.push_str(&format!("{commented}{} = {}\n", key.name, (key.value)(&d)));
    }
    text.push_str(&format!(
        "\n[checkpoints]\n# Checkpoints kept (the oldest are deleted).\nkeep = {DEFAULT_KEEP}\n\n\
         [store]\n\
         # Where the archive and the checkpoints are. Without a url, in this directory\n\
         # (archive.db, an SQLite file, and checkpoints/). A PostgreSQL URL keeps them in that\n\
         # database instead, shared by every host and proxy instance pointed at it (a fleet):\n\
         # each conversation is leased to one writer at a time. CTXWIN_STORE_URL overrides it.\n\
         # url = \"postgres://ctxwin:secret@db.internal:5432/ctxwin\"\n\n\
         [tokenizer]\n\
         # Count tokens exactly with a Hugging Face tokenizer.json (relative paths start at the\n\
         # directory holding the state directory), or the built-in \"cl100k\" or \"smollm2\".\n\
         # Without it the estimator counts (about 8% mean error, erring high).\n\
         # path = \"tokenizer.json\"\n\n\
         [llm]\n\
         # An OpenAI-compatible server (llama.cpp, vLLM, Ollama, OpenAI) that rewrites summaries\n\
         # and extracts entity values in the background; on any failure the extractive summary\n\
         # stays (--llm-url and CTXWIN_LLM_URL override url).\n\
         # url = \"http://127.0.0.1:8080\"\n\
         # model = \"smollm2\"\n\
         # api_key_env = \"OPENAI_API_KEY\"\n\
         # timeout_secs = 60\n\
         # Seconds a command waits for the model's answers before it saves and exits.\n\
         # wait_secs = 120\n\n\
         [limits]\n\
         # The largest message (`@FILE`, `-`) or conversation file a command reads, in bytes;\n\
         # input is read whole before the state is locked.\n\
         # max_input_bytes = {max_input}\n\
         # Seconds a command waits for another command's lock on this directory.\n\
         # lock_wait_secs = {lock_wait}\n\
         \n\
         [retrieval]\n\
         # `build` retrieves archived turns for the newest user message (or for --retrieve QUERY)\n\
         # into the room the payload has left, for that payload only: nothing is evicted for it.\n\
         # auto = true\n\
         # Most of the budget, in percent, the retrieved block may take.\n\
         # max_share_percent = 100\n\
         # max_items = 200\n\
         # candidates = 200\n\
         # A short reply brings the turn it answers.\n\
         # neighbours = true\n\
         # Recency prior: BM25 score x (1 + recency x position among the candidates).\n\
         # recency = 0.2\n\
         # An OpenAI-compatible /v1/embeddings server: recall then ranks by BM25 fused with\n\
         # meaning (reciprocal rank fusion, k = 60); vectors are cached in the archive per model.\n\
         # On any failure of the server a build ranks by BM25 alone (--embeddings-url and\n\
         # CTXWIN_EMBED_URL override the URL, --embeddings-model and CTXWIN_EMBED_MODEL the model).\n\
         # embeddings_url = \"http://127.0.0.1:8090\"\n\
         # embeddings_model = \"all-MiniLM-L6-v2\"\n\
         \n\
         [tasks]\n\
         # `ctxwin task start \"goal\"` and `ctxwin task done` mark tasks; a finished task leaves\n\
         # one structured summary and its messages leave first. \"new-request\" also starts a\n\
         # task at a user message after a finished tool loop (the agent answered without calls)\n\
         # that is not a reply to the agent's question; `ctxwin stats` says which is on.\n\
         # detect = \"off\"\n\
         {PROXY_SECTION}",
        max_input = statefs::DEFAULT_MAX_INPUT_BYTES,
        lock_wait = statefs::DEFAULT_LOCK_WAIT.as_secs(),
    ));
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<FileConfig, CliError> {
        FileConfig::parse(text, Path::new("ctxwin.toml"))
    }

    #[test]
    fn the_template_parses_to_the_defaults_and_documents_every_key() {
        let template = default_toml();
        assert_eq!(parse(&template).unwrap(), FileConfig::default());
        let table: toml::Table = toml::from_str(&template).unwrap();
        let written: Vec<&String> = table["context"].as_table().unwrap().keys().collect();
        let mut known = known_context_keys();
        known.retain(|key| key != "outbox" && key != COMMENTED_CONTEXT_KEY);
        assert_eq!(written.len(), known.len(), "{written:?} vs {known:?}");
        assert!(known.iter().all(|key| written.contains(&key)));
        assert!(template.contains("\n# observation_limit = 1000\n"), "{template}");
        assert!(table["proxy"].as_table().unwrap().is_empty(), "every [proxy] key is commented");
        for key in [
            "upstream",
            "default_window",
            "reserve",
            "observation_limit",
            "never_cut",
            "supersede",
            "recall_tool",
            "clock_header",
            "parse_cache_mib",
        ] {
            assert!(template.contains(&format!("\n# {key} = ")), "[proxy] {key} is not documented");
        }
    }

    #[test]
    fn values_are_read() {
        let config = parse(
            "session = \"agent\"\n[context]\nstrategy = \"summarization\"\nlocked_tail = 2\n\
             entity_schema = [\"file\"]\ncheckpoint_interval_messages = 7\n[checkpoints]\nkeep = 3\n[tokenizer]\npath = \"t.json\"\n\
             [llm]\nurl = \"http://127.0.0.1:1\"\n",
        )
        .unwrap();
        assert_eq!(config.session, "agent");
        assert_eq!(config.context.strategy, StrategyKind::Summarization);
        assert_eq!(config.context.locked_tail, 2);
        assert_eq!(config.context.entity_schema.keys().collect::<Vec<_>>(), ["file"]);
        assert_eq!(config.checkpoint_interval_messages, 7);
        assert_eq!(config.keep_checkpoints, 3);
        assert_eq!(config.tokenizer_path(Path::new("/p")), Some(PathBuf::from("/p/t.json")));
        assert_eq!(config.llm.url.as_deref(), Some("http://127.0.0.1:1"));
    }

    #[test]
    fn mistakes_are_refused_with_one_line() {
        let typo = parse("[context]\ntrigger_percnt = 70\n").unwrap_err();
        assert!(typo.to_string().contains("unknown key `trigger_percnt`"), "{typo}");
        let section = parse("[contxt]\n").unwrap_err();
        assert!(section.to_string().contains("contxt"), "{section}");
        let value = parse("[context]\nstrategy = \"fifo\"\n").unwrap_err();
        assert!(value.to_string().contains("fifo"), "{value}");
        let invalid = parse("[context]\ntrigger_percent = 0\n").unwrap_err();
        assert!(invalid.to_string().contains("trigger_percent must be between 1 and 100"));
        let syntax = parse("[context\n").unwrap_err();
        for error in [typo, section, value, invalid, syntax] {
            assert_eq!(error.exit(), crate::Exit::Config);
            assert!(!error.to_string().contains('\n'), "{error}");
        }
        assert!(parse("[checkpoints]\nkeep = 0\n").is_err());
        assert!(parse("[context]\noutbox = \"discard\"\n").is_err());
        let schema = parse("[context]\nentity_schema = [\"a b\"]\n").unwrap_err();
        assert!(schema.to_string().contains("entity_schema \"a b\""), "{schema}");
        assert!(parse("[context]\nentity_schema = 3\n").is_err());
        let interval = parse("[context]\ncheckpoint_interval_messages = -1\n").unwrap_err();
        assert!(
            interval.to_string().contains("checkpoint_interval_messages must be"),
            "{interval}"
        );
    }

    #[test]
    fn the_store_is_a_postgres_url() {
        let config = parse("[store]\nurl = \"postgres://u:p@db/ctxwin\"\n").unwrap();
        assert_eq!(config.store_url.as_deref(), Some("postgres://u:p@db/ctxwin"));
        let directory = parse("[store]\nurl = \"/var/lib/ctxwin\"\n").unwrap_err();
        assert!(directory.to_string().contains("postgres://"), "{directory}");
        assert!(parse("[store]\nuri = \"postgres://db/x\"\n").is_err());
    }

    #[test]
    fn builtin_tokenizers_are_not_paths() {
        let config = FileConfig { tokenizer: Some("cl100k".into()), ..FileConfig::default() };
        assert_eq!(config.tokenizer_path(Path::new("/p")), Some(PathBuf::from("cl100k")));
    }
}
