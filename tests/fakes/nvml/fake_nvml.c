/*
 * A fake libnvidia-ml.so.1, compiled against NVIDIA's own nvml.h, so that every prototype, struct
 * layout and return code is the header's. The real nvidia-ml-py loads it through its normal
 * lookup (dlopen("libnvidia-ml.so.1")) and cannot tell it from the driver's library.
 *
 * It models what partkeeper uses of MIG: cards with MIG mode current and pending, GPU-instance
 * profiles with NVIDIA's ids and legal placements (A100-40GB, H100-80GB, H200-141GB; a T4 without
 * MIG), GPU instances created at a placement with the slot's own id (fk_gi_id), compute instances
 * inside them, MIG devices by index (NOT_FOUND for an empty index), running processes per compute
 * instance, destroy refused with IN_USE while processes (for a CI) or CIs (for a GI) remain, the
 * MIG capability files the kernel driver publishes under /proc/driver/nvidia/capabilities and
 * /proc/devices; per profile a placements answer other than the placements, and MIG mode switched
 * off under the caller (every instance gone, the MIG calls NOT_SUPPORTED).
 *
 * State lives in the file FAKE_NVML_STATE (see ../common/fakestate.h): every process that loads
 * the library sees the same cards, and failures are injected through it. Without the file the
 * library answers as NVML does with no driver loaded. Pointers and versioned structs are checked
 * as a real GPU would need them to be: a struct passed by value where the header asks for a
 * pointer, or a versioned struct without its version, is rejected and recorded as a complaint.
 */
#define _DEFAULT_SOURCE
#include "fake_nvml.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define P1 NVML_GPU_INSTANCE_PROFILE_1_SLICE
#define P1ME NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1
#define P1X2 NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2
#define P2 NVML_GPU_INSTANCE_PROFILE_2_SLICE
#define P3 NVML_GPU_INSTANCE_PROFILE_3_SLICE
#define P4 NVML_GPU_INSTANCE_PROFILE_4_SLICE
#define P7 NVML_GPU_INSTANCE_PROFILE_7_SLICE

/* NVIDIA's profile ids, instance counts and placements (memory slices, start bitmask). */
#define MODEL(key, nm, mib, m1, m2, m3, m4, m7, n1, n1x2, n2, n3, n4, n7)                     \
    {key, nm, mib, 1,                                                                         \
     {{P1, 19, 1, 7, 1, 0x7f, m1, n1, 0, 0},     {P1ME, 20, 1, 1, 1, 0x7f, m1, n1 "+me", 0, 0},\
      {P1X2, 15, 1, 4, 2, 0x55, m2, n1x2, 0, 0}, {P2, 14, 2, 3, 2, 0x15, m2, n2, 0, 0},        \
      {P3, 9, 3, 2, 4, 0x11, m3, n3, 0, 0},      {P4, 5, 4, 1, 4, 0x01, m4, n4, 0, 0},         \
      {P7, 0, 7, 1, 8, 0x01, m7, n7, 0, 0}}}

