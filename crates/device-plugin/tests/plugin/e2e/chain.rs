// SPDX-License-Identifier: Apache-2.0
//! The chain from `Allocate` through `nvidia-container-runtime` and runc to the GPUs
//! a container sees.

use super::*;

// 10. The chain: Allocate → env → nvidia-container-runtime → runc → the GPUs a
// container sees.

#[tokio::test]
async fn allocated_env_gives_the_container_exactly_those_gpus() {
    let node = node(&NodeSpec::standard(8));
    let sim = &node.sim;
    let dir = tempfile::tempdir().unwrap();
    let rootfs = dir.path().join("rootfs");
    sim.container_rootfs().build(&rootfs).unwrap();
    let config = dir.path().join("config.toml");
    fs::write(&config, sim.runtime_config("runc", None)).unwrap();
    let runc_root = dir.path().join("runc-root");
    let uuid = |i: usize| sim.spec.gpus[i].uuid.clone();

    for id_strategy in ["uuid", "index"] {
        let case = id_strategy;
        let run = launch(
            sim,
            Launch {
                args: &["--device-id-strategy", id_strategy],
                ..Launch::default()
            },
        )
        .await;
        run.registrations(1, GENEROUS, case).await;
        let id = |i: usize| match id_strategy {
            "uuid" => uuid(i),
            _ => i.to_string(),
        };
        // GPU 6 is /dev/nvidia7 on the standard node.
        let answer = run
            .dial(GPU_SOCKET)
            .await
            .allocate(allocate_request(&[&[id(6), id(1)]]))
            .await
            .unwrap_or_else(|e| panic!("case {case}: {e}"))
            .into_inner();
        let mut envs: Vec<String> = answer.container_responses[0]
            .envs
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        envs.sort();
        assert_eq!(envs.len(), 1, "case {case}: {envs:?}");

        let id = format!("nvshim-plugin-e2e-{}-{case}", std::process::id());
        let bundle = dir.path().join(&id);
        let mut env = vec![
            "MOCK_NVML_CONFIG=/etc/mock-nvml.json",
            "MOCK_NVML_DEV_ROOT=/dev",
        ];
        env.extend(envs.iter().map(String::as_str));
        runc_bundle(&bundle, &rootfs, &["sh", "-c", GPU_SCRIPT], &env).unwrap();
        // The mock NVML inside reads the node's GPUs from its config: mount it in.
        let spec_path = bundle.join("config.json");
        let mut spec: Value = serde_json::from_slice(&fs::read(&spec_path).unwrap()).unwrap();
        spec["mounts"].as_array_mut().unwrap().push(json!({
            "destination": "/etc/mock-nvml.json",
            "type": "bind",
            "source": sim.mock_config,
            "options": ["ro", "bind"],
        }));
        fs::write(&spec_path, serde_json::to_vec_pretty(&spec).unwrap()).unwrap();
        let out = Command::new(crate::common::runtime_bin())
            .env_clear()
            .env(
                "PATH",
                "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            )
            .env("NVIDIA_CTK_CONFIG_FILE_PATH", &config)
            .arg("--root")
            .arg(&runc_root)
            .args(["run", "--bundle"])
            .arg(&bundle)
            .arg(&id)
            .output()
            .unwrap();
        let printed = Printed(String::from_utf8_lossy(&out.stdout).into_owned());
        assert!(
            out.status.success(),
            "case {case}: container failed ({}):\n{}\n{}",
            out.status,
            printed.0,
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(
            printed.gpu_nodes(),
            strings(&["nvidia1", "nvidia7"]),
            "case {case}: {envs:?}\n{}",
            printed.0
        );
        let smi = printed.smi_lines();
        assert_eq!(smi.len(), 2, "case {case}: {smi:?}");
        assert!(
            smi[0].contains(&uuid(1)) && smi[1].contains(&uuid(6)),
            "case {case}: {smi:?}"
        );
    }
}
