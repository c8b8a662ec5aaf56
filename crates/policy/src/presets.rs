//! The presets (`capgate policy init allow-all|balanced|deny-all`): the global rules a
//! user starts from, stored with `source: default`, non-editable, replaced as a whole.
//!
//! **KIT ALLOWS APPLY ON TOP OF ANY PRESET; ONLY A DENY RULE BEATS THEM.** A preset only
//! adds (or does not add) global allow rules. `deny-all` is *not* a deny rule: it stores no
//! rule at all, so a sandbox created from a kit that grants `api.example.com` reaches
//! `api.example.com` under `deny-all` too. To stop a kit's allow, add a deny rule
//! (`capgate policy deny --sandbox NAME HOST`, or `**`).
//!
//! `balanced` is reviewed data: `data/presets/balanced.txt`, one group per rule, each group
//! and host with a comment saying why it is there.

use std::fmt;

use serde::Serialize;

use crate::rule::{CreatedVia, Decision, Protocol, ResourceType, Scope, Source};
use crate::store::NewRule;

/// The text of the `balanced` preset.
pub const BALANCED: &str = include_str!("../data/presets/balanced.txt");

/// Where [`BALANCED`] comes from, for messages.
const BALANCED_FILE: &str = "data/presets/balanced.txt";

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Preset {
    /// One global `**` allow (TCP): every host, like no policy at all.
    AllowAll,
    /// Default deny plus the groups of `data/presets/balanced.txt`.
    Balanced,
    /// No preset rule at all: nothing is allowed but what kits and the user allow. Not a
    /// deny rule.
    DenyAll,
}

impl Preset {
    pub const ALL: [Preset; 3] = [Preset::AllowAll, Preset::Balanced, Preset::DenyAll];

    pub fn as_str(self) -> &'static str {
        match self {
            Preset::AllowAll => "allow-all",
            Preset::Balanced => "balanced",
            Preset::DenyAll => "deny-all",
        }
    }

    pub fn parse(s: &str) -> Option<Preset> {
        Preset::ALL.into_iter().find(|p| p.as_str() == s)
    }

    /// The rules the preset stores. Kit allows apply on top of them; only a deny beats a
    /// kit allow, and no preset holds a deny.
    pub fn rules(self) -> Result<Vec<NewRule>, PresetError> {
        match self {
            Preset::AllowAll => Ok(vec![default_rule(
                "default-allow-all",
                vec!["**".to_owned()],
            )]),
            Preset::Balanced => Ok(parse_groups(BALANCED)?
                .into_iter()
                .map(|g| default_rule(&g.name, g.hosts.into_iter().map(|h| h.pattern).collect()))
                .collect()),
            Preset::DenyAll => Ok(Vec::new()),
        }
    }
}

impl fmt::Display for Preset {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

fn default_rule(name: &str, resources: Vec<String>) -> NewRule {
    NewRule {
        name: name.to_owned(),
        scope: Scope::Global,
        resource_type: ResourceType::Network,
        decision: Decision::Allow,
        resources,
        methods: None,
        paths: None,
        protocol: Protocol::Tcp,
        phase: None,
        source: Source::Default,
        created_via: CreatedVia::Default,
        editable: false,
        active: true,
    }
}

/// One group of a preset file: one rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PresetGroup {
    /// `default-…`.
    pub name: String,
    /// Why the group exists.
    pub why: String,
    pub hosts: Vec<PresetHost>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PresetHost {
    pub pattern: String,
    pub why: Option<String>,
    /// 1-based line in the file.
    pub line: usize,
}

/// A preset file that does not follow its format.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{file}:{line}: {problem}")]
pub struct PresetError {
    pub file: &'static str,
    pub line: usize,
    pub problem: PresetProblem,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PresetProblem {
    /// A host line before the first `# group:` line.
    HostOutsideGroup,
    BadGroupName {
        name: String,
    },
    DuplicateGroup {
        name: String,
    },
    /// The line after `# group:` is not a comment saying why.
    MissingWhy {
        group: String,
    },
    EmptyGroup {
        group: String,
    },
    InvalidPattern {
        pattern: String,
    },
    DuplicatePattern {
        pattern: String,
    },
    NoGroups,
}

impl fmt::Display for PresetProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PresetProblem::HostOutsideGroup => {
                f.write_str("host pattern before the first `# group:` line")
            }
            PresetProblem::BadGroupName { name } => {
                write!(
                    f,
                    "group name `{name}` is not `default-` followed by lowercase words"
                )
            }
            PresetProblem::DuplicateGroup { name } => write!(f, "group `{name}` is defined twice"),
            PresetProblem::MissingWhy { group } => {
                write!(
                    f,
                    "group `{group}` needs a comment line saying why it exists"
                )
            }
            PresetProblem::EmptyGroup { group } => write!(f, "group `{group}` lists no host"),
            PresetProblem::InvalidPattern { pattern } => write!(
                f,
                "`{pattern}` is not a lowercase host pattern (`name.tld`, `*.name.tld` or `**.name.tld`, optional `:port`)"
            ),
            PresetProblem::DuplicatePattern { pattern } => write!(f, "`{pattern}` is listed twice"),
            PresetProblem::NoGroups => f.write_str("no `# group:` line"),
        }
    }
}

