//! The store's transaction: one dropped unfinished rolls back on its
//! connection before the pool hands that connection to anyone else; the
//! engine's, whose `BEGIN` is sent with its first read, says when that
//! `BEGIN` failed before anything is written.

use std::time::Duration;

use composer_testkit::TestDb;

/// A pool of one connection: whoever comes next gets the same one.
async fn one_connection() -> (TestDb, composer_store::Pool) {
    let db = TestDb::create().await;
    let pool = composer_store::connect(&db.url, 1, Duration::from_secs(5)).unwrap();
    let client = composer_store::client(&pool).await.unwrap();
    client.batch_execute("CREATE TABLE t (v int CHECK (v > 0))").await.unwrap();
    (db, pool)
}

async fn values(pool: &composer_store::Pool) -> Vec<i32> {
    let client = composer_store::client(pool).await.unwrap();
    client.query("SELECT v FROM t ORDER BY v", &[]).await.unwrap().iter().map(|r| r.get(0)).collect()
}

/// Inserts `v` in a transaction of its own and commits it: the connection
/// serves a transaction as if nothing had happened on it before.
async fn commit_one(pool: &composer_store::Pool, v: i32) {
    let mut client = composer_store::client(pool).await.unwrap();
    let tx = composer_store::begin(&mut client).await.unwrap();
    tx.execute("INSERT INTO t VALUES ($1)", &[&v]).await.unwrap();
    tx.commit().await.unwrap();
}

/// Whether the connection is inside a transaction block: `now()` is the
/// transaction's start, so two statements apart see the same one only
/// inside a block.
async fn in_a_block(client: &composer_store::Client) -> bool {
    let a: chrono::DateTime<chrono::Utc> = client.query_one("SELECT now()", &[]).await.unwrap().get(0);
    // A fixed time by nature: the clock must move between the two reads.
    tokio::time::sleep(Duration::from_millis(5)).await;
    let b: chrono::DateTime<chrono::Utc> = client.query_one("SELECT now()", &[]).await.unwrap().get(0);
    a == b
}

#[tokio::test]
async fn statements_after_either_begin_are_in_the_transaction_and_commit_together() {
    let (db, pool) = one_connection().await;
    let elsewhere = composer_store::connect(&db.url, 1, Duration::from_secs(5)).unwrap();
    for pipelined in [false, true] {
        let mut client = composer_store::client(&pool).await.unwrap();
        let mut tx = match pipelined {
            false => composer_store::begin(&mut client).await.unwrap(),
            true => composer_store::begin_pipelined(&mut client),
        };
        // The first read, sent before `BEGIN`'s answer is looked at, is in
        // the transaction too: it sees the transaction's start as `now()`.
        let read = tx.query_one("SELECT count(*), now() FROM t", &[]).await.unwrap();
        let (first, start): (i64, chrono::DateTime<chrono::Utc>) = (read.get(0), read.get(1));
        tx.confirm().await.unwrap();
        // A fixed time by nature: the clock must move between the two reads.
        tokio::time::sleep(Duration::from_millis(5)).await;
        let later: chrono::DateTime<chrono::Utc> = tx.query_one("SELECT now()", &[]).await.unwrap().get(0);
        assert_eq!(start, later, "the first read ran outside the transaction (pipelined: {pipelined})");
        tx.execute("INSERT INTO t VALUES ($1)", &[&(first as i32 + 1)]).await.unwrap();
        assert!(in_a_block(&tx).await, "not in a transaction block after begin (pipelined: {pipelined})");
        // Not visible elsewhere before the commit: the insert is in the transaction.
        assert_eq!(values(&elsewhere).await, (1..=first as i32).collect::<Vec<_>>());
        tx.commit().await.unwrap();
        assert!(!in_a_block(&client).await, "the connection is still in a transaction after the commit");
    }
    assert_eq!(values(&elsewhere).await, vec![1, 2]);
}

#[tokio::test]
async fn a_pipelined_begin_that_failed_is_an_error_at_confirm_and_the_connection_recovers() {
    let (_db, pool) = one_connection().await;
    {
        let client = composer_store::client(&pool).await.unwrap();
        // Leave the connection in an aborted transaction block, where
        // `BEGIN` itself fails (as a cancel landing on it would).
        assert!(client.batch_execute("BEGIN; SELECT 1/0").await.is_err());
    }
    {
        let mut client = composer_store::client(&pool).await.unwrap();
        let mut tx = composer_store::begin_pipelined(&mut client);
        let refused = tx.confirm().await;
        assert!(refused.is_err(), "a BEGIN that failed was confirmed");
        assert!(tx.confirm().await.is_err(), "a second look forgot that BEGIN failed");
        // Dropped: the queued ROLLBACK ends the aborted block.
    }
    commit_one(&pool, 7).await;
    assert_eq!(values(&pool).await, vec![7]);
}

