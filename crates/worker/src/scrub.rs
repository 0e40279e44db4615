//! Finding secret values in text a target sent back, in the forms a value
//! takes on its way through HTTP and JSON: any letter case, URL encoding
//! (`%20` or `+`, hex in either case, whole or in part), JSON string escapes
//! (`\"`, `\/`, `\u0041`, …), hex of its bytes (either case) and base64
//! (standard or URL-safe, at any of the three alignments it can have inside
//! a longer encoded text, so the password of `Authorization: Basic
//! base64(user:password)` is found too).
//!
//! What it cannot find: a value shorter than [`MIN_ENCODED_CHARS`] in any
//! form but its own (every encoding of a three-letter value would match
//! ordinary text), a value split or transformed otherwise (hashed, encrypted,
//! reversed, encoded twice, HTML entities), or base64 whose first or last
//! one or two characters also carry the neighbouring bytes (those few
//! characters are left; the rest of the value is not).

/// Secrets shorter than this (in characters) are matched only as they are.
pub const MIN_ENCODED_CHARS: usize = 4;

/// What replaces a secret.
pub const REDACTED: &str = "[secret]";

/// One form of a secret to look for.
#[derive(Clone)]
struct Pattern {
    chars: Vec<char>,
    /// ASCII letters match in either case.
    fold_case: bool,
    /// A character may also appear URL-encoded or JSON-escaped.
    decode: bool,
}

/// The forms of a set of secret values; finds and replaces them.
#[derive(Clone, Default)]
pub struct Scrubber {
    patterns: Vec<Pattern>,
}

impl Scrubber {
    pub fn new<'a>(values: impl IntoIterator<Item = &'a str>) -> Scrubber {
        Scrubber::with_min(values, MIN_ENCODED_CHARS)
    }

    /// Finds short secrets in every form too: for deciding whether a value
    /// may be quoted, where finding too much only hides a value.
    pub fn detector<'a>(values: impl IntoIterator<Item = &'a str>) -> Scrubber {
        Scrubber::with_min(values, 1)
    }

    fn with_min<'a>(values: impl IntoIterator<Item = &'a str>, min_encoded: usize) -> Scrubber {
        let mut patterns = Vec::new();
        for value in values.into_iter().filter(|v| !v.is_empty()) {
            if value.chars().count() < min_encoded {
                patterns.push(Pattern { chars: value.chars().collect(), fold_case: false, decode: false });
                continue;
            }
            let mut forms = vec![value.to_string()];
            for other in [value.to_uppercase(), value.to_lowercase()] {
                if !forms.contains(&other) {
                    forms.push(other);
                }
            }
            for form in forms {
                patterns.push(Pattern { chars: form.chars().collect(), fold_case: true, decode: true });
            }
            // Hex of its bytes, in either case (a digest's or a dump's form).
            let hex: String = value.bytes().map(|b| format!("{b:02x}")).collect();
            patterns.push(Pattern { chars: hex.chars().collect(), fold_case: true, decode: false });
            for alphabet in [STANDARD, URL_SAFE] {
                for core in base64_cores(value.as_bytes(), alphabet) {
                    if core.len() >= MIN_ENCODED_CHARS {
                        patterns.push(Pattern { chars: core.chars().collect(), fold_case: false, decode: true });
                    }
                }
            }
        }
        Scrubber { patterns }
    }

    pub fn is_empty(&self) -> bool {
        self.patterns.is_empty()
    }

    /// Whether `text` holds a secret in any form this finds.
    pub fn finds(&self, text: &str) -> bool {
        let mut i = 0;
        while i < text.len() {
            if self.longest_at(text, i).is_some() {
                return true;
            }
            i += next_char_len(text, i);
        }
        false
    }

    /// `text` with every form found replaced by [`REDACTED`].
    pub fn scrub(&self, text: &str) -> String {
        let mut out = String::new();
        let (mut copied, mut i) = (0, 0);
        while i < text.len() {
            match self.longest_at(text, i) {
                Some(end) => {
                    out.push_str(&text[copied..i]);
                    out.push_str(REDACTED);
                    copied = end;
                    i = end;
                }
                None => i += next_char_len(text, i),
            }
        }
        out.push_str(&text[copied..]);
        out
    }

    /// The end of the longest form starting at byte `start`.
    fn longest_at(&self, text: &str, start: usize) -> Option<usize> {
        self.patterns.iter().filter_map(|p| match_at(p, text, start)).max()
    }
}

