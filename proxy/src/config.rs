//! The proxy's settings: the `[proxy]` section of `ctxwin.toml`, then environment variables,
//! then command-line flags (each overriding the one before).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use ctxwin_std::session::{RetrievalSection, RetrievalSettings, TaskDetection};
use serde::Deserialize;

/// The fewest tokens the reply reserve (a request's `max_tokens`) must leave the prompt.
pub const MIN_PROMPT: u32 = 256;

/// The proxy's retrieval unless `[retrieval]` says otherwise: off, and when `auto = true`
/// turns it on, a block of at most a tenth of what the system prompt and tool definitions
/// leave the history ([`ConvSettings::retrieval_within`](crate::conv::ConvSettings::retrieval_within)),
/// sent with every request until a compaction for a new live request.
///
/// Off because in the bill bench it costs on every window and brings back no `Edit` target:
/// its renewal at a compaction rewrites the prefix from `system` on (the history's cached
/// head included), its room brings each compaction closer, and its search is the largest
/// share of a renewing request's time. With it on: 0.57 / 0.24 / 0.16 × direct at 200k /
/// 64k / 32k and 0.35 / 0.10 on OpenAI, cache reads into the messages 94 / 89 / 78%, 1 / 12 /
/// 28 / 5 / 25 `Edit` targets hidden; off: 0.52 / 0.22 / 0.16 and 0.33 / 0.09, 96 / 92 / 83%,
/// 1 / 12 / 27 / 4 / 23 hidden.
pub const RETRIEVAL: RetrievalSettings =
    RetrievalSettings { auto: false, max_share_percent: 10, ..RetrievalSettings::DEFAULT };

/// The tools whose older outputs a repeated call supersedes by default: the file reads of
/// Claude Code (`Read`) and of Cline and its kin (`read_file`). A coding agent reads a file
/// again after editing it; the older read shows a version that is gone (in the bill bench,
/// 70% of the `Read` output is read again later).
pub const SUPERSEDE: [&str; 2] = ["Read", "read_file"];

/// Follow-up requests the proxy sends for one client request to answer the model's recall
/// calls before it returns what it has.
pub const RECALL_ROUNDS: usize = 4;

