//! The credential broker: real secrets are added to requests only where a credential's
//! inject rules say, in its phase, in the declared header and format; a sentinel seen
//! anywhere else is an exfiltration attempt and the request is refused.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, RwLock};

use capgate_policy::Phase;
use capgate_policy::pattern::normalize_host;
use capgate_spec::caps::credential::Credential;

use crate::h1::Header;
use crate::mask::Mask;
use crate::secrets::Secret;

/// One place a secret is added.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Injection {
    pub service: String,
    pub phase: Phase,
    /// The inject domain's host, normalized.
    pub domain: String,
    /// The inject domain's port (`api.example.com:8443`): the secret goes to that port
    /// only. `None`: any port the rules let through.
    pub port: Option<u16>,
    /// The header written (`Authorization` by default).
    pub header: String,
    /// The value format with one `%s` (`Bearer %s` by default); unused for basic.
    pub format: String,
    /// `scheme: basic`: `Basic base64(username:secret)`.
    pub basic_username: Option<String>,
}

/// What [`Broker::apply`] wrote into a request.
#[derive(Debug, Default)]
pub struct Injected {
    /// The services whose secret was added.
    pub services: Vec<String>,
    /// Those secrets as they left (for `scheme: basic` also the base64 text), to be masked
    /// in the response; `None` when nothing (long enough) was added.
    pub mask: Option<Arc<Mask>>,
}

/// Why a request was refused by the broker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Exfiltration {
    /// The service whose sentinel was found.
    pub service: String,
    /// Where it was found (a header name, or `request target`); for an echo, the method.
    pub place: String,
    /// Not a sentinel sent out but a request the server answers with itself (TRACE),
    /// credential included, where the credential is injected.
    pub echo: bool,
}

impl Exfiltration {
    pub fn message(&self, host: &str) -> String {
        if self.echo {
            return format!(
                "`{}` asks `{host}` to send the request back, with the `{}` credential capgate adds there: refused where a credential is injected",
                self.place, self.service
            );
        }
        format!(
            "the `{}` credential's sentinel was sent to `{host}` in {}, where that credential is not injected",
            self.service, self.place
        )
    }
}

/// The broker of one sandbox.
#[derive(Clone, Default)]
pub struct Broker {
    injections: Vec<Injection>,
    /// sentinel → service
    sentinels: Vec<(String, String)>,
    /// The sentinels' finder for streams (`cleartext`).
    scan: Option<Arc<crate::cleartext::SentinelScan>>,
    /// The host-side secrets by service, replaced as a whole when the user sets or
    /// removes one while the sandbox runs ([`Broker::replace_secrets`]).
    secrets: Arc<RwLock<Arc<BTreeMap<String, Secret>>>>,
    /// The masks made for the secrets requests carried, by those secrets: making one costs
    /// a fraction of a millisecond, and the same few serve every request. Emptied when the
    /// secrets change.
    masks: Arc<Mutex<KeptMasks>>,
}

/// Masks by the secrets they were made for (`None`: too short to mask).
type KeptMasks = BTreeMap<Vec<String>, Option<Arc<Mask>>>;

/// How many masks [`Broker`] keeps before it starts over.
const MASKS_KEPT: usize = 64;

impl std::fmt::Debug for Broker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Broker")
            .field("injections", &self.injections)
            .field(
                "services_with_sentinels",
                &self.sentinels.iter().map(|(_, s)| s).collect::<Vec<_>>(),
            )
            .field("secrets", &self.secrets().keys().collect::<Vec<_>>())
            .finish()
    }
}

