/* A fake libhydmi_mig.so.1: Hygon DCU partitions as the DMI library describes them, on the shared
 * partitionable cards (../common/fakeparts.h, state file in FAKE_DMI_STATE), keeping the driver's
 * registry under <host root>/etc/dmi_mig_config.
 *
 * What it holds the caller to, as the library does: NVML's symbol names (so it must be resolved
 * from its own handle, never globally); no init call; a node-wide MIG mode; cards addressed by
 * domain-qualified PCI bus id (the short form is INVALID_ARGUMENT); profiles queried by slice count
 * minus one; placements and instance lists with a count in/out; a fresh partition UUID on every
 * create, written to the registry's `ci/dev<N>gi<G>ci<C>.conf` as its `mig_uuid:` line; a directory
 * at that path failing the create with INSUFFICIENT_RESOURCES; IN_USE on a busy destroy. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dmi_subset.h"
#include "fakeparts.h"

#define ENV "FAKE_DMI_STATE"
#define DRIVER_NOT_LOADED 9 /* NVML's code for "no driver": what the library answers without one */

#define BEGIN(fn)                                                            \
    fake_session s_;                                                         \
    fh_state *st;                                                            \
    {                                                                        \
        int injected_ = fh_begin(&s_, ENV, fn);                              \
        if (injected_ < 0) return (nvmlReturn_t)DRIVER_NOT_LOADED;             \
        if (injected_ > 0) return (nvmlReturn_t)injected_;                     \
        st = fh_state_of(&s_);                                              \
        (void)st;                                                            \
    }
#define DONE(code, dirty) \
    do {                  \
        (void)(dirty);    \
        fh_end(&s_);      \
        return code;      \
    } while (0)

static fh_card *device(fh_state *st, nvmlDevice_t dev) {
    unsigned card;
    if (fh_unhandle(dev, FH_DEVICE, &card, NULL, NULL) != 0) return NULL;
    return fh_card_at(st, card);
}

static fh_gi *gpu_instance(fh_state *st, nvmlGpuInstance_t gi) {
    unsigned card, id;
    if (fh_unhandle(gi, FH_GPU_INSTANCE, &card, &id, NULL) != 0) return NULL;
    return fh_gi_find(st, card, id);
}

static fh_ci *compute_instance(fh_state *st, nvmlComputeInstance_t ci) {
    unsigned card, gi, id;
    if (fh_unhandle(ci, FH_COMPUTE_INSTANCE, &card, &gi, &id) != 0) return NULL;
    return fh_ci_find(st, card, gi, id);
}

static int conf_path(const char *root, char *out, size_t size, unsigned card, unsigned gi,
                     unsigned ci) {
    if (*root == 0) return -1;
    snprintf(out, size, "%s/etc/dmi_mig_config/ci/dev%ugi%uci%u.conf", root, card, gi, ci);
    return 0;
}

/* -- node and devices ------------------------------------------------------------------------ */

nvmlReturn_t nvmlGetSystemMigMode(unsigned int *current, unsigned int *pending) {
    BEGIN("nvmlGetSystemMigMode");
    if (current == NULL || pending == NULL) DONE(NVML_ERROR_INVALID_ARGUMENT, 0);
    *current = st->mode_current;
    *pending = st->mode_pending;
    DONE(NVML_SUCCESS, 0);
}

nvmlReturn_t nvmlDeviceGetCount(unsigned int *count) {
    BEGIN("nvmlDeviceGetCount");
    if (count == NULL) DONE(NVML_ERROR_INVALID_ARGUMENT, 0);
    *count = st->ncards;
    DONE(NVML_SUCCESS, 0);
}

nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t *out) {
    BEGIN("nvmlDeviceGetHandleByIndex");
    if (out == NULL || fh_card_at(st, index) == NULL) DONE(NVML_ERROR_INVALID_ARGUMENT, 0);
    *out = fh_handle(FH_DEVICE, index, 0, 0);
    DONE(NVML_SUCCESS, 0);
}

nvmlReturn_t nvmlDeviceGetHandleByPciBusId(const char *pciBusId, nvmlDevice_t *out) {
    BEGIN("nvmlDeviceGetHandleByPciBusId");
    unsigned domain, bus, slot, function;
    char tail;
    /* Domain-qualified only: "0000:09:00.0"; "09:00.0" is refused. */
    if (pciBusId == NULL || out == NULL ||
        sscanf(pciBusId, "%4x:%2x:%2x.%1x%c", &domain, &bus, &slot, &function, &tail) != 4 ||
        strlen(pciBusId) != 12)
        DONE(NVML_ERROR_INVALID_ARGUMENT, 0);
    for (unsigned i = 0; i < st->ncards; i++)
        if (!strcasecmp(st->cards[i].pci, pciBusId)) {
            *out = fh_handle(FH_DEVICE, st->cards[i].index, 0, 0);
            DONE(NVML_SUCCESS, 0);
        }
    DONE(NVML_ERROR_NOT_FOUND, 0);
}

nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t dev, unsigned int *index) {
    BEGIN("nvmlDeviceGetIndex");
    fh_card *card = device(st, dev);
    if (card == NULL || index == NULL) DONE(NVML_ERROR_INVALID_ARGUMENT, 0);
    *index = card->index;
    DONE(NVML_SUCCESS, 0);
}

nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t dev, nvmlMemory_t *memory) {
    BEGIN("nvmlDeviceGetMemoryInfo");
    fh_card *card = device(st, dev);
    if (card == NULL || memory == NULL) DONE(NVML_ERROR_INVALID_ARGUMENT, 0);
    memory->total = card->memory_mib * 1024ULL * 1024ULL;
    memory->used = 0;
    memory->free = memory->total;
    DONE(NVML_SUCCESS, 0);
}

/* -- GPU-instance profiles, placements, instances -------------------------------------------- */

nvmlReturn_t nvmlDeviceGetGpuInstanceProfileInfo(nvmlDevice_t dev, unsigned int profile,
                                                 nvmlGpuInstanceProfileInfo_t *info) {
    BEGIN("nvmlDeviceGetGpuInstanceProfileInfo");
    fh_card *card = device(st, dev);
    if (card == NULL || info == NULL || profile >= NVML_GPU_INSTANCE_PROFILE_COUNT)
        DONE(NVML_ERROR_INVALID_ARGUMENT, 0);
    if (st->mode_current != NVML_DEVICE_MIG_ENABLE) DONE(NVML_ERROR_NOT_SUPPORTED, 0);
    /* `profile` is a slice count minus one; the id comes back in the answer. */
    fh_profile *p = fh_profile_by_probe(st, card->index, profile);
    if (p == NULL) DONE(NVML_ERROR_INVALID_ARGUMENT, 0);
    memset(info, 0, sizeof(*info));
    info->id = p->id;
    info->gi_count_max = p->count;
    info->cu_count = p->slices * 20;
    info->gpu_slice_count = p->slices;
    info->memory_size_MB = p->memory_mb;
    snprintf(info->name, sizeof(info->name), "%s", p->name);
    DONE(NVML_SUCCESS, 0);
}

nvmlReturn_t nvmlDeviceGetGpuInstancePossiblePlacements(nvmlDevice_t dev, unsigned int profileId,
                                                        nvmlGpuInstancePlacement_t *placements,
                                                        unsigned int *count) {
    BEGIN("nvmlDeviceGetGpuInstancePossiblePlacements");
    fh_card *card = device(st, dev);
    if (card == NULL || placements == NULL || count == NULL) DONE(NVML_ERROR_INVALID_ARGUMENT, 0);
    if (fh_profile_by_id(st, card->index, profileId) == NULL) DONE(NVML_ERROR_INVALID_ARGUMENT, 0);
    unsigned n = 0, room = *count;
    for (unsigned i = 0; i < st->nplaces; i++) {
        const fh_place *p = &st->places[i];
        if (p->card != card->index || p->profile_id != profileId) continue;
        if (n < room) placements[n] = (nvmlGpuInstancePlacement_t){p->start, p->size};
        n++;
    }
    *count = n;
    DONE(n > room ? NVML_ERROR_INSUFFICIENT_SIZE : NVML_SUCCESS, 0);
}

nvmlReturn_t nvmlDeviceGetGpuInstances(nvmlDevice_t dev, unsigned int profileId,
                                       nvmlGpuInstance_t *out, unsigned int *count) {
    BEGIN("nvmlDeviceGetGpuInstances");
    fh_card *card = device(st, dev);
    if (card == NULL || out == NULL || count == NULL) DONE(NVML_ERROR_INVALID_ARGUMENT, 0);
    if (fh_profile_by_id(st, card->index, profileId) == NULL) DONE(NVML_ERROR_INVALID_ARGUMENT, 0);
    unsigned n = 0, room = *count;
    for (unsigned i = 0; i < st->ngis; i++) {
        const fh_gi *gi = &st->gis[i];
        if (gi->card != card->index || gi->profile_id != profileId) continue;
        if (n < room) out[n] = fh_handle(FH_GPU_INSTANCE, gi->card, gi->gi_id, 0);
        n++;
    }
    *count = n;
    DONE(n > room ? NVML_ERROR_INSUFFICIENT_SIZE : NVML_SUCCESS, 0);
}