/// Everything the proxy needs to run.
#[derive(Clone, Debug, PartialEq)]
pub struct ProxyConfig {
    /// The provider's base URL (`https://api.openai.com`, `http://127.0.0.1:8080`); request
    /// paths are appended (`/v1/chat/completions`). A trailing `/v1` is accepted too.
    pub upstream: String,
    /// Where to listen.
    pub listen: SocketAddr,
    /// Where sessions live: `<state_dir>/archive.db` (shared), `<state_dir>/tenant.key` (the
    /// secret tenant and conversation names are keyed with) and
    /// `<state_dir>/<tenant>/<conversation>/checkpoints/`.
    pub state_dir: PathBuf,
    /// Context windows by model name (exact match first, then the longest prefix).
    pub windows: BTreeMap<String, u32>,
    /// The window of a model not listed.
    pub default_window: u32,
    /// Tokens kept free for the reply when a request names no `max_tokens` (a request that
    /// does gets its `max_tokens`: the prompt plus it never pass the window).
    pub reserve: u32,
    /// Most sessions kept in memory; the least recently used idle ones are checkpointed and
    /// unloaded above it.
    pub max_resident: usize,
    /// The key clients must send in `x-ctxwin-key` (required to listen off loopback).
    pub proxy_key: Option<String>,
    /// Largest request body accepted, in bytes.
    pub body_limit: usize,
    /// Bytes of parsed request bodies kept so that a conversation's next request reads only
    /// what it adds ([`crate::parsed`]); 0: every body is read whole.
    pub parse_cache_bytes: usize,
    /// How long to wait for the upstream's response headers (and between stream chunks).
    pub upstream_timeout: Duration,
    /// A conversation idle this long after a change is checkpointed.
    pub checkpoint_idle: Duration,
    /// A busy conversation is checkpointed every this many exchanges.
    pub checkpoint_every: u32,
    /// The header that identifies a request's tenant (`x-team-id`, lower case), when set;
    /// otherwise, and for a request without it, the credential it carries does
    /// ([`crate::keys`]).
    pub tenant_header: Option<String>,
    /// The header that carries a request's time (ms since the Unix epoch, lower case), when
    /// set (`[proxy] clock_header`): its messages are stamped with it and the pause before it
    /// is measured to it (a compaction on a cold prompt cache). For benches and replays of
    /// recorded sessions, behind clients the operator trusts; unset, and for a request
    /// without it, the wall clock.
    pub clock_header: Option<String>,
    /// How long a connection may take to send a request's headers, counted from when it
    /// opens or its previous answer ends: one that never finishes them, and an idle
    /// keep-alive connection, is closed after it.
    pub header_timeout: Duration,
    /// How long a request's body may take to arrive once its headers have (then 408).
    pub body_timeout: Duration,
    /// Most client connections open at once; one more is answered 503 and closed. Lowered
    /// at start to what the file-descriptor limit allows ([`crate::connections`]).
    pub max_connections: usize,
    /// A PostgreSQL database (`postgres://…`) to keep every conversation in instead of the
    /// state directory: a fleet of instances on one database, any of them serving any
    /// conversation (`[store] url`, or `CTXWIN_STORE_URL`, as the CLI reads them).
    pub store_url: Option<String>,
    /// Tool outputs over this many tokens are stored reduced to head and tail (`[proxy]
    /// observation_limit`, else `[context] observation_limit`); `None`: kept whole.
    pub observation_limit: Option<u32>,
    /// At a compaction, old tool outputs over this many tokens are cut to head and tail
    /// before whole turns leave, oldest first, never the live request's (`[proxy]
    /// compaction_limit`, 0 for off); `None`: turns leave whole.
    pub compaction_limit: Option<u32>,
    /// Tools whose outputs are never reduced, by the observation limit or at a compaction
    /// (`[proxy] never_cut`).
    pub never_cut: Vec<String>,
    /// Tools whose output a newer output of the same call (same arguments) supersedes: at a
    /// compaction the older is cut to a note, the archive keeps it (`[proxy] supersede`;
    /// [`SUPERSEDE`] by default, `[]` for none).
    pub supersede: Vec<String>,
    /// Whether a cut tool output names its archived original and the proxy declares and
    /// answers the `ctxwin_recall` tool that returns it (`[proxy] recall_tool`); `None`: on,
    /// when a limit can cut ([`ProxyConfig::declares_recall`]).
    pub recall_tool: Option<bool>,
    /// Retrieval of archived turns once a conversation's oldest turns left the window (the
    /// `[retrieval]` section the CLI shares; `auto = false` turns it off).
    pub retrieval: RetrievalSettings,
    /// How a conversation's task boundaries are found (the `[tasks] detect` the CLI shares):
    /// with `new-request`, a user request after a finished tool loop starts a task, whose
    /// summary then stands for the previous one.
    pub task_detection: TaskDetection,
    /// Where the settings above came from, for the log at start.
    pub origins: Origins,
}

/// Where the settings the proxy reports at start came from.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Origins {
    /// The configuration file read, if any.
    pub file: Option<PathBuf>,
    /// The `[context] context_window` of that file (the CLI's window, not the proxy's).
    pub cli_window: Option<u32>,
    /// The observation limit came from `[context]`, not `[proxy]`.
    pub limit_from_context: bool,
    /// `[retrieval]` keys the proxy does not use (embeddings: it ranks by BM25 alone).
    pub unused_retrieval: Vec<String>,
}

impl Default for ProxyConfig {
    fn default() -> Self {
        Self {
            upstream: "http://127.0.0.1:8080".into(),
            listen: SocketAddr::from(([127, 0, 0, 1], 8787)),
            state_dir: PathBuf::from(".ctxwin/proxy"),
            windows: BTreeMap::new(),
            default_window: 32_768,
            reserve: 4_096,
            max_resident: 256,
            proxy_key: None,
            body_limit: 32 << 20,
            parse_cache_bytes: crate::parsed::MAX_BYTES,
            upstream_timeout: Duration::from_secs(300),
            checkpoint_idle: Duration::from_secs(1),
            checkpoint_every: 64,
            tenant_header: None,
            clock_header: None,
            header_timeout: Duration::from_secs(10),
            body_timeout: Duration::from_secs(60),
            max_connections: 4_096,
            store_url: None,
            observation_limit: None,
            compaction_limit: None,
            never_cut: Vec::new(),
            supersede: SUPERSEDE.iter().map(|tool| (*tool).to_string()).collect(),
            recall_tool: None,
            retrieval: RETRIEVAL,
            task_detection: TaskDetection::Off,
            origins: Origins::default(),
        }
    }
}

