//! Vectors for texts from an OpenAI-compatible `POST /v1/embeddings` endpoint.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::error::excerpt;
use super::{LlmClient, LlmError};

/// The vectors of one `/v1/embeddings` call, in input order.
#[derive(Clone, Debug, PartialEq)]
pub struct Embeddings {
    /// One vector per input, all of the same length.
    pub vectors: Vec<Vec<f32>>,
    /// The model the server says it used (`model` of the answer), when it said.
    pub model: Option<String>,
    /// Wall time of the call, retries and waits included.
    pub latency: Duration,
}

#[derive(Serialize)]
struct EmbeddingsRequest<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    model: Option<&'a str>,
    input: &'a [&'a str],
    encoding_format: &'static str,
}

#[derive(Deserialize)]
struct EmbeddingsResponse {
    #[serde(default)]
    data: Vec<EmbeddingItem>,
    #[serde(default)]
    model: Option<String>,
}

#[derive(Deserialize)]
struct EmbeddingItem {
    #[serde(default)]
    index: Option<usize>,
    embedding: Vec<f32>,
}

impl LlmClient {
    /// One vector per text of `inputs`, from `POST {base}/v1/embeddings` (the configured
    /// model name is sent as `model`; llama-server ignores it, OpenAI requires it). Retries and
    /// timeouts as for [`complete`](Self::complete). No inputs, no call.
    ///
    /// # Errors
    ///
    /// Transport errors as in [`complete`](Self::complete) ([`LlmError::Http`] 404 or 501 when
    /// the server has no embeddings endpoint, e.g. llama-server without `--embeddings`);
    /// [`LlmError::Malformed`] when the answer is not one finite vector per input, all of
    /// one non-zero length.
    ///
    /// ```no_run
    /// let client = ctxwin_std::llm::LlmClientBuilder::new("http://127.0.0.1:8090").build()?;
    /// let answer = client.embeddings(&["a dog", "a puppy"])?;
    /// assert_eq!(answer.vectors.len(), 2);
    /// # Ok::<(), ctxwin_std::llm::LlmError>(())
    /// ```
    pub fn embeddings(&self, inputs: &[&str]) -> Result<Embeddings, LlmError> {
        if inputs.is_empty() {
            return Ok(Embeddings { vectors: Vec::new(), model: None, latency: Duration::ZERO });
        }
        let request = EmbeddingsRequest {
            model: self.model.as_deref(),
            input: inputs,
            encoding_format: "float",
        };
        let body = serde_json::to_string(&request)
            .map_err(|err| LlmError::Malformed(format!("cannot encode the request: {err}")))?;
        let exchange = self.post_json(&self.endpoints.embeddings, &body)?;
        let vectors = parse_vectors(&exchange.body, inputs.len())?;
        tracing::debug!(
            request_id = %exchange.request_id,
            inputs = inputs.len(),
            latency_ms = exchange.latency.as_millis() as u64,
            "embeddings received"
        );
        let model = serde_json::from_str::<EmbeddingsResponse>(&exchange.body)
            .ok()
            .and_then(|response| response.model);
        Ok(Embeddings { vectors, model, latency: exchange.latency })
    }
}

/// The `count` vectors of an embeddings answer, in input order (by `index` when given).
fn parse_vectors(body: &str, count: usize) -> Result<Vec<Vec<f32>>, LlmError> {
    let response: EmbeddingsResponse = serde_json::from_str(body).map_err(|err| {
        LlmError::Malformed(format!(
            "/v1/embeddings answered {:?}, not {{\"data\": [{{\"embedding\": [...]}}]}} ({err})",
            excerpt(body, 120)
        ))
    })?;
    if response.data.len() != count {
        return Err(LlmError::Malformed(format!(
            "{} embeddings for {count} inputs",
            response.data.len()
        )));
    }
    let mut vectors: Vec<Option<Vec<f32>>> = vec![None; count];
    for (position, item) in response.data.into_iter().enumerate() {
        let at = item.index.unwrap_or(position);
        let slot = vectors
            .get_mut(at)
            .ok_or_else(|| LlmError::Malformed(format!("embedding index {at} out of range")))?;
        if slot.replace(item.embedding).is_some() {
            return Err(LlmError::Malformed(format!("embedding index {at} given twice")));
        }
    }
    let vectors: Vec<Vec<f32>> = vectors.into_iter().flatten().collect();
    let dimensions = vectors.first().map_or(0, Vec::len);
    if dimensions == 0 || vectors.iter().any(|v| v.len() != dimensions) {
        return Err(LlmError::Malformed("embeddings are empty or of different lengths".into()));
    }
    if vectors.iter().flatten().any(|x| !x.is_finite()) {
        return Err(LlmError::Malformed("an embedding holds NaN or infinity".into()));
    }
    Ok(vectors)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vectors_come_back_in_input_order() {
        let body = r#"{"model":"m","data":[{"index":1,"embedding":[0.0,1.0]},
            {"index":0,"embedding":[1.0,0.0]}]}"#;
        assert_eq!(parse_vectors(body, 2).unwrap(), [[1.0, 0.0], [0.0, 1.0]]);
        let unindexed = r#"{"data":[{"embedding":[1.0]},{"embedding":[2.0]}]}"#;
        assert_eq!(parse_vectors(unindexed, 2).unwrap(), [[1.0], [2.0]]);
    }

    #[test]
    fn wrong_shapes_are_malformed() {
        for (body, count) in [
            ("not json", 1),
            (r#"{"data":[]}"#, 1),
            (r#"{"data":[{"embedding":[1.0]}]}"#, 2),
            (r#"{"data":[{"index":0,"embedding":[1.0]},{"index":0,"embedding":[2.0]}]}"#, 2),
            (r#"{"data":[{"index":5,"embedding":[1.0]}]}"#, 1),
            (r#"{"data":[{"embedding":[1.0]},{"embedding":[2.0,3.0]}]}"#, 2),
            (r#"{"data":[{"embedding":[]}]}"#, 1),
        ] {
            assert!(matches!(parse_vectors(body, count), Err(LlmError::Malformed(_))), "{body}");
        }
    }

    #[test]
    fn no_inputs_make_no_call() {
        let client = super::super::LlmClientBuilder::new("http://127.0.0.1:1").build().unwrap();
        assert!(client.embeddings(&[]).unwrap().vectors.is_empty());
    }
}
