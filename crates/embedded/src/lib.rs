//! PostgreSQL and redis-server run from the machine's own binaries, on free
//! loopback ports: the embedded default of `composer dev`, and the throwaway
//! services of the test harness.
//!
//! Children are started with a parent-death signal from a thread that lives
//! as long as the process, so a SIGKILLed parent leaves no server behind.
//! PostgreSQL refuses to run as root; as root, it runs as the `postgres` user,
//! which may not be able to reach the data directory asked for (a 0700
//! parent such as `/root`, or a `mktemp -d` TMPDIR): the data then goes where
//! it can ([`LocalPostgres::start`]).

use std::fs;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{0}")]
    Missing(String),
    #[error("{what} failed: {detail}")]
    Failed { what: String, detail: String },
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// A free TCP port on 127.0.0.1 (free when asked; the caller binds it soon).
pub fn free_port() -> Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// A fresh directory under the system temp dir.
pub fn temp_dir(label: &str) -> Result<PathBuf> {
    static COUNTER: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let nanos =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.subsec_nanos()).unwrap_or(0);
    let dir = std::env::temp_dir().join(format!("composer-{label}-{}-{n}-{nanos}", std::process::id()));
    fs::create_dir_all(&dir)?;
    if let Ok(mut made) = TEMP_DIRS.lock() {
        made.push(fs::canonicalize(&dir)?);
    }
    Ok(dir)
}

/// The directories [`temp_dir`] made: a server's data under one is throwaway.
static TEMP_DIRS: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

fn is_throwaway(path: &Path) -> bool {
    TEMP_DIRS.lock().is_ok_and(|made| made.iter().any(|d| path.starts_with(d)))
}

struct SpawnRequest {
    command: Command,
    signal: i32,
    reply: mpsc::Sender<std::io::Result<Child>>,
}

/// Spawns `command` from a thread that never exits, so the child's
/// parent-death signal fires when this process dies, not when the calling
/// thread does.
fn spawn_bound(mut command: Command, signal: i32) -> std::io::Result<Child> {
    static SPAWNER: OnceLock<Mutex<mpsc::Sender<SpawnRequest>>> = OnceLock::new();
    let sender = SPAWNER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<SpawnRequest>();
        std::thread::Builder::new()
            .name("composer-spawner".into())
            .spawn(move || {
                for mut req in rx {
                    let signal = req.signal;
                    // SAFETY: prctl is async-signal-safe and touches only this process.
                    #[allow(unsafe_code)]
                    unsafe {
                        req.command.pre_exec(move || {
                            if libc::prctl(libc::PR_SET_PDEATHSIG, signal as libc::c_ulong) != 0 {
                                return Err(std::io::Error::last_os_error());
                            }
                            Ok(())
                        });
                    }
                    let _ = req.reply.send(req.command.spawn());
                }
                // Keep the thread (and so the death-signal binding) alive.
                loop {
                    std::thread::park();
                }
            })
            .expect("spawning the process spawner thread");
        Mutex::new(tx)
    });
    command.process_group(0);
    let (reply, answer) = mpsc::channel();
    sender
        .lock()
        .expect("spawner lock")
        .send(SpawnRequest { command, signal, reply })
        .map_err(|_| std::io::Error::other("spawner thread is gone"))?;
    answer.recv().map_err(|_| std::io::Error::other("spawner thread is gone"))?
}

fn signal(child: &Child, sig: i32) {
    // SAFETY: sending a signal to our own child by pid.
    #[allow(unsafe_code)]
    unsafe {
        libc::kill(child.id() as libc::pid_t, sig);
    }
}