/// A configuration that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file does not read or parse.
    #[error("{path}: {reason}")]
    File {
        /// The file.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// A value is invalid.
    #[error("{0}")]
    Invalid(String),
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct ProxySection {
    upstream: Option<String>,
    listen: Option<String>,
    state_dir: Option<PathBuf>,
    #[serde(default)]
    windows: BTreeMap<String, u32>,
    default_window: Option<u32>,
    reserve: Option<u32>,
    max_resident: Option<usize>,
    api_key: Option<String>,
    body_limit: Option<usize>,
    parse_cache_mib: Option<usize>,
    upstream_timeout_secs: Option<u64>,
    checkpoint_idle_ms: Option<u64>,
    checkpoint_every: Option<u32>,
    tenant_header: Option<String>,
    clock_header: Option<String>,
    header_timeout_secs: Option<u64>,
    body_timeout_secs: Option<u64>,
    max_connections: Option<usize>,
    observation_limit: Option<u32>,
    compaction_limit: Option<u32>,
    never_cut: Option<Vec<String>>,
    supersede: Option<Vec<String>>,
    recall_tool: Option<bool>,
}

/// `[store]`, shared with the CLI: only `url` is the proxy's concern.
#[derive(Debug, Default, Deserialize)]
struct StoreSection {
    url: Option<String>,
}

/// What the proxy reads of the CLI's `[context]` (the rest is the CLI's own).
#[derive(Debug, Default, Deserialize)]
struct ContextSection {
    context_window: Option<u32>,
    observation_limit: Option<u32>,
}

#[derive(Debug, Default, Deserialize)]
struct File {
    #[serde(default)]
    proxy: Option<ProxySection>,
    #[serde(default)]
    store: Option<StoreSection>,
    #[serde(default)]
    context: Option<ContextSection>,
    #[serde(default)]
    retrieval: Option<RetrievalSection>,
    #[serde(default)]
    tasks: Option<TasksSection>,
}

/// `[tasks]`, shared with the CLI.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct TasksSection {
    detect: Option<String>,
}

impl ProxyConfig {
    /// The window for `model`.
    pub fn window_for(&self, model: &str) -> u32 {
        if let Some(window) = self.windows.get(model) {
            return *window;
        }
        self.windows
            .iter()
            .filter(|(prefix, _)| model.starts_with(prefix.as_str()))
            .max_by_key(|(prefix, _)| prefix.len())
            .map_or(self.default_window, |(_, window)| *window)
    }

    /// Whether conversations declare the recall tool: a limit can cut tool outputs
    /// (`observation_limit` or `compaction_limit`) and `recall_tool` is not `false`.
    ///
    /// ```
    /// let mut config = ctxwin_proxy::ProxyConfig::default();
    /// assert!(!config.declares_recall(), "nothing is cut");
    /// config.compaction_limit = Some(2_000);
    /// assert!(config.declares_recall());
    /// config.recall_tool = Some(false);
    /// assert!(!config.declares_recall());
    /// ```
    pub fn declares_recall(&self) -> bool {
        let cuts = self.observation_limit.is_some() || self.compaction_limit.is_some();
        cuts && self.recall_tool != Some(false)
    }

