//! What every role's configuration shares: how to reach PostgreSQL and Redis,
//! the payload limit, and the error a bad value gives.
//!
//! Each role's configuration (`composer_coord::Config`,
//! `composer_worker::Config`) is a clap `Args` struct: its flags, its
//! `COMPOSER_*` variables and its defaults are written once, on the struct,
//! and the binary flattens them into its subcommands. [`defaults`] builds the
//! same struct from those attributes alone, so a library user or a test gets
//! exactly the defaults the binary has.
//!
//! - [`auth`]: bearer tokens compared in constant time.

pub mod auth;

use clap::{Args, Command, FromArgMatches};

pub use composer_core::storable::DEFAULT_MAX_PAYLOAD;

/// Where PostgreSQL is.
#[derive(Args, Debug, Clone, Default)]
pub struct DatabaseArgs {
    /// PostgreSQL URL (`composer dev` starts an embedded server when it is empty).
    #[arg(
        id = "database_url",
        long = "database-url",
        env = "COMPOSER_DATABASE_URL",
        hide_env_values = true,
        default_value = ""
    )]
    pub url: String,
}

/// Where Redis is, and the prefix of every key Composer uses there.
#[derive(Args, Debug, Clone, Default)]
pub struct RedisArgs {
    /// Redis URL (`redis://`, `rediss://`; a Redis Cluster as `redis+cluster://host:port,host:port` or
    /// `rediss+cluster://…`). Empty under `dev`: an embedded server is started.
    #[arg(
        id = "redis_url",
        long = "redis-url",
        env = "COMPOSER_REDIS_URL",
        hide_env_values = true,
        default_value = ""
    )]
    pub url: String,
    /// Prefix of every Redis key Composer uses (one cluster per prefix).
    #[arg(id = "redis_prefix", long = "redis-prefix", env = "COMPOSER_REDIS_PREFIX", default_value = "composer:")]
    pub prefix: String,
    /// PEM file of the CA that signed the Redis server's certificate, for a `rediss://` URL (default: the
    /// system's roots).
    #[arg(id = "redis_ca_file", long = "redis-ca-file", env = "COMPOSER_REDIS_CA_FILE")]
    pub ca_file: Option<std::path::PathBuf>,
}

impl DatabaseArgs {
    /// The URL, or an error naming the flag when none was given.
    pub fn required(&self) -> Result<&str, ConfigError> {
        required(&self.url, "--database-url", "COMPOSER_DATABASE_URL")
    }
}

impl RedisArgs {
    /// The URL, or an error naming the flag when none was given.
    pub fn required(&self) -> Result<&str, ConfigError> {
        required(&self.url, "--redis-url", "COMPOSER_REDIS_URL")
    }
}

fn required<'a>(value: &'a str, flag: &'static str, env: &'static str) -> Result<&'a str, ConfigError> {
    let value = value.trim();
    if value.is_empty() {
        return Err(ConfigError::new(flag, env, "is not set (use `composer dev` to run on embedded services)"));
    }
    Ok(value)
}

/// A configuration value that cannot work, naming the flag and the variable
/// it came from.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{flag} ({env}) {message}")]
pub struct ConfigError {
    pub flag: &'static str,
    pub env: &'static str,
    pub message: String,
}

impl ConfigError {
    pub fn new(flag: &'static str, env: &'static str, message: impl Into<String>) -> ConfigError {
        ConfigError { flag, env, message: message.into() }
    }
}

/// A config struct holding the defaults written in its clap attributes,
/// ignoring the environment (so a test's configuration does not depend on
/// the shell that runs it).
pub fn defaults<T: Args + FromArgMatches>() -> T {
    let command = T::augment_args(Command::new("defaults").no_binary_name(true)).mut_args(|a| a.env(None));
    let parsed = command.try_get_matches_from(std::iter::empty::<String>()).and_then(|m| T::from_arg_matches(&m));
    match parsed {
        Ok(config) => config,
        // Only a struct with a required flag and no default gets here: a bug
        // in its attributes, caught by each role's own defaults test.
        Err(e) => panic!("configuration defaults: {e}"),
    }
}

/// Treats an empty or blank value the same as an unset one.
pub fn non_empty(v: &Option<String>) -> Option<String> {
    v.as_ref().map(|s| s.trim().to_string()).filter(|s| !s.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_come_from_the_attributes_not_the_environment() {
        // No other test of this crate reads this variable.
        std::env::set_var("COMPOSER_REDIS_PREFIX", "from-env:");
        let r: RedisArgs = defaults();
        assert_eq!(r.prefix, "composer:");
        assert_eq!(r.url, "");
    }

    #[test]
    fn a_missing_url_names_flag_and_variable() {
        let e = DatabaseArgs::default().required().unwrap_err();
        assert_eq!(
            e.to_string(),
            "--database-url (COMPOSER_DATABASE_URL) is not set (use `composer dev` to run on embedded services)"
        );
    }
}
