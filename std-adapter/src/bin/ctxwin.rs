//! `ctxwin`: the command-line tool over a persistent context window (see `ctxwin_std::cli`).

fn main() -> std::process::ExitCode {
    ctxwin_std::cli::main()
}
