//! The command line, declared with clap's derive API.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};
use ctxwin_core::{Level, Role};

use ctxwin_std::format::Format;

const EXIT_CODES: &str = "\
Exit codes:
  0 success           4 I/O error                 7 no state directory (run `ctxwin init`)
  1 internal error    5 budget impossible         8 invalid configuration
  2 usage error       6 state corrupt (reported, never reset)
  3 bad input (a file, message or id that does not parse, or that the context refuses)";

/// `ctxwin`: a persistent context window for LLM agents, driven from the shell.
#[derive(Debug, Parser)]
#[command(
    name = "ctxwin",
    version,
    about = "A context-window manager for LLM agents: keeps what the model sees under a token budget",
    long_about = "A context-window manager for LLM agents: keeps what the model sees under a token \
budget. State (configuration, checkpoints, archive) lives in a directory, `.ctxwin` by default; \
each command restores it from the latest checkpoint and checkpoints it again when it changed. \
Works without a tokenizer or a server; --tokenizer counts tokens exactly.",
    after_help = EXIT_CODES,
    propagate_version = true
)]
pub(crate) struct Cli {
    /// State directory: configuration, checkpoints and archive.
    #[arg(long, global = true, env = "CTXWIN_DIR", default_value = ".ctxwin", value_name = "DIR")]
    pub dir: PathBuf,

    /// Count tokens exactly with a Hugging Face tokenizer.json (or the built-in `cl100k` or
    /// `smollm2`) instead of the estimator.
    #[arg(long, global = true, env = "CTXWIN_TOKENIZER", value_name = "FILE")]
    pub tokenizer: Option<String>,

    /// Base URL of an OpenAI-compatible server for LLM summaries (overrides [llm] url).
    #[arg(long, global = true, env = "CTXWIN_LLM_URL", value_name = "URL")]
    pub llm_url: Option<String>,

    /// Base URL of an OpenAI-compatible `/v1/embeddings` server: `build` then ranks recall by
    /// BM25 fused with meaning (overrides [retrieval] embeddings_url).
    #[arg(long, global = true, env = "CTXWIN_EMBED_URL", value_name = "URL")]
    pub embeddings_url: Option<String>,

    /// The embedding model's name, sent as `model` and keying cached vectors (overrides
    /// [retrieval] embeddings_model).
    #[arg(long, global = true, env = "CTXWIN_EMBED_MODEL", value_name = "NAME")]
    pub embeddings_model: Option<String>,

    /// Print reports and tables as JSON.
    #[arg(long, global = true)]
    pub json: bool,

    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The commands.
#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Create the state directory with a commented default configuration.
    Init(InitArgs),
    /// Add one message to the context.
    Add(AddArgs),
    /// Import a conversation file (OpenAI or Anthropic, JSON or JSONL).
    Import(ImportArgs),
    /// Print the payload to send now (`ctxwin build > context.json`).
    Build(BuildArgs),
    /// Show tokens used per level, messages, summaries and compression; with `--proxy`, what
    /// each conversation of `ctxwin proxy` cost.
    Stats(StatsArgs),
    /// Force a compression pass now: the strategy evicts (and summarizes) down to a target.
    Compress(CompressArgs),
    /// Fold the oldest history into the rolling summary now.
    Summarize(SummarizeArgs),
    /// Write a checkpoint now.
    Checkpoint,
    /// List the checkpoints, newest first.
    Checkpoints,
    /// Go back to a checkpoint.
    Restore(RestoreArgs),
    /// Rebuild the context from the archive (when no checkpoint restores, or they disagree
    /// with the archive): one new checkpoint.
    Recover,
    /// Search the archive by keywords, or drill down into a summary.
    Search(SearchArgs),
    /// Forget a message, or every occurrence of a text: out of the window, the archive and
    /// every checkpoint, with no byte left on disk.
    Forget(ForgetArgs),
    /// Show the entity values (`[context] entity_schema`), or update or delete one: the old
    /// value is forgotten as `forget --match` forgets a text.
    Entity(EntityArgs),
    /// Delete old checkpoints (keep the newest N), or a whole conversation, from the store.
    Prune(PruneArgs),
    /// Trim a conversation to a token budget without any state: print what ctxwin would send.
    Trim(TrimArgs),
    /// Run the OpenAI/Anthropic proxy: any agent gets a managed context window by pointing its
    /// base URL here. Runs until Ctrl-C or SIGTERM (then checkpoints every conversation).
    Proxy(ProxyArgs),
    /// Start a task (`task start "goal"`), finish the running one (`task done [OUTCOME]`) or
    /// list them: a finished task leaves one structured summary and its messages leave first.
    Task(TaskArgs),
}

