//! Expressions: jq, evaluated by jaq, compiled once per definition version.
//!
//! A [`Template`] is a `config` (or `output`) value with `${ jq }` strings in
//! it: a string that is one whole `${ … }` keeps the result's JSON type, one
//! with text around it interpolates the results as text. `${ .secrets.NAME }`
//! is never evaluated here: it is kept as written, for the worker to resolve
//! from its own environment, so a secret never reaches PostgreSQL, a stream,
//! the API or a log.
//!
//! - [`sandbox`]: the one door to the evaluator: every evaluation takes a
//!   [`Sandbox`], which only an evaluation thread holds for every expression.
//! - `value`: the sandbox's data type, which charges every value it builds.
//! - `guard`: the budget of one evaluation (steps, bytes, depth, stack, time).

mod guard;
pub mod sandbox;
mod value;

use std::cell::RefCell;
use std::fmt;
use std::sync::{Arc, LazyLock, OnceLock};

use jaq_core::load::{parse::Def, Arena, File, Loader};
use jaq_core::{Compiler, Ctx, Vars};
use serde_json::{Map, Value};

/// Longest expression, in bytes (`max_expression_bytes`): jq's parser and
/// compiler recurse as deep as an expression nests, and even a thread with
/// [`EVAL_STACK`] must not overflow on the deepest one this allows.
pub const MAX_EXPRESSION_BYTES: usize = 16 * 1024;

/// Whether `source` has an `import "…"` or `include "…"` directive (jq's
/// modules and data files; the sandbox has neither, and jaq panics on a
/// data import it cannot resolve).
fn imports(source: &str) -> bool {
    let bytes = source.as_bytes();
    ["import", "include"].iter().any(|word| {
        source.match_indices(word).any(|(at, _)| {
            let before = at.checked_sub(1).map(|i| bytes[i]);
            let word_starts =
                before.is_none_or(|b| !(b.is_ascii_alphanumeric() || b == b'_' || b == b'$' || b == b'.'));
            let rest = source[at + word.len()..].trim_start();
            word_starts && rest.starts_with('"')
        })
    })
}

/// Runs `f` on a thread of its own with [`EVAL_STACK`] and waits for it:
/// for compiling what users wrote (a definition, a webhook's transform)
/// from a thread whose stack is small, such as a tokio worker's. A panic in
/// `f` comes back as the error.
pub fn on_eval_stack<T: Send>(f: impl FnOnce() -> T + Send) -> Result<T, String> {
    std::thread::scope(|s| {
        let thread = std::thread::Builder::new().name("composer-compile".into()).stack_size(EVAL_STACK);
        match thread.spawn_scoped(s, f) {
            Ok(t) => t.join().map_err(|p| format!("compiling failed: {}", crate::panic_message(&*p))),
            Err(e) => Err(format!("cannot start a thread to compile on: {e}")),
        }
    })
}

pub use guard::{inline, take_exceeded, use_clock, Clock, Exceeded, InlineSpent, Limits};
pub use sandbox::{sandbox_thread, sandboxed, Sandbox, EVAL_STACK};
use value::{Lookup, Sandboxed};

type Filter = jaq_core::Filter<Sandboxed>;
type Native = jaq_core::native::Fun<Sandboxed>;

/// Natives an expression may call: pure functions of their input. Anything
/// that reads the environment, the clock, other inputs or writes to stderr,
/// or exits (`env`, `now`, `input`, `halt`, `debug`, `stderr`, …) is left
/// out, and so is every definition that needs one of them. A jaq upgrade
/// that adds a native does not make it callable: it must be listed here.
const ALLOWED_NATIVES: &[&str] = &[
    "acos",
    "acosh",
    "ascii_downcase",
    "ascii_upcase",
    "asin",
    "asinh",
    "atan",
    "atan2",
    "atanh",
    "cbrt",
    "ceil",
    "copysign",
    "cos",
    "cosh",
    "decode_base64",
    "decode_uri",
    "encode_base64",
    "encode_uri",
    "endswith",
    "erf",
    "erfc",
    "error_empty",
    "escape_html",
    "escape_sh",
    "exp",
    "exp10",
    "exp2",
    "explode",
    "expm1",
    "fabs",
    "fdim",
    "first",
    "floor",
    "fma",
    "fmax",
    "fmin",
    "fmod",
    "frexp",
    "fromdateiso8601",
    "gmtime",
    "group_by",
    "hypot",
    "ilogb",
    "implode",
    "j0",
    "j1",
    "jn",
    "key_values",
    "keys_unsorted",
    "last",
    "ldexp",
    "lgamma",
    "limit",
    "log",
    "log10",
    "log1p",
    "log2",
    "ltrim",
    "ltrimstr",
    "matches",
    "max_by_or_empty",
    "min_by_or_empty",
    "mktime",
    "modf",
    "nearbyint",
    "nextafter",
    "path",
    "path_value",
    "pow",
    "range",
    "remainder",
    "reverse",
    "rint",
    "round",
    "rtrim",
    "rtrimstr",
    "scalbln",
    "sin",
    "sinh",
    "skip",
    "sort",
    "sort_by",
    "split_",
    "split_matches",
    "sqrt",
    "startswith",
    "strftime",
    "strptime",
    "tan",
    "tanh",
    "tgamma",
    "todateiso8601",
    "trim",
    "trunc",
    "unescape_html",
    "utf8bytelength",
    "y0",
    "y1",
    "yn",
];

