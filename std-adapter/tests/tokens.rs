//! Exact counting, chat framing and calibration against real tokenizers.
//!
//! `fixtures/tokens-sample.jsonl` holds 52 messages of every content type from the estimator
//! corpus with their exact `cl100k_base` and SmolLM2 counts (computed with tiktoken and the
//! Python `tokenizers` package when the corpus was built).

use std::path::{Path, PathBuf};
use std::time::Instant;

use ctxwin_core::estimator::{Estimator, Margin, Weights};
use ctxwin_core::{
    Config, ContextManager, Message, PayloadItem, TinyCapacities, counter::TokenCounter,
};
use ctxwin_std::tokens::{
    CHATML_ROLES, Calibrator, ChatFraming, ExactCounter, TokenizerError, render_chatml,
};

#[derive(serde::Deserialize)]
struct Sample {
    #[serde(rename = "type")]
    kind: String,
    text: String,
    cl100k: u32,
    smollm2: u32,
}

fn samples() -> Vec<Sample> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tokens-sample.jsonl");
    let text = std::fs::read_to_string(path).unwrap();
    text.lines().map(|line| serde_json::from_str(line).unwrap()).collect()
}

fn asset(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("assets").join(name)
}

#[test]
fn cl100k_counts_known_strings() {
    let counter = ExactCounter::cl100k().unwrap();
    assert_eq!(counter.count(""), 0);
    assert_eq!(counter.count("hello world"), 2);
    assert_eq!(counter.count("Hello, world!"), 4);
    assert_eq!(counter.count("tiktoken is great!"), 6);
    assert_eq!(counter.count("1234567"), 3); // digits in groups of three
    // Special-token text counts as the one token it names; nothing is added around it.
    assert_eq!(counter.count("<|endoftext|>"), 1);
}

#[test]
fn cl100k_reproduces_the_corpus_counts() {
    let samples = samples();
    assert!(samples.len() >= 50);
    let counter = ExactCounter::cl100k().unwrap();
    for sample in &samples {
        assert_eq!(
            counter.count(&sample.text),
            sample.cl100k,
            "{}: {:?}",
            sample.kind,
            sample.text
        );
    }
}

#[test]
fn smollm2_reproduces_the_corpus_counts() {
    let counter = ExactCounter::smollm2().unwrap();
    assert_eq!(counter.count("2026"), 4); // digits one by one
    for sample in samples() {
        assert_eq!(
            counter.count(&sample.text),
            sample.smollm2,
            "{}: {:?}",
            sample.kind,
            sample.text
        );
    }
}

#[test]
fn from_file_reads_gzip_and_plain_json() {
    let gz = asset("smollm2-135m.tokenizer.json.gz");
    let from_gz = ExactCounter::from_file(&gz).unwrap();
    assert_eq!(from_gz.path(), gz);

    let dir = tempfile::tempdir().unwrap();
    let plain = dir.path().join("tokenizer.json");
    let mut json = Vec::new();
    std::io::Read::read_to_end(
        &mut flate2::read::GzDecoder::new(std::fs::File::open(&gz).unwrap()),
        &mut json,
    )
    .unwrap();
    std::fs::write(&plain, &json).unwrap();
    let from_plain = ExactCounter::from_file(&plain).unwrap();

    let embedded = ExactCounter::smollm2().unwrap();
    for sample in samples().iter().take(10) {
        let expected = embedded.count(&sample.text);
        assert_eq!(from_gz.count(&sample.text), expected);
        assert_eq!(from_plain.count(&sample.text), expected);
    }
}

