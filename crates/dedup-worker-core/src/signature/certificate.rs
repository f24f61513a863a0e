//! An X.509 certificate's RSA key, for senders that sign with a private key and publish the
//! certificate (PayPal's `SHA256withRSA`): read from PEM once (at start for a configured one,
//! once per URL for a fetched one), then checked per delivery for its validity period and used
//! to verify RSA PKCS#1 v1.5 SHA-256 signatures.
//!
//! Parsing is x509-parser's, verification ring's (both already in the tree through the AMQP
//! client's TLS): no home-made ASN.1 or RSA.

use ring::signature::{UnparsedPublicKey, RSA_PKCS1_2048_8192_SHA256};
use x509_parser::pem::Pem;
use x509_parser::public_key::PublicKey;

/// The most PEM text read for one certificate (a file, an inline value, a fetched body): a
/// certificate with its chain is a few KiB.
pub const MAX_PEM_BYTES: usize = 64 * 1024;

/// The RSA key of a certificate and what is checked of the certificate per delivery.
#[derive(Clone)]
pub struct RsaCertificate {
    /// The subject's common name (`messageverificationcerts.paypal.com`), if it has one.
    common_name: Option<String>,
    /// Start of the validity period, Unix seconds.
    not_before: i64,
    /// End of the validity period, Unix seconds.
    not_after: i64,
    /// The public key as DER `RSAPublicKey` (PKCS#1), as ring takes it.
    public_key: Vec<u8>,
}

/// Why a PEM text is not a usable certificate.
#[derive(Debug, thiserror::Error)]
pub enum CertificateError {
    /// Longer than [`MAX_PEM_BYTES`].
    #[error("longer than {MAX_PEM_BYTES} bytes")]
    TooLong,
    /// No `-----BEGIN CERTIFICATE-----` block could be read.
    #[error("no PEM CERTIFICATE block: {0}")]
    NotPem(String),
    /// The block is not an X.509 certificate.
    #[error("not an X.509 certificate: {0}")]
    NotX509(String),
    /// The certificate's key is not an RSA key.
    #[error("its public key is not an RSA key")]
    NotRsa,
}

impl std::fmt::Debug for RsaCertificate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RsaCertificate")
            .field("common_name", &self.common_name)
            .field("not_before", &self.not_before)
            .field("not_after", &self.not_after)
            .finish_non_exhaustive()
    }
}

impl RsaCertificate {
    /// The first certificate of a PEM text (a leaf followed by its chain, as PayPal serves it).
    pub fn from_pem(pem: &[u8]) -> Result<Self, CertificateError> {
        if pem.len() > MAX_PEM_BYTES {
            return Err(CertificateError::TooLong);
        }
        let block = Pem::iter_from_buffer(pem)
            .find(|block| {
                block
                    .as_ref()
                    .map_or(true, |block| block.label == "CERTIFICATE")
            })
            .ok_or_else(|| CertificateError::NotPem("none found".into()))?
            .map_err(|e| CertificateError::NotPem(e.to_string()))?;
        let certificate = block
            .parse_x509()
            .map_err(|e| CertificateError::NotX509(e.to_string()))?;
        let key = certificate.public_key();
        if !matches!(key.parsed(), Ok(PublicKey::RSA(_))) {
            return Err(CertificateError::NotRsa);
        }
        let common_name = certificate
            .subject()
            .iter_common_name()
            .next()
            .and_then(|cn| cn.as_str().ok())
            .map(str::to_owned);
        let validity = certificate.validity();
        Ok(RsaCertificate {
            common_name,
            not_before: validity.not_before.timestamp(),
            not_after: validity.not_after.timestamp(),
            public_key: key.subject_public_key.data.to_vec(),
        })
    }

    /// The subject's common name, if it has one.
    pub fn common_name(&self) -> Option<&str> {
        self.common_name.as_deref()
    }

