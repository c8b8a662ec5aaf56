//! `capgate run` from a terminal: the command gets a terminal of the sandbox's own, never
//! the caller's. These tests drive capgate on a pseudo-terminal of their own, as a user's
//! terminal emulator would (capgate is its session's leader, with the terminal as its
//! controlling terminal, by `setsid --ctty`).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "tests"
)]

use std::os::fd::{AsFd as _, OwnedFd};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rustix::pty::{OpenptFlags, grantpt, openpt, ptsname, unlockpt};
use rustix::termios::{Termios, Winsize, tcgetattr, tcsetwinsize};

const BIN: &str = env!("CARGO_BIN_EXE_capgate");

/// How long a test waits for what it expects before it fails (a deadline, not a timing).
const PATIENCE: Duration = Duration::from_secs(30);

/// capgate running on a pseudo-terminal: the test holds the controlling side, as a
/// terminal emulator does, and reads everything written to the terminal.
struct OnTerminal {
    master: Arc<OwnedFd>,
    /// The terminal's path on the host (`/dev/pts/N`).
    terminal: PathBuf,
    child: Child,
    seen: Arc<Mutex<Vec<u8>>>,
    /// The terminal shows its output slowly (`slow_bash`).
    slow: bool,
    _home: tempfile::TempDir,
}

impl OnTerminal {
    /// `capgate ARGS` in an empty workspace, on a terminal of `rows` × `cols`.
    fn start(args: &[&str], rows: u16, cols: u16) -> OnTerminal {
        let home = tempfile::tempdir().unwrap();
        Self::spawn(home, BIN, args, (rows, cols))
    }

    /// `sh -c SCRIPT` on a terminal, with `$CAPGATE` naming capgate, in the workspace of
    /// `home` (which has `ws/`).
    fn shell(home: tempfile::TempDir, script: &str) -> OnTerminal {
        Self::spawn(home, "sh", &["-c", script], (24, 80))
    }

    /// `bash -c SCRIPT` on a terminal that shows 2 KB every quarter of a second, as a slow
    /// link does.
    fn slow_bash(home: tempfile::TempDir, script: &str) -> OnTerminal {
        let mut t = Self::spawn_reading(home, "bash", &["-c", script], (24, 80), false);
        t.slow = true;
        t
    }

    fn spawn(
        home: tempfile::TempDir,
        program: &str,
        args: &[&str],
        size: (u16, u16),
    ) -> OnTerminal {
        Self::spawn_reading(home, program, args, size, true)
    }

    fn spawn_reading(
        home: tempfile::TempDir,
        program: &str,
        args: &[&str],
        (rows, cols): (u16, u16),
        fast: bool,
    ) -> OnTerminal {
        std::fs::create_dir_all(home.path().join("ws")).unwrap();
        let (master, terminal) = new_pty();
        resize(&master, rows, cols);
        let slave = || open_terminal(&terminal);
        let child = Command::new("setsid")
            .arg("--ctty")
            .arg(program)
            .args(args)
            .current_dir(home.path().join("ws"))
            .env("CAPGATE_HOME", home.path().join("home"))
            .env("CAPGATE", BIN)
            .env("TERM", "dumb")
            .stdin(Stdio::from(slave()))
            .stdout(Stdio::from(slave()))
            .stderr(Stdio::from(slave()))
            .spawn()
            .unwrap();
        let master = Arc::new(master);
        let (seen, _) = read_all_of(Arc::clone(&master), fast);
        OnTerminal {
            master,
            terminal,
            child,
            seen,
            slow: false,
            _home: home,
        }
    }

    fn type_in(&self, keys: &str) {
        assert!(type_into(&self.master, keys.as_bytes()));
    }

    fn shown(&self) -> String {
        String::from_utf8_lossy(&self.seen.lock().unwrap()).into_owned()
    }