/// Parses a preset file (the format is described in its header).
pub fn parse_groups(text: &str) -> Result<Vec<PresetGroup>, PresetError> {
    let err = |line, problem| PresetError {
        file: BALANCED_FILE,
        line,
        problem,
    };
    let mut groups: Vec<PresetGroup> = Vec::new();
    // The line of the `# group:` header of the last group while its "why" is still due.
    let mut why_due: Option<usize> = None;
    let mut seen = std::collections::BTreeSet::new();
    for (index, raw) in text.lines().enumerate() {
        let line = index + 1;
        let trimmed = raw.trim();
        if trimmed.is_empty() {
            continue;
        }
        if let Some(comment) = trimmed.strip_prefix('#') {
            let comment = comment.trim();
            if let Some(name) = comment.strip_prefix("group:") {
                if let (Some(header), Some(group)) = (why_due, groups.last()) {
                    return Err(err(
                        header,
                        PresetProblem::MissingWhy {
                            group: group.name.clone(),
                        },
                    ));
                }
                close_group(groups.last()).map_err(|p| err(line, p))?;
                let name = name.trim().to_owned();
                if !valid_group_name(&name) {
                    return Err(err(line, PresetProblem::BadGroupName { name }));
                }
                if groups.iter().any(|g| g.name == name) {
                    return Err(err(line, PresetProblem::DuplicateGroup { name }));
                }
                groups.push(PresetGroup {
                    name,
                    why: String::new(),
                    hosts: Vec::new(),
                });
                why_due = Some(line);
            } else if why_due.take().is_some()
                && let Some(group) = groups.last_mut()
            {
                group.why = comment.to_owned();
            }
            continue;
        }
        let Some(group) = groups.last_mut() else {
            return Err(err(line, PresetProblem::HostOutsideGroup));
        };
        if why_due.is_some() {
            return Err(err(
                line,
                PresetProblem::MissingWhy {
                    group: group.name.clone(),
                },
            ));
        }
        let (pattern, why) = match trimmed.split_once('#') {
            Some((p, w)) => (
                p.trim(),
                Some(w.trim().to_owned()).filter(|w| !w.is_empty()),
            ),
            None => (trimmed, None),
        };
        if !valid_pattern(pattern) {
            return Err(err(
                line,
                PresetProblem::InvalidPattern {
                    pattern: pattern.to_owned(),
                },
            ));
        }
        if !seen.insert(pattern.to_owned()) {
            return Err(err(
                line,
                PresetProblem::DuplicatePattern {
                    pattern: pattern.to_owned(),
                },
            ));
        }
        group.hosts.push(PresetHost {
            pattern: pattern.to_owned(),
            why,
            line,
        });
    }
    let last_line = text.lines().count();
    if let (Some(header), Some(group)) = (why_due, groups.last()) {
        return Err(err(
            header,
            PresetProblem::MissingWhy {
                group: group.name.clone(),
            },
        ));
    }
    close_group(groups.last()).map_err(|p| err(last_line, p))?;
    if groups.is_empty() {
        return Err(err(last_line, PresetProblem::NoGroups));
    }
    Ok(groups)
}

fn close_group(group: Option<&PresetGroup>) -> Result<(), PresetProblem> {
    match group {
        Some(g) if g.hosts.is_empty() => Err(PresetProblem::EmptyGroup {
            group: g.name.clone(),
        }),
        _ => Ok(()),
    }
}

fn valid_group_name(name: &str) -> bool {
    name.strip_prefix("default-").is_some_and(|rest| {
        !rest.is_empty()
            && rest
                .split('-')
                .all(|w| !w.is_empty() && w.bytes().all(|c| c.is_ascii_lowercase()))
    })
}

