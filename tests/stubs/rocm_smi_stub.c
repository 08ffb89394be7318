/* A scripted stand-in for librocm_smi64.so (ROCm SMI 5.x ABI), compiled by the tests and loaded
 * through --rocm-lib. Like 5.2.3 it has rsmi_dev_power_ave_get but no
 * rsmi_dev_current_socket_power_get. Any call with an index beyond the device count abort()s, the
 * way real versions segfault, so a test run proves the supervisor never makes one.
 *   STUB_RSMI_INIT_STATUS=N   rsmi_init's status (default 0; 8 = INIT_ERROR, no AMD GPU)
 *   STUB_RSMI_GPUS=N          device count (default 1)
 *   STUB_RSMI_POWER_UW=N      average socket power, µW (default 500000000)
 *   STUB_RSMI_NO_MEMORY=1     rsmi_dev_memory_usage_get is NOT_SUPPORTED
 * Device i has (3 + i) GiB of VRAM in use; memory calls for another type than VRAM are
 * NOT_SUPPORTED, so a reading proves the VRAM type was asked for.
 * The energy counter ticks in 15.3 µJ units and follows the power over monotonic time.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static unsigned gpus = 1;
static int no_memory = 0;
enum { RSMI_STATUS_NOT_SUPPORTED = 2, RSMI_MEM_TYPE_VRAM = 0 };
static unsigned long long power_uw = 500000000ULL;
static double t0;
static const float RES_UJ = 15.3f;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}
static void guard(uint32_t i) { if (i >= gpus) abort(); }

int rsmi_init(uint64_t flags) {
    (void)flags;
    const char *st = getenv("STUB_RSMI_INIT_STATUS");
    if (st && atoi(st) != 0) return atoi(st);
    gpus = getenv("STUB_RSMI_GPUS") ? (unsigned)atoi(getenv("STUB_RSMI_GPUS")) : 1;
    if (getenv("STUB_RSMI_POWER_UW")) power_uw = strtoull(getenv("STUB_RSMI_POWER_UW"), 0, 10);
    no_memory = getenv("STUB_RSMI_NO_MEMORY") != NULL;
    t0 = now_s();
    return 0;
}
int rsmi_shut_down(void) { return 0; }
int rsmi_num_monitor_devices(uint32_t *n) { *n = gpus; return 0; }
int rsmi_dev_name_get(uint32_t i, char *name, size_t len) { guard(i); snprintf(name, len, "AMD Instinct MI325X (stub)"); return 0; }
int rsmi_dev_unique_id_get(uint32_t i, uint64_t *id) { guard(i); *id = 0x8f1c2a3b4d5e6f70ULL + i; return 0; }
int rsmi_dev_power_ave_get(uint32_t i, uint32_t sensor, uint64_t *uw) { (void)sensor; guard(i); *uw = power_uw; return 0; }
int rsmi_dev_energy_count_get(uint32_t i, uint64_t *count, float *res, uint64_t *ts) {
    guard(i);
    double uj = 1e9 + (now_s() - t0) * (double)power_uw;
    *count = (uint64_t)(uj / RES_UJ);
    *res = RES_UJ;
    *ts = (uint64_t)(now_s() * 1e9);
    return 0;
}
int rsmi_dev_memory_total_get(uint32_t i, int type, uint64_t *v) {
    guard(i);
    if (type != RSMI_MEM_TYPE_VRAM) return RSMI_STATUS_NOT_SUPPORTED;
    *v = 274877906944ULL;
    return 0;
}
int rsmi_dev_memory_usage_get(uint32_t i, int type, uint64_t *v) {
    guard(i);
    if (type != RSMI_MEM_TYPE_VRAM || no_memory) return RSMI_STATUS_NOT_SUPPORTED;
    *v = (3ULL + i) << 30;
    return 0;
}
int rsmi_dev_busy_percent_get(uint32_t i, uint32_t *p) { guard(i); *p = 88; return 0; }
int rsmi_dev_temp_metric_get(uint32_t i, uint32_t sensor, uint32_t metric, int64_t *t) { (void)sensor; (void)metric; guard(i); *t = 51000; return 0; }
