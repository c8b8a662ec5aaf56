//! `capgate gateway` on its own, as a policy proxy: decisions follow the store live, every
//! decision lands in the audit log, and `capgate env` hands out sentinels, never secrets.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "tests"
)]

use std::io::{BufRead as _, BufReader, Write as _};
use std::net::TcpListener;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_capgate");

struct Home(tempfile::TempDir);

impl Home {
    fn cmd(&self, args: &[&str]) -> Command {
        let mut c = Command::new(BIN);
        c.args(args)
            .current_dir(self.0.path())
            .env("CAPGATE_HOME", self.0.path().join("home"));
        c
    }

    /// Creates the sandbox `name` from `yaml`, written as the kit `kit`.
    fn create(&self, name: &str, yaml: &str) {
        std::fs::create_dir_all(self.0.path().join("kit")).unwrap();
        std::fs::write(self.0.path().join("kit/kit.yaml"), yaml).unwrap();
        let o = self.run(&["create", name, "--kit", "kit"], None);
        assert_eq!(o.status.code(), Some(0), "{o:?}");
    }

    fn run(&self, args: &[&str], stdin: Option<&str>) -> Output {
        let mut c = self.cmd(args);
        c.stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .stdin(Stdio::piped());
        let mut child = c.spawn().unwrap();
        let mut input = child.stdin.take().unwrap();
        if let Some(s) = stdin {
            input.write_all(s.as_bytes()).unwrap();
        }
        drop(input);
        child.wait_with_output().unwrap()
    }
}

struct Killed(Child);

impl Drop for Killed {
    /// SIGTERM, as a service manager would stop it; the gateway flushes its audit log.
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.0.id().to_string()])
            .status();
        let _ = self.0.wait();
    }
}

