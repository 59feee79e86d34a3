//! The provider adapters against the fake provider, OpenAI's published
//! schemas, and a real model on a real third-party server.

#![expect(clippy::unwrap_used, reason = "a test fails on what it did not expect")]

mod config;
mod conformance;
mod docs;
mod failure_table;
mod fake;
mod local_gemma;
mod reconcile;
mod secrets;
mod support;