/// Waits up to `timeout` for the child to exit; SIGKILLs it otherwise.
fn stop_child(child: &mut Child, sig: i32, timeout: Duration) {
    if matches!(child.try_wait(), Ok(Some(_))) {
        return;
    }
    signal(child, sig);
    let until = Instant::now() + timeout;
    while Instant::now() < until {
        if matches!(child.try_wait(), Ok(Some(_))) {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// The uid and gid to run PostgreSQL as: ours, or `postgres`'s when we are root.
#[allow(unsafe_code)] // geteuid, which has no preconditions.
fn postgres_identity() -> Result<Option<(u32, u32)>> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Ok(None);
    }
    let passwd = fs::read_to_string("/etc/passwd")?;
    for line in passwd.lines() {
        let f: Vec<&str> = line.split(':').collect();
        if f.len() > 3 && f[0] == "postgres" {
            let uid = f[2].parse().map_err(|_| Error::Missing("bad /etc/passwd entry for postgres".into()))?;
            let gid = f[3].parse().map_err(|_| Error::Missing("bad /etc/passwd entry for postgres".into()))?;
            return Ok(Some((uid, gid)));
        }
    }
    Err(Error::Missing(
        "running as root, and PostgreSQL refuses to run as root: create a `postgres` user \
         (apt-get install -y postgresql does) or run as another user"
            .into(),
    ))
}

/// The directory holding initdb and postgres: `COMPOSER_PG_BIN`, else the
/// newest /usr/lib/postgresql/*/bin, else `pg_config --bindir`.
pub fn postgres_bin_dir() -> Result<PathBuf> {
    if let Some(dir) = std::env::var_os("COMPOSER_PG_BIN").filter(|d| !d.is_empty()) {
        return Ok(PathBuf::from(dir));
    }
    let mut versions: Vec<(u32, PathBuf)> = fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let v = e.file_name().to_str()?.parse::<u32>().ok()?;
            let bin = e.path().join("bin");
            bin.join("postgres").exists().then_some((v, bin))
        })
        .collect();
    versions.sort();
    if let Some((_, bin)) = versions.pop() {
        return Ok(bin);
    }
    if let Ok(out) = Command::new("pg_config").arg("--bindir").output() {
        let dir = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        if dir.join("postgres").exists() {
            return Ok(dir);
        }
    }
    Err(Error::Missing(
        "PostgreSQL binaries not found (install them with `apt-get install -y postgresql`, \
         set COMPOSER_PG_BIN, or set COMPOSER_DATABASE_URL to use a running server)"
            .into(),
    ))
}

/// Options for [`LocalPostgres::start`].
#[derive(Debug, Clone)]
pub struct PgOptions {
    pub data_dir: PathBuf,
    pub port: Option<u16>,
    /// Off for throwaway test servers (fast); on for `composer dev`.
    pub fsync: bool,
    pub max_connections: u32,
}

/// A PostgreSQL server we started.
pub struct LocalPostgres {
    child: Option<Child>,
    opts: PgOptions,
    port: u16,
    bin: PathBuf,
    identity: Option<(u32, u32)>,
    /// The data directory we made elsewhere for a throwaway one (asked for
    /// under a [`temp_dir`]): removed when the server is dropped.
    throwaway: Option<PathBuf>,
}

/// The first directory on the way to `path` (not `path` itself) that
/// `uid`/`gid` may not enter. Supplementary groups are not counted, so a
/// directory entered only through one is taken as closed.
fn closed_on_the_way(path: &Path, uid: u32, gid: u32) -> Option<PathBuf> {
    use std::os::unix::fs::MetadataExt;
    path.ancestors().skip(1).find_map(|dir| {
        let meta = fs::metadata(dir).ok()?;
        let bit = if meta.uid() == uid {
            0o100
        } else if meta.gid() == gid {
            0o010
        } else {
            0o001
        };
        (meta.mode() & bit == 0).then(|| dir.to_path_buf())
    })
}

/// A short name for a path that stays the same from one start to the next
/// (FNV-1a: std's hasher may change between Rust releases).
fn path_key(path: &Path) -> String {
    let hash = path
        .as_os_str()
        .as_encoded_bytes()
        .iter()
        .fold(0xcbf2_9ce4_8422_2325_u64, |h, b| (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3));
    format!("{hash:016x}")
}

