//! `capgate lock`: record the grant set; on update, list widenings and stop for approval.

use std::collections::BTreeMap;
use std::io::{BufRead as _, IsTerminal as _, Write as _};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use capgate_resolve::{KitWidening, Lock};
use capgate_spec::text::printable;
use serde::Serialize;

use crate::kits;
use crate::{exit, resolve};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The kits of the composition: exactly one workload and any mixins.
    #[arg(required = true, value_name = "KIT")]
    kits: Vec<PathBuf>,
    /// A create-phase arg value (repeatable). A value goes only to kits that declare the arg.
    #[arg(long = "arg", value_name = "NAME=VALUE", value_parser = kits::parse_arg)]
    args: Vec<(String, String)>,
    /// The lock file (default: `capgate.lock` beside the workload kit).
    #[arg(long, value_name = "FILE")]
    lock: Option<PathBuf>,
    /// Approve every widening and write the new lock.
    #[arg(long, conflicts_with = "check")]
    approve: bool,
    /// Change nothing: exit 4 if the composition widens the lock (or there is none), 0 if not.
    #[arg(long)]
    check: bool,
    /// Print `{"widenings": [{"kit", "category", "detail"}], "written": bool}`.
    #[arg(long)]
    json: bool,
}

#[derive(Serialize)]
struct JsonOut<'a> {
    lock: String,
    widenings: &'a [KitWidening],
    written: bool,
}

impl Args {
    /// The lock step of the composition `capgate run` would gate (for `capgate warm`,
    /// before it prepares any sandbox: a lock written on first use is then not written by
    /// the preparations themselves).
    pub fn of_run(
        kits: Vec<PathBuf>,
        args: Vec<(String, String)>,
        lock: Option<PathBuf>,
        approve: bool,
    ) -> Args {
        Args {
            kits,
            args,
            lock,
            approve,
            check: false,
            json: false,
        }
    }
}

pub fn run(args: &Args) -> Result<u8> {
    // Where is the lock? Beside the workload unless given; read the kits once to know.
    let (lock_path, base) = match crate::sandbox::lock_location(
        &args.kits,
        &args.args,
        args.lock.as_deref(),
        args.json,
    ) {
        Ok(Some(found)) => found,
        Ok(None) => {
            // No workload: let the resolver say so, with every other reason.
            return Ok(resolve::plan_kits(&args.kits, &args.args, args.json, None)
                .err()
                .unwrap_or(exit::REFUSED));
        }
        Err(code) => return Ok(code),
    };
    let plan = match resolve::plan_kits(&args.kits, &args.args, args.json, Some(&base)) {
        Ok(p) => p,
        Err(code) => return Ok(code),
    };
    gate(
        &plan,
        &lock_path,
        GateMode {
            approve: args.approve,
            check: args.check,
            json: args.json,
            json_when_approved: true,
        },
    )
}

/// How to treat widenings.
#[derive(Debug, Clone, Copy)]
pub struct GateMode {
    /// Approve every widening.
    pub approve: bool,
    /// Change nothing.
    pub check: bool,
    /// Report as JSON (never prompts).
    pub json: bool,
    /// With `json`: print the report when the plan is approved too (`capgate lock`'s own
    /// output). A caller that prints its own JSON then (`create`) leaves this off, so that
    /// stdout holds one document: the gate's only when it refuses.
    pub json_when_approved: bool,
}

/// Widenings of one kit and category printed one by one before the rest is counted.
const SHOWN_PER_CATEGORY: usize = 20;

/// The largest lock read: kits are at most 1 MiB each, and a lock records less of them.
const MAX_LOCK_BYTES: u64 = 16 * 1024 * 1024;

