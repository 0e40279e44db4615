//! Expressions: jq, evaluated by jaq, compiled once per definition version.
//!
//! A [`Template`] is a `config` (or `output`) value with `${ jq }` strings in
//! it: a string that is one whole `${ … }` keeps the result's JSON type, one
//! with text around it interpolates the results as text. `${ .secrets.NAME }`
//! is never evaluated here: it is kept as written, for the worker to resolve
//! from its own environment, so a secret never reaches PostgreSQL, a stream,
//! the API or a log.

use std::fmt;
use std::sync::Arc;

use jaq_core::load::{Arena, File, Loader};
use jaq_core::{data, unwrap_valr, Compiler, Ctx, Vars};
use jaq_json::Val;
use serde_json::{Map, Value};

type Filter = jaq_core::Filter<data::JustLut<Val>>;

/// A compiled jq expression.
#[derive(Clone)]
pub struct Expr {
    source: String,
    filter: Arc<Filter>,
}

impl fmt::Debug for Expr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Expr({:?})", self.source)
    }
}

impl PartialEq for Expr {
    fn eq(&self, other: &Self) -> bool {
        self.source == other.source
    }
}

impl Expr {
    /// Parses and compiles `source`, or says why it is not valid jq.
    pub fn compile(source: &str) -> Result<Expr, String> {
        let program = File { code: source, path: () };
        let defs = jaq_core::defs().chain(jaq_std::defs()).chain(jaq_json::defs());
        let funs = jaq_core::funs().chain(jaq_std::funs()).chain(jaq_json::funs());
        let loader = Loader::new(defs);
        let arena = Arena::default();
        let modules = loader.load(&arena, program).map_err(|errs| {
            let parts: Vec<String> = errs.into_iter().map(|(_, e)| format!("{e:?}")).collect();
            format!("invalid jq {source:?}: {}", parts.join("; "))
        })?;
        let filter = Compiler::default().with_funs(funs).compile(modules).map_err(|errs| {
            let parts: Vec<String> = errs.into_iter().map(|(_, e)| format!("{e:?}")).collect();
            format!("invalid jq {source:?}: {}", parts.join("; "))
        })?;
        Ok(Expr { source: source.to_string(), filter: Arc::new(filter) })
    }

    pub fn source(&self) -> &str {
        &self.source
    }

    /// The expression's first output for `input`; an error names the
    /// expression and what went wrong, and never panics.
    pub fn eval(&self, input: &Value) -> Result<Value, String> {
        self.eval_in(&Scope::new(input)?)
    }

    /// Like [`Expr::eval`], on an input converted once for many expressions.
    pub fn eval_in(&self, scope: &Scope) -> Result<Value, String> {
        let ctx = Ctx::<data::JustLut<Val>>::new(&self.filter.lut, Vars::new([]));
        let mut out = self.filter.id.run((ctx, scope.0.clone())).map(unwrap_valr);
        match out.next() {
            Some(Ok(v)) => {
                let text = v.to_string();
                serde_json::from_str(&text).map_err(|_| format!("{}: result {text} is not JSON", self.source))
            }
            Some(Err(e)) => Err(format!("{}: {e}", self.source)),
            None => Err(format!("{}: produced no value", self.source)),
        }
    }

    /// Evaluates a condition, which must yield a boolean.
    pub fn eval_bool(&self, input: &Value) -> Result<bool, String> {
        self.eval_bool_in(&Scope::new(input)?)
    }

    pub fn eval_bool_in(&self, scope: &Scope) -> Result<bool, String> {
        match self.eval_in(scope)? {
            Value::Bool(b) => Ok(b),
            other => Err(format!("{}: must yield a boolean, got {other}", self.source)),
        }
    }
}

/// An expression input converted to jaq's values once, so that many
/// expressions can read it without converting it again (cheap to clone).
#[derive(Clone)]
pub struct Scope(Val);

