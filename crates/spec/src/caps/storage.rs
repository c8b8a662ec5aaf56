//! volume@1, host-mount@1, port@1, usb-device@1 and resources@1 (spec §2.5–§2.9).

use schemars::JsonSchema;
use serde::Serialize;

use super::{
    BlockKey, KnownType, clean_path, is_canonical_absolute, is_size, literal_str, parse_size_parts,
};
use crate::node::{Node, Path, Value};
use crate::read::Cx;

/// volume@1: persistent or tmpfs storage at a path inside the sandbox.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Volume {
    /// Absolute path inside the sandbox (need not be canonical).
    pub path: String,
    /// Capacity such as `20g`; empty means unspecified.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub size: String,
    /// RAM-backed storage, emptied on stop.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub tmpfs: bool,
    /// Octal mode of a freshly allocated root, such as `0755`; empty means unspecified.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub mode: String,
}

impl Volume {
    /// Whether two requests at one path ask for the same storage (spec §2.5
    /// `SameVolumeRequest`): cleaned paths, tmpfs, modes without leading zeros, and sizes as
    /// exact byte counts.
    pub fn same_request(&self, other: &Volume) -> bool {
        clean_path(&self.path) == clean_path(&other.path)
            && self.tmpfs == other.tmpfs
            && same_mode(&self.mode, &other.mode)
            && same_size(&self.size, &other.size)
    }
}

fn same_mode(a: &str, b: &str) -> bool {
    match (a.is_empty(), b.is_empty()) {
        (true, true) => true,
        (false, false) => {
            let strip = |s: &str| {
                let t = s.trim_start_matches('0');
                if t.is_empty() { "0" } else { t }.to_owned()
            };
            strip(a) == strip(b)
        }
        _ => false,
    }
}

/// An exact size in bytes as a rational `numerator / 10^scale`, compared without floats.
fn size_bytes(s: &str) -> Option<(u128, u32)> {
    let (int, frac, exp) = parse_size_parts(s)?;
    if int.is_empty() {
        return None;
    }
    let frac = frac.trim_end_matches('0');
    let digits = format!("{int}{frac}");
    let digits = digits.trim_start_matches('0');
    let mantissa: u128 = if digits.is_empty() {
        0
    } else {
        digits.parse().ok()?
    };
    let multiplier = 1024u128.checked_pow(exp)?;
    Some((
        mantissa.checked_mul(multiplier)?,
        u32::try_from(frac.len()).ok()?,
    ))
}

/// A size of the volume@1 / resources@1 grammar in whole bytes (units are powers of 1024;
/// a fraction of a byte is dropped). `None` for an empty, zero, malformed or too large size.
pub fn size_in_bytes(s: &str) -> Option<u64> {
    let (n, scale) = size_bytes(s)?;
    let bytes = n / 10u128.checked_pow(scale)?;
    u64::try_from(bytes).ok().filter(|b| *b > 0)
}

fn same_size(a: &str, b: &str) -> bool {
    match (a.is_empty(), b.is_empty()) {
        (true, true) => true,
        (false, false) => match (size_bytes(a), size_bytes(b)) {
            (Some((na, sa)), Some((nb, sb))) => {
                let scale = sa.max(sb);
                let up = |n: u128, s: u32| n.checked_mul(10u128.checked_pow(scale - s)?);
                matches!((up(na, sa), up(nb, sb)), (Some(x), Some(y)) if x == y)
            }
            _ => false,
        },
        _ => false,
    }
}

/// host-mount@1: a host directory owned by the runtime, shared across sandboxes of a kit.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct HostMount {
    /// Absolute canonical path inside the sandbox; not `/`.
    pub path: String,
    /// Octal mode applied when the directory is created.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<String>,
}

/// Transport of a published port.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Transport {
    Tcp,
    Udp,
}

/// port@1: a container port published to the host.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Port {
    /// Display label.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
    /// Container port, 1 to 65535.
    pub container: u16,
    /// `tcp` (default) or `udp`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub transport: Option<Transport>,
}

