//! Fuzzes the webhook request-body path (content type, gzip, splitting,
//! decode) for a budget: `fuzz_body SECONDS`.

fn main() {
    let budget = ubik_fuzz::budget_from_args();
    let door = ubik_webhook::door::Door::new(ubik_fuzz::schema());
    let (_, findings) = ubik_fuzz::run_for("request body", budget, ubik_fuzz::request(), |req| {
        ubik_fuzz::check_body(&door, &req)
    });
    println!(
        "request body: {} admitted, {} refused",
        ubik_fuzz::ADMITTED.load(std::sync::atomic::Ordering::Relaxed),
        ubik_fuzz::REFUSED.load(std::sync::atomic::Ordering::Relaxed)
    );
    std::process::exit(i32::from(findings > 0));
}
