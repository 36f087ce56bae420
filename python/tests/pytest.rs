//! Runs the Python package's test suite from `cargo test`: makes a venv under the target
//! directory (`target/python-venv`, reused), installs the real packages the suite tests
//! against (pinned: LangChain v1, the OpenAI Agents SDK, LangGraph and its conformance suite,
//! pytest), builds and installs the package with `pip install ./python` (maturin, into
//! `target/python-build`), then runs pytest on `python/tests` and the package's doctests.
//!
//! Without python3 the test says so and passes; anything else that fails fails it. The real
//! Agents SDK run loop runs when `CTXWIN_LLM_URL` names a local model server
//! (`scripts/llm-server.sh start`), which the environment passes through;
//! the PostgreSQL tests run when `CTXWIN_PG_URL` names a server (`scripts/pg-server.sh
//! start`); `CTXWIN_PYTEST_K` passes pytest a `-k` selection (CI's LLM and PostgreSQL steps
//! run only theirs).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

/// What the suite runs against, pinned so that a green run can be repeated.
const TEST_PACKAGES: &[&str] = &[
    "maturin==1.16.0",
    "pytest==9.2.0",
    "pytest-asyncio==1.5.0",
    "langchain-core==1.8.3",
    "langchain==1.5.2",
    "langgraph==1.2.24",
    "langgraph-checkpoint==4.3.2",
    "langgraph-checkpoint-conformance==0.0.2",
    "openai-agents==0.24.0",
    // Creates and drops each PostgreSQL test's schema (tests/conftest.py).
    "psycopg[binary]==3.3.9",
];

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR").map(PathBuf::from).unwrap_or_else(|| repo().join("target"))
}

/// `PATH` with `dir` first (pip runs the venv's `maturin` by name).
fn path_with(dir: &Path) -> std::ffi::OsString {
    let rest = std::env::var_os("PATH").unwrap_or_default();
    std::env::join_paths(std::iter::once(dir.to_path_buf()).chain(std::env::split_paths(&rest)))
        .unwrap_or(rest)
}

fn run(command: &mut Command, what: &str) {
    let status = command.status().unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(status.success(), "{what} failed ({status})");
}

#[test]
fn the_python_package_passes_its_test_suite() {
    if Command::new("python3").arg("--version").output().is_err() {
        eprintln!("SKIPPED: python3 is not installed; the Python package's tests need it");
        return;
    }
    let target = target_dir();
    let venv = target.join("python-venv");
    let python = venv.join("bin/python");
    let stamp = venv.join("ctxwin-test-packages");
    let wanted = TEST_PACKAGES.join("\n");
    if std::fs::read_to_string(&stamp).ok().as_deref() != Some(wanted.as_str()) {
        run(
            Command::new("python3").args(["-m", "venv", "--clear"]).arg(&venv),
            "python3 -m venv target/python-venv",
        );
        run(
            Command::new(&python)
                .args(["-m", "pip", "install", "--quiet", "--disable-pip-version-check"])
                .args(TEST_PACKAGES),
            "pip install of the test packages",
        );
        std::fs::write(&stamp, &wanted).unwrap();
    }
    // `pip install ./python`, as a user does (maturin comes from the venv rather than an
    // isolated build environment, so the test does not download it each time).
    let started = Instant::now();
    run(
        Command::new(&python)
            .args(["-m", "pip", "install", "--quiet", "--disable-pip-version-check"])
            .args(["--no-build-isolation", "--no-deps", "--force-reinstall"])
            .arg(repo().join("python"))
            .env("CARGO_TARGET_DIR", target.join("python-build"))
            .env("PATH", path_with(&venv.join("bin"))),
        "pip install ./python",
    );
    eprintln!("pip install ./python: {:.1} s", started.elapsed().as_secs_f64());
    // From outside the repository, so `import ctxwin` is the installed package, not
    // python/ctxwin (which has no native module).
    let python_dir = repo().join("python");
    let output = Command::new(&python)
        .args(["-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs"])
        .arg("-c")
        .arg(python_dir.join("pyproject.toml"))
        .arg("--rootdir")
        .arg(&python_dir)
        .arg(python_dir.join("tests"))
        .args(["--pyargs", "ctxwin"])
        .args(
            std::env::var("CTXWIN_PYTEST_K").map(|k| vec!["-k".to_owned(), k]).unwrap_or_default(),
        )
        .current_dir(&venv)
        .env("CTXWIN_PYTEST_CACHE", target.join("python-cache"))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    eprintln!("{stdout}{stderr}");
    assert!(output.status.success(), "pytest failed ({})", output.status);
    let summary = stdout.lines().last().unwrap_or_default();
    assert!(summary.contains(" passed"), "pytest ran no test: {summary}");
}
