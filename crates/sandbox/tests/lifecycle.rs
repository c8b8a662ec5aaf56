//! No process of a sandbox outlives `stop()`, the `Sandbox` being dropped, or the caller's
//! death; the cgroup goes with it.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "tests"
)]
mod common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

use capgate_sandbox::WorkspaceMode;
use common::*;

/// A `sleep` argument no other process on the host has: GNU sleep takes fractional
/// seconds, and the fraction is this test's.
fn unique_sleep() -> String {
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    format!(
        "1000.{}{:04}",
        std::process::id(),
        N.fetch_add(1, std::sync::atomic::Ordering::SeqCst)
    )
}

/// Starts `sleep <marker>` in the background inside; returns the marker.
fn start_sleeper(b: &mut Started) -> String {
    let marker = unique_sleep();
    let out = sh(
        &mut b.sandbox,
        &format!("/bin/sleep {marker} >/dev/null 2>&1 & echo started"),
    );
    assert_eq!(out.stdout, "started\n", "{out:?}");
    assert!(
        eventually(5, || !host_processes_with(&marker).is_empty()),
        "the sleeper did not start"
    );
    marker
}

#[test]
fn stop_leaves_no_process_and_no_cgroup() {
    let s = setup("life-stop", WorkspaceMode::Copy);
    let mut b = start(&s.spec);
    let marker = start_sleeper(&mut b);
    let cgroups = b.sandbox.report().cgroups.clone();
    b.sandbox.stop().unwrap();
    assert_eq!(
        host_processes_with(&marker),
        Vec::<i32>::new(),
        "a process survived stop()"
    );
    for dir in cgroups {
        assert!(!dir.exists(), "{} survived stop()", dir.display());
    }
}

#[test]
fn dropping_the_sandbox_stops_it() {
    let s = setup("life-drop", WorkspaceMode::Copy);
    let mut b = start(&s.spec);
    let marker = start_sleeper(&mut b);
    drop(b);
    assert_eq!(host_processes_with(&marker), Vec::<i32>::new());
}

#[test]
fn the_sandbox_dies_with_its_caller() {
    let marker = unique_sleep();
    let dir = tempfile::tempdir().unwrap();
    // Re-run this test binary as a separate caller process that starts a sandbox and waits.
    let mut caller = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "caller_process_holding_a_sandbox",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("CAPGATE_TEST_SLEEP_MARKER", &marker)
        .env("TMPDIR", dir.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let stdout = caller.stdout.take().unwrap();
    let mut cgroups = None;
    for line in BufReader::new(stdout).lines() {
        let line = line.unwrap();
        // libtest prints "test <name> ... " before the test's own output on the same line.
        if let Some((_, rest)) = line.split_once("CALLER READY ") {
            cgroups = Some(
                rest.split(' ')
                    .map(std::path::PathBuf::from)
                    .collect::<Vec<_>>(),
            );
            break;
        }
    }
    let cgroups = cgroups.expect("the caller process did not start its sandbox");
    assert!(eventually(5, || !host_processes_with(&marker).is_empty()));
    // The caller dies without any chance to clean up.
    caller.kill().unwrap();
    caller.wait().unwrap();
    assert!(
        eventually(10, || host_processes_with(&marker).is_empty()),
        "processes survived their caller: {:?}",
        host_processes_with(&marker)
    );
    assert!(
        eventually(10, || cgroups.iter().all(|d| !d.exists())),
        "the cgroup survived its caller: {cgroups:?}"
    );
}

/// Not a test on its own: the caller process of `the_sandbox_dies_with_its_caller`.
#[test]
#[ignore = "run by the_sandbox_dies_with_its_caller as a separate process"]
fn caller_process_holding_a_sandbox() {
    let Ok(marker) = std::env::var("CAPGATE_TEST_SLEEP_MARKER") else {
        return;
    };
    let s = setup("life-caller", WorkspaceMode::Copy);
    let mut b = start(&s.spec);
    let out = sh(
        &mut b.sandbox,
        &format!("/bin/sleep {marker} >/dev/null 2>&1 & echo started"),
    );
    assert_eq!(out.stdout, "started\n");
    let cgroups: Vec<String> = b
        .sandbox
        .report()
        .cgroups
        .iter()
        .map(|p| p.display().to_string())
        .collect();
    println!("CALLER READY {}", cgroups.join(" "));
    std::thread::sleep(std::time::Duration::from_secs(60));
}

fn parent_of(pid: i32) -> i32 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // The command name may hold spaces; the fields after its closing parenthesis do not.
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    rest.split(' ').nth(1).unwrap().parse().unwrap()
}

