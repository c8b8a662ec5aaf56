//! The gateway's TLS pieces: the local CA on disk, minted leaves verified by a real rustls
//! client, the ClientHello peek on a real hello, and the upstream client configuration.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "tests"
)]

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use capgate_gateway::tls::{
    CertificateAuthority, MAX_PEEK_LEN, SniPeek, TlsError, install_crypto_provider, peek_sni,
    sni_matches_authority, upstream_client_config,
};
use proptest::prelude::*;
use rustls::pki_types::{CertificateDer, ServerName};
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::{TlsAcceptor, TlsConnector};
use x509_parser::extensions::{GeneralName, ParsedExtension};

fn mode(path: &Path) -> u32 {
    fs::metadata(path).unwrap().permissions().mode() & 0o7777
}

fn new_ca() -> (tempfile::TempDir, CertificateAuthority) {
    let tmp = tempfile::tempdir().unwrap();
    let ca = CertificateAuthority::load_or_create(&tmp.path().join("ca")).unwrap();
    (tmp, ca)
}

/// A client that trusts only the given CA certificate.
fn client_trusting(ca: &CertificateDer<'static>, alpn: &[&[u8]]) -> Arc<ClientConfig> {
    install_crypto_provider();
    let mut roots = RootCertStore::empty();
    roots.add(ca.clone()).unwrap();
    let mut config = ClientConfig::builder()
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Arc::new(config)
}

/// Runs a TLS handshake between `server` and `client` over an in-memory stream and echoes
/// one message. Returns the client's error, or the negotiated ALPN protocol.
async fn handshake(
    server: Arc<ServerConfig>,
    client: Arc<ClientConfig>,
    name: ServerName<'static>,
) -> Result<Option<Vec<u8>>, std::io::Error> {
    let (client_io, server_io) = tokio::io::duplex(64 * 1024);
    let server_task = tokio::spawn(async move {
        let mut tls = TlsAcceptor::from(server).accept(server_io).await?;
        let mut buf = [0u8; 5];
        tls.read_exact(&mut buf).await?;
        tls.write_all(&buf).await?;
        tls.shutdown().await?;
        Ok::<_, std::io::Error>(())
    });
    let result = async {
        let mut tls = TlsConnector::from(client).connect(name, client_io).await?;
        tls.write_all(b"hello").await?;
        let mut buf = [0u8; 5];
        tls.read_exact(&mut buf).await?;
        assert_eq!(&buf, b"hello");
        Ok(tls.get_ref().1.alpn_protocol().map(<[u8]>::to_vec))
    }
    .await;
    // The server fails too when the client rejects its certificate; only the client's view
    // matters here.
    let _server_result = server_task.await.unwrap();
    result
}

fn dns(name: &str) -> ServerName<'static> {
    ServerName::try_from(name.to_owned()).unwrap()
}

// ---------------------------------------------------------------------------------------
// The CA on disk

#[test]
fn ca_is_created_with_owner_only_key_and_directory() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("state").join("ca");
    let ca = CertificateAuthority::load_or_create(&dir).unwrap();

    assert_eq!(mode(&dir), 0o700);
    assert_eq!(mode(&tmp.path().join("state")), 0o700);
    assert_eq!(mode(&dir.join("ca.pem")), 0o644);
    assert_eq!(mode(&dir.join("ca-key.pem")), 0o600);
    assert_eq!(ca.cert_path(), dir.join("ca.pem"));
    assert_eq!(
        fs::read_to_string(dir.join("ca.pem")).unwrap(),
        ca.cert_pem()
    );
    assert!(ca.cert_pem().starts_with("-----BEGIN CERTIFICATE-----"));
    let mut names: Vec<_> = fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(names, ["ca-key.pem", "ca.pem"], "no temporary file left");

    // Debug never shows the key.
    let key_pem = fs::read_to_string(dir.join("ca-key.pem")).unwrap();
    let debug = format!("{ca:?}");
    let key_body = key_pem.lines().nth(1).unwrap();
    assert!(!debug.contains(key_body), "{debug}");
    assert!(!debug.contains("PRIVATE"), "{debug}");
}

