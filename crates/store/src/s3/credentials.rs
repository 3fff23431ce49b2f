//! AWS credentials, found the way the SDKs look for them: the environment, the shared
//! credentials file, web identity (EKS IRSA), the container endpoint (ECS, EKS Pod Identity),
//! then the instance metadata service (IMDSv2). None found: requests go unsigned (public
//! buckets), and a refusal says where we looked.

use std::path::PathBuf;
use std::time::Duration;

use hyper::Method;
use hyper::body::Bytes;
use url::Url;

use super::xml;
use crate::http::{self, FetchError};

/// The link-local container credentials host (ECS) for a relative URI.
const ECS_HOST: &str = "http://169.254.170.2";
const IMDS_DEFAULT: &str = "http://169.254.169.254";
/// The metadata services answer at once where they exist; elsewhere, do not wait for them.
const METADATA_TIMEOUT: Duration = Duration::from_secs(2);

#[derive(Clone)]
pub struct Credentials {
    pub access_key: String,
    pub secret_key: String,
    pub session_token: Option<String>,
    /// As the source wrote it (ISO 8601), for the log.
    pub expires: Option<String>,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Credentials({}…)",
            &self.access_key[..self.access_key.len().min(4)]
        )
    }
}

/// The variables the chain reads (a snapshot, so tests need not touch the process's).
#[derive(Debug, Clone, Default)]
pub struct CredentialEnv {
    vars: std::collections::BTreeMap<String, String>,
}

const VARS: &[&str] = &[
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_PROFILE",
    "AWS_SHARED_CREDENTIALS_FILE",
    "HOME",
    "AWS_WEB_IDENTITY_TOKEN_FILE",
    "AWS_ROLE_ARN",
    "AWS_ROLE_SESSION_NAME",
    "AWS_ENDPOINT_URL_STS",
    "AWS_ENDPOINT_URL",
    "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
    "AWS_CONTAINER_CREDENTIALS_FULL_URI",
    "AWS_CONTAINER_AUTHORIZATION_TOKEN",
    "AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE",
    "AWS_EC2_METADATA_DISABLED",
    "AWS_EC2_METADATA_SERVICE_ENDPOINT",
];

impl CredentialEnv {
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> Self {
        CredentialEnv {
            vars: VARS
                .iter()
                .filter_map(|k| var(k).filter(|v| !v.is_empty()).map(|v| (k.to_string(), v)))
                .collect(),
        }
    }

    fn get(&self, k: &str) -> Option<&str> {
        self.vars.get(k).map(String::as_str)
    }
}

/// The first credentials the chain finds, and where; None when there are none to find.
pub(crate) async fn find(
    env: &CredentialEnv,
    region: &str,
) -> Result<Option<(Credentials, &'static str)>, FetchError> {
    if let (Some(a), Some(s)) = (
        env.get("AWS_ACCESS_KEY_ID"),
        env.get("AWS_SECRET_ACCESS_KEY"),
    ) {
        let c = Credentials {
            access_key: a.to_string(),
            secret_key: s.to_string(),
            session_token: env.get("AWS_SESSION_TOKEN").map(str::to_string),
            expires: None,
        };
        return Ok(Some((c, "the environment (AWS_ACCESS_KEY_ID)")));
    }
    if let Some(c) = shared_file(env) {
        return Ok(Some((c, "the shared credentials file")));
    }
    if let (Some(file), Some(role)) = (
        env.get("AWS_WEB_IDENTITY_TOKEN_FILE"),
        env.get("AWS_ROLE_ARN"),
    ) {
        return web_identity(env, file, role, region)
            .await
            .map(|c| Some((c, "web identity (AWS_WEB_IDENTITY_TOKEN_FILE)")));
    }
    if let Some(url) = container_url(env) {
        return container(env, &url)
            .await
            .map(|c| Some((c, "the container credentials endpoint")));
    }
    if env
        .get("AWS_EC2_METADATA_DISABLED")
        .is_some_and(|v| v.eq_ignore_ascii_case("true"))
    {
        return Ok(None);
    }
    let base = env
        .get("AWS_EC2_METADATA_SERVICE_ENDPOINT")
        .unwrap_or(IMDS_DEFAULT);
    match tokio::time::timeout(METADATA_TIMEOUT * 3, imds(base)).await {
        Ok(Ok(c)) => Ok(Some((c, "the instance metadata service"))),
        // Not on EC2 (or no role): no credentials, not an error.
        _ => Ok(None),
    }
}

