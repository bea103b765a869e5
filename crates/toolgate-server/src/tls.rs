//! TLS on the gRPC listener (`[server.tls]`): the certificate, key and optional client CA are
//! read and checked when the configuration is loaded, before any port is bound, by building
//! the very rustls configuration the listener then uses, so a missing file, a file without
//! PEM, or a key that does not belong to the certificate stops the start with a message
//! naming the key and the file. With a client CA, every client must present a certificate it
//! issued (mTLS); without one, any client may connect and the bearer token authenticates it.
//!
//! The handshakes are ours (tokio-rustls), not tonic's: its TLS features would change
//! rustls's features and recompile much of the tree, and would use rustls's process-wide
//! provider, which rustls cannot pick alone when more than one is compiled in. Here the
//! provider is aws-lc-rs, passed explicitly; nothing process-wide is installed.

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::Stream;
use rustls::RootCertStore;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::{self, PemObject as _};
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;
use tonic::transport::server::{Connected, TcpConnectInfo};
use tracing::{debug, warn};

/// How long a client may take over its TLS handshake before the connection is closed.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Connections whose handshake is done and that wait for the server to take them.
const ACCEPTED_BACKLOG: usize = 64;

/// The paths of `[server.tls]`, as configured.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsPaths {
    /// The server's certificate chain (PEM), leaf first.
    pub cert_file: PathBuf,
    /// The private key of the certificate (PEM: PKCS#8, PKCS#1 or SEC1).
    pub key_file: PathBuf,
    /// When set, clients must present a certificate issued by one of these CAs (PEM): mTLS.
    pub client_ca_file: Option<PathBuf>,
}

/// `[server.tls]` read and checked: the rustls configuration the listener uses.
#[derive(Clone)]
pub struct ServerTls {
    /// Where the material came from.
    pub paths: TlsPaths,
    config: Arc<rustls::ServerConfig>,
}

impl fmt::Debug for ServerTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The configuration holds the private key: only the paths are shown.
        f.debug_struct("ServerTls")
            .field("paths", &self.paths)
            .finish_non_exhaustive()
    }
}

impl ServerTls {
    /// Reads the files of `paths` and builds the listener's configuration from them: at least
    /// one certificate, a private key that matches the first, and (for mTLS) at least one
    /// usable CA certificate. The error names the config key and the file.
    pub fn load(paths: TlsPaths) -> Result<ServerTls, String> {
        let provider = provider();
        let cert_pem = read(&paths.cert_file, "server.tls.cert_file")?;
        let chain = certificates(&cert_pem, &paths.cert_file, "server.tls.cert_file")?;
        let key_pem = read(&paths.key_file, "server.tls.key_file")?;
        let key = PrivateKeyDer::from_pem_slice(&key_pem).map_err(|error| {
            let file = paths.key_file.display();
            match error {
                pem::Error::NoItemsFound => format!(
                    "server.tls.key_file: {file} holds no PEM private key (BEGIN PRIVATE KEY, BEGIN RSA PRIVATE KEY or BEGIN EC PRIVATE KEY)"
                ),
                other => format!("server.tls.key_file: {file} is not a valid PEM private key: {other}"),
            }
        })?;
        let builder = rustls::ServerConfig::builder_with_provider(Arc::clone(&provider))
            .with_safe_default_protocol_versions()
            .map_err(|e| format!("the TLS provider refuses its default protocol versions: {e}"))?;
        let builder = match &paths.client_ca_file {
            None => builder.with_no_client_auth(),
            Some(path) => builder.with_client_cert_verifier(client_verifier(path, &provider)?),
        };
        let mut config = builder.with_single_cert(chain, key).map_err(|error| {
            let key = paths.key_file.display();
            let cert = paths.cert_file.display();
            match error {
                rustls::Error::InconsistentKeys(_) => format!(
                    "server.tls.key_file: the key in {key} does not match the certificate in {cert} (server.tls.cert_file)"
                ),
                other => format!(
                    "server.tls.key_file: the key in {key} cannot be used with the certificate in {cert}: {other}"
                ),
            }
        })?;
        // gRPC is HTTP/2 only; MCP clients may speak HTTP/1.1 on the same port.
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok(ServerTls {
            paths,
            config: Arc::new(config),
        })
    }

