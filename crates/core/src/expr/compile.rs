//! Compiling expressions: an [`Expr`] from its source (checked for length,
//! imports and reserved names), a definition's expressions compiled as one
//! program ([`together`]), and noting what a definition compiles.

use std::cell::RefCell;
use std::fmt;
use std::sync::{Arc, OnceLock};

use jaq_core::load::{Arena, File, Loader};

use super::analysis::{is_path, is_simple};
use super::library::{compile_program, Filter, RESERVED};
use super::sandbox::EVAL_STACK;
use super::syntax::load_errors;

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

/// A compiled jq expression, evaluated in a sandbox: only pure functions,
/// and a budget ([`Limits`](super::Limits)) on steps, bytes, depth, recursion and time.
#[derive(Clone)]
pub struct Expr {
    pub(super) source: String,
    pub(super) linked: Arc<OnceLock<Linked>>,
    /// Whether it is simple ([`is_simple`]): evaluated by any [`Sandbox`].
    pub(super) simple: bool,
    /// Whether it only reads a path ([`is_path`]): its result may be as
    /// large as a value the run holds.
    pub(super) path: bool,
}

/// The compiled program an expression belongs to: its own, or one shared by
/// every expression of a definition ([`together`]), where `index` picks it.
pub(super) struct Linked {
    pub(super) filter: Arc<Filter>,
    pub(super) index: Option<usize>,
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
    let filter = Arc::new(compile_program(&program, &[PICK])?);
    for (i, (_, slot)) in batch.into_iter().enumerate() {
        let _ = slot.set(Linked { filter: filter.clone(), index: Some(i) });
    }
    Ok(())
}

/// Whether `source` parses (names are checked when the batch is linked).
fn check_syntax(source: &str) -> Result<(), String> {
    let loader = Loader::new([]);
    let arena = Arena::default();
    loader.load(&arena, File { code: source, path: () }).map(|_| ()).map_err(|errs| load_errors(source, errs))
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
            let filter = Arc::new(compile_program(source, &[])?);
            let _ = linked.set(Linked { filter, index: None });
        }
        Ok(Expr { source: source.to_string(), linked, simple: is_simple(source), path: is_path(source) })
    }

    pub fn source(&self) -> &str {
        &self.source
    }

    /// Whether any [`Sandbox`](super::Sandbox) may evaluate it ([`is_simple`]).
    pub fn is_simple(&self) -> bool {
        self.simple
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
