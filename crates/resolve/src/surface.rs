//! The permission surface (spec §5.2): a normalized inventory of everything the host must
//! grant, computed from a descriptor's declarations. The widening gate (spec §5.3) compares
//! two of these.

use capgate_spec::canonical;
use capgate_spec::caps::agent::SkillsMode;
use capgate_spec::caps::network::{HostEntry, NetworkPolicy};
use capgate_spec::caps::pack::Tier;
use capgate_spec::caps::{Capability, KnownType, Phase};
use capgate_spec::node::Node;
use capgate_spec::{Descriptor, Entry};
use serde::{Deserialize, Serialize};

/// The normalized grant set of one descriptor (spec §5.2). Every list is de-duplicated and
/// sorted by byte order; empty lists and `false` are omitted, so an empty surface is `{}`.
/// Field order is the serialization order and is part of the contract.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Surface {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub network_install_allow: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub network_install_deny: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub network_runtime_allow: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub network_runtime_deny: Vec<String>,
    #[serde(
        default,
        rename = "networkInstallHTTPAllow",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub network_install_http_allow: Vec<String>,
    #[serde(
        default,
        rename = "networkInstallHTTPDeny",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub network_install_http_deny: Vec<String>,
    #[serde(
        default,
        rename = "networkRuntimeHTTPAllow",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub network_runtime_http_allow: Vec<String>,
    #[serde(
        default,
        rename = "networkRuntimeHTTPDeny",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub network_runtime_http_deny: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub credentials_install: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub credentials_runtime: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ssh_agent: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub storage_paths: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub skills_paths: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub skills_write_paths: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ports: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub usb: Vec<String>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub privileged: bool,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub services: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub host_mount_paths: Vec<String>,
    /// capgate's own: the egress triples (`dev.capgate/egress@1`) as
    /// `host:port/protocol`, granted in the runtime phase.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub egress: Vec<String>,
    /// capgate's own: where the workload may write (`dev.capgate/filesystem@1`), sorted;
    /// absent when the kits leave writes to the sandbox's defaults (which is wider).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub filesystem_write: Option<Vec<String>>,
    /// capgate's own: what of the workspace the workload sees (`dev.capgate/filesystem@1`
    /// `read`), sorted; absent when it sees all of it (which is wider).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub filesystem_read: Option<Vec<String>>,
    /// capgate's own: the programs the workload may execute (`dev.capgate/exec@1`),
    /// sorted; absent when any program may run (which is wider).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exec_allow: Option<Vec<String>>,
    /// capgate's own: the determinism tier (`dev.capgate/determinism@1`), when one is
    /// declared. No tier binds like `unrestricted`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub determinism: Option<Tier>,
}

/// The surface of a descriptor's declarations: ordinary entries and every group member (a
/// conservative inventory: an unselected group still counts). For enforcement, pass the
/// selected and merged entries to [`surface_of_entries`] instead.
pub fn surface_of(descriptor: &Descriptor) -> Surface {
    surface_of_entries(descriptor.declared_entries().into_iter().map(|(_, e)| e))
}

/// The surface of a list of entries (for example a merged or selected composition).
pub fn surface_of_entries<'a>(entries: impl IntoIterator<Item = &'a Entry>) -> Surface {
    let mut surface = Surface::default();
    // One filesystem@1 entry that states no `read` shows the whole workspace, whatever
    // the others list: composition merges them so (a second entry, say in a group).
    let mut reads_all = false;
    for entry in entries {
        if let Some(Capability::Filesystem(f)) = &entry.capability {
            reads_all |= f.read.is_none();
        }
        surface.add(entry);
    }
    if reads_all {
        surface.filesystem_read = None;
    }
    surface.normalize();
    surface
}

impl Surface {
    /// Sorts every list by byte order and removes duplicates.
    pub fn normalize(&mut self) {
        for list in self.lists_mut() {
            list.sort_unstable();
            list.dedup();
        }
        for list in [
            &mut self.filesystem_write,
            &mut self.filesystem_read,
            &mut self.exec_allow,
        ]
        .into_iter()
        .flatten()
        {
            list.sort_unstable();
            list.dedup();
        }
    }

