//! The processes of a scenario: PostgreSQL (a primary and, for a failover, a
//! streaming replica), a redis-server, and `composer` coordinators and
//! workers, each in a namespace of its own and, for a clock scenario, under
//! libfaketime. Each is killed when dropped.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::net::{sh, Host};

pub const BIN: &str = env!("CARGO_BIN_EXE_composer");

/// libfaketime, which `faketime` preloads (Debian's package `faketime`).
const LIBFAKETIME: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1";

fn postgres_ids() -> (u32, u32) {
    let passwd = std::fs::read_to_string("/etc/passwd").expect("/etc/passwd");
    let f: Vec<&str> = passwd
        .lines()
        .map(|l| l.split(':').collect::<Vec<_>>())
        .find(|f| f[0] == "postgres")
        .expect("a postgres user (apt-get install -y postgresql)");
    (f[2].parse().expect("uid"), f[3].parse().expect("gid"))
}

fn pg_bin(name: &str) -> PathBuf {
    composer_embedded::postgres_bin_dir().expect("PostgreSQL binaries").join(name)
}

/// How a primary ships its WAL to the replica.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Replication {
    /// A commit is acknowledged once it is on the primary's disk.
    Asynchronous,
    /// A commit is acknowledged once the replica has it too.
    Synchronous,
}

/// A PostgreSQL server listening on every address of this machine.
pub struct Postgres {
    pub port: u16,
    dir: PathBuf,
    clock: Clock,
    child: Option<Child>,
}

impl Postgres {
    /// A primary in `dir`, ready for a replica when `replication` is given.
    /// Its WAL in `waldir` when given (a disk of its own).
    pub fn primary(dir: &Path, replication: Option<Replication>, clock: Clock, waldir: Option<&Path>) -> Postgres {
        let (uid, gid) = postgres_ids();
        std::fs::create_dir_all(dir).expect("data dir");
        std::fs::set_permissions(dir, std::os::unix::fs::PermissionsExt::from_mode(0o700)).expect("chmod data dir");
        std::os::unix::fs::chown(dir, Some(uid), Some(gid)).expect("chown data dir");
        let mut initdb = Command::new(pg_bin("initdb"));
        if let Some(wal) = waldir {
            initdb.arg(format!("--waldir={}", wal.display()));
        }
        let init = initdb
            .arg("-D")
            .arg(dir)
            .args(["-U", "postgres", "--auth=trust", "-E", "UTF8", "--locale=C", "--no-sync"])
            .uid(uid)
            .gid(gid)
            .env("HOME", "/tmp")
            .output()
            .expect("initdb");
        assert!(init.status.success(), "initdb: {}", String::from_utf8_lossy(&init.stderr));
        let standby = match replication {
            Some(Replication::Synchronous) => "'*'",
            _ => "''",
        };
        let conf = format!(
            "listen_addresses = '*'\nmax_connections = 200\nwal_level = replica\nmax_wal_senders = 4\n\
             synchronous_standby_names = {standby}\nsynchronous_commit = on\nfsync = on\n\
             unix_socket_directories = ''\n"
        );
        append(&dir.join("postgresql.conf"), &conf);
        append(&dir.join("pg_hba.conf"), "host all all 0.0.0.0/0 trust\nhost replication all 0.0.0.0/0 trust\n");
        let mut pg = Postgres {
            port: composer_embedded::free_port().expect("port"),
            dir: dir.to_path_buf(),
            clock,
            child: None,
        };
        pg.start();
        pg
    }