fn next_char_len(text: &str, i: usize) -> usize {
    text[i..].chars().next().map_or(1, char::len_utf8)
}

/// Where `pattern` ends when it starts at byte `start` of `text`. A `%` or
/// `\\` of a secret can appear as itself or encoded, both starting with the
/// same character, so the search tries both ways (remembering where it has
/// been once there are two, so no text makes it exponential).
fn match_at(pattern: &Pattern, text: &str, start: usize) -> Option<usize> {
    let first = *pattern.chars.first()?;
    // Most places start no form: answer those without allocating.
    if as_is(first, pattern, text, start).is_none()
        && (!pattern.decode || encoded(first, pattern, text, start).is_none())
    {
        return None;
    }
    let mut stack = vec![(0usize, start)];
    let mut seen: Option<std::collections::HashSet<(usize, usize)>> = None;
    while let Some((i, at)) = stack.pop() {
        let Some(&c) = pattern.chars.get(i) else { return Some(at) };
        let as_is = as_is(c, pattern, text, at);
        let encoded = if pattern.decode { encoded(c, pattern, text, at) } else { None };
        if let (Some(_), Some(_)) = (as_is, encoded) {
            seen.get_or_insert_with(Default::default);
        }
        for end in [encoded, as_is].into_iter().flatten() {
            if seen.as_mut().is_none_or(|seen| seen.insert((i + 1, end))) {
                stack.push((i + 1, end));
            }
        }
    }
    None
}

/// Where the character `c` of a pattern ends when it is at byte `at` as itself.
fn as_is(c: char, pattern: &Pattern, text: &str, at: usize) -> Option<usize> {
    let t = text[at..].chars().next()?;
    (t == c || (pattern.fold_case && t.eq_ignore_ascii_case(&c))).then(|| at + t.len_utf8())
}

/// Where the character `c` of a pattern ends when it is at byte `at`
/// URL-encoded or JSON-escaped.
fn encoded(c: char, pattern: &Pattern, text: &str, at: usize) -> Option<usize> {
    let rest = &text.as_bytes()[at..];
    let len = match rest.first()? {
        b'+' if c == ' ' => Some(1),
        b'%' => percent_encoded(c, pattern.fold_case, rest),
        b'\\' => json_escaped(c, pattern.fold_case, rest),
        _ => None,
    }?;
    Some(at + len)
}

/// `c` as `%XX` sequences (its UTF-8 bytes) at the start of `b`: their length.
fn percent_encoded(c: char, fold_case: bool, b: &[u8]) -> Option<usize> {
    let mut buf = [0u8; 4];
    let want = c.encode_utf8(&mut buf).as_bytes();
    let mut i = 0;
    for &w in want {
        if b.get(i) != Some(&b'%') {
            return None;
        }
        let byte = u8::try_from(hex(b.get(i + 1..i + 3)?)?).ok()?;
        if byte != w && !(fold_case && byte.eq_ignore_ascii_case(&w)) {
            return None;
        }
        i += 3;
    }
    Some(i)
}

/// `c` as a JSON string escape at the start of `b`: its length.
fn json_escaped(c: char, fold_case: bool, b: &[u8]) -> Option<usize> {
    let short = match b.get(1)? {
        b'"' => '"',
        b'\\' => '\\',
        b'/' => '/',
        b'b' => '\u{8}',
        b'f' => '\u{c}',
        b'n' => '\n',
        b'r' => '\r',
        b't' => '\t',
        b'u' => {
            let high = hex(b.get(2..6)?)?;
            let (decoded, len) = if (0xD800..0xDC00).contains(&high) {
                if b.get(6..8)? != b"\\u" {
                    return None;
                }
                let low = hex(b.get(8..12)?)?;
                if !(0xDC00..0xE000).contains(&low) {
                    return None;
                }
                (char::from_u32(0x10000 + ((high - 0xD800) << 10) + (low - 0xDC00))?, 12)
            } else {
                (char::from_u32(high)?, 6)
            };
            return (decoded == c || (fold_case && decoded.eq_ignore_ascii_case(&c))).then_some(len);
        }
        _ => return None,
    };
    (short == c).then_some(2)
}

