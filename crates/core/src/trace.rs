//! Where a run's spans sit in a trace: W3C `traceparent` headers, and the
//! span ids of a run and of its attempts.
//!
//! The ids are derived, not drawn: a run's span id comes from its run id and
//! an attempt's from its task id and attempt number. Any coordinator can so
//! name the parent of a span it records, a worker can be told the span its
//! HTTP call belongs to before that span is recorded, and a child run is
//! placed under its parent's attempt without asking anyone.
//!
//! A run's trace is the trace of the `traceparent` it was started with (by
//! an API call, an event that triggered it, or its parent's attempt), or
//! else the run's own id, a UUID being 16 bytes as a trace id is.

use uuid::Uuid;

/// The longest `traceparent` read; the W3C form of version 00 is 55 bytes,
/// later versions may add fields after it.
pub const MAX_TRACEPARENT: usize = 512;

/// A position in a trace: the trace and the span that is the parent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceContext {
    pub trace_id: [u8; 16],
    pub span_id: [u8; 8],
    /// The caller's `sampled` flag; Composer records every run it traces.
    pub sampled: bool,
}

/// Why a `traceparent` header was not read (the W3C rules: an invalid
/// header is ignored and a new trace begins).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BadTraceparent {
    #[error("traceparent is longer than {MAX_TRACEPARENT} bytes")]
    TooLong,
    #[error("traceparent is not version-traceid-parentid-flags in lower-case hex")]
    Form,
    #[error("traceparent version ff is invalid")]
    Version,
    #[error("traceparent has an all-zero trace id or parent id")]
    Zero,
}

impl TraceContext {
    /// Reads a W3C `traceparent` header (`00-<32 hex>-<16 hex>-<2 hex>`).
    /// A version above 00 is read by its first four fields, as the W3C
    /// asks, when what follows them starts with `-`.
    pub fn parse(header: &str) -> Result<TraceContext, BadTraceparent> {
        if header.len() > MAX_TRACEPARENT {
            return Err(BadTraceparent::TooLong);
        }
        let h = header.trim_matches([' ', '\t']);
        let b = h.as_bytes();
        if !h.is_ascii() || b.len() < 55 || b[2] != b'-' || b[35] != b'-' || b[52] != b'-' {
            return Err(BadTraceparent::Form);
        }
        let version = hex::<1>(&h[0..2]).ok_or(BadTraceparent::Form)?[0];
        if version == 0xff {
            return Err(BadTraceparent::Version);
        }
        if (version == 0 && b.len() != 55) || (b.len() > 55 && b[55] != b'-') {
            return Err(BadTraceparent::Form);
        }
        let trace_id = hex::<16>(&h[3..35]).ok_or(BadTraceparent::Form)?;
        let span_id = hex::<8>(&h[36..52]).ok_or(BadTraceparent::Form)?;
        let flags = hex::<1>(&h[53..55]).ok_or(BadTraceparent::Form)?[0];
        if trace_id == [0; 16] || span_id == [0; 8] {
            return Err(BadTraceparent::Zero);
        }
        Ok(TraceContext { trace_id, span_id, sampled: flags & 1 == 1 })
    }

    /// The W3C header of this position (version 00).
    pub fn header(&self) -> String {
        let mut out = String::with_capacity(55);
        out.push_str("00-");
        push_hex(&mut out, &self.trace_id);
        out.push('-');
        push_hex(&mut out, &self.span_id);
        out.push_str(if self.sampled { "-01" } else { "-00" });
        out
    }
}

/// The trace a run's spans go to, and the parent of its run span.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunTrace {
    pub trace_id: [u8; 16],
    /// The span the run continues (a caller's, an event's, its parent's
    /// attempt); `None` for a run that is a trace of its own.
    pub parent: Option<[u8; 8]>,
    pub run_span: [u8; 8],
}

impl RunTrace {
    /// The trace of run `run_id` as stored: `traceparent` is what it was
    /// started under, if anything (a stored value that does not read, which
    /// Composer never writes, is taken as none).
    pub fn of(run_id: Uuid, traceparent: Option<&str>) -> RunTrace {
        let run_span = run_span_id(run_id);
        match traceparent.and_then(|t| TraceContext::parse(t).ok()) {
            Some(c) => RunTrace { trace_id: c.trace_id, parent: Some(c.span_id), run_span },
            None => RunTrace { trace_id: *run_id.as_bytes(), parent: None, run_span },
        }
    }

    /// The trace id as OTLP viewers show it: 32 lower-case hex digits.
    pub fn trace_id_hex(&self) -> String {
        let mut out = String::with_capacity(32);
        push_hex(&mut out, &self.trace_id);
        out
    }

    /// The `traceparent` an attempt's work carries: its HTTP call's header,
    /// a task-API worker's, a child run's parent.
    pub fn attempt(&self, task_id: Uuid, attempt: i32) -> TraceContext {
        TraceContext { trace_id: self.trace_id, span_id: attempt_span_id(task_id, attempt), sampled: true }
    }
}

