//! No fixed sleep in the tests without its reason. A test that sleeps a
//! fixed time to let something happen and then asserts it is slow when the
//! machine is fast and flaky when it is slow: it waits for the thing itself
//! (`composer_testkit::eventually`, `Engine::wait_until`). What must stay a
//! fixed time — a window in which something must NOT happen, the pacing of
//! load or chaos, a handler that stands for slow work — says why in a
//! comment on the line of the sleep or the line before it.
//!
//! Checked here: every call of `sleep` / `sleep_until` (tokio's or std's) in
//! `crates/composer/tests` and `crates/testkit/src`, in code (not in a
//! comment or a string: SQL's `pg_sleep` is a slow statement, not a wait).

#![allow(clippy::unwrap_used)] // a test fails by panicking

use std::fs;
use std::path::{Path, PathBuf};

/// The directories checked, from the workspace root.
const CHECKED: [&str; 2] = ["crates/composer/tests", "crates/testkit/src"];

/// Sleeps allowed without a comment, by file, with why: at most that many.
const UNCOMMENTED: [(&str, usize, &str); 1] =
    [("crates/testkit/src/fake_http.rs", 1, "its `/slow/<ms>/` path is a slow service: the sleep is what it serves")];

/// Words a comment needs to count as a reason.
const REASON_WORDS: usize = 3;

/// A line of source: its code (string contents blanked, comments removed)
/// and the text of its comments.
#[derive(Debug, Default, PartialEq)]
struct Line {
    code: String,
    comment: String,
}

#[derive(Clone, Copy, PartialEq)]
enum State {
    Code,
    BlockComment(usize),
    Str,
    RawStr(usize),
}

/// Splits Rust source into lines of code and comment; strings (also raw
/// and across lines) keep their quotes and lose their contents.
fn lex(text: &str) -> Vec<Line> {
    let mut state = State::Code;
    let mut lines = Vec::new();
    for raw in text.lines() {
        let mut line = Line::default();
        let chars: Vec<char> = raw.chars().collect();
        let mut i = 0;
        while i < chars.len() {
            let (c, next) = (chars[i], chars.get(i + 1).copied());
            match state {
                State::BlockComment(depth) => {
                    if c == '*' && next == Some('/') {
                        state = if depth == 1 { State::Code } else { State::BlockComment(depth - 1) };
                        i += 1;
                    } else if c == '/' && next == Some('*') {
                        state = State::BlockComment(depth + 1);
                        i += 1;
                    } else {
                        line.comment.push(c);
                    }
                }
                State::Str => {
                    if c == '\\' {
                        i += 1;
                    } else if c == '"' {
                        line.code.push('"');
                        state = State::Code;
                    }
                }
                State::RawStr(hashes) => {
                    if c == '"' && chars[i + 1..].iter().take_while(|&&h| h == '#').count() >= hashes {
                        line.code.push('"');
                        state = State::Code;
                        i += hashes;
                    }
                }
                State::Code => {
                    if c == '/' && next == Some('/') {
                        line.comment.extend(&chars[i + 2..]);
                        break;
                    } else if c == '/' && next == Some('*') {
                        state = State::BlockComment(1);
                        i += 1;
                    } else if c == '"' {
                        line.code.push('"');
                        state = State::Str;
                    } else if c == 'r' && matches!(next, Some('"' | '#')) && !ident(chars.get(i.wrapping_sub(1))) {
                        let hashes = chars[i + 1..].iter().take_while(|&&h| h == '#').count();
                        if chars.get(i + 1 + hashes) == Some(&'"') {
                            line.code.push('"');
                            state = State::RawStr(hashes);
                            i += hashes + 1;
                        } else {
                            line.code.push(c);
                        }
                    } else if c == '\'' {
                        // A char literal ('x', '\n', '"'), else a lifetime.
                        let end = if next == Some('\\') {
                            chars.get(i + 3..).and_then(|rest| rest.iter().position(|&q| q == '\'')).map(|p| i + 3 + p)
                        } else {
                            (chars.get(i + 2) == Some(&'\'')).then_some(i + 2)
                        };
                        line.code.push('\'');
                        if let Some(end) = end {
                            line.code.push('\'');
                            i = end;
                        }
                    } else {
                        line.code.push(c);
                    }
                }
            }
            i += 1;
        }
        lines.push(line);
    }
    lines
}

fn ident(c: Option<&char>) -> bool {
    c.is_some_and(|c| c.is_alphanumeric() || *c == '_')
}

