use super::*;
use chrono::TimeZone;
use proptest::prelude::*;
use serde_json::json;

fn at(ms_: i64) -> DateTime<Utc> {
    Utc.timestamp_millis_opt(1_800_000_000_000 + ms_).unwrap()
}

fn ev(seq: i64) -> HeldEvent {
    HeldEvent { seq, event_id: format!("e{seq}"), input: json!({"n": seq}), idempotency_key: None }
}

/// Events arriving at the given times, with the timer looking at every
/// `tick`: every run started, and what became of each event.
struct World {
    starts: Vec<(DateTime<Utc>, Start)>,
    dropped: Vec<i64>,
    superseded: Vec<i64>,
    state: Option<State>,
}

fn drive(hold: &Hold, arrivals: &[i64], tick: i64) -> World {
    let mut w = World { starts: Vec::new(), dropped: Vec::new(), superseded: Vec::new(), state: None };
    let mut clock = 0;
    let timer = |w: &mut World, now: DateTime<Utc>| {
        if let Some(s) = w.state.take() {
            if s.due_at <= now {
                let (starts, next) = due(hold, s, now);
                w.starts.extend(starts.into_iter().map(|st| (now, st)));
                w.state = next;
            } else {
                w.state = Some(s);
            }
        }
    };
    for (i, t) in arrivals.iter().enumerate() {
        while clock + tick <= *t {
            clock += tick;
            timer(&mut w, at(clock));
        }
        let step = arrive(hold, w.state.take(), at(*t), ev(i as i64), MAX_HELD_BYTES);
        if let Outcome::Started(k) = step.outcome {
            assert!(step.starts[k].events.contains(&(i as i64)), "the outcome names the start that holds it");
        }
        if let Outcome::Dropped(_) = step.outcome {
            w.dropped.push(i as i64);
        }
        w.superseded.extend(step.superseded.iter().map(|(s, _)| *s));
        w.starts.extend(step.starts.into_iter().map(|st| (at(*t), st)));
        w.state = step.state;
    }
    // Time goes on until nothing is held.
    for _ in 0..10_000 {
        if w.state.is_none() {
            break;
        }
        clock += tick;
        timer(&mut w, at(clock));
    }
    w
}

/// Each event is started exactly once, dropped, or replaced: none is lost,
/// none runs twice.
fn each_once(w: &World, n: usize) {
    let mut seen = vec![0; n];
    for (_, s) in &w.starts {
        for e in &s.events {
            seen[*e as usize] += 1;
        }
    }
    for e in w.dropped.iter().chain(&w.superseded) {
        seen[*e as usize] += 1;
    }
    assert!(seen.iter().all(|n| *n == 1), "each event once: {seen:?}");
    assert!(w.state.is_none(), "nothing is held in the end");
}

fn times() -> impl Strategy<Value = Vec<i64>> {
    prop::collection::vec(0i64..3_000, 1..60).prop_map(|mut v| {
        v.sort();
        v
    })
}

proptest! {
    #[test]
    fn a_trailing_debounce_starts_one_run_per_burst_with_its_last_event(arrivals in times(), period in 1u64..500, tick in 1i64..200) {
        let hold = Hold::Debounce { period_ms: period, leading: false, max_wait_ms: None };
        let w = drive(&hold, &arrivals, tick);
        each_once(&w, arrivals.len());
        prop_assert!(w.dropped.is_empty());
        // The last event always runs; a run's event is followed by a quiet period.
        prop_assert_eq!(w.starts.last().unwrap().1.events.clone(), vec![arrivals.len() as i64 - 1]);
        for (_, s) in &w.starts {
            let e = s.events[0] as usize;
            if let Some(next) = arrivals.get(e + 1) {
                prop_assert!(next - arrivals[e] >= period as i64, "a burst ends with a quiet period");
            }
        }
    }

    #[test]
    fn a_debounce_with_a_longest_wait_starts_within_it(arrivals in times(), period in 1u64..500, max_wait in 1u64..800, tick in 1i64..50) {
        let hold = Hold::Debounce { period_ms: period, leading: false, max_wait_ms: Some(max_wait) };
        let w = drive(&hold, &arrivals, tick);
        each_once(&w, arrivals.len());
    }

    #[test]
    fn a_leading_debounce_starts_a_burst_s_first_event_and_drops_the_rest(arrivals in times(), period in 1u64..500, tick in 1i64..200) {
        let hold = Hold::Debounce { period_ms: period, leading: true, max_wait_ms: None };
        let w = drive(&hold, &arrivals, tick);
        each_once(&w, arrivals.len());
        prop_assert_eq!(w.starts[0].1.events.clone(), vec![0]);
        for (_, s) in &w.starts {
            let e = s.events[0] as usize;
            if e > 0 {
                prop_assert!(arrivals[e] - arrivals[e - 1] >= period as i64, "a run starts only after quiet");
            }
        }
    }

    #[test]
    fn a_batch_holds_each_event_once_in_order_and_at_most_max_size(arrivals in times(), size in 1u32..20, wait in 1u64..500, tick in 1i64..200) {
        let hold = Hold::Batch { max_size: size, max_wait_ms: wait };
        let w = drive(&hold, &arrivals, tick);
        each_once(&w, arrivals.len());
        prop_assert!(w.dropped.is_empty());
        let mut order = Vec::new();
        for (_, s) in &w.starts {
            prop_assert!(!s.events.is_empty() && s.events.len() <= size as usize);
            prop_assert_eq!(s.input.as_array().unwrap().len(), s.events.len());
            order.extend(s.events.iter().copied());
        }
        prop_assert_eq!(order, (0..arrivals.len() as i64).collect::<Vec<_>>());
    }

    #[test]
    fn a_throttle_starts_at_most_count_per_period_and_queues_the_rest_in_order(arrivals in times(), count in 1u32..5, period in 1u64..500, tick in 1i64..200, queue in any::<bool>()) {
        let hold = Hold::Throttle { count, period_ms: period, queue };
        let w = drive(&hold, &arrivals, tick);
        each_once(&w, arrivals.len());
        if queue {
            prop_assert!(w.dropped.is_empty(), "nothing dropped below the queue's limit");
            let order: Vec<i64> = w.starts.iter().flat_map(|(_, s)| s.events.clone()).collect();
            prop_assert_eq!(order, (0..arrivals.len() as i64).collect::<Vec<_>>());
        }
        // Periods are fixed, each beginning with its first run: any span of
        // a period's length meets at most two of them.
        for (i, (t, _)) in w.starts.iter().enumerate() {
            let within = w.starts[i..].iter().take_while(|(u, _)| *u < *t + ms(period)).count();
            prop_assert!(within <= 2 * count as usize, "{} starts within a period from {}", within, t);
        }
    }
}

