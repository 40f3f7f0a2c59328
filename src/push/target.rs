//! Where notifications may go: refuses the special-purpose addresses of both families (IANA
//! registries: loopback, private, link-local with the cloud metadata service, unique-local,
//! shared, documentation, benchmarking, multicast, reserved, ..., and IPv6 forms that embed
//! such an IPv4 address) unless allowed. A config is refused at registration only for what is
//! certain then (its form, a literal address, a name that resolves to a refused address); a name
//! that does not resolve yet is accepted. Every delivery resolves the name and checks again, and
//! connects to the address that was checked (see [`CheckedResolver`]), so a name that resolves
//! elsewhere the second time (DNS rebinding) gains nothing; a name that does not resolve then
//! fails that attempt, which is retried.

use reqwest::Url;
use reqwest::dns::{Addrs, Name, Resolve, Resolving};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum TargetError {
    #[error("not a valid URL: {0}")]
    BadUrl(String),
    #[error(
        "only https URLs are accepted (http only for push.allowed_hosts or with push.allow_private_networks)"
    )]
    NotHttps,
    #[error("{host} cannot be resolved: {error}")]
    Unresolvable {
        host: String,
        #[source]
        error: crate::error::Cause,
    },
    #[error("{host} cannot be resolved: no address")]
    NoAddress { host: String },
    #[error(
        "{host} resolves to {addr}, in {why}: a special-purpose address, not a public one (allow it with push.allow_private_networks or push.allowed_hosts)"
    )]
    Internal {
        host: String,
        addr: IpAddr,
        why: SpecialPurpose,
    },
}

impl TargetError {
    /// Why the host could not be resolved, without naming it (logs never carry a webhook's
    /// URL); `None` for every other refusal. A name that does not resolve now may resolve later
    /// (the resolver is down, the name is not in DNS yet): at delivery that is a failed attempt,
    /// retried, not a refusal.
    pub fn unresolved(&self) -> Option<String> {
        match self {
            TargetError::Unresolvable { error, .. } => Some(format!(
                "the webhook's host cannot be resolved: {}",
                crate::error::chain(error)
            )),
            TargetError::NoAddress { .. } => {
                Some("the webhook's host cannot be resolved: no address".into())
            }
            _ => None,
        }
    }
}

/// The operator's allowances.
#[derive(Debug, Clone, Default)]
pub struct TargetPolicy {
    /// Any address is allowed.
    pub allow_private_networks: bool,
    /// Host names (or address literals) allowed whatever they resolve to, over http too.
    pub allowed_hosts: Vec<String>,
}

impl TargetPolicy {
    fn host_allowed(&self, host: &str) -> bool {
        let host = host.trim_start_matches('[').trim_end_matches(']');
        self.allowed_hosts
            .iter()
            .any(|allowed| allowed.eq_ignore_ascii_case(host))
    }

    /// The URL's form: http(s), a host, https unless allowed. Returns the host and port.
    pub fn check_url(&self, url: &str) -> Result<(String, u16), TargetError> {
        let parsed = Url::parse(url).map_err(|e| TargetError::BadUrl(e.to_string()))?;
        let host = parsed
            .host_str()
            .filter(|h| !h.is_empty())
            .ok_or_else(|| TargetError::BadUrl("no host".into()))?
            .to_owned();
        let port = parsed
            .port_or_known_default()
            .ok_or_else(|| TargetError::BadUrl("no port".into()))?;
        match parsed.scheme() {
            "https" => {}
            "http" if self.allow_private_networks || self.host_allowed(&host) => {}
            "http" => return Err(TargetError::NotHttps),
            other => return Err(TargetError::BadUrl(format!("scheme {other:?}"))),
        }
        Ok((host, port))
    }

    /// Whether `addr` may be reached for `host`.
    pub fn check_addr(&self, host: &str, addr: IpAddr) -> Result<(), TargetError> {
        if self.allow_private_networks || self.host_allowed(host) {
            return Ok(());
        }
        match special_purpose(addr) {
            None => Ok(()),
            Some(why) => Err(TargetError::Internal {
                host: host.to_owned(),
                addr,
                why,
            }),
        }
    }