impl Scope {
    pub fn new(input: &Value) -> Result<Scope, String> {
        serde_json::from_value(input.clone()).map(Scope).map_err(|e| format!("expression input is not JSON: {e}"))
    }

    /// `null`, for inputs that could not be converted.
    pub fn null() -> Scope {
        Scope(Val::default())
    }
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

#[derive(Debug, Clone, PartialEq)]
enum Piece {
    Text(String),
    Expr(Expr),
}

/// A JSON value with `${ … }` expressions compiled in place.
#[derive(Debug, Clone, PartialEq)]
pub enum Template {
    Literal(Value),
    /// A string that is one whole expression: the result keeps its type.
    Whole(Expr),
    /// Text with expressions in it: results are interpolated as text.
    Text(Vec<PieceOwned>),
    Array(Vec<Template>),
    Object(Vec<(String, Template)>),
}

/// A piece of an interpolated string (public for pattern matching only).
#[derive(Debug, Clone, PartialEq)]
pub struct PieceOwned(Piece);

/// A part of a string as written: plain text, or one `${ … }`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Segment<'a> {
    Text(&'a str),
    /// `raw` is the whole `${ … }`; `source` what is between the braces, trimmed.
    Expr {
        source: &'a str,
        raw: &'a str,
    },
}

/// Cuts `s` into text and `${ … }` segments: the one place that syntax is
/// read (templates at compile time, secret references in the worker). A
/// `}` inside a string literal or nested braces does not close an expression.
pub fn segments(s: &str) -> Result<Vec<Segment<'_>>, String> {
    let mut out = Vec::new();
    let mut rest = s;
    while let Some(start) = rest.find("${") {
        let after = &rest[start + 2..];
        let end = find_close(after).ok_or_else(|| format!("unclosed ${{ in {s:?}"))?;
        if start > 0 {
            out.push(Segment::Text(&rest[..start]));
        }
        out.push(Segment::Expr { source: after[..end].trim(), raw: &rest[start..start + 2 + end + 1] });
        rest = &after[end + 1..];
    }
    if !rest.is_empty() {
        out.push(Segment::Text(rest));
    }
    Ok(out)
}

/// Splits `s` into text and compiled pieces. Secret references stay text.
fn split(s: &str) -> Result<Vec<Piece>, String> {
    let mut pieces = Vec::new();
    for segment in segments(s)? {
        let source = match segment {
            Segment::Text(text) => {
                pieces.push(Piece::Text(text.to_string()));
                continue;
            }
            Segment::Expr { source, .. } => source,
        };
        if secret_name(source).is_some() {
            pieces.push(Piece::Text(format!("${{ {source} }}")));
        } else if source.contains(".secrets") || source.contains("$__loc__") {
            return Err(format!("{source:?}: secrets can only be used as ${{ .secrets.NAME }}"));
        } else if source.is_empty() {
            return Err(format!("empty ${{ }} in {s:?}"));
        } else {
            pieces.push(Piece::Expr(Expr::compile(source)?));
        }
    }
    Ok(pieces)
}

/// The index of the `}` closing an expression, skipping braces inside it and
/// inside string literals.
fn find_close(s: &str) -> Option<usize> {
    let mut depth = 0usize;
    let mut in_string = false;
    let mut escaped = false;
    for (i, c) in s.char_indices() {
        if in_string {
            match c {
                _ if escaped => escaped = false,
                '\\' => escaped = true,
                '"' => in_string = false,
                _ => {}
            }
            continue;
        }
        match c {
            '"' => in_string = true,
            '{' => depth += 1,
            '}' if depth == 0 => return Some(i),
            '}' => depth -= 1,
            _ => {}
        }
    }
    None
}

impl Template {
    /// Compiles every `${ … }` in `value`; the error names the path.
    pub fn compile(value: &Value) -> Result<Template, (String, String)> {
        Self::compile_at(value, String::new())
    }

