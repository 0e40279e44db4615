//! Comparing bearer tokens: the coordinator's `/v1` (users), `/v1/tasks`
//! (workers), `/metrics` and UI login, and the worker's own `/metrics`.

use ring::digest::{digest, SHA256};

/// Whether `given` is `expected`, in time that depends on neither: both
/// are hashed (SHA-256) and the two digests, always of equal length, are
/// compared without an early exit. So a token cannot be guessed byte by
/// byte, nor its length learnt.
pub fn tokens_match(given: &[u8], expected: &[u8]) -> bool {
    let (a, b) = (digest(&SHA256, given), digest(&SHA256, expected));
    let diff = a.as_ref().iter().zip(b.as_ref()).fold(0u8, |acc, (x, y)| acc | (x ^ y));
    std::hint::black_box(diff) == 0
}

/// The token an `Authorization` header value carries. The scheme's name is
/// case-insensitive (RFC 9110 §11.1): `bearer` is `Bearer`.
pub fn bearer(header: Option<&str>) -> Option<&str> {
    let (scheme, token) = header?.split_once(' ')?;
    scheme.eq_ignore_ascii_case("Bearer").then(|| token.trim())
}

/// Whether an `Authorization` header value carries `expected`.
pub fn bearer_matches(header: Option<&str>, expected: &str) -> bool {
    bearer(header).is_some_and(|token| tokens_match(token.as_bytes(), expected.as_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `Authorization: bearer …` was refused, though an authentication
    /// scheme's name is case-insensitive.
    #[test]
    fn the_bearer_scheme_is_case_insensitive() {
        for scheme in ["Bearer", "bearer", "BEARER", "bEaReR"] {
            assert!(bearer_matches(Some(&format!("{scheme} s3cret")), "s3cret"), "{scheme}");
        }
        assert!(!bearer_matches(Some("bearer s3creT"), "s3cret"), "the token itself is not");
    }

    #[test]
    fn tokens_match_exactly() {
        assert!(bearer_matches(Some("Bearer s3cret"), "s3cret"));
        assert!(!bearer_matches(Some("Bearer s3cre"), "s3cret"));
        assert!(!bearer_matches(Some("Bearer s3creT"), "s3cret"));
        assert!(!bearer_matches(Some("Basic s3cret"), "s3cret"));
        assert!(!bearer_matches(Some("Bearers3cret"), "s3cret"));
        assert!(!bearer_matches(Some("s3cret"), "s3cret"));
        assert!(!bearer_matches(None, "s3cret"));
        assert!(!tokens_match(b"", b"s3cret") && !tokens_match(b"s3cret-and-more", b"s3cret"));
        assert!(tokens_match(b"", b""));
    }
}
