//! Reading the kits of a composition from disk into resolver units.
//!
//! Each kit is read strictly (authored form), given the `--arg` values it declares,
//! expanded into its effective form, and judged again. Problems are input errors (exit 1);
//! refusals come later, from the resolver (exit 2).

use std::collections::BTreeMap;
use std::path::{Component, Path, PathBuf};

use capgate_resolve::{Unit, digest_of};
use capgate_spec::text::printable;
use capgate_spec::{Kind, Options};

use crate::kitref;

/// One `NAME=VALUE` given with `--arg`.
pub fn parse_arg(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.is_empty() => Ok((k.to_owned(), v.to_owned())),
        _ => Err(format!("`{s}` is not NAME=VALUE")),
    }
}

/// Kits read from disk, or the problems that stopped them (already formatted
/// `file:line:col: path: message`).
pub struct Kits {
    /// What each kit was named on the command line.
    pub given: Vec<PathBuf>,
    pub units: Vec<Unit>,
}

pub fn read_kits(paths: &[PathBuf], args: &[(String, String)]) -> Result<Kits, Vec<String>> {
    let mut problems = Vec::new();
    let mut units = Vec::new();
    let mut declared_anywhere: Vec<&str> = Vec::new();
    let mut loaded_all = Vec::new();
    for path in paths {
        let file = match kitref::descriptor_path(path) {
            Ok(f) => f,
            Err(e) => {
                problems.push(printable(&format!("{e:#}")).into_owned());
                continue;
            }
        };
        let bytes = match crate::state::read_kit_file(&file) {
            Ok(b) => b,
            Err(e) => {
                problems.push(format!("{}: cannot read the file: {e}", shown(&file)));
                continue;
            }
        };
        let loaded = capgate_spec::load(&bytes, &Options::default());
        if !loaded.is_valid() {
            problems.extend(
                loaded
                    .diagnostics
                    .errors()
                    .map(|d| format!("{}:{d}", shown(&file))),
            );
            continue;
        }
        loaded_all.push((path.clone(), file, bytes, loaded));
    }
    for (_, _, _, loaded) in &loaded_all {
        if let Some(d) = &loaded.descriptor {
            for a in &d.args {
                declared_anywhere.push(a.name.as_str());
            }
        }
    }
    for (name, _) in args {
        if !declared_anywhere.contains(&name.as_str()) {
            problems.push(format!(
                "--arg {name}: no kit of the composition declares an arg `{name}`"
            ));
        }
    }
    for (given, file, bytes, loaded) in &loaded_all {
        let Some(descriptor) = &loaded.descriptor else {
            continue;
        };
        // A value goes only to the kits that declare that arg.
        let supplied: BTreeMap<String, String> = args
            .iter()
            .filter(|(k, _)| descriptor.arg(k).is_some())
            .cloned()
            .collect();
        // Groups are still declarations here: selection comes at composition.
        match capgate_spec::args::effective(loaded, &supplied, &BTreeMap::new(), true) {
            Ok(effective) if effective.is_valid() => {
                let Some(d) = effective.descriptor else {
                    continue;
                };
                let resolved = capgate_spec::args::resolve_args(&descriptor.args, &supplied)
                    .unwrap_or_default();
                units.push(Unit {
                    reference: given.display().to_string(),
                    digest: digest_of(bytes),
                    descriptor: d,
                    args: resolved,
                });
            }
            Ok(effective) => problems.extend(
                effective
                    .diagnostics
                    .errors()
                    .map(|d| format!("{}:{d} (after arg expansion)", shown(file))),
            ),
            Err(errors) => problems.extend(errors.iter().map(|e| {
                // At the arg's declaration, where the kit says what values it takes.
                let at = loaded.root.as_ref().and_then(|r| e.declaration_at(r));
                let place = at
                    .filter(|(_, pos)| pos.is_known())
                    .map_or_else(String::new, |(path, pos)| format!(":{pos}: {path}"));
                format!("{}{place}: {}", shown(file), printable(&e.to_string()))
            })),
        }
    }
    if problems.is_empty() {
        Ok(Kits {
            given: paths.to_vec(),
            units,
        })
    } else {
        Err(problems)
    }
}

/// A file's name as shown: anyone's choice, so spelled out (diagnostics spell out the
/// kit text they quote themselves).
fn shown(file: &Path) -> String {
    printable(&file.display().to_string()).into_owned()
}

/// The lock's file name; by default it lies beside the workload kit.
pub const LOCK_FILE: &str = "capgate.lock";

impl Kits {
    /// Where the lock lives by default: `capgate.lock` beside the workload kit.
    pub fn default_lock_path(&self) -> Option<PathBuf> {
        let (given, _) = self
            .given
            .iter()
            .zip(&self.units)
            .find(|(_, u)| u.descriptor.kind == Kind::Workload)?;
        Some(kitref::kit_dir(given).join(LOCK_FILE))
    }

    /// Names every kit by its path relative to `base` (the lock's directory), so that the
    /// lock matches the same kits from whatever directory capgate runs in.
    pub fn rebase_references(&mut self, base: &Path) {
        for (given, unit) in self.given.iter().zip(&mut self.units) {
            if let Some(rel) = relative_path(base, given) {
                unit.reference = rel;
            }
        }
    }
}

/// `target` relative to directory `base`, both resolved on disk; `None` if either cannot be.
fn relative_path(base: &Path, target: &Path) -> Option<String> {
    let base = std::fs::canonicalize(base).ok()?;
    let target = std::fs::canonicalize(target).ok()?;
    let b: Vec<Component<'_>> = base.components().collect();
    let t: Vec<Component<'_>> = target.components().collect();
    let common = b.iter().zip(&t).take_while(|(x, y)| x == y).count();
    let mut out = PathBuf::new();
    for _ in common..b.len() {
        out.push("..");
    }
    for c in &t[common..] {
        out.push(c);
    }
    let s = out.display().to_string();
    Some(if s.is_empty() { ".".to_owned() } else { s })
}
