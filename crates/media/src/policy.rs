//! Which media URLs the server may fetch: a guard against server-side request forgery.
//!
//! [`check_url`] parses the URL as a browser (and `reqwest`, which uses the same `url` crate)
//! would, so `http://0x7f.1/` is seen as the 127.0.0.1 it is, and refuses: schemes other than
//! http and https, credentials, IP literals that are not public, `localhost`, and hosts not on the
//! allow-list when there is one. A domain name passes on its name; the caller must resolve it,
//! refuse it with [`CheckedUrl::check_resolved`] when any address is not public, and connect to
//! the addresses it checked (not resolve again: DNS rebinding), following redirects only through
//! this check again.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::error::{MediaError, Result};

/// The host of a [`CheckedUrl`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum UrlHost {
    /// A domain name, lower case, IDNA to ASCII, without a trailing dot.
    Domain(String),
    /// An IP literal (public).
    Ip(IpAddr),
}

/// A URL that passed [`check_url`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CheckedUrl {
    /// The URL as normalised by the parser: fetch this one.
    pub url: String,
    /// `http` or `https`.
    pub scheme: String,
    pub host: UrlHost,
    /// The port, the scheme's default when the URL names none.
    pub port: u16,
}

impl CheckedUrl {
    /// Refuses when the domain resolved to no address or to any address that is not public.
    pub fn check_resolved(&self, addrs: &[IpAddr]) -> Result<()> {
        if addrs.is_empty() {
            return Err(MediaError::UrlRefused(format!(
                "{} resolved to no address",
                self.host_str()
            )));
        }
        if let Some(ip) = addrs.iter().find(|ip| !is_public(**ip)) {
            return Err(MediaError::UrlRefused(format!(
                "{} resolves to {ip}, {}: only public addresses are fetched",
                self.host_str(),
                describe(*ip)
            )));
        }
        Ok(())
    }

    fn host_str(&self) -> String {
        match &self.host {
            UrlHost::Domain(d) => d.clone(),
            UrlHost::Ip(ip) => ip.to_string(),
        }
    }
}

/// Checks a media URL against the fetch policy; `allowed_domains` empty allows any host (still
/// refusing private addresses). An entry is a host name matched exactly (`example.com`), a
/// `*.example.com` matching the subdomains of example.com (not example.com itself), or an IP
/// address matched exactly.
pub fn check_url(url: &str, allowed_domains: &[String]) -> Result<CheckedUrl> {
    let refuse = |reason: String| Err(MediaError::UrlRefused(reason));
    let parsed = match url::Url::parse(url) {
        Ok(u) => u,
        Err(e) => return refuse(format!("not a valid URL ({e})")),
    };
    let scheme = parsed.scheme().to_string();
    if scheme != "http" && scheme != "https" {
        return refuse(format!(
            "the scheme is '{scheme}': only http and https URLs are fetched (send other media inline as a data: URL)"
        ));
    }
    if !parsed.username().is_empty() || parsed.password().is_some() {
        return refuse("the URL carries credentials (user:password@): remove them".to_string());
    }
    let host = match parsed.host() {
        Some(url::Host::Domain(d)) => {
            let d = d.trim_end_matches('.').to_ascii_lowercase();
            if d.is_empty() {
                return refuse("the URL has no host".to_string());
            }
            if d == "localhost" || d.ends_with(".localhost") {
                return refuse(format!("the host '{d}' is this machine"));
            }
            UrlHost::Domain(d)
        }
        Some(url::Host::Ipv4(ip)) => UrlHost::Ip(IpAddr::V4(ip)),
        Some(url::Host::Ipv6(ip)) => UrlHost::Ip(IpAddr::V6(ip)),
        None => return refuse("the URL has no host".to_string()),
    };
    if let UrlHost::Ip(ip) = host
        && !is_public(ip)
    {
        return refuse(format!(
            "the host {ip} is {}: only public addresses are fetched",
            describe(ip)
        ));
    }
    if !allowed_domains.is_empty() && !allowed_domains.iter().any(|a| host_matches(&host, a)) {
        let shown = match &host {
            UrlHost::Domain(d) => d.clone(),
            UrlHost::Ip(ip) => ip.to_string(),
        };
        return refuse(format!(
            "the host '{shown}' is not in the allowed media domains ({})",
            allowed_domains.join(", ")
        ));
    }
    let Some(port) = parsed.port_or_known_default() else {
        return refuse("the URL has no port".to_string());
    };
    Ok(CheckedUrl {
        url: parsed.to_string(),
        scheme,
        host,
        port,
    })
}