    /// Whether clients must present a certificate (mTLS).
    pub fn requires_client_certificates(&self) -> bool {
        self.paths.client_ca_file.is_some()
    }

    /// The connections of `listener`, each once its handshake has succeeded. Handshakes run
    /// concurrently, each within [`HANDSHAKE_TIMEOUT`]; a failed one (a client that does not
    /// trust the certificate, or presents none when mTLS requires one) closes that connection
    /// only. The stream ends when the listener fails for good.
    pub(crate) fn incoming(
        &self,
        listener: TcpListener,
    ) -> impl Stream<Item = Result<TlsConnection, io::Error>> + Send + 'static {
        let acceptor = TlsAcceptor::from(Arc::clone(&self.config));
        let (accepted, mut taken) = tokio::sync::mpsc::channel(ACCEPTED_BACKLOG);
        tokio::spawn(accept_loop(listener, acceptor, accepted));
        futures::stream::poll_fn(move |cx| taken.poll_recv(cx).map(|next| next.map(Ok)))
    }
}

/// The crypto provider of every TLS configuration the gateway builds.
pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::aws_lc_rs::default_provider())
}

/// One TLS connection, as tonic's server takes it.
#[derive(Debug)]
pub(crate) struct TlsConnection {
    stream: TlsStream<TcpStream>,
    info: TcpConnectInfo,
}

impl Connected for TlsConnection {
    type ConnectInfo = TcpConnectInfo;

    fn connect_info(&self) -> TcpConnectInfo {
        self.info.clone()
    }
}

impl AsyncRead for TlsConnection {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for TlsConnection {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }
}

/// Accepts connections until the server stops taking them, handing each to its own
/// handshake task.
async fn accept_loop(
    listener: TcpListener,
    acceptor: TlsAcceptor,
    accepted: tokio::sync::mpsc::Sender<TlsConnection>,
) {
    loop {
        let (tcp, remote) = tokio::select! {
            next = listener.accept() => match next {
                Ok(next) => next,
                Err(error) => {
                    // Out of file descriptors and the like: wait a moment rather than spin.
                    warn!(%error, "accepting a connection failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            // The server has stopped: release the port.
            () = accepted.closed() => return,
        };
        // Without it, small responses wait for Nagle and delayed ACKs.
        let _ = tcp.set_nodelay(true);
        let local = tcp.local_addr().ok();
        let acceptor = acceptor.clone();
        let accepted = accepted.clone();
        tokio::spawn(async move {
            match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                Ok(Ok(stream)) => {
                    let info = TcpConnectInfo {
                        local_addr: local,
                        remote_addr: Some(remote),
                    };
                    let _ = accepted.send(TlsConnection { stream, info }).await;
                }
                Ok(Err(error)) => debug!(%remote, %error, "TLS handshake failed"),
                Err(_) => debug!(%remote, "TLS handshake timed out"),
            }
        });
    }
}

fn read(path: &Path, key: &str) -> Result<Vec<u8>, String> {
    std::fs::read(path).map_err(|e| format!("{key}: cannot read {}: {e}", path.display()))
}

fn certificates(
    bytes: &[u8],
    path: &Path,
    key: &str,
) -> Result<Vec<CertificateDer<'static>>, String> {
    let certificates = CertificateDer::pem_slice_iter(bytes)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("{key}: {} is not valid PEM: {e}", path.display()))?;
    if certificates.is_empty() {
        return Err(format!(
            "{key}: {} holds no PEM certificate (BEGIN CERTIFICATE)",
            path.display()
        ));
    }
    Ok(certificates)
}

/// The verifier of client certificates: issued by a CA of `path`, required.
fn client_verifier(
    path: &Path,
    provider: &Arc<CryptoProvider>,
) -> Result<Arc<dyn rustls::server::danger::ClientCertVerifier>, String> {
    let key = "server.tls.client_ca_file";
    let bytes = read(path, key)?;
    let mut roots = RootCertStore::empty();
    let (added, _unusable) = roots.add_parsable_certificates(certificates(&bytes, path, key)?);
    if added == 0 {
        return Err(format!(
            "{key}: no certificate in {} can be used as a CA",
            path.display()
        ));
    }
    WebPkiClientVerifier::builder_with_provider(Arc::new(roots), Arc::clone(provider))
        .build()
        .map_err(|e| {
            format!(
                "{key}: the CAs in {} cannot verify clients: {e}",
                path.display()
            )
        })
}

