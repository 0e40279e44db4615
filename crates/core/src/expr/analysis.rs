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
    if s.first() != Some(&b'.') {
        return false;
    }
    let ident = |s: &[u8], i: usize| {
        let n = s[i..].iter().take_while(|c| c.is_ascii_alphanumeric() || **c == b'_').count();
        (n > 0 && !s[i].is_ascii_digit()).then_some(i + n)
    };
    let string = |s: &[u8], i: usize| {
        if s.get(i) != Some(&b'"') {
            return None;
        }
        let mut j = i + 1;
        while j < s.len() {
            match s[j] {
                b'"' => return Some(j + 1),
                // An escape, but never an interpolation `\(…)`, which evaluates.
                b'\\' if s.get(j + 1) == Some(&b'(') => return None,
                b'\\' => j += 2,
                _ => j += 1,
            }
        }
        None
    };
    let index = |s: &[u8], i: usize| {
        let neg = usize::from(s.get(i) == Some(&b'-'));
        let n = s[i + neg..].iter().take_while(|c| c.is_ascii_digit()).count();
        (n > 0).then_some(i + neg + n)
    };
    let mut i = 0;
    let mut first = true;
    while i < s.len() {
        let dotted = s[i] == b'.';
        if dotted {
            i += 1;
        } else if s[i] != b'[' {
            return false;
        }
        let step = match s.get(i) {
            // `.` alone, or at the end.
            None if dotted && first => Some(i),
            Some(b'[') => {
                let j = i + 1;
                match string(s, j).or_else(|| index(s, j)) {
                    Some(k) if s.get(k) == Some(&b']') => Some(k + 1),
                    _ => None,
                }
            }
            Some(b'"') if dotted => string(s, i),
            Some(_) if dotted => ident(s, i),
            _ => None,
        };
        let Some(next) = step else { return false };
        i = next;
        if s.get(i) == Some(&b'?') {
            i += 1;
        }
        first = false;
    }
    true
}

#[cfg(test)]
mod tests {
    use super::is_path;

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
