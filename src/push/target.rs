//! Where notifications may go: refuses addresses inside the operator's networks (loopback,
//! private, link-local with the cloud metadata service, unique-local, multicast, unspecified)
//! unless allowed, checked when a config is registered and again, after resolving the name, at
//! every delivery. Delivery connects to the address that was checked (see [`CheckedResolver`]),
//! so a name that resolves elsewhere the second time (DNS rebinding) gains nothing.

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
    Unresolvable { host: String, error: String },
    #[error(
        "{host} resolves to {addr}, an address of a private, loopback, link-local or otherwise internal network (allow it with push.allow_private_networks or push.allowed_hosts)"
    )]
    Internal { host: String, addr: IpAddr },
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
        if self.allow_private_networks || self.host_allowed(host) || is_public(addr) {
            return Ok(());
        }
        Err(TargetError::Internal {
            host: host.to_owned(),
            addr,
        })
    }

    /// Checks the URL and every address its host resolves to now.
    pub async fn check(&self, url: &str) -> Result<(), TargetError> {
        let (host, port) = self.check_url(url)?;
        for addr in self.resolve(&host, port).await? {
            self.check_addr(&host, addr.ip())?;
        }
        Ok(())
    }

    async fn resolve(&self, host: &str, port: u16) -> Result<Vec<SocketAddr>, TargetError> {
        let bare = host.trim_start_matches('[').trim_end_matches(']');
        if let Ok(ip) = bare.parse::<IpAddr>() {
            return Ok(vec![SocketAddr::new(ip, port)]);
        }
        let unresolvable = |error: String| TargetError::Unresolvable {
            host: host.to_owned(),
            error,
        };
        let addrs: Vec<SocketAddr> = tokio::net::lookup_host((bare, port))
            .await
            .map_err(|e| unresolvable(e.to_string()))?
            .collect();
        if addrs.is_empty() {
            return Err(unresolvable("no address".into()));
        }
        Ok(addrs)
    }
}

/// Resolves names for the delivery client and hands it only addresses the policy allows: the
/// client connects to exactly what was checked. A name with any refused address is refused.
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

/// An address on the public internet (not loopback, private, link-local, unique-local, shared,
/// multicast, broadcast, documentation or unspecified).
pub fn is_public(addr: IpAddr) -> bool {
    match addr {
        IpAddr::V4(v4) => is_public_v4(v4),
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => is_public_v4(v4),
            None => is_public_v6(v6),
        },
    }
}

fn is_public_v4(ip: Ipv4Addr) -> bool {
    let [a, b, ..] = ip.octets();
    let shared = a == 100 && (64..128).contains(&b); // 100.64.0.0/10, carrier-grade NAT
    let reserved = a == 0 || a >= 240;
    !(ip.is_loopback()
        || ip.is_private()
        || ip.is_link_local()
        || ip.is_multicast()
        || ip.is_broadcast()
        || ip.is_unspecified()
        || ip.is_documentation()
        || shared
        || reserved)
}

fn is_public_v6(ip: Ipv6Addr) -> bool {
    let first = ip.segments()[0];
    let unique_local = first & 0xfe00 == 0xfc00; // fc00::/7
    let link_local = first & 0xffc0 == 0xfe80; // fe80::/10
    let documentation = first == 0x2001 && ip.segments()[1] == 0x0db8;
    let nat64 = first == 0x0064 && ip.segments()[1] == 0xff9b; // may reach any IPv4
    !(ip.is_loopback()
        || ip.is_unspecified()
        || ip.is_multicast()
        || unique_local
        || link_local
        || documentation
        || nat64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn internal_addresses_are_not_public() {
        for addr in [
            "127.0.0.1",
            "10.0.0.1",
            "172.16.5.4",
            "192.168.1.1",
            "169.254.169.254",
            "100.64.0.1",
            "0.0.0.0",
            "224.0.0.1",
            "255.255.255.255",
            "::1",
            "::",
            "fe80::1",
            "fd00::1",
            "ff02::1",
            "::ffff:127.0.0.1",
            "::ffff:169.254.169.254",
        ] {
            assert!(
                !is_public(addr.parse().unwrap()),
                "{addr} counted as public"
            );
        }
        for addr in ["93.184.216.34", "8.8.8.8", "2606:4700:4700::1111"] {
            assert!(
                is_public(addr.parse().unwrap()),
                "{addr} counted as internal"
            );
        }
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
}
