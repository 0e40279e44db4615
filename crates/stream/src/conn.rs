//! The connection to Redis: one server or a cluster, and how either is
//! opened from its URL (with the CA of a `rediss://` server when given).

use std::path::Path;
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClientBuilder;
use redis::cluster_async::ClusterConnection;
use redis::Value;

use crate::error::{Error, Result};

/// A connection to one server or to a cluster (which routes each command
/// by its key and follows the cluster through failovers and migrations).
#[derive(Clone)]
pub(crate) enum Conn {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

impl redis::aio::ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a redis::Cmd) -> redis::RedisFuture<'a, Value> {
        match self {
            Conn::Single(c) => c.req_packed_command(cmd),
            Conn::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> redis::RedisFuture<'a, Vec<Value>> {
        match self {
            Conn::Single(c) => c.req_packed_commands(pipeline, offset, count),
            Conn::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Single(c) => c.get_db(),
            Conn::Cluster(c) => c.get_db(),
        }
    }
}

/// The nodes of a `redis+cluster://a:1,b:2` (or `rediss+cluster://`) URL,
/// as node URLs; `None` for any other URL.
pub fn cluster_nodes(url: &str) -> Option<Vec<String>> {
    let (scheme, rest) = url.split_once("://")?;
    let node_scheme = match scheme {
        "redis+cluster" => "redis",
        "rediss+cluster" => "rediss",
        _ => return None,
    };
    // Credentials, when given, are for every node: `redis+cluster://:pw@a:1,b:2`.
    let (auth, hosts) = match rest.rsplit_once('@') {
        Some((auth, hosts)) => (format!("{auth}@"), hosts),
        None => (String::new(), rest),
    };
    let nodes: Vec<String> = hosts
        .trim_end_matches('/')
        .split(',')
        .filter(|h| !h.is_empty())
        .map(|h| format!("{node_scheme}://{auth}{h}"))
        .collect();
    Some(nodes)
}

impl Conn {
    /// Connects to the server or cluster `url` names, checking a
    /// `rediss://` server against the CA in `ca_file` (PEM) when given.
    /// Also returns the clients to subscribe with: the server, or each node
    /// of a cluster.
    pub(crate) async fn open(url: &str, ca_file: Option<&Path>) -> Result<(Conn, Vec<redis::Client>)> {
        let root_cert = match ca_file {
            Some(path) => Some(std::fs::read(path).map_err(|e| Error::Tls(format!("{}: {e}", path.display())))?),
            None => None,
        };
        match cluster_nodes(url) {
            Some(nodes) => Conn::open_cluster(nodes, root_cert).await,
            None => Conn::open_single(url, root_cert).await,
        }
    }

    /// A connection that follows the cluster of `nodes`.
    async fn open_cluster(nodes: Vec<String>, root_cert: Option<Vec<u8>>) -> Result<(Conn, Vec<redis::Client>)> {
        if nodes.is_empty() {
            return Err(Error::Redis(redis::RedisError::from((
                redis::ErrorKind::InvalidClientConfig,
                "a redis+cluster:// URL names no node",
            ))));
        }
        let mut builder = ClusterClientBuilder::new(nodes.clone())
            .connection_timeout(Duration::from_secs(2))
            .response_timeout(Duration::from_secs(5));
        if let Some(root_cert) = root_cert.clone() {
            builder = builder.certs(redis::TlsCertificates { client_tls: None, root_cert: Some(root_cert) });
        }
        let client = builder.build()?;
        let conn = client.get_async_connection().await?;
        let subscribe_to = nodes
            .iter()
            .map(|node| match &root_cert {
                Some(root_cert) => redis::Client::build_with_tls(
                    node.as_str(),
                    redis::TlsCertificates { client_tls: None, root_cert: Some(root_cert.clone()) },
                ),
                None => redis::Client::open(node.as_str()),
            })
            .collect::<redis::RedisResult<Vec<_>>>()?;
        Ok((Conn::Cluster(conn), subscribe_to))
    }

    /// A self-reconnecting connection to the one server at `url`.
    async fn open_single(url: &str, root_cert: Option<Vec<u8>>) -> Result<(Conn, Vec<redis::Client>)> {
        let client = match root_cert {
            Some(root_cert) => redis::Client::build_with_tls(
                url,
                redis::TlsCertificates { client_tls: None, root_cert: Some(root_cert) },
            )?,
            None => redis::Client::open(url)?,
        };
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(Duration::from_secs(2)))
            .set_response_timeout(Some(Duration::from_secs(5)))
            .set_number_of_retries(2);
        let conn = ConnectionManager::new_with_config(client.clone(), config).await?;
        Ok((Conn::Single(conn), vec![client]))
    }
}

#[cfg(test)]
mod tests {
    use super::cluster_nodes;

    #[test]
    fn cluster_urls_name_their_nodes_and_other_urls_are_not_clusters() {
        assert_eq!(
            cluster_nodes("redis+cluster://10.0.0.1:7000,10.0.0.2:7001/"),
            Some(vec!["redis://10.0.0.1:7000".to_string(), "redis://10.0.0.2:7001".to_string()])
        );
        assert_eq!(
            cluster_nodes("rediss+cluster://:pw@a:1,b:2"),
            Some(vec!["rediss://:pw@a:1".to_string(), "rediss://:pw@b:2".to_string()])
        );
        assert_eq!(cluster_nodes("redis+cluster://"), Some(vec![]));
        assert_eq!(cluster_nodes("redis://127.0.0.1:6379/"), None);
        assert_eq!(cluster_nodes("rediss://h:1"), None);
    }
}
