//! Helpers of the CLI integration tests: running the `ubik` binary. The
//! event generator, the oracle and the fold come from `ubik_testkit`.
#![allow(dead_code)]

use std::io::Read;
use std::process::{Child, Command, Output};

pub fn ubik() -> Command {
    Command::new(env!("CARGO_BIN_EXE_ubik"))
}

pub fn run(args: &[&str]) -> Output {
    ubik().args(args).output().expect("run ubik")
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// What a spawned child (stderr piped) wrote to stderr, to its end.
pub fn child_stderr(child: &mut Child) -> String {
    let mut err = String::new();
    if let Some(mut e) = child.stderr.take() {
        let _ = e.read_to_string(&mut err);
    }
    err
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}
