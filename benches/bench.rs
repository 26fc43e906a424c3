//! `cargo bench --bench bench -- [--quick] [--n 20000] [--out target/bench] [--workers 1,2,4]`:
//! mailroom's benchmark, the `mailroom-bench` crate (benches/bench), run against the `mailroom`
//! binary Cargo builds for this target and the shipped templates.

fn main() -> anyhow::Result<()> {
    mailroom_bench::main(mailroom_bench::Mailroom {
        bin: env!("CARGO_BIN_EXE_mailroom").into(),
        templates: concat!(env!("CARGO_MANIFEST_DIR"), "/templates").into(),
    })
}
