//! ssh-agent@1 (spec §2.4): an SSH agent relayed into the sandbox for one or more phases,
//! unrestricted or bounded to named signature namespaces and login destinations.

use schemars::JsonSchema;
use serde::Serialize;

use super::credential::{PhaseForm, literal_phases, read_phases, serialize_phases};
use super::{BlockKey, Phase};
use crate::node::{Node, Path, Pos};
use crate::read::Cx;

/// ssh-agent@1: the phases the agent is exposed in, and what it may sign.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SshAgent {
    /// `install`, `runtime`, or a non-empty list of distinct phases. Written back as a
    /// string when there is one.
    #[serde(rename = "phase", serialize_with = "serialize_phases")]
    #[schemars(with = "PhaseForm")]
    pub phases: Vec<Phase>,
    /// Sign anything (the default). `false` bounds the agent to `sign` and `authenticate`.
    #[serde(default = "yes", skip_serializing_if = "is_true")]
    #[schemars(extend("default" = true))]
    pub unrestricted: bool,
    /// SSHSIG namespaces the agent may sign for (printable ASCII, no spaces); only when
    /// `unrestricted` is false.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(min = 1), inner(pattern(r"^[!-~]+$")))]
    pub sign: Vec<String>,
    /// Servers (`host` or `user@host`, a literal lowercase DNS name) the agent may log in to;
    /// only when `unrestricted` is false.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(
        length(min = 1),
        inner(pattern(r"^([a-z_][a-z0-9_.-]*@)?[a-z0-9]([a-z0-9-]*[a-z0-9])?(\.[a-z0-9]([a-z0-9-]*[a-z0-9])?)*$"))
    )]
    pub authenticate: Vec<String>,
}

fn yes() -> bool {
    true
}

fn is_true(b: &bool) -> bool {
    *b
}

/// `^[!-~]+$`: printable ASCII without spaces.
fn is_namespace(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|b| (b'!'..=b'~').contains(&b))
}

/// `^([a-z_][a-z0-9_.-]*@)?label(\.label)*$` with `label = [a-z0-9]([a-z0-9-]*[a-z0-9])?`.
fn is_destination(s: &str) -> bool {
    let host = match s.split_once('@') {
        Some((user, host)) => {
            let mut b = user.bytes();
            let first_ok = b
                .next()
                .is_some_and(|c| c.is_ascii_lowercase() || c == b'_');
            let rest_ok = b.all(|c| {
                c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, b'_' | b'.' | b'-')
            });
            if !(first_ok && rest_ok) {
                return false;
            }
            host
        }
        None => s,
    };
    host.split('.').all(|label| {
        let b = label.as_bytes();
        let edge = |c: &u8| c.is_ascii_lowercase() || c.is_ascii_digit();
        b.first().is_some_and(edge)
            && b.last().is_some_and(edge)
            && b.iter().all(|c| edge(c) || *c == b'-')
    })
}

/// The server of a destination, without its user.
fn destination_host(d: &str) -> &str {
    d.rsplit_once('@').map_or(d, |(_, host)| host)
}

