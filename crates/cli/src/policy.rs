//! `capgate policy`: presets, the rule store, decisions and the audit log, in the manner of
//! `sbx policy`. Kit allow rules apply on top of any preset; only a deny rule beats them.

use std::fmt::Write as _;

use anyhow::{Context, Result, bail};
use capgate_policy::audit::{LogQuery, Timestamp, log};
use capgate_policy::decision::{HttpRequest, Query};
use capgate_policy::pattern::{HostPattern, parse_target};
use capgate_policy::presets::Preset;
use capgate_policy::store::{NewRule, RuleFilter};
use capgate_policy::{Decision, Matcher, Method, Phase, Protocol, Rule, Scope, Source, Verdict};
use capgate_spec::text::printable;
use clap::{Subcommand, ValueEnum};
use serde::Serialize;

use crate::exit;
use crate::state::open_store;

const PRESET_NOTE: &str = "Kit allow rules apply on top of any preset; only a deny rule beats them (`deny-all` is not a deny rule).";

#[derive(Debug, Subcommand)]
pub enum PolicyCommand {
    /// Set the global preset: `allow-all`, `balanced` (AI providers, package registries,
    /// code hosts) or `deny-all`. Kit allows still apply on top; only a deny beats them.
    Init { preset: String },
    /// List rules (`--json` for the full records).
    Ls(LsArgs),
    /// Add an allow rule (a user rule that already says the same is named, not copied).
    Allow {
        #[command(subcommand)]
        kind: RuleKind,
    },
    /// Add a deny rule (a deny wins over every allow, in every scope and from every source).
    Deny {
        #[command(subcommand)]
        kind: RuleKind,
    },
    /// Remove user rules by id or by resource. Rules provisioned from a kit or a preset
    /// cannot be removed here; the refusal says why.
    Rm(RmArgs),
    /// Ask the decision function, exactly as the gateway would (exit 0 allowed, 2 denied).
    Check {
        #[command(subcommand)]
        kind: CheckKind,
    },
    /// Show decisions the gateway recorded, grouped per host, with HTTP methods and paths.
    Log(LogArgs),
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum SourceArg {
    Kit,
    User,
    Default,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum DecisionArg {
    Allow,
    Deny,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum PhaseArg {
    Install,
    Runtime,
}

impl PhaseArg {
    fn phase(self) -> Phase {
        match self {
            PhaseArg::Install => Phase::Install,
            PhaseArg::Runtime => Phase::Runtime,
        }
    }
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum ProtocolArg {
    Tcp,
    Udp,
    Any,
    /// Cleartext HTTP requests only.
    Http,
    /// TLS naming the host (or requests inside intercepted TLS) only.
    Https,
}

impl ProtocolArg {
    fn protocol(self) -> Protocol {
        match self {
            ProtocolArg::Tcp => Protocol::Tcp,
            ProtocolArg::Udp => Protocol::Udp,
            ProtocolArg::Any => Protocol::Any,
            ProtocolArg::Http => Protocol::Http,
            ProtocolArg::Https => Protocol::Https,
        }
    }
}

#[derive(Debug, clap::Args)]
pub struct LsArgs {
    /// Only rules that apply to this sandbox (its own and the global ones).
    #[arg(long)]
    sandbox: Option<String>,
    #[arg(long, value_enum)]
    source: Option<SourceArg>,
    #[arg(long, value_enum)]
    decision: Option<DecisionArg>,
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Subcommand)]
pub enum RuleKind {
    /// Network resources: comma-separated hosts (`example.com`, `*.example.com`,
    /// `**.example.com`, `host:port`), IP addresses or CIDRs.
    Network(RuleArgs),
}

#[derive(Debug, clap::Args)]
pub struct RuleArgs {
    /// Comma-separated resources.
    resources: String,
    /// Only this sandbox (default: every sandbox).
    #[arg(long)]
    sandbox: Option<String>,
    /// HTTP methods (repeatable or comma-separated; `ANY` for every method).
    #[arg(long = "method", value_delimiter = ',')]
    methods: Vec<String>,
    /// An HTTP path glob (`/repos/**`; `*` within one segment). Needs hosts, not IPs.
    #[arg(long = "path")]
    paths: Vec<String>,
    /// Only in this grant phase (default: both).
    #[arg(long, value_enum)]
    phase: Option<PhaseArg>,
    /// What the rule covers: a transport (`tcp` also covers HTTP and HTTPS), or `http` /
    /// `https` alone (default: tcp for allow, any for deny).
    #[arg(long, value_enum)]
    protocol: Option<ProtocolArg>,
}

#[derive(Debug, clap::Args)]
#[command(group(clap::ArgGroup::new("selector").required(true).args(["id", "resource"])))]
pub struct RmArgs {
    /// The rule with this id (as `policy ls` shows it), whatever its scope.
    #[arg(long)]
    id: Option<String>,
    /// Every user rule naming this resource in one scope: the global rules, or with
    /// `--sandbox` that sandbox's. (So removing a global allow never takes a sandbox's
    /// deny of the same host with it.)
    #[arg(long)]
    resource: Option<String>,
    /// The scope: that sandbox's rules only.
    #[arg(long)]
    sandbox: Option<String>,
}

#[derive(Debug, Subcommand)]
pub enum CheckKind {
    /// TARGET is a host, host:port, IP, `[v6]:port` or URL (bare hosts mean port 443).
    Network(CheckArgs),
}

#[derive(Debug, clap::Args)]
pub struct CheckArgs {
    target: String,
    #[arg(long)]
    sandbox: Option<String>,
    /// Ask about one HTTP request with this method (on an inspected connection).
    #[arg(long)]
    method: Option<String>,
    /// The request path (default: the URL's path, else `/`); implies `--method GET`.
    #[arg(long)]
    path: Option<String>,
    /// The grant phase to ask about (default: runtime).
    #[arg(long, value_enum, default_value = "runtime")]
    phase: PhaseArg,
    /// What the traffic is carried as (default: the URL's scheme, `http` or `https`; tcp
    /// for a `host:port`).
    #[arg(long, value_enum)]
    protocol: Option<ProtocolArg>,
    #[arg(long)]
    json: bool,
}

#[derive(Debug, clap::Args)]
pub struct LogArgs {
    /// Only this sandbox's events.
    #[arg(long)]
    sandbox: Option<String>,
    /// The newest N events (default 100).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    limit: Option<u32>,
    /// Remove every sandbox's events recorded before WHEN (an RFC 3339 time such as
    /// `2026-11-01T00:00:00Z`, or an age such as `30d`, `12h`, `45m`), print how many,
    /// and record the prune (later listings say what is missing). The log is otherwise
    /// append-only; freed space is reused by new events.
    #[arg(long, value_name = "WHEN", value_parser = parse_when, conflicts_with_all = ["sandbox", "limit"])]
    prune_before: Option<Timestamp>,
    #[arg(long)]
    json: bool,
}

/// An RFC 3339 time, or an age (`30d`, `12h`, `45m`) counted back from now.
fn parse_when(s: &str) -> std::result::Result<Timestamp, String> {
    if let Some(t) = Timestamp::parse(s) {
        return Ok(t);
    }
    let unit_ms: i64 = match s.chars().last() {
        Some('d') => 86_400_000,
        Some('h') => 3_600_000,
        Some('m') => 60_000,
        _ => {
            return Err(format!(
                "`{s}` is neither an RFC 3339 time nor an age such as `30d`, `12h` or `45m`"
            ));
        }
    };
    let n: i64 = s[..s.len() - 1]
        .parse()
        .ok()
        .filter(|n| *n >= 0)
        .ok_or_else(|| format!("`{s}`: the age must be a whole number before its unit (`30d`)"))?;
    let back = n
        .checked_mul(unit_ms)
        .ok_or_else(|| format!("`{s}`: too far back"))?;
    Ok(Timestamp::from_unix_millis(
        Timestamp::now().unix_millis().saturating_sub(back),
    ))
}

/// `--prune-before`: removes the events, says how many.
fn prune_log(before: Timestamp, json: bool) -> Result<u8> {
    let mut store = open_store()?;
    let removed = capgate_policy::audit::prune(&mut store, before)?;
    if json {
        out!(
            "{}",
            crate::json_text(&serde_json::json!({ "pruned": removed, "before": before }))?
        );
    } else {
        out!(
            "pruned {removed} event{} recorded before {before}",
            if removed == 1 { "" } else { "s" }
        );
    }
    Ok(exit::OK)
}

/// The line that says what earlier prunes removed, if any.
fn pruned_note(p: &capgate_policy::audit::Pruned) -> String {
    format!(
        "(events recorded before {} were pruned: {} removed, the last prune at {})",
        p.before, p.events, p.at
    )
}

pub fn run(cmd: &PolicyCommand) -> Result<u8> {
    match cmd {
        PolicyCommand::Init { preset } => init(preset),
        PolicyCommand::Ls(a) => ls(a),
        PolicyCommand::Allow {
            kind: RuleKind::Network(a),
        } => add(a, Decision::Allow),
        PolicyCommand::Deny {
            kind: RuleKind::Network(a),
        } => add(a, Decision::Deny),
        PolicyCommand::Rm(a) => rm(a),
        PolicyCommand::Check {
            kind: CheckKind::Network(a),
        } => check(a),
        PolicyCommand::Log(a) => show_log(a),
    }
}

fn init(preset: &str) -> Result<u8> {
    let Some(p) = Preset::parse(preset) else {
        bail!("preset `{preset}` is not `allow-all`, `balanced` or `deny-all`");
    };
    let mut store = open_store()?;
    let rules = store.apply_preset(p)?;
    out!("preset `{}`: {} default rules", p.as_str(), rules.len());
    out!("{PRESET_NOTE}");
    Ok(exit::OK)
}

fn ls(a: &LsArgs) -> Result<u8> {
    let store = open_store()?;
    let filter = RuleFilter {
        sandbox: a.sandbox.clone(),
        source: a.source.map(|s| match s {
            SourceArg::Kit => Source::Kit,
            SourceArg::User => Source::User,
            SourceArg::Default => Source::Default,
        }),
        decision: a.decision.map(|d| match d {
            DecisionArg::Allow => Decision::Allow,
            DecisionArg::Deny => Decision::Deny,
        }),
    };
    let rules = store.rules(&filter)?;
    if a.json {
        out!(
            "{}",
            crate::json_text(&serde_json::json!({ "rules": rules }))?
        );
        return Ok(exit::OK);
    }
    let preset = store.preset()?.map_or("none", |p| p.as_str());
    out!("Preset: {preset}. {PRESET_NOTE}\n");
    if rules.is_empty() {
        out!("no rules");
        return Ok(exit::OK);
    }
    out!(
        "{:<16} {:<26} {:<20} {:<7} {:<8} {:<8} {:<8} RESOURCES",
        "ID",
        "NAME",
        "SCOPE",
        "SOURCE",
        "DECISION",
        "PHASE",
        "EDITABLE"
    );
    for r in &rules {
        out!(
            "{:<16} {:<26} {:<20} {:<7} {:<8} {:<8} {:<8} {}",
            r.id,
            r.name,
            r.scope.to_string(),
            json_word(&r.source),
            json_word(&r.decision),
            r.phase.map_or("both", Phase::as_str),
            if r.editable { "yes" } else { "no" },
            describe_resources(r)
        );
    }
    Ok(exit::OK)
}

fn json_word<T: Serialize>(v: &T) -> String {
    serde_json::to_value(v)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_default()
}

fn describe_resources(r: &Rule) -> String {
    let mut s = r.resources.join(",");
    if let Some(m) = &r.methods {
        let _ = write!(
            s,
            " methods={}",
            m.iter().map(|m| m.as_str()).collect::<Vec<_>>().join(",")
        );
    }
    if let Some(p) = &r.paths {
        let _ = write!(s, " paths={}", p.join(","));
    }
    // tcp (the default of an allow) and any (of a deny) go unsaid; the rest narrows.
    if !matches!(r.protocol, Protocol::Tcp | Protocol::Any) {
        let _ = write!(s, " protocol={}", r.protocol);
    }
    s
}

fn parse_method(m: &str) -> Result<Method> {
    Method::parse(&m.to_ascii_uppercase()).with_context(|| format!("`{m}` is not an HTTP method (GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS, TRACE, CONNECT or ANY)"))
}

fn add(a: &RuleArgs, decision: Decision) -> Result<u8> {
    let resources: Vec<String> = a
        .resources
        .split(',')
        .map(str::trim)
        .filter(|r| !r.is_empty())
        .map(str::to_owned)
        .collect();
    if resources.is_empty() {
        bail!("name at least one resource");
    }
    for r in &resources {
        HostPattern::parse(r)
            .with_context(|| format!("resource `{r}` is not a host pattern, IP address or CIDR"))?;
    }
    let scope = match &a.sandbox {
        Some(s) => {
            crate::state::check_sandbox_name(s)?;
            Scope::Sandbox(s.clone())
        }
        None => Scope::Global,
    };
    let protocol = match (a.protocol, decision) {
        (Some(p), _) => p.protocol(),
        (None, Decision::Allow) => Protocol::Tcp,
        (None, Decision::Deny) => Protocol::Any,
    };
    let name = format!("user:{}", resources.join(","));
    let mut rule = NewRule::user(name, scope, decision, resources, protocol);
    if !a.methods.is_empty() {
        rule.methods = Some(
            a.methods
                .iter()
                .map(|m| parse_method(m))
                .collect::<Result<_>>()?,
        );
    }
    if !a.paths.is_empty() {
        for p in &a.paths {
            capgate_policy::path::PathGlob::compile(p)
                .with_context(|| format!("path `{p}` is not a path glob"))?;
        }
        rule.paths = Some(a.paths.clone());
        if rule.methods.is_none() {
            rule.methods = Some(vec![Method::Any]);
        }
    }
    rule.phase = a.phase.map(PhaseArg::phase);
    let mut store = open_store()?;
    if let Some(same) = store
        .rules(&RuleFilter {
            sandbox: a.sandbox.clone(),
            source: Some(Source::User),
            decision: Some(decision),
        })?
        .into_iter()
        .find(|r| says_the_same(r, &rule))
    {
        out!(
            "rule {} ({}) already {} {}; nothing added",
            same.id,
            same.scope,
            match same.decision {
                Decision::Allow => "allows",
                Decision::Deny => "denies",
            },
            describe_resources(&same)
        );
        return Ok(exit::OK);
    }
    if let Scope::Sandbox(s) = &rule.scope
        && store.sandbox(s)?.is_none()
    {
        say!(
            "capgate: note: no sandbox is named `{}` yet; the rule applies to the one created with that name (`capgate ls` lists them)",
            printable(s)
        );
    }
    let stored = store.add_rule(rule)?;
    out!(
        "added {} rule {} ({}) for {}",
        json_word(&stored.decision),
        stored.id,
        stored.scope,
        describe_resources(&stored)
    );
    Ok(exit::OK)
}

/// `rule` would add nothing to `existing`: the same scope, decision, resources (as a set),
/// methods, paths, protocol and phase.
fn says_the_same(existing: &Rule, rule: &NewRule) -> bool {
    fn set<T: Ord + Clone>(v: &[T]) -> Vec<T> {
        let mut v = v.to_vec();
        v.sort();
        v.dedup();
        v
    }
    existing.scope == rule.scope
        && existing.decision == rule.decision
        && existing.protocol == rule.protocol
        && existing.phase == rule.phase
        && existing.active
        && set(&existing.resources) == set(&rule.resources)
        && existing.methods.as_deref().map(set) == rule.methods.as_deref().map(set)
        && existing.paths.as_deref().map(set) == rule.paths.as_deref().map(set)
}

fn rm(a: &RmArgs) -> Result<u8> {
    let mut store = open_store()?;
    let scope = a.sandbox.clone().map(Scope::Sandbox);
    let removed: Vec<Rule> = match (&a.id, &a.resource) {
        (Some(id), _) => vec![store.remove_rule_by_id(id, scope.as_ref())?],
        (None, Some(resource)) => store
            .remove_rules_by_resource(resource, Some(scope.as_ref().unwrap_or(&Scope::Global)))?,
        (None, None) => bail!("at least one selector is required: use --id or --resource"),
    };
    if removed.is_empty() {
        match (&a.resource, &a.sandbox) {
            (Some(resource), None) => bail!(
                "no global user rule names `{resource}` (a sandbox's rules are removed with `--sandbox NAME`)"
            ),
            _ => bail!("no user rule matches"),
        }
    }
    for r in removed {
        out!(
            "removed rule {} ({}) {}",
            r.id,
            r.name,
            describe_resources(&r)
        );
    }
    Ok(exit::OK)
}

/// What `policy check --json` prints.
#[derive(Serialize)]
struct CheckOut<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    target: String,
    context: String,
    phase: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    method: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    path: Option<&'a str>,
    allowed: bool,
    #[serde(flatten)]
    verdict: &'a Verdict,
}

/// The rules the gateway of `sandbox` would use, compiled.
pub fn matcher_for(sandbox: Option<&str>) -> Result<Matcher> {
    let store = open_store()?;
    let rules = store.rules(&RuleFilter {
        sandbox: sandbox.map(str::to_owned),
        source: None,
        decision: None,
    })?;
    Ok(Matcher::compile(&rules))
}

fn check(a: &CheckArgs) -> Result<u8> {
    let (target, port) =
        parse_target(&a.target).with_context(|| format!("cannot judge `{}`", a.target))?;
    let url_path = a
        .target
        .split_once("://")
        .and_then(|(_, rest)| rest.find('/').map(|i| &rest[i..]))
        .map(|p| p.split(['?', '#']).next().unwrap_or("/"));
    let method = match (&a.method, &a.path) {
        (Some(m), _) => Some(parse_method(m)?),
        (None, Some(_)) => Some(Method::Get),
        (None, None) => None,
    };
    let path = a.path.as_deref().or(url_path).unwrap_or("/");
    let http = method.map(|m| HttpRequest {
        method: m,
        path: path.to_owned(),
    });
    let protocol = match a.protocol {
        Some(p) => p.protocol(),
        None => match a.target.split_once("://").map(|(scheme, _)| scheme) {
            Some(s) if s.eq_ignore_ascii_case("https") => Protocol::Https,
            Some(s) if s.eq_ignore_ascii_case("http") => Protocol::Http,
            _ => Protocol::Tcp,
        },
    };
    let query = Query {
        sandbox: a.sandbox.clone(),
        phase: a.phase.phase(),
        target: target.clone(),
        port,
        protocol,
        http,
    };
    let verdict = matcher_for(a.sandbox.as_deref())?.decide(&query);
    let shown = match &target {
        capgate_policy::Target::Host(h) => format!("{h}:{port}"),
        capgate_policy::Target::Ip(std::net::IpAddr::V6(ip)) => format!("[{ip}]:{port}"),
        capgate_policy::Target::Ip(ip) => format!("{ip}:{port}"),
    };
    if a.json {
        let out = CheckOut {
            kind: "network",
            target: shown,
            context: a
                .sandbox
                .as_ref()
                .map_or_else(|| "global".to_owned(), |s| format!("sandbox:{s}")),
            phase: a.phase.phase().as_str(),
            method: method.map(Method::as_str),
            path: method.map(|_| path),
            allowed: verdict.is_allowed(),
            verdict: &verdict,
        };
        out!("{}", crate::json_text(&out)?);
    } else {
        let what = match method {
            Some(m) => format!("{} {shown}{path}", m.as_str()),
            None => shown,
        };
        if verdict.is_allowed() {
            out!("Allowed: {what}");
        } else {
            out!("Denied: {what}");
        }
        out!("Reason: {} ({})", verdict.message, verdict.reason);
        if let Some(r) = &verdict.rule {
            out!("Rule: {} `{}` ({})", r.id, r.name, json_word(&r.source));
        }
        if verdict.inspect {
            out!(
                "Note: only some HTTP requests to this host are granted; its traffic is inspected."
            );
        }
    }
    Ok(if verdict.is_allowed() {
        exit::OK
    } else {
        exit::REFUSED
    })
}

fn show_log(a: &LogArgs) -> Result<u8> {
    if let Some(before) = a.prune_before {
        return prune_log(before, a.json);
    }
    let store = open_store()?;
    let pruned = capgate_policy::audit::pruned(&store)?;
    let summaries = log(
        &store,
        &LogQuery {
            sandbox: a.sandbox.clone(),
            limit: a.limit.map(|n| n as usize),
            since: None,
        },
    )?;
    if a.json {
        out!(
            "{}",
            crate::json_text(&serde_json::json!({ "hosts": summaries, "pruned": pruned }))?
        );
        return Ok(exit::OK);
    }
    for (title, decision) in [
        ("Blocked requests", Decision::Deny),
        ("Allowed requests", Decision::Allow),
    ] {
        let rows: Vec<_> = summaries
            .iter()
            .filter(|s| s.decision == decision)
            .collect();
        if rows.is_empty() {
            continue;
        }
        out!("{title}:");
        out!(
            "  {:<16} {:<36} {:<24} {:<24} {:>6}  LAST SEEN",
            "SANDBOX",
            "HOST",
            "REASON",
            "RULE",
            "COUNT"
        );
        for s in rows {
            out!(
                "  {:<16} {:<36} {:<24} {:<24} {:>6}  {}",
                s.sandbox,
                format!("{}:{}", printable(&s.host), s.port),
                s.reason.code(),
                s.rule_id.as_deref().unwrap_or("-"),
                s.count,
                s.last_seen
            );
            for mp in &s.methods_paths {
                out!(
                    "      {} {} ×{}",
                    printable(&mp.method),
                    printable(&mp.path),
                    mp.count
                );
            }
        }
        out!();
    }
    if summaries.is_empty() {
        out!("no decisions recorded yet");
    }
    if let Some(p) = &pruned {
        out!("{}", pruned_note(p));
    }
    Ok(exit::OK)
}

/// What an event was about, `METHOD host:port/path` or `host:port`, for a terminal: hosts,
/// methods and paths are what a workload sent, so they are spelled out, never acted on.
pub fn event_target(e: &capgate_policy::audit::AuditEvent) -> String {
    match (&e.method, &e.path) {
        // A request to the relayed SSH agent: its message, and what about it was refused.
        (Some(m), Some(detail)) if e.host == crate::sshagent::AUDIT_HOST && e.port == 0 => {
            format!(
                "{} {} ({})",
                crate::sshagent::AUDIT_HOST,
                printable(m),
                printable(detail)
            )
        }
        // A program an exec allowlist refused (recorded by `capgate run`).
        (Some(_), Some(file)) if e.host == crate::run::EXEC_AUDIT_HOST && e.port == 0 => {
            format!("{} {}", crate::run::EXEC_AUDIT_HOST, printable(file))
        }
        (Some(m), Some(p)) => format!(
            "{} {}:{}{}",
            printable(m),
            printable(&e.host),
            e.port,
            printable(p)
        ),
        _ => format!("{}:{}", printable(&e.host), e.port),
    }
}

/// `capgate log`: audit events one by one, newest first.
pub fn events_command(a: &LogArgs) -> Result<u8> {
    if let Some(before) = a.prune_before {
        return prune_log(before, a.json);
    }
    let store = open_store()?;
    let pruned = capgate_policy::audit::pruned(&store)?;
    let events = capgate_policy::audit::events(
        &store,
        &LogQuery {
            sandbox: a.sandbox.clone(),
            limit: Some(a.limit.map_or(100, |n| n as usize)),
            since: None,
        },
    )?;
    if a.json {
        out!(
            "{}",
            crate::json_text(&serde_json::json!({ "events": events, "pruned": pruned }))?
        );
        return Ok(exit::OK);
    }
    if events.is_empty() {
        out!("no events recorded yet");
    }
    for e in events {
        let what = event_target(&e);
        out!(
            "{}  {:<16} {:<5} {:<26} {}{}",
            e.time,
            e.sandbox,
            json_word(&e.decision),
            e.reason.code(),
            what,
            e.rule_id
                .map(|r| format!("  (rule {r})"))
                .unwrap_or_default()
        );
    }
    if let Some(p) = &pruned {
        out!("{}", pruned_note(p));
    }
    Ok(exit::OK)
}
