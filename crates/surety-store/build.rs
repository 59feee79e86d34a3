//! The schema is compiled in (`sqlx::migrate!`, `include_str!`): a new or
//! changed migration rebuilds the crate.
fn main() {
    println!("cargo:rerun-if-changed=migrations");
}