    /// A streaming replica of `primary` in `dir`.
    pub fn replica(dir: &Path, primary: &Postgres) -> Postgres {
        let (uid, gid) = postgres_ids();
        std::fs::create_dir_all(dir).expect("data dir");
        std::fs::set_permissions(dir, std::os::unix::fs::PermissionsExt::from_mode(0o700)).expect("chmod data dir");
        std::os::unix::fs::chown(dir, Some(uid), Some(gid)).expect("chown data dir");
        let copy = Command::new(pg_bin("pg_basebackup"))
            .args(["-h", "127.0.0.1", "-p", &primary.port.to_string(), "-U", "postgres", "-R", "-X", "stream", "-D"])
            .arg(dir)
            .uid(uid)
            .gid(gid)
            .env("HOME", "/tmp")
            .output()
            .expect("pg_basebackup");
        assert!(copy.status.success(), "pg_basebackup: {}", String::from_utf8_lossy(&copy.stderr));
        // Once promoted, it has no replica to wait for.
        append(&dir.join("postgresql.auto.conf"), "synchronous_standby_names = ''\n");
        let mut pg = Postgres {
            port: composer_embedded::free_port().expect("port"),
            dir: dir.to_path_buf(),
            clock: Clock::True,
            child: None,
        };
        pg.start();
        pg
    }

