/* The part of T-Head's HGML (libhgml.so) that partkeeper calls, written from the library's
 * published contract (docs/drivers.md, "T-Head PPU: provenance"): NVML's shapes under hgml* names,
 * NVML's return codes, handles passed as one-pointer structs by value. Not the vendor's header:
 * only the declarations partkeeper's binding relies on, so that the fake is compiled against the
 * very prototypes the ctypes binding declares. */
#ifndef PK_HGML_SUBSET_H
#define PK_HGML_SUBSET_H

typedef enum {
    HGML_SUCCESS = 0,
    HGML_ERROR_UNINITIALIZED = 1,
    HGML_ERROR_INVALID_ARGUMENT = 2,
    HGML_ERROR_NOT_SUPPORTED = 3,
    HGML_ERROR_NO_PERMISSION = 4,
    HGML_ERROR_NOT_FOUND = 6,
    HGML_ERROR_INSUFFICIENT_SIZE = 7,
    HGML_ERROR_IN_USE = 19,
    HGML_ERROR_INSUFFICIENT_RESOURCES = 23,
    HGML_ERROR_ARGUMENT_VERSION_MISMATCH = 25,
    HGML_ERROR_GPU_NOT_FOUND = 28,
    HGML_ERROR_UNKNOWN = 999
} hgmlReturn_t;

#define HGML_DEVICE_MIG_DISABLE 0x0
#define HGML_DEVICE_MIG_ENABLE 0x1
#define HGML_DEVICE_NAME_V2_BUFFER_SIZE 96
#define HGML_DEVICE_UUID_V2_BUFFER_SIZE 96
#define HGML_GPU_INSTANCE_PROFILE_CAPS_P2P 0x1
#define HGML_GPU_INSTANCE_PROFILE_CAPS_GFX 0x2
#define HGML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED 0x0

typedef struct { struct hgmlDevice_st *handle; } hgmlDevice_t;
typedef struct { struct hgmlGpuInstance_st *handle; } hgmlGpuInstance_t;
typedef struct { struct hgmlComputeInstance_st *handle; } hgmlComputeInstance_t;

typedef struct {
    unsigned long long total, free, used;
} hgmlMemory_t;

typedef struct { unsigned int start, size; } hgmlGpuInstancePlacement_t;

typedef struct {
    unsigned int version, id, isP2pSupported, sliceCount, instanceCount, multiprocessorCount,
        copyEngineCount, decoderCount, encoderCount, jpegCount, ofaCount;
    unsigned long long memorySizeMB;
    char name[HGML_DEVICE_NAME_V2_BUFFER_SIZE];
} hgmlGpuInstanceProfileInfo_v2_t;

typedef struct {
    unsigned int version, id, sliceCount, instanceCount, multiprocessorCount, copyEngineCount,
        decoderCount, encoderCount, jpegCount, ofaCount;
    unsigned long long memorySizeMB;
    char name[HGML_DEVICE_NAME_V2_BUFFER_SIZE];
    unsigned int capabilities;
} hgmlGpuInstanceProfileInfo_v3_t;

/* version word: sizeof | (ver << 24); v2 and v3 are both 152 bytes */
#define HGML_STRUCT_VERSION(type, ver) ((unsigned int)(sizeof(type) | ((ver) << 24U)))
#define hgmlGpuInstanceProfileInfo_v2 HGML_STRUCT_VERSION(hgmlGpuInstanceProfileInfo_v2_t, 2)
#define hgmlGpuInstanceProfileInfo_v3 HGML_STRUCT_VERSION(hgmlGpuInstanceProfileInfo_v3_t, 3)

typedef struct {
    hgmlDevice_t device;
    unsigned int id, profileId;
    hgmlGpuInstancePlacement_t placement;
} hgmlGpuInstanceInfo_t;

typedef struct {
    unsigned int id, sliceCount, instanceCount, multiprocessorCount, sharedCopyEngineCount,
        sharedDecoderCount, sharedEncoderCount, sharedJpegCount, sharedOfaCount;
} hgmlComputeInstanceProfileInfo_t;

typedef struct { unsigned int start, size; } hgmlComputeInstancePlacement_t;

typedef struct {
    hgmlDevice_t device;
    hgmlGpuInstance_t gpuInstance;
    unsigned int id, profileId;
    hgmlComputeInstancePlacement_t placement;
} hgmlComputeInstanceInfo_t;

typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId, computeInstanceId;
} hgmlProcessInfo_t;

hgmlReturn_t hgmlInit_v2(void);
hgmlReturn_t hgmlShutdown(void);
hgmlReturn_t hgmlDeviceGetCount_v2(unsigned int *count);
hgmlReturn_t hgmlDeviceGetHandleByIndex_v2(unsigned int index, hgmlDevice_t *device);
hgmlReturn_t hgmlDeviceGetName(hgmlDevice_t device, char *name, unsigned int length);
hgmlReturn_t hgmlDeviceGetUUID(hgmlDevice_t device, char *uuid, unsigned int length);
hgmlReturn_t hgmlDeviceGetMinorNumber(hgmlDevice_t device, unsigned int *minor);
hgmlReturn_t hgmlDeviceGetMemoryInfo(hgmlDevice_t device, hgmlMemory_t *memory);
hgmlReturn_t hgmlDeviceGetMigMode(hgmlDevice_t device, unsigned int *current,
                                  unsigned int *pending);
hgmlReturn_t hgmlDeviceGetGpuInstanceProfileInfoV(hgmlDevice_t device, unsigned int profile,
                                                  hgmlGpuInstanceProfileInfo_v2_t *info);
hgmlReturn_t hgmlDeviceGetGpuInstancePossiblePlacements_v2(hgmlDevice_t device,
                                                           unsigned int profileId,
                                                           hgmlGpuInstancePlacement_t *placements,
                                                           unsigned int *count);
hgmlReturn_t hgmlDeviceCreateGpuInstanceWithPlacement(hgmlDevice_t device, unsigned int profileId,
                                                      const hgmlGpuInstancePlacement_t *placement,
                                                      hgmlGpuInstance_t *gpuInstance);
hgmlReturn_t hgmlGpuInstanceDestroy(hgmlGpuInstance_t gpuInstance);
hgmlReturn_t hgmlDeviceGetGpuInstances(hgmlDevice_t device, unsigned int profileId,
                                       hgmlGpuInstance_t *gpuInstances, unsigned int *count);
hgmlReturn_t hgmlDeviceGetGpuInstanceById(hgmlDevice_t device, unsigned int id,
                                          hgmlGpuInstance_t *gpuInstance);
hgmlReturn_t hgmlGpuInstanceGetInfo(hgmlGpuInstance_t gpuInstance, hgmlGpuInstanceInfo_t *info);
hgmlReturn_t hgmlGpuInstanceGetComputeInstanceProfileInfo(hgmlGpuInstance_t gpuInstance,
                                                          unsigned int profile,
                                                          unsigned int engProfile,
                                                          hgmlComputeInstanceProfileInfo_t *info);
hgmlReturn_t hgmlGpuInstanceCreateComputeInstance(hgmlGpuInstance_t gpuInstance,
                                                  unsigned int profileId,
                                                  hgmlComputeInstance_t *computeInstance);
hgmlReturn_t hgmlGpuInstanceGetComputeInstanceById(hgmlGpuInstance_t gpuInstance,
                                                   unsigned int id,
                                                   hgmlComputeInstance_t *computeInstance);
hgmlReturn_t hgmlComputeInstanceGetInfo_v2(hgmlComputeInstance_t computeInstance,
                                           hgmlComputeInstanceInfo_t *info);
hgmlReturn_t hgmlComputeInstanceDestroy(hgmlComputeInstance_t computeInstance);
hgmlReturn_t hgmlDeviceGetMaxMigDeviceCount(hgmlDevice_t device, unsigned int *count);
hgmlReturn_t hgmlDeviceGetMigDeviceHandleByIndex(hgmlDevice_t device, unsigned int index,
                                                 hgmlDevice_t *migDevice);
hgmlReturn_t hgmlDeviceGetGpuInstanceId(hgmlDevice_t device, unsigned int *id);
hgmlReturn_t hgmlDeviceGetComputeInstanceId(hgmlDevice_t device, unsigned int *id);
hgmlReturn_t hgmlDeviceGetComputeRunningProcesses(hgmlDevice_t device, unsigned int *infoCount,
                                                  hgmlProcessInfo_t *infos);

#endif
