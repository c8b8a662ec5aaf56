//! Create-phase args: resolving supplied values against declarations, and expanding
//! `${{ kit.args.* }}` and `${{ kit.env.* }}` references into the effective descriptor
//! (spec §1.8, §1.9).

use std::collections::BTreeMap;

use thiserror::Error;

use crate::caps::KnownType;
use crate::descriptor::ArgDecl;
use crate::node::{Key, Node, Path, Value};
use crate::refs::{self, RefKind};

/// The most args one kit declares: each may carry a pattern, compiled at every read.
pub const MAX_ARGS: usize = 256;
/// The longest arg pattern, in bytes.
pub const MAX_PATTERN: usize = 512;

/// An arg's `pattern`, anchored at both ends. Bounded so that a kit cannot make reading it
/// slow: at most [`MAX_PATTERN`] bytes, and a compiled program of at most 256 KiB (which a
/// pattern such as `\w{150}`, each `\w` a large Unicode class, exceeds at once).
pub(crate) fn compile_pattern(pattern: &str) -> Result<regex::Regex, regex::Error> {
    if pattern.len() > MAX_PATTERN {
        return Err(regex::Error::Syntax(format!(
            "the pattern is longer than {MAX_PATTERN} bytes"
        )));
    }
    regex::RegexBuilder::new(&format!("^(?:{pattern})$"))
        .size_limit(256 * 1024)
        .dfa_size_limit(1024 * 1024)
        .build()
}

/// Why args could not be resolved or expanded. Paths are descriptor paths.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ArgError {
    #[error("no arg `{name}` is declared by this kit")]
    NotDeclared { name: String },
    #[error("arg `{name}` is required and no value was supplied")]
    Required { name: String },
    #[error("arg `{name}` is build-phase: its value was already baked at publish")]
    AlreadyBaked { name: String },
    #[error("value `{value}` for arg `{name}` is not one of {allowed:?}")]
    NotInEnum {
        name: String,
        value: String,
        allowed: Vec<String>,
    },
    #[error("value `{value}` for arg `{name}` does not match its pattern `{pattern}`")]
    PatternMismatch {
        name: String,
        value: String,
        pattern: String,
    },
    #[error("arg `{name}` has a pattern that does not compile")]
    BadPattern { name: String },
    #[error(
        "value for arg `{name}` must be literal: it may not contain `${{{{ kit.args` or `${{{{ kit.env`"
    )]
    NotLiteral { name: String },
    #[error("{path}: references arg `{name}`, which has no resolved value")]
    NoResolvedValue { path: String, name: String },
    #[error("{path}: expansion collapses two keys onto \"{key}\"")]
    KeyCollision { path: String, key: String },
    #[error("{path}: the value of arg `{name}` would introduce a `${{{{ kit.env` reference")]
    IntroducesEnvReference { path: String, name: String },
    #[error("{path}: references kit.env `{name}`, which the environment does not define")]
    UnknownEnv { path: String, name: String },
    #[error("{path}: the value of kit.env `{name}` holds a NUL or a reference")]
    BadEnvValue { path: String, name: String },
    #[error("{path}: a config key may not reference kit.env")]
    EnvInKey { path: String },
    #[error(
        "{path}: the args' values expand the descriptor by more than {MAX_SUBSTITUTED} bytes; a kit never needs that"
    )]
    ExpansionTooLarge { path: String },
}

impl ArgError {
    /// Where in the kit text (`root`, the loaded document) the declaration this error is
    /// about lies, for an error about one declared arg: the field that refused the value
    /// (`args.NAME.pattern`, `args.NAME.enum`) or the declaration itself. `None` for the
    /// others (they name their own path, or no declaration).
    pub fn declaration_at(&self, root: &Node) -> Option<(Path, crate::node::Pos)> {
        let (name, field) = match self {
            ArgError::NotInEnum { name, .. } => (name, Some("enum")),
            ArgError::PatternMismatch { name, .. } | ArgError::BadPattern { name } => {
                (name, Some("pattern"))
            }
            ArgError::Required { name }
            | ArgError::NotLiteral { name }
            | ArgError::AlreadyBaked { name } => (name, None),
            _ => return None,
        };
        let decl = root.get("args")?.get(name)?;
        let path = Path::root().key("args").key(name);
        Some(match field.and_then(|f| Some((f, decl.get(f)?))) {
            Some((f, node)) => (path.key(f), node.pos),
            None => (path, decl.pos),
        })
    }
}

