// SPDX-License-Identifier: Apache-2.0
//! Property tests: whatever IDs kubelet (or anyone on the socket) sends, `allocate`
//! never panics, and either answers with each requested unit once, in unit order,
//! or refuses for the reason the request deserves.

use std::collections::{BTreeSet, HashSet};
use std::path::Path;

use proptest::prelude::*;

use super::*;
use crate::config::{DeviceIdStrategy, DeviceListStrategy};
use crate::resources::fixtures::{gpus, time_slicing};
use crate::resources::{self, ResourceIndex};

/// One requested ID: a known device (by position) or arbitrary text.
#[derive(Debug, Clone)]
enum Pick {
    Known(usize),
    Text(String),
}

fn arb_pick() -> impl Strategy<Value = Pick> {
    prop_oneof![
        4 => (0usize..24).prop_map(Pick::Known),
        1 => "[0-9:]{0,6}".prop_map(Pick::Text),
        1 => any::<String>().prop_map(Pick::Text),
    ]
}

proptest! {
    #[test]
    fn requests_never_panic(
        picks in prop::collection::vec(arb_pick(), 0..24),
        replicas in prop_oneof![Just(None), (2u32..4).prop_map(Some)],
        sick in prop::collection::btree_set(0u32..6, 0..2),
    ) {
        let mut s = Settings {
            device_id_strategy: DeviceIdStrategy::Index,
            device_list_strategies: vec![DeviceListStrategy::Envvar],
            ..Settings::default()
        };
        s.sharing = replicas.map(|r| time_slicing("nvidia.com/gpu", r, false, false));
        let built = resources::build(&gpus(6), &s, Path::new("/nonexistent")).unwrap();
        let r = &built[0];
        let index = ResourceIndex::new(r);
        let ids: Vec<String> = picks
            .iter()
            .map(|p| match p {
                Pick::Known(i) => r.devices[i % r.devices.len()].id.clone(),
                Pick::Text(t) => t.clone(),
            })
            .collect();
        let healthy = |u: Unit| !sick.contains(&u.gpu);
        let result = allocate(r, &index, &ids, &s, &healthy);

        let known: Vec<usize> = ids.iter().filter_map(|id| index.position(id)).collect();
        let distinct: HashSet<usize> = known.iter().copied().collect();
        let gpus: BTreeSet<u32> = known.iter().map(|p| r.devices[*p].unit.gpu).collect();
        match result {
            Ok(got) => {
                prop_assert!(!ids.is_empty());
                prop_assert_eq!(known.len(), ids.len(), "all ids known");
                prop_assert_eq!(distinct.len(), ids.len(), "no duplicates");
                prop_assert!(gpus.iter().all(|g| !sick.contains(g)));
                let want: Vec<String> = gpus.iter().map(u32::to_string).collect();
                prop_assert_eq!(&got.envs["NVIDIA_VISIBLE_DEVICES"], &want.join(","));
            }
            Err(AllocateError::EmptyRequest { .. }) => prop_assert!(ids.is_empty()),
            Err(AllocateError::UnknownDevices { ids: bad, .. }) => {
                prop_assert_eq!(bad.total, ids.len() - known.len());
            }
            Err(AllocateError::DuplicateDevices { .. }) => {
                prop_assert!(distinct.len() < ids.len());
            }
            Err(AllocateError::Unhealthy { .. }) => {
                prop_assert!(gpus.iter().any(|g| sick.contains(g)));
            }
            Err(other) => prop_assert!(false, "unexpected error {other}"),
        }
    }
}
