//! The SSRF guard: which URLs and addresses an outbound call may reach, and the DNS resolver
//! that hands reqwest only addresses it has checked (so the connection goes to the address
//! that was checked, with no second resolution).
//!
//! Literal IP hosts never reach a resolver: the URL parser (WHATWG, the `url` crate) has
//! already normalized decimal, octal, hex and short IPv4 forms (`2130706433`, `0177.0.0.1`,
//! `0x7f.1`, `127.1`) to a dotted quad, so checking the parsed host is enough.

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;

use url::{Host, Url};

/// The future a [`DnsResolver`] returns.
pub type Resolving = Pin<Box<dyn Future<Output = io::Result<Vec<IpAddr>>> + Send>>;

/// Resolves a host name to addresses. The client checks every address it returns before
/// connecting; tests inject a [`StaticResolver`] so names can "resolve" to refused addresses.
pub trait DnsResolver: Send + Sync + fmt::Debug {
    /// All addresses of `host` (a DNS name, never an IP literal).
    fn resolve(&self, host: &str) -> Resolving;
}

/// The operating system's resolver, through `tokio::net::lookup_host`.
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemResolver;

impl DnsResolver for SystemResolver {
    fn resolve(&self, host: &str) -> Resolving {
        let host = host.to_owned();
        Box::pin(async move {
            let addrs = tokio::net::lookup_host((host.as_str(), 0)).await?;
            Ok(addrs.map(|addr| addr.ip()).collect())
        })
    }
}

/// A fixed table of names to addresses; unknown names fail to resolve. For tests and for
/// pinning a vendor's addresses.
#[derive(Clone, Debug, Default)]
pub struct StaticResolver {
    names: HashMap<String, Vec<IpAddr>>,
}

impl StaticResolver {
    /// An empty table.
    pub fn new() -> StaticResolver {
        StaticResolver::default()
    }

    /// Adds `host` (matched case-insensitively) resolving to `addrs`.
    pub fn with(mut self, host: &str, addrs: &[IpAddr]) -> StaticResolver {
        self.names.insert(host.to_ascii_lowercase(), addrs.to_vec());
        self
    }
}

impl DnsResolver for StaticResolver {
    fn resolve(&self, host: &str) -> Resolving {
        let found = self.names.get(&host.to_ascii_lowercase()).cloned();
        Box::pin(async move {
            found.ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "name not found"))
        })
    }
}

/// Why a URL or address was refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// Not http or https.
    Scheme(String),
    /// `user:pass@` in the URL (a classic trick to disguise the real host).
    UserInfo,
    /// The URL has no host.
    NoHost,
    /// The host (or one of its addresses) is in a refused range.
    Address { host: String, range: &'static str },
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refusal::Scheme(scheme) => write!(f, "scheme `{scheme}` is not allowed"),
            Refusal::UserInfo => f.write_str("credentials in the url are not allowed"),
            Refusal::NoHost => f.write_str("the url has no host"),
            Refusal::Address { host, range } => {
                write!(f, "host {host} resolves to a {range} address")
            }
        }
    }
}

impl std::error::Error for Refusal {}

/// Hosts exempt from the address check, as configured (`localhost`, `127.0.0.1`, `[::1]`).
#[derive(Clone, Debug, Default)]
pub(crate) struct AllowList {
    names: Vec<String>,
    ips: Vec<IpAddr>,
}

impl AllowList {
    pub(crate) fn new(hosts: &[String]) -> AllowList {
        let mut list = AllowList::default();
        for host in hosts {
            let trimmed = host.trim().trim_start_matches('[').trim_end_matches(']');
            match trimmed.parse::<IpAddr>() {
                Ok(ip) => list.ips.push(ip),
                Err(_) => list.names.push(trimmed.to_ascii_lowercase()),
            }
        }
        list
    }

    fn allows_name(&self, name: &str) -> bool {
        let name = name.to_ascii_lowercase();
        self.names.contains(&name)
    }

    fn allows_ip(&self, ip: IpAddr) -> bool {
        self.ips.contains(&ip)
    }
}

/// Checks what can be checked without DNS: scheme, userinfo, and literal IP hosts.
pub(crate) fn check_url(url: &Url, allow: &AllowList) -> Result<(), Refusal> {
    match url.scheme() {
        "http" | "https" => {}
        other => return Err(Refusal::Scheme(other.to_owned())),
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err(Refusal::UserInfo);
    }
    let ip = match url.host() {
        None => return Err(Refusal::NoHost),
        Some(Host::Domain(_)) => return Ok(()),
        Some(Host::Ipv4(v4)) => IpAddr::V4(v4),
        Some(Host::Ipv6(v6)) => IpAddr::V6(v6),
    };
    if allow.allows_ip(ip) {
        return Ok(());
    }
    match refused_range(ip) {
        Some(range) => Err(Refusal::Address {
            host: ip.to_string(),
            range,
        }),
        None => Ok(()),
    }
}

