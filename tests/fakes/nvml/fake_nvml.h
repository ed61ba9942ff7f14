/*
 * Internal to the fake NVML (fake_nvml.c, fake_nvml_mig.c): the state file's layout, the handles
 * handed to callers, and the per-call helpers. See fake_nvml.c for what the fake models.
 */
#ifndef FAKE_NVML_H
#define FAKE_NVML_H

#include <nvml.h>
#include <stddef.h>

#include "fakestate.h"

#define MAGIC 0x4e564d4cu /* "NVML" */
#define MAX_GPUS 8
#define MAX_PROFILES 8
#define MAX_GI 15 /* GI ids 0..14: the slot tree of an 8-slot card (fk_gi_id) */
#define MAX_CI 8
#define MAX_MIG 7
#define SLICES 8
/* The dynamic majors the fake's /proc/devices gives (fake_nvml.c, write_proc_devices). */
#define FAKE_CAPS_MAJOR 235
#define FAKE_IMEX_MAJOR 234
#define FAKE_UVM_MAJOR 236

typedef struct {
    unsigned cnst, id, slices, count, size, starts; /* starts: bit s set = start s legal */
    unsigned long long memory_mb;
    char name[32];
    int placements_rc; /* nonzero: what nvmlDeviceGetGpuInstancePossiblePlacements answers */
    unsigned descending; /* nonzero: the placements listed highest start first */
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
    unsigned lost; /* nonzero: fallen off the bus, every call on it answers GPU_IS_LOST */
} gpu_state;

/* Events raised by the tests (fake_nvml_raise), kept in a ring that every process's event sets
 * read from their own cursor: a set sees only what was raised after it was created, as NVML's. */
#define MAX_EVENTS 64
typedef struct {
    unsigned long long seq, type, data;
    unsigned gpu, gi, ci;
} fake_event;

typedef struct {
    fake_header h;
    char proc_root[256];
    unsigned ci_info_parent; /* nonzero: nvmlComputeInstanceGetInfo names the parent card */
    unsigned ngpus;
    gpu_state gpu[MAX_GPUS];
    unsigned long long event_seq; /* the last event raised; events[seq % MAX_EVENTS] */
    fake_event events[MAX_EVENTS];
} nvml_state;

typedef struct {
    const char *key, *name;
    unsigned long long memory_mib;
    unsigned mig;
    gi_profile p[MAX_PROFILES];
} model_def;

/* Handles are pointers into tables of the calling process, checked by their magic. */
#define HANDLE_MAGIC 0x48444c45u
struct nvmlDevice_st { unsigned magic; int gpu, gi, ci; }; /* gi < 0: the whole card */
struct nvmlGpuInstance_st { unsigned magic; int gpu, gi; };
struct nvmlComputeInstance_st { unsigned magic; int gpu, gi, ci; };

/* One call: the state locked and read, the call counted, an injected failure answered. */
typedef struct {
    fake_session s;
    nvml_state *st;
} call;

#define BEGIN(c)                                       \
    call c;                                            \
    do {                                               \
        nvmlReturn_t _rc = fk_begin(&c, __func__);        \
        if (_rc != NVML_SUCCESS) return _rc;           \
    } while (0)
#define OUT(c, p) \
    do { if ((p) == NULL || !fake_readable((p), sizeof *(p))) return fk_reject(&c, __func__, "output pointer " #p " is not a valid pointer"); } while (0)
/* The handle argument resolved to its state, or the call refused as NVML refuses a bad handle. */
#define WHOLE_CARD(c, g, device)                    \
    gpu_state *g = fk_card(&c, device, 1);          \
    if (g == NULL) return fk_reject(&c, __func__, "not a device handle"); \
    if (g->lost) return fk_end(&c, NVML_ERROR_GPU_IS_LOST)
#define ANY_DEVICE(c, g, device)                    \
    gpu_state *g = fk_card(&c, device, 0);          \
    if (g == NULL) return fk_reject(&c, __func__, "not a device handle"); \
    if (g->lost) return fk_end(&c, NVML_ERROR_GPU_IS_LOST)
#define LIVE_GI(c, gi, handle)                      \
    gi_state *gi = fk_gpu_instance(&c, handle);     \
    if (gi == NULL) return fk_reject(&c, __func__, "not a live GPU instance handle"); \
    if (c.st->gpu[(handle)->gpu].lost) return fk_end(&c, NVML_ERROR_GPU_IS_LOST)
#define LIVE_CI(c, ci, handle)                      \
    ci_state *ci = fk_compute_instance(&c, handle); \
    if (ci == NULL) return fk_reject(&c, __func__, "not a live compute instance handle"); \
    if (c.st->gpu[(handle)->gpu].lost) return fk_end(&c, NVML_ERROR_GPU_IS_LOST)

/* Shared by the two halves, never exported: the library's symbols are NVML's and the controls. */
#pragma GCC visibility push(hidden)
nvmlReturn_t fk_begin(call *c, const char *fn);
nvmlReturn_t fk_end(call *c, nvmlReturn_t rc); /* writes the state back and unlocks */
nvmlReturn_t fk_reject(call *c, const char *fn, const char *what); /* INVALID_ARGUMENT + complaint */
nvmlDevice_t fk_device_handle(int g);
nvmlDevice_t fk_mig_handle(int g, int gi, int ci);
nvmlGpuInstance_t fk_gi_handle(int g, int gi);
nvmlComputeInstance_t fk_ci_handle(int g, int gi, int ci);
gpu_state *fk_card(call *c, nvmlDevice_t d, int whole); /* NULL: not a (whole-card) handle */
gi_state *fk_gpu_instance(call *c, nvmlGpuInstance_t h); /* NULL: not a live GI */
ci_state *fk_compute_instance(call *c, nvmlComputeInstance_t h); /* NULL: not a live CI */
const gi_profile *fk_profile_by(gpu_state *g, int by_const, unsigned value);
unsigned fk_ci_slices(unsigned cnst);
void fk_mig_uuid(const gpu_state *g, unsigned gi, unsigned ci, unsigned start, char *out, size_t n);
unsigned fk_gi_id(unsigned start, unsigned size);
void fk_publish_cap(const nvml_state *st, const gpu_state *g, unsigned gi, int ci, int on);
#pragma GCC visibility pop

#endif