pub(crate) fn decode(cx: &mut Cx<'_>, node: &Node, path: &Path) -> Option<SshAgent> {
    let before = cx.diags.errors().count();
    let mut f = cx.fields(node, path)?;
    let phases = read_phases(cx, &mut f);
    // Null is never read as omitted: it would quietly mean "unrestricted".
    let mut take = |cx: &mut Cx<'_>, key: &str| match f.take(key) {
        Some(n) if n.is_null() => {
            cx.error(
                &path.key(key),
                n.pos,
                format!("{key} is null; omit the field or declare a value"),
            );
            Err(())
        }
        other => Ok(other),
    };
    let unrestricted_node = take(cx, "unrestricted");
    let sign_node = take(cx, "sign");
    let authenticate_node = take(cx, "authenticate");
    f.finish(cx);

    // `None` inside: stated but deferred or not a boolean.
    let unrestricted = match unrestricted_node {
        Ok(None) => Some(Some(true)),
        Ok(Some(n)) => Some(cx.boolean(n, &path.key("unrestricted"))),
        Err(()) => None,
    };
    let sign_stated = matches!(sign_node, Ok(Some(_)) | Err(()));
    let authenticate_stated = matches!(authenticate_node, Ok(Some(_)) | Err(()));
    if let Some(Some(unrestricted)) = unrestricted {
        let pos = node.get("unrestricted").map_or(node.pos, |n| n.pos);
        if !unrestricted && !sign_stated && !authenticate_stated {
            cx.error(
                &path.key("unrestricted"),
                pos,
                "unrestricted: false requires sign or authenticate; name what the agent may sign",
            );
        }
        if unrestricted {
            for (key, stated) in [("sign", sign_stated), ("authenticate", authenticate_stated)] {
                if stated {
                    let pos = node.get(key).map_or(node.pos, |n| n.pos);
                    cx.error(
                        &path.key(key),
                        pos,
                        format!("{key} requires unrestricted: false"),
                    );
                }
            }
        }
    }
    let sign = bounds(cx, sign_node, &path.key("sign"), "sign", |cx, v, p, pos| {
        if !is_namespace(v) {
            cx.error(
                p,
                pos,
                format!(
                    "sign namespace `{v}` is invalid: a namespace is printable ASCII without spaces"
                ),
            );
        }
    });
    let authenticate = bounds(
        cx,
        authenticate_node,
        &path.key("authenticate"),
        "authenticate",
        |cx, v, p, pos| {
            if !is_destination(v) {
                cx.error(
                p,
                pos,
                format!("destination `{v}` is invalid: a destination is host or user@host, with a literal lowercase DNS name and no wildcard, port, or IP address"),
            );
            } else if destination_host(v)
                .bytes()
                .all(|c| c.is_ascii_digit() || c == b'.')
            {
                cx.error(
                    p,
                    pos,
                    format!(
                        "destination `{v}` names an IP address; name the server by its DNS name"
                    ),
                );
            }
        },
    );

    if cx.diags.errors().count() > before {
        return None;
    }
    Some(SshAgent {
        phases: phases?,
        unrestricted: unrestricted??,
        sign: sign?,
        authenticate: authenticate?,
    })
}

/// Reads a `sign` or `authenticate` list: non-empty, distinct, each judgeable value checked
/// by `judge`. `None` when it could not be read (or was null, already reported).
fn bounds(
    cx: &mut Cx<'_>,
    node: Result<Option<&Node>, ()>,
    path: &Path,
    key: &str,
    judge: fn(&mut Cx<'_>, &str, &Path, Pos),
) -> Option<Vec<String>> {
    let node = match node {
        Ok(None) => return Some(Vec::new()),
        Ok(Some(n)) => n,
        Err(()) => return None,
    };
    let items = cx.string_list(node, path)?;
    if items.is_empty() {
        cx.error(
            path,
            node.pos,
            format!("empty {key} list; name at least one, or omit the field"),
        );
        return None;
    }
    let mut out: Vec<String> = Vec::with_capacity(items.len());
    for (p, v, pos) in items {
        // Identical spellings stay identical after expansion, so repeats are judged now.
        if out.iter().any(|o| o == v) {
            cx.error(&p, pos, format!("{key} lists `{v}` twice"));
        } else if cx.judgeable(v) {
            judge(cx, v, &p, pos);
        }
        out.push(v.to_owned());
    }
    Some(out)
}

/// One key per literal phase (spec §2.4: the same phase in two entries of one block).
pub(crate) fn block_keys(config: &Node) -> Vec<BlockKey> {
    literal_phases(config)
        .into_iter()
        .map(|phase| BlockKey {
            key: format!("ssh-agent:{phase}"),
            what: format!("ssh-agent for phase {phase}"),
        })
        .collect()
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, reason = "tests")]
mod tests {
    use super::*;
    use crate::diag::Diagnostics;
    use crate::yaml::{Limits, parse};

    const AT: &str = "capabilities[0].config";

    fn decode_text(text: &str, lenient: bool) -> (Option<SshAgent>, Diagnostics) {
        let mut diags = Diagnostics::new();
        let node = parse(text.as_bytes(), &Limits::DEFAULT, &mut diags).expect("yaml");
        assert!(diags.is_empty(), "{diags:?}");
        let mut cx = Cx::new(&mut diags);
        cx.lenient = lenient;
        let a = decode(&mut cx, &node, &Path::from(AT));
        (a, diags)
    }