nvmlReturn_t nvmlDeviceCreateGpuInstanceWithPlacement(nvmlDevice_t dev, unsigned int profileId,
                                                      const nvmlGpuInstancePlacement_t *placement,
                                                      nvmlGpuInstance_t *out) {
    BEGIN("nvmlDeviceCreateGpuInstanceWithPlacement");
    fh_card *card = device(st, dev);
    if (card == NULL || placement == NULL || out == NULL) DONE(NVML_ERROR_INVALID_ARGUMENT, 0);
    if (st->mode_current != NVML_DEVICE_MIG_ENABLE) DONE(NVML_ERROR_NOT_SUPPORTED, 0);
    if (fh_profile_by_id(st, card->index, profileId) == NULL ||
        !fh_legal(st, card->index, profileId, placement->start, placement->size))
        DONE(NVML_ERROR_INVALID_ARGUMENT, 0);
    if (fh_overlaps(st, card->index, placement->start, placement->size))
        DONE(NVML_ERROR_INSUFFICIENT_RESOURCES, 0);
    int id = fh_gi_add(st, card->index, profileId, placement->start, placement->size);
    if (id < 0) DONE(NVML_ERROR_INSUFFICIENT_RESOURCES, 0);
    *out = fh_handle(FH_GPU_INSTANCE, card->index, (unsigned)id, 0);
    DONE(NVML_SUCCESS, 1);
}

nvmlReturn_t nvmlGpuInstanceGetInfo(nvmlGpuInstance_t handle, nvmlGpuInstanceInfo_t *info) {
    BEGIN("nvmlGpuInstanceGetInfo");
    fh_gi *gi = gpu_instance(st, handle);
    if (gi == NULL || info == NULL) DONE(NVML_ERROR_INVALID_ARGUMENT, 0);
    info->device = fh_handle(FH_DEVICE, gi->card, 0, 0);
    info->id = gi->gi_id;
    info->profile_id = gi->profile_id;
    info->placement = (nvmlGpuInstancePlacement_t){gi->start, gi->size};
    DONE(NVML_SUCCESS, 0);
}

nvmlReturn_t nvmlGpuInstanceDestroy(nvmlGpuInstance_t handle) {
    BEGIN("nvmlGpuInstanceDestroy");
    fh_gi *gi = gpu_instance(st, handle);
    if (gi == NULL) DONE(NVML_ERROR_INVALID_ARGUMENT, 0);
    if (fh_ci_count(st, gi->card, gi->gi_id) > 0) DONE(NVML_ERROR_IN_USE, 0);
    fh_gi_remove(st, gi->card, gi->gi_id);
    DONE(NVML_SUCCESS, 1);
}

/* -- compute instances ----------------------------------------------------------------------- */

nvmlReturn_t nvmlGpuInstanceGetComputeInstanceProfileInfo(nvmlGpuInstance_t handle,
                                                          unsigned int profile,
                                                          unsigned int engProfile,
                                                          nvmlComputeInstanceProfileInfo_t *info) {
    BEGIN("nvmlGpuInstanceGetComputeInstanceProfileInfo");
    fh_gi *gi = gpu_instance(st, handle);
    if (gi == NULL || info == NULL || engProfile != NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED ||
        profile >= NVML_COMPUTE_INSTANCE_PROFILE_COUNT)
        DONE(NVML_ERROR_INVALID_ARGUMENT, 0);
    fh_ciprofile *p = fh_ciprofile_by_probe(st, gi->card, profile);
    fh_profile *gp = fh_profile_by_id(st, gi->card, gi->profile_id);
    if (p == NULL || gp == NULL || p->slices > gp->slices) DONE(NVML_ERROR_INVALID_ARGUMENT, 0);
    memset(info, 0, sizeof(*info));
    info->id = p->id;
    info->ci_count_max = gp->slices / p->slices;
    info->cu_count = p->slices * 20;
    info->gpu_slice_count = p->slices;
    DONE(NVML_SUCCESS, 0);
}

nvmlReturn_t nvmlGpuInstanceGetComputeInstances(nvmlGpuInstance_t handle, unsigned int profileId,
                                                nvmlComputeInstance_t *out, unsigned int *count) {
    BEGIN("nvmlGpuInstanceGetComputeInstances");
    fh_gi *gi = gpu_instance(st, handle);
    if (gi == NULL || out == NULL || count == NULL) DONE(NVML_ERROR_INVALID_ARGUMENT, 0);
    unsigned n = 0, room = *count;
    for (unsigned i = 0; i < st->ncis; i++) {
        const fh_ci *ci = &st->cis[i];
        if (ci->card != gi->card || ci->gi_id != gi->gi_id || ci->profile_id != profileId)
            continue;
        if (n < room) out[n] = fh_handle(FH_COMPUTE_INSTANCE, ci->card, ci->gi_id, ci->ci_id);
        n++;
    }
    *count = n;
    DONE(n > room ? NVML_ERROR_INSUFFICIENT_SIZE : NVML_SUCCESS, 0);
}

