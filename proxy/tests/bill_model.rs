//! The bill bench's model, in the normal test run: the cache models bill known sequences as
//! computed by hand, the session generator is deterministic and keeps its promises (every
//! `Edit` quotes an earlier `Read`), the validator refuses what the real APIs refuse, and a
//! short session runs direct through the fake upstream with no refusal. The modules are the
//! bench's own (`benches/bill/`), compiled here as well.
#![allow(dead_code)]

#[path = "../benches/bill/cache.rs"]
mod cache;
#[path = "../benches/bill/client.rs"]
mod client;
#[path = "../benches/bill/conversation.rs"]
mod conversation;
#[path = "../benches/bill/png.rs"]
mod png;
#[path = "../benches/bill/rng.rs"]
mod rng;
#[path = "../benches/bill/session.rs"]
mod session;
#[path = "../benches/bill/text.rs"]
mod text;
#[path = "../benches/bill/tokens.rs"]
mod tokens;
#[path = "../benches/bill/upstream.rs"]
mod upstream;
#[path = "../benches/bill/validate.rs"]
mod validate;

use std::sync::Arc;

use base64::Engine;
use cache::{AnthropicCache, CACHE_TTL_MS, OpenAiCache, Usage};
use client::{Trim, Wire};
use conversation::Conversation;
use rng::Rng;
use serde_json::{Value, json};
use session::Session;
use tokens::{Layout, Unit};

fn layout(blocks: &[(u64, u32, bool)], messages_start: usize) -> Layout {
    Layout {
        units: blocks
            .iter()
            .map(|&(hash, tokens, breakpoint)| Unit { hash, tokens, breakpoint })
            .collect(),
        messages_start,
    }
}

/// A hand-computed sequence: tools (1,000) and system (500, breakpoint), then messages
/// with the breakpoint on the newest block.
#[test]
fn anthropic_bills_a_known_sequence() {
    let mut cache = AnthropicCache::default();
    // 1: nothing cached; both breakpoints (1,500 and 1,700 tokens) are written.
    let r1 = layout(&[(1, 1_000, false), (2, 500, true), (3, 200, true)], 2);
    assert_eq!(
        cache.bill(&r1, 0),
        Usage { input: 0, cache_write: 1_700, cache_read: 0, reads_messages: false }
    );
    // 2: one minute later, two more blocks; the moving breakpoint finds the old one 2 back.
    let r2 = layout(
        &[(1, 1_000, false), (2, 500, true), (3, 200, false), (4, 300, false), (5, 100, true)],
        2,
    );
    assert_eq!(
        cache.bill(&r2, 60_000),
        Usage { input: 0, cache_write: 400, cache_read: 1_700, reads_messages: true }
    );
    assert!((cache.bill(&r2, 61_000).bill(true) - 210.0).abs() < 1e-9, "2,100 read × 0.1");
    // 3: the system changes: nothing is read (the tools carry no breakpoint of their own).
    let r3 = layout(
        &[(1, 1_000, false), (9, 500, true), (3, 200, false), (4, 300, false), (5, 100, true)],
        2,
    );
    assert_eq!(
        cache.bill(&r3, 62_000),
        Usage { input: 0, cache_write: 2_100, cache_read: 0, reads_messages: false }
    );
    // 4: six minutes after r3's last use: expired, written again.
    assert_eq!(
        cache.bill(&r3, 62_000 + 360_000),
        Usage { input: 0, cache_write: 2_100, cache_read: 0, reads_messages: false }
    );
    // 5: 25 new blocks: the old breakpoint is out of the lookback; the system one still hits.
    let mut blocks =
        vec![(1, 1_000, false), (9, 500, true), (3, 200, false), (4, 300, false), (5, 100, false)];
    blocks.extend((100..125).map(|h| (h, 10, false)));
    blocks.last_mut().unwrap().2 = true;
    let r5 = layout(&blocks, 2);
    assert_eq!(
        cache.bill(&r5, 430_000),
        Usage { input: 0, cache_write: 850, cache_read: 1_500, reads_messages: false }
    );
}