/// Natives left out on purpose; every native jaq offers is in one list or
/// the other (a test checks), so an upgrade cannot slip one in.
const DENIED_NATIVES: &[&str] = &["env", "halt", "debug_empty", "stderr_empty", "now", "localtime", "strflocaltime"];

/// Definitions that call a denied native.
const DENIED_DEFS: &[&str] = &["halt", "halt_error", "debug", "stderr", "todate_local", "localtime", "now"];

fn allowed_native(name: &str) -> bool {
    ALLOWED_NATIVES.contains(&name) && !DENIED_NATIVES.contains(&name)
}

/// The regex natives of jaq, which the sandbox renames (to
/// [`RESERVED`]-prefixed names no expression may write) and calls only
/// through definitions of its own that charge their work first.
const REGEX_NATIVES: &[(&str, &str)] = &[
    ("matches", "__composer_matches"),
    ("split_matches", "__composer_split_matches"),
    ("split_", "__composer_split_"),
];

/// The prefix of names only the sandbox's own definitions may call.
const RESERVED: &str = "__composer_";

/// `matches`, `split_matches` and `split_` as every regex filter of jq's
/// library (`test`, `match`, `capture`, `scan`, `splits`, `sub`, `gsub`)
/// reaches them: charged by [`value::regex_cost`] before they run.
const METERED_REGEX: &str = "
def matches($re; $flags): __composer_regex_cost($re; $flags) | __composer_matches($re; $flags);
def split_matches($re; $flags): __composer_regex_cost($re; $flags) | __composer_split_matches($re; $flags);
def split_($re; $flags): __composer_regex_cost($re; $flags) | __composer_split_($re; $flags);
";

/// The standard library, parsed once for the whole process; the metered
/// regex definitions come before the library's definitions that use them.
static DEFS: LazyLock<Vec<Def<&'static str>>> = LazyLock::new(|| {
    let metered = jaq_core::load::parse(METERED_REGEX, |p| p.defs()).unwrap_or_default();
    jaq_core::defs()
        .chain(metered)
        .chain(jaq_std::defs())
        .chain(jaq_json::defs())
        .filter(|d| !DENIED_DEFS.contains(&d.name))
        .collect()
});

fn natives() -> impl Iterator<Item = Native> {
    let json = value::json_funs::<Sandboxed>();
    let json_names: Vec<&str> = value::json_funs::<Sandboxed>().map(|(name, _, _)| name).collect();
    jaq_core::funs::<Sandboxed>()
        .chain(jaq_std::funs::<Sandboxed>())
        .filter(move |(name, _, _)| allowed_native(name) && !json_names.contains(name))
        .map(|(name, args, native)| {
            let renamed = REGEX_NATIVES.iter().find(|(from, _)| *from == name).map_or(name, |(_, to)| *to);
            (renamed, args, native)
        })
        .chain(json)
        .chain(value::regex_cost_fun::<Sandboxed>())
}

/// Why a name does not compile; names left out of the sandbox say so.
fn undefined(name: &str, what: jaq_core::compile::Undefined) -> String {
    use jaq_core::compile::Undefined;
    let sandboxed = DENIED_NATIVES.contains(&name)
        || DENIED_DEFS.contains(&name)
        || ["input", "inputs", "$ENV", "ENV", "input_filename"].contains(&name);
    if sandboxed {
        return format!(
            "{name} is not available: expressions cannot read the environment, the clock or other inputs, \
             write to stderr or stop the process"
        );
    }
    match what {
        Undefined::Filter(arity) => format!("{name}/{arity} is not defined"),
        Undefined::Var => format!("${name} is not defined"),
        _ => format!("{name} is not defined"),
    }
}

/// A compiled jq expression, evaluated in a sandbox: only pure functions,
/// and a budget ([`Limits`]) on steps, bytes, depth, recursion and time.
#[derive(Clone)]
pub struct Expr {
    source: String,
    linked: Arc<OnceLock<Linked>>,
    /// Whether it is simple ([`is_simple`]): evaluated by any [`Sandbox`].
    simple: bool,
}