/// Gates `plan` against the lock at `lock_path`: writes it when there is none (unless
/// checking), applies silently within it, and stops widenings for approval (asking on a
/// terminal). Returns 0 when the plan is approved (and the lock written), 4 when a widening
/// was not approved, 1 when the lock is unusable.
pub fn gate(plan: &capgate_resolve::Plan, lock_path: &Path, mode: GateMode) -> Result<u8> {
    let args = mode;
    let candidate = Lock::from_plan(plan);

    let existing = match crate::state::read_regular(lock_path, MAX_LOCK_BYTES) {
        Ok(bytes) => match Lock::parse(&bytes) {
            Ok(lock) => Some(lock),
            Err(e) => {
                say!(
                    "{}:{}",
                    printable(&lock_path.display().to_string()),
                    printable(&e.to_string())
                );
                say!("capgate: the lock was left as it is; fix or remove it");
                return Ok(exit::INVALID);
            }
        },
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => {
            return Err(e).with_context(|| format!("cannot read `{}`", lock_path.display()));
        }
    };
    // The lock sits beside the kits, where whoever ships them can replace it with one
    // that approves their update. What this user last approved there is kept in the data
    // directory too, and that is what the candidate is held to.
    // Each record with what it holds, read once.
    let records: Vec<(PathBuf, Option<Lock>)> = approval_records(lock_path)?
        .into_iter()
        .map(|r| {
            let held = read_record(&r);
            (r, held)
        })
        .collect();
    let recorded = records.iter().find_map(|(_, held)| held.clone());
    let replaced = recorded
        .as_ref()
        .is_some_and(|r| existing.as_ref() != Some(r));
    let baseline = if replaced {
        recorded.clone()
    } else {
        existing.clone()
    };
    if replaced && !args.json {
        say!(
            "capgate: `{}` is not the lock you last approved (it was changed or removed outside capgate); the composition is held to what you approved",
            printable(&lock_path.display().to_string())
        );
    }
    // Nothing this user approved at this path, yet a lock, or an approval of theirs, at
    // another place a kit of this composition puts one: which kit is the workload (and so
    // where the default lock is) changed, a kit directory became a file or the other way
    // round, or the lock was moved. What was approved there does not carry over (nor does
    // a lock shipped here), and nothing is approved without asking.
    let approved_here = records.iter().any(|(_, held)| held.is_some());
    let elsewhere = if approved_here {
        Vec::new()
    } else {
        locks_beside_other_kits(plan, lock_path, baseline.is_none())
    };
    let widenings = match &baseline {
        _ if !elsewhere.is_empty() => Lock {
            version: capgate_resolve::lock::LOCK_VERSION,
            kits: Vec::new(),
        }
        .gate(plan),
        Some(lock) => lock.gate(plan),
        None if args.check => Lock {
            version: capgate_resolve::lock::LOCK_VERSION,
            kits: Vec::new(),
        }
        .gate(plan),
        None => Vec::new(),
    };
    if !elsewhere.is_empty() && !args.json {
        let shown: Vec<String> = elsewhere
            .iter()
            .map(|p| format!("`{}`", printable(&p.display().to_string())))
            .collect();
        say!(
            "capgate: you approved no lock at `{}`, but {} beside a kit of this composition: a kit's kind or form, or the lock's place, changed, so this composition is approved anew",
            printable(&lock_path.display().to_string()),
            shown.join(" and ")
        );
    }
    let name = lock_path.display().to_string();
    let write = |lock: &Lock| -> Result<()> {
        crate::state::write_atomically(lock_path, lock.to_json().as_bytes(), 0o644)
            .with_context(|| format!("cannot write `{name}`"))
    };

    let approved = if widenings.is_empty() {
        !args.check
    } else {
        if !args.json {
            let mut err = std::io::stderr().lock();
            if baseline.is_some() || !elsewhere.is_empty() {
                writeln!(err, "The composition widens what `{name}` approved:")?;
            } else {
                writeln!(
                    err,
                    "No lock approves this composition yet (`{name}`); it grants:"
                )?;
            }
            let mut last_kit = "";
            // A kit listing thousands of entries must not scroll the one that matters off
            // the screen: past SHOWN_PER_CATEGORY per kit and category, a count.
            let mut shown: BTreeMap<(&str, &str), usize> = BTreeMap::new();
            for w in &widenings {
                // Kit text is spelled out: a control character in a detail must not be
                // able to move the cursor and erase the widening printed above it.
                if w.kit != last_kit {
                    writeln!(err, "{}:", printable(&w.kit))?;
                    last_kit = &w.kit;
                }
                let n = shown.entry((&w.kit, w.category.as_str())).or_default();
                *n += 1;
                if *n > SHOWN_PER_CATEGORY {
                    if *n == SHOWN_PER_CATEGORY + 1 {
                        let total = widenings
                            .iter()
                            .filter(|o| o.kit == w.kit && o.category == w.category)
                            .count();
                        writeln!(
                            err,
                            "  + {}: … and {} more (capgate lock --json lists them all)",
                            w.category.as_str(),
                            total - SHOWN_PER_CATEGORY
                        )?;
                    }
                    continue;
                }
                // A host in another script is also shown as DNS sees it: `api.gіthub.com`
                // (a Cyrillic `і`) must not pass for the name it imitates.
                let dns = w
                    .detail
                    .split_whitespace()
                    .next()
                    .filter(|first| !first.is_ascii())
                    .and_then(ascii_form)
                    .map_or_else(String::new, |a| format!(" (in DNS: {a})"));
                writeln!(
                    err,
                    "  + {}: {}{dns}",
                    w.category.as_str(),
                    printable(&w.detail)
                )?;
            }
        }
        if args.approve {
            true
        } else if args.check || args.json || !std::io::stdin().is_terminal() {
            false
        } else {
            ask("Approve these widenings and update the lock? [y/N] ")?
        }
    };
    if approved {
        let unchanged = existing.as_ref() == Some(&candidate);
        if !unchanged {
            write(&candidate)?;
        }
        for (record, held) in &records {
            if held.as_ref() != Some(&candidate) {
                crate::state::write_private(record, candidate.to_json().as_bytes())?;
            }
        }
        if args.json {
            if args.json_when_approved {
                print_json(&name, &widenings, !unchanged)?;
            }
        } else if existing.is_none() {
            let n = candidate.kits.len();
            say!("wrote {name} ({n} kit{})", if n == 1 { "" } else { "s" });
        } else if !widenings.is_empty() {
            say!("approved; wrote {name}");
        }
        Ok(exit::OK)
    } else {
        if args.json {
            print_json(&name, &widenings, false)?;
        } else if !widenings.is_empty() {
            say!("not approved: `{name}` is unchanged (approve with --approve)");
        }
        Ok(if widenings.is_empty() {
            exit::OK
        } else {
            exit::NEEDS_APPROVAL
        })
    }
}

