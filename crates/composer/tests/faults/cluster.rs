//! A cluster of a scenario: PostgreSQL (and its replica), Redis and the
//! HTTP target on this machine; coordinators and workers in namespaces of
//! their own; and the client that talks to the coordinators the way a user
//! does (a timeout on every request, the next coordinator when one fails).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use composer_testkit::FakeHttp;
use serde_json::{json, Value};

use crate::net::{Forwarding, Host};
use crate::procs::{Clock, Node, Postgres, Redis, Replication, SlowDisk, SmallDisk};

pub const API_TOKEN: &str = "faults-api-token-0123456789abcdef";
const WORKER_TOKEN: &str = "faults-worker-token-0123456789abcdef";
pub const DB: &str = "faults";
/// How long one request to a coordinator may take before the client tries another.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(3);

/// What a scenario's cluster is made of.
pub struct Options {
    pub coordinators: usize,
    pub workers: usize,
    pub replication: Option<Replication>,
    /// Each coordinator's clock (missing ones: this machine's).
    pub clocks: Vec<Clock>,
    /// PostgreSQL's data on a disk of this many MiB, to fill.
    pub small_disk_mb: Option<u32>,
    /// The clock of PostgreSQL's host.
    pub pg_clock: Clock,
    /// PostgreSQL's WAL on a disk whose fsync stalls this many seconds when asked.
    pub slow_fsync: Option<f64>,
    /// Redis persisting (append-only file) on a disk of this many MiB, to fill.
    pub redis_disk_mb: Option<u32>,
    /// More settings for every coordinator.
    pub coordinator_env: Vec<(&'static str, String)>,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            coordinators: 2,
            workers: 2,
            replication: None,
            clocks: Vec::new(),
            small_disk_mb: None,
            pg_clock: Clock::True,
            slow_fsync: None,
            redis_disk_mb: None,
            coordinator_env: Vec::new(),
        }
    }
}

/// Fields drop in order: the processes first, the services, then the network.
pub struct Cluster {
    pub coords: Vec<Node>,
    pub workers: Vec<Node>,
    pub replica: Option<Postgres>,
    pub pg: Postgres,
    pub slow: Option<SlowDisk>,
    pub redis: Redis,
    pub redis_disk: Option<SmallDisk>,
    pub disk: Option<SmallDisk>,
    pub sink: FakeHttp,
    /// The namespace whose gateway is this machine's address for the others.
    pub hub: Host,
    pub dir: PathBuf,
    _forwarding: Forwarding,
    http: reqwest::Client,
    /// Whether the replica is now the primary.
    pub promoted: std::sync::atomic::AtomicBool,
}

