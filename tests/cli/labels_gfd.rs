// SPDX-License-Identifier: Apache-2.0
//! gpu-feature-discovery parity of `nvshim labels` through the real binary: a node with
//! GFD's hard cases (MIG profiles with NVML's attributes, a GPU in graphics mode, a vGPU,
//! an IMEX clique) gives GFD's whole label set, and the binary linked as
//! `gpu-feature-discovery` runs with GFD's defaults.

#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::fs;
use std::process::{Command, Stdio};
use std::time::{SystemTime, UNIX_EPOCH};

use crate::labels::{Setup, parse, wait_for};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use nvshim_testkit::{
    MockConfig, MockFabric, MockGfd, MockMigAttributes, NodeSpec, PCI_CLASS_VGA, make_vgpu,
    set_pci_class,
};

/// The cluster every GPU of [`gfd_node`] registered with.
const CLUSTER_UUID: &str = "3f1c2b6a-9d4e-4c1a-8b7e-5a6d2c9e0f11";

/// `with_mig(3)` made into GFD's hard cases: GPU 0 split into 1g.10gb + 2g.20gb (with
/// NVML's attributes for both profiles), GPU 1 in graphics mode (a VGA controller),
/// GPU 2 a vGPU whose host runs 550.90.05 (branch r550_00), all three in IMEX clique 7.
fn gfd_node() -> Setup {
    let spec = NodeSpec::with_mig(3);
    let setup = Setup::new(&spec);
    let sim = &setup.node.sim;
    let mut config = MockConfig::new(&spec, &sim.dev_root, &sim.dir.join("xid-events"));
    let attributes = |sms, slices, copy, decoders, memory_mib| MockMigAttributes {
        multiprocessors: sms,
        copy_engines: copy,
        decoders,
        encoders: 0,
        jpeg_engines: 0,
        ofa_engines: 0,
        gpu_instance_slices: slices,
        compute_instance_slices: slices,
        memory_mib,
    };
    for (index, gpu) in config.gpus.iter_mut().enumerate() {
        let mut gfd = MockGfd {
            fabric: Some(MockFabric {
                cluster_uuid: CLUSTER_UUID.to_string(),
                clique_id: 7,
                state: 3,
                status: 0,
            }),
            ..MockGfd::default()
        };
        if index == 0 {
            gfd.mig_attributes = BTreeMap::from([
                ("1g.10gb".to_string(), attributes(14, 1, 1, 0, 9728)),
                ("2g.20gb".to_string(), attributes(28, 2, 2, 1, 19968)),
            ]);
        }
        gpu.gfd = Some(gfd);
    }
    config.write(&sim.mock_config).unwrap();
    set_pci_class(&sim.dir, &spec.gpus[1].bus_id, PCI_CLASS_VGA).unwrap();
    make_vgpu(&sim.dir, &spec.gpus[2].bus_id, "550.90.05", "r550_00").unwrap();
    setup
}

/// Every label GFD writes for [`gfd_node`] with the mixed strategy, as GFD's rules give
/// them: the mode is `unknown` because the GPUs disagree, the MIG profiles carry NVML's
/// attributes (their memory too), the clique is `<cluster>.<clique>`.
#[test]
fn a_gfd_node_gets_gfds_whole_label_set() {
    let setup = gfd_node();
    let got = setup.labels(&["--output", "-", "--mig-strategy", "mixed", "--no-timestamp"]);
    let want = format!(
        "nvidia.com/cuda.driver-version.full=550.54.15
nvidia.com/cuda.driver-version.major=550
nvidia.com/cuda.driver-version.minor=54
nvidia.com/cuda.driver-version.revision=15
nvidia.com/cuda.driver.major=550
nvidia.com/cuda.driver.minor=54
nvidia.com/cuda.driver.rev=15
nvidia.com/cuda.runtime-version.full=12.4
nvidia.com/cuda.runtime-version.major=12
nvidia.com/cuda.runtime-version.minor=4
nvidia.com/cuda.runtime.major=12
nvidia.com/cuda.runtime.minor=4
nvidia.com/gpu.clique={CLUSTER_UUID}.7
nvidia.com/gpu.compute.major=8
nvidia.com/gpu.compute.minor=0
nvidia.com/gpu.count=2
nvidia.com/gpu.family=ampere
nvidia.com/gpu.machine=DGX-A100
nvidia.com/gpu.memory=81920
nvidia.com/gpu.mode=unknown
nvidia.com/gpu.product=NVIDIA-A100-SXM4-80GB
nvidia.com/gpu.product.NVIDIA-A100-SXM4-80GB.compute.major=8
nvidia.com/gpu.product.NVIDIA-A100-SXM4-80GB.compute.minor=0
nvidia.com/gpu.product.NVIDIA-A100-SXM4-80GB.count=2
nvidia.com/gpu.product.NVIDIA-A100-SXM4-80GB.family=ampere
nvidia.com/gpu.product.NVIDIA-A100-SXM4-80GB.memory=81920
nvidia.com/gpu.replicas=1
nvidia.com/gpu.sharing-strategy=none
nvidia.com/mig-1g.10gb.count=1
nvidia.com/mig-1g.10gb.engines.copy=1
nvidia.com/mig-1g.10gb.engines.decoder=0
nvidia.com/mig-1g.10gb.engines.encoder=0
nvidia.com/mig-1g.10gb.engines.jpeg=0
nvidia.com/mig-1g.10gb.engines.ofa=0
nvidia.com/mig-1g.10gb.memory=9728
nvidia.com/mig-1g.10gb.multiprocessors=14
nvidia.com/mig-1g.10gb.product=NVIDIA-A100-SXM4-80GB-MIG-1g.10gb
nvidia.com/mig-1g.10gb.replicas=1
nvidia.com/mig-1g.10gb.sharing-strategy=none
nvidia.com/mig-1g.10gb.slices.ci=1
nvidia.com/mig-1g.10gb.slices.gi=1
nvidia.com/mig-2g.20gb.count=1
nvidia.com/mig-2g.20gb.engines.copy=2
nvidia.com/mig-2g.20gb.engines.decoder=1
nvidia.com/mig-2g.20gb.engines.encoder=0
nvidia.com/mig-2g.20gb.engines.jpeg=0
nvidia.com/mig-2g.20gb.engines.ofa=0
nvidia.com/mig-2g.20gb.memory=19968
nvidia.com/mig-2g.20gb.multiprocessors=28
nvidia.com/mig-2g.20gb.product=NVIDIA-A100-SXM4-80GB-MIG-2g.20gb
nvidia.com/mig-2g.20gb.replicas=1
nvidia.com/mig-2g.20gb.sharing-strategy=none
nvidia.com/mig-2g.20gb.slices.ci=2
nvidia.com/mig-2g.20gb.slices.gi=2
nvidia.com/mig.capable=true
nvidia.com/mig.strategy=mixed
nvidia.com/mps.capable=false
nvidia.com/vgpu.host-driver-branch=r550_00
nvidia.com/vgpu.host-driver-version=550.90.05
nvidia.com/vgpu.present=true
"
    );
    assert_eq!(got, want);
    parse(&got);

    // GFD's default: a timestamp (seconds since the epoch) on top of the same labels.
    let before = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let mut stamped = parse(&setup.labels(&["--output", "-", "--mig-strategy", "mixed"]));
    let stamp: u64 = stamped
        .remove("nvidia.com/gfd.timestamp")
        .expect("a timestamp by default")
        .parse()
        .unwrap();
    assert!(
        stamp >= before,
        "timestamp {stamp} before the run ({before})"
    );
    assert_eq!(
        stamped,
        parse(&want),
        "the same labels besides the timestamp"
    );
}