#[test]
fn ca_certificate_has_the_specified_shape() {
    let (_tmp, ca) = new_ca();
    let (_, cert) = x509_parser::parse_x509_certificate(ca.cert_der()).unwrap();
    let cn = cert.subject().iter_common_name().next().unwrap();
    assert_eq!(cn.as_str().unwrap(), "capgate local CA");
    assert_eq!(cert.subject(), cert.issuer());

    let bc = cert.basic_constraints().unwrap().unwrap().value;
    assert!(bc.ca);
    assert_eq!(bc.path_len_constraint, Some(0));
    let ku = cert.key_usage().unwrap().unwrap().value;
    assert!(ku.key_cert_sign() && ku.crl_sign());
    assert!(!ku.digital_signature());
    assert_eq!(
        cert.public_key()
            .algorithm
            .parameters
            .as_ref()
            .unwrap()
            .as_oid()
            .unwrap(),
        x509_parser::oid_registry::OID_EC_P256
    );

    let now = time::OffsetDateTime::now_utc().unix_timestamp();
    let not_before = cert.validity().not_before.timestamp();
    let not_after = cert.validity().not_after.timestamp();
    let day = 24 * 3600;
    assert!((now - not_before - day).abs() < 60, "backdated a day");
    assert!((not_after - now - 3650 * day).abs() < 60, "ten years");
}

#[test]
fn reload_gives_the_same_certificate() {
    let tmp = tempfile::tempdir().unwrap();
    let first = CertificateAuthority::load_or_create(tmp.path()).unwrap();
    let second = CertificateAuthority::load_or_create(tmp.path()).unwrap();
    assert_eq!(first.cert_der(), second.cert_der());
    assert_eq!(first.cert_pem(), second.cert_pem());
}

#[test]
fn key_readable_by_others_is_refused() {
    for bad_mode in [0o644, 0o640, 0o604, 0o620, 0o602] {
        let tmp = tempfile::tempdir().unwrap();
        CertificateAuthority::load_or_create(tmp.path()).unwrap();
        let key = tmp.path().join("ca-key.pem");
        fs::set_permissions(&key, fs::Permissions::from_mode(bad_mode)).unwrap();
        let err = CertificateAuthority::load_or_create(tmp.path()).unwrap_err();
        assert!(
            matches!(&err, TlsError::CaKeyReadableByOthers { path, mode } if *path == key && *mode == bad_mode),
            "{err:?}"
        );
        assert!(
            err.to_string()
                .ends_with("is readable by others; fix its mode or remove it"),
            "{err}"
        );
        // A stricter mode than 0600 is fine.
        fs::set_permissions(&key, fs::Permissions::from_mode(0o400)).unwrap();
        CertificateAuthority::load_or_create(tmp.path()).unwrap();
    }
}

#[test]
fn mismatched_certificate_and_key_are_refused() {
    let a = tempfile::tempdir().unwrap();
    let b = tempfile::tempdir().unwrap();
    CertificateAuthority::load_or_create(a.path()).unwrap();
    CertificateAuthority::load_or_create(b.path()).unwrap();
    fs::copy(b.path().join("ca-key.pem"), a.path().join("ca-key.pem")).unwrap();
    let err = CertificateAuthority::load_or_create(a.path()).unwrap_err();
    assert!(matches!(err, TlsError::CaKeyMismatch { .. }), "{err:?}");
}

#[test]
fn half_a_ca_is_refused_not_replaced() {
    let tmp = tempfile::tempdir().unwrap();
    CertificateAuthority::load_or_create(tmp.path()).unwrap();
    fs::remove_file(tmp.path().join("ca.pem")).unwrap();
    let err = CertificateAuthority::load_or_create(tmp.path()).unwrap_err();
    assert!(matches!(err, TlsError::IncompleteCa { .. }), "{err:?}");
    assert!(tmp.path().join("ca-key.pem").exists());
    assert!(!tmp.path().join("ca.pem").exists());
}

