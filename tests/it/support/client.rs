//! A bare HTTP/1.1 client (one connection per request) that can bind any local address, so
//! tests can be different clients: loopback accepts every 127.x source address.

use std::net::{IpAddr, SocketAddr};

use bytes::Bytes;
use http::{HeaderMap, Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use tokio::net::TcpSocket;

/// A response, fully read.
#[derive(Debug)]
pub struct Reply {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Reply {
    /// A header as a string, if present.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(|v| v.to_str().unwrap())
    }

    /// A numeric header.
    pub fn number(&self, name: &str) -> u64 {
        self.header(name)
            .unwrap_or_else(|| panic!("no {name} header"))
            .parse()
            .unwrap()
    }

    pub fn text(&self) -> &str {
        std::str::from_utf8(&self.body).unwrap()
    }
}

/// Send one request from `from` to `to`.
pub async fn request(
    to: SocketAddr,
    from: IpAddr,
    method: Method,
    path: &str,
    headers: &[(&str, &str)],
    body: Bytes,
) -> Reply {
    let socket = TcpSocket::new_v4().unwrap();
    socket.bind(SocketAddr::new(from, 0)).unwrap();
    let stream = socket.connect(to).await.unwrap();
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(connection);
    let mut builder = Request::builder().method(method).uri(path);
    // A test that names the host sends its own.
    if !headers.iter().any(|(name, _)| name.eq_ignore_ascii_case("host")) {
        builder = builder.header("host", "gateway.test");
    }
    for (name, value) in headers {
        builder = builder.header(*name, *value);
    }
    let response = sender
        .send_request(builder.body(Full::new(body)).unwrap())
        .await
        .unwrap();
    let (parts, body) = response.into_parts();
    Reply {
        status: parts.status,
        headers: parts.headers,
        body: body.collect().await.unwrap().to_bytes(),
    }
}

/// `GET path` from 127.0.0.1.
pub async fn get(to: SocketAddr, path: &str) -> Reply {
    get_from(to, [127, 0, 0, 1].into(), path, &[]).await
}

/// `GET path` from a chosen source address with extra headers.
pub async fn get_from(to: SocketAddr, from: IpAddr, path: &str, headers: &[(&str, &str)]) -> Reply {
    request(to, from, Method::GET, path, headers, Bytes::new()).await
}

/// Send raw bytes on a fresh connection and return the response's status line: for requests
/// a well-behaved client library would refuse to send.
pub async fn raw_status_line(addr: SocketAddr, request: &[u8]) -> String {
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    // The server may answer and close before it has read everything; that is its right.
    let _ = stream.write_all(request).await;
    let mut line = String::new();
    BufReader::new(stream).read_line(&mut line).await.unwrap();
    line.trim_end().to_owned()
}

/// Read a response head byte by byte (so nothing after it, such as a tunnel's first bytes, is
/// consumed), lower-cased.
pub async fn read_head(stream: &mut tokio::net::TcpStream) -> String {
    use tokio::io::AsyncReadExt;

    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        let mut byte = [0u8; 1];
        stream.read_exact(&mut byte).await.unwrap();
        head.push(byte[0]);
    }
    String::from_utf8(head).unwrap().to_ascii_lowercase()
}
