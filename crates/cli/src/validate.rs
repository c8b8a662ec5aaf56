//! `capgate validate`: strict decode and validation of descriptors, every problem reported.

use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::PathBuf;

use anyhow::Result;
use capgate_spec::text::printable;
use capgate_spec::{Options, Profile, load};
use serde::Serialize;

use crate::{exit, kitref};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Descriptor files or kit directories.
    #[arg(required = true, value_name = "PATH")]
    paths: Vec<PathBuf>,
    /// Print a JSON report instead of text.
    #[arg(long)]
    json: bool,
    /// Judge the published form (as found in an image annotation) instead of the authored one.
    #[arg(long)]
    published: bool,
    /// Also judge the effective form: create-phase args expanded (defaults, or the values
    /// given with `--arg`), then every rule applied strictly.
    #[arg(long)]
    effective: bool,
    /// A create-phase arg value for the effective form (repeatable; implies `--effective`).
    /// A value goes only to kits that declare that arg.
    #[arg(long = "arg", value_name = "NAME=VALUE", value_parser = crate::kits::parse_arg)]
    args: Vec<(String, String)>,
}

/// One problem, as `--json` reports it.
#[derive(Debug, Serialize)]
struct Problem {
    file: String,
    /// The lint check (`capgate lint` only).
    #[serde(skip_serializing_if = "Option::is_none")]
    check: Option<&'static str>,
    severity: &'static str,
    path: String,
    line: Option<u32>,
    column: Option<u32>,
    message: String,
}

#[derive(Debug, Serialize)]
struct FileReport {
    file: String,
    valid: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    kind: Option<String>,
    /// The declared capability types, de-duplicated and sorted.
    #[serde(skip_serializing_if = "Option::is_none")]
    capabilities: Option<Vec<String>>,
}

#[derive(Debug, Serialize)]
struct Report {
    valid: bool,
    files: Vec<FileReport>,
    problems: Vec<Problem>,
}

impl FileReport {
    fn unreadable(file: &str) -> FileReport {
        FileReport {
            file: file.to_owned(),
            valid: false,
            kind: None,
            capabilities: None,
        }
    }
}

impl Problem {
    /// A problem with the whole file (it cannot be found or read).
    fn whole_file(file: String, message: String) -> Problem {
        Problem {
            file,
            check: None,
            severity: "error",
            path: String::new(),
            line: None,
            column: None,
            message,
        }
    }

    fn of_diagnostic(file: &str, d: &capgate_spec::Diagnostic) -> Problem {
        Problem {
            file: file.to_owned(),
            check: None,
            severity: if d.is_error() { "error" } else { "warning" },
            path: d.path.to_string(),
            line: d.pos.is_known().then_some(d.pos.line),
            column: d.pos.is_known().then_some(d.pos.column),
            message: d.message.clone(),
        }
    }

    /// `file:line:col: [severity: ]path: message`, kit text spelled out. `check` names the
    /// lint check beside the severity (`error[wildcard-host]`).
    fn of_finding(file: &str, f: capgate_resolve::lint::Finding) -> Problem {
        Problem {
            file: file.to_owned(),
            check: Some(f.check.code()),
            severity: match f.severity {
                capgate_spec::Severity::Error => "error",
                capgate_spec::Severity::Warning => "warning",
            },
            path: f.path.to_string(),
            line: f.pos.is_known().then_some(f.pos.line),
            column: f.pos.is_known().then_some(f.pos.column),
            message: f.message,
        }
    }

    fn render(&self) -> String {
        // A file's name is anyone's choice too.
        let file = printable(&self.file);
        let at = match (self.line, self.column) {
            (Some(l), Some(c)) => format!("{file}:{l}:{c}"),
            _ => file.into_owned(),
        };
        let severity = match (self.check, self.severity) {
            (Some(check), s) => format!("{s}[{check}]: "),
            (None, "warning") => "warning: ".to_owned(),
            (None, _) => String::new(),
        };
        let path = if self.path.is_empty() {
            String::new()
        } else {
            format!("{}: ", printable(&self.path))
        };
        format!("{at}: {severity}{path}{}", printable(&self.message))
    }
}

/// Finds and reads one descriptor: its shown name and what loading made of it.
fn read_descriptor(
    reference: &std::path::Path,
    opts: &Options,
) -> Result<(String, capgate_spec::Loaded), Problem> {
    let file = kitref::descriptor_path(reference)
        .map_err(|e| Problem::whole_file(reference.display().to_string(), format!("{e:#}")))?;
    let name = file.display().to_string();
    match crate::state::read_kit_file(&file) {
        Ok(bytes) => Ok((name, load(&bytes, opts))),
        Err(e) => Err(Problem::whole_file(
            name,
            format!("cannot read the file: {e}"),
        )),
    }
}