#[test]
fn garbage_ca_files_are_errors() {
    let tmp = tempfile::tempdir().unwrap();
    CertificateAuthority::load_or_create(tmp.path()).unwrap();
    let good_cert = fs::read(tmp.path().join("ca.pem")).unwrap();

    fs::write(tmp.path().join("ca.pem"), b"not a certificate").unwrap();
    let err = CertificateAuthority::load_or_create(tmp.path()).unwrap_err();
    assert!(matches!(err, TlsError::CaCertificatePem { .. }), "{err:?}");

    fs::write(tmp.path().join("ca.pem"), &good_cert).unwrap();
    let key = tmp.path().join("ca-key.pem");
    fs::write(
        &key,
        b"-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n",
    )
    .unwrap();
    let err = CertificateAuthority::load_or_create(tmp.path()).unwrap_err();
    assert!(matches!(err, TlsError::CaKey { .. }), "{err:?}");

    // A leaf is not a CA, even with its own key.
    let leaf = rcgen::generate_simple_self_signed(vec!["leaf.example".to_owned()]).unwrap();
    fs::write(tmp.path().join("ca.pem"), leaf.cert.pem()).unwrap();
    fs::write(&key, leaf.signing_key.serialize_pem()).unwrap();
    let err = CertificateAuthority::load_or_create(tmp.path()).unwrap_err();
    assert!(matches!(err, TlsError::NotACa { .. }), "{err:?}");
}

#[test]
fn ca_is_shareable_across_tasks() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<CertificateAuthority>();
}

// ---------------------------------------------------------------------------------------
// Minted leaves

#[tokio::test]
async fn leaf_verifies_for_its_host_only() {
    let (_tmp, ca) = new_ca();
    let server = ca.server_config_for("api.example.com").unwrap();
    let client = client_trusting(ca.cert_der(), &[b"http/1.1"]);

    let alpn = handshake(server.clone(), client.clone(), dns("api.example.com"))
        .await
        .unwrap();
    assert_eq!(alpn.as_deref(), Some(&b"http/1.1"[..]));

    let err = handshake(server, client, dns("other.example.com"))
        .await
        .unwrap_err();
    assert!(
        err.to_string().contains("certificate not valid for name"),
        "{err}"
    );
}

#[tokio::test]
async fn leaf_is_not_trusted_without_the_capgate_ca() {
    let (_tmp, ca) = new_ca();
    let (_other_tmp, other_ca) = new_ca();
    let server = ca.server_config_for("api.example.com").unwrap();
    let client = client_trusting(other_ca.cert_der(), &[]);
    let err = handshake(server, client, dns("api.example.com"))
        .await
        .unwrap_err();
    // Both CAs carry the same name, so rustls tries the other one and finds the signature bad.
    assert!(
        err.to_string()
            .contains("invalid peer certificate: BadSignature"),
        "{err}"
    );
}

#[tokio::test]
async fn leaf_from_a_reloaded_ca_verifies() {
    let tmp = tempfile::tempdir().unwrap();
    let created = CertificateAuthority::load_or_create(tmp.path()).unwrap();
    let loaded = CertificateAuthority::load_or_create(tmp.path()).unwrap();
    let server = loaded.server_config_for("api.example.com").unwrap();
    let client = client_trusting(created.cert_der(), &[]);
    handshake(server, client, dns("api.example.com"))
        .await
        .unwrap();
}

#[tokio::test]
async fn ip_leaf_verifies_over_loopback() {
    let (_tmp, ca) = new_ca();
    let server = ca.server_config_for("127.0.0.1").unwrap();
    let client = client_trusting(ca.cert_der(), &[b"http/1.1"]);

    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server_task = tokio::spawn(async move {
        let (tcp, _) = listener.accept().await.unwrap();
        let mut tls = TlsAcceptor::from(server).accept(tcp).await.unwrap();
        let mut buf = [0u8; 4];
        tls.read_exact(&mut buf).await.unwrap();
        tls.write_all(b"pong").await.unwrap();
        tls.shutdown().await.unwrap();
    });
    let tcp = TcpStream::connect(addr).await.unwrap();
    let name = ServerName::IpAddress(addr.ip().into());
    let mut tls = TlsConnector::from(client).connect(name, tcp).await.unwrap();
    tls.write_all(b"ping").await.unwrap();
    let mut buf = [0u8; 4];
    tls.read_exact(&mut buf).await.unwrap();
    assert_eq!(&buf, b"pong");
    server_task.await.unwrap();
}

