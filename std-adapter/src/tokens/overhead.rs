//! [`ChatFraming`]: the tokens a chat API bills around message contents.
//!
//! A chat request is rendered into one token stream: each message's content wrapped in role
//! and separator tokens, plus a primer that starts the reply. The core counts contents only
//! and adds [`Config::message_overhead`] per message and [`Config::request_overhead`] once;
//! a `ChatFraming` supplies those two numbers for a given API or template.

use ctxwin_core::{Config, counter::TokenCounter};

#[cfg(feature = "tokenizers")]
use super::ExactCounter;

/// Roles whose framing [`ChatFraming::chatml`] measures; the overhead is the largest.
pub const CHATML_ROLES: [&str; 4] = ["system", "user", "assistant", "tool"];

/// Per-message and per-request framing tokens.
///
/// Presets:
///
/// | preset | message | request | where the numbers come from |
/// |---|---:|---:|---|
/// | [`OPENAI`](Self::OPENAI) | 4 | 3 | OpenAI's cookbook (`num_tokens_from_messages`, gpt-3.5/gpt-4): 3 per message for `<\|start\|>{role}\n … <\|end\|>\n` plus the role's own token, 3 for the reply primer `<\|start\|>assistant<\|message\|>` |
/// | [`CHATML`](Self::CHATML) | 5 | 3 | ChatML (`<\|im_start\|>{role}\n{content}<\|im_end\|>\n`, llama.cpp's `chatml`, Qwen, SmolLM2) when the markers and every role are one token each; [`ChatFraming::chatml`] measures it for a given tokenizer (SmolLM2 spells `assistant` in two tokens: 6 and 4) |
/// | [`ANTHROPIC`](Self::ANTHROPIC) | 4 | 4 | approximate, erring high: Anthropic publishes no framing; its `count_tokens` example (system "You are a scientist", user "Hello, Claude": 14 input tokens) leaves about 6 for two messages and the request |
///
/// Tool calls in assistant messages cost extra framing the core adds itself (per call).
///
/// # Examples
///
/// ```
/// use ctxwin_core::Config;
/// use ctxwin_std::tokens::ChatFraming;
///
/// let config = ChatFraming::CHATML.apply(Config::DEFAULT);
/// assert_eq!((config.message_overhead, config.request_overhead), (5, 3));
/// assert_eq!(ChatFraming::OPENAI.payload_tokens(&[10, 20]), 10 + 20 + 2 * 4 + 3);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct ChatFraming {
    /// Tokens around each message's content (role, start and end markers, separators).
    pub message: u16,
    /// Tokens once per request (the reply primer).
    pub request: u16,
}

impl ChatFraming {
    /// OpenAI chat completions (gpt-3.5-turbo, gpt-4 family): 4 per message, 3 per request.
    pub const OPENAI: ChatFraming = ChatFraming { message: 4, request: 3 };

    /// ChatML with single-token markers and roles: 5 per message, 3 per request. Measure
    /// the real values with [`ChatFraming::chatml`].
    pub const CHATML: ChatFraming = ChatFraming { message: 5, request: 3 };

    /// Anthropic Messages API, approximate: 4 per message, 4 per request.
    pub const ANTHROPIC: ChatFraming = ChatFraming { message: 4, request: 4 };

    /// A framing of `message` tokens per message and `request` per request.
    ///
    /// ```
    /// use ctxwin_std::tokens::ChatFraming;
    /// assert_eq!(ChatFraming::new(4, 3), ChatFraming::OPENAI);
    /// ```
    pub const fn new(message: u16, request: u16) -> ChatFraming {
        ChatFraming { message, request }
    }

