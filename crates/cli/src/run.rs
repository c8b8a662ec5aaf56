//! `capgate run`: resolve the kits, gate them against the lock, provision the rules, start
//! the gateway and the kernel sandbox, run install hooks under install grants, switch to
//! runtime grants, run the workload, then report what was refused.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::io::{IsTerminal as _, Write as _};
use std::net::SocketAddr;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::{OsStrExt as _, OsStringExt as _};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, Result, bail};
use capgate_gateway::addr::DangerousMapping;
use capgate_gateway::proxy::Gateway;
use capgate_policy::audit::{LogQuery, Timestamp, events};
use capgate_policy::flags::Violations;
use capgate_policy::{Decision, Phase};
use capgate_resolve::Plan;
use capgate_sandbox::{
    EtcFiles, HelperCommand, ListenerKind, ListenerSpec, Prepared, RunCommand, Sandbox,
    SandboxError, SandboxSpec, User, VolumeMount, VolumeSource, Workspace, WorkspaceMode,
};
use capgate_spec::caps::Capability;
use capgate_spec::caps::lifecycle::{FileSpec, Lifecycle};
use capgate_spec::caps::storage::Resources;
use capgate_spec::text::printable;

use crate::exit;
use crate::gateway::{self, workload_env};
use crate::kits;
use crate::sandbox::{CreateArgs, Provisioned, provision};
use crate::state::{SandboxDir, data_dir, open_store};

mod warm;
pub use warm::{WarmArgs, warm};

/// The built-in workload for `capgate run -- CMD` with no kit: a shell with no grants.
const DEFAULT_KIT: &str = "# syntax=docker/sandbox-kit:3
# capgate's built-in workload: a shell with no network grants. The workspace is the
# current directory, copied (the host copy is never modified).
schemaVersion: \"3\"
kind: workload
displayName: capgate default shell
description: A shell with no network grants.
version: \"1.0.0\"
provides: [capgate-shell]
capabilities:
  - type: com.docker.sandbox/sbx@1
";

/// Where the proxy, SOCKS and DNS listeners sit inside the sandbox.
const PROXY_ADDR: &str = "127.0.0.1:3128";
const SOCKS_ADDR: &str = "127.0.0.1:1080";
const DNS_ADDR: &str = "127.0.0.1:53";
const CA_IN_SANDBOX: &str = "/etc/ssl/certs/ca-certificates.crt";

#[derive(Debug, clap::Args)]
pub struct RunArgs {
    /// A kit of the composition (repeatable): one workload and any mixins. Without any: the
    /// kits of the sandbox `--name` names, if it exists; else the built-in default, a
    /// shell with no network grants.
    #[arg(long = "kit", value_name = "KIT")]
    kits: Vec<PathBuf>,
    /// A create-phase arg value (repeatable). A value goes only to kits that declare the arg.
    #[arg(long = "arg", value_name = "NAME=VALUE", value_parser = kits::parse_arg)]
    args: Vec<(String, String)>,
    /// Keep the sandbox under this name (its rules and volumes stay after the run);
    /// without it the sandbox is removed when the run ends. A sandbox of that name that
    /// exists runs with the kits it was made with, unless `--kit` names others.
    #[arg(long)]
    name: Option<String>,
    /// The host directory shown at /home/agent/workspace (default: the current directory).
    #[arg(long)]
    workspace: Option<PathBuf>,
    /// Bind the workspace read-write instead of copying it: the workload's writes reach
    /// the host directory, and it can connect to any UNIX socket found there (a docker or
    /// ssh-agent socket is a way out that the gateway does not see).
    #[arg(long)]
    mount: bool,
    /// After the run, carry the workload's changes to the (copied) workspace back to the
    /// host directory. Changes to files the host runs (git hooks, editor tasks, CI
    /// workflows, direnv, .gitattributes) and symbolic links are never applied: they are
    /// committed on the branch `capgate/NAME` of a git work tree, or saved in the data
    /// directory; changes beneath .git are dropped.
    #[arg(long, conflicts_with = "mount")]
    copy_back: bool,
    /// Memory limit, e.g. `512m` or `2g` (swap capped to it; tmpfs counts).
    #[arg(long, value_parser = parse_size)]
    memory: Option<u64>,
    /// CPU limit in CPUs, e.g. `0.5` or `2` (a CFS quota per 100 ms period; overrides the
    /// kit's resources@1 `cpu`).
    #[arg(long, value_name = "CPUS", value_parser = parse_cpus)]
    cpus: Option<u32>,
    /// Process and thread limit.
    #[arg(long, default_value_t = capgate_sandbox::DEFAULT_PIDS,
          value_parser = clap::value_parser!(u32).range(1..))]
    pids: u32,
    /// Exit 3 if anything was refused during the run: by the gateway (a request, a
    /// connection, a DNS name) or by a pack's exec allowlist (a program it does not list),
    /// or if refusals could not be recorded. Filesystem refusals are the kernel's (EACCES,
    /// EROFS, ENOENT for the workload) and are not counted.
    #[arg(long)]
    fail_on_violation: bool,
    /// Approve widenings of the lock and write it.
    #[arg(long)]
    approve: bool,
    /// The lock file (default: `capgate.lock` beside the workload kit).
    #[arg(long, value_name = "FILE")]
    lock: Option<PathBuf>,
    /// Extra PEM roots the gateway trusts for upstream TLS.
    #[arg(long, value_name = "FILE")]
    upstream_ca: Option<PathBuf>,
    /// Map a name onto an address for the gateway (tests, local development; logged loudly).
    #[arg(long = "dangerously-resolve", value_name = "HOST=IP")]
    dangerously_resolve: Vec<DangerousMapping>,
    /// Start even where the host cannot apply a requested limit (loudly).
    #[arg(long)]
    dangerously_skip_limits: bool,
    /// Sharing of the host's skills store (`DATA/skills`, which may link elsewhere) at a
    /// kit's agent-skills@1 paths: `readwrite` lets a kit that asks for it write there.
    #[arg(long, value_enum, default_value = "readonly")]
    skills: crate::skills::Sharing,
    /// The git name and email a kit's git-identity@1 gets, as `Name <email>` (default: the
    /// pair pinned by an earlier run of the named sandbox, else the host's global git
    /// `user.name` and `user.email`). Nothing else of the host's git config is shown.
    #[arg(long, value_name = "NAME <EMAIL>", value_parser = crate::identity::GitIdentity::parse)]
    git_identity: Option<crate::identity::GitIdentity>,
    /// Internal to `capgate warm`: prepare the sandbox, then wait on this control socket
    /// for a run to take it.
    #[arg(long, hide = true, value_name = "FD")]
    warm_ctl: Option<i32>,
    /// The command (default: a shell).
    #[arg(last = true, value_name = "CMD")]
    command: Vec<String>,
}

impl RunArgs {
    /// The host directory the workspace shows, as given (`--workspace`, else the current
    /// directory).
    fn workspace_dir(&self) -> Result<PathBuf> {
        match &self.workspace {
            Some(w) => Ok(w.clone()),
            None => std::env::current_dir().context("cannot read the current directory"),
        }
    }
}

/// A size as kits write them (`512m`, `1.5g`, `2GiB`, `4096`; units are powers of 1024).
fn parse_size(s: &str) -> Result<u64, String> {
    capgate_spec::caps::storage::size_in_bytes(s.trim())
        .ok_or_else(|| format!("`{s}` is not a size such as `512m`, `1.5g` or `2GiB`"))
}

/// `--cpus`: a positive number of CPUs, as thousandths of a CPU.
fn parse_cpus(s: &str) -> Result<u32, String> {
    match s.trim().parse::<f64>() {
        Ok(cpus) if cpus > 0.0 => millicpus(cpus),
        _ => Err(format!(
            "`{s}` is not a number of CPUs such as `0.5` or `2` (more than zero)"
        )),
    }
}

/// `cpus` CPUs as thousandths of a CPU: at least 1, and refused beyond what a limit can
/// say (over four million CPUs).
fn millicpus(cpus: f64) -> Result<u32, String> {
    let milli = (cpus * 1000.0).round();
    if !milli.is_finite() || milli > f64::from(u32::MAX) {
        return Err(format!("{cpus} CPUs is more than a limit can express"));
    }
    // In range and finite, so the cast is exact.
    Ok((milli as u32).max(1))
}

