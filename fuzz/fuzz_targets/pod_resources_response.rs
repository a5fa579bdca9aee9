// SPDX-License-Identifier: Apache-2.0
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| nvshim_fuzz::checks::pod_resources_response(data));
