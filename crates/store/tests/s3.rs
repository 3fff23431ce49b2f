//! Models from S3: a real S3 server on loopback (moto's, from PyPI) with signatures checked
//! (moto's IAM authentication on after the setup calls), credentials from the environment
//! and from a container credentials endpoint, and the errors that say which thing is wrong.
//! .ci/run installs moto[server] (tests/clients/requirements.txt).

use std::io::{Read, Write};
use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use lmi_store::s3::{S3Config, S3Uri};

struct Moto {
    child: Child,
    url: String,
}

impl Drop for Moto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn python() -> String {
    std::env::var("LMI_PYTHON").unwrap_or_else(|_| "python3".into())
}

/// moto's server (with the query-encoding fix of support/moto_server.py), with IAM
/// authentication from the 6th call on (the first five make the user, its key, a role and
/// their policies).
fn moto() -> Moto {
    let port = free_port();
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/support/moto_server.py");
    let child = Command::new(python())
        .args([script, "-H", "127.0.0.1", "-p", &port.to_string()])
        .env("INITIAL_NO_AUTH_ACTION_COUNT", "5")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("python3 with moto[server] (pip install -r tests/clients/requirements.txt)");
    let url = format!("http://127.0.0.1:{port}");
    let deadline = Instant::now() + Duration::from_secs(60);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            Instant::now() < deadline,
            "moto did not start (is moto[server] installed?)"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    Moto { child, url }
}

/// Makes an IAM user with S3 access, a bucket and the model's objects; returns the user's key
/// pair, then a role's temporary credentials (key, secret, session token).
fn setup(url: &str, files: &[(&str, Vec<u8>)], dir: &std::path::Path) -> Vec<String> {
    for (name, bytes) in files {
        let p = dir.join(name);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, bytes).unwrap();
    }
    let code = r#"
import sys, os, json, boto3
url, src = sys.argv[1], sys.argv[2]
anon = dict(endpoint_url=url, region_name="us-east-1", aws_access_key_id="setup", aws_secret_access_key="setup")
iam = boto3.client("iam", **anon)
iam.create_user(UserName="lmi")
key = iam.create_access_key(UserName="lmi")["AccessKey"]
policy = json.dumps({"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": ["s3:*", "sts:*"], "Resource": "*"}]})
iam.put_user_policy(UserName="lmi", PolicyName="s3", PolicyDocument=policy)
trust = json.dumps({"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Principal": {"AWS": "*"}, "Action": "sts:AssumeRole"}]})
role = iam.create_role(RoleName="pod", AssumeRolePolicyDocument=trust)["Role"]
iam.put_role_policy(RoleName="pod", PolicyName="s3", PolicyDocument=policy)
user = dict(endpoint_url=url, region_name="us-east-1", aws_access_key_id=key["AccessKeyId"], aws_secret_access_key=key["SecretAccessKey"])
s3 = boto3.client("s3", **user)
s3.create_bucket(Bucket="models")
s3.create_bucket(Bucket="empty")
for root, _, names in os.walk(src):
    for n in names:
        p = os.path.join(root, n)
        s3.upload_file(p, "models", "qwen3/" + os.path.relpath(p, src))
s3.put_object(Bucket="models", Key="qwen3-other/config.json", Body=b"{}")
# A pod's temporary credentials (with a session token), as a container endpoint hands out.
pod = boto3.client("sts", **user).assume_role(RoleArn=role["Arn"], RoleSessionName="pod-session")["Credentials"]
print(key["AccessKeyId"], key["SecretAccessKey"], pod["AccessKeyId"], pod["SecretAccessKey"], pod["SessionToken"])
"#;
    let out = Command::new(python())
        .args(["-c", code, url, dir.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .map(str::to_string)
        .collect()
}

fn config(url: &str, dir: &std::path::Path, vars: &[(&str, &str)]) -> S3Config {
    let mut all: Vec<(String, String)> = vars
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    all.push(("AWS_ENDPOINT_URL_S3".into(), url.into()));
    all.push(("SERVING_DOWNLOAD_DIR".into(), dir.to_str().unwrap().into()));
    all.push(("AWS_EC2_METADATA_DISABLED".into(), "true".into()));
    S3Config::from_vars(move |k| all.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone()))
}

/// A container credentials endpoint on loopback that answers `creds` to the right token.
fn credentials_endpoint(access: &str, secret: &str, session: &str, token: &'static str) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let body = format!(
        r#"{{"AccessKeyId": "{access}", "SecretAccessKey": "{secret}", "Token": "{session}", "Expiration": "2099-01-01T00:00:00Z"}}"#
    );
    std::thread::spawn(move || {
        for s in listener.incoming() {
            let Ok(mut s) = s else { continue };
            let mut buf = [0u8; 4096];
            let n = s.read(&mut buf).unwrap_or(0);
            let req = String::from_utf8_lossy(&buf[..n]).to_ascii_lowercase();
            let ok = req.contains(&format!("authorization: {token}"));
            let (status, b) = if ok {
                ("200 OK", body.clone())
            } else {
                ("401 Unauthorized", "{}".into())
            };
            let _ = write!(
                s,
                "HTTP/1.1 {status}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{b}",
                b.len()
            );
        }
    });
    format!("http://{addr}/v2/credentials")
}