    /// The check at registration: the URL, and every address its host resolves to now. A name
    /// that does not resolve now passes: a resolver that is down or a name not yet in DNS says
    /// nothing about where it will lead, and each delivery resolves and checks it again.
    pub async fn check(&self, url: &str) -> Result<(), TargetError> {
        let (host, port) = self.check_url(url)?;
        let addrs = match self.resolve(&host, port).await {
            Ok(addrs) => addrs,
            Err(e @ (TargetError::Unresolvable { .. } | TargetError::NoAddress { .. })) => {
                let why = e.unresolved().unwrap_or_default();
                tracing::debug!(%why, "push target accepted unresolved; checked at delivery");
                return Ok(());
            }
            Err(e) => return Err(e),
        };
        for addr in addrs {
            self.check_addr(&host, addr.ip())?;
        }
        Ok(())
    }

    async fn resolve(&self, host: &str, port: u16) -> Result<Vec<SocketAddr>, TargetError> {
        let bare = host.trim_start_matches('[').trim_end_matches(']');
        if let Ok(ip) = bare.parse::<IpAddr>() {
            return Ok(vec![SocketAddr::new(ip, port)]);
        }
        let addrs: Vec<SocketAddr> = tokio::net::lookup_host((bare, port))
            .await
            .map_err(|e| TargetError::Unresolvable {
                host: host.to_owned(),
                error: crate::error::Cause::new(e),
            })?
            .collect();
        if addrs.is_empty() {
            return Err(TargetError::NoAddress {
                host: host.to_owned(),
            });
        }
        Ok(addrs)
    }
}

/// Resolves names for the delivery client and hands it only addresses the policy allows: the
/// client connects to exactly what was checked. A name with any refused address is refused; one
/// that does not resolve fails with [`TargetError::Unresolvable`] or [`TargetError::NoAddress`]
/// (see [`TargetError::unresolved`]).
pub struct CheckedResolver(pub Arc<TargetPolicy>);

impl Resolve for CheckedResolver {
    fn resolve(&self, name: Name) -> Resolving {
        let policy = self.0.clone();
        Box::pin(async move {
            let host = name.as_str().to_owned();
            let addrs = policy.resolve(&host, 0).await?;
            for addr in &addrs {
                policy.check_addr(&host, addr.ip())?;
            }
            Ok(Box::new(addrs.into_iter()) as Addrs)
        })
    }
}

/// A range no webhook may reach: one entry of an IANA special-purpose address registry (or a
/// range IANA sets apart elsewhere: multicast, reserved, the deprecated IPv6 site-local and
/// IPv4-compatible forms).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Range {
    /// In CIDR notation.
    pub cidr: &'static str,
    /// What the registry calls it.
    pub name: &'static str,
}

impl std::fmt::Display for Range {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({})", self.cidr, self.name)
    }
}

/// Why an address is refused: its range, and for an IPv6 form that carries an IPv4 address
/// (mapped, NAT64, compatible, translated, 6to4, Teredo) that address with its own range if it
/// has one, so the message names where the packets would really go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SpecialPurpose {
    pub range: Range,
    pub embedded: Option<Ipv4Addr>,
    pub embedded_range: Option<Range>,
}

impl std::fmt::Display for SpecialPurpose {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.range)?;
        if let Some(v4) = self.embedded {
            write!(f, ", embedding {v4}")?;
        }
        if let Some(range) = self.embedded_range {
            write!(f, " in {range}")?;
        }
        Ok(())
    }
}

const fn range(cidr: &'static str, name: &'static str) -> Range {
    Range { cidr, name }
}