#[tokio::test]
async fn a_transaction_abandoned_in_mid_statement_rolls_back() {
    let (_db, pool) = one_connection().await;
    {
        let mut client = composer_store::client(&pool).await.unwrap();
        let tx = composer_store::begin_pipelined(&mut client);
        let slow = tx.execute("INSERT INTO t SELECT 1 FROM pg_sleep(0.3)", &[]);
        assert!(tokio::time::timeout(Duration::from_millis(20), slow).await.is_err());
    }
    let client = composer_store::client(&pool).await.unwrap();
    assert!(!in_a_block(&client).await, "the pool handed out a connection inside the abandoned transaction");
    drop(client);
    assert_eq!(values(&pool).await, Vec::<i32>::new());
}

#[tokio::test]
async fn a_transaction_dropped_unfinished_rolls_back_before_the_connection_serves_anyone_else() {
    let (_db, pool) = one_connection().await;
    {
        let mut client = composer_store::client(&pool).await.unwrap();
        let tx = composer_store::begin(&mut client).await.unwrap();
        tx.execute("INSERT INTO t VALUES (1)", &[]).await.unwrap();
        // Dropped here, as by an error's `?` or a caller that went away.
    }
    let mut client = composer_store::client(&pool).await.unwrap();
    assert!(!in_a_block(&client).await, "the pool handed out a connection still inside the dropped transaction");
    let tx = composer_store::begin(&mut client).await.unwrap();
    tx.execute("INSERT INTO t VALUES (2)", &[]).await.unwrap();
    tx.commit().await.unwrap();
    drop(client);
    assert_eq!(values(&pool).await, vec![2]);
}

#[tokio::test]
async fn a_failed_statement_aborts_the_transaction_and_the_next_one_on_the_connection_works() {
    let (_db, pool) = one_connection().await;
    {
        let mut client = composer_store::client(&pool).await.unwrap();
        let tx = composer_store::begin(&mut client).await.unwrap();
        tx.execute("INSERT INTO t VALUES (1)", &[]).await.unwrap();
        let refused = tx.execute("INSERT INTO t VALUES (-1)", &[]).await;
        assert!(refused.is_err(), "the CHECK constraint let -1 in");
        // A commit of an aborted transaction does not commit its first row.
        let _ = tx.commit().await;
    }
    {
        let mut client = composer_store::client(&pool).await.unwrap();
        let tx = composer_store::begin(&mut client).await.unwrap();
        let refused = tx.execute("INSERT INTO t VALUES (-1)", &[]).await;
        assert!(refused.is_err());
        // Dropped in the aborted state: the rollback is queued.
    }
    commit_one(&pool, 3).await;
    assert_eq!(values(&pool).await, vec![3]);
}

#[tokio::test]
async fn a_savepoint_rolls_back_alone_and_a_released_one_commits_with_the_transaction() {
    let (_db, pool) = one_connection().await;
    let mut client = composer_store::client(&pool).await.unwrap();
    let mut tx = composer_store::begin(&mut client).await.unwrap();
    tx.execute("INSERT INTO t VALUES (1)", &[]).await.unwrap();
    {
        let sp = tx.savepoint("one").await.unwrap();
        sp.execute("INSERT INTO t VALUES (2)", &[]).await.unwrap();
        sp.rollback().await.unwrap();
    }
    {
        let sp = tx.savepoint("two").await.unwrap();
        assert!(sp.execute("INSERT INTO t VALUES (-2)", &[]).await.is_err());
        // Dropped: back to where it began, and the transaction goes on.
    }
    {
        let sp = tx.savepoint("three").await.unwrap();
        sp.execute("INSERT INTO t VALUES (4)", &[]).await.unwrap();
        sp.commit().await.unwrap();
    }
    tx.execute("INSERT INTO t VALUES (5)", &[]).await.unwrap();
    tx.commit().await.unwrap();
    drop(client);
    assert_eq!(values(&pool).await, vec![1, 4, 5]);
}

#[tokio::test]
async fn a_commit_whose_caller_leaves_after_sending_it_still_commits() {
    let (db, pool) = one_connection().await;
    {
        let mut client = composer_store::client(&pool).await.unwrap();
        let tx = composer_store::begin(&mut client).await.unwrap();
        tx.execute("INSERT INTO t VALUES (1)", &[]).await.unwrap();
        let mut commit = Box::pin(tx.commit());
        // One poll sends the COMMIT; the caller then goes away.
        assert!(futures_util::poll!(commit.as_mut()).is_pending());
    }
    // Read from another connection: the pooled one would see its own
    // transaction's row even had the commit never gone out.
    let elsewhere = composer_store::connect(&db.url, 1, Duration::from_secs(5)).unwrap();
    let client = composer_store::client(&pool).await.unwrap();
    assert!(!in_a_block(&client).await, "the connection went back to the pool inside the transaction");
    drop(client);
    assert_eq!(values(&elsewhere).await, vec![1]);
}