#[test]
fn anthropic_keeps_the_system_prefix_warm_while_longer_prefixes_are_read() {
    let mut cache = AnthropicCache::default();
    let mut blocks = vec![(1, 2_000, false), (2, 500, true)];
    for n in 0..10u64 {
        blocks.iter_mut().skip(2).for_each(|b| b.2 = false);
        blocks.push((100 + n, 100, true));
        // A request every two minutes: 20 minutes of message-level hits.
        let usage = cache.bill(&layout(&blocks, 2), n * 120_000);
        assert_eq!(usage.cache_read, if n == 0 { 0 } else { 2_500 + 100 * n });
    }
    // The conversation is rewritten after the system prompt: the system prefix is still warm.
    let changed = layout(&[(1, 2_000, false), (2, 500, true), (999, 100, true)], 2);
    assert_eq!(cache.bill(&changed, 10 * 120_000).cache_read, 2_500);
}

#[test]
fn anthropic_does_not_cache_under_1024_tokens_and_bills_after_the_last_breakpoint_at_1x() {
    let mut cache = AnthropicCache::default();
    let small = layout(&[(1, 600, true), (2, 300, true), (3, 50, false)], 1);
    assert_eq!(
        cache.bill(&small, 0),
        Usage { input: 950, cache_write: 0, cache_read: 0, reads_messages: false }
    );
    assert_eq!(
        cache.bill(&small, 1),
        Usage { input: 950, cache_write: 0, cache_read: 0, reads_messages: false }
    );
}

#[test]
fn openai_reads_the_longest_cached_prefix_in_128_token_steps() {
    let mut cache = OpenAiCache::default();
    let r1 = layout(&[(1, 900, false), (2, 100, false), (3, 250, false)], 1);
    assert_eq!(
        cache.bill(&r1, 0),
        Usage { input: 1_250, cache_write: 0, cache_read: 0, reads_messages: false }
    );
    let r2 = layout(&[(1, 900, false), (2, 100, false), (3, 250, false), (4, 40, false)], 1);
    // 1,250 cached → 1,024 + 1 × 128.
    assert_eq!(
        cache.bill(&r2, 1_000),
        Usage { input: 138, cache_write: 0, cache_read: 1_152, reads_messages: true }
    );
    assert!(
        (Usage { input: 138, cache_write: 0, cache_read: 1_152, reads_messages: true }.bill(false)
            - 714.0)
            .abs()
            < 1e-9
    );
    // A changed second message: only the tools (900 < 1,024) match: nothing cached.
    let r3 = layout(&[(1, 900, false), (7, 100, false), (3, 250, false)], 1);
    assert_eq!(cache.bill(&r3, 2_000).cache_read, 0);
    // Expired.
    assert_eq!(cache.bill(&r2, 2_000 + CACHE_TTL_MS).cache_read, 0);
}

#[test]
fn a_screenshot_reads_back_its_size_and_the_check_catches_a_flipped_byte() {
    let png = png::screenshot(&mut Rng::new(3), 320, 200);
    assert_eq!(png::size(&png), Some((320, 200)));
    let bytes = base64::engine::general_purpose::STANDARD.decode(&png).unwrap();
    assert!(bytes.len() < 20_000, "{} bytes", bytes.len());
    let mut broken = bytes.clone();
    broken[20] ^= 1;
    assert_eq!(png::size(&base64::engine::general_purpose::STANDARD.encode(broken)), None);
    assert_eq!(tokens::anthropic_image(&png), 320 * 200 / 750);
    assert_eq!(tokens::openai_image(&png), 85 + 170);
}

