//! The one door to the evaluator. An [`Expr`](super::Expr) or a
//! [`Template`](super::Template) is inert: every way to evaluate one takes a
//! [`Sandbox`], and a sandbox that may evaluate any expression exists only
//! on a thread made for evaluation ([`sandboxed`], [`sandbox_thread`]):
//! [`super::EVAL_STACK`] of stack, a clock for `expr_max_time`, and nothing
//! else running on it that an evaluation at its limits could starve.
//!
//! Any thread may hold [`Sandbox::simple_only`], which evaluates only simple
//! expressions ([`super::is_simple`]: no recursion, loop or costly native,
//! so their time is bounded by their input) and refuses the others with an
//! error: a path that forgot the evaluation threads fails a run with a named
//! error instead of putting a tokio worker's 2 MiB stack in reach of a
//! hostile definition.

use std::marker::PhantomData;

use super::guard::{use_clock, Clock};

/// The stack a thread evaluating expressions is given. Recursion is bounded
/// far below it (`expr_max_stack`), and what an evaluation built is dropped
/// without recursion (the patched jaq-core, `vendor/jaq-core`); the rest is
/// for jaq's parser and compiler, which recurse as deep as an expression
/// nests (`MAX_EXPRESSION_BYTES`). Reserved, not used: pages are touched
/// only by what an evaluation needs.
pub const EVAL_STACK: usize = 256 << 20;

/// Leave to evaluate expressions, held by reference for as long as the
/// thread that made it runs the caller's code. Neither `Send` nor `Sync`:
/// it cannot leave the thread it was made for.
pub struct Sandbox {
    /// Whether every expression may run here, or only simple ones.
    any: bool,
    _here: PhantomData<*const ()>,
}

impl Sandbox {
    /// A sandbox for any thread: it evaluates simple expressions only.
    pub fn simple_only() -> Sandbox {
        Sandbox { any: false, _here: PhantomData }
    }

    /// The sandbox of an evaluation thread (given its clock), or of a unit
    /// test of this crate, whose threads evaluate what the test wrote.
    fn any() -> Sandbox {
        Sandbox { any: true, _here: PhantomData }
    }

    /// Whether every expression may be evaluated in it.
    pub fn is_evaluation_thread(&self) -> bool {
        self.any
    }

    /// `Ok` when an expression (`source`, simple or not) may be evaluated here.
    pub(super) fn admit(&self, source: &str, simple: bool) -> Result<(), String> {
        if self.any || simple {
            return Ok(());
        }
        Err(format!(
            "{}: not evaluated: this expression is not simple, and only the evaluation threads evaluate such \
             expressions",
            crate::clipped(source, 200)
        ))
    }

    #[cfg(test)]
    pub(crate) fn for_tests() -> Sandbox {
        Sandbox::any()
    }
}

/// Runs `f` with a sandbox for any expression, on a thread of its own with
/// [`EVAL_STACK`] and `clock`, and waits for it: for a process that
/// evaluates now and then (`workflow simulate`, tests). A panic in `f`
/// comes back as the error.
pub fn sandboxed<T: Send>(clock: Clock, f: impl FnOnce(&Sandbox) -> T + Send) -> Result<T, String> {
    std::thread::scope(|s| {
        let thread = std::thread::Builder::new().name("composer-eval".into()).stack_size(EVAL_STACK);
        let body = move || {
            use_clock(clock);
            f(&Sandbox::any())
        };
        match thread.spawn_scoped(s, body) {
            Ok(t) => t.join().map_err(|p| format!("evaluation failed: {}", crate::panic_message(&*p))),
            Err(e) => Err(format!("cannot start a thread to evaluate on: {e}")),
        }
    })
}

/// Starts a long-lived evaluation thread named `name`: `body` gets its
/// sandbox (an evaluation pool's worker loop).
pub fn sandbox_thread(
    name: &str,
    clock: Clock,
    body: impl FnOnce(&Sandbox) + Send + 'static,
) -> std::io::Result<std::thread::JoinHandle<()>> {
    std::thread::Builder::new().name(name.to_string()).stack_size(EVAL_STACK).spawn(move || {
        use_clock(clock);
        body(&Sandbox::any())
    })
}

#[cfg(test)]
mod tests {
    use super::super::Expr;
    use super::*;

    #[test]
    fn a_sandbox_off_the_evaluation_threads_refuses_what_is_not_simple() {
        let sb = Sandbox::simple_only();
        let simple = Expr::compile(".input.a + 1").unwrap();
        assert_eq!(simple.eval(&sb, &serde_json::json!({"input": {"a": 1}})).unwrap(), serde_json::json!(2));
        let costly = Expr::compile("def f(x): f(x); f(0)").unwrap();
        let e = costly.eval(&sb, &serde_json::Value::Null).unwrap_err();
        assert!(e.contains("only the evaluation threads"), "{e}");
        let on_thread = sandboxed(std::time::Instant::now, |sb| costly.eval(sb, &serde_json::Value::Null)).unwrap();
        assert!(on_thread.unwrap_err().contains("expr_max_"), "on an evaluation thread it runs to its budget");
    }

    /// A sandbox cannot leave its thread: checked when this module compiles
    /// (a `Sandbox` that were `Send` makes the assertions below fail).
    mod not_send {
        use super::super::Sandbox;
        use std::marker::PhantomData;

        trait Fallback {
            const SEND: bool = false;
        }
        impl<T> Fallback for T {}
        struct Check<T>(PhantomData<T>);
        #[allow(dead_code)]
        impl<T: Send> Check<T> {
            const SEND: bool = true;
        }
        const _: () = assert!(!<Check<Sandbox>>::SEND, "Sandbox must not be Send");
        const _: () = assert!(!<Check<&Sandbox>>::SEND, "&Sandbox must not be Send");
    }
}
