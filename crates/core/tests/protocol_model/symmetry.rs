//! The model's symmetries: the two workers are alike, and so are the two
//! coordinators, so a state and the one with two workers (or two
//! coordinators) renamed behave alike, and the search keeps one of them:
//! the one whose hash is least (a tie keeps both, which costs only time).

use std::hash::{BuildHasher, BuildHasherDefault};

use crate::checker::Fx;
use crate::state::{State, TxKind};

/// `s` with its workers' names swapped.
fn workers_swapped(s: &State) -> State {
    let other = |w: u8| 1 - w;
    let mut n = s.clone();
    n.workers.swap(0, 1);
    for row in n.rows.iter_mut() {
        row.owner = row.owner.map(other);
    }
    for tx in n.tx.iter_mut().flatten() {
        for owner in tx.owners.iter_mut() {
            *owner = owner.map(other);
        }
        if let TxKind::Report { worker, .. } = &mut tx.kind {
            *worker = other(*worker);
        }
    }
    n
}

/// `s` with its coordinators' names swapped.
fn coordinators_swapped(s: &State) -> State {
    let mut n = s.clone();
    n.tx.swap(0, 1);
    n.sending.swap(0, 1);
    n
}

/// The state of the four that stands for them. Whether a coordinator is
/// busy (a transaction, or a message in hand) does not change when the
/// workers are renamed, so with one busy coordinator the busy one is put
/// first and the workers' two namings compared; with none, the
/// coordinators' renaming changes nothing; with two (only with a bug), all
/// four are compared.
pub fn canonical(s: State) -> State {
    let hasher = BuildHasherDefault::<Fx>::default();
    let least = |states: Vec<State>| states.into_iter().min_by_key(|x| hasher.hash_one(x)).expect("a state");
    let busy = |c: usize| s.tx[c].is_some() || s.sending[c].is_some();
    match (busy(0), busy(1)) {
        (true, true) => {
            let (w, c) = (workers_swapped(&s), coordinators_swapped(&s));
            let wc = coordinators_swapped(&w);
            least(vec![s, w, c, wc])
        }
        (false, true) => {
            let c = coordinators_swapped(&s);
            least(vec![workers_swapped(&c), c])
        }
        _ => least(vec![workers_swapped(&s), s]),
    }
}
