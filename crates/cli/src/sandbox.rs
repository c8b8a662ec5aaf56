//! `capgate create`, `capgate ls`, `capgate rm`: sandbox records and their provisioned rules.

use std::path::{Path, PathBuf};

use anyhow::Result;
use capgate_policy::store::{SandboxGrants, SandboxRecord};
use capgate_resolve::Plan;
use capgate_spec::caps::Capability;
use capgate_spec::caps::network::NetworkPolicy;
use capgate_spec::caps::pack::Tier;
use capgate_spec::text::printable;
use serde::Serialize;

use crate::kits::{self, read_kits};
use crate::lock::{GateMode, gate};
use crate::state::{SandboxDir, check_sandbox_name, open_store};
use crate::{exit, resolve};

#[derive(Debug, clap::Args)]
pub struct CreateArgs {
    /// The sandbox's name (a-z, 0-9, `_`, `.`, `-`).
    pub name: String,
    /// A kit of the composition (repeatable): exactly one workload and any mixins.
    #[arg(long = "kit", value_name = "KIT", required = true)]
    pub kits: Vec<PathBuf>,
    /// A create-phase arg value (repeatable). A value goes only to kits that declare the arg.
    #[arg(long = "arg", value_name = "NAME=VALUE", value_parser = kits::parse_arg)]
    pub args: Vec<(String, String)>,
    /// The lock file (default: `capgate.lock` beside the workload kit).
    #[arg(long, value_name = "FILE")]
    pub lock: Option<PathBuf>,
    /// Approve widenings of the lock and write it.
    #[arg(long)]
    pub approve: bool,
    #[arg(long)]
    pub json: bool,
    /// Set by `capgate run`, which goes on to start the sandbox: what only the sandbox's
    /// start would refuse (an exec program or read list it cannot hold) exits 125 there,
    /// as a sandbox that cannot start does.
    #[arg(skip)]
    pub starts: bool,
}

#[derive(Debug, clap::Args)]
pub struct LsArgs {
    #[arg(long)]
    json: bool,
}

#[derive(Debug, clap::Args)]
pub struct RmArgs {
    /// The sandbox to remove, with its provisioned rules and its own user rules.
    name: String,
}

/// The typed capabilities of a composition's merged entries.
pub fn capabilities(plan: &Plan) -> impl Iterator<Item = &Capability> {
    plan.composed
        .entries
        .iter()
        .filter_map(|e| e.capability.as_ref())
}

/// The merged network policy of a composition, if any.
pub fn network_policy(plan: &Plan) -> Option<&NetworkPolicy> {
    capabilities(plan).find_map(|c| match c {
        Capability::NetworkPolicy(p) => Some(p),
        _ => None,
    })
}

/// The composition's determinism tier (`dev.capgate/determinism@1`), if it states one.
pub fn determinism_tier(plan: &Plan) -> Option<Tier> {
    capabilities(plan).find_map(|c| match c {
        Capability::Determinism(d) => Some(d.tier),
        _ => None,
    })
}

/// The rules a composition provisions for sandbox `name`.
pub fn kit_rules(name: &str, plan: &Plan) -> Vec<capgate_policy::store::NewRule> {
    let egress: Vec<_> = capabilities(plan)
        .filter_map(|c| match c {
            Capability::Egress(t) => Some(t),
            _ => None,
        })
        .collect();
    let tier = determinism_tier(plan);
    let mut rules = capgate_policy::provision::kit_rules(name, network_policy(plan), tier);
    rules.extend(capgate_policy::provision::egress_rules(name, &egress, tier));
    rules
}

/// The credential services a composition declares.
pub fn credential_services(plan: &Plan) -> Vec<String> {
    let mut services: Vec<String> = capabilities(plan)
        .filter_map(|c| match c {
            Capability::Credential(c) => Some(c.service.clone()),
            _ => None,
        })
        .collect();
    services.sort();
    services.dedup();
    services
}

/// Where the lock is and what references are relative to.
pub fn lock_location(
    kits: &[PathBuf],
    args: &[(String, String)],
    explicit: Option<&Path>,
    json: bool,
) -> Result<Option<(PathBuf, PathBuf)>, u8> {
    let lock_path = match explicit {
        Some(p) => p.to_path_buf(),
        None => match read_kits(kits, args) {
            Ok(k) => match k.default_lock_path() {
                Some(p) => p,
                None => return Ok(None),
            },
            Err(problems) => {
                resolve::report_invalid(&problems, json);
                return Err(exit::INVALID);
            }
        },
    };
    let base = lock_path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .map_or_else(|| PathBuf::from("."), Path::to_path_buf);
    Ok(Some((lock_path, base)))
}

/// A provisioned composition, the directory its kit references are relative to (the
/// lock's), and its lock.
pub struct Provisioned {
    pub plan: Plan,
    pub base: PathBuf,
    pub lock: PathBuf,
    /// Where each kit of the composition lies, workload first, as the sandbox's record
    /// keeps them.
    pub kits: Vec<String>,
}