    /// The ChatML framing as `counter`'s tokenizer bills it, measured by tokenizing the
    /// template around an empty content: the message overhead is the largest
    /// [`chatml_message_tokens`](Self::chatml_message_tokens) over [`CHATML_ROLES`] (so it
    /// errs high by the difference for cheaper roles), the request overhead
    /// `tokens("<|im_start|>assistant\n")`.
    ///
    /// A tokenizer without the ChatML markers as special tokens spells them out in many
    /// tokens, which this measures too. Templates that inject a default system prompt
    /// (SmolLM2's does when the conversation has none) cost that prompt on top.
    ///
    /// ```
    /// use ctxwin_std::tokens::{ChatFraming, ExactCounter};
    ///
    /// // SmolLM2's vocabulary spells "assistant" in two tokens.
    /// assert_eq!(ChatFraming::chatml(&ExactCounter::smollm2()?), ChatFraming::new(6, 4));
    /// # Ok::<(), ctxwin_std::tokens::TokenizerError>(())
    /// ```
    #[cfg(feature = "tokenizers")]
    pub fn chatml(counter: &ExactCounter) -> ChatFraming {
        let message = CHATML_ROLES
            .iter()
            .map(|role| Self::chatml_message_tokens(counter, role))
            .max()
            .unwrap_or(0);
        let request = counter.count_uncached(CHATML_REPLY_PRIMER);
        ChatFraming { message: saturate_u16(message), request: saturate_u16(request) }
    }

    /// Framing tokens of one ChatML message with `role`:
    /// `tokens("<|im_start|>{role}\n<|im_end|>\n")`. Exact for contents that start with a
    /// non-whitespace character (a leading newline may merge with the one after the role).
    ///
    /// ```
    /// use ctxwin_std::tokens::{ChatFraming, ExactCounter};
    ///
    /// let counter = ExactCounter::smollm2()?;
    /// assert_eq!(ChatFraming::chatml_message_tokens(&counter, "user"), 5);
    /// assert_eq!(ChatFraming::chatml_message_tokens(&counter, "assistant"), 6);
    /// # Ok::<(), ctxwin_std::tokens::TokenizerError>(())
    /// ```
    #[cfg(feature = "tokenizers")]
    pub fn chatml_message_tokens(counter: &ExactCounter, role: &str) -> u32 {
        counter.count_uncached(&render_chatml([(role, "")], false))
    }

    /// `config` with its `message_overhead` and `request_overhead` set to this framing.
    ///
    /// ```
    /// use ctxwin_core::Config;
    /// use ctxwin_std::tokens::ChatFraming;
    ///
    /// let config = ChatFraming::ANTHROPIC.apply(Config::DEFAULT);
    /// assert_eq!(config.request_overhead, 4);
    /// assert_eq!(config.context_window, Config::DEFAULT.context_window);
    /// ```
    pub const fn apply(self, config: Config) -> Config {
        Config { message_overhead: self.message, request_overhead: self.request, ..config }
    }

    /// The framing a `config` carries.
    ///
    /// ```
    /// use ctxwin_core::Config;
    /// use ctxwin_std::tokens::ChatFraming;
    ///
    /// assert_eq!(ChatFraming::of(&Config::DEFAULT), ChatFraming::OPENAI);
    /// ```
    pub const fn of(config: &Config) -> ChatFraming {
        ChatFraming { message: config.message_overhead, request: config.request_overhead }
    }

    /// Tokens of a request whose messages have `content_tokens` each: contents plus framing
    /// (0 for no messages), saturating.
    ///
    /// ```
    /// use ctxwin_std::tokens::ChatFraming;
    ///
    /// assert_eq!(ChatFraming::CHATML.payload_tokens(&[]), 0);
    /// assert_eq!(ChatFraming::CHATML.payload_tokens(&[7]), 7 + 5 + 3);
    /// ```
    pub fn payload_tokens(&self, content_tokens: &[u32]) -> u32 {
        if content_tokens.is_empty() {
            return 0;
        }
        content_tokens.iter().fold(u32::from(self.request), |sum, &tokens| {
            sum.saturating_add(tokens).saturating_add(u32::from(self.message))
        })
    }

