//! Generates the gRPC types and stubs from `proto/toolgate/v1/toolgate.proto`.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut config = tonic_prost_build::Config::new();
    // A vendored protoc means nobody has to install one; an explicit PROTOC still wins.
    if std::env::var_os("PROTOC").is_none() {
        config.protoc_executable(protoc_bin_vendored::protoc_bin_path()?);
    }
    let out_dir = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
    tonic_prost_build::configure()
        .file_descriptor_set_path(out_dir.join("toolgate_descriptor.bin"))
        .compile_with_config(
            config,
            &["../../proto/toolgate/v1/toolgate.proto"],
            &["../../proto"],
        )?;
    println!("cargo:rerun-if-changed=../../proto");
    Ok(())
}
