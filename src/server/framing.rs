//! Which HTTP/1 request on a connection carried both `Content-Length` and `Transfer-Encoding`.
//!
//! RFC 9112 section 6.1 lets a server either refuse such a request or read it by
//! `Transfer-Encoding` alone, and closing the connection after it either way. hyper does the
//! second: it drops the `Content-Length` before the service sees the request, so nothing in
//! the request says the client sent one. Envoy and nginx refuse it with `400`, since it is
//! the classic shape of a request-smuggling attempt, and so does tollgate: [`Framing`] follows
//! the bytes the client sends, head by head, and remembers the number of the first head with
//! both fields; the service counts requests and refuses that one (see
//! [`crate::proxy::strict::Violation::ContentLengthWithTransferEncoding`]).
//!
//! To count heads it must skip bodies exactly as hyper frames them: `Content-Length` bytes,
//! or chunks up to the last one and its trailers. Where it could disagree with hyper it stops
//! following, and flags nothing more: on the HTTP/2 preface, and on anything hyper itself
//! refuses (which closes the connection). A head with both fields is the last it reads, as
//! hyper closes the connection after it. And the service refuses the flagged request only if
//! it does carry a `Transfer-Encoding`, so a request is refused only when both readings agree
//! on it.
//!
//! An `Upgrade` (or `CONNECT`) request does not stop it. Once the connection has switched
//! protocols (a `101`), the service is never called on it again, so nothing read after is
//! ever consulted, and the server stops the follower then (see `InFlight::switched`). Until then,
//! and for good when the upgrade was not taken (the backend answered `200`, say), the bytes
//! are the next HTTP/1 requests, which hyper reads and the follower must count: stopping at
//! the `Upgrade` header let a request with both fields through after a refused upgrade.

/// A line buffer up to this size is kept for the next line split across reads.
const SMALL_LINE: usize = 1024;

/// Longest line (request line, header, chunk size or trailer) followed; longer ones stop it.
/// hyper's whole head is at most about 400 KiB, its line rarely more than a few KiB.
const MAX_LINE: usize = 64 * 1024;

/// Follows one HTTP/1 connection's incoming bytes.
#[derive(Debug, Default)]
pub(crate) struct Framing {
    state: State,
    /// The line being read, without its end.
    line: Vec<u8>,
    /// What the head being read has said so far.
    head: Head,
    /// Heads read to their end.
    heads: u64,
    /// The number (from 1) of the first head with both `Content-Length` and
    /// `Transfer-Encoding`.
    ambiguous: Option<u64>,
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Before a request line (empty lines are skipped, as hyper does).
    #[default]
    RequestLine,
    /// Header lines, up to the empty one.
    Headers,
    /// This many body bytes of a `Content-Length` body left.
    Body(u64),
    /// A chunk-size line.
    ChunkSize,
    /// This many bytes of chunk data left.
    ChunkData(u64),
    /// The empty line after a chunk's data.
    ChunkEnd,
    /// Trailer lines after the last chunk, up to the empty one.
    Trailers,
    /// No longer followed.
    Stopped,
}

/// What a head says about its body and the connection.
#[derive(Debug, Default, Clone, Copy)]
struct Head {
    /// A `Content-Length` hyper refuses (not digits, or two that differ): without a
    /// `Transfer-Encoding`, hyper answers `400` and closes.
    content_length_invalid: bool,
    content_length: Option<u64>,
    transfer_encoding: bool,
    /// The last `Transfer-Encoding` line ends in `chunked`.
    chunked: bool,
}

impl Framing {
    /// The number (from 1) of the first request head on this connection that carried both
    /// `Content-Length` and `Transfer-Encoding`, once it has been read whole.
    pub(crate) fn ambiguous(&self) -> Option<u64> {
        self.ambiguous
    }

