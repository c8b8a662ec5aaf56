//! Composition (spec §4.3): the selected contributions of every kit, in dependency order,
//! reconciled into one effective descriptor.
//!
//! The kind is derived (one workload makes a workload, none a mixin), relations are unioned
//! with the requirements the composition answers itself dropped, and capabilities are
//! reconciled per type: network policies union per phase, lifecycles concatenate,
//! agent-context profiles and bodies are collected, the types describing the whole sandbox
//! keep one author, and everything else unions on its instance key, where a second ask
//! either is the same request (it collapses) or is refused naming both parties.
//!
//! Every problem is collected; a composition with any problem is refused as a whole.

use std::collections::{HashMap, HashSet};
use std::fmt;

use capgate_spec::caps::agent::{Acp, AgentContext, SkillsMode};
use capgate_spec::caps::credential::Credential;
use capgate_spec::caps::lifecycle::Lifecycle;
use capgate_spec::caps::network::{HostEntry, NetworkPolicy, PhaseRules, PolicyVersion};
use capgate_spec::caps::ssh_agent::SshAgent;
use capgate_spec::caps::{Capability, KnownType, Phase, clean_path};
use capgate_spec::names::{self, Provide, Version};
use capgate_spec::node::Node;
use capgate_spec::{Descriptor, Entry, Kind, canonical, refs};

use crate::problem::Refusal;

/// One kit's part in a composition: its selected entries (groups flattened), in order.
#[derive(Debug, Clone)]
pub struct Contribution<'a> {
    /// The kit's reference, used to attribute problems (`first-kit capabilities[0]`).
    pub reference: &'a str,
    /// The kit's effective descriptor (its `version` is the effective provide version).
    pub descriptor: &'a Descriptor,
    /// The selected entries with their paths in the kit (`capabilities[1]`,
    /// `capabilities[2].group.capabilities[0]`).
    pub entries: Vec<(String, &'a Entry)>,
}

/// An agent-context body and the kit it came from.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ContextSource {
    pub reference: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
}

/// The merged result.
#[derive(Debug, Clone, PartialEq)]
pub struct Composed {
    pub kind: Kind,
    pub provides: Vec<String>,
    pub requires: Vec<String>,
    pub integrates: Vec<String>,
    pub conflicts: Vec<String>,
    pub licenses: Vec<String>,
    /// The merged entries, typed, in the spec's finish order.
    pub entries: Vec<Entry>,
    pub context_sources: Vec<ContextSource>,
}

impl Composed {
    /// The merged effective descriptor.
    pub fn descriptor(&self) -> Descriptor {
        Descriptor {
            schema_version: "3".to_owned(),
            display_name: None,
            author: None,
            description: None,
            source_url: None,
            icon_url: None,
            licenses: self.licenses.clone(),
            kind: self.kind,
            version: None,
            args: Vec::new(),
            provides: self.provides.clone(),
            requires: self.requires.clone(),
            integrates: self.integrates.clone(),
            conflicts: self.conflicts.clone(),
            build: None,
            dockerfile: None,
            kits: None,
            capabilities: self
                .entries
                .iter()
                .cloned()
                .map(capgate_spec::Item::Entry)
                .collect(),
        }
    }
}

/// Merges contributions given in dependency order (providers first).
///
/// Entries must be selected (groups flattened) and expanded: an entry still holding an arg
/// or env reference is refused. Every problem is reported, each naming the kits and the
/// paths of the entries involved.
pub fn compose(contributions: &[Contribution<'_>]) -> Result<Composed, Vec<Refusal>> {
    if contributions.is_empty() {
        return Err(vec![Refusal::new(
            "nothing to compose: no kit contributes to the composition",
        )]);
    }
    let mut problems = Vec::new();
    let kind = derived_kind(contributions, &mut problems);
    let relations = relations(contributions, &mut problems);
    let mut merge = Merge::default();
    for c in contributions {
        for (path, entry) in &c.entries {
            let at = At {
                reference: c.reference,
                path,
            };
            merge.add(at, entry, &mut problems);
        }
    }
    let (entries, context_sources) = merge.finish(&mut problems);
    read_only_conflicts(contributions, &entries, &mut problems);
    if !problems.is_empty() {
        return Err(problems);
    }
    Ok(Composed {
        kind,
        provides: relations.provides,
        requires: relations.requires,
        integrates: relations.integrates,
        conflicts: relations.conflicts,
        licenses: relations.licenses,
        entries,
        context_sources,
    })
}

/// A `read-only` tier (dev.capgate/determinism@1) and a host mount cannot share a sandbox:
/// the mount is a way to change the host's files, which the tier rules out. (The network
/// side of the tier is enforced by the rules it provisions.)
fn read_only_conflicts(
    contributions: &[Contribution<'_>],
    merged: &[Entry],
    problems: &mut Vec<Refusal>,
) {
    use capgate_spec::caps::pack::Tier;
    let read_only = merged.iter().any(
        |e| matches!(&e.capability, Some(Capability::Determinism(d)) if d.tier == Tier::ReadOnly),
    );
    if !read_only {
        return;
    }
    for c in contributions {
        for (path, entry) in &c.entries {
            if let Some(Capability::HostMount(m)) = &entry.capability {
                problems.push(Refusal::at(
                    c.reference,
                    path,
                    format!(
                        "host mount `{}` would let a read-only workload change the host's files; the composition's tier is `read-only`",
                        m.path
                    ),
                ));
            }
        }
    }
}

/// Where an entry comes from: a kit and the entry's path in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct At<'c> {
    reference: &'c str,
    path: &'c str,
}

impl At<'_> {
    fn refuse(self, message: impl Into<String>) -> Refusal {
        Refusal::at(self.reference, self.path, message)
    }
}

