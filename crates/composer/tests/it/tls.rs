//! TLS to PostgreSQL and Redis, against a local server of each started with
//! a certificate made here (a CA of the test's own signs it).

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use composer_embedded::{free_port, temp_dir, LocalPostgres, PgOptions};
use composer_stream::{Keys, Streams};
use composer_testkit::{eventually_blocking, http_node, Engine, EngineOptions, FakeHttp, TestDb};
use serde_json::json;

/// A CA and a certificate it signed for `localhost` and `127.0.0.1`, made
/// with the openssl command line.
struct Certs {
    ca: PathBuf,
    cert: PathBuf,
    key: PathBuf,
}

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl").current_dir(dir).args(args).output().expect("openssl (scripts/deps installs it)");
    assert!(out.status.success(), "openssl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

fn make_certs(dir: &Path, name: &str) -> Certs {
    let ca_key = format!("{name}-ca.key");
    let ca = format!("{name}-ca.pem");
    openssl(
        dir,
        &["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", &ca_key, "-out", &ca, "-days", "2"]
            .into_iter()
            .chain(["-subj", "/CN=composer-test-ca"])
            .collect::<Vec<_>>(),
    );
    let key = format!("{name}.key");
    let csr = format!("{name}.csr");
    let cert = format!("{name}.pem");
    openssl(dir, &["req", "-newkey", "rsa:2048", "-nodes", "-keyout", &key, "-out", &csr, "-subj", "/CN=localhost"]);
    std::fs::write(dir.join("san.cnf"), "subjectAltName=DNS:localhost,IP:127.0.0.1\n").unwrap();
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            &csr,
            "-CA",
            &ca,
            "-CAkey",
            &ca_key,
            "-CAcreateserial",
            "-out",
            &cert,
            "-days",
            "2",
            "-extfile",
            "san.cnf",
        ],
    );
    Certs { ca: dir.join(ca), cert: dir.join(cert), key: dir.join(key) }
}

/// PostgreSQL with `ssl = on` and the test's certificate.
fn postgres_with_tls(dir: &Path, certs: &Certs) -> LocalPostgres {
    let data = dir.join("pg");
    let mut pg =
        LocalPostgres::start(PgOptions { data_dir: data.clone(), port: None, fsync: false, max_connections: 50 })
            .expect("PostgreSQL");
    // The server reads its key as the data directory's owner, and only if
    // nobody else can.
    let owner = std::fs::metadata(&data).unwrap();
    for (from, to) in [(&certs.cert, "server.crt"), (&certs.key, "server.key")] {
        std::fs::copy(from, data.join(to)).unwrap();
        std::os::unix::fs::chown(data.join(to), Some(owner.uid()), Some(owner.gid())).unwrap();
        std::fs::set_permissions(data.join(to), std::fs::Permissions::from_mode(0o600)).unwrap();
    }
    let conf = data.join("postgresql.conf");
    let mut text = std::fs::read_to_string(&conf).unwrap();
    text.push_str("\nssl = on\nssl_cert_file = 'server.crt'\nssl_key_file = 'server.key'\n");
    std::fs::write(&conf, text).unwrap();
    pg.restart().expect("PostgreSQL with TLS");
    pg
}

/// redis-server listening only with TLS.
struct TlsRedis {
    child: Child,
    port: u16,
}