#[test]
fn a_stale_key_does_its_due_work_before_the_new_event() {
    let hold = Hold::Batch { max_size: 10, max_wait_ms: 100 };
    let first = arrive(&hold, None, at(0), ev(0), MAX_HELD_BYTES);
    let late = arrive(&hold, first.state, at(500), ev(1), MAX_HELD_BYTES);
    assert_eq!(late.starts.len(), 1, "the overdue batch started");
    assert_eq!(late.starts[0].events, vec![0]);
    assert!(matches!(late.outcome, Outcome::Held(_)));
    assert_eq!(late.state.unwrap().events.len(), 1);
}

#[test]
fn a_batch_past_the_bytes_a_key_holds_starts_with_what_it_has() {
    let hold = Hold::Batch { max_size: 1000, max_wait_ms: 60_000 };
    let big = |seq| HeldEvent {
        seq,
        event_id: "b".into(),
        input: json!("x".repeat(MAX_HELD_BYTES / 3)),
        idempotency_key: None,
    };
    let mut state = None;
    let mut started = Vec::new();
    for seq in 0..4 {
        let step = arrive(&hold, state, at(seq), big(seq), MAX_HELD_BYTES);
        started.extend(step.starts.into_iter().map(|s| s.events));
        state = step.state;
    }
    assert_eq!(started, vec![vec![0, 1]], "a third would pass MAX_HELD_BYTES");
    assert_eq!(state.unwrap().events.len(), 2);
    // Under a smaller largest input, a batch never passes it either.
    let mut state = None;
    let mut lists = Vec::new();
    for seq in 0..10 {
        let step = arrive(&hold, state, at(seq), ev(seq), 40);
        lists.extend(step.starts.into_iter().map(|s| s.input.to_string().len()));
        state = step.state;
    }
    assert!(!lists.is_empty() && lists.iter().all(|n| *n <= 40), "{lists:?}");
}

#[test]
fn a_full_throttle_queue_drops_and_says_so() {
    let hold = Hold::Throttle { count: 1, period_ms: 60_000, queue: true };
    let mut state = arrive(&hold, None, at(0), ev(0), MAX_HELD_BYTES).state;
    for seq in 1..=MAX_THROTTLE_QUEUE as i64 {
        let step = arrive(&hold, state, at(1), ev(seq), MAX_HELD_BYTES);
        assert!(matches!(step.outcome, Outcome::Held(_)));
        state = step.state;
    }
    let over = arrive(&hold, state, at(2), ev(5000), MAX_HELD_BYTES);
    let Outcome::Dropped(why) = over.outcome else { panic!("{:?}", over.outcome) };
    assert!(why.contains("max_throttle_queue"), "{why}");
}

#[test]
fn a_hold_reads_back_as_it_was_kept() {
    for hold in [
        Hold::Debounce { period_ms: 5, leading: true, max_wait_ms: Some(9) },
        Hold::Batch { max_size: 3, max_wait_ms: 7 },
        Hold::Throttle { count: 2, period_ms: 1, queue: false },
    ] {
        let kept = serde_json::to_value(&hold).unwrap();
        assert_eq!(serde_json::from_value::<Hold>(kept).unwrap(), hold);
    }
}