/// The compiled program an expression belongs to: its own, or one shared by
/// every expression of a definition ([`together`]), where `index` picks it.
struct Linked {
    filter: Arc<Filter>,
    index: Option<usize>,
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

/// Expressions waiting to be compiled together: each source and the slot
/// its [`Expr`] reads the compiled program from.
type Batch = Vec<(String, Arc<OnceLock<Linked>>)>;

thread_local! {
    /// The expressions met while [`together`] runs, compiled when it ends.
    static BATCH: RefCell<Option<Batch>> = const { RefCell::new(None) };
}

/// The variable that picks an expression in a shared program.
const PICK: &str = "$__composer_expr";

/// Runs `build` (which compiles expressions with [`Expr::compile`]) so that
/// all its expressions are compiled as one program, with jaq's standard
/// library compiled once for them all instead of once each. `Err` when that
/// program does not compile: run `build` again outside `together` to learn
/// which expression fails and why.
pub fn together<T, E>(build: impl FnOnce() -> Result<T, E>) -> Result<Result<T, E>, String> {
    struct Reset;
    impl Drop for Reset {
        fn drop(&mut self) {
            BATCH.with(|b| b.borrow_mut().take());
        }
    }
    let _reset = Reset;
    BATCH.with(|b| *b.borrow_mut() = Some(Vec::new()));
    let built = build();
    let batch = BATCH.with(|b| b.borrow_mut().take()).unwrap_or_default();
    if built.is_ok() && !batch.is_empty() {
        link(batch)?;
    }
    Ok(built)
}

/// Compiles the expressions of a batch as one program: each a definition,
/// and a main filter that calls the one [`PICK`] names (by halving, so it
/// costs a few steps however many there are).
fn link(batch: Batch) -> Result<(), String> {
    fn pick(lo: usize, hi: usize) -> String {
        if hi - lo == 1 {
            return format!("__composer_{lo}");
        }
        let mid = (lo + hi) / 2;
        format!("if {PICK} < {mid} then {} else {} end", pick(lo, mid), pick(mid, hi))
    }
    let mut program = String::new();
    for (i, (source, _)) in batch.iter().enumerate() {
        // A newline ends a trailing comment inside the expression.
        program.push_str(&format!("def __composer_{i}: (\n{source}\n);\n"));
    }
    program.push_str(&pick(0, batch.len()));
    let filter = Arc::new(compile_program(&program, true)?);
    for (i, (_, slot)) in batch.into_iter().enumerate() {
        let _ = slot.set(Linked { filter: filter.clone(), index: Some(i) });
    }
    Ok(())
}

/// Parses and compiles a jq program with the sandbox's library.
fn compile_program(code: &str, with_pick: bool) -> Result<Filter, String> {
    let loader = Loader::new(DEFS.iter().cloned());
    let arena = Arena::default();
    let modules = loader.load(&arena, File { code, path: () }).map_err(|errs| {
        let parts: Vec<String> = errs.into_iter().map(|(_, e)| format!("{e:?}")).collect();
        format!("invalid jq {code:?}: {}", parts.join("; "))
    })?;
    let globals: &[&str] = if with_pick { &[PICK] } else { &[] };
    Compiler::default().with_funs(natives()).with_global_vars(globals.iter().copied()).compile(modules).map_err(
        |errs| {
            let parts: Vec<String> =
                errs.into_iter().flat_map(|(_, e)| e).map(|(name, u)| undefined(name, u)).collect();
            format!("invalid jq {code:?}: {}", parts.join("; "))
        },
    )
}

/// Whether `source` parses (names are checked when the batch is linked).
fn check_syntax(source: &str) -> Result<(), String> {
    let loader = Loader::new([]);
    let arena = Arena::default();
    loader.load(&arena, File { code: source, path: () }).map(|_| ()).map_err(|errs| {
        let parts: Vec<String> = errs.into_iter().map(|(_, e)| format!("{e:?}")).collect();
        format!("invalid jq {source:?}: {}", parts.join("; "))
    })
}

impl Expr {
    /// Parses and compiles `source`, or says why it is not valid jq. Inside
    /// [`together`], only parses it; the batch compiles it.
    pub fn compile(source: &str) -> Result<Expr, String> {
        if source.len() > MAX_EXPRESSION_BYTES {
            return Err(format!(
                "an expression of {} bytes is longer than {MAX_EXPRESSION_BYTES} (max_expression_bytes)",
                source.len()
            ));
        }
        if imports(source) {
            return Err("invalid jq: import and include are not allowed (an expression reads its input only)".into());
        }
        if source.contains(RESERVED) {
            return Err(format!("invalid jq: names starting with {RESERVED} are reserved"));
        }
        SIMPLE.with(|s| {
            if let Some(all) = s.get() {
                s.set(Some(all && is_simple(source)));
            }
        });
        SOURCES.with(|s| {
            if let Some(sources) = s.borrow_mut().as_mut() {
                sources.push(source.to_string());
            }
        });
        let linked = Arc::new(OnceLock::new());
        let batched = BATCH.with(|b| b.borrow().is_some());
        if batched {
            check_syntax(source)?;
            BATCH.with(|b| {
                if let Some(batch) = b.borrow_mut().as_mut() {
                    batch.push((source.to_string(), linked.clone()));
                }
            });
        } else {
            let filter = Arc::new(compile_program(source, false)?);
            let _ = linked.set(Linked { filter, index: None });
        }
        Ok(Expr { source: source.to_string(), linked, simple: is_simple(source) })
    }

    pub fn source(&self) -> &str {
        &self.source
    }