    /// Whether the surface grants nothing (it serializes as `{}`).
    pub fn is_empty(&self) -> bool {
        !self.privileged
            && self.determinism.is_none()
            && self.filesystem_write.is_none()
            && self.filesystem_read.is_none()
            && self.exec_allow.is_none()
            && self.lists().iter().all(|l| l.is_empty())
    }

    fn lists(&self) -> [&Vec<String>; 19] {
        [
            &self.network_install_allow,
            &self.network_install_deny,
            &self.network_runtime_allow,
            &self.network_runtime_deny,
            &self.network_install_http_allow,
            &self.network_install_http_deny,
            &self.network_runtime_http_allow,
            &self.network_runtime_http_deny,
            &self.credentials_install,
            &self.credentials_runtime,
            &self.ssh_agent,
            &self.storage_paths,
            &self.skills_paths,
            &self.skills_write_paths,
            &self.ports,
            &self.usb,
            &self.services,
            &self.host_mount_paths,
            &self.egress,
        ]
    }

    fn lists_mut(&mut self) -> [&mut Vec<String>; 19] {
        [
            &mut self.network_install_allow,
            &mut self.network_install_deny,
            &mut self.network_runtime_allow,
            &mut self.network_runtime_deny,
            &mut self.network_install_http_allow,
            &mut self.network_install_http_deny,
            &mut self.network_runtime_http_allow,
            &mut self.network_runtime_http_deny,
            &mut self.credentials_install,
            &mut self.credentials_runtime,
            &mut self.ssh_agent,
            &mut self.storage_paths,
            &mut self.skills_paths,
            &mut self.skills_write_paths,
            &mut self.ports,
            &mut self.usb,
            &mut self.services,
            &mut self.host_mount_paths,
            &mut self.egress,
        ]
    }

    /// Adds one entry's contribution (unnormalized).
    fn add(&mut self, entry: &Entry) {
        if entry.known.is_some_and(contributes_nothing) {
            return;
        }
        match &entry.capability {
            Some(Capability::NetworkPolicy(policy)) => self.add_network(policy),
            Some(Capability::Credential(c)) => {
                for phase in &c.phases {
                    let list = match phase {
                        Phase::Install => &mut self.credentials_install,
                        Phase::Runtime => &mut self.credentials_runtime,
                    };
                    list.push(c.service.clone());
                }
            }
            Some(Capability::SshAgent(a)) => {
                for phase in &a.phases {
                    if a.unrestricted {
                        self.ssh_agent.push(phase.as_str().to_owned());
                        continue;
                    }
                    for ns in &a.sign {
                        self.ssh_agent.push(format!("{phase} sign {ns}"));
                    }
                    for dest in &a.authenticate {
                        self.ssh_agent.push(format!("{phase} authenticate {dest}"));
                    }
                }
            }
            Some(Capability::Volume(v)) => self.storage_paths.push(v.path.clone()),
            Some(Capability::HostMount(m)) => self.host_mount_paths.push(m.path.clone()),
            Some(Capability::Port(p)) => self.ports.push(p.key()),
            Some(Capability::UsbDevice(u)) => self.usb.push(match u.class.as_deref() {
                Some(class) if !class.is_empty() => format!("class:{class}"),
                _ => format!(
                    "{}:{}",
                    u.vendor_id.as_deref().unwrap_or_default(),
                    u.product_id.as_deref().unwrap_or_default()
                ),
            }),
            Some(Capability::AgentSkills(s)) => {
                self.skills_paths.push(s.path.clone());
                if s.effective_mode() == SkillsMode::Readwrite {
                    self.skills_write_paths.push(s.path.clone());
                }
            }
            // Were two tiers ever to meet here (an unmerged inventory), the wider one counts.
            Some(Capability::Egress(e)) => self.egress.push(e.key()),
            Some(Capability::Exec(x)) => self
                .exec_allow
                .get_or_insert_with(Vec::new)
                .extend(x.allow.iter().cloned()),
            Some(Capability::Filesystem(f)) => {
                self.filesystem_write
                    .get_or_insert_with(Vec::new)
                    .extend(f.write.iter().cloned());
                if let Some(read) = &f.read {
                    self.filesystem_read
                        .get_or_insert_with(Vec::new)
                        .extend(read.iter().cloned());
                }
            }
            Some(Capability::Determinism(d)) => {
                self.determinism = Some(self.determinism.map_or(d.tier, |t| t.max(d.tier)));
            }
            // privileged@1 takes no config, so nothing about it can fail to decode.
            _ if entry.known == Some(KnownType::Privileged) => self.privileged = true,
            // Unknown types, git-identity@1, kit-registry@1, and any well-known entry whose
            // config did not decode (or is still parameterized).
            _ => self.services.push(service_entry(entry)),
        }
    }

