//! The conversation's unit tests (private fields: what it recorded, its writer).

use serde_json::{Value, json};

use super::*;
use crate::assemble::Answer;
use crate::wire::Request;
use ctxwin_std::ChatMessage;
use ctxwin_std::core::{Level, Role};
use ctxwin_std::store::ArchiveStore;

fn request(messages: &[Value]) -> Request {
    let body = json!({"model": "m", "messages": messages}).to_string();
    Request::parse(Provider::OpenAi, body.as_bytes()).unwrap()
}

fn turn(conv: &mut Conv, messages: &[Value]) -> String {
    let request = request(messages);
    let hashes = crate::wire::raw_hashes(&request);
    assert!(matches!(conv.ingest(&request, &hashes).unwrap(), Ingest::Extended { .. }));
    String::from_utf8(conv.compose(&request).unwrap().body).unwrap()
}

#[test]
fn a_reduced_tool_output_of_text_blocks_is_sent_reduced() {
    let dir = tempfile::tempdir().unwrap();
    let store = prepare_state(dir.path(), false).unwrap();
    let limited =
        ConvSettings { observation_limit: Some(1_000), ..ConvSettings::new(32_768, 1_024) };
    let long: String = (0..800).map(|i| format!("line {i} of the build log\n")).collect();
    let blocks = json!([{"type": "text", "text": long}, {"type": "text", "text": "exit 1", "cache_control": {"type": "ephemeral"}}]);
    // OpenAI: a tool message whose content is an array of text parts.
    let mut conv = Conv::open(dir.path(), &store, "o", Provider::OpenAi, &limited).unwrap();
    let messages = [
        json!({"role": "user", "content": "build it"}),
        json!({"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "build", "arguments": "{}"}}]}),
        json!({"role": "tool", "tool_call_id": "c1", "content": blocks}),
    ];
    let body: Value = serde_json::from_str(&turn(&mut conv, &messages)).unwrap();
    let content = &body["messages"][2]["content"];
    let sent = content[0]["text"].as_str().unwrap();
    assert!(sent.len() < long.len() / 2, "sent {} of {} bytes", sent.len(), long.len());
    assert_eq!(content.as_array().unwrap().len(), 1);
    assert_eq!(content[0]["cache_control"], json!({"type": "ephemeral"}));
    // Anthropic: a tool_result block whose content is an array of text blocks.
    let mut conv = Conv::open(dir.path(), &store, "a", Provider::Anthropic, &limited).unwrap();
    let messages = [
        json!({"role": "user", "content": "build it"}),
        json!({"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "build", "input": {}}]}),
        json!({"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": blocks}]}),
    ];
    let body = {
        let body = json!({"model": "m", "max_tokens": 100, "messages": messages}).to_string();
        let request = Request::parse(Provider::Anthropic, body.as_bytes()).unwrap();
        let hashes = crate::wire::raw_hashes(&request);
        conv.ingest(&request, &hashes).unwrap();
        String::from_utf8(conv.compose(&request).unwrap().body).unwrap()
    };
    let body: Value = serde_json::from_str(&body).unwrap();
    let content = &body["messages"][2]["content"][0]["content"];
    let sent = content[0]["text"].as_str().unwrap();
    assert!(sent.len() < long.len() / 2, "sent {} of {} bytes", sent.len(), long.len());
    assert_eq!(content[0]["cache_control"], json!({"type": "ephemeral"}));
}

#[test]
fn persisted_keys_name_every_conversation_with_something_stored() {
    let dir = tempfile::tempdir().unwrap();
    let store = prepare_state(dir.path(), false).unwrap();
    let messages = [json!({"role": "user", "content": "Is the build green?"})];
    // Checkpointed: archive rows and a checkpoint.
    let mut saved =
        Conv::create(dir.path(), &store, "saved", Provider::OpenAi, &ConvSettings::new(8_192, 512))
            .unwrap();
    turn(&mut saved, &messages);
    saved.checkpoint().unwrap();
    // Never checkpointed: archive rows only (as after a crash).
    let mut crashed = Conv::create(
        dir.path(),
        &store,
        "crashed",
        Provider::OpenAi,
        &ConvSettings::new(8_192, 512),
    )
    .unwrap();
    turn(&mut crashed, &messages);
    crashed.session.sync_archive().unwrap();
    // Created, nothing pushed: nothing stored.
    let idle =
        Conv::create(dir.path(), &store, "idle", Provider::OpenAi, &ConvSettings::new(8_192, 512))
            .unwrap();
    drop((saved, crashed, idle));
    // A later generation's rows, and rows a restore set aside, count for their key.
    let row = |text: &str| {
        ctxwin_std::store::ArchivedMessage::new(1, 1, ChatMessage::text(Role::User, text))
    };
    let archive = store.local().unwrap().archive.clone();
    let local = ctxwin_std::store::Scope::local;
    let none = ctxwin_std::store::Fence::NONE;
    archive.put(&local("next#1"), none, &[row("a")]).unwrap();
    archive.put(&local("aside@rewound-1"), none, &[row("b")]).unwrap();
    let mut keys: Vec<String> = persisted_keys(&store).unwrap().into_iter().collect();
    keys.sort();
    assert_eq!(keys, ["aside", "crashed", "next", "saved"]);
    // A created conversation's checkpoint opens like any other.
    let reopened =
        Conv::open(dir.path(), &store, "saved", Provider::OpenAi, &ConvSettings::new(1_024, 512))
            .unwrap();
    assert_eq!(reopened.len(), 1);
    assert_eq!(reopened.session().manager().config().context_window, 8_192);
}

#[test]
fn a_waiting_answer_is_stored_as_the_clients_copy_or_dropped_when_superseded() {
    let dir = tempfile::tempdir().unwrap();
    let store = prepare_state(dir.path(), false).unwrap();
    let mut conv =
        Conv::open(dir.path(), &store, "w", Provider::OpenAi, &ConvSettings::new(8_192, 512))
            .unwrap();
    let rows = |conv: &mut Conv| {
        conv.session.sync_archive().unwrap();
        conv.session().archive().unwrap().usage(conv.session.scope()).unwrap().messages
    };
    let mut messages = vec![json!({"role": "user", "content": "Is the build green?"})];
    turn(&mut conv, &messages);
    let answer = json!({"role": "assistant", "content": "Yes, all 42 tests pass."});
    let reply = Answer { message: answer.clone(), prompt_tokens: None, billed: Default::default() };
    conv.record_answer(&reply, 0).unwrap();
    assert_eq!((rows(&mut conv), conv.len()), (1, 1), "the answer waits for the next request");
    // Retried or regenerated: the same request again, a hundred times. The answers nobody
    // kept are dropped; nothing grows.
    for _ in 0..100 {
        turn(&mut conv, &messages);
        conv.record_answer(&reply, 0).unwrap();
    }
    assert_eq!((rows(&mut conv), conv.len()), (1, 1));
    // Kept in the checkpoint: the reopened conversation still has it waiting.
    conv.checkpoint().unwrap();
    drop(conv);
    let mut conv =
        Conv::open(dir.path(), &store, "w", Provider::OpenAi, &ConvSettings::new(8_192, 512))
            .unwrap();
    assert_eq!(conv.pending_answer, Some(answer));
    // The client echoes it (its library adds a field) with the next question: one row each,
    // the answer as the client sent it.
    messages
        .push(json!({"role": "assistant", "content": "Yes, all 42 tests pass.", "refusal": null}));
    messages.push(json!({"role": "user", "content": "Deploy it."}));
    turn(&mut conv, &messages);
    assert_eq!((rows(&mut conv), conv.len()), (3, 3));
    assert_eq!(conv.pending_answer, None);
}

/// Settings with retrieval on (the proxy's default is off), its block free to take the
/// whole room: a 2,048-token window's tenth holds one or two turns.
pub(crate) fn retrieving(window: u32, reserve: u32) -> ConvSettings {
    let retrieval = ctxwin_std::session::RetrievalSettings {
        auto: true,
        max_share_percent: 100,
        ..crate::config::RETRIEVAL
    };
    ConvSettings { retrieval, recall: true, ..ConvSettings::new(window, reserve) }
}

#[test]
fn retrieval_starts_with_the_first_eviction() {
    let dir = tempfile::tempdir().unwrap();
    let store = prepare_state(dir.path(), false).unwrap();
    let settings = retrieving(2_048, 256);
    let mut conv = Conv::open(dir.path(), &store, "t", Provider::OpenAi, &settings).unwrap();
    assert_eq!(
        conv.writer.as_ref().unwrap().inner().cache_kib().unwrap(),
        u64::from(ARCHIVE_CACHE_KIB)
    );
    let mut messages = vec![
        json!({"role": "user", "content": "The staging database runs Postgres 16."}),
        json!({"role": "assistant", "content": "Noted."}),
    ];
    turn(&mut conv, &messages);
    assert!(!conv.evicted_any, "nothing has left the core");
    let mut n = 0;
    while !conv.evicted_any {
        n += 1;
        assert!(n < 200, "the fact never left the window");
        messages.push(json!({"role": "user", "content": format!("Filler turn {n}: list the open pull requests, the failing jobs and who owns each of them.")}));
        messages.push(json!({"role": "assistant", "content": format!("Reply {n}: three pull requests are open and one job fails.")}));
        turn(&mut conv, &messages);
    }
    // The block retrieved at that compaction stays, byte for byte, until the next one: the
    // question asked now is answered from the archive from then on.
    let question = "Which Postgres version does staging run?";
    messages.push(json!({"role": "user", "content": question}));
    let first = turn(&mut conv, &messages);
    assert!(first.contains("Retrieved from archive"), "{first}");
    let frozen = |body: &str| body.split("\"},{").next().unwrap_or_default().to_string();
    let mut body = first.clone();
    while frozen(&body) == frozen(&first) {
        n += 1;
        assert!(n < 400, "no second compaction");
        messages.push(json!({"role": "assistant", "content": format!("Reply {n}: checking.")}));
        messages.push(json!({"role": "user", "content": format!("{question} ({n})")}));
        body = turn(&mut conv, &messages);
        assert!(body.contains("Retrieved from archive"), "{body}");
    }
    assert!(body.contains("runs Postgres 16"), "{body}");
    // Reopened from its checkpoint, it still knows that something left.
    conv.checkpoint().unwrap();
    drop(conv);
    let conv =
        Conv::open(dir.path(), &store, "t", Provider::OpenAi, &ConvSettings::new(2_048, 256))
            .unwrap();
    assert!(conv.evicted_any);
}

#[test]
fn detected_tasks_are_summarized_and_reported_once() {
    let dir = tempfile::tempdir().unwrap();
    let store = prepare_state(dir.path(), false).unwrap();
    let settings = ConvSettings {
        task_detection: ctxwin_std::session::TaskDetection::NewRequest,
        ..ConvSettings::new(32_768, 1_024)
    };
    let mut conv = Conv::open(dir.path(), &store, "t", Provider::OpenAi, &settings).unwrap();
    let mut messages = vec![
        json!({"role": "user", "content": "Fix the failing test in tests/io.rs"}),
        json!({"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "run", "arguments": "{\"cmd\":\"cargo test\"}"}}]}),
        json!({"role": "tool", "tool_call_id": "c1", "content": "error[E0425]: cannot find value `x` in src/reader.rs"}),
        json!({"role": "assistant", "content": "Decided to declare x in src/reader.rs; the test passes."}),
    ];
    turn(&mut conv, &messages);
    assert_eq!(conv.session.tasks().len(), 1);
    messages.push(json!({"role": "user", "content": "Now bump the version to 1.4.2"}));
    let request = request(&messages);
    let hashes = crate::wire::raw_hashes(&request);
    conv.ingest(&request, &hashes).unwrap();
    let composed = conv.compose(&request).unwrap();
    assert_eq!(composed.tasks_finished.len(), 1, "the first task finished when the second began");
    assert!(composed.tasks_finished[0] > 0.0);
    let body = String::from_utf8(composed.body).unwrap();
    assert!(body.contains("Task 1: Fix the failing test in tests/io.rs"), "{body}");
    assert!(conv.compose(&request).unwrap().tasks_finished.is_empty(), "reported once");
}