#[derive(Debug, Args)]
pub(crate) struct StatsArgs {
    /// The proxy's conversations instead of the CLI's session (where `ctxwin proxy` keeps
    /// them: its `[proxy]` settings): each one's billed prompt tokens (uncached, cache write,
    /// cache read), its bill against an estimate of sending the client's body direct, and
    /// the share of its forwarded prompts' bytes that the previous prompt began with. From
    /// the conversations' newest checkpoints; the running proxy's live numbers are at
    /// `/metrics` and `/metrics/conversations`.
    #[arg(long)]
    pub proxy: bool,
}

#[derive(Debug, Args)]
pub(crate) struct TaskArgs {
    #[command(subcommand)]
    pub action: TaskAction,
}

#[derive(Debug, Subcommand)]
pub(crate) enum TaskAction {
    /// Start a task with this goal (the running one is finished first, and the switch
    /// compacts the window once).
    Start {
        /// What the task is for (64 bytes are kept).
        goal: String,
    },
    /// Finish the running task.
    Done {
        /// How it ended (the summary takes the last answer's first sentence when left out).
        outcome: Option<String>,
    },
    /// List the tasks kept, with their compression.
    List,
}

#[derive(Debug, Args)]
pub(crate) struct InitArgs {
    /// Use this configuration file (checked, then copied into the state directory) instead of
    /// the commented defaults.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub(crate) struct AddArgs {
    /// Who speaks.
    #[arg(value_enum)]
    pub role: RoleArg,
    /// The text; `@FILE` reads a file, `-` reads standard input.
    #[arg(allow_hyphen_values = true)]
    pub content: String,
    /// For a tool result: the id of the call it answers.
    #[arg(long, value_name = "ID", required_if_eq("role", "tool"))]
    pub tool_call_id: Option<String>,
    /// For an assistant message: its tool calls as JSON, OpenAI's
    /// `[{"id":…,"function":{"name":…,"arguments":…}}]` or flat `[{"id":…,"name":…,"arguments":…}]`.
    #[arg(long, value_name = "JSON")]
    pub tool_calls: Option<String>,
    /// Store it in this level instead of the role's default.
    #[arg(long, value_enum)]
    pub level: Option<LevelArg>,
    /// Mark it important (kept longer by the importance strategy).
    #[arg(long)]
    pub important: bool,
}

#[derive(Debug, Args)]
pub(crate) struct ImportArgs {
    /// The conversation file (`-` for standard input).
    pub file: PathBuf,
    /// Its format; detected from the content when omitted.
    #[arg(long, value_enum)]
    pub format: Option<ConversationFormat>,
}

#[derive(Debug, Args)]
pub(crate) struct BuildArgs {
    /// Payload format.
    #[arg(long, value_enum, default_value = "openai")]
    pub format: PayloadFormat,
    /// Dynamic context sent this turn only (task goals, retrieved text); `@FILE` reads a file.
    /// Repeatable.
    #[arg(long, value_name = "TEXT")]
    pub dynamic: Vec<String>,
    /// Retrieve archived messages matching these words (instead of the newest user message)
    /// into the room the payload has left, for this payload only.
    #[arg(long, value_name = "QUERY")]
    pub retrieve: Option<String>,
    /// Most archived messages retrieval adds (default: `[retrieval] max_items`).
    #[arg(long, value_name = "N")]
    pub retrieve_limit: Option<usize>,
    /// No retrieval for this payload.
    #[arg(long, conflicts_with = "retrieve")]
    pub no_retrieve: bool,
}

#[derive(Debug, Args)]
pub(crate) struct ForgetArgs {
    /// The message id (see `ctxwin search`).
    #[arg(value_name = "ID", required_unless_present = "text", conflicts_with = "text")]
    pub id: Option<u64>,
    /// Forget every occurrence of this exact text instead (a leaked secret).
    #[arg(long = "match", value_name = "TEXT")]
    pub text: Option<String>,
}

#[derive(Debug, Args)]
pub(crate) struct EntityArgs {
    /// The key (all keys and values when left out).
    #[arg(value_name = "KEY", required_if_eq("delete", "true"))]
    pub key: Option<String>,
    /// The new value.
    #[arg(value_name = "VALUE", allow_hyphen_values = true, conflicts_with = "delete")]
    pub value: Option<String>,
    /// Delete the key's value.
    #[arg(long)]
    pub delete: bool,
}

#[derive(Debug, Args)]
pub(crate) struct CompressArgs {
    /// Compress down to this share of the budget, in percent (1–100).
    #[arg(long, value_name = "PERCENT", default_value_t = 50,
          value_parser = clap::value_parser!(u8).range(1..=100))]
    pub target: u8,
}

