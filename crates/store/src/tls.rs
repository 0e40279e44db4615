//! TLS to PostgreSQL, with rustls, chosen by the URL as libpq does:
//!
//! | `sslmode` | connection |
//! |---|---|
//! | `disable` | plain |
//! | `prefer` (the default) | TLS when the server offers it, else plain; the certificate is not checked |
//! | `require` | TLS, or no connection; the certificate is not checked |
//! | `verify-ca`, `verify-full` | TLS with the certificate checked against `sslrootcert` (a PEM file), or the Mozilla roots without it, and the host name |
//!
//! (libpq's `verify-ca` checks the chain but not the name; here it checks
//! both, which is stricter.) tokio-postgres itself knows only the first
//! three modes and not `sslrootcert`, so both are read here and the rest of
//! the URL is handed to it.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_postgres::tls::{ChannelBinding, MakeTlsConnect, TlsConnect};

use crate::error::{Error, Result};

/// A PostgreSQL URL (or `key=value` string) read for its TLS settings.
pub struct Target {
    pub config: tokio_postgres::Config,
    pub tls: Tls,
}

/// Parses `url`: the TLS settings here, the rest by tokio-postgres.
pub fn parse(url: &str) -> Result<Target> {
    let (rest, mode, root) = split_tls_params(url);
    let mut config: tokio_postgres::Config =
        rest.parse().map_err(|e: tokio_postgres::Error| Error::Config(e.to_string()))?;
    let verify = match mode.as_deref() {
        None | Some("prefer") => false,
        Some("disable") => {
            config.ssl_mode(tokio_postgres::config::SslMode::Disable);
            false
        }
        Some("require") => {
            config.ssl_mode(tokio_postgres::config::SslMode::Require);
            false
        }
        Some("verify-ca" | "verify-full") => {
            config.ssl_mode(tokio_postgres::config::SslMode::Require);
            true
        }
        Some(other) => {
            return Err(Error::Config(format!(
                "sslmode={other} is not one of disable, prefer, require, verify-ca, verify-full"
            )))
        }
    };
    let client = if verify { verifying(root.as_deref())? } else { encrypting_only() };
    Ok(Target { config, tls: Tls(Arc::new(client)) })
}

/// Takes `sslmode` and `sslrootcert` out of a URL's query string or a
/// `key=value` string.
fn split_tls_params(url: &str) -> (String, Option<String>, Option<String>) {
    let (mut mode, mut root) = (None, None);
    let mut take = |key: &str, value: &str| match key {
        "sslmode" => {
            mode = Some(value.to_string());
            true
        }
        "sslrootcert" => {
            root = Some(percent_decode(value));
            true
        }
        _ => false,
    };
    let rest = if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        match url.split_once('?') {
            Some((base, query)) => {
                let kept: Vec<&str> =
                    query.split('&').filter(|kv| !kv.split_once('=').is_some_and(|(k, v)| take(k, v))).collect();
                if kept.is_empty() {
                    base.to_string()
                } else {
                    format!("{base}?{}", kept.join("&"))
                }
            }
            None => url.to_string(),
        }
    } else {
        url.split_whitespace()
            .filter(|kv| !kv.split_once('=').is_some_and(|(k, v)| take(k, v)))
            .collect::<Vec<_>>()
            .join(" ")
    };
    (rest, mode, root)
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        match (bytes[i], bytes.get(i + 1).copied().and_then(hex), bytes.get(i + 2).copied().and_then(hex)) {
            (b'%', Some(h), Some(l)) => {
                out.push((h * 16 + l) as u8);
                i += 3;
            }
            (b, _, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn verifying(root: Option<&str>) -> Result<ClientConfig> {
    let mut roots = RootCertStore::empty();
    match root {
        Some(path) => {
            use rustls::pki_types::pem::PemObject;
            let certs = CertificateDer::pem_file_iter(path)
                .map_err(|e| Error::Config(format!("sslrootcert {path}: {e}")))?
                .collect::<std::result::Result<Vec<_>, _>>()
                .map_err(|e| Error::Config(format!("sslrootcert {path}: {e}")))?;
            for cert in certs {
                roots.add(cert).map_err(|e| Error::Config(format!("sslrootcert {path}: {e}")))?;
            }
        }
        None => roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned()),
    }
    Ok(ClientConfig::builder().with_root_certificates(roots).with_no_client_auth())
}

/// `prefer` and `require`, as libpq: encrypted, the server not checked.
fn encrypting_only() -> ClientConfig {
    let provider = rustls::crypto::ring::default_provider();
    ClientConfig::builder()
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(Unchecked(provider.signature_verification_algorithms)))
        .with_no_client_auth()
}

#[derive(Debug)]
struct Unchecked(rustls::crypto::WebPkiSupportedAlgorithms);

impl ServerCertVerifier for Unchecked {
    fn verify_server_cert(
        &self,
        _: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        _: UnixTime,
    ) -> std::result::Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.0)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.0)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_schemes()
    }
}

/// The connector tokio-postgres and the pool use.
#[derive(Clone)]
pub struct Tls(Arc<ClientConfig>);

impl<S> MakeTlsConnect<S> for Tls
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    type Stream = Stream<S>;
    type TlsConnect = Connect;
    type Error = io::Error;

    fn make_tls_connect(&mut self, domain: &str) -> io::Result<Connect> {
        let name = ServerName::try_from(domain.to_string())
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, format!("TLS server name {domain:?}: {e}")))?;
        Ok(Connect { config: self.0.clone(), name })
    }
}

pub struct Connect {
    config: Arc<ClientConfig>,
    name: ServerName<'static>,
}

impl<S> TlsConnect<S> for Connect
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    type Stream = Stream<S>;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = io::Result<Stream<S>>> + Send>>;

    fn connect(self, stream: S) -> Self::Future {
        Box::pin(async move {
            let tls = tokio_rustls::TlsConnector::from(self.config).connect(self.name, stream).await?;
            Ok(Stream(tls))
        })
    }
}

/// A TLS session with the server.
pub struct Stream<S>(tokio_rustls::client::TlsStream<S>);

impl<S: AsyncRead + AsyncWrite + Unpin> tokio_postgres::tls::TlsStream for Stream<S> {
    fn channel_binding(&self) -> ChannelBinding {
        ChannelBinding::none()
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncRead for Stream<S> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncWrite for Stream<S> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tls_settings_are_taken_out_of_urls_and_key_value_strings() {
        let (rest, mode, root) =
            split_tls_params("postgres://u@h:5/db?sslmode=verify-full&application_name=x&sslrootcert=%2Ftmp%2Fca.pem");
        assert_eq!(rest, "postgres://u@h:5/db?application_name=x");
        assert_eq!(mode.as_deref(), Some("verify-full"));
        assert_eq!(root.as_deref(), Some("/tmp/ca.pem"));
        let (rest, mode, _) = split_tls_params("host=h dbname=d sslmode=require");
        assert_eq!((rest.as_str(), mode.as_deref()), ("host=h dbname=d", Some("require")));
        assert!(parse("postgres://h/db?sslmode=sometimes").is_err());
        assert!(parse("postgres://h/db?sslmode=verify-full&sslrootcert=/nonexistent.pem").is_err());
    }
}
