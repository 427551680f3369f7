//! Runs every `slt/*.slt` file against the streaming engine (each query also
//! with other batchings and a checkpoint/restore in the middle).

use std::path::PathBuf;

use sqllogictest::Runner;
use ubik_sqltest::StreamDb;

#[test]
fn golden_sql_files() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("slt");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("slt directory")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "slt"))
        // UBIK_SLT=name runs the files whose name contains `name` only.
        .filter(|p| {
            std::env::var("UBIK_SLT")
                .map_or(true, |only| p.to_string_lossy().contains(only.as_str()))
        })
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no .slt files in {}", dir.display());
    let mut failures = Vec::new();
    for file in &files {
        let mut runner = Runner::new(|| async { Ok(StreamDb::new()) });
        if let Err(e) = runner.run_file(file) {
            failures.push(format!("{}:\n{e}", file.display()));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} files failed:\n{}",
        failures.len(),
        files.len(),
        failures.join("\n\n")
    );
}
