//! Request paths: one canonical form, and the globs of bounded rules matched against it.
//!
//! [`normalize_path`] gives the path a bounded rule judges (and that the gateway should
//! forward, so that the upstream sees what was judged):
//! - percent-escapes of unreserved characters (`A-Z a-z 0-9 - . _ ~`) are decoded
//!   (`%7E` → `~`); every other escape is kept, its hex digits uppercased (`%3a` → `%3A`);
//! - runs of `/` collapse into one (`/a//b` → `/a/b`), as most servers read them;
//! - dot segments are removed (RFC 3986 §5.2.4: `/a/b/../c` → `/a/c`, `/a/.` → `/a/`).
//!
//! Some paths have no single reading, and are refused as *ambiguous* rather than guessed:
//! an encoded `/` (`%2F`), an encoded `.` that forms a dot segment (`%2e%2e`, `.%2E`), a
//! backslash (literal or `%5C`, which some servers read as `/`), a `;` (literal or `%3B`:
//! Tomcat, Jetty and Spring cut path parameters off each segment before resolving dot
//! segments, so they read `/repos/..;/user` as `/user` and `/admin;x/users` as
//! `/admin/users`), and a path that has both an empty segment (`//`) and a dot segment,
//! which resolves differently on servers that collapse slashes and servers that do not
//! (`/a//..` is `/a/` or `/`).

use std::borrow::Cow;
use std::fmt;

/// Why a request path cannot be judged.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PathError {
    #[error("`{path}` does not start with `/`")]
    NotAbsolute { path: String },
    #[error("`{path}` is ambiguous: {why}")]
    Ambiguous { path: String, why: Ambiguity },
    #[error("`{path}` has an invalid percent-escape")]
    InvalidEscape { path: String },
    #[error("`{path}` contains `{ch}`, which a request path cannot carry")]
    ForbiddenCharacter { path: String, ch: char },
}

/// What makes a path ambiguous.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Ambiguity {
    #[error("it contains an encoded `/`")]
    EncodedSlash,
    #[error("an encoded `.` forms a dot segment")]
    EncodedDotSegment,
    #[error("it contains a backslash")]
    Backslash,
    #[error("it contains `;`, which some servers read as the start of path parameters")]
    PathParameter,
    #[error("it has both an empty segment and a dot segment")]
    EmptyAndDotSegments,
}

/// Why a path glob of a rule is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GlobError {
    #[error("path `{glob}` does not start with `/`")]
    NotAbsolute { glob: String },
    #[error("path `{glob}` has an invalid percent-escape")]
    InvalidEscape { glob: String },
    #[error("path `{glob}` contains an encoded `/` or `\\`")]
    EncodedSeparator { glob: String },
    #[error("path `{glob}` contains `{ch}`")]
    ForbiddenCharacter { glob: String, ch: char },
    #[error("path `{glob}` has an empty segment (`//`)")]
    EmptySegment { glob: String },
    #[error("path `{glob}` has a dot segment (`.` or `..`)")]
    DotSegment { glob: String },
    #[error("path `{glob}`: `**` must be a whole segment")]
    MisplacedDoubleStar { glob: String },
}

/// What is wrong with one segment, before it is known whether it is a request path or a
/// glob.
enum SegmentError {
    InvalidEscape,
    EncodedSlash,
    Backslash,
    PathParameter,
    Forbidden(char),
}

fn is_unreserved(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~')
}

fn hex_value(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

const HEX_UPPER: &[u8; 16] = b"0123456789ABCDEF";

/// Appends `raw` (one segment, without `/`) to `out` with its escapes normalized. Returns
/// whether an escape decoded to `.`.
fn push_segment(raw: &str, out: &mut String) -> Result<bool, SegmentError> {
    let bytes = raw.as_bytes();
    let mut encoded_dot = false;
    let mut run = 0;
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' => {
                out.push_str(&raw[run..i]);
                let (Some(hi), Some(lo)) = (
                    bytes.get(i + 1).copied().and_then(hex_value),
                    bytes.get(i + 2).copied().and_then(hex_value),
                ) else {
                    return Err(SegmentError::InvalidEscape);
                };
                let value = hi * 16 + lo;
                match value {
                    b'/' => return Err(SegmentError::EncodedSlash),
                    b'\\' => return Err(SegmentError::Backslash),
                    b';' => return Err(SegmentError::PathParameter),
                    v if is_unreserved(v) => {
                        encoded_dot |= v == b'.';
                        out.push(char::from(v));
                    }
                    _ => {
                        out.push('%');
                        out.push(char::from(HEX_UPPER[usize::from(hi)]));
                        out.push(char::from(HEX_UPPER[usize::from(lo)]));
                    }
                }
                i += 3;
                run = i;
            }
            b'\\' => return Err(SegmentError::Backslash),
            b';' => return Err(SegmentError::PathParameter),
            b @ (b'?' | b'#') => return Err(SegmentError::Forbidden(char::from(b))),
            _ => i += 1,
        }
    }
    out.push_str(&raw[run..]);
    Ok(encoded_dot)
}