/// The retrieved block of an OpenAI body: its first message's content when that is the
/// proxy's system message.
fn retrieved_block(body: &str) -> Option<String> {
    let body: Value = serde_json::from_str(body).unwrap();
    let first = body["messages"][0]["content"].as_str()?;
    first.contains("Retrieved from archive").then(|| first.to_string())
}

#[test]
fn the_retrieved_block_is_renewed_only_at_a_compaction_for_a_new_request() {
    let dir = tempfile::tempdir().unwrap();
    let store = prepare_state(dir.path(), false).unwrap();
    let settings = retrieving(2_048, 256);
    let mut conv = Conv::open(dir.path(), &store, "r", Provider::OpenAi, &settings).unwrap();
    // Something left the window: the cached prefix is rewritten from there anyway.
    let compactions = |conv: &Conv| conv.session().manager().stats().counters.units_evicted;
    let mut messages = vec![
        json!({"role": "user", "content": "The staging database runs Postgres 16."}),
        json!({"role": "assistant", "content": "Noted."}),
        json!({"role": "user", "content": "The billing service is deployed from the release-7 branch."}),
        json!({"role": "assistant", "content": "Noted too."}),
    ];
    let mut n = 0;
    let call = |messages: &mut Vec<Value>, n: &mut usize| {
        *n += 1;
        let id = format!("c{n}");
        messages.push(json!({"role": "assistant", "content": null, "tool_calls": [{"id": id, "type": "function", "function": {"name": "run", "arguments": format!("{{\"step\":{n}}}")}}]}));
        messages.push(json!({"role": "tool", "tool_call_id": id, "content": format!("step {n}: the job list shows three queued builds, two finished deploys and one flaky integration test.")}));
    };
    // A question, then tool loops (no new user message) until something left and a block
    // came back for it.
    messages.push(json!({"role": "user", "content": "Which Postgres version does staging run?"}));
    let mut body = turn(&mut conv, &messages);
    while retrieved_block(&body).is_none() {
        assert!(n < 300, "nothing was ever retrieved");
        call(&mut messages, &mut n);
        body = turn(&mut conv, &messages);
    }
    let block = retrieved_block(&body).unwrap();
    assert!(block.contains("Postgres 16"), "{block}");
    // More tool loops for the same request, through a compaction: the block stays.
    let before = compactions(&conv);
    while compactions(&conv) == before {
        assert!(n < 600, "no second compaction");
        call(&mut messages, &mut n);
        body = turn(&mut conv, &messages);
        assert_eq!(retrieved_block(&body).as_deref(), Some(block.as_str()), "at step {n}");
    }
    // A new request: no compaction yet, the block stays; the first compaction renews it.
    messages.push(json!({"role": "assistant", "content": "Postgres 16."}));
    messages.push(
        json!({"role": "user", "content": "Which branch is the billing service deployed from?"}),
    );
    let before = compactions(&conv);
    body = turn(&mut conv, &messages);
    while compactions(&conv) == before {
        assert!(n < 900, "no third compaction");
        assert_eq!(retrieved_block(&body).as_deref(), Some(block.as_str()), "at step {n}");
        call(&mut messages, &mut n);
        body = turn(&mut conv, &messages);
    }
    let renewed = retrieved_block(&body).unwrap();
    assert_ne!(renewed, block);
    assert!(renewed.contains("release-7"), "{renewed}");
}