#[tokio::test]
async fn a_commit_dropped_before_it_was_polled_rolls_back() {
    let (db, pool) = one_connection().await;
    {
        let mut client = composer_store::client(&pool).await.unwrap();
        let tx = composer_store::begin(&mut client).await.unwrap();
        tx.execute("INSERT INTO t VALUES (1)", &[]).await.unwrap();
        drop(tx.commit());
    }
    let elsewhere = composer_store::connect(&db.url, 1, Duration::from_secs(5)).unwrap();
    let client = composer_store::client(&pool).await.unwrap();
    assert!(!in_a_block(&client).await);
    drop(client);
    assert_eq!(values(&elsewhere).await, Vec::<i32>::new());
}

/// The engine's locked read sends the run's lock and the read of its tasks
/// together: when the lock's wait ends in an error (here a statement
/// timeout while another transaction holds the run), that error is the
/// one returned, not the task read's "current transaction is aborted"
/// (25P02) that follows it, which would hide the cause and be taken for
/// a passing one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_locked_read_whose_lock_fails_returns_the_locks_error() {
    use composer_testkit::{Engine, EngineOptions};
    let e = Engine::with(EngineOptions { workers: 0, ..Default::default() }).await;
    e.register(&serde_json::json!({"name": "w", "nodes": [
        {"id": "wait", "type": "WAIT_FOR_EVENT", "config": {"event": "go", "key": "k"}}]}))
        .await;
    let run = e.start_run("w", serde_json::json!({})).await;
    let mut holder = composer_store::client(&e.db.pool()).await.unwrap();
    let held = holder.transaction().await.unwrap();
    held.execute("SELECT 1 FROM workflow_runs WHERE id = $1 FOR UPDATE", &[&run]).await.unwrap();
    for _ in 0..8 {
        let mut client = composer_store::client(&e.db.pool()).await.unwrap();
        let tx = composer_store::begin(&mut client).await.unwrap();
        tx.batch_execute("SET LOCAL statement_timeout = '100ms'").await.unwrap();
        let part = composer_store::runs::InPart { runs: &[], named: &[] };
        let Err(error) = composer_store::runs::lock_many(&tx, &[run], &[], part).await else {
            panic!("the run's lock was taken while another transaction held it")
        };
        let code = match &error {
            composer_store::Error::Db(e) => e.code().cloned(),
            _ => None,
        };
        assert_eq!(code, Some(tokio_postgres::error::SqlState::QUERY_CANCELED), "{error}");
    }
    held.rollback().await.unwrap();
    e.stop().await;
}

/// The recovery sweep's MAPs to carry on leave out a run whose row is
/// locked: a coordinator is carrying it in a long transaction (its rows'
/// `updated_at` is that transaction's start), and the sweep's event would
/// only wait on its lock until the statement timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_map_whose_run_is_locked_is_left_to_the_coordinator_that_holds_it() {
    use composer_testkit::{Engine, EngineOptions};
    // The engine's own sweep never runs here: it would carry the MAP on.
    let e = Engine::with(EngineOptions {
        workers: 0,
        coordinator: |c| c.recovery_interval = Duration::from_secs(3600),
        ..Default::default()
    })
    .await;
    e.register(&serde_json::json!({"name": "m", "nodes": [
        {"id": "each", "type": "MAP", "config": {"items": [1, 2, 3], "max_concurrency": 1,
            "node": {"type": "resize", "queue": "nobody"}}}]}))
        .await;
    let run = e.start_run("m", serde_json::json!({})).await;
    let db = composer_store::client(&e.db.pool()).await.unwrap();
    // As a coordinator that died before it carried the MAP on leaves it:
    // items queued, none open, untouched for a minute.
    let stalled = "UPDATE task_instances SET progress = jsonb_set(progress, '{open}', '0'),
                   updated_at = now() - interval '1 minute' WHERE run_id = $1 AND node_type = 'MAP'";
    assert_eq!(db.execute(stalled, &[&run]).await.unwrap(), 1);
    let found = || async {
        let maps = composer_store::runs::stalled_maps(&db, Duration::from_secs(5), 100).await.unwrap();
        maps.iter().any(|(r, _)| *r == run)
    };
    assert!(found().await, "a stalled MAP is found");
    let mut holder = composer_store::client(&e.db.pool()).await.unwrap();
    let held = holder.transaction().await.unwrap();
    held.execute("SELECT 1 FROM workflow_runs WHERE id = $1 FOR UPDATE", &[&run]).await.unwrap();
    // Without SKIP LOCKED it is found, and the sweep's event then waits
    // on that lock.
    assert!(!found().await, "one whose run is locked is not");
    held.rollback().await.unwrap();
    assert!(found().await, "once the lock is gone, it is found again");
    e.stop().await;
}
