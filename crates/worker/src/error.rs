//! Why a worker could not start or keep running.

use std::net::SocketAddr;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("invalid worker configuration: {0}")]
    Config(#[from] composer_config::ConfigError),
    #[error("cannot listen on {addr} (COMPOSER_WORKER_LISTEN): {source}")]
    Listen { addr: SocketAddr, source: std::io::Error },
}