/// Where PostgreSQL, running as `uid`/`gid`, keeps the data asked for in
/// `wanted` (absolute, created): `wanted` when it can reach it, else a
/// directory of its own under `/var/tmp` (or `/tmp` for a throwaway one,
/// asked for under a [`temp_dir`]), with `wanted` made a link to it so the
/// next start finds the same data. The second value says whether it is
/// throwaway.
fn reachable_data_dir(wanted: &Path, uid: u32, gid: u32) -> Result<(PathBuf, bool)> {
    let real = fs::canonicalize(wanted)?;
    let Some(closed) = closed_on_the_way(&real, uid, gid) else { return Ok((real, false)) };
    let how = format!(
        "PostgreSQL runs as the postgres user (uid {uid}), which may not enter {}: give COMPOSER_DATA_DIR \
         a directory it can reach (such as /var/tmp/composer), or let it through with `chmod o+x {}`",
        closed.display(),
        closed.display()
    );
    if fs::read_dir(&real)?.next().is_some() {
        return Err(Error::Missing(format!("{how} ({} is not empty, so it is not moved)", wanted.display())));
    }
    let throwaway = is_throwaway(&real);
    let base = Path::new(if throwaway { "/tmp" } else { "/var/tmp" });
    let moved = base.join(format!("composer-pg-{}", path_key(&real)));
    if let Some(still) = closed_on_the_way(&moved, uid, gid) {
        return Err(Error::Missing(format!("{how} ({} is closed to it too)", still.display())));
    }
    fs::create_dir_all(&moved)?;
    fs::remove_dir(&real)?;
    std::os::unix::fs::symlink(&moved, &real)?;
    Ok((moved, throwaway))
}

impl LocalPostgres {
    /// Initializes `data_dir` if it is empty, starts the server and waits
    /// until it accepts connections. As root, when the `postgres` user
    /// cannot reach an empty `data_dir`, the data goes to a directory of
    /// its own that it can (see [`LocalPostgres::data_dir`]) and `data_dir`
    /// becomes a link to it; a `data_dir` that already holds something is an
    /// error saying what to do.
    pub fn start(mut opts: PgOptions) -> Result<LocalPostgres> {
        let bin = postgres_bin_dir()?;
        let identity = postgres_identity()?;
        fs::create_dir_all(&opts.data_dir)?;
        let mut throwaway = None;
        if let Some((uid, gid)) = identity {
            let (dir, is_throwaway) = reachable_data_dir(&opts.data_dir, uid, gid)?;
            if is_throwaway {
                throwaway = Some(dir.clone());
            }
            opts.data_dir = dir;
            chown(&opts.data_dir, uid, gid)?;
        }
        if !opts.data_dir.join("PG_VERSION").exists() {
            let mut initdb = Command::new(bin.join("initdb"));
            initdb
                .arg("-D")
                .arg(&opts.data_dir)
                .args(["-U", "postgres", "--auth=trust", "-E", "UTF8", "--locale=C", "--no-sync"])
                .stdin(Stdio::null());
            as_identity(&mut initdb, identity);
            let out = initdb.output()?;
            if !out.status.success() {
                return Err(Error::Failed {
                    what: format!("initdb in {}", opts.data_dir.display()),
                    detail: String::from_utf8_lossy(&out.stderr).trim().to_string(),
                });
            }
        }
        let port = match opts.port {
            Some(p) => p,
            None => free_port()?,
        };
        let mut pg = LocalPostgres { child: None, opts, port, bin, identity, throwaway };
        pg.spawn()?;
        Ok(pg)
    }

    /// Where the data is: the directory asked for, or the one
    /// [`LocalPostgres::start`] chose because PostgreSQL could not reach it.
    pub fn data_dir(&self) -> &Path {
        &self.opts.data_dir
    }

