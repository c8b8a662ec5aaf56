//! Reading a descriptor from bytes: strict decode and complete validation in one pass over
//! the positioned tree, so every problem carries its path and `line:column`.
//!
//! The checks follow spec §1 and §2: top-level grammar (§1.3), set members (§1.4),
//! relations (§1.5), capability entries and groups (§1.7, §1.10), args (§1.8), references
//! (§1.8, §1.9), the size budget (§9.4), and each well-known type's rules (§2), judged per
//! declaration block.

use std::collections::HashMap;

use crate::caps::{self, BlockKey, Capability, KnownType};
use crate::descriptor::{ArgDecl, Descriptor, Entry, Group, Item, Kind, KitEntry, SourceRef};
use crate::diag::Diagnostics;
use crate::names;
use crate::node::{Node, Path, Pos, Value};
use crate::read::{Cx, Fields};
use crate::reference;
use crate::refs::{self, RefKind};
use crate::yaml::{self, Limits};

/// A descriptor above this size is refused (spec §9.4).
pub const BUDGET_ERROR_BYTES: usize = 512 * 1024;
/// A descriptor above this size draws a warning (spec §9.4).
pub const BUDGET_WARNING_BYTES: usize = 64 * 1024;

/// Which form of descriptor is being judged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Profile {
    /// As an author writes it (`ValidateRaw` plus the authored-form checks): references
    /// to args are allowed and judged leniently.
    #[default]
    Authored,
    /// As published in an image annotation (`ValidatePublished`): no build-phase
    /// references, no `kind: set`, pinned kits, literal provides and version.
    Published,
    /// After create-phase expansion (`ValidateEffective`): no references at all, strict.
    Effective,
}

/// How to read and judge one descriptor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Options {
    pub profile: Profile,
    pub limits: Limits,
    /// Skip the checks that depend on selection (the credential inject ⊆ allow cross-check),
    /// and allow groups in the effective form.
    pub declarations_only: bool,
}

/// The outcome of reading one descriptor.
#[derive(Debug, Clone)]
pub struct Loaded {
    /// The document tree, when the text was readable.
    pub root: Option<Node>,
    /// The descriptor, when its shape could be read (it may still carry errors).
    pub descriptor: Option<Descriptor>,
    /// Every problem found, sorted by position.
    pub diagnostics: Diagnostics,
}

impl Loaded {
    /// No errors (warnings allowed).
    pub fn is_valid(&self) -> bool {
        self.descriptor.is_some() && !self.diagnostics.has_errors()
    }

    /// The descriptor if it is valid.
    pub fn valid(&self) -> Option<&Descriptor> {
        if self.is_valid() {
            self.descriptor.as_ref()
        } else {
            None
        }
    }
}

/// Reads and validates descriptor text (YAML or JSON).
pub fn load(bytes: &[u8], opts: &Options) -> Loaded {
    let mut diags = Diagnostics::new();
    let Some(root) = yaml::parse(bytes, &opts.limits, &mut diags) else {
        return Loaded {
            root: None,
            descriptor: None,
            diagnostics: diags,
        };
    };
    let descriptor = judge(&root, Some(bytes), opts, &mut diags);
    Loaded {
        root: Some(root),
        descriptor,
        diagnostics: diags.sorted(),
    }
}

/// Validates a tree built in memory (for example an expanded or merged descriptor).
pub fn load_tree(root: &Node, opts: &Options) -> Loaded {
    let mut diags = Diagnostics::new();
    let text = serde_json::to_vec(root).unwrap_or_default();
    let descriptor = judge(root, Some(&text), opts, &mut diags);
    Loaded {
        root: Some(root.clone()),
        descriptor,
        diagnostics: diags.sorted(),
    }
}

fn judge(
    root: &Node,
    raw: Option<&[u8]>,
    opts: &Options,
    diags: &mut Diagnostics,
) -> Option<Descriptor> {
    let top = Path::root();
    if let Some(raw) = raw {
        if raw.len() > BUDGET_ERROR_BYTES {
            diags.error(
                &top,
                Pos::UNKNOWN,
                format!(
                    "descriptor is {} bytes, over the 512 KiB budget an image annotation allows",
                    raw.len()
                ),
            );
        } else if raw.len() > BUDGET_WARNING_BYTES {
            diags.warning(
                &top,
                Pos::UNKNOWN,
                format!(
                    "descriptor is {} bytes, over the 64 KiB the budget recommends",
                    raw.len()
                ),
            );
        }
    }
    let mut cx = Cx::new(diags);
    let mut reader = Reader {
        opts,
        args: Vec::new(),
    };
    let d = reader.descriptor(&mut cx, root)?;
    reader.check_references(&mut cx, root, raw, &d);
    Some(d)
}

struct Reader<'o> {
    opts: &'o Options,
    args: Vec<ArgDecl>,
}

