//! Resource limits, read back from cgroupfs and exercised: a fork bomb stops at the pids
//! limit, a memory balloon is killed inside while the test process lives on.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "tests"
)]
mod common;

use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};

use capgate_sandbox::{Availability, Feature, Sandbox, WorkspaceMode};
use common::*;

fn cgroup_dir(cgroups: &[PathBuf], controller: &str) -> PathBuf {
    cgroups
        .iter()
        .find(|d| {
            d.components().any(|c| c.as_os_str() == controller)
                || d.join(format!("{controller}.max")).exists()
        })
        .cloned()
        .unwrap_or_else(|| {
            panic!(
                "no {controller} cgroup in {cgroups:?}; host: {}",
                capgate_sandbox::probe_host()
            )
        })
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .trim()
        .to_string()
}

#[test]
fn a_fork_bomb_is_held_at_the_pids_limit_and_the_host_stays_responsive() {
    let mut s = setup("lim-pids", WorkspaceMode::Copy);
    s.spec.limits.pids = 64;
    let mut b = start(&s.spec);
    let pids = cgroup_dir(&b.sandbox.report().cgroups, "pids");
    assert_eq!(read(&pids.join("pids.max")), "64");
    // Bounded: at most 200 forks, children sleep 20 s at most (stop() kills them sooner).
    let lines = py_lines(
        &mut b.sandbox,
        r#"
import time
ok = refused = 0
for i in range(200):
    try:
        pid = os.fork()
    except BlockingIOError:
        refused += 1
        continue
    if pid == 0:
        time.sleep(20)
        os._exit(0)
    ok += 1
print(ok, refused)
"#,
    );
    let counts: Vec<u32> = lines[0].split(' ').map(|n| n.parse().unwrap()).collect();
    let (ok, refused) = (counts[0], counts[1]);
    assert!(
        ok < 64 && refused >= 200 - 64,
        "forked {ok}, refused {refused}"
    );
    let current: u32 = read(&pids.join("pids.current")).parse().unwrap();
    assert!(current <= 64, "pids.current {current}");
    // The host is not affected: while the sandbox sits at its limit, the host still forks.
    assert!(
        std::process::Command::new("/bin/true")
            .status()
            .unwrap()
            .success()
    );
    b.sandbox.stop().unwrap();
    assert!(!pids.exists(), "the cgroup is removed on stop");
}

#[test]
fn a_memory_balloon_is_killed_inside_and_the_sandbox_lives_on() {
    let mut s = setup("lim-mem", WorkspaceMode::Copy);
    s.spec.limits.memory = Some(64 << 20);
    let mut b = start(&s.spec);
    let memory = cgroup_dir(&b.sandbox.report().cgroups, "memory");
    // The kernel's view of the limit and of the swap cap.
    if memory.join("memory.limit_in_bytes").exists() {
        assert_eq!(
            read(&memory.join("memory.limit_in_bytes")),
            (64u64 << 20).to_string()
        );
        assert_eq!(
            read(&memory.join("memory.memsw.limit_in_bytes")),
            (64u64 << 20).to_string()
        );
    } else {
        assert_eq!(read(&memory.join("memory.max")), (64u64 << 20).to_string());
        assert_eq!(read(&memory.join("memory.swap.max")), "0");
    }
    let balloon = py(&mut b.sandbox, "x = b'x' * (256 << 20)\nprint('survived')");
    assert_eq!(balloon.status.signal(), Some(9), "{balloon:?}");
    assert!(!balloon.stdout.contains("survived"));
    let oom_kills = if memory.join("memory.oom_control").exists() {
        read(&memory.join("memory.oom_control"))
    } else {
        read(&memory.join("memory.events"))
    };
    let kills: u64 = oom_kills
        .lines()
        .find_map(|l| l.strip_prefix("oom_kill "))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0);
    assert!(kills >= 1, "{oom_kills}");
    // A modest allocation still works, and so does the sandbox.
    let modest = py(&mut b.sandbox, "x = b'x' * (16 << 20)\nprint('fine')");
    assert_eq!(modest.stdout, "fine\n", "{modest:?}");
    b.sandbox.stop().unwrap();
    assert!(!memory.exists());
}

#[test]
fn tmpfs_files_count_toward_the_memory_limit() {
    let mut s = setup("lim-tmpfs", WorkspaceMode::Copy);
    s.spec.limits.memory = Some(64 << 20);
    let mut b = start(&s.spec);
    // 128 MiB into /tmp (a tmpfs of 256 MiB): only the memory limit can stop it.
    let out = py(
        &mut b.sandbox,
        "import os\nf = open('/tmp/big', 'wb')\nfor i in range(128):\n    f.write(b'x' * (1 << 20))\nf.flush()\nprint('wrote')",
    );
    assert!(
        !out.status.success() && !out.stdout.contains("wrote"),
        "{out:?}"
    );
    let size = sh(&mut b.sandbox, "rm -f /tmp/big; echo removed");
    assert_eq!(size.stdout, "removed\n", "{size:?}");
    b.sandbox.stop().unwrap();
}

