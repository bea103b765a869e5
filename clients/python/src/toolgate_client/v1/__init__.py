"""The generated toolgate.v1 stubs: `toolgate_pb2` (messages, with `.pyi` type stubs) and
`toolgate_pb2_grpc` (service stubs). Generated from `proto/toolgate/v1/toolgate.proto` when
the wheel is built."""
