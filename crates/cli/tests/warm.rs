//! `capgate warm` end to end on the real kernel: runs take prepared sandboxes with their
//! own stdio, status, refusals and signals; a sandbox prepared from kit files that changed
//! since is never used (the lock gate judges the change); stopping removes everything.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "tests"
)]

use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc::{Receiver, channel};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_capgate");

struct Env {
    tmp: tempfile::TempDir,
}

impl Env {
    fn new() -> Env {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(tmp.path().join("ws")).unwrap();
        std::fs::write(tmp.path().join("ws/notes.txt"), "workspace file\n").unwrap();
        Env { tmp }
    }

    fn path(&self, p: &str) -> PathBuf {
        self.tmp.path().join(p)
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(BIN);
        cmd.args(args)
            .current_dir(self.path("ws"))
            .env("CAPGATE_HOME", self.path("home"));
        cmd
    }

    /// `capgate ARGS` with `stdin` (none: `/dev/null`).
    fn capgate(&self, args: &[&str], stdin: Option<&str>) -> Output {
        let mut child = self
            .command(args)
            .stdin(if stdin.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        if let Some(s) = stdin {
            child.stdin.take().unwrap().write_all(s.as_bytes()).unwrap();
        }
        child.wait_with_output().unwrap()
    }

    /// Starts `capgate warm ARGS` and waits until its sandboxes are ready.
    fn warm(&self, args: &[&str]) -> Warm {
        let mut child = self
            .command(&[&["warm"], args].concat())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let (tx, lines) = channel();
        let stderr = child.stderr.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { return };
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        let mut warm = Warm {
            child,
            lines,
            seen: Vec::new(),
            looked: 0,
        };
        warm.wait_for(" ready; ");
        warm
    }

    fn write_kit(&self, yaml: &str) {
        std::fs::create_dir_all(self.path("kit")).unwrap();
        std::fs::write(self.path("kit/kit.yaml"), yaml).unwrap();
    }
}

struct Warm {
    child: Child,
    lines: Receiver<String>,
    seen: Vec<String>,
    /// How many of `seen` [`Warm::wait_for`] has looked at.
    looked: usize,
}

impl Warm {
    /// Waits (up to 60 s) for a line of the supervisor's stderr containing `what`, counting
    /// from the lines not looked at yet; returns it.
    fn wait_for(&mut self, what: &str) -> String {
        let deadline = Instant::now() + Duration::from_secs(60);
        if let Some(at) = self.seen[self.looked..]
            .iter()
            .position(|l| l.contains(what))
        {
            self.looked += at + 1;
            return self.seen[self.looked - 1].clone();
        }
        self.looked = self.seen.len();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    self.seen.push(line.clone());
                    self.looked = self.seen.len();
                    if line.contains(what) {
                        return line;
                    }
                }
                Err(_) => panic!(
                    "`capgate warm` did not say {what:?}; it said {:?} (exit {:?})",
                    self.seen,
                    self.child.try_wait()
                ),
            }
        }
    }

    /// The lines said so far (after a short pause for lines in flight).
    fn said(&mut self) -> Vec<String> {
        std::thread::sleep(Duration::from_millis(200));
        while let Ok(line) = self.lines.try_recv() {
            self.seen.push(line);
        }
        self.seen.clone()
    }

    fn handed(&mut self) -> usize {
        self.said()
            .iter()
            .filter(|l| l.contains("a run took the prepared sandbox"))
            .count()
    }

    /// Stops it with Ctrl-C's signal; its exit status.
    fn stop(mut self) -> Option<i32> {
        signal(self.child.id(), rustix::process::Signal::INT);
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status.code();
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        panic!("`capgate warm` did not stop on SIGINT");
    }
}

impl Drop for Warm {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            signal(self.child.id(), rustix::process::Signal::TERM);
            let _ = self.child.wait();
        }
    }
}

fn signal(pid: u32, sig: rustix::process::Signal) {
    let pid = rustix::process::Pid::from_raw(i32::try_from(pid).unwrap()).unwrap();
    rustix::process::kill_process(pid, sig).unwrap();
}

