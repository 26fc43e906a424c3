//! The checks, for both `MAILROOM_ON_UNCERTAIN` policies, and the proof that the model can
//! fail: without the fence, or without the token guard on ledger writes, the checker finds
//! two live workers sending one job twice.

use std::collections::{HashMap, VecDeque};
use std::sync::OnceLock;
use std::time::Instant;

use stateright::{Checker, Model, Path};

use super::{Action, Mailroom, Step, World, Write};
use crate::config::OnUncertain;

/// Faults per run: a crash, a failed or unknown commit, a lost reply, twice.
const FAULTS: u8 = 2;

/// The `always` properties that must hold under both policies.
const SAFE: [&str; 5] = [
    "no duplicate outside a window",
    "the dot goes out only under the sender's live lease",
    "a deadline never outlives its lease",
    "a sent row was accepted",
    "a world with nothing left to do has ended the job",
];

/// `sometimes` properties both policies must reach, or the check proves nothing.
const REACHED: [&str; 3] = [
    "the job is sent",
    "the job is dead-lettered",
    "a claim is given back at the fence",
];

const WORDED: &str = "no duplicate outside a crash or an unrecorded sent";
const DUPLICATE: &str = "a window lets a duplicate through";

fn mailroom(on_uncertain: OnUncertain) -> Mailroom {
    Mailroom {
        on_uncertain,
        fence: true,
        token_guard: true,
        faults: FAULTS,
        max_attempts: 2,
    }
}

/// What one exhaustive check found: a path for each property with a discovery.
struct Run {
    model: Mailroom,
    discoveries: HashMap<&'static str, Path<World, Action>>,
}

impl Run {
    /// Checks every reachable world, depth first, one world per class of worlds that differ
    /// only by the names of workers, copies and tokens; says how many and how long.
    fn exhaustive(model: Mailroom) -> Run {
        let started = Instant::now();
        let checker = model
            .clone()
            .checker()
            .symmetry_fn(World::representative)
            .spawn_dfs()
            .join();
        assert!(checker.is_done(), "the check must be exhaustive");
        eprintln!(
            "{model:?}: {} worlds ({} unique up to names), depth {}, in {:?}",
            checker.state_count(),
            checker.unique_state_count(),
            checker.max_depth(),
            started.elapsed()
        );
        Run {
            discoveries: checker.discoveries(),
            model,
        }
    }

    /// The check of `on_uncertain`, run once for all the tests that read it.
    fn of(on_uncertain: OnUncertain) -> &'static Run {
        static RESEND: OnceLock<Run> = OnceLock::new();
        static DEAD_LETTER: OnceLock<Run> = OnceLock::new();
        let cell = match on_uncertain {
            OnUncertain::Resend => &RESEND,
            OnUncertain::DeadLetter => &DEAD_LETTER,
        };
        cell.get_or_init(|| Run::exhaustive(mailroom(on_uncertain)))
    }

    fn found(&self, name: &str) -> Option<&Path<World, Action>> {
        let known = self.model.properties().iter().any(|p| p.name == name);
        assert!(known, "no property named {name:?}");
        self.discoveries.get(name)
    }

    fn assert_holds(&self, name: &str) {
        if let Some(path) = self.found(name) {
            panic!("{:?}: {name:?} fails:\n{path}", self.model);
        }
    }

    fn assert_reached(&self, name: &str) -> &Path<World, Action> {
        self.found(name)
            .unwrap_or_else(|| panic!("{:?}: {name:?} is never reached", self.model))
    }
}

/// The steps of `path` up to the first world where `done` holds (a discovery's path may go on
/// past it), and that world.
fn until(path: &Path<World, Action>, done: impl Fn(&World) -> bool) -> (Vec<Action>, World) {
    let mut steps = Vec::new();
    for (world, action) in path.clone().into_vec() {
        if done(&world) {
            return (steps, world);
        }
        steps.extend(action);
    }
    panic!("the path never reaches the world it was found for");
}

