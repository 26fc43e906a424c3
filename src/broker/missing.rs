//! The parts of a namespace's topology that this process could not declare, for `/readyz` and
//! the metrics, and the log lines that say so: one WARN when a part goes missing, one INFO when
//! it is declared again, however many sessions try in between. Kept per namespace (tests run
//! several side by side in one process).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Mutex;

use super::Topology;
use super::declare::Missing;

#[derive(Default)]
struct State {
    /// Part → why, per namespace.
    missing: HashMap<String, BTreeMap<String, String>>,
    /// Namespaces with a repair task running.
    repairing: BTreeSet<String>,
    /// Namespaces whose classic `<ns>.dead` was reported.
    classic_told: BTreeSet<String>,
    /// Namespaces this process has declared in full once.
    declared: BTreeSet<String>,
}

static STATE: Mutex<Option<State>> = Mutex::new(None);

fn with<R>(f: impl FnOnce(&mut State) -> R) -> R {
    let mut guard = STATE.lock().unwrap_or_else(|e| e.into_inner());
    f(guard.get_or_insert_with(State::default))
}

/// The parts of `namespace` the last declaration left missing, as (part, why).
pub fn missing(namespace: &str) -> Vec<(String, String)> {
    with(|s| {
        s.missing
            .get(namespace)
            .map(|m| m.iter().map(|(p, e)| (p.clone(), e.clone())).collect())
            .unwrap_or_default()
    })
}

/// Every part missing in this process, of any namespace, sorted: what `/readyz` and
/// `/metrics` report.
pub fn missing_parts() -> Vec<String> {
    with(|s| {
        let mut parts: Vec<String> = s.missing.values().flat_map(|m| m.keys().cloned()).collect();
        parts.sort();
        parts
    })
}

/// Records what one declaration left missing, logging what changed.
pub(super) fn record(t: &Topology, now: &[Missing]) {
    with(|s| {
        let before = s.missing.entry(t.exchange.clone()).or_default();
        for m in now {
            if !before.contains_key(&m.part) {
                tracing::warn!(part = %m.part, error = %m.error,
                    "could not declare {}; working without it, and declaring it again every {:?}",
                    m.part, super::declare::REPAIR_EVERY);
            }
        }
        for part in before.keys() {
            if !now.iter().any(|m| &m.part == part) {
                tracing::info!(part = %part, "declared {part}, missing until now");
            }
        }
        *before = now
            .iter()
            .map(|m| (m.part.clone(), m.error.clone()))
            .collect();
    })
}

/// Whether this process has declared the namespace's topology in full before (so a session
/// now is a reconnect).
pub(super) fn declared_before(t: &Topology) -> bool {
    with(|s| s.declared.contains(&t.exchange))
}

pub(super) fn mark_declared(t: &Topology) {
    with(|s| s.declared.insert(t.exchange.clone()));
}

/// Whether the caller should start the namespace's repair task (none is running).
pub(super) fn start_repair(t: &Topology) -> bool {
    with(|s| s.repairing.insert(t.exchange.clone()))
}

pub(super) fn end_repair(t: &Topology) {
    with(|s| s.repairing.remove(&t.exchange));
}

/// Says once per process that `<ns>.dead` is still the classic queue, and how to move it.
pub(super) fn warn_classic_once(t: &Topology) {
    if with(|s| s.classic_told.insert(t.exchange.clone())) {
        tracing::warn!(queue = %t.dead,
            "{} is a classic queue, which stops dead-lettering whenever its one node is down; \
             mailroom keeps using it. Move it to a quorum queue with \
             `mailroom broker migrate-dead-queue` (docs/OPERATING.md, \"The dead-letter queue\")",
            t.dead);
    }
}
