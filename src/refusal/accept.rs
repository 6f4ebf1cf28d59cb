//! Which of our refusal formats a client prefers, from its `Accept` (RFC 9110 section 12.5.1).
//!
//! Each media range (`type/subtype`, `type/*` or `*/*`, with an optional weight `;q=`) gives
//! each of our media types its weight if it is the most specific range matching that type
//! (section 12.5.1: "the most specific reference has precedence"). The format chosen has the
//! highest weight; among equal weights, one the client named outright beats one it reached
//! through a wildcard, and then `DENY_FORMAT`'s beats the others. So `*/*` (curl's, and most
//! clients') gets `DENY_FORMAT`; `application/problem+json` gets the problem body, even next to
//! `*/*`; `application/json, text/plain, */*` (axios's) gets JSON.
//!
//! No `Accept`, or one of which none of ours is acceptable (every weight 0, or only other
//! types): `DENY_FORMAT`, as section 12.5.1 allows ("disregard the header field"), since a
//! refusal that cannot be read is better than a 406 that says less. A malformed range is
//! skipped. The client chooses what is parsed, so it is bounded: past [`MAX_ACCEPT_BYTES`] in
//! all or [`MAX_ACCEPT_RANGES`] ranges, the header is disregarded as a whole.

use http::HeaderValue;

use super::DenyFormat;

/// The most bytes of `Accept` (all its lines together) read; browsers send under 200.
pub(crate) const MAX_ACCEPT_BYTES: usize = 1024;

/// The most media ranges read; browsers send under 10.
pub(crate) const MAX_ACCEPT_RANGES: usize = 32;

/// How a range matched one of our types: the higher, the more specific.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Match {
    None,
    Any,
    Type,
    Exact,
}

/// Our media types, in [`DenyFormat::ALL`]'s order: the type, and the whole `type/subtype`.
const OURS: [(&[u8], &[u8]); 3] = [
    (b"application", b"application/json"),
    (b"application", b"application/problem+json"),
    (b"text", b"text/plain"),
];

/// The format `values` (the request's `Accept` lines, in order) prefer; `default` is
/// `DENY_FORMAT`. Each line is read once, split on `,`, each range on `;`: a refusal is the
/// answer a flood gets, and a browser's `Accept` has four ranges or more.
pub(crate) fn choose<'a>(values: impl Iterator<Item = &'a HeaderValue>, default: DenyFormat) -> DenyFormat {
    // Per format (in `DenyFormat::ALL`'s order): the match that set its weight, and the weight
    // in thousandths.
    let mut found = [(Match::None, 0u16); 3];
    // Whether any range but `*/*` was read: if not, nothing is preferred.
    let mut weighed = false;
    let mut bytes = 0;
    let mut ranges = 0;
    for value in values {
        let value = value.as_bytes();
        // What nearly every client that sends one sends: everything, equally.
        if value == b"*/*" {
            found
                .iter_mut()
                .for_each(|entry| *entry = (*entry).max((Match::Any, 1000)));
            continue;
        }
        bytes += value.len();
        if bytes > MAX_ACCEPT_BYTES {
            return default;
        }
        for range in value.split(|&byte| byte == b',') {
            let range = range.trim_ascii();
            if range.is_empty() {
                continue;
            }
            ranges += 1;
            if ranges > MAX_ACCEPT_RANGES {
                return default;
            }
            if let Some((media, weight)) = media_range(range) {
                weighed = true;
                weigh(media, weight, &mut found);
            }
        }
    }
    if !weighed {
        return default;
    }
    // The highest weight; then a type named outright; then the default; then the first.
    let rank = |index: usize| {
        let (matched, weight) = found[index];
        (weight, matched == Match::Exact, DenyFormat::ALL[index] == default)
    };
    let mut best = None;
    for (index, &(_, weight)) in found.iter().enumerate() {
        if weight > 0 && best.is_none_or(|best| rank(index) > rank(best)) {
            best = Some(index);
        }
    }
    best.map_or(default, |index| DenyFormat::ALL[index])
}

