//! Running the real `ctxwin` binary over temporary state directories.
#![allow(dead_code)]

pub mod agent_session;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::Value;
use tempfile::TempDir;

/// One finished `ctxwin` process.
#[derive(Debug)]
pub struct Run {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl Run {
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("stdout is not JSON ({e}):\n{}", self.stdout))
    }
}

/// A working directory with a state directory `state/` in it.
pub struct Workdir {
    pub root: TempDir,
}

impl Workdir {
    /// An empty working directory (no state yet).
    pub fn new() -> Workdir {
        Workdir { root: tempfile::tempdir().unwrap() }
    }

    /// A working directory with an initialized state.
    pub fn init() -> Workdir {
        let work = Workdir::new();
        work.ok(&["init"]);
        work
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.root.path().join(name)
    }

    pub fn state(&self) -> PathBuf {
        self.path("state")
    }

    pub fn write(&self, name: &str, text: &str) -> PathBuf {
        let path = self.path(name);
        std::fs::write(&path, text).unwrap();
        path
    }

    /// `ctxwin --dir state ARGS` with `stdin`, in the working directory.
    pub fn run_with(&self, args: &[&str], stdin: Option<&str>, env: &[(&str, &str)]) -> Run {
        let mut command = Command::new(env!("CARGO_BIN_EXE_ctxwin"));
        command
            .current_dir(self.root.path())
            .arg("--dir")
            .arg(self.state())
            .args(args)
            .env_remove("CTXWIN_DIR")
            .env_remove("CTXWIN_TOKENIZER")
            .env_remove("CTXWIN_LLM_URL")
            .env_remove("CTXWIN_STORE_URL")
            .env("RUST_BACKTRACE", "1")
            .stdin(if stdin.is_some() { Stdio::piped() } else { Stdio::null() })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        for (key, value) in env {
            command.env(key, value);
        }
        let mut child = command.spawn().unwrap();
        if let Some(text) = stdin {
            child.stdin.take().unwrap().write_all(text.as_bytes()).unwrap();
        }
        let output = child.wait_with_output().unwrap();
        let run = Run {
            code: output.status.code().unwrap_or(-1),
            stdout: String::from_utf8(output.stdout).unwrap(),
            stderr: String::from_utf8(output.stderr).unwrap(),
        };
        assert!(
            !run.stderr.contains("panicked") && !run.stderr.contains("stack backtrace"),
            "ctxwin {args:?} panicked:\n{}",
            run.stderr
        );
        run
    }

    pub fn run(&self, args: &[&str]) -> Run {
        self.run_with(args, None, &[])
    }

    /// Runs and asserts success with nothing on standard error.
    pub fn ok(&self, args: &[&str]) -> Run {
        let run = self.run(args);
        assert_eq!(run.code, 0, "ctxwin {args:?} failed:\n{}", run.stderr);
        assert_eq!(run.stderr, "", "ctxwin {args:?} wrote to stderr");
        run
    }

    /// Runs with `--json` and parses the output.
    pub fn json(&self, args: &[&str]) -> Value {
        let mut with_json = args.to_vec();
        with_json.push("--json");
        self.ok(&with_json).json()
    }

    /// Runs, asserts exit `code` and a one-line error naming `needle`; returns the line.
    pub fn fails(&self, args: &[&str], code: i32, needle: &str) -> String {
        let run = self.run(args);
        assert_eq!(run.code, code, "ctxwin {args:?}: stdout {}\nstderr {}", run.stdout, run.stderr);
        assert_eq!(run.stderr.lines().count(), 1, "not one line: {}", run.stderr);
        assert!(run.stderr.starts_with("error: "), "{}", run.stderr);
        assert!(run.stderr.contains(needle), "{:?} not in {}", needle, run.stderr);
        run.stderr
    }
}

/// The repository's shipped example session.
pub fn example_path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/agent-session.jsonl")
}
