//! Fuzzes the JSON decoder for a budget: `fuzz_decoder SECONDS`.

fn main() {
    let budget = ubik_fuzz::budget_from_args();
    let strategy = proptest::collection::vec(ubik_fuzz::record(), 1..24);
    let (_, findings) = ubik_fuzz::run_for("json decoder", budget, strategy, |records| {
        ubik_fuzz::check_decoder(&records)
    });
    std::process::exit(i32::from(findings > 0));
}