#[tokio::test]
async fn leaf_has_the_specified_shape() {
    let (_tmp, ca) = new_ca();
    for (host, want) in [
        ("api.example.com", GeneralNameKind::Dns("api.example.com")),
        ("API.Example.COM.", GeneralNameKind::Dns("api.example.com")),
        ("127.0.0.1", GeneralNameKind::Ip(vec![127, 0, 0, 1])),
        (
            "[::1]",
            GeneralNameKind::Ip([[0u8; 15].as_slice(), &[1]].concat()),
        ),
    ] {
        let config = ca.server_config_for(host).unwrap();
        let name = match &want {
            GeneralNameKind::Dns(name) => dns(name),
            GeneralNameKind::Ip(ip) if ip.len() == 4 => {
                ServerName::IpAddress(std::net::Ipv4Addr::new(ip[0], ip[1], ip[2], ip[3]).into())
            }
            GeneralNameKind::Ip(_) => ServerName::IpAddress(std::net::Ipv6Addr::LOCALHOST.into()),
        };
        let chain = served_chain(config, ca.cert_der(), name).await;
        assert_eq!(chain.len(), 1, "the leaf only");
        let leaf = &chain[0];
        let (_, cert) = x509_parser::parse_x509_certificate(leaf).unwrap();
        assert_eq!(cert.issuer().to_string(), "CN=capgate local CA");
        let san = cert.subject_alternative_name().unwrap().unwrap().value;
        match (&san.general_names[..], &want) {
            ([GeneralName::DNSName(name)], GeneralNameKind::Dns(want)) => assert_eq!(name, want),
            ([GeneralName::IPAddress(ip)], GeneralNameKind::Ip(want)) => assert_eq!(ip, want),
            (other, _) => panic!("{host}: SAN {other:?}"),
        }
        let eku = cert.extended_key_usage().unwrap().unwrap().value;
        assert!(eku.server_auth && !eku.client_auth);
        assert!(!cert.is_ca());
        assert!(cert.extensions().iter().any(|e| matches!(
            e.parsed_extension(),
            ParsedExtension::AuthorityKeyIdentifier(_)
        )));
        let now = time::OffsetDateTime::now_utc().unix_timestamp();
        let not_before = cert.validity().not_before.timestamp();
        let not_after = cert.validity().not_after.timestamp();
        assert!((now - not_before - 3600).abs() < 60, "backdated an hour");
        assert!((not_after - now - 24 * 3600).abs() < 60, "a day");
    }
}

enum GeneralNameKind {
    Dns(&'static str),
    Ip(Vec<u8>),
}

/// The chain a server configuration presents to a client that trusts `ca` and asks for
/// `name`.
async fn served_chain(
    server: Arc<ServerConfig>,
    ca: &CertificateDer<'static>,
    name: ServerName<'static>,
) -> Vec<CertificateDer<'static>> {
    let client = client_trusting(ca, &[]);
    let (client_io, server_io) = tokio::io::duplex(64 * 1024);
    let server_task = tokio::spawn(async move {
        // The client leaves once it has the certificate; the server's view does not matter.
        if let Ok(mut tls) = TlsAcceptor::from(server).accept(server_io).await {
            let _ = tls.shutdown().await;
        }
    });
    let tls = TlsConnector::from(client)
        .connect(name, client_io)
        .await
        .unwrap();
    let chain = tls.get_ref().1.peer_certificates().unwrap().to_vec();
    drop(tls);
    server_task.await.unwrap();
    chain
}

