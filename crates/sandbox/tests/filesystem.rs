//! The filesystem walls: hidden host paths, read-only mounts, Landlock, noexec home,
//! copy and mount workspaces, volumes. Each hostile probe sits next to its harmless twin.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "tests"
)]
mod common;

use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;

use capgate_sandbox::{Sandbox, User, VolumeMount, VolumeSource, WorkspaceMode};
use common::*;

#[test]
fn host_paths_outside_the_grants_do_not_exist_but_the_workspace_does() {
    let s = setup("fs-read", WorkspaceMode::Copy);
    let secret = s.dir.path().join("secret.txt");
    std::fs::write(&secret, "host secret").unwrap();
    let mut b = start(&s.spec);
    let probes = [
        secret.display().to_string(),
        "/etc/shadow".into(),
        "/etc/machine-id".into(),
        "/root/.bashrc".into(),
        "/work/main/Cargo.toml".into(),
        "/sys/kernel/notes".into(),
        "/opt".into(),
        s.spec.state_dir.display().to_string(),
    ];
    let code = format!(
        "for p in {probes:?}:\n    print(p, err(lambda: open(p, 'rb').read()))\nprint('workspace', open('/home/agent/workspace/README.md').read().strip())"
    );
    let lines = py_lines(&mut b.sandbox, &code);
    for (line, probe) in lines.iter().zip(&probes) {
        assert_eq!(line, &format!("{probe} ENOENT"), "{lines:?}");
    }
    assert_eq!(lines.last().unwrap(), "workspace hello from the host");
    b.sandbox.stop().unwrap();
}

#[test]
fn the_sandbox_reads_no_host_path_in_its_mount_table_or_its_init_command_line() {
    // A copy-mode workspace's overlay options, and the init's argv, are readable inside.
    // Named as given, they would tell the workload where the host keeps the workspace and
    // the data directory (a user name, a project name).
    let s = setup("fs-paths", WorkspaceMode::Copy);
    let mut b = start(&s.spec);
    let out = sh(
        &mut b.sandbox,
        "cat /proc/self/mountinfo /proc/self/mounts; tr '\\0' ' ' </proc/1/cmdline",
    );
    assert!(out.ok(), "{out:?}");
    let tmp = s.dir.path().display().to_string();
    let exe = helper().exe.display().to_string();
    for host in [&tmp, &exe] {
        assert!(
            !out.stdout.contains(host.as_str()),
            "{host} in\n{}",
            out.stdout
        );
    }
    // The harmless twin: the workspace is there, an overlay, and the init is the helper.
    assert!(
        out.stdout
            .lines()
            .any(|l| l.contains(" /home/agent/workspace ") && l.contains(" - overlay ")),
        "{}",
        out.stdout
    );
    let cmdline = out.stdout.lines().last().unwrap();
    assert!(cmdline.starts_with("capgate --ctl-fd "), "{cmdline}");
    let readme = run(&mut b.sandbox, &["cat", "/home/agent/workspace/README.md"]);
    assert_eq!(readme.stdout, "hello from the host\n");
    b.sandbox.stop().unwrap();
}