#[test]
fn a_cpu_limit_throttles_a_busy_loop_and_no_limit_makes_no_cpu_cgroup() {
    // The twin: a sandbox that asks for no CPU limit gets no cpu cgroup at all.
    let s = setup("lim-nocpu", WorkspaceMode::Copy);
    let b = start(&s.spec);
    let cgroups = b.sandbox.report().cgroups.clone();
    assert!(
        !cgroups
            .iter()
            .any(|d| d.join("cpu.cfs_quota_us").exists() || d.join("cpu.max").exists()),
        "{cgroups:?}"
    );
    b.sandbox.stop().unwrap();

    let mut s = setup("lim-cpu", WorkspaceMode::Copy);
    s.spec.limits.millicpus = Some(200);
    let host = capgate_sandbox::probe_host();
    if host.check(Feature::CpuLimit).unwrap().availability == Availability::Missing {
        // A host without the controller refuses the limit, saying what is missing.
        let err = Sandbox::start(&s.spec, &helper())
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("`cpu`"), "{err}");
        eprintln!("this host has no cpu controller; checked the refusal only:\n{host}");
        return;
    }
    let mut b = start(&s.spec);
    // v1 mounts the controller as `cpu` or `cpu,cpuacct`: found by its files.
    let cpu = b
        .sandbox
        .report()
        .cgroups
        .iter()
        .find(|d| d.join("cpu.cfs_quota_us").exists() || d.join("cpu.max").exists())
        .cloned()
        .unwrap_or_else(|| panic!("no cpu cgroup; host: {}", capgate_sandbox::probe_host()));
    let throttled = |dir: &Path| -> u64 {
        read(&dir.join("cpu.stat"))
            .lines()
            .find_map(|l| l.strip_prefix("nr_throttled "))
            .and_then(|n| n.trim().parse().ok())
            .unwrap()
    };
    if cpu.join("cpu.cfs_quota_us").exists() {
        assert_eq!(read(&cpu.join("cpu.cfs_quota_us")), "20000");
        assert_eq!(read(&cpu.join("cpu.cfs_period_us")), "100000");
    } else {
        assert_eq!(read(&cpu.join("cpu.max")), "20000 100000");
    }
    assert_eq!(throttled(&cpu), 0, "nothing has run yet");
    // A busy loop that takes 0.3 s of CPU needs fifteen periods of a 20 ms quota, however
    // busy the machine is: the kernel throttles it, and it gets at most about a fifth of
    // the wall time.
    let lines = py_lines(
        &mut b.sandbox,
        "import time\nw, c = time.monotonic(), time.process_time()\nwhile time.process_time() - c < 0.3: pass\nprint(round((time.process_time() - c) / (time.monotonic() - w), 3))",
    );
    let share: f64 = lines[0].parse().unwrap();
    assert!(throttled(&cpu) >= 1, "{}", read(&cpu.join("cpu.stat")));
    assert!(
        share < 0.5,
        "the loop had {share} of a CPU under a 0.2 limit"
    );
    b.sandbox.stop().unwrap();
    assert!(!cpu.exists(), "the cgroup is removed on stop");
}

/// tmpfs pages belong to no process, so when a command fills `/dev/shm` up to the memory
/// limit the kernel must still pick a command to kill, not the sandbox's init: the run
/// goes on and says so. Each command's `oom_score_adj` is raised for that.
#[test]
fn filling_tmpfs_to_the_limit_kills_a_command_not_the_sandbox() {
    let mut s = setup("lim-shm", WorkspaceMode::Copy);
    s.spec.limits.memory = Some(64 << 20);
    let mut b = start(&s.spec);
    let adj = sh(&mut b.sandbox, "cat /proc/self/oom_score_adj");
    assert_eq!(adj.stdout.trim(), "500", "{adj:?}");
    let fill = sh(
        &mut b.sandbox,
        "dd if=/dev/zero of=/dev/shm/fill bs=1M count=100 2>/dev/null; echo dd=$?",
    );
    // The filler was killed (or failed to write), the shell around it went on, and so
    // does the sandbox.
    assert!(
        fill.stdout.starts_with("dd=") && fill.stdout.trim() != "dd=0",
        "{fill:?}"
    );
    let after = sh(&mut b.sandbox, "rm -f /dev/shm/fill; echo alive");
    assert_eq!(after.stdout, "alive\n", "{after:?}");
    b.sandbox.stop().unwrap();
}
