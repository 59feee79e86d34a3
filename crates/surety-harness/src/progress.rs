//! Where a long run is: on a terminal a bar (done of all, elapsed, time
//! left, what it is at), otherwise plain lines, one per milestone the
//! caller names, so a CI log reads as a list of what was done.

use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// Progress of `total` steps under a name (`certify local-gemma`,
/// `bench router`).
#[derive(Debug)]
pub struct Progress {
    name: String,
    total: u64,
    done: u64,
    started: Instant,
    shown: Shown,
}

#[derive(Debug)]
enum Shown {
    Bar(ProgressBar),
    /// Not a terminal: lines written to this sink (stderr, or a test's buffer).
    Lines(Sink),
}

/// Where plain lines go.
pub enum Sink {
    Stderr,
    Buffer(std::sync::Arc<std::sync::Mutex<Vec<u8>>>),
}

impl std::fmt::Debug for Sink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Sink::Stderr => "Stderr",
            Sink::Buffer(_) => "Buffer",
        })
    }
}

impl Progress {
    /// A bar on stderr when stderr is a terminal, plain lines on it when
    /// not.
    pub fn new(name: impl Into<String>, total: u64) -> Progress {
        if std::io::stderr().is_terminal() {
            Progress::bar(name, total, ProgressDrawTarget::stderr())
        } else {
            Progress::lines(name, total, Sink::Stderr)
        }
    }

    fn bar(name: impl Into<String>, total: u64, target: ProgressDrawTarget) -> Progress {
        let name = name.into();
        let bar = ProgressBar::with_draw_target(Some(total), target);
        if let Ok(style) = ProgressStyle::with_template(
            "{prefix} [{bar:30}] {pos}/{len} {elapsed} elapsed, ~{eta} left · {wide_msg}",
        ) {
            bar.set_style(style.progress_chars("=> "));
        }
        bar.set_prefix(name.clone());
        Progress {
            name,
            total,
            done: 0,
            started: Instant::now(),
            shown: Shown::Bar(bar),
        }
    }

    /// Plain lines to `sink`, whatever stderr is.
    pub fn lines(name: impl Into<String>, total: u64, sink: Sink) -> Progress {
        Progress {
            name: name.into(),
            total,
            done: 0,
            started: Instant::now(),
            shown: Shown::Lines(sink),
        }
    }

    /// `n` more steps done, now at `at`. A bar shows it at once; plain
    /// lines are written only where `milestone` is true (a case finished,
    /// a cell measured), so a log holds one line per milestone.
    pub fn advance(&mut self, n: u64, at: &str, milestone: bool) {
        self.done = (self.done + n).min(self.total);
        match &self.shown {
            Shown::Bar(bar) => {
                bar.set_message(at.to_owned());
                bar.set_position(self.done);
            }
            Shown::Lines(sink) => {
                if milestone {
                    let line = format!(
                        "{}: {}/{} {at} ({} elapsed{})\n",
                        self.name,
                        self.done,
                        self.total,
                        clock(self.started.elapsed()),
                        self.left()
                            .map(|left| format!(", about {} left", clock(left)))
                            .unwrap_or_default(),
                    );
                    write(sink, &line);
                }
            }
        }
    }

    /// Writes a line above the bar (or as a plain line).
    pub fn println(&self, line: &str) {
        match &self.shown {
            Shown::Bar(bar) => bar.println(line),
            Shown::Lines(sink) => write(sink, &format!("{line}\n")),
        }
    }

    /// Removes the bar; plain lines say how long it all took.
    pub fn finish(&self) {
        match &self.shown {
            Shown::Bar(bar) => bar.finish_and_clear(),
            Shown::Lines(sink) => write(
                sink,
                &format!(
                    "{}: {}/{} done in {}\n",
                    self.name,
                    self.done,
                    self.total,
                    clock(self.started.elapsed())
                ),
            ),
        }
    }

    /// What is left at the rate so far, once a step is done.
    fn left(&self) -> Option<Duration> {
        if self.done == 0 || self.done >= self.total {
            return None;
        }
        let per_step = self.started.elapsed().as_secs_f64() / self.done as f64;
        Some(Duration::from_secs_f64(
            per_step * (self.total - self.done) as f64,
        ))
    }
}

fn write(sink: &Sink, line: &str) {
    match sink {
        Sink::Stderr => {
            // Progress is not the output: a closed stderr loses only it.
            let _ = std::io::stderr().write_all(line.as_bytes());
        }
        Sink::Buffer(buffer) => {
            if let Ok(mut b) = buffer.lock() {
                b.extend_from_slice(line.as_bytes());
            }
        }
    }
}

/// `1m 05s`, `42s`.
fn clock(d: Duration) -> String {
    let s = d.as_secs();
    if s >= 60 {
        format!("{}m {:02}s", s / 60, s % 60)
    } else {
        format!("{s}s")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    #[test]
    fn off_a_terminal_each_milestone_is_one_plain_line_and_nothing_else_is_written() {
        let buffer = Arc::new(Mutex::new(Vec::new()));
        let mut p = Progress::lines("certify fake", 6, Sink::Buffer(Arc::clone(&buffer)));
        p.advance(1, "language-detect/german", false);
        p.advance(1, "language-detect/german", false);
        p.advance(1, "language-detect/german", true);
        p.advance(3, "language-detect/french", true);
        p.println("a line of its own");
        p.finish();
        let text = String::from_utf8(buffer.lock().unwrap().clone()).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 4, "{text}");
        assert!(
            lines[0].starts_with("certify fake: 3/6 language-detect/german ("),
            "{text}"
        );
        assert!(lines[0].contains("left)"), "halfway, a time left: {text}");
        assert!(
            lines[1].starts_with("certify fake: 6/6 language-detect/french ("),
            "{text}"
        );
        assert!(!lines[1].contains("left"), "all done, nothing left: {text}");
        assert_eq!(lines[2], "a line of its own");
        assert!(lines[3].starts_with("certify fake: 6/6 done in "), "{text}");
        assert!(
            !text.contains('\u{1b}'),
            "no escape codes off a terminal: {text:?}"
        );
    }

    #[test]
    fn a_bar_counts_every_step_and_never_passes_its_total() {
        let mut p = Progress::bar("bench", 3, ProgressDrawTarget::hidden());
        p.advance(2, "closed 16", false);
        let Shown::Bar(bar) = &p.shown else {
            panic!("a bar")
        };
        let bar = bar.clone();
        assert_eq!(bar.position(), 2);
        p.advance(5, "closed 64", true);
        assert_eq!(bar.position(), 3);
        assert_eq!(bar.message(), "closed 64");
    }
}