/// `` `first-kit capabilities[0]` ``
impl fmt::Display for At<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "`{} {}`", self.reference, self.path)
    }
}

// ---------------------------------------------------------------------------------------
// Kind and relations.

/// One workload makes a workload, none a mixin; two workloads, or a set that was never
/// merged, cannot compose.
fn derived_kind(contributions: &[Contribution<'_>], problems: &mut Vec<Refusal>) -> Kind {
    let mut workload: Option<&str> = None;
    for c in contributions {
        match c.descriptor.kind {
            Kind::Workload => match workload {
                Some(first) => problems.push(Refusal::new(format!(
                    "`{first}` and `{}` are both workload kits; a composition has exactly one base",
                    c.reference
                ))),
                None => workload = Some(c.reference),
            },
            Kind::Set => problems.push(Refusal::in_kit(
                c.reference,
                "declares `kind: set`; a set has to be merged before it can contribute to a composition",
            )),
            Kind::Mixin => {}
        }
    }
    if workload.is_some() {
        Kind::Workload
    } else {
        Kind::Mixin
    }
}

#[derive(Debug, Default)]
struct Relations {
    provides: Vec<String>,
    requires: Vec<String>,
    integrates: Vec<String>,
    conflicts: Vec<String>,
    licenses: Vec<String>,
}

/// Provides union (a bare provide takes its contributor's `version`), requires and
/// integrates union minus what another contribution provides, conflicts union, licenses
/// union sorted.
fn relations(contributions: &[Contribution<'_>], problems: &mut Vec<Refusal>) -> Relations {
    let mut out = Relations::default();
    // What each contribution offers, bare provides materialized with its version.
    let mut offered: Vec<Vec<Provide>> = Vec::with_capacity(contributions.len());
    let mut emitted: HashSet<String> = HashSet::new();
    for c in contributions {
        let fallback = c
            .descriptor
            .version
            .as_deref()
            .map(str::trim)
            .filter(|v| !v.is_empty());
        let mut mine = Vec::new();
        for (i, written) in c.descriptor.provides.iter().enumerate() {
            let at = format!("provides[{i}]");
            let mut provide = match names::parse_provide(written) {
                Ok(p) => p,
                Err(e) => {
                    problems.push(Refusal::at(
                        c.reference,
                        &at,
                        format!("provide `{written}` cannot be read: {e}"),
                    ));
                    continue;
                }
            };
            // The author's spelling of the name is kept, trimmed so that `shell ` does not
            // become `shell @1.0.0`.
            let mut text = written.trim().to_owned();
            if provide.version.is_none()
                && let Some(v) = fallback
            {
                match Version::parse(v) {
                    Ok(version) => {
                        text = format!("{text}@{}", version.as_str());
                        provide.version = Some(version);
                    }
                    Err(e) => problems.push(Refusal::at(
                        c.reference,
                        "version",
                        format!("version `{v}` cannot version provide `{written}`: {e}"),
                    )),
                }
            }
            let key = format!(
                "{}@{}",
                provide.name,
                provide.version.as_ref().map_or("", Version::as_str)
            );
            if emitted.insert(key) {
                out.provides.push(text);
            }
            mine.push(provide);
        }
        offered.push(mine);
    }

    let mut seen_requires = HashSet::new();
    let mut seen_integrates = HashSet::new();
    let mut seen_conflicts = HashSet::new();
    let mut licenses = HashSet::new();
    for (i, c) in contributions.iter().enumerate() {
        for (field, list, seen, into) in [
            (
                "requires",
                &c.descriptor.requires,
                &mut seen_requires,
                &mut out.requires,
            ),
            (
                "integrates",
                &c.descriptor.integrates,
                &mut seen_integrates,
                &mut out.integrates,
            ),
        ] {
            for (j, written) in list.iter().enumerate() {
                let require = match names::parse_require(written) {
                    Ok(r) => r,
                    Err(e) => {
                        problems.push(Refusal::at(
                            c.reference,
                            &format!("{field}[{j}]"),
                            format!("`{written}` cannot be read: {e}"),
                        ));
                        continue;
                    }
                };
                // A contribution's own provide never answers its own requirement.
                let answered = offered
                    .iter()
                    .enumerate()
                    .any(|(k, ps)| k != i && ps.iter().any(|p| names::satisfies(p, &require)));
                if !answered && seen.insert(written.as_str()) {
                    into.push(written.clone());
                }
            }
        }
        for conflict in &c.descriptor.conflicts {
            if seen_conflicts.insert(conflict.as_str()) {
                out.conflicts.push(conflict.clone());
            }
        }
        for license in &c.descriptor.licenses {
            if licenses.insert(license.as_str()) {
                out.licenses.push(license.clone());
            }
        }
    }
    out.licenses.sort();
    out
}

// ---------------------------------------------------------------------------------------
// Capabilities.

/// The label, description and optionality of a merged entry: the first non-empty label
/// and description in contribution order; optional only if every asker was.
#[derive(Debug, Clone)]
struct Meta {
    name: Option<String>,
    description: Option<String>,
    optional: bool,
}

impl Meta {
    fn of(e: &Entry) -> Meta {
        Meta {
            name: non_empty(e.name.as_ref()),
            description: non_empty(e.description.as_ref()),
            optional: e.optional,
        }
    }

    fn absorb(&mut self, e: &Entry) {
        if self.name.is_none() {
            self.name = non_empty(e.name.as_ref());
        }
        if self.description.is_none() {
            self.description = non_empty(e.description.as_ref());
        }
        self.optional &= e.optional;
    }

    /// The meta of every entry in `asks`, or `None` when there is none.
    fn over<T>(asks: &[Ask<'_, T>]) -> Option<Meta> {
        let (first, rest) = asks.split_first()?;
        let mut meta = Meta::of(first.entry);
        for ask in rest {
            meta.absorb(ask.entry);
        }
        Some(meta)
    }
}

fn non_empty(s: Option<&String>) -> Option<String> {
    s.filter(|s| !s.is_empty()).cloned()
}

/// An entry collected for a whole-type merge (network, lifecycle, agent-context).
#[derive(Debug)]
struct Ask<'c, T> {
    at: At<'c>,
    entry: &'c Entry,
    value: &'c T,
}

/// What a keyed slot holds: a typed capability, or an unknown type's config as written.
#[derive(Debug)]
enum Held {
    Typed(Capability),
    Opaque {
        type_name: String,
        config: Option<Node>,
    },
}

/// An instance-keyed entry and the first contribution that asked for it.
#[derive(Debug)]
struct Slot<'c> {
    at: At<'c>,
    meta: Meta,
    held: Held,
}

/// A type describing the whole sandbox, and its author.
#[derive(Debug)]
struct Sole<'c> {
    at: At<'c>,
    meta: Meta,
    capability: Capability,
}