impl Broker {
    /// Builds the broker from a composition's credentials, the sandbox's sentinels (by
    /// service) and the host-side secrets (by service).
    pub fn new(
        credentials: &[Credential],
        sentinels: &BTreeMap<String, String>,
        secrets: BTreeMap<String, Secret>,
    ) -> Broker {
        let mut injections = Vec::new();
        for c in credentials {
            let Some(api) = &c.api_key else { continue };
            for phase in &c.phases {
                for rule in &api.inject {
                    // A domain whose host or port cannot be read gets nothing (fail closed).
                    let Some((domain, port)) = inject_destination(&rule.domain) else {
                        continue;
                    };
                    let basic = rule.is_basic();
                    injections.push(Injection {
                        service: c.service.clone(),
                        phase: *phase,
                        domain,
                        port,
                        header: rule.header_or_default().to_owned(),
                        format: rule.format_or_default().to_owned(),
                        basic_username: basic.then(|| rule.username.clone().unwrap_or_default()),
                    });
                }
            }
        }
        let sentinels: Vec<(String, String)> = sentinels
            .iter()
            .map(|(service, sentinel)| (sentinel.clone(), service.clone()))
            .collect();
        Broker {
            injections,
            scan: crate::cleartext::SentinelScan::new(&sentinels).map(Arc::new),
            sentinels,
            secrets: Arc::new(RwLock::new(Arc::new(secrets))),
            masks: Arc::new(Mutex::new(BTreeMap::new())),
        }
    }

    /// The secrets in force now.
    fn secrets(&self) -> Arc<BTreeMap<String, Secret>> {
        match self.secrets.read() {
            Ok(s) => Arc::clone(&s),
            Err(poisoned) => Arc::clone(&poisoned.into_inner()),
        }
    }

    /// Puts `secrets` in force for every later request (`capgate secret set` or `rm`
    /// while the sandbox runs): a removed secret is no longer added anywhere.
    pub fn replace_secrets(&self, secrets: BTreeMap<String, Secret>) {
        let secrets = Arc::new(secrets);
        match self.secrets.write() {
            Ok(mut s) => *s = secrets,
            Err(poisoned) => *poisoned.into_inner() = secrets,
        }
        self.masks_kept().clear();
    }