    /// Follow `bytes`, the next ones read from the client.
    pub(crate) fn read(&mut self, mut bytes: &[u8]) {
        while !bytes.is_empty() {
            match self.state {
                State::Stopped => {
                    // Whatever line was being read is of no use now.
                    self.line = Vec::new();
                    return;
                }
                State::Body(left) | State::ChunkData(left) => {
                    let taken = left.min(bytes.len() as u64);
                    bytes = &bytes[taken as usize..];
                    self.state = match (self.state, left - taken) {
                        (State::Body(_), 0) => State::RequestLine,
                        (State::Body(_), left) => State::Body(left),
                        (_, 0) => State::ChunkEnd,
                        (_, left) => State::ChunkData(left),
                    };
                }
                _ => match memchr::memchr(b'\n', bytes) {
                    Some(end) if self.line.len() + end > MAX_LINE => self.stop(),
                    Some(end) => {
                        let (line, rest) = bytes.split_at(end);
                        bytes = &rest[1..];
                        if self.line.is_empty() {
                            self.end_line(line);
                        } else {
                            let mut whole = std::mem::take(&mut self.line);
                            whole.extend_from_slice(line);
                            self.end_line(&whole);
                            // Keep a small buffer for the next split line, not a long one's.
                            if whole.capacity() <= SMALL_LINE {
                                whole.clear();
                                self.line = whole;
                            }
                        }
                    }
                    None => {
                        if self.line.len() + bytes.len() > MAX_LINE {
                            self.stop();
                        } else {
                            self.line.extend_from_slice(bytes);
                        }
                        return;
                    }
                },
            }
        }
    }

    /// Follow no more, and give back the line buffer: a connection may live long after.
    fn stop(&mut self) {
        self.state = State::Stopped;
        self.line = Vec::new();
    }

    /// A whole line, its `\n` removed.
    fn end_line(&mut self, line: &[u8]) {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        self.state = match self.state {
            State::RequestLine if line.is_empty() => State::RequestLine,
            State::RequestLine => self.request_line(line),
            State::Headers if line.is_empty() => self.end_head(),
            State::Headers => self.header(line),
            State::ChunkSize => match chunk_size(line) {
                Some(0) => State::Trailers,
                Some(size) => State::ChunkData(size),
                None => State::Stopped,
            },
            State::ChunkEnd if line.is_empty() => State::ChunkSize,
            State::Trailers if line.is_empty() => State::RequestLine,
            State::Trailers => State::Trailers,
            State::ChunkEnd | State::Body(_) | State::ChunkData(_) | State::Stopped => State::Stopped,
        };
    }

    fn request_line(&mut self, line: &[u8]) -> State {
        if line.starts_with(b"PRI * HTTP/2.0") {
            return State::Stopped;
        }
        self.head = Head::default();
        State::Headers
    }

    fn header(&mut self, line: &[u8]) -> State {
        let Some(colon) = line.iter().position(|&byte| byte == b':') else {
            return State::Stopped;
        };
        let (name, value) = (&line[..colon], &line[colon + 1..]);
        // Most headers are neither: their length says so without comparing.
        if !matches!(name.len(), 14 | 17) {
            return State::Headers;
        }
        let value = value.trim_ascii();
        if name.eq_ignore_ascii_case(b"content-length") {
            match content_length(value) {
                Some(length) if self.head.content_length.is_none_or(|known| known == length) => {
                    self.head.content_length = Some(length);
                }
                _ => self.head.content_length_invalid = true,
            }
        } else if name.eq_ignore_ascii_case(b"transfer-encoding") {
            self.head.transfer_encoding = true;
            let last = value.rsplit(|&byte| byte == b',').next().unwrap_or_default();
            self.head.chunked = last.trim_ascii().eq_ignore_ascii_case(b"chunked");
        }
        State::Headers
    }

    fn end_head(&mut self) -> State {
        self.heads += 1;
        let head = self.head;
        // A `Content-Length` line, valid or not: with a `Transfer-Encoding` hyper ignores its
        // value, and the head is refused all the same.
        let content_length_seen = head.content_length.is_some() || head.content_length_invalid;
        if head.transfer_encoding && content_length_seen {
            self.ambiguous.get_or_insert(self.heads);
            // hyper closes the connection after this request.
            return State::Stopped;
        }
        match head {
            Head {
                content_length_invalid: true,
                ..
            } => State::Stopped,
            Head {
                transfer_encoding: true,
                chunked,
                ..
            } => {
                if chunked {
                    State::ChunkSize
                } else {
                    State::Stopped
                }
            }
            Head {
                content_length: Some(length),
                ..
            } if length > 0 => State::Body(length),
            _ => State::RequestLine,
        }
    }
}