impl Port {
    /// `"<container>/<transport>"`, the port's identity and surface entry.
    pub fn key(&self) -> String {
        let t = match self.transport.unwrap_or(Transport::Tcp) {
            Transport::Tcp => "tcp",
            Transport::Udp => "udp",
        };
        format!("{}/{t}", self.container)
    }
}

/// usb-device@1: a USB match by vendor and product, or by class.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct UsbDevice {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vendor_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub product_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub class: Option<String>,
}

/// resources@1: CPU, memory and GPU limits (a constraint, not a grant).
#[derive(Debug, Clone, PartialEq, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Resources {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu: Option<String>,
}

fn is_octal_mode(s: &str) -> bool {
    (3..=4).contains(&s.len()) && s.bytes().all(|b| (b'0'..=b'7').contains(&b))
}

pub(crate) fn decode_volume(cx: &mut Cx<'_>, node: &Node, path: &Path) -> Option<Volume> {
    let mut f = cx.fields(node, path)?;
    let p = f.required_string(cx, "path");
    let size = f.string(cx, "size");
    let tmpfs = f
        .take("tmpfs")
        .map(|n| (cx.boolean(n, &path.key("tmpfs")), n));
    let mode = f.string(cx, "mode");
    f.finish(cx);
    let mut ok = true;
    if let Some(p) = p
        && cx.judgeable(p)
        && !p.starts_with('/')
    {
        cx.error(
            &path.key("path"),
            node_pos(node, "path"),
            format!("path `{p}` must be absolute"),
        );
        ok = false;
    }
    if let Some(s) = size
        && cx.judgeable(s)
        && !is_size(s)
    {
        cx.error(
            &path.key("size"),
            node_pos(node, "size"),
            format!("size `{s}` is not a size such as `512m` or `20g`"),
        );
        ok = false;
    }
    if let Some(m) = mode
        && cx.judgeable(m)
        && !(m.is_empty() || is_octal_mode(m))
    {
        cx.error(
            &path.key("mode"),
            node_pos(node, "mode"),
            format!("mode `{m}` is not an octal mode such as `0755`"),
        );
        ok = false;
    }
    let tmpfs = match tmpfs {
        Some((Some(b), _)) => b,
        Some((None, _)) => return None,
        None => false,
    };
    ok.then_some(())?;
    Some(Volume {
        path: p?.to_owned(),
        size: size.unwrap_or_default().to_owned(),
        tmpfs,
        mode: mode.unwrap_or_default().to_owned(),
    })
}

pub(crate) fn decode_host_mount(cx: &mut Cx<'_>, node: &Node, path: &Path) -> Option<HostMount> {
    let mut f = cx.fields(node, path)?;
    let p = f.required_string(cx, "path");
    let mode = f.string(cx, "mode");
    f.finish(cx);
    let mut ok = true;
    if let Some(p) = p
        && cx.judgeable(p)
        && (!is_canonical_absolute(p) || p == "/")
    {
        cx.error(
                &path.key("path"),
                node_pos(node, "path"),
                format!("path `{p}` must be absolute and canonical (no `.`, `..`, `//` or trailing `/`) and not `/`"),
            );
        ok = false;
    }
    if let Some(m) = mode
        && cx.judgeable(m)
        && !is_octal_mode(m)
    {
        cx.error(
            &path.key("mode"),
            node_pos(node, "mode"),
            format!("mode `{m}` is not an octal mode such as `0755`"),
        );
        ok = false;
    }
    ok.then_some(())?;
    Some(HostMount {
        path: p?.to_owned(),
        mode: mode.map(str::to_owned),
    })
}