    /// The injections that apply to `host` (normalized) on `port` in `phase`.
    fn injections_for<'a>(
        &'a self,
        (host, port): (&'a str, u16),
        phase: Phase,
    ) -> impl Iterator<Item = &'a Injection> {
        self.injections.iter().filter(move |i| {
            i.phase == phase && i.domain == host && i.port.is_none_or(|p| p == port)
        })
    }

    /// Whether requests to `host` on `port` must be seen (TLS intercepted) so a secret
    /// can be added.
    pub fn intercepts(&self, dest: (&str, u16), phase: Phase) -> bool {
        self.injections_for(dest, phase).next().is_some()
    }

    /// The finder of this sandbox's sentinels in a stream (made once, with the broker);
    /// `None` without sentinels, or where it could not be made (then a stream it would
    /// watch is refused).
    pub(crate) fn sentinel_scan(&self) -> Option<&crate::cleartext::SentinelScan> {
        self.scan.as_deref()
    }

    /// Whether any sentinel exists (so cleartext requests are worth scanning).
    pub fn has_sentinels(&self) -> bool {
        !self.sentinels.is_empty()
    }

    /// The service whose sentinel occurs (in any letter case) in `bytes`, if any: for the
    /// places no credential is ever injected into, like a host name.
    pub fn sentinel_in(&self, bytes: &[u8]) -> Option<&str> {
        self.sentinels
            .iter()
            .find(|(sentinel, _)| contains(bytes, sentinel.as_bytes()))
            .map(|(_, service)| service.as_str())
    }

    /// Judges and rewrites one request to `dest` (host normalized, and port) in `phase`:
    /// refuses a sentinel of a credential that is not injected here; then, on a TLS upstream
    /// only (a secret never travels in clear), writes each applicable credential's header.
    /// Returns what it wrote: the services, and the mask for the response (see
    /// [`crate::mask`]). A request that carries a secret asks for an uncompressed response
    /// (`Accept-Encoding: identity`), so that a reflected secret can be masked.
    ///
    /// A sentinel is looked for, in any letter case, in the method, the target (as sent and
    /// after each of up to four rounds of percent-decoding), every header name, and every
    /// header value except the header its credential is injected into here.
    pub fn apply(
        &self,
        dest: (&str, u16),
        phase: Phase,
        method: &str,
        target: &str,
        headers: &mut Vec<Header>,
        tls_upstream: bool,
    ) -> Result<Injected, Exfiltration> {
        let secrets = self.secrets();
        let injected_here = self.injected_here(&secrets, dest, phase, tls_upstream);
        self.scan(&injected_here, method, target, headers)?;
        // TRACE (and TRACK, its IIS spelling) is answered with the request as the server
        // received it: the real secret would come back to the workload.
        if (method == "TRACE" || method == "TRACK")
            && let Some(inj) = injected_here
                .iter()
                .find(|i| secrets.contains_key(&i.service))
        {
            return Err(Exfiltration {
                service: inj.service.clone(),
                place: method.to_owned(),
                echo: true,
            });
        }
        let mut done = Vec::new();
        let mut sent: Vec<String> = Vec::new();
        for inj in injected_here {
            let Some(secret) = secrets.get(&inj.service) else {
                continue;
            };
            sent.push(secret.expose().to_owned());
            let value = match &inj.basic_username {
                Some(user) => {
                    let encoded = base64(format!("{user}:{}", secret.expose()).as_bytes());
                    sent.push(encoded.clone());
                    format!("Basic {encoded}")
                }
                None => inj.format.replacen("%s", secret.expose(), 1),
            };
            headers.retain(|h| !h.is(&inj.header));
            headers.push(Header::new(inj.header.clone(), value.into_bytes()));
            done.push(inj.service.clone());
        }
        if !done.is_empty() {
            // An answer must come readable to be masked: no compression (without
            // `grpc-accept-encoding` a gRPC server compresses no message), and no
            // WebSocket extension (permessage-deflate).
            headers.retain(|h| {
                !h.is("accept-encoding")
                    && !h.is("grpc-accept-encoding")
                    && !h.is("sec-websocket-extensions")
            });
            headers.push(Header::new("Accept-Encoding", b"identity".to_vec()));
        }
        Ok(Injected {
            services: done,
            mask: self.mask_for(&secrets, sent),
        })
    }

    fn masks_kept(&self) -> std::sync::MutexGuard<'_, KeptMasks> {
        self.masks
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The mask for the secrets one request carried (read from `secrets`): made once, then
    /// kept while those secrets are the ones in force, so that a secret removed since is
    /// not kept in a mask.
    fn mask_for(
        &self,
        secrets: &Arc<BTreeMap<String, Secret>>,
        sent: Vec<String>,
    ) -> Option<Arc<Mask>> {
        if sent.is_empty() {
            return None;
        }
        if let Some(mask) = self.masks_kept().get(&sent) {
            return mask.clone();
        }
        // Made outside the lock: it takes a fraction of a millisecond.
        let mask = Mask::new(&sent).map(Arc::new);
        let mut kept = self.masks_kept();
        if Arc::ptr_eq(secrets, &self.secrets()) {
            if kept.len() >= MASKS_KEPT {
                kept.clear();
            }
            kept.insert(sent, mask.clone());
        }
        mask
    }

    /// [`Broker::apply`]'s judgement alone, for a request that will not be sent (the rules
    /// refused it): whether it carries a sentinel where its credential is not injected.
    pub fn check(
        &self,
        dest: (&str, u16),
        phase: Phase,
        method: &str,
        target: &str,
        headers: &[Header],
        tls_upstream: bool,
    ) -> Result<(), Exfiltration> {
        let injected_here = self.injected_here(&self.secrets(), dest, phase, tls_upstream);
        self.scan(&injected_here, method, target, headers)
    }

    /// The credentials whose secret (one of `secrets`) goes into requests to `dest` in
    /// `phase` (none over cleartext: a secret never travels in clear).
    fn injected_here<'a>(
        &'a self,
        secrets: &BTreeMap<String, Secret>,
        dest: (&'a str, u16),
        phase: Phase,
        tls_upstream: bool,
    ) -> Vec<&'a Injection> {
        if tls_upstream {
            self.injections_for(dest, phase)
                .filter(|i| secrets.contains_key(&i.service))
                .collect()
        } else {
            Vec::new()
        }
    }

    /// Refuses a sentinel anywhere but the header its credential is injected into here.
    fn scan(
        &self,
        injected_here: &[&Injection],
        method: &str,
        target: &str,
        headers: &[Header],
    ) -> Result<(), Exfiltration> {
        let allowed = |service: &str| injected_here.iter().any(|i| i.service == service);
        // The target as sent and as each round of percent-decoding leaves it (until nothing
        // changes, at most 4 rounds); nothing to decode without sentinels or escapes.
        let mut targets = vec![target.as_bytes().to_vec()];
        while !self.sentinels.is_empty() && targets.len() <= 4 {
            let Some(last) = targets.last().filter(|t| t.contains(&b'%')) else {
                break;
            };
            let next = percent_decode(last);
            if &next == last {
                break;
            }
            targets.push(next);
        }
        for (sentinel, service) in &self.sentinels {
            let sentinel = sentinel.as_bytes();
            let refuse = |place: String| {
                Err(Exfiltration {
                    service: service.clone(),
                    place,
                    echo: false,
                })
            };
            if contains(method.as_bytes(), sentinel) {
                return refuse("the request method".to_owned());
            }
            if targets.iter().any(|t| contains(t, sentinel)) {
                return refuse("the request target".to_owned());
            }
            for h in headers.iter() {
                if contains(h.name.as_bytes(), sentinel) {
                    return refuse("a header name".to_owned());
                }
                if contains(&h.value, sentinel) {
                    let header_is_replaced = injected_here
                        .iter()
                        .any(|i| i.service == *service && h.is(&i.header));
                    if !(allowed(service) && header_is_replaced) {
                        return refuse(format!("the `{}` header", h.name));
                    }
                }
            }
        }
        Ok(())
    }
}