fn host_matches(host: &UrlHost, allowed: &str) -> bool {
    let allowed = allowed.trim().trim_end_matches('.').to_ascii_lowercase();
    match host {
        UrlHost::Domain(d) => match allowed.strip_prefix("*.") {
            Some(suffix) => {
                !suffix.is_empty() && d.len() > suffix.len() + 1 && {
                    d.ends_with(suffix) && d.as_bytes()[d.len() - suffix.len() - 1] == b'.'
                }
            }
            None => *d == allowed,
        },
        UrlHost::Ip(ip) => allowed
            .trim_start_matches('[')
            .trim_end_matches(']')
            .parse::<IpAddr>()
            .is_ok_and(|a| a == *ip),
    }
}

/// Whether `ip` is a public unicast address: not loopback, private (10/8, 172.16/12,
/// 192.168/16, fc00::/7), shared (CGNAT 100.64/10), link-local (169.254/16 — cloud metadata at
/// 169.254.169.254 — and fe80::/10), unspecified, multicast, broadcast, reserved or documentation
/// ranges; IPv6 addresses that embed an IPv4 one (mapped, compatible, NAT64, 6to4) are judged by
/// it, and IPv6 outside global unicast (2000::/3) is refused, as is Teredo.
pub fn is_public(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => is_public_v4(v4),
        IpAddr::V6(v6) => is_public_v6(v6),
    }
}

fn is_public_v4(ip: Ipv4Addr) -> bool {
    let [a, b, c, _] = ip.octets();
    !(a == 0 // "this network", 0.0.0.0
        || a == 10
        || a == 127
        || (a == 100 && (64..128).contains(&b)) // CGNAT 100.64/10
        || (a == 169 && b == 254)
        || (a == 172 && (16..32).contains(&b))
        || (a == 192 && b == 168)
        || (a == 192 && b == 0 && c == 0) // IETF protocol assignments
        || (a == 192 && b == 0 && c == 2) // TEST-NET-1
        || (a == 198 && (18..20).contains(&b)) // benchmarking
        || (a == 198 && b == 51 && c == 100) // TEST-NET-2
        || (a == 203 && b == 0 && c == 113) // TEST-NET-3
        || a >= 224) // multicast 224/4, reserved 240/4, broadcast
}

fn is_public_v6(ip: Ipv6Addr) -> bool {
    if let Some(v4) = ip.to_ipv4_mapped() {
        return is_public_v4(v4);
    }
    let s = ip.segments();
    let embedded = |hi: u16, lo: u16| Ipv4Addr::from((u32::from(hi) << 16) | u32::from(lo));
    if s[..6] == [0; 6] {
        // ::, ::1 and the deprecated IPv4-compatible ::a.b.c.d
        return false;
    }
    if s[..6] == [0x64, 0xff9b, 0, 0, 0, 0] {
        // NAT64: the gateway connects to the embedded IPv4 address.
        return is_public_v4(embedded(s[6], s[7]));
    }
    if s[0] == 0x2002 {
        // 6to4 embeds the IPv4 address of the site.
        return is_public_v4(embedded(s[1], s[2]));
    }
    if s[0] == 0x2001 && (s[1] == 0 || s[1] == 0x0db8) {
        // Teredo 2001::/32, documentation 2001:db8::/32
        return false;
    }
    (s[0] & 0xe000) == 0x2000
}

/// A word for why an address is not public, for the error message.
fn describe(ip: IpAddr) -> &'static str {
    let v4 = match ip {
        IpAddr::V4(v4) => Some(v4),
        IpAddr::V6(v6) => v6.to_ipv4_mapped(),
    };
    if let Some(v4) = v4 {
        return match v4.octets() {
            [127, ..] => "a loopback address",
            [10, ..] | [192, 168, ..] => "a private address",
            [172, b, ..] if (16..32).contains(&b) => "a private address",
            [169, 254, ..] => "a link-local address",
            [100, b, ..] if (64..128).contains(&b) => "a shared (CGNAT) address",
            [0, ..] => "an unspecified address",
            [a, ..] if (224..240).contains(&a) => "a multicast address",
            _ => "a reserved address",
        };
    }
    let IpAddr::V6(v6) = ip else {
        return "a reserved address";
    };
    let s0 = v6.segments()[0];
    if v6.is_loopback() {
        "a loopback address"
    } else if v6.is_unspecified() {
        "an unspecified address"
    } else if s0 & 0xfe00 == 0xfc00 {
        "a private (unique local) address"
    } else if s0 & 0xffc0 == 0xfe80 {
        "a link-local address"
    } else if s0 & 0xff00 == 0xff00 {
        "a multicast address"
    } else {
        "a reserved address"
    }
}