/// Why capgate's data directory `data` (canonical) cannot stay where it is while a sandbox
/// runs, if it cannot: beneath a host directory every sandbox sees read-only (`/usr`, …),
/// its CA key, secrets and policy store would be readable by the workload, which owns them
/// (it runs as the invoking user, or as root for root).
fn data_dir_problem(data: &Path, shown: &[PathBuf]) -> Option<String> {
    let dir = shown.iter().find(|d| data.starts_with(d))?;
    Some(format!(
        "capgate's data directory `{}` is beneath `{}`, which every sandbox sees: its CA key, secrets and policy store would be readable inside; set CAPGATE_HOME elsewhere",
        data.display(),
        dir.display()
    ))
}

/// Why `workspace` cannot be given to a sandbox, if it cannot (both paths canonical): it
/// would show the workload capgate's own data directory (the CA key, the secrets, the
/// policy store; writable with `--mount`), or the whole host.
fn workspace_problem(workspace: &Path, data: &Path) -> Option<String> {
    if workspace == Path::new("/") {
        return Some("the workspace is `/`, the whole host; run from a project directory or give --workspace DIR".to_owned());
    }
    if data.starts_with(workspace) || workspace.starts_with(data) {
        return Some(format!(
            "the workspace `{}` {} capgate's data directory `{}` (its CA key, secrets and policy store must stay out of every sandbox); run from a project directory, give --workspace DIR, or set CAPGATE_HOME outside the workspace",
            workspace.display(),
            if workspace.starts_with(data) {
                "is inside"
            } else {
                "contains"
            },
            data.display()
        ));
    }
    None
}

/// Writes the built-in kit into the data directory and returns its directory.
fn default_kit() -> Result<PathBuf> {
    let dir = data_dir()?.join("builtin").join("shell");
    crate::state::private_dir(&dir)?;
    let file = dir.join("kit.yaml");
    if std::fs::read_to_string(&file).ok().as_deref() != Some(DEFAULT_KIT) {
        // Replaced, never written through: a link left at that name points nowhere after.
        crate::state::write_atomically(&file, DEFAULT_KIT.as_bytes(), 0o600)
            .with_context(|| format!("cannot write `{}`", file.display()))?;
    }
    Ok(dir)
}

fn random_name() -> String {
    let mut b = [0u8; 3];
    if getrandom::fill(&mut b).is_err() {
        b = std::process::id().to_le_bytes()[..3]
            .try_into()
            .unwrap_or([0; 3]);
    }
    format!("run-{:02x}{:02x}{:02x}", b[0], b[1], b[2])
}

/// The composition's typed entries of one kind.
fn lifecycle(plan: &Plan) -> Option<Lifecycle> {
    crate::sandbox::capabilities(plan).find_map(|c| match c {
        Capability::Lifecycle(l) => Some(l.clone()),
        _ => None,
    })
}

/// The composition's resources@1 entry (one author, spec §2.9), if any.
fn resources(plan: &Plan) -> Option<&Resources> {
    crate::sandbox::capabilities(plan).find_map(|c| match c {
        Capability::Resources(r) => Some(r),
        _ => None,
    })
}

/// resources@1 `memory`, in bytes. A value that cannot be applied is an error, never a
/// limit quietly left out.
fn memory_from_kits(plan: &Plan) -> Result<Option<u64>, String> {
    match resources(plan)
        .and_then(|r| r.memory.as_deref())
        .map(str::trim)
    {
        None | Some("") => Ok(None),
        Some(m) => parse_size(m)
            .map(Some)
            .map_err(|e| format!("resources@1 memory: {e}")),
    }
}

/// resources@1 `cpu`, in thousandths of a CPU; `0` (or none) asks for no limit.
fn cpus_from_kits(plan: &Plan) -> Result<Option<u32>, String> {
    match resources(plan).and_then(|r| r.cpu) {
        None | Some(0.0) => Ok(None),
        Some(c) => millicpus(c)
            .map(Some)
            .map_err(|e| format!("resources@1 cpu: {e}")),
    }
}

/// volume@1 and host-mount@1 as mounts: persistent directories under the data directory
/// (per sandbox for volumes, per declaring kit for host mounts), or tmpfs.
fn volumes(plan: &Plan, base: &Path, sandbox_dir: &Path) -> Result<Vec<VolumeMount>> {
    let mut out = Vec::new();
    // One directory name per cleaned path, reversibly (`%` first, then `/`).
    let key = |p: &str| {
        capgate_spec::caps::clean_path(p)
            .trim_start_matches('/')
            .replace('%', "%25")
            .replace('/', "%2F")
    };
    // A host mount belongs to the kit that declares it (only one kit may, spec §2.6): its
    // directory is keyed on that kit's identity, here its canonical location, so another
    // kit declaring the same path never sees its contents, while updates in place keep them.
    let mut owners: BTreeMap<String, String> = BTreeMap::new();
    let kit_key = |reference: &str| {
        let location = base.join(reference);
        let identity = std::fs::canonicalize(&location).unwrap_or(location);
        let digest = capgate_resolve::lock::digest_of(identity.as_os_str().as_encoded_bytes());
        digest
            .trim_start_matches("sha256:")
            .get(..16)
            .unwrap_or_default()
            .to_owned()
    };
    for (unit, selection) in plan.layered_selections() {
        for (_, entry) in &selection.entries {
            if let Some(Capability::HostMount(m)) = &entry.capability {
                owners
                    .entry(capgate_spec::caps::clean_path(&m.path))
                    .or_insert_with(|| kit_key(&unit.reference));
            }
        }
    }
    for e in &plan.composed.entries {
        match &e.capability {
            Some(Capability::Volume(v)) if v.tmpfs => out.push(VolumeMount {
                target: PathBuf::from(capgate_spec::caps::clean_path(&v.path)),
                source: VolumeSource::Tmpfs {
                    size: parse_size(&v.size).unwrap_or(capgate_sandbox::DEFAULT_TMPFS_SIZE),
                },
            }),
            Some(Capability::Volume(v)) => out.push(VolumeMount {
                target: PathBuf::from(capgate_spec::caps::clean_path(&v.path)),
                source: VolumeSource::Dir(sandbox_dir.join("volumes").join(key(&v.path))),
            }),
            Some(Capability::HostMount(m)) => {
                let owner = owners
                    .get(&capgate_spec::caps::clean_path(&m.path))
                    .with_context(|| format!("host-mount `{}`: no kit declares it", m.path))?;
                out.push(VolumeMount {
                    target: PathBuf::from(&m.path),
                    source: VolumeSource::Dir(
                        data_dir()?
                            .join("host-mounts")
                            .join(owner)
                            .join(key(&m.path)),
                    ),
                });
            }
            _ => {}
        }
    }
    Ok(out)
}

/// The environments inside (never the host's): the baseline every command starts from
/// (`PATH HOME HOSTNAME TERM …`), and the workload's (the baseline plus the proxy, CA and
/// credential variables and the kits' `env:` exports). Hooks get the baseline plus only the
/// names they declare in `env` (spec §2.12), taking their values from the workload's.
struct Environments {
    baseline: Vec<(String, String)>,
    workload: BTreeMap<String, String>,
    /// `SSH_AUTH_SOCK` for install hooks that declare it (an install-phase grant).
    install_ssh: Option<String>,
}

