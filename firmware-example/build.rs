//! Puts `memory.x` where the linker finds it and links with cortex-m-rt's and defmt's scripts.
//!
//! `rustc-link-arg` (not `-bins`) so every binary of the package gets the vector table;
//! `-Tdefmt.x` per binary, for those that log with defmt.

use std::{env, fs, path::PathBuf};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let out = PathBuf::from(env::var_os("OUT_DIR").ok_or("OUT_DIR not set")?);
    fs::write(out.join("memory.x"), include_bytes!("memory.x"))?;
    println!("cargo:rustc-link-search={}", out.display());
    println!("cargo:rerun-if-changed=memory.x");
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rustc-link-arg=-Tlink.x");
    // defmt's script only for the binaries that log with defmt: `minimal` and `snapshot` print
    // plain text and must not link defmt or its logger.
    for bin in ["firmware-example", "icount"] {
        println!("cargo:rustc-link-arg-bin={bin}=-Tdefmt.x");
    }
    Ok(())
}
