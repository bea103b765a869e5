//! Rust types and tonic client/server stubs generated from `proto/toolgate/v1/toolgate.proto`.
//!
//! Wire types stay here and in the gateway: library crates never see them.

/// The `toolgate.v1` package.
#[allow(
    missing_docs,
    missing_debug_implementations,
    unreachable_pub,
    clippy::all,
    reason = "generated code"
)]
pub mod v1 {
    tonic::include_proto!("toolgate.v1");

    /// The encoded file descriptor set, for gRPC server reflection.
    pub const FILE_DESCRIPTOR_SET: &[u8] =
        tonic::include_file_descriptor_set!("toolgate_descriptor");
}