#[test]
fn under_resend_a_job_is_sent_once_outside_the_windows_and_always_ends() {
    let run = Run::of(OnUncertain::Resend);
    for name in SAFE {
        run.assert_holds(name);
    }
    for name in REACHED {
        run.assert_reached(name);
    }
    run.assert_reached("a claim is taken over");
    let duplicate = run.assert_reached(DUPLICATE);
    assert!(duplicate.last_state().windows.total() >= 1);
}

#[test]
fn under_dead_letter_a_job_is_sent_at_most_once_and_always_ends() {
    let run = Run::of(OnUncertain::DeadLetter);
    for name in SAFE {
        run.assert_holds(name);
    }
    for name in REACHED {
        run.assert_reached(name);
    }
    run.assert_reached("an expired claim is marked uncertain");
    run.assert_holds(WORDED);
    assert!(run.found(DUPLICATE).is_none(), "no second send at all");
}

#[test]
fn a_reply_lost_to_a_live_worker_under_resend_is_a_window_of_its_own() {
    // The protocol as first written for issue 12 named a lost reply only with a crash (W1).
    // Alive, the worker records `uncertain`, and under `resend` its retry takes that row over
    // and sends again: no crash, nothing unrecorded (docs/GUARANTEES.md's W2 names it).
    let run = Run::of(OnUncertain::Resend);
    let (steps, last) = until(run.assert_reached(WORDED), |w| w.accepted == 2);
    eprintln!("a duplicate with no crash and nothing unrecorded: {steps:?}");
    assert!(steps.iter().all(|a| !matches!(a, Action::Crash(_))));
    assert_eq!((last.windows.crashed, last.windows.unrecorded), (0, 0));
    assert!(last.windows.reply_lost >= 1);
}

#[test]
fn without_the_fence_two_live_workers_send_one_job_twice() {
    let model = Mailroom {
        fence: false,
        faults: 0,
        ..mailroom(OnUncertain::Resend)
    };
    // Breadth first, unreduced: the shortest duplicate, with readable worker numbers.
    let checker = model.checker().spawn_bfs().join();
    let found = checker.assert_any_discovery("no duplicate outside a window");
    let (steps, last) = until(&found, |w| w.accepted == 2);
    eprintln!("the duplicate without a fence: {steps:?}");
    assert!(
        steps.iter().all(|a| !a.is_fault()),
        "no crash, lost reply or failed commit"
    );
    assert_eq!(last.windows.total(), 0);
    checker.assert_any_discovery("the dot goes out only under the sender's live lease");
}

#[test]
fn without_the_token_guard_a_late_write_lets_two_live_workers_send_twice() {
    let model = Mailroom {
        token_guard: false,
        faults: 0,
        ..mailroom(OnUncertain::Resend)
    };
    let checker = model.checker().spawn_bfs().join();
    let found = checker.assert_any_discovery("no duplicate outside a window");
    let (steps, last) = until(&found, |w| w.accepted == 2);
    eprintln!("the duplicate without a token guard: {steps:?}");
    assert!(
        steps.iter().all(|a| !a.is_fault()),
        "no crash, lost reply or failed commit"
    );
    assert_eq!(last.windows.total(), 0);
}

/// Every reachable world (up to names), and the steps between them.
struct Graph {
    worlds: Vec<World>,
    steps: Vec<Vec<Edge>>,
}

struct Edge {
    to: usize,
    fault: bool,
    /// The step gives a claim back at the fence.
    gives_back: bool,
}