/// `[profile]` (AWS_PROFILE, else default) of `~/.aws/credentials`.
fn shared_file(env: &CredentialEnv) -> Option<Credentials> {
    let path = env
        .get("AWS_SHARED_CREDENTIALS_FILE")
        .map(PathBuf::from)
        .or_else(|| {
            env.get("HOME")
                .map(|h| PathBuf::from(h).join(".aws").join("credentials"))
        })?;
    let text = std::fs::read_to_string(path).ok()?;
    let profile = env.get("AWS_PROFILE").unwrap_or("default");
    let mut in_profile = false;
    let (mut a, mut s, mut t) = (None, None, None);
    for line in text.lines() {
        let line = line.trim();
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            in_profile = name.trim() == profile;
            continue;
        }
        if !in_profile {
            continue;
        }
        if let Some((k, v)) = line.split_once('=') {
            let v = Some(v.trim().to_string());
            match k.trim() {
                "aws_access_key_id" => a = v,
                "aws_secret_access_key" => s = v,
                "aws_session_token" => t = v,
                _ => {}
            }
        }
    }
    Some(Credentials {
        access_key: a?,
        secret_key: s?,
        session_token: t,
        expires: None,
    })
}

async fn web_identity(
    env: &CredentialEnv,
    file: &str,
    role: &str,
    region: &str,
) -> Result<Credentials, FetchError> {
    let token = std::fs::read_to_string(file)
        .map_err(|e| FetchError::fatal(format!("AWS_WEB_IDENTITY_TOKEN_FILE {file}: {e}")))?;
    let base = env
        .get("AWS_ENDPOINT_URL_STS")
        .or_else(|| env.get("AWS_ENDPOINT_URL"))
        .map(|s| s.trim_end_matches('/').to_string())
        .unwrap_or_else(|| format!("https://sts.{region}.amazonaws.com"));
    let session = env.get("AWS_ROLE_SESSION_NAME").unwrap_or("lmi");
    let mut url = Url::parse(&format!("{base}/"))
        .map_err(|e| FetchError::fatal(format!("the STS endpoint {base}: {e}")))?;
    url.query_pairs_mut()
        .append_pair("Action", "AssumeRoleWithWebIdentity")
        .append_pair("Version", "2011-06-15")
        .append_pair("RoleArn", role)
        .append_pair("RoleSessionName", session)
        .append_pair("WebIdentityToken", token.trim());
    let body = get_text(Method::GET, &url, &[]).await?;
    let creds = xml::first(&body, "Credentials").ok_or_else(|| {
        FetchError::fatal(format!(
            "STS AssumeRoleWithWebIdentity for {role}: {}",
            xml::error_text(&body)
        ))
    })?;
    let field = |k: &str| xml::first(creds, k).map(xml::unescape);
    Ok(Credentials {
        access_key: field("AccessKeyId").unwrap_or_default(),
        secret_key: field("SecretAccessKey").unwrap_or_default(),
        session_token: field("SessionToken"),
        expires: field("Expiration"),
    })
}

fn container_url(env: &CredentialEnv) -> Option<String> {
    env.get("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI")
        .map(|r| format!("{ECS_HOST}{r}"))
        .or_else(|| {
            env.get("AWS_CONTAINER_CREDENTIALS_FULL_URI")
                .map(str::to_string)
        })
}

async fn container(env: &CredentialEnv, url: &str) -> Result<Credentials, FetchError> {
    let u = Url::parse(url)
        .map_err(|e| FetchError::fatal(format!("container credentials URI {url}: {e}")))?;
    let token = match env.get("AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE") {
        Some(f) => Some(
            std::fs::read_to_string(f)
                .map_err(|e| {
                    FetchError::fatal(format!("AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE {f}: {e}"))
                })?
                .trim()
                .to_string(),
        ),
        None => env
            .get("AWS_CONTAINER_AUTHORIZATION_TOKEN")
            .map(str::to_string),
    };
    let headers: Vec<(&str, String)> = token.into_iter().map(|t| ("authorization", t)).collect();
    let body = tokio::time::timeout(METADATA_TIMEOUT * 5, get_text(Method::GET, &u, &headers))
        .await
        .map_err(|_| {
            FetchError::transient(format!(
                "the container credentials endpoint {url} did not answer"
            ))
        })??;
    json_credentials(&body).ok_or_else(|| {
        FetchError::fatal(format!(
            "the container credentials endpoint {url} answered without credentials"
        ))
    })
}

