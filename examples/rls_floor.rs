//! The floor of `ShouldRateLimit` for `scripts/bench_decide.sh`: tonic's generated
//! `RateLimitService` server (tollgate's own types, from `proto/`) answering every call with a
//! constant `OK` and one descriptor status, served over h2c by hyper-util as tollgate's
//! `DECIDE_PORT` serves it. What tollgate spends above it is the matcher, the gate, the store
//! and the headers.
//!
//! Deliberately missing: reading the request past decoding it, the descriptor tree, the
//! limiter, metrics, logs, timeouts and connection limits. Not a thing to deploy.
//!
//! Environment: `PORT` (default 8084).

use std::convert::Infallible;

use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use tokio::net::TcpListener;
use tollgate::testing::proto::envoy::service::ratelimit::v3::rate_limit_response::{Code, DescriptorStatus};
use tollgate::testing::proto::envoy::service::ratelimit::v3::rate_limit_service_server::{
    RateLimitService, RateLimitServiceServer,
};
use tollgate::testing::proto::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use tonic::codegen::Service;
use tonic::{Request, Response, Status};

/// Answers every call `OK`, with one status per descriptor as tollgate does.
#[derive(Clone, Copy)]
struct Constant;

#[tonic::async_trait]
impl RateLimitService for Constant {
    async fn should_rate_limit(
        &self,
        request: Request<RateLimitRequest>,
    ) -> Result<Response<RateLimitResponse>, Status> {
        let statuses = request
            .get_ref()
            .descriptors
            .iter()
            .map(|_| DescriptorStatus {
                code: Code::Ok as i32,
                ..DescriptorStatus::default()
            })
            .collect();
        Ok(Response::new(RateLimitResponse {
            overall_code: Code::Ok as i32,
            statuses,
            ..RateLimitResponse::default()
        }))
    }
}

#[tokio::main]
async fn main() -> std::io::Result<()> {
    let port: u16 = std::env::var("PORT")
        .ok()
        .and_then(|port| port.parse().ok())
        .unwrap_or(8084);
    let listener = TcpListener::bind(("127.0.0.1", port)).await?;
    println!(
        "ShouldRateLimit floor (h2c) listening on http://{}",
        listener.local_addr()?
    );
    let server = RateLimitServiceServer::new(Constant);
    loop {
        let (stream, _) = listener.accept().await?;
        let _ = stream.set_nodelay(true);
        let server = server.clone();
        tokio::spawn(async move {
            let service = service_fn(move |request: hyper::Request<Incoming>| {
                let mut server = server.clone();
                async move {
                    let Ok(response) = server.call(request).await;
                    Ok::<_, Infallible>(response.map(|body| {
                        body.map_err(|status| Box::new(status) as Box<dyn std::error::Error + Send + Sync>)
                    }))
                }
            });
            // Connection errors (a client resetting, say) are the client's business here.
            let _ = auto::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}
