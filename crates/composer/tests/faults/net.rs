//! Hosts on one machine: each process of a scenario runs in a network
//! namespace of its own, joined to this one by a veth pair (this side
//! `10.77.N.1`, the namespace's side `10.77.N.2`), with this machine
//! forwarding between them. PostgreSQL, Redis and the HTTP target listen
//! here, on every address, and are reached at the gateway of a first
//! namespace that no process runs in (the hub): any of this machine's
//! addresses is reached from any namespace through its default route.
//!
//! Faults are nftables rules inside a namespace: a cut drops every packet to
//! and from one port (a silent partition: connections hang, nothing is
//! refused), a lossy link drops a share of all packets at random. A slow
//! link is a token bucket (`tc tbf`) on the namespace's side. This kernel
//! has no `netem` (no delay or reordering qdisc), so delay comes from loss:
//! a dropped segment waits for TCP's retransmission, and segments arrive
//! out of order behind it.

use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

static NEXT: AtomicU32 = AtomicU32::new(0);

/// Runs `ip`/`nft`/`tc`/`sysctl`; panics with what it printed when it fails.
pub fn sh(program: &str, args: &[&str]) {
    let out = Command::new(program).args(args).output().unwrap_or_else(|e| panic!("running {program}: {e}"));
    assert!(out.status.success(), "{program} {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim());
}

/// The machine's forwarding switch, turned on for the scenario and set back after.
pub struct Forwarding(String);

impl Forwarding {
    pub fn on() -> Forwarding {
        let was = std::fs::read_to_string("/proc/sys/net/ipv4/ip_forward").unwrap_or_else(|_| "0".into());
        sh("sysctl", &["-q", "-w", "net.ipv4.ip_forward=1"]);
        Forwarding(was.trim().to_string())
    }
}

impl Drop for Forwarding {
    fn drop(&mut self) {
        let _ = Command::new("sysctl").args(["-q", "-w", &format!("net.ipv4.ip_forward={}", self.0)]).status();
    }
}

/// One namespace: a host of its own.
pub struct Host {
    pub name: String,
    /// This namespace's address, where the others reach a process in it.
    pub ip: String,
    /// This machine's address on the link to it.
    pub gateway: String,
    outside: String,
    inside: String,
}

impl Host {
    /// A new namespace with its link up and its default route to this machine.
    pub fn new() -> Host {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        assert!(n < 250, "too many namespaces in one test process");
        // The whole id (a link's name is at most 15 bytes: `cf` + 7
        // digits + `x` + 3), so that a sweep can tell whether it is alive.
        let pid = std::process::id();
        let name = format!("cfault-{pid}-{n}");
        let (outside, inside) = (format!("cf{pid}x{n}"), format!("cf{pid}y{n}"));
        let (gw, ip) = (format!("10.77.{n}.1"), format!("10.77.{n}.2"));
        sh("ip", &["netns", "add", &name]);
        let host = Host { name, ip, gateway: gw.clone(), outside, inside };
        sh("ip", &["link", "add", &host.outside, "type", "veth", "peer", "name", &host.inside]);
        sh("ip", &["link", "set", &host.inside, "netns", &host.name]);
        sh("ip", &["addr", "add", &format!("{gw}/30"), "dev", &host.outside]);
        sh("ip", &["link", "set", &host.outside, "up"]);
        host.exec("ip", &["addr", "add", &format!("{}/30", host.ip), "dev", &host.inside]);
        host.exec("ip", &["link", "set", &host.inside, "up"]);
        host.exec("ip", &["link", "set", "lo", "up"]);
        host.exec("ip", &["route", "add", "default", "via", &gw]);
        host.exec("nft", &["add", "table", "inet", "fault"]);
        for (chain, hook) in [("in", "input"), ("out", "output")] {
            let spec = format!("{{ type filter hook {hook} priority 0; }}");
            host.exec("nft", &["add", "chain", "inet", "fault", chain, &spec]);
        }
        host
    }

    /// Runs a command inside the namespace.
    pub fn exec(&self, program: &str, args: &[&str]) {
        let mut all = vec!["netns", "exec", &self.name, program];
        all.extend_from_slice(args);
        sh("ip", &all);
    }

    /// The command prefix that runs a program inside the namespace.
    pub fn command(&self, program: &str) -> Command {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &self.name, program]);
        cmd
    }

    /// Drops every packet to and from `port` of any host: this namespace
    /// and the service on `port` can no longer talk, and neither side is told.
    pub fn cut(&self, port: u16) {
        let p = port.to_string();
        self.exec("nft", &["add", "rule", "inet", "fault", "out", "tcp", "dport", &p, "drop"]);
        self.exec("nft", &["add", "rule", "inet", "fault", "in", "tcp", "sport", &p, "drop"]);
    }

    /// Drops every packet to and from `ip:port`.
    pub fn cut_from(&self, ip: &str, port: u16) {
        let p = port.to_string();
        self.exec("nft", &["add", "rule", "inet", "fault", "out", "ip", "daddr", ip, "tcp", "dport", &p, "drop"]);
        self.exec("nft", &["add", "rule", "inet", "fault", "in", "ip", "saddr", ip, "tcp", "sport", &p, "drop"]);
    }

    /// Drops `percent` of every packet in and out, at random.
    pub fn lossy(&self, percent: u8) {
        let p = percent.to_string();
        for chain in ["in", "out"] {
            self.exec(
                "nft",
                &["add", "rule", "inet", "fault", chain, "numgen", "random", "mod", "100", "<", &p, "drop"],
            );
        }
    }

    /// Caps what leaves the namespace at `rate` (tc's units: `2mbit`).
    pub fn slow(&self, rate: &str) {
        self.exec(
            "tc",
            &["qdisc", "add", "dev", &self.inside, "root", "tbf", "rate", rate, "burst", "16kbit", "latency", "200ms"],
        );
    }

    /// Takes every fault away.
    pub fn heal(&self) {
        for chain in ["in", "out"] {
            self.exec("nft", &["flush", "chain", "inet", "fault", chain]);
        }
        let _ = self.command("tc").args(["qdisc", "del", "dev", &self.inside, "root"]).output();
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        // Deleting the namespace deletes the pair; the link is deleted in
        // case it was never moved there.
        let _ = Command::new("ip").args(["netns", "del", &self.name]).output();
        let _ = Command::new("ip").args(["link", "del", &self.outside]).output();
    }
}