#[cfg(test)]
pub(crate) mod tests {
    use futures::StreamExt as _;
    use rustls::pki_types::ServerName;

    use super::*;

    /// A test CA that issues certificates for `localhost` and 127.0.0.1.
    pub(crate) struct TestCa {
        params: rcgen::CertificateParams,
        key: rcgen::KeyPair,
        pub(crate) cert_pem: String,
    }

    impl TestCa {
        pub(crate) fn new(name: &str) -> TestCa {
            let key = rcgen::KeyPair::generate().unwrap();
            let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
            params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
            params.distinguished_name = rcgen::DistinguishedName::new();
            params
                .distinguished_name
                .push(rcgen::DnType::CommonName, name);
            let cert_pem = params.self_signed(&key).unwrap().pem();
            TestCa {
                params,
                key,
                cert_pem,
            }
        }

        /// A certificate and its key (PEM).
        pub(crate) fn issue(&self) -> (String, String) {
            let key = rcgen::KeyPair::generate().unwrap();
            let mut params =
                rcgen::CertificateParams::new(vec!["localhost".into(), "127.0.0.1".into()])
                    .unwrap();
            params.distinguished_name = rcgen::DistinguishedName::new();
            params
                .distinguished_name
                .push(rcgen::DnType::CommonName, "localhost");
            let issuer = rcgen::Issuer::from_params(&self.params, &self.key);
            let cert = params.signed_by(&key, &issuer).unwrap();
            (cert.pem(), key.serialize_pem())
        }
    }

    /// Files in a temporary directory.
    pub(crate) fn files(dir: &Path, entries: &[(&str, &str)]) {
        for (name, text) in entries {
            std::fs::write(dir.join(name), text).unwrap();
        }
    }

    fn paths(dir: &Path, cert: &str, key: &str, ca: Option<&str>) -> TlsPaths {
        TlsPaths {
            cert_file: dir.join(cert),
            key_file: dir.join(key),
            client_ca_file: ca.map(|ca| dir.join(ca)),
        }
    }

    #[test]
    fn bad_material_is_refused_naming_the_key_and_the_problem() {
        let dir = tempfile::tempdir().unwrap();
        let ca = TestCa::new("test ca");
        let (cert, key) = ca.issue();
        let (_, other_key) = ca.issue();
        files(
            dir.path(),
            &[
                ("cert.pem", &cert),
                ("key.pem", &key),
                ("other-key.pem", &other_key),
                ("ca.pem", &ca.cert_pem),
                ("empty.pem", ""),
                ("garbage.pem", "not pem at all\n"),
            ],
        );
        // (cert, key, client CA, what the message says)
        let cases: &[(&str, &str, Option<&str>, &[&str])] = &[
            (
                "missing.pem",
                "key.pem",
                None,
                &["server.tls.cert_file", "missing.pem", "cannot read"],
            ),
            (
                "cert.pem",
                "missing.pem",
                None,
                &["server.tls.key_file", "missing.pem", "cannot read"],
            ),
            (
                "empty.pem",
                "key.pem",
                None,
                &["server.tls.cert_file", "no PEM certificate"],
            ),
            (
                "key.pem",
                "key.pem",
                None,
                &["server.tls.cert_file", "no PEM certificate"],
            ),
            (
                "cert.pem",
                "garbage.pem",
                None,
                &["server.tls.key_file", "no PEM private key"],
            ),
            (
                "cert.pem",
                "cert.pem",
                None,
                &["server.tls.key_file", "no PEM private key"],
            ),
            (
                "cert.pem",
                "other-key.pem",
                None,
                &["server.tls.key_file", "does not match", "cert.pem"],
            ),
            (
                "cert.pem",
                "key.pem",
                Some("missing.pem"),
                &["server.tls.client_ca_file", "cannot read"],
            ),
            (
                "cert.pem",
                "key.pem",
                Some("empty.pem"),
                &["server.tls.client_ca_file", "no PEM certificate"],
            ),
        ];
        for (cert, key, ca, expected) in cases {
            let error = ServerTls::load(paths(dir.path(), cert, key, *ca)).unwrap_err();
            for part in *expected {
                assert!(error.contains(part), "{cert} {key} {ca:?}: {error}");
            }
        }
        let tls = ServerTls::load(paths(dir.path(), "cert.pem", "key.pem", None)).unwrap();
        assert!(!tls.requires_client_certificates());
        assert_eq!(
            tls.config.alpn_protocols,
            vec![b"h2".to_vec(), b"http/1.1".to_vec()]
        );
        let mtls =
            ServerTls::load(paths(dir.path(), "cert.pem", "key.pem", Some("ca.pem"))).unwrap();
        assert!(mtls.requires_client_certificates());
        // The key is never shown.
        let shown = format!("{mtls:?}");
        assert!(!shown.contains("PRIVATE"), "{shown}");
    }

