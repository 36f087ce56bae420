//! The proxy under test, as a user runs it: the `ctxwin-proxy` binary in a process of its
//! own, configured by a `ctxwin.toml` with a `[proxy]` section, in a fresh state directory.
//! Only its HTTP face and its configuration file are used, so the bench keeps working
//! whatever changes inside.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};

/// A running proxy process.
pub struct ProxyProcess {
    child: Child,
    /// Its base URL (`http://127.0.0.1:PORT`).
    pub base: String,
    dir: tempfile::TempDir,
}

impl ProxyProcess {
    /// Starts the proxy in front of `upstream` with `windows` (model name → context window)
    /// and `extra` TOML appended to its configuration file.
    pub fn start(upstream: SocketAddr, windows: &[(&str, u32)], extra: &str) -> ProxyProcess {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let state = dir.path().join("state");
        // The windows are an inline table so that `extra`'s keys before any table header are
        // `[proxy]`'s (`observation_limit = 2000`), and its tables come after.
        let windows: Vec<String> =
            windows.iter().map(|(model, window)| format!("{model:?} = {window}")).collect();
        let mut toml = format!(
            "[proxy]\nupstream = \"http://{upstream}\"\nlisten = \"127.0.0.1:0\"\nstate_dir = {:?}\nwindows = {{ {} }}\nclock_header = \"{}\"\n",
            state.display().to_string(),
            windows.join(", "),
            crate::client::CLOCK_HEADER
        );
        toml.push_str(extra);
        let config = dir.path().join("ctxwin.toml");
        std::fs::write(&config, toml).expect("write the proxy's configuration");
        let log =
            std::fs::File::create(dir.path().join("proxy.log")).expect("the proxy's log file");
        let mut command = Command::new(env!("CARGO_BIN_EXE_ctxwin-proxy"));
        for (name, _) in std::env::vars_os() {
            if name.to_string_lossy().starts_with("CTXWIN_PROXY_") {
                command.env_remove(name);
            }
        }
        let mut child = command
            .arg("--config")
            .arg(&config)
            .current_dir(dir.path())
            .env("RUST_LOG", std::env::var("BILL_PROXY_LOG").unwrap_or_else(|_| "warn".into()))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(log)
            .spawn()
            .expect("start ctxwin-proxy");
        let mut line = String::new();
        if let Some(stdout) = child.stdout.take() {
            let _ = BufReader::new(stdout).read_line(&mut line);
        }
        let Some(base) = line.trim().strip_prefix("ctxwin-proxy listening on ").map(str::to_string)
        else {
            let _ = child.kill();
            let log = std::fs::read_to_string(dir.path().join("proxy.log")).unwrap_or_default();
            panic!("ctxwin-proxy did not start: {line:?}\n{log}");
        };
        ProxyProcess { child, base, dir }
    }

    /// CPU time (user + system) the proxy process has used, ms (Linux `/proc`; 0 elsewhere).
    pub fn cpu_ms(&self) -> u64 {
        let stat =
            std::fs::read_to_string(format!("/proc/{}/stat", self.child.id())).unwrap_or_default();
        // After the parenthesized name: utime and stime are fields 14 and 15, clock ticks of
        // 10 ms.
        let rest = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
        let fields: Vec<u64> = rest.split_whitespace().map(|f| f.parse().unwrap_or(0)).collect();
        (fields.get(11).copied().unwrap_or(0) + fields.get(12).copied().unwrap_or(0)) * 10
    }

    /// Lines the proxy logged at warning level or above.
    pub fn warnings(&self) -> Vec<String> {
        std::fs::read_to_string(self.dir.path().join("proxy.log"))
            .unwrap_or_default()
            .lines()
            .filter(|l| l.contains("WARN") || l.contains("ERROR"))
            .map(str::to_string)
            .collect()
    }
}

impl Drop for ProxyProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if let Ok(to) = std::env::var("BILL_KEEP_LOG") {
            let _ = std::fs::copy(self.dir.path().join("proxy.log"), to);
        }
    }
}