/// Whether `code` calls `sleep(` or `sleep_until(` (not `pg_sleep(`).
fn calls_sleep(code: &str) -> bool {
    ["sleep(", "sleep_until("]
        .iter()
        .any(|call| code.match_indices(call).any(|(at, _)| !ident(code[..at].chars().last().as_ref())))
}

fn is_reason(comment: &str) -> bool {
    comment.split_whitespace().count() >= REASON_WORDS
}

/// The lines (1-based) of `text` that sleep with no reason given on the
/// line or in a comment line right before it.
fn unexplained(text: &str) -> Vec<usize> {
    let lines = lex(text);
    let mut found = Vec::new();
    for (n, line) in lines.iter().enumerate() {
        if !calls_sleep(&line.code) || is_reason(&line.comment) {
            continue;
        }
        let before = n.checked_sub(1).map(|p| &lines[p]);
        if before.is_some_and(|b| b.code.trim().is_empty() && is_reason(&b.comment)) {
            continue;
        }
        found.push(n + 1);
    }
    found
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

#[test]
fn every_fixed_sleep_in_the_tests_says_why_it_is_a_fixed_time() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut files = Vec::new();
    for dir in CHECKED {
        rust_files(&root.join(dir), &mut files);
    }
    files.sort();
    assert!(files.len() > 20, "the checked directories moved: {files:?}");
    let mut problems = Vec::new();
    for path in &files {
        let rel = path.strip_prefix(&root).unwrap().to_string_lossy().replace('\\', "/");
        let lines = unexplained(&fs::read_to_string(path).unwrap());
        let allowed = UNCOMMENTED.iter().find(|(file, ..)| *file == rel).map_or(0, |(_, n, _)| *n);
        if lines.len() > allowed {
            problems.push(format!("{rel}: line {lines:?}"));
        }
    }
    assert!(
        problems.is_empty(),
        "a fixed sleep with no reason: wait for what you expect instead (composer_testkit::eventually, \
         Engine::wait_until), or say on the line or the one before why it must be a fixed time \
         (a window in which nothing may happen, pacing):\n{}",
        problems.join("\n")
    );
}

#[test]
fn the_check_sees_a_bare_sleep_and_passes_an_explained_one() {
    let bare =
        "async fn t() {\n    go().await;\n    tokio::time::sleep(Duration::from_millis(300)).await;\n    check();\n}\n";
    assert_eq!(unexplained(bare), [3]);
    let std_sleep = "fn t() {\n    std::thread::sleep(d);\n}\n";
    assert_eq!(unexplained(std_sleep), [2]);
    let imported = "use tokio::time::sleep;\nasync fn t() {\n    sleep(d).await;\n    sleep_until(t).await;\n}\n";
    assert_eq!(unexplained(imported), [3, 4]);
    let before = "    // Nothing may start in this window: an absence.\n    tokio::time::sleep(d).await;\n";
    assert_eq!(unexplained(before), Vec::<usize>::new());
    let same_line = "    tokio::time::sleep(d).await; // the pacing of the load\n";
    assert_eq!(unexplained(same_line), Vec::<usize>::new());
    // A comment two lines up, a word or two, or one after code is no reason.
    let far = "    // Nothing may start in this window.\n    let x = 1;\n    tokio::time::sleep(d).await;\n";
    assert_eq!(unexplained(far), [3]);
    let short = "    // wait\n    tokio::time::sleep(d).await; // a bit\n";
    assert_eq!(unexplained(short), [2]);
    let after_code = "    go(); // the pacing of the load\n    tokio::time::sleep(d).await;\n";
    assert_eq!(unexplained(after_code), [2]);
    // Not a call in code: a comment, a string (also raw, or across lines), SQL.
    let not_code = [
        "    // tokio::time::sleep(d) would do\n",
        "    /* sleep(d) */ let x = 1;\n",
        "    let s = \"tokio::time::sleep(d)\";\n",
        "    let s = r#\"sleep(\"d\")\"#;\n",
        "    let q = \"SELECT\n      pg_sleep(1), sleep(2)\";\n",
        "    c.execute(\"SELECT pg_sleep(0.3)\", &[]);\n",
        "    let c = '\"'; let s = \"x\"; // a char holding a quote\n",
        "    let c = '\\''; let s = \"sleep(d)\";\n",
    ];
    for text in not_code {
        assert_eq!(unexplained(text), Vec::<usize>::new(), "{text}");
    }
    // What follows a string or a comment on the line is code again.
    let after = "    let s = \"a\"; /* b */ tokio::time::sleep(d).await;\n";
    assert_eq!(unexplained(after), [1]);
    let lifetime = "fn f<'a>(x: &'a str) { std::thread::sleep(d) }\n";
    assert_eq!(unexplained(lifetime), [1]);
}
