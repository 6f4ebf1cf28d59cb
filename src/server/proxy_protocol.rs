//! The PROXY protocol (haproxy's `proxy-protocol.txt`, versions 1 and 2), `PROXY_PROTOCOL=true`:
//! a TCP load balancer in front (HAProxy `send-proxy-v2`, AWS NLB, ...) says in the first bytes
//! of each connection whom the connection is for, and that source address becomes the client.
//!
//! The parsing is the `ppp` crate's; this module reads the header off the socket and decides
//! what it means, as the specification says:
//!
//! > The receiver MUST be configured to only receive the protocol described in this
//! > specification and MUST not try to guess whether the protocol header is present or not.
//! > [...] the receiver MUST wait for the whole header [...] before parsing it.
//!
//! so every connection from a trusted proxy must begin with a header, and one that does not,
//! or whose header is malformed, is closed. A connection from any other peer is closed before
//! a byte is read: anyone who could reach the port could otherwise name any address.
//!
//! > The receiver may apply a short timeout and decide to abort the connection if the protocol
//! > header is not seen within a few seconds
//!
//! The caller bounds the read by `HEADER_READ_TIMEOUT_MS` from accept.
//!
//! What the header says is kept only in two cases (section 2.1 for v1, 2.2 for v2):
//!
//! > `PROXY UNKNOWN` [...] the receiver must ignore anything presented before the CRLF is found
//! > and use the real connection's endpoints.
//!
//! > `LOCAL`: the connection was established on purpose by the proxy without being relayed
//! > (health checks) [...] the receiver must use the real connection endpoints.
//!
//! and likewise an unspecified or UNIX-socket address family: the TCP peer stays the client.

use std::net::{IpAddr, SocketAddr};

use bytes::{Bytes, BytesMut};
use ppp::v2;
use ppp::{HeaderResult, PartialResult, v1};
use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;

/// The longest header: v2's 16 fixed bytes and a payload of up to 65535 (addresses and TLVs).
/// A v1 header is at most 107 bytes, which the parser checks itself.
pub const MAX_HEADER: usize = 16 + u16::MAX as usize;

/// The longest v1 header, `\r\n` included (section 2.1).
const MAX_V1: usize = 107;

/// The first read's buffer: a v1 header, or a v2 one for IPv6 with a few TLVs, in one read.
const FIRST_READ: usize = 256;

/// What a complete header says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// The client's address, when the header gives one (not `UNKNOWN`, `LOCAL`, unspecified
    /// or a UNIX socket: then the TCP peer is the client).
    pub source: Option<SocketAddr>,
    /// How many bytes the header took: what follows is the client's.
    pub len: usize,
}

/// The start of a connection that is not a good PROXY header.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HeaderError {
    /// Bytes that can be no header, or a header that breaks the specification.
    #[error("malformed PROXY header: {0}")]
    Malformed(String),
    /// Longer than any header may be, and still not complete.
    #[error("PROXY header longer than {MAX_HEADER} bytes")]
    TooLong,
    /// The peer closed the connection before the header was complete.
    #[error("connection closed before the PROXY header was complete")]
    Closed,
    /// The peer closed the connection without sending a byte: a load balancer's TCP health
    /// check, nothing wrong.
    #[error("connection closed before sending anything")]
    Empty,
}