    /// Whether any [`Sandbox`] may evaluate it ([`is_simple`]).
    pub fn is_simple(&self) -> bool {
        self.simple
    }

    /// The expression's first output for `input`; an error names the
    /// expression and what went wrong, and never panics.
    pub fn eval(&self, sb: &Sandbox, input: &Value) -> Result<Value, String> {
        self.eval_in(sb, &Scope::new(input)?)
    }

    /// Like [`Expr::eval`], on an input converted once for many expressions.
    pub fn eval_in(&self, sb: &Sandbox, scope: &Scope) -> Result<Value, String> {
        self.eval_limited(sb, scope, Limits::DEFAULT)
    }

    /// Evaluates under `limits`: whatever the expression does, this returns
    /// within the time limit, with its first output or an error.
    pub fn eval_limited(&self, sb: &Sandbox, scope: &Scope, limits: Limits) -> Result<Value, String> {
        sb.admit(&self.source, self.simple)?;
        let Some(linked) = self.linked.get() else {
            return Err(format!("{}: expression was never compiled", self.source));
        };
        let result = guard::run(limits, || {
            let vars = match linked.index {
                Some(i) => Vars::new([value::Value::from(i)]),
                None => Vars::new([]),
            };
            let ctx = Ctx::<Sandboxed>::new(Lookup(&linked.filter.lut), vars);
            let mut out = linked.filter.id.run((ctx, scope.0.clone()));
            match out.next() {
                Some(Ok(v)) => to_json(&v.inner, limits),
                Some(Err(e)) => match e.get_err() {
                    Ok(e) => Err(value::describe(&e)),
                    Err(_) => Err("stopped outside of a label".to_string()),
                },
                None => Err("produced no value".to_string()),
            }
        });
        result.map_err(|e| format!("{}: {e}", crate::clipped(&self.source, 200)))
    }

    /// Evaluates a condition, which must yield a boolean.
    pub fn eval_bool(&self, sb: &Sandbox, input: &Value) -> Result<bool, String> {
        self.eval_bool_in(sb, &Scope::new(input)?)
    }

    pub fn eval_bool_in(&self, sb: &Sandbox, scope: &Scope) -> Result<bool, String> {
        match self.eval_in(sb, scope)? {
            Value::Bool(b) => Ok(b),
            other => Err(format!("{}: must yield a boolean, got {other}", self.source)),
        }
    }
}

/// A result as JSON: no bigger than the byte limit and no deeper than the
/// depth limit, so that it can be stored and read back.
fn to_json(v: &jaq_json::Val, limits: Limits) -> Result<Value, String> {
    use fmt::Write;
    let mut text = value::Capped { out: String::new(), limit: limits.output };
    if write!(text, "{v}").is_err() {
        return Err(Exceeded::Output(limits.output).to_string());
    }
    serde_json::from_str(&text.out).map_err(|e| {
        if e.to_string().contains("recursion limit") {
            Exceeded::Depth(limits.depth).to_string()
        } else {
            let cut: String = text.out.chars().take(200).collect();
            format!("result {cut} is not JSON")
        }
    })
}

/// An expression input converted to jaq's values once, so that many
/// expressions can read it without converting it again (cheap to clone).
#[derive(Clone)]
pub struct Scope(value::Value);

impl Scope {
    pub fn new(input: &Value) -> Result<Scope, String> {
        serde_json::from_value(input.clone())
            .map(|v| Scope(value::Value::wrap(v)))
            .map_err(|e| format!("expression input is not JSON: {e}"))
    }

    /// `null`, for inputs that could not be converted.
    pub fn null() -> Scope {
        Scope(value::Value::default())
    }