#[derive(Debug, Args)]
pub(crate) struct SummarizeArgs {
    /// Keep this many of the newest messages out of the summary (default: the configured
    /// locked_tail).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub keep: Option<u32>,
}

#[derive(Debug, Args)]
pub(crate) struct PruneArgs {
    /// Keep the newest N checkpoints of the session (of every conversation with --all) and
    /// delete the older ones.
    #[arg(
        long,
        value_name = "N",
        required_unless_present = "delete",
        conflicts_with = "delete",
        value_parser = clap::value_parser!(u32).range(1..)
    )]
    pub keep: Option<u32>,
    /// With --keep: every conversation in the store, not only this directory's session.
    #[arg(long, requires = "keep")]
    pub all: bool,
    /// Delete this conversation from the store: its messages, summaries, vectors and every
    /// checkpoint (a session serving it elsewhere is fenced and starts it anew).
    #[arg(long, value_name = "NAME")]
    pub delete: Option<String>,
}

#[derive(Debug, Args)]
pub(crate) struct RestoreArgs {
    /// A checkpoint id (see `ctxwin checkpoints`) or `latest`.
    pub checkpoint: String,
}

#[derive(Debug, Args)]
pub(crate) struct SearchArgs {
    /// Words to look for (BM25 ranking over archived messages and summaries).
    #[arg(required_unless_present = "summary", conflicts_with = "summary")]
    pub query: Option<String>,
    /// Most hits to show.
    #[arg(long, value_name = "N", default_value_t = 10)]
    pub limit: usize,
    /// Show the messages summary ID stands for instead of searching.
    #[arg(long, value_name = "ID")]
    pub summary: Option<u64>,
}

#[derive(Debug, Args)]
pub(crate) struct TrimArgs {
    /// The conversation file (`-` for standard input).
    pub file: PathBuf,
    /// Token budget of the payload.
    #[arg(long, value_name = "TOKENS", value_parser = parse_budget)]
    pub budget: u32,
    /// Payload format (default: the input's provider, as a JSON body).
    #[arg(long, value_enum)]
    pub format: Option<PayloadFormat>,
    /// Input format; detected from the content when omitted.
    #[arg(long, value_enum, value_name = "FORMAT")]
    pub input_format: Option<ConversationFormat>,
    /// Take strategy, locked tail, observation limit… from this ctxwin.toml (the budget
    /// replaces its window and level budgets).
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
}

#[derive(Debug, Args)]
#[command(after_help = "Settings come from the [proxy] section of DIR/ctxwin.toml (with \
[context] observation_limit and [retrieval], which it shares with the CLI), then \
CTXWIN_PROXY_UPSTREAM / _LISTEN / _KEY / _STATE_DIR / _MAX_RESIDENT, then these flags. \
Conversations live in DIR/proxy/ unless [proxy] state_dir or CTXWIN_PROXY_STATE_DIR says otherwise, \
or in the PostgreSQL database [store] url or CTXWIN_STORE_URL names: a fleet of instances on it, \
any of them serving any conversation. \
The global --tokenizer, --llm-url and --embeddings-* are refused: the proxy counts with the \
estimator calibrated by billed usage, writes no summaries and ranks retrieval by BM25. \
At start it logs which context window each model gets and why.")]
pub(crate) struct ProxyArgs {
    /// The provider's base URL (`https://api.openai.com`, `http://127.0.0.1:8080`).
    #[arg(long, value_name = "URL")]
    pub upstream: Option<String>,
    /// Where to listen (default 127.0.0.1:8787; off loopback needs a proxy key).
    #[arg(long, value_name = "HOST:PORT")]
    pub listen: Option<String>,
    /// Most conversations kept in memory (the least recently used idle ones are
    /// checkpointed and unloaded above it).
    #[arg(long, value_name = "N")]
    pub max_resident: Option<String>,
}

/// A payload budget: a whole number of tokens, at least [`MIN_BUDGET`].
fn parse_budget(text: &str) -> Result<u32, String> {
    match text.trim().parse::<u32>() {
        Ok(tokens) if tokens >= MIN_BUDGET => Ok(tokens),
        Ok(_) => Err(format!("a budget needs at least {MIN_BUDGET} tokens (try 8000)")),
        Err(_) => Err(format!("not a token count from {MIN_BUDGET} to {} (try 8000)", u32::MAX)),
    }
}

/// Smallest `trim --budget`: below it not even a system prompt and one message fit.
const MIN_BUDGET: u32 = 64;

/// A message role.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum RoleArg {
    System,
    User,
    Assistant,
    Tool,
}

impl From<RoleArg> for Role {
    fn from(role: RoleArg) -> Role {
        match role {
            RoleArg::System => Role::System,
            RoleArg::User => Role::User,
            RoleArg::Assistant => Role::Assistant,
            RoleArg::Tool => Role::Tool,
        }
    }
}

