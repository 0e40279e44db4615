//! Templates: JSON values with `${ … }` expressions compiled in place, the
//! one reader of that syntax ([`segments`]), and their evaluation in a
//! [`Sandbox`].

use serde_json::{Map, Value};

use super::analysis::secret_name;
use super::compile::Expr;
use super::eval::{Part, Scope};
use super::guard::Limits;
use super::sandbox::Sandbox;

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

/// A part of a string as written: plain text, one `${ … }`, or `$${`, which
/// stands for the text `${`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Segment<'a> {
    Text(&'a str),
    /// `raw` is the whole `${ … }`; `source` what is between the braces, trimmed.
    Expr {
        source: &'a str,
        raw: &'a str,
    },
    /// `$${`: the text `${`, never an expression or a secret reference.
    Escaped,
}

/// Cuts `s` into text, `${ … }` and `$${` segments: the one place that
/// syntax is read (templates at compile time, secret references in the
/// worker). A `}` inside a string literal or nested braces does not close
/// an expression.
pub fn segments(s: &str) -> Result<Vec<Segment<'_>>, String> {
    let mut out = Vec::new();
    let mut rest = s;
    while let Some(start) = rest.find("${") {
        if start > 0 && rest.as_bytes()[start - 1] == b'$' {
            if start > 1 {
                out.push(Segment::Text(&rest[..start - 1]));
            }
            out.push(Segment::Escaped);
            rest = &rest[start + 2..];
            continue;
        }
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

/// Makes data safe to place in a task's input: every `${` becomes `$${`, so
/// that the worker reads it as text. Only the definition's own text can
/// hold a secret reference; a run's input, an event's payload or a target's
/// answer that contains `${ .secrets.X }` is sent as exactly that text.
pub fn escape_data(v: Value) -> Value {
    match v {
        Value::String(s) if s.contains("${") => Value::String(s.replace("${", "$${")),
        Value::Array(items) => Value::Array(items.into_iter().map(escape_data).collect()),
        Value::Object(map) => Value::Object(
            map.into_iter()
                .map(|(k, v)| (if k.contains("${") { k.replace("${", "$${") } else { k }, escape_data(v)))
                .collect(),
        ),
        other => other,
    }
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
            // Kept escaped: the worker turns it into `${`.
            Segment::Escaped => {
                pieces.push(Piece::Text("$${".to_string()));
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

    /// Whether every expression in it is simple ([`Expr::is_simple`]).
    pub fn is_simple(&self) -> bool {
        match self {
            Template::Literal(_) => true,
            Template::Whole(e) => e.is_simple(),
            Template::Text(pieces) => pieces.iter().all(|PieceOwned(p)| !matches!(p, Piece::Expr(e) if !e.is_simple())),
            Template::Array(items) => items.iter().all(Template::is_simple),
            Template::Object(fields) => fields.iter().all(|(_, t)| t.is_simple()),
        }
    }

    /// Evaluates against `ctx`. The first failing expression's error is returned.
    pub fn eval(&self, sb: &Sandbox, ctx: &Value) -> Result<Value, String> {
        if self.is_literal() {
            return self.eval_in(sb, None);
        }
        self.eval_in(sb, Some(&Scope::new(ctx)?))
    }

    /// Evaluates against a converted context (`None` when there is nothing
    /// to evaluate: [`Template::is_literal`]).
    pub fn eval_in(&self, sb: &Sandbox, scope: Option<&Scope>) -> Result<Value, String> {
        self.eval_as(sb, scope, false, Limits::DEFAULT)
    }

    /// Evaluates a task's input: like [`Template::eval_value`], with every
    /// value that came from data escaped ([`escape_data`]), so that only the
    /// definition's text can reference a secret.
    pub fn eval_input(&self, sb: &Sandbox, scope: Option<&Scope>) -> Result<Value, String> {
        super::eval::with_paths(|| self.eval_as(sb, scope, true, Limits::DEFAULT))
    }

    /// Evaluates a value to store (a TRANSFORM's output, a child's input,
    /// the run's output): like [`Template::eval_in`], but a path in it
    /// (`${ .nodes.big.output }`) may pass on a value the run holds whole,
    /// past what an expression may build, up to `PATH_OUTPUT` for the
    /// whole value.
    pub fn eval_value(&self, sb: &Sandbox, scope: Option<&Scope>) -> Result<Value, String> {
        super::eval::with_paths(|| self.eval_as(sb, scope, false, Limits::DEFAULT))
    }

    /// Like [`Template::eval_in`], under other limits (a MAP's `items`).
    pub fn eval_in_with(&self, sb: &Sandbox, scope: Option<&Scope>, limits: Limits) -> Result<Value, String> {
        self.eval_as(sb, scope, false, limits)
    }

    fn eval_as(&self, sb: &Sandbox, scope: Option<&Scope>, escape: bool, limits: Limits) -> Result<Value, String> {
        let need = |e: &Expr| scope.ok_or_else(|| format!("{}: no context", e.source));
        let data = |v: Value| if escape { escape_data(v) } else { v };
        Ok(match self {
            Template::Literal(v) => v.clone(),
            Template::Whole(e) => data(e.eval_limited(sb, need(e)?, limits)?),
            Template::Text(pieces) => {
                let mut out = String::new();
                for PieceOwned(p) in pieces {
                    let text = match p {
                        Piece::Text(t) => {
                            out.push_str(t);
                            continue;
                        }
                        Piece::Expr(e) => match e.eval_limited(sb, need(e)?, limits)? {
                            Value::String(s) => s,
                            Value::Null => continue,
                            other => other.to_string(),
                        },
                    };
                    match data(Value::String(text)) {
                        Value::String(s) => out.push_str(&s),
                        _ => unreachable!("escaping keeps a string a string"),
                    }
                }
                Value::String(out)
            }
            Template::Array(items) => {
                Value::Array(items.iter().map(|t| t.eval_as(sb, scope, escape, limits)).collect::<Result<_, _>>()?)
            }
            Template::Object(fields) => {
                let mut map = Map::new();
                for (k, t) in fields {
                    map.insert(k.clone(), t.eval_as(sb, scope, escape, limits)?);
                }
                Value::Object(map)
            }
        })
    }
}

/// The scope `{<name>: value}` that several templates over one value share
/// (a new run's tags and keys over its input, a trigger's expressions over
/// its event): converted once, when the first expression that reads
/// anything asks, from the value where it is; never copied, never
/// converted again for the next template.
pub struct OneScope<'a> {
    name: &'static str,
    value: &'a Value,
    scope: std::cell::OnceCell<Result<Scope, String>>,
}

impl<'a> OneScope<'a> {
    pub fn new(name: &'static str, value: &'a Value) -> OneScope<'a> {
        OneScope { name, value, scope: std::cell::OnceCell::new() }
    }

    fn scope(&self) -> Result<&Scope, String> {
        let scope = self.scope.get_or_init(|| Scope::of(Part::Object(vec![(self.name, Part::Value(self.value))])));
        scope.as_ref().map_err(Clone::clone)
    }

    /// `template` evaluated in it; a literal converts nothing.
    pub fn eval(&self, sb: &Sandbox, template: &Template) -> Result<Value, String> {
        match template.is_literal() {
            true => template.eval_in(sb, None),
            false => template.eval_in(sb, Some(self.scope()?)),
        }
    }

    /// `expr` evaluated in it as a condition.
    pub fn eval_bool(&self, sb: &Sandbox, expr: &Expr) -> Result<bool, String> {
        expr.eval_bool_in(sb, self.scope()?)
    }

    /// Whether the value has been converted (by an expression that asked).
    pub fn converted(&self) -> bool {
        self.scope.get().is_some()
    }
}