#[test]
fn writes_outside_the_grants_fail_erofs_on_read_only_mounts_and_eacces_by_landlock() {
    let s = setup("fs-write", WorkspaceMode::Copy);
    let mut b = start(&s.spec);
    let lines = py_lines(
        &mut b.sandbox,
        r#"
w = lambda p: (lambda: open(p, 'w').write('x'))
for p in ['/etc/passwd', '/etc/new', '/usr/bin/new', '/newdir-file', '/dev/new', '/proc/sys/kernel/hostname']:
    print(p, err(w(p)))
for p in ['/proc/self/comm', '/proc/self/oom_score_adj']:
    print(p, err(w(p)))
print('chmod-usr', err(lambda: os.chmod('/usr/bin/true', 0o777)))
print('chmod-dev', err(lambda: os.chmod('/dev/null', 0o777)))
print('mkdir-root', err(lambda: os.mkdir('/x')))
# /etc/alternatives is the host's directory bound read-only, not a copy
print('alt-new', err(lambda: os.symlink('/bin/sh', '/etc/alternatives/new')))
print('alt-awk', err(lambda: os.readlink('/etc/alternatives/awk')), os.path.exists('/etc/alternatives/awk'))
# the harmless twins
for p in ['/home/agent/workspace/new.txt', '/tmp/new.txt', '/home/agent/.profile', '/dev/shm/x', '/dev/null']:
    print(p, err(w(p)))
open('/tmp/own', 'w').close()
print('chmod-tmp', err(lambda: os.chmod('/tmp/own', 0o700)))
"#,
    );
    // As the host has it (Debian's awk alternative, on every host CI runs on).
    let (alt_new, alt_awk) = if std::path::Path::new("/etc/alternatives/awk").exists() {
        ("alt-new EROFS", "alt-awk OK True")
    } else {
        ("alt-new ENOENT", "alt-awk ENOENT False")
    };
    let expect = [
        "/etc/passwd EROFS",
        "/etc/new EROFS",
        "/usr/bin/new EROFS",
        "/newdir-file EROFS",
        "/dev/new EROFS",
        "/proc/sys/kernel/hostname EROFS",
        "/proc/self/comm EACCES",
        "/proc/self/oom_score_adj EACCES",
        "chmod-usr EROFS",
        "chmod-dev EROFS",
        "mkdir-root EROFS",
        alt_new,
        alt_awk,
        "/home/agent/workspace/new.txt OK",
        "/tmp/new.txt OK",
        "/home/agent/.profile OK",
        "/dev/shm/x OK",
        "/dev/null OK",
        "chmod-tmp OK",
    ];
    assert_eq!(lines, expect);
    b.sandbox.stop().unwrap();
}

#[test]
fn home_is_noexec_but_system_programs_and_tmp_scripts_run() {
    let s = setup("fs-exec", WorkspaceMode::Copy);
    let mut b = start(&s.spec);
    let lines = py_lines(
        &mut b.sandbox,
        r#"
import shutil, subprocess
shutil.copy('/bin/true', '/home/agent/t')
os.chmod('/home/agent/t', 0o755)
open('/home/agent/s.sh', 'w').write('#!/bin/sh\nexit 0\n'); os.chmod('/home/agent/s.sh', 0o755)
open('/tmp/s.sh', 'w').write('#!/bin/sh\necho script-ran\n'); os.chmod('/tmp/s.sh', 0o755)
print('home-binary', err(lambda: subprocess.run(['/home/agent/t'])))
print('home-script', err(lambda: subprocess.run(['/home/agent/s.sh'])))
print('system', subprocess.run(['/bin/true']).returncode)
print('tmp', subprocess.run(['/tmp/s.sh'], capture_output=True, text=True).stdout.strip())
shutil.copy('/bin/true', '/home/agent/workspace/t'); os.chmod('/home/agent/workspace/t', 0o755)
print('workspace', subprocess.run(['/home/agent/workspace/t']).returncode)
"#,
    );
    assert_eq!(
        lines,
        [
            "home-binary EACCES",
            "home-script EACCES",
            "system 0",
            "tmp script-ran",
            "workspace 0"
        ]
    );
    b.sandbox.stop().unwrap();
}

#[test]
fn copy_mode_leaves_the_host_directory_untouched_while_the_sandbox_sees_its_writes() {
    let s = setup("fs-copy", WorkspaceMode::Copy);
    std::fs::create_dir(s.workspace.join("src")).unwrap();
    std::fs::write(s.workspace.join("src/main.rs"), "fn main() {}\n").unwrap();
    let mut b = start(&s.spec);
    let first = sh(
        &mut b.sandbox,
        "set -e; cd /home/agent/workspace; echo changed > README.md; echo new > added.txt; \
         rm -r src; mkdir src; echo other > src/lib.rs; ls src",
    );
    assert!(first.ok(), "{first:?}");
    // A later command sees the earlier one's writes.
    let second = sh(
        &mut b.sandbox,
        "cd /home/agent/workspace && cat README.md added.txt && ls src",
    );
    assert_eq!(second.stdout, "changed\nnew\nlib.rs\n", "{second:?}");
    // The host directory is as it was.
    assert_eq!(
        std::fs::read_to_string(s.workspace.join("README.md")).unwrap(),
        "hello from the host\n"
    );
    assert!(!s.workspace.join("added.txt").exists());
    assert_eq!(
        std::fs::read_to_string(s.workspace.join("src/main.rs")).unwrap(),
        "fn main() {}\n"
    );
    assert!(!s.workspace.join("src/lib.rs").exists());
    b.sandbox.stop().unwrap();
    // The writes live in the state directory's upper layer.
    assert!(s.spec.state_dir.join("upper/added.txt").exists());
}

