//! Running the `memwall` binary from the integration tests.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The repository root (commands run there, so fixture paths are relative to it).
pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Runs `memwall ARGS` in the repository root.
pub fn memwall(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_memwall"))
        .args(args)
        .current_dir(repo())
        .output()
        .unwrap()
}

/// Runs `memwall ARGS`, which must succeed, and returns its stdout.
pub fn stdout_of(args: &[&str]) -> String {
    let out = memwall(args);
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}