impl Environments {
    fn new(sandbox: &str, plan: &Plan) -> Result<Environments> {
        let mut baseline: BTreeMap<String, String> = BTreeMap::new();
        for (k, v) in [
            ("HOME", "/home/agent"),
            ("USER", "agent"),
            ("LOGNAME", "agent"),
            (
                "PATH",
                "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            ),
            ("LANG", "C.UTF-8"),
            ("HOSTNAME", sandbox),
        ] {
            baseline.insert(k.to_owned(), v.to_owned());
        }
        baseline.insert("TERM".to_owned(), term().to_owned());
        let mut workload = baseline.clone();
        // Kit args exported with `env:`.
        for unit in plan.layered_units() {
            for decl in &unit.descriptor.args {
                if let (Some(name), Some(value)) = (&decl.env, unit.args.get(&decl.name)) {
                    workload.insert(name.clone(), value.clone());
                }
            }
        }
        workload.extend(workload_env(
            sandbox,
            &format!("http://{PROXY_ADDR}"),
            CA_IN_SANDBOX,
        )?);
        workload.insert("ALL_PROXY".to_owned(), format!("socks5h://{SOCKS_ADDR}"));
        workload.insert("all_proxy".to_owned(), format!("socks5h://{SOCKS_ADDR}"));
        Ok(Environments {
            baseline: baseline.into_iter().collect(),
            workload,
            install_ssh: None,
        })
    }

    /// `SSH_AUTH_SOCK` (the relayed agent) for the phases granted: the workload and the
    /// startup hooks that declare it (runtime), the install hooks that declare it (install).
    fn ssh_agent(&mut self, install: bool, runtime: bool) {
        let sock = crate::sshagent::SOCKET_IN_SANDBOX.to_owned();
        if runtime {
            self.workload
                .insert("SSH_AUTH_SOCK".to_owned(), sock.clone());
        }
        if install {
            self.install_ssh = Some(sock);
        }
    }

    /// What an install hook declaring `names` adds to the baseline: as [`Self::hook`],
    /// with `SSH_AUTH_SOCK` only under an install-phase grant.
    fn install_hook(&self, names: &[String]) -> Vec<(String, String)> {
        let mut env: Vec<_> = self
            .hook(names)
            .into_iter()
            .filter(|(k, _)| k != "SSH_AUTH_SOCK")
            .collect();
        if let Some(sock) = &self.install_ssh
            && names.iter().any(|n| n == "SSH_AUTH_SOCK")
        {
            env.push(("SSH_AUTH_SOCK".to_owned(), sock.clone()));
        }
        env
    }

    /// What a hook declaring `names` adds to the baseline.
    fn hook(&self, names: &[String]) -> Vec<(String, String)> {
        names
            .iter()
            .filter_map(|n| self.workload.get(n).map(|v| (n.clone(), v.clone())))
            .collect()
    }

    /// What the workload adds to the baseline.
    fn workload(&self) -> Vec<(String, String)> {
        self.workload
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    }
}

/// Disarms the run's signal handling when dropped (see `run_provisioned`).
struct Disarm<'a>(&'a crate::interrupt::Interrupt);

impl Drop for Disarm<'_> {
    fn drop(&mut self) {
        self.0.disarm();
    }
}

/// The `TERM` of commands inside: a terminal's where the caller's stdout is one.
fn term() -> &'static str {
    if std::io::stdout().is_terminal() {
        TERMINAL
    } else {
        "dumb"
    }
}

/// The `TERM` of commands whose stdout is a terminal (a pty of the sandbox's own).
const TERMINAL: &str = "xterm-256color";

/// How long a run's end waits for the gateway's connections to finish recording (a
/// connection whose upstream does not close when the sandbox's side has is cut then).
const GATEWAY_PATIENCE: std::time::Duration = std::time::Duration::from_millis(200);

/// Maps a failure to start the sandbox or the command onto the container-runtime codes.
fn start_failure(e: &SandboxError) -> u8 {
    match e {
        SandboxError::Command { message, .. }
            if message.contains("No such file") || message.contains("not found") =>
        {
            127
        }
        SandboxError::Command { .. } => 126,
        _ => 125,
    }
}

fn status_code(status: std::process::ExitStatus) -> u8 {
    use std::os::unix::process::ExitStatusExt as _;
    match (status.code(), status.signal()) {
        (Some(c), _) => u8::try_from(c).unwrap_or(1),
        (None, Some(sig)) => u8::try_from(128 + sig).unwrap_or(255),
        _ => 1,
    }
}

pub fn run(args: &RunArgs) -> Result<u8> {
    let Some(fd) = args.warm_ctl else {
        // A sandbox `capgate warm` prepared for these options, if there is one.
        if let Some(code) = warm::claim(args) {
            return Ok(code);
        }
        return run_here(args, None);
    };
    // A worker of `capgate warm`: its output goes to the caller that claims it, errors
    // included.
    let mut worker = warm::Worker::adopt(fd, args)?;
    let code = match run_here(args, Some(&mut worker)) {
        Ok(code) => code,
        Err(e) => {
            say!("capgate: {}", printable(&format!("{e:#}")));
            exit::INVALID
        }
    };
    drop(worker);
    Ok(code)
}

fn run_here(args: &RunArgs, mut worker: Option<&mut warm::Worker>) -> Result<u8> {
    // The helper starts first: its exec and its reading of the host overlap with resolving
    // the kits and configuring the gateway. A failure to start it is reported where the
    // sandbox would start; if the run ends before that, dropping it ends the helper.
    let helper = HelperCommand {
        exe: std::env::current_exe().context("cannot find the capgate executable")?,
        args: vec![OsString::from("__sandbox")],
    };
    let prepared = Sandbox::prepare(&helper);
    let interrupt = crate::interrupt::Interrupt::catch()?;
    let ephemeral = args.name.is_none();
    let name = args.name.clone().unwrap_or_else(random_name);
    // One connection for the run: provisioning, the gateway's rules, the summary, removal.
    let mut store = open_store()?;
    // One run of a sandbox at a time, from its provisioning to its copy-back: a second run
    // of the same name would re-provision its rules, and write its upper directory while
    // copy-back reads it.
    let dir = SandboxDir::of(&name)?;
    let lock = match dir.lock()? {
        Some(lock) => lock,
        None => {
            say!(
                "capgate: the sandbox could not start: a sandbox named `{name}` is in use by another `capgate run` or `capgate create`"
            );
            return Ok(125);
        }
    };
    // A name a killed ephemeral run left starts afresh.
    dir.clear_abandoned(&name, &mut store)?;
    // Made by this run (under its lock): nothing in the directory but the lock.
    let fresh = std::fs::read_dir(&dir.dir)
        .is_ok_and(|entries| entries.flatten().all(|e| e.file_name() == "lock"));
    // The kits: those named; without any, those a sandbox of this name was made with (a
    // `capgate create`d one runs as created, held to the lock and args it was made with);
    // else the built-in default.
    let recorded = match (args.kits.is_empty(), &args.name) {
        (true, Some(name)) => store.sandbox(name)?.map(|r| r.kits),
        _ => None,
    };
    let made_with = match &recorded {
        Some(_) => dir.made_with()?,
        None => None,
    };
    if recorded.is_some() && made_with.is_none() && args.lock.is_none() {
        // Made before capgate recorded its lock: which lock approved it is not known here.
        say!(
            "capgate: the sandbox `{name}` does not record the lock it was made with; name its kits (--kit) and, if it was not the default, its lock (--lock)"
        );
        return Ok(exit::INVALID);
    }
    let kits = match recorded {
        _ if !args.kits.is_empty() => Ok(args.kits.clone()),
        Some(kits) => Ok(kits.into_iter().map(PathBuf::from).collect()),
        None => default_kit().map(|k| vec![k]),
    };
    let kits = match kits {
        Ok(kits) => kits,
        Err(e) => {
            if fresh {
                let _ = dir.remove();
            }
            return Err(e);
        }
    };
    // Reclaimed if this run is killed; not with --copy-back, whose changes the user may
    // want from the state left behind.
    if ephemeral
        && !args.copy_back
        && let Err(e) = dir.mark_ephemeral()
    {
        let _ = dir.remove();
        return Err(e);
    }
    let (lock_file, kit_args) = match &made_with {
        Some(m) => (
            args.lock.clone().or_else(|| Some(m.lock.clone())),
            if args.args.is_empty() {
                m.args.clone()
            } else {
                args.args.clone()
            },
        ),
        None => (args.lock.clone(), args.args.clone()),
    };
    let create = CreateArgs {
        name: name.clone(),
        kits,
        args: kit_args,
        lock: lock_file,
        approve: args.approve,
        json: false,
        starts: true,
    };
    let provisioned = provision(&create, &mut store, ephemeral);
    let Ok(Ok(provisioned)) = provisioned else {
        // Nothing of the sandbox was made but its directory and lock: one this run made
        // (an ephemeral one, a new name) leaves nothing behind.
        if fresh {
            let _ = dir.remove();
        }
        return provisioned.map(|p| p.err().unwrap_or(exit::INVALID));
    };
    if let Some(w) = worker.as_deref_mut() {
        let read = kit_paths(&provisioned);
        let workspace = args.workspace_dir()?;
        w.watch_inputs(
            read.descriptors,
            (
                read.files,
                read.dirs.into_iter().chain([workspace]).collect(),
            ),
            &read.lost,
        );
    }
    let outcome = run_provisioned(
        args,
        (&name, &provisioned),
        &mut store,
        (prepared, worker.as_deref_mut()),
        &interrupt,
    );
    let outcome = match (outcome, worker) {
        (outcome, None) => outcome,
        // The caller of a prepared sandbox has its status now (an error said to it once);
        // the state goes after, and what that says goes to the supervisor.
        (outcome, Some(w)) => {
            let code = outcome.unwrap_or_else(|e| {
                say!("capgate: {}", printable(&format!("{e:#}")));
                exit::INVALID
            });
            w.finish(interrupt.signalled().unwrap_or(code));
            Ok(code)
        }
    };
    if ephemeral {
        let _ = store.remove_sandbox(&name);
        if let Err(e) = dir.remove() {
            say!("capgate: WARNING: this run's state is left on disk: {e:#}");
        }
    }
    drop(lock);
    // What runs killed before their cleanup left, after this one's work (not on its start).
    crate::state::reclaim_abandoned_runs(&mut store);
    // An interrupted run ends as interrupted programs do, whatever the workload said.
    outcome.map(|code| interrupt.signalled().unwrap_or(code))
}

