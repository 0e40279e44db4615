//! The deployment files name only settings that exist, and the compose file
//! has the topology docs/deploy.md describes; every setting they use is in the book's
//! configuration table (docs/operations/configuration.md).

#![allow(clippy::unwrap_used)] // a test fails by panicking

use std::collections::BTreeSet;

fn read(path: &str) -> String {
    std::fs::read_to_string(format!("{}/../../{path}", env!("CARGO_MANIFEST_DIR"))).unwrap()
}

/// Every `COMPOSER_…` name in `text`.
fn variables(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for (i, _) in text.match_indices("COMPOSER_") {
        let name: String =
            text[i..].chars().take_while(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || *c == '_').collect();
        out.insert(name.trim_end_matches('_').to_string());
    }
    out
}

#[test]
fn every_setting_the_deployment_files_use_is_a_documented_one() {
    // The book's configuration page: its table lists every setting.
    let documented = variables(&read("docs/operations/configuration.md"));
    for file in [
        "deploy/compose.yaml",
        "deploy/Dockerfile",
        "deploy/systemd/coordinator.env",
        "deploy/systemd/worker.env",
        "deploy/systemd/composer-coordinator.service",
        "deploy/systemd/composer-worker@.service",
        "deploy/gen-secrets",
        "deploy/healthcheck",
        "deploy/helm/composer/values.yaml",
        "deploy/helm/composer/templates/_helpers.tpl",
        "deploy/helm/composer/templates/configmap.yaml",
        "deploy/helm/composer/templates/coordinator-deployment.yaml",
        "deploy/helm/composer/templates/worker-deployment.yaml",
        "deploy/helm/composer/templates/NOTES.txt",
        "scripts/cluster",
    ] {
        for name in variables(&read(file)) {
            assert!(documented.contains(&name), "{file} sets {name}, which the book's configuration does not list");
        }
    }
}

#[test]
fn the_compose_file_runs_two_coordinators_and_two_workers_on_postgres_and_redis() {
    let compose: serde_json::Value = yaml_serde::from_str(&read("deploy/compose.yaml")).unwrap();
    let services: BTreeSet<&str> = compose["services"].as_object().unwrap().keys().map(String::as_str).collect();
    assert_eq!(
        services,
        BTreeSet::from(["postgres", "redis", "coordinator-1", "coordinator-2", "worker-1", "worker-2"])
    );
    for worker in ["worker-1", "worker-2"] {
        let urls = compose["services"][worker]["environment"]["COMPOSER_COORDINATOR_URLS"].as_str().unwrap();
        assert_eq!(urls.split(',').count(), 2, "{worker} fails over between both coordinators");
    }
}