static const model_def MODELS[] = {
    MODEL("A100-40GB", "NVIDIA A100-SXM4-40GB", 40960, 4864, 9856, 19968, 19968, 40192,
          "1g.5gb", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"),
    MODEL("H100-80GB", "NVIDIA H100 80GB HBM3", 81559, 9984, 20096, 40320, 40320, 80896,
          "1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"),
    MODEL("H200-141GB", "NVIDIA H200", 143771, 17920, 33792, 69376, 69376, 140288, "1g.18gb",
          "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb"),
    {"T4", "Tesla T4", 15360, 0, {{0}}},
};


/* -- handles ------------------------------------------------------------------------------- */

static struct nvmlDevice_st devices[MAX_GPUS], migs[MAX_GPUS][MAX_GI][MAX_CI];
static struct nvmlGpuInstance_st gis[MAX_GPUS][MAX_GI];
static struct nvmlComputeInstance_st cis[MAX_GPUS][MAX_GI][MAX_CI];
static int initialised;

nvmlDevice_t fk_device_handle(int g) {
    devices[g] = (struct nvmlDevice_st){HANDLE_MAGIC, g, -1, -1};
    return &devices[g];
}
nvmlDevice_t fk_mig_handle(int g, int gi, int ci) {
    migs[g][gi][ci] = (struct nvmlDevice_st){HANDLE_MAGIC, g, gi, ci};
    return &migs[g][gi][ci];
}
nvmlGpuInstance_t fk_gi_handle(int g, int gi) {
    gis[g][gi] = (struct nvmlGpuInstance_st){HANDLE_MAGIC, g, gi};
    return &gis[g][gi];
}
nvmlComputeInstance_t fk_ci_handle(int g, int gi, int ci) {
    cis[g][gi][ci] = (struct nvmlComputeInstance_st){HANDLE_MAGIC, g, gi, ci};
    return &cis[g][gi][ci];
}

#define IN_TABLE(p, table) \
    ((const char *)(p) >= (const char *)(table) && (const char *)(p) < (const char *)(table) + sizeof(table))


/* -- one call: lock the state, count the call, answer an injected failure ------------------ */

nvmlReturn_t fk_begin(call *c, const char *fn) {
    int injected = fake_begin(&c->s, getenv("FAKE_NVML_STATE"), sizeof(nvml_state), MAGIC, fn);
    c->st = (nvml_state *)c->s.state;
    if (injected < 0) return NVML_ERROR_DRIVER_NOT_LOADED;
    if (injected > 0) {
        fake_end(&c->s, 1);
        return (nvmlReturn_t)injected;
    }
    if (!initialised && strncmp(fn, "nvmlInit", 8) != 0) {
        fake_end(&c->s, 1);
        return NVML_ERROR_UNINITIALIZED;
    }
    return NVML_SUCCESS;
}

nvmlReturn_t fk_end(call *c, nvmlReturn_t rc) {
    fake_end(&c->s, 1); /* written back every time: the call counters change */
    return rc;
}

nvmlReturn_t fk_reject(call *c, const char *fn, const char *what) {
    fake_complain(c->s.state, "%s: %s", fn, what);
    return fk_end(c, NVML_ERROR_INVALID_ARGUMENT);
}

gpu_state *fk_card(call *c, nvmlDevice_t d, int whole) {
    if (!IN_TABLE(d, devices) && !IN_TABLE(d, migs)) return NULL;
    if (d->magic != HANDLE_MAGIC || d->gpu < 0 || (unsigned)d->gpu >= c->st->ngpus) return NULL;
    if (whole && d->gi >= 0) return NULL;
    return &c->st->gpu[d->gpu];
}

gi_state *fk_gpu_instance(call *c, nvmlGpuInstance_t h) {
    if (!IN_TABLE(h, gis) || h->magic != HANDLE_MAGIC || (unsigned)h->gpu >= c->st->ngpus) return NULL;
    gi_state *gi = &c->st->gpu[h->gpu].gi[h->gi];
    return gi->used ? gi : NULL;
}

ci_state *fk_compute_instance(call *c, nvmlComputeInstance_t h) {
    if (!IN_TABLE(h, cis) || h->magic != HANDLE_MAGIC || (unsigned)h->gpu >= c->st->ngpus) return NULL;
    gi_state *gi = &c->st->gpu[h->gpu].gi[h->gi];
    return gi->used && gi->ci[h->ci].used ? &gi->ci[h->ci] : NULL;
}

const gi_profile *fk_profile_by(gpu_state *g, int by_const, unsigned value) {
    for (unsigned i = 0; i < g->nprofiles; i++)
        if ((by_const ? g->profiles[i].cnst : g->profiles[i].id) == value) return &g->profiles[i];
    return NULL;
}

unsigned fk_ci_slices(unsigned cnst) {
    static const unsigned slices[] = {1, 2, 3, 4, 7, 8, 6};
    return cnst < sizeof slices / sizeof slices[0] ? slices[cnst] : 0;
}

void fk_mig_uuid(const gpu_state *g, unsigned gi, unsigned ci, unsigned start, char *out, size_t n) {
    /* Name-based, as observed: a successor at the same GI id and start has the same UUID. */
    unsigned long long h = 1469598103934665603ull;
    for (const char *p = g->uuid; *p; p++) h = (h ^ (unsigned char)*p) * 1099511628211ull;
    h = ((h ^ gi) * 1099511628211ull ^ ci) * 1099511628211ull ^ start;
    h *= 1099511628211ull;
    snprintf(out, n, "MIG-%08x-%04x-%04x-%04x-%012llx", (unsigned)(h >> 32), (unsigned)(h >> 16) & 0xffff,
             (unsigned)h & 0xffff, (gi << 8 | ci) & 0xffff, (h * 31 + start) & 0xffffffffffffull);
}

/* -- the MIG capability files of /proc/driver/nvidia/capabilities -------------------------- */

/* Real NVML numbers GPU instances by their node in the slot tree of an 8-slot card: the full card
 * is GI 0, the two halves (start 0, 4) GI 1 and 2, the quarters GI 3..6, the eighths GI 7..14
 * (`nvidia-smi mig -lgi` on an A100: 7g GI 0, 3g at 4 GI 2, 1g at 0..6 GI 7..13). A heap index. */
unsigned fk_gi_id(unsigned start, unsigned size) {
    return SLICES / size - 1 + start / size;
}

/* The minors the kernel driver assigns, as /proc/driver/nvidia-caps/mig-minors lists them (quoted
 * in NVIDIA's k8s-dra-driver-gpu, internal/common/nvcaps.go): gpu0/gi0/access 3, gpu0/gi0/ci0 4,
 * ..., gpu3/gi3/ci3 439: 135 per GPU (15 GIs of 1 + 8 CIs), from 3. */
static unsigned cap_minor(const gpu_state *g, unsigned gi, int ci) {
    return 3 + g->minor * MAX_GI * (1 + MAX_CI) + gi * (1 + MAX_CI) + (unsigned)(ci + 1);
}

static void cap_path(const nvml_state *st, const gpu_state *g, unsigned gi, int ci, char *out, size_t n) {
    int k = snprintf(out, n, "%s/driver/nvidia/capabilities/gpu%u/mig/gi%u", st->proc_root, g->minor, gi);
    if (ci >= 0 && k > 0) snprintf(out + k, n - (size_t)k, "/ci%d", ci);
}

static void mkdirs_above(const char *file) {
    char dir[512];
    snprintf(dir, sizeof dir, "%s", file);
    char *slash = strrchr(dir, '/');
    if (slash == NULL || slash == dir) return;
    *slash = '\0';
    for (char *p = dir + 1; *p; p++) {
        if (*p != '/') continue;
        *p = '\0';
        mkdir(dir, 0755);
        *p = '/';
    }
    mkdir(dir, 0755);
}

static void mkdirs(char *path) {
    for (char *p = path + 1; *p; p++) {
        if (*p != '/') continue;
        *p = '\0';
        mkdir(path, 0755);
        *p = '/';
    }
    mkdir(path, 0755);
}

void fk_publish_cap(const nvml_state *st, const gpu_state *g, unsigned gi, int ci, int on) {
    if (st->proc_root[0] == '\0') return;
    char dir[512], file[600];
    cap_path(st, g, gi, ci, dir, sizeof dir);
    snprintf(file, sizeof file, "%s/access", dir);
    if (!on) {
        unlink(file);
        rmdir(dir);
        return;
    }
    mkdirs(dir);
    FILE *f = fopen(file, "w");
    if (f == NULL) return;
    fprintf(f, "DeviceFileMinor: %u\nDeviceFileMode: 292\nDeviceFileModify: 1\n", cap_minor(g, gi, ci));
    fclose(f);
}

/* -- library and device -------------------------------------------------------------------- */

nvmlReturn_t nvmlInitWithFlags(unsigned int flags) {
    BEGIN(c);
    initialised++;
    return fk_end(&c, NVML_SUCCESS);
}

nvmlReturn_t nvmlInit(void) { return nvmlInitWithFlags(0); }

nvmlReturn_t nvmlShutdown(void) {
    BEGIN(c);
    initialised--;
    return fk_end(&c, NVML_SUCCESS);
}

const char *nvmlErrorString(nvmlReturn_t result) {
    switch (result) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_NO_PERMISSION: return "Insufficient Permissions";
    case NVML_ERROR_NOT_FOUND: return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    case NVML_ERROR_TIMEOUT: return "Timeout";
    case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
    case NVML_ERROR_IN_USE: return "In use by another client";
    case NVML_ERROR_INSUFFICIENT_RESOURCES: return "Insufficient Resources";
    case NVML_ERROR_ARGUMENT_VERSION_MISMATCH: return "Argument version mismatch";
    default: return "Unknown Error";
    }
}