/// The span id of a run's span.
pub fn run_span_id(run_id: Uuid) -> [u8; 8] {
    span_id(run_id, u64::MAX)
}

/// The span id of one attempt of a task.
pub fn attempt_span_id(task_id: Uuid, attempt: i32) -> [u8; 8] {
    span_id(task_id, attempt as u32 as u64)
}

/// Eight bytes mixed from a UUID and a number (SplitMix64's finalizer over
/// both halves): well spread, the same in every process and every build, and
/// never zero (the W3C's invalid id).
fn span_id(id: Uuid, salt: u64) -> [u8; 8] {
    let (hi, lo) = id.as_u64_pair();
    let mut x = mix(hi ^ mix(lo ^ mix(salt)));
    if x == 0 {
        x = 1;
    }
    x.to_be_bytes()
}

fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// `N` bytes from `2N` lower-case hex digits (the W3C allows no upper case).
fn hex<const N: usize>(s: &str) -> Option<[u8; N]> {
    let b = s.as_bytes();
    if b.len() != 2 * N {
        return None;
    }
    let digit = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    };
    let mut out = [0u8; N];
    for (i, pair) in b.chunks_exact(2).enumerate() {
        out[i] = digit(pair[0])? << 4 | digit(pair[1])?;
    }
    Some(out)
}

fn push_hex(out: &mut String, bytes: &[u8]) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    for b in bytes {
        out.push(DIGITS[(b >> 4) as usize] as char);
        out.push(DIGITS[(b & 15) as usize] as char);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const W3C: &str = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";

    #[test]
    fn the_w3c_example_reads_and_writes_back() {
        let c = TraceContext::parse(W3C).unwrap();
        assert_eq!(c.span_id, [0xb7, 0xad, 0x6b, 0x71, 0x69, 0x20, 0x33, 0x31]);
        assert!(c.sampled);
        assert_eq!(c.header(), W3C);
    }

    #[test]
    fn what_the_w3c_calls_invalid_is_refused_by_name() {
        let cases = [
            ("", BadTraceparent::Form),
            ("00-0AF7651916CD43DD8448EB211C80319C-B7AD6B7169203331-01", BadTraceparent::Form),
            ("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-extra", BadTraceparent::Form),
            ("ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", BadTraceparent::Version),
            ("00-00000000000000000000000000000000-b7ad6b7169203331-01", BadTraceparent::Zero),
            ("00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01", BadTraceparent::Zero),
            ("00_0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", BadTraceparent::Form),
            ("00-0af7651916cd43dd8448eb211c8031é-b7ad6b7169203331-01", BadTraceparent::Form),
            ("00-0af7651916cd43dd8448eb211c80319-éb7ad6b7169203331-01", BadTraceparent::Form),
        ];
        for (header, why) in cases {
            assert_eq!(TraceContext::parse(header), Err(why), "{header:?}");
        }
        assert_eq!(TraceContext::parse(&"0".repeat(MAX_TRACEPARENT + 1)), Err(BadTraceparent::TooLong));
    }

    #[test]
    fn a_later_version_is_read_by_its_first_four_fields() {
        let c = TraceContext::parse("01-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00-what-comes").unwrap();
        assert!(!c.sampled);
        assert_eq!(c.header(), "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00");
    }

    #[test]
    fn a_run_is_its_own_trace_unless_it_continues_one() {
        let run = Uuid::now_v7();
        let own = RunTrace::of(run, None);
        assert_eq!(own.trace_id, *run.as_bytes());
        assert_eq!(own.parent, None);
        let continued = RunTrace::of(run, Some(W3C));
        assert_eq!(continued.parent, Some([0xb7, 0xad, 0x6b, 0x71, 0x69, 0x20, 0x33, 0x31]));
        assert_eq!(continued.run_span, own.run_span);
        assert_eq!(RunTrace::of(run, Some("garbage")), own);
        assert_eq!(own.trace_id_hex(), run.simple().to_string());
        assert_eq!(continued.trace_id_hex(), "0af7651916cd43dd8448eb211c80319c");
    }

    proptest! {
        #[test]
        fn every_header_written_reads_back(trace in any::<[u8; 16]>(), span in any::<[u8; 8]>(), sampled: bool) {
            prop_assume!(trace != [0; 16] && span != [0; 8]);
            let c = TraceContext { trace_id: trace, span_id: span, sampled };
            prop_assert_eq!(TraceContext::parse(&c.header()), Ok(c));
        }

        #[test]
        fn no_text_makes_the_reader_panic(s in ".{0,80}") {
            let _ = TraceContext::parse(&s);
        }

        #[test]
        fn attempts_of_a_task_and_its_run_get_distinct_nonzero_ids(a in any::<u128>(), n in 1i32..10_000) {
            let id = Uuid::from_u128(a);
            let (x, y) = (attempt_span_id(id, n), attempt_span_id(id, n + 1));
            prop_assert_ne!(x, y);
            prop_assert_ne!(x, run_span_id(id));
            prop_assert_ne!(x, [0; 8]);
        }
    }
}