    #[test]
    fn accepts_the_documented_shapes() {
        let cases: &[(&str, SshAgent)] = &[
            (
                "phase: runtime",
                SshAgent {
                    phases: vec![Phase::Runtime],
                    unrestricted: true,
                    sign: vec![],
                    authenticate: vec![],
                },
            ),
            (
                "phase: [install, runtime]\nunrestricted: true",
                SshAgent {
                    phases: vec![Phase::Install, Phase::Runtime],
                    unrestricted: true,
                    sign: vec![],
                    authenticate: vec![],
                },
            ),
            (
                "phase: runtime\nunrestricted: false\nsign: [git]\nauthenticate: [github.com, git@gitlab.example.com]",
                SshAgent {
                    phases: vec![Phase::Runtime],
                    unrestricted: false,
                    sign: vec!["git".into()],
                    authenticate: vec!["github.com".into(), "git@gitlab.example.com".into()],
                },
            ),
            (
                "phase: install\nunrestricted: false\nauthenticate: [_svc.x@a-b.c0]",
                SshAgent {
                    phases: vec![Phase::Install],
                    unrestricted: false,
                    sign: vec![],
                    authenticate: vec!["_svc.x@a-b.c0".into()],
                },
            ),
        ];
        for (text, want) in cases {
            let (a, d) = decode_text(text, false);
            assert!(!d.has_errors(), "{text}\n{d:?}");
            assert_eq!(a.as_ref(), Some(want), "{text}");
        }
    }

    #[test]
    fn rejects_bad_configs() {
        let cases: &[(&str, &str, &str)] = &[
            ("unrestricted: true", AT, "`phase` is required"),
            (
                "phase: []",
                "capabilities[0].config.phase",
                "phase list is empty",
            ),
            (
                "phase: always",
                "capabilities[0].config.phase",
                "must be install or runtime",
            ),
            (
                "phase: [runtime, runtime]",
                "capabilities[0].config.phase[1]",
                "listed twice",
            ),
            (
                "phase: null",
                "capabilities[0].config.phase",
                "phase is null",
            ),
            (
                "phase: runtime\nunrestricted: null",
                "capabilities[0].config.unrestricted",
                "unrestricted is null",
            ),
            (
                "phase: runtime\nunrestricted: false\nsign: null",
                "capabilities[0].config.sign",
                "sign is null",
            ),
            (
                "phase: runtime\nunrestricted: false\nauthenticate: null",
                "capabilities[0].config.authenticate",
                "authenticate is null",
            ),
            (
                "phase: runtime\nunrestricted: false",
                "capabilities[0].config.unrestricted",
                "unrestricted: false requires sign or authenticate",
            ),
            (
                "phase: runtime\nsign: [git]",
                "capabilities[0].config.sign",
                "sign requires unrestricted: false",
            ),
            (
                "phase: runtime\nunrestricted: true\nauthenticate: [github.com]",
                "capabilities[0].config.authenticate",
                "authenticate requires unrestricted: false",
            ),
            (
                "phase: runtime\nunrestricted: false\nsign: []",
                "capabilities[0].config.sign",
                "empty sign list",
            ),
            (
                "phase: runtime\nunrestricted: false\nauthenticate: []",
                "capabilities[0].config.authenticate",
                "empty authenticate list",
            ),
            (
                "phase: runtime\nunrestricted: false\nsign: [git, git]",
                "capabilities[0].config.sign[1]",
                "sign lists `git` twice",
            ),
            (
                "phase: runtime\nunrestricted: false\nsign: ['a b']",
                "capabilities[0].config.sign[0]",
                "sign namespace `a b` is invalid",
            ),
            (
                "phase: runtime\nunrestricted: false\nsign: ['']",
                "capabilities[0].config.sign[0]",
                "is invalid",
            ),
            (
                "phase: runtime\nunrestricted: false\nauthenticate: [a.com, a.com]",
                "capabilities[0].config.authenticate[1]",
                "twice",
            ),
            (
                "phase: runtime\nunrestricted: false\nauthenticate: ['*.github.com']",
                "capabilities[0].config.authenticate[0]",
                "no wildcard",
            ),
            (
                "phase: runtime\nunrestricted: false\nauthenticate: ['github.com:22']",
                "capabilities[0].config.authenticate[0]",
                "is invalid",
            ),
            (
                "phase: runtime\nunrestricted: false\nauthenticate: [GitHub.com]",
                "capabilities[0].config.authenticate[0]",
                "lowercase",
            ),
            (
                "phase: runtime\nunrestricted: false\nauthenticate: ['Git@github.com']",
                "capabilities[0].config.authenticate[0]",
                "is invalid",
            ),
            (
                "phase: runtime\nunrestricted: false\nauthenticate: [10.0.0.1]",
                "capabilities[0].config.authenticate[0]",
                "names an IP address",
            ),
            (
                "phase: runtime\nunrestricted: false\nauthenticate: [git@192.168.1.1]",
                "capabilities[0].config.authenticate[0]",
                "names an IP address",
            ),
            (
                "phase: runtime\nunrestricted: false\nauthenticate: [a..b]",
                "capabilities[0].config.authenticate[0]",
                "is invalid",
            ),
            (
                "phase: runtime\nunrestricted: no-thanks",
                "capabilities[0].config.unrestricted",
                "expected true or false",
            ),
            (
                "phase: runtime\nunrestricted: false\nsign: git",
                "capabilities[0].config.sign",
                "expected a list",
            ),
            (
                "phase: runtime\nsgin: [git]",
                "capabilities[0].config.sgin",
                "unknown field `sgin`",
            ),
        ];
        for (text, path, fragment) in cases {
            let (a, d) = decode_text(text, false);
            assert!(
                d.contains(path, fragment),
                "{text}\nwant {path}: {fragment}\ngot {d:?}"
            );
            assert!(a.is_none(), "{text}");
        }
    }