    /// This scope (an object) with more top-level keys bound (a LOOP's
    /// `.iteration` and `.previous`), the rest shared.
    pub fn with(&self, fields: &[(&'static str, &Value)]) -> Result<Scope, String> {
        let mut bound = Vec::with_capacity(fields.len());
        for (name, value) in fields {
            let v = serde_json::from_value((*value).clone()).map_err(|e| format!("{name} is not JSON: {e}"))?;
            bound.push((*name, v));
        }
        Ok(Scope(self.0.with_fields(bound)))
    }

    /// This scope (an object) with `.item` and `.index` bound, for one item
    /// of a MAP. The rest is shared, not converted again, so binding costs
    /// the item's size, not the run's.
    pub fn with_item(&self, item: &Value, index: usize) -> Result<Scope, String> {
        let item = serde_json::from_value(item.clone()).map_err(|e| format!("item is not JSON: {e}"))?;
        Ok(Scope(self.0.with_fields([("item", item), ("index", jaq_json::Val::from(index))])))
    }
}

thread_local! {
    /// Whether every expression compiled since [`noting_simplicity`] began
    /// is simple; none: nobody is asking.
    static SIMPLE: std::cell::Cell<Option<bool>> = const { std::cell::Cell::new(None) };
    /// Every expression compiled since [`noting_sources`] began.
    static SOURCES: RefCell<Option<Vec<String>>> = const { RefCell::new(None) };
}

/// Runs `build`, noting the source of every expression it compiles,
/// whatever the field: how a test tells which fields of a definition take
/// an expression, from what compiles rather than from a list.
pub fn noting_sources<T>(build: impl FnOnce() -> T) -> (T, Vec<String>) {
    let outer = SOURCES.with(|s| s.replace(Some(Vec::new())));
    let built = build();
    let sources = SOURCES.with(|s| s.replace(outer)).unwrap_or_default();
    (built, sources)
}

/// Runs `build`, noting whether every expression it compiles is simple.
pub fn noting_simplicity<T>(build: impl FnOnce() -> T) -> (T, bool) {
    let outer = SIMPLE.with(|s| s.replace(Some(true)));
    let built = build();
    let simple = SIMPLE.with(|s| s.replace(outer)).unwrap_or(true);
    if let Some(outer) = outer {
        SIMPLE.with(|s| s.set(Some(outer && simple)));
    }
    (built, simple)
}

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

    /// Evaluates a task's input: like [`Template::eval_in`], with every
    /// value that came from data escaped ([`escape_data`]), so that only the
    /// definition's text can reference a secret.
    pub fn eval_input(&self, sb: &Sandbox, scope: Option<&Scope>) -> Result<Value, String> {
        self.eval_as(sb, scope, true, Limits::DEFAULT)
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

#[cfg(test)]
mod tests {
    use super::*;

    fn sb() -> crate::expr::Sandbox {
        crate::expr::Sandbox::for_tests()
    }

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
        assert_eq!(t.eval(&sb(), &ctx()).unwrap(), json!({"amount": 42, "tags": ["a", "b"], "n": 1}));
    }

    #[test]
    fn text_around_expressions_interpolates() {
        let t = Template::compile(&json!("order ${ .input.amount } for ${.input.who}")).unwrap();
        assert_eq!(t.eval(&sb(), &ctx()).unwrap(), json!("order 42 for ada"));
        let t = Template::compile(&json!("${ .nodes.charge.output.body | {id} }")).unwrap();
        assert_eq!(t.eval(&sb(), &ctx()).unwrap(), json!({"id": "ch_1"}), "braces inside an expression are fine");
    }

    #[test]
    fn secrets_are_left_for_the_worker() {
        let t = Template::compile(&json!({"auth": "Bearer ${ .secrets.PAY_TOKEN }", "raw": "${.secrets.X}"})).unwrap();
        assert_eq!(
            t.eval(&sb(), &ctx()).unwrap(),
            json!({"auth": "Bearer ${ .secrets.PAY_TOKEN }", "raw": "${.secrets.X}"})
        );
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
        let e = t.eval(&sb(), &ctx()).unwrap_err();
        assert!(e.contains("ascii_downcase"), "{e}");
        let e = Expr::compile("error(\"boom\")").unwrap().eval(&sb(), &json!(null)).unwrap_err();
        assert!(e.contains("boom"), "{e}");
        let e = Expr::compile(".input.amount").unwrap().eval_bool(&sb(), &ctx()).unwrap_err();
        assert!(e.contains("boolean"), "{e}");
        assert!(Expr::compile(".nodes.charge.output.status == 200").unwrap().eval_bool(&sb(), &ctx()).unwrap());
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

    /// Fails `source` under the default limits but a generous clock, so that
    /// a slow (debug) build still meets the limit under test first.
    fn fails_with(source: &str, limit: &str) {
        use_clock(std::time::Instant::now);
        let limits = Limits { time: std::time::Duration::from_secs(120), ..Limits::DEFAULT };
        let scope = Scope::new(&json!({"input": {"a": 1}})).unwrap();
        let e = Expr::compile(source).unwrap().eval_limited(&sb(), &scope, limits).unwrap_err();
        assert!(e.contains(limit), "{source}: {e}");
    }

    #[test]
    fn the_environment_the_process_and_other_inputs_are_out_of_reach() {
        for source in [
            "env",
            "$ENV",
            "env.HOME",
            "halt",
            "halt_error",
            "halt_error(1)",
            "input",
            "inputs",
            "debug",
            "debug(1)",
            "stderr",
            "now",
            "localtime",
            "input_filename",
            "$__prog_args",
        ] {
            let e = Expr::compile(source).unwrap_err();
            assert!(e.contains("invalid jq"), "{source}: {e}");
        }
    }

    #[test]
    fn every_native_of_jaq_is_allowed_or_denied_by_name() {
        let natives = jaq_core::funs::<Sandboxed>().chain(jaq_std::funs::<Sandboxed>());
        for (name, _, _) in natives {
            assert!(
                ALLOWED_NATIVES.contains(&name) ^ DENIED_NATIVES.contains(&name),
                "{name} must be in exactly one of ALLOWED_NATIVES and DENIED_NATIVES"
            );
        }
    }

    #[test]
    fn endless_loops_run_out_of_steps() {
        fails_with("def f: f; f", "expr_max_steps");
        fails_with("last(range(1e15))", "expr_max_steps");
        fails_with("[repeat(1)]", "expr_max_");
        fails_with("[range(0; 10; 0)]", "expr_max_steps");
        fails_with("until(false; .)", "expr_max_steps");
    }

    #[test]
    fn building_too_much_runs_out_of_bytes() {
        fails_with("[range(1e9)]", "expr_max_");
        fails_with(r#""x" * 1000000000"#, "expr_max_bytes");
        fails_with(r#""x" * 100000000000000000000000"#, "expr_max_bytes");
        fails_with(r#"reduce range(64) as $i ("x"; . + .)"#, "expr_max_bytes");
        fails_with("reduce range(64) as $i ([1]; . + .)", "expr_max_bytes");
        fails_with("reduce range(64) as $i ({a: 1}; {a: ., b: .}) | tojson", "expr_max_bytes");
        fails_with("reduce range(64) as $i ([1]; [., .])", "expr_max_bytes (a result of more than");
        fails_with(r#"reduce range(64) as $i ("x"; "\(.)\(.)")"#, "expr_max_bytes");
        fails_with("reduce range(200) as $i (100000000000000000000; . * .)", "expr_max_bytes");
    }

    #[test]
    fn deep_values_and_deep_recursion_are_refused_not_a_stack_overflow() {
        fails_with("reduce range(1000000) as $i (0; [.])", "expr_max_depth");
        fails_with("reduce range(1000000) as $i (0; {a: .})", "expr_max_depth");
        fails_with("def f: 1 + f; f", "expr_max_stack");
        fails_with("def f: [f]; f", "expr_max_");
        fails_with("[1] | .[0] |= reduce range(1000) as $i (.; [.])", "expr_max_depth");
    }

    /// Runs `source` on a thread with the stack evaluations are given
    /// ([`EVAL_STACK`]) and expects an error naming `limit`; a stack overflow
    /// aborts the test binary, which is how these attacks failed on a
    /// tokio worker's 2 MiB.
    fn fails_on_an_evaluation_thread(source: &'static str, limit: &'static str) {
        let evaluated = std::thread::Builder::new()
            .stack_size(EVAL_STACK)
            .spawn(move || {
                use_clock(std::time::Instant::now);
                let limits = Limits { time: std::time::Duration::from_secs(5), ..Limits::DEFAULT };
                Expr::compile(source).unwrap().eval_limited(&sb(), &Scope::null(), limits)
            })
            .unwrap()
            .join()
            .unwrap();
        let e = evaluated.unwrap_err();
        assert!(e.contains(limit), "{source}: {e}");
    }

    #[test]
    fn recursion_through_closures_is_bounded_and_unwinds_within_the_evaluation_stack() {
        fails_on_an_evaluation_thread("def f(x): f(x); f(0)", "expr_max_");
        fails_on_an_evaluation_thread("def f(g): f(1); f(0)", "expr_max_");
        fails_on_an_evaluation_thread("def f(g): f(g | g); f(.)", "expr_max_");
    }

    /// jaq's bindings of closures nest a chain as long as the evaluation
    /// ran; the patched jaq-core (vendor/jaq-core) drops it with a
    /// worklist. With the largest budget any field has (a MAP's items) and
    /// a stack of 16 MiB, a recursive drop aborted this test binary.
    #[test]
    fn closure_chains_of_the_largest_budget_are_dropped_on_a_small_stack() {
        for source in ["def f(x): f(x); f(0)", "def f(g): f(1); f(0)"] {
            let evaluated = std::thread::Builder::new()
                .stack_size(16 << 20)
                .spawn(move || {
                    use_clock(std::time::Instant::now);
                    let limits = Limits { time: std::time::Duration::from_secs(60), ..Limits::MAP_ITEMS };
                    Expr::compile(source).unwrap().eval_limited(&sb(), &Scope::null(), limits)
                })
                .unwrap()
                .join()
                .unwrap();
            let e = evaluated.unwrap_err();
            assert!(e.contains("expr_max_steps"), "{source}: {e}");
        }
    }

    #[test]
    fn a_slow_builtin_is_charged_for_its_work_and_stops_within_the_budget() {
        let cases = [
            (r#"("a" * 200000) | indices("a" * 1000) | length"#, "expr_max_"),
            ("[range(2) | reduce range(30) as $i (0; [., .])] | sort | length", "expr_max_steps"),
            ("[range(2) | reduce range(30) as $i (0; [., .])] | .[0] == .[1]", "expr_max_steps"),
            ("[range(20000) | 1] | indices([range(10000) | 1]) | length", "expr_max_steps"),
            (r#"("a" * 1000) | test("(\\w{1,250}){1,250}b")"#, "expr_max_steps"),
            (r#"("a" * 1000) | [match("(\\w{1,250}){1,250}b"; "g")] | length"#, "expr_max_steps"),
            (r#"("a" * 1000) | sub("(a{1,200}){1,200}b"; "x")"#, "expr_max_steps"),
        ];
        for (source, limit) in cases {
            let started = std::time::Instant::now();
            fails_with(source, limit);
            assert!(started.elapsed() < std::time::Duration::from_secs(30), "{source} took {:?}", started.elapsed());
        }
        // Text of a value that shares structure is written piece by piece,
        // the clock read as it goes: the time limit stops it.
        let started = std::time::Instant::now();
        let text = Expr::compile("reduce range(40) as $i (0; [., .]) | tojson | length").unwrap();
        let e = text.eval_limited(&sb(), &Scope::null(), Limits::DEFAULT).unwrap_err();
        assert!(e.contains("expr_max_"), "{e}");
        assert!(started.elapsed() < std::time::Duration::from_secs(10), "tojson took {:?}", started.elapsed());
        let started = std::time::Instant::now();
        let search = Expr::compile(r#"("a" * 1600000) | contains(("a" * 800000) + "b")"#).unwrap();
        assert_eq!(search.eval(&sb(), &json!(null)).unwrap(), json!(false), "a substring is searched in linear time");
        assert!(started.elapsed() < std::time::Duration::from_secs(30), "took {:?}", started.elapsed());
        let shared = Expr::compile("reduce range(30) as $i (0; [., .]) | [., .] | sort | length").unwrap();
        assert_eq!(shared.eval(&sb(), &json!(null)).unwrap(), json!(2), "values that share structure compare at once");
        let found = Expr::compile(r#""aaaa" | indices("aa")"#).unwrap().eval(&sb(), &json!(null)).unwrap();
        assert_eq!(found, json!([0, 1, 2]), "overlapping matches, as jq finds them");
    }

    #[test]
    fn time_is_a_backstop_for_work_inside_one_step() {
        use_clock(std::time::Instant::now);
        let limits = Limits { steps: u64::MAX, time: std::time::Duration::from_millis(20), ..Limits::DEFAULT };
        let e = Expr::compile("def f: f; f").unwrap().eval_limited(&sb(), &Scope::null(), limits).unwrap_err();
        assert!(e.contains("expr_max_time"), "{e}");
    }

    #[test]
    fn regexes_are_charged_by_program_size_times_input_and_their_natives_are_out_of_reach() {
        assert_eq!(value::regex_size("abc"), 3);
        assert!(value::regex_size("(\\w{1,250}){1,250}b") > 60_000);
        assert!(value::regex_size("[a-z]{2}-\\d{4}") < 20);
        let everyday =
            Expr::compile(r#""2026-12-01" | [test("^\\d{4}-\\d{2}"), (split("-") | length), sub("-"; "/")]"#);
        assert_eq!(everyday.unwrap().eval(&sb(), &json!(null)).unwrap(), json!([true, 3, "2026/12-01"]));
        for source in ["__composer_matches(\"a\"; null)", "\"a\" | __composer_split_(\"a\"; null)"] {
            let e = Expr::compile(source).unwrap_err();
            assert!(e.contains("reserved"), "{source}: {e}");
        }
    }

    #[test]
    fn simple_expressions_are_paths_literals_operators_and_linear_functions() {
        for simple in [
            ".input.amount > 100",
            ".nodes.charge.output.status == 200 and .input.retry != true",
            "{id: .input.id, total: (.input.items | map(.price) | add)}",
            "if .input.a then \"yes\" else .nodes[\"b-2\"].output end",
            ".input.items[] | select(.qty >= 1e3)",
            "1.5e10 + .x",
        ] {
            assert!(is_simple(simple), "{simple}");
        }
        for costly in [
            "def f(x): f(x); f(0)",
            "reduce .[] as $i (0; . + $i)",
            "[range(1e9)]",
            "..",
            ".input | tojson",
            ".input.s | test(\"a+\")",
            ".input | sort",
            "[limit(3; repeat(1))]",
            "@base64",
            "env",
            ".a as $x | $x",
            "\"x\" | recurse",
        ] {
            assert!(!is_simple(costly), "{costly}");
        }
        let (_, all) = noting_simplicity(|| (Expr::compile(".a"), Expr::compile(".b + 1")));
        assert!(all);
        let (_, all) = noting_simplicity(|| (Expr::compile(".a"), Expr::compile("[range(3)]")));
        assert!(!all);
    }

    #[test]
    fn a_long_or_deep_expression_and_an_import_are_refused_and_compiling_runs_on_a_big_stack() {
        let long = vec!["1"; 9000].join("+");
        let e = Expr::compile(&long).unwrap_err();
        assert!(e.contains("max_expression_bytes"), "{e}");
        // Just under the limit, deeply nested: compiled on the evaluation
        // stack it is fine (on a 2 MiB stack its parse overflowed and aborted).
        let deep = format!("{}1{}", "(".repeat(8000), ")".repeat(8000));
        let compiled = on_eval_stack(move || Expr::compile(&deep).map(|_| ())).unwrap();
        assert!(compiled.is_ok(), "{compiled:?}");
        let chain = vec!["1"; 3000].join("+");
        let sum = on_eval_stack(move || Expr::compile(&chain).and_then(|x| x.eval(&sb(), &json!(null)))).unwrap();
        assert!(sum.unwrap_err().contains("expr_max_stack"), "evaluating it meets the sandbox's stack limit");
        let short = vec!["1"; 100].join("+");
        assert_eq!(Expr::compile(&short).and_then(|x| x.eval(&sb(), &json!(null))), Ok(json!(100)));
        for bad in [r#"import "/etc/passwd" as $d; $d"#, r#"include "x"; 1"#, r#"import"m" as m; 1"#] {
            assert!(Expr::compile(bad).unwrap_err().contains("import and include"), "{bad}");
        }
        for fine in [r#""import \"x\"""#, ".important", ". as $include | $include", r#".a.import"#] {
            assert!(Expr::compile(fine).is_ok(), "{fine}");
        }
    }

    #[test]
    fn splitting_text_is_charged_for_its_pieces_before_it_splits() {
        let ok = Expr::compile(r#""a,b,c" / ",""#).unwrap().eval(&sb(), &json!(null));
        assert_eq!(ok, Ok(json!(["a", "b", "c"])));
        assert_eq!(
            Expr::compile(r#""2026-12-01" | split("-")"#).unwrap().eval(&sb(), &json!(null)),
            Ok(json!(["2026", "12", "01"]))
        );
        for source in [r#"("ab" * 3000000) / "b" | length"#, r#"("ab" * 3000000) | split("b") | length"#] {
            let started = std::time::Instant::now();
            let e = Expr::compile(source).unwrap().eval(&sb(), &json!(null)).unwrap_err();
            assert!(e.contains("expr_max_bytes"), "{source}: {e}");
            assert!(
                started.elapsed() < std::time::Duration::from_secs(2),
                "refused before splitting: {:?}",
                started.elapsed()
            );
        }
    }

    #[test]
    fn a_failed_evaluation_leaves_the_next_one_unharmed() {
        fails_with("def f: f; f", "expr_max_steps");
        let ok = Expr::compile("[range(1000)] | add").unwrap().eval(&sb(), &json!(null)).unwrap();
        assert_eq!(ok, json!(499500));
    }

    #[test]
    fn everyday_jq_still_works_in_the_sandbox() {
        let cases = [
            (".input.items | map(. * 2)", json!([2, 4, 6])),
            (".input.items | add", json!(6)),
            (".input.who | ascii_upcase", json!("ADA")),
            ("[.input.items[] | select(. > 1)] | length", json!(2)),
            (".input | to_entries | map(.key) | sort", json!(["items", "who"])),
            (".input | has(\"who\")", json!(true)),
            (".input.items | contains([2])", json!(true)),
            (".input.items | indices(2)", json!([1])),
            (".input | tojson | fromjson | .who", json!("ada")),
            (".input.items | .[1] |= . + 10", json!([1, 12, 3])),
            (".input.items | .[1:] = [9]", json!([1, 9])),
            (".input | .who |= \"x\" | .who", json!("x")),
            (".input | del(.items) | keys", json!(["who"])),
            ("\"\\(.input.who)-\\(.input.items)\"", json!("ada-[1,2,3]")),
            (".input.items | [.[] | tostring] | join(\",\")", json!("1,2,3")),
            ("[paths] | length", json!(6)),
            ("1700000000 | todate", json!("2023-11-14T22:13:20Z")),
            (".input.who | test(\"^a\")", json!(true)),
            (".input | .items += [4] | .items | length", json!(4)),
            ("{a: {b: 1}} * {a: {c: 2}}", json!({"a": {"b": 1, "c": 2}})),
            ("try error(\"boom\") catch .", json!("boom")),
        ];
        let input = json!({"input": {"items": [1, 2, 3], "who": "ada"}});
        for (source, want) in cases {
            assert_eq!(Expr::compile(source).unwrap().eval(&sb(), &input).unwrap(), want, "{source}");
        }
    }

    #[test]
    fn a_definition_compiles_its_expressions_as_one_program() {
        let built = together(|| {
            Ok::<_, String>((
                Expr::compile(".input.a + 1")?,
                Expr::compile("# a comment\n.input.b")?,
                Expr::compile("1")?,
            ))
        });
        let (a, b, one) = built.unwrap().unwrap();
        let (la, lb) = (a.linked.get().unwrap(), b.linked.get().unwrap());
        assert!(Arc::ptr_eq(&la.filter, &lb.filter), "one program, the library compiled once");
        let input = json!({"input": {"a": 41, "b": "x"}});
        assert_eq!(
            (a.eval(&sb(), &input).unwrap(), b.eval(&sb(), &input).unwrap(), one.eval(&sb(), &input).unwrap()),
            (json!(42), json!("x"), json!(1))
        );
        let failed = together(|| Expr::compile("no_such_function"));
        assert!(
            failed.is_err(),
            "a name that does not exist fails the batch (then compiled one by one for the message)"
        );
        assert!(together(|| Expr::compile(".a |")).unwrap().is_err(), "syntax is checked at once");
    }
}
