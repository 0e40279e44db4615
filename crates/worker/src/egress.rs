//! Where the HTTP node may connect: a deny list (and, optionally, an allow
//! list) of address ranges, checked on the address every connection is
//! actually made to — after DNS, and again on every redirect — so neither a
//! hostname that resolves to the cloud metadata service nor a redirect to
//! it gets through.

use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::str::FromStr;
use std::sync::Arc;

/// Link-local ranges (which hold the cloud metadata services of AWS, GCP and
/// Azure at 169.254.169.254) and the other metadata addresses in use: AWS's
/// IPv6 one and Alibaba Cloud's.
pub const DEFAULT_DENY: &str = "169.254.0.0/16,fe80::/10,fd00:ec2::254/128,100.100.100.200/32";

/// An address range, `10.0.0.0/8` or `fe80::/10` (a bare address is a /32
/// or /128).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr {
    net: IpAddr,
    prefix: u8,
}

impl FromStr for Cidr {
    type Err = String;

    fn from_str(s: &str) -> Result<Cidr, String> {
        let s = s.trim();
        let (addr, prefix) = match s.split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (s, None),
        };
        let net: IpAddr = addr.parse().map_err(|_| format!("{s:?} is not an address range (e.g. 10.0.0.0/8)"))?;
        let max = if net.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            Some(p) => p.parse::<u8>().ok().filter(|p| *p <= max).ok_or_else(|| format!("{s:?}: bad prefix length"))?,
            None => max,
        };
        Ok(Cidr { net, prefix })
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.net, self.prefix)
    }
}

impl Cidr {
    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self.net, ip.to_canonical()) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => {
                let mask = u32::MAX.checked_shl(32 - u32::from(self.prefix)).unwrap_or(0);
                u32::from(net) & mask == u32::from(ip) & mask
            }
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                let mask = u128::MAX.checked_shl(128 - u32::from(self.prefix)).unwrap_or(0);
                u128::from(net) & mask == u128::from(ip) & mask
            }
            _ => false,
        }
    }
}

/// Parses a comma-separated list of ranges.
pub fn parse_list(list: &[String]) -> Result<Vec<Cidr>, String> {
    list.iter().map(|s| s.trim()).filter(|s| !s.is_empty()).map(Cidr::from_str).collect()
}

/// The deny and allow lists.
#[derive(Debug, Clone, Default)]
pub struct Policy {
    pub deny: Vec<Cidr>,
    /// When not empty, only these ranges may be reached.
    pub allow: Vec<Cidr>,
}

/// A connection the policy refuses; found in a request's error chain to
/// fail the node at once, for good.
#[derive(Debug)]
pub struct Denied(pub String);

impl fmt::Display for Denied {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Denied {}

impl Policy {
    pub fn check(&self, host: &str, ip: IpAddr) -> Result<(), Denied> {
        if let Some(range) = self.deny.iter().find(|c| c.contains(ip)) {
            return Err(Denied(format!("{host} ({ip}) is in {range}, which COMPOSER_HTTP_DENY refuses")));
        }
        if !self.allow.is_empty() && !self.allow.iter().any(|c| c.contains(ip)) {
            return Err(Denied(format!("{host} ({ip}) is not in COMPOSER_HTTP_ALLOW")));
        }
        Ok(())
    }

    /// Checks a URL whose host is an address (no DNS is asked for those).
    pub fn check_url(&self, url: &reqwest::Url) -> Result<(), Denied> {
        let host = url.host_str().unwrap_or_default();
        match host.trim_start_matches('[').trim_end_matches(']').parse::<IpAddr>() {
            Ok(ip) => self.check(host, ip),
            Err(_) => Ok(()),
        }
    }
}

/// DNS that hands the HTTP client only addresses the policy allows.
pub struct Resolver(pub Arc<Policy>);

impl reqwest::dns::Resolve for Resolver {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let policy = self.0.clone();
        Box::pin(async move {
            let host = name.as_str().to_string();
            let found: Vec<SocketAddr> = tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
            let mut refused = None;
            let allowed: Vec<SocketAddr> = found
                .into_iter()
                .filter(|a| match policy.check(&host, a.ip()) {
                    Ok(()) => true,
                    Err(d) => {
                        refused.get_or_insert(d);
                        false
                    }
                })
                .collect();
            match (allowed.is_empty(), refused) {
                (true, Some(denied)) => Err(Box::new(denied) as Box<dyn std::error::Error + Send + Sync>),
                _ => Ok(Box::new(allowed.into_iter()) as reqwest::dns::Addrs),
            }
        })
    }
}

/// The policy's refusal anywhere in an error's chain.
pub fn denied_in<'a>(e: &'a (dyn std::error::Error + 'static)) -> Option<&'a Denied> {
    let mut cur: Option<&'a (dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = cur {
        if let Some(d) = err.downcast_ref::<Denied>() {
            return Some(d);
        }
        cur = err.source();
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(deny: &str, allow: &str) -> Policy {
        let list = |s: &str| parse_list(&s.split(',').map(String::from).collect::<Vec<_>>()).unwrap();
        Policy { deny: list(deny), allow: list(allow) }
    }

    #[test]
    fn ranges_contain_what_they_should() {
        let p = policy(DEFAULT_DENY, "");
        for ip in
            ["169.254.169.254", "169.254.0.1", "fe80::1", "fd00:ec2::254", "100.100.100.200", "::ffff:169.254.169.254"]
        {
            assert!(p.check("h", ip.parse().unwrap()).is_err(), "{ip} is denied");
        }
        for ip in ["127.0.0.1", "10.1.2.3", "8.8.8.8", "::1", "169.255.0.1"] {
            assert!(p.check("h", ip.parse().unwrap()).is_ok(), "{ip} is allowed");
        }
        let only = policy("", "10.0.0.0/8");
        assert!(only.check("h", "10.9.9.9".parse().unwrap()).is_ok());
        assert!(only.check("h", "11.0.0.1".parse().unwrap()).is_err());
        assert!("10.0.0.0/33".parse::<Cidr>().is_err());
        assert!("nope".parse::<Cidr>().is_err());
        assert!("0.0.0.0/0".parse::<Cidr>().unwrap().contains("1.2.3.4".parse().unwrap()));
    }
}