/// Judges the effective form of a valid authored kit; returns whether it is valid.
fn effective_problems(
    loaded: &capgate_spec::Loaded,
    args: &Args,
    file: &str,
    problems: &mut Vec<Problem>,
) -> bool {
    let Some(descriptor) = &loaded.descriptor else {
        return false;
    };
    if descriptor.kind == capgate_spec::Kind::Set {
        return true; // a set is merged at publish; it has no effective form of its own
    }
    let supplied: BTreeMap<String, String> = args
        .args
        .iter()
        .filter(|(k, _)| descriptor.arg(k).is_some())
        .cloned()
        .collect();
    let problem = |path: String, line: Option<u32>, column: Option<u32>, message: String| Problem {
        file: file.to_owned(),
        check: None,
        severity: "error",
        path,
        line,
        column,
        message: format!("(effective) {message}"),
    };
    // Declarations mode: groups are selected later, at composition.
    match capgate_spec::args::effective(loaded, &supplied, &BTreeMap::new(), true) {
        Ok(e) => {
            for d in e.diagnostics.errors() {
                problems.push(problem(
                    d.path.to_string(),
                    d.pos.is_known().then_some(d.pos.line),
                    d.pos.is_known().then_some(d.pos.column),
                    d.message.clone(),
                ));
            }
            e.is_valid()
        }
        Err(errors) => {
            for err in errors {
                // Where the arg is declared, for the line of a refused value.
                let at = loaded.root.as_ref().and_then(|r| err.declaration_at(r));
                let (path, pos) = at.map_or((String::new(), None), |(p, pos)| {
                    (p.to_string(), pos.is_known().then_some(pos))
                });
                problems.push(problem(
                    path,
                    pos.map(|p| p.line),
                    pos.map(|p| p.column),
                    err.to_string(),
                ));
            }
            false
        }
    }
}

pub fn run(args: &Args) -> Result<u8> {
    let opts = Options {
        profile: if args.published {
            Profile::Published
        } else {
            Profile::Authored
        },
        ..Options::default()
    };
    let mut report = Report {
        valid: true,
        files: Vec::new(),
        problems: Vec::new(),
    };
    // The args the kits declare: an `--arg` none of them declares is refused, as create
    // refuses it.
    let mut declared = std::collections::BTreeSet::new();
    let mut all_read = true;
    for reference in &args.paths {
        let (name, loaded) = match read_descriptor(reference, &opts) {
            Ok(read) => read,
            Err(problem) => {
                report.valid = false;
                all_read = false;
                report.files.push(FileReport::unreadable(&problem.file));
                report.problems.push(problem);
                continue;
            }
        };
        all_read &= loaded.descriptor.is_some();
        if let Some(d) = &loaded.descriptor {
            declared.extend(d.args.iter().map(|a| a.name.clone()));
        }
        let mut valid = loaded.is_valid();
        if valid && (args.effective || !args.args.is_empty()) {
            valid &= effective_problems(&loaded, args, &name, &mut report.problems);
        }
        report.valid &= valid;
        for d in loaded.diagnostics.iter() {
            report.problems.push(Problem::of_diagnostic(&name, d));
        }
        report.files.push(FileReport {
            file: name,
            valid,
            kind: loaded.descriptor.as_ref().map(|d| d.kind.to_string()),
            capabilities: loaded.descriptor.as_ref().map(|d| {
                d.capability_type_list()
                    .into_iter()
                    .map(str::to_owned)
                    .collect()
            }),
        });
    }
    // (Only when every kit could be read: an unreadable one may be the declaring one.)
    for (arg, _) in args
        .args
        .iter()
        .filter(|(a, _)| all_read && !declared.contains(a))
    {
        report.valid = false;
        report.problems.push(Problem::whole_file(
            format!("--arg {arg}"),
            format!("no kit given declares an arg `{arg}`; creating a sandbox would refuse it"),
        ));
    }
    let mut out = std::io::stdout().lock();
    if args.json {
        write!(out, "{}", crate::json_text(&report)?)?;
        writeln!(out)?;
    } else {
        for p in &report.problems {
            writeln!(out, "{}", p.render())?;
        }
        for f in &report.files {
            if f.valid {
                let kind = f.kind.as_deref().unwrap_or("kit");
                let caps = match f.capabilities.as_deref() {
                    Some(types) if !types.is_empty() => types.join(","),
                    _ => "no capabilities".to_owned(),
                };
                writeln!(out, "{}: valid {kind} ({caps})", f.file)?;
            }
        }
        let bad = report.files.iter().filter(|f| !f.valid).count();
        let errors = report
            .problems
            .iter()
            .filter(|p| p.severity == "error")
            .count();
        if bad > 0 || errors > 0 {
            let plural =
                |n: usize, what: &str| format!("{n} {what}{}", if n == 1 { "" } else { "s" });
            writeln!(
                out,
                "{bad} of {} invalid, {}",
                plural(report.files.len(), "file"),
                plural(errors, "error")
            )?;
        }
    }
    Ok(if report.valid {
        exit::OK
    } else {
        exit::INVALID
    })
}