#[test]
fn the_archive_is_searched_only_when_a_new_block_is_retrieved() {
    let dir = tempfile::tempdir().unwrap();
    let store = prepare_state(dir.path(), false).unwrap();
    let settings = retrieving(2_048, 256);
    let mut conv = Conv::open(dir.path(), &store, "s", Provider::OpenAi, &settings).unwrap();
    let compactions = |conv: &Conv| conv.session().manager().stats().counters.units_evicted;
    let mut messages = vec![
        json!({"role": "user", "content": "The staging database runs Postgres 16."}),
        json!({"role": "assistant", "content": "Noted."}),
    ];
    let (mut searched, mut quiet_after_eviction, mut renewals) = (0, 0, 0);
    for n in 0..240 {
        if n % 6 == 0 {
            messages.push(json!({"role": "user", "content": format!("Question {n}: which Postgres version runs on staging, and who owns job {n}?")}));
        } else {
            let id = format!("c{n}");
            messages.push(json!({"role": "assistant", "content": null, "tool_calls": [{"id": id, "type": "function", "function": {"name": "run", "arguments": format!("{{\"step\":{n}}}")}}]}));
            messages.push(json!({"role": "tool", "tool_call_id": id, "content": format!("step {n}: three queued builds, two finished deploys, one flaky test on staging.")}));
        }
        let (searches, evicted) = (conv.session().archive_searches(), compactions(&conv));
        let (had_block, retrieved_for) = (conv.recalled.is_some(), conv.recalled_for);
        turn(&mut conv, &messages);
        let delta = conv.session().archive_searches() - searches;
        let compacted = compactions(&conv) > evicted;
        assert!(delta <= 1, "request {n} searched the archive {delta} times");
        if delta == 1 {
            // Only where the block is renewed: the first after something left, or a
            // compaction for a live request the block was not retrieved for.
            let new_request = conv.recalled_for != retrieved_for;
            assert!(!had_block || (compacted && new_request), "request {n}");
            renewals += 1;
        } else if conv.evicted_any {
            quiet_after_eviction += 1;
        }
        searched += delta;
        if conv.evicted_any {
            assert!(conv.recalled.is_some(), "request {n}: no block after an eviction");
        }
    }
    assert!(renewals >= 2, "the block was renewed {renewals} times");
    assert_eq!(searched, renewals);
    assert!(
        quiet_after_eviction > 4 * renewals,
        "{quiet_after_eviction} requests without a search, {renewals} with one"
    );
}