/// How many processes run `sleep ARG` (on the whole host: the pid namespaces of
/// sandboxes are beneath it).
fn running(arg: &str) -> usize {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| std::fs::read(e.path().join("cmdline")).ok())
        .filter(|c| c == format!("sleep\0{arg}\0").as_bytes())
        .count()
}

fn text(o: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

#[test]
fn a_run_takes_a_prepared_sandbox_with_its_stdio_and_status() {
    let env = Env::new();
    let mut warm = env.warm(&["--ready", "1"]);
    let o = env.capgate(
        &[
            "run",
            "--",
            "sh",
            "-c",
            "cat; cat notes.txt; echo to-stderr >&2; echo $TERM; sleep 41.5 & exit 7",
        ],
        Some("from stdin\n"),
    );
    let (stdout, stderr) = text(&o);
    assert_eq!(o.status.code(), Some(7), "{stderr}");
    assert_eq!(stdout, "from stdin\nworkspace file\ndumb\n");
    assert!(stderr.contains("to-stderr"), "{stderr}");
    assert!(!stderr.contains("starting a new sandbox"), "{stderr}");
    // What the command left behind is gone by the time the caller has its status.
    assert_eq!(running("41.5"), 0);
    assert_eq!(warm.handed(), 1, "{:?}", warm.said());
    // Its replacement serves the next run (each sandbox serves one).
    warm.wait_for("is ready");
    let o = env.capgate(&["run", "--", "sh", "-c", "echo second"], None);
    assert_eq!(text(&o).0, "second\n", "{:?}", text(&o));
    assert_eq!(warm.handed(), 2);
    // The twin: other options make another composition, which starts cold.
    let o = env.capgate(&["run", "--pids", "300", "--", "echo", "cold"], None);
    assert_eq!(text(&o).0, "cold\n", "{:?}", text(&o));
    assert_eq!(
        warm.handed(),
        2,
        "a run with other options took a prepared sandbox"
    );
    assert_eq!(warm.stop(), Some(0));
}

#[test]
fn a_prepared_sandboxs_refusals_are_summarized_and_fail_the_run() {
    let env = Env::new();
    let mut warm = env.warm(&["--ready", "1", "--fail-on-violation"]);
    let o = env.capgate(
        &[
            "run",
            "--fail-on-violation",
            "--",
            "curl",
            "-s",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            "http://refused.test/",
        ],
        None,
    );
    let (stdout, stderr) = text(&o);
    assert_eq!(warm.handed(), 1, "{:?}", warm.said());
    assert_eq!(stdout, "403");
    assert_eq!(o.status.code(), Some(3), "{stderr}");
    assert!(
        stderr.contains("refused.test:80/: no_matching_allow"),
        "{stderr}"
    );
    // The twin: nothing refused, status 0.
    warm.wait_for("is ready");
    let o = env.capgate(&["run", "--fail-on-violation", "--", "true"], None);
    assert_eq!(o.status.code(), Some(0), "{:?}", text(&o));
    assert_eq!(warm.handed(), 2);
}

const KIT: &str = "schemaVersion: \"3\"
kind: workload
displayName: warm test
provides: [warm-test]
capabilities:
  - type: com.docker.sandbox/sbx@1
  - type: com.docker.sandbox/network-policy@2
    config:
      runtime:
        allow:
          - allowed.test
";

/// A sandbox prepared before its kit changed must not run the changed kit's command: the
/// run starts cold, where the lock gate refuses the widening (exit 4).
#[test]
fn a_kit_changed_after_preparation_is_judged_by_the_lock_not_run_warm() {
    let env = Env::new();
    env.write_kit(KIT);
    let kit = env.path("kit");
    let kit = kit.to_str().unwrap();
    let o = env.capgate(&["lock", kit], None);
    assert_eq!(o.status.code(), Some(0), "{:?}", text(&o));
    let mut warm = env.warm(&["--ready", "1", "--kit", kit]);
    // The twin first: the kit as prepared runs warm.
    let o = env.capgate(&["run", "--kit", kit, "--", "true"], None);
    assert_eq!(o.status.code(), Some(0), "{:?}", text(&o));
    assert_eq!(warm.handed(), 1);
    warm.wait_for("is ready");
    // The attack: widen the kit after the sandbox was prepared and approved.
    env.write_kit(&KIT.replace(
        "          - allowed.test\n",
        "          - allowed.test\n          - widened.test\n",
    ));
    let o = env.capgate(&["run", "--kit", kit, "--", "echo", "ran"], None);
    let (stdout, stderr) = text(&o);
    assert_eq!(o.status.code(), Some(4), "{stdout}{stderr}");
    assert!(!stdout.contains("ran"), "{stdout}");
    assert!(stderr.contains("changed since"), "{stderr}");
    assert!(stderr.contains("widened.test"), "{stderr}");
    assert_eq!(warm.handed(), 2, "the run was offered the prepared sandbox");
}

#[test]
fn a_signal_to_the_caller_stops_the_command_inside() {
    let env = Env::new();
    let mut warm = env.warm(&["--ready", "1"]);
    let mut caller = env
        .command(&["run", "--", "sh", "-c", "echo started; exec sleep 37.5"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = BufReader::new(caller.stdout.take().unwrap());
    let mut line = String::new();
    stdout.read_line(&mut line).unwrap();
    assert_eq!(line, "started\n");
    assert_eq!(warm.handed(), 1);
    signal(caller.id(), rustix::process::Signal::INT);
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(s) = caller.try_wait().unwrap() {
            break s;
        }
        assert!(
            Instant::now() < deadline,
            "the caller did not end on SIGINT"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(status.code(), Some(130));
    let mut rest = String::new();
    stdout.read_to_string(&mut rest).unwrap();
    assert_eq!(rest, "");
    // Nothing of the command is left (it was killed; its exit may take a moment).
    let deadline = Instant::now() + Duration::from_secs(5);
    while running("37.5") > 0 {
        assert!(Instant::now() < deadline, "the command outlived the run");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_killed_caller_ends_the_command_inside() {
    let env = Env::new();
    let mut warm = env.warm(&["--ready", "1"]);
    let mut caller = env
        .command(&["run", "--", "sh", "-c", "echo started; exec sleep 38.5"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(caller.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line, "started\n");
    assert_eq!(warm.handed(), 1);
    caller.kill().unwrap();
    caller.wait().unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if running("38.5") == 0 {
            break;
        }
        assert!(Instant::now() < deadline, "the command outlived its caller");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn stopping_removes_the_prepared_sandboxes_and_runs_start_cold_again() {
    let env = Env::new();
    let warm = env.warm(&["--ready", "2"]);
    let sockets = || {
        std::fs::read_dir(env.path("home/warm"))
            .unwrap()
            .filter(|e| {
                e.as_ref()
                    .unwrap()
                    .path()
                    .extension()
                    .is_some_and(|x| x == "sock")
            })
            .count()
    };
    assert_eq!(sockets(), 1);
    assert_eq!(
        std::fs::read_dir(env.path("home/sandboxes"))
            .unwrap()
            .count(),
        2
    );
    assert_eq!(warm.stop(), Some(0));
    assert_eq!(sockets(), 0);
    assert_eq!(
        std::fs::read_dir(env.path("home/sandboxes"))
            .unwrap()
            .count(),
        0
    );
    let o = env.capgate(&["run", "--", "echo", "cold"], None);
    assert_eq!(text(&o).0, "cold\n", "{:?}", text(&o));
}

#[test]
fn what_cannot_be_prepared_is_refused_with_the_runs_reason() {
    let env = Env::new();
    for args in [
        &["warm", "--name", "kept"][..],
        &["warm", "--copy-back"],
        &["warm", "--mount"],
        &["warm", "--", "echo", "hi"],
    ] {
        let o = env.capgate(args, None);
        assert_eq!(o.status.code(), Some(1), "{args:?}: {:?}", text(&o));
        assert!(
            text(&o).1.contains("cannot be prepared ahead"),
            "{:?}",
            text(&o)
        );
    }
    // A kit whose lock refuses it stops warm with the run's code and message.
    env.write_kit(KIT);
    let kit = env.path("kit");
    let kit = kit.to_str().unwrap();
    assert_eq!(env.capgate(&["lock", kit], None).status.code(), Some(0));
    env.write_kit(&KIT.replace("allowed.test", "other.test"));
    let o = env.capgate(&["warm", "--kit", kit], None);
    let (stdout, stderr) = text(&o);
    assert_eq!(o.status.code(), Some(4), "{stdout}{stderr}");
    assert!(
        format!("{stdout}{stderr}").contains("other.test"),
        "{stdout}{stderr}"
    );
    assert!(
        !env.path("home/sandboxes").exists()
            || std::fs::read_dir(env.path("home/sandboxes"))
                .unwrap()
                .count()
                == 0
    );
}

/// A sandbox shows the workspace directory that was there when it was prepared: one
/// replaced since (a fresh checkout at the same path) is not shown from a prepared one.
#[test]
fn a_replaced_workspace_is_not_shown_from_a_prepared_sandbox() {
    let env = Env::new();
    let mut warm = env.warm(&["--ready", "1"]);
    std::fs::rename(env.path("ws"), env.path("ws-old")).unwrap();
    std::fs::create_dir(env.path("ws")).unwrap();
    std::fs::write(env.path("ws/notes.txt"), "the new checkout\n").unwrap();
    let o = env.capgate(&["run", "--", "cat", "notes.txt"], None);
    let (stdout, stderr) = text(&o);
    assert_eq!(stdout, "the new checkout\n", "{stderr}");
    assert!(stderr.contains("changed since"), "{stderr}");
    assert_eq!(warm.handed(), 1, "the run was offered the prepared sandbox");
}

/// A run waiting for a prepared sandbox (here: the supervisor is stopped) is not stuck:
/// Ctrl-C ends it before anything runs, and left alone it starts its own sandbox.
#[test]
fn a_run_waiting_for_a_prepared_sandbox_can_leave_and_is_never_stuck() {
    let env = Env::new();
    let warm = env.warm(&["--ready", "1"]);
    signal(warm.child.id(), rustix::process::Signal::STOP);
    let caller = env
        .command(&["run", "--", "echo", "ran"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Once it waits (its signals blocked, to be passed on or to end the wait).
    let blocked = |pid: u32| {
        std::fs::read_to_string(format!("/proc/{pid}/status"))
            .ok()
            .and_then(|s| {
                let line = s.lines().find(|l| l.starts_with("SigBlk:"))?.to_owned();
                u64::from_str_radix(line.trim_start_matches("SigBlk:").trim(), 16).ok()
            })
            .is_some_and(|mask| mask & 0b10 != 0)
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    while !blocked(caller.id()) {
        assert!(Instant::now() < deadline, "the run never waited");
        std::thread::sleep(Duration::from_millis(10));
    }
    signal(caller.id(), rustix::process::Signal::INT);
    let o = caller.wait_with_output().unwrap();
    assert_eq!(o.status.code(), Some(130), "{:?}", text(&o));
    assert_eq!(text(&o).0, "");
    // The twin: not interrupted, it gives up waiting and runs in a sandbox of its own.
    let o = env.capgate(&["run", "--", "echo", "cold"], None);
    let (stdout, stderr) = text(&o);
    assert_eq!(stdout, "cold\n", "{stderr}");
    assert!(stderr.contains("no prepared sandbox answered"), "{stderr}");
    signal(warm.child.id(), rustix::process::Signal::CONT);
    assert_eq!(warm.stop(), Some(0));
    // The two runs that left no longer hold a sandbox: none was handed to them, or the
    // worker handed one ended it (it saw no `Go`).
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::fs::read_dir(env.path("home/sandboxes"))
        .unwrap()
        .count()
        > 0
    {
        assert!(
            Instant::now() < deadline,
            "a prepared sandbox was left behind"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}
