// SPDX-License-Identifier: Apache-2.0
// What NVML costs a bare C process: dlopen the library, nvmlInit_v2, a handle and UUID
// for every GPU, then print VmHWM. `benches/plugin.rs` builds it with the system cc and
// compares the device plugin's peak RSS with it.
//
// usage: nvml_baseline /path/to/libnvidia-ml.so.1
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

typedef int (*init_fn)(void);
typedef int (*count_fn)(unsigned int *);
typedef int (*handle_fn)(unsigned int, void **);
typedef int (*uuid_fn)(void *, char *, unsigned int);

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: nvml_baseline LIBRARY\n");
        return 2;
    }
    void *lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        fprintf(stderr, "dlopen: %s\n", dlerror());
        return 1;
    }
    init_fn init = (init_fn)dlsym(lib, "nvmlInit_v2");
    count_fn count = (count_fn)dlsym(lib, "nvmlDeviceGetCount_v2");
    handle_fn handle = (handle_fn)dlsym(lib, "nvmlDeviceGetHandleByIndex_v2");
    uuid_fn uuid = (uuid_fn)dlsym(lib, "nvmlDeviceGetUUID");
    if (!init || !count || !handle || !uuid || init() != 0) {
        fprintf(stderr, "NVML did not initialise\n");
        return 1;
    }
    unsigned int n = 0;
    count(&n);
    for (unsigned int i = 0; i < n; i++) {
        void *device = NULL;
        char id[96];
        if (handle(i, &device) == 0) {
            uuid(device, id, sizeof id);
        }
    }
    FILE *status = fopen("/proc/self/status", "r");
    char line[256];
    while (status && fgets(line, sizeof line, status)) {
        if (strncmp(line, "VmHWM:", 6) == 0) {
            fputs(line, stdout);
        }
    }
    printf("GPUs: %u\n", n);
    return 0;
}