/// A context level.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum LevelArg {
    Permanent,
    Session,
    Working,
    Volatile,
}

impl From<LevelArg> for Level {
    fn from(level: LevelArg) -> Level {
        match level {
            LevelArg::Permanent => Level::Permanent,
            LevelArg::Session => Level::Session,
            LevelArg::Working => Level::Working,
            LevelArg::Volatile => Level::Volatile,
        }
    }
}

/// A conversation file format.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum ConversationFormat {
    /// OpenAI chat completions: a message array or a request body.
    Openai,
    /// OpenAI messages, one per line.
    OpenaiJsonl,
    /// Anthropic Messages: a message array or a request body.
    Anthropic,
    /// Anthropic messages, one per line.
    AnthropicJsonl,
}

impl From<ConversationFormat> for Format {
    fn from(format: ConversationFormat) -> Format {
        match format {
            ConversationFormat::Openai => Format::OpenAiJson,
            ConversationFormat::OpenaiJsonl => Format::OpenAiJsonl,
            ConversationFormat::Anthropic => Format::AnthropicJson,
            ConversationFormat::AnthropicJsonl => Format::AnthropicJsonl,
        }
    }
}

/// How a payload is printed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum PayloadFormat {
    /// An OpenAI chat-completions request body.
    Openai,
    /// An Anthropic Messages request body.
    Anthropic,
    /// OpenAI messages, one per line.
    OpenaiJsonl,
    /// Anthropic messages, one per line.
    AnthropicJsonl,
    /// A readable transcript.
    Text,
}

impl PayloadFormat {
    /// The provider format, `None` for the transcript.
    pub(crate) fn provider(self) -> Option<Format> {
        match self {
            PayloadFormat::Openai => Some(Format::OpenAiJson),
            PayloadFormat::Anthropic => Some(Format::AnthropicJson),
            PayloadFormat::OpenaiJsonl => Some(Format::OpenAiJsonl),
            PayloadFormat::AnthropicJsonl => Some(Format::AnthropicJsonl),
            PayloadFormat::Text => None,
        }
    }

    /// The JSON body of the same provider as `format`.
    pub(crate) fn body_of(format: Format) -> PayloadFormat {
        match format {
            Format::OpenAiJson | Format::OpenAiJsonl => PayloadFormat::Openai,
            Format::AnthropicJson | Format::AnthropicJsonl => PayloadFormat::Anthropic,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn the_command_line_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn tool_results_need_a_call_id() {
        let parsed = Cli::try_parse_from(["ctxwin", "add", "tool", "42"]);
        assert!(parsed.is_err());
        let parsed =
            Cli::try_parse_from(["ctxwin", "add", "tool", "42", "--tool-call-id", "c1"]).unwrap();
        let Command::Add(add) = parsed.command else { panic!("not add") };
        assert_eq!((add.role, add.tool_call_id.as_deref()), (RoleArg::Tool, Some("c1")));
    }

    #[test]
    fn global_flags_go_anywhere() {
        let parsed = Cli::try_parse_from(["ctxwin", "stats", "--json", "--dir", "/tmp/x"]).unwrap();
        assert!(parsed.json);
        assert_eq!(parsed.dir, PathBuf::from("/tmp/x"));
        let Command::Stats(stats) = parsed.command else { panic!("not stats") };
        assert!(!stats.proxy);
        let parsed = Cli::try_parse_from(["ctxwin", "stats", "--proxy"]).unwrap();
        assert!(matches!(parsed.command, Command::Stats(StatsArgs { proxy: true })));
    }

    #[test]
    fn a_budget_error_says_what_a_budget_is() {
        let small = Cli::try_parse_from(["ctxwin", "trim", "--budget", "10", "f"]).unwrap_err();
        assert!(small.to_string().contains("at least 64 tokens"), "{small}");
        let word = Cli::try_parse_from(["ctxwin", "trim", "--budget", "lots", "f"]).unwrap_err();
        assert!(word.to_string().contains("not a token count"), "{word}");
        let ok = Cli::try_parse_from(["ctxwin", "trim", "--budget", "64", "f"]).unwrap();
        let Command::Trim(trim) = ok.command else { panic!("not trim") };
        assert_eq!(trim.budget, 64);
    }

    #[test]
    fn search_takes_a_query_or_a_summary() {
        assert!(Cli::try_parse_from(["ctxwin", "search"]).is_err());
        assert!(Cli::try_parse_from(["ctxwin", "search", "--summary", "4"]).is_ok());
        assert!(Cli::try_parse_from(["ctxwin", "search", "x", "--summary", "4"]).is_err());
    }
}
