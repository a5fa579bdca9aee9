// SPDX-License-Identifier: Apache-2.0
//! The monitor's pure parts: which units an event marks, the defaults, the stop flag.

use super::*;
use nvshim::inventory::MigDevice;

fn mig(index: u32, gpu_instance_id: u32, compute_instance_id: u32) -> MigDevice {
    MigDevice {
        index,
        gpu_instance_id,
        compute_instance_id,
        uuid: format!("MIG-{index}"),
        memory_bytes: None,
        profile: "1g.10gb".to_string(),
    }
}

fn unit(gpu: u32, mig: Option<u32>) -> Unit {
    Unit { gpu, mig }
}

#[test]
fn events_mark_the_units_they_name() {
    let gpu = Gpu {
        index: 3,
        minor: 3,
        uuid: "GPU-3".to_string(),
        bus_id: "0000:47:00.0".to_string(),
        name: "NVIDIA A100-SXM4-80GB".to_string(),
        memory_bytes: None,
        compute_capability: None,
        brand: None,
        mig_enabled: Some(true),
        // Two compute instances share GPU instance 1.
        mig_devices: vec![mig(0, 1, 0), mig(1, 1, 1), mig(2, 2, 0)],
    };
    let all = [
        unit(3, None),
        unit(3, Some(0)),
        unit(3, Some(1)),
        unit(3, Some(2)),
    ];
    let whole_gpu = [unit(3, None)];
    let none = INSTANCE_ID_NONE;
    // (case, units the board knows, GPU instance, compute instance, want: the groups)
    type Case<'a> = (&'a str, &'a [Unit], u32, u32, Vec<Vec<Unit>>);
    let cases: [Case; 7] = [
        ("GPU-wide", &all, none, none, vec![all.to_vec()]),
        ("one MIG device", &all, 2, 0, vec![vec![unit(3, Some(2))]]),
        (
            "a whole GPU instance",
            &all,
            1,
            none,
            vec![vec![unit(3, Some(0))], vec![unit(3, Some(1))]],
        ),
        (
            "one of two compute instances",
            &all,
            1,
            1,
            vec![vec![unit(3, Some(1))]],
        ),
        ("an unknown instance", &all, 5, 0, vec![all.to_vec()]),
        (
            "MIG strategy none",
            &whole_gpu,
            2,
            0,
            vec![whole_gpu.to_vec()],
        ),
        ("nothing advertised", &[], none, none, vec![]),
    ];
    for (case, known, gi, ci, want) in cases {
        let got: Vec<Vec<Unit>> = targets(&gpu, known, gi, ci)
            .into_iter()
            .map(|(units, _)| units)
            .collect();
        assert_eq!(got, want, "case {case}");
    }
    let places: Vec<String> = targets(&gpu, &all, 2, 0)
        .into_iter()
        .chain(targets(&gpu, &whole_gpu, none, none))
        .map(|(_, place)| place)
        .collect();
    assert_eq!(places, ["MIG device 3:2 (MIG-2)", "GPU 3 (GPU-3)"]);
}

#[test]
fn defaults_keep_stop_and_events_prompt() {
    let options = WatchOptions::default();
    assert!(options.wait_timeout <= Duration::from_millis(200));
    assert_eq!(options.reprobe_interval, Duration::from_secs(30));
    assert_eq!(options.recovery_quiet_period, Duration::from_secs(300));
}

#[test]
fn pause_returns_once_stopped() {
    let stop = AtomicBool::new(true);
    let started = Instant::now();
    pause(&stop, Duration::from_secs(3600), Duration::from_millis(10));
    assert!(started.elapsed() < Duration::from_secs(3600));
}
