//! Compiles the protos with protox (pure Rust, no protoc) and tonic-prost-build.

use prost::Message;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
    let files = [
        "mentis/v1/sandbox.proto",
        "mentis/v1/space.proto",
        "mentis/v1/observation.proto",
        "mentis/v1/action.proto",
        "mentis/v1/file.proto",
        "mentis/v1/key.proto",
        "mentis/v1/terminal.proto",
        "mentis/v1/snapshot.proto",
        "mentis/v1/template.proto",
        "mentis/executor/v1/types.proto",
        "mentis/executor/v1/executor.proto",
        "mentis/executor/v1/files.proto",
        "mentis/journal/v1/record.proto",
    ];
    let fds = protox::compile(files, ["."])?;
    // compile_fds() does not honour file_descriptor_set_path(): write the set ourselves for reflection.
    // Reflection shows only the public API, so its set leaves the internal executor protos out.
    let public = protox::compile(files.iter().filter(|f| f.starts_with("mentis/v1/")), ["."])?;
    std::fs::write(out.join("mentis_v1_descriptor.bin"), public.encode_to_vec())?;
    // build_transport(false): the generated `connect` constructor would clash with ActionService.Connect.
    // bytes("."): output chunks are shared between log readers, so they are `Bytes` (cheap clones).
    tonic_prost_build::configure()
        .build_transport(false)
        .bytes(".")
        .compile_fds(fds)?;
    println!("cargo:rerun-if-changed=mentis");
    Ok(())
}
