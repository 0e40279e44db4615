//! Why an expression does not parse, in words: what was expected, what was
//! found instead and where (`expected a term … at offset 5, but the
//! expression ends there`), never the parser's own values (`Parse([(Term,
//! "")])`). Offsets count characters from 0 in the expression as written.

use jaq_core::load::{self, lex, parse};

/// Most errors one message lists (a lexer keeps going after the first).
const MAX_LISTED: usize = 3;

/// Longest part of an expression a message quotes, in characters.
const MAX_QUOTED: usize = 200;

/// The message for `code` that did not load.
pub(super) fn load_errors(code: &str, errs: load::Errors<&str, ()>) -> String {
    let mut parts: Vec<String> = Vec::new();
    for (_, e) in errs {
        match e {
            load::Error::Io(io) => {
                parts.extend(io.into_iter().map(|(path, why)| format!("cannot load {path:?}: {why}")))
            }
            load::Error::Lex(lexed) => parts.extend(lexed.into_iter().map(|(e, rest)| lex_error(code, &e, rest))),
            load::Error::Parse(parsed) => {
                parts.extend(parsed.into_iter().map(|(e, found)| parse_error(code, &e, found)))
            }
        }
    }
    invalid(code, parts)
}

/// `invalid jq "<code>": <each part>`, the first [`MAX_LISTED`] parts.
pub(super) fn invalid(code: &str, mut parts: Vec<String>) -> String {
    let more = parts.len().saturating_sub(MAX_LISTED);
    parts.truncate(MAX_LISTED);
    if more > 0 {
        parts.push(format!("and {more} more"));
    }
    format!("invalid jq {:?}: {}", crate::clipped(code, MAX_QUOTED), parts.join("; "))
}

/// Where `part`, a slice of `code`, starts: in characters, `None` when it is
/// not a slice of `code` (a name of the standard library).
pub(super) fn offset_of(code: &str, part: &str) -> Option<usize> {
    let start = (part.as_ptr() as usize).checked_sub(code.as_ptr() as usize)?;
    let end = start.checked_add(part.len())?;
    if end > code.len() {
        return None;
    }
    code.get(..start).map(|before| before.chars().count())
}

/// `at offset N`, or nothing when `part` is not in `code`.
pub(super) fn at(code: &str, part: &str) -> String {
    offset_of(code, part).map(|n| format!(" at offset {n}")).unwrap_or_default()
}

/// A token, quoted and clipped (a block token is the whole block).
fn quoted(token: &str) -> String {
    format!("{:?}", crate::clipped(token, 20))
}

/// A lexer's error: `rest` is the input left where it stopped.
fn lex_error(code: &str, e: &lex::Expect<&str>, rest: &str) -> String {
    let at = at(code, rest);
    match e {
        lex::Expect::Token => match rest.chars().next() {
            Some(c) => format!("unexpected character {c:?}{at}"),
            None => format!("unexpected end{at}"),
        },
        lex::Expect::Digit => format!("expected a digit{at}"),
        lex::Expect::Ident => format!("expected a name after \"$\" or \"@\"{at}"),
        lex::Expect::Delim(open) => {
            let close = match *open {
                "(" => "\")\"",
                "[" => "\"]\"",
                "{" => "\"}\"",
                _ => "a closing quote",
            };
            let opened = offset_of(code, open).map(|n| format!(" at offset {n}")).unwrap_or_default();
            format!("{open:?}{opened} is not closed: expected {close}{at}")
        }
        lex::Expect::Escape => format!("invalid escape sequence{at} (expected \\n, \\t, \\\", \\\\, \\u or \\( )"),
        lex::Expect::Unicode => format!("expected 4 hexadecimal digits after \\u{at}"),
        _ => format!("unexpected text{at}"),
    }
}