/// The most bytes args' values may add to a descriptor by substitution (each reference
/// replaced by its value): a short kit cannot expand into gigabytes.
pub const MAX_SUBSTITUTED: usize = 2 * 1024 * 1024;

/// Resolves supplied create-arg values against a kit's declarations (`ResolveArgs`):
/// defaults applied, required args enforced, enums and patterns checked. Every problem is
/// returned.
pub fn resolve_args(
    decls: &[ArgDecl],
    supplied: &BTreeMap<String, String>,
) -> Result<BTreeMap<String, String>, Vec<ArgError>> {
    let mut errors = Vec::new();
    let mut out = BTreeMap::new();
    for name in supplied.keys() {
        match decls.iter().find(|d| &d.name == name) {
            None => errors.push(ArgError::NotDeclared { name: name.clone() }),
            Some(d) if d.is_build_phase() => {
                errors.push(ArgError::AlreadyBaked { name: name.clone() });
            }
            Some(_) => {}
        }
    }
    for d in decls.iter().filter(|d| !d.is_build_phase()) {
        let value = match (supplied.get(&d.name), &d.default) {
            (Some(v), _) => v.clone(),
            (None, Some(def)) => def.clone(),
            (None, None) if d.required => {
                errors.push(ArgError::Required {
                    name: d.name.clone(),
                });
                continue;
            }
            (None, None) => continue,
        };
        if refs::has_any_ref(&value) || value.contains("${{ kit.") {
            errors.push(ArgError::NotLiteral {
                name: d.name.clone(),
            });
            continue;
        }
        if let Some(allowed) = &d.allowed
            && !allowed.contains(&value)
        {
            errors.push(ArgError::NotInEnum {
                name: d.name.clone(),
                value,
                allowed: allowed.clone(),
            });
            continue;
        }
        if let Some(pattern) = &d.pattern {
            match compile_pattern(pattern) {
                Ok(re) if re.is_match(&value) => {}
                Ok(_) => {
                    errors.push(ArgError::PatternMismatch {
                        name: d.name.clone(),
                        value,
                        pattern: pattern.clone(),
                    });
                    continue;
                }
                Err(_) => {
                    errors.push(ArgError::BadPattern {
                        name: d.name.clone(),
                    });
                    continue;
                }
            }
        }
        out.insert(d.name.clone(), value);
    }
    if errors.is_empty() {
        Ok(out)
    } else {
        Err(errors)
    }
}

/// Expands create-phase arg references in every string value and mapping key
/// (`ExpandCreateArgs`). A string that is exactly one reference adopts the type its value
/// reads as (`true` → boolean, `8080` → integer, `1.5` → float), except `size` and `mode`
/// inside a volume@1 config, which stay text. Build-phase references are left alone.
pub fn expand_create_args(
    root: &Node,
    values: &BTreeMap<String, String>,
    build_phase: &[String],
) -> Result<Node, Vec<ArgError>> {
    let mut errors = Vec::new();
    let mut left = MAX_SUBSTITUTED;
    let out = expand_node(
        root,
        &Path::root(),
        values,
        build_phase,
        false,
        (&mut errors, &mut left),
    );
    if errors.is_empty() {
        Ok(out)
    } else {
        Err(errors)
    }
}

