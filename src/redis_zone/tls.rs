//! The TLS of `rediss://` zones: rustls over the zone's nginx connections,
//! verifying the server's certificate against the zone's `ssl_trusted_certificate`
//! (else the public roots) and presenting its client certificate, if any.

use std::sync::Arc;

use redis::{ClientTlsConfig, TlsCertificates};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::{ClientConfig, RootCertStore};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_rustls::client::TlsStream;
use tokio_rustls::TlsConnector;

use super::RedisError;

/// The client configuration of a zone's TLS connections.
pub fn client_config(certs: &Option<TlsCertificates>) -> Result<Arc<ClientConfig>, RedisError> {
    let bad = |what: &str, e: &dyn std::fmt::Display| RedisError::Io(format!("{what}: {e}"));
    let mut roots = RootCertStore::empty();
    match certs.as_ref().and_then(|c| c.root_cert.as_ref()) {
        Some(pem) => {
            for cert in CertificateDer::pem_slice_iter(pem) {
                let cert = cert.map_err(|e| bad("cannot read the trusted certificates", &e))?;
                roots.add(cert).map_err(|e| bad("cannot use a trusted certificate", &e))?;
            }
        }
        None => roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned()),
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| bad("TLS", &e))?
        .with_root_certificates(roots);
    let config = match certs.as_ref().and_then(|c| c.client_tls.as_ref()) {
        Some(ClientTlsConfig { client_cert, client_key }) => {
            let chain = CertificateDer::pem_slice_iter(client_cert)
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| bad("cannot read the client certificate", &e))?;
            let key = PrivateKeyDer::from_pem_slice(client_key).map_err(|e| bad("cannot read the client key", &e))?;
            builder.with_client_auth_cert(chain, key).map_err(|e| bad("cannot use the client certificate", &e))?
        }
        None => builder.with_no_client_auth(),
    };
    Ok(Arc::new(config))
}

/// The TLS handshake over `stream` with the server named `host` (a name or
/// an address, verified against the server's certificate).
pub async fn handshake<S>(config: Arc<ClientConfig>, host: &str, stream: S) -> Result<TlsStream<S>, RedisError>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let name = ServerName::try_from(host.to_string()).map_err(|e| RedisError::Io(format!("TLS name {host}: {e}")))?;
    TlsConnector::from(config).connect(name, stream).await.map_err(|e| RedisError::Io(format!("TLS handshake: {e}")))
}
