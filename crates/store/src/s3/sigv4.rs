//! AWS Signature Version 4 for the few S3 requests we send (GET and HEAD, empty bodies).

use sha2::{Digest, Sha256};

use super::credentials::Credentials;

/// SHA-256 of an empty payload.
const EMPTY_SHA256: &str = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn sha256(data: &[u8]) -> [u8; 32] {
    Sha256::digest(data).into()
}

/// HMAC-SHA256 (RFC 2104).
fn hmac(key: &[u8], data: &[u8]) -> [u8; 32] {
    let mut k = [0u8; 64];
    if key.len() > 64 {
        k[..32].copy_from_slice(&sha256(key));
    } else {
        k[..key.len()].copy_from_slice(key);
    }
    let mut inner = Sha256::new();
    inner.update(k.map(|b| b ^ 0x36));
    inner.update(data);
    let mut outer = Sha256::new();
    outer.update(k.map(|b| b ^ 0x5c));
    outer.update(inner.finalize());
    outer.finalize().into()
}

/// RFC 3986 encoding as SigV4 wants it: unreserved characters kept, `/` kept when `path`.
pub(crate) fn uri_encode(s: &str, path: bool) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                out.push(b as char)
            }
            b'/' if path => out.push('/'),
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

/// The headers that sign a request: `x-amz-date`, `x-amz-content-sha256`, the session token
/// when there is one, and `authorization`. `path` is already encoded; `query` pairs unencoded.
pub(crate) fn sign(
    creds: &Credentials,
    region: &str,
    method: &str,
    host: &str,
    path: &str,
    query: &[(String, String)],
    amz_date: &str,
) -> Vec<(&'static str, String)> {
    let date = &amz_date[..8];
    let mut q: Vec<(String, String)> = query
        .iter()
        .map(|(k, v)| (uri_encode(k, false), uri_encode(v, false)))
        .collect();
    q.sort();
    let canonical_query = q
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join("&");
    let mut headers: Vec<(&'static str, String)> = vec![
        ("host", host.to_string()),
        ("x-amz-content-sha256", EMPTY_SHA256.to_string()),
        ("x-amz-date", amz_date.to_string()),
    ];
    if let Some(t) = &creds.session_token {
        headers.push(("x-amz-security-token", t.clone()));
    }
    let signed: Vec<&str> = headers.iter().map(|(k, _)| *k).collect();
    let signed = signed.join(";");
    let canonical_headers: String = headers
        .iter()
        .map(|(k, v)| format!("{k}:{}\n", v.trim()))
        .collect();
    let canonical = format!(
        "{method}\n{path}\n{canonical_query}\n{canonical_headers}\n{signed}\n{EMPTY_SHA256}"
    );
    let scope = format!("{date}/{region}/s3/aws4_request");
    let to_sign = format!(
        "AWS4-HMAC-SHA256\n{amz_date}\n{scope}\n{}",
        hex(&sha256(canonical.as_bytes()))
    );
    let k = hmac(
        format!("AWS4{}", creds.secret_key).as_bytes(),
        date.as_bytes(),
    );
    let k = hmac(&k, region.as_bytes());
    let k = hmac(&k, b"s3");
    let k = hmac(&k, b"aws4_request");
    let signature = hex(&hmac(&k, to_sign.as_bytes()));
    headers.retain(|(k, _)| *k != "host"); // the client sends Host itself
    headers.push((
        "authorization",
        format!(
            "AWS4-HMAC-SHA256 Credential={}/{scope}, SignedHeaders={signed}, Signature={signature}",
            creds.access_key
        ),
    ));
    headers
}

/// `YYYYMMDDTHHMMSSZ` for a Unix time.
pub(crate) fn amz_date(unix: u64) -> String {
    let days = (unix / 86400) as i64;
    let secs = unix % 86400;
    // Civil from days (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}{m:02}{d:02}T{:02}{:02}{:02}Z",
        secs / 3600,
        secs / 60 % 60,
        secs % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hmac_matches_rfc_4231() {
        // Test case 2.
        assert_eq!(
            hex(&hmac(b"Jefe", b"what do ya want for nothing?")),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }

    #[test]
    fn signs_as_botocore_does() {
        // Signatures botocore's S3SigV4Auth computes for the same requests at 2013-05-24
        // 00:00:00 with AWS's documentation key pair.
        let creds = Credentials {
            access_key: "AKIAIOSFODNN7EXAMPLE".into(),
            secret_key: "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY".into(),
            session_token: None,
            expires: None,
        };
        let signature = |host: &str, path: &str, query: &[(String, String)]| {
            let h = sign(
                &creds,
                "us-east-1",
                "GET",
                host,
                path,
                query,
                "20130524T000000Z",
            );
            let auth = &h.iter().find(|(k, _)| *k == "authorization").unwrap().1;
            assert!(auth.starts_with("AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request, SignedHeaders=host;x-amz-content-sha256;x-amz-date, Signature="), "{auth}");
            auth.rsplit('=').next().unwrap().to_string()
        };
        assert_eq!(
            signature("examplebucket.s3.amazonaws.com", "/test.txt", &[]),
            "df548e2ce037944d03f3e68682813b093763996d597cf890ca3d9037fd231eb4"
        );
        let list = [
            ("list-type".to_string(), "2".to_string()),
            ("prefix".to_string(), "qwen3/".to_string()),
        ];
        assert_eq!(
            signature("127.0.0.1:9000", "/models/", &list),
            "3e0e5ef01e397466f509f1c76a5dc323649741bc9234ea4490b5cb00c2d81e39"
        );
        assert_eq!(amz_date(1_369_353_600), "20130524T000000Z");
        assert_eq!(amz_date(951_782_400 + 86_399), "20000229T235959Z");
        assert_eq!(uri_encode("a b/c~", true), "a%20b/c~");
        assert_eq!(uri_encode("a/b", false), "a%2Fb");
    }
}