/// `{"AccessKeyId", "SecretAccessKey", "Token", "Expiration"}` (container endpoint and IMDS).
fn json_credentials(body: &str) -> Option<Credentials> {
    let v: serde_json::Value = serde_json::from_str(body).ok()?;
    let s = |k: &str| v.get(k)?.as_str().map(str::to_string);
    Some(Credentials {
        access_key: s("AccessKeyId")?,
        secret_key: s("SecretAccessKey")?,
        session_token: s("Token"),
        expires: s("Expiration"),
    })
}

async fn imds(base: &str) -> Result<Credentials, FetchError> {
    let base = base.trim_end_matches('/');
    let url = |p: &str| {
        Url::parse(&format!("{base}{p}")).map_err(|e| FetchError::fatal(format!("{base}: {e}")))
    };
    let token = tokio::time::timeout(
        METADATA_TIMEOUT,
        get_text(
            Method::PUT,
            &url("/latest/api/token")?,
            &[("x-aws-ec2-metadata-token-ttl-seconds", "21600".into())],
        ),
    )
    .await
    .map_err(|_| FetchError::transient("no instance metadata service"))??;
    let h = [("x-aws-ec2-metadata-token", token.trim().to_string())];
    let roles = get_text(
        Method::GET,
        &url("/latest/meta-data/iam/security-credentials/")?,
        &h,
    )
    .await?;
    let role = roles
        .lines()
        .next()
        .map(str::trim)
        .filter(|r| !r.is_empty())
        .ok_or_else(|| FetchError::fatal("the instance has no IAM role"))?;
    let body = get_text(
        Method::GET,
        &url(&format!(
            "/latest/meta-data/iam/security-credentials/{role}"
        ))?,
        &h,
    )
    .await?;
    json_credentials(&body).ok_or_else(|| {
        FetchError::fatal("the instance metadata service answered without credentials")
    })
}

async fn get_text(
    method: Method,
    url: &Url,
    headers: &[(&str, String)],
) -> Result<String, FetchError> {
    let mut resp = http::send(method, url, headers, Bytes::new()).await?;
    let status = resp.status();
    let body = http::read_body(resp.body_mut(), 1 << 20).await?;
    let text = String::from_utf8_lossy(&body).into_owned();
    if !status.is_success() {
        return Err(FetchError {
            message: format!(
                "{url} answered {status}: {}",
                text.chars().take(300).collect::<String>()
            ),
            transient: status.is_server_error(),
        });
    }
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(vars: &[(&str, &str)]) -> CredentialEnv {
        let m: std::collections::HashMap<&str, &str> = vars.iter().copied().collect();
        CredentialEnv::from_vars(|k| m.get(k).map(|v| v.to_string()))
    }

    #[test]
    fn environment_then_shared_file() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("credentials");
        std::fs::write(&file, "[default]\naws_access_key_id = AKDEF\naws_secret_access_key = sdef\n[dev]\naws_access_key_id=AKDEV\naws_secret_access_key=sdev\naws_session_token=tdev\n").unwrap();
        let f = file.to_str().unwrap();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let found = |e: CredentialEnv| {
            rt.block_on(find(&e, "us-east-1"))
                .unwrap()
                .map(|(c, from)| (c.access_key, c.session_token, from))
        };
        let e = env(&[
            ("AWS_ACCESS_KEY_ID", "AKENV"),
            ("AWS_SECRET_ACCESS_KEY", "s"),
            ("AWS_SHARED_CREDENTIALS_FILE", f),
        ]);
        assert_eq!(found(e).unwrap().0, "AKENV");
        let e = env(&[
            ("AWS_SHARED_CREDENTIALS_FILE", f),
            ("AWS_EC2_METADATA_DISABLED", "true"),
        ]);
        assert_eq!(found(e).unwrap().0, "AKDEF");
        let e = env(&[("AWS_SHARED_CREDENTIALS_FILE", f), ("AWS_PROFILE", "dev")]);
        assert_eq!(found(e).unwrap().1.as_deref(), Some("tdev"));
        let e = env(&[("AWS_EC2_METADATA_DISABLED", "true")]);
        assert!(found(e).is_none());
    }

    #[test]
    fn container_and_imds_json() {
        let c = json_credentials(r#"{"AccessKeyId":"AK","SecretAccessKey":"S","Token":"T","Expiration":"2026-12-06T10:00:00Z"}"#).unwrap();
        assert_eq!(
            (c.access_key.as_str(), c.session_token.as_deref()),
            ("AK", Some("T"))
        );
        assert!(json_credentials("{}").is_none());
    }
}