#[test]
fn load_errors_name_the_file_and_the_problem() {
    let dir = tempfile::tempdir().unwrap();

    let missing = dir.path().join("missing.json");
    let error = ExactCounter::from_file(&missing).unwrap_err();
    assert!(matches!(&error, TokenizerError::Read { path, .. } if *path == missing), "{error}");
    assert!(error.to_string().contains("missing.json"));

    let cases = [
        ("empty.json", &b""[..], "EOF"),
        ("truncated.json", &b"{\"version\": \"1.0\", \"model\": {"[..], "EOF"),
        ("not-a-tokenizer.json", &b"{\"hello\": 1}"[..], "line 1 column"),
        ("garbage.json", &b"\x00\x01binary"[..], "expected value"),
    ];
    for (name, bytes, detail) in cases {
        let path = dir.path().join(name);
        std::fs::write(&path, bytes).unwrap();
        let error = ExactCounter::from_file(&path).unwrap_err();
        assert!(matches!(error, TokenizerError::Parse { .. }), "{name}: {error}");
        let message = error.to_string();
        assert!(message.contains(name) && message.contains(detail), "{message}");
    }

    let bad_gz = dir.path().join("bad.json.gz");
    std::fs::write(&bad_gz, [0x1f, 0x8b, 0x08, 0x00, 0xde, 0xad]).unwrap();
    let error = ExactCounter::from_file(&bad_gz).unwrap_err();
    assert!(matches!(error, TokenizerError::Decompress { .. }), "{error}");

    let error = ExactCounter::from_file(dir.path()).unwrap_err();
    assert!(matches!(error, TokenizerError::Read { .. }), "{error}");
}

#[test]
fn cache_counts_hits_and_misses() {
    let counter = ExactCounter::cl100k().unwrap();
    let samples = samples();
    for sample in &samples {
        counter.count(&sample.text);
    }
    let first = counter.cache_stats();
    assert_eq!(first.misses, samples.len() as u64);
    assert_eq!(first.hits, 0);
    assert_eq!(first.entries, samples.len());
    for sample in &samples {
        assert_eq!(counter.count(&sample.text), sample.cl100k);
    }
    let second = counter.cache_stats();
    assert_eq!((second.hits, second.misses), (samples.len() as u64, samples.len() as u64));
    assert_eq!(second.hit_rate(), Some(0.5));

    let small = counter.clone().with_cache_capacity(4);
    for sample in &samples {
        small.count(&sample.text);
    }
    assert!(small.cache_stats().entries <= 4);
}

#[test]
fn counter_is_send_and_sync_and_counts_across_threads() {
    fn assert_send_sync<T: Send + Sync + 'static>() {}
    assert_send_sync::<ExactCounter>();
    assert_send_sync::<Calibrator>();

    let counter = ExactCounter::cl100k().unwrap();
    let samples = samples();
    std::thread::scope(|scope| {
        for _ in 0..2 {
            scope.spawn(|| {
                for sample in &samples {
                    assert_eq!(counter.count(&sample.text), sample.cl100k);
                }
            });
        }
    });
    assert_eq!(counter.cache_stats().lookups(), 2 * samples.len() as u64);
}

/// Contents that start with a non-whitespace character, so the newline after the role never
/// merges with them.
fn simple_contents() -> Vec<String> {
    let mut contents: Vec<String> = [
        "You are a helpful assistant.",
        "What is the capital of France?",
        "Paris.",
        "Run `cargo test` and tell me what fails.",
        "{\"ok\": true, \"passed\": 42}",
        "東京は日本の首都です。",
    ]
    .map(String::from)
    .to_vec();
    contents.extend(
        samples()
            .into_iter()
            .map(|sample| sample.text)
            .filter(|text| text.chars().next().is_some_and(|c| !c.is_whitespace())),
    );
    contents
}