    /// Applies the `[proxy]` section of the TOML file at `path`, with what the proxy shares of
    /// the CLI's sections (`[context] observation_limit`, `[retrieval]`).
    ///
    /// # Errors
    /// [`ConfigError::File`] when it does not read or parse; [`ConfigError::Invalid`].
    pub fn apply_file(&mut self, path: &Path) -> Result<(), ConfigError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| ConfigError::File { path: path.into(), reason: e.to_string() })?;
        self.apply_toml(&text).map_err(|e| match e {
            ConfigError::Invalid(reason) => ConfigError::File { path: path.into(), reason },
            other => other,
        })?;
        self.origins.file = Some(path.into());
        Ok(())
    }

    /// Applies the `[proxy]` section of TOML `text`.
    ///
    /// # Errors
    /// [`ConfigError::Invalid`] for a syntax error, an unknown key or a bad value.
    pub fn apply_toml(&mut self, text: &str) -> Result<(), ConfigError> {
        let file: File = toml::from_str(text).map_err(|e| ConfigError::Invalid(e.to_string()))?;
        if let Some(url) = file.store.and_then(|store| store.url) {
            self.store_url = store_url(&url);
        }
        if let Some(context) = file.context {
            self.origins.cli_window = context.context_window;
            if let Some(limit) = context.observation_limit {
                self.observation_limit = Some(limit);
                self.origins.limit_from_context = true;
            }
        }
        if let Some(retrieval) = file.retrieval {
            self.apply_retrieval(&retrieval)?;
        }
        if let Some(detect) = file.tasks.and_then(|tasks| tasks.detect) {
            self.task_detection = TaskDetection::parse(&detect).ok_or_else(|| {
                ConfigError::Invalid(format!(
                    "[tasks] detect must be \"off\" or \"new-request\", not {detect:?}"
                ))
            })?;
        }
        let Some(section) = file.proxy else { return Ok(()) };
        self.apply_connection_limits(&section);
        if let Some(limit) = section.observation_limit {
            self.observation_limit = (limit != 0).then_some(limit);
            self.origins.limit_from_context = false;
        }
        if let Some(limit) = section.compaction_limit {
            self.compaction_limit = (limit != 0).then_some(limit);
        }
        if let Some(tools) = section.never_cut {
            self.never_cut = tools;
        }
        if let Some(tools) = section.supersede {
            self.supersede = tools;
        }
        if let Some(recall) = section.recall_tool {
            self.recall_tool = Some(recall);
        }
        if let Some(upstream) = section.upstream {
            self.upstream = upstream;
        }
        if let Some(listen) = section.listen {
            self.listen = parse_listen(&listen)?;
        }
        if let Some(dir) = section.state_dir {
            self.state_dir = dir;
        }
        self.windows.extend(section.windows);
        if let Some(window) = section.default_window {
            self.default_window = window;
        }
        if let Some(reserve) = section.reserve {
            self.reserve = reserve;
        }
        if let Some(max) = section.max_resident {
            self.max_resident = max;
        }
        if section.api_key.is_some() {
            self.proxy_key = section.api_key;
        }
        if let Some(limit) = section.body_limit {
            self.body_limit = limit;
        }
        if let Some(mib) = section.parse_cache_mib {
            self.parse_cache_bytes = mib.saturating_mul(1 << 20);
        }
        if let Some(secs) = section.upstream_timeout_secs {
            self.upstream_timeout = Duration::from_secs(secs);
        }
        if let Some(ms) = section.checkpoint_idle_ms {
            self.checkpoint_idle = Duration::from_millis(ms);
        }
        if let Some(every) = section.checkpoint_every {
            self.checkpoint_every = every.max(1);
        }
        if let Some(header) = section.tenant_header {
            self.tenant_header = header_name(&header);
        }
        if let Some(header) = section.clock_header {
            self.clock_header = header_name(&header);
        }
        Ok(())
    }

    /// The connection settings of a `[proxy]` section.
    fn apply_connection_limits(&mut self, section: &ProxySection) {
        if let Some(secs) = section.header_timeout_secs {
            self.header_timeout = Duration::from_secs(secs);
        }
        if let Some(secs) = section.body_timeout_secs {
            self.body_timeout = Duration::from_secs(secs);
        }
        if let Some(max) = section.max_connections {
            self.max_connections = max;
        }
    }

    fn apply_retrieval(&mut self, section: &RetrievalSection) -> Result<(), ConfigError> {
        self.retrieval = section.resolve(self.retrieval).map_err(ConfigError::Invalid)?;
        let unused = [
            ("embeddings_url", &section.embeddings_url),
            ("embeddings_model", &section.embeddings_model),
        ];
        self.origins.unused_retrieval =
            unused.iter().filter(|(_, v)| v.is_some()).map(|(k, _)| (*k).to_string()).collect();
        Ok(())
    }

    /// Applies `CTXWIN_PROXY_UPSTREAM`, `CTXWIN_PROXY_LISTEN`, `CTXWIN_PROXY_KEY`,
    /// `CTXWIN_PROXY_STATE_DIR`, `CTXWIN_PROXY_MAX_RESIDENT`, `CTXWIN_PROXY_TENANT_HEADER`
    /// (empty: none) and `CTXWIN_STORE_URL` (empty: the file's) when set.
    ///
    /// # Errors
    /// [`ConfigError::Invalid`] for a bad address or number.
    pub fn apply_env(&mut self, get: impl Fn(&str) -> Option<String>) -> Result<(), ConfigError> {
        if let Some(upstream) = get("CTXWIN_PROXY_UPSTREAM") {
            self.upstream = upstream;
        }
        if let Some(listen) = get("CTXWIN_PROXY_LISTEN") {
            self.listen = parse_listen(&listen)?;
        }
        if let Some(key) = get("CTXWIN_PROXY_KEY") {
            self.proxy_key = Some(key);
        }
        if let Some(dir) = get("CTXWIN_PROXY_STATE_DIR") {
            self.state_dir = dir.into();
        }
        if let Some(max) = get("CTXWIN_PROXY_MAX_RESIDENT") {
            self.max_resident = max.parse().map_err(|_| {
                ConfigError::Invalid(format!("CTXWIN_PROXY_MAX_RESIDENT: `{max}` is not a number"))
            })?;
        }
        if let Some(header) = get("CTXWIN_PROXY_TENANT_HEADER") {
            self.tenant_header = header_name(&header);
        }
        if let Some(url) = get(ctxwin_std::store::STORE_URL_VAR).and_then(|url| store_url(&url)) {
            self.store_url = Some(url);
        }
        Ok(())
    }

    /// Checks the settings work together: a non-loopback address needs a proxy key, the
    /// resident cap is at least 1, the upstream is an http(s) URL, the tenant header is a
    /// header name, the connection limit and timeouts are not zero.
    ///
    /// # Errors
    /// [`ConfigError::Invalid`] saying what to change.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if !self.listen.ip().is_loopback() && self.proxy_key.as_deref().is_none_or(str::is_empty) {
            return Err(ConfigError::Invalid(format!(
                "listening on {} (not loopback) needs a proxy key: set [proxy] api_key or CTXWIN_PROXY_KEY; clients send it in x-ctxwin-key",
                self.listen
            )));
        }
        if self.max_resident == 0 {
            return Err(ConfigError::Invalid("max_resident must be at least 1".into()));
        }
        if !(self.upstream.starts_with("http://") || self.upstream.starts_with("https://")) {
            return Err(ConfigError::Invalid(format!(
                "upstream `{}` is not an http(s) URL",
                self.upstream
            )));
        }
        for (key, header) in
            [("tenant_header", &self.tenant_header), ("clock_header", &self.clock_header)]
        {
            if let Some(header) = header
                && axum::http::HeaderName::from_bytes(header.as_bytes()).is_err()
            {
                return Err(ConfigError::Invalid(format!(
                    "{key} `{header}` is not an HTTP header name"
                )));
            }
        }
        if let Some(url) = &self.store_url
            && !matches!(
                ctxwin_std::store::Location::parse(url),
                ctxwin_std::store::Location::Postgres(_)
            )
        {
            return Err(ConfigError::Invalid(
                "[store] url (CTXWIN_STORE_URL) must be a postgres:// or postgresql:// URL (leave it out to keep conversations in the state directory)".into(),
            ));
        }
        if self.default_window < 1_024 || self.windows.values().any(|w| *w < 1_024) {
            return Err(ConfigError::Invalid(
                "context windows must be at least 1,024 tokens".into(),
            ));
        }
        self.validate_connection_limits()?;
        self.validate_budgets()
    }

    fn validate_connection_limits(&self) -> Result<(), ConfigError> {
        let zero = [
            ("header_timeout_secs", self.header_timeout.is_zero()),
            ("body_timeout_secs", self.body_timeout.is_zero()),
            ("max_connections", self.max_connections == 0),
        ];
        match zero.iter().find(|(_, zero)| *zero) {
            Some((name, _)) => Err(ConfigError::Invalid(format!("{name} must be at least 1"))),
            None => Ok(()),
        }
    }

    /// Checks the reserve, the observation limit and the retrieval share.
    fn validate_budgets(&self) -> Result<(), ConfigError> {
        let smallest = self.windows.values().copied().fold(self.default_window, u32::min);
        if self.reserve.saturating_add(MIN_PROMPT) > smallest {
            return Err(ConfigError::Invalid(format!(
                "reserve {} leaves less than {MIN_PROMPT} tokens of the smallest context window ({smallest}) for the prompt",
                self.reserve
            )));
        }
        if self.observation_limit.is_some_and(|limit| limit < 32) {
            return Err(ConfigError::Invalid(
                "observation_limit must be at least 32 tokens (0 in [proxy]: tool outputs whole)"
                    .into(),
            ));
        }
        if self.compaction_limit.is_some_and(|limit| limit < 32) {
            return Err(ConfigError::Invalid(
                "compaction_limit must be at least 32 tokens (0: turns leave whole)".into(),
            ));
        }
        if self.retrieval.max_share_percent > 100 {
            return Err(ConfigError::Invalid("[retrieval] max_share_percent must be 0-100".into()));
        }
        Ok(())
    }

    /// What the proxy says at start about the settings it runs with, and why: which context
    /// window each model gets, the reply reserve, tool outputs, retrieval.
    pub fn notes(&self) -> Vec<String> {
        let mut notes = Vec::new();
        let listed: Vec<String> =
            self.windows.iter().map(|(model, window)| format!("{model}* -> {window}")).collect();
        let default_from = if self.origins.file.is_some() || self.default_window != 32_768 {
            "[proxy] default_window, or its default"
        } else {
            "the default: no configuration file sets [proxy] default_window"
        };
        notes.push(format!(
            "context windows (tokens): {}any other model -> {} ({default_from})",
            if listed.is_empty() {
                "no [proxy.windows]; ".to_string()
            } else {
                format!(
                    "{} ([proxy.windows], exact name first, then the longest prefix); ",
                    listed.join(", ")
                )
            },
            self.default_window
        ));
        if let (Some(window), Some(file)) = (self.origins.cli_window, &self.origins.file) {
            notes.push(format!(
                "[context] context_window = {window} in {} is the CLI's window, not the proxy's: set [proxy.windows] or [proxy] default_window",
                file.display()
            ));
        }
        notes.push(format!(
            "reply reserve: each request's max_tokens (prompt + max_tokens never pass the window); {} tokens for a request without it ([proxy] reserve)",
            self.reserve
        ));
        notes.push(match self.observation_limit {
            None => "tool outputs: whole while the window has room (the oldest turns leave first); set [proxy] observation_limit to cut them".into(),
            Some(limit) => format!(
                "tool outputs: cut to head and tail above {limit} tokens ({}){}",
                if self.origins.limit_from_context { "[context] observation_limit" } else { "[proxy] observation_limit" },
                if self.never_cut.is_empty() { String::new() } else { format!(", never for {}", self.never_cut.join(", ")) }
            ),
        });
        notes.push(match self.compaction_limit {
            None => "at a compaction, the oldest turns leave whole; set [proxy] compaction_limit to cut their tool outputs first".into(),
            Some(limit) => format!(
                "at a compaction, old tool outputs above {limit} tokens are cut to head and tail before whole turns leave ([proxy] compaction_limit){}",
                if self.never_cut.is_empty() { String::new() } else { format!(", never for {}", self.never_cut.join(", ")) }
            ),
        });
        notes.push(match self.supersede.is_empty() {
            true => "at a compaction, older outputs of a call made again stay ([proxy] supersede = [])".into(),
            false => format!(
                "at a compaction, an older output of a {} call made again with the same arguments (a file read again) is cut to a note, the archive keeps it ([proxy] supersede)",
                self.supersede.join(" / ")
            ),
        });
        notes.push(self.recall_note());
        if let Some(header) = &self.clock_header {
            notes.push(format!("clock: a request's time is its {header} header when it has one ([proxy] clock_header: for benches and replays, behind trusted clients)"));
        }
        notes.push(format!(
            "tasks ([tasks] detect = \"{}\"): {}",
            self.task_detection.as_str(),
            self.task_detection.explain()
        ));
        notes.push(if self.retrieval.auto {
            format!(
                "retrieval: after a conversation's first compaction, archived turns matching the live request, at most {}% of what the system prompt and tools leave the history, frozen until a compaction for a new request ([retrieval] auto = true)",
                self.retrieval.max_share_percent
            )
        } else {
            "retrieval: off (the proxy's default; [retrieval] auto = true turns it on)".into()
        });
        for key in &self.origins.unused_retrieval {
            notes.push(format!(
                "[retrieval] {key} is not used by the proxy: its retrieval ranks by BM25 alone"
            ));
        }
        notes
    }

    /// What the start log says of the recall tool.
    fn recall_note(&self) -> String {
        let cuts = self.observation_limit.is_some() || self.compaction_limit.is_some();
        match (cuts, self.recall_tool) {
            (false, Some(true)) => "recall tool: not declared, no limit cuts tool outputs ([proxy] recall_tool = true has no effect without observation_limit or compaction_limit)".into(),
            (false, _) => "recall tool: not declared (no limit cuts tool outputs)".into(),
            (true, Some(false)) => "recall tool: off ([proxy] recall_tool = false): a cut tool output is lost to the model".into(),
            (true, _) => format!(
                "recall tool: a cut tool output ends with a line naming its archived original; {} is declared after the client's tools on every request, and the proxy answers its calls itself (at most {} rounds per request; [proxy] recall_tool = false turns it off)",
                crate::wire::RECALL_TOOL,
                RECALL_ROUNDS
            ),
        }
    }

    /// The upstream URL for request path `path_and_query` (`/v1/...`).
    pub fn upstream_url(&self, path_and_query: &str) -> String {
        let base = self.upstream.trim_end_matches('/');
        let base =
            base.strip_suffix("/v1").filter(|_| path_and_query.starts_with("/v1")).unwrap_or(base);
        format!("{base}{path_and_query}")
    }
}