impl Cluster {
    pub async fn start(name: &str, opts: Options) -> Cluster {
        let forwarding = Forwarding::on();
        let slug: String = name.chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '-' }).take(24).collect();
        let dir = composer_embedded::temp_dir(&format!("faults-{slug}")).expect("temp dir");
        // PostgreSQL, running as its own user, must reach its data.
        let mut parents = dir.clone();
        while parents.pop() && parents != Path::new("/") {
            let _ = std::process::Command::new("chmod").arg("o+x").arg(&parents).status();
        }
        std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o755)).expect("chmod");
        let hub = Host::new();
        let disk = opts.small_disk_mb.map(|mb| SmallDisk::mount(&dir.join("disk"), mb));
        let pg_dir = match &disk {
            Some(d) => d.dir.join("pg"),
            None => dir.join("pg"),
        };
        let slow = opts.slow_fsync.map(|secs| SlowDisk::mount(&dir.join("wal-disk"), secs));
        let waldir = slow.as_ref().map(|s| s.dir.join("wal"));
        let pg = Postgres::primary(&pg_dir, opts.replication, opts.pg_clock.clone(), waldir.as_deref());
        let replica = opts.replication.map(|_| Postgres::replica(&dir.join("replica"), &pg));
        composer_store::ensure_database(&pg.url("127.0.0.1", "postgres"), DB).await.expect("database");
        if replica.is_some() {
            streaming(&pg).await;
        }
        let redis_disk = opts.redis_disk_mb.map(|mb| SmallDisk::mount(&dir.join("redis-disk"), mb));
        let redis = match &redis_disk {
            Some(d) => Redis::start(&d.dir, true, &dir.join("redis.log")),
            None => Redis::start(&dir, false, &dir.join("redis.log")),
        };
        let sink = FakeHttp::start_on(std::net::Ipv4Addr::UNSPECIFIED.into()).await;
        let database_url = match &replica {
            // Both servers: a connection goes to whichever takes writes.
            Some(r) => format!(
                "postgres://postgres@{gw}:{},{gw}:{}/{DB}?target_session_attrs=read-write",
                pg.port,
                r.port,
                gw = hub.gateway
            ),
            None => pg.url(&hub.gateway, DB),
        };
        let common = vec![
            ("COMPOSER_DATABASE_URL".to_string(), database_url),
            ("COMPOSER_REDIS_URL".to_string(), format!("redis://{}:{}/", hub.gateway, redis.port)),
            ("COMPOSER_REDIS_PREFIX".to_string(), "faults:".to_string()),
            ("COMPOSER_API_TOKEN".to_string(), API_TOKEN.to_string()),
            ("COMPOSER_WORKER_TOKEN".to_string(), WORKER_TOKEN.to_string()),
            ("COMPOSER_LEASE_TTL".to_string(), "2s".to_string()),
            // The target is on a private address, which steps may not call by default.
            ("COMPOSER_HTTP_DENY".to_string(), "240.0.0.0/4".to_string()),
        ];
        let log = dir.join("composer.log");
        let mut coords = Vec::new();
        for i in 0..opts.coordinators {
            let mut env = common.clone();
            for (k, v) in [
                ("COMPOSER_STATE_DIR", dir.join(format!("state-{i}")).display().to_string()),
                ("COMPOSER_STREAM_SHARDS", "2".into()),
                ("COMPOSER_TIMER_INTERVAL", "200ms".into()),
                ("COMPOSER_RECOVERY_INTERVAL", "1s".into()),
                ("COMPOSER_LOST_DISPATCH_AGE", "3s".into()),
                ("COMPOSER_OUTBOX_CLAIM_TIMEOUT", "3s".into()),
                ("COMPOSER_DB_POOL_SIZE", "8".into()),
                ("COMPOSER_DB_TIMEOUT", "2s".into()),
            ] {
                env.push((k.to_string(), v));
            }
            env.extend(opts.coordinator_env.iter().map(|(k, v)| (k.to_string(), v.clone())));
            let clock = opts.clocks.get(i).cloned().unwrap_or(Clock::True);
            let mut node = Node::new("coordinator", env, clock, log.clone());
            node.push_env("COMPOSER_LISTEN", format!("0.0.0.0:{}", node.port));
            coords.push(node);
        }
        let urls: Vec<String> = coords.iter().map(Node::url).collect();
        let mut workers = Vec::new();
        for _ in 0..opts.workers {
            let mut env = common.clone();
            env.push(("COMPOSER_COORDINATOR_URLS".into(), urls.join(",")));
            env.push(("COMPOSER_RECLAIM_INTERVAL".into(), "1s".into()));
            env.push(("COMPOSER_WORKER_CONCURRENCY".into(), "8".into()));
            workers.push(Node::new("worker", env, Clock::True, log.clone()));
        }
        let http = reqwest::Client::builder().timeout(REQUEST_TIMEOUT).build().expect("HTTP client");
        let mut cluster = Cluster {
            coords,
            workers,
            replica,
            pg,
            slow,
            redis,
            redis_disk,
            disk,
            sink,
            hub,
            dir,
            _forwarding: forwarding,
            http,
            promoted: false.into(),
        };
        for c in &mut cluster.coords {
            c.spawn();
        }
        for w in &mut cluster.workers {
            w.spawn();
        }
        cluster
    }

    /// The HTTP target's URL for `path`, as the steps reach it.
    pub fn target(&self, path: &str) -> String {
        format!("http://{}:{}{path}", self.hub.gateway, self.sink.url("").rsplit(':').next().unwrap_or_default())
    }

    /// The current primary, from this machine.
    pub fn db_url(&self) -> String {
        match (&self.replica, self.promoted.load(std::sync::atomic::Ordering::Relaxed)) {
            (Some(r), true) => r.url("127.0.0.1", DB),
            _ => self.pg.url("127.0.0.1", DB),
        }
    }

    pub async fn db(&self) -> tokio_postgres::Client {
        let (client, conn) = tokio_postgres::connect(&self.db_url(), tokio_postgres::NoTls).await.expect("connecting");
        tokio::spawn(conn);
        client
    }

    /// One request to coordinator `i`: its status and body, or why there was none.
    pub async fn call(
        &self,
        i: usize,
        method: reqwest::Method,
        path: &str,
        body: Option<&Value>,
    ) -> Result<(u16, Value), String> {
        let url = format!("{}{path}", self.coords[i % self.coords.len()].url());
        let mut req = self.http.request(method, &url).bearer_auth(API_TOKEN);
        if let Some(b) = body {
            req = req.json(b);
        }
        let resp = req.send().await.map_err(|e| format!("{url}: {e}"))?;
        let status = resp.status().as_u16();
        Ok((status, resp.json().await.unwrap_or(Value::Null)))
    }

    /// Sends to one coordinator after another until one answers below 500,
    /// or `deadline` passes (then the last error).
    pub async fn send(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<&Value>,
        deadline: Instant,
    ) -> Result<(u16, Value), String> {
        let mut i = 0;
        loop {
            let last = match self.call(i, method.clone(), path, body).await {
                Ok((status, v)) if status < 500 => return Ok((status, v)),
                Ok((status, v)) => format!("{status} {v}"),
                Err(e) => e,
            };
            i += 1;
            if Instant::now() >= deadline {
                return Err(last);
            }
            // The pace of a client's retries while a coordinator is cut off.
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Waits until every coordinator's `/readyz` answers 200.
    pub async fn wait_ready(&self, within: Duration) {
        let until = Instant::now() + within;
        for i in 0..self.coords.len() {
            loop {
                if matches!(self.call(i, reqwest::Method::GET, "/readyz", None).await, Ok((200, _))) {
                    break;
                }
                assert!(Instant::now() < until, "coordinator {i} not ready in {within:?}; see {}", self.dir.display());
                // Waiting for a process to come up.
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }

    /// Registers `spec`, on whichever coordinator answers.
    pub async fn register(&self, spec: &Value) {
        let deadline = Instant::now() + Duration::from_secs(30);
        let (status, body) =
            self.send(reqwest::Method::POST, "/v1/workflows", Some(spec), deadline).await.expect("registering");
        assert!(status == 200 || status == 201, "registering {}: {status} {body}", spec["name"]);
    }

    /// The failover: the primary's host dies and the replica is promoted.
    pub fn fail_over(&self) {
        self.pg.kill();
        self.replica.as_ref().expect("a replica").promote();
        self.promoted.store(true, std::sync::atomic::Ordering::Relaxed);
    }

    pub fn log(&self) -> PathBuf {
        self.dir.join("composer.log")
    }
}

/// Waits until the replica streams from `primary` (coordinators read how
/// PostgreSQL replicates when they start).
async fn streaming(primary: &Postgres) {
    let (db, conn) = tokio_postgres::connect(&primary.url("127.0.0.1", "postgres"), tokio_postgres::NoTls)
        .await
        .expect("connecting");
    tokio::spawn(conn);
    let until = Instant::now() + Duration::from_secs(30);
    while db.query_one("SELECT count(*) FROM pg_stat_replication", &[]).await.expect("replication").get::<_, i64>(0)
        == 0
    {
        assert!(Instant::now() < until, "the replica is not streaming after 30 s");
        // Polling a replica that is connecting.
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// `json!` for a step calling the target at `path`/<run id>/<node>.
pub fn http_step(cluster: &Cluster, id: &str, path: &str) -> Value {
    json!({"id": id, "type": "HTTP",
           "config": {"method": "POST", "url": cluster.target(&format!("/{path}/${{ .run.id }}/{id}"))},
           "retry": {"max_attempts": 5, "initial_backoff": "200ms"}})
}