    fn spawn(&mut self) -> Result<()> {
        let log_path = self.opts.data_dir.join("postgres.log");
        let log = fs::OpenOptions::new().create(true).append(true).open(&log_path)?;
        if let Some((uid, gid)) = self.identity {
            chown(&log_path, uid, gid)?;
        }
        let mut cmd = Command::new(self.bin.join("postgres"));
        cmd.arg("-D")
            .arg(&self.opts.data_dir)
            .arg("-p")
            .arg(self.port.to_string())
            .args(["-c", "listen_addresses=127.0.0.1"])
            .arg("-c")
            .arg(format!("unix_socket_directories={}", self.opts.data_dir.display()))
            .arg("-c")
            .arg(format!("max_connections={}", self.opts.max_connections))
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        if !self.opts.fsync {
            cmd.args(["-c", "fsync=off", "-c", "full_page_writes=off", "-c", "synchronous_commit=off"]);
        }
        as_identity(&mut cmd, self.identity);
        // SIGQUIT: immediate shutdown, right for a parent that died.
        self.child = Some(spawn_bound(cmd, libc::SIGQUIT)?);
        self.wait_ready(Duration::from_secs(30))
    }

    fn wait_ready(&mut self, timeout: Duration) -> Result<()> {
        let until = Instant::now() + timeout;
        loop {
            if let Some(child) = self.child.as_mut() {
                if let Ok(Some(status)) = child.try_wait() {
                    return Err(Error::Failed {
                        what: "postgres".into(),
                        detail: format!(
                            "exited with {status}; see {}",
                            self.opts.data_dir.join("postgres.log").display()
                        ),
                    });
                }
            }
            let ok = Command::new(self.bin.join("pg_isready"))
                .args(["-q", "-h", "127.0.0.1", "-p", &self.port.to_string(), "-U", "postgres"])
                .status()
                .is_ok_and(|s| s.success());
            if ok {
                return Ok(());
            }
            if Instant::now() > until {
                return Err(Error::Failed { what: "postgres".into(), detail: "not ready after 30 s".into() });
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// A URL for database `db` as the superuser `postgres`.
    pub fn url(&self, db: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{db}", self.port)
    }

    /// Fast shutdown: running transactions are rolled back.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            stop_child(&mut child, libc::SIGINT, Duration::from_secs(10));
        }
    }

    /// Stops and starts again on the same port and data.
    pub fn restart(&mut self) -> Result<()> {
        self.stop();
        self.spawn()
    }
}

impl Drop for LocalPostgres {
    fn drop(&mut self) {
        self.stop();
        if let Some(dir) = self.throwaway.take() {
            let _ = fs::remove_dir_all(dir);
        }
    }
}

fn as_identity(cmd: &mut Command, identity: Option<(u32, u32)>) {
    if let Some((uid, gid)) = identity {
        cmd.uid(uid).gid(gid).env("HOME", "/tmp").env_remove("PGDATA");
    }
}

fn chown(path: &Path, uid: u32, gid: u32) -> Result<()> {
    std::os::unix::fs::chown(path, Some(uid), Some(gid))?;
    Ok(())
}

/// A redis-server we started; it keeps nothing on disk.
pub struct LocalRedis {
    child: Option<Child>,
    dir: PathBuf,
    port: u16,
    /// Extra arguments (a cluster node's).
    extra: Vec<String>,
}

impl LocalRedis {
    pub fn start(dir: &Path, port: Option<u16>) -> Result<LocalRedis> {
        fs::create_dir_all(dir)?;
        let port = match port {
            Some(p) => p,
            None => free_port()?,
        };
        let mut r = LocalRedis { child: None, dir: dir.to_path_buf(), port, extra: Vec::new() };
        r.spawn()?;
        Ok(r)
    }