/// The IPv4 special-purpose registry, with multicast and the reserved 240/4. More specific
/// entries first, so the narrowest name is given.
const V4_RANGES: &[(Ipv4Addr, u8, Range)] = &[
    (
        Ipv4Addr::new(0, 0, 0, 0),
        8,
        range("0.0.0.0/8", "this network"),
    ),
    (
        Ipv4Addr::new(10, 0, 0, 0),
        8,
        range("10.0.0.0/8", "private-use"),
    ),
    (
        Ipv4Addr::new(100, 64, 0, 0),
        10,
        range("100.64.0.0/10", "shared address space"),
    ),
    (
        Ipv4Addr::new(127, 0, 0, 0),
        8,
        range("127.0.0.0/8", "loopback"),
    ),
    (
        Ipv4Addr::new(169, 254, 0, 0),
        16,
        range("169.254.0.0/16", "link-local"),
    ),
    (
        Ipv4Addr::new(172, 16, 0, 0),
        12,
        range("172.16.0.0/12", "private-use"),
    ),
    (
        Ipv4Addr::new(192, 0, 0, 0),
        24,
        range("192.0.0.0/24", "IETF protocol assignments"),
    ),
    (
        Ipv4Addr::new(192, 0, 2, 0),
        24,
        range("192.0.2.0/24", "documentation"),
    ),
    (
        Ipv4Addr::new(192, 88, 99, 0),
        24,
        range("192.88.99.0/24", "6to4 relay anycast"),
    ),
    (
        Ipv4Addr::new(192, 168, 0, 0),
        16,
        range("192.168.0.0/16", "private-use"),
    ),
    (
        Ipv4Addr::new(198, 18, 0, 0),
        15,
        range("198.18.0.0/15", "benchmarking"),
    ),
    (
        Ipv4Addr::new(198, 51, 100, 0),
        24,
        range("198.51.100.0/24", "documentation"),
    ),
    (
        Ipv4Addr::new(203, 0, 113, 0),
        24,
        range("203.0.113.0/24", "documentation"),
    ),
    (
        Ipv4Addr::new(224, 0, 0, 0),
        4,
        range("224.0.0.0/4", "multicast"),
    ),
    (
        Ipv4Addr::new(255, 255, 255, 255),
        32,
        range("255.255.255.255/32", "limited broadcast"),
    ),
    (
        Ipv4Addr::new(240, 0, 0, 0),
        4,
        range("240.0.0.0/4", "reserved"),
    ),
];

/// Where an IPv6 range keeps the IPv4 address it embeds, and whether the range is refused
/// outright or judged by that address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Embeds {
    Nothing,
    /// The last 32 bits, refused whatever they hold (not routed as such, or deprecated).
    Last32,
    /// The last 32 bits, judged as that IPv4 address: the packets go exactly there (an
    /// IPv4-mapped socket address; the well-known NAT64 prefix, which IANA marks globally
    /// reachable and a DNS64 resolver hands out for every IPv4-only name).
    Last32JudgedAsV4,
    /// 6to4: bits 16-47 (the site's IPv4 address); refused (RFC 7526 deprecated its relays).
    SixToFour,
    /// Teredo: the client's address is the last 32 bits inverted; refused.
    Teredo,
}