#[test]
fn leaf_for_an_invalid_host_is_an_error() {
    let (_tmp, ca) = new_ca();
    for host in ["", ".", "ab@cd.com", "exa mple.com", "[not-an-ip]", "a..b"] {
        let err = ca.server_config_for(host).unwrap_err();
        assert!(
            matches!(err, TlsError::InvalidHost { .. }),
            "{host}: {err:?}"
        );
    }
}

#[test]
fn cache_returns_the_same_config() {
    let (_tmp, ca) = new_ca();
    let first = ca.server_config_for("api.example.com").unwrap();
    let again = ca.server_config_for("api.example.com").unwrap();
    let other_spelling = ca.server_config_for("API.example.com.").unwrap();
    assert!(Arc::ptr_eq(&first, &again));
    assert!(Arc::ptr_eq(&first, &other_spelling));
    let other = ca.server_config_for("other.example.com").unwrap();
    assert!(!Arc::ptr_eq(&first, &other));
    assert_eq!(ca.leaf_cache().len(), 2);
    assert_eq!(first.alpn_protocols, vec![b"http/1.1".to_vec()]);
}

#[test]
fn cache_is_bounded() {
    let (_tmp, ca) = new_ca();
    let ca = ca.with_leaf_cache_capacity(2);
    let a = ca.server_config_for("a.example").unwrap();
    ca.server_config_for("b.example").unwrap();
    ca.server_config_for("c.example").unwrap();
    assert_eq!(ca.leaf_cache().len(), 2);
    // `a` was first in, so it went first and is minted again.
    let a_again = ca.server_config_for("a.example").unwrap();
    assert!(!Arc::ptr_eq(&a, &a_again));
    assert_eq!(ca.leaf_cache().len(), 2);
}

#[test]
fn cache_is_consistent_under_concurrency() {
    let (_tmp, ca) = new_ca();
    let ca = Arc::new(ca);
    let configs: Vec<_> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..8)
            .map(|_| scope.spawn(|| ca.server_config_for("race.example").unwrap()))
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert!(configs.iter().all(|c| Arc::ptr_eq(c, &configs[0])));
}

/// Measures minting. Run with
/// `cargo test --release -p capgate-gateway --test tls -- --ignored --nocapture mint_time`.
#[test]
#[ignore = "a measurement, not a check"]
fn mint_time() {
    let (_tmp, ca) = new_ca();
    let ca = ca.with_leaf_cache_capacity(100_000);
    for i in 0..100 {
        ca.server_config_for(&format!("warm{i}.example")).unwrap();
    }
    let count = 2000u32;
    let start = Instant::now();
    for i in 0..count {
        ca.server_config_for(&format!("host{i}.example.com"))
            .unwrap();
    }
    let minted = start.elapsed() / count;
    let start = Instant::now();
    for i in 0..count {
        ca.server_config_for(&format!("host{i}.example.com"))
            .unwrap();
    }
    let cached = start.elapsed() / count;
    eprintln!("mint: {minted:?} per leaf; cache hit: {cached:?}");
}

// ---------------------------------------------------------------------------------------
// Peeking at a real ClientHello

/// The first bytes a rustls client sends to `name`, offering `alpn`.
async fn real_client_hello(name: ServerName<'static>, alpn: &[&[u8]]) -> Vec<u8> {
    let (_tmp, ca) = new_ca();
    let client = client_trusting(ca.cert_der(), alpn);
    let (client_io, mut server_io) = tokio::io::duplex(64 * 1024);
    let connect = tokio::spawn(async move {
        // Never answered: the handshake fails once the other end is dropped.
        let _ = TlsConnector::from(client).connect(name, client_io).await;
    });
    let mut buf = vec![0u8; 0];
    let mut chunk = [0u8; 4096];
    loop {
        match peek_sni(&buf).unwrap() {
            SniPeek::NeedMore => {}
            SniPeek::Hello { .. } => break,
            SniPeek::NotTls => panic!("a rustls hello is TLS"),
        }
        let n = server_io.read(&mut chunk).await.unwrap();
        assert!(n > 0, "client closed before a full hello");
        buf.extend_from_slice(&chunk[..n]);
    }
    drop(server_io);
    connect.await.unwrap();
    buf
}