#[test]
fn chatml_overhead_matches_the_rendered_conversation_exactly() {
    let counter = ExactCounter::smollm2().unwrap();
    let framing = ChatFraming::chatml(&counter);
    assert_eq!(framing, ChatFraming::new(6, 4)); // "assistant" is two tokens

    let contents = simple_contents();
    assert!(contents.len() > 40);
    let messages: Vec<(&str, &str)> = contents
        .iter()
        .enumerate()
        .map(|(i, text)| (CHATML_ROLES[i % CHATML_ROLES.len()], text.as_str()))
        .collect();
    for end in [1, 2, 3, 5, messages.len()] {
        let conversation = &messages[..end];
        let rendered = counter.count(&render_chatml(conversation.iter().copied(), true));
        let exact: u32 = conversation
            .iter()
            .map(|(role, text)| {
                counter.count(text) + ChatFraming::chatml_message_tokens(&counter, role)
            })
            .sum::<u32>()
            + u32::from(framing.request);
        assert_eq!(rendered, exact, "first {end} messages");
        // The single per-message overhead errs high by one token per non-assistant message.
        let cheaper = conversation.iter().filter(|(role, _)| *role != "assistant").count() as u32;
        let predicted =
            framing.count_messages(&counter, conversation.iter().map(|(_, text)| *text));
        assert_eq!(predicted, rendered + cheaper, "first {end} messages");
    }
}

#[test]
fn manager_payload_tokens_match_the_rendered_chatml_tokens() {
    let counter = ExactCounter::smollm2().unwrap();
    let config = ChatFraming::chatml(&counter).apply(Config::DEFAULT);
    let mut manager = ContextManager::<TinyCapacities>::builder()
        .config(config)
        .counter(counter.clone())
        .build()
        .unwrap();
    let contents = simple_contents();
    manager.push(Message::system(&contents[0])).unwrap();
    for (i, text) in contents.iter().enumerate().skip(1).take(5) {
        let message = if i % 2 == 1 { Message::user(text) } else { Message::assistant(text) };
        manager.push(message).unwrap();
    }
    let dynamic = ["Retrieved: the build has been green since Tuesday."];
    let payload = manager.compose(&dynamic).unwrap();
    let messages: Vec<(&str, &str)> = payload
        .items()
        .map(|item| match item {
            PayloadItem::System(message) | PayloadItem::Message(message) => {
                (message.role().as_str(), message.content())
            }
            PayloadItem::Dynamic(text) => ("system", text),
            other => panic!("unexpected item {other:?}"),
        })
        .collect();
    assert_eq!(messages.len(), 7);
    let cheaper = messages.iter().filter(|(role, _)| *role != "assistant").count() as u32;
    let rendered = counter.count(&render_chatml(messages, true));
    // Exact but for the one token the shared overhead charges non-assistant messages extra.
    assert_eq!(payload.tokens(), rendered + cheaper);
}

#[test]
fn openai_framing_counts_like_the_cookbook() {
    // The cookbook's `num_tokens_from_messages` rule: 3 per message, plus the tokens of every
    // field value (the role is one token), plus 3 for the reply primer.
    let counter = ExactCounter::cl100k().unwrap();
    let contents =
        ["You are a helpful assistant.", "Hello!", "Hi there! How can I help you today?"];
    let content_tokens: u32 = contents.iter().map(|text| counter.count(text)).sum();
    assert_eq!(content_tokens, 6 + 2 + 10);
    assert_eq!(ChatFraming::OPENAI.count_messages(&counter, contents), 18 + 3 * 4 + 3);
}

/// Consecutive samples as the user messages of successive requests.
fn requests(samples: &[Sample], size: usize) -> Vec<Vec<&str>> {
    samples.chunks(size).map(|chunk| chunk.iter().map(|s| s.text.as_str()).collect()).collect()
}