    #[test]
    fn lenient_entries_keep_presence_rules() {
        // Values wait for expansion.
        for text in [
            "phase: '${{ kit.args.p }}'",
            "phase: runtime\nunrestricted: '${{ kit.args.u }}'\nsign: [git]",
            "phase: runtime\nunrestricted: false\nauthenticate: ['${{ kit.args.host }}']",
            "phase: runtime\nunrestricted: false\nsign: ['${{ kit.env.NS }}']",
        ] {
            let (a, d) = decode_text(text, true);
            assert!(!d.has_errors(), "{text}\n{d:?}");
            if text.contains("kit.args.p") || text.contains("kit.args.u") {
                assert!(a.is_none(), "{text}");
            }
        }
        // Presence, emptiness, nulls and repeats do not.
        let cases: &[(&str, &str, &str)] = &[
            (
                "phase: runtime\nunrestricted: false\nauthenticate: ['${{ kit.args.h }}', '${{ kit.args.h }}']",
                "capabilities[0].config.authenticate[1]",
                "twice",
            ),
            (
                "phase: runtime\nunrestricted: false\nsign: []",
                "capabilities[0].config.sign",
                "empty sign list",
            ),
            (
                "phase: runtime\nsign: ['${{ kit.args.ns }}']",
                "capabilities[0].config.sign",
                "requires unrestricted: false",
            ),
            (
                "phase: '${{ kit.args.p }}'\nunrestricted: false",
                "capabilities[0].config.unrestricted",
                "requires sign or authenticate",
            ),
            (
                "phase: '${{ kit.args.p }}'\nsign: null",
                "capabilities[0].config.sign",
                "sign is null",
            ),
        ];
        for (text, path, fragment) in cases {
            let (_, d) = decode_text(text, true);
            assert!(
                d.contains(path, fragment),
                "{text}\nwant {path}: {fragment}\ngot {d:?}"
            );
        }
    }

    #[test]
    fn serializes_the_written_form() {
        let (a, _) = decode_text("phase: [runtime]\nunrestricted: true", false);
        assert_eq!(
            serde_json::to_string(&a.unwrap()).unwrap(),
            r#"{"phase":"runtime"}"#
        );
        let (a, _) = decode_text(
            "phase: [install, runtime]\nunrestricted: false\nsign: [git]",
            false,
        );
        assert_eq!(
            serde_json::to_string(&a.unwrap()).unwrap(),
            r#"{"phase":["install","runtime"],"unrestricted":false,"sign":["git"]}"#
        );
    }

    #[test]
    fn schema_admits_no_null() {
        let text = serde_json::to_string(&schemars::schema_for!(SshAgent)).unwrap();
        assert!(!text.contains("\"null\""), "{text}");
        assert!(text.contains("\"default\":true"), "{text}");
    }

    #[test]
    fn block_keys_are_one_per_literal_phase() {
        let mut diags = Diagnostics::new();
        let mut keys = |text: &str| {
            let node = parse(text.as_bytes(), &Limits::DEFAULT, &mut diags).unwrap();
            block_keys(&node)
                .into_iter()
                .map(|k| (k.key, k.what))
                .collect::<Vec<_>>()
        };
        assert_eq!(
            keys("phase: runtime"),
            [(
                "ssh-agent:runtime".to_owned(),
                "ssh-agent for phase runtime".to_owned()
            )]
        );
        assert_eq!(keys("phase: [install, runtime]").len(), 2);
        assert_eq!(keys("phase: ['${{ kit.args.p }}', install]").len(), 1);
        assert!(keys("unrestricted: true").is_empty());
    }
}
