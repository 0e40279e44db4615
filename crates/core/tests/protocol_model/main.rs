//! An exhaustive model of Composer's dispatch, lease, outbox and recovery
//! protocol, checked state by state: one run of one or two steps, two
//! coordinators, two workers, a Redis stream that loses and duplicates
//! messages, and the PostgreSQL rows the code's statements guard. Every
//! state reachable within the bounds is visited, the protocol's properties
//! are checked in each, and a broken one comes with its shortest trace.
//!
//! - `checker`: the generic breadth-first checker and its progress check.
//! - `oracle`: the code's state machine (`composer_core::machine::apply`),
//!   asked what each event does.
//! - `state`: configuration, states, actions, and how a trace prints them.
//! - `steps`: what each actor may do next (engine, outbox, Redis, polls,
//!   workers), the code's guards cited.
//! - `recovery`: the recovery sweeps, attempts' deadlines, time, crashes.
//! - `props`: the properties, and the protocol as a `checker::Model`.
//! - `symmetry`: the workers' and coordinators' names, which the search
//!   may swap.
//! - `names`: the code's enums (task and run states, why an event is
//!   ignored) against what the model covers.
//!
//! Bounds: two attempts per step, one re-dispatch per attempt by recovery
//! (`COMPOSER_MAX_DISPATCHES` = 1), two copies of a message, a few faults
//! per run (`GRID`). Time is a lease's `expired` flag, and every grace,
//! claim timeout, age and deadline is "at any moment". What the search
//! skips changes no property: states alike but for the actors' names
//! (`symmetry`), messages and rows no lease can take (`steps`), and eager
//! dispatch, which reaches no state the outbox does not.
//!
//! The tests: the grid (every configuration holds every property), one
//! test per property that a deliberately broken protocol breaks it (so no
//! property holds vacuously), two that plant the code as it was before its
//! fixes of at-most-once (`Bug::UnguardedWrite`,
//! `Bug::MaxDispatchesNotUnknown`), one that pins where the code is weaker
//! than the docs say (`holder_at_commit`), and the names.

#![allow(clippy::unwrap_used)] // a test fails by panicking

mod checker;
mod names;
mod oracle;
mod props;
mod recovery;
mod state;
mod steps;
mod symmetry;

use checker::{check, Limits, Report};
use props::Property;
use state::{Action, Answer, Bug, Config, Got};
use steps::Protocol;

/// Far above what any configuration reaches: a search that stops at it
/// fails its test (nothing is proved by a search that stopped).
const LIMITS: Limits = Limits { max_states: 2_000_000, max_depth: 200 };

fn explore(cfg: Config) -> (Protocol, Report<Protocol>) {
    let m = Protocol::new(cfg);
    let report = check(&m, LIMITS);
    (m, report)
}

/// The grid: one or two steps, at most once or not. Faults (a message
/// lost or delivered again, a worker's or a coordinator's crash, a
/// publisher's death between its XADD and its DELETE) are bounded per run:
/// three, but for the two-step at-least-once chain, whose takeovers and
/// requeues make it the largest: one there (two take 645,000 states and 28 s
/// of a debug build, and hold as well). Every step has a node `timeout`
/// (its deadline may pass at any moment).
const GRID: [(usize, bool, u8, bool); 4] =
    [(1, false, 3, true), (1, true, 3, true), (2, false, 1, true), (2, true, 3, true)];

/// Fewer states than this means the model lost its way (a guard that
/// disables everything, a broken search): each configuration reaches far more.
const FLOOR: usize = 1_000;

#[test]
fn the_protocol_holds_in_every_reachable_state_of_two_coordinators_and_two_workers() {
    for (tasks, at_most_once, max_faults, node_timeout) in GRID {
        let started = std::time::Instant::now();
        let (m, r) = explore(Config { max_faults, node_timeout, ..Config::new(tasks, at_most_once) });
        eprintln!(
            "protocol model: {tasks} step(s), at_most_once {at_most_once}, {max_faults} fault(s), \
             node timeout {node_timeout}: {} states, {} steps, depth {}, {:.2?}",
            r.states,
            r.steps,
            r.depth,
            started.elapsed()
        );
        if let Some(v) = &r.violation {
            panic!("{}", v.render(&m));
        }
        assert!(r.exhaustive, "the search stopped at a limit");
        assert!(r.states > FLOOR, "{} states: the model explores almost nothing", r.states);
    }
}

