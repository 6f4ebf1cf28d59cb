//! Integration tests: one binary, one module per area (see `support` for the harness).

mod support;

mod admin;
mod admin_ops;
mod backend;
mod binary;
mod bypass;
mod cluster;
mod concurrent;
mod connections;
mod costs;
mod decide;
mod delay;
mod faults;
mod fixed_window;
mod http2;
mod ingress;
mod keys;
mod layer;
mod leases;
mod limits;
mod operator;
mod overrides;
mod proxy;
mod redis;
mod refusals;
mod reload;
mod rls;
mod rules;
mod sentinel;
mod sliding_window;
mod state_file;
mod strict;
mod tls_backend;
mod tls_listener;
mod traces;
