/*
 * A fake libnvidia-ml.so.1, compiled against NVIDIA's own nvml.h, so that every prototype, struct
 * layout and return code is the header's. The real nvidia-ml-py loads it through its normal
 * lookup (dlopen("libnvidia-ml.so.1")) and cannot tell it from the driver's library.
 *
 * It models what partkeeper uses of MIG: cards with MIG mode current and pending, GPU-instance
 * profiles with NVIDIA's ids and legal placements (A100-40GB, H100-80GB, H200-141GB; a T4 without
 * MIG), GPU instances created at a placement with the lowest free id, compute instances inside
 * them, MIG devices by index (NOT_FOUND for an empty index), running processes per compute
 * instance, destroy refused with IN_USE while processes (for a CI) or CIs (for a GI) remain, and
 * the MIG capability files the kernel driver publishes under /proc/driver/nvidia/capabilities.
 *
 * State lives in the file FAKE_NVML_STATE (see ../common/fakestate.h): every process that loads
 * the library sees the same cards, and failures are injected through it. Without the file the
 * library answers as NVML does with no driver loaded. Pointers and versioned structs are checked
 * as a real GPU would need them to be: a struct passed by value where the header asks for a
 * pointer, or a versioned struct without its version, is rejected and recorded as a complaint.
 */
#define _DEFAULT_SOURCE
#include <nvml.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fakestate.h"

#define MAGIC 0x4e564d4cu /* "NVML" */
#define MAX_GPUS 8
#define MAX_PROFILES 8
#define MAX_GI 8 /* GI ids 1..7 */
#define MAX_CI 8
#define MAX_MIG 7
#define SLICES 8

typedef struct {
    unsigned cnst, id, slices, count, size, starts; /* starts: bit s set = start s legal */
    unsigned long long memory_mb;
    char name[32];
} gi_profile;

typedef struct {
    unsigned used, cnst, mig_index, processes;
} ci_state;

typedef struct {
    unsigned used, profile_id, start, size;
    ci_state ci[MAX_CI];
} gi_state;

typedef struct {
    char name[NVML_DEVICE_NAME_V2_BUFFER_SIZE], uuid[NVML_DEVICE_UUID_V2_BUFFER_SIZE];
    unsigned long long memory_mib;
    unsigned mig_capable, mig_current, mig_pending, minor, nprofiles;
    gi_profile profiles[MAX_PROFILES];
    gi_state gi[MAX_GI];
} gpu_state;

typedef struct {
    fake_header h;
    char proc_root[256];
    unsigned ngpus;
    gpu_state gpu[MAX_GPUS];
} nvml_state;

typedef struct {
    const char *key, *name;
    unsigned long long memory_mib;
    unsigned mig;
    gi_profile p[MAX_PROFILES];
} model_def;

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
     {{P1, 19, 1, 7, 1, 0x7f, m1, n1},       {P1ME, 20, 1, 1, 1, 0x7f, m1, n1 "+me"},        \
      {P1X2, 15, 1, 4, 2, 0x55, m2, n1x2},   {P2, 14, 2, 3, 2, 0x15, m2, n2},                \
      {P3, 9, 3, 2, 4, 0x11, m3, n3},        {P4, 5, 4, 1, 4, 0x01, m4, n4},                 \
      {P7, 0, 7, 1, 8, 0x01, m7, n7}}}

