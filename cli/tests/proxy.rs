//! `ctxwin proxy` end to end: the real binary between a raw HTTP client and a fake upstream.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use serde_json::Value;

const CONFIG: i32 = 8;

/// Reads one HTTP/1.1 request (head and `Content-Length` body) from `stream`.
fn read_request(stream: &mut TcpStream) -> (String, Vec<u8>) {
    let mut reader = BufReader::new(stream);
    let mut head = String::new();
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap() == 0 || line == "\r\n" {
            break;
        }
        head.push_str(&line);
    }
    let length = head
        .lines()
        .find_map(|l| {
            let (name, value) = l.split_once(':')?;
            name.eq_ignore_ascii_case("content-length").then(|| value.trim().parse().unwrap())
        })
        .unwrap_or(0);
    let mut body = vec![0; length];
    reader.read_exact(&mut body).unwrap();
    (head, body)
}

/// A one-request fake OpenAI server: sends the request body it received on the channel.
fn fake_upstream() -> (u16, mpsc::Receiver<(String, Value)>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let (mut stream, _) = listener.accept().unwrap();
        let (head, body) = read_request(&mut stream);
        let answer = serde_json::json!({
            "id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "gpt-4o",
            "choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": "Pong from upstream."}}],
            "usage": {"prompt_tokens": 20, "completion_tokens": 4, "total_tokens": 24}
        })
        .to_string();
        write!(
            stream,
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{answer}",
            answer.len()
        )
        .unwrap();
        stream.flush().unwrap();
        let _ = tx.send((head, serde_json::from_slice(&body).unwrap()));
    });
    (port, rx)
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// Kills the child when the test ends, passed or not.
struct Child(std::process::Child);

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn the_proxy_forwards_a_managed_request_and_returns_the_answer() {
    let work = tempfile::tempdir().unwrap();
    let state = work.path().join("state");
    let (upstream, received) = fake_upstream();
    let listen = format!("127.0.0.1:{}", free_port());
    let mut child = Child(
        Command::new(env!("CARGO_BIN_EXE_ctxwin"))
            .current_dir(work.path())
            .env_remove("CTXWIN_DIR")
            .env("RUST_LOG", "warn")
            .args(["--dir", state.to_str().unwrap(), "proxy", "--listen", &listen])
            .args(["--upstream", &format!("http://127.0.0.1:{upstream}")])
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap(),
    );
    let mut line = String::new();
    BufReader::new(child.0.stdout.take().unwrap()).read_line(&mut line).unwrap();
    assert_eq!(line.trim(), format!("ctxwin-proxy listening on http://{listen}"));

    let body = serde_json::json!({
        "model": "gpt-4o",
        "temperature": 0.25,
        "messages": [
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": "Ping?"}
        ]
    })
    .to_string();
    let mut client = TcpStream::connect(&listen).unwrap();
    client.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    write!(
        client,
        "POST /v1/chat/completions HTTP/1.1\r\nhost: {listen}\r\ncontent-type: application/json\r\nauthorization: Bearer sk-test\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut response = String::new();
    client.read_to_string(&mut response).unwrap();
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    let (_, answer) = response.split_once("\r\n\r\n").unwrap();
    let answer: Value = serde_json::from_str(answer).unwrap();
    assert_eq!(answer["choices"][0]["message"]["content"], "Pong from upstream.");

    let (head, sent) = received.recv_timeout(Duration::from_secs(30)).unwrap();
    assert!(head.starts_with("POST /v1/chat/completions"), "{head}");
    assert!(head.to_ascii_lowercase().contains("authorization: bearer sk-test"), "{head}");
    assert_eq!(sent["model"], "gpt-4o");
    assert_eq!(sent["temperature"], 0.25);
    let messages = sent["messages"].as_array().unwrap();
    assert_eq!(messages.first().unwrap()["content"], "You are terse.");
    assert_eq!(messages.last().unwrap()["content"], "Ping?");
    // The managed conversation lives in the CLI's state directory, under proxy/.
    assert!(state.join("proxy").join("archive.db").is_file());

    // SIGTERM: a graceful stop (conversations checkpointed), exit code 0.
    #[cfg(unix)]
    {
        let pid = child.0.id().to_string();
        assert!(Command::new("kill").args(["-TERM", &pid]).status().unwrap().success());
        let status = child.0.wait().unwrap();
        assert_eq!(status.code(), Some(0), "{status}");
        // What the conversation cost, from its checkpoint, the proxy stopped.
        let stats = Command::new(env!("CARGO_BIN_EXE_ctxwin"))
            .env_remove("CTXWIN_DIR")
            .args(["--dir", state.to_str().unwrap(), "stats", "--proxy", "--json"])
            .output()
            .unwrap();
        assert!(stats.status.success(), "{}", String::from_utf8_lossy(&stats.stderr));
        let stats: Value = serde_json::from_slice(&stats.stdout).unwrap();
        assert_eq!(stats["total"]["requests"], 1, "{stats}");
        assert_eq!(stats["conversations"].as_array().map(Vec::len), Some(1), "{stats}");
    }
}

#[test]
fn a_bad_listen_address_is_a_configuration_error() {
    let work = tempfile::tempdir().unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_ctxwin"))
        .current_dir(work.path())
        .env_remove("CTXWIN_DIR")
        .args(["proxy", "--upstream", "http://127.0.0.1:9", "--listen", "not-an-address"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(CONFIG), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.contains("--listen `not-an-address` is not HOST:PORT"), "{stderr}");
    let output = Command::new(env!("CARGO_BIN_EXE_ctxwin"))
        .current_dir(work.path())
        .env_remove("CTXWIN_DIR")
        .args(["proxy", "--upstream", "ftp://x", "--listen", "127.0.0.1:1"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(CONFIG));
}

#[test]
fn a_proxy_section_does_not_break_the_cli_config() {
    let work = tempfile::tempdir().unwrap();
    let state = work.path().join("state");
    let dir = state.to_str().unwrap();
    let run = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_ctxwin"))
            .current_dir(work.path())
            .env_remove("CTXWIN_DIR")
            .args(["--dir", dir])
            .args(args)
            .output()
            .unwrap()
    };
    assert!(run(&["init"]).status.success());
    let file = state.join("ctxwin.toml");
    let text = std::fs::read_to_string(&file).unwrap();
    // `init` writes the section, every key commented: a user sets them there.
    assert!(text.contains("\n[proxy]\n# `ctxwin proxy`"), "{text}");
    let mut text =
        text.replacen("\n[proxy]\n", "\n[proxy]\nupstream = \"http://127.0.0.1:9\"\n", 1);
    text.push_str("\n[proxy.windows]\n\"gpt-4o\" = 128000\n");
    std::fs::write(&file, text).unwrap();
    let output = run(&["stats"]);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
}