/// A lowercase host name of at least two labels, optionally with a leading `*` or `**`
/// label and a `:port`. Never a bare wildcard: a preset group cannot allow everything.
pub fn valid_pattern(pattern: &str) -> bool {
    let (host, port) = match pattern.rsplit_once(':') {
        Some((h, p)) => (h, Some(p)),
        None => (pattern, None),
    };
    let port_ok = port.is_none_or(|p| {
        !p.is_empty()
            && !p.starts_with('0')
            && p.len() <= 5
            && p.parse::<u16>().is_ok_and(|n| n > 0)
    });
    let labels: Vec<&str> = host.split('.').collect();
    let named = labels
        .iter()
        .skip_while(|l| **l == "*" || **l == "**")
        .count();
    let wildcards = labels.len() - named;
    let label_ok = |l: &&str| {
        !l.is_empty()
            && l.len() <= 63
            && !l.starts_with('-')
            && !l.ends_with('-')
            && l.bytes()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-')
    };
    port_ok
        && host.len() <= 253
        && wildcards <= 1
        && named >= 2
        && labels.iter().skip(wildcards).all(label_ok)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "tests")]
mod tests {
    use super::*;

    #[test]
    fn balanced_has_reviewed_groups() {
        let groups = parse_groups(BALANCED).unwrap();
        assert!(groups.len() >= 3);
        for g in &groups {
            assert!(g.name.starts_with("default-"));
            assert!(!g.why.is_empty(), "{}", g.name);
            for h in &g.hosts {
                assert!(valid_pattern(&h.pattern), "{}", h.pattern);
                // The matcher reads it the same way, already in canonical form.
                let parsed = crate::pattern::HostPattern::parse(&h.pattern).unwrap();
                assert_eq!(parsed.to_string(), h.pattern);
                assert_eq!(h.pattern, h.pattern.to_lowercase());
                assert!(!h.pattern.contains(char::is_whitespace));
            }
        }
        let names: Vec<&str> = groups.iter().map(|g| g.name.as_str()).collect();
        assert!(names.contains(&"default-ai-services"));
        let all: Vec<&str> = groups
            .iter()
            .flat_map(|g| g.hosts.iter().map(|h| h.pattern.as_str()))
            .collect();
        for host in [
            "api.anthropic.com:443",
            "registry.npmjs.org:443",
            "static.crates.io:443",
            "github.com:443",
        ] {
            assert!(all.contains(&host), "{host}");
        }
        assert!(BALANCED.contains("ONLY A DENY RULE BEATS THEM"));
    }

    #[test]
    fn preset_rules() {
        let allow_all = Preset::AllowAll.rules().unwrap();
        assert_eq!(allow_all.len(), 1);
        assert_eq!(allow_all[0].resources, vec!["**"]);
        assert!(Preset::DenyAll.rules().unwrap().is_empty());
        for rule in Preset::Balanced.rules().unwrap() {
            assert_eq!(rule.decision, Decision::Allow);
            assert_eq!(
                (rule.source, rule.created_via, rule.editable),
                (Source::Default, CreatedVia::Default, false)
            );
            assert_eq!((rule.scope, rule.phase), (Scope::Global, None));
        }
        for p in Preset::ALL {
            assert_eq!(Preset::parse(p.as_str()), Some(p));
        }
        assert_eq!(Preset::parse("open"), None);
    }

    #[test]
    fn patterns() {
        for ok in [
            "a.com",
            "*.a.com",
            "**.a.com:443",
            "x-1.a.io:8080",
            "a.com:22",
        ] {
            assert!(valid_pattern(ok), "{ok}");
        }
        for bad in [
            "**",
            "*",
            "com",
            "**.com",
            "A.com",
            "a .com",
            "a.com:",
            "a.com:0",
            "a.com:70000",
            "a..com",
            "-a.com",
            "*.*.a.com",
            "a.*.com",
            "a.com:04",
        ] {
            assert!(!valid_pattern(bad), "{bad}");
        }
    }

    #[test]
    fn format_errors_name_the_line() {
        let missing_why = "# group: default-x\na.com\n";
        let e = parse_groups(missing_why).unwrap_err();
        assert_eq!(
            (e.line, e.problem.clone()),
            (
                2,
                PresetProblem::MissingWhy {
                    group: "default-x".into()
                }
            )
        );
        assert!(e.to_string().starts_with("data/presets/balanced.txt:2: "));
        let empty = "# group: default-x\n# why\n# group: default-y\n# why\nb.com\n";
        assert_eq!(
            parse_groups(empty).unwrap_err().problem,
            PresetProblem::EmptyGroup {
                group: "default-x".into()
            }
        );
        let outside = "a.com\n";
        assert_eq!(
            parse_groups(outside).unwrap_err().problem,
            PresetProblem::HostOutsideGroup
        );
        let twice = "# group: default-x\n# why\na.com\na.com # again\n";
        assert_eq!(parse_groups(twice).unwrap_err().line, 4);
        let bad_name = "# group: ai\n# why\na.com\n";
        assert!(matches!(
            parse_groups(bad_name).unwrap_err().problem,
            PresetProblem::BadGroupName { .. }
        ));
        assert_eq!(
            parse_groups("# nothing\n").unwrap_err().problem,
            PresetProblem::NoGroups
        );
    }
}
