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
    #[serde(skip_serializing_if = "Option::is_none")]
    capabilities: Option<String>,
}

#[derive(Debug, Serialize)]
struct Report {
    valid: bool,
    files: Vec<FileReport>,
    problems: Vec<Problem>,
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
                problems.push(problem(String::new(), None, None, err.to_string()));
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
    for reference in &args.paths {
        let file = match kitref::descriptor_path(reference) {
            Ok(f) => f,
            Err(e) => {
                report.valid = false;
                let name = reference.display().to_string();
                report.problems.push(Problem {
                    file: name.clone(),
                    severity: "error",
                    path: String::new(),
                    line: None,
                    column: None,
                    message: format!("{e:#}"),
                });
                report.files.push(FileReport {
                    file: name,
                    valid: false,
                    kind: None,
                    capabilities: None,
                });
                continue;
            }
        };
        let name = file.display().to_string();
        let loaded = match crate::state::read_kit_file(&file) {
            Ok(bytes) => load(&bytes, &opts),
            Err(e) => {
                report.valid = false;
                report.problems.push(Problem {
                    file: name.clone(),
                    severity: "error",
                    path: String::new(),
                    line: None,
                    column: None,
                    message: format!("cannot read the file: {e}"),
                });
                report.files.push(FileReport {
                    file: name,
                    valid: false,
                    kind: None,
                    capabilities: None,
                });
                continue;
            }
        };
        let mut valid = loaded.is_valid();
        if valid && (args.effective || !args.args.is_empty()) {
            valid &= effective_problems(&loaded, args, &name, &mut report.problems);
        }
        report.valid &= valid;
        for d in loaded.diagnostics.iter() {
            report.problems.push(Problem {
                file: name.clone(),
                severity: if d.is_error() { "error" } else { "warning" },
                path: d.path.to_string(),
                line: d.pos.is_known().then_some(d.pos.line),
                column: d.pos.is_known().then_some(d.pos.column),
                message: d.message.clone(),
            });
        }
        report.files.push(FileReport {
            file: name,
            valid,
            kind: loaded.descriptor.as_ref().map(|d| d.kind.to_string()),
            capabilities: loaded
                .descriptor
                .as_ref()
                .map(capgate_spec::Descriptor::capability_types),
        });
    }
    let mut out = std::io::stdout().lock();
    if args.json {
        serde_json::to_writer_pretty(&mut out, &report)?;
        writeln!(out)?;
    } else {
        for p in &report.problems {
            let at = match (p.line, p.column) {
                (Some(l), Some(c)) => format!("{}:{l}:{c}", p.file),
                _ => p.file.clone(),
            };
            let severity = if p.severity == "warning" {
                "warning: "
            } else {
                ""
            };
            let path = if p.path.is_empty() {
                String::new()
            } else {
                format!("{}: ", printable(&p.path))
            };
            writeln!(out, "{at}: {severity}{path}{}", printable(&p.message))?;
        }
        for f in &report.files {
            if f.valid {
                let kind = f.kind.as_deref().unwrap_or("kit");
                let caps = f
                    .capabilities
                    .as_deref()
                    .filter(|c| !c.is_empty())
                    .unwrap_or("no capabilities");
                writeln!(out, "{}: valid {kind} ({caps})", f.file)?;
            }
        }
        let bad = report.files.iter().filter(|f| !f.valid).count();
        let errors = report
            .problems
            .iter()
            .filter(|p| p.severity == "error")
            .count();
        if bad > 0 {
            writeln!(
                out,
                "{bad} of {} files invalid, {errors} errors",
                report.files.len()
            )?;
        }
    }
    Ok(if report.valid {
        exit::OK
    } else {
        exit::INVALID
    })
}
