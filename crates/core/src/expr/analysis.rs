//! What an expression's source says before it is compiled: whether it is
//! simple (its time bounded by its input), whether it only reads a path,
//! which nodes it reads, whether it is a secret reference.

/// Names a simple expression may use: paths, literals, operators,
/// conditionals, and functions whose work is linear in their input.
const SIMPLE_NAMES: &[&str] = &[
    "if",
    "then",
    "elif",
    "else",
    "end",
    "and",
    "or",
    "not",
    "null",
    "true",
    "false",
    "length",
    "keys",
    "keys_unsorted",
    "has",
    "tostring",
    "tonumber",
    "ascii_downcase",
    "ascii_upcase",
    "type",
    "select",
    "map",
    "map_values",
    "add",
    "join",
    "first",
    "last",
    "to_entries",
    "from_entries",
    "with_entries",
    "floor",
    "ceil",
    "round",
    "empty",
    "error",
    "values",
    "nulls",
    "strings",
    "numbers",
    "arrays",
    "objects",
    "booleans",
    "iterables",
    "scalars",
    "any",
    "all",
    "startswith",
    "endswith",
    "ltrimstr",
    "rtrimstr",
    "utf8bytelength",
];

/// Whether `source` is simple: written only of paths (not `..`), literals,
/// operators, `if`, and the functions of [`SIMPLE_NAMES`] — no definitions,
/// variables, reductions, loops, recursion, formats or costly natives. Its
/// time is then bounded by its input's size, and its recursion by the
/// source's nesting. Conservative: anything unsure is not simple.
pub fn is_simple(source: &str) -> bool {
    let bytes = source.as_bytes();
    let mut i = 0;
    let mut after_dot = false;
    while i < bytes.len() {
        let c = bytes[i];
        match c {
            b'.' if bytes.get(i + 1) == Some(&b'.') => return false,
            b'.' => {
                after_dot = true;
                i += 1;
                continue;
            }
            b'$' | b'@' | b'#' => return false,
            b'0'..=b'9' => {
                while i < bytes.len() && (bytes[i].is_ascii_alphanumeric() || bytes[i] == b'.') {
                    i += 1;
                }
            }
            c if c.is_ascii_alphabetic() || c == b'_' => {
                let start = i;
                while i < bytes.len() && (bytes[i].is_ascii_alphanumeric() || bytes[i] == b'_') {
                    i += 1;
                }
                let key = source[i..].trim_start().starts_with(':');
                if !after_dot && !key && !SIMPLE_NAMES.contains(&&source[start..i]) {
                    return false;
                }
            }
            // A string literal is data; one that interpolates is not simple.
            b'"' => {
                i += 1;
                while i < bytes.len() && bytes[i] != b'"' {
                    if bytes[i] == b'\\' {
                        if bytes.get(i + 1) == Some(&b'(') {
                            return false;
                        }
                        i += 1;
                    }
                    i += 1;
                }
                i += 1;
            }
            _ => i += 1,
        }
        after_dot = false;
    }
    true
}

/// The node ids an expression reads through `.nodes.<id>`, or `None` when it
/// may read any node (`.nodes[...]`, `.nodes | keys`, …): contexts are built
/// from just these nodes, so evaluating costs the same in a 3-node workflow
/// and in a 1,000-node one.
pub fn node_refs(source: &str) -> Option<Vec<String>> {
    let mut refs = Vec::new();
    let mut rest = source;
    while let Some(i) = rest.find("nodes") {
        let before = rest[..i].chars().last();
        let after = &rest[i + 5..];
        rest = after;
        let whole_word = !after.starts_with(|c: char| c.is_ascii_alphanumeric() || c == '_');
        if !whole_word || (before != Some('.') && before != Some('"')) {
            continue;
        }
        if before == Some('"') {
            return None;
        }
        let name = after.strip_prefix('.')?;
        if let Some(quoted) = name.strip_prefix('"') {
            let end = quoted.find('"')?;
            refs.push(quoted[..end].to_string());
            continue;
        }
        let end = name.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).unwrap_or(name.len());
        if end == 0 {
            return None;
        }
        refs.push(name[..end].to_string());
    }
    Some(refs)
}

/// Whether an expression is a secret reference, `.secrets.NAME`; returns NAME.
pub fn secret_name(source: &str) -> Option<&str> {
    let name = source.trim().strip_prefix(".secrets.")?;
    let valid = !name.is_empty()
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        && !name.starts_with(|c: char| c.is_ascii_digit());
    valid.then_some(name)
}

/// Whether `source` only reads a path of its input (`.`, `.nodes.a.output`,
/// `.input["k"][0]`, each step optionally `?`): it builds nothing, so its
/// result is no larger than a value the scope already holds, whatever the
/// byte limit on what an expression builds.
pub fn is_path(source: &str) -> bool {
    let s = source.trim().as_bytes();
    path_prefix(s).is_some_and(|(end, _)| end == s.len())
}

