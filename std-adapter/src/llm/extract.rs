//! Key/value facts extracted from text as JSON, read tolerantly and checked strictly.

use std::collections::BTreeMap;

use serde_json::{Map, Value};

use super::budget::fit;
use super::prompts::extract_request;
use super::wire::ResponseFormat;
use super::{LlmClient, LlmError};

/// Fewest input tokens left for the text whatever the current values cost.
const MIN_TEXT_TOKENS: u32 = 64;

/// `{` positions tried as the start of the answer's object.
const MAX_OBJECT_STARTS: usize = 8;

impl LlmClient {
    /// Asks the model which of the `schema` keys `text` sets, and returns `current` updated
    /// with the values it found (keys it answers `null` for keep their current value).
    ///
    /// The model sees the declared keys, their current values and the text (cut to the input
    /// budget). The answer is read tolerantly by [`parse_extraction`].
    ///
    /// # Errors
    ///
    /// [`LlmError::Config`] for an empty schema or an empty key; transport errors as in
    /// [`complete`](Self::complete); rejected answers the caller should meet by keeping
    /// `current`: [`LlmError::NotJson`], [`LlmError::UndeclaredKey`], [`LlmError::BadValue`],
    /// [`LlmError::Truncated`] (the answer hit the token limit before its object closed),
    /// [`LlmError::EmptyAnswer`].
    ///
    /// ```no_run
    /// use std::collections::BTreeMap;
    /// let client = ctxwin_std::llm::LlmClientBuilder::new("http://127.0.0.1:8089").build()?;
    /// let facts = client.extract(
    ///     &["branch", "failing_test"],
    ///     &BTreeMap::new(),
    ///     "Switched to branch fix-io; tests/io.rs::reads_back still fails.",
    /// );
    /// match facts {
    ///     Ok(facts) => println!("{facts:?}"),
    ///     Err(err) if err.is_rejected_answer() => println!("keep the old facts: {err}"),
    ///     Err(err) => return Err(err),
    /// }
    /// # Ok::<(), ctxwin_std::llm::LlmError>(())
    /// ```
    pub fn extract(
        &self,
        schema: &[&str],
        current: &BTreeMap<String, String>,
        text: &str,
    ) -> Result<BTreeMap<String, String>, LlmError> {
        if schema.is_empty() || schema.iter().any(|key| key.trim().is_empty()) {
            return Err(LlmError::Config(
                "the extraction schema must declare at least one non-empty key".into(),
            ));
        }
        let shown: Map<String, Value> = schema
            .iter()
            .map(|&key| {
                let value = current.get(key).map_or(Value::Null, |v| Value::String(v.clone()));
                (key.to_owned(), value)
            })
            .collect();
        let current_json = Value::Object(shown).to_string();
        let count = |text: &str| self.count_tokens(text);
        let text_budget =
            self.input_token_budget.saturating_sub(count(&current_json)).max(MIN_TEXT_TOKENS);
        let fitted = fit(vec![text.to_owned()], 0, text_budget, &count);
        let text = fitted.pieces.concat();
        let (system, user) = extract_request(schema, &current_json, &text);
        let format = self.json_mode.then(|| ResponseFormat::declared_keys(schema));
        let completion = self.chat(&system, &user, self.extract_max_tokens, format)?;
        let found = match parse_extraction(&completion.text, schema) {
            Err(LlmError::NotJson(_)) if completion.was_truncated() => {
                return Err(LlmError::Truncated { max_tokens: self.extract_max_tokens });
            }
            other => other?,
        };
        tracing::debug!(
            found = found.len(),
            latency_ms = completion.latency.as_millis() as u64,
            input_cut = fitted.cut,
            "LLM extraction accepted"
        );
        let mut updated = current.clone();
        updated.extend(found);
        Ok(updated)
    }
}

/// Reads an extraction answer: the first JSON object in it (inside a ```` ```json ```` fence
/// or surrounded by prose), whose keys must all be in `schema`.
///
/// Strings are kept (trimmed); numbers and booleans become their JSON text; `null`, `""` and
/// `"null"` mean "unknown or unchanged" and are left out of the result.
///
/// # Errors
///
/// [`LlmError::NotJson`] when no JSON object can be read, [`LlmError::UndeclaredKey`] for a
/// key outside `schema`, [`LlmError::BadValue`] for an array or object value.
///
/// ```
/// use ctxwin_std::llm::{LlmError, parse_extraction};
/// let answer = "Here you go:\n```json\n{\"branch\": \"fix-io\", \"tests\": 3, \"owner\": null}\n```";
/// let facts = parse_extraction(answer, &["branch", "tests", "owner"])?;
/// assert_eq!(facts["branch"], "fix-io");
/// assert_eq!(facts["tests"], "3");
/// assert!(!facts.contains_key("owner"));
/// assert!(matches!(parse_extraction("{\"x\": \"1\"}", &["branch"]), Err(LlmError::UndeclaredKey(k)) if k == "x"));
/// # Ok::<(), LlmError>(())
/// ```
pub fn parse_extraction(
    answer: &str,
    schema: &[&str],
) -> Result<BTreeMap<String, String>, LlmError> {
    let object = first_object(answer)?;
    let mut facts = BTreeMap::new();
    for (key, value) in object {
        if !schema.contains(&key.as_str()) {
            return Err(LlmError::UndeclaredKey(key));
        }
        let text = match value {
            Value::Null => continue,
            Value::String(text) => text.trim().to_owned(),
            Value::Number(number) => number.to_string(),
            Value::Bool(flag) => flag.to_string(),
            Value::Array(_) => return Err(LlmError::BadValue { key, found: "array" }),
            Value::Object(_) => return Err(LlmError::BadValue { key, found: "object" }),
        };
        if text.is_empty() || text.eq_ignore_ascii_case("null") {
            continue;
        }
        facts.insert(key, text);
    }
    Ok(facts)
}

