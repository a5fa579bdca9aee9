// SPDX-License-Identifier: Apache-2.0
//! The IMEX channels the plugin hands out: of `--imex-channel-ids`, those whose device
//! node (`/dev/nvidia-caps-imex-channels/channel<N>`) exists, checked once per start as
//! NVIDIA's plugin does (`internal/imex`): a missing channel fails the start with
//! `--imex-required`, and is left out, with a warning, without it.
//!
//! The node is looked for under the dev root as this process sees it (the driver
//! container's `/driver-root/dev`, say) and at its own path (a plugin container given
//! the node directly), as NVIDIA's plugin looks.

use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};

use crate::config::Settings;

/// Where the driver puts IMEX channel `N`: `channel<N>` in this directory.
pub const CHANNEL_DIR: &str = "/dev/nvidia-caps-imex-channels";

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ImexError {
    #[error(
        "requested IMEX channel {path} does not exist (looked at {}; --imex-required is \
         on: create the channel, or turn --imex-required off to start without it)",
        .looked.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(" and ")
    )]
    Missing { path: String, looked: Vec<PathBuf> },
}

/// The container path of channel `id`.
pub fn channel_path(id: u32) -> String {
    format!("{CHANNEL_DIR}/channel{id}")
}

/// `settings` with only the IMEX channels that exist (see the module doc); `seen_dev` is
/// the dev root as this process sees it.
pub fn existing(settings: Settings, seen_dev: &Path) -> Result<Settings, ImexError> {
    let mut kept = Vec::new();
    for id in &settings.imex.channel_ids {
        let path = channel_path(*id);
        let mut looked = vec![seen_dev.join(path.trim_start_matches('/'))];
        if looked[0] != Path::new(&path) {
            looked.push(PathBuf::from(&path));
        }
        let found = looked
            .iter()
            .any(|p| p.metadata().is_ok_and(|m| m.file_type().is_char_device()));
        if found {
            tracing::info!(channel = %path, "selecting IMEX channel");
            kept.push(*id);
        } else if settings.imex.required {
            return Err(ImexError::Missing { path, looked });
        } else {
            tracing::warn!(channel = %path, "ignoring the requested IMEX channel: it does not exist");
        }
    }
    let mut settings = settings;
    settings.imex.channel_ids = kept;
    Ok(settings)
}

#[cfg(test)]
mod tests {
    use nix::sys::stat::{Mode, SFlag, makedev, mknod};

    use super::*;
    use crate::config::Imex;

    #[test]
    fn kept_left_out_or_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let with_channel = tmp.path().join("a");
        let dir = with_channel.join(CHANNEL_DIR.trim_start_matches('/'));
        std::fs::create_dir_all(&dir).unwrap();
        mknod(
            &dir.join("channel0"),
            SFlag::S_IFCHR,
            Mode::from_bits_truncate(0o666),
            makedev(234, 0),
        )
        .unwrap();
        let not_a_node = tmp.path().join("b");
        let dir = not_a_node.join(CHANNEL_DIR.trim_start_matches('/'));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("channel0"), "").unwrap();
        let settings = |required| Settings {
            imex: Imex {
                channel_ids: vec![0],
                required,
            },
            ..Settings::default()
        };
        // (case, dev root, required, Ok(kept ids) or Err(message part))
        type Case<'a> = (&'a str, &'a Path, bool, Result<Vec<u32>, &'a str>);
        let cases: [Case; 4] = [
            ("present", &with_channel, true, Ok(vec![0])),
            ("absent, not required", tmp.path(), false, Ok(vec![])),
            (
                "absent, required",
                tmp.path(),
                true,
                Err(
                    "requested IMEX channel /dev/nvidia-caps-imex-channels/channel0 does not exist",
                ),
            ),
            (
                "a regular file is not a channel",
                &not_a_node,
                false,
                Ok(vec![]),
            ),
        ];
        for (name, dev, required, want) in cases {
            let got = existing(settings(required), dev)
                .map(|s| s.imex.channel_ids)
                .map_err(|e| e.to_string());
            match (&got, &want) {
                (Ok(got), Ok(want)) => assert_eq!(got, want, "case {name}"),
                (Err(got), Err(part)) => assert!(got.contains(part), "case {name}: {got}"),
                _ => panic!("case {name}: got {got:?}, want {want:?}"),
            }
        }
    }
}