    fn add_network(&mut self, policy: &NetworkPolicy) {
        for phase in Phase::ALL {
            let Some(rules) = policy.phase(phase) else {
                continue;
            };
            let (allow, deny, http_allow, http_deny) = match phase {
                Phase::Install => (
                    &mut self.network_install_allow,
                    &mut self.network_install_deny,
                    &mut self.network_install_http_allow,
                    &mut self.network_install_http_deny,
                ),
                Phase::Runtime => (
                    &mut self.network_runtime_allow,
                    &mut self.network_runtime_deny,
                    &mut self.network_runtime_http_allow,
                    &mut self.network_runtime_http_deny,
                ),
            };
            project_entries(&rules.allow, allow, http_allow);
            project_entries(&rules.deny, deny, http_deny);
        }
    }
}

/// Host lists take the hosts of unbounded entries; HTTP lists take one atomic grant
/// `"<METHOD> <host><path>"` per host × method × path of every entry, bounded or not.
fn project_entries(entries: &[HostEntry], hosts: &mut Vec<String>, http: &mut Vec<String>) {
    for entry in entries {
        if !entry.is_bounded() {
            hosts.extend(entry.hosts.iter().cloned());
        }
        let methods = entry.methods_or_any();
        let paths = entry.paths_or_all();
        for host in &entry.hosts {
            for method in &methods {
                for path in &paths {
                    http.push(format!("{} {host}{path}", method.as_str()));
                }
            }
        }
    }
}

/// Where each credential's real value goes, one string per (phase, service, destination,
/// presentation): `runtime github api.github.com Authorization: Bearer %s`, `…
/// Authorization: basic <username>`, `… oauth-resource <host>`, `… oauth-token
/// <host><path>`. Sorted, without
/// duplicates; hosts lowercased without a trailing dot, a port kept as written. The spec's surface records only the
/// service names, so a new inject domain on a host already allowed, or a new header, would
/// pass unseen; the lock keeps these beside the surface (capgate's own field).
pub fn credential_injects<'a>(entries: impl IntoIterator<Item = &'a Entry>) -> Vec<String> {
    let host = |h: &str| h.trim_end_matches('.').to_ascii_lowercase();
    let mut out = Vec::new();
    for entry in entries {
        let Some(Capability::Credential(c)) = &entry.capability else {
            continue;
        };
        for phase in &c.phases {
            let who = format!("{phase} {}", c.service);
            for rule in c.api_key.iter().flat_map(|k| &k.inject) {
                // As the broker presents it: the header, then basic credentials for the
                // user, or the format (a scheme other than basic changes nothing).
                let how = if rule.is_basic() {
                    format!(
                        "{}: basic {}",
                        rule.header_or_default(),
                        rule.username.as_deref().unwrap_or_default()
                    )
                } else {
                    format!("{}: {}", rule.header_or_default(), rule.format_or_default())
                };
                // With its port, which the broker keeps to: `host:443` to `host` reaches
                // every port.
                let domain = match rule.domain.split_once(':') {
                    Some((name, port)) => format!("{}:{port}", host(name)),
                    None => host(&rule.domain),
                };
                out.push(format!("{who} {domain} {how}"));
            }
            if let Some(oauth) = &c.oauth {
                for h in &oauth.resource_hosts {
                    out.push(format!("{who} oauth-resource {}", host(h)));
                }
                if let Some(t) = &oauth.token_endpoint {
                    out.push(format!(
                        "{who} oauth-token {}{}",
                        host(&t.host),
                        t.path.as_deref().unwrap_or_default()
                    ));
                }
            }
        }
    }
    out.sort_unstable();
    out.dedup();
    out
}