/// Whether the path is already canonical, judged by a scan that never allocates.
fn is_canonical(path: &str) -> bool {
    let Some(rest) = path.strip_prefix('/') else {
        return false;
    };
    if path
        .bytes()
        .any(|b| matches!(b, b'%' | b'\\' | b';' | b'?' | b'#'))
    {
        return false;
    }
    let mut segments = rest.as_bytes().split(|&b| b == b'/').peekable();
    while let Some(segment) = segments.next() {
        let last = segments.peek().is_none();
        if (segment.is_empty() && !last) || segment == b"." || segment == b".." {
            return false;
        }
    }
    true
}

/// The canonical form of a request path (see the module documentation), borrowed when the
/// path is already canonical.
pub fn normalize_path(path: &str) -> Result<Cow<'_, str>, PathError> {
    if is_canonical(path) {
        return Ok(Cow::Borrowed(path));
    }
    let Some(rest) = path.strip_prefix('/') else {
        return Err(PathError::NotAbsolute {
            path: path.to_owned(),
        });
    };
    let ambiguous = |why| PathError::Ambiguous {
        path: path.to_owned(),
        why,
    };
    let mut out = String::with_capacity(path.len());
    // Where each kept segment starts in `out` (at its `/`), to pop on `..`.
    let mut starts: Vec<usize> = Vec::new();
    let mut had_empty = false;
    let mut had_dot = false;
    let mut trailing_slash = false;
    let mut segments = rest.split('/').peekable();
    while let Some(raw) = segments.next() {
        let last = segments.peek().is_none();
        let start = out.len();
        out.push('/');
        let encoded_dot = push_segment(raw, &mut out).map_err(|e| match e {
            SegmentError::InvalidEscape => PathError::InvalidEscape {
                path: path.to_owned(),
            },
            SegmentError::EncodedSlash => ambiguous(Ambiguity::EncodedSlash),
            SegmentError::Backslash => ambiguous(Ambiguity::Backslash),
            SegmentError::PathParameter => ambiguous(Ambiguity::PathParameter),
            SegmentError::Forbidden(ch) => PathError::ForbiddenCharacter {
                path: path.to_owned(),
                ch,
            },
        })?;
        let segment = &out[start + 1..];
        let dot = segment == ".";
        let dot_dot = segment == "..";
        if (dot || dot_dot) && encoded_dot {
            return Err(ambiguous(Ambiguity::EncodedDotSegment));
        }
        if dot || dot_dot {
            had_dot = true;
            out.truncate(start);
            if dot_dot && let Some(previous) = starts.pop() {
                out.truncate(previous);
            }
            trailing_slash = last;
        } else if segment.is_empty() && !last {
            had_empty = true;
            out.truncate(start);
        } else {
            starts.push(start);
        }
    }
    if had_empty && had_dot {
        return Err(ambiguous(Ambiguity::EmptyAndDotSegments));
    }
    if trailing_slash || out.is_empty() {
        out.push('/');
    }
    Ok(Cow::Owned(out))
}

/// One segment of a compiled glob.
#[derive(Debug, Clone, PartialEq, Eq)]
enum GlobSegment {
    /// `**`: any number of segments, none included.
    AnyDepth,
    /// A segment without `*`, compared for equality.
    Literal(Box<str>),
    /// A segment with `*`, each matching any run of characters within the segment.
    Wild(Box<str>),
}

/// A path glob of a bounded rule, compiled once: `**` as a whole segment matches any
/// number of segments, none included (`/repos/**` matches `/repos`, `/repos/` and
/// `/repos/a/b`); `*` matches any run of characters within one segment; everything else is
/// literal, with escapes normalized as in [`normalize_path`] (so `%2A` is a literal `*`).
/// Globs are written canonically: no empty segment (a trailing `/` aside), no dot segment,
/// no `?`, `#` or `\`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PathGlob {
    source: Box<str>,
    segments: Box<[GlobSegment]>,
}

