//! `[outbox.sinks.NAME.tls]`'s files, read and parsed: at start-up by the checks (a file that
//! cannot be read or used refuses the start, naming its key), and again by the HTTP sink when
//! its lane is built.

use std::path::Path;

use super::outbox::SinkTlsSettings;

/// What `[outbox.sinks.NAME.tls]` names, read and parsed.
pub struct SinkTls {
    /// `client_cert` and `client_key`, presented to the receiver.
    pub identity: Option<reqwest::Identity>,
    /// `ca`: the only roots the receiver's certificate may chain to.
    pub roots: Option<Vec<reqwest::Certificate>>,
}

impl SinkTls {
    /// `builder` presenting the client certificate and trusting only `ca`, as given.
    pub fn apply_to(self, mut builder: reqwest::ClientBuilder) -> reqwest::ClientBuilder {
        if let Some(identity) = self.identity {
            builder = builder.identity(identity);
        }
        if let Some(roots) = self.roots {
            // The receiver's CA replaces the built-in roots: a private CA's receiver is then
            // trusted for this sink alone, and no public CA can stand in for it.
            builder = builder.tls_built_in_root_certs(false);
            for root in roots {
                builder = builder.add_root_certificate(root);
            }
        }
        builder
    }
}

/// Reads and parses the files of `tls`; `Err` names the field (`client_cert`, …) and why.
pub fn read_sink_tls(tls: &SinkTlsSettings) -> Result<SinkTls, (&'static str, String)> {
    let identity = match (&tls.client_cert, &tls.client_key) {
        (None, None) => None,
        (None, Some(_)) => {
            return Err((
                "client_cert",
                "is not set, but client_key is: a key is presented with its certificate".into(),
            ))
        }
        (Some(_), None) => {
            return Err((
                "client_key",
                "is not set, but client_cert is: the certificate's private key (PEM)".into(),
            ))
        }
        (Some(cert), Some(key)) => {
            let cert_pem = read_pem("client_cert", cert)?;
            certificates("client_cert", cert, &cert_pem)?;
            let mut both = cert_pem;
            both.push(b'\n');
            both.extend(read_pem("client_key", key)?);
            let identity = reqwest::Identity::from_pem(&both).map_err(|error| {
                (
                    "client_key",
                    format!(
                        "{} holds no private key reqwest can use (PEM `PRIVATE KEY`, \
                         `RSA PRIVATE KEY` or `EC PRIVATE KEY`, not encrypted): {}",
                        key.display(),
                        error_text(&error)
                    ),
                )
            })?;
            Some(identity)
        }
    };
    let roots = match &tls.ca {
        None => None,
        Some(ca) => {
            let pem = read_pem("ca", ca)?;
            Some(certificates("ca", ca, &pem)?)
        }
    };
    Ok(SinkTls { identity, roots })
}

fn read_pem(field: &'static str, path: &Path) -> Result<Vec<u8>, (&'static str, String)> {
    std::fs::read(path).map_err(|error| (field, format!("cannot read {}: {error}", path.display())))
}

/// The certificates of a PEM file, at least one.
fn certificates(
    field: &'static str,
    path: &Path,
    pem: &[u8],
) -> Result<Vec<reqwest::Certificate>, (&'static str, String)> {
    match reqwest::Certificate::from_pem_bundle(pem) {
        Ok(certificates) if !certificates.is_empty() => Ok(certificates),
        Ok(_) => Err((
            field,
            format!(
                "{} holds no certificate (PEM, `-----BEGIN CERTIFICATE-----`)",
                path.display()
            ),
        )),
        Err(error) => Err((
            field,
            format!(
                "{} is not a PEM certificate file: {}",
                path.display(),
                error_text(&error)
            ),
        )),
    }
}

/// A reqwest error with its causes (its own text is often only "builder error").
fn error_text(error: &reqwest::Error) -> String {
    let mut text = error.to_string();
    let mut source = std::error::Error::source(error);
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// Reads and parses the files of `tls`, and tries what reqwest checks only when it builds a
/// client (a key that does not match its certificate, a CA certificate rustls cannot use), one
/// file at a time so that `Err` names the right field.
pub(super) fn check_sink_tls(tls: &SinkTlsSettings) -> Result<(), (&'static str, String)> {
    let SinkTls { identity, roots } = read_sink_tls(tls)?;
    let trial = |field: &'static str, tls: SinkTls| {
        tls.apply_to(reqwest::Client::builder())
            .build()
            .map(drop)
            .map_err(|error| (field, format!("cannot be used: {}", error_text(&error))))
    };
    if let Some(identity) = identity {
        trial(
            "client_key",
            SinkTls {
                identity: Some(identity),
                roots: None,
            },
        )?;
    }
    if let Some(roots) = roots {
        trial(
            "ca",
            SinkTls {
                identity: None,
                roots: Some(roots),
            },
        )?;
    }
    Ok(())
}
