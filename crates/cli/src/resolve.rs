//! `capgate resolve`: compose a workload with its mixins and print the merged grant set.

use std::fmt::Write as _;
use std::io::Write as _;
use std::path::PathBuf;

use anyhow::Result;
use capgate_resolve::{Plan, Refusal, Surface, plan};
use capgate_spec::text::printable;
use serde::Serialize;

use crate::exit;
use crate::kits::{self, read_kits};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The kits of the composition: exactly one workload and any mixins (directories or
    /// descriptor files).
    #[arg(required = true, value_name = "KIT")]
    kits: Vec<PathBuf>,
    /// A create-phase arg value (repeatable). A value goes only to kits that declare the arg.
    #[arg(long = "arg", value_name = "NAME=VALUE", value_parser = kits::parse_arg)]
    args: Vec<(String, String)>,
    /// Print one JSON object: `surface`, `order`, `skipped`, `descriptor`.
    #[arg(long)]
    json: bool,
}

#[derive(Serialize)]
struct JsonOut<'a> {
    surface: &'a Surface,
    order: Vec<&'a str>,
    topological: Vec<&'a str>,
    skipped: Vec<capgate_resolve::Skipped>,
    descriptor: capgate_spec::Descriptor,
}

/// Reads the kits and plans the composition, reporting problems; `Err(code)` when it
/// cannot (1: invalid input, 2: refused).
pub fn plan_kits(
    paths: &[PathBuf],
    args: &[(String, String)],
    json: bool,
    rebase: Option<&std::path::Path>,
) -> Result<Plan, u8> {
    let mut kits = match read_kits(paths, args) {
        Ok(k) => k,
        Err(problems) => {
            report_invalid(&problems, json);
            return Err(exit::INVALID);
        }
    };
    if let Some(base) = rebase {
        kits.rebase_references(base);
    }
    plan(kits.units).map_err(|refusals| {
        report_refusals(&refusals, json);
        exit::REFUSED
    })
}

/// Kits that cannot be read or are invalid: each problem on stderr, and for `--json` the
/// same lines as `{"invalid": [...]}` on stdout.
pub fn report_invalid(problems: &[String], json: bool) {
    if json {
        json_on_the_way_out(&serde_json::json!({ "invalid": problems }));
    }
    for p in problems {
        say!("{p}");
    }
}

/// `body` on stdout, said on the way to an exit code of failure: a closed stdout changes
/// nothing.
fn json_on_the_way_out(body: &serde_json::Value) {
    use std::io::Write as _;
    let _ = writeln!(
        std::io::stdout().lock(),
        "{}",
        crate::json_text(body).unwrap_or_default()
    );
}

pub fn report_refusals(refusals: &[Refusal], json: bool) {
    if json {
        json_on_the_way_out(&serde_json::json!({ "refused": refusals }));
    } else {
        say!("capgate: the composition is refused:");
        for r in refusals {
            say!("  {r}");
        }
    }
}

pub fn run(args: &Args) -> Result<u8> {
    let plan = match plan_kits(&args.kits, &args.args, args.json, None) {
        Ok(p) => p,
        Err(code) => return Ok(code),
    };
    let mut out = std::io::stdout().lock();
    if args.json {
        let body = JsonOut {
            surface: &plan.surface,
            order: plan.order(),
            topological: plan
                .resolution
                .topological
                .iter()
                .map(|&i| plan.resolution.units[i].reference.as_str())
                .collect(),
            skipped: plan.skipped(),
            descriptor: plan.composed.descriptor(),
        };
        write!(out, "{}", crate::json_text(&body)?)?;
        writeln!(out)?;
    } else {
        out.write_all(render(&plan).as_bytes())?;
    }
    Ok(exit::OK)
}

/// The merged grants as readable tables.
pub fn render(plan: &Plan) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "Composition (layer order):");
    for (n, u) in plan.layered_units().enumerate() {
        let reference = printable(&u.reference);
        let _ = writeln!(s, "  {}. {reference:<40} {}", n + 1, u.descriptor.kind);
    }
    s.push_str(&render_surface(&plan.surface));
    let skipped = plan.skipped();
    if !skipped.is_empty() {
        let _ = writeln!(s, "\nSkipped optional entries (not granted):");
        for k in skipped {
            let _ = writeln!(
                s,
                "  {} {}: {}",
                printable(&k.kit),
                printable(&k.path.to_string()),
                printable(&k.reason)
            );
        }
    }
    s
}

/// A surface as sections of `label  values` rows; empty sections are left out.
pub fn render_surface(surface: &Surface) -> String {
    let mut s = String::new();
    let mut section = |title: &str, rows: &[(&str, &[String])]| {
        let rows: Vec<_> = rows.iter().filter(|(_, v)| !v.is_empty()).collect();
        if rows.is_empty() {
            return;
        }
        let _ = writeln!(s, "\n{title}:");
        for (label, values) in rows {
            let mut first = true;
            for v in *values {
                let v = printable(v);
                let _ = writeln!(s, "  {:<12} {v}", if first { *label } else { "" });
                first = false;
            }
        }
    };
    for (phase, allow, deny, http_allow, http_deny) in [
        (
            "install",
            &surface.network_install_allow,
            &surface.network_install_deny,
            &surface.network_install_http_allow,
            &surface.network_install_http_deny,
        ),
        (
            "runtime",
            &surface.network_runtime_allow,
            &surface.network_runtime_deny,
            &surface.network_runtime_http_allow,
            &surface.network_runtime_http_deny,
        ),
    ] {
        section(
            &format!("Network, {phase} phase"),
            &[
                ("allow", allow),
                ("deny", deny),
                ("http allow", http_allow),
                ("http deny", http_deny),
            ],
        );
    }
    section(
        "Credentials",
        &[
            ("install", &surface.credentials_install),
            ("runtime", &surface.credentials_runtime),
        ],
    );
    section("SSH agent", &[("grants", &surface.ssh_agent)]);
    section(
        "Storage",
        &[
            ("volumes", &surface.storage_paths),
            ("host mounts", &surface.host_mount_paths),
            ("skills", &surface.skills_paths),
            ("skills (rw)", &surface.skills_write_paths),
        ],
    );
    section("Ports", &[("published", &surface.ports)]);
    section("Devices", &[("usb", &surface.usb)]);
    section("Egress (runtime)", &[("allow", &surface.egress)]);
    section("Services", &[("requested", &surface.services)]);
    if let Some(write) = &surface.filesystem_write {
        let places = if write.is_empty() {
            "nowhere".to_owned()
        } else {
            printable(&write.join(", ")).into_owned()
        };
        let _ = writeln!(s, "\nWrites only beneath: {places}");
    }
    if let Some(programs) = &surface.exec_allow {
        let _ = writeln!(s, "\nExecutes only: {}", printable(&programs.join(", ")));
    }
    if let Some(tier) = surface.determinism {
        let _ = writeln!(s, "\nDeterminism: {tier}");
        if tier == capgate_spec::caps::pack::Tier::ReadOnly {
            let _ = writeln!(
                s,
                "  (held to reading: only GET, HEAD and OPTIONS requests without a body leave, whatever is allowed above)"
            );
        }
    }
    if surface.privileged {
        let _ = writeln!(s, "\nPrivileged: yes");
    }
    if surface.is_empty() {
        let _ = writeln!(
            s,
            "\nNo grants: the composition can reach nothing and holds no credential."
        );
    }
    s
}