#[test]
fn calibrated_budget_keeps_real_smollm2_payloads_under_the_window() {
    // What a llama.cpp server running SmolLM2 bills: the rendered ChatML prompt.
    let smollm2 = ExactCounter::smollm2().unwrap();
    let framing = ChatFraming::chatml(&smollm2);
    let billed = |request: &[&str]| {
        smollm2.count(&render_chatml(request.iter().map(|text| ("user", *text)), true))
    };
    let samples = samples();
    let requests = requests(&samples, 4);

    // The cl100k-weighted estimator undercounts SmolLM2 (its digits and non-English text
    // cost more tokens): uncalibrated, a payload estimated right at the budget can be rejected.
    let estimator = Estimator::with(Weights::CL100K, Margin::SAFE);
    let mut calibrator = Calibrator::new();
    let window = 4_096u32;
    for request in &requests {
        let estimated = framing.count_messages(&estimator, request.iter().copied());
        calibrator.observe(estimated, billed(request)).unwrap();
        let budget = calibrator.recommended_budget(window);
        // Every recent request, scaled to an estimate of `budget`, still fits the window.
        for observation in calibrator.recent() {
            let scaled_actual = u64::from(budget) * u64::from(observation.actual)
                / u64::from(observation.estimated);
            assert!(scaled_actual <= u64::from(window), "{observation:?} budget {budget}");
        }
    }
    assert!(calibrator.recent().any(|o| o.actual > o.estimated), "no underestimate seen");
    assert!(calibrator.recommended_budget(window) < window);

    // Exact counts with the measured framing err high by at most a token per message.
    let mut exact = Calibrator::new();
    for request in &requests {
        let estimated = framing.count_messages(&smollm2, request.iter().copied());
        let actual = billed(request);
        assert!(estimated >= actual && estimated <= actual + request.len() as u32 + 1);
        exact.observe(estimated, actual).unwrap();
    }
    let ratio = exact.ratio().unwrap();
    assert!(ratio > 0.95 && ratio <= 1.0, "{ratio}");
    assert!(exact.recommended_budget(10_200) >= 10_000);
}

/// Exact-counting throughput over a corpus of JSON lines with a `text` field (the estimator
/// corpus), uncached. Prints, asserts nothing about speed:
///
/// `CTXWIN_TOKEN_CORPUS=path/to/estimator-corpus.jsonl cargo test --release -p ctxwin-std
/// --test tokens -- --ignored --nocapture throughput`
#[test]
#[ignore = "measurement: needs CTXWIN_TOKEN_CORPUS and a release build"]
fn throughput() {
    let Some(path) = std::env::var_os("CTXWIN_TOKEN_CORPUS") else {
        eprintln!("set CTXWIN_TOKEN_CORPUS to a JSONL file with a `text` field per line");
        return;
    };
    let corpus = std::fs::read_to_string(path).unwrap();
    let texts: Vec<String> = corpus
        .lines()
        .map(|line| serde_json::from_str::<serde_json::Value>(line).unwrap())
        .filter_map(|value| value["text"].as_str().map(String::from))
        .collect();
    let bytes: usize = texts.iter().map(String::len).sum();
    let mb = bytes as f64 / 1e6;
    println!("corpus: {} messages, {mb:.2} MB", texts.len());

    for (name, load) in [
        ("cl100k", ExactCounter::cl100k as fn() -> Result<ExactCounter, TokenizerError>),
        ("smollm2", ExactCounter::smollm2),
    ] {
        let started = Instant::now();
        let counter = load().unwrap();
        let loaded = started.elapsed();
        let started = Instant::now();
        let tokens: u64 = texts.iter().map(|text| u64::from(counter.count(text))).sum();
        let cold = started.elapsed().as_secs_f64();
        let started = Instant::now();
        let again: u64 = texts.iter().map(|text| u64::from(counter.count(text))).sum();
        let warm = started.elapsed().as_secs_f64();
        assert_eq!(tokens, again);
        println!(
            "{name}: load {:.0} ms; {tokens} tokens; uncached {:.2} MB/s, {:.0} tokens/s; \
             cached {:.0} MB/s",
            loaded.as_secs_f64() * 1e3,
            mb / cold,
            tokens as f64 / cold,
            mb / warm,
        );
    }
    let estimator = Estimator::new();
    let started = Instant::now();
    let estimated: u64 = texts.iter().map(|text| u64::from(estimator.count(text))).sum();
    let seconds = started.elapsed().as_secs_f64();
    println!("estimator: {estimated} tokens, {:.0} MB/s", mb / seconds);
}