/// The composition's kits as paths a reader can follow: the plan's references are
/// relative to the lock's directory `base` (so that the lock can move with its kits),
/// which alone say little (`.`).
fn kit_locations(plan: &Plan, base: &Path) -> Vec<String> {
    let base = std::fs::canonicalize(base).unwrap_or_else(|_| base.to_path_buf());
    plan.order()
        .into_iter()
        .map(|reference| beneath(&base, reference))
        .collect()
}

/// Where the kit `reference` (relative to the composition's `base`) is, as an absolute
/// path without `.` or `..`.
pub(crate) fn kit_location(base: &Path, reference: &str) -> String {
    beneath(
        &std::fs::canonicalize(base).unwrap_or_else(|_| base.to_path_buf()),
        reference,
    )
}

/// `reference` joined to the canonical `base`, its `.` and `..` taken out.
fn beneath(base: &Path, reference: &str) -> String {
    let mut path = PathBuf::new();
    for c in base.join(reference).components() {
        match c {
            std::path::Component::CurDir => {}
            std::path::Component::ParentDir => {
                path.pop();
            }
            other => path.push(other),
        }
    }
    path.display().to_string()
}

/// Resolves, gates against the lock, records the sandbox and provisions its kit rules, then
/// writes its composition and sentinels. `Err(code)` when it must stop (1 invalid, 2
/// refused, 4 needs approval). The composition of an `ephemeral` sandbox (one `capgate run`
/// removes when it ends) is not synced to disk: a crash loses nothing that was to be kept.
pub fn provision(
    args: &CreateArgs,
    store: &mut capgate_policy::Store,
    ephemeral: bool,
) -> Result<Result<Provisioned, u8>> {
    check_sandbox_name(&args.name)?;
    let (plan, lock_path, base) =
        match lock_location(&args.kits, &args.args, args.lock.as_deref(), args.json) {
            Err(code) => return Ok(Err(code)),
            Ok(None) => {
                // No workload: let the resolver say so, with every other reason.
                let code = resolve::plan_kits(&args.kits, &args.args, args.json, None)
                    .err()
                    .unwrap_or(exit::REFUSED);
                return Ok(Err(code));
            }
            Ok(Some((lock_path, base))) => {
                match resolve::plan_kits(&args.kits, &args.args, args.json, Some(&base)) {
                    Ok(p) => (p, lock_path, base),
                    Err(code) => return Ok(Err(code)),
                }
            }
        };
    // What the composition leaves out is said, never dropped in silence: an optional
    // entry of a type capgate does not know (often a typo) would otherwise take, say, an
    // exec list away without a word.
    for k in plan.skipped() {
        say!(
            "capgate: WARNING: kit `{}` {}: this optional entry is skipped and grants nothing: {}",
            capgate_spec::text::printable(&kit_location(&base, &k.kit)),
            capgate_spec::text::printable(&k.path),
            capgate_spec::text::printable(&k.reason)
        );
    }
    // What creating the sandbox would fail on, named at the kit's line, before anything is
    // written (the lock included).
    let refused = crate::validate::refused_by_create(&plan, &base);
    if !refused.is_empty() {
        for (_, line) in &refused {
            say!("{line}");
        }
        say!(
            "capgate: the sandbox cannot be created from these kits (`capgate lint` says the same, and more)"
        );
        use capgate_resolve::lint::Check;
        let sandbox_only = refused
            .iter()
            .all(|(check, _)| matches!(check, Check::ExecInWritablePlace | Check::InvalidReadPath));
        return Ok(Err(if args.starts && sandbox_only {
            exit::CANNOT_START
        } else {
            exit::INVALID
        }));
    }
    // Rules the store would refuse stop everything before anything is written: no lock,
    // no composition (whose credential routes the gateway follows), no sentinels.
    let rules = kit_rules(&args.name, &plan);
    for rule in &rules {
        rule.validate()?;
    }
    let code = gate(
        &plan,
        &lock_path,
        GateMode {
            approve: args.approve,
            check: false,
            json: args.json,
            json_when_approved: false,
        },
    )?;
    if code != exit::OK {
        return Ok(Err(code));
    }
    let lock_digest = capgate_resolve::digest_of(&std::fs::read(&lock_path)?);
    let kits = kit_locations(&plan, &base);
    let record = SandboxRecord::new(
        args.name.clone(),
        kits.clone(),
        SandboxGrants::LockDigest(lock_digest),
    );
    // The store first, which is where a refusal would come from: the composition (and
    // its credentials' inject domains) changes only once the kits' rules are in force.
    store.provision_sandbox(record, rules)?;
    let dir = SandboxDir::of(&args.name)?;
    dir.create()?;
    // Read only by a later `run --name`: an ephemeral run has none.
    if !ephemeral {
        dir.write_made_with(&crate::state::MadeWith {
            lock: std::path::absolute(&lock_path).unwrap_or_else(|_| lock_path.clone()),
            args: args.args.clone(),
        })?;
    }
    dir.write_composition(&plan.composed.descriptor(), !ephemeral)?;
    dir.sentinels(&credential_services(&plan))?;
    Ok(Ok(Provisioned {
        plan,
        base,
        lock: lock_path,
        kits,
    }))
}

