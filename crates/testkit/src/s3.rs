//! An S3 protocol server for the tests: `s3s-fs` (buckets as directories)
//! over a directory of its own, on a free loopback port, checking every
//! request's signature (SigV4) against one key pair — a real server that
//! speaks the protocol over HTTP, not a stand-in for the client.

use std::path::PathBuf;

use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto::Builder;
use s3s::auth::SimpleAuth;
use s3s::service::S3ServiceBuilder;

/// A running server; it stops, and its directory goes, when dropped.
pub struct S3Server {
    /// `http://127.0.0.1:PORT`.
    pub endpoint: String,
    pub access_key: String,
    pub secret_key: String,
    dir: PathBuf,
    task: tokio::task::JoinHandle<()>,
}

impl S3Server {
    /// Starts a server with one bucket, `bucket`.
    pub async fn start(bucket: &str) -> S3Server {
        let dir = std::env::temp_dir().join(format!("composer-s3-{}", uuid::Uuid::now_v7()));
        std::fs::create_dir_all(dir.join(bucket)).expect("making the S3 server's directory");
        let (access_key, secret_key) = ("composer-test".to_string(), format!("secret-{}", uuid::Uuid::now_v7()));
        let mut service = S3ServiceBuilder::new(s3s_fs::FileSystem::new(&dir).expect("the S3 server's file system"));
        service.set_auth(SimpleAuth::from_single(access_key.clone(), secret_key.clone()));
        let service = service.build();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("a port for the S3 server");
        let endpoint = format!("http://{}", listener.local_addr().unwrap());
        let task = tokio::spawn(async move {
            let http = Builder::new(TokioExecutor::new());
            while let Ok((socket, _)) = listener.accept().await {
                let conn = http.serve_connection(TokioIo::new(socket), service.clone()).into_owned();
                tokio::spawn(async move {
                    let _ = conn.await;
                });
            }
        });
        S3Server { endpoint, access_key, secret_key, dir, task }
    }

    /// The client's settings, by their `AWS_*` names.
    pub fn options(&self) -> Vec<(String, String)> {
        [
            ("AWS_ENDPOINT", self.endpoint.as_str()),
            ("AWS_ACCESS_KEY_ID", &self.access_key),
            ("AWS_SECRET_ACCESS_KEY", &self.secret_key),
            ("AWS_REGION", "us-east-1"),
            ("AWS_ALLOW_HTTP", "true"),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
    }

    /// Where the server keeps bucket `bucket`'s objects.
    pub fn bucket_dir(&self, bucket: &str) -> PathBuf {
        self.dir.join(bucket)
    }
}

impl Drop for S3Server {
    fn drop(&mut self) {
        self.task.abort();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