/// An inject domain's host (normalized) and port, if it names one: `api.example.com`,
/// `api.example.com:8443`. `None` when either cannot be read (an IP literal in brackets,
/// `host:`, `host:https`, port 0).
fn inject_destination(domain: &str) -> Option<(String, Option<u16>)> {
    let (host, port) = match domain.split_once(':') {
        Some((host, port)) => {
            let valid = !port.is_empty() && port.bytes().all(|b| b.is_ascii_digit());
            (
                host,
                Some(port.parse::<u16>().ok().filter(|p| valid && *p != 0)?),
            )
        }
        None => (domain, None),
    };
    Some((normalize_host(host).ok()?, port))
}

/// Whether `needle` occurs in `haystack`, ASCII letters compared without case.
fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    !needle.is_empty()
        && haystack
            .windows(needle.len())
            .any(|w| w.eq_ignore_ascii_case(needle))
}

/// `%HH` escapes decoded (other bytes, and malformed escapes, kept as they are).
pub(crate) fn percent_decode(input: &[u8]) -> Vec<u8> {
    let hex = |at: usize| input.get(at).copied().and_then(crate::h1::hex_value);
    let mut out = Vec::with_capacity(input.len());
    let mut i = 0;
    while i < input.len() {
        if input[i] == b'%'
            && let (Some(hi), Some(lo)) = (hex(i + 1), hex(i + 2))
        {
            out.push(hi * 16 + lo);
            i += 3;
            continue;
        }
        out.push(input[i]);
        i += 1;
    }
    out
}