impl PathGlob {
    pub fn compile(glob: &str) -> Result<PathGlob, GlobError> {
        let Some(rest) = glob.strip_prefix('/') else {
            return Err(GlobError::NotAbsolute {
                glob: glob.to_owned(),
            });
        };
        let mut segments = Vec::new();
        let mut parts = rest.split('/').peekable();
        let mut buf = String::new();
        while let Some(raw) = parts.next() {
            let last = parts.peek().is_none();
            buf.clear();
            // An encoded `.` cannot hide a dot segment here: dot segments are refused below.
            push_segment(raw, &mut buf).map_err(|e| match e {
                SegmentError::InvalidEscape => GlobError::InvalidEscape {
                    glob: glob.to_owned(),
                },
                SegmentError::EncodedSlash | SegmentError::Backslash => {
                    GlobError::EncodedSeparator {
                        glob: glob.to_owned(),
                    }
                }
                SegmentError::Forbidden(ch) => GlobError::ForbiddenCharacter {
                    glob: glob.to_owned(),
                    ch,
                },
                // A request path holding `;` is refused before any glob is matched, so a
                // glob holding one could never match.
                SegmentError::PathParameter => GlobError::ForbiddenCharacter {
                    glob: glob.to_owned(),
                    ch: ';',
                },
            })?;
            let segment = if buf == "**" {
                GlobSegment::AnyDepth
            } else if buf == "." || buf == ".." {
                return Err(GlobError::DotSegment {
                    glob: glob.to_owned(),
                });
            } else if buf.is_empty() && !last {
                return Err(GlobError::EmptySegment {
                    glob: glob.to_owned(),
                });
            } else if buf.contains("**") {
                return Err(GlobError::MisplacedDoubleStar {
                    glob: glob.to_owned(),
                });
            } else if buf.contains('*') {
                GlobSegment::Wild(buf.as_str().into())
            } else {
                GlobSegment::Literal(buf.as_str().into())
            };
            segments.push(segment);
        }
        Ok(PathGlob {
            source: glob.into(),
            segments: segments.into_boxed_slice(),
        })
    }

    /// The glob as written.
    pub fn as_str(&self) -> &str {
        &self.source
    }

    /// Whether the glob matches `path`, which must be normalized ([`normalize_path`]).
    /// Never allocates.
    pub fn matches(&self, path: &str) -> bool {
        let Some(rest) = path.strip_prefix('/') else {
            return false;
        };
        let globs = &self.segments;
        // Segment-level wildcard matching with one backtrack point (the last `**` seen):
        // `**` absorbs one more segment each time the rest fails to match.
        let mut g = 0;
        let mut pos = 0; // start of the current segment in `rest`; past the end when done
        let mut backtrack: Option<(usize, usize)> = None;
        loop {
            if pos > rest.len() {
                return globs[g..].iter().all(|s| *s == GlobSegment::AnyDepth);
            }
            let (segment, next) = segment_at(rest, pos);
            if let Some(glob) = globs.get(g) {
                match glob {
                    GlobSegment::AnyDepth => {
                        g += 1;
                        backtrack = Some((g, pos));
                        continue;
                    }
                    GlobSegment::Literal(l) if **l == *segment => {
                        g += 1;
                        pos = next;
                        continue;
                    }
                    GlobSegment::Wild(w) if wild_matches(w.as_bytes(), segment.as_bytes()) => {
                        g += 1;
                        pos = next;
                        continue;
                    }
                    GlobSegment::Literal(_) | GlobSegment::Wild(_) => {}
                }
            }
            let Some((after_star, star_pos)) = backtrack else {
                return false;
            };
            let (_, absorbed) = segment_at(rest, star_pos);
            backtrack = Some((after_star, absorbed));
            g = after_star;
            pos = absorbed;
        }
    }
}

/// The segment of `rest` starting at `pos`, and where the next one starts (past the end
/// of `rest` when this one is the last).
fn segment_at(rest: &str, pos: usize) -> (&str, usize) {
    let tail = rest.get(pos..).unwrap_or_default();
    match tail.find('/') {
        Some(i) => (&tail[..i], pos + i + 1),
        None => (tail, rest.len() + 1),
    }
}