#[test]
fn a_compaction_cuts_old_tool_outputs_and_never_a_never_cut_tools() {
    let dir = tempfile::tempdir().unwrap();
    let store = prepare_state(dir.path(), false).unwrap();
    let settings = ConvSettings {
        compaction_limit: Some(64),
        never_cut: Arc::from(["read".to_string()]),
        retrieval: ctxwin_std::session::RetrievalSettings {
            auto: false,
            ..crate::config::RETRIEVAL
        },
        recall: false,
        ..ConvSettings::new(32_768, 512)
    };
    let mut conv = Conv::open(dir.path(), &store, "cut", Provider::OpenAi, &settings).unwrap();
    // Small reads, long build logs: cutting the logs makes the room.
    let output = |tool: &str, n: usize| -> String {
        let lines = if tool == "read" { 12 } else { 80 };
        (0..lines).map(|line| format!("{tool} {n} line {line}: src/lib.rs compiled\n")).collect()
    };
    let mut messages = vec![json!({"role": "user", "content": "Fix the build."})];
    let mut body = String::new();
    let mut n = 0;
    // A read and a build log per turn, until the first compaction.
    while conv.session().manager().stats().counters.compactions == 0 {
        assert!(n < 100, "no compaction");
        n += 1;
        for tool in ["read", "build"] {
            let id = format!("{tool}{n}");
            messages.push(json!({"role": "assistant", "content": null, "tool_calls": [{"id": id, "type": "function", "function": {"name": tool, "arguments": "{}"}}]}));
            messages.push(json!({"role": "tool", "tool_call_id": id, "content": output(tool, n)}));
        }
        body = turn(&mut conv, &messages);
    }
    let sent: Value = serde_json::from_str(&body).unwrap();
    let results: Vec<(String, String)> = sent["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "tool")
        .map(|m| {
            (
                m["tool_call_id"].as_str().unwrap().to_string(),
                m["content"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    let cut = |id: &str| {
        results.iter().find(|(i, _)| i == id).map(|(_, c)| c.contains("[Data Truncated]"))
    };
    // The oldest build logs were cut, not dropped; no read ever was; the newest stayed whole.
    assert_eq!(cut("build1"), Some(true), "{results:?}");
    assert!(
        results
            .iter()
            .filter(|(id, _)| id.starts_with("read"))
            .all(|(_, c)| !c.contains("[Data Truncated]"))
    );
    assert_eq!(cut(&format!("build{n}")), Some(false));
    assert_eq!(
        results.iter().find(|(id, _)| id == "read1").map(|(_, c)| c.clone()),
        Some(output("read", 1))
    );
    assert!(conv.session().manager().stats().counters.observations_reduced > 0);
}

#[test]
fn a_file_read_again_is_cut_to_a_note_at_the_next_compaction_only() {
    let dir = tempfile::tempdir().unwrap();
    let store = prepare_state(dir.path(), false).unwrap();
    let settings = ConvSettings { recall: false, ..ConvSettings::new(32_768, 512) };
    assert_eq!(&*settings.supersede, ["Read", "read_file"], "file reads by default");
    let mut conv = Conv::open(dir.path(), &store, "reads", Provider::OpenAi, &settings).unwrap();
    let file = |n: usize| -> String {
        (0..60).map(|line| format!("{line:>6}\tversion {n} of src/lib.rs, line {line}\n")).collect()
    };
    let mut messages = vec![json!({"role": "user", "content": "Fix src/lib.rs."})];
    let (mut before, mut body) = (String::new(), String::new());
    let mut n = 0;
    // The same file read again each turn, until the first compaction.
    while conv.session().manager().stats().counters.compactions == 0 {
        assert!(n < 200, "no compaction");
        n += 1;
        let id = format!("read{n}");
        let arguments = json!({"file_path": "/repo/src/lib.rs"}).to_string();
        messages.push(json!({"role": "assistant", "content": null, "tool_calls": [{"id": id, "type": "function", "function": {"name": "Read", "arguments": arguments}}]}));
        messages.push(json!({"role": "tool", "tool_call_id": id, "content": file(n)}));
        before = std::mem::replace(&mut body, turn(&mut conv, &messages));
    }
    let results = |body: &str| -> Vec<(String, String)> {
        let sent: Value = serde_json::from_str(body).unwrap();
        let messages = sent["messages"].as_array().unwrap().clone();
        messages
            .iter()
            .filter(|m| m["role"] == "tool")
            .map(|m| {
                (m["tool_call_id"].as_str().unwrap().into(), m["content"].as_str().unwrap().into())
            })
            .collect()
    };
    let note = ctxwin_std::core::manager::SUPERSEDED_NOTE;
    // Before the compaction every read went as the client sent it (the cached prefix holds).
    assert!(results(&before).iter().all(|(id, text)| *text == file(id[4..].parse().unwrap())));
    let after = results(&body);
    // The older reads are notes, but for the locked tail's: the newest turns stay as sent.
    let notes = after.iter().take_while(|(_, text)| text == note).count();
    assert!(notes + 4 >= after.len(), "{notes} of {}", after.len());
    assert!(after[notes..].iter().all(|(id, text)| *text == file(id[4..].parse().unwrap())));
    assert_eq!(after.last().map(|(_, text)| text.clone()), Some(file(n)), "the newest stays");
    assert_eq!(conv.session().manager().stats().counters.units_evicted, 0, "cutting made the room");
}

#[test]
fn recalled_text_is_the_archived_whole_within_the_room_and_the_cap() {
    use crate::wire::RecallCall;
    let dir = tempfile::tempdir().unwrap();
    let store = prepare_state(dir.path(), false).unwrap();
    let settings = ConvSettings {
        observation_limit: Some(64),
        recall_tool: true,
        ..ConvSettings::new(32_768, 1_024)
    };
    let mut conv = Conv::open(dir.path(), &store, "r", Provider::OpenAi, &settings).unwrap();
    let long: Vec<String> = (1..=40).map(|i| format!("line {i} of the build log")).collect();
    let messages = [
        json!({"role": "user", "content": "build it"}),
        json!({"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "build", "arguments": "{}"}}]}),
        json!({"role": "tool", "tool_call_id": "c1", "content": long.join("\n")}),
    ];
    let tools = json!([{"type": "function", "function": {"name": "build", "parameters": {"type": "object"}}}]);
    let request = json!({"model": "m", "tools": tools, "messages": messages}).to_string();
    let request = Request::parse(Provider::OpenAi, request.as_bytes()).unwrap();
    conv.ingest(&request, &crate::wire::raw_hashes(&request)).unwrap();
    let body = String::from_utf8(conv.compose(&request).unwrap().body).unwrap();
    let id = conv.recorded.entries[2].ids[0];
    assert!(body.contains(&format!("ctxwin_recall with {{\\\"id\\\": {id}}}")), "{body}");
    let call =
        |from, to| RecallCall { call_id: "k".into(), id: Some(id), from_line: from, to_line: to };
    // Room for all of it, under the cap (64 x 8 tokens): the whole text.
    let (results, used) = conv.recall_results(&[call(None, None)], 10_000);
    assert_eq!(results[0].text, long.join("\n"));
    assert!(!results[0].is_error && used > 0 && used <= 512, "{used}");
    // Lines asked for.
    let (results, _) = conv.recall_results(&[call(Some(3), Some(4))], 10_000);
    assert_eq!(results[0].text, "line 3 of the build log\nline 4 of the build log");
    // Little room: the first lines that fit, and where to go on.
    let (results, used) = conv.recall_results(&[call(None, None)], 40);
    assert!(used <= 40, "{used}");
    let (shown, note) = results[0].text.rsplit_once('\n').unwrap();
    let next = shown.lines().count() + 1;
    assert!(next > 1 && next < 40, "{}", results[0].text);
    assert!(note.contains(&format!("\"from_line\": {next}}}")), "{note}");
    // Two calls share the room; an id of nothing archived and lines past the end are errors.
    let (results, _) = conv.recall_results(&[call(None, None), call(None, None)], 300);
    assert!(results[1].text.len() < results[0].text.len() || results[1].is_error);
    let missing = RecallCall { id: Some(9_999), ..call(None, None) };
    let (results, _) = conv.recall_results(&[missing, call(Some(41), None)], 10_000);
    assert!(results.iter().all(|r| r.is_error), "{results:?}");
    assert_eq!(results[0].text, "no archived output 9999 in this conversation");
}

#[test]
fn the_recall_tool_is_pinned_with_the_clients_tools() {
    use ctxwin_std::core::Level;
    let dir = tempfile::tempdir().unwrap();
    let store = prepare_state(dir.path(), false).unwrap();
    let pinned = |recall_tool: bool, name: &str| {
        let settings = ConvSettings { recall_tool, ..ConvSettings::new(32_768, 1_024) };
        let mut conv = Conv::open(dir.path(), &store, name, Provider::OpenAi, &settings).unwrap();
        let tools = json!([{"type": "function", "function": {"name": "run", "parameters": {"type": "object"}}}]);
        let body =
            json!({"model": "m", "tools": tools, "messages": [{"role": "user", "content": "hi"}]});
        let request = Request::parse(Provider::OpenAi, body.to_string().as_bytes()).unwrap();
        let hashes = crate::wire::raw_hashes(&request);
        conv.ingest(&request, &hashes).unwrap();
        let sent = String::from_utf8(conv.compose(&request).unwrap().body).unwrap();
        assert_eq!(sent.contains(crate::wire::RECALL_TOOL), recall_tool);
        conv.session().manager().level_tokens(Level::Permanent)
    };
    let (with, without) = (pinned(true, "with"), pinned(false, "without"));
    assert!(with > without + 50, "the recall tool's definition is counted: {with} vs {without}");
}

#[test]
fn a_small_history_room_locks_fewer_messages_once_the_pinned_part_is_known() {
    let dir = tempfile::tempdir().unwrap();
    let store = prepare_state(dir.path(), false).unwrap();
    let rules: String = (0..1_500).map(|n| format!("Rule {n}: keep the build green. ")).collect();
    let locked = |window: u32| {
        let settings = ConvSettings { recall: false, ..ConvSettings::new(window, 1_024) };
        let name = format!("tail{window}");
        let mut conv = Conv::open(dir.path(), &store, &name, Provider::OpenAi, &settings).unwrap();
        let mut messages = vec![
            json!({"role": "system", "content": rules}),
            json!({"role": "user", "content": "Go."}),
        ];
        turn(&mut conv, &messages);
        // The first request's budgets are set before its system prompt is counted.
        messages.push(json!({"role": "assistant", "content": "Done."}));
        messages.push(json!({"role": "user", "content": "Next."}));
        turn(&mut conv, &messages);
        assert!(conv.session().manager().level_tokens(Level::Permanent) > 15_500);
        conv.session().configured().locked_tail
    };
    assert_eq!(locked(32_768), settings::LOCKED_TAIL_SMALL, "the room left is under 16k");
    assert_eq!(locked(200_000), ctxwin_std::core::Config::DEFAULT.locked_tail);
}

#[test]
fn a_pause_longer_than_the_cache_lives_compacts_a_history_past_halfway_first() {
    let dir = tempfile::tempdir().unwrap();
    let store = prepare_state(dir.path(), false).unwrap();
    let settings = ConvSettings { recall: false, ..ConvSettings::new(8_192, 512) };
    // A conversation past halfway from its low-water mark to its budget, cache warm, and
    // how many compactions it has had.
    let filled = |name: &str| {
        let mut conv = Conv::open(dir.path(), &store, name, Provider::OpenAi, &settings).unwrap();
        let mut messages = vec![json!({"role": "system", "content": "Be brief."})];
        loop {
            let n = messages.len();
            messages.push(json!({"role": "user", "content": format!("step {n}: {}", "check the logs ".repeat(20))}));
            messages.push(json!({"role": "assistant", "content": format!("done {n}")}));
            turn(&mut conv, &messages[..messages.len() - 1]);
            turn(&mut conv, &messages);
            let manager = conv.session().manager();
            let low = manager.config().low_water_tokens();
            let half = low + (manager.budget() - low) / 2;
            let room = manager.budget() - manager.used();
            if manager.used() > half && room > 400 {
                break;
            }
            assert!(n < 400, "never past halfway");
        }
        let compactions = conv.session().manager().stats().counters.compactions;
        (conv, messages, compactions)
    };
    let minute = 60 * 1000;
    let now = super::measure::unix_ms();
    // Eleven minutes after the newest message: OpenAI's cache (5 to 10 minutes) is cold.
    let (mut conv, mut messages, before) = filled("cold");
    messages.push(json!({"role": "user", "content": "And now?"}));
    let request = request(&messages);
    assert!(conv.compact_if_cold(&request, now + 11 * minute).unwrap() > 0);
    let manager = conv.session().manager();
    assert_eq!(manager.stats().counters.compactions, before + 1);
    assert!(manager.used() <= manager.config().low_water_tokens(), "{}", manager.used());
    let hashes = crate::wire::raw_hashes(&request);
    assert!(matches!(conv.ingest(&request, &hashes).unwrap(), Ingest::Extended { .. }));
    // Nine minutes: it may still be warm; nothing moves before the budget needs it.
    let (mut conv, _, before) = filled("warm");
    assert_eq!(conv.compact_if_cold(&request, now + 9 * minute).unwrap(), 0);
    assert_eq!(conv.session().manager().stats().counters.compactions, before);
    // A request whose client says when it was sent: its messages carry that time.
    let (mut conv, _, _) = filled("told");
    conv.set_request_time(now + 3 * minute);
    assert!(matches!(conv.ingest(&request, &hashes).unwrap(), Ingest::Extended { .. }));
    let newest = conv.session().manager().history().next_back().map(|m| m.timestamp());
    assert_eq!(newest, Some(now + 3 * minute));
    // A request the client sends now (the wall clock): its newest message is not old.
    let (mut conv, _, before) = filled("now");
    assert!(matches!(conv.ingest(&request, &hashes).unwrap(), Ingest::Extended { .. }));
    assert_eq!(conv.session().manager().stats().counters.compactions, before);
}

#[test]
fn new_bytes_are_the_items_past_the_recorded_ones() {
    let dir = tempfile::tempdir().unwrap();
    let store = prepare_state(dir.path(), false).unwrap();
    let settings = ConvSettings { recall: false, ..ConvSettings::new(32_768, 1_024) };
    let mut conv = Conv::open(dir.path(), &store, "bytes", Provider::OpenAi, &settings).unwrap();
    let mut messages = vec![json!({"role": "user", "content": "Read the log."})];
    assert_eq!(conv.new_bytes(&request(&messages)), request(&messages).items[0].get().len());
    turn(&mut conv, &messages);
    messages.push(json!({"role": "assistant", "content": "It says: ".repeat(100)}));
    messages.push(json!({"role": "user", "content": "And then?"}));
    let next = request(&messages);
    let past: usize = next.items[1..].iter().map(|item| item.get().len()).sum();
    assert!(past > 900);
    assert_eq!(conv.new_bytes(&next), past, "the first message is recorded");
}

#[test]
fn tool_definitions_are_pushed_when_they_change_and_not_parsed_again_when_they_do_not() {
    let dir = tempfile::tempdir().unwrap();
    let store = prepare_state(dir.path(), false).unwrap();
    let settings = ConvSettings::new(32_768, 1_024);
    let mut conv = Conv::open(dir.path(), &store, "tools", Provider::OpenAi, &settings).unwrap();
    let tool = |name: &str| json!([{"type": "function", "function": {"name": name, "parameters": {"type": "object"}}}]);
    let mut messages = vec![json!({"role": "user", "content": "go"})];
    // A, A, B, A: the third and the fourth change what the session holds.
    let mut pushed = Vec::new();
    for (n, tools) in [tool("run"), tool("run"), tool("build"), tool("run")].into_iter().enumerate()
    {
        let body = json!({"model": "m", "tools": tools, "messages": messages}).to_string();
        let request = Request::parse(Provider::OpenAi, body.as_bytes()).unwrap();
        let hashes = crate::wire::raw_hashes(&request);
        let before = conv.recorded.tools_fp;
        conv.ingest(&request, &hashes).unwrap();
        pushed.push(conv.recorded.tools_fp != before);
        let raw = crate::wire::raw_hash(request.fields["tools"].get().as_bytes());
        // Once taken, the same bytes are known: the next request does not parse them.
        assert_eq!(conv.tools_seen.0 == raw, n > 0 && !pushed[n], "request {n}");
        assert!(conv.tools_to_push(&request).is_none(), "request {n}: taken");
        assert_eq!(conv.tools_seen, (raw, conv.recorded.tools_fp), "request {n}");
        conv.compose(&request).unwrap();
        messages.push(json!({"role": "assistant", "content": format!("done {n}")}));
        messages.push(json!({"role": "user", "content": format!("next {n}")}));
    }
    assert_eq!(pushed, [true, false, true, true]);
}