#[derive(Debug, Default)]
struct Merge<'c> {
    network: Vec<Ask<'c, NetworkPolicy>>,
    lifecycles: Vec<Ask<'c, Lifecycle>>,
    contexts: Vec<Ask<'c, AgentContext>>,
    /// Instance-keyed entries in first-seen order.
    keyed: Vec<Slot<'c>>,
    index: HashMap<String, usize>,
    resources: Option<Sole<'c>>,
    sessions: Option<Sole<'c>>,
    interactive: Option<Sole<'c>>,
}

impl<'c> Merge<'c> {
    fn add(&mut self, at: At<'c>, entry: &'c Entry, problems: &mut Vec<Refusal>) {
        if entry.parameterized {
            problems.extend(parameterized(at, entry));
            return;
        }
        let Some(capability) = &entry.capability else {
            if entry.known.is_some() {
                problems.push(at.refuse(format!(
                    "`{}` carries no readable config; validate the kit before composing it",
                    entry.type_name
                )));
            } else {
                let held = Held::Opaque {
                    type_name: entry.type_name.clone(),
                    config: entry.config.clone(),
                };
                self.keyed(at, entry, opaque_key(entry), held, problems);
            }
            return;
        };
        match capability {
            Capability::NetworkPolicy(value) => self.network.push(Ask { at, entry, value }),
            Capability::Lifecycle(value) => self.lifecycles.push(Ask { at, entry, value }),
            Capability::AgentContext(value) => self.contexts.push(Ask { at, entry, value }),
            Capability::Resources(_)
            | Capability::AgentSessions(_)
            | Capability::AgentInteractiveSessions(_) => self.sole(at, entry, capability, problems),
            Capability::Credential(credential) => {
                if credential.phases.is_empty() {
                    problems.push(at.refuse("credential states no phase"));
                }
                for &phase in &credential.phases {
                    let one = Credential {
                        phases: vec![phase],
                        ..credential.clone()
                    };
                    let key = format!("{}\0{}\0{phase}", KnownType::Credential.name(), one.service);
                    let held = Held::Typed(Capability::Credential(one));
                    self.keyed(at, entry, key, held, problems);
                }
            }
            Capability::SshAgent(agent) => {
                if agent.phases.is_empty() {
                    problems.push(at.refuse("ssh-agent states no phase"));
                }
                for &phase in &agent.phases {
                    let one = SshAgent {
                        phases: vec![phase],
                        ..agent.clone()
                    };
                    let key = format!("{}\0{phase}", KnownType::SshAgent.name());
                    let held = Held::Typed(Capability::SshAgent(one));
                    self.keyed(at, entry, key, held, problems);
                }
            }
            other => {
                let key = instance_key(other, entry);
                self.keyed(at, entry, key, Held::Typed(other.clone()), problems);
            }
        }
    }