fn expand_node(
    n: &Node,
    path: &Path,
    values: &BTreeMap<String, String>,
    build_phase: &[String],
    in_volume: bool,
    (errors, left): (&mut Vec<ArgError>, &mut usize),
) -> Node {
    let value = match &n.value {
        Value::Str(s) => {
            let keep_text = in_volume && {
                let p = path.as_str();
                p.ends_with(".config.size") || p.ends_with(".config.mode")
            };
            expand_string(s, path, values, build_phase, !keep_text, (errors, left))
        }
        Value::Seq(items) => Value::Seq(
            items
                .iter()
                .enumerate()
                .map(|(i, item)| {
                    let p = path.index(i);
                    let vol = in_volume || is_volume_entry(item);
                    expand_node(
                        item,
                        &p,
                        values,
                        build_phase,
                        vol,
                        (&mut *errors, &mut *left),
                    )
                })
                .collect(),
        ),
        Value::Map(entries) => {
            let mut out: Vec<(Key, Node)> = Vec::with_capacity(entries.len());
            for (k, v) in entries {
                let key_text = match expand_string(
                    &k.text,
                    &path.key(&k.text),
                    values,
                    build_phase,
                    false,
                    (&mut *errors, &mut *left),
                ) {
                    Value::Str(s) => s,
                    _ => k.text.clone(),
                };
                if out.iter().any(|(existing, _)| existing.text == key_text) {
                    errors.push(ArgError::KeyCollision {
                        path: path.to_string(),
                        key: key_text.clone(),
                    });
                    continue;
                }
                let p = path.key(&key_text);
                let vol = in_volume || is_volume_entry(v);
                let child =
                    expand_node(v, &p, values, build_phase, vol, (&mut *errors, &mut *left));
                out.push((
                    Key {
                        text: key_text,
                        pos: k.pos,
                    },
                    child,
                ));
            }
            Value::Map(out)
        }
        other => other.clone(),
    };
    Node::new(value, n.pos)
}

fn is_volume_entry(n: &Node) -> bool {
    n.get("type").and_then(Node::as_str) == Some(KnownType::Volume.name())
}

fn expand_string(
    s: &str,
    path: &Path,
    values: &BTreeMap<String, String>,
    build_phase: &[String],
    typed: bool,
    (errors, left): (&mut Vec<ArgError>, &mut usize),
) -> Value {
    let found = refs::find(s);
    if found
        .iter()
        .all(|r| r.kind != RefKind::Arg || build_phase.iter().any(|b| b == r.name))
    {
        return Value::Str(s.to_owned());
    }
    let mut out = String::with_capacity(s.len());
    let mut last = 0;
    for r in &found {
        out.push_str(&s[last..r.start]);
        last = r.end;
        if r.kind != RefKind::Arg || build_phase.iter().any(|b| b == r.name) {
            out.push_str(&s[r.start..r.end]);
            continue;
        }
        match values.get(r.name) {
            Some(v) => {
                if v.len() > *left {
                    // Said once; nothing more is expanded (the kit is refused).
                    if !errors
                        .iter()
                        .any(|e| matches!(e, ArgError::ExpansionTooLarge { .. }))
                    {
                        errors.push(ArgError::ExpansionTooLarge {
                            path: path.to_string(),
                        });
                    }
                    *left = 0;
                    return Value::Str(String::new());
                }
                *left -= v.len();
                out.push_str(v);
            }
            None => {
                errors.push(ArgError::NoResolvedValue {
                    path: path.to_string(),
                    name: r.name.to_owned(),
                });
                out.push_str(&s[r.start..r.end]);
            }
        }
    }
    out.push_str(&s[last..]);
    let env_before = found.iter().filter(|r| r.kind == RefKind::Env).count();
    let env_after = refs::find(&out)
        .iter()
        .filter(|r| r.kind == RefKind::Env)
        .count();
    if env_after > env_before
        || (out.contains("${{") && out.matches("${{").count() > s.matches("${{").count())
    {
        let name = found
            .first()
            .map_or_else(String::new, |r| r.name.to_owned());
        errors.push(ArgError::IntroducesEnvReference {
            path: path.to_string(),
            name,
        });
    }
    if typed && refs::whole_arg_ref(s).is_some() {
        return typed_value(out);
    }
    Value::Str(out)
}

