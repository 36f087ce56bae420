//! `ctxwin_std::llm` against a scripted in-process HTTP server: retries, timeouts, errors and
//! answer validation, with no model needed.

use std::collections::BTreeMap;
use std::time::Duration;

use ctxwin_std::core::Role;
use ctxwin_std::llm::{LlmClient, LlmClientBuilder, LlmError, LlmUsage};
use ctxwin_std::{ChatMessage, ToolCall};
use fake::{FakeServer, Reply, chat};

/// A client for `server` that retries quickly.
fn client(server: &FakeServer) -> LlmClient {
    LlmClientBuilder::new(&server.url)
        .model("test-model")
        .api_key("sk-test")
        .timeout(Duration::from_secs(5))
        .max_retries(2)
        .backoff(Duration::from_millis(1), Duration::from_millis(5))
        .build()
        .unwrap()
}

fn conversation() -> Vec<ChatMessage> {
    vec![
        ChatMessage::text(
            Role::User,
            "The integration test tests/io.rs fails on CI since this morning. Please find out \
             why, fix it and make sure the whole workspace builds and passes again.",
        ),
        ChatMessage::assistant_calls(
            "I will run the failing test first to see the error.",
            vec![ToolCall::new("c1", "run", r#"{"cmd": "cargo test --test io"}"#)],
        ),
        ChatMessage::tool_result(
            "c1",
            "running 3 tests\ntest reads_back ... FAILED\nthread 'reads_back' panicked at \
             tests/io.rs:42:5: assertion failed: left == right (left: 3, right: 4)\ntest result: \
             FAILED. 2 passed; 1 failed",
        ),
        ChatMessage::text(
            Role::Assistant,
            "The test reads_back expects 4 records but the reader returns 3; the last record \
             is dropped when the file does not end with a newline. I will fix the reader.",
        ),
    ]
}

#[test]
fn a_completion_posts_the_openai_request_and_reads_text_reason_and_usage() {
    let server = FakeServer::start(vec![Reply::ok(chat("Paris.", "stop"))]);
    let answer = client(&server).complete("Answer briefly.", "Capital of France?", 16).unwrap();
    assert_eq!(answer.text, "Paris.");
    assert_eq!(answer.finish_reason.as_deref(), Some("stop"));
    assert_eq!(answer.usage, Some(LlmUsage { prompt_tokens: 21, completion_tokens: 3 }));
    assert_eq!(answer.attempts, 1);

    let requests = server.requests();
    assert_eq!(requests.len(), 1);
    let request = &requests[0];
    assert_eq!(request.line, "POST /v1/chat/completions HTTP/1.1");
    assert_eq!(request.header("authorization"), Some("Bearer sk-test"));
    assert!(request.header("x-request-id").is_some_and(|id| id.starts_with("ctxwin-")));
    let body: serde_json::Value = serde_json::from_str(&request.body).unwrap();
    assert_eq!(body["model"], "test-model");
    assert_eq!(body["max_tokens"], 16);
    assert_eq!(body["stream"], false);
    assert_eq!(body["messages"][0]["role"], "system");
    assert_eq!(body["messages"][1]["content"], "Capital of France?");
}

#[test]
fn a_base_url_ending_in_v1_reaches_the_same_endpoint() {
    let server = FakeServer::start(vec![Reply::ok(chat("ok", "stop"))]);
    let client = LlmClientBuilder::new(format!("{}/v1/", server.url)).build().unwrap();
    client.complete("s", "u", 4).unwrap();
    let request = &server.requests()[0];
    assert_eq!(request.line, "POST /v1/chat/completions HTTP/1.1");
    assert_eq!(request.header("authorization"), None);
    let body: serde_json::Value = serde_json::from_str(&request.body).unwrap();
    assert!(body.get("model").is_none(), "no model configured, none sent");
}

#[test]
fn server_errors_are_retried_until_success() {
    let server = FakeServer::start(vec![
        Reply::status(503, "loading model"),
        Reply::status(502, "bad gateway"),
        Reply::ok(chat("done", "stop")),
    ]);
    let answer = client(&server).complete("s", "u", 8).unwrap();
    assert_eq!(answer.text, "done");
    assert_eq!(answer.attempts, 3);
    assert_eq!(server.requests().len(), 3);
    let ids: Vec<_> =
        server.requests().iter().map(|r| r.header("x-request-id").map(str::to_owned)).collect();
    assert!(ids.windows(2).all(|w| w[0] == w[1]), "one request id across retries: {ids:?}");
}

#[test]
fn retries_stop_at_the_limit_with_the_last_status() {
    let server = FakeServer::start(vec![Reply::status(500, "boom"); 3]);
    let err = client(&server).complete("s", "u", 8).unwrap_err();
    assert!(
        matches!(&err, LlmError::Http { status: 500, attempts: 3, body, .. } if body == "boom"),
        "{err:?}"
    );
    assert!(err.is_transient());
}

#[test]
fn retry_after_is_honoured_within_the_cap() {
    let server = FakeServer::start(vec![
        Reply::status(429, "slow down").header("Retry-After", "1"),
        Reply::ok(chat("ok", "stop")),
    ]);
    // No backoff of its own: the only wait is the one Retry-After asks for, so the call
    // cannot take less than that second.
    let client =
        LlmClientBuilder::new(&server.url).backoff(Duration::ZERO, Duration::ZERO).build().unwrap();
    let answer = client.complete("s", "u", 8).unwrap();
    assert_eq!(answer.attempts, 2);
    assert!(answer.latency >= Duration::from_secs(1), "{:?}", answer.latency);
}

#[test]
fn retry_after_beyond_the_cap_ends_the_call() {
    let server = FakeServer::start(vec![
        Reply::status(429, "quota").header("Retry-After", "120"),
        Reply::ok(chat("too early", "stop")),
    ]);
    let client =
        LlmClientBuilder::new(&server.url).retry_after_cap(Duration::from_secs(5)).build().unwrap();
    let err = client.complete("s", "u", 8).unwrap_err();
    assert!(
        matches!(err, LlmError::RateLimited { retry_after, cap }
            if retry_after == Duration::from_secs(120) && cap == Duration::from_secs(5)),
        "{err:?}"
    );
    assert_eq!(server.requests().len(), 1);
}

#[test]
fn a_server_that_never_answers_times_out_on_every_attempt() {
    let server = FakeServer::start(vec![Reply::Stall(Duration::from_secs(5)); 2]);
    let client = LlmClientBuilder::new(&server.url)
        .timeout(Duration::from_millis(300))
        .max_retries(1)
        .backoff(Duration::from_millis(1), Duration::from_millis(1))
        .build()
        .unwrap();
    let err = client.complete("s", "u", 8).unwrap_err();
    assert!(
        matches!(err, LlmError::Timeout { attempts: 2, limit, .. } if limit == Duration::from_millis(300)),
        "{err:?}"
    );
    assert!(err.to_string().contains("raise the timeout"));
}

#[test]
fn a_dead_port_is_unreachable_after_the_retries() {
    let url = fake::dead_url();
    let client = LlmClientBuilder::new(&url)
        .max_retries(2)
        .backoff(Duration::from_millis(1), Duration::from_millis(2))
        .build()
        .unwrap();
    let err = client.complete("s", "u", 8).unwrap_err();
    assert!(matches!(&err, LlmError::Unreachable { attempts: 3, .. }), "{err:?}");
    assert!(err.to_string().contains("check that the server runs"), "{err}");
}

#[test]
fn a_server_that_hangs_up_is_retried() {
    let server = FakeServer::start(vec![Reply::Hangup, Reply::ok(chat("back", "stop"))]);
    let answer = client(&server).complete("s", "u", 8).unwrap();
    assert_eq!((answer.text.as_str(), answer.attempts), ("back", 2));
}

#[test]
fn client_errors_are_not_retried() {
    for status in [400, 401, 404, 422] {
        let server = FakeServer::start(vec![
            Reply::status(status, "{\"error\":\"nope\"}"),
            Reply::ok(chat("never", "stop")),
        ]);
        let err = client(&server).complete("s", "u", 8).unwrap_err();
        assert!(
            matches!(&err, LlmError::Http { status: s, attempts: 1, .. } if *s == status),
            "{err:?}"
        );
        assert_eq!(server.requests().len(), 1, "status {status}");
        assert!(!err.is_transient());
    }
}

#[test]
fn a_408_is_retried() {
    let server =
        FakeServer::start(vec![Reply::status(408, "timeout"), Reply::ok(chat("ok", "stop"))]);
    assert_eq!(client(&server).complete("s", "u", 8).unwrap().attempts, 2);
}

#[test]
fn malformed_bodies_are_reported_and_not_retried() {
    for body in ["<html>gateway</html>", "{\"choices\": []}", "{\"object\": \"list\"}"] {
        let server = FakeServer::start(vec![Reply::ok(body.into()), Reply::ok(chat("x", "stop"))]);
        let err = client(&server).complete("s", "u", 8).unwrap_err();
        assert!(matches!(err, LlmError::Malformed(_)), "{body}: {err:?}");
        assert_eq!(server.requests().len(), 1);
    }
}

#[test]
fn an_empty_answer_is_rejected() {
    let server = FakeServer::start(vec![Reply::ok(chat("  \n ", "stop"))]);
    let err = client(&server).summarize(None, &conversation(), 100).unwrap_err();
    assert!(matches!(err, LlmError::EmptyAnswer), "{err:?}");
    assert!(err.is_rejected_answer());
}

#[test]
fn a_good_summary_is_returned_with_usage_and_latency() {
    let text = "CI fails: tests/io.rs:42 reads_back gets 3 of 4 records (last line lacks a \
                newline). Next: fix the reader, run cargo test.";
    let server = FakeServer::start(vec![Reply::ok(chat(&format!("Summary: {text}"), "stop"))]);
    let summary =
        client(&server).summarize(Some("Task: keep CI green."), &conversation(), 120).unwrap();
    assert_eq!(summary.text, text);
    assert_eq!(summary.usage, Some(LlmUsage { prompt_tokens: 21, completion_tokens: 3 }));
    assert!(summary.latency > Duration::ZERO);
    assert!(!summary.input_cut);

    let body: serde_json::Value = serde_json::from_str(&server.requests()[0].body).unwrap();
    assert_eq!(body["messages"][0]["content"], ctxwin_std::llm::SUMMARY_SYSTEM_PROMPT);
    assert_eq!(body["max_tokens"], 120);
    let user = body["messages"][1]["content"].as_str().unwrap();
    assert!(user.starts_with("Summary so far:\nTask: keep CI green.\n\nNew messages:\nUser: "));
    assert!(user.contains("Assistant called run {\"cmd\":\"cargo test --test io\"}"), "{user}");
    assert!(user.contains("Tool run result: running 3 tests"), "{user}");
    assert!(user.ends_with("Write the updated summary in at most 90 words."), "{user}");
}

#[test]
fn input_over_the_budget_is_cut_before_sending() {
    let mut messages = conversation();
    messages
        .push(ChatMessage::tool_result("c1", format!("HEAD {} TAIL", "log line\n".repeat(2000))));
    let server = FakeServer::start(vec![Reply::ok(chat("Reader drops the last record.", "stop"))]);
    let client = LlmClientBuilder::new(&server.url).input_token_budget(300).build().unwrap();
    let summary = client.summarize(None, &messages, 64).unwrap();
    assert!(summary.input_cut);
    assert!(summary.input_tokens > 6000, "{}", summary.input_tokens);
    let body: serde_json::Value = serde_json::from_str(&server.requests()[0].body).unwrap();
    let user = body["messages"][1]["content"].as_str().unwrap();
    assert!(user.contains("characters cut"), "{user}");
    assert!(user.contains("HEAD") && user.contains("TAIL"), "head and tail stay");
    assert!(ctxwin_std::llm::estimate_tokens(user) <= 300 + 40, "{}", user.len());
}

#[test]
fn an_answer_longer_than_its_input_is_not_shorter() {
    let messages = [ChatMessage::text(Role::User, "Use SQLite.")];
    let long = "The user has asked the assistant to use SQLite as the storage engine for the \
                archive, which is an important architectural decision that affects persistence.";
    let server = FakeServer::start(vec![Reply::ok(chat(long, "stop"))]);
    let err = client(&server).summarize(None, &messages, 200).unwrap_err();
    assert!(matches!(err, LlmError::NotShorter { .. }), "{err:?}");
}

#[test]
fn a_refusal_is_not_a_summary() {
    let server = FakeServer::start(vec![Reply::ok(chat(
        "I'm sorry, but as an AI I cannot do that.",
        "stop",
    ))]);
    let err = client(&server).summarize(None, &conversation(), 100).unwrap_err();
    assert!(matches!(err, LlmError::NotASummary("it is a refusal")), "{err:?}");
}

#[test]
fn a_copy_of_the_last_message_is_not_a_summary() {
    let copy = "The test reads_back expects 4 records but the reader returns 3; the last \
                record is dropped when the file does not end with a newline.";
    let server = FakeServer::start(vec![Reply::ok(chat(copy, "stop"))]);
    let err = client(&server).summarize(None, &conversation(), 100).unwrap_err();
    assert!(matches!(err, LlmError::NotASummary("it repeats the last message")), "{err:?}");
}

#[test]
fn a_summary_cut_at_the_token_limit_is_truncated() {
    let server = FakeServer::start(vec![Reply::ok(chat("CI fails because the", "length"))]);
    let err = client(&server).summarize(None, &conversation(), 5).unwrap_err();
    assert!(matches!(err, LlmError::Truncated { max_tokens: 5 }), "{err:?}");
}

#[test]
fn a_cut_summary_can_be_kept_up_to_its_last_sentence() {
    let cut = "CI fails in tests/io.rs:42. The reader drops the last record. Next the";
    let server = FakeServer::start(vec![
        Reply::ok(chat(cut, "length")),
        Reply::ok(chat("no end", "length")),
    ]);
    let client = LlmClientBuilder::new(&server.url)
        .keep_truncated_summaries(true)
        .frequency_penalty(0.5)
        .build()
        .unwrap();
    let summary = client.summarize(None, &conversation(), 20).unwrap();
    assert_eq!(summary.text, "CI fails in tests/io.rs:42. The reader drops the last record.");
    assert!(summary.truncated);
    let body: serde_json::Value = serde_json::from_str(&server.requests()[0].body).unwrap();
    assert_eq!(body["frequency_penalty"], 0.5);
    let err = client.summarize(None, &conversation(), 20).unwrap_err();
    assert!(matches!(err, LlmError::Truncated { max_tokens: 20 }), "no sentence to keep: {err:?}");
}

#[test]
fn an_answer_stuck_in_a_loop_is_not_a_summary() {
    let looping = "The test suite fails on CI and I need to fix it. ".repeat(5);
    let server = FakeServer::start(vec![Reply::ok(chat(&looping, "stop"))]);
    let err = client(&server).summarize(None, &conversation(), 200).unwrap_err();
    assert!(matches!(err, LlmError::NotASummary("it repeats itself")), "{err:?}");
}

#[test]
fn nothing_to_summarize_sends_nothing() {
    let server = FakeServer::start(vec![]);
    let err = client(&server).summarize(Some("old"), &[], 100).unwrap_err();
    assert!(matches!(err, LlmError::NothingToSummarize));
    assert!(server.requests().is_empty());
}

#[test]
fn extraction_reads_a_fenced_object_and_updates_the_current_values() {
    let answer = "Here are the facts:\n```json\n{\"branch\": \"fix-io\", \"failing\": null, \
                  \"attempts\": 2}\n```";
    let server = FakeServer::start(vec![Reply::ok(chat(answer, "stop"))]);
    let current = BTreeMap::from([
        ("failing".to_owned(), "tests/io.rs".to_owned()),
        ("branch".to_owned(), "main".to_owned()),
    ]);
    let facts = client(&server)
        .extract(&["branch", "failing", "attempts"], &current, "Switched to fix-io, try 2.")
        .unwrap();
    let expected = BTreeMap::from([
        ("attempts".to_owned(), "2".to_owned()),
        ("branch".to_owned(), "fix-io".to_owned()),
        ("failing".to_owned(), "tests/io.rs".to_owned()),
    ]);
    assert_eq!(facts, expected);

    let body: serde_json::Value = serde_json::from_str(&server.requests()[0].body).unwrap();
    let system = body["messages"][0]["content"].as_str().unwrap();
    assert!(system.contains("Use only these keys: branch, failing, attempts."), "{system}");
    let user = body["messages"][1]["content"].as_str().unwrap();
    assert!(user.contains(r#""branch":"main""#) && user.contains(r#""attempts":null"#), "{user}");
    assert!(user.contains("Switched to fix-io, try 2."));
    assert_eq!(body["response_format"]["type"], "json_schema");
    let declared = &body["response_format"]["json_schema"]["schema"]["required"];
    assert_eq!(declared, &serde_json::json!(["branch", "failing", "attempts"]));
}

#[test]
fn completions_and_summaries_do_not_ask_for_json() {
    let server = FakeServer::start(vec![Reply::ok(chat("ok", "stop"))]);
    client(&server).complete("s", "u", 4).unwrap();
    let body: serde_json::Value = serde_json::from_str(&server.requests()[0].body).unwrap();
    assert!(body.get("response_format").is_none());
    assert!(body.get("frequency_penalty").is_none());
}

#[test]
fn json_mode_can_be_turned_off() {
    let server = FakeServer::start(vec![Reply::ok(chat("{\"branch\": \"x\"}", "stop"))]);
    let client = LlmClientBuilder::new(&server.url).json_mode(false).build().unwrap();
    client.extract(&["branch"], &BTreeMap::new(), "on x").unwrap();
    let body: serde_json::Value = serde_json::from_str(&server.requests()[0].body).unwrap();
    assert!(body.get("response_format").is_none());
}

#[test]
fn extraction_rejects_undeclared_keys_and_non_json() {
    let cases = [
        ("{\"branch\": \"x\", \"password\": \"hunter2\"}", "undeclared"),
        ("The branch is fix-io.", "not json"),
        ("{\"branch\": [\"a\", \"b\"]}", "bad value"),
    ];
    for (answer, case) in cases {
        let server = FakeServer::start(vec![Reply::ok(chat(answer, "stop"))]);
        let err = client(&server).extract(&["branch"], &BTreeMap::new(), "text").unwrap_err();
        let expected = match case {
            "undeclared" => matches!(&err, LlmError::UndeclaredKey(k) if k == "password"),
            "not json" => matches!(err, LlmError::NotJson(_)),
            _ => matches!(err, LlmError::BadValue { .. }),
        };
        assert!(expected, "{case}: {err:?}");
        assert!(err.is_rejected_answer());
    }
}

#[test]
fn an_extraction_cut_before_its_object_closes_is_truncated() {
    let server = FakeServer::start(vec![Reply::ok(chat("{\"branch\": \"fix-", "length"))]);
    let err = client(&server).extract(&["branch"], &BTreeMap::new(), "text").unwrap_err();
    assert!(matches!(err, LlmError::Truncated { max_tokens: 256 }), "{err:?}");
}

#[test]
fn an_empty_schema_is_a_configuration_error() {
    let server = FakeServer::start(vec![]);
    let err = client(&server).extract(&[], &BTreeMap::new(), "text").unwrap_err();
    assert!(matches!(err, LlmError::Config(_)));
}

#[test]
fn tokenize_posts_to_the_server_root_and_reads_ids_and_pieces() {
    let server = FakeServer::start(vec![
        Reply::ok(r#"{"tokens":[28120,905]}"#.into()),
        Reply::ok(r#"{"tokens":[{"id":28120,"piece":"hello"},{"id":250,"piece":[160]}]}"#.into()),
    ]);
    let client = LlmClientBuilder::new(format!("{}/v1", server.url)).build().unwrap();
    assert_eq!(client.tokenize("hello world").unwrap(), vec![28120, 905]);
    let pieces = client.tokenize_pieces("hello\u{a0}").unwrap();
    assert_eq!(pieces[0].bytes, b"hello");
    assert_eq!((pieces[1].id, pieces[1].bytes.as_slice()), (250, &[160u8][..]));

    let requests = server.requests();
    assert_eq!(requests[0].line, "POST /tokenize HTTP/1.1");
    let body: serde_json::Value = serde_json::from_str(&requests[0].body).unwrap();
    assert_eq!(body["content"], "hello world");
    assert_eq!(body["add_special"], false);
}

#[test]
fn a_server_without_tokenize_says_404() {
    let server = FakeServer::start(vec![Reply::status(404, "File Not Found")]);
    let err = client(&server).tokenize("x").unwrap_err();
    assert!(matches!(err, LlmError::Http { status: 404, .. }), "{err:?}");
}

/// A scripted HTTP/1.1 server on 127.0.0.1: one connection per reply, in order.
mod fake {
    use std::io::{BufRead, BufReader, Read, Write};
    use std::net::{TcpListener, TcpStream};
    use std::sync::{Arc, Mutex};
    use std::thread;
    use std::time::Duration;

    /// What the server does with the next connection.
    #[derive(Clone, Debug)]
    pub enum Reply {
        /// Answer with this status, extra headers and JSON body.
        Respond { status: u16, headers: Vec<(String, String)>, body: String },
        /// Read the request, then say nothing for this long before closing.
        Stall(Duration),
        /// Read the request and close the connection without answering.
        Hangup,
    }

    impl Reply {
        pub fn ok(body: String) -> Self {
            Self::status(200, &body)
        }

        pub fn status(status: u16, body: &str) -> Self {
            Self::Respond { status, headers: Vec::new(), body: body.to_owned() }
        }

        pub fn header(mut self, name: &str, value: &str) -> Self {
            if let Self::Respond { headers, .. } = &mut self {
                headers.push((name.to_owned(), value.to_owned()));
            }
            self
        }
    }

    /// A chat-completions body with usage 21 + 3.
    pub fn chat(content: &str, finish_reason: &str) -> String {
        serde_json::json!({
            "id": "chatcmpl-test",
            "object": "chat.completion",
            "choices": [{
                "index": 0,
                "message": {"role": "assistant", "content": content},
                "finish_reason": finish_reason,
            }],
            "usage": {"prompt_tokens": 21, "completion_tokens": 3, "total_tokens": 24},
        })
        .to_string()
    }

    /// A request as the server received it.
    #[derive(Clone, Debug)]
    pub struct Recorded {
        pub line: String,
        pub headers: Vec<(String, String)>,
        pub body: String,
    }

    impl Recorded {
        pub fn header(&self, name: &str) -> Option<&str> {
            self.headers
                .iter()
                .find(|(key, _)| key.eq_ignore_ascii_case(name))
                .map(|(_, value)| value.as_str())
        }
    }

    pub struct FakeServer {
        pub url: String,
        requests: Arc<Mutex<Vec<Recorded>>>,
    }

    impl FakeServer {
        pub fn start(replies: Vec<Reply>) -> Self {
            let listener = TcpListener::bind("127.0.0.1:0").unwrap();
            let url = format!("http://{}", listener.local_addr().unwrap());
            let requests = Arc::new(Mutex::new(Vec::new()));
            let log = Arc::clone(&requests);
            thread::spawn(move || {
                for reply in replies {
                    let Ok((stream, _)) = listener.accept() else { return };
                    serve(stream, &reply, &log);
                }
            });
            Self { url, requests }
        }

        pub fn requests(&self) -> Vec<Recorded> {
            self.requests.lock().unwrap().clone()
        }
    }

    /// A URL on which nothing listens: a port that was just bound and released.
    pub fn dead_url() -> String {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        drop(listener);
        url
    }

    fn serve(stream: TcpStream, reply: &Reply, log: &Mutex<Vec<Recorded>>) {
        stream.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut reader = BufReader::new(stream);
        let Some(request) = read_request(&mut reader) else { return };
        log.lock().unwrap().push(request);
        let mut stream = reader.into_inner();
        match reply {
            Reply::Respond { status, headers, body } => {
                let mut head = format!(
                    "HTTP/1.1 {status} Scripted\r\nContent-Type: application/json\r\n\
                     Content-Length: {}\r\nConnection: close\r\n",
                    body.len()
                );
                for (name, value) in headers {
                    head.push_str(&format!("{name}: {value}\r\n"));
                }
                head.push_str("\r\n");
                let _ = stream.write_all(head.as_bytes());
                let _ = stream.write_all(body.as_bytes());
                let _ = stream.flush();
            }
            Reply::Stall(pause) => thread::sleep(*pause),
            Reply::Hangup => {}
        }
    }

    fn read_request(reader: &mut BufReader<TcpStream>) -> Option<Recorded> {
        let mut line = String::new();
        reader.read_line(&mut line).ok()?;
        let mut headers = Vec::new();
        loop {
            let mut header = String::new();
            reader.read_line(&mut header).ok()?;
            let header = header.trim_end();
            if header.is_empty() {
                break;
            }
            let (name, value) = header.split_once(':')?;
            headers.push((name.trim().to_owned(), value.trim().to_owned()));
        }
        let length: usize = headers
            .iter()
            .find(|(name, _)| name.eq_ignore_ascii_case("content-length"))
            .and_then(|(_, value)| value.parse().ok())
            .unwrap_or(0);
        let mut body = vec![0; length];
        reader.read_exact(&mut body).ok()?;
        Some(Recorded {
            line: line.trim_end().to_owned(),
            headers,
            body: String::from_utf8(body).ok()?,
        })
    }
}
