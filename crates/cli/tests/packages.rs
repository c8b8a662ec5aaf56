//! The package managers agents use most, pip and npm, inside `capgate run`: they install
//! through the gateway from registries a kit grants with bounded rules (so their TLS is
//! intercepted, and each must trust capgate's CA through the variables the sandbox sets),
//! and what the rules do not grant is answered 403, recorded, and never reaches the
//! registry. The registries are local HTTPS servers (a test CA, names mapped with
//! `--dangerously-resolve`).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "tests"
)]

use std::collections::BTreeMap;
use std::io::{BufRead as _, BufReader};
use std::net::TcpListener;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};

use capgate_gateway::tls::CertificateAuthority;

const BIN: &str = env!("CARGO_BIN_EXE_capgate");

/// Path → (content type, body).
type Files = Arc<Mutex<BTreeMap<String, (&'static str, Vec<u8>)>>>;
/// The request lines a registry received.
type Seen = Arc<Mutex<Vec<String>>>;

/// A static HTTPS server for `name` (certificate from `ca`) serving `files`, 404 otherwise.
fn registry(ca: &CertificateAuthority, name: &str, files: &Files) -> (u16, Seen) {
    let config = ca.server_config_for(name).unwrap();
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let seen: Seen = Arc::default();
    let (s2, f2) = (Arc::clone(&seen), Arc::clone(files));
    std::thread::spawn(move || {
        for stream in l.incoming().flatten() {
            let (seen, files, config) = (Arc::clone(&s2), Arc::clone(&f2), Arc::clone(&config));
            std::thread::spawn(move || {
                let Ok(conn) = rustls::ServerConnection::new(config) else {
                    return;
                };
                serve(rustls::StreamOwned::new(conn, stream), &seen, &files);
            });
        }
    });
    (port, seen)
}

fn serve<S: std::io::Read + std::io::Write>(stream: S, seen: &Seen, files: &Files) {
    let mut r = BufReader::new(stream);
    loop {
        let mut request = String::new();
        loop {
            let mut line = String::new();
            if r.read_line(&mut line).unwrap_or(0) == 0 {
                return;
            }
            if line == "\r\n" {
                break;
            }
            if request.is_empty() {
                request = line.trim_end().to_owned();
            }
        }
        let path = request.split_whitespace().nth(1).unwrap_or("/").to_owned();
        seen.lock().unwrap().push(request);
        let found = files.lock().unwrap().get(&path).cloned();
        let (status, kind, body) = match found {
            Some((kind, body)) => ("200 OK", kind, body),
            None => ("404 Not Found", "text/plain", b"not here\n".to_vec()),
        };
        let head = format!(
            "HTTP/1.1 {status}\r\nContent-Type: {kind}\r\nContent-Length: {}\r\n\r\n",
            body.len()
        );
        let stream = r.get_mut();
        if stream.write_all(head.as_bytes()).is_err() || stream.write_all(&body).is_err() {
            return;
        }
    }
}

/// A wheel of the package `tinypkg` 1.0 (`tinypkg.VALUE == 42`) and an npm tarball of
/// `tinynpm` 1.0.0 (`module.exports = 42`), made by the host's python3 and tar in `dir`.
fn packages(dir: &Path) -> (Vec<u8>, Vec<u8>) {
    let script = r#"
import base64, hashlib, sys, zipfile
files = {
    "tinypkg/__init__.py": b"VALUE = 42\n",
    "tinypkg-1.0.dist-info/METADATA": b"Metadata-Version: 2.1\nName: tinypkg\nVersion: 1.0\n",
    "tinypkg-1.0.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: capgate-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
}
record = []
for name, data in files.items():
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    record.append(f"{name},sha256={digest},{len(data)}")
record.append("tinypkg-1.0.dist-info/RECORD,,")
files["tinypkg-1.0.dist-info/RECORD"] = ("\n".join(record) + "\n").encode()
with zipfile.ZipFile(sys.argv[1], "w") as z:
    for name, data in files.items():
        z.writestr(name, data)
"#;
    let wheel = dir.join("tinypkg-1.0-py3-none-any.whl");
    let ok = Command::new("python3")
        .args(["-c", script])
        .arg(&wheel)
        .status()
        .unwrap();
    assert!(ok.success());
    let npm = dir.join("npm/package");
    std::fs::create_dir_all(&npm).unwrap();
    std::fs::write(
        npm.join("package.json"),
        r#"{"name":"tinynpm","version":"1.0.0","main":"index.js"}"#,
    )
    .unwrap();
    std::fs::write(npm.join("index.js"), "module.exports = 42;\n").unwrap();
    let tarball = dir.join("tinynpm-1.0.0.tgz");
    let ok = Command::new("tar")
        .arg("-C")
        .arg(dir.join("npm"))
        .arg("-czf")
        .arg(&tarball)
        .arg("package")
        .status()
        .unwrap();
    assert!(ok.success());
    (
        std::fs::read(wheel).unwrap(),
        std::fs::read(tarball).unwrap(),
    )
}

/// `sha512-BASE64` of `data`, as npm's `integrity` says it (by the host's python3).
fn integrity(dir: &Path, data: &[u8]) -> String {
    let file = dir.join("integrity-of");
    std::fs::write(&file, data).unwrap();
    let out = Command::new("python3")
        .args([
            "-c",
            "import base64,hashlib,sys; print('sha512-' + base64.b64encode(hashlib.sha512(open(sys.argv[1],'rb').read()).digest()).decode())",
        ])
        .arg(&file)
        .output()
        .unwrap();
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

#[test]
fn pip_and_npm_install_from_granted_registries_and_are_refused_elsewhere() {
    let tmp = tempfile::tempdir().unwrap();
    let path = |p: &str| tmp.path().join(p);
    std::fs::create_dir_all(path("ws")).unwrap();
    std::fs::create_dir_all(path("kit")).unwrap();
    let up_ca = CertificateAuthority::load_or_create(&path("upstream-ca")).unwrap();
    let (pypi_files, npm_files): (Files, Files) = (Arc::default(), Arc::default());
    let (pypi, pypi_seen) = registry(&up_ca, "pypi.test", &pypi_files);
    let (npm, npm_seen) = registry(&up_ca, "registry.test", &npm_files);

    let (wheel, tarball) = packages(tmp.path());
    {
        let index = r#"<html><body><a href="/packages/tinypkg-1.0-py3-none-any.whl">tinypkg-1.0-py3-none-any.whl</a></body></html>"#;
        let mut f = pypi_files.lock().unwrap();
        f.insert("/simple/tinypkg/".into(), ("text/html", index.into()));
        f.insert(
            "/packages/tinypkg-1.0-py3-none-any.whl".into(),
            ("application/octet-stream", wheel),
        );
        // Served, but on a path the kit does not grant.
        f.insert(
            "/private/simple/tinypkg/".into(),
            ("text/html", index.into()),
        );
    }
    {
        let packument = |name: &str| {
            format!(
                r#"{{"name":"{name}","dist-tags":{{"latest":"1.0.0"}},"versions":{{"1.0.0":{{"name":"{name}","version":"1.0.0","main":"index.js","dist":{{"tarball":"https://registry.test:{npm}/{name}/-/{name}-1.0.0.tgz","integrity":"{}"}}}}}}}}"#,
                integrity(tmp.path(), &tarball)
            )
        };
        let mut f = npm_files.lock().unwrap();
        for name in ["tinynpm", "secretpkg"] {
            f.insert(
                format!("/{name}"),
                ("application/json", packument(name).into()),
            );
            f.insert(
                format!("/{name}/-/{name}-1.0.0.tgz"),
                ("application/octet-stream", tarball.clone()),
            );
        }
    }
    std::fs::write(
        path("kit/kit.yaml"),
        r#"schemaVersion: "3"
kind: workload
capabilities:
  - type: com.docker.sandbox/network-policy@2
    config:
      runtime:
        allow:
          - {hosts: [pypi.test], methods: [GET], paths: ["/simple/**", "/packages/**"]}
          - {hosts: [registry.test], methods: [GET], paths: ["/tinynpm", "/tinynpm/-/**"]}
"#,
    )
    .unwrap();
    let script = format!(
        r#"
pip() {{ /usr/bin/python3 -m pip install --no-cache-dir --disable-pip-version-check "$@"; }}
pip --target /tmp/py --index-url https://pypi.test:{pypi}/simple tinypkg >/tmp/pip.log 2>&1
echo "pip=$?"
echo "pip_import=$(PYTHONPATH=/tmp/py /usr/bin/python3 -c 'import tinypkg; print(tinypkg.VALUE)')"
pip --target /tmp/py2 --index-url https://pypi.test:{pypi}/private/simple tinypkg >/tmp/pip2.log 2>&1
echo "pip_private=$?"
export NPM_CONFIG_UPDATE_NOTIFIER=false
mkdir /tmp/n && cd /tmp/n
npm install --no-audit --no-fund --registry https://registry.test:{npm}/ tinynpm >/tmp/npm.log 2>&1
echo "npm=$?"
echo "npm_require=$(node -e 'console.log(require("tinynpm"))')"
npm install --no-audit --no-fund --registry https://registry.test:{npm}/ secretpkg >/tmp/npm2.log 2>&1
echo "npm_other=$?"
echo "npm_other_said_403=$(grep -c 'E403' /tmp/npm2.log)"
cat /tmp/pip.log /tmp/pip2.log /tmp/npm.log /tmp/npm2.log >&2
"#
    );
    std::fs::write(path("ws/install.sh"), script).unwrap();
    let kit = path("kit");
    let ca = path("upstream-ca/ca.pem");
    let out = Command::new(BIN)
        .args(["run", "--kit"])
        .arg(&kit)
        .arg("--upstream-ca")
        .arg(&ca)
        .args([
            "--dangerously-resolve",
            "pypi.test=127.0.0.1",
            "--dangerously-resolve",
            "registry.test=127.0.0.1",
            "--",
            "sh",
            "install.sh",
        ])
        .current_dir(path("ws"))
        .env("CAPGATE_HOME", path("home"))
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    );
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");
    let probes: BTreeMap<&str, &str> = stdout.lines().filter_map(|l| l.split_once('=')).collect();
    let expect = |k: &str, v: &str| {
        assert_eq!(probes.get(k).copied(), Some(v), "{k}:\n{stdout}\n{stderr}");
    };
    // Granted: installed and usable.
    expect("pip", "0");
    expect("pip_import", "42");
    expect("npm", "0");
    expect("npm_require", "42");
    // Not granted: refused with 403 (npm says so; pip says only that nothing was found,
    // unless asked to debug).
    assert_ne!(probes.get("pip_private"), Some(&"0"), "{stdout}\n{stderr}");
    assert_ne!(probes.get("npm_other"), Some(&"0"), "{stdout}\n{stderr}");
    assert_ne!(probes.get("npm_other_said_403"), Some(&"0"), "{stderr}");
    // The run's summary names what was refused, and why.
    for refused in [
        format!("GET pypi.test:{pypi}/private/simple/tinypkg/: http_not_allowed"),
        format!("GET registry.test:{npm}/secretpkg: http_not_allowed"),
    ] {
        assert!(stderr.contains(&refused), "{refused} in:\n{stderr}");
    }
    // The registries saw the granted requests only.
    let requests = |seen: &Seen| seen.lock().unwrap().join("\n");
    let (pypi_got, npm_got) = (requests(&pypi_seen), requests(&npm_seen));
    assert!(pypi_got.contains("GET /simple/tinypkg/"), "{pypi_got}");
    assert!(
        pypi_got.contains("GET /packages/tinypkg-1.0-py3-none-any.whl"),
        "{pypi_got}"
    );
    assert!(!pypi_got.contains("/private"), "{pypi_got}");
    assert!(npm_got.contains("GET /tinynpm "), "{npm_got}");
    assert!(
        npm_got.contains("GET /tinynpm/-/tinynpm-1.0.0.tgz"),
        "{npm_got}"
    );
    assert!(!npm_got.contains("secretpkg"), "{npm_got}");
}
