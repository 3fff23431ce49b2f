//! Fetching http(s) media, only from the hosts option.allowed_media_domains names, and never
//! from an address that is not public: the URL is checked (`lmi_media::policy`), its host
//! resolved, every address checked, and the connection made to those addresses (no second
//! lookup a DNS rebinding could answer differently). No redirects; bytes, and time, capped.
//! A request's remote items are fetched before it is prepared and handed on as `data:` URLs.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use base64::Engine as _;
use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use hyper::client::conn::http1;
use hyper::{Request, header};
use hyper_util::rt::TokioIo;
use lmi_media::policy::{self, UrlHost};
use tokio::net::TcpStream;

/// How long one item may take, from lookup to the last byte.
const FETCH_TIMEOUT: Duration = Duration::from_secs(20);

/// Fetches `url` (an http or https URL) within the policy; the error says what to change.
pub async fn fetch(url: &str, allowed: &[String], max_bytes: usize) -> Result<Vec<u8>, String> {
    tokio::time::timeout(FETCH_TIMEOUT, fetch_inner(url, allowed, max_bytes))
        .await
        .map_err(|_| format!("fetching took longer than {} s", FETCH_TIMEOUT.as_secs()))?
}

async fn fetch_inner(url: &str, allowed: &[String], max_bytes: usize) -> Result<Vec<u8>, String> {
    if allowed.is_empty() {
        return Err("fetching media is off on this server".into());
    }
    let checked = policy::check_url(url, allowed).map_err(|e| e.to_string())?;
    let addrs: Vec<SocketAddr> = match &checked.host {
        UrlHost::Ip(ip) => vec![SocketAddr::new(*ip, checked.port)],
        UrlHost::Domain(d) => tokio::net::lookup_host((d.as_str(), checked.port))
            .await
            .map_err(|e| format!("cannot resolve {d}: {e}"))?
            .collect(),
    };
    let ips: Vec<IpAddr> = addrs.iter().map(|a| a.ip()).collect();
    checked.check_resolved(&ips).map_err(|e| e.to_string())?;
    let uri: hyper::Uri = checked.url.parse().map_err(|e| format!("{e}"))?;
    let target = Target {
        tls: (checked.scheme == "https").then(|| match &checked.host {
            UrlHost::Domain(d) => d.clone(),
            UrlHost::Ip(ip) => ip.to_string(),
        }),
        host: uri
            .authority()
            .map(|a| a.as_str().to_string())
            .unwrap_or_default(),
        path: uri.path_and_query().map_or("/", |p| p.as_str()).to_string(),
    };
    download(&addrs, &target, max_bytes).await
}

/// Where a checked URL is fetched from.
struct Target {
    /// https: the name the certificate must carry.
    tls: Option<String>,
    /// The Host header.
    host: String,
    path: String,
}

/// GETs `target` from `addrs` (already checked: this connects to them as they are).
async fn download(
    addrs: &[SocketAddr],
    target: &Target,
    max_bytes: usize,
) -> Result<Vec<u8>, String> {
    let tcp = TcpStream::connect(addrs)
        .await
        .map_err(|e| format!("cannot connect: {e}"))?;
    match &target.tls {
        Some(name) => {
            let tls = lmi_store::http::tls_connect(tcp, name)
                .await
                .map_err(|e| e.to_string())?;
            get(TokioIo::new(tls), &target.host, &target.path, max_bytes).await
        }
        None => get(TokioIo::new(tcp), &target.host, &target.path, max_bytes).await,
    }
}