impl Reader<'_> {
    fn profile(&self) -> Profile {
        self.opts.profile
    }

    /// Declarations mode skips the checks that depend on selection. A published descriptor
    /// is always judged in it (spec §1.11 `ValidatePublished`).
    fn declarations_only(&self) -> bool {
        self.opts.declarations_only || self.opts.profile == Profile::Published
    }

    fn descriptor(&mut self, cx: &mut Cx<'_>, root: &Node) -> Option<Descriptor> {
        let top = Path::root();
        let mut f = cx.fields(root, &top)?;

        let schema_version = f.require(cx, "schemaVersion").and_then(|n| {
            let p = top.key("schemaVersion");
            match &n.value {
                Value::Str(s) if s == "3" => Some(s.clone()),
                Value::Str(s) => {
                    cx.error(
                        &p,
                        n.pos,
                        format!("unsupported schemaVersion `{s}`; this reader reads \"3\""),
                    );
                    None
                }
                Value::Int(i) => {
                    cx.error(
                        &p,
                        n.pos,
                        format!(
                            "schemaVersion must be the string \"3\"; `{i}` is a number (quote it)"
                        ),
                    );
                    None
                }
                _ => {
                    cx.string(n, &p);
                    None
                }
            }
        });
        let kind = self.kind(cx, &mut f);
        let display_name = f.string(cx, "displayName").map(str::to_owned);
        let author = f.string(cx, "author").map(str::to_owned);
        let description = f.string(cx, "description").map(str::to_owned);
        let source_url = f.string(cx, "sourceUrl").map(str::to_owned);
        let icon_url = f
            .take("iconUrl")
            .and_then(|n| self.icon_url(cx, n, &top.key("iconUrl")));
        let version_node = f.take("version");
        let version =
            version_node.and_then(|n| cx.string(n, &top.key("version")).map(str::to_owned));
        let licenses = self.strings(cx, &mut f, "licenses");
        // Args first: other checks need to know which args exist and their phases.
        self.args = f
            .take("args")
            .map(|n| self.arg_decls(cx, n, &top.key("args")))
            .unwrap_or_default();
        let provides = self.strings(cx, &mut f, "provides");
        let requires = self.strings(cx, &mut f, "requires");
        let integrates = self.strings(cx, &mut f, "integrates");
        let conflicts = self.strings(cx, &mut f, "conflicts");
        let build = f.string(cx, "build").map(str::to_owned);
        let dockerfile_node = f.take("dockerfile");
        let dockerfile =
            dockerfile_node.and_then(|n| cx.string(n, &top.key("dockerfile")).map(str::to_owned));
        let kits_node = f.take("kits");
        let kits = kits_node.and_then(|n| self.kits(cx, n, &top.key("kits")));
        let capabilities = f
            .take("capabilities")
            .map(|n| self.items(cx, n, &top.key("capabilities"), kind))
            .unwrap_or_default();
        f.finish(cx);

        if let (Some(v), Some(n)) = (&version, version_node) {
            self.check_version_field(cx, v, n);
        }
        self.check_relations(cx, root, &provides, &requires, &integrates, &conflicts);
        self.check_recipe(
            cx,
            root,
            kind,
            build.as_deref(),
            dockerfile.as_deref(),
            dockerfile_node,
            kits_node,
        );
        if let Some(kind) = kind {
            self.check_blocks(cx, &capabilities, kind);
        }
        if self.profile() == Profile::Published {
            self.check_published(
                cx,
                root,
                kind,
                version.as_deref(),
                &provides,
                kits.as_deref(),
                &capabilities,
            );
        }

        Some(Descriptor {
            schema_version: schema_version?,
            display_name,
            author,
            description,
            source_url,
            icon_url,
            licenses,
            kind: kind?,
            version,
            args: self.args.clone(),
            provides,
            requires,
            integrates,
            conflicts,
            build,
            dockerfile,
            kits,
            capabilities,
        })
    }

    fn kind(&self, cx: &mut Cx<'_>, f: &mut Fields<'_>) -> Option<Kind> {
        let n = f.require(cx, "kind")?;
        let p = Path::root().key("kind");
        match cx.string(n, &p)? {
            "workload" => Some(Kind::Workload),
            "mixin" => Some(Kind::Mixin),
            "set" => Some(Kind::Set),
            "sandbox" if self.profile() == Profile::Published => {
                cx.warning(
                    &p,
                    n.pos,
                    "kind `sandbox` is the old spelling of `workload`; read as `workload`",
                );
                Some(Kind::Workload)
            }
            "sandbox" => {
                cx.error(
                    &p,
                    n.pos,
                    "kind `sandbox` is the old spelling of `workload`; write `workload`",
                );
                None
            }
            other => {
                cx.error(
                    &p,
                    n.pos,
                    format!("kind `{other}` is not workload, mixin or set"),
                );
                None
            }
        }
    }

    fn icon_url(&self, cx: &mut Cx<'_>, n: &Node, p: &Path) -> Option<String> {
        let s = cx.string(n, p)?;
        if !s.is_empty() {
            // The authority as written must name a host: the URL parser would turn
            // `https:///x` or `https:x` into `https://x/`.
            let authority = s
                .strip_prefix("https://")
                .map(|rest| rest.split(['/', '?', '#']).next().unwrap_or_default())
                .map(|a| a.rsplit('@').next().unwrap_or_default());
            let ok = authority.is_some_and(|a| !a.is_empty() && !a.starts_with(':'))
                && url::Url::parse(s).ok().is_some_and(|u| {
                    u.scheme() == "https" && u.host_str().is_some_and(|h| !h.is_empty())
                });
            if !ok {
                cx.error(
                    p,
                    n.pos,
                    format!("iconUrl `{s}` must be an absolute https URL"),
                );
            }
        }
        Some(s.to_owned())
    }

    fn strings(&self, cx: &mut Cx<'_>, f: &mut Fields<'_>, key: &str) -> Vec<String> {
        f.string_list(cx, key)
            .map(|items| items.into_iter().map(|(_, s, _)| s.to_owned()).collect())
            .unwrap_or_default()
    }

    // -- args (§1.8) ------------------------------------------------------------------

    fn arg_decls(&self, cx: &mut Cx<'_>, node: &Node, path: &Path) -> Vec<ArgDecl> {
        let Some(entries) = node.as_map() else {
            cx.error(
                path,
                node.pos,
                format!(
                    "args must be a mapping of arg names to declarations, found {}",
                    node.kind_name()
                ),
            );
            return Vec::new();
        };
        if entries.len() > crate::args::MAX_ARGS {
            cx.error(
                path,
                node.pos,
                format!(
                    "{} args are declared; a kit declares at most {}",
                    entries.len(),
                    crate::args::MAX_ARGS
                ),
            );
            return Vec::new();
        }
        let mut out = Vec::new();
        for (key, decl) in entries {
            let p = path.key(&key.text);
            if !refs::is_identifier(&key.text) {
                cx.error(
                    &p,
                    key.pos,
                    format!("arg name `{}` must match [A-Za-z_][A-Za-z0-9_]*", key.text),
                );
            }
            let Some(mut f) = cx.fields(decl, &p) else {
                continue;
            };
            let default = f.string(cx, "default").map(str::to_owned);
            let required = f.boolean(cx, "required").unwrap_or(false);
            let description = f.string(cx, "description").map(str::to_owned);
            let allowed = f.take("enum").and_then(|n| {
                cx.string_list(n, &p.key("enum")).map(|v| {
                    v.into_iter()
                        .map(|(_, s, _)| s.to_owned())
                        .collect::<Vec<_>>()
                })
            });
            let pattern_node = f.take("pattern");
            let pattern =
                pattern_node.and_then(|n| cx.string(n, &p.key("pattern")).map(str::to_owned));
            let env = f.string(cx, "env").map(str::to_owned);
            let build_arg = f.string(cx, "buildArg").map(str::to_owned);
            f.finish(cx);
            if default.is_some() && required {
                cx.error(&p, decl.pos, "`default` and `required` are mutually exclusive: a required arg has no default");
            }
            if allowed.is_some() && pattern.is_some() {
                cx.error(&p, decl.pos, "`enum` and `pattern` are mutually exclusive");
            }
            if env.is_some() && build_arg.is_some() {
                cx.error(&p, decl.pos, "`env` and `buildArg` are mutually exclusive: an arg is build-phase or create-phase");
            }
            for (k, v) in [("env", &env), ("buildArg", &build_arg)] {
                if let Some(v) = v
                    && !refs::is_identifier(v)
                {
                    cx.error(
                        &p.key(k),
                        decl.get(k).map_or(decl.pos, |n| n.pos),
                        format!("{k} `{v}` is not a variable name"),
                    );
                }
            }
            let compiled = match (&pattern, pattern_node) {
                (Some(pat), Some(n)) => match crate::args::compile_pattern(pat) {
                    Ok(re) => Some(re),
                    Err(e) => {
                        let first = e
                            .to_string()
                            .lines()
                            .last()
                            .unwrap_or_default()
                            .trim()
                            .to_owned();
                        cx.error(
                            &p.key("pattern"),
                            n.pos,
                            format!("pattern `{pat}` does not compile: {first}"),
                        );
                        None
                    }
                },
                _ => None,
            };
            if let Some(d) = &default {
                if let Some(allowed) = &allowed
                    && !allowed.contains(d)
                {
                    cx.error(
                        &p.key("default"),
                        decl.get("default").map_or(decl.pos, |n| n.pos),
                        format!("default `{d}` is not one of the enum values"),
                    );
                }
                if let Some(re) = &compiled
                    && !re.is_match(d)
                {
                    cx.error(
                        &p.key("default"),
                        decl.get("default").map_or(decl.pos, |n| n.pos),
                        format!("default `{d}` does not match the pattern"),
                    );
                }
            }
            out.push(ArgDecl {
                name: key.text.clone(),
                default,
                required,
                description,
                allowed,
                pattern,
                env,
                build_arg,
            });
        }
        out
    }

    fn arg_phase(&self, name: &str) -> Option<bool> {
        self.args
            .iter()
            .find(|a| a.name == name)
            .map(ArgDecl::is_build_phase)
    }

    // -- relations (§1.5, §1.6) --------------------------------------------------------

    fn check_version_field(&self, cx: &mut Cx<'_>, v: &str, n: &Node) {
        let p = Path::root().key("version");
        let found = refs::find(v);
        if found.is_empty() {
            if !names::is_version(v.trim()) {
                cx.error(
                    &p,
                    n.pos,
                    format!("version `{v}` is not a version such as `1.2.3` (no `v` prefix)"),
                );
            }
            return;
        }
        if self.profile() != Profile::Authored {
            cx.error(&p, n.pos, "version must be literal once published");
            return;
        }
        for r in found {
            if r.kind == RefKind::Arg && self.arg_phase(r.name) == Some(false) {
                cx.error(&p, n.pos, format!("version references create-phase arg `{}`; only a build-phase arg (with `buildArg`) may set it", r.name));
            }
        }
    }

    fn check_relations(
        &self,
        cx: &mut Cx<'_>,
        root: &Node,
        provides: &[String],
        requires: &[String],
        integrates: &[String],
        conflicts: &[String],
    ) {
        let top = Path::root();
        let pos_of = |key: &str, i: usize| {
            root.get(key)
                .and_then(Node::as_seq)
                .and_then(|s| s.get(i))
                .map_or(Pos::UNKNOWN, |n| n.pos)
        };
        for (i, s) in provides.iter().enumerate() {
            let p = top.key("provides").index(i);
            let pos = pos_of("provides", i);
            if refs::has_any_ref(s) {
                // Expanded at publish: judge the literal name part now.
                let name = s.split('@').next().unwrap_or_default().trim();
                if !refs::has_any_ref(name)
                    && let Err(e) = names::CapabilityName::parse(name)
                {
                    cx.error(&p, pos, e.to_string());
                }
                continue;
            }
            match names::parse_provide(s) {
                Ok(prov) if prov.name.is_reserved() && self.profile() == Profile::Authored => {
                    cx.error(&p, pos, format!("provide `{s}` uses a reserved namespace: `deb/` and `apk/` provides are derived at publish, never written"));
                }
                Ok(_) => {}
                Err(e) => cx.error(&p, pos, e.to_string()),
            }
        }
        for (key, list) in [("requires", requires), ("integrates", integrates)] {
            for (i, s) in list.iter().enumerate() {
                let p = top.key(key).index(i);
                let pos = pos_of(key, i);
                if refs::has_any_ref(s) {
                    cx.error(&p, pos, format!("{key} entries may not reference args; write the name and constraints literally"));
                    continue;
                }
                if let Err(e) = names::parse_require(s) {
                    cx.error(&p, pos, e.to_string());
                }
            }
        }
        for (i, s) in conflicts.iter().enumerate() {
            let p = top.key("conflicts").index(i);
            let pos = pos_of("conflicts", i);
            if refs::has_any_ref(s) {
                cx.error(&p, pos, "conflicts entries may not reference args");
                continue;
            }
            if let Err(e) = names::parse_conflict(s) {
                cx.error(&p, pos, e.to_string());
            }
        }
    }

    // -- recipe and set members (§1.3, §1.4) ---------------------------------------------

    #[expect(
        clippy::too_many_arguments,
        reason = "one check over several top-level fields"
    )]
    fn check_recipe(
        &self,
        cx: &mut Cx<'_>,
        root: &Node,
        kind: Option<Kind>,
        build: Option<&str>,
        dockerfile: Option<&str>,
        dockerfile_node: Option<&Node>,
        kits_node: Option<&Node>,
    ) {
        let top = Path::root();
        if build.is_some() && dockerfile.is_some() {
            cx.error(
                &top.key("dockerfile"),
                dockerfile_node.map_or(Pos::UNKNOWN, |n| n.pos),
                "states both `build` and `dockerfile`; a kit has one recipe",
            );
        }
        if kits_node.is_some() && (build.is_some() || dockerfile.is_some()) {
            cx.error(
                &top.key("kits"),
                kits_node.map_or(Pos::UNKNOWN, |n| n.pos),
                "a set's content is the kits it lists: drop `build` and `dockerfile`",
            );
        }
        if let (Some(df), Some(n)) = (dockerfile, dockerfile_node) {
            let cleaned = caps::clean_path(df);
            if df.starts_with('/') {
                cx.error(
                    &top.key("dockerfile"),
                    n.pos,
                    format!(
                        "dockerfile `{df}` must be a path relative to the descriptor's directory"
                    ),
                );
            } else if cleaned == ".." || cleaned.starts_with("../") {
                cx.error(
                    &top.key("dockerfile"),
                    n.pos,
                    format!("dockerfile `{df}` leaves the descriptor's directory"),
                );
            }
        }
        let kits_pos = kits_node.map_or(root.pos, |n| n.pos);
        // Judge emptiness on the list as written: an entry with problems of its own still
        // counts as listed (and a value that is not a list was reported already).
        let listed = kits_node.map(|n| n.as_seq().map_or(1, <[Node]>::len));
        match (kind, listed) {
            (Some(Kind::Set), None) => cx.error(
                &top.key("kits"),
                root.pos,
                "a set lists no kits; `kits` is required",
            ),
            (Some(Kind::Set), Some(0)) => {
                cx.error(&top.key("kits"), kits_pos, "a set lists no kits")
            }
            (Some(_), Some(0)) => cx.error(
                &top.key("kits"),
                kits_pos,
                "kits is present but empty; omit it",
            ),
            _ => {}
        }
    }

    fn kits(&self, cx: &mut Cx<'_>, node: &Node, path: &Path) -> Option<Vec<KitEntry>> {
        let items = cx.list(node, path)?;
        let mut out = Vec::new();
        let mut seen: HashMap<String, usize> = HashMap::new();
        for (i, (p, n)) in items.into_iter().enumerate() {
            let Some(mut f) = cx.fields(n, &p) else {
                continue;
            };
            let reference = f.required_string(cx, "ref");
            let digest_node = f.take("digest");
            let digest = digest_node.and_then(|d| cx.string(d, &p.key("digest")));
            let args = f
                .take("args")
                .map(|a| self.kit_args(cx, a, &p.key("args")))
                .unwrap_or_default();
            f.finish(cx);
            let Some(reference) = reference else { continue };
            let ref_pos = n.get("ref").map_or(n.pos, |r| r.pos);
            let rp = p.key("ref");
            if let Some(first) = seen.get(reference) {
                cx.error(
                    &rp,
                    ref_pos,
                    format!("kit `{reference}` is already listed at kits[{first}]"),
                );
            } else {
                seen.insert(reference.to_owned(), i);
            }
            let parsed = self.check_kit_ref(cx, reference, &rp, ref_pos);
            if let (Some(d), Some(dn)) = (digest, digest_node) {
                if !reference::is_sha256_digest(d) {
                    cx.error(&p.key("digest"), dn.pos, format!("digest `{d}` is not a sha256 manifest digest (sha256: and 64 lowercase hex digits)"));
                } else if let Some(pinned) = parsed.and_then(|r| r.1)
                    && pinned != d
                {
                    cx.error(
                        &p.key("digest"),
                        dn.pos,
                        format!("ref pins `{pinned}` but digest says `{d}`: one kit has one pin"),
                    );
                }
            }
            out.push(KitEntry {
                reference: reference.to_owned(),
                digest: digest.map(str::to_owned),
                args,
            });
        }
        Some(out)
    }

    /// Judges a set member reference; returns whether it parsed and the digest it pins.
    fn check_kit_ref(
        &self,
        cx: &mut Cx<'_>,
        r: &str,
        p: &Path,
        pos: Pos,
    ) -> Option<(bool, Option<String>)> {
        if r.trim().is_empty() {
            cx.error(p, pos, "ref is blank");
            return None;
        }
        let mut outside_refs = r.to_owned();
        for found in refs::find(r).iter().rev() {
            outside_refs.replace_range(found.start..found.end, "");
        }
        if r != r.trim() || outside_refs.chars().any(char::is_whitespace) {
            cx.error(p, pos, format!("ref `{r}` contains whitespace"));
            return None;
        }
        if r.starts_with("git+") {
            cx.error(
                p,
                pos,
                format!("ref `{r}` is a git reference; a set lists published image references"),
            );
            return None;
        }
        if r.starts_with('.') || r.starts_with('/') {
            cx.error(
                p,
                pos,
                format!("ref `{r}` is a local path; a set lists published image references"),
            );
            return None;
        }
        // Build-phase references expand at publish: judge the reference with their defaults.
        let mut expanded = String::new();
        let mut last = 0;
        for found in refs::find(r) {
            expanded.push_str(&r[last..found.start]);
            last = found.end;
            match (found.kind, self.arg_phase(found.name)) {
                (RefKind::Arg, Some(true)) => {
                    let default = self
                        .args
                        .iter()
                        .find(|a| a.name == found.name)
                        .and_then(|a| a.default.clone());
                    expanded.push_str(&default.unwrap_or_else(|| "registry.invalid".to_owned()));
                }
                (RefKind::Arg, Some(false)) => {
                    cx.error(p, pos, format!("ref references create-phase arg `{}`, which resolves at create; a set's members are fixed at publish", found.name));
                    return None;
                }
                (RefKind::Arg, None) => return None, // reported by the reference scan
                (RefKind::Env, _) => {
                    cx.error(p, pos, "ref may not reference kit.env");
                    return None;
                }
            }
        }
        expanded.push_str(&r[last..]);
        match reference::parse_image_ref(&expanded) {
            Some(img) => Some((true, img.digest.map(str::to_owned))),
            None => {
                cx.error(p, pos, format!("ref `{r}` is not an image reference (lowercase `registry/name:tag`, no URL scheme)"));
                None
            }
        }
    }

    fn kit_args(&self, cx: &mut Cx<'_>, node: &Node, path: &Path) -> Vec<(String, String)> {
        let Some(entries) = node.as_map() else {
            cx.error(
                path,
                node.pos,
                format!("expected a mapping, found {}", node.kind_name()),
            );
            return Vec::new();
        };
        let mut out = Vec::new();
        for (k, v) in entries {
            let p = path.key(&k.text);
            if !refs::is_identifier(&k.text) {
                cx.error(
                    &p,
                    k.pos,
                    format!("arg name `{}` must match [A-Za-z_][A-Za-z0-9_]*", k.text),
                );
            }
            let Some(s) = cx.string(v, &p) else { continue };
            if refs::has_any_ref(s) && refs::whole_arg_ref(s).is_none() {
                cx.error(&p, v.pos, format!("value `{s}` embeds a reference in a larger value; pass a literal or exactly one `${{{{ kit.args.NAME }}}}`"));
            }
            out.push((k.text.clone(), s.to_owned()));
        }
        out
    }

    // -- capabilities (§1.7, §1.10, §2) ----------------------------------------------------

    fn items(&self, cx: &mut Cx<'_>, node: &Node, path: &Path, kind: Option<Kind>) -> Vec<Item> {
        let Some(list) = cx.list(node, path) else {
            return Vec::new();
        };
        let mut out = Vec::new();
        for (p, n) in list {
            if n.get("group").is_some() {
                if let Some(g) = self.group(cx, n, &p, kind) {
                    out.push(Item::Group(g));
                }
            } else if let Some(e) = self.entry(cx, n, &p, kind, false) {
                out.push(Item::Entry(e));
            }
        }
        out
    }

    fn group(&self, cx: &mut Cx<'_>, n: &Node, p: &Path, kind: Option<Kind>) -> Option<Group> {
        let mut item = cx.fields(n, p)?;
        for key in ["type", "name", "description", "optional", "config"] {
            if let Some(k) = item.keys().find(|k| k.text == key) {
                cx.error(&p.key(key), k.pos, format!("an item with `group` states only `group` and `source`; move `{key}` into the group or drop it"));
                item.take(key);
            }
        }
        let group_node = item.take("group")?;
        let source = item
            .take("source")
            .and_then(|s| self.source(cx, s, &p.key("source")));
        item.finish(cx);
        let gp = p.key("group");
        if group_node.is_null() {
            cx.error(
                &gp,
                group_node.pos,
                "group is null; a group lists its capabilities",
            );
            return None;
        }
        let mut f = cx.fields(group_node, &gp)?;
        let name = f.string(cx, "name").map(str::to_owned);
        let description = f.string(cx, "description").map(str::to_owned);
        let optional = f.boolean(cx, "optional").unwrap_or(false);
        let members = f.take("capabilities");
        f.finish(cx);
        let mut capabilities = Vec::new();
        match members {
            None => cx.error(&gp, group_node.pos, "group lists no capabilities"),
            Some(m) => {
                if let Some(list) = cx.list(m, &gp.key("capabilities")) {
                    if list.is_empty() {
                        cx.error(
                            &gp.key("capabilities"),
                            m.pos,
                            "group lists no capabilities",
                        );
                    }
                    for (mp, mn) in list {
                        if mn.get("group").is_some() {
                            cx.error(&mp.key("group"), mn.pos, "groups do not nest");
                            continue;
                        }
                        if let Some(e) = self.entry(cx, mn, &mp, kind, true) {
                            capabilities.push(e);
                        }
                    }
                }
            }
        }
        Some(Group {
            name,
            description,
            optional,
            capabilities,
            source,
        })
    }

    fn source(&self, cx: &mut Cx<'_>, n: &Node, p: &Path) -> Option<SourceRef> {
        let mut f = cx.fields(n, p)?;
        let kit = f.string(cx, "kit").map(str::to_owned);
        let path = f.required_string(cx, "path");
        f.finish(cx);
        let path = path?;
        if path.is_empty() {
            cx.error(
                &p.key("path"),
                n.get("path").map_or(n.pos, |x| x.pos),
                "source path is empty",
            );
        }
        Some(SourceRef {
            kit,
            path: path.to_owned(),
        })
    }

    fn entry(
        &self,
        cx: &mut Cx<'_>,
        n: &Node,
        p: &Path,
        kind: Option<Kind>,
        member: bool,
    ) -> Option<Entry> {
        let mut f = cx.fields(n, p)?;
        let type_node = f.require(cx, "type");
        let type_name = type_node.and_then(|t| cx.string(t, &p.key("type")));
        let name = f
            .string(cx, "name")
            .filter(|s| !s.is_empty())
            .map(str::to_owned);
        let optional_node = f.take("optional");
        let optional = optional_node
            .and_then(|o| cx.boolean(o, &p.key("optional")))
            .unwrap_or(false);
        let description = f.string(cx, "description").map(str::to_owned);
        let config = f.take("config").cloned();
        let source = f
            .take("source")
            .and_then(|s| self.source(cx, s, &p.key("source")));
        f.finish(cx);
        if member && let Some(o) = optional_node {
            cx.error(
                &p.key("optional"),
                o.pos,
                "a group member does not state `optional`; the group's `optional` decides",
            );
        }
        let type_name = type_name?;
        let type_pos = type_node.map_or(n.pos, |t| t.pos);
        if !caps::is_valid_type(type_name) {
            cx.error(&p.key("type"), type_pos, format!("type `{type_name}` is not a capability type (`namespace/name@version`, e.g. `com.docker.sandbox/network-policy@2`)"));
            return None;
        }
        let known = KnownType::parse(type_name);
        let config_path = p.key("config");
        let parameterized = config
            .as_ref()
            .is_some_and(|c| self.check_config_references(cx, c, &config_path));
        let mut capability = None;
        if let Some(t) = known {
            if t.is_workload_only() && kind == Some(Kind::Mixin) {
                cx.error(
                    &p.key("type"),
                    type_pos,
                    format!("`{type_name}` is workload-only; a mixin cannot declare it"),
                );
            }
            if t.is_config_less() {
                if let Some(c) = &config {
                    cx.error(
                        &config_path,
                        c.pos,
                        format!("`{type_name}` takes no config; remove `config`"),
                    );
                }
                capability = caps::decode(cx, t, None, &config_path);
            } else {
                let lenient = parameterized && self.profile() != Profile::Effective;
                cx.lenient = lenient;
                let decoded = caps::decode(cx, t, config.as_ref(), &config_path);
                cx.lenient = false;
                if !parameterized {
                    capability = decoded;
                }
            }
        }
        Some(Entry {
            type_name: type_name.to_owned(),
            known,
            name,
            optional,
            description,
            config,
            source,
            parameterized,
            capability,
            type_pos: crate::descriptor::Place(type_pos),
        })
    }

    /// Judges references inside a config and says whether it is parameterized (spec §1.7:
    /// an arg reference anywhere, or an env reference in a string value).
    fn check_config_references(&self, cx: &mut Cx<'_>, config: &Node, path: &Path) -> bool {
        let mut parameterized = false;
        let mut problems: Vec<(Pos, String)> = Vec::new();
        config.for_each_key(&mut |k| {
            if refs::has_env_ref(&k.text) || refs::has_malformed_env_opener(&k.text) {
                problems.push((
                    k.pos,
                    format!(
                        "config key `{}` references kit.env; only values may",
                        k.text
                    ),
                ));
            }
            if refs::has_arg_ref(&k.text) {
                parameterized = true;
            }
        });
        config.for_each_str(&mut |s| {
            if refs::has_any_ref(s) {
                parameterized = true;
            }
            if refs::has_malformed_env_opener(s) {
                problems.push((config.pos, format!("`{s}` opens a `${{{{ kit.env` reference that is not `${{{{ kit.env.NAME }}}}`")));
            }
        });
        for (pos, m) in problems {
            cx.error(path, pos, m);
        }
        parameterized
    }

    /// Arity, duplicates and cross-entry rules, per declaration block (spec §1.10): the
    /// ordinary entries form one block, each group's members another.
    fn check_blocks(&self, cx: &mut Cx<'_>, items: &[Item], kind: Kind) {
        let mut ordinary: Vec<(Path, &Entry)> = Vec::new();
        let mut groups: Vec<Vec<(Path, &Entry)>> = Vec::new();
        let caps_path = Path::root().key("capabilities");
        for (i, item) in items.iter().enumerate() {
            match item {
                Item::Entry(e) => ordinary.push((caps_path.index(i), e)),
                Item::Group(g) => groups.push(
                    g.capabilities
                        .iter()
                        .enumerate()
                        .map(|(j, e)| {
                            (
                                caps_path.index(i).key("group").key("capabilities").index(j),
                                e,
                            )
                        })
                        .collect(),
                ),
            }
        }
        self.check_block(cx, &ordinary, None, kind);
        for g in &groups {
            self.check_block(cx, g, Some(&ordinary), kind);
        }
    }

    fn check_block(
        &self,
        cx: &mut Cx<'_>,
        block: &[(Path, &Entry)],
        outer: Option<&[(Path, &Entry)]>,
        kind: Kind,
    ) {
        let mut exact: HashMap<String, &Path> = HashMap::new();
        let mut singles: HashMap<KnownType, &Path> = HashMap::new();
        let mut keys: HashMap<String, &Path> = HashMap::new();
        let mut network: Option<(&Path, KnownType)> = None;
        for (p, e) in block {
            // At the config; an entry without one, at its `type`.
            let pos = e.config.as_ref().map_or(e.type_pos.0, |c| c.pos);
            let empty = Node::detached(Value::Map(Vec::new()));
            let config = match &e.config {
                Some(c) if !c.is_null() => c,
                _ => &empty,
            };
            let canonical = format!(
                "{}\u{0}{}",
                e.type_name,
                crate::canonical::to_string(config).unwrap_or_default()
            );
            let singleton = e.known.is_some_and(KnownType::is_singleton);
            if singleton {
                if let Some(t) = e.known {
                    if let Some(first) = singles.get(&t) {
                        cx.error(
                            p,
                            pos,
                            format!("`{}` already declared at {first}", e.type_name),
                        );
                        continue;
                    }
                    singles.insert(t, p);
                }
            } else if let Some(first) = exact.get(&canonical) {
                cx.error(p, pos, format!("this entry is identical to {first}"));
                continue;
            }
            exact.insert(canonical, p);
            if let Some(t @ (KnownType::NetworkPolicyV1 | KnownType::NetworkPolicyV2)) = e.known {
                match network {
                    Some((first, other)) if other != t => {
                        cx.error(p, pos, format!("a descriptor states one network-policy version; {first} already states the other"));
                    }
                    _ => network = Some((p, t)),
                }
            }
            if let Some(t) = e.known {
                for BlockKey { key, what } in caps::block_keys(t, e.config.as_ref()) {
                    if let Some(first) = keys.get(&key) {
                        cx.error(p, pos, format!("{what} already declared at {first}"));
                    } else {
                        keys.insert(key, p);
                    }
                }
            }
        }
        self.check_cross_entry(cx, block, outer, kind);
    }

    fn check_cross_entry(
        &self,
        cx: &mut Cx<'_>,
        block: &[(Path, &Entry)],
        outer: Option<&[(Path, &Entry)]>,
        kind: Kind,
    ) {
        let here = typed(block);
        let around = outer.map(typed).unwrap_or_default();
        let find = |pred: &dyn Fn(&Capability) -> bool| {
            here.iter()
                .chain(around.iter())
                .find(|(_, _, c)| pred(c))
                .map(|(p, e, c)| (p.clone(), *e, *c))
        };
        let policy_entry = find(&|c| matches!(c, Capability::NetworkPolicy(_)));
        let policy_parameterized = block.iter().chain(outer.unwrap_or_default()).any(|(_, e)| {
            e.parameterized
                && matches!(
                    e.known,
                    Some(KnownType::NetworkPolicyV1 | KnownType::NetworkPolicyV2)
                )
        });
        let policy = match policy_entry {
            Some((_, _, Capability::NetworkPolicy(np))) => Some(np),
            _ => None,
        };
        let egress: Vec<&str> = here
            .iter()
            .chain(around.iter())
            .filter_map(|(_, _, c)| match c {
                Capability::Egress(e) => Some(e.host.as_str()),
                _ => None,
            })
            .collect();
        for (p, e, c) in &here {
            match c {
                Capability::Credential(cred)
                    if !self.declarations_only() && !policy_parameterized =>
                {
                    if let Some(config) = &e.config {
                        caps::credential::check_inject_within_allow(
                            cx,
                            cred,
                            config,
                            &p.key("config"),
                            (policy, &egress),
                        );
                    }
                }
                Capability::AgentContext(ctx)
                    if kind == Kind::Mixin && !ctx.is_explicit() && ctx.filename.is_some() =>
                {
                    cx.error(
                        &p.key("config").key("filename"),
                        e.config.as_ref().and_then(|c| c.get("filename")).map_or(Pos::UNKNOWN, |n| n.pos),
                        "a profile `filename` without `directory` is workload-kit-only; a mixin names the `directory` too",
                    );
                }
                _ => {}
            }
        }
        let pick = |pred: &dyn Fn(&Capability) -> bool| here.iter().find(|(_, _, c)| pred(c));
        let lifecycle =
            pick(&|c| matches!(c, Capability::Lifecycle(_))).and_then(|(p, _, c)| match c {
                Capability::Lifecycle(l) => Some((p.key("config"), l)),
                _ => None,
            });
        let sessions =
            pick(&|c| matches!(c, Capability::AgentSessions(_))).and_then(|(p, _, c)| match c {
                Capability::AgentSessions(s) => Some((p.key("config"), s)),
                _ => None,
            });
        let interactive = pick(&|c| matches!(c, Capability::AgentInteractiveSessions(_))).and_then(
            |(p, _, c)| match c {
                Capability::AgentInteractiveSessions(s) => Some((p.key("config"), s)),
                _ => None,
            },
        );
        caps::agent::check_session_agreement(
            cx,
            lifecycle.as_ref().map(|(p, l)| (p, *l)),
            sessions.as_ref().map(|(p, s)| (p, *s)),
            interactive.as_ref().map(|(p, s)| (p, *s)),
        );
    }

    // -- published form (§1.11 ValidatePublished) -----------------------------------------

    #[expect(
        clippy::too_many_arguments,
        reason = "one check over several top-level fields"
    )]
    fn check_published(
        &self,
        cx: &mut Cx<'_>,
        root: &Node,
        kind: Option<Kind>,
        version: Option<&str>,
        provides: &[String],
        kits: Option<&[KitEntry]>,
        capabilities: &[Item],
    ) {
        let top = Path::root();
        for (i, item) in capabilities.iter().enumerate() {
            let at = top.key("capabilities").index(i);
            let members: Vec<(Path, &Entry)> = match item {
                Item::Entry(e) => vec![(at, e)],
                Item::Group(g) => g
                    .capabilities
                    .iter()
                    .enumerate()
                    .map(|(j, e)| (at.key("group").key("capabilities").index(j), e))
                    .collect(),
            };
            for (p, e) in members {
                let path = e.config.as_ref().and_then(|c| c.get("path"));
                if let (Some(KnownType::AgentSkill), Some(n)) = (e.known, path)
                    && n.as_str().is_some_and(refs::has_any_ref)
                {
                    cx.error(
                        &p.key("config").key("path"),
                        n.pos,
                        "a published agent-skill path must be literal: it names content in the image",
                    );
                }
            }
        }
        if kind == Some(Kind::Set) {
            cx.error(
                &top.key("kind"),
                root.get("kind").map_or(root.pos, |n| n.pos),
                "a published descriptor is never `kind: set`; sets are merged at publish",
            );
        }
        for (i, s) in provides.iter().enumerate() {
            if refs::has_any_ref(s) {
                cx.error(
                    &top.key("provides").index(i),
                    Pos::UNKNOWN,
                    "published provides must be literal: expansion did not run",
                );
            }
        }
        if version.is_none_or(str::is_empty) {
            for (i, s) in provides.iter().enumerate() {
                if !s.contains('@') {
                    cx.error(
                        &top.key("provides").index(i),
                        Pos::UNKNOWN,
                        format!("provide `{s}` has no version and the kit states no `version`"),
                    );
                }
            }
        }
        for (i, k) in kits.unwrap_or_default().iter().enumerate() {
            if k.digest.is_none() {
                cx.error(
                    &top.key("kits").index(i),
                    Pos::UNKNOWN,
                    format!(
                        "kit `{}` is listed with no digest; a published set pins every member",
                        k.reference
                    ),
                );
            }
            if refs::has_any_ref(&k.reference) {
                cx.error(
                    &top.key("kits").index(i).key("ref"),
                    Pos::UNKNOWN,
                    "published descriptor still references an arg",
                );
            }
        }
        let mut build_refs = Vec::new();
        collect_strings(root, &top, &mut |p, pos, s| {
            for r in refs::find(s) {
                if r.kind == RefKind::Arg && self.arg_phase(r.name) == Some(true) {
                    build_refs.push((p.clone(), pos, r.name.to_owned()));
                }
            }
        });
        for (p, pos, name) in build_refs {
            cx.error(&p, pos, format!("published descriptor still references build-phase arg `{name}`: expansion did not run"));
        }
    }

    // -- references (§1.8, §1.9, §1.11) ----------------------------------------------------

    fn check_references(&self, cx: &mut Cx<'_>, root: &Node, raw: Option<&[u8]>, d: &Descriptor) {
        let top = Path::root();
        let declared = |name: &str| self.args.iter().any(|a| a.name == name);
        let mut found: Vec<(Path, Pos, RefKind, String)> = Vec::new();
        collect_strings(root, &top, &mut |p, pos, s| {
            for r in refs::find(s) {
                found.push((p.clone(), pos, r.kind, r.name.to_owned()));
            }
        });
        let mut reported: Vec<String> = Vec::new();
        for (p, pos, kind, name) in &found {
            match kind {
                RefKind::Arg if !declared(name) => {
                    cx.error(
                        p,
                        *pos,
                        format!("references arg `{name}`, but the kit declares no arg \"{name}\""),
                    );
                    reported.push(name.clone());
                }
                RefKind::Arg if self.profile() == Profile::Effective => {
                    cx.error(
                        p,
                        *pos,
                        format!("effective descriptor still references kit args (`{name}`)"),
                    );
                }
                RefKind::Env if self.profile() == Profile::Effective => {
                    cx.error(
                        p,
                        *pos,
                        format!("effective descriptor still references kit.env (`{name}`)"),
                    );
                }
                RefKind::Env if !is_config_path(p) => {
                    cx.error(p, *pos, "`${{ kit.env.* }}` references are allowed only in capability config values");
                }
                _ => {}
            }
        }
        // Parity with the reference validator, which scans the raw bytes: a reference in a
        // YAML comment must name a declared arg too.
        if let Some(raw) = raw {
            let text = String::from_utf8_lossy(raw);
            let in_tree = |name: &str| {
                found
                    .iter()
                    .any(|(_, _, k, n)| *k == RefKind::Arg && n == name)
            };
            for r in refs::find(&text) {
                let effective_leftover = self.profile() == Profile::Effective && !in_tree(r.name);
                if r.kind == RefKind::Arg
                    && (!declared(r.name) || effective_leftover)
                    && !reported.iter().any(|n| n == r.name)
                {
                    let before = &text[..r.start];
                    let line = before.matches('\n').count() + 1;
                    let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
                    let pos = Pos {
                        line: u32::try_from(line).unwrap_or(u32::MAX),
                        column: u32::try_from(column).unwrap_or(u32::MAX),
                    };
                    let message = if declared(r.name) {
                        format!(
                            "effective descriptor still references kit args (`{}`, in a comment)",
                            r.name
                        )
                    } else {
                        format!(
                            "references arg `{}` (in a comment), but the kit declares no arg \"{}\"",
                            r.name, r.name
                        )
                    };
                    cx.error(&top, pos, message);
                    reported.push(r.name.to_owned());
                }
            }
        }
        if self.profile() == Profile::Effective && !self.declarations_only() {
            for (i, item) in d.capabilities.iter().enumerate() {
                if matches!(item, Item::Group(_)) {
                    cx.error(&top.key("capabilities").index(i), Pos::UNKNOWN, "effective descriptor still holds a group: select groups before composition");
                }
            }
        }
    }
}

