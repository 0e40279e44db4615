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
//! - `compile`: an [`Expr`] compiled from its source, alone or [`together`]
//!   with the rest of a definition.
//! - `eval`: an expression evaluated in a sandbox over a [`Scope`].
//! - `template`: a [`Template`] and the `${ … }` syntax ([`segments`]).
//! - `analysis`: what a source says before it is compiled ([`is_simple`],
//!   [`node_refs`], [`secret_name`]).
//! - `library`: the natives and definitions an expression may call.
//! - `natives`: jq's JSON functions written for the sandbox's value, each
//!   charged for its work, and the charge of a regex.
//! - `value`: the sandbox's data type, which charges every value it builds.
//! - `guard`: the budget of one evaluation (steps, bytes, depth, stack, time).
//! - `syntax`: why an expression does not parse or compile, in words, with
//!   where.

mod analysis;
mod compile;
mod eval;
mod guard;
mod library;
mod natives;
pub mod sandbox;
mod syntax;
mod template;
mod value;

pub use analysis::{is_path, is_simple, node_refs, reads_input, secret_name};
pub use compile::{noting_simplicity, noting_sources, on_eval_stack, together, Expr, MAX_EXPRESSION_BYTES};
pub use eval::{Part, Scope};
pub use guard::{inline, take_exceeded, use_clock, Clock, Exceeded, InlineSpent, Limits, PATH_OUTPUT, PATH_TIME};
pub use sandbox::{sandbox_thread, sandboxed, Sandbox, EVAL_STACK};
pub use template::{escape_data, segments, OneScope, PieceOwned, Segment, Template};

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use serde_json::Value;

    use super::library::{ALLOWED_NATIVES, DENIED_NATIVES};
    use super::value::Sandboxed;
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

    /// Every expression of up to three of these pieces that compiles and
    /// [`reads_input`] says cannot read `.input` gives the same result
    /// whatever the input: the scope may leave it out.
    #[test]
    fn an_expression_said_not_to_read_the_input_gives_the_same_whatever_the_input() {
        const PIECES: &[&str] = &[
            ".input",
            ".input.amount",
            ".nodes.charge.output.status",
            ".nodes",
            ".run",
            ".",
            "..",
            ".[]",
            "1",
            "\"s\"",
            "null",
            "==",
            "+",
            "and",
            "//",
            ",",
            "|",
            "|=",
            "=",
            "as $x |",
            "$x",
            "to_entries",
            "keys",
            "tojson",
            "length",
            ".amount",
            "[",
            "]",
            "not",
        ];
        let sb = sb();
        let other = {
            let mut c = ctx();
            c["input"] = json!({"amount": "other"});
            c
        };
        let mut pieces = vec![String::new()];
        let (mut judged, mut found) = (0, 0);
        for _ in 0..3 {
            pieces = pieces.iter().flat_map(|p| PIECES.iter().map(move |q| format!("{p} {q}"))).collect();
            for source in &pieces {
                if reads_input(source) {
                    continue;
                }
                let Ok(expr) = Expr::compile(source) else { continue };
                judged += 1;
                let (a, b) = (expr.eval(&sb, &ctx()), expr.eval(&sb, &other));
                assert_eq!(a, b, "{source} reads the input");
                found += usize::from(a.is_ok());
            }
        }
        assert!(judged > 100 && found > 50, "{judged} judged, {found} gave a value");
    }

    #[test]
    fn whole_expressions_keep_their_type() {
        let t =
            Template::compile(&json!({"amount": "${ .input.amount }", "tags": "${ .input.tags }", "n": 1})).unwrap();
        assert_eq!(t.eval(&sb(), &ctx()).unwrap(), json!({"amount": 42, "tags": ["a", "b"], "n": 1}));
    }

    /// Templates that share a [`OneScope`] give what each gives over the
    /// object `{name: value}`, and the value is converted only once one of
    /// them reads something: a literal converts nothing.
    #[test]
    fn templates_sharing_one_scope_give_what_each_gives_alone_and_convert_only_when_read() {
        let input = json!({"amount": 42, "who": "ada", "tags": ["a"]});
        let alone = json!({"input": input});
        let scope = OneScope::new("input", &input);
        let literal = Template::compile(&json!({"n": 1, "s": "plain"})).unwrap();
        assert_eq!(scope.eval(&sb(), &literal).unwrap(), json!({"n": 1, "s": "plain"}));
        assert!(!scope.converted(), "a literal converts nothing");
        for source in [
            json!("${ .input.amount }"),
            json!("order ${ .input.amount } for ${.input.who}"),
            json!({"t": "${ .input.tags }", "x": "${ .missing }"}),
            json!("${ .input.nothing.deeper }"),
        ] {
            let t = Template::compile(&source).unwrap();
            assert_eq!(scope.eval(&sb(), &t), t.eval(&sb(), &alone), "{source}");
            assert!(scope.converted());
        }
        let when = Expr::compile(".input.amount > 40").unwrap();
        assert_eq!(scope.eval_bool(&sb(), &when), when.eval_bool(&sb(), &alone));
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
        fails_within(source, limit, Limits::DEFAULT);
    }

    /// [`fails_with`] under `limits`, given all the time they need.
    fn fails_within(source: &str, limit: &str, limits: Limits) {
        use_clock(std::time::Instant::now);
        let limits = Limits { time: std::time::Duration::from_secs(120), ..limits };
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
        // Byte limits of 4 MiB, not 64: the same checks, but writing out a
        // value that shares structure (`[., .]`) up to 64 MiB takes a debug
        // build some 15 s per case.
        let small = Limits { bytes: 4 << 20, output: 4 << 20, ..Limits::DEFAULT };
        fails_within("[range(1e9)]", "expr_max_", small);
        fails_within(r#""x" * 1000000000"#, "expr_max_bytes", small);
        fails_within(r#""x" * 100000000000000000000000"#, "expr_max_bytes", small);
        fails_within(r#"reduce range(64) as $i ("x"; . + .)"#, "expr_max_bytes", small);
        fails_within("reduce range(64) as $i ([1]; . + .)", "expr_max_bytes", small);
        fails_within("reduce range(64) as $i ({a: 1}; {a: ., b: .}) | tojson", "expr_max_bytes", small);
        fails_within("reduce range(64) as $i ([1]; [., .])", "expr_max_bytes (a result of more than", small);
        fails_within(r#"reduce range(64) as $i ("x"; "\(.)\(.)")"#, "expr_max_bytes", small);
        fails_within("reduce range(200) as $i (100000000000000000000; . * .)", "expr_max_bytes", small);
    }

    /// An error that names a value of the wrong type shows its start, not
    /// the whole of it (a condition over a large output).
    #[test]
    fn a_wrong_value_in_an_error_is_clipped() {
        let long = json!({"x": "y".repeat(100_000)});
        let e = Expr::compile(".x").unwrap().eval_bool(&sb(), &long).unwrap_err();
        assert!(e.contains("must yield a boolean") && e.len() < 400, "{} bytes", e.len());
    }

    /// In a value to store, a path gives a value the run holds whatever its
    /// size (an offloaded one may be up to a GiB), up to a budget for the
    /// whole value; building one is held to the limits, and so is a path
    /// anywhere else (a condition, a key) and one run inline, which goes
    /// to the evaluation threads instead.
    #[test]
    fn a_path_in_a_value_to_store_gives_a_large_value_whole_and_only_there() {
        let big = json!({"blob": "x".repeat((64 << 20) + 1), "list": (0..1000).collect::<Vec<_>>()});
        let scope = Scope::new(&json!({"nodes": {"big": {"output": big}}})).unwrap();
        let tpl = |v: Value| Template::compile(&v).unwrap();
        let path = tpl(json!({"b": "${ .nodes.big.output.blob }"}));
        assert_eq!(path.eval_value(&sb(), Some(&scope)).unwrap()["b"], big["blob"]);
        assert_eq!(path.eval_input(&sb(), Some(&scope)).unwrap()["b"], big["blob"], "a step's input");
        for elsewhere in
            [path.eval_in(&sb(), Some(&scope)), Expr::compile(".nodes.big.output.blob").unwrap().eval_in(&sb(), &scope)]
        {
            let e = elsewhere.unwrap_err();
            assert!(e.contains("expr_max_bytes"), "{e}");
        }
        let built = tpl(json!("${ .nodes.big.output.blob + \"\" }")).eval_value(&sb(), Some(&scope)).unwrap_err();
        assert!(built.contains("expr_max_bytes"), "{built}");
        // Inline (on the async runtime), it is not done there.
        let inline = guard::inline(u64::MAX, || path.eval_value(&sb(), Some(&scope)));
        assert!(inline.is_err(), "sent to the evaluation threads");
        // The paths of one value share one budget: copies of a path do not
        // multiply it.
        let list = tpl(json!(["${ .nodes.big.output.list }", "${ .nodes.big.output.list }"]));
        let one = serde_json::to_string(&big["list"]).unwrap().len();
        let under = |budget: usize| {
            eval::with_paths_up_to(budget, || {
                let small = Limits { output: 16, ..Limits::DEFAULT };
                match &list {
                    Template::Array(items) => items
                        .iter()
                        .map(|t| match t {
                            Template::Whole(e) => e.eval_limited(&sb(), &scope, small),
                            _ => unreachable!(),
                        })
                        .collect::<Result<Vec<_>, _>>(),
                    _ => unreachable!(),
                }
            })
        };
        assert_eq!(under(2 * one).unwrap().len(), 2);
        let e = under(2 * one - 1).unwrap_err();
        assert!(e.contains("expr_max_bytes"), "{e}");
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
        assert_eq!(natives::regex_size("abc"), 3);
        assert!(natives::regex_size("(\\w{1,250}){1,250}b") > 60_000);
        assert!(natives::regex_size("[a-z]{2}-\\d{4}") < 20);
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
