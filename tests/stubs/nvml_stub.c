/* A scripted stand-in for libnvidia-ml.so.1, compiled by the tests (cc -shared -fPIC) and loaded
 * through --nvml-lib, so the real nvml-wrapper code path runs without a GPU.
 *
 * Environment (read at nvmlInit):
 *   STUB_NVML_GPUS=N           device count (default 1)
 *   STUB_NVML_INIT_FAIL=1      nvmlInit_v2 returns DRIVER_NOT_LOADED
 *   STUB_NVML_POWER_MW=N       instant power in mW (default 150000); the 1 s average reads 90 % of it
 *   STUB_NVML_NO_ENERGY=1      the energy counter is NOT_SUPPORTED
 *   STUB_NVML_LOST_INDEX=I     device I reports GPU_IS_LOST ...
 *   STUB_NVML_LOST_AFTER_MS=T  ... T ms after init (default 0)
 *   STUB_NVML_PROCS=pid:bytes,...   compute processes on every device
 *   STUB_NVML_MEM_USED_MIB=N   device i has N×(i+1) MiB in use (default: 2 GiB with processes,
 *                              else 0), 64 MiB more reserved by the driver
 *   STUB_NVML_MEMORY=v1        nvmlDeviceGetMemoryInfo_v2 is FUNCTION_NOT_FOUND (a driver before
 *                              R510); nvmlDeviceGetMemoryInfo (v1, whose used counts the reserved)
 *                              answers
 *   STUB_NVML_MEMORY=none      neither memory call is supported
 * The energy counter follows the instant power over monotonic time, so counter and integral agree.
 * nvmlDeviceGetCurrentClocksThrottleReasons is deliberately missing (a symbol an old driver lacks).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef int nvmlReturn_t;
typedef void *nvmlDevice_t;
enum { OK = 0, INVALID_ARG = 2, NOT_SUPPORTED = 3, INSUFFICIENT_SIZE = 7, DRIVER_NOT_LOADED = 9, FUNCTION_NOT_FOUND = 13, GPU_IS_LOST = 15 };

typedef struct { unsigned long long total, free, used; } nvmlMemory_t;
typedef struct { unsigned int version; unsigned long long total, reserved, free, used; } nvmlMemory_v2_t;
typedef struct { unsigned int gpu, memory; } nvmlUtilization_t;
typedef struct { unsigned int pid; unsigned long long usedGpuMemory; unsigned int gpuInstanceId, computeInstanceId; } nvmlProcessInfo_t;
typedef struct {
    unsigned int fieldId, scopeId;
    long long timestamp, latencyUsec;
    int valueType, nvmlReturn;
    union { double d; unsigned int ui; unsigned long long ull; } value;
} nvmlFieldValue_t;

static unsigned gpus = 1, power_mw = 150000;
static int no_energy = 0, lost_index = -1, mem_used_mib = -1;
static char memory[8];
static const unsigned long long MEM_TOTAL = 150754820096ULL, MEM_RESERVED = 64ULL << 20;
static double lost_after_s = 0, t_init = 0;
static char procs[256];

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}
static unsigned env_u(const char *k, unsigned d) { const char *v = getenv(k); return v ? (unsigned)strtoul(v, 0, 10) : d; }
static unsigned idx(nvmlDevice_t d) { return (unsigned)((uintptr_t)d - 1); }
static int lost(nvmlDevice_t d) { return (int)idx(d) == lost_index && now_s() - t_init >= lost_after_s; }

nvmlReturn_t nvmlInit_v2(void) {
    if (getenv("STUB_NVML_INIT_FAIL")) return DRIVER_NOT_LOADED;
    gpus = env_u("STUB_NVML_GPUS", 1);
    power_mw = env_u("STUB_NVML_POWER_MW", 150000);
    no_energy = getenv("STUB_NVML_NO_ENERGY") != NULL;
    lost_index = getenv("STUB_NVML_LOST_INDEX") ? (int)env_u("STUB_NVML_LOST_INDEX", 0) : -1;
    lost_after_s = env_u("STUB_NVML_LOST_AFTER_MS", 0) / 1000.0;
    snprintf(procs, sizeof procs, "%s", getenv("STUB_NVML_PROCS") ? getenv("STUB_NVML_PROCS") : "");
    mem_used_mib = getenv("STUB_NVML_MEM_USED_MIB") ? (int)env_u("STUB_NVML_MEM_USED_MIB", 0) : -1;
    snprintf(memory, sizeof memory, "%s", getenv("STUB_NVML_MEMORY") ? getenv("STUB_NVML_MEMORY") : "v2");
    t_init = now_s();
    return OK;
}
nvmlReturn_t nvmlInitWithFlags(unsigned int flags) { (void)flags; return nvmlInit_v2(); }
nvmlReturn_t nvmlShutdown(void) { return OK; }
const char *nvmlErrorString(nvmlReturn_t r) {
    switch (r) {
    case NOT_SUPPORTED: return "Not Supported";
    case GPU_IS_LOST: return "GPU is lost";
    case DRIVER_NOT_LOADED: return "Driver Not Loaded";
    default: return "Unknown Error";
    }
}
nvmlReturn_t nvmlSystemGetDriverVersion(char *v, unsigned int n) { snprintf(v, n, "580.159.04"); return OK; }
nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *n) { *n = gpus; return OK; }
nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int i, nvmlDevice_t *d) {
    if (i >= gpus) return INVALID_ARG;
    *d = (nvmlDevice_t)(uintptr_t)(i + 1);
    return OK;
}
nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t d, char *name, unsigned int n) {
    if (lost(d)) return GPU_IS_LOST;
    snprintf(name, n, "NVIDIA H200 (stub)");
    return OK;
}
nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t d, char *uuid, unsigned int n) {
    if (lost(d)) return GPU_IS_LOST;
    snprintf(uuid, n, "GPU-00000000-0000-0000-0000-00000000000%u", idx(d));
    return OK;
}
nvmlReturn_t nvmlDeviceGetFieldValues(nvmlDevice_t d, int count, nvmlFieldValue_t *v) {
    if (lost(d)) return GPU_IS_LOST;
    for (int i = 0; i < count; i++) {
        v[i].valueType = 1; /* unsigned int */
        v[i].nvmlReturn = OK;
        if (v[i].fieldId == 186) v[i].value.ui = power_mw;                 /* POWER_INSTANT */
        else if (v[i].fieldId == 185) v[i].value.ui = power_mw / 10 * 9;   /* POWER_AVERAGE */
        else v[i].nvmlReturn = NOT_SUPPORTED;
    }
    return OK;
}
nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t d, unsigned int *mw) {
    if (lost(d)) return GPU_IS_LOST;
    *mw = power_mw / 10 * 9;
    return OK;
}
nvmlReturn_t nvmlDeviceGetTotalEnergyConsumption(nvmlDevice_t d, unsigned long long *mj) {
    if (lost(d)) return GPU_IS_LOST;
    if (no_energy) return NOT_SUPPORTED;
    *mj = 5000000ULL + (unsigned long long)((now_s() - t_init) * power_mw);
    return OK;
}
static unsigned long long mem_used(nvmlDevice_t d) {
    if (mem_used_mib >= 0) return (unsigned long long)mem_used_mib * (idx(d) + 1) << 20;
    return procs[0] ? 2ULL << 30 : 0;
}
nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t d, nvmlMemory_v2_t *m) {
    if (lost(d)) return GPU_IS_LOST;
    if (strcmp(memory, "v1") == 0) return FUNCTION_NOT_FOUND;
    if (strcmp(memory, "none") == 0) return NOT_SUPPORTED;
    m->total = MEM_TOTAL;
    m->used = mem_used(d);
    m->reserved = MEM_RESERVED;
    m->free = m->total - m->used - m->reserved;
    return OK;
}
nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t d, nvmlMemory_t *m) {
    if (lost(d)) return GPU_IS_LOST;
    if (strcmp(memory, "none") == 0) return NOT_SUPPORTED;
    m->total = MEM_TOTAL;
    m->used = mem_used(d) + MEM_RESERVED;
    m->free = m->total - m->used;
    return OK;
}
nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t d, nvmlUtilization_t *u) {
    if (lost(d)) return GPU_IS_LOST;
    u->gpu = 42;
    u->memory = 7;
    return OK;
}
nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t d, int sensor, unsigned int *t) {
    (void)sensor;
    if (lost(d)) return GPU_IS_LOST;
    *t = 33;
    return OK;
}
nvmlReturn_t nvmlDeviceGetClockInfo(nvmlDevice_t d, int type, unsigned int *mhz) {
    if (lost(d)) return GPU_IS_LOST;
    *mhz = type == 1 ? 1980 : type == 2 ? 3201 : 1755; /* SM=1, MEM=2 */
    return OK;
}
nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t d, unsigned int *count, nvmlProcessInfo_t *infos) {
    if (lost(d)) return GPU_IS_LOST;
    unsigned n = 0;
    nvmlProcessInfo_t list[16];
    char buf[256];
    snprintf(buf, sizeof buf, "%s", procs);
    for (char *tok = strtok(buf, ","); tok && n < 16; tok = strtok(NULL, ",")) {
        unsigned pid = 0;
        unsigned long long bytes = 0;
        if (sscanf(tok, "%u:%llu", &pid, &bytes) == 2) {
            list[n].pid = pid;
            list[n].usedGpuMemory = bytes;
            list[n].gpuInstanceId = list[n].computeInstanceId = 0xFFFFFFFF;
            n++;
        }
    }
    if (!infos || *count < n) {
        *count = n;
        return n ? INSUFFICIENT_SIZE : OK;
    }
    memcpy(infos, list, n * sizeof *list);
    *count = n;
    return OK;
}