#[test]
fn mount_mode_writes_through_to_the_host_as_the_invoking_user() {
    let s = setup("fs-mount", WorkspaceMode::Mount);
    let mut b = start(&s.spec);
    let out = sh(
        &mut b.sandbox,
        "echo from-sandbox > /home/agent/workspace/out.txt && echo more >> /home/agent/workspace/README.md",
    );
    assert!(out.ok(), "{out:?}");
    let written = s.workspace.join("out.txt");
    assert_eq!(std::fs::read_to_string(&written).unwrap(), "from-sandbox\n");
    assert_eq!(
        std::fs::read_to_string(s.workspace.join("README.md")).unwrap(),
        "hello from the host\nmore\n"
    );
    assert_eq!(
        std::fs::metadata(&written).unwrap().uid(),
        nix::unistd::getuid().as_raw()
    );
    b.sandbox.stop().unwrap();
}

#[test]
fn volumes_are_writable_persistent_dirs_or_tmpfs_and_executable() {
    let mut s = setup("fs-vol", WorkspaceMode::Copy);
    let cache = s.dir.path().join("cache");
    s.spec.volumes.push(VolumeMount {
        target: PathBuf::from("/cache"),
        source: VolumeSource::Dir(cache.clone()),
    });
    s.spec.volumes.push(VolumeMount {
        target: PathBuf::from("/home/agent/.npm/_cacache"),
        source: VolumeSource::Tmpfs { size: 8 << 20 },
    });
    let mut b = start(&s.spec);
    let out = sh(
        &mut b.sandbox,
        "set -e; cp /bin/true /cache/tool && /cache/tool && echo kept > /cache/state; \
         echo t > /home/agent/.npm/_cacache/x; echo sibling > /home/agent/.npm/other; \
         head -c 9000000 /dev/zero > /home/agent/.npm/_cacache/big 2>/dev/null && echo tmpfs-unbounded || echo tmpfs-full",
    );
    assert_eq!(out.stdout, "tmpfs-full\n", "{out:?}");
    b.sandbox.stop().unwrap();
    assert_eq!(
        std::fs::read_to_string(cache.join("state")).unwrap(),
        "kept\n"
    );
    // A new sandbox on the same volume sees it.
    let mut s2 = setup("fs-vol2", WorkspaceMode::Copy);
    s2.spec.volumes.push(VolumeMount {
        target: PathBuf::from("/cache"),
        source: VolumeSource::Dir(cache),
    });
    let mut b2 = start(&s2.spec);
    assert_eq!(sh(&mut b2.sandbox, "cat /cache/state").stdout, "kept\n");
    b2.sandbox.stop().unwrap();
}