    fn keyed(
        &mut self,
        at: At<'c>,
        entry: &Entry,
        key: String,
        held: Held,
        problems: &mut Vec<Refusal>,
    ) {
        let Some(&i) = self.index.get(&key) else {
            self.index.insert(key, self.keyed.len());
            self.keyed.push(Slot {
                at,
                meta: Meta::of(entry),
                held,
            });
            return;
        };
        let Some(slot) = self.keyed.get_mut(i) else {
            return;
        };
        match reconcile(&slot.held, &held, slot.at, at) {
            Ok(merged) => {
                if let Some(merged) = merged {
                    slot.held = merged;
                }
                slot.meta.absorb(entry);
            }
            Err(refusal) => problems.push(refusal),
        }
    }

    fn sole(
        &mut self,
        at: At<'c>,
        entry: &Entry,
        capability: &Capability,
        problems: &mut Vec<Refusal>,
    ) {
        let slot = match capability {
            Capability::Resources(_) => &mut self.resources,
            Capability::AgentSessions(_) => &mut self.sessions,
            _ => &mut self.interactive,
        };
        match slot {
            None => {
                *slot = Some(Sole {
                    at,
                    meta: Meta::of(entry),
                    capability: capability.clone(),
                });
            }
            Some(held) if held.capability == *capability => held.meta.absorb(entry),
            Some(held) => problems.push(Refusal::new(format!(
                "{} and {at} both declare {} and ask for different things; it describes the whole sandbox, so it has one author",
                held.at, entry.type_name
            ))),
        }
    }

    /// The merged entries in finish order, and the agent-context bodies.
    fn finish(self, problems: &mut Vec<Refusal>) -> (Vec<Entry>, Vec<ContextSource>) {
        self.cross_check(problems);
        let mut merged: Vec<(Meta, Held)> = Vec::new();
        if let Some((meta, policy)) = merged_network(&self.network) {
            merged.push((meta, Held::Typed(Capability::NetworkPolicy(policy))));
        }
        merged.extend(self.keyed.into_iter().map(|slot| (slot.meta, slot.held)));
        for sole in [self.resources, self.sessions, self.interactive]
            .into_iter()
            .flatten()
        {
            merged.push((sole.meta, Held::Typed(sole.capability)));
        }
        if let Some((meta, lifecycle)) = merged_lifecycle(&self.lifecycles, problems) {
            merged.push((meta, Held::Typed(Capability::Lifecycle(lifecycle))));
        }
        let (profiles, sources) = merged_context(&self.contexts, problems);
        for (meta, context) in profiles {
            merged.push((meta, Held::Typed(Capability::AgentContext(context))));
        }
        let mut out = Vec::with_capacity(merged.len());
        for (meta, held) in merged {
            match held {
                Held::Typed(capability) => match typed_entry(meta, capability) {
                    Ok(e) => out.push(e),
                    Err(r) => problems.push(r),
                },
                Held::Opaque { type_name, config } => out.push(Entry {
                    type_name,
                    known: None,
                    name: meta.name,
                    optional: meta.optional,
                    description: meta.description,
                    config,
                    source: None,
                    parameterized: false,
                    capability: None,
                    type_pos: capgate_spec::descriptor::Place::default(),
                }),
            }
        }
        (out, sources)
    }

