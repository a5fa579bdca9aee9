// SPDX-License-Identifier: Apache-2.0
//! The udev rule and the systemd unit in `deployments/` run a command our `nvidia-ctk`
//! accepts, and the flag rules NVIDIA's has.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;

use clap::Parser;

use super::*;
use crate::ctk::{Ctk, CtkCommand};

fn deployment(path: &str) -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(path)).unwrap()
}

/// The command as `nvidia-ctk` parses it; its first word must be the installed path.
fn parse(command: &str, case: &str) -> DevCharArgs {
    let argv: Vec<&str> = command.split_whitespace().collect();
    assert_eq!(argv[0], "/usr/bin/nvidia-ctk", "{case}: {command}");
    let ctk = Ctk::try_parse_from(&argv).unwrap_or_else(|e| panic!("{case}: {command}: {e}"));
    match ctk.command {
        CtkCommand::System(SystemArgs {
            command: SystemCommand::CreateDevCharSymlinks(args),
        }) => args,
        other => panic!("{case}: not create-dev-char-symlinks: {other:?}"),
    }
}

#[test]
fn the_udev_rule_and_the_unit_run_create_all() {
    let rule = deployment("deployments/udev/71-nvidia-dev-char.rules");
    let rules: Vec<&str> = rule
        .lines()
        .filter(|l| !l.trim().is_empty() && !l.starts_with('#'))
        .collect();
    assert_eq!(rules.len(), 1, "{rule}");
    assert!(
        rules[0].contains(r#"ACTION=="add""#)
            && rules[0].contains(r#"DEVPATH=="/bus/pci/drivers/nvidia""#),
        "{}",
        rules[0]
    );
    let run = rules[0]
        .split_once(r#"RUN+=""#)
        .and_then(|(_, rest)| rest.strip_suffix('"'))
        .expect("RUN+=\"…\" at the end of the rule");
    let args = parse(run, "udev rule");
    assert!(args.create_all && !args.dry_run && !args.watch);
    assert_eq!(args.dev_char_path, Path::new("/dev/char"));

    let unit = deployment("deployments/systemd/nvidia-dev-char-symlinks.service");
    let exec: Vec<&str> = unit
        .lines()
        .filter_map(|l| l.strip_prefix("ExecStart="))
        .collect();
    assert_eq!(exec.len(), 1, "{unit}");
    let args = parse(exec[0], "systemd unit");
    assert!(args.create_all && !args.dry_run);
    for line in ["Type=oneshot", "[Install]", "WantedBy=multi-user.target"] {
        assert!(unit.lines().any(|l| l == line), "unit lacks {line}");
    }
}

#[test]
fn watch_is_refused_with_the_replacement_named() {
    let run_args = |extra: &[&str]| {
        let mut argv = vec!["nvidia-ctk", "system", "create-dev-char-symlinks"];
        argv.extend_from_slice(extra);
        let ctk = Ctk::try_parse_from(&argv).unwrap();
        let CtkCommand::System(args) = &ctk.command else {
            panic!("not system")
        };
        let mut out = Vec::new();
        run(&ctk.global, args, &mut out).map(|()| out)
    };
    let both = run_args(&["--watch", "--create-all"]).unwrap_err();
    assert!(both.to_string().contains("mutually exclusive"), "{both}");
    let watch = run_args(&["--watch"]).unwrap_err().to_string();
    assert!(
        watch.contains("not supported") && watch.contains("71-nvidia-dev-char.rules"),
        "{watch}"
    );
}