/// A parser's error: `found` is the token met instead, empty at the end.
fn parse_error(code: &str, e: &parse::Expect<&str>, found: &str) -> String {
    let at = at(code, found);
    if let parse::Expect::Nothing = e {
        return format!("unexpected {}{at}: the expression should end before it", quoted(found));
    }
    let expected = match e {
        parse::Expect::Just(s) => quoted(s),
        parse::Expect::Var => "a variable ($name)".to_string(),
        parse::Expect::Pattern => "a variable or a destructuring pattern".to_string(),
        parse::Expect::ElseOrEnd => "\"else\" or \"end\"".to_string(),
        parse::Expect::CommaOrRBrack => "\",\" or \"]\"".to_string(),
        parse::Expect::CommaOrRBrace => "\",\" or \"}\"".to_string(),
        parse::Expect::SemicolonOrRParen => "\";\" or \")\"".to_string(),
        parse::Expect::Term => "a term (a value, a path such as .a, or a call such as length)".to_string(),
        parse::Expect::Key => "a key (a name or a string)".to_string(),
        parse::Expect::Ident => "a name".to_string(),
        parse::Expect::Arg => "an argument name".to_string(),
        parse::Expect::Str => "a string".to_string(),
        other => other.as_str().to_string(),
    };
    match found {
        "" => format!("expected {expected}{at}, but the expression ends there"),
        _ => format!("expected {expected}{at}, found {}", quoted(found)),
    }
}

#[cfg(test)]
mod tests {
    use crate::expr::Expr;

    /// What no message may show: the parser's own values.
    const INTERNALS: [&str; 8] = ["Parse(", "Lex(", "Term", "[(", "Just(", "Delim(", "Some(", "None"];

    #[test]
    fn a_bad_expression_is_refused_in_words_naming_the_place() {
        let cases = [
            (".x | ", "expected a term", "offset 5", "ends there"),
            ("", "expected a term", "offset 0", "ends there"),
            ("-", "expected a term", "offset 1", "ends there"),
            ("(1 +)", "expected a term", "offset 4", "found \")\""),
            ("if . then 1", "\"else\" or \"end\"", "offset 11", "ends there"),
            ("if 0 1", "expected \"then\"", "offset 5", "found \"1\""),
            ("{a;}", "\",\" or \"}\"", "offset 2", "found \";\""),
            ("f(0:)", "\";\" or \")\"", "offset 3", "found \":\""),
            (". as", "a variable or a destructuring pattern", "offset 4", "ends there"),
            ("1 2", "unexpected \"2\"", "offset 2", "should end"),
            (".a & .b", "unexpected character '&'", "offset 3", ""),
            ("(1 + 2", "\"(\" at offset 0 is not closed", "expected \")\" at offset 6", ""),
            ("[1, 2", "\"[\" at offset 0 is not closed", "offset 5", ""),
            ("\"abc", "is not closed", "a closing quote at offset 4", ""),
            ("\"a\\qb\"", "invalid escape sequence", "offset 3", ""),
            ("\"\\u12\"", "4 hexadecimal digits", "offset 5", ""),
            ("$", "expected a name", "offset 1", ""),
            ("1e", "expected a digit", "offset 2", ""),
            ("\"é\" | .é", "unexpected character 'é'", "offset 7", ""),
            ("nosuchfn(1)", "nosuchfn/1 is not defined", "offset 0", ""),
            ("$nope", "$nope is not defined", "offset 0", ""),
        ];
        for (source, what, place, found) in cases {
            let e = Expr::compile(source).map(|_| ()).unwrap_err();
            for internal in INTERNALS {
                assert!(!e.contains(internal), "{source:?}: {e} shows {internal}");
            }
            assert!(e.starts_with(&format!("invalid jq {source:?}: ")), "{source:?}: {e}");
            for part in [what, place, found] {
                assert!(e.contains(part), "{source:?}: {e} does not say {part:?}");
            }
        }
    }

    #[test]
    fn a_bad_expression_among_others_is_named_the_same_way() {
        // Compiled together (a definition's), the expression still reports
        // offsets in itself, not in the program it was put in.
        let built = crate::expr::together(|| Expr::compile(".ok").and_then(|_| Expr::compile(".a | | .b")));
        let e = built.unwrap().map(|_| ()).unwrap_err();
        assert!(e.contains("expected a term") && e.contains("offset 5"), "{e}");
        assert!(!e.contains("__composer"), "{e}");
    }
}