#[tokio::test]
async fn peek_reads_sni_and_alpn_from_a_rustls_hello() {
    let wire = real_client_hello(dns("api.example.com"), &[b"h2", b"http/1.1"]).await;
    assert_eq!(
        peek_sni(&wire).unwrap(),
        SniPeek::Hello {
            sni: Some("api.example.com".to_owned()),
            alpn: vec!["h2".to_owned(), "http/1.1".to_owned()],
        }
    );
    // Every proper prefix asks for more.
    for cut in 0..wire.len() {
        assert_eq!(
            peek_sni(&wire[..cut]).unwrap(),
            SniPeek::NeedMore,
            "cut {cut}"
        );
    }
    // Bytes after the hello are ignored.
    let mut longer = wire.clone();
    longer.extend_from_slice(&[0x17, 3, 3, 0, 1, 0]);
    assert!(matches!(peek_sni(&longer).unwrap(), SniPeek::Hello { .. }));
}

#[tokio::test]
async fn peek_on_a_hello_to_an_ip_has_no_sni() {
    let wire = real_client_hello(
        ServerName::IpAddress(std::net::Ipv4Addr::LOCALHOST.into()),
        &[],
    )
    .await;
    assert_eq!(
        peek_sni(&wire).unwrap(),
        SniPeek::Hello {
            sni: None,
            alpn: vec![]
        }
    );
}

#[tokio::test]
async fn peek_on_a_hello_split_across_records() {
    let wire = real_client_hello(dns("split.example"), &[b"http/1.1"]).await;
    // Re-frame the one handshake message into records of 100 bytes each.
    let message = &wire[5..];
    let mut split = Vec::new();
    for piece in message.chunks(100) {
        split.extend_from_slice(&[0x16, 3, 1]);
        split.extend_from_slice(&u16::try_from(piece.len()).unwrap().to_be_bytes());
        split.extend_from_slice(piece);
    }
    assert_eq!(
        peek_sni(&split).unwrap(),
        SniPeek::Hello {
            sni: Some("split.example".to_owned()),
            alpn: vec!["http/1.1".to_owned()],
        }
    );
}

#[test]
fn peek_on_non_tls_and_oversized_input() {
    assert_eq!(peek_sni(b"").unwrap(), SniPeek::NeedMore);
    assert_eq!(
        peek_sni(b"CONNECT a:443 HTTP/1.1\r\n").unwrap(),
        SniPeek::NotTls
    );
    assert_eq!(peek_sni(b"\x16\x03").unwrap(), SniPeek::NeedMore);
    // A handshake header declaring 16 MiB.
    let err = peek_sni(&[0x16, 3, 1, 0, 4, 1, 0xff, 0xff, 0xff]).unwrap_err();
    assert!(
        matches!(err, TlsError::ClientHelloTooLarge { .. }),
        "{err:?}"
    );
    // A garbage hello body of the right length.
    let mut wire = vec![0x16, 3, 1, 0, 8, 1, 0, 0, 4, 0xde, 0xad, 0xbe, 0xef];
    let err = peek_sni(&wire).unwrap_err();
    assert!(
        matches!(err, TlsError::MalformedClientHello { .. }),
        "{err:?}"
    );
    wire.truncate(10);
    assert_eq!(peek_sni(&wire).unwrap(), SniPeek::NeedMore);
}