    fn start(&mut self) {
        let (uid, gid) = postgres_ids();
        let log = std::fs::File::create(self.dir.join("../postgres-".to_string() + &self.port.to_string() + ".log"))
            .expect("log");
        let mut cmd = Command::new(pg_bin("postgres"));
        self.clock.apply(&mut cmd);
        let child = cmd
            .arg("-D")
            .arg(&self.dir)
            .args(["-p", &self.port.to_string()])
            .uid(uid)
            .gid(gid)
            .env("HOME", "/tmp")
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("postgres");
        self.child = Some(child);
        let until = Instant::now() + Duration::from_secs(60);
        loop {
            let ready = Command::new(pg_bin("pg_isready"))
                .args(["-q", "-h", "127.0.0.1", "-p", &self.port.to_string(), "-U", "postgres"])
                .status()
                .is_ok_and(|s| s.success());
            if ready {
                return;
            }
            assert!(Instant::now() < until, "postgres on {} not ready after 60 s", self.port);
            // Polling a process that is starting (or exiting): the pace of the checks.
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The host dies: every process of the server at once (SIGSTOP to
    /// the postmaster, SIGKILL to its children, then to it), nothing sent or
    /// flushed that was not.
    pub fn kill(&self) {
        let Some(c) = self.child.as_ref() else { return };
        let pid = c.id() as i32;
        let out = Command::new("pgrep").args(["-P", &pid.to_string()]).output().expect("pgrep");
        let children: Vec<i32> =
            String::from_utf8_lossy(&out.stdout).lines().filter_map(|l| l.trim().parse().ok()).collect();
        // SAFETY: signals to our own child and its children.
        #[allow(unsafe_code)]
        unsafe {
            libc::kill(pid, libc::SIGSTOP);
            for child in children {
                libc::kill(child, libc::SIGKILL);
            }
            libc::kill(pid, libc::SIGKILL);
        }
    }

    /// Stops this primary's WAL sender (SIGSTOP): from now on its replica
    /// receives nothing (what was sent before is in the replica's socket,
    /// and it gets that), as if the link between them stalled.
    pub fn freeze_sender(&self) {
        let parent = self.child.as_ref().expect("running").id().to_string();
        let out = Command::new("pgrep").args(["-P", &parent, "-f", "walsender"]).output().expect("pgrep");
        let pid: i32 = String::from_utf8_lossy(&out.stdout).trim().parse().expect("the primary's walsender");
        // SAFETY: a signal to a process of ours.
        #[allow(unsafe_code)]
        unsafe {
            libc::kill(pid, libc::SIGSTOP);
        }
    }

    /// `pg_ctl promote`: the replica becomes the primary.
    pub fn promote(&self) {
        let (uid, gid) = postgres_ids();
        let out = Command::new(pg_bin("pg_ctl"))
            .args(["promote", "-w", "-D"])
            .arg(&self.dir)
            .uid(uid)
            .gid(gid)
            .env("HOME", "/tmp")
            .output()
            .expect("pg_ctl promote");
        assert!(out.status.success(), "pg_ctl promote: {}", String::from_utf8_lossy(&out.stderr));
    }

    pub fn url(&self, host: &str, db: &str) -> String {
        format!("postgres://postgres@{host}:{}/{db}", self.port)
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        if let Some(c) = self.child.as_mut() {
            // SIGQUIT: an immediate shutdown, the backends with it.
            // SAFETY: a signal to our own child.
            #[allow(unsafe_code)]
            unsafe {
                libc::kill(c.id() as i32, libc::SIGQUIT);
            }
            let _ = c.wait();
        }
    }
}

fn append(path: &Path, text: &str) {
    use std::io::Write;
    let mut f = std::fs::OpenOptions::new().append(true).open(path).expect("config file");
    f.write_all(text.as_bytes()).expect("writing config");
}

/// A redis-server on every address.
pub struct Redis {
    pub port: u16,
    child: Child,
}

impl Redis {
    /// Keeping nothing on disk, or, when `persist`, every write in its
    /// append-only file in `dir`, fsynced every second (Redis's default:
    /// with `always`, a failed write makes Redis exit).
    pub fn start(dir: &Path, persist: bool, log: &Path) -> Redis {
        let port = composer_embedded::free_port().expect("port");
        let aof: &[&str] = match persist {
            true => &["--appendonly", "yes", "--appendfsync", "everysec"],
            false => &["--appendonly", "no"],
        };
        let child = Command::new("redis-server")
            .args(["--bind", "0.0.0.0", "--port", &port.to_string(), "--protected-mode", "no"])
            .args(["--save", ""])
            .args(aof)
            .arg("--dir")
            .arg(dir)
            .arg("--logfile")
            .arg(log)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server");
        let until = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < until, "redis-server not listening after 10 s");
            // Polling a process that is starting (or exiting): the pace of the checks.
            std::thread::sleep(Duration::from_millis(20));
        }
        Redis { port, child }
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// How a process sees the time.
#[derive(Debug, Clone)]
pub enum Clock {
    /// This machine's.
    True,
    /// Off by a fixed offset (libfaketime's `+30s`, `-3s`).
    Off(&'static str),
    /// Read from a file libfaketime rereads every second: writing another
    /// offset to it makes the clock jump.
    Jumping(PathBuf),
}

impl Clock {
    /// Runs `cmd` under this clock.
    fn apply(&self, cmd: &mut Command) {
        match self {
            Clock::True => return,
            Clock::Off(offset) => cmd.env("LD_PRELOAD", LIBFAKETIME).env("FAKETIME", offset),
            Clock::Jumping(file) => cmd
                .env("LD_PRELOAD", LIBFAKETIME)
                .env("FAKETIME_TIMESTAMP_FILE", file)
                .env("FAKETIME_CACHE_DURATION", "1"),
        };
        // Timers and timeouts run on the monotonic clock, which a real jump
        // of the wall clock does not move either.
        cmd.env("FAKETIME_DONT_FAKE_MONOTONIC", "1");
    }
}

/// A `composer` coordinator or worker in a namespace of its own.
pub struct Node {
    pub host: Host,
    pub role: &'static str,
    pub port: u16,
    env: Vec<(String, String)>,
    clock: Clock,
    log: PathBuf,
    child: Option<Child>,
}

impl Node {
    pub fn new(role: &'static str, env: Vec<(String, String)>, clock: Clock, log: PathBuf) -> Node {
        let port = composer_embedded::free_port().expect("port");
        Node { host: Host::new(), role, port, env, clock, log, child: None }
    }

    pub fn env(&self) -> &[(String, String)] {
        &self.env
    }

    pub fn push_env(&mut self, key: &str, value: String) {
        self.env.push((key.to_string(), value));
    }

    /// Where the API of a coordinator is, from any host.
    pub fn url(&self) -> String {
        format!("http://{}:{}", self.host.ip, self.port)
    }

    pub fn spawn(&mut self) {
        let mut cmd = self.host.command(BIN);
        cmd.arg(self.role);
        for (k, _) in std::env::vars() {
            if k.starts_with("COMPOSER_") || k.starts_with("FAKETIME") || k == "LD_PRELOAD" {
                cmd.env_remove(k);
            }
        }
        cmd.env("COMPOSER_LOG", "warn");
        for (k, v) in &self.env {
            cmd.env(k, v);
        }
        self.clock.apply(&mut cmd);
        let out = std::fs::OpenOptions::new().create(true).append(true).open(&self.log).expect("log");
        let err = out.try_clone().expect("log");
        self.child = Some(cmd.stdin(Stdio::null()).stdout(out).stderr(err).spawn().expect("spawning composer"));
    }

    /// Waits for the process to exit within `within`; its status if it did.
    pub fn exited(&mut self, within: Duration) -> Option<std::process::ExitStatus> {
        let until = Instant::now() + within;
        while Instant::now() < until {
            if let Some(status) = self.child.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
                return Some(status);
            }
            // Polling a process that is starting (or exiting): the pace of the checks.
            std::thread::sleep(Duration::from_millis(50));
        }
        None
    }

    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A tmpfs of `megabytes` at `dir`, for a disk that fills; unmounted when dropped.
pub struct SmallDisk {
    pub dir: PathBuf,
}

impl SmallDisk {
    pub fn mount(dir: &Path, megabytes: u32) -> SmallDisk {
        std::fs::create_dir_all(dir).expect("mount point");
        sh(
            "mount",
            &["-t", "tmpfs", "-o", &format!("size={megabytes}m,mode=0755"), "tmpfs", &dir.display().to_string()],
        );
        SmallDisk { dir: dir.to_path_buf() }
    }

    /// Fills what is left with a file; returns its path (remove it to free the disk).
    pub fn fill(&self) -> PathBuf {
        let filler = self.dir.join("filler");
        let _ = Command::new("dd")
            .args(["if=/dev/zero", &format!("of={}", filler.display()), "bs=1M", "status=none"])
            .stderr(Stdio::null())
            .status();
        filler
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.dir).status();
    }
}

/// A disk whose fsync stalls: a FUSE passthrough (`slow_fsync.py`) over a
/// directory, whose every fsync sleeps while [`SlowDisk::stall`] is on.
pub struct SlowDisk {
    pub dir: PathBuf,
    flag: PathBuf,
    child: Child,
}

impl SlowDisk {
    /// Mounts it at `dir` over `dir`.source; each stalled fsync takes `seconds`.
    pub fn mount(dir: &Path, seconds: f64) -> SlowDisk {
        let source = dir.with_extension("source");
        std::fs::create_dir_all(&source).expect("source dir");
        std::fs::create_dir_all(dir).expect("mount point");
        let flag = dir.with_extension("stall");
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/faults/slow_fsync.py");
        let child = Command::new("python3")
            .arg(script)
            .args([&source, dir, &flag])
            .arg(seconds.to_string())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.with_extension("log")).expect("log"))
            .spawn()
            .expect("python3");
        let until = Instant::now() + Duration::from_secs(20);
        let wanted = dir.display().to_string();
        while !std::fs::read_to_string("/proc/mounts")
            .unwrap_or_default()
            .lines()
            .any(|l| l.split(' ').nth(1) == Some(&wanted))
        {
            let log = std::fs::read_to_string(dir.with_extension("log")).unwrap_or_default();
            assert!(
                Instant::now() < until,
                "the slow-fsync disk is not mounted after 20 s (fusepy and libfuse2: scripts/deps): {log}"
            );
            // Polling a mount that is coming up.
            std::thread::sleep(Duration::from_millis(50));
        }
        SlowDisk { dir: dir.to_path_buf(), flag, child }
    }

    /// Makes every fsync stall (`true`) or not.
    pub fn stall(&self, on: bool) {
        match on {
            true => std::fs::write(&self.flag, b"").expect("stall flag"),
            false => std::fs::remove_file(&self.flag).expect("stall flag"),
        }
    }
}

impl Drop for SlowDisk {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.flag);
        let _ = Command::new("umount").arg("-l").arg(&self.dir).output();
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