/// Types that grant nothing the gate tracks (spec §5.2).
fn contributes_nothing(t: KnownType) -> bool {
    matches!(
        t,
        KnownType::Resources
            | KnownType::LongRunning
            | KnownType::AgentSkill
            | KnownType::AgentSessions
            | KnownType::AgentInteractiveSessions
            | KnownType::Lifecycle
            | KnownType::AgentContext
            | KnownType::Sbx
            | KnownType::Acp
    )
}

/// The `services` entry of an "other" request: the type alone when the config is absent,
/// null or an empty mapping, else `type+<first 12 hex of sha256(canonical JSON)>`.
fn service_entry(entry: &Entry) -> String {
    let ty = &entry.type_name;
    match entry.config.as_ref().filter(|c| !is_empty_config(c)) {
        None => ty.clone(),
        Some(config) => match canonical::short_digest(config) {
            Some(digest) => format!("{ty}+{digest}"),
            None => format!("{ty}+unencodable-config"),
        },
    }
}

fn is_empty_config(config: &Node) -> bool {
    config.is_null() || config.as_map().is_some_and(<[_]>::is_empty)
}

#[cfg(test)]
mod tests {
    #![allow(
        clippy::unwrap_used,
        clippy::expect_used,
        clippy::panic,
        reason = "tests"
    )]

    use super::*;

    #[test]
    fn empty_surface_serializes_as_empty_object() {
        let s = Surface::default();
        assert!(s.is_empty());
        assert_eq!(serde_json::to_string(&s).unwrap(), "{}");
    }

    #[test]
    fn privileged_alone_is_not_empty() {
        let s = Surface {
            privileged: true,
            ..Surface::default()
        };
        assert!(!s.is_empty());
        assert_eq!(serde_json::to_string(&s).unwrap(), r#"{"privileged":true}"#);
    }

    #[test]
    fn normalize_sorts_by_bytes_and_dedups() {
        let mut s = Surface {
            storage_paths: vec!["/b".into(), "/a".into(), "/b".into(), "/B".into()],
            host_mount_paths: vec!["/z".into(), "/z".into()],
            ..Surface::default()
        };
        s.normalize();
        assert_eq!(s.storage_paths, ["/B", "/a", "/b"]);
        assert_eq!(s.host_mount_paths, ["/z"]);
    }

    #[test]
    fn field_order_is_the_contract() {
        let s = Surface {
            network_install_allow: vec!["a".into()],
            network_runtime_http_deny: vec!["ANY d/**".into()],
            privileged: true,
            services: vec!["x/y@1".into()],
            host_mount_paths: vec!["/h".into()],
            ..Surface::default()
        };
        assert_eq!(
            serde_json::to_string(&s).unwrap(),
            r#"{"networkInstallAllow":["a"],"networkRuntimeHTTPDeny":["ANY d/**"],"privileged":true,"services":["x/y@1"],"hostMountPaths":["/h"]}"#
        );
        let back: Surface = serde_json::from_str(&serde_json::to_string(&s).unwrap()).unwrap();
        assert_eq!(back, s);
    }

    #[test]
    fn projection_collapses_any_and_defaults_paths() {
        let entries = [
            HostEntry::host("plain.example.com"),
            HostEntry {
                hosts: vec!["a.example.com".into(), "b.example.com".into()],
                methods: Some(vec![
                    capgate_spec::caps::network::Method::Get,
                    capgate_spec::caps::network::Method::Any,
                ]),
                paths: None,
            },
        ];
        let (mut hosts, mut http) = (Vec::new(), Vec::new());
        project_entries(&entries, &mut hosts, &mut http);
        assert_eq!(hosts, ["plain.example.com"]);
        assert_eq!(
            http,
            [
                "ANY plain.example.com/**",
                "ANY a.example.com/**",
                "ANY b.example.com/**"
            ]
        );
    }
}
