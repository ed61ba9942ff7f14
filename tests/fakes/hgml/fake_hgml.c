/* A fake libhgml.so: T-Head PPU partitions as HGML describes them, on the shared fake hardware
 * (../common/fakeparts.h, state file in FAKE_HGML_STATE). With a host root in the state it keeps
 * the driver's procfs capability records under that root and creates the capability device nodes
 * (when permitted), as the PPU driver does.
 *
 * What it holds the caller to, as the library does: versioned profile structs (v2 0x02000098,
 * v3 0x03000098, anything else INVALID_ARGUMENT and a complaint); profiles probed by index, the index not
 * being the id; placements as a count query with NULL first; a GPU instance refusing destroy while a
 * compute instance lives in it; a busy compute instance refusing destroy (IN_USE). Quirk
 * `v3_as_v2 1` models a library that fills a v3 buffer with the v2 layout. */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include "fakeparts.h"
#include "hgml_subset.h"

#define ENV "FAKE_HGML_STATE"
#define DRIVER_NOT_LOADED 9 /* NVML's code for "no driver": what the library answers without one */
#define PROBE_SPACE 85
#define CAP_MAJOR 511
#define MAX_MIG_DEVICES 8

static int initialised;

#define BEGIN(fn)                                                            \
    fake_session s_;                                                         \
    fh_state *st;                                                            \
    {                                                                        \
        int injected_ = fh_begin(&s_, ENV, fn);                              \
        if (injected_ < 0) return (hgmlReturn_t)DRIVER_NOT_LOADED;             \
        if (injected_ > 0) return (hgmlReturn_t)injected_;                     \
        st = fh_state_of(&s_);                                              \
        (void)st;                                                            \
        if (!initialised && strncmp(fn, "hgmlInit", 8) != 0) {               \
            fh_end(&s_);                                                     \
            return HGML_ERROR_UNINITIALIZED;                                 \
        }                                                                    \
    }
#define DONE(code, dirty) \
    do {                  \
        (void)(dirty);    \
        fh_end(&s_);      \
        return code;      \
    } while (0)

static fh_card *device(fh_state *st, hgmlDevice_t dev) {
    unsigned card;
    if (fh_unhandle(dev.handle, FH_DEVICE, &card, NULL, NULL) != 0) return NULL;
    return fh_card_at(st, card);
}

static fh_gi *gpu_instance(fh_state *st, hgmlGpuInstance_t gi) {
    unsigned card, id;
    if (fh_unhandle(gi.handle, FH_GPU_INSTANCE, &card, &id, NULL) != 0) return NULL;
    return fh_gi_find(st, card, id);
}

static fh_ci *compute_instance(fh_state *st, hgmlComputeInstance_t ci) {
    unsigned card, gi, id;
    if (fh_unhandle(ci.handle, FH_COMPUTE_INSTANCE, &card, &gi, &id) != 0) return NULL;
    return fh_ci_find(st, card, gi, id);
}

static fh_ci *mig_device(fh_state *st, hgmlDevice_t dev) {
    unsigned card, gi, id;
    if (fh_unhandle(dev.handle, FH_MIG, &card, &gi, &id) != 0) return NULL;
    return fh_ci_find(st, card, gi, id);
}

/* -- the driver's procfs capability records ------------------------------------------------- */

static unsigned gi_minor(const fh_state *st, unsigned card, unsigned gi) {
    return (unsigned)fh_quirk_value(st, "cap_base", 229632) + card * 4096 + gi * 64;
}

static void cap_path(const char *root, char *out, size_t size, unsigned card, unsigned gi,
                     int ci) {
    if (ci < 0)
        snprintf(out, size, "%s/proc/driver/alixpu/capabilities/ppu%u/mig/gi%u/access", root,
                 card, gi);
    else
        snprintf(out, size, "%s/proc/driver/alixpu/capabilities/ppu%u/mig/gi%u/ci%d/access",
                 root, card, gi, ci);
}