    fn compile_at(value: &Value, path: String) -> Result<Template, (String, String)> {
        Ok(match value {
            Value::String(s) if s.contains("${") => {
                let mut pieces = split(s).map_err(|e| (path.clone(), e))?;
                match pieces.as_slice() {
                    [Piece::Expr(_)] => match pieces.pop() {
                        Some(Piece::Expr(e)) => Template::Whole(e),
                        _ => unreachable!("matched a single expression"),
                    },
                    _ if pieces.iter().all(|p| matches!(p, Piece::Text(_))) => Template::Literal(value.clone()),
                    _ => Template::Text(pieces.into_iter().map(PieceOwned).collect()),
                }
            }
            Value::Array(items) => Template::Array(
                items
                    .iter()
                    .enumerate()
                    .map(|(i, v)| Self::compile_at(v, format!("{path}[{i}]")))
                    .collect::<Result<_, _>>()?,
            ),
            Value::Object(map) => Template::Object(
                map.iter()
                    .map(|(k, v)| Ok::<_, (String, String)>((k.clone(), Self::compile_at(v, format!("{path}.{k}"))?)))
                    .collect::<Result<_, _>>()?,
            ),
            other => Template::Literal(other.clone()),
        })
    }

    /// The sources of every expression in the template.
    pub fn sources(&self) -> Vec<&str> {
        let mut out = Vec::new();
        self.collect_sources(&mut out);
        out
    }