/// The entries of a block that carry a typed capability.
fn typed<'a>(list: &[(Path, &'a Entry)]) -> Vec<(Path, &'a Entry, &'a Capability)> {
    list.iter()
        .filter_map(|(p, e)| e.capability.as_ref().map(|c| (p.clone(), *e, c)))
        .collect()
}

/// Whether a path lies inside some capability's `config`.
fn is_config_path(p: &Path) -> bool {
    let s = p.as_str();
    s.starts_with("capabilities[") && s.contains(".config")
}

/// Calls `f` on every string value and mapping key of the tree with its path.
fn collect_strings(root: &Node, top: &Path, f: &mut dyn FnMut(&Path, Pos, &str)) {
    let mut stack: Vec<(Path, &Node)> = vec![(top.clone(), root)];
    while let Some((p, n)) = stack.pop() {
        match &n.value {
            Value::Str(s) => f(&p, n.pos, s),
            Value::Seq(items) => {
                for (i, item) in items.iter().enumerate().rev() {
                    stack.push((p.index(i), item));
                }
            }
            Value::Map(entries) => {
                for (k, v) in entries.iter().rev() {
                    let kp = p.key(&k.text);
                    f(&kp, k.pos, &k.text);
                    stack.push((kp, v));
                }
            }
            _ => {}
        }
    }
}
