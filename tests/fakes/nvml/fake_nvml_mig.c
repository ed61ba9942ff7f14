/* The MIG half of the fake NVML: GI profiles and placements, GPU and compute instances, MIG
 * devices and their processes. See fake_nvml.c. */
#define _DEFAULT_SOURCE
#include "fake_nvml.h"

#include <stdio.h>
#include <string.h>

/* -- GPU-instance profiles and placements -------------------------------------------------- */

static nvmlReturn_t mig_card(call *c, nvmlDevice_t device, gpu_state **out) {
    *out = fk_card(c, device, 1);
    if (*out == NULL) return fk_reject(c, "device", "not a device handle");
    if (!(*out)->mig_capable || !(*out)->mig_current) return fk_end(c, NVML_ERROR_NOT_SUPPORTED);
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
    if (profile >= NVML_GPU_INSTANCE_PROFILE_COUNT) return fk_end(c, NVML_ERROR_INVALID_ARGUMENT);
    *out = fk_profile_by(g, 1, profile);
    return *out ? NVML_SUCCESS : fk_end(c, NVML_ERROR_NOT_SUPPORTED);
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
    return fk_end(&c, NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetGpuInstanceProfileInfoV(nvmlDevice_t device, unsigned int profile,
                                                  nvmlGpuInstanceProfileInfo_v2_t *info) {
    BEGIN(c);
    OUT(c, info);
    if (info->version != nvmlGpuInstanceProfileInfo_v2 && info->version != nvmlGpuInstanceProfileInfo_v3) {
        fake_complain(c.s.state, "%s: info->version is 0x%x, not a nvmlGpuInstanceProfileInfo version",
                      __func__, info->version);
        return fk_end(&c, NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
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
    return fk_end(&c, NVML_SUCCESS);
}

static const gi_profile *profile_of_id(call *c, nvmlDevice_t device, unsigned id, gpu_state **g, nvmlReturn_t *rc) {
    *rc = mig_card(c, device, g);
    if (*rc != NVML_SUCCESS) return NULL;
    const gi_profile *p = fk_profile_by(*g, 0, id);
    if (p == NULL) *rc = fk_end(c, NVML_ERROR_INVALID_ARGUMENT);
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
    /* A profile the card lists but cannot place answers as a test set it (NOT_SUPPORTED or
     * INVALID_ARGUMENT), for the count query and the array alike: NVIDIA's DRA driver skips such a
     * profile (cmd/gpu-kubelet-plugin/nvlib.go, GetGpuInstancePossiblePlacements). */
    if (p->placements_rc != 0) return fk_end(&c, (nvmlReturn_t)p->placements_rc);
    unsigned n = 0;
    for (unsigned s = 0; s < SLICES; s++) n += (p->starts >> s) & 1;
    if (placements == NULL) { /* the count query */
        *count = n;
        return fk_end(&c, NVML_SUCCESS);
    }
    if (*count < n) {
        *count = n;
        return fk_end(&c, NVML_ERROR_INSUFFICIENT_SIZE);
    }
    if (!fake_readable(placements, n * sizeof *placements))
        return fk_reject(&c, __func__, "placements is not a valid pointer");
    unsigned k = 0;
    for (unsigned i = 0; i < SLICES; i++) {
        unsigned s = p->descending ? SLICES - 1 - i : i;
        if ((p->starts >> s) & 1) placements[k++] = (nvmlGpuInstancePlacement_t){s, p->size};
    }
    *count = n;
    return fk_end(&c, NVML_SUCCESS);
}

/* -- GPU instances ------------------------------------------------------------------------- */

static int overlaps(unsigned a, unsigned an, unsigned b, unsigned bn) { return a < b + bn && b < a + an; }

static unsigned count_of_profile(const gpu_state *g, unsigned id) {
    unsigned n = 0;
    for (unsigned i = 0; i < MAX_GI; i++) n += g->gi[i].used && g->gi[i].profile_id == id;
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
        return fk_reject(&c, __func__, what);
    }
    gpu_state *g;
    nvmlReturn_t rc;
    const gi_profile *p = profile_of_id(&c, device, profileId, &g, &rc);
    if (p == NULL) return rc;
    unsigned start = placement->start, size = placement->size;
    if (start >= SLICES || size != p->size || !((p->starts >> start) & 1))
        return fk_end(&c, NVML_ERROR_INVALID_ARGUMENT);
    for (unsigned i = 0; i < MAX_GI; i++) {
        gi_state *o = &g->gi[i];
        if (o->used && overlaps(start, size, o->start, o->size)) return fk_end(&c, NVML_ERROR_INSUFFICIENT_RESOURCES);
    }
    if (count_of_profile(g, p->id) >= p->count) return fk_end(&c, NVML_ERROR_INSUFFICIENT_RESOURCES);
    /* The id is the slot's, not the lowest free one (fk_gi_id): no overlap above means it is free. */
    unsigned id = fk_gi_id(start, size);
    g->gi[id] = (gi_state){1, p->id, start, size, {{0}}};
    fk_publish_cap(c.st, g, id, -1, 1);
    *gpuInstance = fk_gi_handle(device->gpu, (int)id);
    return fk_end(&c, NVML_SUCCESS);
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
        return fk_reject(&c, __func__, "gpuInstances must hold the profile's instanceCount handles");
    unsigned n = 0;
    for (unsigned i = 0; i < MAX_GI; i++)
        if (g->gi[i].used && g->gi[i].profile_id == profileId) gpuInstances[n++] = fk_gi_handle(device->gpu, (int)i);
    *count = n;
    return fk_end(&c, NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetGpuInstanceById(nvmlDevice_t device, unsigned int id, nvmlGpuInstance_t *gpuInstance) {
    BEGIN(c);
    OUT(c, gpuInstance);
    gpu_state *g;
    nvmlReturn_t rc = mig_card(&c, device, &g);
    if (rc != NVML_SUCCESS) return rc;
    if (id >= MAX_GI || !g->gi[id].used) return fk_end(&c, NVML_ERROR_NOT_FOUND);
    *gpuInstance = fk_gi_handle(device->gpu, (int)id);
    return fk_end(&c, NVML_SUCCESS);
}

nvmlReturn_t nvmlGpuInstanceGetInfo(nvmlGpuInstance_t gpuInstance, nvmlGpuInstanceInfo_t *info) {
    BEGIN(c);
    OUT(c, info);
    LIVE_GI(c, gi, gpuInstance);
    info->device = fk_device_handle(gpuInstance->gpu);
    info->id = (unsigned)gpuInstance->gi;
    info->profileId = gi->profile_id;
    info->placement = (nvmlGpuInstancePlacement_t){gi->start, gi->size};
    return fk_end(&c, NVML_SUCCESS);
}

nvmlReturn_t nvmlGpuInstanceDestroy(nvmlGpuInstance_t gpuInstance) {
    BEGIN(c);
    LIVE_GI(c, gi, gpuInstance);
    for (unsigned i = 0; i < MAX_CI; i++)
        if (gi->ci[i].used) return fk_end(&c, NVML_ERROR_IN_USE); /* compute instances remain */
    gpu_state *g = &c.st->gpu[gpuInstance->gpu];
    fk_publish_cap(c.st, g, (unsigned)gpuInstance->gi, -1, 0);
    memset(gi, 0, sizeof *gi);
    return fk_end(&c, NVML_SUCCESS);
}

/* -- compute instances --------------------------------------------------------------------- */

/* The CI profile `profile` of a GI: its slice count and how many fit, or an NVML error. */
static nvmlReturn_t ci_profile(call *c, nvmlGpuInstance_t gpuInstance, unsigned profile,
                               unsigned engProfile, unsigned *slices, const gi_profile **p) {
    gi_state *gi = fk_gpu_instance(c, gpuInstance);
    if (gi == NULL) return fk_reject(c, "ci profile", "not a live GPU instance handle");
    *p = fk_profile_by(&c->st->gpu[gpuInstance->gpu], 0, gi->profile_id);
    *slices = fk_ci_slices(profile);
    if (profile >= NVML_COMPUTE_INSTANCE_PROFILE_COUNT ||
        engProfile != NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
        return fk_end(c, NVML_ERROR_INVALID_ARGUMENT);
    if (*slices == 0 || *p == NULL || *slices > (*p)->slices) return fk_end(c, NVML_ERROR_NOT_SUPPORTED);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlGpuInstanceGetComputeInstanceProfileInfo(nvmlGpuInstance_t gpuInstance, unsigned int profile,
                                                          unsigned int engProfile,
                                                          nvmlComputeInstanceProfileInfo_t *info) {
    BEGIN(c);
    OUT(c, info);
    unsigned slices;
    const gi_profile *p;
    nvmlReturn_t rc = ci_profile(&c, gpuInstance, profile, engProfile, &slices, &p);
    if (rc != NVML_SUCCESS) return rc;
    memset(info, 0, sizeof *info);
    info->id = profile;
    info->sliceCount = slices;
    info->instanceCount = p->slices / slices;
    info->multiprocessorCount = slices * 16;
    return fk_end(&c, NVML_SUCCESS);
}

nvmlReturn_t nvmlGpuInstanceGetComputeInstanceProfileInfoV(nvmlGpuInstance_t gpuInstance, unsigned int profile,
                                                           unsigned int engProfile,
                                                           nvmlComputeInstanceProfileInfo_v2_t *info) {
    BEGIN(c);
    OUT(c, info);
    if (info->version != nvmlComputeInstanceProfileInfo_v2) {
        fake_complain(c.s.state, "%s: info->version is 0x%x, not nvmlComputeInstanceProfileInfo_v2",
                      __func__, info->version);
        return fk_end(&c, NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
    }
    unsigned slices;
    const gi_profile *p;
    nvmlReturn_t rc = ci_profile(&c, gpuInstance, profile, engProfile, &slices, &p);
    if (rc != NVML_SUCCESS) return rc;
    memset((char *)info + sizeof info->version, 0, sizeof *info - sizeof info->version);
    info->id = profile;
    info->sliceCount = slices;
    info->instanceCount = p->slices / slices;
    info->multiprocessorCount = slices * 16;
    snprintf(info->name, sizeof info->name, "%uc.%s", slices, p->name);
    return fk_end(&c, NVML_SUCCESS);
}

static unsigned free_mig_index(const gpu_state *g) {
    for (unsigned index = 0; index < MAX_MIG; index++) {
        int taken = 0;
        for (unsigned i = 0; i < MAX_GI; i++)
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
    LIVE_GI(c, gi, gpuInstance);
    gpu_state *g = &c.st->gpu[gpuInstance->gpu];
    const gi_profile *p = fk_profile_by(g, 0, gi->profile_id);
    unsigned slices = fk_ci_slices(profileId), used = 0, id = MAX_CI;
    if (slices == 0 || p == NULL || slices > p->slices) return fk_end(&c, NVML_ERROR_INVALID_ARGUMENT);
    for (unsigned i = MAX_CI; i-- > 0;) {
        if (gi->ci[i].used) used += fk_ci_slices(gi->ci[i].cnst);
        else id = i;
    }
    unsigned index = free_mig_index(g);
    if (used + slices > p->slices || id == MAX_CI || index == MAX_MIG)
        return fk_end(&c, NVML_ERROR_INSUFFICIENT_RESOURCES);
    gi->ci[id] = (ci_state){1, profileId, index, 0};
    fk_publish_cap(c.st, g, (unsigned)gpuInstance->gi, (int)id, 1);
    *computeInstance = fk_ci_handle(gpuInstance->gpu, gpuInstance->gi, (int)id);
    return fk_end(&c, NVML_SUCCESS);
}

nvmlReturn_t nvmlGpuInstanceGetComputeInstances(nvmlGpuInstance_t gpuInstance, unsigned int profileId,
                                                nvmlComputeInstance_t *computeInstances, unsigned int *count) {
    BEGIN(c);
    OUT(c, count);
    LIVE_GI(c, gi, gpuInstance);
    if (computeInstances == NULL || !fake_readable(computeInstances, sizeof *computeInstances))
        return fk_reject(&c, __func__, "computeInstances is not a valid pointer");
    unsigned n = 0;
    for (unsigned i = 0; i < MAX_CI; i++)
        if (gi->ci[i].used && gi->ci[i].cnst == profileId)
            computeInstances[n++] = fk_ci_handle(gpuInstance->gpu, gpuInstance->gi, (int)i);
    *count = n;
    return fk_end(&c, NVML_SUCCESS);
}

nvmlReturn_t nvmlGpuInstanceGetComputeInstanceById(nvmlGpuInstance_t gpuInstance, unsigned int id,
                                                   nvmlComputeInstance_t *computeInstance) {
    BEGIN(c);
    OUT(c, computeInstance);
    LIVE_GI(c, gi, gpuInstance);
    if (id >= MAX_CI || !gi->ci[id].used) return fk_end(&c, NVML_ERROR_NOT_FOUND);
    *computeInstance = fk_ci_handle(gpuInstance->gpu, gpuInstance->gi, (int)id);
    return fk_end(&c, NVML_SUCCESS);
}

nvmlReturn_t nvmlComputeInstanceGetInfo(nvmlComputeInstance_t computeInstance, nvmlComputeInstanceInfo_t *info) {
    BEGIN(c);
    OUT(c, info);
    LIVE_CI(c, ci, computeInstance);
    /* The MIG device of this CI, not the parent card: NVIDIA's DRA driver reads the new MIG
     * device's UUID from exactly this handle instead of walking every MIG device index
     * (cmd/gpu-kubelet-plugin/nvlib.go createMigDevice, "ciInfo.Device.GetUUID()"). */
    info->device = c.st->ci_info_parent
                       ? fk_device_handle(computeInstance->gpu) /* nvml.h: "Parent device" */
                       : fk_mig_handle(computeInstance->gpu, computeInstance->gi, computeInstance->ci);
    info->gpuInstance = fk_gi_handle(computeInstance->gpu, computeInstance->gi);
    info->id = (unsigned)computeInstance->ci;
    info->profileId = ci->cnst;
    info->placement = (nvmlComputeInstancePlacement_t){0, fk_ci_slices(ci->cnst)};
    return fk_end(&c, NVML_SUCCESS);
}

nvmlReturn_t nvmlComputeInstanceDestroy(nvmlComputeInstance_t computeInstance) {
    BEGIN(c);
    LIVE_CI(c, ci, computeInstance);
    if (ci->processes > 0) return fk_end(&c, NVML_ERROR_IN_USE);
    gpu_state *g = &c.st->gpu[computeInstance->gpu];
    fk_publish_cap(c.st, g, (unsigned)computeInstance->gi, computeInstance->ci, 0);
    memset(ci, 0, sizeof *ci);
    return fk_end(&c, NVML_SUCCESS);
}

/* -- MIG devices --------------------------------------------------------------------------- */

nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t device, unsigned int *count) {
    BEGIN(c);
    OUT(c, count);
    WHOLE_CARD(c, g, device);
    *count = g->mig_capable && g->mig_current ? MAX_MIG : 0;
    return fk_end(&c, NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t device, unsigned int index, nvmlDevice_t *migDevice) {
    BEGIN(c);
    OUT(c, migDevice);
    gpu_state *g;
    nvmlReturn_t rc = mig_card(&c, device, &g);
    if (rc != NVML_SUCCESS) return rc;
    if (index >= MAX_MIG) return fk_end(&c, NVML_ERROR_INVALID_ARGUMENT);
    for (unsigned i = 0; i < MAX_GI; i++)
        for (unsigned j = 0; j < MAX_CI; j++)
            if (g->gi[i].used && g->gi[i].ci[j].used && g->gi[i].ci[j].mig_index == index) {
                *migDevice = fk_mig_handle(device->gpu, (int)i, (int)j);
                return fk_end(&c, NVML_SUCCESS);
            }
    return fk_end(&c, NVML_ERROR_NOT_FOUND);
}

static nvmlReturn_t mig_ids(call *c, nvmlDevice_t device, unsigned int *id, int want_gi) {
    gpu_state *g = fk_card(c, device, 0);
    if (g == NULL) return fk_reject(c, "mig", "not a device handle");
    if (device->gi < 0) return fk_end(c, NVML_ERROR_NOT_SUPPORTED); /* not a MIG device */
    if (!g->gi[device->gi].used || !g->gi[device->gi].ci[device->ci].used)
        return fk_end(c, NVML_ERROR_INVALID_ARGUMENT);
    *id = (unsigned)(want_gi ? device->gi : device->ci);
    return fk_end(c, NVML_SUCCESS);
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
    ANY_DEVICE(c, g, device);
    unsigned n = 0;
    nvmlProcessInfo_t found[64];
    for (unsigned i = 0; i < MAX_GI; i++)
        for (unsigned j = 0; j < MAX_CI; j++) {
            const ci_state *ci = &g->gi[i].ci[j];
            int mine = device->gi < 0 || ((unsigned)device->gi == i && (unsigned)device->ci == j);
            for (unsigned k = 0; g->gi[i].used && ci->used && mine && k < ci->processes && n < 64; k++)
                found[n++] = (nvmlProcessInfo_t){4000 + i * 100 + j * 10 + k, 1ull << 30, i, j};
        }
    if (n == 0) {
        *infoCount = 0;
        return fk_end(&c, NVML_SUCCESS);
    }
    if (infos == NULL || *infoCount < n) {
        *infoCount = n;
        return fk_end(&c, NVML_ERROR_INSUFFICIENT_SIZE);
    }
    if (!fake_readable(infos, n * sizeof *infos)) return fk_reject(&c, __func__, "infos is not a valid pointer");
    memcpy(infos, found, n * sizeof *infos);
    *infoCount = n;
    return fk_end(&c, NVML_SUCCESS);
}