/// Hex digits (either case) as a number.
fn hex(digits: &[u8]) -> Option<u32> {
    digits.iter().try_fold(0u32, |n, d| Some(n * 16 + char::from(*d).to_digit(16)?))
}

const STANDARD: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
const URL_SAFE: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

/// Base64 without padding.
fn base64(bytes: &[u8], alphabet: &[u8; 64]) -> String {
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let n = chunk.iter().enumerate().fold(0u32, |n, (i, b)| n | u32::from(*b) << (16 - 8 * i));
        for i in 0..=chunk.len() {
            out.push(char::from(alphabet[(n >> (18 - 6 * i)) as usize & 63]));
        }
    }
    out
}

/// The characters of `value`'s base64 that depend on its bytes alone, for
/// each of the three offsets (modulo 3) it can start at inside a longer
/// encoded text: whatever surrounds it, these characters are there.
fn base64_cores(value: &[u8], alphabet: &[u8; 64]) -> Vec<String> {
    (0..3usize)
        .map(|offset| {
            let mut bytes = vec![0u8; offset];
            bytes.extend_from_slice(value);
            let encoded = base64(&bytes, alphabet);
            // Character i holds bits [6i, 6i + 6); the value's are [8·offset, 8·(offset + len)).
            let first = (8 * offset).div_ceil(6);
            let end = 8 * (offset + value.len()) / 6;
            encoded.get(first..end).unwrap_or_default().to_string()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIX: &str = "AbC d/Ef+xYz&q=1";

    fn scrubbed(secret: &str, text: &str) -> String {
        Scrubber::new([secret]).scrub(text)
    }

    /// Percent-encodes every byte of `s` that is not unreserved.
    fn url_encode(s: &str, space_as_plus: bool, lower_hex: bool) -> String {
        s.bytes()
            .map(|b| match b {
                b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => char::from(b).to_string(),
                b' ' if space_as_plus => "+".to_string(),
                _ if lower_hex => format!("%{b:02x}"),
                _ => format!("%{b:02X}"),
            })
            .collect()
    }

    #[test]
    fn base64_is_the_standard_encoding() {
        assert_eq!(base64(b"user:pass", STANDARD), "dXNlcjpwYXNz");
        assert_eq!(base64(b"ab", STANDARD), "YWI");
        assert_eq!(base64(b"\xfb\xff", STANDARD), "+/8");
        assert_eq!(base64(b"\xfb\xff", URL_SAFE), "-_8");
    }

    #[test]
    fn a_secret_is_found_in_every_form_it_takes_over_http_and_json() {
        let b64 = |s: &str, a| base64(s.as_bytes(), a);
        let forms = [
            MIX.to_string(),
            MIX.to_uppercase(),
            MIX.to_lowercase(),
            url_encode(MIX, false, false),
            url_encode(MIX, true, false),
            url_encode(MIX, false, true),
            url_encode(&MIX.to_uppercase(), true, true),
            // As reqwest puts it in a query: only the space encoded.
            MIX.replace(' ', "%20"),
            serde_json::to_string(&serde_json::json!({"v": MIX})).unwrap(),
            MIX.replace('/', "\\/"),
            MIX.chars().map(|c| format!("\\u{:04X}", c as u32)).collect(),
            b64(MIX, STANDARD),
            b64(MIX, URL_SAFE),
            format!("Basic {}", b64(&format!("user:{MIX}"), STANDARD)),
            format!("Basic {}==", b64(&format!("me:{MIX}"), STANDARD)),
            b64(&format!("xy{MIX}"), URL_SAFE),
            url_encode(&b64(&format!("u:{MIX}"), STANDARD), false, false),
        ];
        for form in forms {
            let text = format!("got <{form}> back");
            let out = scrubbed(MIX, &text);
            assert!(out.contains(REDACTED), "{form:?} is found: {out}");
            for piece in ["AbC", "Ef+x", "xYz&q", "QWJD", "d/Ef"] {
                assert!(!out.contains(piece), "{form:?} leaves {piece:?}: {out}");
            }
            assert!(out.starts_with("got <") && out.ends_with("> back"), "the rest is kept: {out}");
        }
    }

    /// A target echoing a secret in hex (`hexdump`, a debugging page) kept it
    /// in the output, the logs and the history.
    #[test]
    fn a_secret_in_hex_of_either_case_is_scrubbed() {
        let s = Scrubber::new(["tok-123"]);
        let lower: String = "tok-123".bytes().map(|b| format!("{b:02x}")).collect();
        assert_eq!(lower, "746f6b2d313233");
        for text in [lower.clone(), lower.to_uppercase(), format!("0x{lower}!"), format!("a{}b", lower.to_uppercase())]
        {
            let scrubbed = s.scrub(&text);
            assert!(scrubbed.contains(REDACTED) && !scrubbed.to_lowercase().contains(&lower), "{text}: {scrubbed}");
        }
        assert_eq!(s.scrub("746f6b2d3132"), "746f6b2d3132", "a part of it is not the secret");
    }

    #[test]
    fn json_escapes_and_non_ascii_secrets_are_found() {
        let secret = "qu\"ote\\d\nü😀";
        let json = serde_json::to_string(secret).unwrap();
        assert_eq!(scrubbed(secret, &json), format!("\"{REDACTED}\""));
        let escaped: String = secret.encode_utf16().map(|u| format!("\\u{u:04x}")).collect();
        assert_eq!(scrubbed(secret, &escaped), REDACTED);
        assert_eq!(scrubbed(secret, &url_encode(secret, false, false)), REDACTED);
        // `\` of a secret is itself or escaped: both ways are tried, each place once.
        let slashes = format!("{}x", "\\".repeat(40));
        let text = "\\".repeat(200);
        let started = std::time::Instant::now();
        assert_eq!(scrubbed(&slashes, &text), text);
        assert!(started.elapsed() < std::time::Duration::from_secs(2), "{:?}", started.elapsed());
        assert_eq!(
            scrubbed(&slashes, &format!("{text}x")),
            format!("{}{REDACTED}", "\\".repeat(120)),
            "the leftmost match: 80 as 40 escaped"
        );
        let upper_and_lower = scrubbed("Grüße-geheim", "GRÜSSE-GEHEIM grüße-geheim");
        assert_eq!(upper_and_lower, format!("{REDACTED} {REDACTED}"), "ß upper-cases to SS");
    }

    #[test]
    fn short_secrets_are_scrubbed_only_as_they_are() {
        let s = Scrubber::new(["ab1"]);
        assert_eq!(s.scrub("xab1y AB1 ab%31"), format!("x{REDACTED}y AB1 ab%31"));
        assert!(s.finds("ab1") && !s.finds("AB1"));
        assert!(Scrubber::new([""]).is_empty(), "an empty value matches nothing");
        assert!(Scrubber::detector(["ab1"]).finds("x AB%31 y"), "whether a value may be quoted: every form");
        assert_eq!(Scrubber::new(["x"]).scrub("a x b"), format!("a {REDACTED} b"), "one character too");
    }

    #[test]
    fn a_megabyte_answer_is_scrubbed_in_reasonable_time() {
        let s = Scrubber::new([MIX, "another-secret-value-0123456789"]);
        let text = "abcdefghij%\\+ABC".repeat(60_000);
        let started = std::time::Instant::now();
        assert_eq!(s.scrub(&text), text);
        assert!(started.elapsed() < std::time::Duration::from_secs(5), "{:?}", started.elapsed());
    }

    #[test]
    fn text_without_the_secret_is_left_alone() {
        let s = Scrubber::new([MIX]);
        for text in ["", "AbC d/Ef+xYz&q=2", "AbC", "%zz\\u12", "ü", "\\uD800\\u0041"] {
            assert_eq!(s.scrub(text), text);
            assert!(!s.finds(text), "{text}");
        }
    }
}
