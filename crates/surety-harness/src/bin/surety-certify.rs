//! `surety-certify`: the certification harness's command line, run as
//! `cargo xtask certify <provider>` and `cargo xtask manifest verify`.
//!
//! Exit status: 0 when certified (or verified), 1 when certification (or
//! verification) failed, 2 when the harness itself could not run.

// A command-line tool: what it prints is its output.
#![expect(
    clippy::print_stdout,
    reason = "a command-line program: its output is its interface"
)]

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand};
use surety_contracts::Contract;
use surety_harness::config::CertifyConfig;
use surety_harness::progress::Progress;
use surety_harness::{Certification, ContractResult, report};
use surety_manifest::{Current, Eligibility, Manifest};
use surety_providers::build_provider;
use time::OffsetDateTime;

#[derive(Debug, Parser)]
/// Certify LLM providers against surety's prompt contracts.
#[command(name = "surety-certify", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run every contract a provider is routed for through it, and write the manifest.
    Certify(CertifyArgs),
    /// Check a manifest's signature, and whether each entry still matches its contract.
    Verify(VerifyArgs),
    /// Write a new ed25519 key pair: <prefix>.key (secret) and <prefix>.pub.
    Keygen {
        #[arg(long)]
        out: PathBuf,
    },
}

#[derive(Debug, clap::Args)]
struct CertifyArgs {
    /// The provider's id in the configuration.
    #[arg(required_unless_present = "all")]
    provider: Option<String>,
    /// Certify every configured provider.
    #[arg(long, conflicts_with = "provider")]
    all: bool,
    #[arg(long, default_value = "surety.toml")]
    config: PathBuf,
    #[arg(long, default_value = "contracts")]
    contracts: PathBuf,
    #[arg(long, default_value = "golden")]
    golden: PathBuf,
    #[arg(long, default_value = "certification/manifest.json")]
    manifest: PathBuf,
    /// Sign the manifest with this ed25519 key (64 hex digits in a file).
    #[arg(long)]
    signing_key: Option<PathBuf>,
    /// Accept new and changed golden snapshots.
    #[arg(long)]
    accept: bool,
    /// Where the Markdown report and the JUnit XML go.
    #[arg(long, default_value = "target/certify")]
    out: PathBuf,
    /// Run a provider against another URL than its configured one:
    /// `<id>=<url>`. The entry is bound to that URL and records the
    /// override, so a router serves it only if its configuration names the
    /// same URL.
    #[arg(long = "override-base-url", value_name = "ID=URL")]
    base_urls: Vec<String>,
    /// How long a certification stays valid.
    #[arg(long, default_value_t = 30)]
    validity_days: u64,
}

#[derive(Debug, clap::Args)]
struct VerifyArgs {
    #[arg(long, default_value = "certification/manifest.json")]
    manifest: PathBuf,
    /// The verifying key (64 hex digits in a file). Without one, only the
    /// entries are checked against the contracts.
    #[arg(long)]
    public_key: Option<PathBuf>,
    #[arg(long, default_value = "contracts")]
    contracts: PathBuf,
    /// The configuration the entries must match (providers and routes):
    /// an entry whose provider's behaviour changed since certification
    /// (model, base URL, structured-output mode, ...) is not current.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Fail when an entry is stale, expired, failed or bound to another
    /// provider configuration, not only on a bad signature.
    #[arg(long)]
    require_current: bool,
}

/// The harness could not run (exit 2), as opposed to a failed certification (exit 1).
#[derive(Debug)]
struct CouldNotRun(anyhow::Error);

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("error: cannot start the runtime: {e}");
            return ExitCode::from(2);
        }
    };
    let result = match cli.command {
        Command::Certify(args) => runtime.block_on(certify(args)),
        Command::Verify(args) => verify(&args).map_err(CouldNotRun),
        Command::Keygen { out } => keygen(&out).map(|()| true).map_err(CouldNotRun),
    };
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(CouldNotRun(e)) => {
            eprintln!("error: {e:#}");
            ExitCode::from(2)
        }
    }
}