#[test]
fn the_cache_key_ignores_cache_control_and_key_order_but_not_content() {
    let a: Value =
        serde_json::from_str(r#"{"type":"text","text":"x","cache_control":{"type":"ephemeral"}}"#)
            .unwrap();
    let b: Value = serde_json::from_str(r#"{"text":"x","type":"text"}"#).unwrap();
    let c: Value = serde_json::from_str(r#"{"text":"y","type":"text"}"#).unwrap();
    assert_eq!(tokens::content_hash(&a), tokens::content_hash(&b));
    assert_ne!(tokens::content_hash(&b), tokens::content_hash(&c));
}

/// A shorter session (the whole one takes long in a debug build).
fn short() -> Session {
    Session::generate(27, 60)
}

#[test]
fn the_generator_is_deterministic() {
    let (a, b) = (short(), short());
    assert_eq!(a.turns.len(), 60);
    for (x, y) in a.turns.iter().zip(&b.turns) {
        assert_eq!(x.user, y.user);
        assert_eq!(x.answer, y.answer);
        assert_eq!((x.stream, x.at_ms), (y.stream, y.at_ms));
    }
    assert_eq!(a.tools, b.tools);
    let other = Session::generate(28, 60);
    assert_ne!(a.turns[3].answer, other.turns[3].answer);
}

#[test]
fn the_session_has_the_shape_of_a_coding_agent() {
    let s = short();
    let mut kinds = std::collections::HashMap::<String, usize>::new();
    for turn in &s.turns {
        let blocks = turn.answer["content"].as_array().unwrap();
        assert_eq!(blocks[0]["type"], "thinking", "every answer opens with signed thinking");
        assert!(blocks[0]["signature"].as_str().unwrap().len() >= 240);
        let calls = blocks.iter().filter(|b| b["type"] == "tool_use").count();
        assert!(calls <= 3, "{calls} parallel calls");
        for message in [&turn.user, &turn.answer] {
            for block in message["content"].as_array().unwrap() {
                *kinds.entry(block["type"].as_str().unwrap().to_string()).or_default() += 1;
                if block["type"] == "tool_result" && block.get("is_error").is_some() {
                    *kinds.entry("error".into()).or_default() += 1;
                }
                if block["type"] == "tool_result" && block["content"].is_array() {
                    *kinds.entry("image result".into()).or_default() += 1;
                }
            }
        }
    }
    for kind in ["thinking", "tool_use", "tool_result", "error", "text"] {
        assert!(kinds.get(kind).copied().unwrap_or(0) > 0, "no {kind}: {kinds:?}");
    }
    let whole = Session::generate(27, 200);
    let mut kinds_whole = std::collections::HashSet::new();
    for turn in &whole.turns {
        for message in [&turn.user, &turn.answer] {
            for block in message["content"].as_array().unwrap() {
                kinds_whole.insert(block["type"].as_str().unwrap().to_string());
            }
        }
    }
    for kind in ["redacted_thinking", "server_tool_use", "web_search_tool_result", "image"] {
        assert!(kinds_whole.contains(kind), "no {kind} in the whole session");
    }
    let streamed = whole.turns.iter().filter(|t| t.stream).count();
    assert!((40..=80).contains(&streamed), "{streamed} of 200 streamed");
    let pauses = whole.turns.windows(2).filter(|w| w[1].at_ms - w[0].at_ms > CACHE_TTL_MS).count();
    assert!(pauses >= 2, "{pauses} pauses over 5 minutes");
    let wire = Wire::new(Arc::new(Conversation::anthropic(&whole)));
    let last = wire.full_tokens(199);
    assert!((400_000..=600_000).contains(&last), "history at the end: {last} tokens");
    let edits: usize = whole.turns.iter().map(|t| t.edits.len()).sum();
    assert!(edits >= 30, "{edits} Edit calls");
}

#[test]
fn every_edit_quotes_an_earlier_read_verbatim() {
    let s = Session::generate(27, 200);
    let mut reads = std::collections::HashMap::<String, String>::new();
    let mut checked = 0;
    for (k, turn) in s.turns.iter().enumerate() {
        for block in turn.user["content"].as_array().unwrap() {
            if let Some(id) = block["tool_use_id"].as_str()
                && let Some(text) = block["content"].as_str()
            {
                reads.insert(id.to_string(), text::strip_line_numbers(text));
            }
        }
        for edit in &turn.edits {
            let read = reads
                .get(&edit.read_id)
                .unwrap_or_else(|| panic!("step {k}: the Read {} is not earlier", edit.read_id));
            assert!(
                read.contains(&edit.old_string),
                "step {k}: old_string not in its Read:\n{}",
                edit.old_string
            );
            let input = turn.answer["content"].as_array().unwrap().iter().find(|b| {
                b["name"] == "Edit" && b["input"]["old_string"] == edit.old_string.as_str()
            });
            assert!(input.is_some(), "step {k}: the answer carries the Edit");
            checked += 1;
        }
    }
    assert!(checked >= 30, "{checked} Edits checked");
}

fn body(wire: &Wire, k: usize, trim: Trim) -> Value {
    serde_json::from_str(&wire.body(k, trim).0).unwrap()
}

#[test]
fn whole_and_naively_trimmed_requests_validate_and_show_their_edit_targets() {
    let s = short();
    for conversation in [Conversation::anthropic(&s), Conversation::openai(&s)] {
        let emitted = validate::Emitted::of(&conversation);
        let anthropic = conversation.provider == conversation::Provider::Anthropic;
        let wire = Wire::new(Arc::new(conversation));
        let mut counter = tokens::Counter::default();
        for k in 0..wire.conversation.steps.len() {
            for trim in [Trim::Full, Trim::Naive(32_000)] {
                let body = body(&wire, k, trim);
                let checked = if anthropic {
                    validate::anthropic(&body, &emitted)
                } else {
                    validate::openai(&body)
                };
                checked.unwrap_or_else(|e| panic!("step {k} {trim:?}: {e}"));
                let layout =
                    if anthropic { counter.anthropic(&body) } else { counter.openai(&body) };
                if trim == Trim::Full {
                    assert_eq!(
                        layout.tokens(),
                        wire.full_tokens(k),
                        "step {k}: the client counts as the upstream"
                    );
                    let texts = validate::visible_texts(&body);
                    for edit in &wire.conversation.steps[k].edits {
                        assert!(
                            texts.iter().any(|t| t.contains(&edit.old_string)),
                            "step {k}: an Edit target is hidden in the whole history"
                        );
                    }
                } else {
                    assert!(
                        layout.tokens() <= wire.full_tokens(k),
                        "step {k}: the trim adds nothing"
                    );
                }
            }
        }
    }
}

#[test]
fn the_validator_refuses_what_the_api_refuses() {
    let s = short();
    let conversation = Conversation::anthropic(&s);
    let emitted = validate::Emitted::of(&conversation);
    let wire = Wire::new(Arc::new(conversation));
    // A step whose newest user message carries tool results.
    let k = (4..60)
        .find(|&k| {
            !s.turns[k].human
                && s.turns[k - 1].answer["content"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|b| b["type"] == "tool_use")
        })
        .unwrap();
    let good = body(&wire, k, Trim::Full);
    validate::anthropic(&good, &emitted).unwrap();
    let n = good["messages"].as_array().unwrap().len();
    let mut bad = good.clone();
    bad["messages"][n - 2]["content"][0]["signature"] = json!("forged");
    assert!(validate::anthropic(&bad, &emitted).unwrap_err().contains("signature"));
    let mut bad = good.clone();
    bad["messages"][n - 2]["content"].as_array_mut().unwrap().remove(0);
    assert!(
        validate::anthropic(&bad, &emitted).is_err(),
        "the tool loop's thinking block is required"
    );
    let mut bad = good.clone();
    bad["messages"].as_array_mut().unwrap().remove(n - 2);
    assert!(validate::anthropic(&bad, &emitted).is_err(), "orphan results or two user turns");
    let mut bad = good.clone();
    for i in 0..3 {
        bad["messages"][i * 2]["content"].as_array_mut().unwrap().last_mut().unwrap()["cache_control"] =
            json!({"type": "ephemeral"});
    }
    assert!(validate::anthropic(&bad, &emitted).unwrap_err().contains("cache_control"));
    let openai = Wire::new(Arc::new(Conversation::openai(&s)));
    let good = body(&openai, k, Trim::Full);
    validate::openai(&good).unwrap();
    let mut bad = good.clone();
    let messages = bad["messages"].as_array_mut().unwrap();
    let tool = messages.iter().position(|m| m["role"] == "tool").unwrap();
    messages.remove(tool);
    assert!(validate::openai(&bad).is_err(), "a call without its result");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_session_runs_direct_without_a_refusal_and_streams_byte_for_byte() {
    let s = Session::generate(27, 30);
    let http = reqwest::Client::new();
    for conversation in [Conversation::anthropic(&s), Conversation::openai(&s)] {
        let wire = Wire::new(Arc::new(conversation));
        let (addr, upstream) = upstream::Upstream::start(vec![wire.conversation.clone()], 0).await;
        let steps: Vec<usize> = (0..30).collect();
        let sent =
            client::run(&http, &format!("http://{addr}"), &wire, 0, &steps, Trim::Full, &upstream)
                .await;
        for s in &sent {
            assert_eq!(s.status, 200, "step {}: {:?}", s.step, s.error);
            assert!(s.answer_ok, "step {}: the scripted answer", s.step);
            assert_eq!(s.stream, s.stream_identical, "step {}", s.step);
        }
        let records = upstream.records();
        assert!(records.iter().all(|r| r.hidden == 0));
        let reads = records.iter().filter(|r| r.usage.reads_messages).count();
        assert!(reads >= 25, "{reads} of 30 requests read the messages from the cache");
        assert_eq!(records[0].usage.cache_read, 0);
    }
}
