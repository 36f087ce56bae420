//! The model's own tokenization, from llama-server's `POST /tokenize`.

use super::error::excerpt;
use super::wire::{TokenizeRequest, TokenizeResponse, WirePiece, WireToken};
use super::{LlmClient, LlmError};

/// One token with the bytes it stands for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TokenPiece {
    /// Token id in the model's vocabulary.
    pub id: u32,
    /// The bytes of the token's text; a token can hold part of a UTF-8 character.
    pub bytes: Vec<u8>,
}

impl LlmClient {
    /// The model's token ids for `text`, without special tokens (llama-server's
    /// `POST /tokenize` with `add_special: false`; OpenAI's API has no such endpoint).
    ///
    /// # Errors
    ///
    /// Transport errors as in [`complete`](Self::complete); [`LlmError::Http`] 404 when the
    /// server has no `/tokenize`; [`LlmError::Malformed`] for another body shape.
    ///
    /// ```no_run
    /// let client = ctxwin_std::llm::LlmClientBuilder::new("http://127.0.0.1:8089").build()?;
    /// let ids = client.tokenize("hello world")?;
    /// println!("{} tokens", ids.len());
    /// # Ok::<(), ctxwin_std::llm::LlmError>(())
    /// ```
    pub fn tokenize(&self, text: &str) -> Result<Vec<u32>, LlmError> {
        let tokens = self.tokenize_request(text, false)?;
        Ok(tokens
            .into_iter()
            .map(|token| match token {
                WireToken::Id(id) | WireToken::WithPiece { id, .. } => id,
            })
            .collect())
    }

    /// Like [`tokenize`](Self::tokenize), with each token's bytes (`with_pieces: true`; the
    /// server sends a piece as a string, or as byte values when it is not valid UTF-8 alone).
    ///
    /// # Errors
    ///
    /// As [`tokenize`](Self::tokenize); [`LlmError::Malformed`] when a token has no piece.
    ///
    /// ```no_run
    /// let client = ctxwin_std::llm::LlmClientBuilder::new("http://127.0.0.1:8089").build()?;
    /// let pieces = client.tokenize_pieces("héllo")?;
    /// let bytes: Vec<u8> = pieces.iter().flat_map(|p| p.bytes.iter().copied()).collect();
    /// assert_eq!(bytes, "héllo".as_bytes());
    /// # Ok::<(), ctxwin_std::llm::LlmError>(())
    /// ```
    pub fn tokenize_pieces(&self, text: &str) -> Result<Vec<TokenPiece>, LlmError> {
        self.tokenize_request(text, true)?
            .into_iter()
            .map(|token| match token {
                WireToken::WithPiece { id, piece: WirePiece::Text(text) } => {
                    Ok(TokenPiece { id, bytes: text.into_bytes() })
                }
                WireToken::WithPiece { id, piece: WirePiece::Bytes(bytes) } => {
                    Ok(TokenPiece { id, bytes })
                }
                WireToken::Id(id) => {
                    Err(LlmError::Malformed(format!("token {id} came without its piece")))
                }
            })
            .collect()
    }

    fn tokenize_request(&self, text: &str, with_pieces: bool) -> Result<Vec<WireToken>, LlmError> {
        let request = TokenizeRequest { content: text, add_special: false, with_pieces };
        let body = serde_json::to_string(&request)
            .map_err(|err| LlmError::Malformed(format!("cannot encode the request: {err}")))?;
        let exchange = self.post_json(&self.endpoints.tokenize, &body)?;
        let response: TokenizeResponse = serde_json::from_str(&exchange.body).map_err(|err| {
            LlmError::Malformed(format!(
                "/tokenize answered {:?}, not {{\"tokens\": [...]}} ({err})",
                excerpt(&exchange.body, 120)
            ))
        })?;
        tracing::debug!(
            request_id = %exchange.request_id,
            tokens = response.tokens.len(),
            latency_ms = exchange.latency.as_millis() as u64,
            "tokenized"
        );
        Ok(response.tokens)
    }
}