#[derive(Serialize)]
struct Created<'a> {
    name: &'a str,
    kits: &'a [String],
    rules: usize,
}

pub fn create(args: &CreateArgs) -> Result<u8> {
    let mut store = open_store()?;
    // Not while a run of the name holds its lock (it would re-provision the rules under
    // the running gateway), nor beside an `rm` of it.
    let dir = SandboxDir::of(&args.name)?;
    let Some(_lock) = dir.lock()? else {
        say!(
            "capgate: the sandbox `{}` is in use by a `capgate run` or `capgate rm`; try again when it ends",
            args.name
        );
        return Ok(exit::REFUSED);
    };
    // A name a killed ephemeral run left starts afresh.
    dir.clear_abandoned(&args.name, &mut store)?;
    // Made by this call (under its lock): nothing in the directory but the lock.
    let fresh = std::fs::read_dir(&dir.dir)
        .is_ok_and(|entries| entries.flatten().all(|e| e.file_name() == "lock"));
    let recorded = store.sandbox(&args.name)?.is_some();
    let provisioned = match provision(args, &mut store, false) {
        Ok(Ok(p)) => p,
        refused => {
            // A refused or failed create of a new name leaves nothing behind.
            if fresh {
                if !recorded {
                    let _ = store.remove_sandbox(&args.name);
                }
                let _ = dir.remove();
            }
            return refused.map(|r| r.err().unwrap_or(exit::INVALID));
        }
    };
    let rules = kit_rules(&args.name, &provisioned.plan).len();
    if args.json {
        let body = Created {
            name: &args.name,
            kits: &provisioned.kits,
            rules,
        };
        out!("{}", crate::json_text(&body)?);
    } else {
        out!(
            "created sandbox `{}` from {} ({} kit rules provisioned)",
            args.name,
            provisioned.kits.join(", "),
            rules
        );
    }
    Ok(exit::OK)
}

pub fn ls(args: &LsArgs) -> Result<u8> {
    let mut store = open_store()?;
    // A killed run's sandbox is not one to list.
    crate::state::reclaim_abandoned_runs(&mut store);
    let sandboxes = store.sandboxes()?;
    if args.json {
        out!(
            "{}",
            crate::json_text(&serde_json::json!({ "sandboxes": sandboxes }))?
        );
    } else if sandboxes.is_empty() {
        out!("no sandboxes (create one with `capgate create NAME --kit KIT`)");
    } else {
        out!("{:<24} {:<9} {:<26} KITS", "NAME", "STATE", "CREATED");
        for s in sandboxes {
            out!(
                "{:<24} {:<9} {:<26} {}",
                s.name,
                s.state.as_str(),
                s.created_at.to_string(),
                s.kits.join(", ")
            );
        }
    }
    Ok(exit::OK)
}

pub fn rm(args: &RmArgs) -> Result<u8> {
    let mut store = open_store()?;
    // The directory first (its sentinels, volumes and state), the record last: a removal
    // that fails half-way leaves the record, so `rm` can be run again, and a later `create`
    // of the name never inherits the old sentinels.
    if store.sandbox(&args.name)?.is_some() {
        // Not while a run of it holds its lock (its state and upper directory in use).
        let dir = SandboxDir::of(&args.name)?;
        let Some(_lock) = dir.lock()? else {
            say!(
                "capgate: the sandbox `{}` is in use by a `capgate run` (stop it first) or `capgate create`",
                args.name
            );
            return Ok(exit::REFUSED);
        };
        dir.remove()?;
    }
    let removed = store.remove_sandbox(&args.name)?;
    let n = removed.rules.len();
    out!(
        "removed sandbox `{}` and its {n} rule{}",
        args.name,
        if n == 1 { "" } else { "s" }
    );
    // The user's work, never removed with the sandbox: said, so it is not forgotten.
    let others: Vec<String> = store.sandboxes()?.into_iter().map(|s| s.name).collect();
    let kept = crate::copyback::kept_for(
        &crate::state::data_dir()?.join("copyback"),
        &args.name,
        &others,
    );
    if !kept.is_empty() {
        say!(
            "capgate: what copy-back kept of `{}` stays, for you to review (remove it with `rm -r` when done):",
            printable(&args.name)
        );
        for path in &kept {
            say!("  {}", printable(&path.display().to_string()));
        }
    }
    Ok(exit::OK)
}