nvmlReturn_t nvmlDeviceGetCount(unsigned int *count) {
    BEGIN(c);
    OUT(c, count);
    *count = c.st->ngpus;
    return fk_end(&c, NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t *device) {
    BEGIN(c);
    OUT(c, device);
    if (index >= c.st->ngpus) return fk_end(&c, NVML_ERROR_INVALID_ARGUMENT);
    if (c.st->gpu[index].lost) return fk_end(&c, NVML_ERROR_GPU_IS_LOST);
    *device = fk_device_handle((int)index);
    return fk_end(&c, NVML_SUCCESS);
}

static nvmlReturn_t copy_string(call *c, const char *fn, const char *text, char *out, unsigned len) {
    if (out == NULL || len == 0 || !fake_readable(out, len)) return fk_reject(c, fn, "buffer is not a valid pointer");
    if (strlen(text) + 1 > len) return fk_end(c, NVML_ERROR_INSUFFICIENT_SIZE);
    memcpy(out, text, strlen(text) + 1);
    return fk_end(c, NVML_SUCCESS);
}

/* Versions as a 550-series driver reports them (the first field of the NVML version is the CUDA
 * major of the driver's API). */
nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length) {
    BEGIN(c);
    return copy_string(&c, __func__, "550.54.15", version, length);
}

