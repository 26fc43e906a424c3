use clap::{CommandFactory, Parser};

use crate::cli::{Cli, Command};
use crate::dlq::Class;
use crate::worker::ErrorClass;

/// The class a filter takes for each class the worker writes; a new `ErrorClass` fails to
/// compile here until the dead-letter filters know it.
fn filter_class(written: ErrorClass) -> Class {
    match written {
        ErrorClass::Invalid => Class::Invalid,
        ErrorClass::Template => Class::Template,
        ErrorClass::Rejected => Class::Rejected,
        ErrorClass::Exhausted => Class::Exhausted,
        ErrorClass::Uncertain => Class::Uncertain,
        ErrorClass::Expired => Class::Expired,
    }
}

#[test]
fn every_class_the_worker_writes_is_a_class_the_filters_take() {
    for class in Class::ALL {
        if let Some(written) = ErrorClass::parse(class.as_str()) {
            assert_eq!(filter_class(written), class);
            assert_eq!(written.as_str(), class.as_str());
        }
    }
    for written in ErrorClass::ALL {
        assert_eq!(filter_class(written).as_str(), written.as_str());
    }
}

fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
    let env = ["--database-url", "postgres://127.0.0.1/mailroom"];
    Cli::try_parse_from(["mailroom", "dlq"].iter().chain(args).chain(&env))
}

#[test]
fn purge_takes_a_class_as_list_and_replay_do() {
    for command in ["list", "replay", "purge"] {
        let cli = parse(&[command, "--class", "template"]).unwrap();
        let Command::Dlq(dlq) = cli.command else {
            panic!("not dlq")
        };
        let class = match dlq.command {
            super::DlqCommand::List(a) => a.filter.class,
            super::DlqCommand::Replay(a) => a.select.class,
            super::DlqCommand::Purge(a) => a.select.class,
            _ => None,
        };
        assert_eq!(class, Some(Class::Template), "{command}");
    }
}

#[test]
fn an_unknown_class_is_a_usage_error_that_lists_the_classes() {
    for command in ["list", "replay", "purge"] {
        let err = parse(&[command, "--class", "bogus"]).unwrap_err();
        assert_eq!(
            err.kind(),
            clap::error::ErrorKind::InvalidValue,
            "{command}"
        );
        assert_eq!(err.exit_code(), 2);
        let text = err.to_string();
        for class in Class::ALL {
            assert!(text.contains(class.as_str()), "{command}: {text}");
        }
    }
}

#[test]
fn the_reads_take_no_broker_at_all() {
    for command in [&["list"][..], &["groups"], &["show", "7"]] {
        let cli = parse(command).unwrap();
        assert!(matches!(cli.command, Command::Dlq(_)), "{command:?}");
        let with_broker: Vec<&str> = command
            .iter()
            .copied()
            .chain(["--amqp-url", "amqp://x"])
            .collect();
        let err = parse(&with_broker).unwrap_err();
        assert_eq!(
            err.kind(),
            clap::error::ErrorKind::UnknownArgument,
            "{command:?}"
        );
    }
}

#[test]
fn purge_still_names_exactly_one_selection() {
    let err = parse(&["purge", "--class", "template", "--kind", "welcome"]).unwrap_err();
    assert_eq!(err.kind(), clap::error::ErrorKind::ArgumentConflict);
    let err = parse(&["purge", "--yes"]).unwrap_err();
    assert_eq!(err.kind(), clap::error::ErrorKind::MissingRequiredArgument);
}

/// Every argument of `command` and its subcommands, as `command sub --arg`, that has no help.
fn without_help(command: &clap::Command, path: &str, out: &mut Vec<String>) {
    for arg in command.get_arguments() {
        let id = arg.get_id().as_str();
        if arg.get_help().is_none() && !["help", "version"].contains(&id) {
            out.push(format!("{path} --{id}"));
        }
    }
    for sub in command.get_subcommands() {
        without_help(sub, &format!("{path} {}", sub.get_name()), out);
    }
}

#[test]
fn every_flag_of_every_command_has_help() {
    let mut missing = Vec::new();
    without_help(&Cli::command(), "mailroom", &mut missing);
    assert!(missing.is_empty(), "no help text: {missing:#?}");
}
