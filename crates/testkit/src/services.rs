//! Where a test's data lives: the shared throwaway services, and a
//! database and Redis key prefix of each test's own.

use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use composer_embedded::{LocalPostgres, LocalRedis, PgOptions};
use uuid::Uuid;

/// Where tests find PostgreSQL (an admin URL, database `postgres`) and Redis.
#[derive(Debug, Clone)]
pub struct Services {
    pub pg_admin_url: String,
    pub redis_url: String,
    /// True when the services are ours to throw away at exit.
    pub throwaway: bool,
}

struct Owned {
    pg: Option<LocalPostgres>,
    redis: Option<LocalRedis>,
    dir: Option<std::path::PathBuf>,
}

static OWNED: Mutex<Owned> = Mutex::new(Owned { pg: None, redis: None, dir: None });

extern "C" fn stop_owned_services() {
    if let Ok(mut owned) = OWNED.lock() {
        owned.redis.take();
        owned.pg.take();
        if let Some(dir) = owned.dir.take() {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

/// The services of this test process, started on first use.
pub fn services() -> &'static Services {
    static SERVICES: OnceLock<Services> = OnceLock::new();
    SERVICES.get_or_init(|| {
        let pg_env = env("COMPOSER_TEST_DATABASE_URL");
        let redis_env = env("COMPOSER_TEST_REDIS_URL");
        let mut owned = OWNED.lock().expect("services lock");
        let dir = composer_embedded::temp_dir("test").expect("creating a temp dir");
        let pg_admin_url = match pg_env {
            Some(url) => url,
            None => {
                let pg = LocalPostgres::start(PgOptions {
                    data_dir: dir.join("pg"),
                    port: None,
                    fsync: false,
                    max_connections: 400,
                })
                .expect("starting a throwaway PostgreSQL");
                let url = pg.url("postgres");
                owned.pg = Some(pg);
                url
            }
        };
        let redis_url = match redis_env {
            Some(url) => url,
            None => {
                let r = LocalRedis::start(&dir.join("redis"), None).expect("starting a throwaway redis-server");
                let url = r.url();
                owned.redis = Some(r);
                url
            }
        };
        let throwaway = owned.pg.is_some();
        owned.dir = Some(dir);
        // SAFETY: registering a plain extern "C" function to run at exit.
        #[allow(unsafe_code)]
        unsafe {
            libc::atexit(stop_owned_services);
        }
        Services { pg_admin_url, redis_url, throwaway }
    })
}

/// A Redis key prefix no other test uses.
pub fn unique_prefix() -> String {
    format!("ct:{}:", Uuid::now_v7().simple())
}

/// A database of one test's own, dropped when the test ends.
pub struct TestDb {
    pub name: String,
    pub url: String,
    admin_url: String,
}

impl TestDb {
    pub async fn create() -> TestDb {
        let s = services();
        TestDb::create_on(&s.pg_admin_url).await
    }

    /// Creates a database on the server behind `admin_url`.
    pub async fn create_on(admin_url: &str) -> TestDb {
        let name = format!("composer_t_{}", Uuid::now_v7().simple());
        let (client, conn) =
            tokio_postgres::connect(admin_url, tokio_postgres::NoTls).await.expect("connecting to the test PostgreSQL");
        let driver = tokio::spawn(conn);
        client.batch_execute(&format!("CREATE DATABASE {name}")).await.expect("creating the test database");
        drop(client);
        let _ = driver.await;
        let url = replace_db(admin_url, &name);
        TestDb { name, url, admin_url: admin_url.to_string() }
    }

    /// A pool on this database.
    pub fn pool(&self) -> composer_store::Pool {
        composer_store::connect(&self.url, 4, Duration::from_secs(5)).expect("test pool")
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        let admin = self.admin_url.clone();
        let name = self.name.clone();
        // Drop is synchronous and may run inside a runtime: use a thread of our own.
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().ok()?;
            rt.block_on(async {
                let (client, conn) = tokio_postgres::connect(&admin, tokio_postgres::NoTls).await.ok()?;
                let driver = tokio::spawn(conn);
                let _ = client.batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)")).await;
                drop(client);
                let _ = driver.await;
                Some(())
            })
        })
        .join();
    }
}

/// `url` with its database name replaced by `db`.
pub fn replace_db(url: &str, db: &str) -> String {
    let (base, query) = match url.split_once('?') {
        Some((b, q)) => (b, Some(q)),
        None => (url, None),
    };
    let scheme_end = base.find("://").map(|i| i + 3).unwrap_or(0);
    let base = match base[scheme_end..].find('/') {
        Some(i) => &base[..scheme_end + i],
        None => base,
    };
    match query {
        Some(q) => format!("{base}/{db}?{q}"),
        None => format!("{base}/{db}"),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn replaces_the_database_name() {
        assert_eq!(super::replace_db("postgres://u@h:5/postgres", "x"), "postgres://u@h:5/x");
        assert_eq!(super::replace_db("postgres://u@h:5", "x"), "postgres://u@h:5/x");
        assert_eq!(super::replace_db("postgres://u@h/p?sslmode=disable", "x"), "postgres://u@h/x?sslmode=disable");
    }
}