/// Whether the guard lets a request to `url` start: its scheme, userinfo and a literal IP
/// host are checked, with `allow_hosts` exempt as in [`crate::VendorConfig`]. A host name
/// passes here and is checked when it resolves (every address it resolves to).
pub fn check_target(url: &str, allow_hosts: &[String]) -> Result<(), String> {
    let parsed = Url::parse(url).map_err(|e| format!("not a url: {e}"))?;
    check_url(&parsed, &AllowList::new(allow_hosts)).map_err(|refusal| refusal.to_string())
}

/// The refused range `ip` falls in (`"loopback"`, `"private"`, ...), or `None` for a public
/// address.
pub fn refused_range(ip: IpAddr) -> Option<&'static str> {
    match ip {
        IpAddr::V4(v4) => refused_v4(v4),
        IpAddr::V6(v6) => refused_v6(v6),
    }
}

fn refused_v4(ip: Ipv4Addr) -> Option<&'static str> {
    let [a, b, c, _] = ip.octets();
    let range = match (a, b, c) {
        (0, _, _) => "unspecified",
        (10, _, _) => "private",
        (100, 64..=127, _) => "shared (carrier-grade nat)",
        (127, _, _) => "loopback",
        (169, 254, _) => "link-local (cloud metadata)",
        (172, 16..=31, _) => "private",
        (192, 0, 0) => "ietf protocol assignment",
        (192, 0, 2) | (198, 51, 100) | (203, 0, 113) => "documentation",
        (192, 168, _) => "private",
        (198, 18..=19, _) => "benchmarking",
        (224..=239, _, _) => "multicast",
        (240..=255, _, _) => "reserved or broadcast",
        _ => return None,
    };
    Some(range)
}

fn refused_v6(ip: Ipv6Addr) -> Option<&'static str> {
    if ip.is_unspecified() {
        return Some("unspecified");
    }
    if ip.is_loopback() {
        return Some("loopback");
    }
    // IPv4 addresses embedded in IPv6 forms reach the IPv4 host: judge them as IPv4 too (an
    // embedded public address does not clear a refused IPv6 range, as in `fe80::5efe:...`).
    if let Some(range) = embedded_v4(ip).and_then(refused_v4) {
        return Some(range);
    }
    let range = match ip.segments() {
        // IPv4-compatible (deprecated) ::a.b.c.d: refused outright.
        [0, 0, 0, 0, 0, 0, _, _] => "ipv4-compatible",
        // Local-use NAT64 (RFC 8215): where the IPv4 address sits depends on the prefix length
        // the network chose, so it cannot be judged; it only exists inside a network anyway.
        [0x64, 0xff9b, 1, ..] => "local-use nat64",
        // Teredo hides the IPv4 client behind a relay: no vendor API lives there.
        [0x2001, 0, ..] => "teredo",
        [first, ..] if first & 0xfe00 == 0xfc00 => "unique-local",
        [first, ..] if first & 0xffc0 == 0xfe80 => "link-local",
        [first, ..] if first & 0xffc0 == 0xfec0 => "site-local",
        [first, ..] if first & 0xff00 == 0xff00 => "multicast",
        [0x2001, 0x0db8, ..] => "documentation",
        [0x0100, 0, 0, 0, ..] => "discard-only",
        _ => return None,
    };
    Some(range)
}

/// The IPv4 address a packet to `ip` reaches, for the forms that embed one: IPv4-mapped
/// (`::ffff:a.b.c.d`), IPv4-translated (`::ffff:0:a.b.c.d`, SIIT), NAT64's well-known prefix
/// (`64:ff9b::a.b.c.d`), 6to4 (`2002:AABB:CCDD::`) and ISATAP (`...:0:5efe:a.b.c.d`, also
/// with the universal bit `200:5efe`).
fn embedded_v4(ip: Ipv6Addr) -> Option<Ipv4Addr> {
    let v4 = |hi: u16, lo: u16| {
        let [h1, h2] = hi.to_be_bytes();
        let [l1, l2] = lo.to_be_bytes();
        Ipv4Addr::new(h1, h2, l1, l2)
    };
    match ip.segments() {
        [0, 0, 0, 0, 0, 0xffff, hi, lo]
        | [0, 0, 0, 0, 0xffff, 0, hi, lo]
        | [0x64, 0xff9b, 0, 0, 0, 0, hi, lo]
        | [0x2002, hi, lo, ..]
        | [_, _, _, _, 0 | 0x200, 0x5efe, hi, lo] => Some(v4(hi, lo)),
        _ => None,
    }
}