/// Parse the start of a connection: `Ok(None)` while `bytes` may still become a header with
/// more bytes after them, `Ok(Some(header))` once one is complete. Pure, for the fuzzer.
pub fn parse(bytes: &[u8]) -> Result<Option<Header>, HeaderError> {
    // v1 is a line, and the parser reads a line cut short at a space as a bad one ("PROXY
    // TCP4 1.2.3.4 " has an empty destination): wait for its end, as section 2.1 has it,
    //
    // > the receiver [...] must wait for the CRLF [...] within the first 107 bytes
    if bytes.len() < MAX_V1
        && b"PROXY ".starts_with(&bytes[..bytes.len().min(6)])
        && memchr::memchr(b'\n', bytes).is_none()
    {
        return Ok(None);
    }
    // The line ends in CRLF (section 2.1); a bare LF is no end the specification knows, and
    // the parser underneath reads an `UNKNOWN` line cut at one as complete while it reads
    // the same bytes followed by more another way: refused, so one header is read one way.
    if bytes.starts_with(b"PROXY ")
        && let Some(end) = memchr::memchr(b'\n', &bytes[..bytes.len().min(MAX_V1)])
        && (end == 0 || bytes[end - 1] != b'\r')
    {
        return Err(HeaderError::Malformed(
            "a v1 line that does not end in CRLF".into(),
        ));
    }
    let parsed = HeaderResult::parse(bytes);
    if parsed.is_incomplete() {
        return match bytes.len() >= MAX_HEADER {
            true => Err(HeaderError::TooLong),
            false => Ok(None),
        };
    }
    let header = match parsed {
        HeaderResult::V1(Ok(header)) => Header {
            source: match header.addresses {
                v1::Addresses::Tcp4(ip) => {
                    Some(SocketAddr::new(IpAddr::V4(ip.source_address), ip.source_port))
                }
                v1::Addresses::Tcp6(ip) => {
                    Some(SocketAddr::new(IpAddr::V6(ip.source_address), ip.source_port))
                }
                v1::Addresses::Unknown => None,
            },
            len: header.header.len(),
        },
        HeaderResult::V2(Ok(header)) => Header {
            source: match (header.command, header.addresses) {
                (v2::Command::Local, _) => None,
                (v2::Command::Proxy, v2::Addresses::IPv4(ip)) => {
                    Some(SocketAddr::new(IpAddr::V4(ip.source_address), ip.source_port))
                }
                (v2::Command::Proxy, v2::Addresses::IPv6(ip)) => {
                    Some(SocketAddr::new(IpAddr::V6(ip.source_address), ip.source_port))
                }
                (v2::Command::Proxy, v2::Addresses::Unspecified | v2::Addresses::Unix(_)) => None,
            },
            len: header.len(),
        },
        // Neither signature: v2's was tried first and is not there, so this is v1's reason.
        HeaderResult::V1(Err(error)) => return Err(HeaderError::Malformed(error.to_string())),
        HeaderResult::V2(Err(error)) => return Err(HeaderError::Malformed(error.to_string())),
    };
    Ok(Some(header))
}

