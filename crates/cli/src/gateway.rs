//! `capgate gateway`, `capgate env`, `capgate ca path`, `capgate secret`: the gateway in
//! the foreground, the environment a sandbox's workload receives, and host-side secrets.

use std::collections::BTreeMap;
use std::io::Read as _;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use capgate_gateway::addr::{AddressGuard, DangerousMapping, SystemResolver};
use capgate_gateway::broker::Broker;
use capgate_gateway::proxy::{Gateway, GatewayConfig, Limits, PhaseSwitch, PolicyView};
use capgate_gateway::secrets::SecretStore;
use capgate_gateway::tls::{CertificateAuthority, upstream_client_config};
use capgate_policy::audit::AuditWriter;
use capgate_policy::store::RuleFilter;
use capgate_policy::{Matcher, Phase, Rule};
use capgate_spec::caps::Capability;
use capgate_spec::caps::pack::Tier;
use clap::Subcommand;

use crate::exit;
use crate::state::{SandboxDir, data_dir, open_store};

#[derive(Debug, clap::Args)]
pub struct GatewayArgs {
    /// The sandbox whose rules and credentials apply (created with `capgate create`).
    #[arg(long)]
    pub sandbox: String,
    /// Where to accept HTTP proxy connections (CONNECT and absolute-form).
    #[arg(long, default_value = "127.0.0.1:3128")]
    pub listen: SocketAddr,
    /// Also accept SOCKS5 CONNECT here (for non-HTTP protocols a host is granted outright).
    #[arg(long, value_name = "ADDR")]
    pub socks: Option<SocketAddr>,
    /// Extra PEM roots to trust for upstream TLS (a corporate proxy's CA, a test CA).
    #[arg(long, value_name = "FILE")]
    pub upstream_ca: Option<PathBuf>,
    /// Map a name onto an address, bypassing DNS and the address guard for that name only
    /// (for tests and local development; logged loudly).
    #[arg(long = "dangerously-resolve", value_name = "HOST=IP")]
    pub dangerously_resolve: Vec<DangerousMapping>,
    /// The grant phase to enforce.
    #[arg(long, default_value = "runtime", value_parser = parse_phase)]
    pub phase: Phase,
}

fn parse_phase(s: &str) -> Result<Phase, String> {
    Phase::parse(s).ok_or_else(|| format!("`{s}` is not `install` or `runtime`"))
}