/// A store URL setting: trimmed; empty is none.
fn store_url(text: &str) -> Option<String> {
    let text = text.trim();
    (!text.is_empty()).then(|| text.to_string())
}

/// A header name setting: lower case (header names are case-insensitive); empty is none.
fn header_name(text: &str) -> Option<String> {
    let text = text.trim();
    (!text.is_empty()).then(|| text.to_ascii_lowercase())
}

fn parse_listen(text: &str) -> Result<SocketAddr, ConfigError> {
    text.parse()
        .map_err(|_| ConfigError::Invalid(format!("listen address `{text}` is not HOST:PORT")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tasks_detect_is_shared_with_the_cli_and_checked() {
        let mut config = ProxyConfig::default();
        assert_eq!(config.task_detection, TaskDetection::Off);
        config.apply_toml("[tasks]\ndetect = \"new-request\"").unwrap();
        assert_eq!(config.task_detection, TaskDetection::NewRequest);
        let settings = crate::conv::ConvSettings::for_model(&config, "any");
        assert_eq!(settings.task_detection, TaskDetection::NewRequest);
        assert!(
            config
                .notes()
                .iter()
                .any(|note| note.starts_with("tasks ([tasks] detect = \"new-request\")"))
        );
        let bad = config.apply_toml("[tasks]\ndetect = \"always\"").unwrap_err();
        assert!(bad.to_string().contains("[tasks] detect"), "{bad}");
        assert!(config.apply_toml("[tasks]\ndetecting = \"off\"").is_err());
    }

    #[test]
    fn toml_env_and_checks() {
        let mut config = ProxyConfig::default();
        config
            .apply_toml(
                r#"
[budget]
other = 1
[proxy]
upstream = "http://up:9/v1"
max_resident = 4
[proxy.windows]
"gpt-4o" = 128000
"claude" = 200000
"#,
            )
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(config.window_for("gpt-4o-mini"), 128_000);
        assert_eq!(config.window_for("claude-sonnet-4"), 200_000);
        assert_eq!(config.window_for("llama"), 32_768);
        assert_eq!(config.upstream_url("/v1/models"), "http://up:9/v1/models");
        config
            .apply_env(|k| (k == "CTXWIN_PROXY_LISTEN").then(|| "0.0.0.0:1".to_string()))
            .unwrap();
        assert!(config.validate().unwrap_err().to_string().contains("proxy key"));
        config.proxy_key = Some("k".into());
        config.validate().unwrap();
        assert!(config.apply_toml("[proxy]\nbogus = 1").is_err());
        assert_eq!(config.parse_cache_bytes, 256 << 20);
        config.apply_toml("[proxy]\nparse_cache_mib = 16").unwrap();
        assert_eq!(config.parse_cache_bytes, 16 << 20);
        config.apply_toml("[proxy]\ntenant_header = \"X-Team-Id\"").unwrap();
        assert_eq!(config.tenant_header.as_deref(), Some("x-team-id"));
        config.validate().unwrap();
        config.apply_toml("[proxy]\nclock_header = \"X-Request-Time-Ms\"").unwrap();
        assert_eq!(config.clock_header.as_deref(), Some("x-request-time-ms"));
        config.validate().unwrap();
        assert!(config.notes().iter().any(|note| note.contains("x-request-time-ms")));
        let mut bad = config.clone();
        bad.apply_toml("[proxy]\nclock_header = \"bad header\"").unwrap();
        assert!(bad.validate().unwrap_err().to_string().contains("clock_header"));
        config
            .apply_env(|k| (k == "CTXWIN_PROXY_TENANT_HEADER").then(|| "bad header".into()))
            .unwrap();
        assert!(config.validate().unwrap_err().to_string().contains("tenant_header"));
        config.apply_env(|k| (k == "CTXWIN_PROXY_TENANT_HEADER").then(String::new)).unwrap();
        assert_eq!(config.tenant_header, None);
    }

    #[test]
    fn connection_limits_are_read_and_checked_by_name() {
        let mut config = ProxyConfig::default();
        config
            .apply_toml(
                "[proxy]\nheader_timeout_secs = 3\nbody_timeout_secs = 30\nmax_connections = 100",
            )
            .unwrap();
        assert_eq!(config.header_timeout, Duration::from_secs(3));
        assert_eq!(config.body_timeout, Duration::from_secs(30));
        assert_eq!(config.max_connections, 100);
        config.validate().unwrap();
        for key in ["header_timeout_secs", "body_timeout_secs", "max_connections"] {
            let mut zero = config.clone();
            zero.apply_toml(&format!("[proxy]\n{key} = 0")).unwrap();
            assert_eq!(
                zero.validate().unwrap_err().to_string(),
                format!("{key} must be at least 1")
            );
        }
        let wrong = config.apply_toml("[proxy]\nheader_timeout = 3").unwrap_err().to_string();
        assert!(wrong.contains("header_timeout"), "{wrong}");
        assert!(config.apply_toml("[proxy]\nmax_connections = -1").is_err());
    }

    #[test]
    fn the_store_url_comes_from_the_file_then_the_environment() {
        let mut config = ProxyConfig::default();
        config.apply_toml("[store]\nurl = \"postgres://db/file\"\n[proxy]\n").unwrap();
        assert_eq!(config.store_url.as_deref(), Some("postgres://db/file"));
        config.validate().unwrap();
        config.apply_env(|k| (k == "CTXWIN_STORE_URL").then(String::new)).unwrap();
        assert_eq!(config.store_url.as_deref(), Some("postgres://db/file"), "empty: the file's");
        config
            .apply_env(|k| (k == "CTXWIN_STORE_URL").then(|| "postgres://db/env".into()))
            .unwrap();
        assert_eq!(config.store_url.as_deref(), Some("postgres://db/env"));
        config.store_url = Some("/var/lib/ctxwin".into());
        assert!(config.validate().unwrap_err().to_string().contains("postgres://"));
    }

    #[test]
    fn shared_sections_are_honoured_and_bad_values_refused_by_name() {
        let mut config = ProxyConfig::default();
        assert_eq!(config.observation_limit, None);
        let text = "[context]\ncontext_window = 9000\nobservation_limit = 1500\nstrategy = \"sliding_window\"\n\
                    [retrieval]\nauto = false\nembeddings_url = \"http://127.0.0.1:1\"\n\
                    [proxy]\nnever_cut = [\"Read\"]\n";
        config.apply_toml(text).unwrap();
        assert_eq!(config.observation_limit, Some(1_500));
        assert_eq!(config.never_cut, ["Read"]);
        assert!(!config.retrieval.auto);
        config.origins.file = Some("ctxwin.toml".into());
        let notes = config.notes().join("\n");
        assert!(notes.contains("[context] context_window = 9000"), "{notes}");
        assert!(
            notes.contains("above 1500 tokens ([context] observation_limit), never for Read"),
            "{notes}"
        );
        assert!(notes.contains("retrieval: off"), "{notes}");
        assert!(notes.contains("embeddings_url is not used"), "{notes}");
        config.apply_toml("[proxy]\nobservation_limit = 0\n").unwrap();
        assert_eq!(config.observation_limit, None, "0: whole");
        assert!(config.notes().join("\n").contains("whole while the window has room"));
        config.apply_toml("[proxy]\nobservation_limit = 8\n").unwrap();
        assert!(config.validate().unwrap_err().to_string().contains("observation_limit"));
        let mut config = ProxyConfig::default();
        assert!(config.notes().join("\n").contains("the oldest turns leave whole"));
        config.apply_toml("[proxy]\ncompaction_limit = 800\nnever_cut = [\"Read\"]\n").unwrap();
        assert_eq!(config.compaction_limit, Some(800));
        assert!(
            config.notes().join("\n").contains("above 800 tokens are cut to head and tail before whole turns leave ([proxy] compaction_limit), never for Read"),
            "{:?}",
            config.notes()
        );
        assert_eq!(
            crate::conv::ConvSettings::for_model(&config, "m")
                .session_config(32_768, 1_024, 0)
                .compaction_limit,
            800
        );
        config.apply_toml("[proxy]\ncompaction_limit = 0\n").unwrap();
        assert_eq!(config.compaction_limit, None, "0: off");
        config.apply_toml("[proxy]\ncompaction_limit = 8\n").unwrap();
        assert!(config.validate().unwrap_err().to_string().contains("compaction_limit"));
        let mut config = ProxyConfig::default();
        config.apply_toml("[proxy]\nreserve = 32600\n").unwrap();
        assert!(config.validate().unwrap_err().to_string().contains("reserve 32600"));
        let error = config.apply_toml("[retrieval]\nauto_recall = true\n").unwrap_err();
        assert!(error.to_string().contains("auto_recall"), "{error}");
    }

    #[test]
    fn superseded_outputs_are_file_reads_by_default_and_set_by_name() {
        let mut config = ProxyConfig::default();
        assert_eq!(config.supersede, SUPERSEDE);
        assert!(config.notes().join("\n").contains("an older output of a Read / read_file call"));
        let settings = crate::conv::ConvSettings::for_model(&config, "m");
        assert_eq!(&*settings.supersede, SUPERSEDE);
        config.apply_toml("[proxy]\nsupersede = []\n").unwrap();
        assert!(config.supersede.is_empty());
        assert!(config.notes().join("\n").contains("older outputs of a call made again stay"));
        config.apply_toml("[proxy]\nsupersede = [\"view_file\"]\n").unwrap();
        assert_eq!(config.supersede, ["view_file"]);
        let error = config.apply_toml("[proxy]\nsupersede = \"Read\"\n").unwrap_err();
        assert!(error.to_string().contains("supersede"), "{error}");
    }
}
