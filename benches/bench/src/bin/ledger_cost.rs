//! What one email costs the database (`mailroom_bench::ledger_cost`):
//!
//! ```text
//! cargo run --release -p mailroom-bench --bin ledger_cost -- [--pairs 20000] [--rate 200] [--engine postgres|mysql]
//! ```

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    mailroom_bench::ledger_cost::cli(&args).await
}