/// A `Content-Length` value as hyper reads it: decimal digits, or a list of equal ones
/// (`5, 5`).
fn content_length(value: &[u8]) -> Option<u64> {
    let mut length = None;
    for part in value.split(|&byte| byte == b',') {
        let part = part.trim_ascii();
        if part.is_empty() || !part.iter().all(u8::is_ascii_digit) {
            return None;
        }
        let parsed: u64 = std::str::from_utf8(part).ok()?.parse().ok()?;
        if length.is_some_and(|known| known != parsed) {
            return None;
        }
        length = Some(parsed);
    }
    length
}

/// A chunk-size line: hex digits, then nothing, whitespace or `;` extensions.
fn chunk_size(line: &[u8]) -> Option<u64> {
    let digits = line.iter().take_while(|byte| byte.is_ascii_hexdigit()).count();
    let rest = &line[digits..];
    if digits == 0 || !(rest.is_empty() || rest[0] == b';' || rest[0] == b' ' || rest[0] == b'\t') {
        return None;
    }
    u64::from_str_radix(std::str::from_utf8(&line[..digits]).ok()?, 16).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Follow `input` fed in pieces of `step` bytes.
    fn follow(input: &[u8], step: usize) -> Framing {
        let mut framing = Framing::default();
        for piece in input.chunks(step) {
            framing.read(piece);
        }
        framing
    }

    /// The same answer however the bytes are cut.
    fn ambiguous(input: &str) -> Option<u64> {
        let whole = follow(input.as_bytes(), input.len().max(1)).ambiguous();
        for step in [1, 2, 3, 7, 64] {
            assert_eq!(follow(input.as_bytes(), step).ambiguous(), whole, "step {step}");
        }
        whole
    }

    const GET: &str = "GET / HTTP/1.1\r\nHost: a\r\n\r\n";

    #[test]
    fn plain_requests_flag_nothing() {
        assert_eq!(ambiguous(GET), None);
        assert_eq!(ambiguous(&GET.repeat(5)), None);
        let posts = "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\nhello".repeat(3);
        assert_eq!(ambiguous(&posts), None);
    }

    #[test]
    fn the_first_head_with_both_is_numbered() {
        let both = "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n";
        assert_eq!(ambiguous(both), Some(1));
        let other_order = "POST / HTTP/1.1\r\ntransfer-encoding: chunked\r\ncontent-length: 3\r\n\r\n";
        assert_eq!(ambiguous(other_order), Some(1));
        assert_eq!(ambiguous(&format!("{GET}{GET}{both}")), Some(3));
        // hyper reads a Content-Length after Transfer-Encoding not at all: any value, valid or
        // not, makes the head one with both.
        for length in ["abc", "1, 2", "-1", ""] {
            let head =
                format!("POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\nContent-Length: {length}\r\n\r\n");
            assert_eq!(ambiguous(&head), Some(1), "{length:?}");
        }
        let twice =
            "POST / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n";
        assert_eq!(ambiguous(twice), Some(1));
    }

    #[test]
    fn a_list_of_equal_lengths_is_one_length() {
        let both = "POST / HTTP/1.1\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n";
        let listed = format!("POST / HTTP/1.1\r\nContent-Length: 5, 5\r\n\r\nhello{both}");
        assert_eq!(ambiguous(&listed), Some(2));
        // Unequal ones hyper refuses (and closes): nothing after is followed.
        let unequal = format!("POST / HTTP/1.1\r\nContent-Length: 5, 6\r\n\r\nhello{both}");
        assert_eq!(ambiguous(&unequal), None);
    }

    #[test]
    fn a_stopped_follower_keeps_no_line() {
        let mut framing = Framing::default();
        framing.read(b"GET / HTTP/1.1\r\nX-Long: ");
        framing.read(&vec![b'a'; MAX_LINE]);
        framing.read(b"more");
        assert_eq!(framing.line.capacity(), 0);
    }

    #[test]
    fn bodies_are_skipped_as_hyper_frames_them() {
        let both = "POST / HTTP/1.1\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n";
        // A body that looks like a head is a body.
        let length = format!("POST / HTTP/1.1\r\nContent-Length: {}\r\n\r\n{both}", both.len());
        assert_eq!(ambiguous(&length), None);
        assert_eq!(ambiguous(&format!("{length}{both}")), Some(2));
        let chunked = format!(
            "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n{:x};ext=1\r\n{both}\r\n4\r\n\r\n\n\r\n0\r\nTrailer: x\r\n\r\n",
            both.len()
        );
        assert_eq!(ambiguous(&chunked), None);
        assert_eq!(ambiguous(&format!("{chunked}{both}")), Some(2));
    }

    #[test]
    fn it_stops_where_it_cannot_follow() {
        let both = "POST / HTTP/1.1\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n";
        for before in [
            "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
            "POST / HTTP/1.1\r\nContent-Length: x\r\n\r\n",
            "POST / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
            "POST / HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n",
            "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
            "GET / HTTP/1.1\r\nno colon\r\n\r\n",
        ] {
            assert_eq!(ambiguous(&format!("{before}{both}")), None, "{before:?}");
        }
        let long = format!("GET /{} HTTP/1.1\r\n\r\n{both}", "a".repeat(MAX_LINE));
        assert_eq!(follow(long.as_bytes(), 4096).ambiguous(), None);
    }

    #[test]
    fn it_follows_past_upgrade_and_connect_requests() {
        // Not switched (the server stops the follower on a 101): HTTP/1 goes on.
        let both = "POST / HTTP/1.1\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n";
        for before in [
            "GET / HTTP/1.1\r\nUpgrade: websocket\r\nConnection: upgrade\r\n\r\n",
            "GET / HTTP/1.1\r\nUpgrade: h2c\r\nContent-Length: 2\r\n\r\nok",
            "CONNECT a:443 HTTP/1.1\r\nHost: a:443\r\n\r\n",
        ] {
            assert_eq!(ambiguous(&format!("{before}{both}")), Some(2), "{before:?}");
        }
    }

    /// One well-formed request, its body any bytes at all.
    fn request() -> impl Strategy<Value = Vec<u8>> {
        let body = proptest::collection::vec(any::<u8>(), 0..300);
        let chunks = proptest::collection::vec(proptest::collection::vec(any::<u8>(), 1..100), 0..4);
        prop_oneof![
            Just(GET.as_bytes().to_vec()),
            body.prop_map(|body| {
                let mut request =
                    format!("PUT / HTTP/1.1\r\ncontent-length: {}\r\n\r\n", body.len()).into_bytes();
                request.extend(body);
                request
            }),
            chunks.prop_map(|chunks| {
                let mut request = b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec();
                for chunk in chunks {
                    request.extend(format!("{:X};a=b\r\n", chunk.len()).into_bytes());
                    request.extend(chunk);
                    request.extend(b"\r\n");
                }
                request.extend(b"0\r\nx-trailer: 1\r\n\r\n");
                request
            }),
        ]
    }

    proptest! {
        #[test]
        fn requests_are_counted_whatever_their_bodies_hold(
            requests in proptest::collection::vec(request(), 0..6),
            both in any::<bool>(),
            step in 1usize..200,
        ) {
            let mut input = requests.concat();
            if both {
                input.extend(b"POST / HTTP/1.1\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n");
            }
            let expected = both.then_some(requests.len() as u64 + 1);
            prop_assert_eq!(follow(&input, step).ambiguous(), expected);
        }

        #[test]
        fn any_bytes_are_followed_without_panicking(input in proptest::collection::vec(any::<u8>(), 0..2000), step in 1usize..300) {
            follow(&input, step);
        }
    }

    #[test]
    fn leading_empty_lines_and_bare_newlines_are_read_as_hyper_does() {
        assert_eq!(
            ambiguous("\r\n\r\nPOST / HTTP/1.1\nContent-Length: 0\nTransfer-Encoding: chunked\n\n"),
            Some(1)
        );
    }
}