#[test]
fn a_prefix_from_a_real_s3_server() {
    let moto = moto();
    let src = tempfile::tempdir().unwrap();
    let shard: Vec<u8> = (0..3_000_000u32).map(|i| (i % 253) as u8).collect();
    let files = vec![
        (
            "config.json",
            br#"{"architectures": ["LlamaForCausalLM"]}"#.to_vec(),
        ),
        (
            "serving.properties",
            b"option.max_rolling_batch_size=4\n".to_vec(),
        ),
        ("model.safetensors", shard.clone()),
        ("pytorch_model.bin", b"pickle".to_vec()),
        ("tokenizer/extra.json", b"{}".to_vec()),
    ];
    let keys = setup(&moto.url, &files, src.path());
    let (access, secret) = (keys[0].clone(), keys[1].clone());
    let uri = S3Uri::parse("s3://models/qwen3").unwrap();

    // Keys from the environment; the prefix as a folder (not qwen3-other/), pickles skipped.
    let out = tempfile::tempdir().unwrap();
    let env = [
        ("AWS_ACCESS_KEY_ID", access.as_str()),
        ("AWS_SECRET_ACCESS_KEY", secret.as_str()),
    ];
    let cfg = config(&moto.url, out.path(), &env);
    let d = lmi_store::s3::download(&cfg, &uri, false).unwrap();
    assert_eq!(d.dir, out.path());
    assert_eq!(
        std::fs::read(out.path().join("model.safetensors")).unwrap(),
        shard
    );
    assert_eq!(
        std::fs::read(out.path().join("tokenizer/extra.json")).unwrap(),
        b"{}"
    );
    assert!(out.path().join("serving.properties").is_file());
    assert!(!out.path().join("pytorch_model.bin").exists());
    assert!(!out.path().join("qwen3-other").exists());
    assert_eq!(d.fetched, d.bytes);
    // serving.properties alone (read before the model, as LMI does).
    let props = lmi_store::s3::properties(&cfg, &uri).unwrap().unwrap();
    assert_eq!(
        std::fs::read_to_string(props).unwrap(),
        "option.max_rolling_batch_size=4\n"
    );
    let none = lmi_store::s3::properties(&cfg, &S3Uri::parse("s3://models/qwen3-other/").unwrap())
        .unwrap();
    assert!(none.is_none());
    // Again: nothing fetched.
    assert_eq!(
        lmi_store::s3::download(&cfg, &uri, false).unwrap().fetched,
        0
    );

    // A role's temporary keys from a container credentials endpoint (EKS Pod Identity / ECS):
    // the session token signed along.
    let out2 = tempfile::tempdir().unwrap();
    let endpoint = credentials_endpoint(&keys[2], &keys[3], &keys[4], "pod-token");
    let env = [
        ("AWS_CONTAINER_CREDENTIALS_FULL_URI", endpoint.as_str()),
        ("AWS_CONTAINER_AUTHORIZATION_TOKEN", "pod-token"),
    ];
    let d = lmi_store::s3::download(&config(&moto.url, out2.path(), &env), &uri, false).unwrap();
    assert_eq!(
        std::fs::read(d.dir.join("model.safetensors")).unwrap(),
        shard
    );

    // What is wrong, said in one line each.
    let err = |uri: &str, env: &[(&str, &str)]| {
        let dir = tempfile::tempdir().unwrap();
        lmi_store::s3::download(
            &config(&moto.url, dir.path(), env),
            &S3Uri::parse(uri).unwrap(),
            false,
        )
        .unwrap_err()
        .to_string()
    };
    let good = [
        ("AWS_ACCESS_KEY_ID", access.as_str()),
        ("AWS_SECRET_ACCESS_KEY", secret.as_str()),
    ];
    let e = err(
        "s3://models/qwen3/",
        &[
            ("AWS_ACCESS_KEY_ID", access.as_str()),
            ("AWS_SECRET_ACCESS_KEY", "wrong"),
        ],
    );
    assert!(
        e.contains("denied") && e.contains("SignatureDoesNotMatch"),
        "{e}"
    );
    let e = err("s3://no-such-bucket/m/", &good);
    assert!(e.contains("there is no bucket no-such-bucket"), "{e}");
    let e = err("s3://empty/m/", &good);
    assert!(e.contains("holds no objects"), "{e}");
}