/// The resolver reqwest uses: resolves through the configured [`DnsResolver`], then refuses
/// the whole name if any address is in a refused range (unless the name is allow-listed), and
/// hands reqwest exactly the addresses it checked.
#[derive(Debug, Clone)]
pub(crate) struct GuardedResolver {
    pub(crate) inner: Arc<dyn DnsResolver>,
    pub(crate) allow: Arc<AllowList>,
}

impl reqwest::dns::Resolve for GuardedResolver {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let host = name.as_str().to_owned();
        let inner = Arc::clone(&self.inner);
        let allow = Arc::clone(&self.allow);
        Box::pin(async move {
            let ips = inner.resolve(&host).await?;
            if ips.is_empty() {
                return Err(
                    io::Error::new(io::ErrorKind::NotFound, "name has no addresses").into(),
                );
            }
            if !allow.allows_name(&host) {
                for ip in &ips {
                    if let Some(range) = refused_range(*ip) {
                        let refusal = Refusal::Address {
                            host: host.clone(),
                            range,
                        };
                        return Err(Box::new(refusal) as Box<dyn std::error::Error + Send + Sync>);
                    }
                }
            }
            let addrs: reqwest::dns::Addrs =
                Box::new(ips.into_iter().map(|ip| SocketAddr::new(ip, 0)));
            Ok(addrs)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn address_ranges() {
        let cases: &[(&str, Option<&str>)] = &[
            ("8.8.8.8", None),
            ("1.1.1.1", None),
            ("127.0.0.1", Some("loopback")),
            ("10.1.2.3", Some("private")),
            ("172.31.255.255", Some("private")),
            ("172.32.0.1", None),
            ("192.168.1.1", Some("private")),
            ("169.254.169.254", Some("link-local (cloud metadata)")),
            ("100.100.100.200", Some("shared (carrier-grade nat)")),
            ("0.0.0.0", Some("unspecified")),
            ("224.0.0.1", Some("multicast")),
            ("255.255.255.255", Some("reserved or broadcast")),
            ("::1", Some("loopback")),
            ("::", Some("unspecified")),
            (
                "::ffff:169.254.169.254",
                Some("link-local (cloud metadata)"),
            ),
            ("::ffff:8.8.8.8", None),
            ("::127.0.0.1", Some("ipv4-compatible")),
            ("64:ff9b::a9fe:a9fe", Some("link-local (cloud metadata)")),
            ("64:ff9b::808:808", None),
            // IPv4-translated (SIIT), the form `::ffff:0:0/96`.
            ("::ffff:0:a9fe:a9fe", Some("link-local (cloud metadata)")),
            ("::ffff:0:7f00:1", Some("loopback")),
            ("::ffff:0:808:808", None),
            // Local-use NAT64, whatever the prefix length puts where.
            ("64:ff9b:1::a9fe:a9fe", Some("local-use nat64")),
            ("64:ff9b:1:a9fe:a9:fe00::", Some("local-use nat64")),
            ("64:ff9b:1:ffff::808:808", Some("local-use nat64")),
            ("2002:7f00:1::", Some("loopback")),
            ("2002:a9fe:a9fe::1", Some("link-local (cloud metadata)")),
            ("2002:808:808::1", None),
            ("::127.0.0.1", Some("ipv4-compatible")),
            ("::8.8.8.8", Some("ipv4-compatible")),
            ("::ffff:10.0.0.1", Some("private")),
            // ISATAP interface ids carry the IPv4 end of the tunnel.
            (
                "2001:db9::5efe:a9fe:a9fe",
                Some("link-local (cloud metadata)"),
            ),
            ("2a00:1450::200:5efe:a00:1", Some("private")),
            ("2001:0:4136:e378:8000:63bf:3fff:fdd2", Some("teredo")),
            ("fe80::5efe:808:808", Some("link-local")),
            ("fd00::200:5efe:808:808", Some("unique-local")),
            ("fc00::1", Some("unique-local")),
            ("fd00:ec2::254", Some("unique-local")),
            ("fe80::1", Some("link-local")),
            ("febf::1", Some("link-local")),
            ("ff02::1", Some("multicast")),
            ("2606:4700:4700::1111", None),
        ];
        for (ip, expected) in cases {
            let parsed: IpAddr = ip.parse().unwrap();
            assert_eq!(refused_range(parsed), *expected, "{ip}");
        }
    }

    #[test]
    fn allow_list_exempts_literal_ips_and_names() {
        let allow = AllowList::new(&["127.0.0.1".into(), "[::1]".into(), "LocalHost".into()]);
        let ok = |u: &str| check_url(&Url::parse(u).unwrap(), &allow);
        assert_eq!(ok("http://127.0.0.1:8080/x"), Ok(()));
        assert_eq!(ok("http://[::1]/x"), Ok(()));
        assert!(ok("http://127.0.0.2/x").is_err());
        assert!(allow.allows_name("localhost"));
        assert!(!allow.allows_name("localhost.evil.com"));
    }
}
