//! Image references as Docker's normalized-reference parser accepts them (spec §1.4), and
//! manifest digests.
//!
//! `[domain[:port]/]path[:tag][@sha256:hex]` with lowercase path components.

/// `^sha256:[0-9a-f]{64}$`
pub fn is_sha256_digest(s: &str) -> bool {
    s.strip_prefix("sha256:").is_some_and(|hex| {
        hex.len() == 64 && hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
    })
}

/// The parts of a valid image reference.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageRef<'s> {
    pub domain: Option<&'s str>,
    pub path: &'s str,
    pub tag: Option<&'s str>,
    pub digest: Option<&'s str>,
}

/// Parses an image reference; `None` when Docker's parser would refuse it.
pub fn parse_image_ref(s: &str) -> Option<ImageRef<'_>> {
    if s.is_empty() || s.len() > 512 {
        return None;
    }
    // Docker refuses a bare 64-hex name: it would read as an image ID.
    if s.len() == 64 && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
        return None;
    }
    let (rest, digest) = match s.rsplit_once('@') {
        Some((r, d)) => {
            let (alg, hex) = d.split_once(':')?;
            let alg_ok = !alg.is_empty()
                && alg
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"+._-".contains(&b));
            let hex_ok = hex.len() >= 32 && hex.bytes().all(|b| b.is_ascii_hexdigit());
            if !(alg_ok && hex_ok) || (alg == "sha256" && !is_sha256_digest(d)) {
                return None;
            }
            (r, Some(d))
        }
        None => (s, None),
    };
    let last_slash = rest.rfind('/').map_or(0, |i| i + 1);
    let (name, tag) = match rest[last_slash..].rfind(':') {
        Some(i) => (&rest[..last_slash + i], Some(&rest[last_slash + i + 1..])),
        None => (rest, None),
    };
    if let Some(t) = tag {
        let b = t.as_bytes();
        let word = |c: u8| c.is_ascii_alphanumeric() || c == b'_';
        if b.is_empty()
            || b.len() > 128
            || !word(b[0])
            || !b.iter().all(|&c| word(c) || c == b'.' || c == b'-')
        {
            return None;
        }
    }
    if name.len() > 255 {
        return None;
    }
    let (domain, path) = match name.split_once('/') {
        Some((first, remainder)) if first.contains(['.', ':']) || first == "localhost" => {
            (Some(first), remainder)
        }
        _ => (None, name),
    };
    if let Some(d) = domain
        && !is_domain(d)
    {
        return None;
    }
    if path.is_empty() || !path.split('/').all(is_path_component) {
        return None;
    }
    Some(ImageRef {
        domain,
        path,
        tag,
        digest,
    })
}

fn is_domain(d: &str) -> bool {
    let (host, port) = match d.rsplit_once(':') {
        Some((h, p)) => (h, Some(p)),
        None => (d, None),
    };
    if port.is_some_and(|p| p.is_empty() || !p.bytes().all(|b| b.is_ascii_digit())) {
        return false;
    }
    !host.is_empty()
        && host.split('.').all(|c| {
            let b = c.as_bytes();
            !b.is_empty()
                && b[0].is_ascii_alphanumeric()
                && b[b.len() - 1].is_ascii_alphanumeric()
                && b.iter().all(|&x| x.is_ascii_alphanumeric() || x == b'-')
        })
}

/// `[a-z0-9]+((\.|_|__|-+)[a-z0-9]+)*`
fn is_path_component(c: &str) -> bool {
    let b = c.as_bytes();
    let alnum = |x: u8| x.is_ascii_lowercase() || x.is_ascii_digit();
    if b.is_empty() || !alnum(b[0]) || !alnum(b[b.len() - 1]) {
        return false;
    }
    let mut i = 0;
    while i < b.len() {
        if alnum(b[i]) {
            i += 1;
            continue;
        }
        let start = i;
        while i < b.len() && !alnum(b[i]) {
            i += 1;
        }
        let sep = &c[start..i];
        let ok = sep == "." || sep == "_" || sep == "__" || sep.bytes().all(|x| x == b'-');
        if !ok {
            return false;
        }
    }
    true
}

/// A version taken from the consumption reference (spec §4.1): the OCI tag, or a git
/// `#ref=`, when version-shaped after stripping a leading `v`.
pub fn version_from_reference(reference: &str) -> Option<String> {
    let candidate = if let Some((_, frag)) = reference.split_once("#ref=") {
        frag.split('&').next()?
    } else {
        let image = parse_image_ref(reference)?;
        image.tag?
    };
    let v = candidate.strip_prefix('v').unwrap_or(candidate);
    crate::names::is_version(v).then(|| v.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_what_docker_accepts() {
        for ok in [
            "docker.io/docker/sbx-kit-shell:1.0.0",
            "localhost:5000/x",
            "ubuntu",
            "reg.example/a/b_c/d--e:v1.2",
            "x@sha256:0123456789012345678901234567890123456789012345678901234567890123",
        ] {
            assert!(parse_image_ref(ok).is_some(), "{ok}");
        }
        for bad in [
            "https://reg.example/x",
            "Reg/Upper",
            "docker.io/Upper",
            "a b",
            "x:",
            "x@sha256:short",
            "/abs",
            "",
        ] {
            assert!(parse_image_ref(bad).is_none(), "{bad}");
        }
    }

    #[test]
    fn versions_from_tags() {
        assert_eq!(
            version_from_reference("reg/x:2.1.0").as_deref(),
            Some("2.1.0")
        );
        assert_eq!(
            version_from_reference("reg/x:v2.1.0").as_deref(),
            Some("2.1.0")
        );
        assert_eq!(version_from_reference("reg/x:dev"), None);
        assert_eq!(version_from_reference("localhost:5000/x"), None);
        assert_eq!(
            version_from_reference(
                "reg/x@sha256:0123456789012345678901234567890123456789012345678901234567890123"
            ),
            None
        );
        assert_eq!(version_from_reference("./local/kit"), None);
    }
}
