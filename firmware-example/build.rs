//! Puts `memory.x` where the linker finds it and links with cortex-m-rt's and defmt's scripts.
//!
//! `rustc-link-arg` (not `-bins`) so every binary of the package gets the vector table;
//! `-Tdefmt.x` per binary, for those that log with defmt.

use std::{env, fs, path::PathBuf};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let out = PathBuf::from(env::var_os("OUT_DIR").ok_or("OUT_DIR not set")?);
    fs::write(out.join("memory.x"), include_bytes!("memory.x"))?;
    // cortex-m-rt's `device` feature includes `device.x` for interrupt handler names; the
    // vectors (src/vectors.rs) all point at `DefaultHandler`, so it declares nothing.
    fs::write(out.join("device.x"), b"/* no device-specific handlers */\n")?;
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
