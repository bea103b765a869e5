//! The client's side of TLS, for an `https://` gateway: the CAs it trusts (`--ca-file`, else
//! the system's), and for mTLS the client certificate and key it presents (`--cert-file`,
//! `--key-file`). The handshake is made here with tokio-rustls and aws-lc-rs, like the
//! gateway's (see toolgate-server's `tls` module for why not tonic's TLS).

use std::future::Future;
use std::io;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use anyhow::{Context as _, bail};
use hyper_util::rt::TokioIo;
use rustls::RootCertStore;
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use tonic::codegen::Service;
use tonic::codegen::http::Uri;

/// Files of the client's TLS settings.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ClientFiles<'a> {
    pub(crate) ca_file: Option<&'a Path>,
    pub(crate) cert_file: Option<&'a Path>,
    pub(crate) key_file: Option<&'a Path>,
}

/// Connects to a gateway over TLS: TCP to the URI's host and port (443 by default), then the
/// handshake, checking the gateway's certificate against the URI's host.
#[derive(Debug, Clone)]
pub(crate) struct TlsConnector {
    config: Arc<rustls::ClientConfig>,
}

impl TlsConnector {
    /// The connector for `files`; every file is read now, so a bad one is named before any
    /// connection is tried.
    pub(crate) fn new(files: ClientFiles<'_>) -> anyhow::Result<TlsConnector> {
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let mut roots = RootCertStore::empty();
        match files.ca_file {
            Some(path) => {
                let (added, _) = roots.add_parsable_certificates(certificates(path, "--ca-file")?);
                if added == 0 {
                    bail!(
                        "--ca-file: no certificate in {} can be used as a CA",
                        path.display()
                    );
                }
            }
            None => {
                let native = rustls_native_certs::load_native_certs();
                let (added, _) = roots.add_parsable_certificates(native.certs);
                if added == 0 {
                    bail!(
                        "no CA certificates found on this system to check the gateway's certificate; pass --ca-file (or set TOOLGATE_CA_FILE)"
                    );
                }
            }
        }
        let builder = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .context("the TLS provider refuses its default protocol versions")?
            .with_root_certificates(roots);
        let mut config = match (files.cert_file, files.key_file) {
            (Some(cert), Some(key)) => {
                let chain = certificates(cert, "--cert-file")?;
                let key = PrivateKeyDer::from_pem_file(key).with_context(|| {
                    format!(
                        "--key-file: {} holds no usable PEM private key",
                        key.display()
                    )
                })?;
                builder
                    .with_client_auth_cert(chain, key)
                    .context("--key-file does not match the certificate of --cert-file")?
            }
            (None, None) => builder.with_no_client_auth(),
            (Some(_), None) => bail!("--cert-file needs --key-file (TOOLGATE_CLIENT_KEY_FILE)"),
            (None, Some(_)) => bail!("--key-file needs --cert-file (TOOLGATE_CLIENT_CERT_FILE)"),
        };
        config.alpn_protocols = vec![b"h2".to_vec()];
        Ok(TlsConnector {
            config: Arc::new(config),
        })
    }
}

impl Service<Uri> for TlsConnector {
    type Response = TokioIo<TlsStream<TcpStream>>;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = io::Result<Self::Response>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let connector = tokio_rustls::TlsConnector::from(Arc::clone(&self.config));
        Box::pin(async move {
            let invalid = |what: &str| io::Error::new(io::ErrorKind::InvalidInput, what.to_owned());
            let host = uri
                .host()
                .ok_or_else(|| invalid("the address has no host"))?;
            // `[::1]` in a URI is `::1` to connect to and to check the certificate against.
            let host = host
                .trim_start_matches('[')
                .trim_end_matches(']')
                .to_owned();
            let port = uri.port_u16().unwrap_or(443);
            let name = ServerName::try_from(host.clone())
                .map_err(|_| invalid("the address's host is not a valid server name"))?;
            let tcp = TcpStream::connect((host.as_str(), port)).await?;
            tcp.set_nodelay(true)?;
            let tls = connector.connect(name, tcp).await?;
            Ok(TokioIo::new(tls))
        })
    }
}

fn certificates(path: &Path, flag: &str) -> anyhow::Result<Vec<CertificateDer<'static>>> {
    let certificates = CertificateDer::pem_file_iter(path)
        .with_context(|| format!("{flag}: cannot read {}", path.display()))?
        .collect::<Result<Vec<_>, _>>()
        .with_context(|| format!("{flag}: {} is not valid PEM", path.display()))?;
    if certificates.is_empty() {
        bail!("{flag}: {} holds no PEM certificate", path.display());
    }
    Ok(certificates)
}