pub(crate) fn decode_port(cx: &mut Cx<'_>, node: &Node, path: &Path) -> Option<Port> {
    let mut f = cx.fields(node, path)?;
    let name = f.string(cx, "name");
    let container = f.require(cx, "container").and_then(|n| {
        let p = path.key("container");
        let v = cx.integer(n, &p)?;
        match u16::try_from(v) {
            Ok(port) if port >= 1 => Some(port),
            _ => {
                cx.error(
                    &p,
                    n.pos,
                    format!("container port {v} is out of range (1 to 65535)"),
                );
                None
            }
        }
    });
    let transport = match f.take("transport") {
        None => Some(None),
        Some(n) => match cx.string(n, &path.key("transport")) {
            Some("" | "tcp") => Some(Some(Transport::Tcp)),
            Some("udp") => Some(Some(Transport::Udp)),
            Some(t) if !cx.judgeable(t) => None,
            Some(t) => {
                cx.error(
                    &path.key("transport"),
                    n.pos,
                    format!("transport `{t}` is not `tcp` or `udp`"),
                );
                None
            }
            None => None,
        },
    };
    f.finish(cx);
    Some(Port {
        name: name.unwrap_or_default().to_owned(),
        container: container?,
        transport: transport?,
    })
}

pub(crate) fn decode_usb(cx: &mut Cx<'_>, node: &Node, path: &Path) -> Option<UsbDevice> {
    let mut f = cx.fields(node, path)?;
    let vendor = f.string(cx, "vendorId");
    let product = f.string(cx, "productId");
    let class = f.string(cx, "class");
    f.finish(cx);
    let ids = vendor.is_some() || product.is_some();
    if ids && class.is_some() {
        cx.error(
            path,
            node.pos,
            "states vendorId/productId and class; name one form, not both",
        );
        return None;
    }
    if !ids && class.is_none() {
        cx.error(path, node.pos, "needs vendorId and productId, or class");
        return None;
    }
    if ids && (vendor.is_none() || product.is_none()) {
        cx.error(path, node.pos, "vendorId and productId go together");
        return None;
    }
    for (key, v) in [
        ("vendorId", vendor),
        ("productId", product),
        ("class", class),
    ] {
        if v == Some("") {
            cx.error(
                &path.key(key),
                node_pos(node, key),
                format!("`{key}` is empty"),
            );
            return None;
        }
    }
    Some(UsbDevice {
        vendor_id: vendor.map(str::to_owned),
        product_id: product.map(str::to_owned),
        class: class.map(str::to_owned),
    })
}

pub(crate) fn decode_resources(cx: &mut Cx<'_>, node: &Node, path: &Path) -> Option<Resources> {
    let mut f = cx.fields(node, path)?;
    let cpu = f.take("cpu").map(|n| (cx.number(n, &path.key("cpu")), n));
    let memory = f.string(cx, "memory");
    let gpu = f.string(cx, "gpu");
    f.finish(cx);
    // Every problem is said before the entry is given up on.
    let mut valid = true;
    let cpu = match cpu {
        Some((Some(c), n)) => {
            if c < 0.0 || !c.is_finite() {
                cx.error(
                    &path.key("cpu"),
                    n.pos,
                    format!("cpu {c} must be zero or more"),
                );
                valid = false;
            }
            Some(c)
        }
        Some((None, _)) => {
            valid = false;
            None
        }
        None => None,
    };
    // A size that overflows (`99999999999999999999999g`) fits the grammar, yet no runtime
    // could apply it: refused here, where `capgate run` would refuse it anyway.
    if let Some(m) = memory
        && cx.judgeable(m)
        && (!is_size(m) || size_in_bytes(m).is_none())
    {
        cx.error(
            &path.key("memory"),
            node_pos(node, "memory"),
            format!("memory `{m}` is not a size such as `8g`"),
        );
        valid = false;
    }
    if !valid {
        return None;
    }
    Some(Resources {
        cpu,
        memory: memory.map(str::to_owned),
        gpu: gpu.map(str::to_owned),
    })
}