/// Standard base64 with padding.
fn base64(input: &[u8]) -> String {
    const T: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(input.len().div_ceil(3) * 4);
    for chunk in input.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for (i, shift) in [18u32, 12, 6, 0].into_iter().enumerate() {
            if i <= chunk.len() {
                out.push(char::from(T[((n >> shift) & 63) as usize]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::panic, reason = "tests")]
    use super::*;
    use capgate_spec::caps::Capability;

    fn credential(yaml: &str) -> Credential {
        let text = format!(
            "schemaVersion: \"3\"\nkind: mixin\ncapabilities:\n  - type: com.docker.sandbox/credential@1\n    config:\n{yaml}"
        );
        let loaded = capgate_spec::load(
            text.as_bytes(),
            &capgate_spec::Options {
                declarations_only: true,
                ..Default::default()
            },
        );
        assert!(loaded.is_valid(), "{:?}", loaded.diagnostics);
        match &loaded.descriptor.unwrap().declared_entries()[0]
            .1
            .capability
        {
            Some(Capability::Credential(c)) => c.clone(),
            _ => panic!("credential"),
        }
    }

    fn broker() -> Broker {
        let gh = credential(
            "      service: github\n      phase: runtime\n      apiKey: {name: GH_TOKEN, inject: [{domain: api.github.com}, {domain: \"uploads.github.com:443\"}]}\n",
        );
        let basic = credential(
            "      service: host\n      phase: [install, runtime]\n      apiKey: {inject: [{domain: git.example.com, scheme: basic, username: agent}]}\n",
        );
        let sentinels: BTreeMap<String, String> =
            [("github".to_owned(), "SENTINEL-GH".to_owned())].into();
        let secrets: BTreeMap<String, Secret> = [
            ("github".to_owned(), Secret::new("ghp_real".into())),
            ("host".to_owned(), Secret::new("pw".into())),
        ]
        .into();
        Broker::new(&[gh, basic], &sentinels, secrets)
    }

    /// A runtime `GET /` over TLS to `dest`: what the broker wrote.
    fn inject(
        b: &Broker,
        dest: (&str, u16),
        h: &mut Vec<Header>,
    ) -> Result<Injected, Exfiltration> {
        b.apply(dest, Phase::Runtime, "GET", "/", h, true)
    }

    /// [`inject`]'s services.
    fn get(
        b: &Broker,
        dest: (&str, u16),
        h: &mut Vec<Header>,
    ) -> Result<Vec<String>, Exfiltration> {
        inject(b, dest, h).map(|injected| injected.services)
    }

    fn auth(headers: &[Header]) -> Option<String> {
        headers
            .iter()
            .find(|h| h.is("authorization"))
            .map(|h| String::from_utf8_lossy(&h.value).into_owned())
    }

    #[test]
    fn a_sentinel_is_found_in_every_place_and_spelling() {
        let b = broker();
        let refused = |method: &str, target: &str, headers: Vec<Header>| {
            let mut h = headers;
            b.apply(
                ("evil.example", 443),
                Phase::Runtime,
                method,
                target,
                &mut h,
                true,
            )
            .err()
            .map(|e| e.place)
        };
        // Each disguise next to its harmless twin.
        for (what, method, target, headers) in [
            ("method", "SENTINEL-GH", "/", vec![]),
            ("encoded target", "GET", "/?t=%53ENTINEL%2DGH", vec![]),
            (
                "twice-encoded target",
                "GET",
                "/?t=%2553ENTINEL%252DGH",
                vec![],
            ),
            ("lower-case target", "GET", "/?t=sentinel-gh", vec![]),
            (
                "header name",
                "GET",
                "/",
                vec![Header::new("X-SENTINEL-GH", "1")],
            ),
            (
                "lower-case header value",
                "GET",
                "/",
                vec![Header::new("X-A", "sentinel-gh")],
            ),
        ] {
            assert!(refused(method, target, headers).is_some(), "{what}");
        }
        for (what, method, target, headers) in [
            ("method", "GET", "/", vec![]),
            ("encoded target", "GET", "/?t=%53ENTINEL%2DGX", vec![]),
            ("malformed escape", "GET", "/?t=%zz%5", vec![]),
            ("header", "GET", "/", vec![Header::new("X-SENTINEL", "GH")]),
        ] {
            assert_eq!(refused(method, target, headers), None, "{what}");
        }
        assert_eq!(percent_decode(b"a%41%4a%zz%4"), b"aAJ%zz%4");
    }

    #[test]
    fn sentinel_is_swapped_on_the_inject_domain() {
        let b = broker();
        assert!(b.intercepts(("api.github.com", 443), Phase::Runtime));
        assert!(!b.intercepts(("api.github.com", 443), Phase::Install));
        let mut h = vec![Header::new("Authorization", "Bearer SENTINEL-GH")];
        assert_eq!(
            b.apply(
                ("api.github.com", 443),
                Phase::Runtime,
                "GET",
                "/user",
                &mut h,
                true
            )
            .unwrap()
            .services,
            vec!["github"]
        );
        assert_eq!(auth(&h).as_deref(), Some("Bearer ghp_real"));
        let mut h = vec![];
        get(&b, ("uploads.github.com", 443), &mut h).unwrap();
        assert_eq!(
            auth(&h).as_deref(),
            Some("Bearer ghp_real"),
            "inject-only: the header is added"
        );
    }

    /// `domain: host:port` sends the secret to that port only; a bare host, to any port
    /// the rules let through. A domain whose port cannot be read sends it nowhere.
    #[test]
    fn an_inject_domain_with_a_port_gets_the_secret_on_that_port_only() {
        let b = broker();
        assert!(b.intercepts(("uploads.github.com", 443), Phase::Runtime));
        assert!(!b.intercepts(("uploads.github.com", 8443), Phase::Runtime));
        assert!(b.intercepts(("api.github.com", 8443), Phase::Runtime));
        let mut h = vec![Header::new("Authorization", "Bearer SENTINEL-GH")];
        let e = get(&b, ("uploads.github.com", 8443), &mut h).unwrap_err();
        assert_eq!(e.service, "github");
        assert_eq!(auth(&h).as_deref(), Some("Bearer SENTINEL-GH"));
        let mut h = vec![Header::new("Authorization", "Bearer SENTINEL-GH")];
        get(&b, ("uploads.github.com", 443), &mut h).unwrap();
        assert_eq!(auth(&h).as_deref(), Some("Bearer ghp_real"));

        for (domain, read) in [
            ("api.example.com", Some(("api.example.com", None))),
            (
                "API.Example.com:8443",
                Some(("api.example.com", Some(8443))),
            ),
            ("api.example.com:0", None),
            ("api.example.com:", None),
            ("api.example.com:https", None),
            ("api.example.com:+443", None),
            ("api.example.com:65536", None),
            ("api.example.com:443:1", None),
            ("[2001:db8::1]:443", None),
        ] {
            let got = inject_destination(domain);
            let got = got.as_ref().map(|(h, p)| (h.as_str(), *p));
            assert_eq!(got, read, "{domain}");
        }
    }

    /// `capgate secret rm` (or `set`) while the sandbox runs is in force for the next
    /// request: a removed secret is added nowhere and its sentinel is refused again.
    #[test]
    fn replaced_secrets_are_in_force_for_the_next_request() {
        let b = broker();
        let shared = b.clone();
        let injected = |h: &mut Vec<Header>| get(&b, ("api.github.com", 443), h);
        shared.replace_secrets(BTreeMap::new());
        let mut h = vec![Header::new("Authorization", "Bearer SENTINEL-GH")];
        assert!(
            injected(&mut h).is_err(),
            "no secret: the sentinel stays a leak"
        );
        let mut h = vec![];
        assert!(injected(&mut h).unwrap().is_empty());
        assert_eq!(auth(&h), None);
        shared.replace_secrets([("github".to_owned(), Secret::new("ghp_rotated".into()))].into());
        let mut h = vec![Header::new("Authorization", "Bearer SENTINEL-GH")];
        assert_eq!(injected(&mut h).unwrap(), vec!["github"]);
        assert_eq!(auth(&h).as_deref(), Some("Bearer ghp_rotated"));
    }

    /// A method the server answers with the request itself never carries the real secret
    /// (TRACE, and IIS's TRACK); its twin, GET, does.
    #[test]
    fn echoing_methods_to_an_inject_domain_are_refused() {
        let b = broker();
        for method in ["TRACE", "TRACK"] {
            let mut h = vec![];
            let refused = b.apply(
                ("api.github.com", 443),
                Phase::Runtime,
                method,
                "/",
                &mut h,
                true,
            );
            assert!(refused.is_err_and(|e| e.echo), "{method}");
            assert_eq!(auth(&h), None, "{method}");
        }
        let mut h = vec![];
        get(&b, ("api.github.com", 443), &mut h).unwrap();
        assert_eq!(auth(&h).as_deref(), Some("Bearer ghp_real"));
    }

    #[test]
    fn sentinel_elsewhere_is_exfiltration() {
        let b = broker();
        let mut h = vec![Header::new("Authorization", "Bearer SENTINEL-GH")];
        let e = get(&b, ("evil.example", 443), &mut h).unwrap_err();
        assert_eq!(e.service, "github");
        assert!(e.message("evil.example").contains("not injected"));
        let mut h = vec![Header::new("X-Leak", "SENTINEL-GH")];
        assert!(
            get(&b, ("api.github.com", 443), &mut h).is_err(),
            "only the injected header may carry it"
        );
        let mut h = vec![];
        assert!(
            b.apply(
                ("evil.example", 443),
                Phase::Runtime,
                "GET",
                "/?t=SENTINEL-GH",
                &mut h,
                true
            )
            .is_err()
        );
        // In the wrong phase the inject domain is just another host.
        let mut h = vec![Header::new("Authorization", "Bearer SENTINEL-GH")];
        assert!(
            b.apply(
                ("api.github.com", 443),
                Phase::Install,
                "GET",
                "/",
                &mut h,
                true
            )
            .is_err()
        );
    }

    #[test]
    fn no_secret_in_clear_and_basic_scheme() {
        let b = broker();
        let mut h = vec![Header::new("Authorization", "Bearer SENTINEL-GH")];
        assert!(
            b.apply(
                ("api.github.com", 443),
                Phase::Runtime,
                "GET",
                "/",
                &mut h,
                false
            )
            .is_err(),
            "never swapped over cleartext"
        );
        let mut h = vec![];
        assert!(
            b.apply(
                ("api.github.com", 443),
                Phase::Runtime,
                "GET",
                "/",
                &mut h,
                false
            )
            .unwrap()
            .services
            .is_empty()
        );
        let mut h = vec![];
        b.apply(
            ("git.example.com", 443),
            Phase::Install,
            "GET",
            "/",
            &mut h,
            true,
        )
        .unwrap();
        assert_eq!(auth(&h).as_deref(), Some("Basic YWdlbnQ6cHc="));
        assert!(!format!("{b:?}").contains("ghp_real"));
    }

    /// What was written into a request is what its answer is masked of: the secret, and
    /// for `scheme: basic` the base64 text it left as (its secret alone is too short to
    /// mask). The request asks for an uncompressed answer, so a reflection can be seen.
    /// The twin: a request nothing is injected into keeps its encodings and gets no mask.
    #[test]
    fn what_was_injected_is_what_the_answer_is_masked_of() {
        let b = broker();
        let gh = Secret::new("ghp_real_and_long_enough".into());
        b.replace_secrets(
            [
                ("github".to_owned(), gh),
                ("host".to_owned(), Secret::new("pw".into())),
            ]
            .into(),
        );
        let mut h = vec![Header::new("Accept-Encoding", "gzip, br")];
        let injected = inject(&b, ("api.github.com", 443), &mut h).unwrap();
        assert_eq!(injected.services, ["github"]);
        let mask = injected.mask.unwrap();
        let mut echo = format!("you sent: {}", auth(&h).unwrap()).into_bytes();
        assert_eq!(mask.apply(&mut echo), 1);
        assert_eq!(
            String::from_utf8(echo).unwrap(),
            "you sent: Bearer [capgate:masked]********"
        );
        let encodings: Vec<_> = h.iter().filter(|h| h.is("accept-encoding")).collect();
        assert_eq!(encodings.len(), 1);
        assert_eq!(encodings[0].value, b"identity");

        let mut h = vec![];
        let basic = inject(&b, ("git.example.com", 443), &mut h).unwrap();
        let mut echo = auth(&h).unwrap().into_bytes();
        assert_eq!(basic.mask.unwrap().apply(&mut echo), 1);
        assert_eq!(echo, b"Basic [capgate:mas");

        let mut h = vec![Header::new("Accept-Encoding", "gzip, br")];
        let none = inject(&b, ("example.org", 443), &mut h).unwrap();
        assert!(none.services.is_empty() && none.mask.is_none());
        assert_eq!(h[0].value, b"gzip, br");
    }

    /// A mask is made once for the secrets a request carries and kept for the next; a
    /// rotated secret gets a new one, which masks the new value.
    #[test]
    fn masks_are_kept_until_the_secrets_change() {
        let b = broker();
        let first = inject(&b, ("api.github.com", 443), &mut vec![]).unwrap();
        let again = inject(&b, ("api.github.com", 443), &mut vec![]).unwrap();
        assert!(Arc::ptr_eq(
            first.mask.as_ref().unwrap(),
            again.mask.as_ref().unwrap()
        ));
        b.replace_secrets([("github".to_owned(), Secret::new("ghp_rotated_value".into()))].into());
        let rotated = inject(&b, ("api.github.com", 443), &mut vec![]).unwrap();
        let mask = rotated.mask.unwrap();
        let mut echo = b"ghp_rotated_value".to_vec();
        assert_eq!(mask.apply(&mut echo), 1, "the new secret is masked");
    }

    #[test]
    fn base64_matches_rfc4648() {
        for (i, o) in [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("fooba", "Zm9vYmE="),
            ("foobar", "Zm9vYmFy"),
        ] {
            assert_eq!(base64(i.as_bytes()), o);
        }
    }
}
