//! The web terminal embeds xterm.js from web/node_modules (installed by deploy/ensure-web.sh, `npm ci` from
//! web/package-lock.json): a clone without them stops here saying what to run, rather than at an
//! `include_bytes!` that names only a path.

use std::path::Path;

/// The files `web.rs` embeds, relative to the repository's web/ folder.
const ASSETS: &[&str] = &[
    "node_modules/@xterm/xterm/lib/xterm.js",
    "node_modules/@xterm/xterm/css/xterm.css",
    "node_modules/@xterm/addon-fit/lib/addon-fit.js",
];

fn main() {
    let web = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../web");
    println!(
        "cargo:rerun-if-changed={}",
        web.join("package-lock.json").display()
    );
    let missing: Vec<&str> = ASSETS
        .iter()
        .copied()
        .filter(|a| !web.join(a).is_file())
        .collect();
    if !missing.is_empty() {
        eprintln!(
            "error: the web terminal's npm packages are missing ({} in {}).\n\
             Install them with `deploy/ensure-web.sh` (or `make tools`): npm ci in web/, as \
             web/package-lock.json pins them.",
            missing.join(", "),
            web.display()
        );
        std::process::exit(1);
    }
    for a in ASSETS {
        println!("cargo:rerun-if-changed={}", web.join(a).display());
    }
}
