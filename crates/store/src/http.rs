//! A small HTTP/1.1 client for fetching models (the Hub, S3) and media: one connection per
//! request over TCP or rustls (ring, Mozilla's roots), bodies streamed frame by frame, no
//! pooling. Redirects and retries are left to the caller, because what a redirect keeps (the
//! token) and what is worth retrying are the caller's rules.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::client::conn::http1;
use hyper::{Method, Request, Response, header};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use url::Url;

/// How long connecting may take, and how long a body may go without a byte.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(60);

pub const USER_AGENT: &str = concat!("lmi/", env!("CARGO_PKG_VERSION"));

/// A failed exchange; `transient` when trying again may help (connection refused or cut,
/// a timeout), as opposed to a URL that cannot be used.
#[derive(Debug, Clone)]
pub struct FetchError {
    pub message: String,
    pub transient: bool,
}

impl std::fmt::Display for FetchError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl FetchError {
    pub(crate) fn fatal(message: impl Into<String>) -> Self {
        FetchError {
            message: message.into(),
            transient: false,
        }
    }

    pub(crate) fn transient(message: impl Into<String>) -> Self {
        FetchError {
            message: message.into(),
            transient: true,
        }
    }
}

/// The TLS client configuration every https fetch shares.
fn tls_connector() -> tokio_rustls::TlsConnector {
    static CONFIG: OnceLock<Arc<rustls::ClientConfig>> = OnceLock::new();
    let config = CONFIG.get_or_init(|| {
        let roots = rustls::RootCertStore {
            roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
        };
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map(|b| b.with_root_certificates(roots).with_no_client_auth());
        Arc::new(config.unwrap_or_else(|_| {
            // The ring provider supports the default versions; this is unreachable.
            rustls::ClientConfig::builder_with_provider(Arc::new(
                rustls::crypto::ring::default_provider(),
            ))
            .with_protocol_versions(&[&rustls::version::TLS13])
            .expect("TLS 1.3 with ring")
            .with_root_certificates(rustls::RootCertStore::empty())
            .with_no_client_auth()
        }))
    });
    tokio_rustls::TlsConnector::from(config.clone())
}

/// TLS over `tcp`, checking the certificate names `host`.
pub async fn tls_connect(
    tcp: TcpStream,
    host: &str,
) -> Result<tokio_rustls::client::TlsStream<TcpStream>, FetchError> {
    let name = rustls::pki_types::ServerName::try_from(host.to_string())
        .map_err(|e| FetchError::fatal(format!("{host}: {e}")))?;
    tls_connector()
        .connect(name, tcp)
        .await
        .map_err(|e| FetchError::transient(format!("TLS with {host}: {e}")))
}

/// Sends one request to `url` and returns the response with its body unread.
pub async fn send(
    method: Method,
    url: &Url,
    headers: &[(&str, String)],
    body: Bytes,
) -> Result<Response<Incoming>, FetchError> {
    let host = url
        .host_str()
        .ok_or_else(|| FetchError::fatal(format!("{url} has no host")))?;
    let tls = match url.scheme() {
        "https" => true,
        "http" => false,
        other => {
            return Err(FetchError::fatal(format!(
                "{url}: unsupported scheme {other}"
            )));
        }
    };
    let port = url
        .port_or_known_default()
        .unwrap_or(if tls { 443 } else { 80 });
    // IPv6 literals come bracketed from `host_str`; the socket address wants them bare.
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    let tcp = tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect((bare, port)))
        .await
        .map_err(|_| FetchError::transient(format!("connecting to {host}:{port} timed out")))?
        .map_err(|e| FetchError::transient(format!("cannot connect to {host}:{port}: {e}")))?;
    let _ = tcp.set_nodelay(true);
    let authority = match url.port() {
        Some(p) => format!("{host}:{p}"),
        None => host.to_string(),
    };
    let path = match url.query() {
        Some(q) => format!("{}?{q}", url.path()),
        None => url.path().to_string(),
    };
    let mut req = Request::builder()
        .method(method)
        .uri(path)
        .header(header::HOST, authority)
        .header(header::USER_AGENT, USER_AGENT);
    for (k, v) in headers {
        req = req.header(*k, v);
    }
    let req = req
        .body(Full::new(body))
        .map_err(|e| FetchError::fatal(format!("{url}: {e}")))?;
    if tls {
        exchange(TokioIo::new(tls_connect(tcp, bare).await?), req).await
    } else {
        exchange(TokioIo::new(tcp), req).await
    }
}

async fn exchange<T>(
    io: TokioIo<T>,
    req: Request<Full<Bytes>>,
) -> Result<Response<Incoming>, FetchError>
where
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (mut sender, conn) = http1::handshake::<_, Full<Bytes>>(io)
        .await
        .map_err(|e| FetchError::transient(format!("{e}")))?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    tokio::time::timeout(IDLE_TIMEOUT, sender.send_request(req))
        .await
        .map_err(|_| FetchError::transient("no answer within a minute"))?
        .map_err(|e| FetchError::transient(format!("{e}")))
}

/// The next chunk of a body: None at its end; an error when it was cut or went idle.
pub async fn next_chunk(body: &mut Incoming) -> Result<Option<Bytes>, FetchError> {
    loop {
        let frame = tokio::time::timeout(IDLE_TIMEOUT, body.frame())
            .await
            .map_err(|_| FetchError::transient("the transfer stalled for a minute"))?;
        match frame {
            None => return Ok(None),
            Some(Err(e)) => return Err(FetchError::transient(format!("transfer cut: {e}"))),
            Some(Ok(f)) => {
                if let Ok(data) = f.into_data() {
                    return Ok(Some(data));
                }
            }
        }
    }
}

/// A whole (small) body, at most `max` bytes.
pub async fn read_body(body: &mut Incoming, max: usize) -> Result<Vec<u8>, FetchError> {
    let mut out = Vec::new();
    while let Some(chunk) = next_chunk(body).await? {
        if out.len() + chunk.len() > max {
            return Err(FetchError::fatal(format!(
                "the answer is larger than the {max} bytes expected"
            )));
        }
        out.extend_from_slice(&chunk);
    }
    Ok(out)
}

/// A response header as text.
pub fn header_str<'a>(resp: &'a Response<Incoming>, name: &str) -> Option<&'a str> {
    resp.headers().get(name).and_then(|v| v.to_str().ok())
}
