//! The sandbox's jq library: the natives and definitions an expression may
//! call (pure functions of their input, the regex natives only through
//! definitions that charge their work first), why a name is not there, and
//! compiling a program with them.

use std::sync::LazyLock;

use jaq_core::load::{parse::Def, Arena, File, Loader};
use jaq_core::Compiler;

use super::natives;
use super::syntax;
use super::value::Sandboxed;

/// A compiled program, over the sandbox's values.
pub(super) type Filter = jaq_core::Filter<Sandboxed>;
type Native = jaq_core::native::Fun<Sandboxed>;

/// Natives an expression may call: pure functions of their input. Anything
/// that reads the environment, the clock, other inputs or writes to stderr,
/// or exits (`env`, `now`, `input`, `halt`, `debug`, `stderr`, …) is left
/// out, and so is every definition that needs one of them. A jaq upgrade
/// that adds a native does not make it callable: it must be listed here.
pub(super) const ALLOWED_NATIVES: &[&str] = &[
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
pub(super) const DENIED_NATIVES: &[&str] =
    &["env", "halt", "debug_empty", "stderr_empty", "now", "localtime", "strflocaltime"];

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
pub(super) const RESERVED: &str = "__composer_";

/// `matches`, `split_matches` and `split_` as every regex filter of jq's
/// library (`test`, `match`, `capture`, `scan`, `splits`, `sub`, `gsub`)
/// reaches them: charged by [`natives::regex_cost`](super::natives::regex_cost) before they run.
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
    let json = natives::json_funs::<Sandboxed>();
    let json_names: Vec<&str> = natives::json_funs::<Sandboxed>().map(|(name, _, _)| name).collect();
    jaq_core::funs::<Sandboxed>()
        .chain(jaq_std::funs::<Sandboxed>())
        .filter(move |(name, _, _)| allowed_native(name) && !json_names.contains(name))
        .map(|(name, args, native)| {
            let renamed = REGEX_NATIVES.iter().find(|(from, _)| *from == name).map_or(name, |(_, to)| *to);
            (renamed, args, native)
        })
        .chain(json)
        .chain(natives::regex_cost_fun::<Sandboxed>())
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

/// Parses and compiles a jq program with the sandbox's library.
pub(super) fn compile_program(code: &str, globals: &[&str]) -> Result<Filter, String> {
    let loader = Loader::new(DEFS.iter().cloned());
    let arena = Arena::default();
    let modules = loader.load(&arena, File { code, path: () }).map_err(|errs| syntax::load_errors(code, errs))?;
    Compiler::default().with_funs(natives()).with_global_vars(globals.iter().copied()).compile(modules).map_err(
        |errs| {
            let parts = errs.into_iter().flat_map(|(_, e)| e);
            let parts = parts.map(|(name, u)| format!("{}{}", undefined(name, u), syntax::at(code, name)));
            syntax::invalid(code, parts.collect())
        },
    )
}
