//! The repo's TLS files and `fjord cert ...`: the cluster CA (`tls/ca.crt`, `ca.key`) and a
//! certificate and key per service (`tls/pageserver.crt`, `tls/safekeeper-1.crt`, ...),
//! each naming `localhost`, `127.0.0.1` and the service's advertised host. Keys are mode
//! 0600 and no file is ever overwritten (the `tls` crate's rule).

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use anyhow::{bail, Context};
use tls::ca::{Ca, CA_CERT, CA_KEY};

/// The repo's directory of TLS files.
pub const TLS_DIR: &str = "tls";

pub fn tls_dir(repo_dir: &Path) -> PathBuf {
    repo_dir.join(TLS_DIR)
}

pub fn ca_cert(repo_dir: &Path) -> PathBuf {
    tls_dir(repo_dir).join(CA_CERT)
}

/// A service's certificate and key in the repo.
pub fn service_files(repo_dir: &Path, service: &str) -> (PathBuf, PathBuf) {
    let dir = tls_dir(repo_dir);
    (dir.join(format!("{service}.crt")), dir.join(format!("{service}.key")))
}

/// The hosts a service's certificate names: `localhost`, `127.0.0.1` and `advertised`.
pub fn hosts_for(advertised: &str) -> Vec<String> {
    let mut hosts = vec!["localhost".to_string(), "127.0.0.1".to_string()];
    if !hosts.iter().any(|h| h == advertised) {
        hosts.push(advertised.to_string());
    }
    hosts
}

/// Makes the repo's CA and a certificate for each of `services`.
pub fn make_repo_tls(repo_dir: &Path, services: &[String], advertised: &str) -> anyhow::Result<()> {
    let ca = Ca::create(&tls_dir(repo_dir)).context("make the cluster CA")?;
    for service in services {
        let (cert, key) = service_files(repo_dir, service);
        ca.issue_to_files(service, &hosts_for(advertised), tls::ca::SERVICE_VALIDITY, &cert, &key)
            .with_context(|| format!("make the certificate of the {service}"))?;
    }
    Ok(())
}

/// Issues a certificate for one more service of the repo from its CA (`fjord pageserver
/// add`).
pub fn issue_repo_cert(repo_dir: &Path, service: &str, advertised: &str) -> anyhow::Result<()> {
    let ca = Ca::load_dir(&tls_dir(repo_dir)).context("load the repo's cluster CA")?;
    let (cert, key) = service_files(repo_dir, service);
    ca.issue_to_files(service, &hosts_for(advertised), tls::ca::SERVICE_VALIDITY, &cert, &key)
        .with_context(|| format!("make the certificate of the {service}"))
}

/// How long until a certificate file expires, for `fjord status`.
pub fn expires_in(cert: &Path) -> anyhow::Result<String> {
    let not_after = tls::cert_not_after(cert)?;
    Ok(match not_after.duration_since(SystemTime::now()) {
        Ok(left) => format!("expires in {} days", left.as_secs() / 86400),
        Err(_) => "EXPIRED".to_string(),
    })
}

#[derive(clap::Subcommand, Debug)]
pub enum CertCommand {
    /// Make a new CA (ca.crt, ca.key) in --out, for a cluster that is not one repo (the
    /// repo's own is made by `fjord init`).
    Ca {
        /// Directory for ca.crt and ca.key (created; existing files are never overwritten).
        #[arg(long, value_name = "DIR")]
        out: PathBuf,
    },
    /// Issue a certificate for a service, signed by the repo's CA (or --ca-dir's): the way
    /// to bring a service on another host into the cluster. Writes NAME.crt and NAME.key
    /// (mode 0600) to --out; start the service with --tls-cert and --tls-key on them.
    Issue {
        /// The service's name (the certificate's common name and the files' names), e.g.
        /// safekeeper-4.
        #[arg(long)]
        name: String,
        /// A host name or IP address clients dial the service at; repeat for each.
        #[arg(long = "host", value_name = "HOST", required = true)]
        hosts: Vec<String>,
        /// Directory for NAME.crt and NAME.key (created; existing files are never
        /// overwritten).
        #[arg(long, value_name = "DIR")]
        out: PathBuf,
        /// Directory holding the CA's ca.crt and ca.key [default: the repo's tls/].
        #[arg(long, value_name = "DIR")]
        ca_dir: Option<PathBuf>,
        /// How long the certificate is valid, in days.
        #[arg(long, default_value_t = 365, value_parser = clap::value_parser!(u32).range(1..=3650))]
        days: u32,
    },
}

/// `fjord cert ...`; `repo_dir` is where the CA is unless `--ca-dir` says otherwise.
pub fn run(repo_dir: &Path, command: CertCommand) -> anyhow::Result<()> {
    match command {
        CertCommand::Ca { out } => {
            Ca::create(&out)?;
            say!("made a CA in {}: {CA_CERT} (give it to clients as --tls-ca) and {CA_KEY} (keep it private)", out.display());
        }
        CertCommand::Issue { name, hosts, out, ca_dir, days } => {
            if name.is_empty() || name.contains('/') || name.starts_with('.') {
                bail!("invalid certificate name {name:?}: it names the files NAME.crt and NAME.key");
            }
            let ca_dir = ca_dir.unwrap_or_else(|| tls_dir(repo_dir));
            if !ca_dir.join(CA_KEY).exists() {
                bail!(
                    "no CA in {} (no {CA_KEY}): a repo made with `fjord init --no-tls` or before TLS has none; pass --ca-dir",
                    ca_dir.display()
                );
            }
            let ca = Ca::load_dir(&ca_dir)?;
            let (cert, key) = (out.join(format!("{name}.crt")), out.join(format!("{name}.key")));
            ca.issue_to_files(&name, &hosts, Duration::from_secs(u64::from(days) * 86400), &cert, &key)?;
            say!(
                "issued {} and {} for {} (valid {days} days), signed by {}",
                cert.display(),
                key.display(),
                hosts.join(", "),
                ca_dir.join(CA_CERT).display()
            );
        }
    }
    Ok(())
}