/// The IPv6 special-purpose registry, with multicast and the deprecated site-local and
/// IPv4-compatible ranges. More specific entries first.
const V6_RANGES: &[(Ipv6Addr, u8, Range, Embeds)] = &[
    (
        Ipv6Addr::UNSPECIFIED,
        128,
        range("::/128", "unspecified"),
        Embeds::Nothing,
    ),
    (
        Ipv6Addr::LOCALHOST,
        128,
        range("::1/128", "loopback"),
        Embeds::Nothing,
    ),
    (
        Ipv6Addr::new(0, 0, 0, 0, 0, 0xffff, 0, 0),
        96,
        range("::ffff:0:0/96", "IPv4-mapped"),
        Embeds::Last32JudgedAsV4,
    ),
    (
        Ipv6Addr::new(0, 0, 0, 0, 0xffff, 0, 0, 0),
        96,
        range("::ffff:0:0:0/96", "IPv4-translated"),
        Embeds::Last32,
    ),
    (
        Ipv6Addr::UNSPECIFIED,
        96,
        range("::/96", "IPv4-compatible, deprecated"),
        Embeds::Last32,
    ),
    (
        Ipv6Addr::new(0x64, 0xff9b, 0, 0, 0, 0, 0, 0),
        96,
        range("64:ff9b::/96", "NAT64 IPv4-IPv6 translation"),
        Embeds::Last32JudgedAsV4,
    ),
    (
        Ipv6Addr::new(0x64, 0xff9b, 1, 0, 0, 0, 0, 0),
        48,
        range("64:ff9b:1::/48", "local-use IPv4-IPv6 translation"),
        Embeds::Nothing,
    ),
    (
        Ipv6Addr::new(0x100, 0, 0, 0, 0, 0, 0, 0),
        64,
        range("100::/64", "discard-only"),
        Embeds::Nothing,
    ),
    (
        Ipv6Addr::new(0x2001, 0, 0, 0, 0, 0, 0, 0),
        32,
        range("2001::/32", "Teredo"),
        Embeds::Teredo,
    ),
    (
        Ipv6Addr::new(0x2001, 0, 0, 0, 0, 0, 0, 0),
        23,
        range("2001::/23", "IETF protocol assignments"),
        Embeds::Nothing,
    ),
    (
        Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 0),
        32,
        range("2001:db8::/32", "documentation"),
        Embeds::Nothing,
    ),
    (
        Ipv6Addr::new(0x2002, 0, 0, 0, 0, 0, 0, 0),
        16,
        range("2002::/16", "6to4"),
        Embeds::SixToFour,
    ),
    (
        Ipv6Addr::new(0x3fff, 0, 0, 0, 0, 0, 0, 0),
        20,
        range("3fff::/20", "documentation"),
        Embeds::Nothing,
    ),
    (
        Ipv6Addr::new(0x5f00, 0, 0, 0, 0, 0, 0, 0),
        16,
        range("5f00::/16", "segment routing SIDs"),
        Embeds::Nothing,
    ),
    (
        Ipv6Addr::new(0xfc00, 0, 0, 0, 0, 0, 0, 0),
        7,
        range("fc00::/7", "unique-local"),
        Embeds::Nothing,
    ),
    (
        Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 0),
        10,
        range("fe80::/10", "link-local"),
        Embeds::Nothing,
    ),
    (
        Ipv6Addr::new(0xfec0, 0, 0, 0, 0, 0, 0, 0),
        10,
        range("fec0::/10", "site-local, deprecated"),
        Embeds::Nothing,
    ),
    (
        Ipv6Addr::new(0xff00, 0, 0, 0, 0, 0, 0, 0),
        8,
        range("ff00::/8", "multicast"),
        Embeds::Nothing,
    ),
];

/// Whether the first `len` bits of `a` and `b` agree (`bits` wide).
fn same_prefix(a: u128, b: u128, len: u8, bits: u8) -> bool {
    len == 0 || (a ^ b) >> (bits - len) == 0
}

/// Why `addr` may not be a webhook's address: the special-purpose range it is in (for IPv6
/// that embeds an IPv4 address, possibly the IPv4 address's range). None: a public address.
/// The one address check, at registration and at every delivery.
pub fn special_purpose(addr: IpAddr) -> Option<SpecialPurpose> {
    match addr {
        IpAddr::V4(v4) => v4_range(v4).map(|range| SpecialPurpose {
            range,
            embedded: None,
            embedded_range: None,
        }),
        IpAddr::V6(v6) => v6_special_purpose(v6),
    }
}

fn v4_range(v4: Ipv4Addr) -> Option<Range> {
    let bits = u128::from(v4.to_bits());
    V4_RANGES
        .iter()
        .find(|(net, len, _)| same_prefix(bits, u128::from(net.to_bits()), *len, 32))
        .map(|(_, _, range)| *range)
}

