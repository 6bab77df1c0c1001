//! Generates the CSI v1 and kubelet plugin-registration gRPC code from `proto/` into OUT_DIR.
//! protox parses the .proto files in Rust, so no protoc has to be installed on the machine.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protos = ["proto/csi.proto", "proto/pluginregistration.proto"];
    for p in protos {
        println!("cargo:rerun-if-changed={p}");
    }
    let fds = protox::compile(protos, ["proto"])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(fds)?;
    Ok(())
}