/// One media range: `type/subtype` as given (trimmed) and its weight in thousandths (1000
/// without `q`); `None` if a parameter is malformed. A media type that is not one of ours, nor
/// a wildcard, matches nothing, so it is not checked further.
fn media_range(range: &[u8]) -> Option<(&[u8], u16)> {
    let mut parts = range.split(|&byte| byte == b';');
    let media = parts.next()?.trim_ascii();
    let mut weight = 1000;
    // `weight = OWS ";" OWS "q=" qvalue` (RFC 9110 section 12.4.2): no spaces round the `=`.
    for parameter in parts {
        match parameter.trim_ascii() {
            [b'q' | b'Q', b'=', value @ ..] => weight = qvalue(value)?,
            parameter if !parameter.contains(&b'=') => return None,
            _ => {}
        }
    }
    Some((media, weight))
}

/// Record what `media` at `weight` says of each of ours: a more specific range than the one
/// that set a type's weight sets it again (RFC 9110 section 12.5.1).
fn weigh(media: &[u8], weight: u16, found: &mut [(Match, u16); 3]) {
    let wildcard = media.strip_suffix(b"/*");
    for ((kind, whole), entry) in OURS.iter().zip(found.iter_mut()) {
        let matched = match wildcard {
            Some(b"*") => Match::Any,
            Some(range_kind) if range_kind.eq_ignore_ascii_case(kind) => Match::Type,
            Some(_) => Match::None,
            None if media.eq_ignore_ascii_case(whole) => Match::Exact,
            None => Match::None,
        };
        if matched > entry.0 {
            *entry = (matched, weight);
        }
    }
}