static int write_conf(const char *path, const fh_gi *gi, unsigned ci, const char *uuid) {
    if (fh_mkdirs(path) != 0) return -1;
    FILE *out = fopen(path, "w");
    if (out == NULL) return -1;
    fprintf(out,
            "gpu_instance_id: %u\nprofile_id: %u\nplacement_start: %u\nplacement_size: %u\n"
            "compute_instance_id: %u\nmig_uuid: %s\n",
            gi->gi_id, gi->profile_id, gi->start, gi->size, ci, uuid);
    return fclose(out);
}

nvmlReturn_t nvmlGpuInstanceCreateComputeInstance(nvmlGpuInstance_t handle,
                                                  unsigned int profileId,
                                                  nvmlComputeInstance_t *out) {
    BEGIN("nvmlGpuInstanceCreateComputeInstance");
    fh_gi *gi = gpu_instance(st, handle);
    if (gi == NULL || out == NULL) DONE(NVML_ERROR_INVALID_ARGUMENT, 0);
    fh_ciprofile *p = fh_ciprofile_by_id(st, gi->card, profileId);
    fh_profile *gp = fh_profile_by_id(st, gi->card, gi->profile_id);
    if (p == NULL || gp == NULL || p->slices > gp->slices) DONE(NVML_ERROR_INVALID_ARGUMENT, 0);
    if (fh_ci_count(st, gi->card, gi->gi_id) > 0) DONE(NVML_ERROR_INSUFFICIENT_RESOURCES, 0);
    unsigned next = 0;
    while (fh_ci_find(st, gi->card, gi->gi_id, next) != NULL) next++;
    char path[512], uuid[64];
    if (conf_path(st->root, path, sizeof(path), gi->card, gi->gi_id, next) != 0) DONE(NVML_ERROR_UNKNOWN, 0);
    struct stat info;
    /* A directory at the record's path (a container runtime made it) can never be written. */
    if (lstat(path, &info) == 0 && S_ISDIR(info.st_mode)) DONE(NVML_ERROR_INSUFFICIENT_RESOURCES, 0);
    fh_uuid(st, "dcu", 1, uuid, sizeof(uuid)); /* fresh on every create */
    if (write_conf(path, gi, next, uuid) != 0) DONE(NVML_ERROR_UNKNOWN, 1);
    if (fh_ci_add(st, gi->card, gi->gi_id, profileId, uuid) < 0) DONE(NVML_ERROR_UNKNOWN, 1);
    *out = fh_handle(FH_COMPUTE_INSTANCE, gi->card, gi->gi_id, next);
    DONE(NVML_SUCCESS, 1);
}

nvmlReturn_t nvmlComputeInstanceGetInfo(nvmlComputeInstance_t handle,
                                        nvmlComputeInstanceInfo_t *info) {
    BEGIN("nvmlComputeInstanceGetInfo");
    fh_ci *ci = compute_instance(st, handle);
    if (ci == NULL || info == NULL) DONE(NVML_ERROR_INVALID_ARGUMENT, 0);
    fh_ciprofile *p = fh_ciprofile_by_id(st, ci->card, ci->profile_id);
    info->device = fh_handle(FH_DEVICE, ci->card, 0, 0);
    info->gpu_instance = fh_handle(FH_GPU_INSTANCE, ci->card, ci->gi_id, 0);
    info->id = ci->ci_id;
    info->profile_id = ci->profile_id;
    info->placement = (nvmlComputeInstancePlacement_t){0, p ? p->slices : 0};
    DONE(NVML_SUCCESS, 0);
}

nvmlReturn_t nvmlComputeInstanceDestroy(nvmlComputeInstance_t handle) {
    BEGIN("nvmlComputeInstanceDestroy");
    fh_ci *ci = compute_instance(st, handle);
    if (ci == NULL) DONE(NVML_ERROR_INVALID_ARGUMENT, 0);
    if (ci->busy) DONE(NVML_ERROR_IN_USE, 0);
    char path[512];
    struct stat info;
    if (conf_path(st->root, path, sizeof(path), ci->card, ci->gi_id, ci->ci_id) == 0 &&
        lstat(path, &info) == 0 && S_ISREG(info.st_mode))
        unlink(path);
    fh_ci_remove(st, ci->card, ci->gi_id, ci->ci_id);
    DONE(NVML_SUCCESS, 1);
}