/// The type a whole-value reference adopts: a value that re-renders identically as a
/// boolean, an integer or a finite float becomes one; everything else stays text.
fn typed_value(v: String) -> Value {
    match v.as_str() {
        "true" => return Value::Bool(true),
        "false" => return Value::Bool(false),
        _ => {}
    }
    if let Ok(i) = v.parse::<i64>()
        && i.to_string() == v
    {
        return Value::Int(i);
    }
    let numeric_shape = v
        .bytes()
        .all(|b| b.is_ascii_digit() || b == b'.' || b == b'-');
    if numeric_shape
        && let Ok(f) = v.parse::<f64>()
        && f.is_finite()
        && f.to_string() == v
    {
        return Value::Float(f);
    }
    Value::Str(v)
}

/// Expands `${{ kit.env.NAME }}` in capability config string values (spec §1.9). Values stay
/// text even for a whole-value reference.
pub fn expand_env(root: &Node, env: &BTreeMap<String, String>) -> Result<Node, Vec<ArgError>> {
    let mut errors = Vec::new();
    let mut out = root.clone();
    if let Value::Map(entries) = &mut out.value {
        for (k, v) in entries.iter_mut() {
            if k.text != "capabilities" {
                continue;
            }
            let caps_path = Path::root().key("capabilities");
            if let Value::Seq(items) = &mut v.value {
                for (i, item) in items.iter_mut().enumerate() {
                    expand_item_env(item, &caps_path.index(i), env, &mut errors);
                }
            }
        }
    }
    if errors.is_empty() {
        Ok(out)
    } else {
        Err(errors)
    }
}

fn expand_item_env(
    item: &mut Node,
    path: &Path,
    env: &BTreeMap<String, String>,
    errors: &mut Vec<ArgError>,
) {
    let Value::Map(fields) = &mut item.value else {
        return;
    };
    for (k, v) in fields.iter_mut() {
        match k.text.as_str() {
            "config" => expand_config_env(v, &path.key("config"), env, errors),
            "group" => {
                let gp = path.key("group");
                if let Value::Map(gfields) = &mut v.value {
                    for (gk, gv) in gfields.iter_mut() {
                        if gk.text == "capabilities"
                            && let Value::Seq(members) = &mut gv.value
                        {
                            for (j, m) in members.iter_mut().enumerate() {
                                expand_item_env(m, &gp.key("capabilities").index(j), env, errors);
                            }
                        }
                    }
                }
            }
            _ => {}
        }
    }
}

fn expand_config_env(
    n: &mut Node,
    path: &Path,
    env: &BTreeMap<String, String>,
    errors: &mut Vec<ArgError>,
) {
    match &mut n.value {
        Value::Str(s) => {
            let found = refs::find(s);
            if found.iter().all(|r| r.kind != RefKind::Env) {
                return;
            }
            let mut out = String::with_capacity(s.len());
            let mut last = 0;
            for r in found {
                out.push_str(&s[last..r.start]);
                last = r.end;
                if r.kind != RefKind::Env {
                    out.push_str(&s[r.start..r.end]);
                    continue;
                }
                match env.get(r.name) {
                    Some(v)
                        if v.contains('\0') || v.contains("${{ kit.") || refs::has_any_ref(v) =>
                    {
                        errors.push(ArgError::BadEnvValue {
                            path: path.to_string(),
                            name: r.name.to_owned(),
                        });
                    }
                    Some(v) => out.push_str(v),
                    None => errors.push(ArgError::UnknownEnv {
                        path: path.to_string(),
                        name: r.name.to_owned(),
                    }),
                }
            }
            out.push_str(&s[last..]);
            *s = out;
        }
        Value::Seq(items) => {
            for (i, item) in items.iter_mut().enumerate() {
                expand_config_env(item, &path.index(i), env, errors);
            }
        }
        Value::Map(entries) => {
            for (k, v) in entries.iter_mut() {
                let p = path.key(&k.text);
                if refs::has_env_ref(&k.text) {
                    errors.push(ArgError::EnvInKey {
                        path: p.to_string(),
                    });
                }
                expand_config_env(v, &p, env, errors);
            }
        }
        _ => {}
    }
}

