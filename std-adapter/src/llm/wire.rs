//! The OpenAI chat-completions and llama.cpp tokenize wire formats, and endpoint URLs.

use serde::{Deserialize, Serialize};

use super::LlmError;

/// Endpoints derived from a base URL given with or without a trailing `/v1`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Endpoints {
    /// The server root (no `/v1`), as the user should recognise it in messages.
    pub(crate) root: String,
    pub(crate) chat: String,
    pub(crate) tokenize: String,
    pub(crate) embeddings: String,
}

impl Endpoints {
    pub(crate) fn parse(base_url: &str) -> Result<Self, LlmError> {
        let trimmed = base_url.trim().trim_end_matches('/');
        let rest = trimmed
            .strip_prefix("http://")
            .or_else(|| trimmed.strip_prefix("https://"))
            .ok_or_else(|| {
                LlmError::Config(format!(
                    "base URL {base_url:?} must start with http:// or https://, e.g. \
                     http://127.0.0.1:8089"
                ))
            })?;
        if rest.is_empty() || rest.starts_with('/') || rest.contains(['?', '#', ' ']) {
            return Err(LlmError::Config(format!(
                "base URL {base_url:?} needs a host and no query, e.g. https://api.openai.com/v1"
            )));
        }
        let root = trimmed.strip_suffix("/v1").unwrap_or(trimmed).to_owned();
        Ok(Self {
            chat: format!("{root}/v1/chat/completions"),
            tokenize: format!("{root}/tokenize"),
            embeddings: format!("{root}/v1/embeddings"),
            root,
        })
    }
}

/// One message of a chat-completions request.
#[derive(Debug, Serialize)]
pub(crate) struct WireMessage<'a> {
    pub(crate) role: &'static str,
    pub(crate) content: &'a str,
}

/// The chat-completions request body.
#[derive(Debug, Serialize)]
pub(crate) struct ChatRequest<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) model: Option<&'a str>,
    pub(crate) messages: [WireMessage<'a>; 2],
    pub(crate) max_tokens: u32,
    pub(crate) temperature: f32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) frequency_penalty: Option<f32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) response_format: Option<ResponseFormat>,
    pub(crate) stream: bool,
}

/// Longest value, in characters, the extraction schema lets the server produce: keeps a
/// grammar-constrained answer well inside the extraction token limit.
pub(crate) const MAX_EXTRACTED_VALUE_CHARS: u32 = 120;

/// `{"type": "json_schema", ...}`: the server constrains the answer to one JSON object with
/// exactly the declared keys, each a short string or null (llama.cpp turns the schema into a
/// grammar, so even a 135M model answers in shape; OpenAI and vLLM honour it too).
#[derive(Debug, Serialize)]
pub(crate) struct ResponseFormat {
    #[serde(rename = "type")]
    pub(crate) kind: &'static str,
    pub(crate) json_schema: serde_json::Value,
}

impl ResponseFormat {
    /// The format for an extraction over `keys`.
    pub(crate) fn declared_keys(keys: &[&str]) -> Self {
        let value =
            serde_json::json!({"type": ["string", "null"], "maxLength": MAX_EXTRACTED_VALUE_CHARS});
        let properties: serde_json::Map<String, serde_json::Value> =
            keys.iter().map(|&key| (key.to_owned(), value.clone())).collect();
        Self {
            kind: "json_schema",
            json_schema: serde_json::json!({
                "name": "entities",
                "schema": {
                    "type": "object",
                    "properties": properties,
                    "required": keys,
                    "additionalProperties": false,
                },
            }),
        }
    }
}

#[derive(Debug, Deserialize)]
pub(crate) struct ChatResponse {
    #[serde(default)]
    pub(crate) id: Option<String>,
    #[serde(default)]
    pub(crate) choices: Vec<Choice>,
    #[serde(default)]
    pub(crate) usage: Option<WireUsage>,
}