static void publish_cap(const char *root, unsigned card, unsigned gi, int ci, unsigned minor) {
    char path[512];
    if (*root == 0) return;
    cap_path(root, path, sizeof(path), card, gi, ci);
    if (fh_mkdirs(path) != 0) return;
    FILE *out = fopen(path, "w");
    if (out == NULL) return;
    fprintf(out, "DeviceFileMinor: %u\nDeviceFileMode: 292\nDeviceFileModify: 1\n", minor);
    fclose(out);
    /* The driver creates the node with the instance and never removes it. */
    snprintf(path, sizeof(path), "%s/dev/alixpu-caps/alixpu-cap%u", root, minor);
    if (fh_mkdirs(path) == 0) (void)mknod(path, S_IFCHR | 0444, makedev(CAP_MAJOR, minor));
}

static void withdraw_cap(const char *root, unsigned card, unsigned gi, int ci) {
    char path[512];
    if (*root == 0) return;
    cap_path(root, path, sizeof(path), card, gi, ci);
    unlink(path);
    *strrchr(path, '/') = 0;
    rmdir(path);
}

/* -- library and devices --------------------------------------------------------------------- */

#ifdef FAKE_HGML_OLD_INIT
/* An older library: only the unversioned entry point. */
hgmlReturn_t hgmlInit(void);
hgmlReturn_t hgmlInit(void) {
    BEGIN("hgmlInit");
    initialised = 1;
    DONE(HGML_SUCCESS, 0);
}
#else
hgmlReturn_t hgmlInit_v2(void) {
    BEGIN("hgmlInit_v2");
    initialised = 1;
    DONE(HGML_SUCCESS, 0);
}
#endif

hgmlReturn_t hgmlShutdown(void) {
    BEGIN("hgmlShutdown");
    initialised = 0;
    DONE(HGML_SUCCESS, 0);
}

hgmlReturn_t hgmlDeviceGetCount_v2(unsigned int *count) {
    BEGIN("hgmlDeviceGetCount_v2");
    if (count == NULL) DONE(HGML_ERROR_INVALID_ARGUMENT, 0);
    *count = st->ncards;
    DONE(HGML_SUCCESS, 0);
}

hgmlReturn_t hgmlDeviceGetHandleByIndex_v2(unsigned int index, hgmlDevice_t *out) {
    BEGIN("hgmlDeviceGetHandleByIndex_v2");
    if (out == NULL || fh_card_at(st, index) == NULL) DONE(HGML_ERROR_INVALID_ARGUMENT, 0);
    out->handle = fh_handle(FH_DEVICE, index, 0, 0);
    DONE(HGML_SUCCESS, 0);
}

static hgmlReturn_t text(char *dst, unsigned int length, const char *src) {
    if (dst == NULL) return HGML_ERROR_INVALID_ARGUMENT;
    if (strlen(src) + 1 > length) return HGML_ERROR_INSUFFICIENT_SIZE;
    memcpy(dst, src, strlen(src) + 1);
    return HGML_SUCCESS;
}

hgmlReturn_t hgmlDeviceGetName(hgmlDevice_t dev, char *name, unsigned int length) {
    BEGIN("hgmlDeviceGetName");
    fh_card *card = device(st, dev);
    if (card == NULL) DONE(HGML_ERROR_INVALID_ARGUMENT, 0);
    DONE(text(name, length, card->name), 0);
}

hgmlReturn_t hgmlDeviceGetUUID(hgmlDevice_t dev, char *uuid, unsigned int length) {
    BEGIN("hgmlDeviceGetUUID");
    fh_card *card = device(st, dev);
    if (card != NULL) DONE(text(uuid, length, card->uuid), 0);
    fh_ci *mig = mig_device(st, dev);
    if (mig == NULL) DONE(HGML_ERROR_INVALID_ARGUMENT, 0);
    DONE(text(uuid, length, mig->uuid), 0);
}