async fn certify(args: CertifyArgs) -> Result<bool, CouldNotRun> {
    let contracts = surety_contracts::load_all(&args.contracts)
        .with_context(|| format!("loading contracts from {}", args.contracts.display()))
        .map_err(CouldNotRun)?;
    let ids: Vec<String> = contracts.iter().map(|c| c.id.clone()).collect();
    let text = std::fs::read_to_string(&args.config)
        .with_context(|| format!("reading {}", args.config.display()))
        .map_err(CouldNotRun)?;
    let mut config = CertifyConfig::from_toml(&text, &ids)
        .with_context(|| format!("in {}", args.config.display()))
        .map_err(CouldNotRun)?;
    let mut overridden = std::collections::BTreeMap::new();
    for spec in &args.base_urls {
        let (id, url) = spec
            .split_once('=')
            .context("--override-base-url takes <id>=<url>")
            .map_err(CouldNotRun)?;
        let provider = config
            .providers
            .get_mut(id)
            .with_context(|| format!("--override-base-url: no provider `{id}`"))
            .map_err(CouldNotRun)?;
        let url = url.trim_end_matches('/').to_owned();
        if url != provider.base_url {
            eprintln!(
                "note: `{id}` runs against {url}, not its configured {}; the entry records the override, and a router serves it only at that URL",
                provider.base_url
            );
            overridden.insert(id.to_owned(), provider.base_url.clone());
            provider.base_url = url;
        }
    }
    let targets: Vec<String> = match (&args.provider, args.all) {
        (_, true) => config.providers.keys().cloned().collect(),
        (Some(p), false) => vec![p.clone()],
        (None, false) => return Err(CouldNotRun(anyhow::anyhow!("name a provider, or --all"))),
    };
    let now = OffsetDateTime::now_utc();
    let mut manifest = match Manifest::load_or_new(&args.manifest, now) {
        Ok(manifest) => manifest,
        // A format-1 manifest binds no provider configuration or prompt:
        // nothing in it can be trusted by this build, so none of it is kept.
        Err(surety_manifest::ManifestError::Format(old)) if old == "surety-manifest/1" => {
            eprintln!(
                "note: {} is in the older format `{old}`, whose entries bind neither the provider's configuration nor the prompts; starting a new manifest without them",
                args.manifest.display()
            );
            Manifest::new(now)
        }
        Err(e) => return Err(CouldNotRun(e.into())),
    };
    let mut all_certified = true;
    let (mut replaced, mut unreachable) = (0, Vec::new());
    for target in &targets {
        let provider_config = config
            .providers
            .get(target)
            .with_context(|| format!("no provider `{target}` in {}", args.config.display()))
            .map_err(CouldNotRun)?
            .clone();
        let routed = config.contracts_of(target);
        if routed.is_empty() {
            return Err(CouldNotRun(anyhow::anyhow!(
                "provider `{target}` is not routed for any contract in {}",
                args.config.display()
            )));
        }
        let selected: Vec<Contract> = contracts
            .iter()
            .filter(|c| routed.contains(&c.id))
            .cloned()
            .collect();
        let provider = build_provider(&provider_config).map_err(|e| CouldNotRun(e.into()))?;
        let served = match provider.capabilities().models_endpoint {
            true => match provider.served_models().await {
                Ok(served) => Some(served),
                Err(e) if !e.answered() => {
                    println!(
                        "UNREACHABLE: provider `{target}` does not answer its models endpoint ({e}); its manifest entries are left as they were"
                    );
                    unreachable.push(target.clone());
                    continue;
                }
                Err(e) => {
                    return Err(CouldNotRun(
                        anyhow::Error::new(e)
                            .context(format!("provider `{target}` does not answer")),
                    ));
                }
            },
            false => None,
        };
        let total: u64 = selected
            .iter()
            .map(|c| c.cases.len() as u64 * u64::from(c.sampling.samples))
            .sum();
        // A bar on a terminal; off one, a line as each case's samples are done.
        let bar = Arc::new(std::sync::Mutex::new(Samples::new(
            Progress::new(format!("certify {target}"), total),
            &selected,
        )));
        let progress = Arc::clone(&bar);
        let certification = Certification {
            provider: Arc::clone(&provider),
            config: provider_config.clone(),
            golden_root: args.golden.clone(),
            accept: args.accept,
            retry: surety_harness::RetryBudget::default(),
            on_sample: Box::new(move |contract, case| {
                if let Ok(mut samples) = progress.lock() {
                    samples.sample(contract, case);
                }
            }),
        };
        let results = match certification.run(&selected).await {
            Ok(results) => results,
            // Not certified, nor failed: its entries stay as they were.
            Err(e @ surety_harness::HarnessError::Unreachable { .. }) => {
                if let Ok(samples) = bar.lock() {
                    samples.progress.finish();
                }
                println!("UNREACHABLE: {e}; its manifest entries are left as they were");
                unreachable.push(target.clone());
                continue;
            }
            Err(e) => return Err(CouldNotRun(e.into())),
        };
        if let Ok(samples) = bar.lock() {
            samples.progress.finish();
        }
        let validity = Duration::from_secs(args.validity_days * 24 * 3600);
        let entries: Vec<_> = results
            .iter()
            .map(|r| {
                surety_harness::entry(
                    &provider_config,
                    r,
                    served.clone(),
                    overridden.get(target).map(String::as_str),
                    now,
                    validity,
                )
            })
            .collect();
        let about = report::About {
            provider: &provider_config,
            served: served.as_deref(),
            retry: &certification.retry,
        };
        write_reports(&args.out, &about, &results).map_err(CouldNotRun)?;
        manifest.replace_provider(target, entries, now);
        replaced += 1;
        print!("{}", report::summary_table(target, &results));
        all_certified &= results.iter().all(|r| r.certified);
    }
    if replaced == 0 && !unreachable.is_empty() {
        return Err(CouldNotRun(anyhow::anyhow!(
            "unreachable: {}; {} is unchanged",
            unreachable.join(", "),
            args.manifest.display()
        )));
    }
    if let Some(key) = &args.signing_key {
        let key = surety_manifest::read_signing_key(key).map_err(|e| CouldNotRun(e.into()))?;
        manifest.sign(&key);
    }
    if let Some(dir) = args.manifest.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|e| CouldNotRun(e.into()))?;
    }
    manifest
        .write(&args.manifest)
        .map_err(|e| CouldNotRun(e.into()))?;
    println!(
        "manifest: {}{}",
        args.manifest.display(),
        if args.signing_key.is_some() {
            " (signed)"
        } else {
            ""
        }
    );
    println!("reports: {}", args.out.display());
    if !unreachable.is_empty() {
        return Err(CouldNotRun(anyhow::anyhow!(
            "unreachable: {} (not certified, nor failed: their entries are left as they were)",
            unreachable.join(", ")
        )));
    }
    Ok(all_certified)
}