/// A read-only volume shows the host directory's files, one store at two places, and
/// refuses every change (the attack: a write, a new file, a chmod, a removal, as the agent
/// and as root inside), while a writable volume beside it takes writes (the twin).
#[test]
fn read_only_volumes_show_the_host_directory_and_refuse_changes() {
    let mut s = setup("fs-rovol", WorkspaceMode::Copy);
    let store = s.dir.path().join("store");
    std::fs::create_dir_all(store.join("skill")).unwrap();
    std::fs::write(store.join("skill/SKILL.md"), "# a skill\n").unwrap();
    let meta = std::fs::metadata(&store).unwrap();
    for target in ["/home/agent/.claude/skills", "/home/agent/.agents/skills"] {
        s.spec.volumes.push(VolumeMount {
            target: PathBuf::from(target),
            source: VolumeSource::HostDir {
                path: store.clone(),
                identity: (meta.dev(), meta.ino()),
                writable: false,
            },
        });
    }
    s.spec.volumes.push(VolumeMount {
        target: PathBuf::from("/home/agent/.claude/rw"),
        source: VolumeSource::Dir(s.dir.path().join("rw")),
    });
    let mut b = start(&s.spec);
    let script = "cd /home/agent; cat .claude/skills/skill/SKILL.md .agents/skills/skill/SKILL.md; \
         for try in 'echo x >> .claude/skills/skill/SKILL.md' 'echo x > .agents/skills/new' \
                    'chmod 777 .claude/skills/skill' 'rm .claude/skills/skill/SKILL.md' \
                    'mkdir .claude/skills/d'; do \
           sh -c \"$try\" 2>/dev/null && echo \"changed: $try\"; done; \
         echo w > .claude/rw/file && echo rw-ok";
    // (Root inside has no capability over the agent's private volume either.)
    for (user, expected) in [
        (User::Agent, "# a skill\n# a skill\nrw-ok\n"),
        (User::Root, "# a skill\n# a skill\n"),
    ] {
        let out = run_as(&mut b.sandbox, user, &["sh", "-c", script]);
        assert_eq!(out.stdout, expected, "{user:?}: {out:?}");
    }
    b.sandbox.stop().unwrap();
    assert_eq!(
        std::fs::read_to_string(store.join("skill/SKILL.md")).unwrap(),
        "# a skill\n"
    );
    assert_eq!(std::fs::read_dir(&store).unwrap().count(), 1);
}

/// A vetted host directory is bound only while its path still leads to the directory the
/// caller checked: a link swapped in afterwards (here, to a directory of secrets) stops
/// the start instead of redirecting the mount.
#[test]
fn a_vetted_host_directory_swapped_for_a_link_is_never_bound() {
    let mut s = setup("fs-vetted", WorkspaceMode::Copy);
    let store = s.dir.path().join("store");
    let secrets = s.dir.path().join("secrets");
    std::fs::create_dir_all(&store).unwrap();
    std::fs::create_dir_all(&secrets).unwrap();
    std::fs::write(secrets.join("ca.key"), "KEY").unwrap();
    let meta = std::fs::metadata(&store).unwrap();
    s.spec.volumes.push(VolumeMount {
        target: PathBuf::from("/home/agent/skills"),
        source: VolumeSource::HostDir {
            path: store.clone(),
            identity: (meta.dev(), meta.ino()),
            writable: false,
        },
    });
    // The twin: unchanged, it is bound.
    let mut b = start(&s.spec);
    assert_eq!(sh(&mut b.sandbox, "ls -A /home/agent/skills").stdout, "");
    b.sandbox.stop().unwrap();
    // The attack: the path now leads elsewhere.
    std::fs::rename(&store, s.dir.path().join("moved")).unwrap();
    std::os::unix::fs::symlink(&secrets, &store).unwrap();
    s.spec.name = format!("{}-2", s.spec.name);
    let err = match Sandbox::start(&s.spec, &helper()) {
        Ok(_) => panic!("a swapped directory was bound"),
        Err(e) => e.to_string(),
    };
    assert!(
        err.contains("no longer the directory capgate checked"),
        "{err}"
    );
}

#[test]
fn generated_etc_and_minimal_dev() {
    let mut s = setup("fs-etc", WorkspaceMode::Copy);
    s.spec.etc.trusted_ca = "-----BEGIN CERTIFICATE-----\ntest\n-----END CERTIFICATE-----\n".into();
    let mut b = start(&s.spec);
    let out = sh(
        &mut b.sandbox,
        "id -un; getent passwd agent; cat /etc/resolv.conf; hostname; tail -3 /etc/ssl/certs/ca-certificates.crt | head -2; ls /dev | tr '\\n' ' '; ls /sys 2>&1 | head -1",
    );
    let expected = format!(
        "agent\nagent:x:1000:1000:agent:/home/agent:/bin/sh\nnameserver 127.0.0.1\n{}\n-----BEGIN CERTIFICATE-----\ntest\n\
         fd full null ptmx pts random shm stderr stdin stdout tty urandom zero ls: cannot access '/sys': No such file or directory\n",
        s.spec.name
    );
    assert_eq!(out.stdout, expected, "{out:?}");
    b.sandbox.stop().unwrap();
}