fn explore(model: &Mailroom) -> Graph {
    let mut index: HashMap<World, usize> = HashMap::new();
    let mut graph = Graph {
        worlds: model
            .init_states()
            .iter()
            .map(World::representative)
            .collect(),
        steps: Vec::new(),
    };
    index.insert(graph.worlds[0].clone(), 0);
    let mut queue = VecDeque::from([0]);
    while let Some(i) = queue.pop_front() {
        let mut edges = Vec::new();
        for (action, world) in model.next_steps(&graph.worlds[i]) {
            let gives_back = matches!(action, Action::Fence(w) if world.workers[w]
                .is_some_and(|d| matches!(d.step, Step::Writing { write: Write::Release, .. })));
            let world = world.representative();
            let to = match index.get(&world) {
                Some(&to) => to,
                None => {
                    graph.worlds.push(world.clone());
                    index.insert(world, graph.worlds.len() - 1);
                    queue.push_back(graph.worlds.len() - 1);
                    graph.worlds.len() - 1
                }
            };
            edges.push(Edge {
                to,
                fault: action.is_fault(),
                gives_back,
            });
        }
        graph.steps.resize_with(graph.worlds.len(), Vec::new);
        graph.steps[i] = edges;
    }
    graph
}

/// From every reachable world, once faults stop, some schedule still ends the job.
fn assert_every_world_can_end(model: &Mailroom, graph: &Graph) {
    let mut back: Vec<Vec<usize>> = vec![Vec::new(); graph.worlds.len()];
    for (i, steps) in graph.steps.iter().enumerate() {
        for edge in steps.iter().filter(|e| !e.fault) {
            back[edge.to].push(i);
        }
    }
    let mut can_end: Vec<bool> = graph.worlds.iter().map(World::job_ended).collect();
    let mut queue: VecDeque<usize> = (0..can_end.len()).filter(|i| can_end[*i]).collect();
    while let Some(j) = queue.pop_front() {
        for &i in &back[j] {
            if !can_end[i] {
                can_end[i] = true;
                queue.push_back(i);
            }
        }
    }
    if let Some(i) = can_end.iter().position(|ok| !ok) {
        panic!(
            "{model:?}: no schedule ends the job from {:#?}",
            graph.worlds[i]
        );
    }
}

/// A world on a cycle of the steps that `keep` admits, if there is one (Kahn's algorithm:
/// peel worlds nothing leads to; what cannot be peeled lies on or after a cycle).
fn on_a_cycle(graph: &Graph, keep: impl Fn(&Edge) -> bool) -> Option<usize> {
    let n = graph.worlds.len();
    let next = |i: usize| graph.steps[i].iter().filter(|e| keep(e)).map(|e| e.to);
    let mut incoming = vec![0usize; n];
    for i in 0..n {
        for j in next(i) {
            incoming[j] += 1;
        }
    }
    let mut queue: VecDeque<usize> = (0..n).filter(|i| incoming[*i] == 0).collect();
    while let Some(i) = queue.pop_front() {
        for j in next(i) {
            incoming[j] -= 1;
            if incoming[j] == 0 {
                queue.push_back(j);
            }
        }
    }
    (0..n).find(|i| incoming[*i] > 0)
}

#[test]
fn every_world_can_still_end_and_only_give_backs_can_loop() {
    for on_uncertain in [OnUncertain::Resend, OnUncertain::DeadLetter] {
        let model = mailroom(on_uncertain);
        let started = Instant::now();
        let graph = explore(&model);
        assert_every_world_can_end(&model, &graph);
        // Without give-backs every path ends: only a claim given back at the fence again and
        // again (the claim always too slow for the lease) keeps a delivery going.
        if let Some(i) = on_a_cycle(&graph, |e| !e.gives_back) {
            panic!(
                "{model:?}: a loop without a give-back through {:#?}",
                graph.worlds[i]
            );
        }
        assert!(
            on_a_cycle(&graph, |_| true).is_some(),
            "{model:?}: give-backs do loop, or this check could not see a loop"
        );
        eprintln!(
            "{model:?}: {} worlds can all end, in {:?}",
            graph.worlds.len(),
            started.elapsed()
        );
    }
}