hgmlReturn_t hgmlDeviceGetMinorNumber(hgmlDevice_t dev, unsigned int *minor) {
    BEGIN("hgmlDeviceGetMinorNumber");
    fh_card *card = device(st, dev);
    if (card == NULL || minor == NULL) DONE(HGML_ERROR_INVALID_ARGUMENT, 0);
    *minor = card->minor;
    DONE(HGML_SUCCESS, 0);
}

hgmlReturn_t hgmlDeviceGetMemoryInfo(hgmlDevice_t dev, hgmlMemory_t *memory) {
    BEGIN("hgmlDeviceGetMemoryInfo");
    fh_card *card = device(st, dev);
    if (card == NULL || memory == NULL) DONE(HGML_ERROR_INVALID_ARGUMENT, 0);
    memory->total = card->memory_mib * 1024ULL * 1024ULL;
    memory->used = 0;
    memory->free = memory->total;
    DONE(HGML_SUCCESS, 0);
}

hgmlReturn_t hgmlDeviceGetMigMode(hgmlDevice_t dev, unsigned int *current, unsigned int *pending) {
    BEGIN("hgmlDeviceGetMigMode");
    fh_card *card = device(st, dev);
    if (card == NULL || current == NULL || pending == NULL) DONE(HGML_ERROR_INVALID_ARGUMENT, 0);
    *current = card->mig_current;
    *pending = card->mig_pending;
    DONE(HGML_SUCCESS, 0);
}

/* -- GPU-instance profiles and placements ---------------------------------------------------- */

static void fill_v2(hgmlGpuInstanceProfileInfo_v2_t *info, const fh_profile *p) {
    unsigned int version = info->version;
    memset(info, 0, sizeof(*info));
    info->version = version;
    info->id = p->id;
    info->isP2pSupported = p->caps & HGML_GPU_INSTANCE_PROFILE_CAPS_P2P;
    info->sliceCount = p->slices;
    info->instanceCount = p->count;
    info->multiprocessorCount = p->slices * 16;
    info->memorySizeMB = p->memory_mb;
    snprintf(info->name, sizeof(info->name), "%s", p->name);
}

static void fill_v3(hgmlGpuInstanceProfileInfo_v3_t *info, const fh_profile *p) {
    unsigned int version = info->version;
    memset(info, 0, sizeof(*info));
    info->version = version;
    info->id = p->id;
    info->sliceCount = p->slices;
    info->instanceCount = p->count;
    info->multiprocessorCount = p->slices * 16;
    info->memorySizeMB = p->memory_mb;
    snprintf(info->name, sizeof(info->name), "%s", p->name);
    info->capabilities = p->caps;
}

hgmlReturn_t hgmlDeviceGetGpuInstanceProfileInfoV(hgmlDevice_t dev, unsigned int profile,
                                                  hgmlGpuInstanceProfileInfo_v2_t *info) {
    BEGIN("hgmlDeviceGetGpuInstanceProfileInfoV");
    fh_card *card = device(st, dev);
    if (card == NULL || info == NULL || profile >= PROBE_SPACE)
        DONE(HGML_ERROR_INVALID_ARGUMENT, 0);
    int v2 = info->version == hgmlGpuInstanceProfileInfo_v2;
    int v3 = info->version == hgmlGpuInstanceProfileInfo_v3;
    if (!v2 && !v3) {
        /* The library rejects it; a caller that forgets the version word reads no profiles. */
        fake_complain(s_.state, "hgmlDeviceGetGpuInstanceProfileInfoV: version 0x%08x is "
                      "neither v2 (0x%08x) nor v3 (0x%08x)", info->version,
                      hgmlGpuInstanceProfileInfo_v2, hgmlGpuInstanceProfileInfo_v3);
        DONE(HGML_ERROR_INVALID_ARGUMENT, 0);
    }
    if (card->mig_current != HGML_DEVICE_MIG_ENABLE) DONE(HGML_ERROR_NOT_SUPPORTED, 0);
    fh_profile *p = fh_profile_by_probe(st, card->index, profile);
    if (p == NULL) DONE(HGML_ERROR_NOT_SUPPORTED, 0);
    if (v2 || fh_quirk_value(st, "v3_as_v2", 0))
        fill_v2(info, p);
    else
        fill_v3((hgmlGpuInstanceProfileInfo_v3_t *)(void *)info, p);
    DONE(HGML_SUCCESS, 0);
}