/// Read the PROXY header at the start of `stream`: what it says, and the bytes read past it
/// (the client's first bytes), to be read before the socket's.
pub async fn read_header(stream: &mut TcpStream) -> Result<(Header, Bytes), HeaderError> {
    let mut buffer = BytesMut::with_capacity(FIRST_READ);
    loop {
        // A v2 header says its length in its first 16 bytes: the buffer grows to it at once.
        if buffer.len() == buffer.capacity() {
            buffer.reserve(buffer.capacity().min(MAX_HEADER - buffer.len()).max(1));
        }
        match stream.read_buf(&mut buffer).await {
            Ok(0) | Err(_) if buffer.is_empty() => return Err(HeaderError::Empty),
            Ok(0) | Err(_) if buffer.is_empty() => return Err(HeaderError::Empty),
            Ok(0) | Err(_) => return Err(HeaderError::Closed),
            Ok(_) => {}
        }
        if let Some(header) = parse(&buffer)? {
            let rest = buffer.split_off(header.len).freeze();
            return Ok((header, rest));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A v2 header: `command` (0 LOCAL, 1 PROXY), `family` and protocol byte, the addresses.
    fn v2(command: u8, family: u8, addresses: &[u8]) -> Vec<u8> {
        let mut header = b"\r\n\r\n\0\r\nQUIT\n".to_vec();
        header.push(0x20 | command);
        header.push(family);
        header.extend_from_slice(&(addresses.len() as u16).to_be_bytes());
        header.extend_from_slice(addresses);
        header
    }

    fn ipv4(source: [u8; 4], destination: [u8; 4], ports: (u16, u16)) -> Vec<u8> {
        let mut addresses = source.to_vec();
        addresses.extend_from_slice(&destination);
        addresses.extend_from_slice(&ports.0.to_be_bytes());
        addresses.extend_from_slice(&ports.1.to_be_bytes());
        addresses
    }

    #[test]
    fn v1_tcp4_and_tcp6_give_the_source() {
        let header = b"PROXY TCP4 198.51.100.7 192.0.2.1 5555 443\r\nGET / HTTP/1.1\r\n";
        assert_eq!(
            parse(header),
            Ok(Some(Header {
                source: Some("198.51.100.7:5555".parse().unwrap()),
                len: 44,
            }))
        );
        let header = b"PROXY TCP6 2001:db8::7 2001:db8::1 5555 443\r\n";
        assert_eq!(
            parse(header).unwrap().unwrap().source,
            Some("[2001:db8::7]:5555".parse().unwrap())
        );
    }

    #[test]
    fn a_v1_line_ends_in_crlf_or_is_malformed() {
        for line in [
            &b"PROXY UNKNOWN \n"[..],
            b"PROXY UNKNOWN\n",
            b"PROXY TCP4 1.2.3.4 5.6.7.8 1 2\n",
        ] {
            assert!(matches!(parse(line), Err(HeaderError::Malformed(_))), "{line:?}");
            let mut longer = line.to_vec();
            longer.extend_from_slice(b"GET / HTTP/1.1\r\n");
            assert_eq!(
                parse(&longer),
                parse(line),
                "{line:?}: read one way, whatever follows"
            );
        }
    }

    #[test]
    fn unknown_and_local_keep_the_tcp_peer() {
        assert_eq!(
            parse(b"PROXY UNKNOWN\r\n"),
            Ok(Some(Header {
                source: None,
                len: 15
            }))
        );
        let local = v2(0, 0x00, &[]);
        assert_eq!(
            parse(&local),
            Ok(Some(Header {
                source: None,
                len: 16
            }))
        );
        // LOCAL with addresses: still the real endpoints.
        let local = v2(0, 0x11, &ipv4([1, 2, 3, 4], [5, 6, 7, 8], (1, 2)));
        assert_eq!(parse(&local).unwrap().unwrap().source, None);
    }

    #[test]
    fn v2_proxy_gives_the_source_and_its_length_with_tlvs() {
        let mut addresses = ipv4([198, 51, 100, 7], [192, 0, 2, 1], (5555, 443));
        // A NOOP TLV (type 0x04) of 3 bytes.
        addresses.extend_from_slice(&[0x04, 0, 3, 0, 0, 0]);
        let mut bytes = v2(1, 0x11, &addresses);
        let len = bytes.len();
        bytes.extend_from_slice(b"\x16\x03\x01");
        assert_eq!(
            parse(&bytes),
            Ok(Some(Header {
                source: Some("198.51.100.7:5555".parse().unwrap()),
                len,
            }))
        );
    }

    #[test]
    fn every_prefix_of_a_header_waits_for_more() {
        let v1 = b"PROXY TCP4 198.51.100.7 192.0.2.1 5555 443\r\n".to_vec();
        let v2 = v2(1, 0x11, &ipv4([198, 51, 100, 7], [192, 0, 2, 1], (5555, 443)));
        for header in [v1, v2] {
            for end in 0..header.len() {
                assert_eq!(parse(&header[..end]), Ok(None), "{:?}", &header[..end]);
            }
            assert!(parse(&header).unwrap().is_some());
        }
    }

    #[test]
    fn what_is_no_header_is_malformed_at_once() {
        for bytes in [
            &b"GET / HTTP/1.1\r\n"[..],
            b"\x16\x03\x01\x02\x00",
            b"PROXY TCP4 198.51.100.7 192.0.2.1 5555\r\n",
            b"PROXY TCP4 2001:db8::1 192.0.2.1 5555 443\r\n",
            b"PROXY TCP5 1.2.3.4 1.2.3.4 1 2\r\n",
            b"PROXY TCP4 1.2.3.4 1.2.3.4 01 2\r\n",
        ] {
            assert!(
                matches!(parse(bytes), Err(HeaderError::Malformed(_))),
                "{:?}: {:?}",
                String::from_utf8_lossy(bytes),
                parse(bytes)
            );
        }
        // Version 1 in the binary signature, and an unknown command.
        let mut wrong_version = v2(1, 0x11, &ipv4([1, 2, 3, 4], [5, 6, 7, 8], (1, 2)));
        wrong_version[12] = 0x11;
        assert!(matches!(parse(&wrong_version), Err(HeaderError::Malformed(_))));
        let mut wrong_command = v2(1, 0x11, &ipv4([1, 2, 3, 4], [5, 6, 7, 8], (1, 2)));
        wrong_command[12] = 0x2F;
        assert!(matches!(parse(&wrong_command), Err(HeaderError::Malformed(_))));
        // Addresses shorter than the family needs.
        assert!(matches!(
            parse(&v2(1, 0x11, &[1, 2, 3])),
            Err(HeaderError::Malformed(_))
        ));
        // A v1 line longer than 107 bytes without its end.
        let long = format!("PROXY TCP6 {}", "f".repeat(120));
        assert!(matches!(parse(long.as_bytes()), Err(HeaderError::Malformed(_))));
    }
}