    /// Agreement across kits: the interactive sessions' `newSession` against every
    /// contributor's lifecycle `interactive`, and the two session types' `list`.
    fn cross_check(&self, problems: &mut Vec<Refusal>) {
        let Some(tui) = &self.interactive else {
            return;
        };
        let Capability::AgentInteractiveSessions(interactive) = &tui.capability else {
            return;
        };
        let resolved = |argv: &[String]| !argv.iter().any(|s| refs::has_any_ref(s));
        if let Some(new_session) = interactive.new_session.as_deref()
            && resolved(new_session)
        {
            for lc in &self.lifecycles {
                if let Some(tail) = lc.value.interactive.as_deref()
                    && resolved(tail)
                    && tail != new_session
                {
                    problems.push(Refusal::new(format!(
                        "newSession `{}` at {} disagrees with lifecycle interactive `{}` at {}; the plain interactive launch has one tail",
                        render_argv(new_session),
                        tui.at,
                        render_argv(tail),
                        lc.at
                    )));
                }
            }
        }
        if let Some(headless) = &self.sessions
            && let Capability::AgentSessions(sessions) = &headless.capability
            && let (Some(headless_list), Some(tui_list)) =
                (sessions.list.as_deref(), interactive.list.as_deref())
            && !headless_list.is_empty()
            && !tui_list.is_empty()
            && resolved(headless_list)
            && resolved(tui_list)
            && headless_list != tui_list
        {
            problems.push(Refusal::new(format!(
                "agent-sessions list `{}` at {} differs from agent-interactive-sessions list `{}` at {}; one agent lists its sessions one way",
                render_argv(headless_list),
                headless.at,
                render_argv(tui_list),
                tui.at
            )));
        }
    }
}

/// Why an entry that still holds references cannot be merged. A lifecycle file path is
/// called out on its own: the merge has to read it to find two writers of one file.
fn parameterized(at: At<'_>, entry: &Entry) -> Vec<Refusal> {
    if entry.known == Some(KnownType::Lifecycle) {
        let paths: Vec<Refusal> = entry
            .config
            .as_ref()
            .and_then(|c| c.get("files"))
            .and_then(Node::as_seq)
            .unwrap_or_default()
            .iter()
            .filter_map(|f| f.get("path").and_then(Node::as_str))
            .filter(|p| refs::has_arg_ref(p))
            .map(|p| {
                at.refuse(format!(
                    "lifecycle file path `{p}` resolves at create; pin the path"
                ))
            })
            .collect();
        if !paths.is_empty() {
            return paths;
        }
    }
    vec![at.refuse(format!(
        "`{}` is still parameterized where the merge has to read it; expand its kit args and kit.env references before composing",
        entry.type_name
    ))]
}

/// The key an instance-shaped type unions on (spec §4.3 `instanceKey`). Volume and
/// host-mount share the path key on purpose: they claim one mount destination.
fn instance_key(capability: &Capability, entry: &Entry) -> String {
    let keyed = |t: KnownType, k: &str| format!("{}\0{k}", t.name());
    match capability {
        Capability::Volume(v) => keyed(KnownType::Volume, &clean_path(&v.path)),
        Capability::HostMount(m) => keyed(KnownType::Volume, &clean_path(&m.path)),
        Capability::AgentSkill(s) => keyed(KnownType::AgentSkill, s.effective_name()),
        Capability::AgentSkills(s) => keyed(KnownType::AgentSkills, &s.path),
        Capability::Port(p) => keyed(KnownType::Port, &p.key()),
        // One triple is one grant however its host is cased.
        Capability::Egress(e) => keyed(KnownType::Egress, &e.key()),
        // One set of write places, one exec allowlist per sandbox: kits' lists union.
        Capability::Filesystem(_) => KnownType::Filesystem.name().to_owned(),
        Capability::Exec(_) => KnownType::Exec.name().to_owned(),
        // One tier per workload: a second, different tier collides and is refused.
        Capability::Determinism(_) => KnownType::Determinism.name().to_owned(),
        Capability::Acp(a) => keyed(
            KnownType::Acp,
            &a.agent_name()
                .map_or_else(|| a.agent.clone(), |n| n.to_string()),
        ),
        _ => opaque_key(entry),
    }
}

/// Type plus the canonical JSON of the config; an absent, null or empty config is the
/// type alone (`config: {}` and no config are one request).
fn opaque_key(entry: &Entry) -> String {
    let stated = entry
        .config
        .as_ref()
        .filter(|c| !(c.is_null() || c.as_map().is_some_and(<[_]>::is_empty)));
    match stated {
        None => entry.type_name.clone(),
        Some(c) => format!(
            "{}\0{}",
            entry.type_name,
            canonical::to_string(c).unwrap_or_else(|| c.to_json().to_string())
        ),
    }
}