/// The create-time pipeline for one kit (spec §3, "Create"): resolve the supplied arg
/// values, expand create-phase references, expand `kit.env` references against the kit's
/// own `env:` exports overridden by `env_overrides`, and judge the result strictly as an
/// effective descriptor. Build-phase args of an unpublished (authored) kit take their
/// defaults. Arg problems are errors; validation problems are in the returned
/// [`crate::Loaded`]'s diagnostics.
pub fn effective(
    loaded: &crate::Loaded,
    supplied: &BTreeMap<String, String>,
    env_overrides: &BTreeMap<String, String>,
    declarations_only: bool,
) -> Result<crate::Loaded, Vec<ArgError>> {
    let (Some(descriptor), Some(root)) = (&loaded.descriptor, &loaded.root) else {
        return Err(Vec::new());
    };
    let mut values = resolve_args(&descriptor.args, supplied)?;
    // A kit read from its authored source was never published: its build-phase args take
    // their defaults, as a build with no `--build-arg` would give them.
    for a in descriptor.args.iter().filter(|a| a.is_build_phase()) {
        if let Some(default) = &a.default {
            values.insert(a.name.clone(), default.clone());
        }
    }
    let expanded = expand_create_args(root, &values, &[])?;
    let mut env: BTreeMap<String, String> = descriptor
        .args
        .iter()
        .filter_map(|a| Some((a.env.clone()?, values.get(&a.name)?.clone())))
        .collect();
    env.extend(env_overrides.iter().map(|(k, v)| (k.clone(), v.clone())));
    let expanded = expand_env(&expanded, &env)?;
    let opts = crate::Options {
        profile: crate::Profile::Effective,
        declarations_only,
        ..crate::Options::default()
    };
    Ok(crate::load_tree(&expanded, &opts))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]
    use super::*;

    fn load_errors(text: &str) -> Vec<String> {
        crate::load(text.as_bytes(), &crate::Options::default())
            .diagnostics
            .errors()
            .map(|d| d.to_string())
            .collect()
    }

    /// A short kit cannot expand into gigabytes through its args: a 240 KB value
    /// referenced 13,000 times is refused as soon as the substitutions pass 2 MiB, once;
    /// the twin, a few references, expands.
    #[test]
    fn substitution_is_bounded() {
        let value = "x".repeat(240_000);
        let refs = vec!["\"${{ kit.args.a }}\""; 13_000].join(", ");
        let kit = format!(
            "schemaVersion: \"3\"\nkind: workload\nargs:\n  a: {{default: \"{value}\"}}\ncapabilities:\n  - type: com.docker.sandbox/network-policy@2\n    config: {{runtime: {{allow: [{refs}]}}}}\n"
        );
        let loaded = crate::load(kit.as_bytes(), &crate::Options::default());
        let errors = effective(&loaded, &BTreeMap::new(), &BTreeMap::new(), false).unwrap_err();
        let too_large = errors
            .iter()
            .filter(|e| matches!(e, ArgError::ExpansionTooLarge { .. }))
            .count();
        assert_eq!(too_large, 1, "{errors:?}");
        let few = kit.replace(&refs, "\"${{ kit.args.a }}\"");
        let loaded = crate::load(few.as_bytes(), &crate::Options::default());
        let out = expand_create_args(
            loaded.root.as_ref().unwrap(),
            &[("a".to_owned(), "y".repeat(1000))].into(),
            &[],
        );
        assert!(out.is_ok());
    }

    /// A kit cannot make reading it slow with its arg patterns: patterns whose program
    /// is large fail at once, there are at most 256 args, and a pattern is at most 512
    /// bytes. The twin: an ordinary pattern compiles and judges values.
    #[test]
    fn arg_patterns_are_bounded() {
        let mut many = String::from("schemaVersion: \"3\"\nkind: workload\nargs:\n");
        for i in 0..200 {
            many.push_str(&format!("  a{i}: {{pattern: '\\w{{150}}'}}\n"));
        }
        // Each fails on the program limit (unbounded, each compiles, in ~60 ms).
        let errors = load_errors(&many);
        assert_eq!(errors.len(), 200, "{errors:?}");
        assert!(errors[0].contains("does not compile"), "{errors:?}");
        let mut too_many = String::from("schemaVersion: \"3\"\nkind: workload\nargs:\n");
        for i in 0..300 {
            too_many.push_str(&format!("  a{i}: {{default: x}}\n"));
        }
        let errors = load_errors(&too_many);
        assert!(
            errors
                .iter()
                .any(|e| e.contains("300 args are declared; a kit declares at most 256")),
            "{errors:?}"
        );
        assert!(compile_pattern(&"a".repeat(600)).is_err());
        let re = compile_pattern("[0-9]+\\.[0-9]+").unwrap();
        assert!(re.is_match("2.1") && !re.is_match("2.1x"));
    }

    fn decl(name: &str) -> ArgDecl {
        ArgDecl {
            name: name.into(),
            default: None,
            required: false,
            description: None,
            allowed: None,
            pattern: None,
            env: None,
            build_arg: None,
        }
    }

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn resolve_applies_defaults_and_rules() {
        let mut port = decl("port");
        port.default = Some("3000".into());
        port.pattern = Some("[0-9]{4,5}".into());
        let mut team = decl("team");
        team.required = true;
        let mut mode = decl("mode");
        mode.allowed = Some(vec!["alpha".into(), "beta".into()]);
        let mut baked = decl("version");
        baked.build_arg = Some("V".into());
        let decls = [port, team, mode, baked];

        let ok = resolve_args(&decls, &map(&[("team", "x")])).unwrap();
        assert_eq!(ok.get("port").map(String::as_str), Some("3000"));
        assert!(!ok.contains_key("mode"));

        let errs = resolve_args(
            &decls,
            &map(&[
                ("port", "1"),
                ("mode", "gamma"),
                ("nope", "1"),
                ("version", "2"),
            ]),
        )
        .unwrap_err();
        let text: Vec<String> = errs.iter().map(ToString::to_string).collect();
        let joined = text.join("\n");
        for fragment in [
            "no arg `nope`",
            "`team` is required",
            "already baked",
            "not one of",
            "pattern",
        ] {
            assert!(joined.contains(fragment), "{fragment} in {joined}");
        }
    }

    fn node(text: &str) -> Node {
        let mut d = crate::diag::Diagnostics::new();
        crate::yaml::parse(text.as_bytes(), &crate::yaml::Limits::DEFAULT, &mut d).unwrap()
    }

    #[test]
    fn whole_references_adopt_types() {
        let n = node("a: '${{ kit.args.v }}'\n");
        let cases = [
            ("8080", Value::Int(8080)),
            ("true", Value::Bool(true)),
            ("1.5", Value::Float(1.5)),
            ("1.0", Value::Str("1.0".into())),
            ("007", Value::Str("007".into())),
            ("1e5", Value::Str("1e5".into())),
            ("0x10", Value::Str("0x10".into())),
            ("+1", Value::Str("+1".into())),
            ("NaN", Value::Str("NaN".into())),
            ("-Inf", Value::Str("-Inf".into())),
        ];
        for (v, expected) in cases {
            let out = expand_create_args(&n, &map(&[("v", v)]), &[]).unwrap();
            assert_eq!(out.get("a").map(|n| n.value.clone()), Some(expected), "{v}");
        }
        let padded = node("a: 'port ${{ kit.args.v }} is \"open\"'\n");
        let out = expand_create_args(&padded, &map(&[("v", "8080")]), &[]).unwrap();
        assert_eq!(
            out.get("a").and_then(Node::as_str),
            Some("port 8080 is \"open\"")
        );
    }

    #[test]
    fn volume_size_and_mode_stay_text() {
        let n = node(
            "capabilities:\n- type: com.docker.sandbox/volume@1\n  config: {path: /v, size: '${{ kit.args.s }}', mode: '${{ kit.args.m }}'}\n",
        );
        let out = expand_create_args(&n, &map(&[("s", "20"), ("m", "755")]), &[]).unwrap();
        let cfg = out
            .get("capabilities")
            .and_then(Node::as_seq)
            .and_then(|s| s.first())
            .and_then(|e| e.get("config"))
            .unwrap();
        assert_eq!(cfg.get("size").and_then(Node::as_str), Some("20"));
        assert_eq!(cfg.get("mode").and_then(Node::as_str), Some("755"));
    }

    #[test]
    fn keys_values_verbatim_and_collisions() {
        let n = node("m:\n  '${{ kit.args.k }}': open\n");
        let out = expand_create_args(&n, &map(&[("k", "8080")]), &[]).unwrap();
        assert_eq!(
            out.get("m")
                .and_then(|m| m.get("8080"))
                .and_then(Node::as_str),
            Some("open")
        );
        let n = node("m:\n  '${{ kit.args.k }}': 1\n  profile: 2\n");
        let errs = expand_create_args(&n, &map(&[("k", "profile")]), &[]).unwrap_err();
        assert!(errs.iter().any(|e| {
            e.to_string()
                .contains("collapses two keys onto \"profile\"")
        }));
        for v in [
            "say \"hello\"",
            "C:\\new\\text",
            "line\nbreak",
            "{\"json\":\"looking\"}",
            "trailing\\",
            "tab\there",
        ] {
            let n = node("a: 'x${{ kit.args.v }}'\n");
            let out = expand_create_args(&n, &map(&[("v", v)]), &[]).unwrap();
            assert_eq!(
                out.get("a").and_then(Node::as_str),
                Some(format!("x{v}").as_str())
            );
        }
    }

    #[test]
    fn missing_values_and_env_injection_are_errors() {
        let n = node("a: '${{ kit.args.v }}'\nb: '${{ kit.args.build }}'\n");
        let errs = expand_create_args(&n, &BTreeMap::new(), &["build".into()]).unwrap_err();
        assert!(
            errs.iter()
                .any(|e| e.to_string().contains("no resolved value"))
        );
        let ok = expand_create_args(&n, &map(&[("v", "x")]), &["build".into()]).unwrap();
        assert_eq!(
            ok.get("b").and_then(Node::as_str),
            Some("${{ kit.args.build }}")
        );
        let errs = expand_create_args(&n, &map(&[("v", "${{ kit.env.HOME }}")]), &["build".into()])
            .unwrap_err();
        assert!(
            errs.iter()
                .any(|e| matches!(e, ArgError::IntroducesEnvReference { .. }))
        );
    }

    #[test]
    fn env_expands_only_in_config_values() {
        let n = node(
            "description: '${{ kit.env.X }}'\ncapabilities:\n- type: t/x@1\n  config: {p: '${{ kit.env.X }}/a', n: '${{ kit.env.N }}'}\n",
        );
        let out = expand_env(&n, &map(&[("X", "/home"), ("N", "1")])).unwrap();
        assert_eq!(
            out.get("description").and_then(Node::as_str),
            Some("${{ kit.env.X }}")
        );
        let cfg = out
            .get("capabilities")
            .and_then(Node::as_seq)
            .and_then(|s| s.first())
            .and_then(|e| e.get("config"))
            .unwrap();
        assert_eq!(cfg.get("p").and_then(Node::as_str), Some("/home/a"));
        assert_eq!(cfg.get("n").and_then(Node::as_str), Some("1"));
        let errs = expand_env(&n, &map(&[("X", "a\0b")])).unwrap_err();
        assert!(
            errs.iter()
                .any(|e| matches!(e, ArgError::BadEnvValue { .. }))
        );
        assert!(
            errs.iter()
                .any(|e| matches!(e, ArgError::UnknownEnv { .. }))
        );
    }
}