#[derive(Debug, clap::Args)]
pub struct EnvArgs {
    /// The sandbox.
    pub name: String,
    /// The gateway address the environment points at.
    #[arg(long, default_value = "127.0.0.1:3128")]
    pub proxy: SocketAddr,
    /// Print one JSON object: `{"sandbox": NAME, "env": {VARIABLE: VALUE, …}}`.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Subcommand)]
pub enum CaCommand {
    /// Print the path of the capgate CA certificate (created on first use).
    Path {
        /// Print one JSON object: `{"path": PATH}`.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, Subcommand)]
pub enum SecretCommand {
    /// Store the secret for SERVICE, read from standard input (never from the command line).
    /// Running gateways use the new value from their next request (within a second).
    Set { service: String },
    /// List the services that have a secret (names only).
    Ls {
        #[arg(long)]
        json: bool,
    },
    /// Remove the secret for SERVICE. Running gateways stop sending it from their next
    /// request (within a second); its sentinel is then refused everywhere.
    Rm { service: String },
}

pub fn secrets() -> Result<SecretStore> {
    Ok(SecretStore::new(data_dir()?.join("secrets.json")))
}

pub fn ca() -> Result<CertificateAuthority> {
    let dir = data_dir()?.join("ca");
    CertificateAuthority::load_or_create(&dir)
        .with_context(|| format!("cannot load the capgate CA in `{}`", dir.display()))
}

pub fn ca_command(cmd: &CaCommand) -> Result<u8> {
    match cmd {
        CaCommand::Path { json } => {
            let ca = ca()?;
            let path = ca.cert_path();
            if *json {
                let body = serde_json::json!({ "path": path.to_string_lossy() });
                out!("{}", crate::json_text(&body)?);
            } else {
                out!("{}", path.display());
            }
            Ok(exit::OK)
        }
    }
}

/// The secret's value: standard input to its end, or, from a terminal, one line typed with
/// the terminal's echo off (so it is never on screen, nor in the scrollback).
fn read_secret(service: &str) -> Result<String> {
    use rustix::termios::{LocalModes, OptionalActions, tcgetattr, tcsetattr};
    use std::io::{BufRead as _, IsTerminal as _};
    use std::os::fd::AsFd as _;
    let stdin = std::io::stdin();
    if !stdin.is_terminal() {
        let mut value = String::new();
        stdin
            .lock()
            .read_to_string(&mut value)
            .context("cannot read the secret from standard input")?;
        return Ok(value);
    }
    let fd = stdin.as_fd();
    let saved = tcgetattr(fd).context("cannot read the terminal's settings")?;
    let mut hidden = saved.clone();
    hidden.local_modes.remove(LocalModes::ECHO);
    // Echo off before the prompt: whatever is typed once the prompt shows is hidden.
    tcsetattr(fd, OptionalActions::Now, &hidden).context("cannot turn the terminal's echo off")?;
    eprint!("secret for `{service}` (not shown; Enter ends it): ");
    let mut line = String::new();
    let read = stdin.lock().read_line(&mut line);
    let restored = tcsetattr(fd, OptionalActions::Now, &saved);
    say!();
    read.context("cannot read the secret from the terminal")?;
    restored.context("cannot turn the terminal's echo back on")?;
    Ok(line)
}

pub fn secret_command(cmd: &SecretCommand) -> Result<u8> {
    let store = secrets()?;
    match cmd {
        SecretCommand::Set { service } => {
            let value = read_secret(service)?;
            store.set(service, &value)?;
            out!("stored the secret for `{service}`");
            // As stored: the line end is not part of it.
            if value.trim_end_matches(['\n', '\r']).len() < capgate_gateway::mask::MIN_MASKED_LEN {
                say!(
                    "capgate: warning: the secret is shorter than {} bytes: an answer that quotes it back is not masked (so short a value occurs by chance)",
                    capgate_gateway::mask::MIN_MASKED_LEN
                );
            }
        }
        SecretCommand::Ls { json } => {
            let services = store.services()?;
            if *json {
                out!("{}", serde_json::json!({ "services": services }));
            } else if services.is_empty() {
                out!("no secrets (add one with `capgate secret set SERVICE < file`)");
            } else {
                for s in services {
                    out!("{s}");
                }
            }
        }
        SecretCommand::Rm { service } => {
            if !store.remove(service)? {
                bail!("no secret is stored for `{service}`");
            }
            out!("removed the secret for `{service}`");
        }
    }
    Ok(exit::OK)
}

/// The credentials of a sandbox's composition.
fn credentials(
    composition: &capgate_spec::Descriptor,
) -> Vec<capgate_spec::caps::credential::Credential> {
    composition
        .declared_entries()
        .into_iter()
        .filter_map(|(_, e)| match &e.capability {
            Some(Capability::Credential(c)) => Some(c.clone()),
            _ => None,
        })
        .collect()
}

pub fn rules_for(store: &capgate_policy::Store, sandbox: &str) -> Result<Vec<Rule>> {
    Ok(store.rules(&RuleFilter {
        sandbox: Some(sandbox.to_owned()),
        source: None,
        decision: None,
    })?)
}

/// Everything the gateway of `sandbox` needs; `rules` are the sandbox's rules from the store.
pub fn config(
    sandbox: &str,
    rules: &[Rule],
    upstream_ca: Option<&std::path::Path>,
    mappings: Vec<DangerousMapping>,
    phase: Phase,
) -> Result<GatewayConfig> {
    capgate_gateway::tls::install_crypto_provider();
    let dir = SandboxDir::of(sandbox)?;
    let composition = dir.read_composition()?;
    let creds = credentials(&composition);
    let read_only = composition
        .declared_entries()
        .iter()
        .any(|(_, e)| matches!(&e.capability, Some(Capability::Determinism(d)) if d.tier == Tier::ReadOnly));
    let services: Vec<String> = creds.iter().map(|c| c.service.clone()).collect();
    let sentinels = dir.sentinels(&services)?;
    let broker = Broker::new(&creds, &sentinels, secrets()?.all()?);

    for m in &mappings {
        say!(
            "capgate: WARNING: --dangerously-resolve maps `{m}`: that name bypasses DNS and the address guard"
        );
    }
    // No fixed openings: the gateway takes the IPs and CIDRs user rules name from the
    // rules in force, phase by phase (`Matcher::openings`), so they end with their rule.
    let guard = AddressGuard::new(Vec::new())?.with_dangerous_mappings(mappings);
    let extra = match upstream_ca {
        Some(p) => {
            Some(std::fs::read(p).with_context(|| format!("cannot read `{}`", p.display()))?)
        }
        None => None,
    };
    let audit = AuditWriter::spawn(&data_dir()?.join("policy.db"))?;
    // `capgate run` gets here after its sandbox's helper has started: the workload keeps
    // the descriptor limit it was given.
    let mut limits = Limits::default();
    if let Some((wanted, available)) = limits.fit_descriptors() {
        say!(
            "capgate: WARNING: this process may open {available} descriptors (ulimit -n): the gateway of `{sandbox}` takes {} connections at once, not {wanted}",
            limits.max_connections
        );
    }
    Ok(GatewayConfig {
        sandbox: sandbox.to_owned(),
        policy: Arc::new(PolicyView::new(Matcher::compile(rules))),
        phase: Arc::new(PhaseSwitch::new(phase)),
        guard,
        resolver: Arc::new(SystemResolver),
        ca: Some(ca()?),
        upstream_tls: upstream_client_config(extra.as_deref())?,
        broker,
        audit: Some(Arc::new(audit)),
        limits,
        read_only,
    })
}

/// Keeps the gateway current while its sandbox runs: the user may add a deny, or set or
/// remove a secret (`capgate secret rm` stops the secret being sent from the next request
/// on). Both are looked at every 500 ms.
pub fn watch_store(sandbox: String, cfg: &GatewayConfig) {
    let view = Arc::clone(&cfg.policy);
    let broker = cfg.broker.clone();
    std::thread::spawn(move || {
        let mut last: Option<Vec<Rule>> = None;
        // One connection for the life of the watcher, opened after its first wait: a short
        // run ends before then, and its start-up does not share the CPU with this.
        let mut store = None;
        let filter = RuleFilter {
            sandbox: Some(sandbox),
            source: None,
            decision: None,
        };
        // Where the secrets are is settled once, after the first wait too; then only the
        // file is looked at.
        let mut watched: Option<SecretsWatch> = None;
        loop {
            std::thread::sleep(Duration::from_millis(500));
            if watched.is_none() {
                watched = secrets()
                    .ok()
                    .map(|store| SecretsWatch { store, seen: None });
            }
            if let Some(watch) = &mut watched {
                watch.refresh(&broker);
            }
            let store = match &mut store {
                Some(store) => store,
                empty => match open_store() {
                    Ok(opened) => empty.insert(opened),
                    Err(_) => continue,
                },
            };
            let Ok(rules) = store.rules(&filter) else {
                continue;
            };
            if last.as_ref() != Some(&rules) {
                view.replace(Matcher::compile(&rules));
                last = Some(rules);
            }
        }
    });
}

/// Which version of the secrets file is there: device, inode, change time and size
/// (`secret set` and `rm` rename a new file over it); `None` when there is none.
type FileVersion = Option<(u64, u64, i64, i64, u64)>;

/// The secrets file, and the version of it last read (`None` before the first look).
struct SecretsWatch {
    store: SecretStore,
    seen: Option<FileVersion>,
}

impl SecretsWatch {
    /// Reads the secrets again when the file changed, and puts them in force. A file that
    /// cannot be read keeps the secrets in force, and says so once.
    fn refresh(&mut self, broker: &Broker) {
        use std::os::unix::fs::MetadataExt as _;
        let store = &self.store;
        let version = std::fs::metadata(store.path())
            .ok()
            .map(|m| (m.dev(), m.ino(), m.ctime(), m.ctime_nsec(), m.size()));
        if self.seen == Some(version) {
            return;
        }
        self.seen = Some(version);
        match store.all() {
            Ok(all) => broker.replace_secrets(all),
            Err(e) => say!("capgate: WARNING: the secrets in force are kept: {e}"),
        }
    }
}

pub fn run_gateway(args: &GatewayArgs) -> Result<u8> {
    let rules = rules_for(&open_store()?, &args.sandbox)?;
    let cfg = config(
        &args.sandbox,
        &rules,
        args.upstream_ca.as_deref(),
        args.dangerously_resolve.clone(),
        args.phase,
    )?;
    watch_store(args.sandbox.clone(), &cfg);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let listener = tokio::net::TcpListener::bind(args.listen)
            .await
            .with_context(|| format!("cannot listen on {}", args.listen))?;
        say!(
            "capgate gateway for sandbox `{}` on http://{} (phase {}); Ctrl-C to stop",
            args.sandbox,
            listener.local_addr()?,
            args.phase
        );
        let gw = Gateway::new(cfg);
        if let Some(addr) = args.socks {
            let socks = tokio::net::TcpListener::bind(addr)
                .await
                .with_context(|| format!("cannot listen on {addr}"))?;
            say!("capgate gateway: SOCKS5 on {}", socks.local_addr()?);
            let gw2 = gw.clone();
            tokio::spawn(async move { gw2.serve_socks(socks).await });
        }
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        // On Ctrl-C or SIGTERM, return: dropping the configuration flushes the audit log.
        tokio::select! {
            r = gw.serve_http(listener) => r.context("the gateway stopped"),
            _ = tokio::signal::ctrl_c() => Ok(()),
            _ = term.recv() => Ok(()),
        }
    })?;
    Ok(exit::OK)
}

/// The proxy, CA and credential variables a workload gets.
pub fn workload_env(
    sandbox: &str,
    proxy: &str,
    ca_bundle: &str,
) -> Result<BTreeMap<String, String>> {
    let dir = SandboxDir::of(sandbox)?;
    let creds = credentials(&dir.read_composition()?);
    let services: Vec<String> = creds.iter().map(|c| c.service.clone()).collect();
    let sentinels = dir.sentinels(&services)?;
    let mut env = BTreeMap::new();
    for name in [
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "ALL_PROXY",
        "http_proxy",
        "https_proxy",
        "all_proxy",
    ] {
        env.insert(name.to_owned(), proxy.to_owned());
    }
    env.insert("NO_PROXY".to_owned(), String::new());
    env.insert("no_proxy".to_owned(), String::new());
    // Each tool family's way to be told which CAs to trust: OpenSSL and Go (and rustls'
    // native roots), Python's requests and pip, Node (and npm, Bun), git, curl, cargo, the
    // AWS SDKs and CLI, Deno. The bundle is the system's roots plus capgate's CA.
    for name in [
        "SSL_CERT_FILE",
        "REQUESTS_CA_BUNDLE",
        "NODE_EXTRA_CA_CERTS",
        "GIT_SSL_CAINFO",
        "CURL_CA_BUNDLE",
        "CARGO_HTTP_CAINFO",
        "AWS_CA_BUNDLE",
        "DENO_CERT",
    ] {
        env.insert(name.to_owned(), ca_bundle.to_owned());
    }
    // Each credential's variable holds the sandbox's sentinel; inject-only credentials add
    // no variable at all.
    for c in &creds {
        if let (Some(name), Some(sentinel)) = (
            c.api_key.as_ref().and_then(|k| k.env_name()),
            sentinels.get(&c.service),
        ) {
            env.insert(name.to_owned(), sentinel.clone());
        }
    }
    Ok(env)
}

/// A CA bundle on the host: the system roots plus the capgate CA.
pub fn host_ca_bundle(sandbox: &str) -> Result<PathBuf> {
    let ca = ca()?;
    let mut bundle =
        std::fs::read_to_string("/etc/ssl/certs/ca-certificates.crt").unwrap_or_default();
    if !bundle.is_empty() && !bundle.ends_with('\n') {
        bundle.push('\n');
    }
    bundle.push_str(ca.cert_pem());
    let path = SandboxDir::of(sandbox)?.dir.join("ca-bundle.pem");
    std::fs::write(&path, bundle).with_context(|| format!("cannot write `{}`", path.display()))?;
    Ok(path)
}

pub fn env_command(args: &EnvArgs) -> Result<u8> {
    // Only a sandbox that exists has an environment (and nothing is created for one that
    // does not: no CA, no bundle).
    if open_store()?.sandbox(&args.name)?.is_none() {
        return Err(capgate_policy::store::StoreError::NoSuchSandbox {
            name: args.name.clone(),
        }
        .into());
    }
    let bundle = host_ca_bundle(&args.name)?;
    let env = workload_env(
        &args.name,
        &format!("http://{}", args.proxy),
        &bundle.display().to_string(),
    )?;
    if args.json {
        let env: std::collections::BTreeMap<_, _> = env.into_iter().collect();
        let body = serde_json::json!({ "sandbox": args.name, "env": env });
        out!("{}", crate::json_text(&body)?);
    } else {
        for (k, v) in env {
            out!("{k}={v}");
        }
    }
    Ok(exit::OK)
}