fn write_reports(out: &Path, about: &report::About<'_>, results: &[ContractResult]) -> Result<()> {
    let provider = about.provider.id.as_str();
    let dir = out.join(provider);
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    std::fs::write(
        dir.join("report.md"),
        report::markdown_about(about, results),
    )?;
    std::fs::write(
        dir.join("report.html"),
        report::html(about, results).context("rendering report.html")?,
    )?;
    std::fs::write(dir.join("junit.xml"), report::junit(provider, results))?;
    std::fs::write(
        dir.join("results.json"),
        serde_json::to_string_pretty(results)?,
    )?;
    Ok(())
}

fn verify(args: &VerifyArgs) -> Result<bool> {
    let text = std::fs::read_to_string(&args.manifest)
        .with_context(|| format!("reading {}", args.manifest.display()))?;
    let manifest = match Manifest::parse(&text) {
        Ok(manifest) => manifest,
        Err(e) => {
            println!("REFUSED: {e}");
            return Ok(false);
        }
    };
    if let Some(key) = &args.public_key {
        let key = surety_manifest::read_verifying_key(key)?;
        if let Err(e) = manifest.verify(&key) {
            println!("REFUSED: {e}");
            return Ok(false);
        }
        println!(
            "signature: valid ({})",
            manifest
                .signature
                .as_ref()
                .map(|s| s.public_key.as_str())
                .unwrap_or_default()
        );
    } else {
        println!("signature: not checked (no --public-key)");
    }
    let contracts = surety_contracts::load_all(&args.contracts)?;
    let providers = match &args.config {
        Some(path) => {
            let ids: Vec<String> = contracts.iter().map(|c| c.id.clone()).collect();
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("reading {}", path.display()))?;
            let config = CertifyConfig::from_toml(&text, &ids)
                .with_context(|| format!("in {}", path.display()))?;
            Some(config.providers)
        }
        None => {
            println!("provider configuration: not checked (no --config)");
            None
        }
    };
    let now = OffsetDateTime::now_utc();
    let mut current = true;
    for entry in &manifest.entries {
        let verdict = match contracts.iter().find(|c| c.id == entry.contract) {
            None => format!("NOT CURRENT: no contract `{}` any more", entry.contract),
            Some(contract) => {
                let prompt_digest = surety_exchange::prompt_digest(contract)
                    .map_err(|e| anyhow::anyhow!("contract `{}`: {e}", contract.id))?;
                // Without --config, the entry is compared with its own record.
                let behaviour = match &providers {
                    None => Some(entry.provider_config.clone()),
                    Some(providers) => providers.get(&entry.provider).map(|p| p.behaviour()),
                }
                .map(surety_manifest::Behaviour::new);
                match behaviour {
                    None => format!(
                        "NOT CURRENT: no provider `{}` in the configuration",
                        entry.provider
                    ),
                    Some(behaviour) => {
                        let now_is = Current {
                            contract_digest: &contract.digest,
                            prompt_digest: &prompt_digest,
                            provider: &behaviour,
                        };
                        match manifest.eligibility(&entry.provider, &entry.contract, &now_is, now) {
                            Eligibility::Certified => "certified".to_owned(),
                            Eligibility::Failed => "failed".to_owned(),
                            other => format!("NOT CURRENT: {other}"),
                        }
                    }
                }
            }
        };
        current &= verdict == "certified";
        println!("{:<14} {:<22} {verdict}", entry.provider, entry.contract);
    }
    Ok(current || !args.require_current)
}