/// volume@1 and host-mount@1 share one key per cleaned path (spec §2.5, §2.6).
pub(crate) fn path_block_keys(ty: KnownType, config: &Node) -> Vec<BlockKey> {
    let Some(p) = literal_str(config, "path") else {
        return Vec::new();
    };
    let what = if ty == KnownType::HostMount {
        "host mount"
    } else {
        "volume"
    };
    vec![BlockKey {
        key: format!("storage:{}", clean_path(p)),
        what: format!("storage path `{}` ({what})", clean_path(p)),
    }]
}

pub(crate) fn port_block_keys(config: &Node) -> Vec<BlockKey> {
    let Some(container) = config.get("container").and_then(|n| match n.value {
        Value::Int(i) => Some(i),
        _ => None,
    }) else {
        return Vec::new();
    };
    let transport = match config.get("transport").map(|n| &n.value) {
        None => "tcp",
        Some(Value::Str(s)) if s.is_empty() || s == "tcp" => "tcp",
        Some(Value::Str(s)) if s == "udp" => "udp",
        Some(_) => return Vec::new(),
    };
    let what = if transport == "tcp" {
        format!("port {container}")
    } else {
        format!("port {container}/{transport}")
    };
    vec![BlockKey {
        key: format!("port:{container}/{transport}"),
        what,
    }]
}

/// The position of field `key` of a mapping node, else the node's own.
pub(crate) fn node_pos(node: &Node, key: &str) -> crate::node::Pos {
    node.get(key).map_or(node.pos, |n| n.pos)
}

#[cfg(test)]
mod size_tests {
    use super::size_in_bytes;

    #[test]
    fn sizes_in_bytes_follow_the_grammar_exactly() {
        assert_eq!(size_in_bytes("512m"), Some(512 << 20));
        assert_eq!(size_in_bytes("1.5g"), Some(3 << 29));
        assert_eq!(size_in_bytes("1.5 GiB"), Some(3 << 29));
        assert_eq!(size_in_bytes("2048"), Some(2048));
        assert_eq!(size_in_bytes("0.5k"), Some(512));
        for bad in ["", "0", "0.0g", "g", "1.5x", "-1m", "99999999999t"] {
            assert_eq!(size_in_bytes(bad), None, "{bad}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A memory size that fits the grammar but no number of bytes is refused when the kit
    /// is read, where `capgate run` would refuse it later; the twin reads.
    #[test]
    fn a_memory_size_no_runtime_could_apply_is_invalid() {
        let kit = |memory: &str| {
            format!(
                "schemaVersion: \"3\"\nkind: workload\ncapabilities:\n  - type: com.docker.sandbox/resources@1\n    config: {{memory: \"{memory}\"}}\n"
            )
        };
        let read = |memory: &str| crate::load(kit(memory).as_bytes(), &crate::Options::default());
        let loaded = read("99999999999999999999999g");
        assert!(!loaded.is_valid());
        assert!(
            loaded
                .diagnostics
                .errors()
                .any(|d| d.to_string().contains("is not a size")),
        );
        assert!(read("8g").is_valid());
    }

    fn vol(size: &str, mode: &str) -> Volume {
        Volume {
            path: "/data/cache".into(),
            size: size.into(),
            tmpfs: false,
            mode: mode.into(),
        }
    }

    #[test]
    fn equivalent_volume_requests() {
        assert!(vol("1g", "755").same_request(&vol("1024mib", "0755")));
        assert!(vol("1g", "").same_request(&vol("1073741824", "")));
        assert!(vol("1.5g", "").same_request(&vol("1536m", "")));
        assert!(vol("001.0k", "").same_request(&vol("1024.00", "")));
        assert!(!vol("0", "").same_request(&vol("", "")));
        assert!(!vol("", "0000").same_request(&vol("", "")));
        assert!(!vol("1g", "").same_request(&vol("1.0000000001g", "")));
        let mut other = vol("", "");
        other.path = "/data/./cache/".into();
        assert!(vol("", "").same_request(&other));
        other.tmpfs = true;
        assert!(!vol("", "").same_request(&other));
    }
}