/// `*` matches any run of bytes (the segment holds no `/`); everything else is literal.
fn wild_matches(pattern: &[u8], text: &[u8]) -> bool {
    let (mut p, mut t) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while t < text.len() {
        match pattern.get(p) {
            Some(b'*') => {
                p += 1;
                star = Some((p, t));
            }
            Some(&c) if c == text[t] => {
                p += 1;
                t += 1;
            }
            _ => match star {
                Some((sp, st)) => {
                    p = sp;
                    t = st + 1;
                    star = Some((sp, st + 1));
                }
                None => return false,
            },
        }
    }
    pattern[p..].iter().all(|&c| c == b'*')
}

impl fmt::Display for PathGlob {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.source)
    }
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

    fn norm(p: &str) -> Result<String, PathError> {
        normalize_path(p).map(Cow::into_owned)
    }

    fn ambiguity(p: &str) -> Option<Ambiguity> {
        match normalize_path(p) {
            Err(PathError::Ambiguous { why, .. }) => Some(why),
            _ => None,
        }
    }

    #[test]
    fn canonical_paths_are_borrowed() {
        for p in ["/", "/a", "/a/", "/a/b.c/~d", "/..a/.b/c..", "/a%"] {
            if is_canonical(p) {
                assert!(matches!(normalize_path(p), Ok(Cow::Borrowed(_))), "{p}");
            }
        }
        assert!(matches!(
            normalize_path("/repos/x"),
            Ok(Cow::Borrowed("/repos/x"))
        ));
    }

    #[test]
    fn removes_dot_segments() {
        for (input, expected) in [
            ("/a/b/../c", "/a/c"),
            ("/a/./b", "/a/b"),
            ("/a/.", "/a/"),
            ("/a/b/..", "/a/"),
            ("/..", "/"),
            ("/../..", "/"),
            ("/a/../../b", "/b"),
            ("/.", "/"),
            ("/a/..b/c", "/a/..b/c"),
            ("/a/.../c", "/a/.../c"),
        ] {
            assert_eq!(norm(input).unwrap(), expected, "{input}");
        }
    }

    #[test]
    fn decodes_unreserved_escapes_only() {
        assert_eq!(norm("/%7Euser").unwrap(), "/~user");
        assert_eq!(norm("/%7euser").unwrap(), "/~user");
        assert_eq!(norm("/%41%62%2D%5f").unwrap(), "/Ab-_");
        assert_eq!(norm("/a%3ab").unwrap(), "/a%3Ab");
        assert_eq!(norm("/a%20b").unwrap(), "/a%20b");
        assert_eq!(norm("/a%2A").unwrap(), "/a%2A");
        assert_eq!(norm("/%2e%2ehidden").unwrap(), "/..hidden");
        assert_eq!(norm("/caf\u{e9}/%7E").unwrap(), "/caf\u{e9}/~");
    }

    #[test]
    fn collapses_repeated_slashes() {
        assert_eq!(norm("//a").unwrap(), "/a");
        assert_eq!(norm("/a//b").unwrap(), "/a/b");
        assert_eq!(norm("/a///").unwrap(), "/a/");
        assert_eq!(norm("//").unwrap(), "/");
    }

    #[test]
    fn refuses_ambiguous_paths() {
        assert_eq!(ambiguity("/a%2Fb"), Some(Ambiguity::EncodedSlash));
        assert_eq!(ambiguity("/a%2fb"), Some(Ambiguity::EncodedSlash));
        assert_eq!(ambiguity("/a/%2e%2e/b"), Some(Ambiguity::EncodedDotSegment));
        assert_eq!(ambiguity("/a/.%2E/b"), Some(Ambiguity::EncodedDotSegment));
        assert_eq!(ambiguity("/a/%2E"), Some(Ambiguity::EncodedDotSegment));
        assert_eq!(ambiguity("/a\\b"), Some(Ambiguity::Backslash));
        assert_eq!(ambiguity("/a%5cb"), Some(Ambiguity::Backslash));
        assert_eq!(ambiguity("/repos/..;/user"), Some(Ambiguity::PathParameter));
        assert_eq!(ambiguity("/admin;x/users"), Some(Ambiguity::PathParameter));
        assert_eq!(ambiguity("/a;"), Some(Ambiguity::PathParameter));
        assert_eq!(ambiguity("/a/%3b/b"), Some(Ambiguity::PathParameter));
        assert_eq!(ambiguity("/a//../b"), Some(Ambiguity::EmptyAndDotSegments));
        assert_eq!(ambiguity("//a/./b"), Some(Ambiguity::EmptyAndDotSegments));
    }

    #[test]
    fn refuses_malformed_paths() {
        assert!(matches!(
            normalize_path(""),
            Err(PathError::NotAbsolute { .. })
        ));
        assert!(matches!(
            normalize_path("*"),
            Err(PathError::NotAbsolute { .. })
        ));
        assert!(matches!(
            normalize_path("a/b"),
            Err(PathError::NotAbsolute { .. })
        ));
        assert!(matches!(
            normalize_path("/a%"),
            Err(PathError::InvalidEscape { .. })
        ));
        assert!(matches!(
            normalize_path("/a%4"),
            Err(PathError::InvalidEscape { .. })
        ));
        assert!(matches!(
            normalize_path("/a%zz"),
            Err(PathError::InvalidEscape { .. })
        ));
        assert!(matches!(
            normalize_path("/a?b"),
            Err(PathError::ForbiddenCharacter { ch: '?', .. })
        ));
        assert!(matches!(
            normalize_path("/a#b"),
            Err(PathError::ForbiddenCharacter { ch: '#', .. })
        ));
    }

    #[test]
    fn normalization_is_idempotent() {
        for p in ["/a/b/../c", "/%7e/%3a", "/a//b/", "/x/./y/..", "/%41"] {
            let once = norm(p).unwrap();
            assert_eq!(norm(&once).unwrap(), once);
        }
    }

    fn glob(g: &str) -> PathGlob {
        PathGlob::compile(g).unwrap()
    }

    #[test]
    fn double_star_matches_any_depth() {
        let g = glob("/repos/**");
        for p in ["/repos", "/repos/", "/repos/a", "/repos/a/b/c"] {
            assert!(g.matches(p), "{p}");
        }
        for p in ["/", "/repo", "/reposx", "/other/repos"] {
            assert!(!g.matches(p), "{p}");
        }
        let all = glob("/**");
        for p in ["/", "/a", "/a/b/"] {
            assert!(all.matches(p), "{p}");
        }
        let mid = glob("/a/**/z");
        for p in ["/a/z", "/a/b/z", "/a/b/c/z"] {
            assert!(mid.matches(p), "{p}");
        }
        for p in ["/a", "/a/z/b", "/a/zz", "/z"] {
            assert!(!mid.matches(p), "{p}");
        }
        let two = glob("/**/x/**/y");
        assert!(two.matches("/x/y"));
        assert!(two.matches("/a/x/b/c/y"));
        assert!(!two.matches("/a/y/x"));
    }

    #[test]
    fn star_stays_in_one_segment() {
        let g = glob("/repos/*/issues");
        assert!(g.matches("/repos/x/issues"));
        assert!(!g.matches("/repos/x/y/issues"));
        assert!(!g.matches("/repos/issues"));
        let g = glob("/files/*.txt");
        assert!(g.matches("/files/a.txt"));
        assert!(g.matches("/files/.txt"));
        assert!(!g.matches("/files/a.txt/b"));
        assert!(!g.matches("/files/a.tx"));
        let g = glob("/a/*");
        assert!(g.matches("/a/b"));
        assert!(g.matches("/a/"));
        assert!(!g.matches("/a"));
        let g = glob("/*a*b*");
        assert!(g.matches("/xaxbx"));
        assert!(g.matches("/ab"));
        assert!(!g.matches("/ba"));
    }

    #[test]
    fn literal_globs() {
        let g = glob("/repos");
        assert!(g.matches("/repos"));
        assert!(!g.matches("/repos/"));
        let g = glob("/repos/");
        assert!(g.matches("/repos/"));
        assert!(!g.matches("/repos"));
        let g = glob("/");
        assert!(g.matches("/"));
        assert!(!g.matches("/a"));
        // Escapes are normalized in globs as in paths; `%2A` is a literal star.
        let g = glob("/%7euser/a%3a");
        assert!(g.matches("/~user/a%3A"));
        let g = glob("/a%2A");
        assert!(g.matches("/a%2A"));
        assert!(!g.matches("/ab"));
    }

    #[test]
    fn refuses_bad_globs() {
        for bad in [
            "",
            "repos",
            "/a//b",
            "//",
            "/a/./b",
            "/a/..",
            "/a/%2e%2e",
            "/a%2Fb",
            "/a\\b",
            "/a?b",
            "/a#b",
            "/a**",
            "/**b",
            "/%zz",
        ] {
            assert!(PathGlob::compile(bad).is_err(), "{bad:?} should be refused");
        }
    }
}