/// Explores `cfg` with `bug` planted and returns the trace that breaks
/// `property`, failing unless the checker finds exactly that.
#[allow(clippy::print_stderr)] // the trace is what the test shows its reader (a #[test] fn may print)
fn broken_by(cfg: Config, bug: Bug, property: Property) -> Vec<Action> {
    let (m, r) = explore(Config { bug: Some(bug), ..cfg });
    let v = r.violation.unwrap_or_else(|| panic!("{bug:?}: no property broken in {} states", r.states));
    eprintln!("{bug:?}:\n{}", v.render(&m));
    assert_eq!(v.property, property, "{bug:?} broke another property first");
    assert!(!v.trace.is_empty(), "a violation needs steps to get there");
    v.trace.into_iter().map(|(a, _)| a).collect()
}

#[test]
fn a_result_applied_without_its_lease_check_breaks_only_the_holder() {
    let trace = broken_by(Config::new(1, false), Bug::AcceptStaleReport, Property::OnlyTheHolder);
    assert!(trace.iter().any(|a| matches!(a, Action::TakeOver { .. } | Action::Poll { got: Got::TakenOver, .. })));
}

#[test]
fn results_applied_without_the_run_lock_break_no_result_twice() {
    let trace = broken_by(Config::new(1, false), Bug::NoRunLock, Property::NoResultTwice);
    let applied = trace.iter().filter(|a| matches!(a, Action::Commit { answer: Answer::Applied, .. })).count();
    assert_eq!(applied, 2, "two reports of one attempt applied");
}

#[test]
fn re_dispatching_an_expired_at_most_once_lease_breaks_at_most_once() {
    let trace = broken_by(Config::new(1, true), Bug::RetryAtMostOnce, Property::AtMostOnce);
    assert!(trace.iter().any(|a| matches!(a, Action::LeaseExpires { .. })));
}

#[test]
fn a_cancel_that_leaves_pending_tasks_breaks_nothing_after_cancel() {
    let trace = broken_by(Config::new(1, false), Bug::DispatchAfterCancel, Property::NothingAfterCancel);
    let cancel = trace.iter().position(|a| matches!(a, Action::Cancel)).unwrap();
    assert!(matches!(trace.last(), Some(Action::Poll { got: Got::Granted, .. })), "{:?}", &trace[cancel..]);
}

#[test]
fn deleting_the_outbox_row_before_its_xadd_breaks_no_lost_work() {
    let trace = broken_by(Config::new(1, false), Bug::DeleteOutboxBeforePublish, Property::NoLostWork);
    assert!(matches!(trace.last(), Some(Action::CoordCrash { .. })));
}

#[test]
fn without_the_lost_dispatch_sweep_a_lost_message_breaks_progress() {
    let cfg = Config { max_faults: 1, ..Config::new(1, false) };
    let trace = broken_by(cfg, Bug::NoLostDispatchSweep, Property::Progress);
    assert!(matches!(trace.last(), Some(Action::LoseMessage { .. })));
}

/// The engine's write of a task it read PENDING, unguarded (the code
/// before `store::transitions` checked the row is still PENDING): a poll
/// leases the attempt between the engine's read and its commit, its worker
/// calls the target, and the commit writes what the machine made of
/// PENDING, a retry, over the lease: the next attempt calls the target
/// again while the first call's outcome is unknown. With a node `timeout`
/// the timer loop's failure of the attempt does it; without, the
/// max-dispatches sweep's (`coord::loops::fail_exhausted`).
#[test]
fn an_unguarded_write_can_send_an_at_most_once_attempt_twice() {
    for node_timeout in [true, false] {
        let cfg = Config { node_timeout, ..Config::new(1, true) };
        let trace = broken_by(cfg, Bug::UnguardedWrite, Property::AtMostOnce);
        let read = trace
            .iter()
            .position(|a| match node_timeout {
                true => matches!(a, Action::DeadlinePasses { .. }),
                false => matches!(a, Action::FailExhausted { .. }),
            })
            .unwrap();
        let commit = read + trace[read..].iter().position(|a| matches!(a, Action::Commit { .. })).unwrap();
        assert!(
            trace[read..commit].iter().any(|a| matches!(a, Action::Poll { got: Got::Granted, .. })),
            "the attempt is leased between the engine's read and its commit"
        );
        assert!(matches!(trace[commit], Action::Commit { answer: Answer::Applied, .. }));
    }
}