/// A volume inside another: the inner mount point is made inside the outer volume once it
/// is mounted, so both work and both persist.
#[test]
fn nested_volumes_both_mount_and_persist() {
    let mut s = setup("fs-nest", WorkspaceMode::Copy);
    let dir = s.dir.path().to_path_buf();
    let (outer, inner) = (dir.join("outer"), dir.join("inner"));
    // Inner before outer on purpose; and, outside the agent's home, a point made inside
    // the outer volume (/data/sub) that must be the agent's.
    for (target, source) in [
        ("/home/agent/data/sub", &inner),
        ("/home/agent/data", &outer),
        ("/data", &dir.join("top")),
        ("/data/sub/cache", &dir.join("deep")),
    ] {
        s.spec.volumes.push(VolumeMount {
            target: PathBuf::from(target),
            source: VolumeSource::Dir(source.clone()),
        });
    }
    let mut b = start(&s.spec);
    let out = sh(
        &mut b.sandbox,
        "echo o > /home/agent/data/o && echo i > /home/agent/data/sub/i && \
         echo t > /data/sub/t && echo c > /data/sub/cache/c && echo ok",
    );
    assert_eq!(out.stdout, "ok\n", "{out:?}");
    b.sandbox.stop().unwrap();
    assert_eq!(std::fs::read_to_string(outer.join("o")).unwrap(), "o\n");
    assert_eq!(std::fs::read_to_string(inner.join("i")).unwrap(), "i\n");
}

/// A workload that leaves a symbolic link in a persistent volume where a nested volume is
/// mounted next time (here onto the sandbox's `/etc`, or out to a host directory) finds
/// the next start refused, naming the link; nothing was mounted or changed through it.
#[test]
fn a_symlink_left_in_a_volume_never_redirects_the_next_mount() {
    for (name, link) in [("fs-link-rel", "../../../etc"), ("fs-link-abs", "/tmp")] {
        let mut s = setup(name, WorkspaceMode::Copy);
        let (outer, inner) = (s.dir.path().join("outer"), s.dir.path().join("inner"));
        std::fs::create_dir_all(&outer).unwrap();
        std::os::unix::fs::symlink(link, outer.join("sub")).unwrap();
        s.spec.volumes.push(VolumeMount {
            target: PathBuf::from("/home/agent/data"),
            source: VolumeSource::Dir(outer.clone()),
        });
        s.spec.volumes.push(VolumeMount {
            target: PathBuf::from("/home/agent/data/sub"),
            source: VolumeSource::Dir(inner),
        });
        let err = capgate_sandbox::Sandbox::start(&s.spec, &helper())
            .expect_err("the start must be refused");
        let message = err.to_string();
        assert!(
            message.contains("/home/agent/data/sub") && message.contains("symbolic link"),
            "{message}"
        );
    }
    // /tmp's mode is what it was (a chmod through the link would have made it 0755).
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata("/tmp").unwrap().permissions().mode() & 0o7777;
    assert_eq!(mode, 0o1777);
}