async fn get<T>(io: TokioIo<T>, host: &str, path: &str, max_bytes: usize) -> Result<Vec<u8>, String>
where
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (mut sender, conn) = http1::handshake::<_, Empty<Bytes>>(io)
        .await
        .map_err(|e| format!("{e}"))?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    let req = Request::get(path)
        .header(header::HOST, host)
        .header(
            header::USER_AGENT,
            concat!("lmi/", env!("CARGO_PKG_VERSION")),
        )
        .body(Empty::new())
        .map_err(|e| format!("{e}"))?;
    let resp = sender.send_request(req).await.map_err(|e| format!("{e}"))?;
    let status = resp.status();
    if status.is_redirection() {
        return Err(format!(
            "the server answered {status} (a redirect): send the final URL"
        ));
    }
    if !status.is_success() {
        return Err(format!("the server answered {status}"));
    }
    let too_big = || format!("the item is larger than the {max_bytes} bytes allowed");
    if let Some(len) = resp
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<usize>().ok())
        && len > max_bytes
    {
        return Err(too_big());
    }
    let mut body = resp.into_body();
    let mut out = Vec::new();
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| format!("{e}"))?;
        if let Some(data) = frame.data_ref() {
            if out.len() + data.len() > max_bytes {
                return Err(too_big());
            }
            out.extend_from_slice(data);
        }
    }
    Ok(out)
}

/// Replaces every http(s) media URL of `urls` by a `data:` URL of the bytes fetched, when the
/// server fetches (`allowed` non-empty); the others are left for the loader to refuse.
pub async fn inline(
    urls: Vec<&mut String>,
    allowed: &[String],
    max_bytes: usize,
) -> Result<(), (String, String)> {
    if allowed.is_empty() {
        return Ok(());
    }
    for url in urls {
        if !(url.starts_with("http://") || url.starts_with("https://")) {
            continue;
        }
        let bytes = fetch(url, allowed, max_bytes)
            .await
            .map_err(|e| (url.clone(), e))?;
        *url = format!(
            "data:application/octet-stream;base64,{}",
            base64::engine::general_purpose::STANDARD.encode(bytes)
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// An HTTP server on 127.0.0.1 answering every connection with `response`; counts them.
    async fn serve(response: Vec<u8>) -> (SocketAddr, Arc<AtomicUsize>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let hits = Arc::new(AtomicUsize::new(0));
        let h = hits.clone();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                h.fetch_add(1, Ordering::SeqCst);
                let mut buf = [0u8; 4096];
                let _ = s.read(&mut buf).await;
                let _ = s.write_all(&response).await;
            }
        });
        (addr, hits)
    }

    fn ok(body: &[u8]) -> Vec<u8> {
        let mut r =
            format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n", body.len()).into_bytes();
        r.extend_from_slice(body);
        r
    }

    fn plain(path: &str) -> Target {
        Target {
            tls: None,
            host: "media.example".into(),
            path: path.into(),
        }
    }

    #[tokio::test]
    async fn downloads_within_the_size_limit_and_follows_no_redirect() {
        let (addr, _) = serve(ok(b"PNGDATA")).await;
        assert_eq!(
            download(&[addr], &plain("/a.png"), 100).await.unwrap(),
            b"PNGDATA"
        );
        let e = download(&[addr], &plain("/a.png"), 3).await.unwrap_err();
        assert!(e.contains("larger than the 3 bytes"), "{e}");
        let redirect =
            b"HTTP/1.1 302 Found\r\nLocation: http://10.0.0.1/\r\nContent-Length: 0\r\n\r\n";
        let (addr, _) = serve(redirect.to_vec()).await;
        let e = download(&[addr], &plain("/"), 100).await.unwrap_err();
        assert!(e.contains("redirect"), "{e}");
    }

    #[tokio::test]
    async fn never_connects_where_the_policy_refuses() {
        let (addr, hits) = serve(ok(b"x")).await;
        let url = format!("http://{addr}/a.png");
        // A loopback address, even when listed.
        let e = fetch(&url, &["127.0.0.1".into()], 100).await.unwrap_err();
        assert!(e.contains("loopback"), "{e}");
        // A host off the list; fetching off.
        let e = fetch("http://example.org/a.png", &["cdn.example.com".into()], 100)
            .await
            .unwrap_err();
        assert!(e.contains("example.org"), "{e}");
        let e = fetch(&url, &[], 100).await.unwrap_err();
        assert!(e.contains("off"), "{e}");
        let mut u = url.clone();
        let e = inline(vec![&mut u], &["127.0.0.1".into()], 100)
            .await
            .unwrap_err();
        assert!(e.1.contains("loopback"), "{e:?}");
        assert_eq!(u, url, "left as it was");
        assert_eq!(hits.load(Ordering::SeqCst), 0, "nothing fetched");
    }
}