/// A second ask under a held key: `Ok(None)` when it collapses into what is held,
/// `Ok(Some(_))` when the two merge into something new, `Err` when they cannot share.
fn reconcile(
    held: &Held,
    asked: &Held,
    first: At<'_>,
    second: At<'_>,
) -> Result<Option<Held>, Refusal> {
    use Capability as C;
    // An unknown type's key is its whole config: a collision is the same request.
    let (Held::Typed(a), Held::Typed(b)) = (held, asked) else {
        return Ok(None);
    };
    let different = |what: String| {
        Refusal::new(format!(
            "{first} and {second} both declare {what} but ask for different things; one of them has to change"
        ))
    };
    // One kit restating its own request in another declaration block (an ordinary entry
    // and a selected group member) is still one owner asking once.
    let restated = first.reference == second.reference && a == b;
    match (a, b) {
        (C::HostMount(_), _) | (C::Credential(_), _) if restated => Ok(None),
        (C::HostMount(m), _) | (_, C::HostMount(m)) => Err(Refusal::new(format!(
            "{first} ({}) and {second} ({}) both declare storage at `{}`; a host mount has one owner",
            a.known_type(),
            b.known_type(),
            clean_path(&m.path)
        ))),
        (C::Credential(c), C::Credential(_)) => Err(Refusal::new(format!(
            "{first} and {second} both declare credential `{}` for the {} phase; one credential has one owner",
            c.service,
            c.phases.first().map_or("", |p| p.as_str())
        ))),
        (C::SshAgent(x), C::SshAgent(y)) => {
            Ok(Some(Held::Typed(C::SshAgent(merge_ssh_agents(x, y)))))
        }
        (C::Volume(x), C::Volume(y)) => {
            if x.same_request(y) {
                Ok(None)
            } else {
                Err(different(format!(
                    "{} at `{}`",
                    KnownType::Volume,
                    clean_path(&x.path)
                )))
            }
        }
        (C::AgentSkill(x), C::AgentSkill(y)) => {
            if x.path == y.path {
                Ok(None)
            } else {
                Err(different(format!(
                    "{} named `{}` (from `{}` and `{}`)",
                    KnownType::AgentSkill,
                    x.effective_name(),
                    x.path,
                    y.path
                )))
            }
        }
        (C::AgentSkills(x), C::AgentSkills(y)) => {
            // Across kits the widest mode wins (spec §9 item 3); the host still bounds it.
            if x.effective_mode() == y.effective_mode()
                || x.effective_mode() == SkillsMode::Readwrite
            {
                Ok(None)
            } else {
                let mut widest = x.clone();
                widest.mode = Some(SkillsMode::Readwrite);
                Ok(Some(Held::Typed(C::AgentSkills(widest))))
            }
        }
        (C::Port(x), C::Port(y)) => {
            // One publication per key; the port's name is informational, first one kept.
            if x.name.is_empty() && !y.name.is_empty() {
                let mut named = x.clone();
                named.name.clone_from(&y.name);
                Ok(Some(Held::Typed(C::Port(named))))
            } else {
                Ok(None)
            }
        }
        (C::Acp(x), C::Acp(y)) => {
            if same_acp(x, y) {
                Ok(None)
            } else {
                Err(different(format!(
                    "{} for agent `{}`",
                    KnownType::Acp,
                    x.agent
                )))
            }
        }
        (C::Egress(_), C::Egress(_)) => Ok(None),
        (C::Filesystem(x), C::Filesystem(y)) => {
            // Grants union: write places add up; the workspace shows what either kit
            // reads, and all of it when one of them reads it all (states no `read`).
            let merged = capgate_spec::caps::pack::Filesystem {
                write: union(&x.write, &y.write).unwrap_or_else(|| x.write.clone()),
                read: match (&x.read, &y.read) {
                    (Some(a), Some(b)) => Some(union(a, b).unwrap_or_else(|| a.clone())),
                    _ => None,
                },
            };
            Ok((merged != *x).then(|| Held::Typed(C::Filesystem(merged))))
        }
        (C::Exec(x), C::Exec(y)) => Ok(union(&x.allow, &y.allow)
            .map(|allow| Held::Typed(C::Exec(capgate_spec::caps::pack::Exec { allow })))),
        (C::Determinism(x), C::Determinism(y)) if x != y => Err(Refusal::new(format!(
            "{first} declares determinism tier `{}` and {second} tier `{}`; a workload has one tier, so one of them has to change",
            x.tier, y.tier
        ))),
        // Keyed on the whole config (usb-device, config-less types): equal by construction.
        _ if a == b => Ok(None),
        _ => Err(different(a.known_type().to_string())),
    }
}

/// `held` with what `asked` adds, in order; `None` when it adds nothing.
fn union(held: &[String], asked: &[String]) -> Option<Vec<String>> {
    let mut all = held.to_vec();
    all.extend(asked.iter().filter(|p| !held.contains(p)).cloned());
    (all.len() != held.len()).then_some(all)
}