proptest! {
    #[test]
    fn peek_never_panics_on_random_bytes(bytes in prop::collection::vec(any::<u8>(), 0..2048)) {
        let _ = peek_sni(&bytes);
    }

    #[test]
    fn peek_never_panics_on_random_records(
        body in prop::collection::vec(any::<u8>(), 0..2048),
        minor in any::<u8>(),
    ) {
        // Random bytes behind a plausible record and handshake header go deeper.
        let mut wire = vec![0x16, 3, minor];
        wire.extend_from_slice(&u16::try_from(body.len() + 4).unwrap().to_be_bytes());
        let len = u32::try_from(body.len()).unwrap().to_be_bytes();
        wire.extend_from_slice(&[1, len[1], len[2], len[3]]);
        wire.extend_from_slice(&body);
        if let Ok(SniPeek::NeedMore) = peek_sni(&wire) {
            prop_assert!(wire.len() <= MAX_PEEK_LEN);
        }
    }

    #[test]
    fn peek_never_panics_on_a_mutated_real_hello(
        flips in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8),
        cut in any::<prop::sample::Index>(),
    ) {
        let mut wire = REAL_HELLO.with(Clone::clone);
        for (at, value) in flips {
            let i = at.index(wire.len());
            wire[i] = value;
        }
        let end = cut.index(wire.len() + 1);
        let _ = peek_sni(&wire[..end]);
    }
}

thread_local! {
    static REAL_HELLO: Vec<u8> = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap()
        .block_on(real_client_hello(dns("mutate.example"), &[b"h2", b"http/1.1"]));
}

// ---------------------------------------------------------------------------------------
// SNI against the CONNECT authority

#[test]
fn sni_matches_authority_cases() {
    let cases: &[(Option<&str>, &str, bool)] = &[
        (Some("api.example.com"), "api.example.com", true),
        (Some("API.Example.com"), "api.example.COM", true),
        (Some("api.example.com."), "api.example.com", true),
        (Some("api.example.com"), "api.example.com.", true),
        (Some("other.example.com"), "api.example.com", false),
        (Some("example.com"), "api.example.com", false),
        (Some("api.example.com"), "example.com", false),
        (Some("api.example.com.evil"), "api.example.com", false),
        // No SNI: fine for an address, refused for a name (opaque tunnels).
        (None, "api.example.com", false),
        (None, "127.0.0.1", true),
        (None, "[::1]", true),
        // An IP literal in SNI counts as no SNI.
        (Some("127.0.0.1"), "127.0.0.1", true),
        (Some("127.0.0.1"), "api.example.com", false),
        (Some("::1"), "[::1]", true),
        // A name to an address authority is a mismatch.
        (Some("api.example.com"), "127.0.0.1", false),
        (Some(""), "api.example.com", false),
        (None, "", false),
        (Some("a"), "", false),
    ];
    for &(sni, authority, want) in cases {
        assert_eq!(
            sni_matches_authority(sni, authority),
            want,
            "sni {sni:?} authority {authority:?}"
        );
    }
}

// ---------------------------------------------------------------------------------------
// Upstream client configuration

#[tokio::test]
async fn upstream_config_trusts_extra_roots() {
    let (_tmp, upstream_ca) = new_ca();
    let server = upstream_ca.server_config_for("upstream.example").unwrap();

    let client = upstream_client_config(Some(upstream_ca.cert_pem().as_bytes())).unwrap();
    assert_eq!(client.alpn_protocols, vec![b"http/1.1".to_vec()]);
    let alpn = handshake(server.clone(), client, dns("upstream.example"))
        .await
        .unwrap();
    assert_eq!(alpn.as_deref(), Some(&b"http/1.1"[..]));

    // Without the extra root, only the public roots are trusted.
    let client = upstream_client_config(None).unwrap();
    let err = handshake(server, client, dns("upstream.example"))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("UnknownIssuer"), "{err}");
}

#[test]
fn upstream_extra_roots_must_hold_a_certificate() {
    let err = upstream_client_config(Some(b"nothing here")).unwrap_err();
    assert!(matches!(err, TlsError::NoUpstreamRoots), "{err:?}");
    let err = upstream_client_config(Some(
        b"-----BEGIN CERTIFICATE-----\nnot base64!\n-----END CERTIFICATE-----\n",
    ))
    .unwrap_err();
    assert!(
        matches!(
            err,
            TlsError::UpstreamRootsPem { .. } | TlsError::UpstreamRoot { .. }
        ),
        "{err:?}"
    );
}

#[test]
fn install_crypto_provider_is_idempotent() {
    install_crypto_provider();
    install_crypto_provider();
    assert!(rustls::crypto::CryptoProvider::get_default().is_some());
}
