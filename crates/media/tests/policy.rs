//! The fetch policy for media URLs.

use std::net::IpAddr;

use lmi_media::MediaError;
use lmi_media::policy::{UrlHost, check_url, is_public};

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

#[test]
fn non_public_addresses_are_refused() {
    for a in [
        "127.0.0.1",
        "127.255.0.9",
        "10.0.0.1",
        "10.255.255.255",
        "172.16.0.1",
        "172.31.255.254",
        "192.168.1.1",
        "169.254.169.254",
        "169.254.0.1",
        "100.64.0.1",
        "100.127.255.255",
        "0.0.0.0",
        "0.1.2.3",
        "224.0.0.1",
        "239.255.255.250",
        "255.255.255.255",
        "240.0.0.1",
        "192.0.2.1",
        "198.51.100.7",
        "203.0.113.9",
        "198.18.0.1",
        "192.0.0.8",
        "::",
        "::1",
        "fc00::1",
        "fd12:3456::1",
        "fe80::1",
        "febf::1",
        "ff02::1",
        "fec0::1",
        "::ffff:127.0.0.1",
        "::ffff:10.1.2.3",
        "::ffff:169.254.169.254",
        "::ffff:192.168.0.1",
        "::ffff:100.64.1.1",
        "::127.0.0.1",
        "64:ff9b::a9fe:a9fe",
        "2002:c0a8:0101::1",
        "2001:db8::1",
        "2001:0:4136:e378:8000:63bf:3fff:fdd2",
        "100::1",
    ] {
        assert!(!is_public(ip(a)), "{a} must not be public");
    }
}

#[test]
fn public_addresses_pass() {
    for a in [
        "8.8.8.8",
        "1.1.1.1",
        "172.15.255.255",
        "172.32.0.1",
        "100.63.255.255",
        "100.128.0.1",
        "169.253.0.1",
        "192.169.0.1",
        "2606:4700:4700::1111",
        "2a00:1450:4001:80b::200e",
        "::ffff:8.8.8.8",
        "64:ff9b::808:808",
        "2002:0808:0808::1",
    ] {
        assert!(is_public(ip(a)), "{a} must be public");
    }
}

fn refused(url: &str, allowed: &[&str]) -> String {
    let allowed: Vec<String> = allowed.iter().map(|s| s.to_string()).collect();
    match check_url(url, &allowed) {
        Err(e @ MediaError::UrlRefused(_)) => {
            assert!(e.is_client_error());
            e.to_string()
        }
        other => panic!("{url}: expected UrlRefused, got {other:?}"),
    }
}

#[test]
fn private_hosts_in_every_spelling_are_refused() {
    for url in [
        "http://127.0.0.1/a.png",
        "http://localhost/a.png",
        "http://LOCALHOST./a.png",
        "http://foo.localhost/a.png",
        "http://[::1]:8080/a.png",
        "http://[::ffff:127.0.0.1]/",
        "http://[::ffff:a9fe:a9fe]/latest/meta-data",
        "http://169.254.169.254/latest/meta-data/",
        "http://2130706433/",
        "http://0x7f.1/",
        "http://0177.0.0.1/",
        "http://10.1/",
        "https://192.168.0.1:443/x.jpg",
        "http://[fe80::1%25eth0]/",
        "http://100.100.100.200/",
        "http://0.0.0.0:8000/",
    ] {
        let msg = refused(url, &[]);
        assert!(
            msg.contains("only public addresses")
                || msg.contains("this machine")
                || msg.contains("not a valid URL"),
            "{url}: {msg}"
        );
    }
    assert!(refused("http://169.254.169.254/", &[]).contains("link-local"));
    assert!(refused("http://10.0.0.1/", &[]).contains("private"));
    assert!(refused("http://[::1]/", &[]).contains("loopback"));
}

#[test]
fn schemes_and_credentials() {
    assert!(refused("file:///etc/passwd", &[]).contains("only http and https"));
    assert!(refused("ftp://example.com/a.png", &[]).contains("only http and https"));
    assert!(refused("gopher://example.com/", &[]).contains("only http and https"));
    assert!(refused("http://user:pw@example.com/a.png", &[]).contains("credentials"));
    assert!(refused("http://user@example.com/a.png", &[]).contains("credentials"));
    assert!(refused("not a url", &[]).contains("not a valid URL"));
    let ok = check_url("HTTPS://Example.COM./a%20b.png?x=1", &[]).unwrap();
    assert_eq!(ok.scheme, "https");
    assert_eq!(ok.host, UrlHost::Domain("example.com".to_string()));
    assert_eq!(ok.port, 443);
    assert_eq!(ok.url, "https://example.com./a%20b.png?x=1");
    assert_eq!(
        check_url("http://example.com:8080/", &[]).unwrap().port,
        8080
    );
}

#[test]
fn the_allow_list_matches_exact_hosts_and_star_suffixes() {
    let allowed = ["images.example.com", "*.cdn.example.org", "8.8.8.8"];
    let list: Vec<String> = allowed.iter().map(|s| s.to_string()).collect();
    for url in [
        "https://images.example.com/a.png",
        "https://IMAGES.example.com./a.png",
        "https://a.cdn.example.org/a.png",
        "https://a.b.cdn.example.org/a.png",
        "http://8.8.8.8/a.png",
    ] {
        assert!(check_url(url, &list).is_ok(), "{url} must be allowed");
    }
    for url in [
        "https://example.com/a.png",
        "https://evilimages.example.com/a.png",
        "https://images.example.com.evil.net/a.png",
        "https://cdn.example.org/a.png",
        "https://xcdn.example.org/a.png",
        "http://1.1.1.1/a.png",
    ] {
        assert!(
            refused(url, &allowed).contains("not in the allowed media domains"),
            "{url}"
        );
    }
    // A private address stays refused even when listed.
    assert!(refused("http://10.0.0.1/", &["10.0.0.1"]).contains("private"));
}

#[test]
fn resolved_addresses_are_checked() {
    let url = check_url("https://example.com/a.png", &[]).unwrap();
    assert!(url.check_resolved(&[ip("93.184.216.34")]).is_ok());
    let e = url
        .check_resolved(&[ip("93.184.216.34"), ip("10.0.0.5")])
        .unwrap_err();
    assert!(e.to_string().contains("resolves to 10.0.0.5"), "{e}");
    assert!(url.check_resolved(&[]).is_err());
}
