//! Builds `mentis-enter` (executor/enter), the freestanding first program of every user process, which
//! the executor embeds (see src/enter.rs). It is built with rustc directly: a program without std needs
//! `panic=abort`, which a Cargo profile would impose on the whole workspace.

use std::path::PathBuf;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=enter/main.rs");
    println!("cargo:rerun-if-changed=enter/enter.rs");
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let rustc = std::env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
    let target = std::env::var("TARGET").expect("cargo sets TARGET");
    let output = Command::new(rustc)
        .args([
            "--edition=2024",
            "--crate-name=mentis_enter",
            "--crate-type=bin",
        ])
        .args(["--target", &target])
        .args([
            "-C",
            "panic=abort",
            "-C",
            "opt-level=2",
            "-C",
            "strip=symbols",
        ])
        // A static executable without the C runtime: `_start` is ours.
        .args(["-C", "relocation-model=static"])
        .args(["-C", "link-arg=-nostartfiles", "-C", "link-arg=-nostdlib"])
        .args([
            "-C",
            "link-arg=-static",
            "-C",
            "link-arg=-Wl,--build-id=none",
        ])
        .arg("-o")
        .arg(out.join("mentis-enter"))
        .arg("enter/main.rs")
        .output()
        .expect("run rustc for mentis-enter");
    if !output.status.success() || !output.stderr.is_empty() {
        // Warnings too: the program is small enough to keep clean.
        panic!(
            "building mentis-enter failed:\n{}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
}
