//! A minimal chat-completions server for unit tests: one connection per request, answered in
//! turn (a fixed list) or by a function of the request body.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Reads one request and returns its body.
fn read_request(stream: TcpStream) -> Option<(String, TcpStream)> {
    let mut reader = BufReader::new(stream);
    let mut length = 0usize;
    loop {
        let mut line = String::new();
        reader.read_line(&mut line).ok()?;
        if let Some(value) = line.to_ascii_lowercase().strip_prefix("content-length:") {
            length = value.trim().parse().ok()?;
        }
        if line == "\r\n" || line.is_empty() {
            break;
        }
    }
    let mut body = vec![0; length];
    reader.read_exact(&mut body).ok()?;
    Some((String::from_utf8_lossy(&body).into_owned(), reader.into_inner()))
}

fn respond(mut stream: TcpStream, answer: &str) {
    let body = serde_json::json!({
        "choices": [{"message": {"content": answer}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 5}
    })
    .to_string();
    let _ = write!(
        stream,
        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
}

/// A server returning `answers` in turn, one per connection, then closing.
pub(crate) fn server(answers: Vec<String>) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    std::thread::spawn(move || {
        for answer in answers {
            let Ok((stream, _)) = listener.accept() else { return };
            if let Some((_, stream)) = read_request(stream) {
                respond(stream, &answer);
            }
        }
    });
    url
}

/// A server answering every request with `answer(body)` after `delay`; the bodies it got are
/// in `requests`.
pub(crate) struct Responder {
    pub url: String,
    pub requests: Arc<Mutex<Vec<String>>>,
}

pub(crate) fn responder(
    delay: Duration,
    answer: impl Fn(&str) -> String + Send + 'static,
) -> Responder {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let requests = Arc::new(Mutex::new(Vec::new()));
    let seen = Arc::clone(&requests);
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(stream) = stream else { return };
            let Some((body, stream)) = read_request(stream) else { continue };
            std::thread::sleep(delay);
            let text = answer(&body);
            seen.lock().unwrap().push(body);
            respond(stream, &text);
        }
    });
    Responder { url, requests }
}