    /// Waits until the terminal has shown `text` `times` times in all.
    fn wait_for(&self, text: &str, times: usize) {
        let started = Instant::now();
        let patience = if self.slow { 4 * PATIENCE } else { PATIENCE };
        while self.shown().matches(text).count() < times {
            assert!(
                started.elapsed() < patience,
                "the terminal never showed {text:?} ({times}×); it shows:\n{}",
                self.shown()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// capgate's exit code (it must end on its own).
    fn exit_code(&mut self) -> Option<i32> {
        let started = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status.code();
            }
            if started.elapsed() > PATIENCE {
                let _ = self.child.kill();
                panic!("capgate did not end; the terminal shows:\n{}", self.shown());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The terminal's modes (what `stty` sets: raw mode, echo, line editing, …).
    fn settings(&self) -> Modes {
        let t: Termios = tcgetattr(&*self.master).unwrap();
        Modes(format!(
            "{:?} {:?} {:?} {:?}",
            t.input_modes, t.output_modes, t.control_modes, t.local_modes
        ))
    }
}

impl Drop for OnTerminal {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[derive(Debug, PartialEq, Eq)]
struct Modes(String);

/// Reads all that is shown on the terminal whose controlling side is `master` (slowly
/// unless `fast`: 2 KB every quarter of a second), until EIO, once every holder of the
/// terminal has closed it: what was shown, and the reader.
fn read_all_of(
    master: Arc<OwnedFd>,
    fast: bool,
) -> (Arc<Mutex<Vec<u8>>>, std::thread::JoinHandle<()>) {
    let seen: Arc<Mutex<Vec<u8>>> = Arc::default();
    let into = Arc::clone(&seen);
    let reader = std::thread::spawn(move || {
        let mut buf = vec![0u8; if fast { 4096 } else { 2048 }];
        while let Ok(n @ 1..) = rustix::io::read(&*master, &mut buf) {
            into.lock().unwrap().extend_from_slice(&buf[..n]);
            if !fast {
                std::thread::sleep(Duration::from_millis(250));
            }
        }
    });
    (seen, reader)
}

/// `capgate ARGS` in `home`'s workspace, `line` piped into its stdin (then closed).
fn capgate_fed(
    home: &tempfile::TempDir,
    args: &[&str],
    line: &str,
    (stdout, stderr): (Stdio, Stdio),
) -> std::process::Child {
    use std::io::Write as _;
    std::fs::create_dir_all(home.path().join("ws")).unwrap();
    let mut child = Command::new(BIN)
        .args(args)
        .current_dir(home.path().join("ws"))
        .env("CAPGATE_HOME", home.path().join("home"))
        .stdin(Stdio::piped())
        .stdout(stdout)
        .stderr(stderr)
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(line.as_bytes())
        .unwrap();
    child
}

/// Writes `bytes` to the terminal's controlling side; `false` once nothing holds the
/// terminal any more.
fn type_into(master: &OwnedFd, mut bytes: &[u8]) -> bool {
    while !bytes.is_empty() {
        match rustix::io::write(master, bytes) {
            Ok(n) => bytes = &bytes[n..],
            Err(_) => return false,
        }
    }
    true
}

/// Writes `yaml` as `HOME/kit/kit.yaml` (and makes `HOME/ws`); the kit's directory.
fn write_kit(home: &tempfile::TempDir, yaml: &str) -> String {
    let kit = home.path().join("kit");
    std::fs::create_dir_all(&kit).unwrap();
    std::fs::create_dir_all(home.path().join("ws")).unwrap();
    std::fs::write(kit.join("kit.yaml"), yaml).unwrap();
    kit.display().to_string()
}

/// A new pseudo-terminal: its controlling side, and its terminal's path.
fn new_pty() -> (OwnedFd, PathBuf) {
    let master = openpt(OpenptFlags::RDWR | OpenptFlags::NOCTTY | OpenptFlags::CLOEXEC).unwrap();
    grantpt(&master).unwrap();
    unlockpt(&master).unwrap();
    let path = ptsname(&master, Vec::new()).unwrap().into_string().unwrap();
    (master, PathBuf::from(path))
}

fn open_terminal(path: &PathBuf) -> std::fs::File {
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap()
}

fn resize(master: &OwnedFd, rows: u16, cols: u16) {
    let size = Winsize {
        ws_row: rows,
        ws_col: cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    tcsetwinsize(master.as_fd(), size).unwrap();
}

fn mode_of(path: &PathBuf) -> u32 {
    use std::os::unix::fs::MetadataExt as _;
    std::fs::metadata(path).unwrap().mode() & 0o7777
}

/// The built-in shell, interactive: its terminal is the sandbox's own (named inside, the
/// agent's, the caller's size), it has job control, Ctrl-C and Ctrl-Z act on the command
/// in the foreground inside (before, Ctrl-C ended the whole run), a resize of the
/// caller's window reaches it, and its exit status is the run's.
#[test]
fn an_interactive_shell_has_a_terminal_of_its_own_with_job_control() {
    let mut t = OnTerminal::start(&["run"], 33, 111);
    let before = t.settings();
    t.type_in("echo ready-$((1+1))\n");
    t.wait_for("ready-2", 1);
    assert!(
        !t.shown().contains("no job control"),
        "the shell has no controlling terminal:\n{}",
        t.shown()
    );

    t.type_in("tty; stat -c 'owner=%u:%g' $(tty); stty size\n");
    t.wait_for("33 111", 1);
    let shown = t.shown();
    assert!(shown.contains("/dev/pts/0"), "{shown}");
    assert!(shown.contains("owner=1000:1000"), "{shown}");

    // Ctrl-C interrupts the foreground job inside; the shell and the run go on.
    t.type_in("sleep 60\n");
    std::thread::sleep(Duration::from_millis(300));
    t.type_in("\x03");
    t.type_in("echo after-interrupt-$((6*7))\n");
    t.wait_for("after-interrupt-42", 1);

    // Ctrl-Z stops it; the shell's job control knows it.
    t.type_in("sleep 61\n");
    std::thread::sleep(Duration::from_millis(300));
    t.type_in("\x1a");
    t.wait_for("Stopped", 1);
    t.type_in("kill %1; echo killed-$((7*7))\n");
    t.wait_for("killed-49", 1);

    // The caller's window grows: the kernel tells capgate (its foreground), and the
    // command's terminal follows.
    resize(&t.master, 44, 120);
    t.type_in("stty size\n");
    t.wait_for("44 120", 1);

    t.type_in("exit 5\n");
    assert_eq!(t.exit_code(), Some(5), "{}", t.shown());
    // Raw mode was the run's only: the caller's terminal is as it was.
    assert_eq!(t.settings(), before);
    assert!(!t.shown().contains("SIGINT"), "{}", t.shown());
}

/// A command inside cannot touch the caller's terminal: it gets none of it, only its own.
/// The attack: chmod the terminal for every user and turn its echo off for after the
/// run. The twin: the same on its own terminal inside works.
#[test]
fn the_callers_terminal_is_never_handed_into_the_sandbox() {
    let mut t = OnTerminal::start(
        &[
            "run",
            "--",
            "sh",
            "-c",
            "chmod 666 /proc/self/fd/0 && stty -echo -icanon && \
             echo \"inside=$(stat -L -c %a /proc/self/fd/0) $(stty -a | grep -o -- '-echo ')done\"",
        ],
        24,
        80,
    );
    let (mode, before) = (mode_of(&t.terminal), t.settings());
    assert_eq!(t.exit_code(), Some(0), "{}", t.shown());
    t.wait_for("done", 1);
    assert!(t.shown().contains("inside=666 -echo done"), "{}", t.shown());
    assert_eq!(
        mode_of(&t.terminal),
        mode,
        "the caller's terminal was chmod'ed from inside"
    );
    assert_eq!(t.settings(), before, "the caller's terminal modes changed");
}

/// A caller that is not interactive (stdin not a terminal): its pipe is handed over as it
/// is, and its terminal on stdout and stderr becomes a pty of the sandbox's own, for
/// output only: not the command's controlling terminal.
#[test]
fn a_caller_that_is_not_interactive_gets_its_output_on_a_terminal_of_the_sandbox() {
    let home = tempfile::tempdir().unwrap();
    // stdin: a pipe; stdout, stderr: the terminal.
    let (master, path) = new_pty();
    let slave = || Stdio::from(open_terminal(&path));
    let mut child = capgate_fed(
        &home,
        &[
            "run",
            "--",
            "sh",
            "-c",
            "read line; ctty=$( (: </dev/tty) 2>/dev/null && echo yes || echo no); echo \"got=$line in=$(readlink /proc/self/fd/0 | cut -c1-5) err=$(tty <&2) ctty=$ctty\"",
        ],
        "piped-line\n",
        (slave(), slave()),
    );
    // Until EIO: capgate, the last holder of the terminal, has exited.
    let (seen, reader) = read_all_of(Arc::new(master), true);
    let status = child.wait().unwrap();
    reader.join().unwrap();
    let shown = String::from_utf8_lossy(&seen.lock().unwrap()).into_owned();
    assert_eq!(status.code(), Some(0), "{shown}");
    assert!(
        shown.contains("got=piped-line in=pipe: err=/dev/pts/0 ctty=no"),
        "{shown}"
    );
    // Line ends turned into `\r\n` once, by the caller's terminal, not twice.
    assert!(shown.contains("ctty=no\r\n"), "{shown:?}");
    assert!(!shown.contains("\r\r\n"), "{shown:?}");
}

/// Only the command the user works with gets the terminal; hooks do not. A background
/// startup hook lives on after its shell ends (with the terminal it would get the
/// terminal's hang-up); keys typed while the hooks run, and while capgate writes the kit's
/// files, reach the command.
#[test]
fn hooks_get_no_terminal_and_keys_typed_early_reach_the_command() {
    let home = tempfile::tempdir().unwrap();
    let kit = write_kit(
        &home,
        r#"schemaVersion: "3"
kind: workload
capabilities:
  - type: com.docker.sandbox/lifecycle@1
    config:
      files:
        - {path: /home/agent/note.txt, content: "a kit file\n"}
      install:
        - command: ["sh", "-c", "for i in 1 2 3; do echo out$i; echo err$i >&2; done; read k; echo \"install-read=[$k]\""]
      startup:
        - command: ["sh", "-c", "echo started > /tmp/daemon.log; sleep 1; echo alive >> /tmp/daemon.log; sleep 60"]
          background: true
        - command: ["sleep", "1"]
"#,
    );
    let mut t = OnTerminal::spawn(
        home,
        BIN,
        &[
            "run",
            "--kit",
            &kit,
            "--",
            "sh",
            "-c",
            "read x; echo \"got=$x\"; for i in $(seq 100); do grep -q alive /tmp/daemon.log && break; sleep 0.1; done; echo \"daemon=$(tr '\\n' , </tmp/daemon.log)\"",
        ],
        (24, 80),
    );
    // Typed at once: the kit's files and the hooks come first.
    t.type_in("early-keys\n");
    assert_eq!(t.exit_code(), Some(0), "{}", t.shown());
    t.wait_for("daemon=", 1);
    let shown = t.shown();
    assert!(shown.contains("got=early-keys"), "{shown}");
    assert!(shown.contains("daemon=started,alive,"), "{shown}");
    // A hook's output reaches the terminal as one stream, in order; it read no keys.
    let lines = shown.replace('\r', "");
    assert!(
        lines.contains("out1\nerr1\nout2\nerr2\nout3\nerr3\ninstall-read=[]"),
        "{shown}"
    );
}

/// What is piped into capgate is the workload's: a hook reads nothing of it.
#[test]
fn hooks_read_nothing_of_what_is_piped_in() {
    let home = tempfile::tempdir().unwrap();
    let kit = write_kit(
        &home,
        r#"schemaVersion: "3"
kind: workload
capabilities:
  - type: com.docker.sandbox/lifecycle@1
    config:
      startup:
        - command: ["sh", "-c", "read line; echo \"hook-took=[$line]\""]
"#,
    );
    let child = capgate_fed(
        &home,
        &[
            "run",
            "--kit",
            &kit,
            "--",
            "sh",
            "-c",
            "read l; echo \"workload-got=[$l]\"",
        ],
        "line-for-workload\n",
        (Stdio::piped(), Stdio::piped()),
    );
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}");
    assert!(stdout.contains("hook-took=[]"), "{stdout}");
    assert!(
        stdout.contains("workload-got=[line-for-workload]"),
        "{stdout}"
    );
}

/// Keys pasted while the command does not read (more than its terminal holds): the run
/// still ends when the command does, and the caller's terminal is as it was.
#[test]
fn a_paste_the_command_never_reads_does_not_hold_up_the_end() {
    let mut t = OnTerminal::start(&["run", "--", "sh", "-c", "sleep 2; echo slept"], 24, 80);
    let before = t.settings();
    // Typed from a thread of its own: were capgate to stop reading, the typing would
    // block, and the deadline below must still hold.
    let master = Arc::clone(&t.master);
    std::thread::spawn(move || {
        let line = format!("{}\n", "x".repeat(99));
        for _ in 0..1000 {
            if !type_into(&master, line.as_bytes()) {
                return;
            }
        }
    });
    assert_eq!(t.exit_code(), Some(0), "{}", t.shown().len());
    t.wait_for("slept", 1);
    assert_eq!(t.settings(), before);
}

/// From a terminal with stdout sent to a file, the command still reads the keyboard (and
/// its output is in the file).
#[test]
fn stdout_to_a_file_keeps_the_keyboard() {
    let home = tempfile::tempdir().unwrap();
    let mut t = OnTerminal::shell(
        home,
        "\"$CAPGATE\" run -- sh -c 'read x; echo \"got=[$x]\"' > out.txt; echo \"file=$(cat out.txt)\"",
    );
    t.type_in("alice\n");
    assert_eq!(t.exit_code(), Some(0), "{}", t.shown());
    t.wait_for("file=", 1);
    assert!(t.shown().contains("file=got=[alice]"), "{}", t.shown());
}

/// capgate as a background job of an interactive shell (its own process group, not the
/// terminal's foreground) leaves the terminal alone: no raw mode (which would stop it with
/// SIGTTOU), no keys taken; its command's output still shows.
#[test]
fn a_run_in_the_background_leaves_the_terminal_alone() {
    let home = tempfile::tempdir().unwrap();
    let mut t = OnTerminal::shell(
        home,
        "set -m; \"$CAPGATE\" run -- sh -c 'echo \"bg=$(( 2 + 3 )) stdin=$(cat)\"' & wait $!; echo \"job=$?\"",
    );
    assert_eq!(t.exit_code(), Some(0), "{}", t.shown());
    t.wait_for("job=", 1);
    let shown = t.shown();
    assert!(shown.contains("bg=5 stdin="), "{shown}");
    assert!(shown.contains("job=0"), "{shown}");
}

/// A caller's terminal left non-blocking by another program (the flag is shared by every
/// process that has it open): a command's flood of output is all shown, and the run ends.
#[test]
fn a_non_blocking_terminal_gets_all_of_a_flood_of_output() {
    let home = tempfile::tempdir().unwrap();
    let mut t = OnTerminal::shell(
        home,
        "nb() { python3 -c 'import fcntl, os, sys\nfor f in (0, 1, 2): fcntl.fcntl(f, fcntl.F_SETFL, fcntl.fcntl(f, fcntl.F_GETFL) | os.O_NONBLOCK)\nos.execv(sys.argv[1], sys.argv[1:])' \"$@\"; }
         nb \"$CAPGATE\" run -- sh -c 'seq 1 200000; echo flood-end' && \
         nb \"$CAPGATE\" run -- sh -c 'seq 1 200000; echo flood-again' </dev/null",
    );
    // The command writes faster than the terminal drains: capgate's writes meet EAGAIN,
    // on the command's terminal and (not interactive, stdin not a terminal) on the pipe.
    assert_eq!(t.exit_code(), Some(0), "{}", t.shown().len());
    t.wait_for("flood-again", 1);
    // (A pty ends its lines with CR LF, and the caller's terminal, not raw after the
    // first run, adds a CR of its own.)
    let shown = t.shown().replace('\r', "");
    assert!(shown.contains("\n199999\n200000\nflood-end"));
    assert!(shown.contains("\n199999\n200000\nflood-again"));
}

/// The rest of a long paste the command never read is dropped, not left in the caller's
/// terminal for the caller's shell to run once capgate has ended (the attack: a paste
/// whose last line is a command).
#[test]
fn a_long_paste_is_not_left_for_the_callers_shell() {
    let home = tempfile::tempdir().unwrap();
    // bash: its `read -t` waits a second for a line.
    let t = OnTerminal::spawn(
        home,
        "bash",
        &[
            "-c",
            "\"$CAPGATE\" run -- sleep 3; echo \"capgate-exit=$?\"; \
             n=0; while read -t 1 x; do n=$((n+1)); done; echo \"host-read-lines=$n\"",
        ],
        (24, 80),
    );
    std::thread::sleep(Duration::from_millis(500));
    let master = Arc::clone(&t.master);
    std::thread::spawn(move || {
        let line = format!("# {}\n", "x".repeat(1000));
        for _ in 0..299 {
            if !type_into(&master, line.as_bytes()) {
                return;
            }
        }
        type_into(&master, b"echo HOST-RAN-$((6*7))\n");
    });
    t.wait_for("host-read-lines=", 1);
    let shown = t.shown();
    assert!(shown.contains("capgate-exit=0"), "{shown}");
    assert!(shown.contains("host-read-lines=0"), "{shown}");
}

/// A command's output comes out whole before the next command's and before capgate says
/// anything, however slowly the caller's terminal takes it.
#[test]
fn output_keeps_its_order_on_a_slow_terminal() {
    let home = tempfile::tempdir().unwrap();
    let kit = write_kit(
        &home,
        r#"schemaVersion: "3"
kind: workload
capabilities:
  - type: com.docker.sandbox/lifecycle@1
    config:
      install:
        - command: ["sh", "-c", "seq 1 8000 | sed s/^/I/; echo install-done"]
        - command: ["sh", "-c", "echo hook2-start; exit 3"]
"#,
    );
    let script = format!("\"$CAPGATE\" run --kit {kit} -- true; echo \"capgate-exit=$?\"");
    let mut t = OnTerminal::slow_bash(home, &script);
    assert_eq!(t.exit_code(), Some(0), "{}", t.shown());
    t.wait_for("capgate-exit=", 1);
    let shown = t.shown().replace('\r', "");
    let at = |text: &str| {
        shown
            .find(text)
            .unwrap_or_else(|| panic!("{text} not shown:\n{shown}"))
    };
    assert!(at("I8000\ninstall-done") < at("hook2-start"), "{shown}");
    assert!(at("hook2-start") < at("install hook 2 failed"), "{shown}");
}
