//! A certificate authority and the certificates it signs (rcgen, ECDSA
//! P-256), for `strom cluster --secure` and the tests: nothing here is
//! needed to run with certificates from elsewhere.

use rcgen::{BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair, KeyUsagePurpose};

/// A CA's certificate and key.
pub struct Authority {
    cert: rcgen::Certificate,
    key: KeyPair,
}

/// A signed certificate and its key, in PEM.
pub struct Issued {
    pub cert_pem: String,
    pub key_pem: String,
}

impl Issued {
    /// Key and certificate in one file, as `ssl.keystore.location` takes them.
    pub fn keystore_pem(&self) -> String {
        format!("{}{}", self.key_pem, self.cert_pem)
    }
}

fn dn(common_name: &str) -> rcgen::DistinguishedName {
    let mut dn = rcgen::DistinguishedName::new();
    dn.push(DnType::OrganizationName, "Strom");
    dn.push(DnType::CommonName, common_name);
    dn
}

impl Authority {
    pub fn generate(common_name: &str) -> Result<Self, rcgen::Error> {
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.distinguished_name = dn(common_name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let key = KeyPair::generate()?;
        let cert = params.self_signed(&key)?;
        Ok(Self { cert, key })
    }

    pub fn cert_pem(&self) -> String {
        self.cert.pem()
    }

    /// A certificate for a node: valid for `names` (host names or IP
    /// addresses), as a server and as a client of other nodes.
    pub fn issue_server(&self, names: &[&str]) -> Result<Issued, rcgen::Error> {
        self.issue_node(names.first().copied().unwrap_or("strom"), names)
    }

    /// As [`Authority::issue_server`], with subject `CN=<common_name>,O=Strom`
    /// (the principal other nodes see: `User:CN=<common_name>,O=Strom`).
    pub fn issue_node(&self, common_name: &str, names: &[&str]) -> Result<Issued, rcgen::Error> {
        let mut params = CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>())?;
        params.distinguished_name = dn(common_name);
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth, ExtendedKeyUsagePurpose::ClientAuth];
        self.sign(params)
    }

    /// A client certificate whose subject is `CN=<common_name>,O=Strom`.
    pub fn issue_client(&self, common_name: &str) -> Result<Issued, rcgen::Error> {
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.distinguished_name = dn(common_name);
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        self.sign(params)
    }

    fn sign(&self, params: CertificateParams) -> Result<Issued, rcgen::Error> {
        let key = KeyPair::generate()?;
        let cert = params.signed_by(&key, &self.cert, &self.key)?;
        Ok(Issued { cert_pem: cert.pem(), key_pem: key.serialize_pem() })
    }
}