/// `qvalue = ( "0" [ "." 0*3DIGIT ] ) / ( "1" [ "." 0*3("0") ] )` (RFC 9110 section 12.4.2),
/// in thousandths.
fn qvalue(text: &[u8]) -> Option<u16> {
    let (whole, fraction) = match text.split_first()? {
        (b'0', rest) => (0, rest),
        (b'1', rest) => (1000, rest),
        _ => return None,
    };
    let digits = match fraction {
        [] => &[][..],
        [b'.', digits @ ..] if digits.len() <= 3 && digits.iter().all(u8::is_ascii_digit) => digits,
        _ => return None,
    };
    let mut thousandths = 0;
    for place in 0..3 {
        thousandths = thousandths * 10 + digits.get(place).map_or(0, |digit| u16::from(digit - b'0'));
    }
    match whole + thousandths {
        weight if weight <= 1000 => Some(weight),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use DenyFormat::{Json, Problem, Text};

    fn chosen(lines: &[&str], default: DenyFormat) -> DenyFormat {
        let values: Vec<HeaderValue> = lines
            .iter()
            .map(|line| HeaderValue::from_str(line).unwrap())
            .collect();
        choose(values.iter(), default)
    }

    #[test]
    fn no_preference_gets_the_configured_format() {
        for default in DenyFormat::ALL {
            assert_eq!(chosen(&[], default), default);
            assert_eq!(chosen(&["*/*"], default), default);
            assert_eq!(chosen(&["*/*;q=0.8"], default), default);
            assert_eq!(chosen(&[""], default), default);
        }
    }

    #[test]
    fn a_client_that_names_a_format_gets_it() {
        for default in DenyFormat::ALL {
            assert_eq!(chosen(&["application/problem+json"], default), Problem);
            assert_eq!(chosen(&["application/problem+json, */*"], default), Problem);
            assert_eq!(chosen(&["text/plain"], default), Text);
            assert_eq!(chosen(&["text/*"], default), Text);
            assert_eq!(chosen(&["application/json"], default), Json);
            assert_eq!(chosen(&["Application/Problem+JSON"], default), Problem);
            assert_eq!(chosen(&["text/plain; charset=utf-8"], default), Text);
        }
    }

    #[test]
    fn weights_decide_then_specificity_then_the_default() {
        // The draft's client: problem details preferred, JSON accepted.
        assert_eq!(
            chosen(&["application/json;q=0.5, application/problem+json"], Json),
            Problem
        );
        assert_eq!(
            chosen(
                &["application/problem+json;q=0.2, application/json;q=0.9"],
                Problem
            ),
            Json
        );
        // `application/*` reaches two of ours equally: the default, if it is one of them.
        assert_eq!(chosen(&["application/*"], Problem), Problem);
        assert_eq!(chosen(&["application/*"], Text), Json);
        // axios: JSON named first, */* for the rest.
        assert_eq!(chosen(&["application/json, text/plain, */*"], Problem), Json);
        // A browser's navigation: text/html is not ours, */* at 0.8 is.
        let browser = "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8";
        assert_eq!(chosen(&[browser], Problem), Problem);
        // The most specific range sets the weight: text/plain at 0 is refused despite */*.
        assert_eq!(chosen(&["*/*, text/plain;q=0"], Text), Json);
        assert_eq!(chosen(&["text/*;q=0.1, text/plain;q=1"], Json), Text);
        // Weights with more places, upper-case Q, spaces round the `;`.
        assert_eq!(
            chosen(
                &["application/json;q=0.501, application/problem+json ; Q=0.5"],
                Problem
            ),
            Json
        );
        // Ranges over two lines read as one list.
        assert_eq!(chosen(&["application/json;q=0.1", "text/plain"], Json), Text);
    }

    #[test]
    fn nothing_of_ours_acceptable_gets_the_configured_format() {
        assert_eq!(chosen(&["image/png"], Problem), Problem);
        assert_eq!(chosen(&["*/*;q=0"], Text), Text);
        assert_eq!(chosen(&["application/json;q=0, text/plain;q=0"], Json), Json);
    }

    #[test]
    fn malformed_ranges_are_skipped() {
        for bad in [
            "text/plain;q=2",
            "text/plain;q=1.5",
            "text/plain;q=0.1234",
            "text/plain;q=",
            "text/plain;q",
            "text",
            "/plain",
            "te xt/plain",
            "text/plain;q=.5",
            "text/plain;q=abc",
        ] {
            assert_eq!(chosen(&[bad], Json), Json, "{bad:?}");
            assert_eq!(
                chosen(&[&format!("{bad}, application/problem+json;q=0.1")], Json),
                Problem,
                "{bad:?}"
            );
        }
        assert_eq!(chosen(&["text/plain;q=1.000"], Json), Text);
        assert_eq!(chosen(&["text/plain;q=0.001"], Json), Text);
        assert_eq!(chosen(&[",,, text/plain ,"], Json), Text);
    }

    #[test]
    fn a_hostile_accept_is_bounded() {
        // Too many ranges: disregarded, whatever the last one says.
        let many = format!("{}text/plain", "image/png, ".repeat(MAX_ACCEPT_RANGES));
        assert!(many.len() < MAX_ACCEPT_BYTES);
        assert_eq!(chosen(&[&many], Json), Json);
        let few = format!("{}text/plain", "image/png, ".repeat(MAX_ACCEPT_RANGES - 1));
        assert_eq!(chosen(&[&few], Json), Text);
        // Too long, in one line or spread over many.
        let long = format!("text/plain;x={}", "a".repeat(MAX_ACCEPT_BYTES));
        assert_eq!(chosen(&[&long], Json), Json);
        let lines: Vec<String> = (0..100)
            .map(|_| "text/plain;x=aaaaaaaaaaaaaaaaaaaa".to_owned())
            .collect();
        let lines: Vec<&str> = lines.iter().map(String::as_str).collect();
        assert_eq!(chosen(&lines, Json), Json);
    }

    #[test]
    fn our_media_types_are_the_content_types_we_send() {
        for (format, (kind, whole)) in DenyFormat::ALL.into_iter().zip(OURS) {
            let content_type = format.content_type();
            let sent = content_type
                .as_bytes()
                .split(|&byte| byte == b';')
                .next()
                .unwrap();
            assert_eq!(sent, whole);
            assert!(whole.starts_with(kind) && whole[kind.len()] == b'/');
        }
    }

    #[test]
    fn qvalues_read_as_rfc_9110_writes_them() {
        for (text, weight) in [
            ("0", Some(0)),
            ("1", Some(1000)),
            ("0.5", Some(500)),
            ("0.05", Some(50)),
            ("1.", Some(1000)),
            ("0.", Some(0)),
            ("1.000", Some(1000)),
            ("1.001", None),
            ("2", None),
            ("", None),
            ("0.1234", None),
        ] {
            assert_eq!(qvalue(text.as_bytes()), weight, "{text:?}");
        }
    }
}
