// SPDX-License-Identifier: Apache-2.0
//! The simulated node's `nvidia-cuda-mps-control`: a shell script that behaves enough
//! like the real one for the device plugin's MPS control daemon to be tested end to end.
//!
//! - `-d` starts a background "daemon" (the script again, so its process name is the
//!   control binary's, as the real daemon's is) that writes
//!   `$CUDA_MPS_PIPE_DIRECTORY/nvidia-cuda-mps-control.pid` and stays up; it refuses to
//!   start a second one on the same pipe directory, as the real one does.
//! - Client mode (no argument) fails when no daemon is up, appends each stdin command to
//!   the record file `$CUDA_MPS_LOG_DIRECTORY/`[`MPS_RECORD_FILE`], answers `get_*`, and
//!   stops the daemon on `quit`.
//!
//! Each daemon start is recorded too, as `start CUDA_VISIBLE_DEVICES=<value>`.

use std::path::Path;

/// The record of one daemon's starts and commands, in its log directory.
pub const MPS_RECORD_FILE: &str = "nvshim-fake-mps-control.log";
/// The pid file the fake (and the real) control daemon writes in its pipe directory.
pub const MPS_PID_FILE: &str = "nvidia-cuda-mps-control.pid";

/// The script installed as `usr/bin/nvidia-cuda-mps-control` under the driver root.
pub const FAKE_MPS_CONTROL: &str = r#"#!/bin/sh
# nvshim testkit: a fake nvidia-cuda-mps-control (see tests/testkit/src/mps.rs).
pipe="${CUDA_MPS_PIPE_DIRECTORY:-/tmp/nvidia-mps}"
logs="${CUDA_MPS_LOG_DIRECTORY:-/var/log/nvidia-mps}"
pidfile="$pipe/nvidia-cuda-mps-control.pid"
record="$logs/nvshim-fake-mps-control.log"
alive() { [ -f "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null; }
case "$1" in
-d)
    mkdir -p "$pipe" "$logs" || exit 1
    if alive; then
        echo "An instance of this daemon is already running" >&2
        exit 1
    fi
    echo "start CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-}" >> "$record"
    "$0" --nvshim-fake-daemon </dev/null >/dev/null 2>&1 &
    exit 0
    ;;
--nvshim-fake-daemon)
    trap 'rm -f "$pidfile"; exit 0' TERM INT
    echo $$ > "$pidfile.tmp" && mv "$pidfile.tmp" "$pidfile"
    while :; do sleep 0.2; done
    ;;
"") ;;
*)
    echo "nvidia-cuda-mps-control: unknown option $1" >&2
    exit 2
    ;;
esac
if ! alive; then
    echo "Cannot find MPS control daemon process" >&2
    exit 1
fi
while IFS= read -r command; do
    [ -n "$command" ] || continue
    echo "$command" >> "$record"
    case "$command" in
    quit) kill "$(cat "$pidfile")" ;;
    get_default_active_thread_percentage) echo "100.0" ;;
    get_server_list) ;;
    esac
done
"#;

/// The lines of a daemon's record file (empty when there is none yet).
pub fn mps_record(log_dir: &Path) -> Vec<String> {
    std::fs::read_to_string(log_dir.join(MPS_RECORD_FILE))
        .map(|text| text.lines().map(str::to_owned).collect())
        .unwrap_or_default()
}