/// Whether `source` may read the context's `.input`; `false` only when it
/// surely cannot, so that a node none of whose expressions read the run's
/// input is not given it (its conversion costs the input's size).
///
/// Conservative, from the text: `false` for paths from the context whose
/// first key is another (`.nodes.a.output`, `.item`), literals, and those
/// joined by comparisons, arithmetic, `and`, `or`, `//` and `,`, optionally
/// followed by `| anything` (what follows a pipe sees only what precedes
/// it, as `|` binds loosest). Anything else may read the whole context
/// (`.`, `..`, `to_entries`, `. as $c | …`, `.a |= …`): `true`.
pub fn reads_input(source: &str) -> bool {
    let s = source.trim().as_bytes();
    let mut i = 0;
    loop {
        i = match operand(s, i) {
            Some(end) => end,
            None => return true,
        };
        i += s[i..].iter().take_while(|c| c.is_ascii_whitespace()).count();
        if i == s.len() {
            return false;
        }
        match binary_operator(s, i) {
            Some(next) => i = next + s[next..].iter().take_while(|c| c.is_ascii_whitespace()).count(),
            // `|=` updates the context and returns it whole.
            None if s[i] == b'|' && s.get(i + 1) != Some(&b'=') => return false,
            None => return true,
        }
    }
}

/// The end of the operand at `s[i..]` that reads no `.input`: a path from
/// the context whose first key is surely another, or a literal.
fn operand(s: &[u8], i: usize) -> Option<usize> {
    if s.get(i) == Some(&b'.') {
        let (end, first) = path_prefix(&s[i..])?;
        return match first {
            // Escapes could spell `input`.
            Some(key) if key != b"input" && !key.contains(&b'\\') => Some(i + end),
            _ => None,
        };
    }
    let word = |w: &[u8]| {
        let after = s.get(i + w.len());
        (s[i..].starts_with(w) && !after.is_some_and(|c| c.is_ascii_alphanumeric() || *c == b'_'))
            .then_some(i + w.len())
    };
    match s.get(i)? {
        b'"' => string_end(s, i),
        b'-' | b'0'..=b'9' => {
            let n = s[i + 1..].iter().take_while(|c| c.is_ascii_digit() || matches!(c, b'.' | b'e' | b'E')).count();
            let digits = s[i..i + 1 + n].iter().any(u8::is_ascii_digit);
            digits.then_some(i + 1 + n)
        }
        _ => word(b"true").or_else(|| word(b"false")).or_else(|| word(b"null")),
    }
}

/// The end of the operator joining two operands at `s[i..]`; never an
/// assignment (`=`, `+=`, `//=`, …), which returns the context whole.
fn binary_operator(s: &[u8], i: usize) -> Option<usize> {
    const OPERATORS: [&[u8]; 15] =
        [b"==", b"!=", b"<=", b">=", b"//", b"<", b">", b"+", b"-", b"*", b"/", b"%", b",", b"and", b"or"];
    let op = OPERATORS.iter().find(|op| s[i..].starts_with(op))?;
    let end = i + op.len();
    let assigns = s.get(end) == Some(&b'=') && !matches!(*op, b"==" | b"!=" | b"<=" | b">=");
    let word = op[0].is_ascii_alphabetic();
    let glued = word && s.get(end).is_some_and(|c| c.is_ascii_alphanumeric() || *c == b'_');
    (!assigns && !glued).then_some(end)
}

/// The end of the string literal starting at `s[i]`, unless it
/// interpolates (`\(…)`, which evaluates).
fn string_end(s: &[u8], i: usize) -> Option<usize> {
    if s.get(i) != Some(&b'"') {
        return None;
    }
    let mut j = i + 1;
    while j < s.len() {
        match s[j] {
            b'"' => return Some(j + 1),
            b'\\' if s.get(j + 1) == Some(&b'(') => return None,
            b'\\' => j += 2,
            _ => j += 1,
        }
    }
    None
}