    /// Tokens `counter` gives the contents of `messages`, plus this framing.
    ///
    /// ```
    /// use ctxwin_std::tokens::{ChatFraming, ExactCounter};
    ///
    /// let counter = ExactCounter::cl100k()?;
    /// let tokens = ChatFraming::OPENAI.count_messages(&counter, ["hello world"]);
    /// assert_eq!(tokens, 2 + 4 + 3);
    /// # Ok::<(), ctxwin_std::tokens::TokenizerError>(())
    /// ```
    pub fn count_messages<'a, K: TokenCounter + ?Sized>(
        &self,
        counter: &K,
        contents: impl IntoIterator<Item = &'a str>,
    ) -> u32 {
        let mut messages = 0u32;
        let total = contents.into_iter().fold(u32::from(self.request), |sum, text| {
            messages += 1;
            sum.saturating_add(counter.count(text)).saturating_add(u32::from(self.message))
        });
        if messages == 0 { 0 } else { total }
    }
}

/// What ChatML appends to prompt the model's reply.
pub const CHATML_REPLY_PRIMER: &str = "<|im_start|>assistant\n";

/// Renders `(role, content)` messages as ChatML, the way llama.cpp's `chatml` template and
/// SmolLM2's Jinja template do (without a default system prompt); with
/// `add_generation_prompt` it ends with [`CHATML_REPLY_PRIMER`].
///
/// # Examples
///
/// ```
/// use ctxwin_std::tokens::render_chatml;
///
/// let text = render_chatml([("user", "Hi")], true);
/// assert_eq!(text, "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
/// ```
pub fn render_chatml<'a>(
    messages: impl IntoIterator<Item = (&'a str, &'a str)>,
    add_generation_prompt: bool,
) -> String {
    let mut text = String::new();
    for (role, content) in messages {
        text.push_str("<|im_start|>");
        text.push_str(role);
        text.push('\n');
        text.push_str(content);
        text.push_str("<|im_end|>\n");
    }
    if add_generation_prompt {
        text.push_str(CHATML_REPLY_PRIMER);
    }
    text
}

#[cfg(feature = "tokenizers")]
fn saturate_u16(n: u32) -> u16 {
    u16::try_from(n).unwrap_or(u16::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[cfg(feature = "tokenizers")]
    fn chatml_framing_of_smollm2() {
        let counter = ExactCounter::smollm2().unwrap();
        let per_role = CHATML_ROLES.map(|role| ChatFraming::chatml_message_tokens(&counter, role));
        assert_eq!(per_role, [5, 5, 6, 5]);
        assert_eq!(counter.count(CHATML_REPLY_PRIMER), 4);
        assert_eq!(ChatFraming::chatml(&counter), ChatFraming::new(6, 4));
    }

    #[test]
    #[cfg(feature = "tokenizers")]
    fn chatml_without_special_markers_costs_more() {
        // cl100k has no <|im_start|>, so the markers are spelled out in ordinary tokens.
        let framing = ChatFraming::chatml(&ExactCounter::cl100k().unwrap());
        assert!(framing.message > ChatFraming::CHATML.message, "{framing:?}");
        assert!(framing.request > ChatFraming::CHATML.request, "{framing:?}");
    }

    #[test]
    fn payload_tokens_saturate() {
        assert_eq!(ChatFraming::OPENAI.payload_tokens(&[u32::MAX, 1]), u32::MAX);
    }

    #[test]
    fn apply_and_of_round_trip() {
        let framing = ChatFraming::new(9, 11);
        assert_eq!(ChatFraming::of(&framing.apply(Config::DEFAULT)), framing);
    }

    #[test]
    fn render_keeps_order_and_roles() {
        let text = render_chatml([("system", "S"), ("user", "U"), ("assistant", "A")], false);
        assert_eq!(
            text,
            "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n\
             <|im_start|>assistant\nA<|im_end|>\n"
        );
    }
}