/// `max_dispatches` taken for a known failure (the code before it joined
/// the unknown outcomes in `rules::report::fail_attempt`): the sweep finds
/// the attempt PENDING with its message lost, a poll leases it before the
/// engine reads the run, its worker calls the target, and the engine, which
/// reads RUNNING (the guard has nothing to refuse), retries the attempt:
/// the target is called again while the first call's outcome is unknown.
#[test]
fn a_max_dispatches_failure_taken_as_known_can_send_an_at_most_once_attempt_twice() {
    let trace = broken_by(Config::new(1, true), Bug::MaxDispatchesNotUnknown, Property::AtMostOnce);
    let found = trace.iter().position(|a| matches!(a, Action::FindExhausted { .. })).unwrap();
    let read = found + trace[found..].iter().position(|a| matches!(a, Action::FailExhausted { .. })).unwrap();
    assert!(
        trace[found..read].iter().any(|a| matches!(a, Action::Poll { got: Got::Granted, .. })),
        "the attempt is leased between the sweep's SELECT and the engine's read"
    );
    let commit = read + trace[read..].iter().position(|a| matches!(a, Action::Commit { .. })).unwrap();
    assert!(matches!(trace[commit], Action::Commit { answer: Answer::Applied, .. }));
}

/// Pinned: a result is checked against the lease as the engine's
/// transaction read the task's row (`coord::engine::batch::events`), and
/// the row is not locked (only the run's is), so a poll that takes over
/// the expired lease meanwhile does not stop the result: the slow worker's
/// result is applied over the new holder's lease. The commit's guard
/// covers only rows read PENDING, and this one was read RUNNING. It is
/// benign: the result is of the current attempt and applied once (the run's
/// lock orders the two reports, and the new holder's, read after this
/// commit, finds its lease gone and is refused with 409), and takeovers
/// skip at-most-once steps, so the new holder's call of the target is one
/// an at-least-once step allows. The grid's property 2 asks for the holder
/// as read, which the code keeps.
#[test]
fn a_result_is_checked_against_the_lease_as_read_not_as_committed() {
    let (m, r) = explore(Config { holder_at_commit: true, ..Config::new(1, false) });
    let v = r.violation.expect("a takeover between the read and the commit is found");
    eprintln!("{}", v.render(&m));
    assert_eq!(v.property, Property::OnlyTheHolder);
    let actions: Vec<Action> = v.trace.iter().map(|(a, _)| *a).collect();
    let read = actions.iter().position(|a| matches!(a, Action::Report { .. })).unwrap();
    assert!(actions[read..]
        .iter()
        .any(|a| matches!(a, Action::TakeOver { .. } | Action::Poll { got: Got::TakenOver, .. })));
    let last = &v.trace.last().unwrap().1;
    assert!(last.ghost[0].applied.iter().all(|&n| n <= 1), "the result is applied once all the same");
}

/// The model's task states are the code's `TaskState` (its rows hold that
/// enum); this says which of them it reaches and why it leaves the others
/// out, and the same of run statuses and of the machine's reasons for
/// ignoring an event (asked of the machine itself).
#[test]
fn the_model_names_the_code_s_states() {
    use composer_core::machine::{IgnoreKind, RunStatus, TaskState};
    use names::{Covered, Ignored};
    let (mut states, mut statuses) = (std::collections::HashSet::new(), std::collections::HashSet::new());
    for at_most_once in [false, true] {
        let m = Protocol::new(Config::new(1, at_most_once));
        let r = checker::check_visiting(&m, LIMITS, |s| {
            states.extend(s.rows.iter().filter_map(|r| r.state));
            statuses.extend(s.run);
        });
        assert!(r.violation.is_none() && r.exhaustive);
    }
    for s in TaskState::ALL {
        assert_eq!(TaskState::parse(s.as_str()), Some(s));
        match names::task_state(s) {
            Covered::Modelled => assert!(states.contains(&s), "{s} is modelled but never reached"),
            Covered::LeftOut(why) => assert!(!states.contains(&s) && !why.is_empty(), "{s} is reached: {why}"),
        }
    }
    for s in RunStatus::ALL {
        assert_eq!(RunStatus::parse(s.as_str()), Some(s));
        match names::run_status(s) {
            Covered::Modelled => assert!(statuses.contains(&s), "run {s} is modelled but never reached"),
            Covered::LeftOut(why) => assert!(!statuses.contains(&s) && !why.is_empty(), "run {s} is reached: {why}"),
        }
    }
    for kind in IgnoreKind::ALL {
        match names::ignore_kind(kind) {
            Ignored::Guard(steps, amo, view, event) => {
                let got = names::ignored_by_the_machine(steps, amo, view, event);
                assert_eq!(got, Some(kind), "{} for {event:?} on {view:?}", kind.as_str());
            }
            Ignored::Unused(why) => assert!(!why.is_empty()),
        }
    }
}
