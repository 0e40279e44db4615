//! Integration tests against real PostgreSQL, Redis and HTTP. One binary
//! (links once); each module is one area.

#![allow(clippy::unwrap_used)] // a test fails by panicking

mod access;
mod api;
mod approvals;
mod archive;
mod bombs;
mod cli;
mod cluster;
mod control;
mod dataflow;
mod definitions;
mod eager;
mod failure_handling;
mod failures;
mod flow;
mod hardening;
mod hardening_http;
mod hardening_worker;
mod hooks;
mod http_steps;
mod in_part;
mod in_process;
mod leases;
mod limits;
mod logs;
mod migrate;
mod model;
mod namespaces;
mod offload;
mod ops;
mod priorities;
mod processes;
mod repair;
mod replay;
mod starts;
mod task_api;
mod tls;
mod traces;
mod transactions;
mod trigger_flows;
mod triggers;
mod ui;
mod updates;
mod wire;
