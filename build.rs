//! Compiles the vendored Envoy rate limit service protocol (`proto/`) into Rust: `protox`
//! parses the `.proto` files (a compiler in Rust, so no `protoc` on the build machine, CI or
//! the Dockerfile's builder), and `tonic-prost-build` writes the messages and the server.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto");
    let files = protox::compile(["envoy/service/ratelimit/v3/rls.proto"], ["proto"])?;
    tonic_prost_build::configure()
        .build_client(false)
        .build_transport(false)
        .compile_fds(files)?;
    Ok(())
}
