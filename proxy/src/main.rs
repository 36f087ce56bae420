//! `ctxwin-proxy --upstream URL [--listen ADDR] [--config ctxwin.toml] [--state-dir DIR]`.
//!
//! A thin caller of [`ctxwin_proxy::run_blocking`], kept for deployments that want the proxy
//! without the CLI; `ctxwin proxy` (in `ctxwin-cli`) runs the same code.

use std::path::PathBuf;
use std::process::ExitCode;

use ctxwin_proxy::{ProxyConfig, RunError};

const USAGE: &str = "usage: ctxwin-proxy [--upstream URL] [--listen HOST:PORT] [--config FILE] [--state-dir DIR] [--max-resident N]
Settings come from the [proxy] section of ctxwin.toml (default .ctxwin/ctxwin.toml when present),
then CTXWIN_PROXY_UPSTREAM / _LISTEN / _KEY / _STATE_DIR / _MAX_RESIDENT, then these flags.
With [store] url (or CTXWIN_STORE_URL) = postgres://..., conversations are kept in that database
and every instance pointed at it serves any of them (a fleet).";

fn configure(args: &[String]) -> Result<ProxyConfig, String> {
    let mut config = ProxyConfig::default();
    let flag = |name: &str| -> Option<String> {
        args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).cloned()
    };
    for arg in args.iter().filter(|a| a.starts_with("--")) {
        if !matches!(
            arg.as_str(),
            "--upstream" | "--listen" | "--config" | "--state-dir" | "--max-resident"
        ) {
            return Err(format!("unknown flag {arg}"));
        }
    }
    let file = flag("--config").map(PathBuf::from).or_else(|| {
        let default = PathBuf::from(".ctxwin/ctxwin.toml");
        default.exists().then_some(default)
    });
    if let Some(file) = file {
        config.apply_file(&file).map_err(|e| e.to_string())?;
    }
    config.apply_env(|k| std::env::var(k).ok()).map_err(|e| e.to_string())?;
    if let Some(upstream) = flag("--upstream") {
        config.upstream = upstream;
    }
    if let Some(listen) = flag("--listen") {
        config.listen =
            listen.parse().map_err(|_| format!("--listen `{listen}` is not HOST:PORT"))?;
    }
    if let Some(dir) = flag("--state-dir") {
        config.state_dir = dir.into();
    }
    if let Some(max) = flag("--max-resident") {
        config.max_resident =
            max.parse().map_err(|_| format!("--max-resident `{max}` is not a number"))?;
    }
    config.validate().map_err(|e| e.to_string())?;
    Ok(config)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "--help" || a == "-h") {
        println!("{USAGE}");
        return ExitCode::SUCCESS;
    }
    ctxwin_proxy::init_logging();
    let config = match configure(&args) {
        Ok(config) => config,
        Err(error) => {
            eprintln!("ctxwin-proxy: {error}\n{USAGE}");
            return ExitCode::from(8);
        }
    };
    match ctxwin_proxy::run_blocking(config) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("ctxwin-proxy: {error}");
            ExitCode::from(if matches!(error, RunError::Listen { .. }) { 4 } else { 1 })
        }
    }
}