#[test]
fn the_sandbox_dies_with_its_helper() {
    let s = setup("life-helper", WorkspaceMode::Copy);
    let mut b = start(&s.spec);
    let marker = start_sleeper(&mut b);
    let sleeper = host_processes_with(&marker)[0];
    let init = parent_of(sleeper);
    let helper = parent_of(init);
    assert_eq!(
        parent_of(helper),
        std::process::id() as i32,
        "the helper is this process's child"
    );
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(helper),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    assert!(
        eventually(10, || host_processes_with(&marker).is_empty()),
        "PR_SET_PDEATHSIG did not take the sandbox down"
    );
    let gone = b
        .sandbox
        .run(&capgate_sandbox::RunCommand::agent(["/bin/true"]))
        .unwrap_err();
    assert!(
        matches!(gone, capgate_sandbox::SandboxError::Gone { .. }),
        "{gone}"
    );
    let cgroups = b.sandbox.report().cgroups.clone();
    assert!(b.sandbox.stop().is_err(), "a killed helper is reported");
    assert!(
        cgroups.iter().all(|d| !d.exists()),
        "the caller removes what the helper could not"
    );
}

/// `capgate run` starts the helper before it knows the spec; a run that ends before the
/// sandbox would start (a refused lock, a bad kit) drops it.
#[test]
fn a_prepared_helper_dropped_without_a_spec_leaves_nothing() {
    let s = setup("life-prep-drop", WorkspaceMode::Copy);
    let prepared = capgate_sandbox::Sandbox::prepare(&helper()).unwrap();
    // Let it read the host and wait for the spec, then end it: the drop must return.
    std::thread::sleep(std::time::Duration::from_millis(200));
    drop(prepared);
    assert!(
        !s.spec.state_dir.exists(),
        "a helper that never got a spec created its state directory"
    );
}

#[test]
fn a_prepared_helper_builds_the_sandbox_it_is_sent_later() {
    let s = setup("life-prep-late", WorkspaceMode::Copy);
    let prepared = capgate_sandbox::Sandbox::prepare(&helper()).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(200));
    let (mut sandbox, listeners) = prepared.start(&s.spec).unwrap();
    assert_eq!(listeners.len(), s.spec.listeners.len());
    let out = sh(&mut sandbox, "cat /home/agent/workspace/README.md; id -u");
    assert_eq!(out.stdout, "hello from the host\n1000\n", "{out:?}");
    sandbox.stop().unwrap();
}

#[test]
fn a_prepared_helper_refuses_an_invalid_spec_before_sending_it() {
    let mut s = setup("life-prep-bad", WorkspaceMode::Copy);
    s.spec.name = "../escape".into();
    let prepared = capgate_sandbox::Sandbox::prepare(&helper()).unwrap();
    let err = prepared.start(&s.spec).unwrap_err();
    assert!(
        matches!(err, capgate_sandbox::SandboxError::InvalidSpec { .. }),
        "{err}"
    );
    assert!(!s.spec.state_dir.exists());
}

/// `empty()` kills every process inside, the agent's and root's (a root hook's), and waits
/// until they are gone, while the sandbox itself (its init, namespaces, cgroup) stays and
/// still runs commands; `stop()` then tears it down.
#[test]
fn empty_kills_every_process_inside_and_keeps_the_sandbox() {
    let s = setup("life-empty", WorkspaceMode::Copy);
    let mut b = start(&s.spec);
    let agents = start_sleeper(&mut b);
    let roots = unique_sleep();
    let out = run_as(
        &mut b.sandbox,
        capgate_sandbox::User::Root,
        &[
            "/bin/sh",
            "-c",
            &format!("/bin/sleep {roots} >/dev/null 2>&1 & echo started"),
        ],
    );
    assert_eq!(out.stdout, "started\n", "{out:?}");
    assert!(eventually(5, || !host_processes_with(&roots).is_empty()));
    assert!(b.sandbox.empty().unwrap(), "some process was left");
    // Gone when it answers, not eventually.
    assert_eq!(host_processes_with(&agents), Vec::<i32>::new());
    assert_eq!(host_processes_with(&roots), Vec::<i32>::new());
    // The twin: the sandbox itself lives on.
    let out = sh(&mut b.sandbox, "echo still here");
    assert_eq!(out.stdout, "still here\n", "{out:?}");
    let cgroups = b.sandbox.report().cgroups.clone();
    b.sandbox.stop().unwrap();
    for dir in cgroups {
        assert!(!dir.exists(), "{} survived stop()", dir.display());
    }
}