hgmlReturn_t hgmlDeviceGetGpuInstancePossiblePlacements_v2(hgmlDevice_t dev,
                                                           unsigned int profileId,
                                                           hgmlGpuInstancePlacement_t *placements,
                                                           unsigned int *count) {
    BEGIN("hgmlDeviceGetGpuInstancePossiblePlacements_v2");
    fh_card *card = device(st, dev);
    if (card == NULL || count == NULL) DONE(HGML_ERROR_INVALID_ARGUMENT, 0);
    if (card->mig_current != HGML_DEVICE_MIG_ENABLE) DONE(HGML_ERROR_NOT_SUPPORTED, 0);
    if (fh_profile_by_id(st, card->index, profileId) == NULL) DONE(HGML_ERROR_NOT_SUPPORTED, 0);
    unsigned n = 0, room = placements == NULL ? 0 : *count;
    for (unsigned i = 0; i < st->nplaces; i++) {
        const fh_place *p = &st->places[i];
        if (p->card != card->index || p->profile_id != profileId) continue;
        if (n < room) placements[n] = (hgmlGpuInstancePlacement_t){p->start, p->size};
        n++;
    }
    *count = n;
    DONE(placements != NULL && n > room ? HGML_ERROR_INSUFFICIENT_SIZE : HGML_SUCCESS, 0);
}

/* -- GPU instances --------------------------------------------------------------------------- */

hgmlReturn_t hgmlDeviceCreateGpuInstanceWithPlacement(hgmlDevice_t dev, unsigned int profileId,
                                                      const hgmlGpuInstancePlacement_t *placement,
                                                      hgmlGpuInstance_t *out) {
    BEGIN("hgmlDeviceCreateGpuInstanceWithPlacement");
    fh_card *card = device(st, dev);
    if (card == NULL || placement == NULL || out == NULL) DONE(HGML_ERROR_INVALID_ARGUMENT, 0);
    if (card->mig_current != HGML_DEVICE_MIG_ENABLE) DONE(HGML_ERROR_NOT_SUPPORTED, 0);
    if (fh_profile_by_id(st, card->index, profileId) == NULL ||
        !fh_legal(st, card->index, profileId, placement->start, placement->size))
        DONE(HGML_ERROR_INVALID_ARGUMENT, 0);
    if (fh_overlaps(st, card->index, placement->start, placement->size))
        DONE(HGML_ERROR_INSUFFICIENT_RESOURCES, 0);
    int id = fh_gi_add(st, card->index, profileId, placement->start, placement->size);
    if (id < 0) DONE(HGML_ERROR_INSUFFICIENT_RESOURCES, 0);
    publish_cap(st->root, card->index, (unsigned)id, -1, gi_minor(st, card->index, (unsigned)id));
    out->handle = fh_handle(FH_GPU_INSTANCE, card->index, (unsigned)id, 0);
    DONE(HGML_SUCCESS, 1);
}

hgmlReturn_t hgmlGpuInstanceDestroy(hgmlGpuInstance_t handle) {
    BEGIN("hgmlGpuInstanceDestroy");
    fh_gi *gi = gpu_instance(st, handle);
    if (gi == NULL) DONE(HGML_ERROR_INVALID_ARGUMENT, 0);
    if (fh_ci_count(st, gi->card, gi->gi_id) > 0) DONE(HGML_ERROR_IN_USE, 0);
    withdraw_cap(st->root, gi->card, gi->gi_id, -1);
    fh_gi_remove(st, gi->card, gi->gi_id);
    DONE(HGML_SUCCESS, 1);
}