/// The race of the same attack: while sandboxes start, something (another sandbox on the
/// same persistent volume) keeps swapping a mount point with a symbolic link to a host
/// directory. Whatever a start does, nothing is made, chmod'ed or mounted through the
/// link: the host directory keeps its mode and gets nothing inside.
#[test]
fn a_symlink_swapped_in_while_mounting_never_redirects_anything() {
    use std::os::unix::fs::PermissionsExt;
    use std::sync::atomic::{AtomicBool, Ordering};
    let s0 = setup("fs-race", WorkspaceMode::Copy);
    let (outer, victim) = (s0.dir.path().join("outer"), s0.dir.path().join("victim"));
    std::fs::create_dir_all(outer.join("sub")).unwrap();
    std::fs::create_dir_all(&victim).unwrap();
    std::fs::set_permissions(&victim, std::fs::Permissions::from_mode(0o700)).unwrap();
    std::os::unix::fs::symlink(&victim, outer.join("link")).unwrap();
    let stop = std::sync::Arc::new(AtomicBool::new(false));
    let swapper = {
        let (outer, stop) = (outer.clone(), stop.clone());
        std::thread::spawn(move || {
            let dir = std::fs::File::open(&outer).unwrap();
            while !stop.load(Ordering::Relaxed) {
                let _ = rustix::fs::renameat_with(
                    &dir,
                    "sub",
                    &dir,
                    "link",
                    rustix::fs::RenameFlags::EXCHANGE,
                );
            }
        })
    };
    for _ in 0..20 {
        let mut s = setup("fs-race", WorkspaceMode::Copy);
        for (target, source) in [
            ("/data", &outer),
            ("/data/sub/cache", &s0.dir.path().join("deep")),
        ] {
            s.spec.volumes.push(VolumeMount {
                target: PathBuf::from(target),
                source: VolumeSource::Dir(source.clone()),
            });
        }
        if let Ok((sandbox, _)) = capgate_sandbox::Sandbox::start(&s.spec, &helper()) {
            sandbox.stop().unwrap();
        }
    }
    stop.store(true, Ordering::Relaxed);
    swapper.join().unwrap();
    let mode = std::fs::metadata(&victim).unwrap().permissions().mode() & 0o7777;
    assert_eq!(
        mode, 0o700,
        "the host directory was chmod'ed through the link"
    );
    assert_eq!(std::fs::read_dir(&victim).unwrap().count(), 0);
}

/// A workspace with a filesystem mounted inside cannot be shown without it (a user
/// namespace refuses to separate locked mounts): the start is refused, naming the mount,
/// rather than with the kernel's bare EINVAL. The twin, the same workspace once the mount
/// is gone, starts. Needs root to mount on the host; says so and passes otherwise.
#[test]
fn a_workspace_with_a_mount_inside_is_refused_by_name() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("not root: no mount could be made inside a workspace; not exercised");
        return;
    }
    struct Unmount(std::path::PathBuf);
    impl Drop for Unmount {
        fn drop(&mut self) {
            let _ = nix::mount::umount2(&self.0, nix::mount::MntFlags::MNT_DETACH);
        }
    }
    for mode in [WorkspaceMode::Copy, WorkspaceMode::Mount] {
        let s = setup("fs-submount", mode);
        let inner = s.workspace.join("mnt");
        std::fs::create_dir(&inner).unwrap();
        nix::mount::mount(
            Some("tmpfs"),
            &inner,
            Some("tmpfs"),
            nix::mount::MsFlags::empty(),
            Some("size=1m"),
        )
        .unwrap();
        let guard = Unmount(inner.clone());
        let err = match Sandbox::start(&s.spec, &helper()) {
            Ok(_) => panic!("{mode:?}: started with a mount inside the workspace"),
            Err(e) => e.to_string(),
        };
        assert!(
            err.contains("mounted beneath it") && err.contains(&*inner.to_string_lossy()),
            "{mode:?}: {err}"
        );
        drop(guard);
        let mut b = start(&s.spec);
        let out = run(&mut b.sandbox, &["cat", "/home/agent/workspace/README.md"]);
        assert_eq!(out.stdout, "hello from the host\n", "{mode:?}");
        b.sandbox.stop().unwrap();
    }
}

/// A workspace whose name holds what mount options cannot carry (`,` `:` `=` `\`) starts in
/// both modes: no host path goes into a mount's options any more.
#[test]
fn a_workspace_named_with_commas_colons_and_equals_signs_starts() {
    for mode in [WorkspaceMode::Copy, WorkspaceMode::Mount] {
        let mut s = setup("fs-odd-name", mode);
        let odd = s.dir.path().join("my work, v2: x=1 \\ y");
        std::fs::rename(&s.workspace, &odd).unwrap();
        s.spec.workspace.host_dir = odd.clone();
        let mut b = start(&s.spec);
        let out = run(&mut b.sandbox, &["cat", "/home/agent/workspace/README.md"]);
        assert_eq!(out.stdout, "hello from the host\n", "{mode:?}: {out:?}");
        b.sandbox.stop().unwrap();
    }
}