fn run_provisioned(
    args: &RunArgs,
    (name, provisioned): (&str, &Provisioned),
    store: &mut capgate_policy::Store,
    (prepared, mut worker): (Result<Prepared, SandboxError>, Option<&mut warm::Worker>),
    interrupt: &crate::interrupt::Interrupt,
) -> Result<u8> {
    let (plan, base) = (&provisioned.plan, provisioned.base.as_path());
    let started = Timestamp::now();
    // Seed 002 flags pack versions: a workload kit that states capgate's pack types
    // (`dev.capgate/…`). Other kits' refusals (a denied telemetry host) are routine.
    let workload = plan.layered_units().find(|u| {
        u.descriptor.kind == capgate_spec::Kind::Workload
            && u.descriptor.declared_entries().iter().any(|(_, e)| {
                e.type_name
                    .starts_with(&format!("{}/", capgate_spec::caps::CAPGATE_NAMESPACE))
            })
    });
    if let Some(w) = workload {
        warn_if_flagged(store, w, &crate::sandbox::kit_location(base, &w.reference))?;
    }
    let dir = SandboxDir::of(name)?;
    let workspace = args.workspace_dir()?;
    // Said like every other workspace problem, before anything starts.
    let workspace = match std::fs::canonicalize(&workspace) {
        Ok(w) if w.is_dir() => w,
        Ok(w) => {
            say!(
                "capgate: the sandbox could not start: the workspace `{}` is not a directory",
                capgate_spec::text::printable(&w.display().to_string())
            );
            return Ok(exit::CANNOT_START);
        }
        Err(e) => {
            say!(
                "capgate: the sandbox could not start: the workspace `{}` cannot be used: {e}",
                capgate_spec::text::printable(&workspace.display().to_string())
            );
            return Ok(exit::CANNOT_START);
        }
    };
    let data = data_dir()?;
    let data = std::fs::canonicalize(&data).unwrap_or(data);
    let problem = workspace_problem(&workspace, &data)
        .or_else(|| data_dir_problem(&data, &capgate_sandbox::shown_host_dirs()));
    if let Some(problem) = problem {
        say!("capgate: the sandbox could not start: {problem}");
        return Ok(125);
    }
    // A read-only tier rules out changing the host's files: --mount would let the workload
    // write them, --copy-back would apply its changes, --skills readwrite would let it write
    // the host's skills store (as a host mount is refused).
    let writes_host = if args.mount {
        Some("--mount")
    } else if args.copy_back {
        Some("--copy-back")
    } else if args.skills == crate::skills::Sharing::Readwrite {
        Some("--skills readwrite")
    } else {
        None
    };
    if let Some(flag) = writes_host
        && crate::sandbox::determinism_tier(plan) == Some(capgate_spec::caps::pack::Tier::ReadOnly)
    {
        say!(
            "capgate: the sandbox could not start: the composition's tier is `read-only` (dev.capgate/determinism@1), and {flag} would let the workload change the host's files; run without it"
        );
        return Ok(125);
    }
    // With --mount the workload writes the host directory: a kit or the lock kept there
    // could be rewritten, and the next run's gate would approve the workload's own grants.
    if args.mount {
        let guarded = std::iter::once(base.to_path_buf())
            .chain(plan.layered_units().map(|u| base.join(&u.reference)));
        for path in guarded {
            let path = std::fs::canonicalize(&path).unwrap_or(path);
            if path.starts_with(&workspace) {
                say!(
                    "capgate: the sandbox could not start: with --mount the workload could rewrite `{}` (a kit or the lock's directory inside the workspace `{}`), and with it what the next run approves; keep kits and the lock outside the workspace (--lock FILE), or run without --mount",
                    path.display(),
                    workspace.display()
                );
                return Ok(125);
            }
        }
    }
    if !args.mount
        && args.name.is_some()
        && let Some(problem) = claim_upper(&dir.dir.join("state"), &workspace)?
    {
        say!("capgate: the sandbox could not start: {problem}");
        return Ok(125);
    }
    // git-identity@1: selected (and pinned) before anything starts; a required one that
    // cannot be had refuses the run.
    let identity_wanted = crate::identity::wanted(plan);
    let identity = match identity_wanted {
        None => None,
        Some(optional) => {
            let pin = dir.dir.join("git-identity");
            match crate::identity::select(args.git_identity.as_ref(), &pin) {
                Ok(id) => {
                    crate::identity::pin(&pin, &id)?;
                    Some(id)
                }
                Err(why) if optional => {
                    say!(
                        "capgate: the optional git-identity@1 is skipped: {why}; the workload gets no git name or email"
                    );
                    None
                }
                Err(why) => {
                    say!(
                        "capgate: the sandbox could not start: the kits require git-identity@1, and {why} (set `git config --global user.name` and `user.email` on the host, or give --git-identity 'Name <email>')"
                    );
                    return Ok(125);
                }
            }
        }
    };
    // ssh-agent@1: the host's agent must answer for a required grant.
    let ssh = crate::sshagent::Grants::of(plan);
    let ssh_backing = if ssh.phases.is_empty() {
        None
    } else {
        match crate::sshagent::backing_agent() {
            Ok(path) => Some(path),
            Err(why) if !ssh.required => {
                say!(
                    "capgate: the optional ssh-agent@1 is skipped: {why}; SSH_AUTH_SOCK is not set inside"
                );
                None
            }
            Err(why) => {
                say!(
                    "capgate: the sandbox could not start: the kits require ssh-agent@1, and {why}"
                );
                return Ok(125);
            }
        }
    };
    // agent-context@1: its bodies are read now, so that a kit's missing or escaping
    // contentFile refuses the run before anything starts (only a warning when optional).
    let context = match crate::context::materialize(plan, base) {
        Ok(c) => c,
        Err(why) if crate::context::all_optional(plan) => {
            say!(
                "capgate: WARNING: the optional agent-context@1 is skipped: {}",
                printable(&why)
            );
            crate::context::Materialize::default()
        }
        Err(why) => {
            say!("capgate: the sandbox could not start: {}", printable(&why));
            return Ok(125);
        }
    };
    let hooks = lifecycle(plan);
    let has_install = hooks.as_ref().is_some_and(|l| !l.install.is_empty());
    let first_phase = if has_install {
        Phase::Install
    } else {
        Phase::Runtime
    };

    // The gateway: the sandbox's only way out.
    let rules = gateway::rules_for(store, name)?;
    let cfg = gateway::config(
        name,
        &rules,
        args.upstream_ca.as_deref(),
        args.dangerously_resolve.clone(),
        first_phase,
    )?;
    let phase = Arc::clone(&cfg.phase);
    // The CA the gateway loaded, for the sandbox's trust bundle (read once per run).
    let ca_pem = cfg
        .ca
        .as_ref()
        .map(|ca| ca.cert_pem().to_owned())
        .unwrap_or_default();
    let audit = cfg.audit.clone();
    gateway::watch_store(name.to_owned(), &cfg);
    let gw = Gateway::new(cfg);

    // The sandbox.
    let state_dir = dir.dir.join("state");
    crate::state::private_dir(&state_dir)?;
    let mut spec = SandboxSpec::new(
        name.to_owned(),
        state_dir,
        Workspace {
            host_dir: workspace,
            mode: if args.mount {
                WorkspaceMode::Mount
            } else {
                WorkspaceMode::Copy
            },
        },
    );
    spec.volumes = volumes(plan, base, &dir.dir)?;
    let ssh_listener = match &ssh_backing {
        Some(_) => {
            let host_dir = dir.dir.join("ssh-agent");
            let listener = crate::sshagent::listen(&host_dir).with_context(|| {
                format!(
                    "cannot make the SSH agent socket in `{}`",
                    host_dir.display()
                )
            })?;
            let meta = std::fs::metadata(&host_dir)
                .with_context(|| format!("cannot read `{}`", host_dir.display()))?;
            spec.volumes.push(VolumeMount {
                target: PathBuf::from(crate::sshagent::DIR_IN_SANDBOX),
                source: VolumeSource::HostDir {
                    path: host_dir,
                    identity: (
                        std::os::unix::fs::MetadataExt::dev(&meta),
                        std::os::unix::fs::MetadataExt::ino(&meta),
                    ),
                    writable: false,
                },
            });
            Some(listener)
        }
        None => None,
    };
    let taken: Vec<PathBuf> = spec.volumes.iter().map(|v| v.target.clone()).collect();
    let guarded = crate::skills::Guarded {
        paths: std::iter::once(spec.workspace.host_dir.clone())
            .chain(std::iter::once(base.to_path_buf()))
            .chain(plan.layered_units().map(|u| base.join(&u.reference)))
            .chain(args.lock.clone())
            .collect(),
    };
    let skills = crate::skills::mounts(
        plan,
        args.skills,
        &data.join("skills"),
        &data,
        &taken,
        &guarded,
    );
    spec.volumes.extend(skills.mounts);
    for note in skills.notes {
        say!("capgate: {note}");
    }
    // A pack's exec allowlist, read list and write places (dev.capgate/exec@1,
    // filesystem@1): what it may execute, what of the workspace it sees, where it writes.
    let paths = |list: &[String]| list.iter().map(PathBuf::from).collect::<Vec<_>>();
    for capability in crate::sandbox::capabilities(plan) {
        match capability {
            Capability::Exec(x) => spec.exec_only = Some(paths(&x.allow)),
            Capability::Filesystem(f) => {
                spec.workspace_read = f.read.as_deref().map(paths);
                spec.write_only = Some(paths(&f.write));
            }
            _ => {}
        }
    }
    spec.etc = EtcFiles {
        shell: PathBuf::from(if Path::new("/bin/bash").exists() {
            "/bin/bash"
        } else {
            "/bin/sh"
        }),
        hosts: None,
        resolv_conf: None,
        trusted_ca: ca_pem,
    };
    let mut envs = Environments::new(name, plan)?;
    if ssh_backing.is_some() {
        envs.ssh_agent(ssh.granted(Phase::Install), ssh.granted(Phase::Runtime));
    }
    spec.env = envs.baseline.clone();
    spec.limits.pids = args.pids;
    spec.limits.memory = match (args.memory, memory_from_kits(plan)) {
        (Some(m), _) => Some(m),
        (None, Ok(m)) => m,
        (None, Err(e)) if args.dangerously_skip_limits => {
            say!("capgate: WARNING: memory NOT limited (--dangerously-skip-limits): {e}");
            None
        }
        (None, Err(e)) => {
            say!(
                "capgate: the sandbox could not start: {e} (give --memory SIZE, or --dangerously-skip-limits to run without a memory limit)"
            );
            return Ok(125);
        }
    };
    spec.limits.millicpus = match (args.cpus, cpus_from_kits(plan)) {
        (Some(c), _) => Some(c),
        (None, Ok(c)) => c,
        (None, Err(e)) => {
            say!("capgate: the sandbox could not start: {e} (give --cpus CPUS)");
            return Ok(125);
        }
    };
    spec.limits.skip_unavailable = args.dangerously_skip_limits;
    let addr = |s: &str| -> Result<SocketAddr> { Ok(s.parse()?) };
    spec.listeners = vec![
        ListenerSpec {
            addr: addr(PROXY_ADDR)?,
            kind: ListenerKind::Tcp,
        },
        ListenerSpec {
            addr: addr(SOCKS_ADDR)?,
            kind: ListenerKind::Tcp,
        },
        ListenerSpec {
            addr: addr(DNS_ADDR)?,
            kind: ListenerKind::Udp,
        },
    ];
    // port@1: the host reaches these through the sandbox's dialer.
    let ports = crate::ports::requested(plan);
    spec.dialer = !ports.is_empty();
    if let Some(code) = interrupt.signalled() {
        return Ok(code); // nothing started yet
    }
    let (mut sandbox, fds) = match prepared.and_then(|p| p.start(&spec)) {
        Ok(s) => s,
        Err(e) => {
            say!(
                "capgate: the sandbox could not start: {}",
                printable(&e.to_string())
            );
            // What the host offers explains a failed start, not a refused request.
            if !matches!(e, capgate_sandbox::SandboxError::InvalidSpec { .. }) {
                say!("{}", capgate_sandbox::probe_host());
            }
            return Ok(start_failure(&e));
        }
    };
    for w in unimplemented(plan) {
        say!("capgate: WARNING: {w}");
    }
    for w in &sandbox.report().warnings {
        say!("capgate: WARNING: {}", w.trim_start_matches("WARNING: "));
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    serve_listeners(&runtime, &gw, fds)?;
    if let (Some(listener), Some(backing)) = (ssh_listener, ssh_backing) {
        let _guard = runtime.enter();
        runtime.spawn(crate::sshagent::serve(
            listener,
            crate::sshagent::Relay {
                grants: ssh,
                backing,
                phase: Arc::clone(&phase),
                audit: audit.clone(),
                sandbox: name.to_owned(),
                known_hosts: crate::sshbind::KnownHosts::load(
                    std::env::var_os("HOME").map(PathBuf::from).as_deref(),
                ),
            },
        ));
    }
    if let Some(dialer) = sandbox.take_dialer() {
        let (published, notes) =
            crate::ports::publish(&runtime, dialer, &ports, &spec.listeners)
                .context("cannot publish the sandbox's ports on the host's loopback")?;
        for note in notes {
            say!("capgate: WARNING: {note}");
        }
        for p in published {
            say!("capgate: {}", p.describe());
        }
    }
    // From here a signal stops the sandbox (see `crate::interrupt`).
    if let Some(stopper) = sandbox.stopper() {
        interrupt.arm(stopper);
    }
    interrupt.watch_window(sandbox.window_watch());

    // Install hooks under install grants, then runtime grants for everything else.
    let mut code = exit::OK;
    if let Some(id) = &identity
        && let Err(e) = write_git_identity(&mut sandbox, id)
    {
        // An optional identity that cannot be set is skipped, like one that cannot be had.
        if identity_wanted == Some(true) {
            say!(
                "capgate: the optional git-identity@1 is skipped: it could not be set inside: {e:#}"
            );
        } else {
            say!("capgate: the git identity could not be set inside: {e:#}");
            code = 1;
        }
    }
    if let Some(l) = hooks.as_ref().filter(|_| code == exit::OK) {
        for (i, hook) in l.install.iter().enumerate() {
            let mut cmd = RunCommand::agent(hook.command.clone());
            cmd.env = envs.install_hook(&hook.env);
            cmd.user = if hook
                .user
                .as_deref()
                .is_some_and(|u| u != "0" && u != "root")
            {
                User::Agent
            } else {
                User::Root
            };
            match sandbox.run(&cmd) {
                Ok(s) if s.success() => {}
                Ok(s) => {
                    say!(
                        "capgate: install hook {} failed (exit {})",
                        i + 1,
                        status_code(s)
                    );
                    code = 1;
                    break;
                }
                Err(e) => {
                    say!("capgate: install hook {} could not start: {e}", i + 1);
                    code = start_failure(&e);
                    break;
                }
            }
        }
    }
    record_exec_refusals(
        sandbox.take_exec_refusals(),
        audit.as_deref(),
        name,
        Phase::Install,
    );
    phase.set(Phase::Runtime);
    if code == exit::OK {
        code = run_workload(
            &mut sandbox,
            (args, worker.as_deref_mut()),
            (hooks.as_ref(), &context),
            &envs,
            interrupt,
        );
    }
    // A prepared sandbox's caller waits for its status: every process inside is killed
    // first (nothing can be refused after that), and the namespaces' teardown, which takes
    // a while, comes after the status is sent. A cold run stops the sandbox here.
    let emptied = worker.is_some() && sandbox.empty().unwrap_or(false);
    let (running, refusals) = if emptied {
        let refusals = sandbox.take_exec_refusals();
        (Some(sandbox), refusals)
    } else {
        // From here the helper's pid is reaped: no signal may use it any more.
        interrupt.disarm();
        // With what was refused until the sandbox stopped: a process the workload left
        // behind may exec after it.
        let (_, refused, dropped) = sandbox.stop_taking_exec_refusals();
        (None, (refused, dropped))
    };
    record_exec_refusals(refusals, audit.as_deref(), name, Phase::Runtime);
    // Whatever way this function leaves, no signal may use the helper's pid once it is
    // reaped: declared after `running`, this is dropped (and disarms) before it.
    let _disarm = Disarm(interrupt);
    // The gateway's connections end with the sandbox: their last records are let in first.
    runtime.block_on(gw.settled(GATEWAY_PATIENCE));
    runtime.shutdown_background();
    if args.copy_back {
        let upper = spec.state_dir.join(capgate_sandbox::OVERLAY_UPPER);
        let guarded = kit_files(provisioned);
        let outcome =
            crate::copyback::copy_back(&upper, &spec.workspace.host_dir, name, &data, &guarded);
        if let Err(e) = &outcome {
            say!(
                "capgate: copy-back failed, nothing was applied: {}",
                capgate_spec::text::printable(&format!("{e:#}"))
            );
            if code == exit::OK {
                code = exit::INVALID;
            }
        }
        match outcome {
            // Carried back whole: the next run of a named sandbox starts from the host's
            // directory again, not from changes already applied.
            Ok(crate::copyback::Outcome::Complete) => {
                if let Err(e) = capgate_sandbox::remove_tree(&upper) {
                    say!(
                        "capgate: WARNING: the copied-back changes are left in {}: {e}",
                        upper.display()
                    );
                }
            }
            // What was not carried back is kept for the user, never lost with the state.
            _ => {
                let parent = data.join("copyback");
                let kept = PathBuf::from(format!(
                    "{}.upper",
                    crate::copyback::unused_dir(&parent, name).display()
                ));
                let moved = crate::state::private_dir(&parent)
                    .and_then(|()| Ok(std::fs::rename(&upper, &kept)?));
                match moved {
                    Ok(()) => say!(
                        "capgate: copy-back: the workload's changes are kept in {}",
                        kept.display()
                    ),
                    Err(e) => {
                        say!("capgate: WARNING: the workload's changes could not be kept: {e:#}")
                    }
                }
            }
        }
    }

    // What was refused. A log that could not be written (a full disk, which the workload
    // can cause) hides refusals: said, and under --fail-on-violation counted as one.
    let mut audit_lost = false;
    if let Some(a) = &audit
        && let Err(e) = a.flush()
    {
        say!(
            "capgate: WARNING: the audit log could not be written, so refusals of this run may be missing from it and from this summary: {}",
            printable(&e.to_string())
        );
        audit_lost = true;
    }
    let refused = summarize(store, name, started)?;
    if let Some(w) = workload
        && refused > 0
    {
        // Best effort: the run's own outcome (its exit code) never depends on the flag.
        if let Err(e) = store.flag_kit(&Violations {
            digest: &w.digest,
            kit: &w.reference,
            version: w.descriptor.version.as_deref(),
            refusals: u64::try_from(refused).unwrap_or(u64::MAX),
            sandbox: name,
        }) {
            say!("capgate: WARNING: this pack version could not be flagged: {e}");
        }
    }
    if args.fail_on_violation && (refused > 0 || audit_lost) {
        if refused == 0 {
            say!("capgate: --fail-on-violation: exit 3, as refusals could not be recorded");
        }
        code = exit::VIOLATION;
    }
    // The caller of a prepared sandbox has its status now, before the sandbox's teardown,
    // the gateway and the audit writer are taken down (the state's removal follows in
    // `run_here`).
    if let Some(w) = worker {
        w.finish(interrupt.signalled().unwrap_or(code));
    }
    if let Some(sandbox) = running {
        interrupt.disarm();
        // Emptied: nothing inside could exec since.
        let _ = sandbox.stop_taking_exec_refusals();
    }
    Ok(code)
}

/// The host files the composition is read from: each kit's descriptor and the bodies its
/// agent-context@1 entries read (`contentFile`), and the lock; and each kit directory,
/// where a new descriptor (`kit.yaml`, which is read first) would replace the one in use.
/// Copy-back diverts the workload's changes to them: applied, the next run would approve
/// the workload's own grants and hooks.
fn kit_files(provisioned: &Provisioned) -> crate::copyback::KitFiles {
    let read = kit_paths(provisioned);
    let canonical = |p: PathBuf| std::fs::canonicalize(&p).unwrap_or(p);
    let descriptors = read.descriptors.into_iter().map(|(path, _)| path);
    crate::copyback::KitFiles {
        files: read
            .files
            .into_iter()
            .chain(descriptors)
            .map(canonical)
            .collect(),
        dirs: read.dirs.into_iter().map(canonical).collect(),
    }
}

/// The host files the composition was read from, as named (not resolved): each kit's
/// descriptor, with the digest of the bytes the composition was made from; the lock and
/// the bodies the kits' agent-context@1 entries read; each kit directory; and the units
/// whose descriptor cannot be found any more.
struct KitPaths {
    descriptors: Vec<(PathBuf, String)>,
    files: Vec<PathBuf>,
    dirs: Vec<PathBuf>,
    lost: Vec<String>,
}

fn kit_paths(provisioned: &Provisioned) -> KitPaths {
    let mut read = KitPaths {
        descriptors: Vec::new(),
        files: vec![provisioned.lock.clone()],
        dirs: Vec::new(),
        lost: Vec::new(),
    };
    for unit in provisioned.plan.layered_units() {
        let kit = provisioned.base.join(&unit.reference);
        let Ok(descriptor) = crate::kitref::descriptor_path(&kit) else {
            read.lost.push(unit.reference.clone());
            continue;
        };
        let dir = crate::kitref::kit_dir(&kit);
        if kit.is_dir() {
            read.dirs.push(dir.clone());
        }
        for (_, entry) in unit.descriptor.declared_entries() {
            if let Some(Capability::AgentContext(c)) = &entry.capability
                && let Some(file) = c.content_file.as_deref().filter(|f| !f.is_empty())
            {
                read.files.push(dir.join(file));
            }
        }
        read.descriptors.push((descriptor, unit.digest.clone()));
    }
    read
}

/// A named sandbox keeps its copy-mode changes (the overlay's upper directory) between
/// runs, and they belong to the workspace they were made on: shown over another one they
/// would mix two trees, and `--copy-back` would carry one's changes (removals included)
/// into the other. Records the workspace beside the upper directory, and refuses a run on
/// another workspace while changes of the first are kept.
fn claim_upper(state: &Path, workspace: &Path) -> Result<Option<String>> {
    let record = state.join("workspace");
    let upper = state.join(capgate_sandbox::OVERLAY_UPPER);
    let held = std::fs::read_dir(&upper).is_ok_and(|mut d| d.next().is_some());
    if let Ok(owner) = std::fs::read(&record) {
        let owner = PathBuf::from(std::ffi::OsString::from_vec(owner));
        if held && owner != workspace {
            return Ok(Some(format!(
                "this sandbox holds changes made on the workspace `{}`; run it there (--workspace), or remove it (capgate rm) to use it on `{}`",
                owner.display(),
                workspace.display()
            )));
        }
    }
    crate::state::private_dir(state)?;
    crate::state::write_atomically(&record, workspace.as_os_str().as_bytes(), 0o600)
        .with_context(|| format!("cannot write `{}`", record.display()))?;
    Ok(None)
}

/// One line per composed entry (or field) `capgate run` does not provide: a GPU, and the
/// skills a kit bundles in its image (capgate builds no image).
fn unimplemented(plan: &Plan) -> Vec<String> {
    crate::sandbox::capabilities(plan)
        .filter_map(|c| match c {
            Capability::Resources(r) => {
                let gpu = r.gpu.as_deref().map(str::trim).filter(|g| !g.is_empty())?;
                Some(format!(
                    "resources@1 gpu `{}` is accepted but not provided by capgate run yet: no GPU device is visible inside",
                    printable(gpu)
                ))
            }
            Capability::AgentSkill(s) => Some(format!(
                "agent-skill@1 `{}` ({}) is accepted but not provided by capgate run: it is bundled in the kit's image, and capgate builds no image; put the skill in the skills store (DATA/skills) to share it",
                printable(s.effective_name()),
                printable(&s.path)
            )),
            _ => None,
        })
        .collect()
}

/// Makes `id` the agent's global git `user.name` and `user.email` inside, as the agent.
fn write_git_identity(sandbox: &mut Sandbox, id: &crate::identity::GitIdentity) -> Result<()> {
    let (name, email) = (
        crate::identity::quoted(&id.name),
        crate::identity::quoted(&id.email),
    );
    let mut cmd = RunCommand::agent([
        "/bin/sh",
        "-c",
        crate::identity::SCRIPT,
        "capgate-git-identity",
        &id.name,
        &id.email,
        &name,
        &email,
    ]);
    cmd.capgate_own = true;
    let status = sandbox.run(&cmd)?;
    if !status.success() {
        bail!("the write inside exited with {}", status_code(status));
    }
    Ok(())
}

/// Writes one lifecycle@1 file inside, as the agent (so it owns it and may change it),
/// before the startup hooks and the workload: parents made, the content passed on stdin,
/// the mode applied (`0644` when none is given); `overwrite: false` keeps a file that is
/// already there.
fn write_kit_file(sandbox: &mut Sandbox, file: &FileSpec) -> Result<()> {
    let script = r#"set -e
if [ "$3" = keep ] && [ -e "$1" ]; then exit 0; fi
mkdir -p "$(dirname "$1")"
cat > "$1"
chmod "$2" "$1""#;
    let mode = file.mode.as_deref().unwrap_or("0644");
    let keep = if file.overwrite { "replace" } else { "keep" };
    write_inside(sandbox, script, &[&file.path, mode, keep], &file.content)
}

/// Runs the shell `script` inside as the agent with `args` (`$1`…), `content` on its
/// stdin; fails unless it exits 0.
fn write_inside(sandbox: &mut Sandbox, script: &str, args: &[&str], content: &str) -> Result<()> {
    let (read, write) = std::io::pipe()?;
    let mut argv = vec!["/bin/sh", "-c", script, "capgate-write"];
    argv.extend_from_slice(args);
    let mut cmd = RunCommand::agent(argv);
    cmd.stdin = Some(read.into());
    cmd.capgate_own = true;
    let content = content.as_bytes().to_vec();
    // The reader may stop early (a file kept); its end of the pipe closing ends the writer.
    let writer = std::thread::spawn(move || {
        let mut write = write;
        let _ = write.write_all(&content);
    });
    let status = sandbox.run(&cmd);
    // Our copy of the read end goes first: a script that stopped reading (a file kept, a
    // failed mkdir) must not leave the writer blocked on a full pipe.
    drop(cmd);
    let _ = writer.join();
    let status = status.map_err(|e| {
        anyhow::anyhow!(
            "{e} (capgate writes it as the agent with /bin/sh, mkdir, cat, chmod and dirname: under an exec allowlist, dev.capgate/exec@1 must list them)"
        )
    })?;
    if !status.success() {
        bail!("the write inside exited with {}", status_code(status));
    }
    Ok(())
}

fn run_workload(
    sandbox: &mut Sandbox,
    (args, worker): (&RunArgs, Option<&mut warm::Worker>),
    (hooks, context): (Option<&Lifecycle>, &crate::context::Materialize),
    envs: &Environments,
    interrupt: &crate::interrupt::Interrupt,
) -> u8 {
    if let Some(l) = hooks {
        for file in &l.files {
            if let Err(e) = write_kit_file(sandbox, file) {
                say!(
                    "capgate: lifecycle file `{}` could not be written: {}",
                    printable(&file.path),
                    printable(&e.to_string())
                );
                return 1;
            }
        }
    }
    // The agent's profiles after the kits' own files, so that a profile a kit writes whole
    // keeps capgate's section too.
    let writes = context
        .bodies
        .iter()
        .map(|(path, text)| (path, text, "whole"))
        .chain(
            context
                .profiles
                .iter()
                .map(|(path, text)| (path, text, "section")),
        );
    // With --mount the workspace is the host's directory, --copy-back carries the copy's
    // changes there, and a named sandbox keeps them for a later --copy-back: capgate's
    // files stay out of it.
    let shared = args.mount || args.copy_back || args.name.is_some();
    for (path, text, how) in writes {
        if shared && Path::new(path).starts_with(capgate_sandbox::WORKSPACE_DIR) {
            say!(
                "capgate: WARNING: agent-context@1 `{}` is not written: it is in the workspace, which {} the host's directory",
                printable(path),
                if args.mount {
                    "--mount shares as"
                } else {
                    "a copy-back (now, or of a named sandbox later) carries back to"
                }
            );
            continue;
        }
        let args = [
            path.as_str(),
            how,
            crate::context::BEGIN,
            crate::context::END,
        ];
        if let Err(e) = write_inside(sandbox, crate::context::SCRIPT, &args, text) {
            let path = printable(path);
            if context.optional {
                say!("capgate: WARNING: agent-context@1 `{path}` could not be written: {e:#}");
            } else {
                say!("capgate: agent-context@1 `{path}` could not be written: {e:#}");
                return 1;
            }
        }
    }
    if let Some(l) = hooks {
        for hook in &l.startup {
            let argv = if hook.background {
                let mut v = vec![
                    "sh".to_owned(),
                    "-c".to_owned(),
                    "\"$@\" >/dev/null 2>&1 &".to_owned(),
                    "sh".to_owned(),
                ];
                v.extend(hook.command.iter().cloned());
                v
            } else {
                hook.command.clone()
            };
            let mut cmd = RunCommand::agent(argv);
            cmd.env = envs.hook(&hook.env);
            if hook
                .user
                .as_deref()
                .is_some_and(|u| u == "0" || u == "root")
            {
                cmd.user = User::Root;
            }
            if let Err(e) = sandbox.run(&cmd) {
                say!("capgate: a startup hook could not start: {e}");
            }
        }
    }
    // A prepared sandbox waits here for the run that takes it, and runs its command.
    let prepared = worker.is_some();
    let command = match worker {
        None => args.command.clone(),
        Some(w) => {
            let name = sandbox.name().to_owned();
            let signalled = || interrupt.signalled().is_some();
            match w.claim(&name, signalled, || sandbox.is_alive()) {
                Ok(Some(argv)) => argv,
                Ok(None) => return exit::OK,
                Err(e) => {
                    say!("capgate: {}", printable(&format!("{e:#}")));
                    return exit::INVALID;
                }
            }
        }
    };
    let argv = if command.is_empty() {
        vec![if Path::new("/bin/bash").exists() {
            "/bin/bash".to_owned()
        } else {
            "/bin/sh".to_owned()
        }]
    } else {
        command
    };
    let mut cmd = RunCommand::agent(argv);
    cmd.env = envs.workload();
    if prepared {
        // As the caller's stdout is (it came after the sandbox's start), unless a kit set it.
        let baseline = |(k, v): &(String, String)| k == "TERM" && (v == "dumb" || v == TERMINAL);
        if cmd.env.iter().any(baseline) {
            cmd.env.retain(|kv| !baseline(kv));
            cmd.env.push(("TERM".to_owned(), term().to_owned()));
        }
    }
    // The command the user works with: the caller's stdin, and a terminal of its own if
    // the user is at one.
    cmd.interactive = true;
    match sandbox.run(&cmd) {
        Ok(status) => status_code(status),
        // Stopped by a signal: said when it came, and the run's code is the signal's.
        Err(e @ SandboxError::Gone { .. }) if interrupt.signalled().is_some() => start_failure(&e),
        Err(e) => {
            say!("capgate: {e}");
            start_failure(&e)
        }
    }
}

/// Accepts on the listeners the sandbox made inside its network namespace.
fn serve_listeners(
    runtime: &tokio::runtime::Runtime,
    gw: &Gateway,
    fds: Vec<OwnedFd>,
) -> Result<()> {
    let mut fds = fds.into_iter();
    let (Some(proxy), Some(socks), Some(dns)) = (fds.next(), fds.next(), fds.next()) else {
        bail!("the sandbox passed out fewer listeners than asked for");
    };
    let _guard = runtime.enter();
    let tcp = |fd: OwnedFd| -> Result<tokio::net::TcpListener> {
        let l = std::net::TcpListener::from(fd);
        l.set_nonblocking(true)?;
        Ok(tokio::net::TcpListener::from_std(l)?)
    };
    let (proxy, socks) = (tcp(proxy)?, tcp(socks)?);
    let udp = std::net::UdpSocket::from(dns);
    udp.set_nonblocking(true)?;
    let dns = tokio::net::UdpSocket::from_std(udp)?;
    let (g1, g2, g3) = (gw.clone(), gw.clone(), gw.clone());
    runtime.spawn(async move { g1.serve_http(proxy).await });
    runtime.spawn(async move { g2.serve_socks(socks).await });
    runtime.spawn(async move { g3.serve_dns(dns).await });
    Ok(())
}

/// Seed 002's flag: a workload kit whose earlier runs were refused something is named on
/// every run of the same bytes, until the kit changes.
/// Warns when the workload's bytes were refused something in earlier runs; `location` is
/// where its kit is, as the user would find it.
fn warn_if_flagged(
    store: &capgate_policy::Store,
    workload: &capgate_resolve::Unit,
    location: &str,
) -> Result<()> {
    let Some(flag) = store.kit_flag(&workload.digest)? else {
        return Ok(());
    };
    let version = flag
        .version
        .as_deref()
        .map(|v| format!(" {}", printable(v)))
        .unwrap_or_default();
    say!(
        "capgate: WARNING: this version of kit `{}`{version} ({}) had {} in {} earlier {}, the last in sandbox `{}` at {}; it stays flagged until the kit changes (see: capgate log --sandbox {})",
        printable(location),
        short_digest(&flag.digest),
        plural_refusals(flag.refusals),
        flag.runs,
        if flag.runs == 1 { "run" } else { "runs" },
        flag.last_sandbox,
        flag.last_at,
        flag.last_sandbox,
    );
    Ok(())
}

fn short_digest(digest: &str) -> &str {
    digest.get(..19).unwrap_or(digest)
}

fn plural_refusals(n: u64) -> String {
    if n == 1 {
        "1 refusal".to_owned()
    } else {
        format!("{n} refusals")
    }
}

/// The host of an exec refusal's audit event (port 0).
pub const EXEC_AUDIT_HOST: &str = "exec";

/// Records the execs the sandbox's exec allowlist refused (in `phase`; and how many more
/// the sandbox did not keep) in the audit log, beside the gateway's refusals: host
/// [`EXEC_AUDIT_HOST`], port 0, method `execve`, the file as the path. Refusals the sandbox
/// could not keep are one `limit_exceeded` event that counts them.
fn record_exec_refusals(
    (refused, dropped): (Vec<capgate_sandbox::ExecRefusal>, u64),
    audit: Option<&capgate_policy::audit::AuditWriter>,
    name: &str,
    phase: Phase,
) {
    let Some(audit) = audit else {
        return;
    };
    let event = |reason| {
        let mut e = capgate_policy::audit::AuditEvent::new(
            name,
            EXEC_AUDIT_HOST,
            0,
            Decision::Deny,
            reason,
        );
        e.phase = Some(phase);
        e.method = Some("execve".to_owned());
        e
    };
    for r in refused {
        let mut e = event(capgate_policy::Reason::ExecNotGranted);
        e.time = Timestamp::from_unix_millis(i64::try_from(r.at_unix_ms).unwrap_or(i64::MAX));
        e.path = Some(r.resolved);
        audit.record(e);
    }
    if dropped > 0 {
        let mut e = event(capgate_policy::Reason::LimitExceeded);
        e.path = Some(format!(
            "({dropped} more refused execs, not kept one by one)"
        ));
        audit.record(e);
    }
}

/// Prints what the gateway refused during the run; returns how many refusals there were.
fn summarize(store: &capgate_policy::Store, name: &str, since: Timestamp) -> Result<usize> {
    let denied: Vec<_> = events(
        store,
        &LogQuery {
            sandbox: Some(name.to_owned()),
            limit: None,
            since: Some(since),
        },
    )?
    .into_iter()
    .filter(|e| e.decision == Decision::Deny)
    .collect();
    if denied.is_empty() {
        return Ok(0);
    }
    let execs = denied
        .iter()
        .filter(|e| e.host == EXEC_AUDIT_HOST && e.port == 0)
        .count();
    say!(
        "capgate: {} refused in sandbox `{name}`:",
        plural(denied.len() - execs, execs)
    );
    let mut shown = BTreeMap::new();
    for e in &denied {
        let what = crate::policy::event_target(e);
        *shown
            .entry((what, e.reason.code(), e.rule_id.clone()))
            .or_insert(0u32) += 1;
    }
    for ((what, reason, rule), count) in shown.iter().take(20) {
        // Named as `capgate policy ls` shows it; the id alone once the rule is gone.
        let rule = match rule.as_deref() {
            Some(id) => match store.rule(id)? {
                Some(r) => format!(" (rule {})", printable(&r.name)),
                None => format!(" (rule {id})"),
            },
            None => String::new(),
        };
        let times = if *count > 1 {
            format!(" ×{count}")
        } else {
            String::new()
        };
        say!("  {what}: {reason}{rule}{times}");
    }
    say!("  (details: capgate policy log --sandbox {name})");
    // A host nothing allows is the common case (a kit that forgot one): say how to grant.
    if let Some(e) = denied
        .iter()
        .find(|e| e.reason == capgate_policy::Reason::NoMatchingAllow && e.port != 0)
    {
        let host = printable(&e.host);
        say!(
            "  (to allow {host}: list it in a kit's network-policy@2 allow and run with --kit, or allow it for every sandbox with `capgate policy allow network {host}`)"
        );
    }
    if denied
        .iter()
        .any(|e| e.reason == capgate_policy::Reason::ExecNotGranted)
    {
        say!(
            "  (exec_not_granted: the pack's dev.capgate/exec@1 `allow` does not list the program; list it there if the pack needs to run it)"
        );
    }
    if denied
        .iter()
        .any(|e| e.reason == capgate_policy::Reason::CaNotTrusted)
    {
        say!(
            "  (ca_not_trusted: a client refused capgate's certificate; in the sandbox capgate's CA is in {CA_IN_SANDBOX}, which SSL_CERT_FILE, NODE_EXTRA_CA_CERTS and the like name; a client with a trust store of its own must be pointed at it)"
        );
    }
    Ok(denied.len())
}

/// "1 request was", "2 requests and 1 exec were", "3 execs were", …
fn plural(requests: usize, execs: usize) -> String {
    let count = |n: usize, what: &str| match n {
        1 => format!("1 {what}"),
        n => format!("{n} {what}s"),
    };
    let (what, total) = match (requests, execs) {
        (r, 0) => (count(r, "request"), r),
        (0, x) => (count(x, "exec"), x),
        (r, x) => (
            format!("{} and {}", count(r, "request"), count(x, "exec")),
            r + x,
        ),
    };
    format!("{what} {}", if total == 1 { "was" } else { "were" })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]
    use super::*;

    #[test]
    fn refusals_are_counted_as_requests_and_execs() {
        assert_eq!(plural(1, 0), "1 request was");
        assert_eq!(plural(3, 0), "3 requests were");
        assert_eq!(plural(0, 1), "1 exec was");
        assert_eq!(plural(0, 2), "2 execs were");
        assert_eq!(plural(1, 1), "1 request and 1 exec were");
        assert_eq!(plural(2, 3), "2 requests and 3 execs were");
    }

    #[test]
    fn a_workspace_never_holds_the_data_directory() {
        let data = Path::new("/home/u/.local/share/capgate");
        let problem = |ws: &str| workspace_problem(Path::new(ws), data);
        assert!(problem("/home/u").unwrap().contains("contains"));
        assert!(problem("/home/u/.local").is_some());
        assert!(problem("/home/u/.local/share/capgate").is_some());
        assert!(
            problem("/home/u/.local/share/capgate/sandboxes/x")
                .unwrap()
                .contains("is inside")
        );
        assert!(problem("/").unwrap().contains("whole host"));
        // Siblings and look-alike prefixes are fine.
        assert_eq!(problem("/home/u/project"), None);
        assert_eq!(problem("/home/u/.local/share/capgate-other"), None);
        assert_eq!(problem("/home/uu"), None);
    }

    #[test]
    fn a_data_directory_beneath_a_shown_host_directory_is_named() {
        let shown = [PathBuf::from("/usr"), PathBuf::from("/usr/lib")];
        let problem = |d: &str| data_dir_problem(Path::new(d), &shown);
        assert!(
            problem("/usr/local/share/capgate")
                .unwrap()
                .contains("beneath `/usr`")
        );
        assert_eq!(problem("/home/u/.local/share/capgate"), None);
        assert_eq!(problem("/usrx/capgate"), None);
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("512m"), Ok(512 << 20));
        assert_eq!(parse_size("2g"), Ok(2 << 30));
        assert_eq!(parse_size("2GiB"), Ok(2 << 30));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("1.5g"), Ok(3 << 29));
        assert!(parse_size("lots").is_err());
        assert!(parse_size("0").is_err());
    }
}