    /// The end of the validity period, Unix seconds (how long a fetched copy may be kept).
    pub fn not_after(&self) -> i64 {
        self.not_after
    }

    /// Whether `now` (Unix seconds) is within the validity period, both ends included.
    pub fn is_valid_at(&self, now: i64) -> bool {
        (self.not_before..=self.not_after).contains(&now)
    }

    /// Whether `signature` is this key's RSA PKCS#1 v1.5 SHA-256 signature (`SHA256withRSA`)
    /// of `message`. A public-key check: nothing secret to compare, so no timing concern.
    pub fn verifies_sha256(&self, message: &[u8], signature: &[u8]) -> bool {
        UnparsedPublicKey::new(&RSA_PKCS1_2048_8192_SHA256, &self.public_key)
            .verify(message, signature)
            .is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_is_not_an_rsa_certificate_is_refused_without_a_panic() {
        for text in [
            &b""[..],
            b"not pem",
            b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
            b"-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n",
            b"-----BEGIN CERTIFICATE-----\n\xff\xfe\n-----END CERTIFICATE-----\n",
        ] {
            assert!(RsaCertificate::from_pem(text).is_err(), "{text:?}");
        }
        assert!(matches!(
            RsaCertificate::from_pem(&vec![b'a'; MAX_PEM_BYTES + 1]),
            Err(CertificateError::TooLong)
        ));
    }

    /// A self-signed test certificate (python `cryptography`, 2020-01-01 to 2100-01-01) and a
    /// signature its key made of PayPal's signed string for a test delivery.
    const PEM: &str = include_str!("testdata/rsa_test_certificate.pem");
    const SIGNED: &str =
        "69cd13f0-d67a-11e5-baa3-778b53f4ae55|2024-05-01T12:00:00Z|1JE4291016473214C|2325436976";
    const SIGNATURE: &str = "Jlo+J5oc4OJe4tUxi/No3Kr8pCRD0a8F3tlRRvoHH+Zat/gDqMpunByxMO62EXvGfKNP7GcofORIFrlEMe9Ox+r+P9Otpsmi8vldGyG1YHMLhUFFlKKOB69uVj+BS699sDFp3Hz6sWWlDJGEUjD9vCDFRFJSMeilq7bm1B/VUTPYyHH2asJm3+6/bBlVR38xYMuWKd+OKnpkpZOZK9/9dOiUDTdx1mSlJ24MQEpfRZ1pummSgOmK7EdYzh2ykWzSaW4Yi4/UhYOeUbSMCB/IGadprUmxf5bypbZGMNALbZhsi5RJMO4mo/8rjDVfNEhmxibaoXOQ1jH5FrFehlBFxg==";

    #[test]
    fn a_certificate_is_read_and_verifies_its_keys_signatures_only() {
        use base64::Engine;
        let certificate = RsaCertificate::from_pem(PEM.as_bytes()).expect("valid");
        assert_eq!(
            certificate.common_name(),
            Some("messageverificationcerts.paypal.com")
        );
        assert!(certificate.is_valid_at(1_577_836_800));
        assert!(certificate.is_valid_at(4_102_444_800));
        assert!(!certificate.is_valid_at(1_577_836_799));
        assert!(!certificate.is_valid_at(4_102_444_801));
        let signature = base64::engine::general_purpose::STANDARD
            .decode(SIGNATURE)
            .unwrap();
        assert!(certificate.verifies_sha256(SIGNED.as_bytes(), &signature));
        assert!(!certificate.verifies_sha256(SIGNED.replace("1JE", "2JE").as_bytes(), &signature));
        assert!(!certificate.verifies_sha256(SIGNED.as_bytes(), &signature[1..]));
        // A chain after the leaf, and text before it, change nothing.
        let bundle = format!("junk\n{PEM}{PEM}");
        assert!(RsaCertificate::from_pem(bundle.as_bytes()).is_ok());
    }
}