/// The `nvshim` binary linked as `gpu-feature-discovery`: GFD's command line gives what
/// `nvshim labels` gives, GFD's usage errors exit 1, and with neither `--oneshot` nor an
/// interval it loops (GFD's default) until SIGTERM, then removes its file.
#[test]
fn the_gpu_feature_discovery_name_runs_labels_with_gfds_defaults() {
    let setup = Setup::new(&NodeSpec::standard(2));
    let gfd = setup.dir.path().join("gpu-feature-discovery");
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_nvshim"), &gfd).unwrap();
    let machine = setup.machine_file();
    let run = |args: &[&str], env: &[(&str, &str)]| {
        let mut cmd = Command::new(&gfd);
        cmd.env_clear()
            .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
            .args(args)
            .args(setup.node.sim.root_args())
            .envs(setup.node.sim.env())
            .envs(env.iter().copied());
        cmd
    };
    let want = setup.labels(&["--output", "-", "--no-timestamp"]);
    let args = [
        "--oneshot",
        "--no-timestamp",
        "-o",
        "-",
        "--machine-type-file",
        &machine,
    ];
    let out = run(&args, &[]).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        want,
        "oneshot to stdout"
    );

    let version = run(&["--version"], &[]).output().unwrap();
    assert!(version.status.success(), "--version");
    assert!(String::from_utf8_lossy(&version.stdout).starts_with("gpu-feature-discovery "));
    let bad = run(&["--mig-strategy", "half"], &[]).output().unwrap();
    assert_eq!(bad.status.code(), Some(1), "a usage error exits 1");
    assert!(String::from_utf8_lossy(&bad.stderr).contains("half"));

    fs::create_dir_all(setup.out_dir()).unwrap();
    let file = setup.out_file();
    let config = setup.dir.path().join("config.yaml");
    fs::write(&config, "version: v1\n").unwrap();
    let mut child = run(
        &["--machine-type-file", &machine],
        &[
            ("GFD_OUTPUT_FILE", file.to_str().unwrap()),
            ("GFD_CONFIG_FILE", config.to_str().unwrap()),
        ],
    )
    .stdout(Stdio::null())
    .spawn()
    .unwrap();
    let read = || fs::read_to_string(&file).unwrap_or_default();
    wait_for("the first labels", || read().contains("gpu.count=2\n"));
    assert!(
        read().contains("nvidia.com/gfd.timestamp="),
        "GFD stamps by default"
    );
    assert!(
        child.try_wait().unwrap().is_none(),
        "loops without --oneshot"
    );

    // SIGHUP, as GFD: the config file is read again and the labels follow at once.
    fs::write(
        &config,
        "version: v1\nsharing:\n  timeSlicing:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 4\n",
    )
    .unwrap();
    kill(Pid::from_raw(child.id() as i32), Signal::SIGHUP).unwrap();
    wait_for("the relabel after SIGHUP", || {
        read().contains("gpu.replicas=4\n")
    });
    assert!(
        child.try_wait().unwrap().is_none(),
        "still running after SIGHUP"
    );
    kill(Pid::from_raw(child.id() as i32), Signal::SIGTERM).unwrap();
    let mut status = None;
    wait_for("exit after SIGTERM", || {
        status = child.try_wait().unwrap();
        status.is_some()
    });
    assert!(status.unwrap().success(), "{status:?}");
    assert!(!file.exists(), "the feature file is removed on exit");
}