hgmlReturn_t hgmlDeviceGetGpuInstances(hgmlDevice_t dev, unsigned int profileId,
                                       hgmlGpuInstance_t *out, unsigned int *count) {
    BEGIN("hgmlDeviceGetGpuInstances");
    fh_card *card = device(st, dev);
    if (card == NULL || count == NULL || out == NULL) DONE(HGML_ERROR_INVALID_ARGUMENT, 0);
    if (card->mig_current != HGML_DEVICE_MIG_ENABLE) DONE(HGML_ERROR_NOT_SUPPORTED, 0);
    if (fh_profile_by_id(st, card->index, profileId) == NULL) DONE(HGML_ERROR_INVALID_ARGUMENT, 0);
    unsigned n = 0, room = *count;
    for (unsigned i = 0; i < st->ngis; i++) {
        const fh_gi *gi = &st->gis[i];
        if (gi->card != card->index || gi->profile_id != profileId) continue;
        if (n < room) out[n].handle = fh_handle(FH_GPU_INSTANCE, gi->card, gi->gi_id, 0);
        n++;
    }
    *count = n;
    DONE(n > room ? HGML_ERROR_INSUFFICIENT_SIZE : HGML_SUCCESS, 0);
}

hgmlReturn_t hgmlDeviceGetGpuInstanceById(hgmlDevice_t dev, unsigned int id,
                                          hgmlGpuInstance_t *out) {
    BEGIN("hgmlDeviceGetGpuInstanceById");
    fh_card *card = device(st, dev);
    if (card == NULL || out == NULL) DONE(HGML_ERROR_INVALID_ARGUMENT, 0);
    if (card->mig_current != HGML_DEVICE_MIG_ENABLE) DONE(HGML_ERROR_NOT_SUPPORTED, 0);
    if (fh_gi_find(st, card->index, id) == NULL) DONE(HGML_ERROR_NOT_FOUND, 0);
    out->handle = fh_handle(FH_GPU_INSTANCE, card->index, id, 0);
    DONE(HGML_SUCCESS, 0);
}

hgmlReturn_t hgmlGpuInstanceGetInfo(hgmlGpuInstance_t handle, hgmlGpuInstanceInfo_t *info) {
    BEGIN("hgmlGpuInstanceGetInfo");
    fh_gi *gi = gpu_instance(st, handle);
    if (gi == NULL || info == NULL) DONE(HGML_ERROR_INVALID_ARGUMENT, 0);
    info->device.handle = fh_handle(FH_DEVICE, gi->card, 0, 0);
    info->id = gi->gi_id;
    info->profileId = gi->profile_id;
    info->placement = (hgmlGpuInstancePlacement_t){gi->start, gi->size};
    DONE(HGML_SUCCESS, 0);
}

/* -- compute instances ----------------------------------------------------------------------- */