/// A host as written in a kit (`name`, `*.name`, `**.name`, with `:port` or `:*`) as DNS
/// sees it: the policy's own reading of it (IDNA ASCII form), `None` when it has none.
pub fn ascii_form(host: &str) -> Option<String> {
    capgate_policy::pattern::HostPattern::parse(host)
        .ok()
        .map(|p| p.to_string())
}

/// Where the data directory keeps what this user last approved at `lock_path`: a copy of
/// that lock, named by the SHA-256 of the lock's absolute path, once as the user spelled
/// it and once with its links resolved. Either finds the approval: a kit directory
/// replaced by a link to another (which an update can do) does not make its lock a new one.
fn approval_records(lock_path: &Path) -> Result<Vec<PathBuf>> {
    let dir = lock_path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let resolved = std::fs::canonicalize(dir)
        .with_context(|| format!("cannot find `{}`", dir.display()))?
        .join(lock_path.file_name().unwrap_or_default());
    let spelled = std::path::absolute(lock_path)
        .with_context(|| format!("cannot find `{}`", lock_path.display()))?;
    let store = crate::state::data_dir()?.join("approved-locks");
    let mut out: Vec<PathBuf> = Vec::new();
    for path in [spelled, resolved] {
        let name = capgate_resolve::digest_of(path.as_os_str().as_encoded_bytes());
        let record = store.join(format!("{}.json", name.trim_start_matches("sha256:")));
        if !out.contains(&record) {
            out.push(record);
        }
    }
    Ok(out)
}

/// The lock this user last approved, kept at `record`; `None` when there is none (or it
/// cannot be read, which a new approval replaces).
fn read_record(record: &Path) -> Option<Lock> {
    let bytes = crate::state::read_regular(record, MAX_LOCK_BYTES).ok()?;
    Lock::parse(&bytes).ok()
}

/// The other places a lock of this composition's kits lies or lay, where there is one now
/// (`files`: when there is none at `lock_path`) or this user approved one: beside each kit
/// as the default lock would be if that kit were the workload, and for a kit given as a
/// descriptor file, also inside a directory of that name (where its lock lay when the kit
/// was a directory), other than `lock_path`. Kit references are relative to the lock's
/// directory.
fn locks_beside_other_kits(
    plan: &capgate_resolve::Plan,
    lock_path: &Path,
    files: bool,
) -> Vec<PathBuf> {
    let base = lock_path.parent().unwrap_or(Path::new("."));
    let resolved = |dir: &Path| {
        let dir = if dir.as_os_str().is_empty() {
            Path::new(".")
        } else {
            dir
        };
        std::fs::canonicalize(dir)
            .unwrap_or_else(|_| dir.to_path_buf())
            .join(crate::kits::LOCK_FILE)
    };
    let own = resolved(base);
    let approved = |lock: &Path| {
        approval_records(lock).is_ok_and(|records| records.iter().any(|r| r.is_file()))
    };
    let mut found: Vec<PathBuf> = Vec::new();
    for unit in plan.layered_units() {
        let kit = base.join(&unit.reference);
        let mut places = vec![crate::kitref::kit_dir(&kit)];
        if kit.is_file() {
            places.push(kit.clone());
        }
        for dir in places {
            let candidate = resolved(&dir);
            if candidate == own || found.contains(&candidate) {
                continue;
            }
            if (files && candidate.is_file()) || approved(&candidate) {
                found.push(candidate);
            }
        }
    }
    found
}

fn print_json(lock: &str, widenings: &[KitWidening], written: bool) -> Result<()> {
    let body = JsonOut {
        lock: lock.to_owned(),
        widenings,
        written,
    };
    out!("{}", crate::json_text(&body)?);
    Ok(())
}

fn ask(question: &str) -> Result<bool> {
    let mut err = std::io::stderr().lock();
    write!(err, "{question}")?;
    err.flush()?;
    let mut line = String::new();
    std::io::stdin().lock().read_line(&mut line)?;
    Ok(matches!(line.trim(), "y" | "Y" | "yes" | "Yes"))
}