impl TlsRedis {
    fn start(dir: &Path, certs: &Certs) -> TlsRedis {
        let port = free_port().unwrap();
        let child = Command::new("redis-server")
            .args(["--port", "0", "--tls-port", &port.to_string(), "--bind", "127.0.0.1"])
            .arg("--tls-cert-file")
            .arg(&certs.cert)
            .arg("--tls-key-file")
            .arg(&certs.key)
            .arg("--tls-ca-cert-file")
            .arg(&certs.ca)
            .args(["--tls-auth-clients", "no", "--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server");
        eventually_blocking(Duration::from_secs(10), "redis-server with TLS to listen", || {
            std::net::TcpStream::connect(("127.0.0.1", port)).ok()
        });
        TlsRedis { child, port }
    }

    fn url(&self) -> String {
        format!("rediss://localhost:{}/", self.port)
    }
}

impl Drop for TlsRedis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn session_uses_tls(url: &str) -> bool {
    let pool = composer_store::connect(url, 1, Duration::from_secs(5)).expect("pool");
    let client = composer_store::client(&pool).await.expect("a connection");
    client.query_one("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()", &[]).await.unwrap().get(0)
}

#[tokio::test]
async fn postgres_and_redis_connections_are_encrypted_and_checked() {
    let dir = temp_dir("tls").unwrap();
    let certs = make_certs(&dir, "server");
    let stranger = make_certs(&dir, "stranger");
    let pg = postgres_with_tls(&dir, &certs);
    let base = pg.url("postgres").replace("127.0.0.1", "localhost");
    let ca = certs.ca.display().to_string();

    assert!(session_uses_tls(&format!("{base}?sslmode=verify-full&sslrootcert={ca}")).await, "verify-full is TLS");
    assert!(session_uses_tls(&format!("{base}?sslmode=require")).await, "require is TLS, unchecked as in libpq");
    assert!(!session_uses_tls(&format!("{base}?sslmode=disable")).await);
    let wrong = format!("{base}?sslmode=verify-full&sslrootcert={}", stranger.ca.display());
    let pool = composer_store::connect(&wrong, 1, Duration::from_secs(5)).unwrap();
    assert!(composer_store::client(&pool).await.is_err(), "a certificate from another CA is refused");

    let redis = TlsRedis::start(&dir, &certs);
    let keys = Keys::new("tls:");
    let streams =
        Streams::connect_with(&redis.url(), keys.clone(), Some(&certs.ca)).await.expect("rediss:// with the CA");
    streams.ping().await.unwrap();
    assert!(
        Streams::connect_with(&redis.url(), keys, Some(&stranger.ca)).await.is_err(),
        "a Redis certificate from another CA is refused"
    );
    drop(redis);
    drop(pg);
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn a_workflow_runs_with_every_connection_over_tls() {
    let dir = temp_dir("tls-run").unwrap();
    let certs = make_certs(&dir, "server");
    let pg = postgres_with_tls(&dir, &certs);
    let redis = TlsRedis::start(&dir, &certs);
    let ca = certs.ca.display().to_string();
    let mut tls_db = TestDb::create_on(&pg.url("postgres")).await;
    tls_db.url = format!("{}?sslmode=verify-full&sslrootcert={ca}", tls_db.url.replace("127.0.0.1", "localhost"));
    // The options take plain functions: the CA's path travels by a variable
    // no other test reads.
    std::env::set_var("COMPOSER_TEST_TLS_REDIS_CA", &ca);
    let e = Engine::on(
        tls_db,
        redis.url(),
        EngineOptions {
            coordinator: |c| c.redis.ca_file = std::env::var_os("COMPOSER_TEST_TLS_REDIS_CA").map(PathBuf::from),
            ..Default::default()
        },
    )
    .await;
    let http = FakeHttp::start().await;
    let id = e.run(&json!({"name": "secure", "nodes": [http_node("a", &http.url("/ok/a"), 1)]})).await;
    let run = e.wait_for_run(id, Duration::from_secs(30)).await;
    assert_eq!(run["status"], "SUCCEEDED", "{run}");
    let client = e.db.pool().get().await.unwrap();
    let encrypted: i64 = client
        .query_one("SELECT count(*) FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid) WHERE a.datname = current_database() AND s.ssl", &[])
        .await
        .unwrap()
        .get(0);
    assert!(encrypted >= 2, "the coordinator's and the worker's sessions are TLS ({encrypted})");
    e.stop().await;
    drop(redis);
    drop(pg);
    let _ = std::fs::remove_dir_all(&dir);
}