/// One socket per phase serves every kit that asked: unrestricted if any ask is,
/// otherwise the sorted unions of the bounds.
fn merge_ssh_agents(held: &SshAgent, asked: &SshAgent) -> SshAgent {
    if held.unrestricted || asked.unrestricted {
        return SshAgent {
            phases: held.phases.clone(),
            unrestricted: true,
            sign: Vec::new(),
            authenticate: Vec::new(),
        };
    }
    let union = |a: &[String], b: &[String]| {
        let mut all: Vec<String> = a.iter().chain(b).cloned().collect();
        all.sort();
        all.dedup();
        all
    };
    SshAgent {
        phases: held.phases.clone(),
        unrestricted: false,
        sign: union(&held.sign, &asked.sign),
        authenticate: union(&held.authenticate, &asked.authenticate),
    }
}

/// acp@1 identity (spec §2.21): normalized agent, command argv, env (absent ≡ empty) and
/// protocol version (absent ≡ 1).
fn same_acp(a: &Acp, b: &Acp) -> bool {
    let agent = match (a.agent_name(), b.agent_name()) {
        (Some(x), Some(y)) => x == y,
        _ => a.agent == b.agent,
    };
    agent
        && a.command == b.command
        && a.env == b.env
        && a.effective_protocol_version() == b.effective_protocol_version()
}

/// A merged entry written back from its typed config, without `source`.
fn typed_entry(meta: Meta, capability: Capability) -> Result<Entry, Refusal> {
    let known = capability.known_type();
    let config = capability
        .config_json()
        .map_err(|e| Refusal::new(format!("the merged {known} config cannot be written: {e}")))?
        .map(|v| Node::from_json(&v));
    Ok(Entry {
        type_name: known.name().to_owned(),
        known: Some(known),
        name: meta.name,
        optional: meta.optional,
        description: meta.description,
        config,
        source: None,
        parameterized: false,
        capability: Some(capability),
        type_pos: capgate_spec::descriptor::Place::default(),
    })
}

fn render_argv(argv: &[String]) -> String {
    serde_json::to_string(argv).unwrap_or_else(|_| argv.join(" "))
}

// ---------------------------------------------------------------------------------------
// Whole-type merges.

/// Every contributor's egress in one policy: union per phase, @1 hosts lifted, @2 when any
/// contributor wrote @2. Identical entries collapse; a bounded allow loses every host some
/// unbounded allow of the phase grants (the union is the unbounded grant) and goes when it
/// loses them all; denies are only de-duplicated.
fn merged_network(asks: &[Ask<'_, NetworkPolicy>]) -> Option<(Meta, NetworkPolicy)> {
    let meta = Meta::over(asks)?;
    let v2 = asks.iter().any(|a| a.value.version == PolicyVersion::V2);
    let phase = |p: Phase| -> Option<PhaseRules> {
        let stated: Vec<&PhaseRules> = asks.iter().filter_map(|a| a.value.phase(p)).collect();
        if stated.is_empty() {
            return None;
        }
        let allow = dedupe(stated.iter().flat_map(|r| &r.allow));
        let deny = dedupe(stated.iter().flat_map(|r| &r.deny));
        let unbounded: HashSet<&str> = allow
            .iter()
            .filter(|e| !e.is_bounded())
            .flat_map(|e| e.hosts.iter().map(String::as_str))
            .collect();
        let allow: Vec<HostEntry> = allow
            .iter()
            .filter_map(|e| {
                if !e.is_bounded() {
                    return Some(e.clone());
                }
                let hosts: Vec<String> = e
                    .hosts
                    .iter()
                    .filter(|h| !unbounded.contains(h.as_str()))
                    .cloned()
                    .collect();
                (!hosts.is_empty()).then(|| HostEntry { hosts, ..e.clone() })
            })
            .collect();
        Some(if v2 {
            PhaseRules { allow, deny }
        } else {
            PhaseRules {
                allow: flatten_hosts(&allow),
                deny: flatten_hosts(&deny),
            }
        })
    };
    let policy = NetworkPolicy {
        version: if v2 {
            PolicyVersion::V2
        } else {
            PolicyVersion::V1
        },
        install: phase(Phase::Install),
        runtime: phase(Phase::Runtime),
    };
    Some((meta, policy))
}

/// Identical entries (same hosts, methods and paths lists) once each, first kept.
fn dedupe<'e>(entries: impl Iterator<Item = &'e HostEntry>) -> Vec<HostEntry> {
    let mut seen: HashSet<&HostEntry> = HashSet::new();
    entries.filter(|e| seen.insert(*e)).cloned().collect()
}

/// The @1 shape: every host of the list once, as its own unbounded entry.
fn flatten_hosts(entries: &[HostEntry]) -> Vec<HostEntry> {
    let mut seen: HashSet<&str> = HashSet::new();
    entries
        .iter()
        .flat_map(|e| &e.hosts)
        .filter(|h| seen.insert(h.as_str()))
        .map(|h| HostEntry::host(h.clone()))
        .collect()
}

