//! `cargo xtask test`'s run of `cargo test`: the output streams through unchanged, and a
//! digest of every failure (the test's name, its panic message and the last lines it
//! printed, without the backtrace) comes last, where a reader of a long CI log looks first.

use anyhow::{Context, Result};
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};

/// Lines of one failure kept in the digest.
const KEEP: usize = 40;

pub fn cargo_test(args: &[&str], extra: &[String]) -> Result<()> {
    let mut child = Command::new(env!("CARGO"))
        .current_dir(crate::setup::root())
        .args(args)
        .args(extra)
        .stdout(Stdio::piped())
        .spawn()
        .context("starting cargo test")?;
    let stdout = child.stdout.take().expect("piped");
    let mut digest = Digest::default();
    let mut out = std::io::stdout().lock();
    for line in BufReader::new(stdout).lines() {
        let line = line.context("reading cargo test's output")?;
        writeln!(out, "{line}")?;
        digest.line(&line);
    }
    drop(out);
    let status = child.wait()?;
    if !status.success() {
        // The digest is the last thing printed: exit with cargo's code, not through an
        // error whose backtrace would follow it.
        eprint!("{}", digest.render());
        eprintln!("cargo test failed: {status}");
        std::process::exit(status.code().unwrap_or(101));
    }
    Ok(())
}

/// The `---- <test> stdout ----` sections of libtest's failure report.
#[derive(Default)]
struct Digest {
    failures: Vec<(String, Vec<String>)>,
    /// Inside a section, and inside its backtrace (skipped).
    open: bool,
    in_backtrace: bool,
}

impl Digest {
    fn line(&mut self, line: &str) {
        if let Some(name) = line
            .strip_prefix("---- ")
            .and_then(|l| l.strip_suffix(" stdout ----"))
        {
            self.failures.push((name.to_string(), Vec::new()));
            self.open = true;
            self.in_backtrace = false;
            return;
        }
        if !self.open {
            return;
        }
        // libtest lists the failed names after the sections: the report is over.
        if line == "failures:" || line.starts_with("test result:") {
            self.open = false;
            return;
        }
        if line.starts_with("stack backtrace:") {
            self.in_backtrace = true;
            return;
        }
        if self.in_backtrace {
            // Frames are indented; the first line that is not ends the backtrace.
            if line.starts_with(' ') || line.is_empty() {
                return;
            }
            self.in_backtrace = false;
        }
        if line.starts_with("note: ") && line.contains("backtrace") {
            return;
        }
        if let Some((_, lines)) = self.failures.last_mut() {
            lines.push(line.to_string());
        }
    }

    fn render(&self) -> String {
        if self.failures.is_empty() {
            return String::new();
        }
        let mut s = format!("\n==== {} failed test(s) ====\n", self.failures.len());
        for (name, lines) in &self.failures {
            let lines: Vec<&String> = lines.iter().filter(|l| !l.trim().is_empty()).collect();
            // The panic and what led to it: the panic line onwards, preceded by what the
            // test printed last, at most KEEP lines in all.
            let panic_at = lines
                .iter()
                .position(|l| l.contains("panicked at"))
                .unwrap_or(0);
            let start = panic_at.saturating_sub(KEEP / 2);
            s.push_str(&format!("---- {name}\n"));
            for l in lines.iter().skip(start).take(KEEP) {
                s.push_str(&format!("  {l}\n"));
            }
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_panic_and_drops_the_backtrace() {
        let mut d = Digest::default();
        for l in [
            "test a ... FAILED",
            "failures:",
            "",
            "---- a stdout ----",
            "step one",
            "thread 'a' panicked at x.rs:1:2:",
            "boom: 6 > 5",
            "stack backtrace:",
            "   0: frame",
            "             at x.rs",
            "note: Some details are omitted, run with `RUST_BACKTRACE=full` for a verbose backtrace.",
            "",
            "---- b stdout ----",
            "thread 'b' panicked at y.rs:3:4:",
            "other",
            "",
            "failures:",
            "    a",
            "test result: FAILED. 0 passed; 2 failed",
        ] {
            d.line(l);
        }
        let r = d.render();
        assert!(r.contains("2 failed test(s)"), "{r}");
        assert!(
            r.contains(
                "---- a\n  step one\n  thread 'a' panicked at x.rs:1:2:\n  boom: 6 > 5\n---- b\n"
            ),
            "{r}"
        );
        assert!(!r.contains("frame") && !r.contains("RUST_BACKTRACE"), "{r}");
        assert!(!r.contains("    a\n"), "{r}");
    }

    #[test]
    fn nothing_when_everything_passed() {
        let mut d = Digest::default();
        d.line("test a ... ok");
        d.line("test result: ok. 1 passed");
        assert_eq!(d.render(), "");
    }
}
