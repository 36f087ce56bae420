//! The official `openai` and `anthropic` Python packages run multi-turn tool-calling
//! conversations through the proxy: against the in-process fake upstream (always), and against
//! a real OpenAI-compatible server when `CTXWIN_LLM_URL` names one (`scripts/llm-server.sh`).
//!
//! The packages are installed with pip into a venv cached under `target/proxy-venv` (made on
//! first use). Without python3 the tests say so and pass; a failing pip install fails them.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::{anthropic_pairs_intact, config, openai_pairs_intact, start_fake, start_proxy};

fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../target"))
}

/// The venv's python with `openai` and `anthropic` importable, or `None` without python3.
///
/// The tests in this file run on parallel threads; the lock makes one of them build the venv
/// while the others wait for it (two `python3 -m venv` on one directory fail with EEXIST).
fn venv_python() -> Option<PathBuf> {
    static VENV: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _building = VENV.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    if Command::new("python3").arg("--version").output().is_err() {
        eprintln!("SKIPPED: python3 is not installed; the Python client tests need it");
        return None;
    }
    let venv = target_dir().join("proxy-venv");
    let python = venv.join("bin/python");
    let ready = |python: &Path| {
        Command::new(python)
            .args(["-c", "import openai, anthropic"])
            .status()
            .is_ok_and(|s| s.success())
    };
    if ready(&python) {
        return Some(python);
    }
    let status =
        Command::new("python3").args(["-m", "venv", "--clear"]).arg(&venv).status().unwrap();
    assert!(status.success(), "python3 -m venv {} failed", venv.display());
    let status = Command::new(venv.join("bin/pip"))
        .args(["install", "--quiet", "--disable-pip-version-check", "openai", "anthropic"])
        .status()
        .unwrap();
    assert!(status.success(), "pip install openai anthropic failed");
    assert!(ready(&python), "openai and anthropic do not import after pip install");
    Some(python)
}

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python/clients.py")
}

async fn run_python(python: &Path, url: &str, mode: &str) -> String {
    let output = tokio::process::Command::new(python)
        .arg(script())
        .arg(url)
        .arg(mode)
        // The SDKs would prefer these to the keys the script passes.
        .env_remove("ANTHROPIC_AUTH_TOKEN")
        .env_remove("ANTHROPIC_API_KEY")
        .env_remove("ANTHROPIC_BASE_URL")
        .env_remove("OPENAI_API_KEY")
        .env_remove("OPENAI_BASE_URL")
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout).to_string();
    let stderr = String::from_utf8_lossy(&output.stderr).to_string();
    assert!(output.status.success(), "python failed\nstdout:\n{stdout}\nstderr:\n{stderr}");
    stdout
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_sdks_against_the_fake_upstream() {
    let Some(python) = venv_python() else { return };
    let state = tempfile::tempdir().unwrap();
    let (up, fake) = start_fake().await;
    let mut cfg = config(up, state.path());
    cfg.windows.insert("fake-model".into(), 2_048);
    cfg.reserve = 256;
    let proxy = start_proxy(cfg).await;
    let stdout = run_python(&python, &format!("http://{}", proxy.addr), "fake").await;
    assert!(stdout.contains("python clients: OK"), "{stdout}");
    let received = fake.received.lock().unwrap().clone();
    let mut managed = 0;
    for request in &received {
        match request.path.as_str() {
            "/v1/chat/completions" => {
                let body = request.json();
                openai_pairs_intact(body["messages"].as_array().unwrap()).unwrap();
                assert_eq!(body["temperature"], 0.2);
                assert_eq!(body["tools"][0]["function"]["name"], "run_command");
                assert_eq!(request.headers["authorization"], "Bearer sk-python-secret");
                managed += 1;
            }
            "/v1/messages" => {
                let body = request.json();
                anthropic_pairs_intact(body["messages"].as_array().unwrap()).unwrap();
                assert_eq!(body["thinking"]["budget_tokens"], 1024);
                assert_eq!(body["system"][0]["cache_control"]["type"], "ephemeral");
                // The SDK sends its key as x-api-key or (2.x) as a bearer token: either is forwarded.
                let key = ["x-api-key", "authorization"]
                    .iter()
                    .filter_map(|h| request.headers.get(*h))
                    .any(|v| v.to_str().unwrap().ends_with("ak-python-secret"));
                assert!(key, "the client's key reaches the upstream");
                managed += 1;
            }
            _ => {}
        }
    }
    assert!(managed >= 30, "{managed}");
    let metrics = proxy.app.metrics.render();
    assert!(!metrics.contains("status=\"5"), "{metrics}");
    proxy.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_openai_sdk_against_a_real_server() {
    let Ok(url) = std::env::var("CTXWIN_LLM_URL") else {
        eprintln!("SKIPPED: CTXWIN_LLM_URL is not set (scripts/llm-server.sh start prints it)");
        return;
    };
    let Some(python) = venv_python() else { return };
    let state = tempfile::tempdir().unwrap();
    let mut cfg = config("127.0.0.1:1".parse().unwrap(), state.path());
    cfg.upstream = url;
    cfg.default_window = 2_048;
    cfg.reserve = 256;
    cfg.upstream_timeout = std::time::Duration::from_secs(120);
    let proxy = start_proxy(cfg).await;
    let stdout = run_python(&python, &format!("http://{}", proxy.addr), "real").await;
    assert!(stdout.contains("OK"), "{stdout}");
    proxy.stop().await;
}

/// The script's real-server mode, against the fake: it must work before CI meets a real server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_real_mode_against_the_fake_upstream() {
    let Some(python) = venv_python() else { return };
    let state = tempfile::tempdir().unwrap();
    let (up, fake) = start_fake().await;
    let proxy = start_proxy(config(up, state.path())).await;
    let stdout = run_python(&python, &format!("http://{}", proxy.addr), "real").await;
    assert!(stdout.contains("OK"), "{stdout}");
    for request in fake.received.lock().unwrap().iter() {
        openai_pairs_intact(request.json()["messages"].as_array().unwrap()).unwrap();
    }
    proxy.stop().await;
}