nvmlReturn_t nvmlSystemGetNVMLVersion(char *version, unsigned int length) {
    BEGIN(c);
    return copy_string(&c, __func__, "12.550.54.15", version, length);
}

nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length) {
    BEGIN(c);
    ANY_DEVICE(c, g, device);
    return copy_string(&c, __func__, g->name, name, length);
}

nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length) {
    BEGIN(c);
    ANY_DEVICE(c, g, device);
    if (device->gi < 0) return copy_string(&c, __func__, g->uuid, uuid, length);
    gi_state *gi = &g->gi[device->gi];
    if (!gi->used || !gi->ci[device->ci].used) return fk_end(&c, NVML_ERROR_INVALID_ARGUMENT);
    char text[NVML_DEVICE_UUID_V2_BUFFER_SIZE];
    fk_mig_uuid(g, (unsigned)device->gi, (unsigned)device->ci, gi->start, text, sizeof text);
    return copy_string(&c, __func__, text, uuid, length);
}

nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory) {
    BEGIN(c);
    OUT(c, memory);
    WHOLE_CARD(c, g, device);
    memory->total = g->memory_mib << 20;
    memory->used = 0;
    memory->free = memory->total;
    return fk_end(&c, NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t device, unsigned int *minorNumber) {
    BEGIN(c);
    OUT(c, minorNumber);
    WHOLE_CARD(c, g, device);
    *minorNumber = g->minor;
    return fk_end(&c, NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t device, unsigned int *currentMode, unsigned int *pendingMode) {
    BEGIN(c);
    OUT(c, currentMode);
    OUT(c, pendingMode);
    WHOLE_CARD(c, g, device);
    if (!g->mig_capable) return fk_end(&c, NVML_ERROR_NOT_SUPPORTED);
    *currentMode = g->mig_current;
    *pendingMode = g->mig_pending;
    return fk_end(&c, NVML_SUCCESS);
}

/* -- control entry points for tests (see tests/fakes/nvml/__init__.py) ------------------------- */

/* /proc/devices as the loaded modules make it: NVIDIA's fixed major 195 and the dynamic majors of
 * nvidia-uvm and nvidia-caps. nvidia-caps-imex-channels comes first, so a reader that matches
 * "nvidia-caps" as a prefix takes the wrong major (nvidia-modprobe matches the whole name:
 * modprobe-utils/nvidia-modprobe-utils.c, nvidia_get_chardev_major). */
static int write_proc_devices(const char *proc_root) {
    char path[512];
    snprintf(path, sizeof path, "%s/devices", proc_root);
    mkdirs_above(path);
    FILE *f = fopen(path, "w");
    if (f == NULL) return -1;
    fprintf(f, "Character devices:\n  1 mem\n  4 tty\n195 nvidia-frontend\n"
               "%u nvidia-caps-imex-channels\n%u nvidia-caps\n%u nvidia-uvm\n\n"
               "Block devices:\n  8 sd\n%u nvidia-caps\n",
            FAKE_IMEX_MAJOR, FAKE_CAPS_MAJOR, FAKE_UVM_MAJOR, FAKE_CAPS_MAJOR + 20);
    return fclose(f) == 0 ? 0 : -1;
}

int fake_nvml_new(const char *path, const char *proc_root) {
    nvml_state *st = calloc(1, sizeof *st);
    if (st == NULL) return -1;
    snprintf(st->proc_root, sizeof st->proc_root, "%s", proc_root ? proc_root : "");
    int rc = fake_create(path, sizeof *st, MAGIC, st);
    free(st);
    if (rc == 0 && proc_root != NULL && proc_root[0] != '\0') rc = write_proc_devices(proc_root);
    return rc;
}

static int control(fake_session *s, const char *path) {
    return fake_begin(s, path, sizeof(nvml_state), MAGIC, "control") < 0 ? -1 : 0;
}

int fake_nvml_add_gpu(const char *path, const char *model, unsigned mig_current, unsigned mig_pending) {
    fake_session s;
    if (control(&s, path) != 0) return -1;
    nvml_state *st = (nvml_state *)s.state;
    const model_def *m = NULL;
    for (size_t i = 0; i < sizeof MODELS / sizeof MODELS[0]; i++)
        if (strcmp(MODELS[i].key, model) == 0) m = &MODELS[i];
    if (m == NULL || st->ngpus >= MAX_GPUS) {
        fake_end(&s, 0);
        return -1;
    }
    int index = (int)st->ngpus++;
    gpu_state *g = &st->gpu[index];
    memset(g, 0, sizeof *g);
    snprintf(g->name, sizeof g->name, "%s", m->name);
    snprintf(g->uuid, sizeof g->uuid, "GPU-%08x-1c2d-4e5f-8a9b-%012x", 0x5eed0000u + (unsigned)index, 0xc0ffee + index);
    g->memory_mib = m->memory_mib;
    g->mig_capable = m->mig;
    g->mig_current = m->mig && mig_current;
    g->mig_pending = m->mig && mig_pending;
    g->minor = (unsigned)index;
    for (unsigned i = 0; m->mig && i < 7; i++) g->profiles[g->nprofiles++] = m->p[i];
    fake_end(&s, 1);
    return index;
}

/* Make a card's view of one profile differ from NVIDIA's (what a newer driver might report). */
int fake_nvml_set_profile(const char *path, unsigned gpu, unsigned cnst, unsigned starts, unsigned count) {
    fake_session s;
    if (control(&s, path) != 0) return -1;
    nvml_state *st = (nvml_state *)s.state;
    int rc = -1;
    for (unsigned i = 0; gpu < st->ngpus && i < st->gpu[gpu].nprofiles; i++) {
        gi_profile *p = &st->gpu[gpu].profiles[i];
        if (p->cnst != cnst) continue;
        p->starts = starts;
        p->count = count;
        rc = 0;
    }
    fake_end(&s, rc == 0);
    return rc;
}

/* Make card `gpu` answer `rc` (an nvmlReturn_t; 0: its placements again) when asked for the
 * placements of GI profile `cnst` (a profile the card lists but cannot place), and list them
 * highest start first when `descending` (nvml.h promises no order). */
int fake_nvml_set_placements(const char *path, unsigned gpu, unsigned cnst, int rc, unsigned descending) {
    fake_session s;
    if (control(&s, path) != 0) return -1;
    nvml_state *st = (nvml_state *)s.state;
    int found = -1;
    for (unsigned i = 0; gpu < st->ngpus && i < st->gpu[gpu].nprofiles; i++)
        if (st->gpu[gpu].profiles[i].cnst == cnst) {
            st->gpu[gpu].profiles[i].placements_rc = rc;
            st->gpu[gpu].profiles[i].descending = descending;
            found = 0;
        }
    fake_end(&s, found == 0);
    return found;
}

/* MIG mode switched under the services (nvidia-smi -mig 0 and a reset): with MIG off no GPU or
 * compute instance exists, so every one of the card's goes, with its capability files; the MIG
 * calls then answer NOT_SUPPORTED, as nvml.h documents for a device without MIG mode enabled. */
int fake_nvml_set_mig_mode(const char *path, unsigned gpu, unsigned current, unsigned pending) {
    fake_session s;
    if (control(&s, path) != 0) return -1;
    nvml_state *st = (nvml_state *)s.state;
    if (gpu >= st->ngpus || !st->gpu[gpu].mig_capable) {
        fake_end(&s, 0);
        return -1;
    }
    gpu_state *g = &st->gpu[gpu];
    for (unsigned i = 0; !current && i < MAX_GI; i++) {
        for (unsigned j = 0; g->gi[i].used && j < MAX_CI; j++)
            if (g->gi[i].ci[j].used) fk_publish_cap(st, g, i, (int)j, 0);
        if (g->gi[i].used) fk_publish_cap(st, g, i, -1, 0);
        memset(&g->gi[i], 0, sizeof g->gi[i]);
    }
    g->mig_current = current != 0;
    g->mig_pending = pending != 0;
    fake_end(&s, 1);
    return 0;
}

/* Make nvmlComputeInstanceGetInfo name the parent card, as nvml.h documents the field, instead
 * of the CI's MIG device, as NVIDIA's DRA driver reads it. */
int fake_nvml_set_ci_info_parent(const char *path, unsigned on) {
    fake_session s;
    if (control(&s, path) != 0) return -1;
    ((nvml_state *)s.state)->ci_info_parent = on != 0;
    fake_end(&s, 1);
    return 0;
}

/* Start or stop `processes` processes on the compute instance of MIG device `uuid`. */
int fake_nvml_set_processes(const char *path, const char *uuid, unsigned processes) {
    fake_session s;
    if (control(&s, path) != 0) return -1;
    nvml_state *st = (nvml_state *)s.state;
    char text[NVML_DEVICE_UUID_V2_BUFFER_SIZE];
    for (unsigned g = 0; g < st->ngpus; g++)
        for (unsigned i = 0; i < MAX_GI; i++)
            for (unsigned j = 0; j < MAX_CI; j++) {
                gi_state *gi = &st->gpu[g].gi[i];
                if (!gi->used || !gi->ci[j].used) continue;
                fk_mig_uuid(&st->gpu[g], i, j, gi->start, text, sizeof text);
                if (strcmp(text, uuid) != 0) continue;
                gi->ci[j].processes = processes;
                fake_end(&s, 1);
                return 0;
            }
    fake_end(&s, 0);
    return -1;
}