/// The first `{…}` in `answer` (fences and prose around it ignored) that parses as a JSON
/// object.
fn first_object(answer: &str) -> Result<Map<String, Value>, LlmError> {
    let body = unfence(answer);
    let mut last_error = None;
    for (start, _) in body.match_indices('{').take(MAX_OBJECT_STARTS) {
        let Some(candidate) = body.get(start..).and_then(balanced_object) else {
            continue;
        };
        match serde_json::from_str::<Map<String, Value>>(candidate) {
            Ok(object) => return Ok(object),
            Err(err) => last_error = Some(err.to_string()),
        }
    }
    Err(LlmError::NotJson(match last_error {
        Some(err) => format!("the object found does not parse: {err}"),
        None => "no complete {…} object in the answer".into(),
    }))
}

/// The text inside the first ```` ``` ```` fence (its info string such as `json` dropped), or
/// the whole answer when there is none.
fn unfence(answer: &str) -> &str {
    let Some((_, after)) = answer.split_once("```") else {
        return answer;
    };
    let inside = after.split_once('\n').map_or(after, |(info, rest)| {
        if info.trim().chars().all(|c| c.is_ascii_alphanumeric()) { rest } else { after }
    });
    inside.split_once("```").map_or(inside, |(fenced, _)| fenced)
}

/// `text` (starting with `{`) up to its matching `}`, skipping braces inside strings.
fn balanced_object(text: &str) -> Option<&str> {
    let mut depth = 0usize;
    let mut in_string = false;
    let mut escaped = false;
    for (index, c) in text.char_indices() {
        if in_string {
            match (escaped, c) {
                (true, _) => escaped = false,
                (false, '\\') => escaped = true,
                (false, '"') => in_string = false,
                _ => {}
            }
            continue;
        }
        match c {
            '"' => in_string = true,
            '{' => depth += 1,
            '}' => {
                depth = depth.checked_sub(1)?;
                if depth == 0 {
                    return text.get(..=index);
                }
            }
            _ => {}
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const SCHEMA: [&str; 3] = ["task", "branch", "tests"];

    #[test]
    fn fenced_and_prose_wrapped_objects_parse() {
        for answer in [
            "```json\n{\"task\": \"fix io\"}\n```",
            "```\n{\"task\": \"fix io\"}\n```",
            "Sure! The facts are {\"task\": \"fix io\"} as requested.",
            "{\"task\": \" fix io \", \"branch\": null}",
            "{not json} then {\"task\": \"fix io\"}",
        ] {
            let facts = parse_extraction(answer, &SCHEMA).unwrap();
            assert_eq!(facts, BTreeMap::from([("task".into(), "fix io".into())]), "{answer}");
        }
    }

    #[test]
    fn braces_inside_strings_do_not_end_the_object() {
        let facts = parse_extraction(r#"{"task": "write {x} \" }", "tests": 4}"#, &SCHEMA).unwrap();
        assert_eq!(facts["task"], "write {x} \" }");
        assert_eq!(facts["tests"], "4");
    }

    #[test]
    fn numbers_and_booleans_become_text_and_empty_values_mean_unknown() {
        let facts =
            parse_extraction(r#"{"tests": 2.5, "branch": true, "task": "null"}"#, &SCHEMA).unwrap();
        assert_eq!(facts.get("tests").map(String::as_str), Some("2.5"));
        assert_eq!(facts.get("branch").map(String::as_str), Some("true"));
        assert!(!facts.contains_key("task"));
        assert!(parse_extraction(r#"{"task": ""}"#, &SCHEMA).unwrap().is_empty());
    }

    #[test]
    fn undeclared_keys_and_nested_values_are_rejected() {
        assert!(matches!(
            parse_extraction(r#"{"task": "a", "secret": "b"}"#, &SCHEMA),
            Err(LlmError::UndeclaredKey(key)) if key == "secret"
        ));
        assert!(matches!(
            parse_extraction(r#"{"tests": [1, 2]}"#, &SCHEMA),
            Err(LlmError::BadValue { found: "array", .. })
        ));
        assert!(matches!(
            parse_extraction(r#"{"tests": {"n": 1}}"#, &SCHEMA),
            Err(LlmError::BadValue { found: "object", .. })
        ));
    }

    #[test]
    fn text_without_an_object_is_not_json() {
        for answer in
            ["The task is fixing io.", "{\"task\": \"unterminated", "{task: fix}", "[1]", ""]
        {
            assert!(
                matches!(parse_extraction(answer, &SCHEMA), Err(LlmError::NotJson(_))),
                "{answer}"
            );
        }
    }

    proptest! {
        #[test]
        fn parsing_never_panics(answer in ".{0,200}") {
            let _ = parse_extraction(&answer, &SCHEMA);
        }

        #[test]
        fn any_string_values_round_trip(task in "[^`]{0,40}", branch in "[a-z/-]{1,20}") {
            let answer = serde_json::json!({"task": task, "branch": branch}).to_string();
            let facts = parse_extraction(&format!("```json\n{answer}\n```"), &SCHEMA).unwrap();
            let task = task.trim();
            if task.is_empty() || task.eq_ignore_ascii_case("null") {
                prop_assert!(!facts.contains_key("task"));
            } else {
                prop_assert_eq!(facts.get("task").map(String::as_str), Some(task));
            }
            prop_assert_eq!(facts.get("branch").map(String::as_str), Some(branch.as_str()));
        }
    }
}