/// Deletes the namespaces (and their links) of test processes that are
/// gone: one killed before its `Drop` ran leaves its `10.77.N.1` addresses
/// on this machine, and a later run's links to the same addresses would
/// lose their packets to them.
fn sweep_dead_hosts() {
    let Ok(out) = Command::new("ip").args(["netns", "list"]).output() else { return };
    let listed = String::from_utf8_lossy(&out.stdout);
    for name in listed.lines().filter_map(|l| l.split_whitespace().next()) {
        let Some((pid, n)) = name.strip_prefix("cfault-").and_then(|rest| rest.split_once('-')) else { continue };
        let (Ok(pid), Ok(n)) = (pid.parse::<u32>(), n.parse::<u32>()) else { continue };
        if pid == std::process::id() || std::path::Path::new(&format!("/proc/{pid}")).exists() {
            continue;
        }
        let _ = Command::new("ip").args(["netns", "del", name]).output();
        let _ = Command::new("ip").args(["link", "del", &format!("cf{pid}x{n}")]).output();
    }
}

/// Whether this machine can make namespaces (root, iproute2, nftables);
/// first, sweeps away those of test processes that are gone.
pub fn can_make_hosts() -> Result<(), String> {
    sweep_dead_hosts();
    let probe = format!("cfault-probe-{}", std::process::id());
    let made = Command::new("ip").args(["netns", "add", &probe]).output().map_err(|e| format!("ip: {e}"))?;
    if !made.status.success() {
        return Err(format!("ip netns add: {}", String::from_utf8_lossy(&made.stderr).trim()));
    }
    let nft = Command::new("ip").args(["netns", "exec", &probe, "nft", "list", "tables"]).output();
    let _ = Command::new("ip").args(["netns", "del", &probe]).status();
    match nft {
        Ok(o) if o.status.success() => Ok(()),
        Ok(o) => Err(format!("nft: {}", String::from_utf8_lossy(&o.stderr).trim())),
        Err(e) => Err(format!("nft: {e} (apt-get install -y nftables)")),
    }
}
