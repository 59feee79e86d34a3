//! `cargo xtask profile router`: the release router under load, sampled
//! by Linux `perf` (call graphs by DWARF unwinding), as a flame graph and
//! as the functions that take the most of a job's CPU. The load is `bench
//! router`'s own (by default its closed 64-client cell on SQLite), so the
//! profile and the benchmark's figures describe the same run. With
//! `SURETY_BENCH_ENGINES=postgres` the whole machine is sampled, and
//! PostgreSQL's processes get a flame graph and a top of their own.

use std::collections::HashMap;
use std::path::Path;
use std::process::Command;

use anyhow::{Context, Result, bail};
use inferno::collapse::Collapse;

/// The functions listed, by the CPU they take themselves and, for surety's
/// own, with what they call.
const TOP: usize = 25;

pub fn router(root: &Path) -> Result<()> {
    let perf_found = Command::new("perf").arg("--version").output();
    if !perf_found.is_ok_and(|o| o.status.success()) {
        bail!(
            "`perf` is not installed: the profile samples the router with Linux perf (Debian: apt install linux-perf)"
        );
    }
    // Another build (e.g. a base that `bench router --compare` left in
    // target/bench/bin) profiled the same way, for a before and after.
    let surety = match std::env::var_os("SURETY_PROFILE_BIN") {
        Some(bin) => std::path::PathBuf::from(bin),
        None => crate::release_surety(root)?,
    };
    let wrk = crate::wrk()?;
    let dir = crate::target_dir(root).join("profile");
    std::fs::create_dir_all(&dir)?;
    let data = dir.join("perf.data");
    let engines = std::env::var("SURETY_BENCH_ENGINES").unwrap_or_else(|_| "sqlite".to_owned());
    let cells = std::env::var("SURETY_BENCH_CELLS").unwrap_or_else(|_| "closed 64".to_owned());
    crate::bench(
        root,
        "router",
        &[
            ("SURETY_BIN", surety.as_os_str()),
            ("SURETY_WRK", wrk.as_os_str()),
            ("SURETY_PROFILE_OUT", data.as_os_str()),
            ("SURETY_BENCH_ENGINES", engines.as_ref()),
            ("SURETY_BENCH_CELLS", cells.as_ref()),
        ],
    )?;
    // What the benchmark says the profile covers.
    let covers: serde_json::Value = serde_json::from_slice(
        &std::fs::read(dir.join("perf.data.json"))
            .context("the benchmark did not say what the profile covers")?,
    )?;
    let (Some(jobs), Some(pid), Some(whole_machine)) = (
        covers["jobs"].as_f64(),
        covers["router_pid"].as_u64(),
        covers["whole_machine"].as_bool(),
    ) else {
        bail!("the benchmark's account of the profile is incomplete: {covers}");
    };
    let title = format!("({engines}, {cells}): {jobs:.0} jobs");
    let router = Profiled {
        name: "router",
        select: ["--pid".to_owned(), pid.to_string()],
        title: format!("surety serve under bench router {title}"),
        // surety's own functions, with what they call.
        inclusive: |frame| frame.contains("surety"),
    };
    let mut report = router.write(&data, &dir, jobs)?;
    // On PostgreSQL the whole machine was sampled: the server's processes
    // too, whose CPU per job is most of a job's.
    if whole_machine {
        let server = Profiled {
            name: "postgres",
            select: ["--comms".to_owned(), "postgres".to_owned()],
            title: format!("PostgreSQL's processes under bench router {title}"),
            // Every function but the process's entry, which every stack
            // passes through, with what it calls: where the server's time
            // goes (executor start, constraint checks, index inserts, commit
            // and its flush).
            inclusive: |frame| {
                !matches!(
                    frame,
                    "postgres"
                        | "[postgres]"
                        | "_start"
                        | "__libc_start_main_impl"
                        | "__libc_start_call_main"
                        | "main"
                        | "PostmasterMain"
                        | "PostgresMain"
                )
            },
        };
        report.push('\n');
        report.push_str(&server.write(&data, &dir, jobs)?);
    }
    std::fs::write(dir.join("top.txt"), &report)?;
    Ok(())
}

