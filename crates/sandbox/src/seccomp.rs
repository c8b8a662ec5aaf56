//! The seccomp filter: a reviewed deny list (everything else is allowed; the namespaces,
//! mounts, Landlock and dropped capabilities are the main walls, this list removes kernel
//! attack surface and the ways around them).
//!
//! Three or four BPF programs are installed, in this order:
//! 1. the deny list: the entries of [`DENY`] return `EPERM`;
//! 2. `clone3` returns `ENOSYS`: its flags live in memory seccomp cannot read, and libc falls
//!    back to `clone`, whose flags the deny list checks;
//! 3. with an exec allowlist only, the entries of [`EXEC_LIST`] return `EACCES`;
//! 4. (x86_64) syscalls with the x32 bit set return `ENOSYS`: they have the same audit arch
//!    value as native ones, so without this check `mount | 0x40000000` would pass a deny list.
//!
//! Any other architecture (i386 `int 0x80` on x86_64, arm32 compat on aarch64) kills the
//! process: seccompiler's arch check does that first in programs 1 and 2.

use std::collections::BTreeMap;

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule, TargetArch, sock_filter,
};

/// When a deny entry applies.
#[derive(Debug, Clone, Copy)]
pub(crate) enum When {
    /// Every call.
    Always,
    /// The low 32 bits of argument `arg` have any of the bits in `flags` set.
    AnyFlag { arg: u8, flags: &'static [u64] },
    /// The low 32 bits of argument `arg` equal one of `values`.
    Equals { arg: u8, values: &'static [u64] },
    /// `personality(2)` sets one of `flags` (the query value `0xffffffff` stays allowed).
    Personality { flags: &'static [u64] },
    /// The low 32 bits of argument `arg` lack the bit `flag`.
    Lacks { arg: u8, flag: u64 },
}

/// One reviewed deny entry.
#[derive(Debug, Clone, Copy)]
#[allow(
    dead_code,
    reason = "`name` and `why` are the review record; the table's tests read them"
)]
pub(crate) struct Deny {
    pub name: &'static str,
    pub nr: i64,
    pub when: When,
    pub why: &'static str,
}

const fn always(name: &'static str, nr: i64, why: &'static str) -> Deny {
    Deny {
        name,
        nr,
        when: When::Always,
        why,
    }
}

/// Namespace-creating flags of `clone(2)`. `CLONE_NEWTIME` (0x80) is left out: in `clone`
/// that bit belongs to the exit signal, and time namespaces need `unshare`/`clone3`, both denied.
const NAMESPACE_FLAGS: &[u64] = &[
    libc::CLONE_NEWUSER as u64,
    libc::CLONE_NEWNS as u64,
    libc::CLONE_NEWPID as u64,
    libc::CLONE_NEWNET as u64,
    libc::CLONE_NEWIPC as u64,
    libc::CLONE_NEWUTS as u64,
    libc::CLONE_NEWCGROUP as u64,
];

/// `personality(2)` flags that weaken exploit mitigations.
const ADDR_NO_RANDOMIZE: u64 = 0x0004_0000;
const MMAP_PAGE_ZERO: u64 = 0x0010_0000;
const ADDR_COMPAT_LAYOUT: u64 = 0x0020_0000;
const READ_IMPLIES_EXEC: u64 = 0x0040_0000;
const PERSONALITY_QUERY: u64 = 0xffff_ffff;

/// The deny list. Each entry returns `EPERM`.
pub(crate) const DENY: &[Deny] = &[
    // The walls themselves: mounts could uncover or replace the read-only binds.
    always(
        "mount",
        libc::SYS_mount,
        "could remount read-only binds writable or uncover hidden paths",
    ),
    always(
        "umount2",
        libc::SYS_umount2,
        "could uncover the paths the sandbox hides under masks",
    ),
    always(
        "pivot_root",
        libc::SYS_pivot_root,
        "changes the root of the mount namespace",
    ),
    always(
        "fsopen",
        libc::SYS_fsopen,
        "new mount API: creates filesystems (same as mount)",
    ),
    always("fsmount", libc::SYS_fsmount, "new mount API: same as mount"),
    always(
        "fsconfig",
        libc::SYS_fsconfig,
        "new mount API: configures filesystems being mounted",
    ),
    always(
        "fspick",
        libc::SYS_fspick,
        "new mount API: reconfigures an existing mount",
    ),
    always(
        "move_mount",
        libc::SYS_move_mount,
        "new mount API: attaches or moves mounts",
    ),
    always(
        "open_tree",
        libc::SYS_open_tree,
        "new mount API: clones mount trees (bind mounts)",
    ),
    always(
        "mount_setattr",
        libc::SYS_mount_setattr,
        "new mount API: changes read-only/nosuid flags",
    ),
    // New namespaces: a fresh user namespace gives full capabilities over new mounts.
    always(
        "unshare",
        libc::SYS_unshare,
        "a new user namespace would let the workload unmount the read-only binds in its own view",
    ),
    Deny {
        name: "clone",
        nr: libc::SYS_clone,
        when: When::AnyFlag {
            arg: 0,
            flags: NAMESPACE_FLAGS,
        },
        why: "clone with namespace flags is unshare by another name",
    },
    always(
        "setns",
        libc::SYS_setns,
        "joining another namespace (through an inherited fd) would leave the sandbox",
    ),
    // Other processes' memory.
    always(
        "ptrace",
        libc::SYS_ptrace,
        "tracing another process reads and changes its memory and syscalls",
    ),
    always(
        "process_vm_readv",
        libc::SYS_process_vm_readv,
        "reads another process's memory",
    ),
    always(
        "process_vm_writev",
        libc::SYS_process_vm_writev,
        "writes another process's memory",
    ),
    // Kernel attack surface with a long CVE history and no use in agent workloads.
    always(
        "bpf",
        libc::SYS_bpf,
        "eBPF programs and maps: large kernel attack surface",
    ),
    always(
        "perf_event_open",
        libc::SYS_perf_event_open,
        "performance counters: side channels and kernel bugs",
    ),
    always(
        "userfaultfd",
        libc::SYS_userfaultfd,
        "makes kernel races in copy_from_user reliably exploitable",
    ),
    always(
        "io_uring_setup",
        libc::SYS_io_uring_setup,
        "io_uring performs syscalls this filter never sees",
    ),
    always(
        "io_uring_enter",
        libc::SYS_io_uring_enter,
        "io_uring performs syscalls this filter never sees",
    ),
    always(
        "io_uring_register",
        libc::SYS_io_uring_register,
        "io_uring performs syscalls this filter never sees",
    ),
    always(
        "open_by_handle_at",
        libc::SYS_open_by_handle_at,
        "opens files by handle, bypassing the path walk (the shocker escape)",
    ),
    // Kernel keyrings are not namespaced by path: keys of the host's uid are reachable.
    always(
        "keyctl",
        libc::SYS_keyctl,
        "kernel keyrings are keyed by uid, not by sandbox",
    ),
    always(
        "add_key",
        libc::SYS_add_key,
        "kernel keyrings are keyed by uid, not by sandbox",
    ),
    always(
        "request_key",
        libc::SYS_request_key,
        "kernel keyrings are keyed by uid, not by sandbox; may call a host upcall",
    ),
    // Whole-machine state.
    always("kexec_load", libc::SYS_kexec_load, "loads a new kernel"),
    always(
        "kexec_file_load",
        libc::SYS_kexec_file_load,
        "loads a new kernel",
    ),
    always("init_module", libc::SYS_init_module, "loads kernel code"),
    always("finit_module", libc::SYS_finit_module, "loads kernel code"),
    always(
        "delete_module",
        libc::SYS_delete_module,
        "unloads kernel code",
    ),
    always(
        "clock_settime",
        libc::SYS_clock_settime,
        "the clock is shared with the host",
    ),
    always(
        "clock_adjtime",
        libc::SYS_clock_adjtime,
        "the clock is shared with the host",
    ),
    always(
        "settimeofday",
        libc::SYS_settimeofday,
        "the clock is shared with the host",
    ),
    always(
        "adjtimex",
        libc::SYS_adjtimex,
        "the clock is shared with the host",
    ),
    always(
        "syslog",
        libc::SYS_syslog,
        "the kernel log is the host's (readable when dmesg_restrict is 0)",
    ),
    // Terminals: pushing input into the terminal the command inherited (CVE-2017-5226).
    Deny {
        name: "ioctl",
        nr: libc::SYS_ioctl,
        when: When::Equals {
            arg: 1,
            values: &[libc::TIOCSTI, libc::TIOCLINUX],
        },
        why: "TIOCSTI/TIOCLINUX inject keystrokes into the caller's terminal; compared on the low 32 bits as the kernel does (CVE-2019-10063)",
    },
    Deny {
        name: "personality",
        nr: libc::SYS_personality,
        when: When::Personality {
            flags: &[
                ADDR_NO_RANDOMIZE,
                MMAP_PAGE_ZERO,
                ADDR_COMPAT_LAYOUT,
                READ_IMPLIES_EXEC,
            ],
        },
        why: "disabling ASLR, mapping page zero or making reads executable weakens exploit mitigations",
    },
    Deny {
        name: "socket",
        nr: libc::SYS_socket,
        when: When::Equals {
            arg: 0,
            values: &[libc::AF_VSOCK as u64],
        },
        why: "vsock reaches the hypervisor host and is not confined by the network namespace",
    },
    Deny {
        name: "socket",
        nr: libc::SYS_socket,
        when: When::Equals {
            arg: 2,
            values: &[IPPROTO_MPTCP],
        },
        why: "Landlock's TCP rules (ABI 4 to 7) do not see MPTCP sockets: connect and bind would pass the listener-port limit",
    },
    always(
        "open_tree_attr",
        SYS_OPEN_TREE_ATTR,
        "new mount API (Linux 6.15): clones and reconfigures mounts, like open_tree",
    ),
    always(
        "listmount",
        SYS_LISTMOUNT,
        "new mount API (Linux 6.8): lists mounts, host paths included",
    ),
    always(
        "statmount",
        SYS_STATMOUNT,
        "new mount API (Linux 6.8): describes mounts, host paths included",
    ),
];

/// `IPPROTO_MPTCP`: an MPTCP socket is `socket(AF_INET{,6}, SOCK_STREAM, 262)`.
const IPPROTO_MPTCP: u64 = 262;
/// Numbers shared by x86_64 and the generic table (aarch64): new syscalls have one number.
const SYS_STATMOUNT: i64 = 457;
const SYS_LISTMOUNT: i64 = 458;
const SYS_OPEN_TREE_ATTR: i64 = 467;

/// x86-only calls denied besides [`DENY`].
#[cfg(target_arch = "x86_64")]
pub(crate) const DENY_X86: &[Deny] = &[always(
    "modify_ldt",
    libc::SYS_modify_ldt,
    "changes the process's segment descriptors; a path of past kernel exploits, unused by programs (Docker's profile denies it too)",
)];
#[cfg(not(target_arch = "x86_64"))]
pub(crate) const DENY_X86: &[Deny] = &[];

/// The set-user-ID and set-group-ID mode bits.
const SETID_BITS: &[u64] = &[libc::S_ISUID as u64, libc::S_ISGID as u64];
/// `fchmodat2(2)` (Linux 6.6): 452 on x86_64 and on the generic table (aarch64).
const SYS_FCHMODAT2: i64 = 452;
const SETID_WHY: &str = "the agent may be the host's uid 0 (when capgate runs as root): a set-id file it \
     makes in a mount-mode workspace or a volume would be a set-id-root program for other host users";

/// Mode-setting calls refused when the mode has set-user-ID or set-group-ID bits.
pub(crate) const DENY_SETID: &[Deny] = &[
    Deny {
        name: "fchmod",
        nr: libc::SYS_fchmod,
        when: When::AnyFlag {
            arg: 1,
            flags: SETID_BITS,
        },
        why: SETID_WHY,
    },
    Deny {
        name: "fchmodat",
        nr: libc::SYS_fchmodat,
        when: When::AnyFlag {
            arg: 2,
            flags: SETID_BITS,
        },
        why: SETID_WHY,
    },
    Deny {
        name: "fchmodat2",
        nr: SYS_FCHMODAT2,
        when: When::AnyFlag {
            arg: 2,
            flags: SETID_BITS,
        },
        why: SETID_WHY,
    },
    Deny {
        name: "openat",
        nr: libc::SYS_openat,
        when: When::AnyFlag {
            arg: 3,
            flags: SETID_BITS,
        },
        why: SETID_WHY,
    },
    Deny {
        name: "mknodat",
        nr: libc::SYS_mknodat,
        when: When::AnyFlag {
            arg: 2,
            flags: SETID_BITS,
        },
        why: SETID_WHY,
    },
];

/// The x86_64-only legacy forms of the calls in [`DENY_SETID`].
#[cfg(target_arch = "x86_64")]
pub(crate) const DENY_SETID_LEGACY: &[Deny] = &[
    Deny {
        name: "chmod",
        nr: libc::SYS_chmod,
        when: When::AnyFlag {
            arg: 1,
            flags: SETID_BITS,
        },
        why: SETID_WHY,
    },
    Deny {
        name: "open",
        nr: libc::SYS_open,
        when: When::AnyFlag {
            arg: 2,
            flags: SETID_BITS,
        },
        why: SETID_WHY,
    },
    Deny {
        name: "creat",
        nr: libc::SYS_creat,
        when: When::AnyFlag {
            arg: 1,
            flags: SETID_BITS,
        },
        why: SETID_WHY,
    },
    Deny {
        name: "mknod",
        nr: libc::SYS_mknod,
        when: When::AnyFlag {
            arg: 1,
            flags: SETID_BITS,
        },
        why: SETID_WHY,
    },
];
#[cfg(not(target_arch = "x86_64"))]
pub(crate) const DENY_SETID_LEGACY: &[Deny] = &[];

/// Syscalls answered `ENOSYS` (the caller's libc falls back to an older call).
pub(crate) const ENOSYS: &[Deny] = &[
    always(
        "clone3",
        libc::SYS_clone3,
        "its flags are in memory seccomp cannot inspect; glibc falls back to clone, which is checked",
    ),
    always(
        "openat2",
        libc::SYS_openat2,
        "its mode is in memory seccomp cannot inspect (see DENY_SETID); callers fall back to openat",
    ),
];

/// `memfd_create(2)`'s flag that makes the file non-executable for good (Linux 6.3).
const MFD_NOEXEC_SEAL: u64 = 0x0008;

/// With an exec allowlist (`dev.capgate/exec@1`) only: entries that return `EACCES`.
/// Landlock does not see files of the kernel's internal mounts, so an executable memfd
/// would run any program the workload writes into it (`fexecve`, `/proc/self/fd/N`).
/// Secret memory is unreadable through `/proc/PID/mem`, so a program named from there
/// would hide its exec from the init's exec watch (`execwatch`).
pub(crate) const EXEC_LIST: &[Deny] = &[
    Deny {
        name: "memfd_create",
        nr: libc::SYS_memfd_create,
        when: When::Lacks {
            arg: 1,
            flag: MFD_NOEXEC_SEAL,
        },
        why: "an executable memfd is a program no allowlist names; a sealed non-executable one is harmless (older kernels: no memfd at all)",
    },
    Deny {
        name: "memfd_secret",
        nr: libc::SYS_memfd_secret,
        when: When::Always,
        why: "a program name in secret memory is unreadable to the exec watch, which would not see a refused exec",
    },
];

/// The compiled programs, in installation order.
#[derive(Debug, Clone)]
pub(crate) struct Programs(pub Vec<BpfProgram>);

fn arch() -> Result<TargetArch, String> {
    TargetArch::try_from(std::env::consts::ARCH).map_err(|e| format!("seccomp: {e}"))
}

fn condition(arg: u8, op: SeccompCmpOp, value: u64) -> Result<SeccompCondition, String> {
    SeccompCondition::new(arg, SeccompCmpArgLen::Dword, op, value).map_err(|e| e.to_string())
}

fn rules_for(when: When) -> Result<Vec<SeccompRule>, String> {
    let rule = |conditions| SeccompRule::new(conditions).map_err(|e| e.to_string());
    match when {
        When::Always => Ok(Vec::new()),
        When::AnyFlag { arg, flags } => flags
            .iter()
            .map(|&flag| rule(vec![condition(arg, SeccompCmpOp::MaskedEq(flag), flag)?]))
            .collect(),
        When::Equals { arg, values } => values
            .iter()
            .map(|&value| rule(vec![condition(arg, SeccompCmpOp::Eq, value)?]))
            .collect(),
        When::Personality { flags } => flags
            .iter()
            .map(|&flag| {
                rule(vec![
                    condition(0, SeccompCmpOp::MaskedEq(flag), flag)?,
                    condition(0, SeccompCmpOp::Ne, PERSONALITY_QUERY)?,
                ])
            })
            .collect(),
        When::Lacks { arg, flag } => Ok(vec![rule(vec![condition(
            arg,
            SeccompCmpOp::MaskedEq(flag),
            0,
        )?])?]),
    }
}

fn compile_list(list: &[Deny], errno: i32) -> Result<BpfProgram, String> {
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> = BTreeMap::new();
    for entry in list {
        rules
            .entry(entry.nr)
            .or_default()
            .extend(rules_for(entry.when)?);
    }
    let filter = SeccompFilter::new(
        rules,
        SeccompAction::Allow,
        SeccompAction::Errno(errno.unsigned_abs()),
        arch()?,
    )
    .map_err(|e| e.to_string())?;
    BpfProgram::try_from(filter).map_err(|e| e.to_string())
}

// Classic BPF, for the programs written by hand below.
const LD_W_ABS: u16 = 0x20;
const JEQ_K: u16 = 0x15;
#[cfg(target_arch = "x86_64")]
const JGE_K: u16 = 0x35;
const RET_K: u16 = 0x06;

fn op(code: u16, jt: u8, jf: u8, k: u32) -> sock_filter {
    sock_filter { code, jt, jf, k }
}

/// The audit architecture of the running build (`AUDIT_ARCH_*`).
const NATIVE_AUDIT_ARCH: u32 = if cfg!(target_arch = "x86_64") {
    0xc000_003e
} else {
    0xc000_00b7 // aarch64
};

/// x86_64 only: syscall numbers with the x32 bit (`__X32_SYSCALL_BIT`) return `ENOSYS`.
#[cfg(target_arch = "x86_64")]
fn x32_guard() -> BpfProgram {
    const X32_SYSCALL_BIT: u32 = 0x4000_0000;
    vec![
        op(LD_W_ABS, 0, 0, 4),              // A = arch
        op(JEQ_K, 0, 3, NATIVE_AUDIT_ARCH), // not x86_64: allow (program 1 kills it)
        op(LD_W_ABS, 0, 0, 0),              // A = nr
        op(JGE_K, 0, 1, X32_SYSCALL_BIT),   // x32 syscall?
        op(RET_K, 0, 0, libc::SECCOMP_RET_ERRNO | libc::ENOSYS as u32),
        op(RET_K, 0, 0, libc::SECCOMP_RET_ALLOW),
    ]
}

/// Under an exec allowlist: a program that hands every `execve` and `execveat` (native
/// numbers) to the init as a user notification, which records one the allowlist does not
/// grant and lets the kernel go on (`SECCOMP_USER_NOTIF_FLAG_CONTINUE`; see `execwatch`
/// for the one exec it refuses itself). Everything else is allowed here; the other programs judge
/// it (another architecture is killed, an x32 number refused, before this one matters).
pub(crate) fn exec_notifier() -> BpfProgram {
    vec![
        op(LD_W_ABS, 0, 0, 4),                      // A = arch
        op(JEQ_K, 0, 3, NATIVE_AUDIT_ARCH),         // another arch: allow
        op(LD_W_ABS, 0, 0, 0),                      // A = nr
        op(JEQ_K, 2, 0, libc::SYS_execve as u32),   // execve: notify
        op(JEQ_K, 1, 0, libc::SYS_execveat as u32), // execveat: notify
        op(RET_K, 0, 0, libc::SECCOMP_RET_ALLOW),
        op(RET_K, 0, 0, libc::SECCOMP_RET_USER_NOTIF),
    ]
}

/// Compiles the programs for the running architecture; `exec_list` adds [`EXEC_LIST`].
pub(crate) fn compile(exec_list: bool) -> Result<Programs, String> {
    let deny: Vec<Deny> = DENY
        .iter()
        .chain(DENY_X86)
        .chain(DENY_SETID)
        .chain(DENY_SETID_LEGACY)
        .copied()
        .collect();
    let mut programs = vec![
        compile_list(&deny, libc::EPERM)?,
        compile_list(ENOSYS, libc::ENOSYS)?,
    ];
    if exec_list {
        programs.push(compile_list(EXEC_LIST, libc::EACCES)?);
    }
    #[cfg(target_arch = "x86_64")]
    programs.push(x32_guard());
    Ok(Programs(programs))
}

#[cfg(test)]
pub(crate) mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]
    use super::*;

    /// A classic-BPF interpreter for the instructions seccomp filters use, so the compiled
    /// programs are checked against the table's meaning (not against their own bytes).
    fn run(program: &[sock_filter], data: &[u8; 64]) -> u32 {
        let mut acc: u32 = 0;
        let mut pc = 0usize;
        let load = |off: u32| {
            let o = off as usize;
            u32::from_ne_bytes([data[o], data[o + 1], data[o + 2], data[o + 3]])
        };
        loop {
            let ins = &program[pc];
            let class = ins.code & 0x07;
            match class {
                0x00 => {
                    assert_eq!(ins.code, 0x20, "only LD|W|ABS is used");
                    acc = load(ins.k);
                    pc += 1;
                }
                0x04 => {
                    assert_eq!(ins.code & 0xf0, 0x50, "only AND is used");
                    acc &= ins.k;
                    pc += 1;
                }
                0x05 => {
                    let taken = match ins.code & 0xf0 {
                        0x00 => {
                            pc += 1 + ins.k as usize;
                            continue;
                        }
                        0x10 => acc == ins.k,
                        0x20 => acc > ins.k,
                        0x30 => acc >= ins.k,
                        0x40 => acc & ins.k != 0,
                        other => unreachable!("jump {other:#x}"),
                    };
                    pc += 1 + usize::from(if taken { ins.jt } else { ins.jf });
                }
                0x06 => return ins.k,
                other => unreachable!("class {other:#x}"),
            }
        }
    }

    const ARCH_X86_64: u32 = 0xc000_003e;
    const ARCH_AARCH64: u32 = 0xc000_00b7;

    fn native_arch() -> u32 {
        if cfg!(target_arch = "x86_64") {
            ARCH_X86_64
        } else {
            ARCH_AARCH64
        }
    }

    fn data(nr: i64, arch: u32, args: [u64; 6]) -> [u8; 64] {
        let mut d = [0u8; 64];
        d[0..4].copy_from_slice(&(nr as u32).to_ne_bytes());
        d[4..8].copy_from_slice(&arch.to_ne_bytes());
        for (i, a) in args.iter().enumerate() {
            d[16 + 8 * i..24 + 8 * i].copy_from_slice(&a.to_ne_bytes());
        }
        d
    }

    /// What the kernel does with stacked filters: the most severe action wins (for our
    /// actions: KILL_PROCESS > ERRNO > ALLOW).
    pub(crate) fn verdict(nr: i64, args: [u64; 6]) -> u32 {
        verdict_arch(nr, native_arch(), args)
    }

    fn verdict_arch(nr: i64, arch: u32, args: [u64; 6]) -> u32 {
        verdict_with(false, nr, arch, args)
    }

    fn verdict_with(exec_list: bool, nr: i64, arch: u32, args: [u64; 6]) -> u32 {
        let Programs(programs) = compile(exec_list).unwrap();
        let rank = |v: u32| match v & 0xffff_0000 {
            0x8000_0000 => 3, // KILL_PROCESS
            0x0005_0000 => 2, // ERRNO
            0x7fff_0000 => 0, // ALLOW
            other => unreachable!("{other:#x}"),
        };
        programs
            .iter()
            .map(|p| run(p, &data(nr, arch, args)))
            .max_by_key(|&v| rank(v))
            .unwrap()
    }

    /// The notifier hands the native `execve` and `execveat` to the init, and nothing
    /// else: not their neighbours, not the same numbers of another architecture.
    #[test]
    fn the_exec_notifier_notifies_native_execs_only() {
        let notifier = exec_notifier();
        let on = |nr: i64, arch: u32| run(&notifier, &data(nr, arch, [0; 6]));
        const NOTIFY: u32 = 0x7fc0_0000;
        for nr in [libc::SYS_execve, libc::SYS_execveat] {
            assert_eq!(on(nr, native_arch()), NOTIFY, "{nr}");
            assert_eq!(on(nr, 0x4000_0003), ALLOW, "{nr} of i386");
            for n in [nr - 1, nr + 1] {
                if ![libc::SYS_execve, libc::SYS_execveat].contains(&n) {
                    assert_eq!(on(n, native_arch()), ALLOW, "neighbour {n}");
                }
            }
        }
        for nr in [libc::SYS_openat, libc::SYS_clone, libc::SYS_read, 0] {
            assert_eq!(on(nr, native_arch()), ALLOW, "{nr}");
        }
    }

    const EPERM: u32 = 0x0005_0000 | libc::EPERM as u32;
    const EACCES: u32 = 0x0005_0000 | libc::EACCES as u32;
    const NOSYS: u32 = 0x0005_0000 | libc::ENOSYS as u32;
    const ALLOW: u32 = 0x7fff_0000;

    #[test]
    fn every_always_entry_is_denied_and_its_neighbours_are_not() {
        let denied: Vec<i64> = DENY.iter().chain(DENY_X86).map(|d| d.nr).collect();
        for entry in DENY
            .iter()
            .chain(DENY_X86)
            .filter(|d| matches!(d.when, When::Always))
        {
            assert_eq!(verdict(entry.nr, [0; 6]), EPERM, "{}", entry.name);
            for n in [entry.nr - 1, entry.nr + 1] {
                if !denied.contains(&n) && !ENOSYS.iter().any(|e| e.nr == n) {
                    assert_eq!(verdict(n, [0; 6]), ALLOW, "{} neighbour {n}", entry.name);
                }
            }
        }
    }

    /// MPTCP sockets are refused; plain TCP (protocol 0 or 6) and UDP are not.
    #[test]
    fn mptcp_sockets_are_refused_and_tcp_is_not() {
        let socket = |family: i32, kind: i32, protocol: u64| {
            verdict(
                libc::SYS_socket,
                [family as u64, kind as u64, protocol, 0, 0, 0],
            )
        };
        for family in [libc::AF_INET, libc::AF_INET6] {
            assert_eq!(socket(family, libc::SOCK_STREAM, IPPROTO_MPTCP), EPERM);
            assert_eq!(socket(family, libc::SOCK_STREAM, 0), ALLOW);
            assert_eq!(
                socket(family, libc::SOCK_STREAM, libc::IPPROTO_TCP as u64),
                ALLOW
            );
            assert_eq!(socket(family, libc::SOCK_DGRAM, 0), ALLOW);
        }
        assert_eq!(socket(libc::AF_VSOCK, libc::SOCK_STREAM, 0), EPERM);
    }

    #[test]
    fn set_id_modes_are_refused_and_plain_modes_are_not() {
        for (nr, arg) in [
            (libc::SYS_fchmod, 1),
            (libc::SYS_fchmodat, 2),
            (SYS_FCHMODAT2, 2),
            (libc::SYS_openat, 3),
            (libc::SYS_mknodat, 2),
        ] {
            let with = |mode: u64| {
                let mut args = [0u64; 6];
                args[arg] = mode;
                verdict(nr, args)
            };
            assert_eq!(with(0o4755), EPERM, "{nr} setuid");
            assert_eq!(with(0o2755), EPERM, "{nr} setgid");
            assert_eq!(with(0o0755), ALLOW, "{nr} plain");
            assert_eq!(with(0o1777), ALLOW, "{nr} sticky");
        }
        assert_eq!(verdict(libc::SYS_openat2, [0; 6]), NOSYS);
    }

    /// Under an exec allowlist a memfd must be sealed non-executable; without one, any
    /// memfd is fine.
    #[test]
    fn an_exec_list_allows_only_sealed_non_executable_memfds() {
        const MFD_CLOEXEC: u64 = 0x0001;
        const MFD_EXEC: u64 = 0x0010;
        let memfd = |exec_list, flags| {
            verdict_with(
                exec_list,
                libc::SYS_memfd_create,
                native_arch(),
                [0, flags, 0, 0, 0, 0],
            )
        };
        for flags in [0, MFD_CLOEXEC, MFD_EXEC, MFD_CLOEXEC | MFD_EXEC] {
            assert_eq!(memfd(true, flags), EACCES, "{flags:#x}");
            assert_eq!(memfd(false, flags), ALLOW, "{flags:#x}");
        }
        for flags in [MFD_NOEXEC_SEAL, MFD_NOEXEC_SEAL | MFD_CLOEXEC] {
            assert_eq!(memfd(true, flags), ALLOW, "{flags:#x}");
        }
        // High bits do not hide the missing seal.
        assert_eq!(memfd(true, 0xffff_ffff_0000_0000), EACCES);
        // Secret memory (unreadable to the exec watch) only under a list.
        let secret =
            |exec_list| verdict_with(exec_list, libc::SYS_memfd_secret, native_arch(), [0; 6]);
        assert_eq!(secret(true), EACCES);
        assert_eq!(secret(false), ALLOW);
    }

    #[test]
    fn harmless_calls_are_allowed() {
        for nr in [
            libc::SYS_read,
            libc::SYS_write,
            libc::SYS_openat,
            libc::SYS_execve,
            libc::SYS_wait4,
        ] {
            assert_eq!(verdict(nr, [0; 6]), ALLOW);
        }
    }

    #[test]
    fn clone_is_checked_by_flags_and_clone3_falls_back() {
        let thread =
            (libc::CLONE_VM | libc::CLONE_FS | libc::CLONE_FILES | libc::CLONE_THREAD) as u64;
        assert_eq!(verdict(libc::SYS_clone, [thread, 0, 0, 0, 0, 0]), ALLOW);
        assert_eq!(
            verdict(libc::SYS_clone, [libc::SIGCHLD as u64, 0, 0, 0, 0, 0]),
            ALLOW
        );
        for &flag in NAMESPACE_FLAGS {
            assert_eq!(
                verdict(
                    libc::SYS_clone,
                    [flag | libc::SIGCHLD as u64, 0, 0, 0, 0, 0]
                ),
                EPERM
            );
        }
        assert_eq!(verdict(libc::SYS_clone3, [0; 6]), NOSYS);
    }

    #[test]
    fn tiocsti_is_denied_even_with_high_bits_set() {
        let sti = libc::TIOCSTI;
        assert_eq!(verdict(libc::SYS_ioctl, [0, sti, 0, 0, 0, 0]), EPERM);
        // bubblewrap's CVE-2019-10063 probe: the kernel ignores the high 32 bits of `cmd`.
        assert_eq!(
            verdict(libc::SYS_ioctl, [0, (0x123 << 32) | sti, 0, 0, 0, 0]),
            EPERM
        );
        assert_eq!(verdict(libc::SYS_ioctl, [0, sti + 1, 0, 0, 0, 0]), ALLOW);
        assert_eq!(
            verdict(libc::SYS_ioctl, [0, libc::TIOCGWINSZ, 0, 0, 0, 0]),
            ALLOW
        );
    }

    #[test]
    fn personality_query_and_linux32_are_allowed_but_aslr_off_is_not() {
        assert_eq!(
            verdict(libc::SYS_personality, [PERSONALITY_QUERY, 0, 0, 0, 0, 0]),
            ALLOW
        );
        assert_eq!(verdict(libc::SYS_personality, [0, 0, 0, 0, 0, 0]), ALLOW);
        assert_eq!(
            verdict(libc::SYS_personality, [0x0008, 0, 0, 0, 0, 0]),
            ALLOW
        );
        assert_eq!(
            verdict(libc::SYS_personality, [ADDR_NO_RANDOMIZE, 0, 0, 0, 0, 0]),
            EPERM
        );
        assert_eq!(
            verdict(
                libc::SYS_personality,
                [READ_IMPLIES_EXEC | 8, 0, 0, 0, 0, 0]
            ),
            EPERM
        );
    }

    #[test]
    fn vsock_sockets_are_denied_inet_are_not() {
        assert_eq!(
            verdict(libc::SYS_socket, [libc::AF_VSOCK as u64, 1, 0, 0, 0, 0]),
            EPERM
        );
        assert_eq!(
            verdict(libc::SYS_socket, [libc::AF_INET as u64, 1, 0, 0, 0, 0]),
            ALLOW
        );
        assert_eq!(
            verdict(libc::SYS_socket, [libc::AF_UNIX as u64, 1, 0, 0, 0, 0]),
            ALLOW
        );
    }

    #[test]
    fn foreign_architectures_are_killed() {
        // i386 `int 0x80` on x86_64 carries AUDIT_ARCH_I386.
        assert_eq!(
            verdict_arch(libc::SYS_read, 0x4000_0003, [0; 6]),
            libc::SECCOMP_RET_KILL_PROCESS
        );
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn x32_numbers_are_refused() {
        assert_eq!(verdict(libc::SYS_mount | 0x4000_0000, [0; 6]), NOSYS);
        assert_eq!(verdict(libc::SYS_read | 0x4000_0000, [0; 6]), NOSYS);
    }

    #[test]
    fn the_brief_list_is_covered() {
        for name in [
            "mount",
            "umount2",
            "pivot_root",
            "unshare",
            "clone",
            "setns",
            "ptrace",
            "process_vm_readv",
            "process_vm_writev",
            "bpf",
            "keyctl",
            "add_key",
            "request_key",
            "kexec_load",
            "kexec_file_load",
            "init_module",
            "finit_module",
            "delete_module",
            "clock_settime",
            "clock_adjtime",
            "settimeofday",
            "adjtimex",
            "io_uring_setup",
            "io_uring_enter",
            "io_uring_register",
            "open_by_handle_at",
            "perf_event_open",
            "userfaultfd",
            "fsopen",
            "fsmount",
            "move_mount",
            "open_tree",
            "fspick",
            "fsconfig",
            "mount_setattr",
            "ioctl",
            "personality",
        ] {
            assert!(DENY.iter().any(|d| d.name == name), "{name} missing");
        }
        assert!(ENOSYS.iter().any(|d| d.name == "clone3"));
        for entry in DENY
            .iter()
            .chain(DENY_X86)
            .chain(ENOSYS)
            .chain(DENY_SETID)
            .chain(DENY_SETID_LEGACY)
        {
            assert!(entry.why.len() > 10, "{} needs a reason", entry.name);
        }
    }
}