fn v6_special_purpose(v6: Ipv6Addr) -> Option<SpecialPurpose> {
    let bits = v6.to_bits();
    let (_, _, range, embeds) = V6_RANGES
        .iter()
        .find(|(net, len, _, _)| same_prefix(bits, net.to_bits(), *len, 128))?;
    let last32 = Ipv4Addr::from_bits(bits as u32);
    let embedded = match embeds {
        Embeds::Nothing => None,
        Embeds::Last32 | Embeds::Last32JudgedAsV4 => Some(last32),
        Embeds::SixToFour => Some(Ipv4Addr::from_bits((bits >> 80) as u32)),
        Embeds::Teredo => Some(Ipv4Addr::from_bits(!(bits as u32))),
    };
    let embedded_range = embedded.and_then(v4_range);
    if *embeds == Embeds::Last32JudgedAsV4 && embedded_range.is_none() {
        // Reaches exactly that public IPv4 address.
        return None;
    }
    Some(SpecialPurpose {
        range: *range,
        embedded,
        embedded_range,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every refused range: its CIDR as named, an address inside (refused, naming that
    /// range), and the nearest address outside it that is allowed (further away where the
    /// neighbour is another refused range).
    const RANGES: &[(&str, &str, &str)] = &[
        ("0.0.0.0/8", "0.1.2.3", "1.0.0.0"),
        ("10.0.0.0/8", "10.255.255.255", "11.0.0.0"),
        ("10.0.0.0/8", "10.0.0.0", "9.255.255.255"),
        ("100.64.0.0/10", "100.64.0.1", "100.63.255.255"),
        ("100.64.0.0/10", "100.127.255.255", "100.128.0.0"),
        ("127.0.0.0/8", "127.0.0.1", "128.0.0.0"),
        ("127.0.0.0/8", "127.0.0.0", "126.255.255.255"),
        ("169.254.0.0/16", "169.254.169.254", "169.255.0.0"),
        ("172.16.0.0/12", "172.31.255.255", "172.32.0.0"),
        ("172.16.0.0/12", "172.16.0.0", "172.15.255.255"),
        ("192.0.0.0/24", "192.0.0.1", "192.0.1.0"),
        ("192.0.0.0/24", "192.0.0.0", "191.255.255.255"),
        ("192.0.2.0/24", "192.0.2.1", "192.0.3.0"),
        ("192.88.99.0/24", "192.88.99.1", "192.88.100.0"),
        ("192.88.99.0/24", "192.88.99.0", "192.88.98.255"),
        ("192.168.0.0/16", "192.168.1.1", "192.169.0.0"),
        ("192.168.0.0/16", "192.168.0.0", "192.167.255.255"),
        ("198.18.0.0/15", "198.18.0.1", "198.17.255.255"),
        ("198.18.0.0/15", "198.19.255.255", "198.20.0.0"),
        ("198.51.100.0/24", "198.51.100.1", "198.51.101.0"),
        ("203.0.113.0/24", "203.0.113.1", "203.0.114.0"),
        ("224.0.0.0/4", "224.0.0.1", "223.255.255.255"),
        ("224.0.0.0/4", "239.255.255.255", "223.255.255.255"),
        ("240.0.0.0/4", "240.0.0.1", "223.255.255.255"),
        ("240.0.0.0/4", "255.255.255.254", "223.255.255.255"),
        ("255.255.255.255/32", "255.255.255.255", "223.255.255.255"),
        ("::/128", "::", "::1:0:0"),
        ("::1/128", "::1", "::1:0:0"),
        ("::ffff:0:0/96", "::ffff:127.0.0.1", "::1:0:0:0"),
        ("::ffff:0:0/96", "::ffff:169.254.169.254", "::ffff:8.8.8.8"),
        ("::ffff:0:0:0/96", "::ffff:0:127.0.0.1", "::ffff:1:0:0"),
        (
            "::ffff:0:0:0/96",
            "::ffff:0:8.8.8.8",
            "::fffe:ffff:ffff:ffff",
        ),
        ("::/96", "::127.0.0.1", "::1:0:0"),
        ("::/96", "::8.8.8.8", "::1:0:0"),
        ("64:ff9b::/96", "64:ff9b::10.0.0.1", "64:ff9b::8.8.8.8"),
        ("64:ff9b::/96", "64:ff9b::127.0.0.1", "64:ff9b::1:0:0"),
        ("64:ff9b:1::/48", "64:ff9b:1::8.8.8.8", "64:ff9b:2::"),
        ("64:ff9b:1::/48", "64:ff9b:1:ffff::1", "64:ff9a:ffff::"),
        ("100::/64", "100::1", "100:0:0:1::"),
        ("2001::/32", "2001::1", "2001:200::"),
        (
            "2001::/32",
            "2001:0:4136:e378:8000:63bf:80ff:fffe",
            "2001:200::",
        ),
        ("2001::/23", "2001:1ff:ffff::1", "2001:200::"),
        ("2001::/23", "2001:2::1", "2000:ffff:ffff::"),
        ("2001:db8::/32", "2001:db8::1", "2001:db9::"),
        ("2001:db8::/32", "2001:db8:ffff::1", "2001:db7:ffff::"),
        ("2002::/16", "2002:7f00:1::", "2003::1"),
        ("2002::/16", "2002:808:808::1", "2001:ffff::1"),
        ("3fff::/20", "3fff:fff::1", "3fff:1000::"),
        ("5f00::/16", "5f00::1", "5f01::"),
        ("fc00::/7", "fd00::1", "fe00::"),
        ("fc00::/7", "fc00::1", "fbff:ffff::"),
        ("fe80::/10", "fe80::1", "fe7f:ffff::"),
        ("fe80::/10", "febf:ffff::1", "fe7f:ffff::"),
        ("fec0::/10", "fec0::1", "fe7f:ffff::"),
        ("fec0::/10", "feff:ffff::1", "fe7f:ffff::"),
        ("ff00::/8", "ff02::1", "fe7f:ffff::"),
    ];

    #[test]
    fn every_special_purpose_range_is_refused_and_its_neighbours_are_not() {
        for (cidr, inside, outside) in RANGES {
            let why = special_purpose(inside.parse().unwrap());
            assert_eq!(
                why.map(|w| w.range.cidr),
                Some(*cidr),
                "{inside} should be refused as in {cidr}"
            );
            let allowed = special_purpose(outside.parse().unwrap());
            assert_eq!(
                allowed, None,
                "{outside}, outside {cidr}, should be allowed"
            );
        }
        for public in [
            "93.184.216.34",
            "8.8.8.8",
            "2606:4700:4700::1111",
            "2a00:1450::1",
        ] {
            assert_eq!(special_purpose(public.parse().unwrap()), None, "{public}");
        }
    }

    /// Addresses a security review found passing an earlier check, each refused naming why.
    #[test]
    fn embedded_ipv4_is_named_and_judged() {
        for (addr, names) in [
            (
                "::127.0.0.1",
                "::/96 (IPv4-compatible, deprecated), embedding 127.0.0.1 in 127.0.0.0/8 (loopback)",
            ),
            (
                "::ffff:0:127.0.0.1",
                "::ffff:0:0:0/96 (IPv4-translated), embedding 127.0.0.1 in 127.0.0.0/8",
            ),
            (
                "2002:7f00:1::",
                "2002::/16 (6to4), embedding 127.0.0.1 in 127.0.0.0/8 (loopback)",
            ),
            ("fec0::1", "fec0::/10 (site-local, deprecated)"),
            (
                "2001::1",
                "2001::/32 (Teredo), embedding 255.255.255.254 in 240.0.0.0/4",
            ),
            (
                "2001:0:4136:e378:8000:63bf:80ff:fffe",
                "2001::/32 (Teredo), embedding 127.0.0.1 in 127.0.0.0/8",
            ),
            ("100::1", "100::/64 (discard-only)"),
            ("198.18.0.1", "198.18.0.0/15 (benchmarking)"),
            ("192.0.0.1", "192.0.0.0/24 (IETF protocol assignments)"),
            (
                "::ffff:10.1.2.3",
                "::ffff:0:0/96 (IPv4-mapped), embedding 10.1.2.3 in 10.0.0.0/8 (private-use)",
            ),
            (
                "64:ff9b::a9fe:a9fe",
                "64:ff9b::/96 (NAT64 IPv4-IPv6 translation), embedding 169.254.169.254 in 169.254.0.0/16 (link-local)",
            ),
            ("2002:808:808::", "2002::/16 (6to4), embedding 8.8.8.8"),
        ] {
            let why = special_purpose(addr.parse().unwrap())
                .expect(addr)
                .to_string();
            assert!(
                why.starts_with(names),
                "{addr}: {why:?} should say {names:?}"
            );
        }
    }

    #[tokio::test]
    async fn a_refusal_names_the_range() {
        let strict = TargetPolicy::default();
        let refused = strict
            .check("https://[2002:7f00:1::]/hook")
            .await
            .unwrap_err();
        let message = refused.to_string();
        assert!(
            message.contains("2002::/16 (6to4), embedding 127.0.0.1"),
            "{message}"
        );
        let allowed = TargetPolicy {
            allowed_hosts: vec!["2002:7f00:1::".into()],
            ..TargetPolicy::default()
        };
        assert!(allowed.check("https://[2002:7f00:1::]/hook").await.is_ok());
    }

    #[test]
    fn http_needs_an_allowance() {
        let strict = TargetPolicy::default();
        assert_eq!(
            strict.check_url("http://example.com/hook"),
            Err(TargetError::NotHttps)
        );
        assert!(strict.check_url("https://example.com/hook").is_ok());
        let allowed = TargetPolicy {
            allowed_hosts: vec!["example.com".into()],
            ..TargetPolicy::default()
        };
        assert!(allowed.check_url("http://example.com/hook").is_ok());
        assert!(strict.check_url("ftp://example.com/").is_err());
    }

    /// `.invalid` never resolves (RFC 6761): registration accepts it, delivery's resolver does
    /// not.
    #[tokio::test]
    async fn a_name_that_does_not_resolve_passes_registration_only() {
        let strict = TargetPolicy::default();
        let host = "hooks.colloquy-test.invalid";
        let registered = strict.check(&format!("https://{host}/hook")).await;
        assert_eq!(registered, Ok(()));
        let delivered = strict.resolve(host, 443).await;
        assert!(
            matches!(
                delivered,
                Err(TargetError::Unresolvable { .. } | TargetError::NoAddress { .. })
            ),
            "{delivered:?}"
        );
        let literal = strict.check("https://169.254.169.254/hook").await;
        assert!(
            matches!(literal, Err(TargetError::Internal { .. })),
            "{literal:?}"
        );
    }

    #[tokio::test]
    async fn a_name_that_resolves_to_loopback_is_refused() {
        let strict = TargetPolicy::default();
        let refused = strict.check("https://localhost:9/hook").await;
        assert!(
            matches!(refused, Err(TargetError::Internal { .. })),
            "{refused:?}"
        );
        let open = TargetPolicy {
            allow_private_networks: true,
            ..TargetPolicy::default()
        };
        assert!(open.check("http://localhost:9/hook").await.is_ok());
    }

    /// Delivery retries an unresolved name, logging why without the name; every other refusal
    /// is not "unresolved".
    #[test]
    fn an_unresolved_name_says_why_without_the_name() {
        let host = "secret-tenant.example".to_owned();
        let cause = std::io::Error::other("failed to lookup address information");
        let unresolvable = TargetError::Unresolvable {
            host: host.clone(),
            error: crate::error::Cause::new(cause),
        };
        let why = unresolvable.unresolved().expect("unresolved");
        assert!(
            why.contains("failed to lookup address information"),
            "{why}"
        );
        assert!(!why.contains(&host), "{why}");
        let no_address = TargetError::NoAddress { host: host.clone() };
        assert!(
            no_address
                .unresolved()
                .is_some_and(|why| !why.contains(&host))
        );
        let internal = TargetError::Internal {
            host,
            addr: IpAddr::V4(Ipv4Addr::LOCALHOST),
            why: special_purpose(IpAddr::V4(Ipv4Addr::LOCALHOST)).expect("loopback"),
        };
        assert_eq!(internal.unresolved(), None);
        assert_eq!(TargetError::NotHttps.unresolved(), None);
    }
}