fn keygen(prefix: &Path) -> Result<()> {
    let secret: [u8; 32] = rand::random();
    let key = ed25519_dalek::SigningKey::from_bytes(&secret);
    let secret_path = prefix.with_extension("key");
    let public_path = prefix.with_extension("pub");
    if secret_path.exists() {
        bail!("{} exists; not overwriting a key", secret_path.display());
    }
    write_private(&secret_path, &hex::encode(secret))?;
    std::fs::write(
        &public_path,
        hex::encode(key.verifying_key().as_bytes()) + "\n",
    )?;
    println!(
        "wrote {} (keep it secret) and {}",
        secret_path.display(),
        public_path.display()
    );
    Ok(())
}

fn write_private(path: &Path, text: &str) -> Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)?;
    writeln!(file, "{text}")?;
    Ok(())
}

/// A certification's progress in samples, with a milestone where a case's
/// last sample is done.
struct Samples {
    progress: Progress,
    per_case: std::collections::HashMap<String, u64>,
    seen: std::collections::HashMap<(String, String), u64>,
}

impl Samples {
    fn new(progress: Progress, contracts: &[Contract]) -> Samples {
        Samples {
            progress,
            per_case: contracts
                .iter()
                .map(|c| (c.id.clone(), u64::from(c.sampling.samples)))
                .collect(),
            seen: Default::default(),
        }
    }

    fn sample(&mut self, contract: &str, case: &str) {
        let n = self
            .seen
            .entry((contract.to_owned(), case.to_owned()))
            .or_default();
        *n += 1;
        let case_done = self.per_case.get(contract) == Some(n);
        self.progress
            .advance(1, &format!("{contract}/{case}"), case_done);
    }
}