#[derive(Debug, Deserialize)]
pub(crate) struct Choice {
    pub(crate) message: Option<ChoiceMessage>,
    #[serde(default)]
    pub(crate) finish_reason: Option<String>,
}

#[derive(Debug, Deserialize)]
pub(crate) struct ChoiceMessage {
    #[serde(default)]
    pub(crate) content: Option<String>,
}

#[derive(Debug, Deserialize)]
pub(crate) struct WireUsage {
    #[serde(default)]
    pub(crate) prompt_tokens: Option<u32>,
    #[serde(default)]
    pub(crate) completion_tokens: Option<u32>,
}

/// llama-server's `POST /tokenize` body.
#[derive(Debug, Serialize)]
pub(crate) struct TokenizeRequest<'a> {
    pub(crate) content: &'a str,
    pub(crate) add_special: bool,
    pub(crate) with_pieces: bool,
}

#[derive(Debug, Deserialize)]
pub(crate) struct TokenizeResponse {
    pub(crate) tokens: Vec<WireToken>,
}

/// A token as `/tokenize` lists it: a bare id, or `{id, piece}` with `with_pieces`, where the
/// piece is a string, or an array of byte values when it is not valid UTF-8 on its own.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub(crate) enum WireToken {
    Id(u32),
    WithPiece { id: u32, piece: WirePiece },
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub(crate) enum WirePiece {
    Text(String),
    Bytes(Vec<u8>),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base_urls_with_and_without_v1_reach_the_same_endpoints() {
        for base in [
            "http://127.0.0.1:8089",
            "http://127.0.0.1:8089/",
            "http://127.0.0.1:8089/v1",
            " http://127.0.0.1:8089/v1/ ",
        ] {
            let endpoints = Endpoints::parse(base).unwrap();
            assert_eq!(endpoints.chat, "http://127.0.0.1:8089/v1/chat/completions", "{base}");
            assert_eq!(endpoints.tokenize, "http://127.0.0.1:8089/tokenize", "{base}");
            assert_eq!(endpoints.embeddings, "http://127.0.0.1:8089/v1/embeddings", "{base}");
        }
        let proxied = Endpoints::parse("https://gateway.example/openai/v1").unwrap();
        assert_eq!(proxied.chat, "https://gateway.example/openai/v1/chat/completions");
    }

    #[test]
    fn bad_base_urls_are_config_errors() {
        for base in ["127.0.0.1:8089", "ftp://host", "http://", "http:///v1", "http://h?x=1", ""] {
            assert!(matches!(Endpoints::parse(base), Err(LlmError::Config(_))), "{base}");
        }
    }

    #[test]
    fn the_extraction_format_declares_exactly_the_keys() {
        let format =
            serde_json::to_value(ResponseFormat::declared_keys(&["branch", "owner"])).unwrap();
        assert_eq!(format["type"], "json_schema");
        let schema = &format["json_schema"]["schema"];
        assert_eq!(schema["required"], serde_json::json!(["branch", "owner"]));
        assert_eq!(schema["additionalProperties"], false);
        assert_eq!(schema["properties"]["owner"]["type"], serde_json::json!(["string", "null"]));
        assert_eq!(schema["properties"].as_object().unwrap().len(), 2);
    }

    #[test]
    fn tokens_parse_as_ids_or_pieces() {
        let plain: TokenizeResponse = serde_json::from_str(r#"{"tokens":[1,2,3]}"#).unwrap();
        assert!(matches!(plain.tokens.as_slice(), [WireToken::Id(1), _, WireToken::Id(3)]));
        let pieces: TokenizeResponse = serde_json::from_str(
            r#"{"tokens":[{"id":905,"piece":" world"},{"id":250,"piece":[160]}]}"#,
        )
        .unwrap();
        assert!(matches!(
            pieces.tokens.as_slice(),
            [
                WireToken::WithPiece { id: 905, piece: WirePiece::Text(_) },
                WireToken::WithPiece { id: 250, piece: WirePiece::Bytes(_) }
            ]
        ));
    }
}