static const model_def MODELS[] = {
    MODEL("A100-40GB", "NVIDIA A100-SXM4-40GB", 40960, 4864, 9856, 19968, 19968, 40192,
          "1g.5gb", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"),
    MODEL("H100-80GB", "NVIDIA H100 80GB HBM3", 81559, 9984, 20096, 40320, 40320, 80896,
          "1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"),
    MODEL("H200-141GB", "NVIDIA H200", 143771, 17920, 33792, 69376, 69376, 140288, "1g.18gb",
          "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb"),
    {"T4", "Tesla T4", 15360, 0, {{0}}},
};

/* -- handles: pointers into tables of this process, checked by their magic ----------------- */

#define HANDLE_MAGIC 0x48444c45u
struct nvmlDevice_st { unsigned magic; int gpu, gi, ci; }; /* gi < 0: the whole card */
struct nvmlGpuInstance_st { unsigned magic; int gpu, gi; };
struct nvmlComputeInstance_st { unsigned magic; int gpu, gi, ci; };

static struct nvmlDevice_st devices[MAX_GPUS], migs[MAX_GPUS][MAX_GI][MAX_CI];
static struct nvmlGpuInstance_st gis[MAX_GPUS][MAX_GI];
static struct nvmlComputeInstance_st cis[MAX_GPUS][MAX_GI][MAX_CI];
static int initialised;

static nvmlDevice_t device_handle(int g) {
    devices[g] = (struct nvmlDevice_st){HANDLE_MAGIC, g, -1, -1};
    return &devices[g];
}
static nvmlDevice_t mig_handle(int g, int gi, int ci) {
    migs[g][gi][ci] = (struct nvmlDevice_st){HANDLE_MAGIC, g, gi, ci};
    return &migs[g][gi][ci];
}
static nvmlGpuInstance_t gi_handle(int g, int gi) {
    gis[g][gi] = (struct nvmlGpuInstance_st){HANDLE_MAGIC, g, gi};
    return &gis[g][gi];
}
static nvmlComputeInstance_t ci_handle(int g, int gi, int ci) {
    cis[g][gi][ci] = (struct nvmlComputeInstance_st){HANDLE_MAGIC, g, gi, ci};
    return &cis[g][gi][ci];
}

#define IN_TABLE(p, table) \
    ((const char *)(p) >= (const char *)(table) && (const char *)(p) < (const char *)(table) + sizeof(table))

/* -- one call: lock the state, count the call, answer an injected failure ------------------ */

typedef struct {
    fake_session s;
    nvml_state *st;
} call;

static nvmlReturn_t begin(call *c, const char *fn) {
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

static nvmlReturn_t end(call *c, nvmlReturn_t rc) {
    fake_end(&c->s, 1); /* written back every time: the call counters change */
    return rc;
}

static nvmlReturn_t reject(call *c, const char *fn, const char *what) {
    fake_complain(c->s.state, "%s: %s", fn, what);
    return end(c, NVML_ERROR_INVALID_ARGUMENT);
}

#define BEGIN(c)                                       \
    call c;                                            \
    do {                                               \
        nvmlReturn_t _rc = begin(&c, __func__);        \
        if (_rc != NVML_SUCCESS) return _rc;           \
    } while (0)
#define OUT(c, p) \
    do { if ((p) == NULL || !fake_readable((p), sizeof *(p))) return reject(&c, __func__, "output pointer " #p " is not a valid pointer"); } while (0)

static gpu_state *card(call *c, nvmlDevice_t d, int whole) {
    if (!IN_TABLE(d, devices) && !IN_TABLE(d, migs)) return NULL;
    if (d->magic != HANDLE_MAGIC || d->gpu < 0 || (unsigned)d->gpu >= c->st->ngpus) return NULL;
    if (whole && d->gi >= 0) return NULL;
    return &c->st->gpu[d->gpu];
}

static gi_state *gpu_instance(call *c, nvmlGpuInstance_t h) {
    if (!IN_TABLE(h, gis) || h->magic != HANDLE_MAGIC || (unsigned)h->gpu >= c->st->ngpus) return NULL;
    gi_state *gi = &c->st->gpu[h->gpu].gi[h->gi];
    return gi->used ? gi : NULL;
}

static ci_state *compute_instance(call *c, nvmlComputeInstance_t h) {
    if (!IN_TABLE(h, cis) || h->magic != HANDLE_MAGIC || (unsigned)h->gpu >= c->st->ngpus) return NULL;
    gi_state *gi = &c->st->gpu[h->gpu].gi[h->gi];
    return gi->used && gi->ci[h->ci].used ? &gi->ci[h->ci] : NULL;
}

static const gi_profile *profile_by(gpu_state *g, int by_const, unsigned value) {
    for (unsigned i = 0; i < g->nprofiles; i++)
        if ((by_const ? g->profiles[i].cnst : g->profiles[i].id) == value) return &g->profiles[i];
    return NULL;
}

static unsigned ci_slices(unsigned cnst) {
    static const unsigned slices[] = {1, 2, 3, 4, 7, 8, 6};
    return cnst < sizeof slices / sizeof slices[0] ? slices[cnst] : 0;
}

static void mig_uuid(const gpu_state *g, unsigned gi, unsigned ci, unsigned start, char *out, size_t n) {
    /* Name-based, as observed: a successor at the same GI id and start has the same UUID. */
    unsigned long long h = 1469598103934665603ull;
    for (const char *p = g->uuid; *p; p++) h = (h ^ (unsigned char)*p) * 1099511628211ull;
    h = ((h ^ gi) * 1099511628211ull ^ ci) * 1099511628211ull ^ start;
    h *= 1099511628211ull;
    snprintf(out, n, "MIG-%08x-%04x-%04x-%04x-%012llx", (unsigned)(h >> 32), (unsigned)(h >> 16) & 0xffff,
             (unsigned)h & 0xffff, (gi << 8 | ci) & 0xffff, (h * 31 + start) & 0xffffffffffffull);
}

/* -- the MIG capability files of /proc/driver/nvidia/capabilities -------------------------- */

static unsigned cap_minor(const gpu_state *g, unsigned gi, int ci) {
    return 1 + g->minor * 100 + gi * 10 + (unsigned)(ci + 1);
}

static void cap_path(const nvml_state *st, const gpu_state *g, unsigned gi, int ci, char *out, size_t n) {
    int k = snprintf(out, n, "%s/driver/nvidia/capabilities/gpu%u/mig/gi%u", st->proc_root, g->minor, gi);
    if (ci >= 0 && k > 0) snprintf(out + k, n - (size_t)k, "/ci%d", ci);
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

static void publish_cap(const nvml_state *st, const gpu_state *g, unsigned gi, int ci, int on) {
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
    return end(&c, NVML_SUCCESS);
}

nvmlReturn_t nvmlInit(void) { return nvmlInitWithFlags(0); }

nvmlReturn_t nvmlShutdown(void) {
    BEGIN(c);
    initialised--;
    return end(&c, NVML_SUCCESS);
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
    return end(&c, NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t *device) {
    BEGIN(c);
    OUT(c, device);
    if (index >= c.st->ngpus) return end(&c, NVML_ERROR_INVALID_ARGUMENT);
    *device = device_handle((int)index);
    return end(&c, NVML_SUCCESS);
}

static nvmlReturn_t copy_string(call *c, const char *fn, const char *text, char *out, unsigned len) {
    if (out == NULL || len == 0 || !fake_readable(out, len)) return reject(c, fn, "buffer is not a valid pointer");
    if (strlen(text) + 1 > len) return end(c, NVML_ERROR_INSUFFICIENT_SIZE);
    memcpy(out, text, strlen(text) + 1);
    return end(c, NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length) {
    BEGIN(c);
    gpu_state *g = card(&c, device, 0);
    if (g == NULL) return reject(&c, __func__, "not a device handle");
    return copy_string(&c, __func__, g->name, name, length);
}

nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length) {
    BEGIN(c);
    gpu_state *g = card(&c, device, 0);
    if (g == NULL) return reject(&c, __func__, "not a device handle");
    if (device->gi < 0) return copy_string(&c, __func__, g->uuid, uuid, length);
    gi_state *gi = &g->gi[device->gi];
    if (!gi->used || !gi->ci[device->ci].used) return end(&c, NVML_ERROR_INVALID_ARGUMENT);
    char text[NVML_DEVICE_UUID_V2_BUFFER_SIZE];
    mig_uuid(g, (unsigned)device->gi, (unsigned)device->ci, gi->start, text, sizeof text);
    return copy_string(&c, __func__, text, uuid, length);
}

nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory) {
    BEGIN(c);
    OUT(c, memory);
    gpu_state *g = card(&c, device, 1);
    if (g == NULL) return reject(&c, __func__, "not a device handle");
    memory->total = g->memory_mib << 20;
    memory->used = 0;
    memory->free = memory->total;
    return end(&c, NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t device, unsigned int *minorNumber) {
    BEGIN(c);
    OUT(c, minorNumber);
    gpu_state *g = card(&c, device, 1);
    if (g == NULL) return reject(&c, __func__, "not a device handle");
    *minorNumber = g->minor;
    return end(&c, NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t device, unsigned int *currentMode, unsigned int *pendingMode) {
    BEGIN(c);
    OUT(c, currentMode);
    OUT(c, pendingMode);
    gpu_state *g = card(&c, device, 1);
    if (g == NULL) return reject(&c, __func__, "not a device handle");
    if (!g->mig_capable) return end(&c, NVML_ERROR_NOT_SUPPORTED);
    *currentMode = g->mig_current;
    *pendingMode = g->mig_pending;
    return end(&c, NVML_SUCCESS);
}

/* -- GPU-instance profiles and placements -------------------------------------------------- */

static nvmlReturn_t mig_card(call *c, nvmlDevice_t device, gpu_state **out) {
    *out = card(c, device, 1);
    if (*out == NULL) return reject(c, "device", "not a device handle");
    if (!(*out)->mig_capable || !(*out)->mig_current) return end(c, NVML_ERROR_NOT_SUPPORTED);
    return NVML_SUCCESS;
}

static void fill_profile_v2(const gi_profile *p, nvmlGpuInstanceProfileInfo_v2_t *info) {
    unsigned version = info->version;
    memset(info, 0, sizeof *info);
    info->version = version;
    info->id = p->id;
    info->sliceCount = p->slices;
    info->instanceCount = p->count;
    info->multiprocessorCount = p->slices * 16;
    info->copyEngineCount = p->slices;
    info->memorySizeMB = p->memory_mb;
    snprintf(info->name, sizeof info->name, "MIG %s", p->name);
}

static nvmlReturn_t profile_for(call *c, nvmlDevice_t device, unsigned profile, const gi_profile **out) {
    gpu_state *g;
    nvmlReturn_t rc = mig_card(c, device, &g);
    if (rc != NVML_SUCCESS) return rc;
    if (profile >= NVML_GPU_INSTANCE_PROFILE_COUNT) return end(c, NVML_ERROR_INVALID_ARGUMENT);
    *out = profile_by(g, 1, profile);
    return *out ? NVML_SUCCESS : end(c, NVML_ERROR_NOT_SUPPORTED);
}

nvmlReturn_t nvmlDeviceGetGpuInstanceProfileInfo(nvmlDevice_t device, unsigned int profile,
                                                 nvmlGpuInstanceProfileInfo_t *info) {
    BEGIN(c);
    OUT(c, info);
    const gi_profile *p;
    nvmlReturn_t rc = profile_for(&c, device, profile, &p);
    if (rc != NVML_SUCCESS) return rc;
    memset(info, 0, sizeof *info);
    info->id = p->id;
    info->sliceCount = p->slices;
    info->instanceCount = p->count;
    info->memorySizeMB = p->memory_mb;
    return end(&c, NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetGpuInstanceProfileInfoV(nvmlDevice_t device, unsigned int profile,
                                                  nvmlGpuInstanceProfileInfo_v2_t *info) {
    BEGIN(c);
    OUT(c, info);
    if (info->version != nvmlGpuInstanceProfileInfo_v2 && info->version != nvmlGpuInstanceProfileInfo_v3) {
        fake_complain(c.s.state, "%s: info->version is 0x%x, not a nvmlGpuInstanceProfileInfo version",
                      __func__, info->version);
        return end(&c, NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
    }
    const gi_profile *p;
    nvmlReturn_t rc = profile_for(&c, device, profile, &p);
    if (rc != NVML_SUCCESS) return rc;
    if (info->version == nvmlGpuInstanceProfileInfo_v2) {
        fill_profile_v2(p, info);
    } else {
        nvmlGpuInstanceProfileInfo_v3_t *v3 = (nvmlGpuInstanceProfileInfo_v3_t *)info;
        memset(v3, 0, sizeof *v3);
        v3->version = nvmlGpuInstanceProfileInfo_v3;
        v3->id = p->id;
        v3->sliceCount = p->slices;
        v3->instanceCount = p->count;
        v3->memorySizeMB = p->memory_mb;
        snprintf(v3->name, sizeof v3->name, "MIG %s", p->name);
    }
    return end(&c, NVML_SUCCESS);
}

static const gi_profile *profile_of_id(call *c, nvmlDevice_t device, unsigned id, gpu_state **g, nvmlReturn_t *rc) {
    *rc = mig_card(c, device, g);
    if (*rc != NVML_SUCCESS) return NULL;
    const gi_profile *p = profile_by(*g, 0, id);
    if (p == NULL) *rc = end(c, NVML_ERROR_INVALID_ARGUMENT);
    return p;
}

nvmlReturn_t nvmlDeviceGetGpuInstancePossiblePlacements(nvmlDevice_t device, unsigned int profileId,
                                                        nvmlGpuInstancePlacement_t *placements,
                                                        unsigned int *count) {
    BEGIN(c);
    OUT(c, count);
    gpu_state *g;
    nvmlReturn_t rc;
    const gi_profile *p = profile_of_id(&c, device, profileId, &g, &rc);
    if (p == NULL) return rc;
    unsigned n = 0;
    for (unsigned s = 0; s < SLICES; s++) n += (p->starts >> s) & 1;
    if (placements == NULL) { /* the count query */
        *count = n;
        return end(&c, NVML_SUCCESS);
    }
    if (*count < n) {
        *count = n;
        return end(&c, NVML_ERROR_INSUFFICIENT_SIZE);
    }
    if (!fake_readable(placements, n * sizeof *placements))
        return reject(&c, __func__, "placements is not a valid pointer");
    unsigned k = 0;
    for (unsigned s = 0; s < SLICES; s++)
        if ((p->starts >> s) & 1) placements[k++] = (nvmlGpuInstancePlacement_t){s, p->size};
    *count = n;
    return end(&c, NVML_SUCCESS);
}

/* -- GPU instances ------------------------------------------------------------------------- */

static int overlaps(unsigned a, unsigned an, unsigned b, unsigned bn) { return a < b + bn && b < a + an; }

static unsigned count_of_profile(const gpu_state *g, unsigned id) {
    unsigned n = 0;
    for (unsigned i = 1; i < MAX_GI; i++) n += g->gi[i].used && g->gi[i].profile_id == id;
    return n;
}

nvmlReturn_t nvmlDeviceCreateGpuInstanceWithPlacement(nvmlDevice_t device, unsigned int profileId,
                                                      const nvmlGpuInstancePlacement_t *placement,
                                                      nvmlGpuInstance_t *gpuInstance) {
    BEGIN(c);
    OUT(c, gpuInstance);
    if (placement == NULL || ((uintptr_t)placement & 3) || !fake_readable(placement, sizeof *placement)) {
        char what[160];
        snprintf(what, sizeof what, "placement %p is not a pointer to a nvmlGpuInstancePlacement_t "
                 "(a struct passed by value?)", (const void *)placement);
        return reject(&c, __func__, what);
    }
    gpu_state *g;
    nvmlReturn_t rc;
    const gi_profile *p = profile_of_id(&c, device, profileId, &g, &rc);
    if (p == NULL) return rc;
    unsigned start = placement->start, size = placement->size;
    if (start >= SLICES || size != p->size || !((p->starts >> start) & 1))
        return end(&c, NVML_ERROR_INVALID_ARGUMENT);
    unsigned free_id = 0;
    for (unsigned i = MAX_GI - 1; i >= 1; i--) {
        gi_state *o = &g->gi[i];
        if (o->used && overlaps(start, size, o->start, o->size)) return end(&c, NVML_ERROR_INSUFFICIENT_RESOURCES);
        if (!o->used) free_id = i;
    }
    if (free_id == 0 || count_of_profile(g, p->id) >= p->count)
        return end(&c, NVML_ERROR_INSUFFICIENT_RESOURCES);
    g->gi[free_id] = (gi_state){1, p->id, start, size, {{0}}};
    publish_cap(c.st, g, free_id, -1, 1);
    *gpuInstance = gi_handle(device->gpu, (int)free_id);
    return end(&c, NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetGpuInstances(nvmlDevice_t device, unsigned int profileId,
                                       nvmlGpuInstance_t *gpuInstances, unsigned int *count) {
    BEGIN(c);
    OUT(c, count);
    gpu_state *g;
    nvmlReturn_t rc;
    const gi_profile *p = profile_of_id(&c, device, profileId, &g, &rc);
    if (p == NULL) return rc;
    if (gpuInstances == NULL || !fake_readable(gpuInstances, p->count * sizeof *gpuInstances))
        return reject(&c, __func__, "gpuInstances must hold the profile's instanceCount handles");
    unsigned n = 0;
    for (unsigned i = 1; i < MAX_GI; i++)
        if (g->gi[i].used && g->gi[i].profile_id == profileId) gpuInstances[n++] = gi_handle(device->gpu, (int)i);
    *count = n;
    return end(&c, NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetGpuInstanceById(nvmlDevice_t device, unsigned int id, nvmlGpuInstance_t *gpuInstance) {
    BEGIN(c);
    OUT(c, gpuInstance);
    gpu_state *g;
    nvmlReturn_t rc = mig_card(&c, device, &g);
    if (rc != NVML_SUCCESS) return rc;
    if (id >= MAX_GI || !g->gi[id].used) return end(&c, NVML_ERROR_NOT_FOUND);
    *gpuInstance = gi_handle(device->gpu, (int)id);
    return end(&c, NVML_SUCCESS);
}

nvmlReturn_t nvmlGpuInstanceGetInfo(nvmlGpuInstance_t gpuInstance, nvmlGpuInstanceInfo_t *info) {
    BEGIN(c);
    OUT(c, info);
    gi_state *gi = gpu_instance(&c, gpuInstance);
    if (gi == NULL) return reject(&c, __func__, "not a live GPU instance handle");
    info->device = device_handle(gpuInstance->gpu);
    info->id = (unsigned)gpuInstance->gi;
    info->profileId = gi->profile_id;
    info->placement = (nvmlGpuInstancePlacement_t){gi->start, gi->size};
    return end(&c, NVML_SUCCESS);
}

nvmlReturn_t nvmlGpuInstanceDestroy(nvmlGpuInstance_t gpuInstance) {
    BEGIN(c);
    gi_state *gi = gpu_instance(&c, gpuInstance);
    if (gi == NULL) return reject(&c, __func__, "not a live GPU instance handle");
    for (unsigned i = 0; i < MAX_CI; i++)
        if (gi->ci[i].used) return end(&c, NVML_ERROR_IN_USE); /* compute instances remain */
    gpu_state *g = &c.st->gpu[gpuInstance->gpu];
    publish_cap(c.st, g, (unsigned)gpuInstance->gi, -1, 0);
    memset(gi, 0, sizeof *gi);
    return end(&c, NVML_SUCCESS);
}

/* -- compute instances --------------------------------------------------------------------- */

nvmlReturn_t nvmlGpuInstanceGetComputeInstanceProfileInfo(nvmlGpuInstance_t gpuInstance, unsigned int profile,
                                                          unsigned int engProfile,
                                                          nvmlComputeInstanceProfileInfo_t *info) {
    BEGIN(c);
    (void)profile;
    (void)engProfile;
    (void)info;
    (void)gpuInstance;
    return reject(&c, __func__, "partkeeper's NVML only answers the versioned call");
}

nvmlReturn_t nvmlGpuInstanceGetComputeInstanceProfileInfoV(nvmlGpuInstance_t gpuInstance, unsigned int profile,
                                                           unsigned int engProfile,
                                                           nvmlComputeInstanceProfileInfo_v2_t *info) {
    BEGIN(c);
    OUT(c, info);
    if (info->version != nvmlComputeInstanceProfileInfo_v2) {
        fake_complain(c.s.state, "%s: info->version is 0x%x, not nvmlComputeInstanceProfileInfo_v2",
                      __func__, info->version);
        return end(&c, NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
    }
    gi_state *gi = gpu_instance(&c, gpuInstance);
    if (gi == NULL) return reject(&c, __func__, "not a live GPU instance handle");
    const gi_profile *p = profile_by(&c.st->gpu[gpuInstance->gpu], 0, gi->profile_id);
    unsigned slices = ci_slices(profile);
    if (profile >= NVML_COMPUTE_INSTANCE_PROFILE_COUNT || engProfile != NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
        return end(&c, NVML_ERROR_INVALID_ARGUMENT);
    if (slices == 0 || p == NULL || slices > p->slices) return end(&c, NVML_ERROR_NOT_SUPPORTED);
    memset((char *)info + sizeof info->version, 0, sizeof *info - sizeof info->version);
    info->id = profile;
    info->sliceCount = slices;
    info->instanceCount = p->slices / slices;
    info->multiprocessorCount = slices * 16;
    snprintf(info->name, sizeof info->name, "%uc.%s", slices, p->name);
    return end(&c, NVML_SUCCESS);
}

static unsigned free_mig_index(const gpu_state *g) {
    for (unsigned index = 0; index < MAX_MIG; index++) {
        int taken = 0;
        for (unsigned i = 1; i < MAX_GI; i++)
            for (unsigned j = 0; j < MAX_CI; j++)
                taken |= g->gi[i].used && g->gi[i].ci[j].used && g->gi[i].ci[j].mig_index == index;
        if (!taken) return index;
    }
    return MAX_MIG;
}

nvmlReturn_t nvmlGpuInstanceCreateComputeInstance(nvmlGpuInstance_t gpuInstance, unsigned int profileId,
                                                  nvmlComputeInstance_t *computeInstance) {
    BEGIN(c);
    OUT(c, computeInstance);
    gi_state *gi = gpu_instance(&c, gpuInstance);
    if (gi == NULL) return reject(&c, __func__, "not a live GPU instance handle");
    gpu_state *g = &c.st->gpu[gpuInstance->gpu];
    const gi_profile *p = profile_by(g, 0, gi->profile_id);
    unsigned slices = ci_slices(profileId), used = 0, id = MAX_CI;
    if (slices == 0 || p == NULL || slices > p->slices) return end(&c, NVML_ERROR_INVALID_ARGUMENT);
    for (unsigned i = MAX_CI; i-- > 0;) {
        if (gi->ci[i].used) used += ci_slices(gi->ci[i].cnst);
        else id = i;
    }
    unsigned index = free_mig_index(g);
    if (used + slices > p->slices || id == MAX_CI || index == MAX_MIG)
        return end(&c, NVML_ERROR_INSUFFICIENT_RESOURCES);
    gi->ci[id] = (ci_state){1, profileId, index, 0};
    publish_cap(c.st, g, (unsigned)gpuInstance->gi, (int)id, 1);
    *computeInstance = ci_handle(gpuInstance->gpu, gpuInstance->gi, (int)id);
    return end(&c, NVML_SUCCESS);
}

nvmlReturn_t nvmlGpuInstanceGetComputeInstances(nvmlGpuInstance_t gpuInstance, unsigned int profileId,
                                                nvmlComputeInstance_t *computeInstances, unsigned int *count) {
    BEGIN(c);
    OUT(c, count);
    gi_state *gi = gpu_instance(&c, gpuInstance);
    if (gi == NULL) return reject(&c, __func__, "not a live GPU instance handle");
    if (computeInstances == NULL || !fake_readable(computeInstances, sizeof *computeInstances))
        return reject(&c, __func__, "computeInstances is not a valid pointer");
    unsigned n = 0;
    for (unsigned i = 0; i < MAX_CI; i++)
        if (gi->ci[i].used && gi->ci[i].cnst == profileId)
            computeInstances[n++] = ci_handle(gpuInstance->gpu, gpuInstance->gi, (int)i);
    *count = n;
    return end(&c, NVML_SUCCESS);
}

nvmlReturn_t nvmlGpuInstanceGetComputeInstanceById(nvmlGpuInstance_t gpuInstance, unsigned int id,
                                                   nvmlComputeInstance_t *computeInstance) {
    BEGIN(c);
    OUT(c, computeInstance);
    gi_state *gi = gpu_instance(&c, gpuInstance);
    if (gi == NULL) return reject(&c, __func__, "not a live GPU instance handle");
    if (id >= MAX_CI || !gi->ci[id].used) return end(&c, NVML_ERROR_NOT_FOUND);
    *computeInstance = ci_handle(gpuInstance->gpu, gpuInstance->gi, (int)id);
    return end(&c, NVML_SUCCESS);
}

nvmlReturn_t nvmlComputeInstanceGetInfo(nvmlComputeInstance_t computeInstance, nvmlComputeInstanceInfo_t *info) {
    BEGIN(c);
    OUT(c, info);
    ci_state *ci = compute_instance(&c, computeInstance);
    if (ci == NULL) return reject(&c, __func__, "not a live compute instance handle");
    info->device = device_handle(computeInstance->gpu);
    info->gpuInstance = gi_handle(computeInstance->gpu, computeInstance->gi);
    info->id = (unsigned)computeInstance->ci;
    info->profileId = ci->cnst;
    info->placement = (nvmlComputeInstancePlacement_t){0, ci_slices(ci->cnst)};
    return end(&c, NVML_SUCCESS);
}

nvmlReturn_t nvmlComputeInstanceDestroy(nvmlComputeInstance_t computeInstance) {
    BEGIN(c);
    ci_state *ci = compute_instance(&c, computeInstance);
    if (ci == NULL) return reject(&c, __func__, "not a live compute instance handle");
    if (ci->processes > 0) return end(&c, NVML_ERROR_IN_USE);
    gpu_state *g = &c.st->gpu[computeInstance->gpu];
    publish_cap(c.st, g, (unsigned)computeInstance->gi, computeInstance->ci, 0);
    memset(ci, 0, sizeof *ci);
    return end(&c, NVML_SUCCESS);
}

/* -- MIG devices --------------------------------------------------------------------------- */

nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t device, unsigned int *count) {
    BEGIN(c);
    OUT(c, count);
    gpu_state *g = card(&c, device, 1);
    if (g == NULL) return reject(&c, __func__, "not a device handle");
    *count = g->mig_capable && g->mig_current ? MAX_MIG : 0;
    return end(&c, NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t device, unsigned int index, nvmlDevice_t *migDevice) {
    BEGIN(c);
    OUT(c, migDevice);
    gpu_state *g;
    nvmlReturn_t rc = mig_card(&c, device, &g);
    if (rc != NVML_SUCCESS) return rc;
    if (index >= MAX_MIG) return end(&c, NVML_ERROR_INVALID_ARGUMENT);
    for (unsigned i = 1; i < MAX_GI; i++)
        for (unsigned j = 0; j < MAX_CI; j++)
            if (g->gi[i].used && g->gi[i].ci[j].used && g->gi[i].ci[j].mig_index == index) {
                *migDevice = mig_handle(device->gpu, (int)i, (int)j);
                return end(&c, NVML_SUCCESS);
            }
    return end(&c, NVML_ERROR_NOT_FOUND);
}

static nvmlReturn_t mig_ids(call *c, nvmlDevice_t device, unsigned int *id, int want_gi) {
    gpu_state *g = card(c, device, 0);
    if (g == NULL) return reject(c, "mig", "not a device handle");
    if (device->gi < 0) return end(c, NVML_ERROR_NOT_SUPPORTED); /* not a MIG device */
    if (!g->gi[device->gi].used || !g->gi[device->gi].ci[device->ci].used)
        return end(c, NVML_ERROR_INVALID_ARGUMENT);
    *id = (unsigned)(want_gi ? device->gi : device->ci);
    return end(c, NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetGpuInstanceId(nvmlDevice_t device, unsigned int *id) {
    BEGIN(c);
    OUT(c, id);
    return mig_ids(&c, device, id, 1);
}

nvmlReturn_t nvmlDeviceGetComputeInstanceId(nvmlDevice_t device, unsigned int *id) {
    BEGIN(c);
    OUT(c, id);
    return mig_ids(&c, device, id, 0);
}

nvmlReturn_t nvmlDeviceGetComputeRunningProcesses(nvmlDevice_t device, unsigned int *infoCount,
                                                  nvmlProcessInfo_t *infos) {
    BEGIN(c);
    OUT(c, infoCount);
    gpu_state *g = card(&c, device, 0);
    if (g == NULL) return reject(&c, __func__, "not a device handle");
    unsigned n = 0;
    nvmlProcessInfo_t found[64];
    for (unsigned i = 1; i < MAX_GI; i++)
        for (unsigned j = 0; j < MAX_CI; j++) {
            const ci_state *ci = &g->gi[i].ci[j];
            int mine = device->gi < 0 || ((unsigned)device->gi == i && (unsigned)device->ci == j);
            for (unsigned k = 0; g->gi[i].used && ci->used && mine && k < ci->processes && n < 64; k++)
                found[n++] = (nvmlProcessInfo_t){4000 + i * 100 + j * 10 + k, 1ull << 30, i, j};
        }
    if (n == 0) {
        *infoCount = 0;
        return end(&c, NVML_SUCCESS);
    }
    if (infos == NULL || *infoCount < n) {
        *infoCount = n;
        return end(&c, NVML_ERROR_INSUFFICIENT_SIZE);
    }
    if (!fake_readable(infos, n * sizeof *infos)) return reject(&c, __func__, "infos is not a valid pointer");
    memcpy(infos, found, n * sizeof *infos);
    *infoCount = n;
    return end(&c, NVML_SUCCESS);
}

/* -- control entry points for tests (see tests/fakes/nvml/fake.py) ------------------------- */

int fake_nvml_new(const char *path, const char *proc_root) {
    nvml_state *st = calloc(1, sizeof *st);
    if (st == NULL) return -1;
    snprintf(st->proc_root, sizeof st->proc_root, "%s", proc_root ? proc_root : "");
    int rc = fake_create(path, sizeof *st, MAGIC, st);
    free(st);
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

/* Start or stop `processes` processes on the compute instance of MIG device `uuid`. */
int fake_nvml_set_processes(const char *path, const char *uuid, unsigned processes) {
    fake_session s;
    if (control(&s, path) != 0) return -1;
    nvml_state *st = (nvml_state *)s.state;
    char text[NVML_DEVICE_UUID_V2_BUFFER_SIZE];
    for (unsigned g = 0; g < st->ngpus; g++)
        for (unsigned i = 1; i < MAX_GI; i++)
            for (unsigned j = 0; j < MAX_CI; j++) {
                gi_state *gi = &st->gpu[g].gi[i];
                if (!gi->used || !gi->ci[j].used) continue;
                mig_uuid(&st->gpu[g], i, j, gi->start, text, sizeof text);
                if (strcmp(text, uuid) != 0) continue;
                gi->ci[j].processes = processes;
                fake_end(&s, 1);
                return 0;
            }
    fake_end(&s, 0);
    return -1;
}
