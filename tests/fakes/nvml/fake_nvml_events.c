/*
 * The fake NVML's events (nvml.h, "Event Handling Methods"): event sets, registration of a card's
 * event types, and nvmlEventSetWait_v2; and the controls that raise an event or make a card fall
 * off the bus.
 *
 * As the header says: a set receives the events raised after it was created, for the cards and
 * types registered on it; registration takes the whole card's handle ("This API does not
 * currently support per-instance event reporting using MIG device handles": a MIG handle is
 * NOT_SUPPORTED) and types the card does not support are NOT_SUPPORTED; a wait returns one event
 * at a time, TIMEOUT when none arrives in time, and GPU_IS_LOST while a registered card has
 * fallen off the bus (once the events raised before it are delivered). An XID event names the
 * GPU and compute instance it is attributable to, 0xFFFFFFFF otherwise.
 *
 * The events live in the state file (fake_nvml.h, fake_event), so a test raises them from its
 * own process and a service that loaded the library receives them.
 */
#define _DEFAULT_SOURCE
#include "fake_nvml.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

/* What a data-centre card supports (nvmlDeviceGetSupportedEventTypes on an H100). */
#define SUPPORTED                                                                       \
    (nvmlEventTypeSingleBitEccError | nvmlEventTypeDoubleBitEccError | nvmlEventTypePState | \
     nvmlEventTypeXidCriticalError | nvmlEventTypeClock)

#define MAX_SETS 16
#define SET_MAGIC 0x45564e54u

struct nvmlEventSet_st {
    unsigned magic;
    unsigned long long cursor; /* the last event seq this set has seen or skipped */
    unsigned long long types[MAX_GPUS];
};
static struct nvmlEventSet_st sets[MAX_SETS];

static struct nvmlEventSet_st *live_set(nvmlEventSet_t set) {
    if ((const char *)set < (const char *)sets || (const char *)set >= (const char *)sets + sizeof sets)
        return NULL;
    return set->magic == SET_MAGIC ? set : NULL;
}

nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t *set) {
    BEGIN(c);
    OUT(c, set);
    for (int i = 0; i < MAX_SETS; i++) {
        if (sets[i].magic == SET_MAGIC) continue;
        memset(&sets[i], 0, sizeof sets[i]);
        sets[i].magic = SET_MAGIC;
        sets[i].cursor = c.st->event_seq;
        *set = &sets[i];
        return fk_end(&c, NVML_SUCCESS);
    }
    return fk_end(&c, NVML_ERROR_UNKNOWN);
}

nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t set) {
    BEGIN(c);
    struct nvmlEventSet_st *s = live_set(set);
    if (s == NULL) return fk_reject(&c, __func__, "not a live event set");
    s->magic = 0;
    return fk_end(&c, NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetSupportedEventTypes(nvmlDevice_t device, unsigned long long *eventTypes) {
    BEGIN(c);
    OUT(c, eventTypes);
    ANY_DEVICE(c, g, device);
    if (device->gi >= 0) return fk_end(&c, NVML_ERROR_NOT_SUPPORTED);
    *eventTypes = g->mig_capable || g->memory_mib ? SUPPORTED : 0;
    return fk_end(&c, NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t device, unsigned long long eventTypes, nvmlEventSet_t set) {
    BEGIN(c);
    ANY_DEVICE(c, g, device);
    (void)g;
    struct nvmlEventSet_st *s = live_set(set);
    if (s == NULL) return fk_reject(&c, __func__, "not a live event set");
    if (device->gi >= 0 || (eventTypes & ~(unsigned long long)SUPPORTED) != 0)
        return fk_end(&c, NVML_ERROR_NOT_SUPPORTED);
    s->types[device->gpu] |= eventTypes;
    return fk_end(&c, NVML_SUCCESS);
}

/* One look at the ring: 1 and *data filled for the next event of `s`, 0 for none,
 * -1 when a registered card is lost. Events overwritten in the ring are skipped. */
static int next_event(const nvml_state *st, struct nvmlEventSet_st *s, nvmlEventData_t *data) {
    if (st->event_seq > s->cursor + MAX_EVENTS) s->cursor = st->event_seq - MAX_EVENTS;
    while (s->cursor < st->event_seq) {
        const fake_event *e = &st->events[(s->cursor + 1) % MAX_EVENTS];
        s->cursor++;
        if (e->gpu >= MAX_GPUS || (s->types[e->gpu] & e->type) == 0) continue;
        memset(data, 0, sizeof *data);
        data->device = fk_device_handle((int)e->gpu);
        data->eventType = e->type;
        data->eventData = e->data;
        data->gpuInstanceId = e->gi;
        data->computeInstanceId = e->ci;
        return 1;
    }
    for (unsigned g = 0; g < st->ngpus; g++)
        if (s->types[g] != 0 && st->gpu[g].lost) return -1;
    return 0;
}

static nvmlReturn_t wait_event(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeoutms) {
    struct timespec start, now, tick = {0, 5 * 1000 * 1000};
    clock_gettime(CLOCK_MONOTONIC, &start);
    for (;;) {
        BEGIN(c);
        OUT(c, data);
        struct nvmlEventSet_st *s = live_set(set);
        if (s == NULL) return fk_reject(&c, "nvmlEventSetWait_v2", "not a live event set");
        int found = next_event(c.st, s, data);
        if (found > 0) return fk_end(&c, NVML_SUCCESS);
        if (found < 0) return fk_end(&c, NVML_ERROR_GPU_IS_LOST);
        fk_end(&c, NVML_SUCCESS);
        clock_gettime(CLOCK_MONOTONIC, &now);
        long long waited = (now.tv_sec - start.tv_sec) * 1000LL + (now.tv_nsec - start.tv_nsec) / 1000000;
        if (waited >= (long long)timeoutms) return NVML_ERROR_TIMEOUT;
        nanosleep(&tick, NULL);
    }
}

/* nvml.h maps the unversioned nvmlEventSetWait onto this one. */
nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeoutms) {
    return wait_event(set, data, timeoutms);
}

/* -- controls ------------------------------------------------------------------------------ */

/* The state locked for a control on card `gpu`; NULL, nothing held, for no state or no card. */
static nvml_state *control_card(fake_session *s, const char *path, unsigned gpu) {
    if (fake_begin(s, path, sizeof(nvml_state), MAGIC, "control") < 0) return NULL;
    nvml_state *st = (nvml_state *)s->state;
    if (gpu < st->ngpus) return st;
    fake_end(s, 0);
    return NULL;
}

/* Raise one event on card `gpu`: `type` an nvmlEventType bit, `data` the XID (or 0). */
int fake_nvml_raise(const char *path, unsigned gpu, unsigned long long type, unsigned long long data,
                    unsigned gi, unsigned ci) {
    fake_session s;
    nvml_state *st = control_card(&s, path, gpu);
    if (st == NULL) return -1;
    unsigned long long seq = ++st->event_seq;
    st->events[seq % MAX_EVENTS] = (fake_event){seq, type, data, gpu, gi, ci};
    fake_end(&s, 1);
    return 0;
}

/* Card `gpu` falls off the bus (`lost` nonzero) or answers again after a reset. */
int fake_nvml_set_lost(const char *path, unsigned gpu, unsigned lost) {
    fake_session s;
    nvml_state *st = control_card(&s, path, gpu);
    if (st == NULL) return -1;
    st->gpu[gpu].lost = lost != 0;
    fake_end(&s, 1);
    return 0;
}