    fn collect_sources<'a>(&'a self, out: &mut Vec<&'a str>) {
        match self {
            Template::Literal(_) => {}
            Template::Whole(e) => out.push(e.source()),
            Template::Text(pieces) => {
                for PieceOwned(p) in pieces {
                    if let Piece::Expr(e) = p {
                        out.push(e.source());
                    }
                }
            }
            Template::Array(items) => items.iter().for_each(|t| t.collect_sources(out)),
            Template::Object(fields) => fields.iter().for_each(|(_, t)| t.collect_sources(out)),
        }
    }

    /// True when nothing needs evaluating.
    pub fn is_literal(&self) -> bool {
        match self {
            Template::Literal(_) => true,
            Template::Array(items) => items.iter().all(Template::is_literal),
            Template::Object(fields) => fields.iter().all(|(_, t)| t.is_literal()),
            _ => false,
        }
    }

    /// Evaluates against `ctx`. The first failing expression's error is returned.
    pub fn eval(&self, ctx: &Value) -> Result<Value, String> {
        if self.is_literal() {
            return self.eval_in(None);
        }
        self.eval_in(Some(&Scope::new(ctx)?))
    }

    /// Evaluates against a converted context (`None` when there is nothing
    /// to evaluate: [`Template::is_literal`]).
    pub fn eval_in(&self, scope: Option<&Scope>) -> Result<Value, String> {
        let need = |e: &Expr| scope.ok_or_else(|| format!("{}: no context", e.source));
        Ok(match self {
            Template::Literal(v) => v.clone(),
            Template::Whole(e) => e.eval_in(need(e)?)?,
            Template::Text(pieces) => {
                let mut out = String::new();
                for PieceOwned(p) in pieces {
                    match p {
                        Piece::Text(t) => out.push_str(t),
                        Piece::Expr(e) => match e.eval_in(need(e)?)? {
                            Value::String(s) => out.push_str(&s),
                            Value::Null => {}
                            other => out.push_str(&other.to_string()),
                        },
                    }
                }
                Value::String(out)
            }
            Template::Array(items) => Value::Array(items.iter().map(|t| t.eval_in(scope)).collect::<Result<_, _>>()?),
            Template::Object(fields) => {
                let mut map = Map::new();
                for (k, t) in fields {
                    map.insert(k.clone(), t.eval_in(scope)?);
                }
                Value::Object(map)
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segments_close_at_the_right_brace() {
        let s = r#"a ${ {"k": "}"} | .k } b ${.x}"#;
        assert_eq!(
            segments(s).unwrap(),
            vec![
                Segment::Text("a "),
                Segment::Expr { source: r#"{"k": "}"} | .k"#, raw: r#"${ {"k": "}"} | .k }"# },
                Segment::Text(" b "),
                Segment::Expr { source: ".x", raw: "${.x}" },
            ]
        );
        assert!(segments("x ${ .a").is_err(), "an unclosed expression is an error");
    }
    use serde_json::json;

    fn ctx() -> Value {
        json!({"input": {"amount": 42, "who": "ada", "tags": ["a", "b"]},
               "nodes": {"charge": {"output": {"status": 200, "body": {"id": "ch_1"}}, "state": "COMPLETED"}}})
    }

    #[test]
    fn whole_expressions_keep_their_type() {
        let t =
            Template::compile(&json!({"amount": "${ .input.amount }", "tags": "${ .input.tags }", "n": 1})).unwrap();
        assert_eq!(t.eval(&ctx()).unwrap(), json!({"amount": 42, "tags": ["a", "b"], "n": 1}));
    }

    #[test]
    fn text_around_expressions_interpolates() {
        let t = Template::compile(&json!("order ${ .input.amount } for ${.input.who}")).unwrap();
        assert_eq!(t.eval(&ctx()).unwrap(), json!("order 42 for ada"));
        let t = Template::compile(&json!("${ .nodes.charge.output.body | {id} }")).unwrap();
        assert_eq!(t.eval(&ctx()).unwrap(), json!({"id": "ch_1"}), "braces inside an expression are fine");
    }

    #[test]
    fn secrets_are_left_for_the_worker() {
        let t = Template::compile(&json!({"auth": "Bearer ${ .secrets.PAY_TOKEN }", "raw": "${.secrets.X}"})).unwrap();
        assert_eq!(t.eval(&ctx()).unwrap(), json!({"auth": "Bearer ${ .secrets.PAY_TOKEN }", "raw": "${.secrets.X}"}));
        assert!(Template::compile(&json!("${ .secrets | keys }")).is_err(), "only plain references are allowed");
    }

    #[test]
    fn syntax_errors_are_caught_at_compile_time_with_the_path() {
        let (path, msg) = Template::compile(&json!({"body": {"x": "${ .input. | }"}})).unwrap_err();
        assert_eq!(path, ".body.x");
        assert!(msg.contains("invalid jq"), "{msg}");
        assert!(Template::compile(&json!("${ .a ")).is_err());
    }

    #[test]
    fn runtime_errors_are_errors_not_panics() {
        let t = Template::compile(&json!("${ .input.amount | ascii_downcase }")).unwrap();
        let e = t.eval(&ctx()).unwrap_err();
        assert!(e.contains("ascii_downcase"), "{e}");
        let e = Expr::compile("error(\"boom\")").unwrap().eval(&json!(null)).unwrap_err();
        assert!(e.contains("boom"), "{e}");
        let e = Expr::compile(".input.amount").unwrap().eval_bool(&ctx()).unwrap_err();
        assert!(e.contains("boolean"), "{e}");
        assert!(Expr::compile(".nodes.charge.output.status == 200").unwrap().eval_bool(&ctx()).unwrap());
    }

    #[test]
    fn node_references_are_found_or_declared_unknown() {
        assert_eq!(node_refs(".nodes.charge.output.status == 200"), Some(vec!["charge".into()]));
        assert_eq!(node_refs(".nodes.a.output + .nodes.\"b-2\".output"), Some(vec!["a".into(), "b-2".into()]));
        assert_eq!(node_refs(".input.nodes_count"), Some(vec![]));
        assert_eq!(node_refs(".nodes | keys"), None);
        assert_eq!(node_refs(".nodes[\"a\"]"), None);
        assert_eq!(node_refs(".[\"nodes\"]"), None);
    }

    #[test]
    fn compiled_expressions_can_be_shared_between_threads() {
        fn send_sync<T: Send + Sync>() {}
        send_sync::<Expr>();
        send_sync::<Template>();
    }
}
