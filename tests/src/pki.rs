//! Test certificates for the TLS tests: a CA made on the spot (rcgen), the certificates it
//! issues for `localhost` and 127.0.0.1, written as PEM files into a directory.

use std::path::{Path, PathBuf};

/// A CA that exists only for one test.
#[derive(Debug)]
pub struct TestCa {
    params: rcgen::CertificateParams,
    key: rcgen::KeyPair,
    /// The CA's certificate (PEM).
    pub cert_pem: String,
}

/// A certificate and its private key, as PEM files.
#[derive(Debug, Clone)]
pub struct Issued {
    /// The certificate file.
    pub cert_file: PathBuf,
    /// The private key file.
    pub key_file: PathBuf,
}

impl TestCa {
    /// A new CA named `name`.
    pub fn new(name: &str) -> TestCa {
        let key = rcgen::KeyPair::generate().expect("generate a CA key");
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("CA params");
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params.distinguished_name = rcgen::DistinguishedName::new();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, name);
        let cert_pem = params.self_signed(&key).expect("self-sign the CA").pem();
        TestCa {
            params,
            key,
            cert_pem,
        }
    }

    /// Writes the CA's certificate to `dir/<name>` and answers the path.
    pub fn write_cert(&self, dir: &Path, name: &str) -> PathBuf {
        let path = dir.join(name);
        std::fs::write(&path, &self.cert_pem).expect("write the CA certificate");
        path
    }

    /// Issues a certificate for `localhost` and 127.0.0.1 (good for a server and a client),
    /// written to `dir/<name>.pem` and `dir/<name>.key`.
    pub fn issue(&self, dir: &Path, name: &str) -> Issued {
        let key = rcgen::KeyPair::generate().expect("generate a key");
        let mut params =
            rcgen::CertificateParams::new(vec!["localhost".to_owned(), "127.0.0.1".to_owned()])
                .expect("certificate params");
        params.distinguished_name = rcgen::DistinguishedName::new();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, name);
        let issuer = rcgen::Issuer::from_params(&self.params, &self.key);
        let cert = params
            .signed_by(&key, &issuer)
            .expect("sign the certificate");
        let issued = Issued {
            cert_file: dir.join(format!("{name}.pem")),
            key_file: dir.join(format!("{name}.key")),
        };
        std::fs::write(&issued.cert_file, cert.pem()).expect("write the certificate");
        std::fs::write(&issued.key_file, key.serialize_pem()).expect("write the key");
        issued
    }
}
