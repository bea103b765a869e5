//! Generates the gRPC types and stubs from `proto/toolgate/v1/toolgate.proto`, and their
//! proto3 JSON (serde) implementations.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut config = tonic_prost_build::Config::new();
    // A vendored protoc means nobody has to install one; an explicit PROTOC still wins.
    if std::env::var_os("PROTOC").is_none() {
        config.protoc_executable(protoc_bin_vendored::protoc_bin_path()?);
    }
    let out_dir = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
    let descriptor_path = out_dir.join("toolgate_descriptor.bin");
    tonic_prost_build::configure()
        .file_descriptor_set_path(&descriptor_path)
        .compile_with_config(
            config,
            &["../../proto/toolgate/v1/toolgate.proto"],
            &["../../proto"],
        )?;
    // Proto3 JSON as the CLI prints it: the field names of the .proto (snake_case, as the
    // documentation and the Python stubs spell them) and every field, defaults included, so
    // a script finds `error_code` empty rather than missing.
    let descriptors = std::fs::read(&descriptor_path)?;
    pbjson_build::Builder::new()
        .register_descriptors(&descriptors)?
        .preserve_proto_field_names()
        .emit_fields()
        .build(&[".toolgate.v1"])?;
    println!("cargo:rerun-if-changed=../../proto");
    Ok(())
}
