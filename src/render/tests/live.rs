//! The live set: an unchanged directory is not reloaded, a good edit is swapped in, a broken one
//! is counted once and leaves the last good set in use, and a ConfigMap-style symlink swap is seen.

use std::fs;
use std::os::unix::fs::symlink;
use std::sync::atomic::Ordering;

use serde_json::json;

use super::{MINIMAL, fixture};
use crate::render::{LiveTemplates, Templates};

fn live(dir: &std::path::Path) -> LiveTemplates {
    LiveTemplates::new(dir.to_owned(), Templates::load(dir).unwrap())
}

fn subject(set: &LiveTemplates) -> String {
    set.current()
        .render("k", None, &json!({"name": "Ada"}))
        .unwrap()
        .subject
}

#[test]
fn a_good_edit_is_swapped_in_and_a_broken_one_is_counted_once() {
    let dir = fixture(&MINIMAL);
    let set = live(dir.path());
    assert!(!set.check(false), "nothing changed");

    fs::write(dir.path().join("k/subject.hbs"), "Hi {{name}}\n").unwrap();
    assert!(set.check(false));
    assert_eq!(subject(&set), "Hi Ada");
    let good = set.current().revision().to_owned();

    fs::write(dir.path().join("k/subject.hbs"), "Hi {{missing}}\n").unwrap();
    assert!(!set.check(false));
    assert!(!set.check(false));
    assert_eq!(
        set.reloads_failed.load(Ordering::Relaxed),
        1,
        "reported once"
    );
    assert_eq!(set.current().revision(), good);
    assert_eq!(subject(&set), "Hi Ada");

    assert!(
        !set.check(true),
        "a forced reload of the broken state fails again"
    );
    assert_eq!(set.reloads_failed.load(Ordering::Relaxed), 2);
    assert_eq!(set.reloads_ok.load(Ordering::Relaxed), 1);
}

#[test]
fn a_configmap_symlink_swap_is_picked_up() {
    // Kubernetes mounts `k -> ..data/k` and updates by repointing `..data` to a new folder.
    let root = tempfile::tempdir().unwrap();
    let v1 = fixture(&MINIMAL);
    let v2 = fixture(&MINIMAL);
    fs::write(v2.path().join("k/subject.hbs"), "Version 2 for {{name}}\n").unwrap();
    symlink(v1.path(), root.path().join("..data")).unwrap();
    symlink("..data/k", root.path().join("k")).unwrap();
    let set = live(root.path());
    assert_eq!(subject(&set), "Hello Ada");

    let staged = root.path().join("..data_tmp");
    symlink(v2.path(), &staged).unwrap();
    fs::rename(&staged, root.path().join("..data")).unwrap();
    assert!(set.check(false));
    assert_eq!(subject(&set), "Version 2 for Ada");
}

fn mkfifo(path: &std::path::Path) {
    let made = std::process::Command::new("mkfifo").arg(path).status();
    assert!(made.unwrap().success(), "mkfifo {}", path.display());
}

#[test]
fn a_fifo_in_the_directory_neither_blocks_a_reload_nor_hides_the_next_edit() {
    // A FIFO with no writer blocks a plain read forever: with one, the check never returned and
    // every later edit went unseen (and the process's exit waited on the check's thread).
    let dir = fixture(&MINIMAL);
    let set = live(dir.path());
    mkfifo(&dir.path().join("k/notes"));
    assert!(!set.check(false), "a file the loader skips changes nothing");
    fs::write(dir.path().join("k/subject.hbs"), "Hi {{name}}\n").unwrap();
    assert!(set.check(false), "the next edit is seen");
    assert_eq!(subject(&set), "Hi Ada");

    mkfifo(&dir.path().join("k/html.fr.hbs"));
    assert!(!set.check(false), "a FIFO as a template is refused");
    assert_eq!(set.reloads_failed.load(Ordering::Relaxed), 1);
    assert_eq!(subject(&set), "Hi Ada", "the last good set stays");
    let e = Templates::load(dir.path()).unwrap_err().to_string();
    assert!(
        e.contains("html.fr.hbs") && e.contains("not a regular file"),
        "{e}"
    );
}

#[test]
fn symlink_loops_in_the_directory_neither_stall_a_reload_nor_hide_the_next_edit() {
    // Two links back to their own folder: followed, the walk was 2^41 folders long.
    let dir = fixture(&MINIMAL);
    let set = live(dir.path());
    symlink(".", dir.path().join("k/a")).unwrap();
    symlink(".", dir.path().join("k/b")).unwrap();
    assert!(!set.check(false), "sub-folders are the loader's error");
    assert_eq!(set.reloads_failed.load(Ordering::Relaxed), 1);
    fs::remove_file(dir.path().join("k/a")).unwrap();
    fs::remove_file(dir.path().join("k/b")).unwrap();
    fs::write(dir.path().join("k/subject.hbs"), "Hi {{name}}\n").unwrap();
    assert!(set.check(false), "the next edit is seen");
    assert_eq!(subject(&set), "Hi Ada");
}