/// An upstream answering `200 ok` to every request.
fn upstream() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for s in l.incoming().flatten() {
            std::thread::spawn(move || {
                let mut r = BufReader::new(s);
                loop {
                    let mut line = String::new();
                    if r.read_line(&mut line).unwrap_or(0) == 0 {
                        return;
                    }
                    if line == "\r\n"
                        && r.get_mut()
                            .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nok\n")
                            .is_err()
                    {
                        return;
                    }
                }
            });
        }
    });
    port
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn curl_code(proxy: u16, url: &str) -> String {
    let out = Command::new("curl")
        .args([
            "-s",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            "--max-time",
            "5",
            "-x",
            &format!("http://127.0.0.1:{proxy}"),
            url,
        ])
        .output()
        .expect("curl must be installed");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn decisions_follow_the_store_while_the_gateway_runs() {
    let h = Home(tempfile::tempdir().unwrap());
    h.create("gw", "schemaVersion: \"3\"\nkind: workload\ncapabilities:\n  - type: com.docker.sandbox/network-policy@1\n    config: {runtime: {allow: [svc.test]}}\n  - type: com.docker.sandbox/credential@1\n    config: {service: svc, phase: runtime, apiKey: {name: SVC_TOKEN, inject: [{domain: svc.test}]}}\n");
    let set = h.run(&["secret", "set", "svc"], Some("the-real-secret\n"));
    assert_eq!(set.status.code(), Some(0));
    assert!(
        set.stderr.is_empty(),
        "{:?}",
        String::from_utf8_lossy(&set.stderr)
    );
    // A secret too short to be masked in answers is stored, with a warning that says so.
    let short = h.run(&["secret", "set", "pin"], Some("1234567\n"));
    assert_eq!(short.status.code(), Some(0));
    assert!(
        String::from_utf8_lossy(&short.stderr).contains("shorter than 8 bytes"),
        "{short:?}"
    );
    assert_eq!(h.run(&["secret", "rm", "pin"], None).status.code(), Some(0));
    let up = upstream();
    let port = free_port();
    let mut child = h.cmd(&[
        "gateway",
        "--sandbox",
        "gw",
        "--listen",
        &format!("127.0.0.1:{port}"),
        "--dangerously-resolve",
        "svc.test=127.0.0.1",
    ]);
    let gateway = Killed(
        child
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let url = format!("http://svc.test:{up}/");
    let start = Instant::now();
    while curl_code(port, &url) != "200" {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "the gateway did not come up"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // The user denies the host while the gateway runs: within a second it is refused.
    assert_eq!(
        h.run(
            &["policy", "deny", "network", "svc.test", "--sandbox", "gw"],
            None
        )
        .status
        .code(),
        Some(0)
    );
    let start = Instant::now();
    while curl_code(port, &url) != "403" {
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "the deny did not take effect"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    drop(gateway);
    // Every decision was recorded, allowed and refused.
    let out = h.run(&["log", "--sandbox", "gw", "--json"], None);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let reasons: Vec<&str> = v["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["reason"].as_str().unwrap())
        .collect();
    assert!(
        reasons.contains(&"allowed_by_rule") && reasons.contains(&"denied_by_rule"),
        "{reasons:?}"
    );

    // The workload's environment: the proxy, the CA bundle, the sentinel — never the secret.
    let out = h.run(&["env", "gw", "--proxy", "127.0.0.1:3128"], None);
    let env = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(env.contains("HTTPS_PROXY=http://127.0.0.1:3128\n"), "{env}");
    assert!(env.contains("SVC_TOKEN=capgate-sentinel-svc-"), "{env}");
    for ca in [
        "SSL_CERT_FILE=",
        "NODE_EXTRA_CA_CERTS=",
        "CARGO_HTTP_CAINFO=",
    ] {
        assert!(env.contains(ca), "{env}");
    }
    assert!(!env.contains("the-real-secret"), "{env}");
    // The same as JSON: every line's variable, with its value.
    let out = h.run(&["env", "gw", "--proxy", "127.0.0.1:3128", "--json"], None);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["sandbox"], "gw");
    let vars = v["env"].as_object().unwrap();
    assert_eq!(vars.len(), env.lines().count(), "{v}");
    for line in env.lines() {
        let (k, value) = line.split_once('=').unwrap();
        assert_eq!(vars[k], value, "{k}");
    }
    let out = h.run(&["secret", "ls", "--json"], None);
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        r#"{"services":["svc"]}"#
    );
    let ca = h.run(&["ca", "path"], None);
    let path = String::from_utf8_lossy(&ca.stdout).trim().to_owned();
    let ca = h.run(&["ca", "path", "--json"], None);
    let v: serde_json::Value = serde_json::from_slice(&ca.stdout).unwrap();
    assert_eq!(v["path"], path.as_str());
    assert!(
        std::fs::read_to_string(path)
            .unwrap()
            .contains("BEGIN CERTIFICATE")
    );
}

/// From a terminal, `secret set` reads one line with the terminal's echo off: the secret is
/// stored and never written back to the screen. (Python's pty module gives the terminal.)
#[test]
fn a_secret_typed_at_a_terminal_is_not_echoed() {
    let h = Home(tempfile::tempdir().unwrap());
    let script = r#"
import os, pty, signal, sys
signal.alarm(20)  # never hang: no prompt in 20 s fails the test
pid, fd = pty.fork()
if pid == 0:
    os.execv(sys.argv[1], [sys.argv[1], "secret", "set", "github"])
out = b""
while b"not shown" not in out:
    out += os.read(fd, 4096)
os.write(fd, b"ghp_typed-secret-123\n")
while True:
    try:
        chunk = os.read(fd, 4096)
    except OSError:
        break
    if not chunk:
        break
    out += chunk
_, status = os.waitpid(pid, 0)
sys.stdout.write(out.decode(errors="replace"))
sys.exit(os.waitstatus_to_exitcode(status))
"#;
    let o = Command::new("python3")
        .args(["-c", script, env!("CARGO_BIN_EXE_capgate")])
        .env("CAPGATE_HOME", h.0.path().join("home"))
        .output()
        .unwrap();
    let shown = String::from_utf8_lossy(&o.stdout).into_owned();
    assert_eq!(
        o.status.code(),
        Some(0),
        "{shown}{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(shown.contains("secret for `github` (not shown"), "{shown}");
    assert!(shown.contains("stored the secret for `github`"), "{shown}");
    assert!(
        !shown.contains("ghp_typed"),
        "the secret was echoed: {shown}"
    );
    let ls = h.run(&["secret", "ls"], None);
    assert_eq!(String::from_utf8_lossy(&ls.stdout), "github\n");
}

/// `capgate env` of a sandbox that does not exist says so, and makes nothing (no CA).
#[test]
fn env_of_a_missing_sandbox_says_so_and_makes_nothing() {
    let h = Home(tempfile::tempdir().unwrap());
    let o = h.run(&["env", "nope"], None);
    assert_eq!(o.status.code(), Some(1), "{o:?}");
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("no sandbox `nope`"),
        "{o:?}"
    );
    assert!(!h.0.path().join("home/ca").exists());
}

/// A client that opens more connections than the gateway has descriptors for does not
/// stop it. Under a descriptor limit of 256 the gateway takes at most 48 connections at
/// once (and says so); 400 idle HTTP and 400 idle SOCKS connections get refusals or wait,
/// and once they are gone, a request is served again by the same process.
#[test]
fn a_flood_of_idle_connections_does_not_stop_the_gateway() {
    let h = Home(tempfile::tempdir().unwrap());
    h.create("gw", "schemaVersion: \"3\"\nkind: workload\ncapabilities:\n  - type: com.docker.sandbox/network-policy@1\n    config: {runtime: {allow: [svc.test]}}\n");
    let up = upstream();
    let (port, socks) = (free_port(), free_port());
    let mut cmd = Command::new("prlimit");
    cmd.args(["--nofile=256:256", BIN])
        .args([
            "gateway",
            "--sandbox",
            "gw",
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--socks",
            &format!("127.0.0.1:{socks}"),
            "--dangerously-resolve",
            "svc.test=127.0.0.1",
        ])
        .current_dir(h.0.path())
        .env("CAPGATE_HOME", h.0.path().join("home"))
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let mut gateway = Killed(cmd.spawn().expect("prlimit (util-linux) must be installed"));
    let url = format!("http://svc.test:{up}/");
    let start = Instant::now();
    while curl_code(port, &url) != "200" {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "the gateway did not come up"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let mut held = Vec::new();
    for listener in [port, socks] {
        let addr = std::net::SocketAddr::from(([127, 0, 0, 1], listener));
        for _ in 0..400 {
            if let Ok(s) = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(1)) {
                held.push(s);
            }
        }
    }
    assert!(held.len() > 300, "{} connections", held.len());
    // Still running, and serving again once the flood is gone.
    assert!(
        gateway.0.try_wait().unwrap().is_none(),
        "the gateway stopped"
    );
    drop(held);
    let start = Instant::now();
    while curl_code(port, &url) != "200" {
        assert!(
            gateway.0.try_wait().unwrap().is_none(),
            "the gateway stopped"
        );
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "the gateway did not serve again"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let _ = Command::new("kill")
        .args(["-TERM", &gateway.0.id().to_string()])
        .status();
    let _ = gateway.0.wait();
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut gateway.0.stderr.take().unwrap(), &mut stderr).unwrap();
    assert!(
        stderr.contains("this process may open 256 descriptors (ulimit -n): the gateway of `gw` takes 48 connections at once, not 1024"),
        "{stderr}"
    );
}
