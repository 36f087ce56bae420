//! `ctxwin`: the command-line tool over a persistent context window (see the `ctxwin_cli` crate).

fn main() -> std::process::ExitCode {
    ctxwin_cli::main()
}