    fn spawn(&mut self) -> Result<()> {
        let bin = std::env::var_os("COMPOSER_REDIS_SERVER").map(PathBuf::from).unwrap_or_else(|| "redis-server".into());
        let mut cmd = Command::new(&bin);
        cmd.args(["--bind", "127.0.0.1", "--port", &self.port.to_string()])
            .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
            .arg("--dir")
            .arg(&self.dir)
            .arg("--logfile")
            .arg(self.dir.join("redis.log"))
            .args(&self.extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let child = spawn_bound(cmd, libc::SIGTERM).map_err(|e| {
            Error::Missing(format!(
                "cannot run {} ({e}): install it with `apt-get install -y redis-server`, \
                 or set COMPOSER_REDIS_URL to use a running server",
                bin.display()
            ))
        })?;
        self.child = Some(child);
        let until = Instant::now() + Duration::from_secs(10);
        while Instant::now() < until {
            if ping(self.port) {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Err(Error::Failed { what: "redis-server".into(), detail: "not answering PING after 10 s".into() })
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            stop_child(&mut child, libc::SIGTERM, Duration::from_secs(5));
        }
    }

    /// Stops and starts again on the same port, empty: what a restart
    /// without persistence looks like.
    pub fn restart(&mut self) -> Result<()> {
        self.stop();
        self.spawn()
    }
}

impl Drop for LocalRedis {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A free port whose cluster bus port (itself + 10000) is free too.
fn free_cluster_port() -> Result<u16> {
    loop {
        let port = free_port()?;
        if port <= 55_535 && std::net::TcpListener::bind(("127.0.0.1", port + 10_000)).is_ok() {
            return Ok(port);
        }
    }
}

/// A Redis Cluster of redis-servers we started: `masters` primaries (at
/// least three), each with `replicas` replicas, joined by
/// `redis-cli --cluster create`. Nodes fail over after one second.
pub struct LocalRedisCluster {
    nodes: Vec<LocalRedis>,
}

impl LocalRedisCluster {
    pub fn start(dir: &Path, masters: usize, replicas: usize) -> Result<LocalRedisCluster> {
        let mut nodes = Vec::new();
        for i in 0..masters * (1 + replicas) {
            let node_dir = dir.join(format!("node{i}"));
            fs::create_dir_all(&node_dir)?;
            let mut r = LocalRedis { child: None, dir: node_dir, port: free_cluster_port()?, extra: Vec::new() };
            // A replica may take over however long ago it last heard from
            // its primary (an idle primary is heard from every 10 s).
            r.extra = [
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                "nodes.conf",
                "--cluster-node-timeout",
                "1000",
                "--cluster-replica-validity-factor",
                "0",
            ]
            .map(String::from)
            .to_vec();
            r.spawn()?;
            nodes.push(r);
        }
        let cli = std::env::var_os("COMPOSER_REDIS_CLI").map(PathBuf::from).unwrap_or_else(|| "redis-cli".into());
        let out = Command::new(&cli)
            .arg("--cluster")
            .arg("create")
            .args(nodes.iter().map(|n| format!("127.0.0.1:{}", n.port)))
            .args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"])
            .stdin(Stdio::null())
            .output()
            .map_err(|e| Error::Missing(format!("cannot run {} ({e}): install redis-tools", cli.display())))?;
        if !out.status.success() {
            let detail = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
            return Err(Error::Failed { what: "redis-cli --cluster create".into(), detail });
        }
        let cluster = LocalRedisCluster { nodes };
        cluster.wait_until_ok(Duration::from_secs(30))?;
        Ok(cluster)
    }

    /// `redis+cluster://` with every node, the form Composer takes.
    pub fn url(&self) -> String {
        let nodes: Vec<String> = self.nodes.iter().map(|n| format!("127.0.0.1:{}", n.port)).collect();
        format!("redis+cluster://{}", nodes.join(","))
    }

    fn cli(&self, port: u16, args: &[&str]) -> Option<String> {
        let cli = std::env::var_os("COMPOSER_REDIS_CLI").map(PathBuf::from).unwrap_or_else(|| "redis-cli".into());
        let out = Command::new(cli).args(["-p", &port.to_string()]).args(args).stdin(Stdio::null()).output().ok()?;
        out.status.success().then(|| String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Waits until every running node says the cluster is ok.
    pub fn wait_until_ok(&self, timeout: Duration) -> Result<()> {
        let until = Instant::now() + timeout;
        while Instant::now() < until {
            let ok = self
                .nodes
                .iter()
                .filter(|n| n.child.is_some())
                .all(|n| self.cli(n.port, &["cluster", "info"]).is_some_and(|i| i.contains("cluster_state:ok")));
            if ok {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Err(Error::Failed { what: "redis cluster".into(), detail: "cluster_state is not ok".into() })
    }

    /// Waits until the node on `port` is marked failed and its slots are
    /// served again (a replica took over).
    pub fn wait_for_failover(&self, port: u16, timeout: Duration) -> Result<()> {
        let until = Instant::now() + timeout;
        let live = self.nodes.iter().find(|n| n.child.is_some()).map(|n| n.port).unwrap_or(port);
        while Instant::now() < until {
            let failed = self.cli(live, &["cluster", "nodes"]).is_some_and(|nodes| {
                nodes.lines().any(|l| l.contains(&format!(":{port}@")) && l.contains("fail") && !l.contains("fail?"))
            });
            if failed && self.cli(live, &["cluster", "info"]).is_some_and(|i| i.contains("cluster_state:ok")) {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Err(Error::Failed { what: "redis cluster".into(), detail: format!("no failover of :{port}") })
    }

    /// Kills (SIGKILL) one primary that has a replica; returns its port.
    pub fn kill_a_master(&mut self) -> Result<u16> {
        let port = self
            .nodes
            .iter()
            .filter(|n| n.child.is_some())
            .map(|n| n.port)
            .find(|&p| self.cli(p, &["role"]).is_some_and(|r| r.starts_with("master")))
            .ok_or_else(|| Error::Failed { what: "redis cluster".into(), detail: "no master".into() })?;
        let node = self.nodes.iter_mut().find(|n| n.port == port).expect("the node was found above");
        if let Some(mut child) = node.child.take() {
            stop_child(&mut child, libc::SIGKILL, Duration::from_secs(5));
        }
        Ok(port)
    }
}

fn ping(port: u16) -> bool {
    let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_millis(500)));
    if s.write_all(b"PING\r\n").is_err() {
        return false;
    }
    let mut buf = [0u8; 7];
    s.read_exact(&mut buf).is_ok() && &buf == b"+PONG\r\n"
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    /// `nobody` is neither the owner nor in the group of what root makes.
    const NOBODY: u32 = 65534;

    #[test]
    fn the_first_directory_closed_to_a_user_on_the_way_is_found() {
        let dir = fs::canonicalize(temp_dir("closed").unwrap()).unwrap();
        let data = dir.join("a").join("b").join("pg");
        fs::create_dir_all(&data).unwrap();
        for d in [&dir, &dir.join("a"), &dir.join("a").join("b")] {
            fs::set_permissions(d, fs::Permissions::from_mode(0o755)).unwrap();
        }
        let closed = |d: &Path| closed_on_the_way(d, NOBODY, NOBODY).filter(|c| c.starts_with(&dir));
        assert_eq!(closed(&data), None);
        fs::set_permissions(dir.join("a"), fs::Permissions::from_mode(0o700)).unwrap();
        assert_eq!(closed(&data), Some(dir.join("a")));
        fs::set_permissions(dir.join("a"), fs::Permissions::from_mode(0o711)).unwrap();
        assert_eq!(closed(&data), None, "entering is enough; listing is not needed");
        fs::remove_dir_all(dir).unwrap();
    }

    /// FNV-1a of the path, as any FNV-1a computes it: no Rust release can move the data.
    #[test]
    fn a_data_dir_s_key_is_the_same_at_every_start() {
        assert_eq!(path_key(Path::new("/root/project/.composer/postgres")), "46a2ed9ce2b7bf3b");
    }
}