    /// A client that trusts the CA completes the handshake over a real socket; one that
    /// trusts another CA does not; with mTLS, a client without a certificate does not.
    #[tokio::test]
    async fn handshakes_over_loopback() {
        let dir = tempfile::tempdir().unwrap();
        let ca = TestCa::new("test ca");
        let other = TestCa::new("other ca");
        let (cert, key) = ca.issue();
        let (client_cert, client_key) = ca.issue();
        files(
            dir.path(),
            &[
                ("cert.pem", &cert),
                ("key.pem", &key),
                ("ca.pem", &ca.cert_pem),
            ],
        );
        let client = |trusted: &str, identity: Option<(&str, &str)>| {
            let mut roots = RootCertStore::empty();
            roots.add_parsable_certificates(
                CertificateDer::pem_slice_iter(trusted.as_bytes()).map(Result::unwrap),
            );
            let builder = rustls::ClientConfig::builder_with_provider(provider())
                .with_safe_default_protocol_versions()
                .unwrap()
                .with_root_certificates(roots);
            let config = match identity {
                Some((cert, key)) => builder
                    .with_client_auth_cert(
                        CertificateDer::pem_slice_iter(cert.as_bytes())
                            .map(Result::unwrap)
                            .collect(),
                        PrivateKeyDer::from_pem_slice(key.as_bytes()).unwrap(),
                    )
                    .unwrap(),
                None => builder.with_no_client_auth(),
            };
            tokio_rustls::TlsConnector::from(Arc::new(config))
        };
        async fn handshake(
            address: std::net::SocketAddr,
            connector: tokio_rustls::TlsConnector,
        ) -> io::Result<()> {
            use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
            let tcp = TcpStream::connect(address).await?;
            let mut tls = connector
                .connect(ServerName::try_from("localhost").unwrap(), tcp)
                .await?;
            // TLS 1.3 reports a refused client certificate only on the first read.
            tls.write_all(b"x").await?;
            let mut byte = [0u8; 1];
            match tokio::time::timeout(Duration::from_millis(300), tls.read(&mut byte)).await {
                Ok(Err(error)) => Err(error),
                _ => Ok(()),
            }
        }
        for (ca_file, cases) in [
            (
                None,
                vec![
                    (ca.cert_pem.clone(), None, true),
                    (other.cert_pem.clone(), None, false),
                ],
            ),
            (
                Some("ca.pem"),
                vec![
                    (
                        ca.cert_pem.clone(),
                        Some((client_cert.clone(), client_key.clone())),
                        true,
                    ),
                    (ca.cert_pem.clone(), None, false),
                ],
            ),
        ] {
            let tls = ServerTls::load(paths(dir.path(), "cert.pem", "key.pem", ca_file)).unwrap();
            let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
            let address = listener.local_addr().unwrap();
            let mut incoming = Box::pin(tls.incoming(listener));
            // Keep the accepted connections open until the client is done.
            let server = tokio::spawn(async move {
                let mut held = Vec::new();
                while let Some(connection) = incoming.next().await {
                    held.push(connection.unwrap());
                }
            });
            for (trusted, identity, works) in cases {
                let identity = identity.as_ref().map(|(c, k)| (c.as_str(), k.as_str()));
                let result = handshake(address, client(&trusted, identity)).await;
                assert_eq!(
                    result.is_ok(),
                    works,
                    "mtls {ca_file:?}, identity {}: {result:?}",
                    identity.is_some()
                );
            }
            server.abort();
        }
    }
}