/// The path from the context that `s` starts with (`.`, `.a`, `."k"`,
/// `["k"]`, `[n]`, each step optionally `?`): where it ends, and its first
/// step's key as written, if that step names one. `None` when `s` does not
/// start with a whole step.
fn path_prefix(s: &[u8]) -> Option<(usize, Option<&[u8]>)> {
    if s.first() != Some(&b'.') {
        return None;
    }
    let ident = |i: usize| {
        let n = s[i..].iter().take_while(|c| c.is_ascii_alphanumeric() || **c == b'_').count();
        (n > 0 && !s[i].is_ascii_digit()).then_some(i + n)
    };
    let index = |i: usize| {
        let neg = usize::from(s.get(i) == Some(&b'-'));
        let n = s[i + neg..].iter().take_while(|c| c.is_ascii_digit()).count();
        (n > 0).then_some(i + neg + n)
    };
    let mut i = 0;
    let mut first = None;
    while i < s.len() {
        let at = i;
        let dotted = s[i] == b'.';
        if dotted {
            i += 1;
        } else if s[i] != b'[' {
            break;
        }
        // The step and the key it names, if any.
        let step = match s.get(i) {
            Some(b'[') => {
                let j = i + 1;
                match string_end(s, j).map(|k| (k, Some(&s[j + 1..k - 1]))).or_else(|| index(j).map(|k| (k, None))) {
                    Some((k, key)) if s.get(k) == Some(&b']') => Some((k + 1, key)),
                    _ => None,
                }
            }
            Some(b'"') if dotted => string_end(s, i).map(|k| (k, Some(&s[i + 1..k - 1]))),
            Some(_) if dotted => ident(i).map(|k| (k, Some(&s[i..k]))),
            _ => None,
        };
        let step = match step {
            Some(step) => step,
            // `.` alone, or followed by what is no step (`. | f`).
            None if dotted && at == 0 && !matches!(s.get(1), Some(b'.' | b'[')) => (1, None),
            None if at == 0 => return None,
            // A step that does not parse as one ends the path before it.
            None => return Some((at, first.flatten())),
        };
        if at == 0 {
            first = Some(step.1);
        }
        i = step.0;
        if s.get(i) == Some(&b'?') {
            i += 1;
        }
    }
    Some((i, first.flatten()))
}

#[cfg(test)]
mod tests {
    use super::{is_path, reads_input};

    #[test]
    fn an_expression_that_cannot_read_the_input_is_told_from_one_that_may() {
        for other in [
            ".nodes.a.output",
            " .nodes.a.output.url ",
            ".nodes[\"a-b\"].output?",
            ".\"nodes\".a",
            ".item",
            ".item.x + 1",
            ".nodes.a.output.status == 200",
            ".nodes.a.output.ok and .nodes.b.output.ok",
            ".nodes.a.output.n >= -1.5e3",
            ".nodes.a.output // \"none\"",
            ".nodes.a.output, .nodes.b.output",
            ".nodes.a.output | .input",
            ".nodes.a.output|.[] | {x: .input}",
            ".nodes.a.output.n == 1 | not",
            ".run.id",
            "\"text\"",
            "\"a | .input\"",
            "42",
            "null",
            ".previous.x",
            ".nodes.a.\"input\"",
        ] {
            assert!(!reads_input(other), "{other}");
        }
        for may in [
            "",
            ".",
            ". | .input",
            "..",
            ".input",
            ".input.x",
            ".\"input\"",
            ".[\"input\"]",
            ".\"in\\u0070ut\"",
            ".[0]",
            ".[]",
            "to_entries",
            "keys",
            "getpath([\"input\"])",
            ".nodes.a.output and .input",
            ".nodes.a.output, .input",
            ".nodes.a.output // .input",
            ".nodes.a |= 1",
            ".nodes.a = 1",
            ".nodes.a += 1",
            ".nodes.a //= 1",
            ".nodes.a as $x | .input",
            ".nodes.a .input",
            ".nodes.a[.input]",
            ".nodes.a orx",
            ".nodes.a # | .input",
            "[.nodes.a]",
            "-.input",
            "\"\\(.input)\"",
            "def f: .input; .nodes.a | f",
            "if true then .input else 1 end",
            "(.nodes.a) | .input",
            "$__loc__",
        ] {
            assert!(reads_input(may), "{may}");
        }
    }

    #[test]
    fn a_path_is_told_from_an_expression_that_builds() {
        for path in [
            ".",
            ".input",
            " .nodes.big.output ",
            ".nodes.big.output.blob",
            ".nodes[\"a-b\"].output",
            ".nodes.\"a-b\".output",
            ".input.list[0]",
            ".input.list[-1]?",
            ".input[\"x\"][2].y",
            ".a?.b?",
            ".[0]",
            ".[\"k\"]",
            ".a_1.b2",
            ".?",
            ".?.a",
        ] {
            assert!(is_path(path), "{path}");
        }
        for built in [
            "",
            "input",
            "..",
            ".a..b",
            ".a | .b",
            ".a + .b",
            "[.a]",
            "{a: .a}",
            ".[]",
            ".a[]",
            ".a[1:2]",
            ".a[.b]",
            ".a.\"\\(.b)\"",
            ".a[\"\\(.b)\"]",
            ".a.1",
            ".a[",
            ".a[\"x]",
            ".a.b, .c",
            ".a as $x | $x",
            ". * 2",
            ".a // .b",
            "$__loc__",
            ".a[-]",
        ] {
            assert!(!is_path(built), "{built}");
        }
    }
}