#[derive(Debug, clap::Args)]
pub struct LintArgs {
    /// Descriptor files or kit directories.
    #[arg(required = true, value_name = "PATH")]
    paths: Vec<PathBuf>,
    /// Fail on what a careful reviewer would refuse: wildcard hosts, hosts beyond ASCII,
    /// broad exec lists and determinism tier mismatches become errors.
    #[arg(long)]
    strict: bool,
    /// Print a JSON report instead of text.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Serialize)]
struct LintReport {
    /// No errors (warnings do not fail a lint).
    ok: bool,
    strict: bool,
    errors: usize,
    warnings: usize,
    findings: Vec<Problem>,
}

/// [`capgate_resolve::lint::lint`] with the policy's own judges of hosts and paths, and
/// `content` to judge agent-context@1 files.
fn lint_with_capgates_judges(
    descriptor: &capgate_spec::Descriptor,
    strict: bool,
    content: &dyn Fn(&str) -> Option<String>,
) -> Vec<capgate_resolve::lint::Finding> {
    let options = capgate_resolve::lint::Options {
        strict,
        host_problem: &|host: &str| {
            capgate_policy::pattern::HostPattern::parse(host)
                .err()
                .map(|e| e.to_string())
        },
        path_problem: &|path: &str| {
            capgate_policy::path::PathGlob::compile(path)
                .err()
                .map(|e| e.to_string())
        },
        content_problem: content,
        ascii_host: &crate::lock::ascii_form,
    };
    capgate_resolve::lint::lint(descriptor, &options)
}

/// What in the kits of `plan` (references relative to `base`) creating its sandbox would
/// fail on, as `capgate lint` says it (`file:line:col: error[check]: …`): a host or path
/// glob the gateway cannot judge, a program the workload could replace, a read path
/// outside the workspace, an inject domain the broker cannot use. Said before anything is
/// written, it names the kit's line instead of the rule made from it.
pub fn refused_by_create(
    plan: &capgate_resolve::Plan,
    base: &std::path::Path,
) -> Vec<(capgate_resolve::lint::Check, String)> {
    use capgate_resolve::lint::Check;
    let refusing = [
        Check::InvalidHost,
        Check::InvalidPath,
        Check::ExecInWritablePlace,
        Check::InvalidReadPath,
        Check::UnusableInjectDomain,
    ];
    let mut out = Vec::new();
    for (unit, selection) in plan.layered_selections() {
        // What selection left out (an optional entry or group) is not made, so cannot fail.
        let left_out = |path: &str| {
            selection.skipped.iter().any(|r| {
                path == r.path
                    || path
                        .strip_prefix(r.path.as_str())
                        .is_some_and(|rest| rest.starts_with('.'))
            })
        };
        let reference = PathBuf::from(crate::sandbox::kit_location(base, &unit.reference));
        let file = kitref::descriptor_path(&reference).map_or_else(
            |_| reference.display().to_string(),
            |f| f.display().to_string(),
        );
        // Content files are the run's to read, and to explain.
        for f in lint_with_capgates_judges(&unit.descriptor, false, &|_| None) {
            if f.severity == capgate_spec::Severity::Error
                && refusing.contains(&f.check)
                && !left_out(f.path.as_str())
            {
                out.push((f.check, Problem::of_finding(&file, f).render()));
            }
        }
    }
    out
}

/// `capgate lint`: validity first (an invalid kit reports its problems as `invalid`), then
/// the coherence checks of [`capgate_resolve::lint`].
pub fn lint(args: &LintArgs) -> Result<u8> {
    let opts = Options::default();
    let mut findings = Vec::new();
    for reference in &args.paths {
        let (name, loaded) = match read_descriptor(reference, &opts) {
            Ok(read) => read,
            Err(mut problem) => {
                problem.check = Some("invalid");
                findings.push(problem);
                continue;
            }
        };
        for d in loaded.diagnostics.iter() {
            findings.push(Problem {
                check: Some(if d.is_error() { "invalid" } else { "validity" }),
                ..Problem::of_diagnostic(&name, d)
            });
        }
        let Some(descriptor) = loaded.descriptor.as_ref().filter(|_| loaded.is_valid()) else {
            continue;
        };
        let content = |file: &str| crate::context::content_file_problem(reference, file);
        for f in lint_with_capgates_judges(descriptor, args.strict, &content) {
            findings.push(Problem::of_finding(&name, f));
        }
    }
    let errors = findings.iter().filter(|p| p.severity == "error").count();
    let report = LintReport {
        ok: errors == 0,
        strict: args.strict,
        errors,
        warnings: findings.len() - errors,
        findings,
    };
    let mut out = std::io::stdout().lock();
    if args.json {
        write!(out, "{}", crate::json_text(&report)?)?;
        writeln!(out)?;
    } else {
        for p in &report.findings {
            writeln!(out, "{}", p.render())?;
        }
        let plural = |n: usize, what: &str| format!("{n} {what}{}", if n == 1 { "" } else { "s" });
        writeln!(
            out,
            "{} · {}",
            plural(report.errors, "error"),
            plural(report.warnings, "warning")
        )?;
    }
    Ok(if report.ok { exit::OK } else { exit::INVALID })
}