/// Hooks and files concatenated in contribution order. One file has one author, and the
/// interactive tail (the launch command's arguments) has one author too.
fn merged_lifecycle(
    asks: &[Ask<'_, Lifecycle>],
    problems: &mut Vec<Refusal>,
) -> Option<(Meta, Lifecycle)> {
    let meta = Meta::over(asks)?;
    let mut merged = Lifecycle::default();
    let mut interactive_from: Option<At<'_>> = None;
    let mut written: HashMap<String, At<'_>> = HashMap::new();
    for ask in asks {
        let lifecycle = ask.value;
        merged.install.extend(lifecycle.install.iter().cloned());
        merged.startup.extend(lifecycle.startup.iter().cloned());
        for file in &lifecycle.files {
            if refs::has_arg_ref(&file.path) {
                problems.push(ask.at.refuse(format!(
                    "lifecycle file path `{}` resolves at create; pin the path",
                    file.path
                )));
                continue;
            }
            let clean = clean_path(&file.path);
            match written.get(&clean) {
                Some(&prev) if prev != ask.at => problems.push(Refusal::new(format!(
                    "{clean} is written by two contributions, {prev} and {}; one file has one author",
                    ask.at
                ))),
                Some(_) => {}
                None => {
                    written.insert(clean, ask.at);
                }
            }
        }
        merged.files.extend(lifecycle.files.iter().cloned());
        if let Some(tail) = &lifecycle.interactive {
            match interactive_from {
                Some(prev) => problems.push(Refusal::new(format!(
                    "{prev} and {} both declare a lifecycle interactive tail; it replaces the launch command's arguments, so it has one author",
                    ask.at
                ))),
                None => {
                    interactive_from = Some(ask.at);
                    merged.interactive = Some(tail.clone());
                }
            }
        }
    }
    Some((meta, merged))
}

/// Agent-context profiles and bodies. Every distinct explicit profile (directory and
/// filename) is kept, in contribution order, and takes precedence over the legacy
/// undirected filename; without an explicit profile one contribution may own the legacy
/// filename. Every body becomes a [`ContextSource`]; the first profile carries the first
/// body as written (other profiles carry none), so the merged entry still states what it
/// asks for, while the sources are the complete list a runtime materializes.
fn merged_context(
    asks: &[Ask<'_, AgentContext>],
    problems: &mut Vec<Refusal>,
) -> (Vec<(Meta, AgentContext)>, Vec<ContextSource>) {
    let Some(meta) = Meta::over(asks) else {
        return (Vec::new(), Vec::new());
    };
    let sources: Vec<ContextSource> = asks
        .iter()
        .filter_map(|ask| {
            let c = ask.value;
            let path = c.content_file.clone().filter(|s| !s.is_empty());
            let content = c.content.clone().filter(|s| !s.is_empty());
            (path.is_some() || content.is_some()).then(|| ContextSource {
                reference: ask.at.reference.to_owned(),
                content: if path.is_some() { None } else { content },
                path,
            })
        })
        .collect();

    let mut profiles: Vec<AgentContext> = Vec::new();
    for ask in asks {
        let c = ask.value;
        if let Some(directory) = &c.directory {
            let already = profiles
                .iter()
                .any(|p| p.directory.as_ref() == Some(directory) && p.filename == c.filename);
            if !already {
                profiles.push(AgentContext {
                    filename: c.filename.clone(),
                    directory: Some(directory.clone()),
                    ..AgentContext::default()
                });
            }
        }
    }
    if profiles.is_empty() {
        let mut legacy: Option<(At<'_>, &str)> = None;
        for ask in asks {
            let Some(filename) = ask.value.filename.as_deref().filter(|f| !f.is_empty()) else {
                continue;
            };
            match legacy {
                Some((prev, held)) if prev.reference != ask.at.reference || held != filename => {
                    problems.push(Refusal::new(format!(
                        "{prev} and {} both declare an agent-context filename (`{held}` and `{filename}`); the profile belongs to the kit that owns the environment",
                        ask.at
                    )));
                }
                Some(_) => {}
                None => legacy = Some((ask.at, filename)),
            }
        }
        if let Some((_, filename)) = legacy {
            profiles.push(AgentContext {
                filename: Some(filename.to_owned()),
                ..AgentContext::default()
            });
        }
    }
    if let Some(body) = asks.iter().map(|a| a.value).find(|c| c.has_body()) {
        if profiles.is_empty() {
            profiles.push(AgentContext::default());
        }
        if let Some(first) = profiles.first_mut() {
            first.content_file = body.content_file.clone().filter(|s| !s.is_empty());
            if first.content_file.is_none() {
                first.content.clone_from(&body.content);
            }
        }
    }
    let profiles = profiles.into_iter().map(|p| (meta.clone(), p)).collect();
    (profiles, sources)
}