/// One process's part of the recorded profile: its folded stacks, its
/// flame graph and its top functions, under `target/profile/<name>.*`.
struct Profiled {
    name: &'static str,
    /// `perf script`'s options that keep only this process's samples.
    select: [String; 2],
    title: String,
    /// The frames listed with what they call.
    inclusive: fn(&str) -> bool,
}

impl Profiled {
    fn write(&self, data: &Path, dir: &Path, jobs: f64) -> Result<String> {
        let script = Command::new("perf")
            .args(["script", "-i"])
            .arg(data)
            .args(&self.select)
            .output()
            .context("perf script")?;
        if !script.status.success() {
            bail!(
                "perf script failed: {}",
                String::from_utf8_lossy(&script.stderr)
            );
        }
        let mut folded = Vec::new();
        inferno::collapse::perf::Folder::from(inferno::collapse::perf::Options::default())
            .collapse(&script.stdout[..], &mut folded)
            .context("collapsing perf's stacks")?;
        std::fs::write(dir.join(format!("{}.folded", self.name)), &folded)?;
        let svg = dir.join(format!("{}.svg", self.name));
        let mut options = inferno::flamegraph::Options::default();
        options.title = self.title.clone();
        inferno::flamegraph::from_reader(&mut options, &folded[..], std::fs::File::create(&svg)?)
            .context("drawing the flame graph")?;
        let report = top(
            &String::from_utf8_lossy(&folded),
            jobs,
            self.name,
            self.inclusive,
        );
        println!("{report}");
        println!("flame graph: {}", svg.display());
        Ok(report)
    }
}

/// The functions that take the most CPU, by themselves (the leaf of a
/// stack), and those `inclusive` picks with what they call (anywhere in a
/// stack, once per stack), in µs of CPU per job of process `name`.
/// `folded`'s counts are perf's periods of the `cpu-clock` event:
/// nanoseconds of CPU.
fn top(folded: &str, jobs: f64, name: &str, inclusive: fn(&str) -> bool) -> String {
    let mut own: HashMap<&str, u64> = HashMap::new();
    let mut with_callees: HashMap<&str, u64> = HashMap::new();
    let mut total = 0u64;
    for line in folded.lines() {
        let Some((stack, count)) = line.rsplit_once(' ') else {
            continue;
        };
        let Ok(count) = count.parse::<u64>() else {
            continue;
        };
        total += count;
        let frames: Vec<&str> = stack.split(';').collect();
        if let Some(leaf) = frames.last() {
            *own.entry(leaf).or_default() += count;
        }
        let mut seen: Vec<&str> = Vec::new();
        for frame in frames.into_iter().filter(|f| inclusive(f)) {
            if !seen.contains(&frame) {
                seen.push(frame);
                *with_callees.entry(frame).or_default() += count;
            }
        }
    }
    let per_job = |ns: u64| ns as f64 / 1000.0 / jobs.max(1.0);
    let mut out = format!(
        "{:.2} s of {name} CPU over {jobs:.0} jobs: {:.1} µs per job\n",
        total as f64 / 1e9,
        per_job(total)
    );
    for (title, table) in [("by itself", &own), ("with what it calls", &with_callees)] {
        let mut rows: Vec<(&str, u64)> = table.iter().map(|(f, n)| (*f, *n)).collect();
        rows.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
        out.push_str(&format!(
            "\ntop {TOP} {title}: µs per job, share of the CPU, function\n"
        ));
        for (frame, ns) in rows.into_iter().take(TOP) {
            out.push_str(&format!(
                "{:>8.2} {:>6.1} %  {frame}\n",
                per_job(ns),
                ns as f64 * 100.0 / total.max(1) as f64
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_top_counts_a_function_once_per_stack_and_in_us_per_job() {
        let folded = "main;surety::handle;parse 30000\nmain;surety::handle;surety::handle 10000\nmain;write 60000\n";
        // 100 µs of CPU over one job.
        let report = super::top(folded, 1.0, "router", |f| f.contains("surety"));
        assert!(
            report.starts_with("0.00 s of router CPU over 1 jobs: 100.0 µs per job"),
            "{report}"
        );
        assert!(report.contains("   60.00   60.0 %  write"), "{report}");
        // `handle` calls itself: with its callees it is 40 µs, not 50; `main` is not surety's.
        assert!(
            report.contains("   40.00   40.0 %  surety::handle"),
            "{report}"
        );
        assert!(!report.contains("%  main"), "{report}");
    }
}