hgmlReturn_t hgmlGpuInstanceGetComputeInstanceProfileInfo(hgmlGpuInstance_t handle,
                                                          unsigned int profile,
                                                          unsigned int engProfile,
                                                          hgmlComputeInstanceProfileInfo_t *info) {
    BEGIN("hgmlGpuInstanceGetComputeInstanceProfileInfo");
    fh_gi *gi = gpu_instance(st, handle);
    if (gi == NULL || info == NULL || engProfile != HGML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
        DONE(HGML_ERROR_INVALID_ARGUMENT, 0);
    fh_ciprofile *p = fh_ciprofile_by_probe(st, gi->card, profile);
    fh_profile *gp = fh_profile_by_id(st, gi->card, gi->profile_id);
    if (p == NULL || gp == NULL || p->slices > gp->slices) DONE(HGML_ERROR_NOT_SUPPORTED, 0);
    memset(info, 0, sizeof(*info));
    info->id = p->id;
    info->sliceCount = p->slices;
    info->instanceCount = gp->slices / p->slices;
    info->multiprocessorCount = p->slices * 16;
    DONE(HGML_SUCCESS, 0);
}

hgmlReturn_t hgmlGpuInstanceCreateComputeInstance(hgmlGpuInstance_t handle,
                                                  unsigned int profileId,
                                                  hgmlComputeInstance_t *out) {
    BEGIN("hgmlGpuInstanceCreateComputeInstance");
    fh_gi *gi = gpu_instance(st, handle);
    if (gi == NULL || out == NULL) DONE(HGML_ERROR_INVALID_ARGUMENT, 0);
    fh_ciprofile *p = fh_ciprofile_by_id(st, gi->card, profileId);
    fh_profile *gp = fh_profile_by_id(st, gi->card, gi->profile_id);
    if (p == NULL || gp == NULL || p->slices > gp->slices) DONE(HGML_ERROR_INVALID_ARGUMENT, 0);
    unsigned used = 0;
    for (unsigned i = 0; i < st->ncis; i++)
        if (st->cis[i].card == gi->card && st->cis[i].gi_id == gi->gi_id) {
            fh_ciprofile *q = fh_ciprofile_by_id(st, gi->card, st->cis[i].profile_id);
            used += q ? q->slices : gp->slices;
        }
    if (used + p->slices > gp->slices) DONE(HGML_ERROR_INSUFFICIENT_RESOURCES, 0);
    fh_card *card = fh_card_at(st, gi->card);
    char seed[256], uuid[64], mig[80];
    unsigned next = 0;
    while (fh_ci_find(st, gi->card, gi->gi_id, next) != NULL) next++;
    /* Name-based, as NVIDIA's: a successor at the same slot and ids gets the same UUID. */
    snprintf(seed, sizeof(seed), "%s/%u/%u/%u/%u", card ? card->uuid : "", gi->gi_id, next,
             gi->profile_id, gi->start);
    fh_uuid(st, seed, 0, uuid, sizeof(uuid));
    snprintf(mig, sizeof(mig), "MIG-%s", uuid);
    int id = fh_ci_add(st, gi->card, gi->gi_id, profileId, mig);
    if (id < 0) DONE(HGML_ERROR_INSUFFICIENT_RESOURCES, 0);
    publish_cap(st->root, gi->card, gi->gi_id, id, gi_minor(st, gi->card, gi->gi_id) + 1 + (unsigned)id);
    out->handle = fh_handle(FH_COMPUTE_INSTANCE, gi->card, gi->gi_id, (unsigned)id);
    DONE(HGML_SUCCESS, 1);
}

hgmlReturn_t hgmlGpuInstanceGetComputeInstanceById(hgmlGpuInstance_t handle, unsigned int id,
                                                   hgmlComputeInstance_t *out) {
    BEGIN("hgmlGpuInstanceGetComputeInstanceById");
    fh_gi *gi = gpu_instance(st, handle);
    if (gi == NULL || out == NULL) DONE(HGML_ERROR_INVALID_ARGUMENT, 0);
    if (fh_ci_find(st, gi->card, gi->gi_id, id) == NULL) DONE(HGML_ERROR_NOT_FOUND, 0);
    out->handle = fh_handle(FH_COMPUTE_INSTANCE, gi->card, gi->gi_id, id);
    DONE(HGML_SUCCESS, 0);
}

hgmlReturn_t hgmlComputeInstanceGetInfo_v2(hgmlComputeInstance_t handle,
                                           hgmlComputeInstanceInfo_t *info) {
    BEGIN("hgmlComputeInstanceGetInfo_v2");
    fh_ci *ci = compute_instance(st, handle);
    if (ci == NULL || info == NULL) DONE(HGML_ERROR_INVALID_ARGUMENT, 0);
    fh_ciprofile *p = fh_ciprofile_by_id(st, ci->card, ci->profile_id);
    info->device.handle = fh_handle(FH_DEVICE, ci->card, 0, 0);
    info->gpuInstance.handle = fh_handle(FH_GPU_INSTANCE, ci->card, ci->gi_id, 0);
    info->id = ci->ci_id;
    info->profileId = ci->profile_id;
    info->placement = (hgmlComputeInstancePlacement_t){0, p ? p->slices : 0};
    DONE(HGML_SUCCESS, 0);
}

hgmlReturn_t hgmlComputeInstanceDestroy(hgmlComputeInstance_t handle) {
    BEGIN("hgmlComputeInstanceDestroy");
    fh_ci *ci = compute_instance(st, handle);
    if (ci == NULL) DONE(HGML_ERROR_INVALID_ARGUMENT, 0);
    if (ci->busy) DONE(HGML_ERROR_IN_USE, 0);
    withdraw_cap(st->root, ci->card, ci->gi_id, (int)ci->ci_id);
    fh_ci_remove(st, ci->card, ci->gi_id, ci->ci_id);
    DONE(HGML_SUCCESS, 1);
}

/* -- MIG device handles ---------------------------------------------------------------------- */

hgmlReturn_t hgmlDeviceGetMaxMigDeviceCount(hgmlDevice_t dev, unsigned int *count) {
    BEGIN("hgmlDeviceGetMaxMigDeviceCount");
    fh_card *card = device(st, dev);
    if (card == NULL || count == NULL) DONE(HGML_ERROR_INVALID_ARGUMENT, 0);
    *count = card->mig_current == HGML_DEVICE_MIG_ENABLE ? MAX_MIG_DEVICES : 0;
    DONE(HGML_SUCCESS, 0);
}

hgmlReturn_t hgmlDeviceGetMigDeviceHandleByIndex(hgmlDevice_t dev, unsigned int index,
                                                 hgmlDevice_t *out) {
    BEGIN("hgmlDeviceGetMigDeviceHandleByIndex");
    fh_card *card = device(st, dev);
    if (card == NULL || out == NULL || index >= MAX_MIG_DEVICES)
        DONE(HGML_ERROR_INVALID_ARGUMENT, 0);
    /* MIG devices numbered per card in (GI id, CI id) order. */
    unsigned seen = 0;
    for (unsigned gi = 0; gi < 4096; gi++) {
        if (fh_gi_find(st, card->index, gi) == NULL) continue;
        for (unsigned ci = 0; ci < 64; ci++) {
            if (fh_ci_find(st, card->index, gi, ci) == NULL) continue;
            if (seen++ == index) {
                out->handle = fh_handle(FH_MIG, card->index, gi, ci);
                DONE(HGML_SUCCESS, 0);
            }
        }
    }
    DONE(HGML_ERROR_NOT_FOUND, 0);
}

hgmlReturn_t hgmlDeviceGetGpuInstanceId(hgmlDevice_t dev, unsigned int *id) {
    BEGIN("hgmlDeviceGetGpuInstanceId");
    fh_ci *mig = mig_device(st, dev);
    if (mig == NULL || id == NULL) DONE(HGML_ERROR_INVALID_ARGUMENT, 0);
    *id = mig->gi_id;
    DONE(HGML_SUCCESS, 0);
}

hgmlReturn_t hgmlDeviceGetComputeInstanceId(hgmlDevice_t dev, unsigned int *id) {
    BEGIN("hgmlDeviceGetComputeInstanceId");
    fh_ci *mig = mig_device(st, dev);
    if (mig == NULL || id == NULL) DONE(HGML_ERROR_INVALID_ARGUMENT, 0);
    *id = mig->ci_id;
    DONE(HGML_SUCCESS, 0);
}

hgmlReturn_t hgmlDeviceGetComputeRunningProcesses(hgmlDevice_t dev, unsigned int *infoCount,
                                                  hgmlProcessInfo_t *infos) {
    BEGIN("hgmlDeviceGetComputeRunningProcesses");
    fh_ci *mig = mig_device(st, dev);
    if (mig == NULL || infoCount == NULL) DONE(HGML_ERROR_INVALID_ARGUMENT, 0);
    unsigned n = mig->busy ? 1 : 0, room = infos == NULL ? 0 : *infoCount;
    *infoCount = n;
    if (n > room) DONE(HGML_ERROR_INSUFFICIENT_SIZE, 0);
    if (n) infos[0] = (hgmlProcessInfo_t){4242, 1ULL << 30, mig->gi_id, mig->ci_id};
    DONE(HGML_SUCCESS, 0);
}
