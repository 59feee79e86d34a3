//! What every suite of surety's tests shares, the crates' own unit tests
//! and `tests/` alike: where the test PostgreSQL is, and how a skipped test
//! is recorded, so that `cargo xtask test` counts every skip one way.

/// The test PostgreSQL on the project's machines.
pub const DEFAULT_POSTGRES_URL: &str = "postgres://postgres@127.0.0.1:5432/test";

/// The test PostgreSQL: `SURETY_TEST_DATABASE_URL`, or the machines' own.
pub fn postgres_url() -> String {
    std::env::var("SURETY_TEST_DATABASE_URL").unwrap_or_else(|_| DEFAULT_POSTGRES_URL.to_owned())
}

/// Records that part of a test was skipped: on stderr, and past libtest's
/// capture in the file `SURETY_SKIPS` names, which `cargo xtask test`
/// counts and prints, so a skip never passes for a pass in silence.
pub fn skipped(why: &str) {
    use std::io::Write;
    eprintln!("SKIPPED: {why}");
    if let Some(path) = std::env::var_os("SURETY_SKIPS")
        && let Ok(mut file) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
    {
        let test = std::thread::current().name().unwrap_or("a test").to_owned();
        // One write of the whole line: appends from parallel tests never interleave.
        let _ = file.write_all(format!("{test}: {why}\n").as_bytes());
    }
}
